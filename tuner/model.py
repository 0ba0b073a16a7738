"""Tuning a whole model: the one path that model jobs, `bench.models` and any other caller share.

    result = tune_model(graph, ModelTuneRequest(target="llvm -mcpu=znver4", budget=64), measurer=measurer)
    served = serve_model(result, inputs, expected, dest=Path("model.tar.gz"))

`tune_model` takes the translated graph (`compiler.workloads.model.importer.ModelGraph`) and a typed request:

1. With `layout="search"` ALT's joint stage (`tuner.graph_layout`, `JOINT_SHARE` of the budget) chooses the
   convs' channel blocks first, unless the history already has them (a resumed job); else the graph is lowered in
   the request's layout.
2. Knowledge before measurement: every tunable task starts from the best schedule known without measuring
   (`start_schedule`): its stored one (`ModelHistory.known`, exact workload key on this target); else a stored
   schedule of a workload of the same form carried to its shapes (`ModelHistory.similar`, `tuner.transfer`): of the
   nearest few, the one the target's cost model ranks first (`knowledge`), the others measured in its first round;
   else, for a conv or matmul, the rule's register-blocked seed. A task the budget does not reach is served with
   it, never with the naive default schedule; a budget of 0 serves the model from knowledge alone.
3. A task with a stored schedule is measured no more. The others share the budget under
   `tuner.scheduler.GradientScheduler` (rounds of `tune(prior=...)`, run here or by any worker: `tuner.rounds`;
   a resumed job continues from its trials),
   its warm-up in order of each task's estimated share of the model's time (`estimated_shares`: calls x flops),
   each task's start measured first. A task whose search raises is given no more rounds (`TaskOutcome.error`,
   reported); the job goes on.
4. Each measured task's pick is its best few trials measured again (`remeasure_best`, one per 32 trials, none
   below 32), the fastest reading; it is applied only when it beats the task's default schedule (what
   `build_model` gives an untuned function), measured by the same measurer.

`serve_model` is the end of a job: the model built with the picks, checked whole against the reference outputs
(schedules whose model does not match are removed), timed against the untuned build (served instead when faster
end to end), written as the artifact. The worker runs it in a confined child (`service.model_build`); a
benchmark runs it in its own process: the same function either way.

The caller persists what it is told through `ModelTuneHooks` (every trial, the layouts, the running estimate);
nothing here reads settings or a database. What the target learned in earlier jobs comes in as `knowledge`
(`tuner.knowledge`: every task's search starts warm from its cost model) and goes out grown by this job's
measurements; persisting it is the caller's.

Over 600 lines: the two halves of one model job, tuning (`tune_model`) and serving (`serve_model`), and the
outcome types they share; the rounds' runners are `tuner.rounds`.

Layering: `tuner` imports `compiler`, never `service` or `bench`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import tvm
from tvm.s_tir.analysis import estimate_tir_flops

from compiler.target import resolve_target, vector_unit
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
from compiler.passes.grouping import Chain
from compiler.workloads.model.importer import ModelGraph, fusion_options, graph_blocks, lower_graph, with_chains
from compiler.workloads.model.tasks import conversions

from . import transfer
from .features import Featurizer
from .knowledge import PROGRAM_WIDTH, Knowledge, TargetModel
from .graph_layout import default_schedule_latency, joint_budget, search_layouts, tunable
from .measurers import Measurer
from .request import ModelTuneRequest
from .rounds import InlineRounds, Round, RoundDone, Rounds
from .scheduler import GradientScheduler, RoundResult, estimated_latency, round_size
from .spaces import make_space, reductions
from .task import Task, Trial, best_trial
from .tune import apply_config, remeasure_best, remeasure_count

log = logging.getLogger("altune.model")

@dataclass(frozen=True)
class StartSchedule:
    """A schedule a task has before this job measures anything (knowledge before measurement).

    Attributes:
        config: the configuration, in the task's space.
        source: "stored" (this workload's, measured on this target by an earlier job), "transferred" (a similar
            workload's, carried to this one's shapes: `tuner.transfer`) or "seed" (the rule's register-blocked
            nest, `SearchSpace.seed_configs`).
        latency_ms: stored only: the latency the earlier job measured.
        default_ms: stored only: the task's default schedule's latency then (None: not recorded).
        origin: transferred only: the workload key it came from.
    """

    config: dict
    source: str
    latency_ms: float | None = None
    default_ms: float | None = None
    origin: str | None = None

    @property
    def beats_default(self) -> bool:
        """Served without measuring: a stored one unless its job found the default schedule faster; a transferred
        one or a seed always (a complex operator's default schedule is never the better guess)."""
        return self.latency_ms is None or self.default_ms is None or self.latency_ms < self.default_ms


@dataclass(frozen=True)
class ModelHistory:
    """What the caller already knows before tuning starts.

    Attributes:
        blocks: the joint stage's chosen blocks (a resumed job's); None: run it when the layout is "search".
        layout_search: that joint stage's report.
        trials: measured trials by workload key (a resumed job's; counted in the budget, never measured again).
        known: the stored schedule of a workload key on this target (`StartSchedule`, source "stored"), None when
            there is none: the task is served with it and measured no more.
        similar: the stored schedules of workloads that share a task's transfer signature (`tuner.transfer`), for
            tasks without a stored schedule of their own.
    """

    blocks: Mapping[str, list[int]] | None = None
    layout_search: Mapping[str, Any] | None = None
    trials: Mapping[str, Sequence[Trial]] = field(default_factory=dict)
    known: Callable[[str], StartSchedule | None] = lambda _key: None
    similar: Callable[[str], Sequence[Any]] = lambda _signature: ()


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
    """One tunable task's tuning: where it started, its trials (history included), its pick and what it was
    compared with."""

    model_task: ModelTask
    task: Task
    trials: list[Trial]
    start: StartSchedule | None = None
    seeds: list[dict] = field(default_factory=list)  # a complex task's register-blocked nests (`_blocked_seeds`)
    carried: list[dict] = field(default_factory=list)  # the other transferred schedules its first round measures
    share: float = 0.0
    best: Trial | None = None
    untuned_ms: float | None = None
    default_ms: float | None = None
    error: str | None = None

    @property
    def pick(self) -> Trial | None:
        """The best measured trial (re-measured where it was), None when nothing of this task was measured."""
        return self.best if self.best is not None else best_trial(self.trials)

    @property
    def beats_default(self) -> bool:
        """The pick is faster than what the task gets without it (its default schedule; else its raw function)."""
        pick = self.pick
        versus = self.default_ms if self.default_ms is not None else self.untuned_ms
        return pick is not None and (versus is None or pick.latency_ms < versus)

    @property
    def served(self) -> tuple[dict, str] | None:
        """(configuration, source) the task is built with, None for its default schedule: the measured pick where
        it beats the default schedule ("measured"); with nothing measured, its start ("stored", "transferred",
        "seed") unless a stored one lost to the default schedule."""
        if self.pick is not None:
            return (self.pick.config, "measured") if self.beats_default else None
        if self.trials:
            return None  # measured, nothing correct (its start among what failed)
        if self.start is not None and self.start.beats_default:
            return self.start.config, self.start.source
        return None


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
        alternatives: fusion "auto" with chain options: the other models `serve_model` times whole against `model`
            (the fastest is served), by name: "unfused" (no chain fused) and "every chain" (every option fused),
            each where it differs from `model`.
        fusion: fusion "auto": one decision per chain option (`decide_fusion`), `model.chains` the fused ones.
    """

    request: ModelTuneRequest
    model: ImportedModel
    outcomes: list[TaskOutcome]
    measurements: int = 0
    layout_search: dict | None = None
    stopped: bool = False
    alternatives: dict[str, ImportedModel] = field(default_factory=dict)
    fusion: list[dict] = field(default_factory=list)

    @property
    def schedules(self) -> dict[str, Any]:
        """The scheduled function of every task served with a schedule (`TaskOutcome.served`), by workload key; a
        configuration that no longer applies is left out (the task gets its default schedule)."""
        out = {}
        for o in self.outcomes:
            if o.served is None:
                continue
            try:
                out[o.task.workload_key] = apply_config(o.task, o.served[0])
            except Exception as e:  # noqa: BLE001 - one task's schedule never fails the model
                log.warning("task %s: its %s schedule does not apply: %s", o.task.name, o.served[1], e)
        return out

    @property
    def facts(self) -> dict[str, dict]:
        """Per workload key: the pick's latency (a stored start's where nothing was measured), the default
        schedule's, the raw function's, where the served schedule came from (the manifest's)."""
        out = {}
        for o in self.outcomes:
            latency = o.pick.latency_ms if o.pick else (o.start.latency_ms if o.start else None)
            out[o.task.workload_key] = {"latency_ms": latency, "default_ms": o.default_ms, "untuned_ms": o.untuned_ms,
                                        "source": o.served[1] if o.served else "default", "share": o.share,
                                        "trials": len(o.trials)}
        return out

    @property
    def report(self) -> dict:
        """The job's report so far: import notes, the joint stage, where each task's schedule came from, the tasks
        whose default schedule was faster, the tasks whose search failed."""
        keys = {t.workload_key for t in self.model.tasks}  # fusion "auto" tuned the chains' other side too
        sources: dict[str, int] = {}
        for o in self.outcomes:
            if o.task.workload_key not in keys:
                continue
            source = o.served[1] if o.served else "default"
            sources[source] = sources.get(source, 0) + 1
        report: dict[str, Any] = {
            "import_notes": list(self.model.notes),
            "schedules": {
                "sources": sources,
                "default_schedule_faster": [
                    {"task": o.model_task.name, "workload_key": o.task.workload_key}
                    for o in self.outcomes if o.pick is not None and not o.beats_default],
                "search_failed": [{"task": o.model_task.name, "workload_key": o.task.workload_key, "error": o.error}
                                  for o in self.outcomes if o.error is not None],
            },
        }
        if self.layout_search is not None:
            report["layout_search"] = dict(self.layout_search)
        if self.request.fusion == "auto":
            report["fusion"] = {"chains": list(self.fusion), "fused": sum(1 for d in self.fusion if d["fused"])}
        # how often the served schedules use the outer-product micro-kernel (`compiler.passes.tensorize`: its
        # register block marked, the loop partitioned around the tails)
        served = [o.served[0] for o in self.outcomes if o.served is not None and o.task.workload_key in keys]
        report["schedules"]["micro_kernel"] = {"served": len(served),
                                               "tensorized": sum(1 for c in served if c.get("tensorize"))}
        return report


def lower_model(graph: ModelGraph, request: ModelTuneRequest, blocks: Mapping[str, list[int]] | None = None
                ) -> ImportedModel:
    """The model in the request's layouts (`blocks`: the joint stage's choice, by conv weight name); with fusion
    "auto" unmerged (`with_chains` merges the chains the job fused, `ModelTuneResult.model.chains`)."""
    target = resolve_target(request.target)
    chosen = graph_blocks(graph, dict(blocks), target) if blocks else None
    return lower_graph(graph, layout=request.layout, target=target, fusion=request.fusion, blocks=chosen,
                       **_limit(request))


def tune_model(graph: ModelGraph, request: ModelTuneRequest, *, measurer: Measurer,
               history: ModelHistory | None = None, hooks: ModelTuneHooks | None = None,
               knowledge: Knowledge | None = None, rounds: Rounds | None = None) -> ModelTuneResult:
    """Tunes every tunable task of the model under one budget (see the module docstring); the measurer stays open.

    Args:
        graph: the translated model.
        request: what to tune and how (a budget of 0: every task served from what is known, nothing measured).
        measurer: where every candidate is measured (the caller closes it).
        history: trials, blocks and schedules already known (a resumed job, the schedules table).
        hooks: told of every trial and estimate; polled to stop.
        knowledge: what the target learned in earlier jobs (`tuner.knowledge`): every task's search starts warm from
            its cost model, and records its measurements into it; None: cold.
        rounds: who runs the tasks' rounds (`tuner.rounds`; the service's spread them over its workers, which write
            their trials: `hooks.on_trial` hears the joint stage's only); None: here, one at a time (`InlineRounds`).
    """
    history = history or ModelHistory()
    hooks = _Guarded(hooks or ModelTuneHooks())
    target = resolve_target(request.target)
    trials: dict[str, list[Trial]] = {k: list(v) for k, v in history.trials.items()}
    start = spent = sum(len(v) for v in trials.values())

    def record(task: ModelTask, trial: Trial) -> Trial:
        trial = replace(trial, index=len(trials.setdefault(task.workload_key, [])))
        trials[task.workload_key].append(trial)
        hooks.on_trial(task, trial)
        return trial

    layout_search = dict(history.layout_search) if history.layout_search is not None else None
    if request.layout == "search" and history.blocks is None and request.budget > 0:
        known_ms = {k: b.latency_ms for k, v in trials.items() if (b := best_trial(v)) is not None}
        found = search_layouts(graph, target, measurer, joint_budget(request.budget), seed=request.seed,
                               fusion=request.fusion, known=known_ms, on_measure=record,
                               should_stop=hooks.should_stop, knowledge=knowledge, **_limit(request))
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

    options = chain_options(model, request) if request.fusion == "auto" else []
    candidates = list(model.tasks) + [o.fused for o in options]
    outcomes = [TaskOutcome(t, Task(t.name, t.workload_key, t.prim_func, target), trials.get(t.workload_key, []))
                for t in {t.workload_key: t for t in candidates}.values() if tunable(t.prim_func)]
    for o in outcomes:  # knowledge before measurement: every task starts from the best schedule known unmeasured
        o.seeds = _blocked_seeds(o.task) if o.model_task.complex else []
        o.start = start_schedule(o, history, knowledge)
    shares = estimated_shares(outcomes)
    for o, share in zip(outcomes, shares):
        o.share = share
    # what this call spends counts against the budget with everything the history measured, kept task or not
    spent = max(spent, sum(len(v) for v in trials.values()))

    index = {o.task.workload_key: i for i, o in enumerate(outcomes)}
    own = [o for o in outcomes if o.task.workload_key in {t.workload_key for t in model.tasks}]

    def publish() -> None:  # the model's estimate as lowered (a chain's fused side is an alternative, not a part)
        estimate = estimated_latency([o.model_task.weight for o in own],
                                     [o.best.latency_ms if o.best else None for o in own],
                                     [o.untuned_ms for o in own])
        if estimate is not None:
            hooks.on_estimate(estimate)

    def make_round(i: int, n: int) -> Round:
        o = outcomes[i]
        # a task's start is measured first (the seed or transferred schedule it would be served with unmeasured),
        # then a complex operator's other register-blocked nests; its untuned nest (the search's other seed, for
        # memory-bound programs) is left out: a conv's runs tens of times slower, seconds per measurement
        start_from = [] if o.trials else [*([o.start.config] if o.start else []), *o.carried, *o.seeds]
        return Round(i, o.task, n, len(o.trials), start_from, seeds=not o.model_task.complex, seed=request.seed,
                     weight=o.model_task.weight)

    def finished(done: RoundDone) -> RoundResult:
        o = outcomes[done.round.index]
        o.trials = trials[o.task.workload_key] = list(done.trials)
        o.best = best_trial(o.trials)
        best_ms = o.best.latency_ms if o.best is not None else None
        if done.error is not None:  # one task's failing search never fails the model job: no more rounds for it
            o.error = done.error
            return RoundResult(best_ms, 0)
        o.untuned_ms = done.baseline_ms if done.baseline_ms is not None else o.untuned_ms
        hooks.on_round(o.model_task, done)
        publish()
        for option in options:  # a chain's fused side clearly slower than its own tasks: no more rounds for it
            fused = index.get(option.fused.workload_key)
            parts = [_best_ms(outcomes[index[m.workload_key]]) if m.workload_key in index else None
                     for m in option.members]
            if fused in position and None not in parts and (ms := _best_ms(outcomes[fused])) is not None \
                    and ms > LOSING_FUSION * sum(parts):  # type: ignore[arg-type]
                scheduler.state.dead[position[fused]] = True
        return RoundResult(best_ms, done.spent)

    # a task with a stored schedule is served with it and measured no more; the others share the budget, the
    # largest estimated share of the model's time first (the scheduler's warm-up goes in this order)
    fresh = sorted((i for i, o in enumerate(outcomes) if o.start is None or o.start.source != "stored"),
                   key=lambda i: -outcomes[i].share)
    left = request.budget - spent
    if fresh and left > 0 and not hooks.should_stop():
        per_round = round_size(left, len(fresh), request.trials_per_round)
        runner = rounds or InlineRounds(measurer, knowledge=knowledge, should_stop=hooks.should_stop,
                                        on_trial=lambda r, t: record(outcomes[r.index].model_task, t),
                                        reraise=hooks.reraise)
        # the scheduler counts the resumed tasks' trials as spent (below): its budget is what is left plus them
        scheduler = GradientScheduler([outcomes[i].model_task.weight for i in fresh], lambda j, n: None,
                                      left + sum(len(outcomes[i].trials) for i in fresh), trials_per_round=per_round,
                                      seed=request.seed, should_stop=hooks.should_stop)
        for j, i in enumerate(fresh):  # resumed: the scheduler starts from what each task already has
            if done := outcomes[i].trials:
                b = best_trial(done)
                scheduler.state.rounds[j], scheduler.state.trials[j] = max(1, len(done) // per_round), len(done)
                scheduler.state.history[j].append(b.latency_ms if b is not None else None)
        position = {i: j for j, i in enumerate(fresh)}

        def wait(more: bool) -> tuple[int, RoundResult] | None | bool:
            done = runner.wait(more)  # a finished round, a free slot (True), or a stop (None)
            return done if done is None or done is True else (position[done.round.index], finished(done))

        try:
            scheduler.run_parallel(lambda j, n: runner.submit(make_round(fresh[j], n), outcomes[fresh[j]].trials),
                                   wait, runner.free)
        finally:
            runner.close()
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
    decisions = decide_fusion(options, outcomes)
    chosen = [o.chain for o, d in zip(options, decisions) if d["fused"]]

    def fused(chains: list[Chain]) -> ImportedModel:
        return with_chains(model, chains, **_limit(request))

    served, alternatives = fused(chosen), {}
    if decisions:
        served.notes.append(f"fusion: {len(chosen)} of {len(decisions)} chain(s) whose intermediates exceed the L2 "
                            f"cache fused, where measured faster than unfused")
        # a task measured alone reads its inputs from warm caches: the models are timed whole too (`serve_model`),
        # where a fused side was measured at all (not for a model served from what is known, the anytime artifact)
        if any(d["fused_ms"] is not None for d in decisions):
            alternatives = {name: fused(chains) for name, chains in (("unfused", []),
                                                                     ("every chain", [o.chain for o in options]))
                            if len(chains) != len(chosen)}
    return ModelTuneResult(request, served, outcomes, measurements, layout_search, stopped=stopped,
                           alternatives=alternatives, fusion=decisions)


@dataclass(frozen=True)
class ChainOption:
    """A chain of complex operators a model job may fuse (fusion "auto"): its merged task and its own tasks."""

    chain: Chain
    fused: ModelTask
    members: tuple[ModelTask, ...]


def chain_options(model: ImportedModel, request: ModelTuneRequest) -> list[ChainOption]:
    """The model's chain options (`ImportedModel.chain_options`: intermediates over the L2 cache) whose merged
    function is a task of its own and whose every function is a tunable task: both sides get tuned."""
    by_function = {f: t for t in model.tasks for f in t.functions}
    out = []
    for chain, fused in zip(model.chain_options, fusion_options(model, **_limit(request))):
        members = tuple(by_function.get(f) for f in chain.functions)
        if fused is None or not tunable(fused.prim_func) or any(m is None or not tunable(m.prim_func)
                                                                for m in members):
            continue
        out.append(ChainOption(chain, fused, members))  # type: ignore[arg-type]
    return out


def decide_fusion(options: Sequence[ChainOption], outcomes: Sequence[TaskOutcome]) -> list[dict]:
    """Per chain option: fused when its merged task, as it will be served, measured faster than its functions'
    tasks together, as they will be (a side that nothing measured: unfused). The model job then times the two
    models end to end as well (`serve_model`)."""
    by_key = {o.task.workload_key: o for o in outcomes}
    decisions = []
    for option in options:
        fused_ms = _served_ms(by_key.get(option.fused.workload_key))
        parts = [_served_ms(by_key.get(m.workload_key)) for m in option.members]
        unfused_ms = None if None in parts else sum(parts)  # type: ignore[arg-type]
        decisions.append({"functions": list(option.chain.functions), "task": option.fused.name,
                          "workload_key": option.fused.workload_key,
                          "intermediate_bytes": option.chain.intermediate_bytes,
                          "fused_ms": fused_ms, "unfused_ms": unfused_ms,
                          "fused": fused_ms is not None and unfused_ms is not None and fused_ms < unfused_ms})
    return decisions


LOSING_FUSION = 1.5  # a chain's fused side this much slower than its own tasks together gets no more rounds


def _best_ms(outcome: TaskOutcome) -> float | None:
    """A task's best latency so far: measured, else its stored schedule's."""
    if outcome.best is not None:
        return outcome.best.latency_ms
    return outcome.start.latency_ms if outcome.start is not None else None


def _served_ms(outcome: TaskOutcome | None) -> float | None:
    """The measured latency of what a task is served with (its pick, else its default schedule; a stored schedule's
    latency as the earlier job measured it), None unmeasured."""
    if outcome is None:
        return None
    if outcome.pick is not None and outcome.beats_default:
        return outcome.pick.latency_ms
    if outcome.pick is None and not outcome.trials and outcome.start is not None and outcome.start.beats_default:
        return outcome.start.latency_ms  # a stored one's; None for a seed or a transferred one
    return outcome.default_ms if outcome.default_ms is not None else outcome.untuned_ms


def start_schedule(outcome: TaskOutcome, history: ModelHistory, knowledge: Knowledge | None = None
                   ) -> StartSchedule | None:
    """The best schedule a task has without measuring: its stored one (exact workload key, this target); else a
    stored schedule of a workload of the same form carried to its shapes (`tuner.transfer`): of the
    `TRANSFERRED` nearest, the one the target's cost model ranks first (`knowledge`; the nearest without one),
    the others measured in the task's first round (`outcome.carried`); else, for a complex operator (conv,
    matmul), the rule's register-blocked seed; else None (the default schedule: pools, reductions and other
    memory-bound tasks run about as fast so)."""
    task = outcome.task
    stored = history.known(task.workload_key)
    if stored is not None:
        return stored
    key = transfer.signature(task)
    if key is not None:
        carried = transfer.transferred(task, history.similar(key.signature), limit=TRANSFERRED)
        if carried and knowledge is not None and knowledge.cost_model is not None and len(carried) > 1:
            carried = [carried[i] for i in _ranked(task, [c for c, _ in carried], knowledge.cost_model)]
        if carried:
            (config, origin), *others = carried
            outcome.carried = [c for c, _ in others]
            return StartSchedule(config, "transferred", origin=origin)
    return StartSchedule(outcome.seeds[0], "seed") if outcome.seeds else None


TRANSFERRED = 4  # the nearest stored schedules of a task's form carried to it: the start, and its first round's


def _ranked(task: Task, configs: Sequence[dict], model: TargetModel) -> list[int]:
    """The indexes of `configs` (of `task`'s loop space), best first as `model` predicts from their program
    features; their order unchanged when they cannot be featurized."""
    space = transfer.space_of(task)  # the space `transfer.adapt` carried them into
    if space is None:
        return list(range(len(configs)))
    try:
        featurize = Featurizer(space, task.target)
        if not featurize.program_features:
            return list(range(len(configs)))
        scores = model.predict(featurize(list(configs))[:, -PROGRAM_WIDTH:])
    except Exception as e:  # noqa: BLE001 - the nearest first, as without a model
        log.warning("task %s: transferred schedules not ranked: %s", task.name, e)
        return list(range(len(configs)))
    return sorted(range(len(configs)), key=lambda i: -float(scores[i]))


def _blocked_seeds(task: Task) -> list[dict]:
    """The task's register-blocked nests (`SearchSpace.seed_configs`, source "blocked"), the rule's first."""
    try:
        space = make_space("fusion" if reductions(task.prim_func) > 1 else "loop", task.prim_func, None,
                           vector_unit(task.target))
        return [c for c, source in space.seed_configs() if source == "blocked"]
    except Exception as e:  # noqa: BLE001 - no seed: the default schedule
        log.warning("task %s: no seed schedule: %s", task.name, e)
        return []


def estimated_shares(outcomes: Sequence[TaskOutcome]) -> list[float]:
    """Each task's estimated share of the model's time before anything is measured: calls x floating-point
    operations (TVM's `estimate_tir_flops`; at least the bytes its arguments hold, for memory-bound tasks),
    normalized to sum to 1."""
    costs = []
    for o in outcomes:
        try:
            flops = float(estimate_tir_flops(tvm.IRModule({"main": o.task.prim_func})))
        except Exception:  # noqa: BLE001 - a function TVM cannot count: its bytes stand in
            flops = 0.0
        data = float(sum(math.prod(a.shape) for a in o.model_task.args))
        costs.append(o.model_task.weight * max(flops, data))
    total = sum(costs) or 1.0
    return [c / total for c in costs]


class _Guarded(ModelTuneHooks):
    """The caller's hooks, remembering an exception one of them raised (an abort: a lost lease), so that a task's
    failure is told from an abort that must end the job."""

    def __init__(self, hooks: ModelTuneHooks) -> None:
        self.hooks = hooks
        self.raised: BaseException | None = None

    def _call(self, name: str, *args: Any) -> Any:
        try:
            return getattr(self.hooks, name)(*args)
        except BaseException as e:
            self.raised = e
            raise

    def reraise(self) -> None:
        if self.raised is not None:
            raise self.raised

    def should_stop(self) -> bool:
        return self._call("should_stop")

    def on_trial(self, task: ModelTask, trial: Trial) -> None:
        self._call("on_trial", task, trial)

    def on_layouts(self, blocks: dict[str, list[int]], report: dict) -> None:
        self._call("on_layouts", blocks, report)

    def on_round(self, task: ModelTask, result: Any) -> None:
        self._call("on_round", task, result)

    def on_estimate(self, latency_ms: float) -> None:
        self._call("on_estimate", latency_ms)


def serve_model(model: ImportedModel, request: ModelTuneRequest, schedules: Mapping[str, Any],
                inputs: Sequence[Any], expected: Sequence[Any], *, dest: Path, facts: Mapping[str, dict],
                report: Mapping[str, Any], torch_ms: Mapping[str, float | None] | None = None,
                spec: Mapping[str, Any] | None = None, alternatives: Mapping[str, ImportedModel] | None = None
                ) -> dict:
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
        alternatives: other models of the same program by name (`ModelTuneResult.alternatives`: fusion "auto"'s
            other choices of chains to fuse), each built, checked and timed too; the fastest is served.

    Returns:
        {"report", "latency_ms", "untuned_ms", "removed", "served", "error"}: `error` (nothing written) when even
        the untuned model does not match the reference.
    """
    target = resolve_target(request.target)
    every = dict(schedules)
    schedules = _own(model, every)
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
    if alternatives:  # the fusion decisions were made task by task: the models are timed whole as well
        timed = {"chosen": latency}
        best = None
        for name, other_model in alternatives.items():
            other = build_checked(other_model, target, _own(other_model, every), inputs, expected,
                                  pipeline=request.pipeline)
            if other.built is None:
                continue
            timed[name] = time_model(other.built, inputs, target)
            if timed[name] < (best[1] if best else latency):
                best = (name, timed[name], other_model, other)
        if best is not None:  # timed again, the two of them (the machine may be noisy)
            latency, timed[best[0]] = time_model(built, inputs, target), time_model(best[3].built, inputs, target)
            timed["chosen"] = latency
        served_name = "chosen"
        if best is not None and timed[best[0]] < latency:
            served_name, (model, built, latency, applied, checked) = best[0], (
                best[2], best[3].built, timed[best[0]], dict(best[3].schedules), best[3])
        report["fusion"] = {**report.get("fusion", {}), "end_to_end_ms": timed, "served": served_name,
                            "served_chains": len(model.chains)}
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
                      "removed_by_check": t.workload_key in checked.removed,
                      # where its schedule came from ("measured", "stored", "transferred", "seed"; "default": none)
                      "source": known.get("source", "default") if t.workload_key in applied else "default",
                      "share": known.get("share"), "trials": known.get("trials", 0)})
    manifest_spec = dict(spec) if spec is not None else asdict(request)
    write_model_artifact(dest, model, built, target, latency_ms=latency, tasks=tasks, spec=manifest_spec,
                         report=report)
    served.update(latency_ms=latency, untuned_ms=untuned_latency, served=sorted(applied))
    return served


def _own(model: ImportedModel, schedules: Mapping[str, Any]) -> dict[str, Any]:
    """The schedules of `model`'s tasks (a fusion "auto" job tuned both sides of its chains)."""
    keys = {t.workload_key for t in model.tasks}
    return {k: v for k, v in schedules.items() if k in keys}


def _default_ms(measurer: Measurer, task: Task) -> float | None:
    """Median latency of the task's default schedule, None when it could not be measured."""
    latencies, error = default_schedule_latency(measurer, task)
    if latencies is None:
        log.warning("task %s: its default schedule failed: %s", task.name, error)
        return None
    return sorted(latencies)[len(latencies) // 2]


def _limit(request: ModelTuneRequest) -> dict:
    return {} if request.max_tensor_elements is None else {"max_tensor_elements": request.max_tensor_elements}
