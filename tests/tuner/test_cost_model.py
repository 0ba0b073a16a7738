"""Cost models: ranking accuracy on a synthetic problem, save/load, the accuracy metric; MetaSchedule features."""

from __future__ import annotations

import numpy as np
import pytest


def _synthetic(rng, n):
    x = rng.uniform(-1, 1, size=(n, 6)).astype(np.float32)
    log_latency = 2 * x[:, 0] ** 2 + x[:, 1] - 0.5 * x[:, 2] * x[:, 3] + 0.05 * rng.normal(size=n)
    return x, list(np.exp(log_latency))


def test_xgb_ranks_better_than_chance_and_random_does_not():
    from tuner import RandomModel, XGBModel, pairwise_accuracy

    rng = np.random.default_rng(0)
    x, y = _synthetic(rng, 200)
    y[:5] = [None] * 5  # failures are training data too
    xt, yt = _synthetic(rng, 64)
    xgb = XGBModel(seed=0)
    xgb.update(x, y)
    accuracy = pairwise_accuracy(xgb.predict(xt), yt)
    assert accuracy > 0.75, accuracy
    rand = RandomModel(seed=0)
    rand.update(x, y)
    assert 0.35 < pairwise_accuracy(rand.predict(xt), yt) < 0.65


def test_save_and_load_give_the_same_predictions(tmp_path):
    from tuner import XGBModel

    rng = np.random.default_rng(1)
    x, y = _synthetic(rng, 40)
    model = XGBModel(seed=0)
    model.update(x, y)
    model.save(tmp_path / "model.npz")
    again = XGBModel(seed=0)
    again.load(tmp_path / "model.npz")
    np.testing.assert_allclose(again.predict(x), model.predict(x))


def test_untrained_model_predicts_zeros():
    from tuner import XGBModel

    model = XGBModel(min_samples=4)
    model.update(np.zeros((2, 3)), [1.0, 2.0])
    assert not model.trained
    assert list(model.predict(np.zeros((3, 3)))) == [0, 0, 0]


def test_pairwise_accuracy():
    from tuner import pairwise_accuracy

    assert pairwise_accuracy([3, 2, 1], [1.0, 2.0, 3.0]) == 1.0
    assert pairwise_accuracy([1, 2, 3], [1.0, 2.0, 3.0]) == 0.0
    assert pairwise_accuracy([1, 1], [1.0, 2.0]) == 0.5
    assert pairwise_accuracy([1, 2], [1.0, None]) is None


def test_unknown_cost_model():
    from tuner import make_cost_model

    with pytest.raises(ValueError, match="unknown cost model: svm"):
        make_cost_model("svm")


def test_ms_features_are_the_same_on_every_thread_count():
    """Per-store features of a batch, extracted on one thread and on two: equal, non-zero, per program."""
    from tuner import LoopSpace
    from tuner.features import MS_FEATURE_LENGTH, MSFeatures
    from tuner_cases import host, workload

    wl = workload("conv2d", {"batch": 1, "in_channels": 8, "height": 10, "width": 10, "out_channels": 16,
                             "kernel": 3, "padding": 1})
    space = LoopSpace(wl.prim_func)
    schedules = [space.apply(c) for c in space.sample(np.random.default_rng(0), 12)]

    one = MSFeatures(space.mod, host(), num_threads=1).extract(schedules)
    two = MSFeatures(space.mod, host(), num_threads=2).extract(schedules + [None])

    assert one.shape == (12, 2 * MS_FEATURE_LENGTH) and two.shape == (13, 2 * MS_FEATURE_LENGTH)
    np.testing.assert_array_equal(one, two[:12])
    assert not two[12].any() and all(row.any() for row in one)
    assert len({row.tobytes() for row in one}) > 1  # the programs differ, and so do their features
