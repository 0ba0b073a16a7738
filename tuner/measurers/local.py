"""`LocalMeasurer`: build and run scheduled candidates on this machine, check them, time them.

`LocalMeasurer` builds and runs every candidate in a separate process
(`tvm.support.popen_pool.PopenPoolExecutor`, one worker, a timeout per
candidate), so a candidate that segfaults, exits or hangs becomes an error
trial and the worker is restarted; the tuner keeps going. The scheduled module
travels as `tvm.ir.save_json` text, the target as its exported dict, the input
and expected arrays as files in a temporary folder owned by the measurer.

A search that knows its next candidates hands them to `prebuild` first: they
are compiled to shared libraries in parallel, one build process per core (LLVM
codegen is most of a candidate's cost), and only then run, one at a time, by the
measuring process. Nothing is built while anything is timed. This is
MetaSchedule's builder/runner split, and it does not change what a measurement is.

Before its time counts, a candidate's output on the task's fixed inputs is
compared with the output of the untransformed program (computed once per task
in the same kind of child process, which also times the untuned program: the
task's baseline).

Layering: `tuner` never imports `service`.
"""

from __future__ import annotations

import concurrent.futures
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import tvm
from tvm.support.popen_pool import PopenPoolExecutor

from compiler.arrays import ATOL, RTOL, arg_specs
from compiler.build import Pipeline
from compiler.target import host_cores

from ..task import Task
from .base import Candidate, Measurer, MeasureResult
from .child import child_build, child_run, default_inputs, one_line, untransformed_module


@dataclass
class _Prepared:
    """Per-task files and the untuned program's outcome."""

    tmp: tempfile.TemporaryDirectory
    inputs_path: str
    expected_path: str
    baseline_ms: float | None = None
    error: str | None = None  # why candidates cannot be checked (the reference failed)


class LocalMeasurer(Measurer):
    """Builds and runs candidates on this machine, each in a worker process; runs one at a time."""

    def __init__(
        self,
        *,
        timeout_s: float = 60.0,
        repeat: int = 3,
        min_repeat_ms: int = 20,
        rtol: float = RTOL,
        atol: float = ATOL,
        max_process_uses: int | None = 64,
        build_workers: int | None = None,
        child_hook: Callable[[dict], None] | None = None,
        pipeline: Pipeline = "licm",
    ):
        """
        Args:
            timeout_s: limit on one candidate's build, check and timing (the
                reference gets 4x). A candidate over it is an error trial.
            repeat: timed repeats per candidate; their median is the latency.
            min_repeat_ms: each repeat runs the program as often as needed to last this long.
            rtol: relative tolerance of the output check.
            atol: absolute tolerance, scaled by max(1, max |expected|).
            max_process_uses: a worker is recycled after this many candidates
                (bounds leaks of compiled modules); None: never.
            build_workers: processes that build the candidates of `prebuild`
                together (default: the cores this process may use).
            child_hook: called with the config in the child before building (for
                tests: a hook that exits or sleeps simulates a crash or a hang).
                Pickled with cloudpickle.
            pipeline: the TIR pipeline candidates are built with (`compiler.build.tir_pipeline`:
                our LICM by default). The untransformed reference is always built with TVM's
                default pipeline, so a pass of ours that computed wrong would fail the check.
        """
        self.timeout_s = timeout_s
        self.repeat = repeat
        self.min_repeat_ms = min_repeat_ms
        self.rtol, self.atol = rtol, atol
        self.max_process_uses = max_process_uses
        self.build_workers = build_workers if build_workers is not None else host_cores()
        self.child_hook = child_hook
        self.pipeline = pipeline
        self._pools: dict[str, Any] = {}  # "run": the one measuring process; "build": the builders
        self._prepared: dict[int, tuple[Task, _Prepared]] = {}
        self._built: dict[int, tuple[tvm.IRModule, dict]] = {}  # id(mod) -> (mod, the build's outcome)
        self._lib_dir: tempfile.TemporaryDirectory | None = None
        self.restarts = 0

    # -- worker pools -----------------------------------------------------------

    def _get_pool(self, kind: str) -> Any:
        if kind not in self._pools:
            self._pools[kind] = PopenPoolExecutor(
                max_workers=1 if kind == "run" else self.build_workers, timeout=self.timeout_s,
                maximum_process_uses=self.max_process_uses,
            )
        return self._pools[kind]

    def _restart(self, kind: str) -> None:
        pool = self._pools.pop(kind, None)
        if pool is not None:
            pool.shutdown(wait=False)
        self.restarts += 1

    def _outcome(self, kind: str, future: concurrent.futures.Future, timeout_s: float,
                 stuck: list | None = None) -> dict:
        """The child's answer, or {"error": ...} for a timeout, a crash or an exception in the child.

        A child that does not answer at all gets its pool restarted, or, with `stuck`, noted
        there for the caller to restart the pool once the other futures are in.
        """
        what = "build, check and run" if kind == "run" else "build"
        try:
            # The child's watchdog answers first; this one catches a child stuck holding the GIL.
            result = future.result(timeout=timeout_s + 15)
            return result if isinstance(result, dict) else {"build_s": result}
        except TimeoutError:
            if not future.done():
                if stuck is None:
                    self._restart(kind)
                else:
                    stuck.append(future)
            return {"error": f"timed out after {timeout_s:g} s ({what}); worker restarted"}
        except ChildProcessError:
            self.restarts += 1  # the pool restarts the dead worker lazily
            return {"error": f"the {'measuring' if kind == 'run' else 'building'} process crashed (segfault, "
                             f"abort or exit) while {'building or running' if kind == 'run' else 'building'} "
                             "this candidate; worker restarted"}
        except Exception as e:  # an exception raised in the child: build error, runtime error
            return {"error": f"{'build or run' if kind == 'run' else 'build'} failed: {one_line(e)}"}

    def _call(self, timeout_s: float, *args: Any) -> dict:
        """Runs `child_run(*args)` in the measuring process; failures come back as {"error": ...}."""
        pool = self._get_pool("run")
        pool._timeout = timeout_s  # the child's own watchdog (PopenPoolExecutor has one timeout)
        return self._outcome("run", pool.submit(child_run, *args), timeout_s)

    def prebuild(self, batch: Sequence[tuple[Task, Candidate]]) -> None:
        """Compiles the candidates to shared libraries, `build_workers` at a time, and waits for all."""
        for mod, built in self._built.values():  # an earlier batch's, never measured
            if "lib" in built:
                os.remove(built["lib"])
        self._built.clear()
        todo = list(batch)
        if len(todo) < 2:  # nothing to build together: measure_one builds it as it runs
            return
        if self._lib_dir is None:
            self._lib_dir = tempfile.TemporaryDirectory(prefix="altune-libs-")
        pool = self._get_pool("build")
        futures = []
        for task, c in todo:
            path = os.path.join(self._lib_dir.name, f"{id(c.mod)}-{time.monotonic_ns()}.so")
            try:
                mod_json = tvm.ir.save_json(c.mod)
            except Exception as e:  # noqa: BLE001 - measure_one reports it
                self._built[id(c.mod)] = (c.mod, {"error": f"cannot serialize the module: {one_line(e)}"})
                continue
            futures.append((c, path, pool.submit(child_build, mod_json, dict(task.target.export()), self.pipeline, path,
                                                 self.child_hook, dict(c.config))))
        stuck: list = []
        for c, path, future in futures:
            outcome = self._outcome("build", future, self.timeout_s, stuck)
            self._built[id(c.mod)] = (c.mod, outcome if "error" in outcome else {**outcome, "lib": path})
        if stuck:  # after the others are in: restarting kills every builder
            self._restart("build")

    def close(self) -> None:
        for kind in list(self._pools):
            self._pools.pop(kind).shutdown(wait=False)
        for _, prepared in self._prepared.values():
            prepared.tmp.cleanup()
        self._prepared.clear()
        self._built.clear()
        if self._lib_dir is not None:
            self._lib_dir.cleanup()
            self._lib_dir = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    # -- tasks -----------------------------------------------------------------

    def prepare(self, task: Task) -> _Prepared:
        """Writes the task's inputs, computes the reference output and the baseline (once per task)."""
        entry = self._prepared.get(id(task))
        if entry is not None and entry[0] is task:
            return entry[1]
        tmp = tempfile.TemporaryDirectory(prefix="altune-measure-")
        inputs = task.inputs if task.inputs is not None else default_inputs(task.prim_func)
        inputs_path = os.path.join(tmp.name, "inputs.npz")
        expected_path = os.path.join(tmp.name, "expected.npy")
        with open(inputs_path, "wb") as f:
            np.savez(f, *inputs)
        if task.expected is not None:
            np.save(expected_path, np.asarray(task.expected))
        prepared = _Prepared(tmp, inputs_path, expected_path)
        mod_json = tvm.ir.save_json(untransformed_module(task.prim_func))
        result = self._call(
            4 * self.timeout_s, mod_json, None, arg_specs(task.prim_func)[-1], dict(task.target.export()), "default",
            inputs_path, expected_path, task.expected is None, self.repeat, self.min_repeat_ms, self.rtol,
            self.atol, None, {},
        )
        if "error" in result:
            what = "the untransformed program failed, so candidates cannot be checked"
            prepared.error = f"{what}: {result['error']}" if task.expected is None else None
        else:
            lat = sorted(result["latencies_ms"])
            prepared.baseline_ms = lat[len(lat) // 2]
        self._prepared[id(task)] = (task, prepared)
        return prepared

    def baseline_ms(self, task: Task) -> float | None:
        return self.prepare(task).baseline_ms

    def measure_one(self, task: Task, candidate: Candidate) -> MeasureResult:
        mod, built = self._built.pop(id(candidate.mod), (None, {}))
        if mod is not candidate.mod:  # not built ahead (or another module at a reused address)
            built = {}
        try:
            result = self._check_and_time(task, candidate, built)
        finally:
            if "lib" in built:
                os.remove(built["lib"])
        if "latencies_ms" not in result:
            return MeasureResult(None, result["error"], build_s=result.get("build_s", 0.0))
        return MeasureResult(result["latencies_ms"], None, result["build_s"], result["run_s"], result.get("extra", {}))

    def _check_and_time(self, task: Task, candidate: Candidate, built: dict) -> dict:
        """`child_run`'s answer for the candidate, from the library built ahead if `built` has one."""
        prepared = self.prepare(task)
        if prepared.error is not None:
            return {"error": prepared.error}
        if "error" in built:
            return built
        mod_json = None
        if "lib" not in built:
            try:
                mod_json = tvm.ir.save_json(candidate.mod)
            except Exception as e:
                return {"error": f"cannot serialize the module: {one_line(e)}"}
        result = self._call(
            self.timeout_s, mod_json, built.get("lib"), arg_specs(candidate.mod["main"])[-1],
            dict(task.target.export()), self.pipeline, prepared.inputs_path, prepared.expected_path, False, self.repeat,
            self.min_repeat_ms, self.rtol, self.atol, self.child_hook, dict(candidate.config),
        )
        return {**result, "build_s": built.get("build_s", 0.0) + result.get("build_s", 0.0)}
