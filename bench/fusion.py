"""basteln fusion against the unfused operators, MetaSchedule on the fused program and torch, per subgraph.

    python -m bench.fusion [--budget 64] [--quick] [--cases NAME...] [--batch 1 8 16] [--rounds N] [--out FILE]

For each catalog subgraph (`compiler.workloads.subgraphs`), in one run on one machine:

- ours: the subgraph tuned as one program in `tuner.spaces.fusion.FusionSpace` (basteln's output tiles,
  redundancy threshold, register blocks, vector length, unroll, and the operators' layouts: as written or
  channel-blocked, `compiler.layout.subgraph_layout`) with `budget` measurements;
- unfused: each complex operator a catalog operator of its own, tuned by our ALT search with an equal
  share of the same budget, the operators between them (softmax, padding) scheduled by basteln
  without a search; its latency is the sum of the parts, each intermediate tensor goes through memory;
- MetaSchedule: `tune_tir` on the same fused program with `budget` measurements;
- torch: eager NCHW, channels_last and `torch.compile` (inductor, frozen), each reported, the best
  of them the baseline.

Each of our searches picks as a job does: its best few configurations measured again at the end, the
fastest then (`tuner.tune.remeasure_count`), not the search's luckiest reading.

Every program is timed in a fresh process of its own, one at a time, in shuffled order (TVM's thread
pool spins after a run and would steal a core from the next program), `--rounds` times in a new order each
round (`bench.common.time_fresh`): a row's `times` are the medians, its `readings` every reading. The table
names the CPU and the `-mcpu`; speedups are geometric means of per-case ratios. Intermediate storage: the
bytes of every tensor between operators (unfused) against basteln's per-tile scratch.

Each run also measures the machine's fp32 FMA peak once (`bench.ops.measure_peak`, report `peak`) and gives
ours and the unfused operators their share of it (`ours_peak_share`, `unfused_peak_share`: the subgraph's
multiply-adds over its time, columns "%peak") and the most any program of these multiply-adds can gain over
the unfused operators (`fusion_ceiling`: their time over the time of the multiply-adds at the peak, column
"ceiling"). Fusion saves memory traffic, not arithmetic: where the unfused operators already run near the
peak, no fused program can be much faster (softmax's exponentials and conversions are not counted, so the
ceiling is an upper bound).

Only `bench` runs this (bench -> tuner -> compiler).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tvm import te, tirx, topi

from bench.baselines import metaschedule as tune_metaschedule
from bench.common import RESULTS_DIR, Column, TorchProgram, TvmProgram, fmt_ms, fmt_s, fmt_share, fmt_x, format_table
from bench.common import geomean, peak_text, speedup, time_fresh
from bench.environment import environment
from bench.ops import measure_bandwidth, measure_peak
from bench.torch_programs import torch_subgraph
from compiler.arrays import arg_specs
from compiler.build import build
from compiler.passes.basteln import basteln
from compiler.target import host_caches, host_cores, resolve_target, target_key
from compiler.workloads import make_workload
from tuner import LocalMeasurer, apply_config
from tuner.operator import task_from_request, tune_operator
from tuner.request import TuneRequest
from tuner.spaces.fusion import FusionSpace


@dataclass(frozen=True)
class Case:
    """A subgraph and how its operators look on their own (`parts`: catalog specs or "te" stages)."""

    name: str
    operator: str
    params: dict
    parts: tuple[dict, ...]


def _conv(c_in: int, h: int, w: int, c_out: int, k: int, pad: int, epilogue: str) -> dict:
    return {"operator": "conv2d", "params": {"batch": 1, "in_channels": c_in, "height": h, "width": w, "out_channels": c_out,
                                             "kernel": k, "stride": 1, "padding": pad}, "epilogue": epilogue}


CASES = (
    # ResNet-50's bottleneck at 56x56: the 3x3 conv and the 1x1 expansion after it (a 784 KiB intermediate)
    Case("resnet50 conv3x3->conv1x1", "conv3x3_conv1x1",
         {"in_channels": 64, "height": 56, "width": 56, "mid_channels": 64, "out_channels": 256},
         (_conv(64, 56, 56, 64, 3, 1, "relu"), _conv(64, 56, 56, 256, 1, 0, "relu"))),
    # MobileNet-V2's block 3 at 56x56: depthwise 144 channels, projection to 24 (a 1.7 MiB intermediate)
    Case("mobilenet_v2 dw->pw", "depthwise_pointwise",
         {"channels": 144, "height": 56, "width": 56, "out_channels": 24, "kernel": 3},
         ({"operator": "depthwise_conv2d", "params": {"batch": 1, "channels": 144, "height": 56, "width": 56,
                                                      "kernel": 3, "stride": 1, "padding": 1}, "epilogue": "relu"},
          _conv(144, 56, 56, 24, 1, 0, "relu"))),
    Case("pad->conv->bias->relu", "pad_conv_bias_relu",
         {"in_channels": 64, "height": 56, "width": 56, "out_channels": 64, "kernel": 3, "padding": 1},
         ({"te": "pad", "shape": (1, 64, 56, 56), "padding": 1}, _conv(64, 58, 58, 64, 3, 0, "bias_relu"))),
    # BERT-base's attention head (12 heads, 128 tokens, 64 per head)
    Case("bert-base attention", "matmul_softmax_matmul", {"heads": 12, "seq": 128, "dim": 64},
         ({"operator": "batch_matmul", "params": {"batch": 12, "m": 128, "n": 128, "k": 64}, "epilogue": "none"},
          {"te": "softmax", "shape": (12, 128, 128)},
          {"operator": "batch_matmul", "params": {"batch": 12, "m": 128, "n": 64, "k": 128}, "epilogue": "none"})),
)
QUICK = ("mobilenet_v2 dw->pw", "bert-base attention")


def batched(case: Case, batch: int) -> Case:
    """`case` at a batch of `batch` images (attention: `batch` sequences of its heads): its subgraph's and its
    parts' shapes scaled along their first dimension, so the intermediates grow past the caches."""
    if batch == 1:
        return case
    params = dict(case.params)
    if "heads" in params:
        params["heads"] *= batch
    else:
        params["batch"] = batch
    parts = []
    for part in case.parts:
        if "te" in part:
            parts.append({**part, "shape": (part["shape"][0] * batch, *part["shape"][1:])})
        else:
            parts.append({**part, "params": {**part["params"], "batch": part["params"]["batch"] * batch}})
    return Case(f"{case.name} x{batch}", case.operator, params, tuple(parts))


# ---------------------------------------------------------------------------
# Programs.


def _export(mod: Any, target: Any, folder: Path, name: str) -> str:
    path = folder / f"{name}.so"
    build(mod, target).export_library(str(path))
    return str(path)


def _te_stage(part: dict) -> Any:
    """The operators between the complex ones, as TIR (scheduled by basteln, not searched)."""
    if part["te"] == "pad":
        x = te.placeholder(part["shape"], name="data")
        pad = part["padding"]
        out = topi.nn.pad(x, (0, 0, pad, pad), (0, 0, pad, pad), name="pad")
        return te.create_prim_func([x, out]).with_attr("global_symbol", "main")
    s = te.placeholder(part["shape"], name="scores")
    b, n, m = part["shape"]
    j = te.reduce_axis((0, m), "j")
    mx = te.compute((b, n), lambda i0, i1: te.max(s[i0, i1, j], axis=j), name="row_max")
    ex = te.compute(part["shape"], lambda i0, i1, i2: tirx.exp(s[i0, i1, i2] - mx[i0, i1]), name="exp")
    j2 = te.reduce_axis((0, m), "j2")
    sm = te.compute((b, n), lambda i0, i1: te.sum(ex[i0, i1, j2], axis=j2), name="row_sum")
    pr = te.compute(part["shape"], lambda i0, i1, i2: ex[i0, i1, i2] / sm[i0, i1], name="probs")
    return te.create_prim_func([s, pr]).with_attr("global_symbol", "main")


def _specs(prim_func: Any) -> list:
    return [(list(s), d) for s, d in arg_specs(prim_func)]


def run_case(case: Case, budget: int, target: Any, folder: Path, seed: int, metaschedule: bool = True) -> dict:
    """Tunes every variant of one case and returns its row (latencies filled in later, by `time_all`;
    `metaschedule=False`: without MetaSchedule)."""
    w = make_workload(case.operator, case.params)
    # a folder per case: every case exports "ours", "part0", ... and they must not replace each other's
    folder = folder / case.operator
    folder.mkdir(parents=True, exist_ok=True)
    row: dict[str, Any] = {"case": case.name, "operator": case.operator, "params": case.params, "flops": w.flops,
                           "programs": {}}
    request = TuneRequest(case.operator, case.params, budget=budget, seed=seed)
    task = task_from_request(request)
    start = time.perf_counter()
    with LocalMeasurer() as measurer:
        result = tune_operator(task, request, measurer=measurer)
    row["ours_tune_s"] = time.perf_counter() - start
    pick = result.final  # the fastest of the best few re-measured, as a job picks
    row["ours_config"] = pick.config if pick else None
    if pick is not None:
        mod = apply_config(task, pick.config)
        row["programs"]["ours"] = ("tvm", _export(mod, target, folder, "ours"), _specs(w.prim_func))
        fused = FusionSpace(w.prim_func, workload=w).fused(pick.config)
        row["ours_scratch_bytes"] = fused.scratch_bytes
        row["fused_groups"] = [[d.group, d.depth, round(d.redundancy, 3)] for d in fused.decisions]
    # unfused: the complex operators tuned on their own, an equal share of the budget each
    tuned = [p for p in case.parts if "operator" in p]
    share = max(budget // len(tuned), 1)
    parts, unfused_bytes = [], 0
    start = time.perf_counter()
    for i, part in enumerate(case.parts):
        if "te" in part:
            func = _te_stage(part)
            mod = basteln(func).sch.mod
            parts.append(("tvm", _export(mod, target, folder, f"part{i}"), _specs(func)))
        else:
            prequest = TuneRequest(part["operator"], part["params"], part.get("dtype", "float32"),
                                   part.get("epilogue", "none"), budget=share, seed=seed)
            ptask = task_from_request(prequest)
            with LocalMeasurer() as measurer:
                presult = tune_operator(ptask, prequest, measurer=measurer)
            if presult.final is None:
                parts.append(None)
                continue
            pmod = apply_config(ptask, presult.final.config)
            parts.append(("tvm", _export(pmod, target, folder, f"part{i}"), _specs_of_module(pmod)))
        if i < len(case.parts) - 1:  # the tensor this part hands to the next one
            unfused_bytes += 4 * math.prod(parts[-1][2][-1][0]) if parts[-1] else 0
    row["unfused_tune_s"] = time.perf_counter() - start
    row["unfused_bytes"] = unfused_bytes
    row["programs"]["unfused"] = parts
    if metaschedule:
        start = time.perf_counter()
        ms = tune_metaschedule(w.prim_func, target, budget, folder / "ms", seed=seed)
        row["metaschedule_tune_s"] = time.perf_counter() - start
        row["metaschedule_error"] = ms.error
        if ms.mod is not None and ms.error is None:
            row["programs"]["metaschedule"] = ("tvm", _export(ms.mod, target, folder, "ms"), _specs(w.prim_func))
    for variant in ("eager", "channels_last", "compile"):
        if variant == "channels_last" and len(w.inputs[0].shape) != 4:
            continue
        row["programs"][f"torch_{variant}"] = ("torch", variant)
    return row


def _specs_of_module(mod: Any) -> list:
    return _specs(mod["main"])


def time_all(rows: list[dict], threads: int, seed: int, rounds: int = 1) -> None:
    """Times every program of every row with `bench.common.time_fresh` (each in a fresh process, shuffled,
    `rounds` readings each: the median in `times`, every reading in `readings`)."""
    programs, where = {}, {}
    for r, row in enumerate(rows):
        for name, program in row["programs"].items():
            parts = enumerate(program) if name == "unfused" else [(None, program)]
            for i, part in parts:
                if part is None:
                    continue
                part_name = name if i is None else f"unfused.{i}"
                key = f"{row['case']}: {part_name}"
                where[key] = (row, part_name)
                programs[key] = (TvmProgram(part[1], specs=tuple(part[2])) if part[0] == "tvm" else
                                 TorchProgram(torch_subgraph, (row["operator"], row["params"], seed), part[1]))
    timings = time_fresh(programs, seed=seed, rounds=rounds, threads=threads, log=sys.stdout)
    for key, ms in timings.ms.items():
        row, name = where[key]
        row.setdefault("times", {})[name] = ms
        row.setdefault("readings", {})[name] = timings.readings[key]
    for row in rows:
        t = row.get("times", {})
        n_parts = len(row["programs"].get("unfused", []))
        part_times = [t.get(f"unfused.{i}") for i in range(n_parts)]
        row["ours_ms"] = t.get("ours")
        row["unfused_ms"] = sum(part_times) if part_times and None not in part_times else None
        row["metaschedule_ms"] = t.get("metaschedule")
        torch_ms = {k[len("torch_"):]: v for k, v in t.items() if k.startswith("torch_") and v is not None}
        row["torch_variants_ms"] = torch_ms
        row["torch_ms"] = min(torch_ms.values()) if torch_ms else None
        row["torch_best"] = min(torch_ms, key=torch_ms.get) if torch_ms else None
        del row["programs"]


def add_peak(row: dict, peak: dict | None) -> None:
    """`ours_peak_share` and `unfused_peak_share` (the subgraph's fp32 GFLOP/s over the measured peak) and
    `fusion_ceiling` (the unfused time over the time of the subgraph's multiply-adds at the peak: what fusion
    could gain at most); None where a time or the peak is missing."""
    at_peak_ms = row["flops"] / peak["gflops"] / 1e6 if peak and peak.get("gflops") else None
    for name in ("ours", "unfused"):
        ms = row.get(f"{name}_ms")
        row[f"{name}_peak_share"] = at_peak_ms / ms if at_peak_ms and ms else None
    row["fusion_ceiling"] = speedup(row.get("unfused_ms"), at_peak_ms) if at_peak_ms else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fusion", description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget", type=int, default=64, help="measurements for ours, for the unfused operators "
                                                                "together and for MetaSchedule")
    parser.add_argument("--quick", action="store_true", help=f"only {', '.join(QUICK)}")
    parser.add_argument("--cases", nargs="*", help="only the cases whose name contains one of these")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=1,
                        help="fresh-process readings per program, in a new shuffled order each round (median)")
    parser.add_argument("--batch", type=int, nargs="*", default=[1],
                        help="batch sizes: each case at each (attention: sequences of its heads)")
    parser.add_argument("--no-metaschedule", action="store_true", help="leave MetaSchedule out")
    parser.add_argument("--out", type=Path, help="the JSON report (default bench/results/fusion-<mcpu>.json)")
    args = parser.parse_args(argv)

    target = resolve_target("host")
    cases = [batched(c, b) for b in args.batch for c in CASES if (not args.quick or c.name in QUICK)
             and (not args.cases or any(s in c.name for s in args.cases))]
    rows = []
    with tempfile.TemporaryDirectory(prefix="altune-fusion-") as tmp:
        for case in cases:
            print(f"tuning {case.name} ({args.budget} measurements each) ...", flush=True)
            rows.append(run_case(case, args.budget, target, Path(tmp), args.seed,
                                 metaschedule=not args.no_metaschedule))
        time_all(rows, host_cores(), args.seed, args.rounds)
    peak = measure_peak("host")  # after every timing: its FMA loop on every core would disturb them
    bandwidth = measure_bandwidth("host")
    caches = host_caches()
    for row in rows:
        add_peak(row, peak)
    mcpu = str(target.attrs.get("mcpu", "generic"))
    columns = [
        Column("case", lambda r: r["case"], right=False),
        Column("ours ms", lambda r: fmt_ms(r["ours_ms"])),
        Column("unfused ms", lambda r: fmt_ms(r["unfused_ms"])),
        Column("MS ms", lambda r: fmt_ms(r["metaschedule_ms"])),
        Column("torch ms", lambda r: fmt_ms(r["torch_ms"]) + (f" ({r['torch_best']})" if r["torch_best"] else "")),
        Column("vs unfused", lambda r: fmt_x(speedup(r["unfused_ms"], r["ours_ms"]))),
        Column("vs MS", lambda r: fmt_x(speedup(r["metaschedule_ms"], r["ours_ms"]))),
        Column("vs torch", lambda r: fmt_x(speedup(r["torch_ms"], r["ours_ms"]))),
        Column("ours %peak", lambda r: fmt_share(r["ours_peak_share"])),
        Column("unfused %peak", lambda r: fmt_share(r["unfused_peak_share"])),
        Column("ceiling", lambda r: fmt_x(r["fusion_ceiling"])),
        Column("scratch KiB", lambda r: f"{r.get('ours_scratch_bytes', 0) / 1024:.0f}"),
        Column("unfused KiB", lambda r: f"{r['unfused_bytes'] / 1024:.0f}"),
        Column("vs L2", lambda r: f"{r['unfused_bytes'] / caches.l2:.1f}x"),
        Column("tune s", lambda r: fmt_s(r["ours_tune_s"])),
    ]
    over_l2 = [r for r in rows if r["unfused_bytes"] > caches.l2]
    geo = {
        "vs_unfused_over_l2": geomean(speedup(r["unfused_ms"], r["ours_ms"]) for r in over_l2) if over_l2 else None,
        "vs_unfused": geomean(speedup(r["unfused_ms"], r["ours_ms"]) for r in rows),
        "fusion_ceiling": geomean(r["fusion_ceiling"] for r in rows),
        "vs_metaschedule": geomean(speedup(r["metaschedule_ms"], r["ours_ms"]) for r in rows),
        "vs_torch": geomean(speedup(r["torch_ms"], r["ours_ms"]) for r in rows),
    }
    print(f"\nbench.fusion: {target_key('host')} ({environment()['cpu']}), budget {args.budget}, "
          f"each program timed in a fresh process, median of {args.rounds} round(s)" + peak_text({"peak": peak}))
    print(f"caches: L2 {caches.l2 // 1024} KiB a core, L3 {caches.l3 // 1024} KiB; memory bandwidth "
          + (f"{bandwidth['gbs']:.1f} GB/s (a {bandwidth['megabytes']} MB copy on {bandwidth['cores']} cores)"
             if bandwidth else "not measured"))
    print(format_table(columns, rows))
    print("geomean: " + ", ".join(f"{k} {fmt_x(v)}" for k, v in geo.items()))
    report = {"bench": "fusion", "target": str(target), "mcpu": mcpu, "budget": args.budget, "rounds": args.rounds,
              "batch": args.batch, "environment": environment(), "peak": peak, "bandwidth": bandwidth,
              "caches": {"l2": caches.l2, "l3": caches.l3}, "cases": rows, "geomean": geo}
    out = args.out or RESULTS_DIR / f"fusion-{mcpu}{'-quick' if args.quick else ''}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
