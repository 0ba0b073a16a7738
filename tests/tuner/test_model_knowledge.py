"""`tuner.model.tune_model`'s knowledge before measurement and its containment of one task's failure, on a small
CNN with the simulated device (no CPU work per measurement)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import tuner.rounds as tuner_rounds  # noqa: E402
from compiler.workloads import zoo  # noqa: E402
from compiler.workloads.model.importer import translate_model  # noqa: E402
from tuner import make_measurer  # noqa: E402
from tuner.model import ModelHistory, ModelTuneHooks, StartSchedule, tune_model  # noqa: E402
from tuner.request import ModelTuneRequest  # noqa: E402
from tuner.spaces import InvalidConfig  # noqa: E402


@pytest.fixture(scope="module")
def graph():
    return translate_model(zoo.export("small_cnn"))


def _tune(graph, budget: int, **kwargs):
    with make_measurer("simulated") as measurer:
        return tune_model(graph, ModelTuneRequest(target="host", budget=budget, layout="blocked"), measurer=measurer,
                          **kwargs)


def test_budget_0_serves_every_complex_task_its_seed_unmeasured(graph):
    result = _tune(graph, 0)
    assert result.measurements == 0 and all(not o.trials for o in result.outcomes)
    complex_ = [o for o in result.outcomes if o.model_task.complex]
    assert complex_ and all(o.served[1] == "seed" for o in complex_)
    assert all(o.served is None for o in result.outcomes if not o.model_task.complex)  # the mean: its default
    assert set(result.schedules) == {o.task.workload_key for o in complex_}


def test_the_warm_up_goes_to_the_largest_estimated_share_first_and_starts_from_the_seed(graph):
    order = []

    class Hooks(ModelTuneHooks):
        def on_trial(self, task, trial):
            order.append((task.workload_key, trial.config, trial.extra.get("source")))

    result = _tune(graph, 4, hooks=Hooks())
    largest = max(result.outcomes, key=lambda o: o.share)
    assert largest.model_task.complex and abs(sum(o.share for o in result.outcomes) - 1) < 1e-9
    key, config, source = order[0]
    assert key == largest.task.workload_key and source == "start_from" and config == largest.start.config


def test_a_stored_schedule_is_served_unmeasured_and_one_that_lost_to_the_default_is_not(graph):
    first = _tune(graph, 0)
    a, b = [o for o in first.outcomes if o.model_task.complex][:2]
    stored = {a.task.workload_key: StartSchedule(a.start.config, "stored", latency_ms=1.0, default_ms=2.0),
              b.task.workload_key: StartSchedule(b.start.config, "stored", latency_ms=3.0, default_ms=2.0)}
    result = _tune(graph, 16, history=ModelHistory(known=stored.get))
    by_key = {o.task.workload_key: o for o in result.outcomes}
    assert not by_key[a.task.workload_key].trials and not by_key[b.task.workload_key].trials
    assert by_key[a.task.workload_key].served == (a.start.config, "stored")
    assert by_key[b.task.workload_key].served is None
    assert result.measurements == 16  # the budget went to the other tasks


def test_a_task_whose_search_raises_does_not_fail_the_model(graph, monkeypatch):
    real = tuner_rounds.tune  # each round's search (`tuner.rounds.run_round`)
    victim = None

    def tune(task, *args, **kwargs):
        nonlocal victim
        victim = victim or task.workload_key
        if task.workload_key == victim:
            raise InvalidConfig("tile.k3.1=112 not in [1, 2, 4, 7, 8, 14, 16, 28, 56]")
        return real(task, *args, **kwargs)

    monkeypatch.setattr(tuner_rounds, "tune", tune)
    result = _tune(graph, 16)
    failed = [o for o in result.outcomes if o.error is not None]
    assert [o.task.workload_key for o in failed] == [victim] and "tile.k3.1=112" in failed[0].error
    assert result.report["schedules"]["search_failed"][0]["workload_key"] == victim
    assert failed[0].served is not None and failed[0].served[1] == "seed"  # its start, never the naive default
    assert all(o.trials for o in result.outcomes if o.error is None)


def test_an_abort_from_a_hook_still_ends_the_tuning(graph):
    class Lost(Exception):
        pass

    class Hooks(ModelTuneHooks):
        def on_trial(self, task, trial):
            raise Lost()

    with pytest.raises(Lost):
        _tune(graph, 16, hooks=Hooks())
