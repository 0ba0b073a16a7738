"""Model jobs over the API: upload, bad uploads, a worker tunes and builds, artifact runs, re-submission reuses."""

from __future__ import annotations

import importlib
import io
import json
import os
import pickle
import subprocess
import sys
import tarfile

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from support.jobs import upload_model  # noqa: E402
from support.models import program_bytes, zoo_program  # noqa: E402

from compiler.workloads import model as M  # noqa: E402
from compiler.workloads import zoo  # noqa: E402
from service.db import session_scope  # noqa: E402
from service.models import Job, Schedule, TrialRow  # noqa: E402


@pytest.fixture
def api(client):
    """The app in-process, with an admin token (tests/conftest.py)."""
    return client


def _jobs(settings) -> int:
    with session_scope(settings.resolved_database_url) as s:
        return s.query(Job).count()


class Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.sandbox
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # compiler work: SQLite is enough (CI time)
def test_bad_uploads_are_422_and_leave_no_job(api, settings, tmp_path):
    marker = tmp_path / "pwned"
    cases = [
        (np.random.default_rng(0).bytes(1000), {}, ["body", "file"], "not a zip"),
        (pickle.dumps(Evil(str(marker))), {}, ["body", "file"], "not a zip"),
        (zoo_program("small_cnn"), {"input_shapes": [[1, 3, 8, 8]]}, ["body", "spec", "input_shapes"], "exported for"),
        (zoo_program("small_cnn"), {"budget": 10**9}, ["body", "spec", "budget"], "at most"),
        (zoo_program("small_cnn"), {"target": "tpu"}, ["body", "spec", "target"], "unknown target"),
        (zoo_program("small_cnn"), {"bogus": 1}, ["body", "spec", "bogus"], "Extra inputs"),
        (zoo_program("small_cnn"), {"layout": "NHWC"}, ["body", "spec", "layout"], "'search' or 'none'"),
    ]
    buf = io.BytesIO()
    torch.save(Evil(str(marker)), buf)
    cases.append((buf.getvalue(), {}, ["body", "file"], "data.pkl"))

    class Spectrum(torch.nn.Module):
        def forward(self, x):
            return torch.fft.rfft(x).abs()

    fft = program_bytes(torch.export.export(Spectrum(), (torch.randn(8),)))
    # an operator nobody converts: named with the graph node it is at
    cases.append((fft, {}, ["body", "file"], "unsupported operator(s): _fft_r2c.default at node _fft_r2c"))
    for data, spec, loc, text in cases:
        r = upload_model(api, data, **spec)
        assert r.status_code == 422, r.text
        (detail,) = r.json()["detail"]
        assert detail["loc"] == loc and text in detail["msg"], detail
    assert _jobs(settings) == 0
    assert not marker.exists()
    assert not list((settings.resolved_artifact_dir / "models").glob("*.pt2")) if (
        settings.resolved_artifact_dir / "models").exists() else True


def _run_and_compare(api, settings, job_id, tmp_path, name):
    from service.worker import Worker

    assert Worker(settings).run_once() == job_id
    job = api.get(f"/api/v1/jobs/{job_id}").json()
    assert job["status"] == "succeeded", job["error"]
    artifact = api.get(f"/api/v1/jobs/{job_id}/artifact")
    assert artifact.status_code == 200
    folder = tmp_path / f"job{job_id}"
    folder.mkdir()
    with tarfile.open(fileobj=io.BytesIO(artifact.content)) as tar:
        tar.extractall(folder, filter="data")
    module, inputs = zoo.create(name)
    np.savez(folder / "in.npz", **{s["name"]: i.numpy() for s, i in
                                   zip(json.loads((folder / "manifest.json").read_text())["inputs"], inputs)})
    done = subprocess.run([sys.executable, "run.py", "in.npz", "out.npz"], cwd=folder, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    with torch.no_grad():
        expected = module(*inputs).numpy()
    with np.load(folder / "out.npz") as out:
        np.testing.assert_allclose(out["output0"], expected, rtol=1e-4, atol=1e-4)
    return job


@pytest.mark.tunes
@pytest.mark.builds_model
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # tuning is backend-neutral; storage is tested elsewhere
def test_upload_tune_download_run_and_resubmit(api, settings, tmp_path):
    data = zoo_program("small_cnn")
    r = upload_model(api, data, budget=16, target="host")
    assert r.status_code == 201, r.text
    job = r.json()
    assert job["kind"] == "model" and job["status"] == "queued"
    # graph-level layouts by default: the convs run in N C/c H W c
    assert job["spec"]["layout"] == "blocked"
    # conv2 and conv3 one task called twice (conv1, its batch norm folded in, another)
    conv = [t for t in job["tasks"] if t["name"] == "fused_conv2d_NCHWc_add_relu" and t["weight"] == 2]
    assert len(conv) == 1, [(t["name"], t["weight"]) for t in job["tasks"]]
    first = _run_and_compare(api, settings, job["id"], tmp_path, "small_cnn")
    # the artifact's parameters are already in the layouts the convs read (6-D packed weights)
    manifest = json.loads((tmp_path / f"job{job['id']}" / "manifest.json").read_text())
    assert any(len(p["shape"]) == 6 for p in manifest["params"]), manifest["params"]
    assert first["trials_done"] == 16 and first["best_latency_ms"] > 0 and first["baseline_ms"] > 0
    with session_scope(settings.resolved_database_url) as s:
        known = {row.workload_key for row in s.query(Schedule).all()}
    assert conv[0]["workload_key"] in known

    # the same model again: every task has a stored schedule, served as stored (or its default schedule, where
    # the first job found that faster); nothing is measured, and the artifact still matches torch
    again = upload_model(api, data, budget=16, target="host").json()
    second = _run_and_compare(api, settings, again["id"], tmp_path, "small_cnn")
    assert second["trials_done"] == 0
    with session_scope(settings.resolved_database_url) as s:
        assert s.query(TrialRow).filter(TrialRow.job_id == again["id"]).count() == 0
    sources = second["report"]["schedules"]["sources"]
    assert set(sources) <= {"stored", "default"} and sources.get("stored", 0) >= 1, sources


@pytest.mark.tunes
@pytest.mark.builds_model
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # the search is backend-neutral (storage: other tests)
def test_search_job_chooses_layouts_then_tunes_loops(api, settings, tmp_path, monkeypatch):
    """layout "search": the joint stage (a share of the budget) measures whole layout choices, records every
    measurement, keeps the chosen blocks on the job, and the loop stage tunes the chosen model's tasks; each
    task's pick is re-measured (forced here for tasks with few trials: one finalist)."""
    monkeypatch.setattr(importlib.import_module("tuner.model"), "remeasure_count", lambda n: 1 if n else 0)
    r = upload_model(api, zoo_program("small_cnn"), budget=32, target="host", layout="search")
    assert r.status_code == 201, r.text
    job = _run_and_compare(api, settings, r.json()["id"], tmp_path, "small_cnn")
    report = job["report"]
    search = report["layout_search"]
    assert search["rounds"][0]["source"] == "rule" and search["measurements"] >= 1
    assert search["chosen_estimate_ms"] <= search["rule_estimate_ms"]
    with session_scope(settings.resolved_database_url) as s:  # kept on the job for a resumed run, not in its spec
        blocks = Job.find_or_raise_by_id(s, job["id"]).layout_blocks
    assert "blocks" not in job["spec"] and "report" not in job["spec"]
    assert blocks == search["blocks"] and set(blocks) == {"conv1.weight", "conv2.weight", "conv3.weight"}
    # the job's model has the conversions of the round it chose (the lowest estimate): the rule's 1 (the image in;
    # the pooled 1x1 image leaves its block as a reshape), none where every conv keeps NCHW (round 1, "plain")
    assert search["rounds"][0]["conversions"] == 1
    assert all(r["conversions"] == 0 for r in search["rounds"] if r["source"] == "plain")  # when the budget reached it
    chosen = min(search["rounds"], key=lambda r: r["estimate_ms"])
    assert report["conversions"] == chosen["conversions"]
    with session_scope(settings.resolved_database_url) as s:
        stages = {row.stage for row in s.query(TrialRow).filter(TrialRow.job_id == job["id"])}
        total = s.query(TrialRow).filter(TrialRow.job_id == job["id"]).count()
    assert {"joint", "layout", "loop"} <= stages
    assert job["trials_done"] == total and total <= 32 + 8  # the joint stage may finish its last measured choice
    # the stored schedules carry their re-measured latency, not a reading of the search
    with session_scope(settings.resolved_database_url) as s:
        stored = s.query(Schedule).all()
        searched = {(t.task_id, json.dumps(t.config, sort_keys=True)): t.latency_ms
                    for t in s.query(TrialRow).filter(TrialRow.job_id == job["id"])}
        keys = {t["workload_key"]: t["id"] for t in job["tasks"]}
        assert stored and all(sch.latency_ms != searched[(keys[sch.workload_key], json.dumps(sch.config, sort_keys=True))]
                              for sch in stored if sch.workload_key in keys)


@pytest.mark.tunes
@pytest.mark.builds_model
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # tuning is backend-neutral; storage is tested elsewhere
def test_upload_transformer_tune_download_run(api, settings, tmp_path):
    r = upload_model(api, zoo_program("small_transformer"), budget=8, target="host")
    assert r.status_code == 201, r.text
    job = r.json()
    assert any("matmul" in t["name"] for t in job["tasks"]), [t["name"] for t in job["tasks"]]
    done = _run_and_compare(api, settings, job["id"], tmp_path, "small_transformer")
    assert done["trials_done"] == 8 and done["best_latency_ms"] > 0
    with session_scope(settings.resolved_database_url) as s:
        assert s.query(TrialRow).filter(TrialRow.job_id == job["id"]).count() == 8


@pytest.mark.sandbox
def test_zoo_job(api, settings):
    r = api.post("/api/v1/models/zoo", json={"model": "small_transformer", "budget": 8})
    assert r.status_code == 201, r.text
    job = r.json()
    assert job["name"] == "small_transformer" and job["spec"]["source"] == "zoo" and len(job["tasks"]) > 5
    r = api.post("/api/v1/models/zoo", json={"model": "vgg"})
    assert r.status_code == 422 and "unknown model" in r.json()["detail"][0]["msg"]
    assert _jobs(settings) == 1


def test_zoo_list(api):
    r = api.get("/api/v1/models/zoo")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["count"] == len(zoo.MODELS) == len(body["data"])
    small = next(m for m in body["data"] if m["name"] == "small_cnn")
    assert small["input_shapes"] == [[1, 3, 16, 16]] and small["input_dtypes"] == ["float32"]
    assert small["description"] == zoo.MODELS["small_cnn"].description
    assert "built-in models" in api.get("/openapi.json").json()["paths"]["/api/v1/models/zoo"]["get"]["description"]


@pytest.mark.tunes
@pytest.mark.builds_model
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # tuning is backend-neutral; storage is tested elsewhere
def test_zoo_job_checks_the_artifact_whole(api, settings, tmp_path, monkeypatch):
    """A real zoo job (the feature pyramid: blocked layouts carried through its resizes, tiny budget) with one
    tuned schedule replaced by a program that computes something else: the whole-model check finds it, the job
    removes it (its task back to the default schedule), records the removal and the latencies, and serves an
    artifact that matches torch."""
    import tuner
    from tvm import te

    import tuner.model as model

    real_apply, wrong = tuner.apply_config, {}

    def apply_config(task, config):
        wrong.setdefault("key", task.workload_key)  # the first tuned schedule applied is made wrong
        if task.workload_key != wrong["key"]:
            return real_apply(task, config)
        *ins, out = [te.placeholder(a.shape, a.dtype) for a in M.func_args(task.prim_func)]
        return te.create_prim_func([*ins, te.compute(out.shape, lambda *_: te.const(0.5, out.dtype))])

    monkeypatch.setattr(model, "apply_config", apply_config)
    monkeypatch.setattr(model, "_default_ms", lambda *_: float("inf"))  # every tuned schedule is kept
    r = api.post("/api/v1/models/zoo", json={"model": "fpn", "budget": 2})
    assert r.status_code == 201, r.text
    job = _run_and_compare(api, settings, r.json()["id"], tmp_path, "fpn")
    report = job["report"]
    assert "key" in wrong and report["check"]["passed"], report
    assert [e["workload_key"] for e in report["check"]["removed_schedules"]] == [wrong["key"]], report
    assert "wrong result" in report["check"]["mismatches"][0]
    assert report["schedules"]["kept"] == report["schedules"]["tuned"] - 1
    assert report["served"] in ("tuned", "untuned: faster end to end than with the tuned schedules",
                                "untuned (no tuned schedule kept)"), report["served"]
    assert report["import_notes"] == [], report["import_notes"]  # no conv left in NCHW by the layout fallback
    latency = report["latency_ms"]
    assert latency["artifact"] == job["best_latency_ms"] and latency["untuned"] == job["baseline_ms"]
    assert all(latency[k] > 0 for k in ("artifact", "untuned", "torch_eager")), latency
    with session_scope(settings.resolved_database_url) as s:  # a removed schedule is never offered to later jobs
        assert wrong["key"] not in {row.workload_key for row in s.query(Schedule).all()}
    manifest = json.loads((tmp_path / f"job{job['id']}" / "manifest.json").read_text())
    assert manifest["report"]["check"]["removed_schedules"] == report["check"]["removed_schedules"]


def _tune_upload(api, settings, data: bytes, budget: int) -> tuple[dict, list]:
    """Uploads `data`, runs the worker once; the succeeded job and its trials (task name, ms, error, task key)."""
    from service.worker import Worker

    r = upload_model(api, data, budget=budget, target="host")
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    assert Worker(settings).run_once() == job_id
    job = api.get(f"/api/v1/jobs/{job_id}").json()
    assert job["status"] == "succeeded", job["error"]
    tasks = {t["id"]: (t["name"], t["workload_key"]) for t in job["tasks"]}
    with session_scope(settings.resolved_database_url) as s:
        trials = [(tasks[t.task_id][0], t.latency_ms, t.error, tasks[t.task_id][1])
                  for t in s.query(TrialRow).filter(TrialRow.job_id == job_id)]
    return job, trials


def _run_artifact(api, job_id: int, folder, arrays: list) -> tuple[dict, dict]:
    """Downloads the job's artifact into `folder`, runs its run.py on `arrays`; (manifest, outputs by name)."""
    folder.mkdir()
    with tarfile.open(fileobj=io.BytesIO(api.get(f"/api/v1/jobs/{job_id}/artifact").content)) as tar:
        tar.extractall(folder, filter="data")
    manifest = json.loads((folder / "manifest.json").read_text())
    np.savez(folder / "in.npz", **{s["name"]: a for s, a in zip(manifest["inputs"], arrays)})
    done = subprocess.run([sys.executable, "run.py", "in.npz", "out.npz"], cwd=folder, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    with np.load(folder / "out.npz") as out:
        return manifest, dict(out)


@pytest.mark.tunes
@pytest.mark.builds_model
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # tuning is backend-neutral; storage is tested elsewhere
def test_a_bfloat16_model_tunes_and_its_artifact_matches_torch(api, settings, tmp_path):
    """A model exported in bfloat16 (`module.to(torch.bfloat16)`): convs and matmuls accumulate in float32 and
    round back, as torch does on a CPU, its convs in the bf16 dot-product form; tuned, checked whole and served;
    run.py takes float32 inputs (rounds them) and writes bfloat16 outputs as float32."""
    from compiler.target import resolve_target
    from compiler.workloads.model.layouts import dot_instruction

    module, inputs = zoo.create("se_net")
    module, inputs = module.to(torch.bfloat16), [x.to(torch.bfloat16) for x in inputs]
    job, trials = _tune_upload(api, settings, program_bytes(torch.export.export(module, tuple(inputs))), budget=8)
    report = job["report"]
    assert report["check"]["passed"] and not report["check"]["removed_schedules"], report["check"]
    assert len(trials) == 8 and not [e for _, _, e, _ in trials if e], trials
    # bfloat16 convs searched: in the dot-product form where the CPU has a bf16 dot product (any AVX2 CPU)
    form = "conv2d_nhwc_dot" if dot_instruction(resolve_target("host"), "bfloat16") else "conv2d"
    assert any(form in name and ms for name, ms, *_ in trials), trials

    manifest, out = _run_artifact(api, job["id"], tmp_path / "artifact", [x.float().numpy() for x in inputs])
    assert [s["dtype"] for s in manifest["inputs"]] == ["bfloat16"] and manifest["outputs"][0]["dtype"] == "bfloat16"
    with torch.no_grad():
        expected = module(*inputs).float().numpy()
    assert out["output0"].dtype == np.float32
    np.testing.assert_allclose(out["output0"], expected, rtol=1 / 64, atol=1 / 64 * np.abs(expected).max())


@pytest.mark.tunes
@pytest.mark.builds_model
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # tuning is backend-neutral; storage is tested elsewhere
def test_a_quantized_model_tunes_in_integers_and_its_artifact_matches_torch(api, settings, tmp_path):
    """A model quantized with torchao's PT2E flow (uint8 activations, int8 per-channel weights): its convs and
    linear tune as integer programs (u8 x s8 -> s32), the artifact is checked whole against the quantized
    program and matches it within a quantization step."""
    from compiler.target import resolve_target
    from compiler.workloads.model.layouts import dot_instruction
    from tests.compiler.test_quantized_models import pt2e_quantized

    module, inputs, ep = pt2e_quantized("se_net")  # 3 of its convs fit a VNNI instruction (NHWC, packed)
    job, trials = _tune_upload(api, settings, program_bytes(ep), budget=8)
    assert job["report"]["check"]["passed"], job["report"]["check"]
    assert len(trials) == 8 and not [e for _, _, e, _ in trials if e], trials
    # an integer conv measured: its key names its operands' dtypes; on a CPU with VNNI, in the dot-product form
    assert any("conv2d" in name and ms and "uint8" in key for name, ms, _, key in trials), trials
    if dot_instruction(resolve_target("host")) is not None:
        assert any("conv2d_nhwc_dot" in name and ms for name, ms, *_ in trials), trials

    _, out = _run_artifact(api, job["id"], tmp_path / "artifact", [x.numpy() for x in inputs])
    with torch.no_grad():
        expected = module(*inputs).numpy()
    np.testing.assert_allclose(out["output0"], expected, rtol=M.QUANTIZED_RTOL,
                               atol=M.QUANTIZED_ATOL * max(1.0, np.abs(expected).max()))


@pytest.mark.sandbox
def test_prepare_times_torch_eager_and_torch_compile_in_the_sandbox(tmp_path):
    """The worker's first step (`prepare_model`, the sandbox's `prepare`) times torch eager and torch.compile (its
    compiler let through the child's audit hook, as `nobody` when root); with the setting off, eager only."""
    from support.models import save_program

    from service.model_worker import prepare_model
    from service.settings import Settings

    path = save_program(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()), (torch.randn(2, 8),),
                        tmp_path / "tiny.pt2")
    spec = {"model_file": str(path), "input_shapes": None, "seed": 0}
    settings = Settings(data_dir=tmp_path)
    _graph, expected, torch_ms = prepare_model(settings, spec, tmp_path / "on")
    assert len(expected) == 1 and set(torch_ms) == {"eager", "compile"}, torch_ms
    assert torch_ms["eager"] > 0 and torch_ms["compile"] > 0, torch_ms

    off = settings.model_copy(update={"time_torch_compile": False})
    _graph, _expected, torch_ms = prepare_model(off, spec, tmp_path / "off")
    assert torch_ms["eager"] > 0 and torch_ms["compile"] is None, torch_ms
