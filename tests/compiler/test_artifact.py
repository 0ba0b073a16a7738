"""write_artifact -> .tar.gz -> load with plain TVM -> same numbers as torch."""

from __future__ import annotations

import json
import tarfile

import numpy as np
import pytest

from compiler.build import ARTIFACT_FILES, load_artifact, write_artifact
from compiler.workloads import make_workload

from compiler_cases import SMALL


def test_artifact_round_trip(tmp_path, host_target):
    import tvm

    workload = make_workload("conv2d", SMALL["conv2d"], epilogue="bias_relu")
    mod = tvm.IRModule({"main": workload.prim_func})
    spec = {"kind": "operator", "operator": "conv2d", "params": SMALL["conv2d"], "epilogue": "bias_relu",
            "target": "host", "budget": 8, "seed": 0}
    path = write_artifact(tmp_path / "out" / "conv2d.tar.gz", workload, mod, host_target, 1.25, spec)
    assert path == tmp_path / "out" / "conv2d.tar.gz"
    assert [p.name for p in path.parent.iterdir()] == ["conv2d.tar.gz"], "no partial files left behind"

    with tarfile.open(path) as tar:
        assert sorted(tar.getnames()) == sorted(ARTIFACT_FILES)
        tar.extractall(tmp_path / "x", filter="data")
    manifest = json.loads((tmp_path / "x" / "manifest.json").read_text())
    assert manifest["function"] == "main"
    assert manifest["call"] == 'lib["main"](*inputs, out)'
    assert [(a["name"], a["role"]) for a in manifest["args"]] == [
        ("data", "input"), ("weight", "input"), ("bias", "input"), ("output", "output"),
    ]
    assert [tuple(a["shape"]) for a in manifest["args"]] == [s.shape for s in workload.args]
    assert all(a["dtype"] == "float32" for a in manifest["args"])
    assert manifest["workload_key"] == workload.key
    assert manifest["latency_ms"] == 1.25
    assert manifest["spec"] == spec
    assert manifest["tvm_version"] == tvm.__version__
    assert manifest["target_kind"] == "llvm" and str(host_target.attrs["mcpu"]) in manifest["target"]
    schedule = (tmp_path / "x" / "schedule.py").read_text()
    assert "def main(" in schedule and 'T.sblock("conv2d_nchw")' in schedule

    # a user needs only TVM: load the extracted library directly
    lib = tvm.runtime.load_module(str(tmp_path / "x" / "lib.so"))
    inputs = workload.random_inputs(seed=11)
    out = tvm.runtime.tensor(np.zeros(workload.output.shape, "float32"))
    lib["main"](*[tvm.runtime.tensor(a) for a in inputs], out)
    np.testing.assert_allclose(out.numpy(), workload.reference(inputs), rtol=1e-4, atol=1e-4)

    # and through the helper, from the archive
    lib2, manifest2 = load_artifact(path)
    assert manifest2 == manifest
    out2 = tvm.runtime.tensor(np.zeros(workload.output.shape, "float32"))
    lib2["main"](*[tvm.runtime.tensor(a) for a in inputs], out2)
    np.testing.assert_array_equal(out2.numpy(), out.numpy())


def test_write_artifact_accepts_a_target_name(tmp_path):
    import tvm

    workload = make_workload("dense", SMALL["dense"])
    path = write_artifact(tmp_path / "d.tar.gz", workload, tvm.IRModule({"main": workload.prim_func}),
                          "host", None, {})
    lib, manifest = load_artifact(path, extract_dir=tmp_path / "d")
    assert manifest["latency_ms"] is None
    assert (tmp_path / "d" / "lib.so").is_file()
    inputs = workload.random_inputs()
    out = tvm.runtime.tensor(np.zeros(workload.output.shape, "float32"))
    lib["main"](*[tvm.runtime.tensor(a) for a in inputs], out)
    np.testing.assert_allclose(out.numpy(), workload.reference(inputs), rtol=1e-4, atol=1e-4)


def test_load_rejects_a_foreign_archive(tmp_path):
    bad = tmp_path / "bad.tar.gz"
    (tmp_path / "evil.txt").write_text("x")
    with tarfile.open(bad, "w:gz") as tar:
        tar.add(tmp_path / "evil.txt", arcname="../evil.txt")
    with pytest.raises(ValueError, match="not an altune artifact"):
        load_artifact(bad)
