"""What a target learns carries from job to job (`service.knowledge`, `tuner.knowledge`): the first job's
measurements land in the database and train the target's cost model; a second job on the same target loads it (its
first round is ranked by it, where a cold job's is not); a cost model of an older feature version is ignored with a
log line and replaced; another target or device starts cold."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from sqlalchemy import select

from service.db import session_scope
from service.knowledge import COST_MODEL, load_knowledge, scope_of
from service.models import KnowledgeSample, LearnedModel, TrialRow
from service.requests import tune_request
from service.settings import Settings
from service.worker import Worker
from support.jobs import add_job, get_job
from tuner import ppo
from tuner.knowledge import FEATURE_VERSION, PROGRAM_WIDTH, Samples, TargetModel

CONV = {"kind": "operator", "operator": "conv2d", "dtype": "float32", "epilogue": "none", "target": "host",
        "budget": 40, "seed": 0,
        "params": {"batch": 1, "in_channels": 8, "height": 10, "width": 10, "out_channels": 16, "kernel": 3,
                   "stride": 1, "padding": 1}}


@pytest.fixture
def learning(settings):
    """Learning on (the tests' default turns it off), measured by the simulated device: nothing built."""
    return settings.model_copy(update={"learn": True, "measurer": "simulated"})


@pytest.fixture
def learning_sqlite(sqlite_url, tmp_path):
    """`learning` on SQLite only (what these tests check does not depend on the database)."""
    return Settings(database_url=sqlite_url, data_dir=tmp_path, lease_seconds=5, poll_seconds=0.2,
                    time_torch_compile=False, anytime_artifact=False, learn=True, measurer="simulated")


def _run(settings, spec: dict) -> int:
    job_id = add_job(settings.resolved_database_url, spec)
    assert Worker(settings).run_once() == job_id
    job = get_job(settings.resolved_database_url, job_id)
    assert job.status == "succeeded", job.error
    return job_id


def _predictions(url: str, job_id: int) -> list[float | None]:
    with session_scope(url) as s:
        return list(s.scalars(select(TrialRow.predicted).where(TrialRow.job_id == job_id).order_by(TrialRow.id)))


def _scope(spec: dict) -> str:
    return scope_of(tune_request(spec, spec["budget"]))


def test_a_second_job_ranks_its_first_round_with_the_model_the_first_job_trained(learning, monkeypatch):
    url = learning.resolved_database_url
    loaded: list[tuple[str, bool]] = []
    load_state = ppo._Actor.load_state

    def spy(self, data, *, source="policy"):
        loaded.append((source, ok := load_state(self, data, source=source)))
        return ok

    monkeypatch.setattr(ppo._Actor, "load_state", spy)
    first = _run(learning, CONV)
    assert loaded == [], "a fresh server has no policy to load"
    with session_scope(url) as s:
        policies = {m.name: m.job_id for m in LearnedModel.where_scope(s, _scope(CONV)) if m.name != COST_MODEL}
    assert f"ppo{ppo.POLICY_VERSION}/conv2d/float32/layout/8x4" in policies, sorted(policies)
    assert set(policies.values()) == {first}
    with session_scope(url) as s:
        samples = s.scalars(select(KnowledgeSample)).all()
        assert [(r.job_id, r.feature_version, r.rows) for r in samples] == [(first, FEATURE_VERSION, 40)]
        assert samples[0].scope == _scope(CONV)
        stored = s.scalar(select(LearnedModel).where(LearnedModel.name == COST_MODEL))
        assert stored is not None and stored.rows == 40 and stored.job_id == first
    knowledge = load_knowledge(url, _scope(CONV))
    assert knowledge.cost_model is not None and knowledge.cost_model.rows == 40
    # the first job started cold: nothing ranked its first round (the seeds and random picks)
    assert all(p is None for p in _predictions(url, first)[:4])

    other_shapes = {**CONV, "params": {**CONV["params"], "height": 14, "width": 12, "out_channels": 24}}
    second = _run(learning, other_shapes)
    predicted = _predictions(url, second)
    ranked = predicted[:4]
    assert all(p is not None for p in ranked), f"the warm model ranked the second job's first round: {ranked}"
    assert len(set(ranked)) > 1, "and its predictions tell candidates apart (a cold model predicts nothing)"
    # the stored model, on the program features the second job recorded, is what ranked them: not a cold model's 0
    with session_scope(url) as s:
        row = s.scalar(select(KnowledgeSample).where(KnowledgeSample.job_id == second))
        batch = Samples.from_bytes(row.workload_key, bytes(row.data))
    assert batch.features.shape == (40, PROGRAM_WIDTH)
    assert np.ptp(knowledge.cost_model.predict(batch.features)) > 0
    refit = load_knowledge(url, _scope(CONV)).cost_model
    assert refit.rows == 80 and refit.workloads == 2, "the second job's trials joined the training set"
    # and its agents started from the first job's policies, and kept what they learned on top
    assert (f"ppo{ppo.POLICY_VERSION}/conv2d/float32/layout/8x4", True) in loaded, loaded
    assert all(ok for _, ok in loaded)
    with session_scope(url) as s:
        kept = {m.name: m.job_id for m in LearnedModel.where_scope(s, _scope(CONV)) if m.name != COST_MODEL}
    assert kept[f"ppo{ppo.POLICY_VERSION}/conv2d/float32/layout/8x4"] == second


def test_a_cost_model_of_an_older_feature_version_is_ignored_with_a_log_line(learning_sqlite, caplog):
    learning = learning_sqlite
    url = learning.resolved_database_url
    rng = np.random.default_rng(0)
    batches = [Samples("w", rng.random((32, PROGRAM_WIDTH), dtype=np.float32), list(rng.random(32) + 0.1))]
    old = TargetModel.fit(batches)
    old.version = "ms164-meanmax-space0-0"  # as an earlier release wrote it
    with session_scope(url) as s:
        LearnedModel.upsert(s, _scope(CONV), COST_MODEL, old.to_bytes(), old.rows, None)
    with caplog.at_level(logging.WARNING):
        assert load_knowledge(url, _scope(CONV)).cost_model is None
    assert "feature version ms164-meanmax-space0-0 ignored" in caplog.text

    job_id = _run(learning, CONV)  # starts cold, and its model replaces the old one
    assert all(p is None for p in _predictions(url, job_id)[:4])
    model = load_knowledge(url, _scope(CONV)).cost_model
    assert model is not None and model.version == FEATURE_VERSION and model.rows == 40


def test_another_device_starts_cold_and_learning_off_keeps_nothing(learning_sqlite):
    learning = learning_sqlite
    url = learning.resolved_database_url
    _run(learning, CONV)
    assert load_knowledge(url, _scope({**CONV, "device": "board"})).cost_model is None
    off = learning.model_copy(update={"learn": False})
    job_id = _run(off, CONV)
    assert all(p is None for p in _predictions(url, job_id)[:4]), "learning off: the job ran cold"
    with session_scope(url) as s:
        assert not s.scalars(select(KnowledgeSample).where(KnowledgeSample.job_id == job_id)).all()
