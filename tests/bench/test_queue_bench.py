"""bench.queue in small: a few workers claiming for a few seconds; no job claimed twice, every claimed job finished."""

from __future__ import annotations

import pytest
from support.databases import reset_postgres

from bench import queue
from service.db import upgrade


def _assert_clean(report: dict) -> None:
    check = report["check"]
    assert report["claims"] > 0, report
    assert report["errors"] == {}, report["error_samples"]
    assert report["lost_finishes"] == 0, report
    assert check["ids_claimed_by_two_workers"] == 0, check
    assert check["ids_claimed_twice_by_one_worker"] == 0, check
    assert check["attempts_over_1"] == 0, check
    assert check["claimed_in_db_not_by_a_worker"] == 0, check
    assert check["claimed_not_finished"] == 0, check
    assert check["claimed_jobs"] == report["claims"], (check, report["claims"])


@pytest.mark.bench
@pytest.mark.postgres
def test_eight_workers_on_postgres_never_claim_a_job_twice(postgres_url):
    """8 workers in 2 processes for 3 s on PostgreSQL (the test server's database of this run): the claim's
    `FOR UPDATE SKIP LOCKED` keeps them apart; the EXPLAIN of the claim is kept."""
    reset_postgres(postgres_url)
    upgrade(postgres_url)
    plan = queue.Plan(url=postgres_url, workers=8, processes=2, seconds=3, work_ms=(10.0, 30.0), idle_ms=20.0)
    report = queue.run(plan, jobs=2000)
    _assert_clean(report)
    assert report["check"]["left_queued"] > 0, "the queue ran dry: the workers were not kept busy"
    assert "LockRows" in report["explain_after"], report["explain_after"]


@pytest.mark.bench
def test_four_workers_on_sqlite_never_claim_a_job_twice(tmp_path):
    """SQLite, one worker a process: the conditional UPDATE alone decides (a lost race is an empty claim)."""
    url = f"sqlite:///{tmp_path / 'altune.db'}"
    upgrade(url)
    report = queue.run(queue.Plan(url=url, workers=4, processes=4, seconds=2, work_ms=(10.0, 30.0)), jobs=500)
    _assert_clean(report)
    assert report["explain_after"] is None
