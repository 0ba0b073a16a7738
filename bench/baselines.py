"""Baselines every benchmark runs beside ours: TVM MetaSchedule, torch, the untuned program.

All TVM latencies here come from `time_ms`, the same method our measurer uses
(`time_evaluator`, the median over repeats, each repeat lengthened to at least
`MIN_REPEAT_MS`), so a ratio between ours and a baseline compares programs, not
timing methods. MetaSchedule tunes with as many on-device measurements as our
budget (`max_trials_global=budget`), in a fresh work directory each call so that
no earlier run's database warm-starts it, with its logs kept in that directory.

MetaSchedule at its best (`metaschedule(..., layout_free=True)`): the constants
(weight, bias: every input but the activations of `compiler.layout.program.ACTIVATIONS`,
the ones ours packs for free) are marked layout-free (the PrimFunc attribute
`layout_free_buffers`, as Relax's `AttachAttrLayoutFreeBuffers` marks constant weights),
so its `RewriteLayout` postprocessor may store them in the layout its schedule reads
best. Its builder times candidates with the rewrite block removed
(`RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)`) and random arguments in the
rewritten shapes; the best program here is split as Relax splits it
(`relax.transform.SplitLayoutRewritePreproc`): a prepack function run once on the
constants (`Prepacked`) and the compute function that is checked and timed on them.

torch (`torch_operator`, in `bench.torch_operators`, re-exported here): the operator as an `nn.Module` whose
constants are parameters, so `torch.compile(freezing=True)` may fold and prepack them as
MetaSchedule's and our packing do; `bench.common.time_torch` times it as each variant.

Only `bench` uses these (the product never times torch or MetaSchedule): bench -> tuner -> compiler.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import statistics
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import tvm
from tvm import relax
from tvm.s_tir import meta_schedule as ms

from bench.common import MIN_REPEAT_MS, REPEAT, calibrate
from bench.torch_operators import torch_operator, torch_output, torch_threads
from compiler.arrays import arg_specs, check_close, device, random_inputs
from compiler.build import compile_module
from compiler.layout.program import ACTIVATIONS
from tuner.measurers.child import one_line

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
        prepacked: with layout-free constants, how `mod`'s arguments are made from the
            untransformed program's inputs (`Prepacked.args`); None: they are those inputs.
    """

    latency_ms: float | None
    tune_s: float
    mod: tvm.IRModule | None = None
    error: str | None = None
    trials: int = 0
    correct: bool | None = None
    work_dir: str | None = None
    prepacked: Prepacked | None = None

    def args(self, inputs: Sequence[np.ndarray], target: tvm.target.Target) -> list[np.ndarray]:
        """The inputs `mod`'s "main" takes for the untransformed program's `inputs` (constants prepacked)."""
        return list(inputs) if self.prepacked is None else self.prepacked.args(inputs, target)


@dataclass(frozen=True)
class Prepacked:
    """A program whose layout-free constants are rewritten once, beforehand (as Relax runs MetaSchedule's).

    Attributes:
        pack: "main"(the constants it rewrites..., their rewritten copies...) (an IRModule), None
            when nothing was rewritten.
        pack_inputs: which of the untransformed inputs `pack` takes, in its order.
        main_args: for each input of the timed "main": ("input", i), the untransformed input i,
            or ("packed", j), `pack`'s output j.
        rewritten: names of the constants stored in another layout.
    """

    pack: tvm.IRModule | None
    pack_inputs: tuple[int, ...]
    main_args: tuple[tuple[str, int], ...]
    rewritten: tuple[str, ...] = ()

    def args(self, inputs: Sequence[np.ndarray], target: tvm.target.Target) -> list[np.ndarray]:
        """The timed main's inputs: the untransformed `inputs`, the rewritten constants computed by `pack`."""
        packed: list[np.ndarray] = []
        if self.pack is not None:
            dev = device(target)
            outs = arg_specs(self.pack["main"])[len(self.pack_inputs):]
            args = [tvm.runtime.tensor(np.ascontiguousarray(inputs[i]), dev) for i in self.pack_inputs]
            args += [tvm.runtime.tensor(np.zeros(shape, dtype), dev) for shape, dtype in outs]
            tvm.compile(self.pack, target=target).jit()["main"](*args)
            packed = [a.numpy() for a in args[len(self.pack_inputs):]]
        return [inputs[i] if kind == "input" else packed[i] for kind, i in self.main_args]


def layout_free_indices(prim_func: tvm.tirx.PrimFunc) -> list[int]:
    """The parameters Relax would mark layout-free: the constants (every input but the activations and the
    output), found by their buffer names as `compiler.layout` names them."""
    names = [str(v.name) for v in prim_func.params]
    return [i for i, name in enumerate(names[:-1]) if name not in ACTIVATIONS]


def split_layout_rewrite(mod: tvm.IRModule, prim_func: tvm.tirx.PrimFunc) -> tuple[tvm.IRModule, Prepacked]:
    """Splits MetaSchedule's best program into the constants' prepack and the compute (Relax's
    `SplitLayoutRewritePreproc`, on a Relax function that calls it as a model would).

    Args:
        mod: the scheduled module ("main", with `meta_schedule.layout_rewrite_preproc` blocks where
            `RewriteLayout` rewrote a layout-free buffer).
        prim_func: the untransformed program (its inputs name the arguments).

    Returns:
        ("main": the compute, taking the rewritten constants; how to make its arguments).
    """
    func = mod["main"]
    specs = arg_specs(prim_func)
    names = [str(v.name) for v in prim_func.params]
    params = [relax.Var(name, relax.TensorType(list(shape), dtype)) for name, (shape, dtype) in zip(names, specs[:-1])]
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        compute = bb.add_func(func.without_attr("global_symbol"), "compute")
        with bb.dataflow():
            out = bb.emit_output(relax.call_tir(compute, relax.Tuple(params), relax.TensorType(list(specs[-1][0]),
                                                                                             specs[-1][1])))
        bb.emit_func_output(out)
    split = relax.transform.SplitLayoutRewritePreproc()(bb.get())
    where: dict[Any, tuple[str, int]] = {p: ("input", i) for i, p in enumerate(params)}
    pack_gv, pack_inputs, main_gv, main_args = None, (), compute, ()
    for binding in split["main"].body.blocks[0].bindings:
        value = binding.value
        if isinstance(value, relax.Call) and isinstance(value.args[0], tvm.ir.GlobalVar):
            args = tuple(where[a] for a in value.args[1].fields)
            if value.args[0].name_hint.endswith("_prepack"):
                pack_gv, pack_inputs = value.args[0], tuple(i for _, i in args)
                where[binding.var] = ("packed", 0)  # one rewritten constant; several: a tuple, taken apart below
            else:
                main_gv, main_args = value.args[0], args
        elif isinstance(value, relax.TupleGetItem):
            where[binding.var] = ("packed", value.index)
    timed = tvm.IRModule({"main": split[main_gv].with_attr("global_symbol", "main")})
    pack = None if pack_gv is None else tvm.IRModule({"main": split[pack_gv].with_attr("global_symbol", "main")})
    rewritten = tuple(names[i] for i in pack_inputs)
    return timed, Prepacked(pack, pack_inputs, main_args or tuple(("input", i) for i in range(len(params))),
                            rewritten)


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
    dev = tvm.cpu(0) if dev is None else dev
    timer = lib.time_evaluator("main", dev, number=1, repeat=repeat, min_repeat_ms=int(min_repeat_ms))
    return statistics.median(timer(*args).results) * 1e3


def random_args(prim_func: tvm.tirx.PrimFunc, seed: int = 0) -> list[np.ndarray]:
    """Random arrays for every parameter but the last (the output), in call order (`compiler.arrays`)."""
    return random_inputs(arg_specs(prim_func)[:-1], seed)


def _output_spec(prim_func: tvm.tirx.PrimFunc) -> tuple[tuple[int, ...], str]:
    return arg_specs(prim_func)[-1]


def _as_module(prog: Any) -> tvm.IRModule:
    if isinstance(prog, tvm.IRModule):
        return prog
    func = prog if "global_symbol" in (prog.attrs or {}) else prog.with_attr("global_symbol", "main")
    return tvm.IRModule({"main": func})


def build_and_run(
    mod: tvm.IRModule,
    prim_func: tvm.tirx.PrimFunc,
    target: tvm.target.Target,
    inputs: Sequence[np.ndarray],
    *,
    pipeline: str | None = None,
) -> tuple[tvm.runtime.Module, list[tvm.runtime.Tensor], np.ndarray]:
    """Builds `mod` and runs it once on `inputs`.

    Args:
        mod: a (scheduled) module whose "main" has `prim_func`'s signature.
        prim_func: the untransformed program (gives the output shape and dtype).
        target: the TVM target.
        inputs: input arrays in call order.
        pipeline: one of our TIR pipelines (`compiler.build.compile_module`: how ours and its
            artifacts are built); None: TVM's default (`tvm.compile`, how a baseline is built).

    Returns:
        (the compiled module, its arguments on the device, the output as an array): what
        `time_ms` times.
    """

    dev = device(target)
    lib = (tvm.compile(mod, target=target) if pipeline is None else compile_module(mod, target, pipeline)).jit()
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
    layout_free: bool = False,
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
        layout_free: mark the constants layout-free (`layout_free_indices`), as Relax does, so
            MetaSchedule may rewrite their layouts; the best program is then split into a prepack
            run once and the compute that is checked and timed (`Baseline.prepacked`).

    Returns:
        A `Baseline`; a failure (no valid schedule, a crash, a wrong result) is
        reported in `error`, never raised.
    """
    assert budget >= 1, f"{budget=} must be >= 1"
    if work_dir is None:
        with tempfile.TemporaryDirectory(prefix="altune-ms-") as tmp:
            result = metaschedule(
                prim_func, target, budget, tmp, seed=seed, inputs=inputs, expected=expected,
                num_tuning_cores=num_tuning_cores, layout_free=layout_free,
            )
        return Baseline(result.latency_ms, result.tune_s, result.mod, result.error, result.trials, result.correct,
                        prepacked=result.prepacked)
    Path(work_dir).mkdir(parents=True, exist_ok=True)
    run_dir = Path(tempfile.mkdtemp(prefix="ms-", dir=work_dir))
    return _metaschedule_in(
        prim_func, target, budget, run_dir, seed=seed, inputs=inputs, expected=expected,
        num_tuning_cores=num_tuning_cores, layout_free=layout_free,
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
    layout_free: bool = False,
) -> Baseline:
    if layout_free:
        prim_func = prim_func.with_attr("layout_free_buffers", layout_free_indices(prim_func))
    mod = _as_module(prim_func)
    cores = num_tuning_cores or target_cores(target)
    # One-time process start-up, not search: kept out of tune_s.
    fast_tvmscript_import()
    # here, not at the top: only after `fast_tvmscript_import` does it take seconds instead of a minute
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
    best, prepacked = sch.mod, None
    inputs = random_args(prim_func) if inputs is None else inputs
    try:
        if expected is None:
            expected = reference_output(prim_func, target, inputs)
        args = list(inputs)
        if layout_free:  # the constants rewritten once, beforehand; the compute checked and timed
            best, prepacked = split_layout_rewrite(best, prim_func)
            args = prepacked.args(inputs, target)
        out, ms_latency = run_and_time(best, prim_func, target, args)
    except Exception as e:
        return Baseline(None, tune_s, best, f"MetaSchedule's best program failed to run: {one_line(e)}",
                        trials, work_dir=str(run_dir), prepacked=prepacked)
    mismatch = check_close(out, expected)
    if mismatch is not None:
        return Baseline(None, tune_s, best, f"MetaSchedule's best program is wrong: {mismatch}", trials,
                        correct=False, work_dir=str(run_dir), prepacked=prepacked)
    return Baseline(ms_latency, tune_s, best, None, trials, correct=True, work_dir=str(run_dir), prepacked=prepacked)


def affinity_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


__all__ = [
    "Baseline",
    "Prepacked",
    "build_and_run",
    "affinity_cores",
    "calibrate",
    "fast_tvmscript_import",
    "layout_free_indices",
    "metaschedule",
    "quiet_metaschedule",
    "random_args",
    "reference_output",
    "run_and_time",
    "split_layout_rewrite",
    "target_cores",
    "time_ms",
    "torch_operator",
    "torch_output",
    "torch_threads",
    "untuned_latency",
]
