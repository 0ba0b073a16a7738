"""A stand-in for `tuner.tune` with a steady pace and both stages, for the dashboard's tests
(ALTUNE_TEST_FAKE_TUNER=1: tests/web/conftest.py's `tuner_kind`)."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence

import tvm

from tuner import Trial, TuneResult

TRIAL_SECONDS = 0.35
LAYOUT = "N H/4 W/16 O/16 4 16 16"


def fake_tune(task, budget: int, *, seed: int = 0, prior: Sequence = (), start_from: Sequence[dict] = (),
              on_trial: Callable = lambda t: None, should_stop: Callable[[], bool] = lambda: False,
              measurer=None) -> TuneResult:
    """Emits plausible trials at a steady pace: a joint stage with layouts, then loop-only, a few errors."""
    rng = random.Random(seed)
    trials = list(prior)
    for i in range(len(trials), budget):
        if should_stop():
            break
        time.sleep(TRIAL_SECONDS)
        stage = "joint" if i < budget // 2 else "loop"
        config = {"tile_i": rng.choice([1, 2, 4, 8, 16]), "tile_j": rng.choice([4, 8, 16, 32]),
                  "unroll": rng.choice([0, 16, 64])}
        error = None
        latencies = None
        if i % 5 == 3:
            error = "timeout: the candidate ran longer than 10.0 s" if i % 10 == 3 else (
                "wrong result: max abs difference 0.37 > 1e-4\nat output[3, 7]")
        else:
            lat = 0.05 * (0.93 ** i) * rng.uniform(1.0, 1.6)
            latencies = [lat, lat * 1.01, lat * 0.99]
        trial = Trial(index=i, config=config, latencies_ms=latencies, error=error, predicted=rng.random(),
                      stage=stage, extra={"layout": LAYOUT})  # loop-only keeps the best layout
        on_trial(trial)
        trials.append(trial)
    measured = [t for t in trials if t.latency_ms is not None]
    best = min(measured, key=lambda t: t.latency_ms) if measured else None
    return TuneResult(best=best, trials=trials, baseline_ms=0.4)


def fake_apply_config(task, config: dict) -> tvm.IRModule:
    return tvm.IRModule({"main": task.prim_func})
