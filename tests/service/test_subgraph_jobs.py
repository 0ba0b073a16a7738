"""Subgraph operators as jobs: listed in the catalog, validated, tuned by a worker into a fused artifact."""

from __future__ import annotations

import io
import json
import tarfile

import numpy as np
import pytest

from service.db import session_scope
from service.models import Artifact, Job, TrialRow
from service.worker import Worker

ATTENTION = {"kind": "operator", "operator": "matmul_softmax_matmul", "params": {"heads": 2, "seq": 16, "dim": 8},
             "dtype": "float32", "epilogue": "none", "target": "host", "budget": 4, "seed": 0}


def test_the_catalog_lists_the_subgraphs_and_refuses_an_epilogue(client):
    names = {op["name"] for op in client.get("/api/v1/operators").json()["data"]}
    assert {"conv3x3_conv1x1", "depthwise_pointwise", "pad_conv_bias_relu", "matmul_softmax_matmul"} <= names
    r = client.post("/api/v1/jobs", json={**ATTENTION, "epilogue": "relu"})
    assert r.status_code == 422 and "carries its own epilogue" in r.text
    r = client.post("/api/v1/jobs", json={**ATTENTION, "operator": "depthwise_pointwise",
                                          "params": {"channels": 4, "height": 8, "width": 8, "out_channels": 4,
                                                     "kernel": 2}})
    assert r.status_code == 422 and "must be odd" in r.text


@pytest.mark.tunes
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # compiler work: SQLite is enough (CI time)
def test_a_worker_tunes_a_subgraph_job_into_a_fused_artifact_equal_to_torch(client, settings, tmp_path):
    import tvm

    from compiler.workloads import make_workload

    r = client.post("/api/v1/jobs", json=ATTENTION)
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    assert Worker(settings, "w").run_once() == job_id
    url = settings.resolved_database_url
    with session_scope(url) as s:
        job = Job.find_or_raise_by_id(s, job_id)
        assert job.status == "succeeded", job.error
        trials = s.query(TrialRow).all()
        assert len(trials) == ATTENTION["budget"] and all("threshold" in t.config for t in trials)
        assert s.query(Artifact).filter_by(job_id=job_id).count() == 1
    artifact = client.get(f"/api/v1/jobs/{job_id}/artifact")
    assert artifact.status_code == 200
    with tarfile.open(fileobj=io.BytesIO(artifact.content)) as tar:
        tar.extractall(tmp_path, filter="data")
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert [a["name"] for a in manifest["args"]] == ["query", "key", "value", "output"]
    # the fused program: the attention's intermediates are computed inside the output's tile loops
    assert "T.parallel" in (tmp_path / "schedule.py").read_text()
    lib = tvm.runtime.load_module(str(tmp_path / "lib.so"))
    w = make_workload(ATTENTION["operator"], ATTENTION["params"])
    inputs = w.random_inputs(seed=3)
    out = tvm.runtime.tensor(np.zeros(w.output.shape, "float32"))
    lib["main"](*[tvm.runtime.tensor(x) for x in inputs], out)
    np.testing.assert_allclose(out.numpy(), w.reference(inputs), rtol=1e-4, atol=1e-4)
