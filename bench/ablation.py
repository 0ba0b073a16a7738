"""Sample efficiency on held-out workloads: how many measurements each search needs to reach within 2% of the best.

    python -m bench.ablation train --out bench/results/knowledge-<cpu>.npz [--budget N] [--cases NAME,...]
    python -m bench.ablation run --knowledge FILE [--budget 1000] [--cases NAME,...] [--arms a,b,c,d]
                                 [--no-seeds-arms | --seeds-only] [--no-metaschedule] [--json PATH [--resume]]

`train` tunes the training workloads (`TRAIN`: common conv2d, dense and depthwise_conv2d shapes) with full ALT
(PPO agents, XGBoost) into one `tuner.knowledge.Knowledge`, refit after each case as a job's would be, and saves
`knowledge.grown()`: every measurement's program features, the target model refit on them, the PPO policies.

`run` tunes each held-out case (`HELD_OUT`: shapes and operators `TRAIN` never has: grouped, 3-D, transposed
and dilated convs, batch_matmul, a 5x5 conv2d and a skinny dense, and two fused subgraphs, attention
(matmul -> softmax -> matmul) and MobileNet's depthwise -> pointwise) with every arm, each once with the seeds and
once without (`tune(seeds=...)`), on one machine in one run, at the same budget:

- (a) the seeds with random walks: `ppo=False, cost_model="random"`, cold;
- (b) XGBoost cold: `ppo=False, cost_model="xgb"`, cold;
- (c) XGBoost warm: `ppo=False, cost_model="xgb"`, warm from the trained knowledge;
- (d) full ALT warm: `ppo=True, cost_model="xgb"`, warm from the trained knowledge (its model and policies).

Each warm arm gets a fresh copy of the trained knowledge (`Knowledge(trained.cost_model, trained.policies)`), so
no held-out measurement reaches another arm. A fused subgraph is searched by "xgb" over the fusion space, which
has no PPO agents: there (d) is (c), not run again, and its row says so (`same_as`). A warm arm whose first round
the model ranked none of (a space without program features) is listed in `warm_unused`. MetaSchedule (`tune_tir`,
`bench.baselines.metaschedule`, the constants layout-free for an operator) runs once per case at the same budget;
its curve is read from its tuning database's records in the order they were committed (its runner's readings,
timed its own way: read against our band, not part of it), and its best is re-timed our way (`metaschedule_ms`).

What a row holds per arm: `curve` (best latency so far after each measurement), `latencies_ms` and `origins` of
every trial in order, `best_ms`, `to_band` (measurements to the 2% band: `bench.ablation_report`), for a seeded arm
`seed_in_band_at` (the first seed that sits in the band), for a warm arm `policies_stored` and `policies_new` (its
agents' keys that had a trained policy, and those that started fresh: a policy is kept by operator family and the
agent's dimensions, so a held-out operator's agents start fresh), `first_round_predicted` (how many of the first round's
trials the cost model ranked: a warm model ranks them, a cold one cannot), `tune_s`. A case's band is 1.02 x the
best latency any of our arms found there; `seeds_in_band` flags the cases where a seed already sits in it.

Not covered: layer norm and a standalone softmax (not tunable operators of the catalog: softmax is only in the
attention subgraph), and a model's layout choices (a model job's joint stage, not an operator's search).

The JSON (`--json`, else under bench/results/) is written after every case; `--resume` skips the cases it holds.
The markdown table (`bench.ablation_report.table`) is printed and written beside it (.md).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.ablation_report import ARMS, arm_name, best_so_far, settle, summary, table
from bench.baselines import metaschedule
from bench.common import RESULTS_DIR, source_commit
from bench.environment import environment
from bench.ops_cases import Case, pick
from compiler.target import host_cpu, target_key
from compiler.workloads.subgraphs import SUBGRAPHS
from tuner import LocalMeasurer
from tuner.knowledge import Knowledge
from tuner.measurers.base import Measurer
from tuner.operator import task_from_request
from tuner.request import TuneRequest
from tuner.task import Task, Trial
from tuner.tune import tune


def _op(operator: str, name: str, **params: int) -> Case:
    return Case(name, operator, params)


# What the learned parts see: common ResNet / MobileNet / BERT shapes of three operators.
TRAIN = (
    _op("conv2d", "tr_c2d_56_64", batch=1, in_channels=64, height=56, width=56, out_channels=64, kernel=3, padding=1),
    _op("conv2d", "tr_c2d_28_128", batch=1, in_channels=128, height=28, width=28, out_channels=128, kernel=3,
        padding=1),
    _op("conv2d", "tr_c2d_14_256_1x1", batch=1, in_channels=256, height=14, width=14, out_channels=1024, kernel=1),
    _op("conv2d", "tr_c2d_7_512", batch=1, in_channels=512, height=7, width=7, out_channels=512, kernel=3,
        padding=1),
    _op("dense", "tr_gemm_512", m=512, n=512, k=512),
    _op("dense", "tr_gemm_bert", m=128, n=768, k=768),
    _op("depthwise_conv2d", "tr_dep_112_32", batch=1, channels=32, height=112, width=112, kernel=3, padding=1),
    _op("depthwise_conv2d", "tr_dep_28_192", batch=1, channels=192, height=28, width=28, kernel=3, padding=1),
)

# What they never see: other operators, other shapes of the trained ones, fused subgraphs.
HELD_OUT = (
    _op("group_conv2d", "grp_14_512_g32", batch=1, in_channels=512, height=14, width=14, out_channels=512, kernel=3,
        padding=1, groups=32),
    _op("conv3d", "c3d_r3d", batch=1, in_channels=32, depth=8, height=28, width=28, out_channels=32, kernel=3,
        padding=1),
    _op("conv2d_transpose", "t2d_28_64", batch=1, in_channels=64, height=28, width=28, out_channels=32, kernel=4,
        stride=2, padding=1),
    _op("dilated_conv2d", "dil_28_128", batch=1, in_channels=128, height=28, width=28, out_channels=128, kernel=3,
        padding=2, dilation=2),
    _op("batch_matmul", "bmm_bert_scores", batch=12, m=128, n=128, k=64),
    _op("conv2d", "c2d_27_48_5x5", batch=1, in_channels=48, height=27, width=27, out_channels=96, kernel=5,
        padding=2),  # a kernel size and channel counts training never has
    _op("dense", "gemm_1x1000x1280", m=1, n=1000, k=1280),  # a matrix-vector product: training has square GEMMs
    _op("matmul_softmax_matmul", "attention_bert", heads=12, seq=128, dim=64),
    _op("depthwise_pointwise", "dw_pw_mobilenet", channels=144, height=56, width=56, out_channels=24, kernel=3),
)

# Tiny cases for tests and smoke runs: one trained shape, one held-out one.
SMOKE_TRAIN = (_op("conv2d", "tiny_c2d", batch=1, in_channels=4, height=8, width=8, out_channels=8, kernel=3,
                   padding=1),)
SMOKE_HELD_OUT = (_op("group_conv2d", "tiny_grp", batch=1, in_channels=8, height=8, width=8, out_channels=8,
                      kernel=3, padding=1, groups=2),)

# arm -> (tune options, warm from the trained knowledge)
ARM_OPTIONS: dict[str, tuple[dict[str, Any], bool]] = {
    "a": ({"ppo": False, "cost_model": "random"}, False),
    "b": ({"ppo": False, "cost_model": "xgb"}, False),
    "c": ({"ppo": False, "cost_model": "xgb"}, True),
    "d": ({"ppo": True, "cost_model": "xgb"}, True),
}


def make_task(case: Case) -> Task:
    """The case's task with its catalog workload (ALT for an operator, the fusion space for a subgraph)."""
    return task_from_request(TuneRequest(case.operator, dict(case.params), case.dtype, case.epilogue))


def is_subgraph(case: Case) -> bool:
    return case.operator in SUBGRAPHS


def train(cases: Sequence[Case], budget: int, out: Path, *, measurer: Measurer | None = None, seed: int = 0,
          log: Any = sys.stderr) -> Knowledge:
    """Tunes `cases` with full ALT into one knowledge, refit after each case as the next job would start, and
    saves `knowledge.grown()` to `out` (returned)."""
    knowledge = Knowledge()
    for case in cases:
        start = time.perf_counter()
        with _measurer(measurer) as m:
            result = tune(make_task(case), budget, seed=seed, measurer=m, ppo=True, cost_model="xgb",
                          knowledge=knowledge)
        knowledge = knowledge.grown()
        best = None if result.best is None else result.best.latency_ms
        print(f"train {case.name}: {len(result.trials)} trials, best {best} ms, {time.perf_counter() - start:.0f} s, "
              f"model on {knowledge.cost_model.rows if knowledge.cost_model else 0} rows", file=log, flush=True)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    knowledge.save(out)
    return knowledge


def run_arm(task: Task, budget: int, arm: str, seeds: bool, trained: Knowledge | None, measurer: Measurer,
            seed: int = 0) -> dict:
    """One arm on one task: its trials in order, as the row's arm entry (`to_band` is filled in by `settle`)."""
    options, warm = ARM_OPTIONS[arm]
    if warm and (trained is None or not trained.warm):
        raise ValueError(f"arm {arm} starts warm: it needs trained knowledge (a model or policies)")
    knowledge = Knowledge(trained.cost_model, trained.policies) if warm else None  # a fresh copy: nothing leaks
    start = time.perf_counter()
    result = tune(task, budget, seed=seed, measurer=measurer, seeds=seeds, knowledge=knowledge, **options)
    entry = arm_entry(result.trials, time.perf_counter() - start, warm=warm)
    if knowledge is not None:  # the agents whose key had a stored policy (a policy is kept by operator family)
        entry["policies_stored"] = sorted(k for k in knowledge.updated_policies if k in trained.policies)
        entry["policies_new"] = sorted(k for k in knowledge.updated_policies if k not in trained.policies)
    return entry


def arm_entry(trials: Sequence[Trial], tune_s: float, *, warm: bool) -> dict:
    latencies = [t.latency_ms for t in trials]
    curve = best_so_far(latencies)
    first_round = [t for t in trials if t.extra.get("round") == trials[0].extra.get("round")] if trials else []
    return {"trials": len(trials), "curve": curve, "latencies_ms": latencies,
            "origins": [t.extra.get("origin") for t in trials], "best_ms": curve[-1] if curve else None,
            "first_round": len(first_round), "first_round_predicted": sum(t.predicted is not None for t in first_round),
            "warm": warm,
            "tune_s": tune_s}


def metaschedule_arm(case: Case, task: Task, budget: int, seed: int = 0) -> dict:
    """MetaSchedule at the same budget: its curve from its database's records in commit order (its runner's
    readings), its best re-timed our way (`metaschedule_ms`)."""
    with tempfile.TemporaryDirectory(prefix="altune-ablation-ms-") as work:
        result = metaschedule(task.prim_func, task.target, budget, work, seed=seed, layout_free=not is_subgraph(case))
        records = Path(result.work_dir or work) / "database_tuning_record.json"
        latencies = database_latencies(records) if records.exists() else []
    curve = best_so_far(latencies)
    return {"trials": len(latencies), "curve": curve, "best_ms": curve[-1] if curve else None,
            "metaschedule_ms": result.latency_ms, "error": result.error, "tune_s": result.tune_s}


def database_latencies(path: Path) -> list[float | None]:
    """Each record's mean run time in ms, in the order MetaSchedule's JSON database committed them (None: the
    candidate failed: no run time, or MetaSchedule's 1e10 s marker)."""
    out: list[float | None] = []
    for line in Path(path).read_text().splitlines():
        if not line.strip():
            continue
        record = json.loads(line)[1]  # [workload index, [trace, run_secs, target, args_info]]
        secs = record[1] if len(record) > 1 else None
        ok = isinstance(secs, list) and secs and all(isinstance(s, (int, float)) and 0 < s < 1e9 for s in secs)
        out.append(1e3 * sum(secs) / len(secs) if ok else None)
    return out


def run_case(case: Case, budget: int, trained: Knowledge | None, *, arms: Sequence[str] = ARMS,
             seed_modes: Sequence[bool] = (True, False), with_metaschedule: bool = True,
             measurer: Measurer | None = None, seed: int = 0, log: Any = sys.stderr) -> dict:
    """Every arm on one case, on one measurer; the row with its band and measurements to it."""
    task = make_task(case)
    row: dict[str, Any] = {"name": case.name, "operator": case.operator, "params": dict(case.params),
                           "search": "xgb (fusion space)" if is_subgraph(case) else "alt", "arms": {},
                           "commit": source_commit()}
    with _measurer(measurer) as m:
        for seeds in seed_modes:
            for arm in arms:
                name = arm_name(arm, seeds)
                if arm == "d" and is_subgraph(case) and "c" in arms:  # no PPO in the fusion space: (d) is (c)
                    row["arms"][name] = {**row["arms"][arm_name("c", seeds)], "same_as": arm_name("c", seeds)}
                    continue
                row["arms"][name] = run_arm(task, budget, arm, seeds, trained, m, seed)
                entry = row["arms"][name]
                print(f"{case.name} {name}: best {entry['best_ms']} ms in {entry['trials']} trials, "
                      f"{entry['tune_s']:.0f} s", file=log, flush=True)
    if with_metaschedule:
        row["arms"]["metaschedule"] = metaschedule_arm(case, task, budget, seed)
    return settle(row)


def run(cases: Sequence[Case], budget: int, knowledge_path: Path | None, json_path: Path, *,
        arms: Sequence[str] = ARMS, seed_modes: Sequence[bool] = (True, False), with_metaschedule: bool = True,
        resume: bool = False, measurer: Measurer | None = None, seed: int = 0, log: Any = sys.stderr) -> dict:
    """Runs every case (skipping those `json_path` holds with `resume`), writing the report after each."""
    trained = Knowledge.load(knowledge_path) if knowledge_path is not None else None
    if trained is not None and trained.cost_model is None:
        print(f"{knowledge_path}: no cost model of this feature version in it; the warm arms start from its "
              "policies only", file=log)
    report: dict[str, Any] = {"bench": "ablation", "target": target_key("host"), "budget": budget,
                              "knowledge": None if knowledge_path is None else str(knowledge_path),
                              "knowledge_rows": trained.cost_model.rows if trained and trained.cost_model else 0,
                              "train_cases": [c.name for c in TRAIN], "environment": environment(), "cases": []}
    if resume and Path(json_path).exists():
        report["cases"] = json.loads(Path(json_path).read_text())["cases"]
    done = {r["name"] for r in report["cases"]}
    for case in cases:
        if case.name in done:
            continue
        report["cases"].append(run_case(case, budget, trained, arms=arms, seed_modes=seed_modes,
                                        with_metaschedule=with_metaschedule, measurer=measurer, seed=seed, log=log))
        write(report, json_path)
    write(report, json_path)
    return report


def write(report: dict, path: Path) -> None:
    """The JSON report and its markdown table beside it (.md), the summary recomputed."""
    report["summary"] = summary(report["cases"], report["budget"])
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.tmp")
    partial.write_text(json.dumps(report, indent=1) + "\n")
    partial.replace(path)
    path.with_suffix(".md").write_text(table(report) + "\n")


def _measurer(measurer: Measurer | None) -> contextlib.AbstractContextManager[Measurer]:
    """A new `LocalMeasurer` (closed on exit), or the caller's measurer (left open)."""
    return LocalMeasurer() if measurer is None else contextlib.nullcontext(measurer)


def _names(text: str | None) -> list[str]:
    return [n for n in (text or "").split(",") if n]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ablation", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    tr = sub.add_parser("train", help="tune the training workloads with full ALT into one knowledge file")
    tr.add_argument("--out", type=Path, default=RESULTS_DIR / f"knowledge-{host_cpu()}.npz")
    tr.add_argument("--budget", type=int, default=300, help="measurements per training case")
    tr.add_argument("--cases", help=f"comma-separated, of: {', '.join(c.name for c in TRAIN)}")
    tr.add_argument("--smoke", action="store_true", help="the tiny smoke case instead")
    tr.add_argument("--seed", type=int, default=0)
    rn = sub.add_parser("run", help="every arm on the held-out cases")
    rn.add_argument("--knowledge", type=Path, help="what `train` wrote (needed by the warm arms c and d)")
    rn.add_argument("--budget", type=int, default=1000)
    rn.add_argument("--cases", help=f"comma-separated, of: {', '.join(c.name for c in HELD_OUT)}")
    rn.add_argument("--smoke", action="store_true", help="the tiny smoke case instead")
    rn.add_argument("--arms", default=",".join(ARMS), help="comma-separated, of a,b,c,d")
    seeds = rn.add_mutually_exclusive_group()
    seeds.add_argument("--seeds-only", action="store_true", help="only the arms with the seeds")
    seeds.add_argument("--no-seeds-arms", action="store_true", help="only the arms without the seeds")
    rn.add_argument("--no-metaschedule", action="store_true")
    rn.add_argument("--json", type=Path)
    rn.add_argument("--resume", action="store_true", help="skip the cases --json already holds")
    rn.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.command == "train":
        cases = pick(SMOKE_TRAIN if args.smoke else TRAIN, _names(args.cases))
        train(cases, args.budget, args.out, seed=args.seed)
        print(f"wrote {args.out}")
        return 0
    arms = _names(args.arms)
    if unknown := [a for a in arms if a not in ARM_OPTIONS]:
        parser.error(f"unknown arm(s): {', '.join(unknown)}; known: {', '.join(ARM_OPTIONS)}")
    if args.knowledge is None and any(ARM_OPTIONS[a][1] for a in arms):
        parser.error("the warm arms (c, d) need --knowledge (what `train` wrote)")
    cases = pick(SMOKE_HELD_OUT if args.smoke else HELD_OUT, _names(args.cases))
    seed_modes = (True,) if args.seeds_only else (False,) if args.no_seeds_arms else (True, False)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    path = args.json or RESULTS_DIR / f"ablation-{host_cpu()}-{stamp}.json"
    report = run(cases, args.budget, args.knowledge, path, arms=arms, seed_modes=seed_modes,
                 with_metaschedule=not args.no_metaschedule, resume=args.resume, seed=args.seed)
    print(table(report))
    print(f"wrote {path} and {path.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
