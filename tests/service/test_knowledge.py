"""Knowledge before measurement (`tuner.model.start_schedule`), as a user meets it through the API and a worker:
a budget-0 job serves its convs with the rule's seed, a second job of tuned tasks measures nothing, a model of
the same form with other shapes starts from the stored schedules carried to its shapes, and a budget omitted is
chosen from the model."""

from __future__ import annotations

import io
import json
import tarfile
import threading
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from compiler.arrays import random_inputs  # noqa: E402
from compiler.workloads.model import reference_outputs  # noqa: E402
from compiler.workloads.model.importer import translate_model  # noqa: E402
from compiler.workloads.pt2 import load_exported_program, static_shapes  # noqa: E402
from service import model_worker  # noqa: E402
from service.db import session_scope  # noqa: E402
from service.models import Schedule  # noqa: E402
from service.worker import Worker  # noqa: E402
from support.jobs import trial_rows, upload_model  # noqa: E402
from support.models import program_bytes  # noqa: E402
from tuner import make_measurer  # noqa: E402


class Cnn(torch.nn.Module):
    """Two 3x3 convs and a classifier: convs large enough that their default NCHWc schedule is far from a blocked
    nest (tens of times slower), small enough to build in seconds."""

    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, width, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(width, width, 3, padding=1)
        self.fc = torch.nn.Linear(width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.conv2(torch.relu(self.conv1(x))))
        return self.fc(x.mean(dim=(2, 3)))


def _program(width: int = 32) -> bytes:
    torch.manual_seed(0)
    return program_bytes(torch.export.export(Cnn(width).eval(), (torch.randn(1, 3, 56, 56),)))


def _artifact_outputs(data: bytes, inputs: list[np.ndarray], folder) -> list[np.ndarray]:
    import tvm
    from tvm import relax

    folder.mkdir()
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(folder, filter="data")
    manifest = json.loads((folder / "manifest.json").read_text())
    vm = relax.VirtualMachine(tvm.runtime.load_module(str(folder / "lib.so")), tvm.cpu(0))
    with np.load(folder / "params.npz") as npz:
        params = [tvm.runtime.tensor(npz[p["key"]]) for p in manifest["params"]]
    out = vm["main"](*[tvm.runtime.tensor(x) for x in inputs], *params)
    return [out.numpy()] if hasattr(out, "numpy") else [o.numpy() for o in out]


def _matches_torch(data: bytes, artifact: bytes, folder) -> None:
    ep = static_shapes(load_exported_program(data))
    inputs = random_inputs([(tuple(x.shape), x.dtype) for x in translate_model(ep).inputs], 1)
    expected = reference_outputs(ep, inputs)
    (out,) = _artifact_outputs(artifact, inputs, folder)
    np.testing.assert_allclose(out, expected[0], rtol=1e-4, atol=1e-4)


def _run(client, settings, data: bytes, **spec) -> dict:
    r = upload_model(client, data, **{"layout": "blocked", "target": "host"} | spec)
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    assert Worker(settings).run_once() == job_id
    job = client.get(f"/api/v1/jobs/{job_id}").json()
    assert job["status"] == "succeeded", job["error"]
    return job


@pytest.mark.builds_model
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_budget_0_job_serves_its_convs_with_the_seed_and_matches_torch(client, settings, tmp_path):
    data = _program()
    job = _run(client, settings, data, budget=0)
    assert job["budget"] == 0 and trial_rows(settings.resolved_database_url, job["id"]) == []
    report = job["report"]
    # the two convs and the classifier's matmul: the rule's register-blocked seed; the mean: its default schedule
    assert report["schedules"]["sources"] == {"seed": 3, "default": 1}, report["schedules"]
    assert report["check"]["passed"] and report["served"] == "tuned", report
    artifact = client.get(f"/api/v1/jobs/{job['id']}/artifact").content
    with tarfile.open(fileobj=io.BytesIO(artifact)) as tar:
        manifest = json.loads(tar.extractfile("manifest.json").read())
    convs = [t for t in manifest["tasks"] if "conv2d" in t["name"]]
    assert len(convs) == 2 and all(t["tuned"] for t in convs), manifest["tasks"]

    _matches_torch(data, artifact, tmp_path / "artifact")


@pytest.mark.tunes
@pytest.mark.builds_model
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_second_job_measures_nothing_of_tasks_a_first_job_tuned_and_a_wider_model_starts_from_them(
        client, settings):
    simulated = settings.model_copy(update={"measurer": "simulated"})
    url = settings.resolved_database_url
    first = _run(client, simulated, _program(), budget=16)
    assert len(trial_rows(url, first["id"])) == 16
    with session_scope(url) as s:
        stored = s.query(Schedule).filter(Schedule.job_id == first["id"]).all()
        assert len(stored) == 4 and all(r.default_ms is not None for r in stored)
        convs = [r for r in stored if "conv2d" in r.workload_key]
        assert all(r.signature and r.extents for r in convs)

    second = _run(client, simulated, _program(), budget=16)
    assert trial_rows(url, second["id"]) == []  # every task had a stored schedule: nothing measured
    sources = second["report"]["schedules"]["sources"]
    assert sum(sources.values()) == 4 and set(sources) <= {"stored", "default"}, sources

    # the same form with other channel counts: no exact key, the stored schedules carried to its shapes
    wider = _run(client, simulated, _program(width=48), budget=0)
    assert wider["report"]["schedules"]["sources"].get("transferred", 0) >= 2, wider["report"]["schedules"]


@pytest.mark.sandbox
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_budget_omitted_is_chosen_from_the_model_and_a_negative_one_refused(client, settings):
    r = upload_model(client, _program(), layout="blocked")
    assert r.status_code == 201, r.text
    job = r.json()
    # four tunable tasks (two convs, the matmul, the mean): 8 each, at least 64
    assert job["budget"] == 64 and job["spec"]["budget_chosen"] is True
    r = upload_model(client, _program(), budget=-1)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"][-1] == "budget", r.text


@pytest.mark.tunes
@pytest.mark.builds_model
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_the_anytime_artifact_is_downloadable_and_matches_torch_while_the_job_tunes(client, settings, tmp_path,
                                                                                   monkeypatch):
    # a device that takes half a second per measurement (no CPU work): the job tunes for 12 s after its anytime build
    monkeypatch.setattr(model_worker, "measurer_for", lambda *_: make_measurer("simulated", delay_s=0.5))
    settings = settings.model_copy(update={"anytime_artifact": True})
    data = _program()
    r = upload_model(client, data, budget=24, layout="blocked", target="host")
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    worker = threading.Thread(target=Worker(settings).run_once)
    worker.start()
    try:
        deadline = time.monotonic() + 300
        while True:
            job = client.get(f"/api/v1/jobs/{job_id}").json()
            assert job["status"] in ("queued", "running"), job
            if job["has_artifact"]:
                break
            assert time.monotonic() < deadline, job
            time.sleep(0.2)
        artifact = client.get(f"/api/v1/jobs/{job_id}/artifact")
        assert artifact.status_code == 200
        anytime = client.get(f"/api/v1/jobs/{job_id}").json()["report"]["anytime"]
        assert anytime["measurements"] == 0 and anytime["sources"] == {"seed": 3, "default": 1}, anytime
        assert anytime["latency_ms"] > 0
        _matches_torch(data, artifact.content, tmp_path / "anytime")
    finally:
        worker.join()
    job = client.get(f"/api/v1/jobs/{job_id}").json()
    assert job["status"] == "succeeded", job["error"]
    assert job["report"]["anytime"] == anytime and job["trials_done"] == 24
    _matches_torch(data, client.get(f"/api/v1/jobs/{job_id}/artifact").content, tmp_path / "final")
    assert not (settings.resolved_artifact_dir / f"job-{job_id}.anytime.tar.gz").exists()
