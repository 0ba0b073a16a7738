"""What runs in the measuring and building processes, and the helpers they share with their parent.

The functions here are module-level, so cloudpickle sends the child a reference, not their code. A child
keeps the arrays it loaded (`CHILD_CACHE`) for the candidates of the same task after the first.

Timing is exclusive on the host (`timing_lock`): several workers on one machine (or a test run's processes)
build at the same time but never time at the same time, since a candidate timed while another runs on the same
cores reads slower than it is.

Layering: `tuner` never imports `service`.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import tvm

from compiler.arrays import arg_specs, check_close, device, loaded, random_inputs
from compiler.build import Pipeline, compile_module


def default_inputs(prim_func: tvm.tirx.PrimFunc, seed: int = 0) -> list[np.ndarray]:
    """Random arrays for every parameter but the output, reproducible from `seed` (`compiler.arrays`)."""
    return random_inputs(arg_specs(prim_func)[:-1], seed)


def untransformed_module(prim_func: tvm.tirx.PrimFunc) -> tvm.IRModule:
    """The program as given, as a module whose "main" it is."""
    return tvm.IRModule({"main": prim_func.with_attr("global_symbol", "main")})


def one_line(e: BaseException) -> str:
    """"ErrorType: the last non-empty line of its message" (TVM's errors end with the reason), at most 500 chars."""
    lines = [line for line in str(e).strip().splitlines() if line.strip()]
    return f"{type(e).__name__}: {lines[-1].strip() if lines else ''}"[:500]


CHILD_CACHE: dict[str, Any] = {}


def child_arrays(path: str) -> Any:
    """The arrays of an .npz file written by the parent (loaded once per process)."""
    if path not in CHILD_CACHE:
        with np.load(path) as data:
            CHILD_CACHE[path] = [loaded(data[f"arr_{i}"]) for i in range(len(data.files))]
    return CHILD_CACHE[path]


def child_build(mod_json: str, target_config: dict, pipeline: Pipeline, lib_path: str,
                 hook: Callable[[dict], None] | None, config: dict) -> float:
    """Compiles the module into the shared library `lib_path`; returns the build time in s."""
    if hook is not None:
        hook(config)
    start = time.perf_counter()
    compile_module(tvm.ir.load_json(mod_json), tvm.target.Target(target_config), pipeline).export_library(lib_path)
    return time.perf_counter() - start


TIMING_LOCK = os.path.join(tempfile.gettempdir(), "altune-timing.lock")


@contextlib.contextmanager
def timing_lock() -> Iterator[None]:
    """Holds the host's timing lock (an advisory `flock` on `TIMING_LOCK`; released when the process dies)."""
    with open(TIMING_LOCK, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def child_run(
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
    hook: Callable[[dict], None] | None,
    config: dict,
) -> dict:
    """Builds the module (or loads the library built ahead), runs it once, checks (or writes) its output,
    times it."""
    target = tvm.target.Target(target_config)
    if lib_path is not None:
        lib = tvm.runtime.load_module(lib_path)
        build_s = 0.0  # the builder reports it
    else:
        if hook is not None:
            hook(config)
        start = time.perf_counter()
        lib = compile_module(tvm.ir.load_json(mod_json), target, pipeline).jit()
        build_s = time.perf_counter() - start
    dev = device(target)
    out_shape, out_dtype = output_spec
    args = [tvm.runtime.tensor(a, dev) for a in child_arrays(inputs_path)]
    args.append(tvm.runtime.tensor(np.zeros(out_shape, dtype=out_dtype), dev))
    with timing_lock():  # the run, the check and the timing: alone on the host's cores
        return _run_checked(lib, dev, args, expected_path, write_expected, repeat, min_repeat_ms, rtol, atol,
                            build_s)


def _run_checked(lib: Any, dev: Any, args: list, expected_path: str | None, write_expected: bool, repeat: int,
                 min_repeat_ms: int, rtol: float, atol: float, build_s: float) -> dict:
    start = time.perf_counter()
    lib["main"](*args)
    out = args[-1].numpy()
    if write_expected:
        assert expected_path is not None
        np.save(expected_path, out)
    elif expected_path is not None:
        if expected_path not in CHILD_CACHE:
            CHILD_CACHE[expected_path] = loaded(np.load(expected_path))
        expected = CHILD_CACHE[expected_path]
        mismatch = check_close(out, expected, rtol, atol)
        if mismatch is not None:
            return {"error": mismatch, "build_s": build_s}
    timer = lib.time_evaluator("main", dev, number=1, repeat=repeat, min_repeat_ms=min_repeat_ms)
    latencies = [float(r) * 1e3 for r in timer(*args).results]
    return {"latencies_ms": latencies, "build_s": build_s, "run_s": time.perf_counter() - start}
