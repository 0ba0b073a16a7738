"""The entry points the service calls: `tune` a task, `apply_config` to get its program.

Pick by re-measurement: the best of a search's measurements is partly the best program and partly
the luckiest reading (the final timing ran 10-20% above the search's best, up to 60% on some
shapes: the winner's curse). With `remeasure=k`, `tune` measures its `k` best distinct trials again
once the search is over and keeps the fastest then (`TuneResult.final`, `final_ms`); those
measurements are neither budget trials nor recorded trials.

Layering: `tuner` never imports `service`.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence

import tvm

from compiler.target import vector_unit
from compiler.workloads.subgraphs import Subgraph

from .cost_models import CostModelKind
from .knowledge import Knowledge
from .measurers import Candidate, LocalMeasurer, Measurer
from .searches import SearchKind, make_search, never, noop
from .spaces import (
    Config,
    FusionSpace,
    LayoutSpace,
    SpaceKind,
    apply_layout_config,
    config_key,
    has_layout,
    interface_space,
    is_fusion_config,
    layout_of_config,
    loop_space,
    make_space,
    reductions,
    split_config,
)
from .task import Task, Trial, TuneResult, best_trial

FINALISTS = 3  # the most trials `remeasure_count` re-measures


def remeasure_count(budget: int) -> int:
    """How many finalists a search of `budget` measurements re-measures: one per 32 measurements, at most
    `FINALISTS`, so re-measuring adds at most 1/32 to a search's measurements (none below 32: smoke jobs
    and tests are not lengthened)."""
    return min(FINALISTS, max(budget, 0) // 32)


def tune(
    task: Task,
    budget: int,
    *,
    seed: int = 0,
    prior: Sequence[Trial] = (),
    start_from: Sequence[Config] = (),
    on_trial: Callable[[Trial], None] = noop,
    should_stop: Callable[[], bool] = never,
    measurer: Measurer | None = None,
    space: SpaceKind = "loop",
    cost_model: CostModelKind = "xgb",
    top_k: int = 8,
    batch_size: int = 128,
    search: SearchKind | None = None,
    joint_fraction: float = 0.3,
    layout: dict[str, int] | None = None,
    layout_levels: int = 1,
    replay: bool = True,
    ppo: bool = True,
    seeds: bool = True,
    remeasure: int = 0,
    knowledge: Knowledge | None = None,
) -> TuneResult:
    """Searches `task`'s layouts and loops (ALT) or its loops only.

    Args:
        task: the program and target.
        budget: on-device measurements in all, `prior` included.
        seed: makes the search deterministic given the same measurements.
        prior: trials already measured for this task (resume): counted in the
            budget, never measured again, and the cost model is trained on them first.
        start_from: known good configurations (from the schedules table), measured first.
        on_trial: called with each trial the moment it is measured.
        should_stop: polled between measurements (cancel, lost lease).
        measurer: where candidates are measured; a `LocalMeasurer` (closed
            afterwards) when None.
        space: the search space's kind; a program of several reductions (a subgraph) always gets
            "fusion" (basteln tiling and fusion, `FusionSpace`).
        cost_model: "xgb" or "random" (the no-model ablation).
        top_k: candidates measured per round.
        batch_size: candidates ranked per round.
        search: "alt" (joint layout + loop tuning; needs `task.workload`), "xgb" (loops of
            the untransformed program) or "random"; None: "alt" when the task carries its
            workload and is one operator, else "xgb".
        joint_fraction: ALT's share of the budget for the joint stage.
        layout: ALT only: a fixed layout choice (loop-only in it, the ALT-OL ablation;
            {} = channels last).
        layout_levels: ALT only: 1 (one-level layout templates, the default) or 2 (two-level
            output tiling, the paper's larger space).
        replay: resume by replaying `prior` through the search (exact; see `Search.run`);
            False learns it at once (callers tuning in many short rounds).
        ppo: ALT only: its PPO agents choose layouts and loop walks; False draws them at random (the
            ablation of the agents: the seeds, the cost model and random walks).
        seeds: the first round measures the space's known nests (`seed_configs`: the untuned nest,
            oneDNN-like register blocking) and ALT starts its layouts from the oneDNN-like one
            (`searches.alt_seeds.first_layout`); False: neither, what the search finds on its own (the unseeded
            ablation).
        remeasure: after the search, measure this many of the best trials (prior ones included)
            again and keep the fastest then (`remeasure_best`); 0: keep the search's best. Skipped
            when `should_stop()` says so. `remeasure_count(budget)` is the service's choice.
        knowledge: what the target learned in earlier jobs (`tuner.knowledge`): the search starts warm from its
            cost model and policies and records what it measures and learns into it; None: cold.

    Returns:
        The best trial (prior ones included), this call's trials, the untuned program's latency
        (None if stopped before it was measured or it failed), and the trial to deploy with its
        latency (`final`, `final_ms`: re-measured with `remeasure`).
    """
    assert budget >= 0, f"{budget=} must be >= 0"
    own = measurer is None
    measurer = LocalMeasurer() if measurer is None else measurer
    try:
        baseline = None if should_stop() else measurer.baseline_ms(task)
        fusion = space == "fusion" or _several_operators(task)
        if fusion:  # a subgraph of complex operators: basteln's tiles and threshold, searched by XGBoost
            space = "fusion"
        kind = search or ("alt" if task.workload is not None and not fusion else "xgb")
        options = dict(cost_model=cost_model, seed=seed, top_k=top_k, batch_size=batch_size, seeds=seeds,
                       knowledge=knowledge)
        if kind == "alt":
            options.update(joint_fraction=joint_fraction, layout=layout, ppo=ppo)
            strategy = make_search("alt", task, LayoutSpace(task, layout_levels), measurer, **options)
        else:
            strategy = make_search(kind, task, make_space(space, task.prim_func, task.workload,
                                                                  vector_unit(task.target)), measurer, **options)
        trials = strategy.run(budget, prior=prior, start_from=start_from, on_trial=on_trial, should_stop=should_stop,
                              replay=replay)
        best = best_trial([*prior, *trials])
        if remeasure <= 0 or best is None or should_stop():
            return TuneResult(best, trials, baseline)
        final, final_ms, readings = remeasure_best(task, [*prior, *trials], measurer, remeasure,
                                                   measured_as=strategy.measured_as)
    finally:
        if own:
            measurer.close()
    return TuneResult(best, trials, baseline, final, final_ms, readings)


def remeasure_best(
    task: Task,
    trials: Sequence[Trial],
    measurer: Measurer,
    count: int = FINALISTS,
    *,
    measured_as: Callable[[Config], tuple[Task, Candidate]] | None = None,
) -> tuple[Trial | None, float | None, dict[int, float | None]]:
    """Measures the `count` fastest trials again and picks the fastest of those readings.

    The finalists are the `count` fastest correct trials by their search latency, one per
    configuration; they are built together and measured one after another, each a fresh
    measurement (the measurer's repeats, median). Nothing is recorded and no budget is spent: the
    caller's trials are left as they are. A finalist that fails now (it ran before: a crash, a
    timeout on a busy machine) is not picked; if every one fails, the search's best stays, with
    its search latency.

    Args:
        task: the task the trials are of.
        trials: its trials (failed ones are ignored).
        measurer: the device, as for the search.
        count: how many finalists (at least 1).
        measured_as: config -> (the task it is measured in, its candidate), as the search
            measured it; default: `apply_config` on `task` (layout configurations in their
            constants-packed task, as ALT measures them).

    Returns:
        (the picked trial, its re-measured latency, trial index -> re-measured latency of every
        finalist (None: failed)); (None, None, {}) when no trial ran correctly.
    """
    assert count >= 1, f"{count=} must be >= 1"
    ranked = sorted((t for t in trials if t.latency_ms is not None), key=lambda t: (t.latency_ms, t.index))
    finalists: list[Trial] = []
    seen: set[str] = set()
    for t in ranked:
        if config_key(t.config) not in seen:
            seen.add(config_key(t.config))
            finalists.append(t)
        if len(finalists) == count:
            break
    if not finalists:
        return None, None, {}
    as_measured = measured_as or (lambda config: _as_measured(task, config))
    readings: dict[int, float | None] = {}
    pairs = []
    for t in finalists:
        try:
            pairs.append((t, *as_measured(t.config)))
        except Exception:  # noqa: BLE001 - a configuration that no longer applies is not picked
            readings[t.index] = None
    measurer.prebuild([(sub, candidate) for _, sub, candidate in pairs])
    for t, sub, candidate in pairs:
        result = measurer.measure_one(sub, candidate)
        readings[t.index] = (statistics.median(result.latencies_ms)
                             if result.error is None and result.latencies_ms else None)
    timed = [t for t in finalists if readings.get(t.index) is not None]
    if not timed:
        return finalists[0], finalists[0].latency_ms, readings
    pick = min(timed, key=lambda t: readings[t.index])
    return pick, readings[pick.index], readings


def _as_measured(task: Task, config: Config) -> tuple[Task, Candidate]:
    """How a configuration is measured without its search at hand: a loop configuration in `task`, a
    layout configuration in its program with the constants packed beforehand (as `ALTSearch` does)."""
    prog = layout_of_config(task, config)
    if prog is None:
        return task, Candidate(config, apply_config(task, config))
    wl = task.workload
    xs = list(task.inputs) if task.inputs is not None else wl.random_inputs(0)
    expected = task.expected if task.expected is not None else wl.reference(xs)
    sub = Task(task.name, task.workload_key, prog.prim_func, task.target, inputs=prog.pack_inputs(xs),
               expected=expected, workload=wl)
    return sub, Candidate(config, interface_space(prog, vector_unit(task.target)).apply(split_config(config)[1]).mod)


def apply_config(task: Task, config: Config) -> tvm.IRModule:
    """The scheduled module of `config` for `task`.

    A loop-only configuration gives "main" with the untransformed signature. A layout
    configuration (ALT's, `layout.*` knobs) gives "main" with data and output in the
    user's layouts (converted inside) and the constants (weight, bias) in their
    tuned layouts, plus "pack_constants"(user constants..., packed constants...) to
    pack them once; `layout_of_config(task, config).manifest()` describes both.

    Raises:
        InvalidConfig: the configuration is not in the task's space.
        ScheduleFailed: TVM refused to apply it.
    """
    if has_layout(config):
        return apply_layout_config(task, config)
    if is_fusion_config(config):
        return FusionSpace(task.prim_func, vector_unit(task.target), workload=task.workload).apply(config).mod
    return loop_space(task.prim_func, vector_unit(task.target)).apply(config).mod


def _several_operators(task: Task) -> bool:
    """A task of several operators (a catalog subgraph, pad -> conv -> bias -> relu included, or a fused
    model task of several reductions): basteln's space."""
    return isinstance(task.workload, Subgraph) or reductions(task.prim_func) > 1
