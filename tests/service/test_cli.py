"""The CLI as a user runs it: `altune tune` tunes locally with the same search a job runs."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from sqlalchemy import select
from support.processes import service_env

from service.db import session_scope
from service.models import Job, TrialRow
from service.worker import Worker

DENSE = {"kind": "operator", "operator": "dense", "params": {"m": 16, "n": 16, "k": 16}, "dtype": "float32",
         "epilogue": "none", "target": "host", "budget": 4, "seed": 3, "layout_levels": 1}


@pytest.mark.tunes
def test_altune_tune_runs_the_same_search_as_a_job(sqlite_url, tmp_path):
    """One round (budget < top_k): its picks depend only on the spec and the seed, not on the timings."""
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(DENSE))
    trials_file, artifact = tmp_path / "trials.jsonl", tmp_path / "dense.tar.gz"
    # the service's settings off; the host CPU as this process sees it (`ALTUNE_HOST_CPU`)
    cli = [str(Path(sys.executable).parent / "altune"), "tune", str(spec_file), "--trials", str(trials_file),
           "--out", str(artifact)]
    run = subprocess.run(cli, capture_output=True, text=True, timeout=600, env=service_env(), cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    local = [json.loads(line) for line in trials_file.read_text().splitlines()]
    assert len(local) == DENSE["budget"] and "best" in run.stdout
    with tarfile.open(artifact) as tar:
        assert {"lib.so", "manifest.json"} <= set(tar.getnames())

    from service.settings import Settings

    url = sqlite_url  # the search is the same on every backend; the job's storage is tested elsewhere
    settings = Settings(database_url=url, data_dir=tmp_path)
    with session_scope(url) as s:
        job = Job(kind="operator", name="dense", spec=DENSE, target="host", budget=DENSE["budget"])
        s.add(job)
        s.flush()
        job_id = job.id
    assert Worker(settings, "w").run_once() == job_id
    with session_scope(url) as s:
        assert s.get(Job, job_id).status == "succeeded"
        rows = s.scalars(select(TrialRow).where(TrialRow.job_id == job_id).order_by(TrialRow.index)).all()
        queued = [(r.config, r.stage) for r in rows]
    assert [(t["config"], t["stage"]) for t in local] == queued
    assert local[0]["stage"] == "joint", "ALT's joint stage: the task carries its workload (loop-only says 'loop')"


@pytest.mark.parametrize(("line", "redacted"), [
    ("GET /?token=alt_abcdefghijkl HTTP/1.1", "GET /?token=<redacted> HTTP/1.1"),
    ("/api/v1/jobs?limit=5&token=alt_abcdefghijkl&offset=0", "/api/v1/jobs?limit=5&token=<redacted>&offset=0"),
    ("/api/v1/jobs?%74oken=secret", "/api/v1/jobs?%74oken=<redacted>"),  # what Starlette decodes to `token`
    ("/api/v1/jobs?access=alt_abcdefghijkl", "/api/v1/jobs?access=<redacted>"),  # shaped like a token
    ("/api/v1/jobs?tokens=1&limit=2", "/api/v1/jobs?tokens=1&limit=2"),
])
def test_access_log_lines_lose_their_tokens(line, redacted):
    from service.cli import redact_tokens

    assert redact_tokens(line) == redacted
