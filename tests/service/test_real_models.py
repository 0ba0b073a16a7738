"""Real models a user brings, through the product: uploaded over the API, tuned by a worker (everything torch does
in the sandbox), the downloaded artifact run on its own and compared with the module's own outputs. The whole
corpus runs as `python -m bench.jobs --all` (bench/jobs.py)."""

from __future__ import annotations

import importlib.util
import io
import json
import subprocess
import sys
import tarfile

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if importlib.util.find_spec("torchvision") is None:
    pytest.skip("torchvision is not installed (pip install -e '.[dev]')", allow_module_level=True)

from support.jobs import upload_model  # noqa: E402
from support.models import program_bytes  # noqa: E402

from bench import corpus  # noqa: E402
from compiler.workloads import model as M  # noqa: E402


# a causal-mask decoder block (a -inf constant), a dict output (nested inputs: bench.jobs and tests/bench/test_corpus.py)
@pytest.mark.tunes
@pytest.mark.builds_model
@pytest.mark.parametrize("name", ["gpt_block", "dict_out"])
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # the storage paths are the other tests'
def test_a_real_model_uploads_tunes_and_its_artifact_matches_the_module(name, client, settings, tmp_path):
    from service.worker import Worker

    module, args, kwargs = corpus.CORPUS[name]()
    ep = torch.export.export(module, args, kwargs)
    r = upload_model(client, program_bytes(ep), budget=1)  # one trial tunes a task: the artifact is what is checked
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    assert Worker(settings).run_once() == job_id
    job = client.get(f"/api/v1/jobs/{job_id}").json()
    assert job["status"] == "succeeded", job["error"]
    assert job["report"]["check"]["passed"] and job["trials_done"] >= 1
    folder = tmp_path / "artifact"
    folder.mkdir()
    with tarfile.open(fileobj=io.BytesIO(client.get(f"/api/v1/jobs/{job_id}/artifact").content)) as tar:
        tar.extractall(folder, filter="data")
    manifest = json.loads((folder / "manifest.json").read_text())
    inputs = corpus.flat_inputs(ep)
    np.savez(folder / "in.npz", **{s["name"]: a for s, a in zip(manifest["inputs"], inputs)})
    done = subprocess.run([sys.executable, "run.py", "in.npz", "out.npz"], cwd=folder, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    expected = M.reference_outputs(ep, inputs)  # the module's own outputs, flattened in its output spec's order
    with np.load(folder / "out.npz") as out:
        outs = [out[f"output{i}"] for i in range(len(expected))]
    assert M.compare_outputs(outs, expected) is None


@pytest.mark.sandbox
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_torchvision_model_with_hyphenated_module_paths_uploads(client):
    """regnet_x_400mf, as torchvision publishes it: `trunk_output.block4.block4-11...` was refused as a name."""
    r = upload_model(client, program_bytes(corpus.export("regnet_x_400mf")))
    assert r.status_code == 201, r.text
    assert len(r.json()["tasks"]) > 5
