"""Baselines every benchmark runs beside ours: TVM MetaSchedule, torch, the untuned program.

All TVM latencies here come from `time_ms`, the same method our measurer uses
(`time_evaluator`, the median over repeats, each repeat lengthened to at least
`MIN_REPEAT_MS`), so a ratio between ours and a baseline compares programs, not
timing methods. MetaSchedule tunes with as many on-device measurements as our
budget (`max_trials_global=budget`), in a fresh work directory each call so that
no earlier run's database warm-starts it, with its logs kept in that directory.

Only `bench` uses these (the product never times torch or MetaSchedule): bench -> tuner -> compiler.
TVM, numpy and torch are imported inside functions.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from compiler.arrays import arg_specs, check_close, device, random_inputs
from tuner.measure import one_line

if TYPE_CHECKING:
    import numpy as np
    import tvm

    from compiler.workloads import Workload

MIN_REPEAT_MS = 50.0  # each timed repeat runs the program for at least this long
REPEAT = 5  # repeats whose median is the latency
_MS_LOGGER = "tvm.s_tir.meta_schedule"


@dataclass(frozen=True)
class Baseline:
    """The outcome of tuning with a baseline tuner.

    Attributes:
        latency_ms: median latency of the best program (time_ms), None if none was found.
        tune_s: wall-clock seconds of the search (not the final timing and check).
        mod: the best scheduled IRModule, None if none was found.
        error: why there is no latency, or why the best program is wrong; None when fine.
        trials: on-device measurements the tuner recorded (its database size).
        correct: whether the best program's output matched the untransformed
            program's; None when there was no program to check.
        work_dir: where the tuner's database and logs were written (removed
            afterwards when the caller gave no work_dir).
    """

    latency_ms: float | None
    tune_s: float
    mod: Any = None  # tvm.IRModule | None; Any keeps this module importable without TVM
    error: str | None = None
    trials: int = 0
    correct: bool | None = None
    work_dir: str | None = None


def time_ms(
    lib: tvm.runtime.Module,
    args: Sequence[tvm.runtime.Tensor],
    dev: tvm.runtime.Device | None = None,
    *,
    repeat: int = REPEAT,
    min_repeat_ms: float = MIN_REPEAT_MS,
) -> float:
    """Median latency of `lib["main"](*args)` in milliseconds.

    Args:
        lib: a compiled module (`tvm.compile(...).jit()`).
        args: its arguments, already on `dev`.
        dev: the device; CPU when None.
        repeat: number of repeats whose median is taken.
        min_repeat_ms: each repeat runs the function as often as needed to last
            at least this long (TVM raises `number` until it does).

    Returns:
        The median over repeats of the mean time per call, in ms.
    """
    import tvm

    dev = tvm.cpu(0) if dev is None else dev
    timer = lib.time_evaluator("main", dev, number=1, repeat=repeat, min_repeat_ms=int(min_repeat_ms))
    return statistics.median(timer(*args).results) * 1e3


def random_args(prim_func: tvm.tirx.PrimFunc, seed: int = 0) -> list[np.ndarray]:
    """Random arrays for every parameter but the last (the output), in call order (`compiler.arrays`)."""
    return random_inputs(arg_specs(prim_func)[:-1], seed)


def _output_spec(prim_func: tvm.tirx.PrimFunc) -> tuple[tuple[int, ...], str]:
    return arg_specs(prim_func)[-1]


def _as_module(prog: Any) -> tvm.IRModule:
    import tvm

    if isinstance(prog, tvm.IRModule):
        return prog
    func = prog if "global_symbol" in (prog.attrs or {}) else prog.with_attr("global_symbol", "main")
    return tvm.IRModule({"main": func})


def build_and_run(
    mod: tvm.IRModule,
    prim_func: tvm.tirx.PrimFunc,
    target: tvm.target.Target,
    inputs: Sequence[np.ndarray],
) -> tuple[tvm.runtime.Module, list[tvm.runtime.Tensor], np.ndarray]:
    """Builds `mod` and runs it once on `inputs`.

    Args:
        mod: a (scheduled) module whose "main" has `prim_func`'s signature.
        prim_func: the untransformed program (gives the output shape and dtype).
        target: the TVM target.
        inputs: input arrays in call order.

    Returns:
        (the compiled module, its arguments on the device, the output as an array): what
        `time_ms` times.
    """
    import numpy as np
    import tvm

    dev = device(target)
    lib = tvm.compile(mod, target=target).jit()
    shape, dtype = _output_spec(prim_func)
    args = [tvm.runtime.tensor(a, dev) for a in inputs]
    args.append(tvm.runtime.tensor(np.zeros(shape, dtype=dtype), dev))
    lib["main"](*args)
    return lib, args, args[-1].numpy()


def run_and_time(
    mod: tvm.IRModule,
    prim_func: tvm.tirx.PrimFunc,
    target: tvm.target.Target,
    inputs: Sequence[np.ndarray],
    *,
    repeat: int = REPEAT,
    min_repeat_ms: float = MIN_REPEAT_MS,
) -> tuple[np.ndarray, float]:
    """Builds `mod`, runs it once on `inputs` and times it (`build_and_run`, then `time_ms`).

    Returns:
        (output array, median latency in ms).
    """
    lib, args, out = build_and_run(mod, prim_func, target, inputs)
    return out, time_ms(lib, args, args[-1].device, repeat=repeat, min_repeat_ms=min_repeat_ms)


def interleaved_ms(
    timers: Mapping[str, Callable[[], float]], rounds: int = REPEAT, *, settle_s: float = 0.1
) -> dict[str, float]:
    """Each timer's median reading (ms) over `rounds` rounds that take the timers in turn.

    A shared machine's speed drifts over minutes (this one ran the same program at
    1.06 and at 1.22 ms a few minutes apart), so two latencies timed minutes apart
    carry the drift into their ratio. Taken in turn, every program sees the same
    moments. `settle_s` between two readings lets the last one's spinning threads
    go to sleep.

    Args:
        timers: name -> a call that times one program once (e.g. `time_ms` with
            repeat=1, a `TorchTimer`).
        rounds: readings per timer.
    """
    readings: dict[str, list[float]] = {name: [] for name in timers}
    for _ in range(rounds):
        for name, timer in timers.items():
            time.sleep(settle_s)
            readings[name].append(timer())
    return {name: statistics.median(values) for name, values in readings.items()}


def untuned_latency(
    prim_func: tvm.tirx.PrimFunc,
    target: tvm.target.Target,
    inputs: Sequence[np.ndarray] | None = None,
    *,
    repeat: int = 3,
) -> float:
    """Median latency (ms) of the untransformed program, compiled as is.

    Args:
        prim_func: the program.
        target: the TVM target.
        inputs: input arrays; random ones when None.
        repeat: repeats (untuned programs are slow, so fewer than `REPEAT`).
    """
    inputs = random_args(prim_func) if inputs is None else inputs
    _, ms = run_and_time(_as_module(prim_func), prim_func, target, inputs, repeat=repeat)
    return ms


def reference_output(
    prim_func: tvm.tirx.PrimFunc, target: tvm.target.Target, inputs: Sequence[np.ndarray]
) -> np.ndarray:
    """The output of the untransformed program on `inputs` (the ground truth for a schedule)."""
    import numpy as np
    import tvm

    dev = device(target)
    lib = tvm.compile(_as_module(prim_func), target=target).jit()
    shape, dtype = _output_spec(prim_func)
    args = [tvm.runtime.tensor(a, dev) for a in inputs]
    args.append(tvm.runtime.tensor(np.zeros(shape, dtype=dtype), dev))
    lib["main"](*args)
    return args[-1].numpy()


# Frames without a source file that TVMScript's parser meets while a module of
# `@T.prim_func`s is imported (see `fast_tvmscript_import`).
_SOURCELESS_FRAMES = {
    "<frozen importlib._bootstrap>": "importlib._bootstrap",
    "<frozen importlib._bootstrap_external>": "importlib._bootstrap_external",
    "<frozen runpy>": "runpy",  # popen workers run as `python -m tvm.exec.popen_worker`
    "<ast>": "ast",
}


def fast_tvmscript_import() -> None:
    """Makes importing `tvm.s_tir.tensor_intrin` take seconds instead of about a minute.

    Every `@T.prim_func` decorator calls `inspect.stack()`, and for each frame
    without a source file (the import machinery's) `inspect.getmodule` scans all
    of `sys.modules`; `tensor_intrin` defines 248 of them, which costs 50 s here.
    MetaSchedule imports it in the tuning process and in every builder worker,
    whose build timeout (30 s) it then exceeds: every candidate failed to build.
    Mapping those frame names to their modules in `inspect`'s own cache skips
    the scan; what `inspect` returns is otherwise unchanged (no source either way).
    Idempotent; run in this process and as the builder workers' initializer.
    """
    import inspect

    for filename, module in _SOURCELESS_FRAMES.items():
        inspect.modulesbyfile.setdefault(filename, module)


@contextlib.contextmanager
def quiet_metaschedule(log_dir: Path) -> Iterator[None]:
    """Sends MetaSchedule's console log (tables every round) to a file in `log_dir`.

    MetaSchedule's logging config binds its console handler to `ext://sys.stdout`
    when tuning starts, so swapping `sys.stdout` for a file during the call
    redirects it; its per-task logs go to `<work_dir>/logs` already. Afterwards
    the handlers it installed are closed, so no file stays open in a removed
    folder. Unnamed handlers (pytest's log capture adds some) are detached during
    the call: MetaSchedule formats every handler name of its logger and fails on None.
    """
    log_dir.mkdir(parents=True, exist_ok=True)
    root = logging.getLogger(_MS_LOGGER)
    unnamed = [h for h in root.handlers if h.get_name() is None]
    for handler in unnamed:
        root.removeHandler(handler)
    with open(log_dir / "console.log", "a") as console, contextlib.redirect_stdout(console):
        try:
            yield
        finally:
            for name in [_MS_LOGGER, *logging.Logger.manager.loggerDict]:
                if not name.startswith(_MS_LOGGER):
                    continue
                logger = logging.getLogger(name)
                for handler in list(logger.handlers):
                    if (handler.get_name() or "").startswith(_MS_LOGGER):
                        logger.removeHandler(handler)
                        handler.close()
            for handler in unnamed:
                root.addHandler(handler)


def metaschedule(
    prim_func: tvm.tirx.PrimFunc,
    target: tvm.target.Target,
    budget: int,
    work_dir: str | os.PathLike | None = None,
    *,
    seed: int = 0,
    inputs: Sequence[np.ndarray] | None = None,
    expected: np.ndarray | None = None,
    num_tuning_cores: int | None = None,
) -> Baseline:
    """Tunes `prim_func` with TVM MetaSchedule, then checks and times its best program.

    Args:
        prim_func: the untransformed program ("main").
        target: the TVM target (with the detected mcpu: see `compiler.target`).
        budget: on-device measurements (MetaSchedule's `max_trials_global`), as ours.
        work_dir: a folder under which a fresh run folder is made (kept, with the
            database and logs); None: a temporary folder, removed afterwards.
        seed: MetaSchedule's random seed.
        inputs: input arrays for the check and the timing; random when None.
        expected: the correct output for `inputs`; computed with the untransformed
            program when None.
        num_tuning_cores: cores for MetaSchedule's builder, runner and cost model;
            the target's num-cores (else all of this process's cores) when None.

    Returns:
        A `Baseline`; a failure (no valid schedule, a crash, a wrong result) is
        reported in `error`, never raised.
    """
    assert budget >= 1, f"{budget=} must be >= 1"
    if work_dir is None:
        with tempfile.TemporaryDirectory(prefix="altune-ms-") as tmp:
            result = metaschedule(
                prim_func, target, budget, tmp, seed=seed, inputs=inputs, expected=expected,
                num_tuning_cores=num_tuning_cores,
            )
        return Baseline(result.latency_ms, result.tune_s, result.mod, result.error, result.trials, result.correct)
    Path(work_dir).mkdir(parents=True, exist_ok=True)
    run_dir = Path(tempfile.mkdtemp(prefix="ms-", dir=work_dir))
    return _metaschedule_in(
        prim_func, target, budget, run_dir, seed=seed, inputs=inputs, expected=expected,
        num_tuning_cores=num_tuning_cores,
    )


def target_cores(target: tvm.target.Target) -> int:
    cores = target.attrs.get("num-cores") if target.attrs is not None else None
    if cores:
        return int(cores)
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _metaschedule_in(
    prim_func: tvm.tirx.PrimFunc,
    target: tvm.target.Target,
    budget: int,
    run_dir: Path,
    *,
    seed: int,
    inputs: Sequence[np.ndarray] | None,
    expected: np.ndarray | None,
    num_tuning_cores: int | None,
) -> Baseline:
    from tvm.s_tir import meta_schedule as ms

    mod = _as_module(prim_func)
    cores = num_tuning_cores or target_cores(target)
    # One-time process start-up, not search: kept out of tune_s.
    fast_tvmscript_import()
    import tvm.s_tir.tensor_intrin  # noqa: F401

    start = time.perf_counter()
    try:
        with quiet_metaschedule(run_dir / "logs"):
            database = ms.tune_tir(
                mod,
                target,
                str(run_dir),
                max_trials_global=budget,
                num_trials_per_iter=min(64, budget),
                builder=ms.builder.LocalBuilder(max_workers=cores, initializer=fast_tvmscript_import),
                seed=seed,
                num_tuning_cores=cores,
            )
    except Exception as e:  # a crash in the baseline is a result to report, not ours to raise
        return Baseline(None, time.perf_counter() - start, error=f"MetaSchedule failed: {one_line(e)}",
                        work_dir=str(run_dir))
    tune_s = time.perf_counter() - start
    trials = len(database.get_all_tuning_records())
    sch = ms.tir_integration.compile_tir(database, mod, target)
    if sch is None:
        return Baseline(None, tune_s, error=f"MetaSchedule found no valid schedule in {trials} trials",
                        trials=trials, work_dir=str(run_dir))
    best = sch.mod
    inputs = random_args(prim_func) if inputs is None else inputs
    try:
        if expected is None:
            expected = reference_output(prim_func, target, inputs)
        out, ms_latency = run_and_time(best, prim_func, target, inputs)
    except Exception as e:
        return Baseline(None, tune_s, best, f"MetaSchedule's best program failed to run: {one_line(e)}",
                        trials, work_dir=str(run_dir))
    mismatch = check_close(out, expected)
    if mismatch is not None:
        return Baseline(None, tune_s, best, f"MetaSchedule's best program is wrong: {mismatch}", trials,
                        correct=False, work_dir=str(run_dir))
    return Baseline(ms_latency, tune_s, best, None, trials, correct=True, work_dir=str(run_dir))


# ---------------------------------------------------------------------------
# torch


def _torch_op(workload: Workload) -> Callable[[list[Any]], Any]:
    """The torch call computing `workload` (the operator and its epilogue) on torch tensors."""
    import torch
    import torch.nn.functional as F

    p, op = workload.params, workload.operator
    conv_kw = lambda: dict(stride=p["stride"], padding=p["padding"], dilation=p["dilation"])  # noqa: E731
    if op in ("conv2d", "dilated_conv2d", "group_conv2d"):
        main = lambda x, w: F.conv2d(x, w, groups=p.get("groups", 1), **conv_kw())  # noqa: E731
    elif op == "depthwise_conv2d":
        main = lambda x, w: F.conv2d(x, w, groups=p["channels"], **conv_kw())  # noqa: E731
    elif op == "conv1d":
        main = lambda x, w: F.conv1d(x, w, **conv_kw())  # noqa: E731
    elif op == "conv3d":
        main = lambda x, w: F.conv3d(x, w, **conv_kw())  # noqa: E731
    elif op == "conv2d_transpose":
        main = lambda x, w: F.conv_transpose2d(  # noqa: E731
            x, w, stride=p["stride"], padding=p["padding"], output_padding=p["output_padding"], groups=p["groups"]
        )
    elif op == "dense":
        main = F.linear
    elif op == "batch_matmul":
        main = torch.bmm
    else:
        raise ValueError(f"no torch baseline for operator: {op}")
    bias_axis = 2 if op == "batch_matmul" else 1
    ndim = len(workload.output.shape)
    view = [1] * ndim
    view[bias_axis] = -1
    has_bias = workload.epilogue in ("bias", "bias_relu")
    has_relu = workload.epilogue in ("relu", "bias_relu")

    def run(tensors: list[Any]) -> Any:
        y = main(tensors[0], tensors[1])
        if has_bias:
            y = y + tensors[2].reshape(view)
        if has_relu:
            y = torch.relu(y)
        return y

    return run


@contextlib.contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def torch_output(workload: Workload, inputs: Sequence[np.ndarray]) -> np.ndarray:
    """What `torch_latency` computes, as numpy (to check it against `workload.reference`)."""
    import torch

    with torch.inference_mode():
        return _torch_op(workload)([torch.from_numpy(a) for a in inputs]).numpy()


def torch_latency(
    workload: Workload,
    threads: int | None = None,
    *,
    repeat: int = REPEAT,
    min_repeat_ms: float = MIN_REPEAT_MS,
    seed: int = 0,
) -> float:
    """Median latency (ms) of the torch op computing `workload` (oneDNN on CPU).

    Timed like `time_ms`, in a process of its own (`TorchTimer`): after a warm-up,
    `repeat` repeats, each calling the op as often as needed to last
    `min_repeat_ms`; the median of the per-call means. Inputs are torch tensors
    made beforehand, so no conversion is timed.

    Args:
        workload: the operator instance (`compiler.workloads.make_workload`).
        threads: torch intra-op threads; all of this process's cores when None.
        repeat, min_repeat_ms: see `time_ms`.
        seed: seed of the random inputs.
    """
    with TorchTimer(workload, seed=seed, threads=threads, min_repeat_ms=min_repeat_ms) as timer:
        return statistics.median(timer() for _ in range(repeat))


class TorchTimer:
    """Times the torch op of a workload in a process of its own; each call is one reading (ms).

    In a process where TVM has run, TVM's thread pool competes with torch's
    OpenMP threads for the cores (BERT-tiny read 60 ms there, 1.35 ms alone:
    `bench.models.torch_latency_fresh`). The spawned process imports torch and
    never runs TVM's thread pool. The op is calibrated on the first reading; a
    reading is the mean per call over at least `min_repeat_ms`.
    """

    def __init__(self, workload: Workload, *, seed: int = 0, threads: int | None = None,
                 min_repeat_ms: float = MIN_REPEAT_MS, timeout_s: float = 600.0):
        import concurrent.futures
        import multiprocessing

        self._args = (workload.operator, dict(workload.params), workload.dtype, workload.epilogue, seed,
                      threads or affinity_cores(), min_repeat_ms)
        self._timeout_s = timeout_s
        self._pool = concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))

    def __call__(self) -> float:
        return self._pool.submit(_torch_reading, *self._args).result(timeout=self._timeout_s)

    def close(self) -> None:
        self._pool.shutdown(cancel_futures=True)

    def __enter__(self) -> TorchTimer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_TORCH_CALLS: dict[tuple, tuple[Callable[[], Any], int]] = {}  # TorchTimer's child: calibrated calls


def _torch_reading(operator: str, params: dict, dtype: str, epilogue: str, seed: int, threads: int,
                   min_repeat_ms: float) -> float:
    """One `TorchTimer` reading, in its child process."""
    import torch

    from compiler.workloads import make_workload

    torch.set_num_threads(threads)
    key = (operator, tuple(sorted(params.items())), dtype, epilogue, seed, min_repeat_ms)
    if key not in _TORCH_CALLS:
        workload = make_workload(operator, params, dtype, epilogue)
        op = _torch_op(workload)
        tensors = [torch.from_numpy(a) for a in workload.random_inputs(seed)]
        call = lambda: op(tensors)  # noqa: E731
        with torch.inference_mode():
            _TORCH_CALLS[key] = (call, calibrate(call, min_repeat_ms))
    call, number = _TORCH_CALLS[key]
    with torch.inference_mode():
        start = time.perf_counter()
        for _ in range(number):
            call()
        return (time.perf_counter() - start) / number * 1e3


def calibrate(call: Callable[[], Any], min_repeat_ms: float) -> int:
    """Warms `call` up and returns how many calls last at least `min_repeat_ms`."""
    call()  # first call: oneDNN picks and JIT-compiles its kernel
    number = 1
    while True:
        start = time.perf_counter()
        for _ in range(number):
            call()
        elapsed_ms = (time.perf_counter() - start) * 1e3
        if elapsed_ms >= min_repeat_ms:
            return number
        # aim 20% past the threshold, at least doubling (TVM's time_evaluator grows the same way)
        target = number * min_repeat_ms * 1.2 / elapsed_ms if elapsed_ms > 0 else number * 2
        number = max(number * 2, math.ceil(target))


def affinity_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


__all__ = [
    "Baseline",
    "TorchTimer",
    "build_and_run",
    "interleaved_ms",
    "affinity_cores",
    "calibrate",
    "fast_tvmscript_import",
    "metaschedule",
    "quiet_metaschedule",
    "random_args",
    "reference_output",
    "run_and_time",
    "target_cores",
    "time_ms",
    "torch_latency",
    "torch_output",
    "torch_threads",
    "untuned_latency",
]
