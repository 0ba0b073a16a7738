"""Tuning one catalog operator: the one path that operator jobs, `altune tune` and `bench.ops` share.

    request = TuneRequest("conv2d", params, budget=64)
    result = tune_operator(task_from_request(request), request, measurer=measurer)

`task_from_request` builds the task (with its catalog workload, so `tune` runs ALT's joint search);
`tune_operator` searches it with the request's seed and layout levels and picks by re-measurement (the best few
measured again, `remeasure_count(budget)` of them), as a job serves it.

Layering: `tuner` imports `compiler`, never `service` or `bench`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from compiler.target import resolve_target
from compiler.workloads import make_workload

from .measurers import Measurer
from .request import TuneRequest
from .task import Task, Trial, TuneResult
from .tune import remeasure_count, tune


def task_from_request(request: TuneRequest, *, max_tensor_elements: int | None = None) -> Task:
    """The task an operator request describes, with its catalog workload, so `tune` runs ALT's joint search.

    The worker, `altune tune` and `bench.ops` all build their operator tasks here, so a job, a local run and a
    benchmark of one request search the same space.

    Raises:
        WorkloadError: the operator or its parameters are not in the catalog.
    """
    limit = {} if max_tensor_elements is None else {"max_tensor_elements": max_tensor_elements}
    workload = make_workload(request.operator, dict(request.params), request.dtype, request.epilogue, **limit)
    inputs = expected = None
    if workload.dtype != "float32":
        # the workload's own inputs (int8: every uint8/int8 value, signed weights; the measurer's default draws
        # non-negative integers) and torch's output, so every search checks candidates against torch
        inputs = workload.random_inputs(0)
        expected = workload.reference(inputs)
    return Task(name=workload.operator, workload_key=workload.key, prim_func=workload.prim_func,
                target=resolve_target(request.target), inputs=inputs, expected=expected, workload=workload)



def tune_operator(task: Task, request: TuneRequest, *, measurer: Measurer | None = None, prior: Sequence[Trial] = (),
                  start_from: Sequence[dict] = (), on_trial: Callable[[Trial], None] = lambda _trial: None,
                  should_stop: Callable[[], bool] = lambda: False, **search: Any) -> TuneResult:
    """Tunes the operator a request describes; `tune`'s result (its `final` is the pick to serve).

    Args:
        task: `task_from_request(request)`.
        request: the budget, seed and layout levels.
        measurer: where candidates are measured (the caller closes it); None: a `LocalMeasurer` `tune` makes and
            closes.
        prior: trials already measured (a resumed job): counted in the budget, never measured again.
        start_from: known good configurations (stored schedules), measured first.
        on_trial: called with each trial the moment it is measured.
        should_stop: polled between measurements.
        search: further `tune` options (a benchmark's ablations: `ppo`, `seeds`, `search`, ...).
    """
    options: dict[str, Any] = {"seed": request.seed, "layout_levels": request.layout_levels,
                               "remeasure": remeasure_count(request.budget), **search}
    return tune(task, request.budget, prior=prior, start_from=start_from, on_trial=on_trial, should_stop=should_stop,
                measurer=measurer, **options)
