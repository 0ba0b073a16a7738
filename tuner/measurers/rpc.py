"""Measuring on devices leased from TVM's RPC tracker: build here, run there.

`RpcMeasurer` is a `LocalMeasurer` whose measuring process, instead of running a candidate itself, leases a
device of one key from the tracker (`tvm.rpc.connect_tracker(...).request(key)`), uploads the shared library
built on this host, allocates the task's inputs on the device, runs the candidate once, copies its output back
and checks it against the reference (computed on a device of the same key: the untransformed program, built
with TVM's default pipeline), then times it there with `time_evaluator`. This is what MetaSchedule's
`RPCRunner` does (`tvm.s_tir.meta_schedule.runner.rpc_runner`), with our check added.

An RPC failure is not a wrong program. The measuring process says in which phase it failed:

- leasing the device, uploading, allocating (or a lease that never comes within the process's time): a device
  problem, retried, after waiting until the tracker lists a server of the key again;
- while the candidate ran: the session died. If the tracker still lists the key's servers, the candidate
  is tried once more; only a candidate that loses its session twice is an error trial (it most likely crashed
  the server's process).

A key without any server makes the job wait (polling the tracker) up to `wait_s`, then `DeviceUnavailable`
is raised: the job fails with that reason and keeps its trials; no trial is ever written for it. So does a
device the tracker lists but that failed `MAX_DEVICE_FAILURES` times in a row.

Layering: `tuner` never imports `service`.
"""

from __future__ import annotations

import logging
import os
import socket
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import tvm
from tvm import rpc

from compiler.arrays import check_close
from compiler.build import Pipeline, compile_module
from compiler.target import target_info

from .child import child_arrays, one_line
from .local import LocalMeasurer

log = logging.getLogger("altune.rpc")

MAX_DEVICE_FAILURES = 10
"""Failed attempts in a row, while the tracker lists servers of the key, before `DeviceUnavailable` (a device
that is there but cannot run anything); attempts while no server is listed only wait."""
REQUEST_S = 30.0
"""Time a measuring process may spend leasing a device and uploading, on top of the candidate's own timeout;
past it, the attempt counts as a device that did not answer (retried), not as a hung candidate."""


class DeviceUnavailable(RuntimeError):
    """No device of the key could be leased from the tracker for the measurer's `wait_s`."""


@dataclass(frozen=True)
class DeviceQueue:
    """One key of the tracker's queue: servers registered, free ones, requests waiting."""

    key: str
    total: int
    free: int
    pending: int


def parse_tracker(address: str) -> tuple[str, int]:
    """("host", port) from "host:port".

    Raises:
        ValueError: not of that form.
    """
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"an RPC tracker address is HOST:PORT (e.g. 127.0.0.1:9190), got {address!r}")
    return host, int(port)


def tracker_queue(address: str, timeout_s: float = 5.0) -> list[DeviceQueue]:
    """The tracker's queue per key (what `python -m tvm.exec.query_rpc_tracker` prints), sorted by key.

    Raises:
        ConnectionError: the tracker does not answer within `timeout_s`.
    """
    host, port = parse_tracker(address)
    try:  # TVM's client retries a refused connection for a minute: ask the socket first
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as e:
        raise ConnectionError(f"the RPC tracker at {address} does not answer: {e}") from e
    tracker = rpc.connect_tracker(host, port)
    try:
        summary = tracker.summary()
    finally:
        tracker.close()
    totals: dict[str, int] = {}
    for server in summary.get("server_info", []):
        key = server["key"].split(":", 1)[-1]  # "server:KEY"
        totals[key] = totals.get(key, 0) + 1
    queue = summary.get("queue_info", {})
    keys = sorted(set(totals) | set(queue))
    return [DeviceQueue(k, totals.get(k, 0), queue.get(k, {}).get("free", 0), queue.get(k, {}).get("pending", 0))
            for k in keys]


# ---------------------------------------------------------------------------
# What runs in the measuring process (module-level, so cloudpickle sends a reference).


def _child_run_rpc(
    rpc_options: dict,
    mod_json: str | None,
    lib_path: str | None,
    output_spec: tuple[tuple[int, ...], str],
    target_config: dict,
    pipeline: Pipeline,
    inputs_path: str,
    expected_path: str | None,
    write_expected: bool,
    repeat: int,
    min_repeat_ms: int,
    rtol: float,
    atol: float,
    hook: Any,
    config: dict,
) -> dict:
    """`child.child_run` on a leased device: {"latencies_ms"...}, {"error"...} (the candidate's fault) or
    {"device_error", "phase"} (the device's)."""
    def phase(name: str) -> None:
        with open(rpc_options["phase_path"], "w") as f:
            f.write(name)

    target = tvm.target.Target(target_config)
    build_s = 0.0
    own_lib = lib_path is None
    if own_lib:  # not built ahead: build it here, on this host, as the builders do
        if hook is not None:
            hook(config)
        start = time.perf_counter()
        lib_path = os.path.join(rpc_options["lib_dir"], f"run-{os.getpid()}-{time.monotonic_ns()}.so")
        try:
            compile_module(tvm.ir.load_json(mod_json), target, pipeline).export_library(lib_path)
        except Exception as e:
            return {"error": f"build failed: {one_line(e)}"}
        build_s = time.perf_counter() - start
    key = rpc_options["key"]
    remote_name = os.path.basename(lib_path)
    phase("request")
    try:
        host, port = parse_tracker(rpc_options["tracker"])
        tracker = rpc.connect_tracker(host, port)
        try:
            session = tracker.request(key, priority=1, max_retry=1, session_timeout=rpc_options["session_timeout"])
        finally:
            tracker.close()  # the lease is the session with the server; the tracker only brokered it
        session.upload(lib_path, remote_name)
        lib = session.load_module(remote_name)
        dev = session.device(target_info(target).device_type, 0)
        out_shape, out_dtype = output_spec
        args = [tvm.runtime.tensor(a, dev) for a in child_arrays(inputs_path)]
        args.append(tvm.runtime.tensor(np.zeros(out_shape, dtype=out_dtype), dev))
    except Exception as e:
        return {"device_error": f"could not lease or prepare a device {key!r}: {one_line(e)}", "phase": "request"}
    finally:
        if own_lib:
            os.remove(lib_path)
    phase("run")
    start = time.perf_counter()
    try:
        lib["main"](*args)
        out = args[-1].numpy()
        if write_expected:
            np.save(expected_path, out)
        elif expected_path is not None:
            mismatch = check_close(out, np.load(expected_path), rtol, atol)
            if mismatch is not None:
                return {"error": mismatch, "build_s": build_s}
        timer = lib.time_evaluator("main", dev, number=1, repeat=repeat, min_repeat_ms=min_repeat_ms)
        latencies = [float(r) * 1e3 for r in timer(*args).results]
    except Exception as e:
        try:
            session.cpu(0).exist  # a remote call: does the session still answer?
        except Exception:
            return {"device_error": f"the session on device {key!r} ended while the candidate ran: {one_line(e)}",
                    "phase": "run", "build_s": build_s}
        return {"error": f"run failed on device {key!r}: {one_line(e)}", "build_s": build_s}
    try:
        session.remove(remote_name)
    except Exception:  # the server removes its session's folder anyway
        pass
    return {"latencies_ms": latencies, "build_s": build_s, "run_s": time.perf_counter() - start,
            "extra": {"device": key}}


# ---------------------------------------------------------------------------


class RpcMeasurer(LocalMeasurer):
    """Builds candidates on this host and measures them on devices of one key leased from an RPC tracker."""

    def __init__(self, tracker: str, key: str, *, wait_s: float = 600.0, **options: Any):
        """
        Args:
            tracker: the tracker's "host:port" (`python -m tvm.exec.rpc_tracker`).
            key: the device key its servers registered with (`python -m tvm.exec.rpc_server --key KEY`).
            wait_s: how long a measurement waits for a device of the key (none registered, or one that keeps
                failing) before `DeviceUnavailable` is raised.
            options: `LocalMeasurer`'s (timeout, repeats, tolerances, pipeline, ...). The target must be one
                this host can build for and the device's runtime can load.
        """
        parse_tracker(tracker)
        super().__init__(**options)
        self.tracker, self.key, self.wait_s = tracker, key, wait_s
        self.device_retries = 0  # attempts that failed for the device's sake and were made again
        self._rpc_dir: tempfile.TemporaryDirectory | None = None

    def _wait_for_device(self, deadline: float) -> None:
        """Return once the tracker lists a server of the key; raise DeviceUnavailable after `deadline`."""
        logged = False
        while True:
            try:
                queue = {q.key: q for q in tracker_queue(self.tracker)}
                if self.key in queue and queue[self.key].total > 0:
                    return
                why = f"the tracker at {self.tracker} lists no server with key {self.key!r}"
            except (OSError, RuntimeError) as e:
                why = str(e)
            if time.monotonic() > deadline:
                raise DeviceUnavailable(f"no device {self.key!r} for {self.wait_s:g} s: {why}")
            if not logged:
                log.warning("waiting for a device: %s", why)
                logged = True
            time.sleep(1.0)

    def _call(self, timeout_s: float, *args: Any) -> dict:
        """`_child_run_rpc(*args)` in the measuring process, again for as long as the device is at fault."""
        if self._rpc_dir is None:
            self._rpc_dir = tempfile.TemporaryDirectory(prefix="altune-rpc-")
        phase_path = os.path.join(self._rpc_dir.name, "phase")
        options = {"tracker": self.tracker, "key": self.key, "phase_path": phase_path, "lib_dir": self._rpc_dir.name,
                   "session_timeout": timeout_s + REQUEST_S}
        deadline = time.monotonic() + self.wait_s
        sessions_lost = failures = 0
        while True:
            self._wait_for_device(deadline)
            with open(phase_path, "w") as f:
                f.write("start")
            pool = self._get_pool("run")
            pool._timeout = timeout_s + REQUEST_S
            result = self._outcome("run", pool.submit(_child_run_rpc, options, *args), timeout_s + REQUEST_S)
            with open(phase_path) as f:
                phase = f.read()
            timed_out = str(result.get("error", "")).startswith("timed out")
            if "device_error" not in result and not (timed_out and phase != "run"):
                return result
            if result.get("phase") == "run":
                sessions_lost += 1
                if sessions_lost >= 2:
                    return {"error": f"the session on device {self.key!r} ended twice while this candidate ran "
                                     f"(it crashes the device's process?): {result['device_error']}",
                            "build_s": result.get("build_s", 0.0)}
            why = result.get("device_error") or f"no device {self.key!r} leased within {timeout_s + REQUEST_S:g} s"
            log.warning("device %r failed, measuring again: %s", self.key, why)
            self.device_retries += 1
            failures += 1
            if failures >= MAX_DEVICE_FAILURES:
                raise DeviceUnavailable(f"device {self.key!r} failed {failures} times in a row: {why}")
            if time.monotonic() > deadline:
                raise DeviceUnavailable(f"device {self.key!r} kept failing for {self.wait_s:g} s: {why}")
            time.sleep(0.5)

    def close(self) -> None:
        super().close()
        if self._rpc_dir is not None:
            self._rpc_dir.cleanup()
            self._rpc_dir = None
