"""A job's spec read once into a typed request, what the worker keeps of its own, and what makes a stored schedule valid.

Migration 0005 moves a model job's report and joint-stage blocks out of the user's spec into their own columns,
and keys schedules by (workload, target, device, pipeline, space version): a schedule stored before, or for
another device, pipeline or version of the spaces, is not offered to a task.
"""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine, text

from service.db import session_scope, upgrade
from service.models import Job, Schedule, ScheduleKey
from service.requests import model_tune_request, schedule_key, tune_request
from service.settings import Settings
from tuner.version import SPACE_VERSION


@pytest.fixture
def old_url(request, tmp_path):
    """A database at revision 0004 (SQLite, or PostgreSQL where reachable) with one model job that has the worker's
    scratch state in its spec, and one schedule."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'old.db'}"
    else:
        url = request.getfixturevalue("postgres_url")
        engine = create_engine(url)
        with engine.begin() as conn:  # the session's PostgreSQL database is shared: start from nothing
            conn.execute(text("DROP SCHEMA public CASCADE"))
            conn.execute(text("CREATE SCHEMA public"))
        engine.dispose()
    upgrade(url, "0004_usage_ledger")
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO jobs (kind, name, spec, target, budget, status, cancel_requested, trials_done, errors, "
            "attempts, created_at, updated_at, upload_bytes, takeovers) VALUES ('model', 'net', :spec, 'host', 8, "
            "'succeeded', false, 8, 0, 1, '2026-01-01', '2026-01-01', 0, 0)"),
            {"spec": '{"budget": 8, "layout": "search", "report": {"check": {"passed": true}}, '
                     '"blocks": {"conv1.weight": [0, 16]}, "layout_search": {"measurements": 3}}'})
        conn.execute(text("INSERT INTO schedules (workload_key, target_key, config, latency_ms, updated_at) "
                          "VALUES ('conv2d[a]', 'llvm -mcpu=x', '{\"t\": 1}', 1.5, '2026-01-01')"))
    engine.dispose()
    upgrade(url)
    return url


@pytest.mark.parametrize("old_url", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True)
def test_the_migration_moves_the_workers_state_out_of_the_spec_and_old_schedules_are_not_offered(old_url):
    with session_scope(old_url) as s:
        (job,) = s.query(Job).all()
        assert job.spec == {"budget": 8, "layout": "search"}
        assert job.report == {"check": {"passed": True}, "layout_search": {"measurements": 3}}
        assert job.layout_blocks == {"conv1.weight": [0, 16]}
        (row,) = s.query(Schedule).all()
        assert (row.device, row.pipeline, row.space_version) == ("", "licm", 0)
        current = ScheduleKey("conv2d[a]", "llvm -mcpu=x", space_version=SPACE_VERSION)
        assert SPACE_VERSION > 0 and Schedule.find_by_key(s, current) is None  # never fitted to today's knobs


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_schedule_serves_only_its_own_device_pipeline_and_space_version(db_url):
    spec = {"operator": "dense", "params": {"m": 8, "n": 8, "k": 8}, "target": "llvm"}
    request = tune_request(spec, 4)
    key = schedule_key("dense[k]", request)
    assert (key.device, key.pipeline, key.space_version) == ("", "licm", SPACE_VERSION)
    others = [schedule_key("dense[k]", tune_request(spec | {"device": "board"}, 4)),
              schedule_key("dense[k]", tune_request(spec | {"licm": False}, 4)),
              ScheduleKey(key.workload_key, key.target_key, space_version=SPACE_VERSION + 1)]
    with session_scope(db_url) as s:
        for i, other in enumerate(others):
            Schedule.upsert_if_faster(s, other, {"other": i}, 0.5, None)
        assert Schedule.find_by_key(s, key) is None
        Schedule.upsert_if_faster(s, key, {"mine": 1}, 2.0, None)
    with session_scope(db_url) as s:
        assert Schedule.find_by_key(s, key).config == {"mine": 1}
        assert [Schedule.find_by_key(s, o).config for o in others] == [{"other": 0}, {"other": 1}, {"other": 2}]
    model = model_tune_request({"target": "host", "device": "board", "licm": False}, 16, Settings())
    assert (model.device, model.pipeline, model.budget) == ("board", "default", 16)


def test_the_apis_seed_bound_is_the_tuners():
    """The API checks a seed against its own constant (it imports no tuner); every seed it admits must be one the
    tuner's generators (torch, numpy, xgboost) take."""
    from service.schemas import MAX_SEED
    from tuner.task import MAX_SEED as TUNER_MAX_SEED

    assert MAX_SEED == TUNER_MAX_SEED
