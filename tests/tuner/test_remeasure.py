"""Pick by re-measurement: the finalists of a search are measured again and the fastest then is kept."""

from __future__ import annotations

import pytest
from tuner_cases import task_of, workload

DENSE = dict(m=8, n=32, k=16)


class _Drifting:
    """A fake device whose readings change: a configuration's first reading is `first(config)`, every later
    one `again(config)` (a lucky first reading, a noisy machine); it counts what it measures."""

    def __new__(cls, first, again, fail_again=()):
        from tuner import config_key
        from tuner.measurers import MeasureResult, Measurer

        class _Fake(Measurer):
            def __init__(self) -> None:
                self.measured: list[dict] = []

            def measure_one(self, task, candidate):
                c = candidate.config
                seen = any(config_key(m) == config_key(c) for m in self.measured)
                self.measured.append(c)
                if seen and config_key(c) in fail_again:
                    return MeasureResult(None, "timed out")
                lat = again(c) if seen else first(c)
                return MeasureResult([lat, lat, lat], None)

            def baseline_ms(self, task):
                return 100.0

        return _Fake()


def _config_number(config: dict) -> int:
    """A number that tells the configurations of the space apart (a stand-in for how fast each one is)."""
    import zlib

    from tuner import config_key

    return zlib.crc32(config_key(config).encode()) % 1000


def test_tune_keeps_the_finalist_fastest_when_measured_again():
    from tuner import tune
    from tuner.tune import FINALISTS

    task = task_of(workload("dense", DENSE))
    # the search sees x; measured again, the order reverses: its best was a lucky reading
    measurer = _Drifting(lambda c: 1 + _config_number(c) / 1000, lambda c: 3 - _config_number(c) / 1000)
    seen = []
    result = tune(task, 12, seed=0, cost_model="random", measurer=measurer, on_trial=seen.append, remeasure=FINALISTS)

    assert len(result.trials) == 12 == len(seen), "re-measurements are not trials"
    assert len(measurer.measured) == 12 + FINALISTS, "each finalist measured once more, outside the budget"
    ranked = sorted(result.trials, key=lambda t: t.latency_ms)
    finalists = ranked[:FINALISTS]
    assert result.best is ranked[0], "the search's best stays what it measured"
    assert sorted(result.remeasured_ms) == sorted(t.index for t in finalists)
    assert result.final is finalists[-1], "the slowest finalist by its search reading is the fastest now"
    assert result.final_ms == pytest.approx(3 - _config_number(finalists[-1].config) / 1000)
    assert result.final_ms == min(result.remeasured_ms.values())


def test_without_remeasure_or_when_stopped_the_search_s_best_is_final():
    from tuner import tune

    task = task_of(workload("dense", DENSE))
    measurer = _Drifting(lambda c: 1 + _config_number(c) / 1000, lambda c: 5.0)
    plain = tune(task, 6, seed=0, cost_model="random", measurer=measurer)
    assert plain.final is plain.best and plain.final_ms == plain.best.latency_ms and not plain.remeasured_ms
    assert len(measurer.measured) == 6

    stopped = tune(task, 6, seed=0, cost_model="random", measurer=measurer, remeasure=3, should_stop=lambda: True)
    assert stopped.final is stopped.best is None and not stopped.remeasured_ms


def test_remeasure_best_skips_duplicates_and_finalists_that_fail_now():
    from tuner import Trial, config_key
    from tuner.tune import remeasure_best

    task = task_of(workload("dense", DENSE))
    configs = [{"a": i} for i in range(5)]
    search_ms = [1.0, 1.1, 1.2, 1.3, 1.4]
    again_ms = {0: 9.0, 1: 2.0, 2: 1.5, 3: 1.0, 4: 0.5}
    trials = [Trial(i, c, [ms], None) for i, (c, ms) in enumerate(zip(configs, search_ms))]
    trials.append(Trial(5, dict(configs[0]), [1.05], None))  # the same configuration measured twice
    trials.append(Trial(6, {"a": 9}, None, "wrong result"))
    measurer = _Drifting(lambda c: 0.1, lambda c: again_ms[c["a"]], fail_again={config_key({"a": 2})})
    for t in trials[:5]:
        measurer.measured.append(t.config)  # the search measured them

    def measured_as(config):
        from tuner import Candidate

        return task, Candidate(config, None)

    pick, pick_ms, readings = remeasure_best(task, trials, measurer, 3, measured_as=measured_as)
    assert sorted(readings) == [0, 1, 2], "one finalist per configuration, the failed trial never"
    assert readings[2] is None, "a finalist that fails now is not picked"
    assert (pick.index, pick_ms) == (1, 2.0)

    never_again = _Drifting(lambda c: 0.1, lambda c: 0.1, fail_again={config_key(c) for c in configs[:2]})
    never_again.measured += [configs[0], configs[1]]
    pick, pick_ms, readings = remeasure_best(task, trials[:2], never_again, 3, measured_as=measured_as)
    assert (pick.index, pick_ms) == (0, 1.0) and readings == {0: None, 1: None}, "all failed: the search's best"


def test_remeasure_count_grows_with_the_budget_up_to_the_finalists():
    from tuner.tune import FINALISTS, remeasure_count

    assert [remeasure_count(b) for b in (0, 8, 31, 32, 64, 128, 1000)] == [0, 0, 0, 1, 2, 3, FINALISTS]


def test_remeasure_best_without_the_search_measures_configurations_as_apply_config_builds_them():
    """As `bench.models` calls it after its rounds: loop configurations measured in the task itself."""
    import numpy as np

    from tuner import LoopSpace, Trial, config_key
    from tuner.tune import remeasure_best

    task = task_of(workload("dense", DENSE))
    configs = LoopSpace(task.prim_func).sample(np.random.default_rng(0), 3)
    trials = [Trial(i, c, [1.0 + i], None) for i, c in enumerate(configs)]
    again = {config_key(c): 3.0 - i for i, c in enumerate(configs)}
    measurer = _Drifting(lambda c: 0.1, lambda c: again[config_key(c)])
    measurer.measured += configs
    seen = []
    measure_one = measurer.measure_one
    measurer.measure_one = lambda t, candidate: seen.append((t, candidate.mod)) or measure_one(t, candidate)

    pick, pick_ms, readings = remeasure_best(task, trials, measurer, 2)
    assert (pick.index, pick_ms) == (1, 2.0) and sorted(readings) == [0, 1]
    assert all(t is task and "main" in [gv.name_hint for gv in mod.functions] for t, mod in seen)
