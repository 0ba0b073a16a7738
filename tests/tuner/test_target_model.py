"""`tuner.knowledge`: the target's cost model learns a ranking across workloads, warms a task's XGBoost model, round-
trips through bytes and files, and refuses bytes of another feature version."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest

from tuner.cost_models import XGBModel, pairwise_accuracy
from tuner.knowledge import FEATURE_VERSION, PROGRAM_WIDTH, Knowledge, Samples, TargetModel, training_set


def _workload(rng: np.random.Generator, key: str, n: int, scale: float) -> Samples:
    """Rows whose latency is a fixed function of two program features (times a per-workload scale)."""
    x = rng.random((n, PROGRAM_WIDTH), dtype=np.float32)
    latency = scale * np.exp(2.0 * x[:, 3] - 1.5 * x[:, 200])
    return Samples(key, x, [float(v) for v in latency])


def test_training_targets_are_each_workloads_log_speed_relative_to_its_best():
    a = Samples("a", np.zeros((3, PROGRAM_WIDTH), np.float32), [1.0, 2.0, None])
    b = Samples("b", np.zeros((2, PROGRAM_WIDTH), np.float32), [100.0, 50.0])
    _, y = training_set([a, b])
    np.testing.assert_allclose(y, [0.0, math.log(0.5), math.log(0.5) - 1.0, math.log(0.5), 0.0], rtol=1e-6)


def test_a_target_model_ranks_an_unseen_workload_and_warms_a_cold_task_model():
    rng = np.random.default_rng(0)
    model = TargetModel.fit([_workload(rng, f"w{i}", 200, 10.0 ** i) for i in range(3)])
    held_out = _workload(rng, "unseen", 64, 0.37)
    assert pairwise_accuracy(model.predict(held_out.features), held_out.latencies_ms) > 0.8

    cold, warm = XGBModel(), XGBModel(base=model)
    assert not cold.trained and warm.trained
    np.testing.assert_array_equal(cold.predict(held_out.features), np.zeros(64))
    np.testing.assert_allclose(warm.predict(held_out.features), model.predict(held_out.features), rtol=1e-6)
    # the task's own trees fit on top of the base: after its measurements, its predictions are its own
    warm.update(held_out.features[:16], held_out.latencies_ms[:16])
    assert not np.allclose(warm.predict(held_out.features), model.predict(held_out.features))


def test_knowledge_records_program_features_and_round_trips_through_a_file(tmp_path):
    rng = np.random.default_rng(1)
    knowledge = Knowledge()
    rows = rng.random((20, PROGRAM_WIDTH + 7), dtype=np.float32)  # knob features first, program features last
    knowledge.record("w", rows, [1.0 + i for i in range(20)])
    knowledge.record("x", rows[:, :7], [1.0] * 20)  # no program features: nothing to learn across workloads
    assert len(knowledge.samples) == 1
    np.testing.assert_array_equal(knowledge.samples[0].features, rows[:, 7:])
    knowledge.keep_policy("conv2d/layout", b"weights")

    grown = knowledge.grown()
    assert grown.cost_model is not None and grown.cost_model.rows == 20
    grown.save(tmp_path / "k.npz")
    loaded = Knowledge.load(tmp_path / "k.npz")
    assert loaded.policies == {"conv2d/layout": b"weights"}
    assert [(s.workload_key, s.latencies_ms) for s in loaded.samples] == [("w", knowledge.samples[0].latencies_ms)]
    np.testing.assert_array_equal(loaded.cost_model.predict(rows[:, 7:]), grown.cost_model.predict(rows[:, 7:]))


@pytest.mark.parametrize("mangle", ["version", "magic"])
def test_bytes_of_another_feature_version_are_never_read(caplog, mangle):
    rng = np.random.default_rng(2)
    model = TargetModel.fit([_workload(rng, "w", 32, 1.0)])
    if mangle == "version":
        model.version = "ms164-meanmax-space0-0"
        data = model.to_bytes()
    else:
        data = b"not a model" + model.to_bytes()
    with caplog.at_level(logging.WARNING):
        assert TargetModel.from_bytes(data, source="stored") is None
    assert "stored:" in caplog.text and "starting cold" in caplog.text
    assert TargetModel.from_bytes(TargetModel.fit([_workload(rng, "w", 32, 1.0)]).to_bytes()).version == FEATURE_VERSION


def test_transferred_schedules_are_ordered_by_the_target_models_prediction():
    """`tuner.model._ranked`: the carried configurations best first as the target model predicts from their program
    features in the task's loop space."""
    from compiler.target import resolve_target
    from compiler.workloads import make_workload
    from tuner import Task
    from tuner.features import Featurizer
    from tuner.model import _ranked
    from tuner.transfer import space_of

    wl = make_workload("dense", {"m": 32, "n": 32, "k": 32})
    task = Task("dense", wl.key, wl.prim_func, resolve_target("host"))
    space = space_of(task)
    configs = space.sample(np.random.default_rng(0), 6)
    rows = Featurizer(space, task.target)(configs)[:, -PROGRAM_WIDTH:]
    rng = np.random.default_rng(3)
    model = TargetModel.fit([Samples("w", rows, [float(v) for v in rng.random(6) + 0.1]),
                             _workload(rng, "x", 40, 1.0)])
    order = _ranked(task, configs, model)
    predicted = model.predict(rows)
    assert sorted(order) == list(range(6))
    assert [float(predicted[i]) for i in order] == sorted((float(p) for p in predicted), reverse=True)
