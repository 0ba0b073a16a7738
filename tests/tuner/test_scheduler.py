"""The gradient task scheduler on synthetic latency curves (no TVM)."""

from __future__ import annotations

import math

import pytest

from tuner.scheduler import GradientScheduler, RoundResult, estimated_latency


def curve(start: float, floor: float, rate: float):
    """best latency after `trials` measurements: decays from `start` to `floor`."""
    return lambda trials: floor + (start - floor) * math.exp(-rate * trials)


class Synthetic:
    """Tasks whose best latency follows a curve of the trials spent on them."""

    def __init__(self, curves):
        self.curves = curves
        self.spent = [0] * len(curves)
        self.calls = []

    def __call__(self, i: int, n: int) -> float:
        self.calls.append((i, n))
        self.spent[i] += n
        return self.curves[i](self.spent[i])


def test_warm_up_is_round_robin_in_task_order():
    tasks = Synthetic([curve(10, 1, 0.1)] * 4)
    sched = GradientScheduler([1, 1, 1, 1], tasks, budget=4 * 8, trials_per_round=8)
    sched.run()
    assert [i for i, _ in tasks.calls] == [0, 1, 2, 3]
    assert sched.spent == 32


def test_rounds_go_where_the_weighted_latency_drops_most():
    # task 0: heavy and still improving; task 1: light and already at its floor
    tasks = Synthetic([curve(100, 10, 0.02), curve(1.0, 1.0, 0.0)])
    sched = GradientScheduler([5, 1], tasks, budget=200, trials_per_round=8)
    best = sched.run()
    assert tasks.spent[0] >= 150 and tasks.spent[1] <= 16, tasks.spent
    assert best[0] < 30 and best[1] == 1.0
    assert sched.objective() == pytest.approx(5 * best[0] + 1 * best[1])


def test_weight_decides_between_equal_curves():
    tasks = Synthetic([curve(10, 1, 0.05), curve(10, 1, 0.05)])
    GradientScheduler([1, 10], tasks, budget=160, trials_per_round=8).run()
    assert tasks.spent[1] > 2 * tasks.spent[0], tasks.spent


def test_budget_is_exact_and_the_last_round_is_shortened():
    tasks = Synthetic([curve(10, 1, 0.1)] * 3)
    sched = GradientScheduler([1, 2, 3], tasks, budget=30, trials_per_round=8)
    sched.run()
    assert sched.spent == 30 and tasks.calls[-1][1] == 30 - 24


def test_failing_and_exhausted_tasks():
    calls = []

    def tune_round(i: int, n: int):
        calls.append(i)
        if i == 0:
            return None  # never a correct program
        if i == 1:
            return RoundResult(2.0, 0 if len([c for c in calls if c == 1]) > 1 else n)  # exhausted on round 2
        return 5.0 / (1 + len([c for c in calls if c == 2]))

    sched = GradientScheduler([1, 1, 1], tune_round, budget=80, trials_per_round=8)
    best = sched.run()
    assert calls[:3] == [0, 1, 2]
    assert calls.count(0) == 1  # not retried while another task can improve
    assert sched.state.dead[1] and calls.count(1) == 2
    assert best[0] is None and best[2] < 1.0
    assert sched.objective() is None
    assert estimated_latency([1, 1, 1], best, [3.0, None, None]) == pytest.approx(3.0 + 2.0 + best[2])


def test_stop_and_determinism():
    stops = iter([False, False, True])
    tasks = Synthetic([curve(10, 1, 0.1)] * 3)
    GradientScheduler([1, 1, 1], tasks, budget=100, should_stop=lambda: next(stops)).run()
    assert len(tasks.calls) == 2

    def order(seed):
        t = Synthetic([curve(10, 1, 0.1)] * 3)
        GradientScheduler([1, 1, 1], t, budget=160, seed=seed).run()
        return t.calls

    assert order(3) == order(3)


def test_best_never_gets_worse():
    values = iter([5.0, 7.0, 4.0, 9.0])
    sched = GradientScheduler([1], lambda i, n: next(values), budget=32, trials_per_round=8)
    sched.run()
    assert sched.state.history[0] == [5.0, 5.0, 4.0, 4.0]


def test_run_parallel_with_one_slot_makes_the_same_choices_as_run():
    curves = [curve(10, 1, 0.1), curve(4, 2, 0.3), curve(20, 5, 0.05)]
    serial = Synthetic(curves)
    GradientScheduler([1, 2, 1], serial, budget=96, trials_per_round=8).run()
    spread = Synthetic(curves)
    sched = GradientScheduler([1, 2, 1], spread, budget=96, trials_per_round=8)
    queue = []
    sched.run_parallel(lambda i, n: queue.append((i, spread(i, n))), lambda _more: queue.pop(0) if queue else None,
                       lambda in_flight: in_flight == 0)
    assert spread.calls == serial.calls and sched.spent == 96


def test_run_parallel_keeps_one_round_per_task_in_flight_and_the_budget_whole():
    tasks = Synthetic([curve(10, 1, 0.1)] * 5)
    sched = GradientScheduler([1] * 5, tasks, budget=100, trials_per_round=8)
    in_flight: list[tuple[int, int]] = []
    most = 0

    def submit(i, n):
        nonlocal most
        assert i not in [j for j, _ in in_flight], f"task {i} got a second round in flight"
        in_flight.append((i, n))
        most = max(most, len(in_flight))

    def wait(more):
        i, n = in_flight.pop(0)  # the oldest round finishes first
        return i, RoundResult(tasks(i, n), n)

    sched.run_parallel(submit, wait, lambda k: k < 3)
    assert most == 3, "three rounds in flight at once"
    assert sched.spent == sum(n for _, n in tasks.calls) == 100
    assert [i for i, _ in tasks.calls[:5]] == [0, 1, 2, 3, 4], "the warm-up still goes in task order"
