"""Warm against cold model jobs: how much sooner a job reaches its final latency when the target's cost model was
trained on earlier jobs (`tuner.knowledge`), each model held out from its own training.

    python -m bench.learning [--models corpus|NAME,...] [--budget default|N] [--layout blocked|search]
                             [--knowledge-dir DIR] [--json PATH]

1. cold: each model tuned as a fresh installation's first job tunes it: `tuner.model.tune_model`, the job's own
   function, with an empty `Knowledge` that records every measurement's program features (what the worker saves
   to the database when the job ends); saved to DIR/<model>.npz.
2. warm: each model tuned again, with a `Knowledge` whose cost model is fit (`TargetModel.fit`, as the worker
   refits) on the OTHER models' cold measurements only: a job on a server that had tuned the rest of the corpus
   first. Its PPO policies are the others' too (graph-level layouts with `--layout search`; the loop searches of a
   model job have no agent).

Each arm's estimate curve is tune_model's `on_estimate` (seconds since the start, measurements, the model's
estimated latency: calls x best measured latency summed over tasks, the default schedule's where none). "To band"
is the first point within 2% of the cold arm's final estimate; the issue's target is warm at most half of cold.
Stored schedules are not used by either arm (no database): what differs is the cost model alone, and the warm
arm is the same code path a job takes with `ALTUNE_LEARN` on. Estimates, not timed artifacts: `bench.models`
times what a job serves.

Layering: `bench` imports `service`, `tuner` and `compiler`; nothing imports `bench`.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import fmt_ms, source_commit
from bench.environment import environment
from bench.models import PRESETS, _BenchHooks, default_budget, load_model
from compiler.target import resolve_target, target_key
from compiler.workloads.model import import_model
from compiler.workloads.model.importer import translate_model
from tuner import make_measurer
from tuner.knowledge import Knowledge, TargetModel
from tuner.model import tune_model
from tuner.request import ModelTuneRequest

BAND = 1.02


def to_band(curve: list[list[float]], final_ms: float | None) -> tuple[float, int] | None:
    """The first (seconds, measurements) of `curve` whose estimate is within `BAND` of `final_ms`."""
    if final_ms is None:
        return None
    for seconds, measurements, estimate in curve:
        if estimate <= BAND * final_ms:
            return seconds, int(measurements)
    return None


def tune_arm(name: str, budget: int | str, layout: str, knowledge: Knowledge, log: Any) -> dict:
    """One model tuned once with `knowledge` (recording into it): its budget, curve, final estimate, seconds."""
    _, _, ep = load_model(name, 0)
    target = resolve_target("host")
    graph = translate_model(ep)
    n = default_budget(import_model(ep, layout="blocked", target=target)) if budget == "default" else int(budget)
    request = ModelTuneRequest(target="host", budget=n, seed=0, layout=layout)
    measurer = make_measurer("local", pipeline=request.pipeline)
    start = time.perf_counter()
    hooks = _BenchHooks(log, start)
    try:
        tuned = tune_model(graph, request, measurer=measurer, hooks=hooks, knowledge=knowledge)
    finally:
        measurer.close()
    return {"budget": n, "tune_s": time.perf_counter() - start, "measurements": tuned.measurements,
            "curve": hooks.curve, "final_ms": hooks.curve[-1][2] if hooks.curve else None}


def warm_knowledge(name: str, folder: Path, names: list[str]) -> Knowledge:
    """The cost model and policies of every other model's cold run (`name` held out)."""
    samples, policies = [], {}
    for other in names:
        if other == name or not (folder / f"{other}.npz").exists():
            continue
        k = Knowledge.load(folder / f"{other}.npz")
        samples += k.samples
        policies.update(k.policies)
    return Knowledge(TargetModel.fit(samples), policies)


def run(names: list[str], budget: int | str, layout: str, folder: Path, log: Any) -> list[dict]:
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in names:  # cold first, every model: the warm arms learn from the others' cold runs
        print(f"cold: {name}", file=log, flush=True)
        knowledge = Knowledge()
        cold = tune_arm(name, budget, layout, knowledge, log)
        knowledge.save(folder / f"{name}.npz")
        rows.append({"model": name, "cold": cold})
    for row in rows:
        name = row["model"]
        knowledge = warm_knowledge(name, folder, names)
        print(f"warm: {name} (model of {knowledge.cost_model.rows if knowledge.cost_model else 0} rows)", file=log,
              flush=True)
        row["warm_rows"] = knowledge.cost_model.rows if knowledge.cost_model else 0
        row["warm"] = tune_arm(name, budget, layout, knowledge, log)
        final = row["cold"]["final_ms"]
        for arm in ("cold", "warm"):
            reached = to_band(row[arm]["curve"], final)
            row[arm]["to_band_s"], row[arm]["to_band_measurements"] = reached or (None, None)
    return rows


def table(rows: list[dict], cpu: str) -> str:
    lines = [f"Warm vs cold model jobs on `{cpu}` (estimates; band: within 2% of the cold final estimate)", "",
             "| model | budget | cold final ms | warm final ms | cold s to band | warm s to band | warm/cold "
             "| cold meas. to band | warm meas. to band | warm model rows |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    ratios = []
    for r in rows:
        c, w = r["cold"], r["warm"]
        ratio = w["to_band_s"] / c["to_band_s"] if w["to_band_s"] is not None and c["to_band_s"] else None
        if ratio is not None:
            ratios.append(ratio)
        lines.append(f"| {r['model']} | {c['budget']} | {fmt_ms(c['final_ms'])} | {fmt_ms(w['final_ms'])} | "
                     f"{_s(c['to_band_s'])} | {_s(w['to_band_s'])} | {f'{ratio:.2f}' if ratio is not None else '-'} | "
                     f"{c['to_band_measurements']} | {w['to_band_measurements']} | {r['warm_rows']} |")
    if ratios:
        geo = math.exp(sum(math.log(max(x, 1e-6)) for x in ratios) / len(ratios))
        lines.append(f"| **geomean** | | | | | | **{geo:.2f}** (target <= 0.5) | | | |")
    return "\n".join(lines)


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.learning", description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="corpus", help="'corpus' or comma-separated names (bench.models')")
    parser.add_argument("--budget", default="default", help="'default' (a job's) or a number")
    parser.add_argument("--layout", default="blocked", choices=("blocked", "search"))
    parser.add_argument("--knowledge-dir", type=Path, default=Path("bench/results/learning-knowledge"))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    names = list(PRESETS.get(args.models, args.models.split(",")))
    cpu = target_key("host")
    rows = run(names, args.budget, args.layout, args.knowledge_dir, sys.stderr)
    text = table(rows, cpu)
    print(text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"environment": environment(), "target": cpu, "layout": args.layout,
                                         "commit": source_commit(), "rows": rows, "table": text}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
