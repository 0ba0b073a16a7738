"""The REST API without a worker: validation, catalog, queue operations, health."""

from __future__ import annotations

import pytest

CONV = {
    "kind": "operator",
    "operator": "conv2d",
    "params": {"batch": 1, "in_channels": 64, "height": 56, "width": 56, "out_channels": 64,
               "kernel": 3, "stride": 1, "padding": 1},
    "dtype": "float32",
    "target": "host",
    "budget": 64,
}


def _with(**changes) -> dict:
    spec = {**CONV, "params": dict(CONV["params"])}
    for key, value in changes.items():
        if key.startswith("p_"):
            if value is None:
                spec["params"].pop(key[2:])
            else:
                spec["params"][key[2:]] = value
        else:
            spec[key] = value
    return spec


def _error(response) -> tuple[list, str]:
    assert response.status_code == 422, response.text
    (err,) = response.json()["detail"]
    return err["loc"], err["msg"]


def test_create_job_returns_201_and_queues(client):
    r = client.post("/api/v1/jobs", json=CONV)
    assert r.status_code == 201, r.text
    job = r.json()
    assert job["status"] == "queued" and job["trials_done"] == 0 and job["budget"] == 64
    assert job["spec"]["params"]["dilation"] == 1, "defaults are filled in"
    assert job["spec"]["layout_levels"] == 1
    again = client.get(f"/api/v1/jobs/{job['id']}").json()
    assert again["id"] == job["id"] and again["created_at"].endswith("Z") or "+00:00" in again["created_at"]
    listed = client.get("/api/v1/jobs").json()
    assert listed["count"] == 1 and listed["data"][0]["id"] == job["id"]
    assert client.get("/api/v1/jobs", params={"status": "running"}).json()["count"] == 0


@pytest.mark.parametrize(
    ("spec", "loc", "words"),
    [
        (_with(operator="conv9d"), ["body", "operator"], "conv9d"),
        (_with(p_kernel=None), ["body", "params", "kernel"], "kernel"),
        (_with(p_stride=0), ["body", "params", "stride"], "stride"),
        (_with(p_bogus=3), ["body", "params", "bogus"], "bogus"),
        (_with(p_batch=64, p_height=4096, p_width=4096), ["body", "params"], "limit"),
        (_with(target="tpu"), ["body", "target"], "tpu"),
        (_with(budget=10**7), ["body", "budget"], "budget"),
        (_with(dtype="int4"), ["body", "dtype"], "int4"),
        (_with(layout_levels=3), ["body", "layout_levels"], "1 or 2"),
    ],
    ids=["operator", "missing", "range", "unknown-param", "too-big", "target", "budget-high", "dtype",
         "layout-levels"],
)
def test_bad_job_is_422_naming_the_field(client, spec, loc, words):
    loc_got, msg = _error(client.post("/api/v1/jobs", json=spec))
    assert loc_got[: len(loc)] == loc, (loc_got, msg)
    assert words in msg, msg
    assert client.get("/api/v1/jobs").json()["count"] == 0, "a rejected job leaves no row"


def test_budget_below_one_is_422(client):
    loc, _ = _error(client.post("/api/v1/jobs", json=_with(budget=0)))
    assert loc == ["body", "budget"]


def test_unknown_job_is_404(client):
    for path in ("/api/v1/jobs/999", "/api/v1/jobs/999/trials", "/api/v1/jobs/999/artifact"):
        r = client.get(path)
        assert r.status_code == 404 and r.json()["detail"] == "job 999 not found", (path, r.text)
    assert client.post("/api/v1/jobs/999/cancel").status_code == 404


def test_cancel_queued_job_and_not_twice(client):
    job = client.post("/api/v1/jobs", json=CONV).json()
    r = client.post(f"/api/v1/jobs/{job['id']}/cancel")
    assert r.status_code == 200 and r.json()["status"] == "cancelled" and r.json()["finished_at"]
    r = client.post(f"/api/v1/jobs/{job['id']}/cancel")
    assert r.status_code == 409 and "already cancelled" in r.json()["detail"]
    artifact = client.get(f"/api/v1/jobs/{job['id']}/artifact")
    assert artifact.status_code == 404 and "no artifact" in artifact.json()["detail"]


def test_operators_catalog_lists_params_with_limits(client):
    body = client.get("/api/v1/operators").json()
    names = {op["name"] for op in body["data"]}
    assert {"conv2d", "depthwise_conv2d", "group_conv2d", "dilated_conv2d", "conv1d", "conv3d",
            "conv2d_transpose", "dense", "batch_matmul"} <= names
    conv = next(op for op in body["data"] if op["name"] == "conv2d")
    kernel = next(p for p in conv["params"] if p["name"] == "kernel")
    assert kernel["required"] and kernel["minimum"] >= 1 and kernel["maximum"] >= 7
    assert "host" in body["targets"] and "float32" in body["dtypes"] and "bias_relu" in body["epilogues"]


def test_schedules_filter(client, settings):
    from service.db import session_scope
    from service.models import Schedule

    with session_scope(settings.resolved_database_url) as s:
        s.add(Schedule(workload_key="conv2d[a]", target_key="llvm -mcpu=x", config={"t": 1}, latency_ms=1.5))
        s.add(Schedule(workload_key="dense[b]", target_key="llvm -mcpu=x", config={"t": 2}, latency_ms=0.5))
    everything = client.get("/api/v1/schedules").json()
    assert everything["count"] == 2
    one = client.get("/api/v1/schedules", params={"workload": "dense[b]", "target": "llvm -mcpu=x"}).json()
    assert one["count"] == 1 and one["data"][0]["config"] == {"t": 2}
    assert client.get("/api/v1/schedules", params={"search": "conv"}).json()["count"] == 1
    # a target name is every stored target of its kind, whichever CPU its workers ran on (the API resolves no
    # target: that would load TVM); a stored key is that key only
    assert client.get("/api/v1/schedules", params={"workload": "dense[b]", "target": "host"}).json()["count"] == 1
    assert client.get("/api/v1/schedules", params={"target": "llvm -mcpu=y"}).json()["count"] == 0
    assert client.get("/api/v1/schedules", params={"target": "llvmx"}).json()["count"] == 0


def test_healthz(client):
    r = client.get("/healthz")
    assert r.status_code == 200 and r.json() == {"status": "ok", "database": "ok"}


def test_openapi_describes_routes(client):
    paths = client.get("/openapi.json").json()["paths"]
    assert paths["/api/v1/jobs"]["post"]["summary"]
    assert {"/api/v1/jobs/{job_id}/trials", "/api/v1/jobs/{job_id}/cancel", "/api/v1/jobs/{job_id}/artifact",
            "/api/v1/schedules", "/api/v1/operators", "/healthz"} <= set(paths)


def test_migrations_match_the_models(db_url):
    """The Alembic head creates exactly the schema the ORM models describe."""
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    from service.db import get_engine
    from service.models import Base

    with get_engine(db_url).connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    assert diff == [], diff


def test_jobs_filter_by_workload_and_stage_summary(client, settings):
    from service.db import session_scope
    from service.models import TrialRow, TuningTask

    first = client.post("/api/v1/jobs", json=CONV).json()
    client.post("/api/v1/jobs", json=_with(p_kernel=5))
    with session_scope(settings.resolved_database_url) as s:
        task = TuningTask(job_id=first["id"], index=0, name="conv2d", workload_key="conv2d[k3]", budget=64)
        s.add(task)
        s.flush()
        for i, stage in enumerate(["joint", "joint", "loop"]):
            s.add(TrialRow(job_id=first["id"], task_id=task.id, index=i, config={}, latency_ms=1.0 + i,
                           latencies_ms=[1.0 + i], stage=stage, extra={}))
    listed = client.get("/api/v1/jobs", params={"workload": "conv2d[k3]"}).json()
    assert listed["count"] == 1 and listed["data"][0]["id"] == first["id"]
    job = client.get(f"/api/v1/jobs/{first['id']}").json()
    assert job["trials_by_stage"] == {"joint": 2, "loop": 1}
    assert job["last_trial_at"].endswith("+00:00")
    # the list computes the same for its whole page in a few queries
    page = client.get("/api/v1/jobs").json()["data"]
    assert [j for j in page if j["id"] == first["id"]] == [job]
    assert [j["trials_by_stage"] for j in page if j["id"] != first["id"]] == [{}]
