"""`bench.ablation`'s arithmetic and table: curves, the 2% band, measurements to it, and the report.

A curve is the best latency so far after each measurement (None until the first correct one). A case's band is
`BAND` x the best latency any of our arms found on it; an arm's "measurements to band" is the 1-based index of the
first measurement whose best-so-far sits in the band (None: never within its budget). The targets are ratios of
geometric means over the cases: (d) full ALT warm over (a) the seeds with random walks, at most `TARGETS[False]`
without the seeds and `TARGETS[True]` with them.

An arm that never reaches the band is counted at budget + 1 in the geometric means (a bound: it would need more),
and every mean says how many such cases it holds.

This module imports no TVM: the arithmetic and the table are tested without tuning.
"""

from __future__ import annotations

from collections.abc import Sequence

from bench.common import Column, fmt_ms, format_table, geomean

BAND = 1.02  # within 2% of the best latency any arm found
TARGETS = {False: 0.2, True: 0.5}  # seeds -> the largest (d)/(a) the issue accepts
SEED_ORIGINS = frozenset({"untuned", "blocked"})  # the rule's known nests (`seed_configs`), as trials name them
ARMS = ("a", "b", "c", "d")  # (a) seeds + random walks, (b) XGBoost cold, (c) XGBoost warm, (d) full ALT warm
ARM_TITLES = {"a": "(a) seeds+random", "b": "(b) xgb cold", "c": "(c) xgb warm", "d": "(d) ALT warm",
              "metaschedule": "MetaSchedule"}


def arm_name(arm: str, seeds: bool) -> str:
    """The JSON key of an arm run with or without the seeds ("a+seeds", "a-seeds")."""
    return f"{arm}{'+' if seeds else '-'}seeds"


def best_so_far(latencies_ms: Sequence[float | None]) -> list[float | None]:
    """The curve: after each measurement, the best correct latency so far (None before the first)."""
    out: list[float | None] = []
    best: float | None = None
    for v in latencies_ms:
        if v is not None and v > 0 and (best is None or v < best):
            best = v
        out.append(best)
    return out


def to_band(curve: Sequence[float | None], band_ms: float | None) -> int | None:
    """The 1-based measurement at which `curve` first sits at or under `band_ms`; None: never."""
    if band_ms is None:
        return None
    return next((i + 1 for i, v in enumerate(curve) if v is not None and v <= band_ms), None)


def seed_in_band(latencies_ms: Sequence[float | None], origins: Sequence[str | None],
                 band_ms: float | None) -> int | None:
    """The 1-based measurement of the first seed (`SEED_ORIGINS`) that sits in the band; None: no seed does."""
    if band_ms is None:
        return None
    return next((i + 1 for i, (v, o) in enumerate(zip(latencies_ms, origins))
                 if o in SEED_ORIGINS and v is not None and v <= band_ms), None)


def settle(row: dict) -> dict:
    """Fills in a case row's band and, per arm, its measurements to the band (in place; returned).

    The band is `BAND` x the best of our arms' curves (MetaSchedule's runner times its own way: its curve is read
    against our band, not part of it; see `bench.ablation`)."""
    arms = row["arms"]
    ours = [a["best_ms"] for name, a in arms.items() if name != "metaschedule" and a.get("best_ms") is not None]
    row["best_ms"] = min(ours) if ours else None
    row["band_ms"] = None if row["best_ms"] is None else BAND * row["best_ms"]
    for name, arm in arms.items():
        arm["to_band"] = to_band(arm.get("curve", []), row["band_ms"])
        if "latencies_ms" in arm:
            arm["seed_in_band_at"] = seed_in_band(arm["latencies_ms"], arm.get("origins", []), row["band_ms"])
    row["seeds_in_band"] = any(a.get("seed_in_band_at") is not None for a in arms.values())
    # a warm arm whose first round the target model ranked none of: the space has no program features (a fused
    # subgraph's), so the arm ran cold whatever it was given
    row["warm_unused"] = sorted(name for name, a in arms.items()
                                if a.get("warm") and not a.get("same_as") and a.get("first_round_predicted") == 0)
    return row


def counted(value: int | None, budget: int) -> int:
    """Measurements to the band as the geometric mean counts them: never -> budget + 1 (a bound)."""
    return budget + 1 if value is None else value


def summary(rows: Sequence[dict], budget: int) -> dict:
    """Per arm the geometric mean of measurements to the band (and how many cases never got there), and the
    ratio (d)/(a) with and without the seeds against `TARGETS`."""
    names = [arm_name(a, s) for s in (True, False) for a in ARMS] + ["metaschedule"]
    means: dict[str, dict] = {}
    for name in names:
        values = [r["arms"][name]["to_band"] for r in rows if name in r["arms"]]
        if values:
            means[name] = {"geomean": geomean(counted(v, budget) for v in values), "cases": len(values),
                           "never": sum(v is None for v in values)}
    ratios = {}
    for seeds in (False, True):
        a, d = means.get(arm_name("a", seeds)), means.get(arm_name("d", seeds))
        ratio = None if not a or not d or not a["geomean"] else d["geomean"] / a["geomean"]
        ratios["with_seeds" if seeds else "without_seeds"] = {
            "ratio": ratio, "target": TARGETS[seeds], "met": None if ratio is None else ratio <= TARGETS[seeds]}
    return {"geomean_to_band": means, "d_over_a": ratios}


def _cell(row: dict, name: str) -> str:
    arm = row["arms"].get(name)
    if arm is None:
        return "-"
    if arm.get("same_as"):
        return f"={arm['same_as'][0]}"  # the fusion space has no PPO: (d) is (c)
    n = arm.get("to_band")
    return "never" if n is None else str(n)


def _mean_cell(mean: dict | None) -> str:
    if mean is None or mean["geomean"] is None:
        return "-"
    return f"{mean['geomean']:.0f}" + (f" ({mean['never']} never)" if mean["never"] else "")


def table(report: dict) -> str:
    """The markdown report: per case and arm the measurements to the 2% band, the geometric means, the targets,
    the cases whose seeds sit in the band at their first measurement."""
    names = [arm_name(a, s) for s in (True, False) for a in ARMS]
    if any("metaschedule" in r["arms"] for r in report["cases"]):
        names.append("metaschedule")
    headers = ["case", "best ms", *(("MS" if n == "metaschedule" else n) for n in names)]
    body = [{"case": r["name"] + (" *" if r.get("seeds_in_band") else ""), "best ms": fmt_ms(r.get("best_ms")),
             **{h: _cell(r, n) for h, n in zip(headers[2:], names)}} for r in report["cases"]]
    means = report["summary"]["geomean_to_band"]
    footer = {"case": "geomean", "best ms": "", **{h: _mean_cell(means.get(n)) for h, n in zip(headers[2:], names)}}
    columns = [Column(h, lambda r, h=h: r[h], right=h != "case") for h in headers]
    lines = [f"Held-out sample efficiency on {report['environment'].get('cpu')} ({report['target']}), budget "
             f"{report['budget']}: measurements to within {100 * (BAND - 1):.0f}% of the best latency any of our "
             "arms found. \"never\": not within the budget (counted as budget + 1 in the geometric means, a bound); "
             "\"=c\": a fused subgraph has no PPO agents, (d) is (c); * the seeds sit in the band at their first "
             "measurement.", "", "```", format_table(columns, body, [footer]), "```", ""]
    for key, label in (("without_seeds", "without seeds"), ("with_seeds", "with seeds")):
        r = report["summary"]["d_over_a"][key]
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f}"
        verdict = "" if r["met"] is None else (" (met)" if r["met"] else " (NOT met)")
        lines.append(f"- (d)/(a) {label}: {ratio}, target <= {r['target']}{verdict}")
    flagged = [f"{r['name']} ({_seed_hits(r)})" for r in report["cases"] if r.get("seeds_in_band")]
    lines.append("- seeds in the band at their first measurement: " + (", ".join(flagged) if flagged else "none"))
    cold = [f"{r['name']} ({', '.join(r['warm_unused'])})" for r in report["cases"] if r.get("warm_unused")]
    if cold:
        lines.append("- warm arms the trained model could not rank (no program features in their space: they ran "
                     "cold, as (b)): " + ", ".join(cold))
    if "metaschedule" in names:
        lines.append("- MS: MetaSchedule's curve is its runner's readings in its database's order, read against our "
                     "band (its runner times with its own repeats; its best re-timed our way is in the JSON).")
    return "\n".join(lines)


def _seed_hits(row: dict) -> str:
    return ", ".join(f"{name} at measurement {arm['seed_in_band_at']}" for name, arm in row["arms"].items()
                     if arm.get("seed_in_band_at") is not None)
