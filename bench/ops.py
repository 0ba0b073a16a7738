"""Operator benchmark: ours vs TVM MetaSchedule (same number of measurements) vs torch, one run, one target.

    python -m bench.ops [--suite smoke|quick|full] [--cases NAME,...] [--spec FILE] [--budget N]
                        [--json PATH [--resume]] [--no-metaschedule] [--no-torch] [--no-untuned]
                        [--torch-variants eager,channels_last,compile] [--rounds N] [--ablation] [--no-seeds]
    python -m bench.ops --merge REPORT [REPORT ...] [--json PATH]
    python -m bench.ops --retime REPORT [--rounds N] [--json PATH]

For each case, every side at its best:

- ours: our tuner (`tuner.tune`: the ALT search, layouts and loops), the best few
  configurations re-measured at the end (`tune(remeasure=...)`, as a job does) and the
  pick built as the artifact is (our TIR pipeline, constants packed beforehand);
- ALT-OL, the ablation: ours, loops only in the fixed channels-last layout, same budget
  (column "ALT-OL", JSON `ours_loop_only_ms`);
- MetaSchedule: `tune_tir` with `max_trials_global` = the same budget on the same program
  as ours (`Workload.prim_func`: for conv2d_transpose the stride-phase form, not topi's
  zero-dilated one with about 4x the multiply-adds at stride 2), the constants marked
  layout-free as Relax marks weights and the layout rewrite run once beforehand, not in
  the timed function (`bench.baselines.metaschedule(layout_free=True)`);
- torch: eager NCHW, channels_last and `torch.compile` (inductor, `freezing=True`), the
  constants as module parameters, all cores; each variant is reported
  (`torch_variants_ms`) and the fastest is the baseline (`torch_ms`, `torch_best`).

Every program is checked against torch's output, then every program of the case is timed
in a fresh process of its own, one at a time, in shuffled order
(`bench.common.time_fresh`: TVM's thread pool spins for about 0.4 s after a run and would
steal a core from the next program; `--rounds N` times each N times, the median kept). A
reading is the median of 5 repeats of at least 50 ms (`time_evaluator`; torch: the same in
Python). Each run also measures the machine's fp32 FMA peak once (`bench.tensorize.peak_gflops`:
an FMA loop on every core, in a process of its own; report `peak`) and gives each fp32 pick's share
of it (column "%peak", JSON `<pick>_peak_share`): how much room a better search could still find.
Prints one table and writes the JSON report (`bench.common`) to --json or under
bench/results/. With --json the report is written after every case, so a stopped run
keeps what it finished, and the same command with --resume goes on from there (a suite
longer than one sitting runs in pieces); --merge joins reports of one target into one table;
--retime times a report's picks and torch again (no search, `--rounds` rounds, 3 by default), for
readings one round left in doubt.

`--ablation` also runs, at the same budget, (a) the seeds with random layouts, walks and ranking and (b) the
same ranked by the XGBoost model without the PPO agents, beside (c) full ALT and (d) ALT-OL (a second table).
`--no-seeds` runs every search of ours without its seeds (`tune(seeds=False)`: no known loop nests measured
first, no oneDNN-like first layout), so the ablation compares what each search finds on its own.

Suites: `smoke` (two tiny cases, for CI), `quick` (one case per operator kind,
ResNet/MobileNet/BERT-like shapes, the table of ../shared/DESIGN.md), `full`
(three shapes per operator kind: batch 1 and 16, channel counts from ALT's
sec. 7.1 set {3, 16, 32, 64, 512, 960, 1280}), `dot` (int8 and bfloat16 conv2d and
dense on the tensor-instruction paper's shapes: the dot-product instructions). `--spec` takes a JSON list of
operator job specs exactly as `POST /api/v1/jobs` accepts them.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from bench.common import (TORCH_VARIANTS, Column, TorchProgram, TvmProgram, check_report, environment, fmt_ms, fmt_s,
                          fmt_share, fmt_x, format_table, geomean, geomeans, peak_text, save_args, source_commit,
                          speedup, time_fresh, write_json)


@dataclass(frozen=True)
class Case:
    """One operator instance to benchmark."""

    name: str
    operator: str
    params: dict[str, int] = field(hash=False)
    epilogue: str = "none"
    dtype: str = "float32"


def _op(operator: str, name: str, **params: int) -> Case:
    return Case(name, operator, params)


SMOKE = (
    _op("conv2d", "conv2d_tiny", batch=1, in_channels=4, height=8, width=8, out_channels=8, kernel=3, padding=1),
    _op("dense", "dense_tiny", m=16, n=16, k=16),
)

# The shapes of ../shared/DESIGN.md's reference table.
QUICK = (
    _op("conv2d", "conv2d_resnet", batch=1, in_channels=64, height=56, width=56, out_channels=64, kernel=3,
        padding=1),
    _op("group_conv2d", "group_conv2d", batch=1, in_channels=128, height=28, width=28, out_channels=128, kernel=3,
        padding=1, groups=4),
    _op("depthwise_conv2d", "depthwise_mobilenet", batch=1, channels=144, height=56, width=56, kernel=3,
        padding=1),
    _op("dilated_conv2d", "dilated_conv2d", batch=1, in_channels=128, height=28, width=28, out_channels=128,
        kernel=3, padding=2, dilation=2),
    _op("conv3d", "conv3d_r3d", batch=1, in_channels=32, depth=8, height=28, width=28, out_channels=32, kernel=3,
        padding=1),
    _op("conv1d", "conv1d", batch=1, in_channels=64, width=256, out_channels=64, kernel=3, padding=1),
    _op("dense", "gemm_512", m=512, n=512, k=512),
    _op("conv2d_transpose", "conv2d_transpose", batch=1, in_channels=64, height=28, width=28, out_channels=32,
        kernel=4, stride=2, padding=1),
)

# Three shapes per operator kind: batch 1 with few and with many channels, and
# batch 16; channel counts from ALT sec. 7.1 ({3, 16, 32, 64, 512, 960, 1280}),
# shapes from ResNet-18/3D-18, MobileNet-V2 and BERT layers.
FULL = (
    _op("conv2d", "c2d_b1_c3_stem", batch=1, in_channels=3, height=224, width=224, out_channels=64, kernel=7,
        stride=2, padding=3),
    _op("conv2d", "c2d_b1_c512", batch=1, in_channels=512, height=7, width=7, out_channels=512, kernel=3,
        padding=1),
    _op("conv2d", "c2d_b16_c64", batch=16, in_channels=64, height=56, width=56, out_channels=64, kernel=3,
        padding=1),
    _op("group_conv2d", "grp_b1_c64", batch=1, in_channels=64, height=56, width=56, out_channels=64, kernel=3,
        padding=1, groups=4),
    _op("group_conv2d", "grp_b1_c512", batch=1, in_channels=512, height=14, width=14, out_channels=512, kernel=3,
        padding=1, groups=32),
    _op("group_conv2d", "grp_b16_c32", batch=16, in_channels=32, height=28, width=28, out_channels=32, kernel=3,
        padding=1, groups=4),
    _op("depthwise_conv2d", "dep_b1_c32", batch=1, channels=32, height=112, width=112, kernel=3, padding=1),
    _op("depthwise_conv2d", "dep_b1_c960", batch=1, channels=960, height=7, width=7, kernel=3, padding=1),
    _op("depthwise_conv2d", "dep_b16_c64", batch=16, channels=64, height=56, width=56, kernel=3, stride=2,
        padding=1),
    _op("dilated_conv2d", "dil_b1_c64", batch=1, in_channels=64, height=56, width=56, out_channels=64, kernel=3,
        padding=2, dilation=2),
    _op("dilated_conv2d", "dil_b1_c512", batch=1, in_channels=512, height=14, width=14, out_channels=512,
        kernel=3, padding=2, dilation=2),
    _op("dilated_conv2d", "dil_b16_c32", batch=16, in_channels=32, height=28, width=28, out_channels=32,
        kernel=3, padding=2, dilation=2),
    _op("conv3d", "c3d_b1_c3", batch=1, in_channels=3, depth=16, height=56, width=56, out_channels=64, kernel=3,
        padding=1),
    _op("conv3d", "c3d_b1_c512", batch=1, in_channels=512, depth=2, height=7, width=7, out_channels=512, kernel=3,
        padding=1),
    _op("conv3d", "c3d_b16_c32", batch=16, in_channels=32, depth=8, height=14, width=14, out_channels=32,
        kernel=3, padding=1),
    _op("conv1d", "c1d_b1_c16", batch=1, in_channels=16, width=1024, out_channels=64, kernel=3, padding=1),
    _op("conv1d", "c1d_b1_c512", batch=1, in_channels=512, width=128, out_channels=512, kernel=3, padding=1),
    _op("conv1d", "c1d_b16_c64", batch=16, in_channels=64, width=256, out_channels=64, kernel=3, padding=1),
    _op("dense", "gemm_b1_c1280", m=1, n=1000, k=1280),  # MobileNet-V2 classifier
    _op("dense", "gemm_512", m=512, n=512, k=512),
    _op("dense", "gemm_b16_bert", m=16 * 128, n=768, k=768),  # BERT-base projection, 16 sequences of 128
    _op("conv2d_transpose", "t2d_b1_c512", batch=1, in_channels=512, height=7, width=7, out_channels=256,
        kernel=4, stride=2, padding=1),
    _op("conv2d_transpose", "t2d_b1_c64", batch=1, in_channels=64, height=28, width=28, out_channels=32,
        kernel=4, stride=2, padding=1),
    _op("conv2d_transpose", "t2d_b16_c32", batch=16, in_channels=32, height=28, width=28, out_channels=16,
        kernel=4, stride=2, padding=1),
)

# int8 and bfloat16 (-> fp32) operator jobs on the tensor-instruction paper's Table II shapes, which divide
# neither the instructions' lanes nor their groups (255, 127 channels; 55x55 maps): ours runs the layout
# template's dot-product form (`compiler.layout.templates`), tensorized where the target has the instruction.
# The int8 ones are a quantized network's layers: u8 x s8 -> s32, bias, ReLU and the requantization to uint8,
# against torch.ao's quantized conv2d / linear (x86 engine: FBGEMM / oneDNN); torch's bf16 operators are oneDNN's.
DOT = tuple(
    replace(case, name=f"{case.name}_{short}", dtype=dtype, epilogue=epilogue)
    for dtype, short, epilogue in (("int8", "i8", "bias_relu_requantize"), ("bfloat16", "bf16", "none"))
    for case in (
        _op("conv2d", "c2d_55x55_128_to_255", batch=1, in_channels=128, height=55, width=55, out_channels=255,
            kernel=3, padding=1),
        _op("conv2d", "c2d_55x55_255_to_127", batch=1, in_channels=255, height=55, width=55, out_channels=127,
            kernel=3, padding=1),
        _op("dense", "gemm_3025x127x255", m=3025, n=127, k=255),
        _op("dense", "gemm_255x255x255", m=255, n=255, k=255),
        _op("dense", "gemm_127x1000x127", m=127, n=1000, k=127),
    )
)

SUITES: dict[str, tuple[tuple[Case, ...], int]] = {  # name -> (cases, default budget)
    "smoke": (SMOKE, 8),
    "quick": (QUICK, 128),
    "full": (FULL, 300),
    "dot": (DOT, 64),
}


@dataclass(frozen=True)
class Options:
    """What to run beside ours, and where MetaSchedule writes its run folders."""

    metaschedule: bool = True
    torch: bool = True
    untuned: bool = True
    work_dir: Path | None = None
    loop_only: bool = True  # the ALT-OL ablation column
    layout_levels: int = 1  # ours: one- or two-level layout templates
    torch_variants: tuple[str, ...] = TORCH_VARIANTS
    rounds: int = 1  # fresh-process readings per program (median)
    ablation: bool = False  # also the seeds with random walks, and the XGBoost search without PPO (ABLATIONS)
    peak: bool = True  # measure this machine's fp32 FMA peak once per run (each pick's share of it)
    seeds: bool = True  # False: every search of ours without its known nests and oneDNN-like first layout


# the search ablation (`--ablation`): name -> `tune` options; full ALT is "ours", ALT-OL "ours_loop_only"
ABLATIONS: dict[str, dict[str, Any]] = {
    "ablation_seeds_random": {"ppo": False, "cost_model": "random"},  # (a) the seeds, random layouts and walks
    "ablation_xgb": {"ppo": False},  # (b) the seeds, random layouts and walks, ranked by the cost model
}


# ---------------------------------------------------------------------------
# Picking cases


def select(suite: str, names: list[str] | None) -> list[Case]:
    """The cases of `suite`, or the named ones in the given order (ValueError for an unknown name)."""
    if suite not in SUITES:
        raise ValueError(f"unknown suite: {suite!r}; known: {', '.join(SUITES)}")
    cases = SUITES[suite][0]
    if not names:
        return list(cases)
    by_name = {c.name: c for c in cases}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise ValueError(f"unknown case(s) in suite {suite}: {', '.join(unknown)}; known: {', '.join(by_name)}")
    return [by_name[n] for n in names]


@dataclass(frozen=True)
class SpecCase:
    """A case from a job spec: its own target, budget and seed."""

    case: Case
    target: str
    budget: int
    seed: int


def load_specs(path: Path) -> list[SpecCase]:
    """Reads a JSON list of operator job specs, validated as `POST /api/v1/jobs` validates them.

    Raises:
        ValueError: the file is not a JSON list, or a spec is invalid (with its index).
    """
    from pydantic import ValidationError

    from compiler.workloads import WorkloadError, validate
    from service.schemas import OperatorJobCreate

    specs = json.loads(Path(path).read_text())
    if not isinstance(specs, list):
        raise ValueError(f"{path}: expected a JSON list of operator job specs, got {type(specs).__name__}")
    out = []
    for i, raw in enumerate(specs):
        try:
            spec = OperatorJobCreate.model_validate(raw)
            params = validate(spec.operator, spec.params, spec.dtype, spec.epilogue)
        except (ValidationError, WorkloadError) as e:
            raise ValueError(f"{path}: spec [{i}]: {e}") from e
        name = f"{i}_{spec.operator}" + ("" if spec.epilogue == "none" else f"_{spec.epilogue}")
        out.append(SpecCase(Case(name, spec.operator, params, spec.epilogue, spec.dtype),
                            spec.target, spec.budget, spec.seed))
    return out


# ---------------------------------------------------------------------------
# Running


def _layout_of(trial: Any) -> str | None:
    """The data layout a trial chose, as text (the output layout; None: the user's layouts, loops only)."""
    return trial.extra.get("layout") if trial is not None else None


def run_ours(task: Any, request: Any, inputs: list, expected: Any, programs: dict[str, Any],
             folder: Path, *, prefix: str = "ours", **options: Any) -> dict:
    """Tunes `task` as an operator job does (`tuner.operator.tune_operator`; `options` go on to `tune`: the
    ablations), then builds and checks the configuration it picks.

    The best few configurations are measured again at the end (`remeasure_count(budget)`, as a job
    does) and the fastest then is the pick. A configuration in tuned layouts runs as the artifact
    does: data and output in the user's layouts, the constants packed once beforehand (not timed). A
    correct program goes into `programs` under `prefix` (exported to `folder`): `run_case` times it
    with the others.
    """
    from tuner.operator import tune_operator

    start = time.perf_counter()
    result = tune_operator(task, request, **options)
    named = (lambda key: f"{prefix}_{key}") if prefix != "ours" else (lambda key: key)
    row: dict[str, Any] = {
        f"{prefix}_tune_s": time.perf_counter() - start,
        f"{prefix}_trials": len(result.trials),
        f"{prefix}_errors": sum(t.error is not None for t in result.trials),
        f"{prefix}_ms": None,
        f"{prefix}_correct": False,
        named("layout"): None,
        named("config"): None,
    }
    pick = result.final
    if pick is None:
        errors = {t.error for t in result.trials if t.error}
        row[named("error")] = (f"{prefix}: no correct trial in {len(result.trials)}"
                               + (f" (e.g. {sorted(errors)[0][:200]})" if errors else ""))
        return row
    row[named("config")] = pick.config
    row[named("layout")] = _layout_of(pick)
    row[f"{prefix}_search_ms"] = result.best.latency_ms  # the search's best reading (the winner's curse)
    row[f"{prefix}_final_ms"] = result.final_ms  # the pick's re-measured latency
    row[f"{prefix}_remeasured"] = len(result.remeasured_ms)
    program, error = build_pick(task, pick.config, inputs, expected, folder, prefix)
    row[f"{prefix}_correct"] = program is not None
    if program is None:
        row[named("error")] = error
        return row
    programs[prefix] = program
    return row


def build_pick(task: Any, config: dict, inputs: list, expected: Any, folder: Path,
               prefix: str) -> tuple[TvmProgram | None, str | None]:
    """`config` built as the artifact is (our pipeline; constants packed beforehand, not timed), exported to
    `folder` and checked against `expected`: (the program, None), or (None, why not)."""
    from compiler.arrays import check_close
    from tuner import apply_config, layout_of_config

    try:
        prog = layout_of_config(task, config)
        args = inputs if prog is None else prog.pack_inputs(inputs)
        program, out = _export(apply_config(task, config), task.prim_func, task.target, args, folder / prefix,
                               pipeline="licm")
    except Exception as e:  # noqa: BLE001 - a failed case is reported, the others still run
        return None, f"{prefix}: best configuration failed to build or run: {type(e).__name__}: {e}"[:500]
    mismatch = check_close(out, expected)
    return (program, None) if mismatch is None else (None, f"{prefix}: {mismatch}")


def _export(mod: Any, prim_func: Any, target: Any, args: list, path: Path,
            pipeline: str | None = None) -> tuple[TvmProgram, Any]:
    """`mod` built once (our pipeline, or TVM's default when None), exported with its arguments for
    `time_fresh`, and run once on them; (the program, its output)."""
    import numpy as np
    import tvm

    from compiler.arrays import arg_specs
    from compiler.build import compile_module

    built = tvm.compile(mod, target=target) if pipeline is None else compile_module(mod, target, pipeline)
    built.export_library(str(path.with_suffix(".so")))
    shape, dtype = arg_specs(prim_func)[-1]
    arrays = [*args, np.zeros(shape, dtype)]
    tensors = [tvm.runtime.tensor(np.ascontiguousarray(a)) for a in arrays]
    built.jit()["main"](*tensors)
    program = TvmProgram(str(path.with_suffix(".so")), save_args(arrays, path.with_suffix(".npz")))
    return program, tensors[-1].numpy()


def torch_programs(case: Case, seed: int, variants: Sequence[str]) -> dict[str, TorchProgram]:
    """The torch variants of a case (channels_last only where an input is 4-D or 5-D)."""
    from bench.baselines import torch_operator
    from compiler.workloads import make_workload

    wl = make_workload(case.operator, case.params, case.dtype, case.epilogue)
    out = {}
    for variant in variants:
        if variant == "channels_last" and len(wl.inputs[0].shape) not in (4, 5):
            continue
        out[f"torch_{variant}"] = TorchProgram(torch_operator, (case.operator, dict(case.params), case.dtype,
                                                                case.epilogue, seed), variant)
    return out


def run_case(case: Case, target_name: str, budget: int, seed: int, options: Options) -> dict:
    """Runs ours and the baselines on one case, then times them; never raises for a failure of one of them."""
    from dataclasses import replace

    from bench.baselines import metaschedule, untuned_latency
    from tuner.operator import task_from_request
    from tuner.request import TuneRequest

    # the task a job of this request would tune (the worker and `altune tune` build it the same way)
    request = TuneRequest(case.operator, case.params, case.dtype, case.epilogue, target_name, budget=budget, seed=seed,
                          layout_levels=options.layout_levels)
    task = task_from_request(request)
    wl, target = task.workload, task.target
    inputs = wl.random_inputs(seed)
    expected = wl.reference(inputs)
    row: dict[str, Any] = {
        "name": case.name,
        "operator": case.operator,
        "params": dict(wl.params),
        "epilogue": case.epilogue,
        "workload_key": wl.key,
        "flops": wl.flops,
        "budget": budget,
        "commit": source_commit(),  # a suite run in pieces (--resume, --merge) may span versions
        "untuned_ms": untuned_latency(wl.prim_func, target, inputs) if options.untuned else None,
    }
    task = replace(task, name=case.name, inputs=inputs, expected=expected)
    programs: dict[str, Any] = {}  # every correct program, timed together at the end
    with tempfile.TemporaryDirectory(prefix="altune-bench-programs-") as tmp:
        folder = Path(tmp)
        row["layout_levels"] = options.layout_levels
        row["seeds"] = options.seeds
        row.update(run_ours(task, request, inputs, expected, programs, folder, seeds=options.seeds))
        if options.loop_only:  # ALT-OL: loops only, in the fixed channels-last layout (NHWO / MN)
            row.update(run_ours(task, request, inputs, expected, programs, folder, prefix="ours_loop_only",
                                layout={}, seeds=options.seeds))
        if options.ablation:  # what the agents and the model add over the seeds, at the same budget
            for prefix, tune_options in ABLATIONS.items():
                row.update(run_ours(task, request, inputs, expected, programs, folder, prefix=prefix,
                                    seeds=options.seeds, **tune_options))

        row.update(metaschedule_ms=None, metaschedule_tune_s=None, metaschedule_trials=None,
                   metaschedule_correct=None, metaschedule_error=None)
        if options.metaschedule:
            # the same program as ours (the stride-phase conv2d_transpose too), constants layout-free
            ms = metaschedule(wl.prim_func, target, budget, options.work_dir, seed=seed, inputs=inputs,
                              expected=expected, layout_free=True)
            row.update(metaschedule_tune_s=ms.tune_s, metaschedule_trials=ms.trials, metaschedule_correct=ms.correct,
                       metaschedule_error=ms.error, metaschedule_alone_ms=ms.latency_ms,
                       metaschedule_rewritten=list(ms.prepacked.rewritten) if ms.prepacked else [])
            if ms.correct:
                programs["metaschedule"], _ = _export(ms.mod, wl.prim_func, target, ms.args(inputs, target),
                                                      folder / "metaschedule")
        if options.torch:
            programs.update(torch_programs(case, seed, options.torch_variants))
        # each in a fresh process, one at a time, in shuffled order
        timings = time_fresh(programs, seed=seed, rounds=options.rounds)
    _record_timings(row, timings)
    return row


def _record_timings(row: dict, timings: Any) -> None:
    """The readings of `timings` into `row` (ours, its ablations, MetaSchedule, each torch variant and the best),
    then the speedups and whether the row is correct (ours checked, MetaSchedule not found wrong)."""
    row["correct"] = bool(row.get("ours_correct")) and row.get("metaschedule_correct") is not False
    for name in ("ours", "ours_loop_only", "metaschedule", *ABLATIONS):
        if name in timings.ms:
            row[f"{name}_ms"] = timings.ms[name]
    variants = {name[len("torch_"):]: ms_ for name, ms_ in timings.ms.items() if name.startswith("torch_")}
    if variants:
        timed = {v: ms_ for v, ms_ in variants.items() if ms_ is not None}
        row["torch_variants_ms"] = variants
        row["torch_best"] = min(timed, key=timed.get) if timed else None
        row["torch_ms"] = timed[row["torch_best"]] if timed else None
    row.setdefault("torch_ms", None)  # --no-torch
    row.setdefault("metaschedule_ms", None)  # --no-metaschedule
    row["timing"] = "fresh-process"
    row["timing_order"] = [str(n) for n in timings.order]
    row["ours_gflops"] = row["flops"] / row["ours_ms"] / 1e6 if row["ours_ms"] else None
    row["vs_metaschedule"] = speedup(row["metaschedule_ms"], row["ours_ms"])
    row["vs_torch"] = speedup(row["torch_ms"], row["ours_ms"])
    row["vs_loop_only"] = speedup(row.get("ours_loop_only_ms"), row["ours_ms"])
    for prefix in ABLATIONS:
        if f"{prefix}_ms" in row:
            row[f"vs_{prefix}"] = speedup(row[f"{prefix}_ms"], row["ours_ms"])


# the picks a report row holds: program name -> the row's key of its configuration
PICKS = {"ours": "config", "ours_loop_only": "ours_loop_only_config", **{p: f"{p}_config" for p in ABLATIONS}}


def retime(earlier: dict, *, target: str = "host", seed: int = 0, rounds: int = 3,
           variants: Sequence[str] = TORCH_VARIANTS, log: Any = sys.stderr) -> dict:
    """The report `earlier` with its programs timed again, searching nothing: each row's picks (ours, ALT-OL and
    the ablations' configurations) rebuilt and checked, the torch variants, all in fresh processes, `rounds`
    rounds in shuffled order (the median kept). MetaSchedule's schedule is not in the report: its reading stays
    the earlier run's (`retimed` lists what was timed again).

    Raises:
        ValueError: the report was measured on another target than `target` resolves to here.
    """
    from compiler.target import target_key
    from tuner.operator import task_from_request
    from tuner.request import TuneRequest

    check_report(earlier)
    if earlier["target"] != target_key(target):
        raise ValueError(f"the report was measured on {earlier['target']!r}, this machine's {target!r} is "
                         f"{target_key(target)!r}: re-timing on another CPU says nothing about that run")
    rows = []
    for i, old in enumerate(earlier["cases"]):
        print(f"[{i + 1}/{len(earlier['cases'])}] {old['name']}: re-timing ...", file=log, flush=True)
        row = dict(old)
        case = Case(row["name"], row["operator"], dict(row["params"]), row.get("epilogue", "none"), _dtype(row))
        task = task_from_request(TuneRequest(case.operator, case.params, case.dtype, case.epilogue, target))
        inputs = task.workload.random_inputs(seed)
        expected = task.workload.reference(inputs)
        task = replace(task, name=case.name, inputs=inputs, expected=expected)
        programs: dict[str, Any] = {}
        with tempfile.TemporaryDirectory(prefix="altune-bench-retime-") as tmp:
            for name, key in PICKS.items():
                if row.get(key) is None:
                    continue
                program, error = build_pick(task, row[key], inputs, expected, Path(tmp), name)
                if program is None:
                    row[f"{name}_ms"], row[f"{name}_correct"] = None, False
                    row["error" if name == "ours" else f"{name}_error"] = error
                else:
                    programs[name] = program
            if variants:
                programs.update(torch_programs(case, seed, variants))
            timings = time_fresh(programs, seed=seed, rounds=rounds)
        _record_timings(row, timings)
        row["retimed"], row["rounds"] = sorted(programs), rounds
        rows.append(row)
    out = report(earlier["suite"], earlier["target"], earlier.get("budgets", [earlier["budget"]]), rows,
                 peak=measure_peak(target))
    out["retimed_from"] = earlier.get("environment", {}).get("date_utc")
    return out


def run(
    suite: str,
    cases: list[Case] | list[SpecCase],
    *,
    target: str = "host",
    budget: int | None = None,
    seed: int = 0,
    options: Options = Options(),
    log: Any = sys.stderr,
    done: Sequence[dict] = (),
    on_case: Callable[[dict], None] | None = None,
) -> dict:
    """Runs `cases` and returns the report (see `bench.common`).

    Args:
        suite: the suite's name (or "spec" for job specs), recorded in the report.
        cases: suite cases, or `SpecCase`s that carry their own target, budget and seed.
        target: target name for suite cases.
        budget: measurements per tuner; for spec cases, overrides the spec's budget when given.
        seed: seed of inputs, ours and MetaSchedule for suite cases.
        options: which baselines to run.
        log: where progress lines go.
        done: rows of an earlier run (interrupted, or of other cases); the cases they hold are not
            run again, and all of them stay in the report.
        on_case: called with the report so far after every case (to save it as it grows).
    """
    from compiler.target import target_key

    default_budget = SUITES[suite][1] if suite in SUITES else 64
    plan = []
    for c in cases:
        if isinstance(c, SpecCase):
            plan.append((c.case, c.target, budget if budget is not None else c.budget, c.seed))
        else:
            plan.append((c, target, budget if budget is not None else default_budget, seed))
    targets = {target_key(t) for _, t, _, _ in plan}
    if len(targets) > 1:
        raise ValueError(f"one benchmark runs on one target; the cases name {sorted(targets)}")
    budgets = sorted({b for _, _, b, _ in plan})
    target_text = targets.pop() if targets else target_key(target)
    finished = {r["name"]: r for r in done}
    planned = {c.name for c, _, _, _ in plan}
    # the earlier report's other cases stay in it: a run of some cases (--cases) adds to a report
    rows = [r for r in done if r["name"] not in planned]
    rows += [finished[c.name] for c, _, _, _ in plan if c.name in finished]
    peak = measure_peak(plan[0][1] if plan else target) if options.peak else None  # a target name, not its key

    with tempfile.TemporaryDirectory(prefix="altune-bench-") as tmp:
        work = options.work_dir if options.work_dir is not None else Path(tmp)
        opts = replace(options, work_dir=work)
        for i, (case, target_name, case_budget, case_seed) in enumerate(plan):
            if case.name in finished:
                print(f"[{i + 1}/{len(plan)}] {case.name}: done in the earlier run", file=log, flush=True)
                continue
            print(f"[{i + 1}/{len(plan)}] {case.name} (budget {case_budget}) ...", file=log, flush=True)
            row = run_case(case, target_name, case_budget, case_seed, opts)
            torch_text = ", ".join(f"{v} {fmt_ms(ms_)}" for v, ms_ in row.get("torch_variants_ms", {}).items())
            print(f"    ours {fmt_ms(row['ours_ms'])} ms ({row.get('layout')}), "
                  f"loop-only {fmt_ms(row.get('ours_loop_only_ms'))} ms, "
                  f"MetaSchedule {fmt_ms(row['metaschedule_ms'])} ms, "
                  f"torch {fmt_ms(row['torch_ms'])} ms ({torch_text})"
                  + (f"  [{row['error']}]" if row.get("error") else ""), file=log, flush=True)
            rows.append(row)
            if on_case is not None:
                on_case(report(suite, target_text, budgets or [budget or default_budget], rows, peak=peak))
    return report(suite, target_text, budgets or [budget or default_budget], rows, peak=peak)


def report(suite: str, target: str, budgets: list[int], rows: list[dict], env: dict | None = None,
           peak: dict | None = None) -> dict:
    """The report of `rows` (see `bench.common`), with its geomeans, `env` (default: this machine's) and the
    machine's measured fp32 peak (`bench.tensorize.peak_gflops`; None: not measured), each fp32 pick's share of it
    in its row (`<pick>_peak_share`)."""
    for row in rows:
        _peak_shares(row, peak)
    return {
        "suite": suite,
        "target": target,
        "budget": max(budgets),
        "budgets": sorted(set(budgets)),
        "cases": rows,
        "geomean": {**geomeans(rows), "vs_loop_only": geomean(r.get("vs_loop_only") for r in rows),
                    **{f"vs_{p}": geomean(r.get(f"vs_{p}") for r in rows) for p in ABLATIONS
                       if any(f"vs_{p}" in r for r in rows)}},
        "environment": env if env is not None else environment(),
        "peak": peak,
    }


def _dtype(row: dict) -> str | None:
    """A row's dtype, from its workload key ("operator[params]:dtype:epilogue"); None without one."""
    parts = row.get("workload_key", "").rsplit(":", 2)
    return parts[1] if len(parts) == 3 else None


def _peak_shares(row: dict, peak: dict | None) -> None:
    """`<pick>_peak_share`: a float32 pick's GFLOP/s over `peak`'s (how much room a faster search could still find)."""
    fp32 = _dtype(row) == "float32"
    for name in PICKS:
        ms = row.get(f"{name}_ms")
        row[f"{name}_peak_share"] = (row["flops"] / ms / 1e6 / peak["gflops"]
                                     if fp32 and peak and ms and row.get("flops") else None)


def measure_peak(target: str) -> dict | None:
    """This machine's fp32 FMA peak (`bench.tensorize.peak_gflops`, in a process of its own); None if it fails."""
    from bench.common import MIN_REPEAT_MS, REPEAT
    from bench.tensorize import peak_gflops
    from compiler.target import resolve_target

    try:
        return peak_gflops(resolve_target(target), REPEAT, int(MIN_REPEAT_MS))
    except Exception as e:  # noqa: BLE001 - a table without the peak column is still a table
        print(f"fp32 peak not measured: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        return None


def resumable_rows(path: Path, suite: str, target: str, budget: int | None) -> list[dict]:
    """The finished cases of the report at `path`, checked to be of the same suite, target and budget.

    Raises:
        ValueError: the report is of another suite, target or budget, so its rows do not belong here.
    """
    from compiler.target import target_key

    earlier = json.loads(Path(path).read_text())
    check_report(earlier)
    default_budget = SUITES[suite][1] if suite in SUITES else earlier["budget"]
    want = {"suite": suite, "target": target_key(target), "budget": budget if budget is not None else default_budget}
    for key, value in want.items():
        if earlier[key] != value:
            raise ValueError(f"--resume: {path} is a report of {key} {earlier[key]!r}, this run's is {value!r}")
    return earlier["cases"]


def merge(reports: list[dict]) -> dict:
    """One report of the cases of several (a suite run in pieces), later pieces winning a case run twice.

    Raises:
        ValueError: the reports are of different targets (their latencies do not compare).
    """
    for r in reports:
        check_report(r)
    targets = sorted({r["target"] for r in reports})
    if len(targets) != 1:
        raise ValueError(f"reports of one target only can be merged; these are of {targets}")
    rows = list({c["name"]: c for r in reports for c in r["cases"]}.values())
    suites = sorted({r["suite"] for r in reports})
    merged = report(suites[0] if len(suites) == 1 else "+".join(suites), targets[0],
                    [b for r in reports for b in r.get("budgets", [r["budget"]])], rows,
                    env=reports[-1].get("environment", {}), peak=reports[-1].get("peak"))
    merged["merged_from"] = [r.get("environment", {}).get("date_utc") for r in reports]
    return merged


# ---------------------------------------------------------------------------
# Output


def _correct_cell(row: dict) -> str:
    if row["correct"]:
        return "yes"
    if not row.get("ours_correct"):
        return "NO (ours)"
    return "NO (MS)"


COLUMNS = (
    Column("case", lambda r: r["name"], right=False),
    Column("untuned ms", lambda r: fmt_ms(r.get("untuned_ms"))),
    Column("ours ms", lambda r: fmt_ms(r.get("ours_ms"))),
    Column("ALT-OL ms", lambda r: fmt_ms(r.get("ours_loop_only_ms"))),
    Column("MS ms", lambda r: fmt_ms(r.get("metaschedule_ms"))),
    Column("torch ms", lambda r: fmt_ms(r.get("torch_ms")) + (f" ({r['torch_best']})" if r.get("torch_best") else "")),
    Column("vs MS", lambda r: fmt_x(r.get("vs_metaschedule"))),
    Column("vs torch", lambda r: fmt_x(r.get("vs_torch"))),
    Column("vs OL", lambda r: fmt_x(r.get("vs_loop_only"))),
    Column("%peak", lambda r: fmt_share(r.get("ours_peak_share"))),
    Column("ours tune s", lambda r: fmt_s(r.get("ours_tune_s"))),
    Column("OL tune s", lambda r: fmt_s(r.get("ours_loop_only_tune_s"))),
    Column("MS tune s", lambda r: fmt_s(r.get("metaschedule_tune_s"))),
    Column("correct", _correct_cell, right=False),
    Column("layout", lambda r: r.get("layout") or "-", right=False),
)


def _cpu(report: dict) -> str:
    env = report.get("environment", {})
    return ", ".join(str(v) for v in (env.get("cpu_model"), env.get("cpu")) if v) or "CPU unknown"


ABLATION_COLUMNS = (
    Column("case", lambda r: r["name"], right=False),
    Column("(a) seeds+random ms", lambda r: fmt_ms(r.get("ablation_seeds_random_ms"))),
    Column("(b) xgb, no PPO ms", lambda r: fmt_ms(r.get("ablation_xgb_ms"))),
    Column("(c) ALT ms", lambda r: fmt_ms(r.get("ours_ms"))),
    Column("(d) ALT-OL ms", lambda r: fmt_ms(r.get("ours_loop_only_ms"))),
    Column("c vs a", lambda r: fmt_x(r.get("vs_ablation_seeds_random"))),
    Column("c vs b", lambda r: fmt_x(r.get("vs_ablation_xgb"))),
    Column("c vs d", lambda r: fmt_x(r.get("vs_loop_only"))),
    Column("a %peak", lambda r: fmt_share(r.get("ablation_seeds_random_peak_share"))),
    Column("c %peak", lambda r: fmt_share(r.get("ours_peak_share"))),
)


def ablation_table(report: dict) -> str:
    """The search ablation of `--ablation` (same budget, the same seeds, or none with `--no-seeds`): (a) the seeds
    with random layouts, walks and ranking, (b) the same ranked by the XGBoost model, (c) full ALT, (d) ALT-OL."""
    g = report["geomean"]
    footer = [{"name": "geomean", "vs_ablation_seeds_random": g.get("vs_ablation_seeds_random"),
               "vs_ablation_xgb": g.get("vs_ablation_xgb"), "vs_loop_only": g.get("vs_loop_only")}]
    seeds = "no seeds in any search" if any(r.get("seeds") is False for r in report["cases"]) else "the same seeds"
    return "\n".join([f"search ablation, budget {report['budget']} each, {seeds}, {_cpu(report)}{peak_text(report)}",
                      format_table(ABLATION_COLUMNS, report["cases"], footer)])


def table(report: dict) -> str:
    """The report as a text table, with a geomean row and the failures below it."""
    g = report["geomean"]
    footer = [{"name": "geomean", "vs_metaschedule": g["vs_metaschedule"], "vs_torch": g["vs_torch"],
               "vs_loop_only": g.get("vs_loop_only"),
               "correct": all(r["correct"] for r in report["cases"]), "ours_correct": True}]
    head = (f"suite {report['suite']}, target {report['target']} ({_cpu(report)}), "
            f"budget {report['budget']} on-device measurements each (ours and MetaSchedule); torch = the best of "
            f"its variants; each program timed in a fresh process; speedup = baseline ms / ours ms{peak_text(report)}")
    notes = [f"  {r['name']}: {r['error']}" for r in report["cases"] if r.get("error")]
    notes += [f"  {r['name']}: {r['ours_loop_only_error']}" for r in report["cases"] if r.get("ours_loop_only_error")]
    notes += [f"  {r['name']}: {r['metaschedule_error']}" for r in report["cases"] if r.get("metaschedule_error")]
    return "\n".join([head, format_table(COLUMNS, report["cases"], footer), *notes])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.ops", description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--suite", default="quick", choices=sorted(SUITES), help="case suite (default quick)")
    parser.add_argument("--cases", help="comma-separated case names of the suite (default: all)")
    parser.add_argument("--spec", type=Path, help="JSON list of operator job specs (POST /api/v1/jobs format)")
    parser.add_argument("--budget", type=int, help="on-device measurements per tuner (default: the suite's)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--target", default="host", help="target name for suite cases (default host)")
    parser.add_argument("--json", type=Path, help="where to write the report (default bench/results/...)")
    parser.add_argument("--work-dir", type=Path, help="keep MetaSchedule's run folders (logs, database) here")
    parser.add_argument("--no-metaschedule", action="store_true", help="skip the MetaSchedule baseline")
    parser.add_argument("--no-torch", action="store_true", help="skip the torch baseline")
    parser.add_argument("--no-untuned", action="store_true", help="skip timing the untuned program")
    parser.add_argument("--no-loop-only", action="store_true",
                        help="skip the ALT-OL ablation (ours, loops only, fixed channels-last layout)")
    parser.add_argument("--torch-variants", default=",".join(TORCH_VARIANTS),
                        help=f"comma-separated torch variants to time (default: all of {', '.join(TORCH_VARIANTS)})")
    parser.add_argument("--rounds", type=int,
                        help="fresh-process readings per program, in a new shuffled order each round (median)")
    parser.add_argument("--layout-levels", type=int, default=1, choices=(1, 2),
                        help="ours: one-level layout templates (default, the paper's) or two-level output tiling")
    parser.add_argument("--resume", action="store_true",
                        help="go on with the report at --json: its finished cases are kept, not run again")
    parser.add_argument("--ablation", action="store_true",
                        help="also (a) the seeds with random layouts and walks, (b) the XGBoost search without PPO, "
                             "at the same budget, beside (c) ALT and (d) ALT-OL")
    parser.add_argument("--no-seeds", action="store_true",
                        help="every search of ours (ALT, ALT-OL, the ablations) without its seeds: no known loop nests "
                             "measured first, no oneDNN-like first layout (what the search finds on its own)")
    parser.add_argument("--merge", type=Path, nargs="+", metavar="REPORT",
                        help="run nothing: merge these reports (one target) into one table and --json")
    parser.add_argument("--retime", type=Path, metavar="REPORT",
                        help="search nothing: rebuild the picks of REPORT (this machine's target) and time them and "
                             "torch again in fresh processes, --rounds rounds (default here 3), into --json")
    args = parser.parse_args(argv)
    if args.budget is not None and args.budget < 1:
        parser.error("--budget must be >= 1")
    if args.resume and args.json is None:
        parser.error("--resume needs --json: the report to go on with")
    variants = tuple(v for v in args.torch_variants.split(",") if v)
    if not variants or set(variants) - set(TORCH_VARIANTS):
        parser.error(f"--torch-variants: each of {', '.join(TORCH_VARIANTS)}, got {args.torch_variants!r}")
    if args.rounds is not None and args.rounds < 1:
        parser.error("--rounds must be >= 1")

    if args.retime:
        try:
            retimed = retime(json.loads(args.retime.read_text()), target=args.target, seed=args.seed,
                             rounds=args.rounds or 3, variants=() if args.no_torch else variants)
        except (OSError, ValueError) as e:
            parser.error(f"--retime: {e}")
        print(table(retimed))
        if any("ablation_seeds_random_ms" in r for r in retimed["cases"]):
            print(ablation_table(retimed))
        print(f"wrote {write_json(retimed, args.json)}")
        return 0

    if args.merge:
        try:
            merged = merge([json.loads(Path(p).read_text()) for p in args.merge])
        except (OSError, ValueError) as e:
            parser.error(f"--merge: {e}")
        print(table(merged))
        print(f"wrote {write_json(merged, args.json)}")
        return 0

    try:
        if args.spec is not None:
            if args.cases:
                parser.error("--cases picks suite cases; a --spec file runs all its specs")
            suite, cases = "spec", load_specs(args.spec)
        else:
            suite, cases = args.suite, select(args.suite, args.cases.split(",") if args.cases else None)
        done = (resumable_rows(args.json, suite, args.target, args.budget)
                if args.resume and args.json.exists() else [])
    except ValueError as e:
        parser.error(str(e))
    options = Options(not args.no_metaschedule, not args.no_torch, not args.no_untuned, args.work_dir,
                      not args.no_loop_only, args.layout_levels, variants, args.rounds or 1, args.ablation,
                      seeds=not args.no_seeds)
    # with --json, the report is written after every case: an interrupted run keeps what it finished
    save = (lambda partial: write_json(partial, args.json)) if args.json is not None else None
    final = run(suite, cases, target=args.target, budget=args.budget, seed=args.seed, options=options, done=done,
                on_case=save)
    print(table(final))
    if args.ablation:
        print(ablation_table(final))
    path = write_json(final, args.json)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
