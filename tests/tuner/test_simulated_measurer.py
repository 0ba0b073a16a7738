"""The simulated measurer: latencies a fixed function of (workload, configuration), no build, an optional delay."""

from __future__ import annotations

import time

import pytest
from tuner_cases import task_of, workload

DENSE = dict(m=8, n=32, k=16)


def _task(**params):
    return task_of(workload("dense", {**DENSE, **params}))


def test_a_configuration_reads_the_same_latency_in_any_measurer_and_order():
    from tuner import make_measurer
    from tuner.measurers import Candidate, SimulatedMeasurer

    task = _task()
    configs = [{"a": 1, "b": 2}, {"b": 2, "a": 1}, {"a": 2, "b": 2}]
    one = make_measurer("simulated", low_ms=0.5, high_ms=4.0, repeat=2)
    assert isinstance(one, SimulatedMeasurer)
    first = [one.measure_one(task, Candidate(c, None)) for c in configs]
    again = [make_measurer("simulated", low_ms=0.5, high_ms=4.0, repeat=2).measure_one(task, Candidate(c, None))
             for c in reversed(configs)][::-1]
    assert [r.latencies_ms for r in first] == [r.latencies_ms for r in again]
    assert all(r.error is None and len(r.latencies_ms) == 2 for r in first)
    assert all(0.5 <= r.latencies_ms[0] <= 4.0 for r in first)
    assert first[0].latencies_ms == first[1].latencies_ms, "the key order of a configuration does not matter"
    assert first[0].latencies_ms != first[2].latencies_ms
    other = one.measure_one(_task(n=16), Candidate(configs[0], None))
    assert other.latencies_ms != first[0].latencies_ms, "another workload reads otherwise"
    assert 0.5 <= one.baseline_ms(task) <= 4.0 and one.baseline_ms(task) == one.baseline_ms(task)


def test_the_delay_is_wall_clock_time_not_cpu_time():
    from tuner.measurers import Candidate, SimulatedMeasurer

    task = _task()
    measurer = SimulatedMeasurer(delay_s=0.2)
    wall, cpu = time.perf_counter(), time.process_time()
    result = measurer.measure_one(task, Candidate({"a": 1}, None))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    assert wall >= 0.2 and cpu < 0.1, (wall, cpu)
    assert result.run_s == 0.2 and measurer.measured == 1


def test_a_search_measured_by_it_gives_the_same_trials_twice():
    from tuner import make_measurer, tune

    task = _task()
    runs = [tune(task, 10, seed=4, measurer=make_measurer("simulated"), search="xgb", batch_size=16)
            for _ in range(2)]
    assert [(t.config, t.latencies_ms) for t in runs[0].trials] == [(t.config, t.latencies_ms) for t in runs[1].trials]
    assert len(runs[0].trials) == 10 and runs[0].best is not None


def test_unknown_measurer():
    from tuner import make_measurer

    with pytest.raises(ValueError, match="unknown measurer: nope"):
        make_measurer("nope")
