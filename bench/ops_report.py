"""The operator benchmark's report (`bench.ops`): its rows into the report with geomeans and each pick's share of
the fp32 peak, reports joined (`--merge`) or gone on with (`--resume`), and the text tables.
"""

from __future__ import annotations

import json
from pathlib import Path

from bench.common import Column, check_report, fmt_ms, fmt_s, fmt_share, fmt_x, format_table, geomean, geomeans, peak_text
from bench.environment import environment
from bench.ops_cases import ABLATIONS, SUITES
from compiler.target import target_key

# the picks a report row holds: program name -> the row's key of its configuration
PICKS = {"ours": "config", "ours_loop_only": "ours_loop_only_config", **{p: f"{p}_config" for p in ABLATIONS}}


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


def row_dtype(row: dict) -> str | None:
    """A row's dtype, from its workload key ("operator[params]:dtype:epilogue"); None without one."""
    parts = row.get("workload_key", "").rsplit(":", 2)
    return parts[1] if len(parts) == 3 else None


def _peak_shares(row: dict, peak: dict | None) -> None:
    """`<pick>_peak_share`: a float32 pick's GFLOP/s over `peak`'s (how much room a faster search could still find)."""
    fp32 = row_dtype(row) == "float32"
    for name in PICKS:
        ms = row.get(f"{name}_ms")
        row[f"{name}_peak_share"] = (row["flops"] / ms / 1e6 / peak["gflops"]
                                     if fp32 and peak and ms and row.get("flops") else None)


def resumable_rows(path: Path, suite: str, target: str, budget: int | None) -> list[dict]:
    """The finished cases of the report at `path`, checked to be of the same suite, target and budget.

    Raises:
        ValueError: the report is of another suite, target or budget, so its rows do not belong here.
    """
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
