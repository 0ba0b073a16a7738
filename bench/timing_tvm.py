"""The child's side of timing a TVM program (`bench.common.TvmProgram`): its library loaded and "main" timed.

Runs in a fresh process of its own (`bench.common.time_fresh`); imports TVM (which loads torch) and nothing of
ONNX Runtime.
"""

from __future__ import annotations

import statistics

import numpy as np
import tvm
from tvm import relax

from bench.common import MIN_REPEAT_MS, REPEAT, TvmProgram
from compiler.arrays import loaded, random_inputs


def _load_args(program: TvmProgram, seed: int) -> list:
    if program.args_path is not None:
        with np.load(program.args_path) as data:
            return [loaded(data[f"arr_{i}"]) for i in range(len(data.files))]
    return random_inputs([(tuple(s), d) for s, d in program.specs], seed)


def time_library(program: TvmProgram, seed: int = 0) -> float:
    """Child: loads the program's library and times "main" (ms: median of `REPEAT` repeats of at least
    `MIN_REPEAT_MS`, `time_evaluator`, the method our measurer uses)."""
    dev = tvm.cpu(0)
    lib = tvm.runtime.load_module(program.lib_path)
    args = [tvm.runtime.tensor(a, dev) for a in _load_args(program, seed)]
    if program.vm:
        lib = relax.VirtualMachine(lib, dev)
    timer = lib.time_evaluator("main", dev, number=1, repeat=REPEAT, min_repeat_ms=int(MIN_REPEAT_MS))
    timer(*args)  # a warm-up, as `calibrate` gives torch and the measurer's first run a candidate (thread pool, pages)
    return statistics.median(timer(*args).results) * 1e3
