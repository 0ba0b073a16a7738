"""Model jobs' fusion: with `"chains"` a depthwise -> pointwise chain becomes one task, tuned in basteln's space;
with the default, `"auto"`, a chain whose intermediate exceeds the L2 cache is tuned both ways and the job decides.
Either way the served artifact computes what the exported program computes."""

from __future__ import annotations

import io
import json
import math
import subprocess
import sys
import tarfile

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from support.jobs import upload_model  # noqa: E402
from support.models import program_bytes  # noqa: E402

from service.db import session_scope  # noqa: E402
from service.models import TrialRow  # noqa: E402

SHAPE = (1, 16, 192, 192)  # a 2.3 MiB intermediate: over half the L2 cache of any x86 core today


class Separable(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.dw = torch.nn.Conv2d(16, 16, 3, padding=1, groups=16)
        self.pw = torch.nn.Conv2d(16, 32, 1)

    def forward(self, x):
        return torch.relu(self.pw(torch.relu(self.dw(x))))


def run_artifact(client, job_id, x, tmp_path):
    """The job's artifact run by its own `run.py` on `x`: output0."""
    folder = tmp_path / "artifact"
    folder.mkdir()
    with tarfile.open(fileobj=io.BytesIO(client.get(f"/api/v1/jobs/{job_id}/artifact").content)) as tar:
        tar.extractall(folder, filter="data")
    manifest = json.loads((folder / "manifest.json").read_text())
    np.savez(folder / "in.npz", **{manifest["inputs"][0]["name"]: x.numpy()})
    ran = subprocess.run([sys.executable, "run.py", "in.npz", "out.npz"], cwd=folder, capture_output=True, text=True,
                         timeout=120)
    assert ran.returncode == 0, ran.stderr[-2000:]
    with np.load(folder / "out.npz") as out:
        return out["output0"]


@pytest.mark.tunes
@pytest.mark.builds_model
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # the tasks and the search are backend-neutral
def test_a_chain_becomes_one_fused_task_and_the_artifact_is_right(client, settings, tmp_path):
    from service.worker import Worker

    torch.manual_seed(0)
    module = Separable().eval()
    x = torch.randn(*SHAPE)
    r = upload_model(client, program_bytes(torch.export.export(module, (x,))), budget=4, target="host",
                     fusion="chains")
    assert r.status_code == 201, r.text
    job = r.json()
    assert job["spec"]["fusion"] == "chains"
    grouped = [t for t in job["tasks"] if t["name"].startswith("grouped")]
    assert len(grouped) == 1, [t["name"] for t in job["tasks"]]
    assert not any("conv2d" in t["name"] and not t["name"].startswith("grouped") for t in job["tasks"])

    assert Worker(settings).run_once() == job["id"]
    done = client.get(f"/api/v1/jobs/{job['id']}").json()
    assert done["status"] == "succeeded", done["error"]
    with session_scope(settings.resolved_database_url) as s:
        configs = [t.config for t in s.query(TrialRow).filter(TrialRow.job_id == job["id"]).all()]
    assert configs and any("threshold" in c for c in configs)  # the grouped task searched basteln's knobs

    with torch.no_grad():
        np.testing.assert_allclose(run_artifact(client, job["id"], x, tmp_path), module(x).numpy(), rtol=1e-4,
                                   atol=1e-4)


@pytest.mark.tunes
@pytest.mark.builds_model
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_by_default_a_chain_over_the_l2_cache_is_tuned_both_ways_and_decided_by_measurement(client, settings,
                                                                                             tmp_path):
    from service.worker import Worker

    from compiler.target import host_caches

    side = 8 * math.ceil(math.sqrt(4 * host_caches().l2 / (4 * 16)) / 8)  # an intermediate of 4x the L2 cache
    torch.manual_seed(0)
    module = Separable().eval()
    x = torch.randn(1, 16, side, side)
    r = upload_model(client, program_bytes(torch.export.export(module, (x,))), budget=12, target="host")
    assert r.status_code == 201, r.text
    job = r.json()
    assert job["spec"]["fusion"] == "auto"
    assert not any(t["name"].startswith("grouped") for t in job["tasks"])  # listed unmerged: the job decides

    assert Worker(settings).run_once() == job["id"]
    done = client.get(f"/api/v1/jobs/{job['id']}").json()
    assert done["status"] == "succeeded", done["error"]
    [decision] = done["report"]["fusion"]["chains"]
    assert decision["intermediate_bytes"] > host_caches().l2
    assert decision["fused_ms"] is not None and decision["unfused_ms"] is not None
    assert decision["fused"] == (decision["fused_ms"] < decision["unfused_ms"])
    with session_scope(settings.resolved_database_url) as s:
        configs = [t.config for t in s.query(TrialRow).filter(TrialRow.job_id == job["id"]).all()]
    assert any("threshold" in c for c in configs)  # the fused side searched basteln's knobs
    assert any("threshold" not in c for c in configs)  # the operators' side their own loop space
    assert done["report"]["check"]["passed"]
    # the chain fused and unfused: both models built, checked, timed whole, and the faster one served
    timed = done["report"]["fusion"]["end_to_end_ms"]
    assert set(timed) == {"chosen", "every chain" if not decision["fused"] else "unfused"}
    assert done["report"]["fusion"]["served"] == min(timed, key=timed.get)
    assert done["best_latency_ms"] == pytest.approx(min(timed.values()))
    with torch.no_grad():
        np.testing.assert_allclose(run_artifact(client, job["id"], x, tmp_path), module(x).numpy(), rtol=1e-4,
                                   atol=1e-4)


def test_an_unknown_fusion_is_a_422(client):
    r = client.post("/api/v1/models/zoo", json={"model": "small_cnn", "fusion": "everything"})
    assert r.status_code == 422 and "fusion" in r.text
