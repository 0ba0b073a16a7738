"""`bench.models`' table: one row per model and budget, the columns shown where some row has a value, a geomean
footer per budget, the CPU and what each column means in the head.

Layering: bench may import everything below it; nothing imports bench.
"""

from __future__ import annotations

from collections.abc import Sequence

from bench.common import Column, fmt_ms, fmt_s, fmt_x, format_table, geomean, geomeans


def _budget_cell(r: dict) -> str:
    budget = r.get("budget")
    return "-" if budget is None else f"{budget}{' (default)' if r.get('budget_given') == 'default' else ''}"


def _torch_cell(r: dict, variant: str) -> str:
    return fmt_ms(r.get("torch_variants_ms", {}).get(variant))


COLUMNS = (
    Column("model", lambda r: r["name"], right=False),
    Column("budget", _budget_cell),
    Column("tasks", lambda r: f"{r.get('tuned_tasks', '-')}/{r.get('tasks', '-')}"),
    Column("untuned ms", lambda r: fmt_ms(r.get("untuned_ms"))),
    Column("ours ms", lambda r: fmt_ms(r.get("ours_ms"))),
    Column("also", lambda r: " ".join(f"{k} {fmt_ms(v.get('ours_ms'))} ({fmt_x(v.get('vs_main'))})"
                                      for k, v in r.get("also", {}).items()) or "-", right=False),
    Column("compile ms", lambda r: _torch_cell(r, "compile")),
    Column("torch ms", lambda r: fmt_ms(r.get("torch_ms")) + (f" ({r['torch_best']})" if r.get("torch_best") else "")),
    Column("eager ms", lambda r: _torch_cell(r, "eager")),
    Column("ORT ms", lambda r: fmt_ms(r.get("onnxruntime_ms"))),
    Column("MS tasks", lambda r: f"{r.get('metaschedule_tuned_tasks', '-')}/{r.get('metaschedule_tasks', '-')}"),
    Column("MS ms", lambda r: fmt_ms(r.get("metaschedule_ms"))),
    Column("vs compile", lambda r: fmt_x(r.get("vs_compile"))),
    Column("vs torch", lambda r: fmt_x(r.get("vs_torch"))),
    Column("vs eager", lambda r: fmt_x(r.get("vs_eager"))),
    Column("vs ORT", lambda r: fmt_x(r.get("vs_onnxruntime"))),
    Column("vs MS", lambda r: fmt_x(r.get("vs_metaschedule"))),
    Column("ours tune s", lambda r: fmt_s(r.get("ours_tune_s"))),
    Column("beat compile s (est.)", lambda r: fmt_s(r.get("estimate_beats_compile_s"))),
    Column("meas.", lambda r: str(r["ours_trials"]) if r.get("ours_trials") is not None else "-"),
    Column("MS tune s", lambda r: fmt_s(r.get("metaschedule_tune_s"))),
    Column("correct", lambda r: "yes" if r["correct"] else ("NO (ours)" if not r.get("ours_correct") else "NO (MS)"),
           right=False),
)
# shown whatever the rows hold; any other column only where some row has a value in it
ALWAYS = {"model", "budget", "ours ms", "correct"}


def geomeans_of(rows: Sequence[dict]) -> dict[str, float | None]:
    """The geometric means of ours' speedups over `rows` (`bench.common.geomeans`' and the other baselines')."""
    return geomeans(rows) | {k: geomean(r.get(k) for r in rows) for k in ("vs_onnxruntime", "vs_compile", "vs_eager")}


def by_budget(rows: Sequence[dict]) -> dict[str, list[dict]]:
    """The rows by budget as given ("default" or the number), in the order first met."""
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(str(r.get("budget_given", r.get("budget"))), []).append(r)
    return groups


def _cpu(report: dict) -> str:
    env = report.get("environment", {})
    return ", ".join(str(v) for v in (env.get("cpu_model"), env.get("cpu")) if v) or "CPU unknown"


def table(report: dict) -> str:
    cases = report["cases"]
    footer = [{"name": "geomean", "budget": given, "correct": all(r["correct"] for r in group), "ours_correct": True,
               **geomeans_of(group)} for given, group in by_budget(cases).items()]
    columns = [c for c in COLUMNS if c.header in ALWAYS or any(c.cell(r) not in ("-", "-/-") for r in cases)]
    budgets = ", ".join(str(b) for b in report.get("budgets", [report["budget"]]))
    ms_models = report.get("metaschedule_models", sorted({r["name"] for r in cases
                                                          if r.get("metaschedule_tune_s") is not None}))
    head = (f"models, target {report['target']} ({_cpu(report)}); budgets {budgets} on-device measurements per "
            f"model (ours and MetaSchedule; default: a model job's when its spec names none); MetaSchedule on "
            f"{', '.join(ms_models) or 'none'}; tasks, MS tasks = tuned/all; torch = the best of its variants; each "
            f"program timed in a fresh process, the median of {report.get('rounds', 1)} round(s); speedup = "
            f"baseline ms / ours ms; beat compile s (est.) = tuning seconds until ours' estimated latency (sum over "
            f"tuned tasks of calls x best measured latency, not a timed artifact) first fell below torch.compile's "
            f"timed ms; meas. = ours' measurements")
    notes = [f"  {r['name']}@{r.get('budget')}: {r['error']}" for r in cases if r.get("error")]
    notes += [f"  {r['name']}@{r.get('budget')}: {r['metaschedule_error']}" for r in cases
              if r.get("metaschedule_error")]
    notes += [f"  {r['name']}@{r.get('budget')}: MetaSchedule: left in its layout (read only in part): "
              f"{', '.join(r['metaschedule_not_layout_free'])}"
              for r in cases if r.get("metaschedule_not_layout_free")]
    notes += sorted({f"  {r['name']}: {r['onnxruntime_error']}" for r in cases if r.get("onnxruntime_error")})
    notes += [f"  {r['name']}@{r.get('budget')}: {f['error']}" for r in cases for f in r.get("also", {}).values()
              if f.get("error")]
    notes += [f"  {r['name']}@{r.get('budget')} ({layout}): layout search {f['layout_search']['rounds']} choices, "
              f"estimate {fmt_ms(f['layout_search']['rule_estimate_ms'])} ms (rule) -> "
              f"{fmt_ms(f['layout_search']['chosen_estimate_ms'])} ms"
              for r in cases for layout, f in [(r.get("layout"), r), *r.get("also", {}).items()]
              if f.get("layout_search")]
    return "\n".join([head, format_table(columns, cases, footer), *notes])
