"""The entry points the service calls: `tune` a task, `apply_config` to get its program.

Layering: `tuner` never imports `service`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from .cost_model import CostModelKind
from .measure import LocalMeasurer, Measurer
from .search import SearchKind, never, noop, make_search
from .space import Config, SpaceKind, loop_space, make_space
from .task import Task, Trial, TuneResult, best_trial

if TYPE_CHECKING:
    import tvm


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

    Returns:
        The best trial (prior ones included), this call's trials, and the untuned
        program's latency (None if stopped before it was measured or it failed).
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
        options = dict(cost_model=cost_model, seed=seed, top_k=top_k, batch_size=batch_size)
        if kind == "alt":
            from .layout_space import LayoutSpace

            options.update(joint_fraction=joint_fraction, layout=layout)
            strategy = make_search("alt", task, LayoutSpace(task, layout_levels), measurer, **options)
        else:
            strategy = make_search(kind, task, make_space(space, task.prim_func), measurer, **options)
        trials = strategy.run(budget, prior=prior, start_from=start_from, on_trial=on_trial, should_stop=should_stop,
                              replay=replay)
    finally:
        if own:
            measurer.close()
    return TuneResult(best_trial([*prior, *trials]), trials, baseline)


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
    from .alt import apply_layout_config, has_layout
    from .fusion_space import FusionSpace, is_fusion_config

    if has_layout(config):
        return apply_layout_config(task, config)
    if is_fusion_config(config):
        return FusionSpace(task.prim_func).apply(config).mod
    return loop_space(task.prim_func).apply(config).mod


def _several_operators(task: Task) -> bool:
    """A task of several complex operators (a catalog subgraph or a fused model task): basteln's space."""
    from .fusion_space import reductions

    return reductions(task.prim_func) > 1
