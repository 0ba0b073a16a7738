"""The whole product over HTTP: submit, a worker tunes, download the artifact, run it, compare with torch."""

from __future__ import annotations

import io
import json
import tarfile

import httpx
import numpy as np
import pytest
from support.jobs import wait_for_job

from service.db import session_scope
from service.models import Schedule, ScheduleKey, TrialRow
from tuner.version import SPACE_VERSION

CONV = {"kind": "operator", "operator": "conv2d",
        "params": {"batch": 1, "in_channels": 16, "height": 14, "width": 14, "out_channels": 16,
                   "kernel": 3, "stride": 1, "padding": 1},
        "dtype": "float32", "epilogue": "bias_relu", "target": "host", "budget": 16}


@pytest.mark.tunes
def test_submit_tune_download_and_run(live_server, settings, tmp_path):
    import tvm

    from compiler.workloads import make_workload

    with httpx.Client(base_url=live_server.url, timeout=30) as client:
        r = client.post("/api/v1/jobs", json=CONV)
        assert r.status_code == 201, r.text
        job = wait_for_job(client, r.json()["id"])
        assert job["status"] == "succeeded", job["error"]
        assert job["trials_done"] == CONV["budget"] and job["best_latency_ms"] > 0
        assert job["baseline_ms"] and job["has_artifact"]
        (task,) = job["tasks"]

        trials = client.get(f"/api/v1/jobs/{job['id']}/trials", params={"limit": 5, "offset": 0}).json()
        assert trials["count"] == CONV["budget"] and len(trials["data"]) == 5
        rest = client.get(f"/api/v1/jobs/{job['id']}/trials", params={"limit": 100, "offset": 5}).json()["data"]
        measured = [t["latency_ms"] for t in trials["data"] + rest if t["latency_ms"] is not None]
        assert min(measured) == pytest.approx(job["best_latency_ms"])

        artifact = client.get(f"/api/v1/jobs/{job['id']}/artifact")
        assert artifact.status_code == 200 and artifact.headers["content-type"] == "application/gzip"

        known = client.get("/api/v1/schedules", params={"workload": task["workload_key"], "target": "host"}).json()
        assert known["count"] == 1 and known["data"][0]["job_id"] == job["id"]

    with session_scope(settings.resolved_database_url) as s:
        rows = TrialRow.where_task(s, task["id"])
        assert len(rows) == CONV["budget"]
        assert all((r.latency_ms is None) == (r.error is not None) for r in rows)
        assert all(r.latencies_ms for r in rows if r.error is None)
        key = ScheduleKey(task["workload_key"], known["data"][0]["target_key"], space_version=SPACE_VERSION)
        assert Schedule.find_by_key(s, key).latency_ms == (
            pytest.approx(job["best_latency_ms"])
        )

    with tarfile.open(fileobj=io.BytesIO(artifact.content)) as tar:
        names = set(tar.getnames())
        assert {"lib.so", "manifest.json", "schedule.py"} <= names, names
        tar.extractall(tmp_path, filter="data")
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["spec"]["params"]["kernel"] == 3 and manifest["latency_ms"] == pytest.approx(
        job["best_latency_ms"])
    lib = tvm.runtime.load_module(str(tmp_path / "lib.so"))
    workload = make_workload(CONV["operator"], CONV["params"], epilogue=CONV["epilogue"])
    inputs = workload.random_inputs(seed=7)
    out = tvm.runtime.tensor(np.zeros(workload.output.shape, dtype=workload.output.dtype))
    named = {spec.name: x for spec, x in zip(workload.inputs, inputs)}
    if "pack" in manifest:  # tuned layouts: pack the constants once, then call main
        packed = {o["name"]: tvm.runtime.tensor(np.zeros(o["shape"], dtype=o["dtype"]))
                  for o in manifest["pack"]["outputs"]}
        lib[manifest["pack"]["function"]](*[tvm.runtime.tensor(named[i["name"]]) for i in manifest["pack"]["inputs"]],
                                          *packed.values())
        named |= packed
    args = [tvm.runtime.tensor(named[a["name"]]) if isinstance(named[a["name"]], np.ndarray) else named[a["name"]]
            for a in manifest["args"] if a["role"] != "output"]
    lib[manifest["function"]](*args, out)
    np.testing.assert_allclose(out.numpy(), workload.reference(inputs), rtol=1e-4, atol=1e-4)


@pytest.mark.tunes
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # compiler work: SQLite is enough (CI time)
def test_second_job_of_a_workload_starts_from_the_known_schedule(live_server, settings):
    spec = CONV | {"budget": 4, "epilogue": "none"}
    with httpx.Client(base_url=live_server.url, timeout=30) as client:
        first = wait_for_job(client, client.post("/api/v1/jobs", json=spec).json()["id"])
        assert first["status"] == "succeeded", first["error"]
        best = first["tasks"][0]["best_config"]
        second = wait_for_job(client, client.post("/api/v1/jobs", json=spec | {"seed": 5}).json()["id"])
        assert second["status"] == "succeeded", second["error"]
        trials = client.get(f"/api/v1/jobs/{second['id']}/trials").json()["data"]
    assert trials[0]["config"] == best, "the known best schedule is measured first"


@pytest.mark.tunes
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # compiler work: SQLite is enough (CI time)
def test_an_int8_operator_job_runs_the_dot_product_instruction(live_server, tmp_path):
    """An int8 dense job whose shapes divide neither the instruction's lanes nor its groups: the search measures
    the template's dot-product form (the target's int8 instruction), which wins over the catalog's own layouts;
    the downloaded artifact packs the weight for it, adds the bias and the ReLU to the int32 sums, requantizes
    them to uint8 (per-channel scale and zero point) and equals the reference bit for bit."""
    import tvm

    from compiler.layout import GROUP_PARAM
    from compiler.workloads import make_workload

    spec = {"kind": "operator", "operator": "dense", "params": {"m": 61, "n": 100, "k": 250}, "dtype": "int8",
            "epilogue": "bias_relu_requantize", "target": "host", "budget": 12}
    with httpx.Client(base_url=live_server.url, timeout=30) as client:
        r = client.post("/api/v1/jobs", json=spec)
        assert r.status_code == 201, r.text
        job = wait_for_job(client, r.json()["id"])
        assert job["status"] == "succeeded", job["error"]
        assert f"layout.{GROUP_PARAM}" in job["tasks"][0]["best_config"], job["tasks"][0]["best_config"]
        artifact = client.get(f"/api/v1/jobs/{job['id']}/artifact")
        assert artifact.status_code == 200
    with tarfile.open(fileobj=io.BytesIO(artifact.content)) as tar:
        tar.extractall(tmp_path, filter="data")
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    lib = tvm.runtime.load_module(str(tmp_path / "lib.so"))
    workload = make_workload(spec["operator"], spec["params"], spec["dtype"], spec["epilogue"])
    inputs = workload.random_inputs(seed=7)
    named = {s.name: x for s, x in zip(workload.inputs, inputs)}
    packed = {o["name"]: tvm.runtime.tensor(np.zeros(o["shape"], dtype=o["dtype"])) for o in manifest["pack"]["outputs"]}
    lib[manifest["pack"]["function"]](*[tvm.runtime.tensor(named[i["name"]]) for i in manifest["pack"]["inputs"]],
                                      *packed.values())
    assert [o["shape"][-2:] for o in manifest["pack"]["outputs"] if o["name"] == "weight"][0][1] in (2, 4)
    named |= packed
    out = tvm.runtime.tensor(np.zeros(workload.output.shape, dtype=workload.output.dtype))
    args = [tvm.runtime.tensor(named[a["name"]]) if isinstance(named[a["name"]], np.ndarray) else named[a["name"]]
            for a in manifest["args"] if a["role"] != "output"]
    lib[manifest["function"]](*args, out)
    expected = workload.reference(inputs)
    assert expected.dtype == np.uint8 and len(np.unique(expected)) > 100  # rounded and clipped, not all 0 or 255
    np.testing.assert_array_equal(out.numpy(), expected)
