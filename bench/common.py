"""What every benchmark shares: the report's JSON shape, speedups, the table, where results go.

A report is one run on one target:

    {"suite": str, "target": str, "budget": int,
     "cases": [{"name": str, "ours_ms": float | None, "metaschedule_ms": float | None,
                "torch_ms": float | None, "ours_tune_s": float, "metaschedule_tune_s": float | None,
                "layout": str | None, "correct": bool, ...}, ...],
     "geomean": {"vs_metaschedule": float | None, "vs_torch": float | None},
     "environment": {"commit": str | None, "cpu": str, ...}, ...}

`bench.ops` rows also carry the commit they ran on: a suite run in pieces
(`--resume`, `--merge`) may span versions of the code.

A speedup is the baseline's latency over ours (> 1: ours is faster); the
geomean is the geometric mean of the per-case speedups over the cases where
both latencies exist (None when there are none). Cases may carry more fields.
"""

from __future__ import annotations

import json
import math
import os
import platform
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).resolve().parent / "results"

# key -> allowed types of every case (None means JSON null is allowed)
CASE_FIELDS: dict[str, tuple[type | None, ...]] = {
    "name": (str,),
    "ours_ms": (float, None),  # None only when ours failed (then "error" says why and correct is False)
    "metaschedule_ms": (float, None),
    "torch_ms": (float, None),
    "ours_tune_s": (float,),
    "metaschedule_tune_s": (float, None),
    "layout": (str, None),
    "correct": (bool,),
}


def speedup(baseline_ms: float | None, ours_ms: float | None) -> float | None:
    """baseline / ours, or None when either is missing."""
    if baseline_ms is None or ours_ms is None or ours_ms <= 0:
        return None
    return baseline_ms / ours_ms


def geomean(values: Iterable[float | None]) -> float | None:
    """Geometric mean of the values that are not None; None when there are none."""
    present = [v for v in values if v is not None]
    if not present:
        return None
    assert all(v > 0 for v in present), f"geomean of non-positive values: {present}"
    return math.exp(sum(math.log(v) for v in present) / len(present))


def geomeans(cases: Sequence[dict]) -> dict[str, float | None]:
    """The report's "geomean" block from its cases."""
    return {
        "vs_metaschedule": geomean(speedup(c.get("metaschedule_ms"), c.get("ours_ms")) for c in cases),
        "vs_torch": geomean(speedup(c.get("torch_ms"), c.get("ours_ms")) for c in cases),
    }


def check_report(report: dict) -> None:
    """Raises ValueError naming the first field of `report` that breaks the shape above."""

    def fail(where: str, value: Any, expected: str) -> None:
        raise ValueError(f"{where}: expected {expected}, got {value!r}")

    def is_a(value: Any, kinds: tuple[type | None, ...]) -> bool:
        if value is None:
            return None in kinds
        if isinstance(value, bool):
            return bool in kinds
        if isinstance(value, int) and float in kinds:  # JSON does not distinguish 1 from 1.0
            return True
        return any(k is not None and isinstance(value, k) for k in kinds)

    for key, kinds in (("suite", (str,)), ("target", (str,)), ("budget", (int,)), ("cases", (list,)),
                       ("geomean", (dict,))):
        if key not in report or not is_a(report[key], kinds) or isinstance(report[key], bool):
            fail(key, report.get(key), " or ".join(k.__name__ for k in kinds if k))
    for i, case in enumerate(report["cases"]):
        for key, kinds in CASE_FIELDS.items():
            if key not in case or not is_a(case[key], kinds):
                fail(f"cases[{i}].{key}", case.get(key), " or ".join(k.__name__ if k else "null" for k in kinds))
    for key in ("vs_metaschedule", "vs_torch"):
        if key not in report["geomean"] or not is_a(report["geomean"][key], (float, None)):
            fail(f"geomean.{key}", report["geomean"].get(key), "float or null")


def default_json_path(bench: str, suite: str) -> Path:
    """bench/results/<bench>-<suite>-<UTC time>.json: a new file per run, never overwritten."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    return RESULTS_DIR / f"{bench}-{suite}-{stamp}.json"


def write_json(report: dict, path: Path | None = None, *, bench: str = "ops") -> Path:
    """Checks `report` and writes it (atomically) to `path`, or under `RESULTS_DIR` when None."""
    check_report(report)
    path = Path(path) if path is not None else default_json_path(bench, report["suite"])
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    partial.write_text(json.dumps(report, indent=2, sort_keys=False) + "\n")
    os.replace(partial, path)
    return path


def source_commit() -> str | None:
    """The git commit of the code that runs (suffixed "+dirty" with uncommitted changes), None outside git."""
    import subprocess

    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                              check=True, timeout=10).stdout.strip()
        # results written meanwhile (a report saved after every case) are not the code
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                                ":(exclude)bench/results"], cwd=root,
                               capture_output=True, text=True, check=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+dirty" if dirty else "")


def environment() -> dict[str, Any]:
    """Versions and machine facts recorded with every report."""
    import torch
    import tvm

    from compiler.target import host_cores, host_cpu

    return {
        "commit": source_commit(),
        "cpu": host_cpu(),
        "cores": host_cores(),
        "machine": platform.machine(),
        "tvm": tvm.__version__,
        "torch": torch.__version__,
        "torch_threads": host_cores(),
        "python": platform.python_version(),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


# ---------------------------------------------------------------------------
# Tables


@dataclass(frozen=True)
class Column:
    """One table column: header, how to get the cell from a row, right-aligned or not."""

    header: str
    cell: Callable[[dict], str]
    right: bool = True


def fmt_ms(value: float | None) -> str:
    """Milliseconds: 3 decimals, 4 below 0.1 ms, 1 from 100 ms ("-" for missing)."""
    if value is None:
        return "-"
    if value >= 100:
        return f"{value:.1f}"
    return f"{value:.3f}" if value >= 0.1 else f"{value:.4f}"


def fmt_x(value: float | None) -> str:
    """A speedup as "1.23x" ("-" for missing)."""
    return "-" if value is None else f"{value:.2f}x"


def fmt_s(value: float | None) -> str:
    """Seconds, whole ("-" for missing)."""
    return "-" if value is None else f"{value:.0f}"


def format_table(columns: Sequence[Column], rows: Sequence[dict], footer: Sequence[dict] = ()) -> str:
    """A plain-text table, one line per row, a rule above the footer rows."""
    body = [[c.cell(r) for c in columns] for r in rows]
    foot = [[c.cell(r) for c in columns] for r in footer]
    widths = [max(len(c.header), *(len(line[i]) for line in body + foot)) for i, c in enumerate(columns)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            cell.rjust(w) if c.right else cell.ljust(w) for c, cell, w in zip(columns, cells, widths)
        ).rstrip()

    rule = "-" * len(line([c.header for c in columns]))
    out = [line([c.header for c in columns]), rule, *map(line, body)]
    if foot:
        out += [rule, *map(line, foot)]
    return "\n".join(out)
