"""Tuning a whole model: the one path that model jobs, `bench.models` and any other caller share.

    result = tune_model(graph, ModelTuneRequest(target="llvm -mcpu=znver4", budget=64), measurer=measurer)
    served = serve_model(result, inputs, expected, dest=Path("model.tar.gz"))

`tune_model` takes the translated graph (`compiler.workloads.model.importer.ModelGraph`) and a typed request:

1. With `layout="search"` ALT's joint stage (`tuner.graph_layout`, `JOINT_SHARE` of the budget) chooses the
   convs' channel blocks first, unless the history already has them (a resumed job); else the graph is lowered in
   the request's layout.
2. Tasks with a known schedule (`ModelHistory.known`: the schedules table) get one measurement of it and no more;
   the other tunable tasks share the rest of the budget under `tuner.scheduler.GradientScheduler` (rounds of
   `tune(prior=...)`, so a resumed job continues from its trials).
3. Each task's pick is its best few trials measured again (`remeasure_best`, one per 32 trials, none below 32),
   the fastest reading; it is applied only when it beats the task's default schedule (what `build_model` gives an
   untuned function), measured by the same measurer.

`serve_model` is the end of a job: the model built with the picks, checked whole against the reference outputs
(schedules whose model does not match are removed), timed against the untuned build (served instead when faster
end to end), written as the artifact. The worker runs it in a confined child (`service.model_build`); a
benchmark runs it in its own process: the same function either way.

The caller persists what it is told through `ModelTuneHooks` (every trial, the layouts, the running estimate);
nothing here reads settings or a database.

Layering: `tuner` imports `compiler`, never `service` or `bench`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from compiler.target import resolve_target
from compiler.workloads.model import (
    ImportedModel,
    ModelTask,
    build_checked,
    build_model,
    compare_outputs,
    run_model,
    time_model,
    tolerance,
    write_model_artifact,
)
from compiler.workloads.model.importer import ModelGraph, graph_blocks, lower_graph
from compiler.workloads.model.tasks import conversions

from .graph_layout import default_schedule_latency, joint_budget, search_layouts, tunable
from .measurers import Measurer
from .request import ModelTuneRequest
from .scheduler import GradientScheduler, RoundResult, estimated_latency, round_size
from .task import Task, Trial, best_trial
from .tune import apply_config, remeasure_best, remeasure_count, tune

log = logging.getLogger("altune.model")

@dataclass(frozen=True)
class ModelHistory:
    """What the caller already knows before tuning starts.

    Attributes:
        blocks: the joint stage's chosen blocks (a resumed job's); None: run it when the layout is "search".
        layout_search: that joint stage's report.
        trials: measured trials by workload key (a resumed job's; counted in the budget, never measured again).
        known: a stored schedule's configuration for a workload key, None when there is none (measured once,
            then kept).
    """

    blocks: Mapping[str, list[int]] | None = None
    layout_search: Mapping[str, Any] | None = None
    trials: Mapping[str, Sequence[Trial]] = field(default_factory=dict)
    known: Callable[[str], dict | None] = lambda _key: None


class ModelTuneHooks:
    """What a caller hears while a model is tuned; every method a no-op here. A hook may raise to abort (the
    worker raises when it lost its lease)."""

    def should_stop(self) -> bool:
        """Polled between measurements and rounds (a cancel, a deadline)."""
        return False

    def on_trial(self, task: ModelTask, trial: Trial) -> None:
        """Every measurement, the joint stage's included, the moment it is made (`trial.index` counts the task's
        trials, history included)."""

    def on_layouts(self, blocks: dict[str, list[int]], report: dict) -> None:
        """The joint stage chose the convs' blocks (report: its measurements and estimates)."""

    def on_round(self, task: ModelTask, result: Any) -> None:
        """A round of `tune` ended on `task` (`tuner.task.TuneResult`: its best, the untuned latency)."""

    def on_estimate(self, latency_ms: float) -> None:
        """The model's estimated latency changed: sum over tuned tasks of weight x (best, else untuned)."""


@dataclass
class TaskOutcome:
    """One tunable task's tuning: its trials (history included), its pick and what it was compared with."""

    model_task: ModelTask
    task: Task
    trials: list[Trial]
    best: Trial | None = None
    untuned_ms: float | None = None
    default_ms: float | None = None

    @property
    def pick(self) -> Trial | None:
        return self.best if self.best is not None else best_trial(self.trials)

    @property
    def beats_default(self) -> bool:
        """The pick is faster than what the task gets without it (its default schedule; else its raw function)."""
        pick = self.pick
        versus = self.default_ms if self.default_ms is not None else self.untuned_ms
        return pick is not None and (versus is None or pick.latency_ms < versus)


@dataclass
class ModelTuneResult:
    """`tune_model`'s outcome.

    Attributes:
        request: what was asked.
        model: the model in its layouts.
        outcomes: one per tunable task, in the model's task order.
        measurements: new measurements this call made (the joint stage's included).
        layout_search: the joint stage's report (None without one).
        stopped: `should_stop` ended the tuning early: nothing was picked and nothing should be built.
    """

    request: ModelTuneRequest
    model: ImportedModel
    outcomes: list[TaskOutcome]
    measurements: int = 0
    layout_search: dict | None = None
    stopped: bool = False

    @property
    def schedules(self) -> dict[str, Any]:
        """The scheduled function of every task whose pick beats its default schedule, by workload key."""
        return {o.task.workload_key: apply_config(o.task, o.pick.config) for o in self.outcomes if o.beats_default}

    @property
    def facts(self) -> dict[str, dict]:
        """Per workload key: the pick's latency, the default schedule's, the raw function's (the manifest's)."""
        return {o.task.workload_key: {"latency_ms": o.pick.latency_ms if o.pick else None,
                                      "default_ms": o.default_ms, "untuned_ms": o.untuned_ms}
                for o in self.outcomes}

    @property
    def report(self) -> dict:
        """The job's report so far: import notes, the joint stage, the tasks whose default schedule was faster."""
        report: dict[str, Any] = {
            "import_notes": list(self.model.notes),
            "schedules": {"default_schedule_faster": [
                {"task": o.model_task.name, "workload_key": o.task.workload_key}
                for o in self.outcomes if o.pick is not None and not o.beats_default]},
        }
        if self.layout_search is not None:
            report["layout_search"] = dict(self.layout_search)
        return report


def lower_model(graph: ModelGraph, request: ModelTuneRequest, blocks: Mapping[str, list[int]] | None = None
                ) -> ImportedModel:
    """The model in the request's layouts (`blocks`: the joint stage's choice, by conv weight name)."""
    target = resolve_target(request.target)
    chosen = graph_blocks(graph, dict(blocks), target) if blocks else None
    return lower_graph(graph, layout=request.layout, target=target, fusion=request.fusion, blocks=chosen,
                       **_limit(request))


def tune_model(graph: ModelGraph, request: ModelTuneRequest, *, measurer: Measurer,
               history: ModelHistory | None = None, hooks: ModelTuneHooks | None = None) -> ModelTuneResult:
    """Tunes every tunable task of the model under one budget (see the module docstring); the measurer stays open.

    Args:
        graph: the translated model.
        request: what to tune and how.
        measurer: where every candidate is measured (the caller closes it).
        history: trials, blocks and schedules already known (a resumed job, the schedules table).
        hooks: told of every trial and estimate; polled to stop.
    """
    history = history or ModelHistory()
    hooks = hooks or ModelTuneHooks()
    target = resolve_target(request.target)
    trials: dict[str, list[Trial]] = {k: list(v) for k, v in history.trials.items()}
    spent = sum(len(v) for v in trials.values())
    start = spent

    def record(task: ModelTask, trial: Trial) -> Trial:
        trial = replace(trial, index=len(trials.setdefault(task.workload_key, [])))
        trials[task.workload_key].append(trial)
        hooks.on_trial(task, trial)
        return trial

    layout_search = dict(history.layout_search) if history.layout_search is not None else None
    if request.layout == "search" and history.blocks is None:
        known_ms = {k: b.latency_ms for k, v in trials.items() if (b := best_trial(v)) is not None}
        found = search_layouts(graph, target, measurer, joint_budget(request.budget), seed=request.seed,
                               fusion=request.fusion, known=known_ms, on_measure=record,
                               should_stop=hooks.should_stop, **_limit(request))
        model = found.model
        layout_search = {
            "measurements": found.measurements, "rule_estimate_ms": found.rule_ms,
            "chosen_estimate_ms": found.estimate_ms, "rounds": found.rounds, "blocks": found.blocks,
            "note": "estimates: sum over the model's tasks of calls x measured latency (a short loop search for "
                    "convs, the default schedule for the rest), conversions included"}
        spent = start + found.measurements
        if hooks.should_stop():
            return ModelTuneResult(request, model, [], spent - start, layout_search, stopped=True)
        hooks.on_layouts(dict(found.blocks), layout_search)
    else:
        model = lower_model(graph, request, history.blocks)

    picked = [t for t in model.tasks if tunable(t.prim_func)]
    outcomes = [TaskOutcome(t, Task(t.name, t.workload_key, t.prim_func, target), trials.get(t.workload_key, []))
                for t in picked]
    weights = [t.weight for t in picked]
    # what this call spends counts against the budget with everything the history measured, kept task or not
    spent = max(spent, sum(len(v) for v in trials.values()))

    def publish() -> None:
        estimate = estimated_latency(weights, [o.best.latency_ms if o.best else None for o in outcomes],
                                     [o.untuned_ms for o in outcomes])
        if estimate is not None:
            hooks.on_estimate(estimate)

    def tune_round(i: int, n: int, start_from: Sequence[dict] = ()) -> RoundResult:
        o = outcomes[i]
        result = tune(o.task, len(o.trials) + n, seed=request.seed, prior=o.trials, start_from=start_from,
                      on_trial=lambda trial: record(o.model_task, trial), should_stop=hooks.should_stop,
                      measurer=measurer, replay=False)
        o.trials = trials[o.task.workload_key]
        o.best, o.untuned_ms = result.best, result.baseline_ms
        hooks.on_round(o.model_task, result)
        publish()
        return RoundResult(result.best.latency_ms if result.best is not None else None, len(result.trials))

    # known schedules first: one measurement each (none when this model already measured it)
    fresh = []
    for i, o in enumerate(outcomes):
        config = history.known(o.task.workload_key)
        if config is None:
            fresh.append(i)
            continue
        measured = any(t.config == config for t in o.trials)
        tune_round(i, 0 if measured else 1, [] if measured else [config])
        spent += 0 if measured else 1
    left = request.budget - spent
    if fresh and left > 0 and not hooks.should_stop():
        per_round = round_size(left, len(fresh), request.trials_per_round)
        scheduler = GradientScheduler([weights[i] for i in fresh], lambda j, n: tune_round(fresh[j], n), left,
                                      trials_per_round=per_round, seed=request.seed, should_stop=hooks.should_stop)
        for j, i in enumerate(fresh):  # resumed: the scheduler starts from what each task already has
            done = outcomes[i].trials
            if done:
                scheduler.state.rounds[j] = max(1, len(done) // per_round)
                scheduler.state.trials[j] = len(done)
                b = best_trial(done)
                scheduler.state.history[j].append(b.latency_ms if b is not None else None)
        scheduler.run()
    measurements = sum(len(v) for v in trials.values()) - start
    if hooks.should_stop():
        return ModelTuneResult(request, model, outcomes, measurements, layout_search, stopped=True)

    for o in outcomes:
        if o.pick is None:
            continue
        # kept only when it beats the schedule its task gets otherwise: the default one `build_model` gives an
        # untuned function, measured here the same way
        o.default_ms = _default_ms(measurer, o.task)
        # the pick by re-measurement: a task's best few measured again (one per 32 of its trials, none below 32),
        # the fastest reading kept, not the luckiest search reading
        count = remeasure_count(len(o.trials))
        if count and not hooks.should_stop():
            pick, pick_ms, readings = remeasure_best(o.task, o.trials, measurer, count)
            if pick is not None and pick_ms is not None:
                o.best = replace(pick, latencies_ms=[pick_ms], extra={**pick.extra, "remeasured": readings})
    stopped = hooks.should_stop()
    return ModelTuneResult(request, model, outcomes, measurements, layout_search, stopped=stopped)


def serve_model(model: ImportedModel, request: ModelTuneRequest, schedules: Mapping[str, Any],
                inputs: Sequence[Any], expected: Sequence[Any], *, dest: Path, facts: Mapping[str, dict],
                report: Mapping[str, Any], torch_ms: Mapping[str, float | None] | None = None,
                spec: Mapping[str, Any] | None = None) -> dict:
    """Builds the model with its picks, checks it whole against `expected`, times it and writes the artifact.

    Args:
        model: the model in its layouts (`ModelTuneResult.model`, or lowered again by `lower_model`).
        request: the request it was tuned for (target, pipeline, seed).
        schedules: the scheduled functions to build with, by workload key (`ModelTuneResult.schedules`).
        inputs: the check's inputs (the request's seed: `compiler.arrays.random_inputs`).
        expected: the reference outputs for `inputs` (torch's, the exported program's).
        dest: the artifact's .tar.gz.
        facts: per workload key, the tuning facts for the manifest (`ModelTuneResult.facts`).
        report: the report so far (`ModelTuneResult.report`); the check, the schedules and latencies are added.
        torch_ms: torch's latencies of the same model, for the report: `{"eager": ms, "compile": ms}`
            (torch.compile: inductor, frozen weights), each None when it was not timed.
        spec: what the manifest records as the job's spec (default: the request's fields).

    Returns:
        {"report", "latency_ms", "untuned_ms", "removed", "served", "error"}: `error` (nothing written) when even
        the untuned model does not match the reference.
    """
    target = resolve_target(request.target)
    schedules = dict(schedules)
    checked = build_checked(model, target, schedules, inputs, expected, pipeline=request.pipeline)
    names = {t.workload_key: t.name for t in model.tasks}
    report = {**report, "schedules": dict(report.get("schedules", {}))}
    report["check"] = {
        "passed": checked.built is not None,
        "inputs": f"random, seed {request.seed}",
        "reference": "torch: the exported program (ep.module())",
        "builds": checked.builds,
        "mismatches": checked.mismatches,
        "removed_schedules": [{"task": names.get(k, k), "workload_key": k} for k in checked.removed],
    }
    report["schedules"]["tuned"] = len(schedules)
    report["schedules"]["kept"] = len(checked.schedules)
    report["conversions"] = conversions(model.mod)
    served = {"report": report, "removed": list(checked.removed), "served": [], "latency_ms": None,
              "untuned_ms": None, "error": None}
    if checked.built is None:
        served["error"] = f"not served: {checked.error}"
        return served
    built, applied = checked.built, dict(checked.schedules)
    latency = time_model(built, inputs, target)
    untuned_built = checked.untuned if checked.untuned is not None else (
        built if not applied else build_model(model, target, pipeline=request.pipeline))
    untuned_latency = latency if untuned_built is built else time_model(untuned_built, inputs, target)
    report["served"] = "tuned" if applied else "untuned (no tuned schedule kept)"
    if untuned_built is not built and untuned_latency < latency:
        # each schedule beat its default on its own, but the model is slower with them: timed again (the machine
        # may be noisy), and if it still is, the untuned build (checked like the other) is served
        latency, untuned_latency = time_model(built, inputs, target), time_model(untuned_built, inputs, target)
        if untuned_latency < latency and (checked.untuned is not None or compare_outputs(
                run_model(untuned_built, inputs, target), expected, **tolerance(model)) is None):
            built, latency, applied = untuned_built, untuned_latency, {}
            report["served"] = "untuned: faster end to end than with the tuned schedules"
    report["schedules"]["served"] = len(applied)
    torch_ms = torch_ms or {}
    report["latency_ms"] = {"artifact": latency, "untuned": untuned_latency, "torch_eager": torch_ms.get("eager"),
                            "torch_compile": torch_ms.get("compile")}
    tasks = []
    for t in model.tasks:
        known = facts.get(t.workload_key, {})
        tasks.append({"name": t.name, "workload_key": t.workload_key, "weight": t.weight, "complex": t.complex,
                      "tuned": t.workload_key in applied, "latency_ms": known.get("latency_ms"),
                      "default_ms": known.get("default_ms"), "untuned_ms": known.get("untuned_ms"),
                      "removed_by_check": t.workload_key in checked.removed})
    manifest_spec = dict(spec) if spec is not None else asdict(request)
    write_model_artifact(dest, model, built, target, latency_ms=latency, tasks=tasks, spec=manifest_spec,
                         report=report)
    served.update(latency_ms=latency, untuned_ms=untuned_latency, served=sorted(applied))
    return served


def _default_ms(measurer: Measurer, task: Task) -> float | None:
    """Median latency of the task's default schedule, None when it could not be measured."""
    latencies, error = default_schedule_latency(measurer, task)
    if latencies is None:
        log.warning("task %s: its default schedule failed: %s", task.name, error)
        return None
    return sorted(latencies)[len(latencies) // 2]


def _limit(request: ModelTuneRequest) -> dict:
    return {} if request.max_tensor_elements is None else {"max_tensor_elements": request.max_tensor_elements}
