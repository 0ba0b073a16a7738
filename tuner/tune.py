"""The entry points the service calls: `tune` a task, `apply_config` to get its program.

Layering: `tuner` never imports `service`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from .cost_model import CostModelKind
from .measure import LocalMeasurer, Measurer
from .search import XGBSearch, _never, _noop
from .space import Config, LoopSpace, SpaceKind, make_space
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
    on_trial: Callable[[Trial], None] = _noop,
    should_stop: Callable[[], bool] = _never,
    measurer: Measurer | None = None,
    space: SpaceKind = "loop",
    cost_model: CostModelKind = "xgb",
    top_k: int = 8,
    batch_size: int = 128,
) -> TuneResult:
    """Searches `task`'s space with the cost-model-ranked search.

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
        space: the search space's kind.
        cost_model: "xgb" or "random" (the no-model ablation).
        top_k: candidates measured per round.
        batch_size: candidates ranked per round.

    Returns:
        The best trial (prior ones included), this call's trials, and the untuned
        program's latency (None if stopped before it was measured or it failed).
    """
    assert budget >= 0, f"{budget=} must be >= 0"
    own = measurer is None
    measurer = LocalMeasurer() if measurer is None else measurer
    try:
        baseline = None if should_stop() else measurer.baseline_ms(task)
        search = XGBSearch(
            task, make_space(space, task.prim_func), measurer,
            cost_model=cost_model, seed=seed, top_k=top_k, batch_size=batch_size,
        )
        trials = search.run(budget, prior=prior, start_from=start_from, on_trial=on_trial, should_stop=should_stop)
    finally:
        if own:
            measurer.close()
    return TuneResult(best_trial([*prior, *trials]), trials, baseline)


@functools.lru_cache(maxsize=16)
def _loop_space(prim_func: tvm.tirx.PrimFunc) -> LoopSpace:
    return LoopSpace(prim_func)


def apply_config(task: Task, config: Config) -> tvm.IRModule:
    """The scheduled module of `config` for `task` ("main" with the untransformed signature).

    Raises:
        InvalidConfig: the configuration is not in the task's space.
        ScheduleFailed: TVM refused to apply it.
    """
    return _loop_space(task.prim_func).apply(config).mod
