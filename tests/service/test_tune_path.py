"""One tuning path: `bench.models` and a model job of the same spec and seed make the same trials and serve the
same artifact (`tuner.model.tune_model` and `serve_model` in both), so a benchmark measures what a job ships.

Both measure with the simulated device (`ALTUNE_MEASURER=simulated`: a latency that is a fixed function of the
configuration), so that the searches see the same readings and must then propose the same candidates."""

from __future__ import annotations

import io
import json
import tarfile

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from bench.models import tune_ours  # noqa: E402
from compiler.arrays import random_inputs  # noqa: E402
from compiler.workloads import zoo  # noqa: E402
from compiler.workloads.model import reference_outputs  # noqa: E402
from compiler.workloads.model.importer import translate_model  # noqa: E402
from compiler.workloads.pt2 import load_exported_program, static_shapes  # noqa: E402
from service.db import session_scope  # noqa: E402
from service.models import Job, TrialRow, TuningTask  # noqa: E402
from service.worker import Worker  # noqa: E402
from tuner import make_measurer  # noqa: E402
from tuner.request import ModelTuneRequest  # noqa: E402


def _members(data: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def _outputs(files: dict[str, bytes], inputs: list[np.ndarray], folder) -> list[np.ndarray]:
    import tvm
    from tvm import relax

    folder.mkdir()
    for name, data in files.items():
        (folder / name).write_bytes(data)
    manifest = json.loads(files["manifest.json"])
    vm = relax.VirtualMachine(tvm.runtime.load_module(str(folder / "lib.so")), tvm.cpu(0))
    with np.load(folder / "params.npz") as npz:
        params = [tvm.runtime.tensor(npz[p["key"]]) for p in manifest["params"]]
    out = vm["main"](*[tvm.runtime.tensor(x) for x in inputs], *params)
    return [out.numpy()] if hasattr(out, "numpy") else [o.numpy() for o in out]


@pytest.mark.tunes
@pytest.mark.builds_model
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # the tuning path, not the storage
def test_bench_models_and_a_model_job_make_the_same_trials_and_artifact(client, settings, tmp_path):
    spec = {"budget": 40, "seed": 3, "layout": "blocked", "target": "host"}
    buf = io.BytesIO()
    torch.export.save(zoo.export("small_cnn"), buf)
    r = client.post("/api/v1/models", files={"file": ("net.pt2", buf.getvalue(), "application/octet-stream")},
                    data={"spec": json.dumps(spec)})
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    simulated = settings.model_copy(update={"measurer": "simulated"})
    assert Worker(simulated).run_once() == job_id
    job = client.get(f"/api/v1/jobs/{job_id}").json()
    assert job["status"] == "succeeded", job["error"]
    job_files = _members(client.get(f"/api/v1/jobs/{job_id}/artifact").content)
    with session_scope(settings.resolved_database_url) as s:
        keys = {t.id: t.workload_key for t in TuningTask.where_job(s, job_id)}
        job_trials = {}
        for row in s.query(TrialRow).filter(TrialRow.job_id == job_id).order_by(TrialRow.task_id, TrialRow.index):
            job_trials.setdefault(keys[row.task_id], []).append((row.index, row.config, row.stage, row.latency_ms))
        assert "report" not in Job.find_or_raise_by_id(s, job_id).spec  # the worker's report has its own column
    assert job["report"]["check"]["passed"]

    # bench.models' path on the same program, spec and seed, with the job's check inputs
    ep = static_shapes(load_exported_program(buf.getvalue()))
    inputs = random_inputs([(tuple(x.shape), x.dtype) for x in translate_model(ep).inputs], spec["seed"])
    request = ModelTuneRequest(target="host", budget=spec["budget"], seed=spec["seed"], layout="blocked",
                               max_tensor_elements=settings.max_tensor_elements)
    dest = tmp_path / "bench.tar.gz"
    facts, tuned, served = tune_ours(ep, request, inputs, reference_outputs(ep, inputs), dest, io.StringIO(),
                                     measurer=make_measurer("simulated"))
    assert served["error"] is None and served["report"]["check"]["passed"]
    bench_trials = {o.task.workload_key: [(t.index, t.config, t.stage, t.latency_ms) for t in o.trials]
                    for o in tuned.outcomes}
    assert {k: v for k, v in job_trials.items() if v} == bench_trials
    assert job["trials_done"] == facts["ours_trials"] == sum(len(v) for v in bench_trials.values())

    # the same picks: every task's picked latency, trials and where its schedule came from
    bench_files = _members(dest.read_bytes())
    job_manifest, bench_manifest = json.loads(job_files["manifest.json"]), json.loads(bench_files["manifest.json"])
    assert job["report"]["schedules"]["sources"] == served["report"]["schedules"]["sources"]
    picks = [(t["workload_key"], t["latency_ms"], t["trials"]) for t in job_manifest["tasks"]]
    assert picks == [(t["workload_key"], t["latency_ms"], t["trials"]) for t in bench_manifest["tasks"]]
    # the same artifact: the same tasks served with the same schedules, the same packed weights, the same outputs.
    # Whether the tuned or the untuned build is served is a real timing of both, and the simulated device's picks
    # are not chosen for this CPU: where the two builds tie, the two sides may choose differently (both checked)
    if job["report"]["served"] != served["report"]["served"]:
        pytest.skip(f"the tuned and untuned builds tied: the job served {job['report']['served']!r}, the benchmark "
                    f"{served['report']['served']!r}")
    served_tasks = [(t["workload_key"], t["tuned"], t["removed_by_check"]) for t in job_manifest["tasks"]]
    assert served_tasks == [(t["workload_key"], t["tuned"], t["removed_by_check"]) for t in bench_manifest["tasks"]]
    assert any(tuned for _, tuned, _ in served_tasks)
    assert job_manifest["params"] == bench_manifest["params"]
    assert job_files["params.npz"] == bench_files["params.npz"]
    job_out = _outputs(job_files, inputs, tmp_path / "job")
    bench_out = _outputs(bench_files, inputs, tmp_path / "bench")
    assert all(np.array_equal(a, b) for a, b in zip(job_out, bench_out, strict=True))
