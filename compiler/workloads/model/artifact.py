"""The model artifact: lib.so, params.npz, manifest.json and a run.py that needs only TVM's runtime.

Layering: `compiler` never imports `tuner` or `service`. torch is imported inside the functions that run the
exported program: building and running the model needs only TVM.
"""

from __future__ import annotations

import json
import os
import tarfile
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import tvm

from compiler.archive import extract_artifact
from compiler.arrays import to_numpy, to_torch
from compiler.target import target_info

from ..operators import TensorSpec
from .build import BuiltModel
from .importer import ImportedModel

MODEL_ARTIFACT_FILES = ("lib.so", "params.npz", "manifest.json", "run.py")


MODEL_MANIFEST_FORMAT = 1


RUN_PY = '''"""Loads and runs this altune model artifact with TVM's runtime (no altune needed).

    python run.py                      # random inputs, prints output shapes
    python run.py inputs.npz out.npz   # inputs named as in manifest.json, outputs output0, output1, ...

From Python: `from run import load; run = load("."); outputs = run(*numpy_inputs)`.

bfloat16 tensors (a model exported in bfloat16) are ml_dtypes.bfloat16 arrays: inputs may also come as float32
(rounded) or as the 2-byte records np.savez writes for bfloat16; out.npz holds bfloat16 outputs as float32
(exactly: every bfloat16 is a float32).
"""

import json
import os
import sys
from pathlib import Path

# TVM's runtime runs one thread per two x86 cores unless told; the latencies in manifest.json used every core.
os.environ.setdefault("TVM_NUM_THREADS", str(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                                             else os.cpu_count() or 1))

import numpy as np  # noqa: E402
import tvm  # noqa: E402
from tvm import relax  # noqa: E402


def typed(array, dtype):
    """`array` as a contiguous array of `dtype` (a manifest dtype name)."""
    array = np.asarray(array)
    if dtype == "bfloat16":
        import ml_dtypes

        if array.dtype.kind == "V" and array.dtype.itemsize == 2:  # np.savez of a bfloat16 array, loaded
            return np.ascontiguousarray(array.view(ml_dtypes.bfloat16))
        return np.ascontiguousarray(array.astype(ml_dtypes.bfloat16))
    return np.ascontiguousarray(array, dtype=dtype)


def load(folder="."):
    """A function numpy inputs -> list of numpy outputs, for the artifact unpacked in `folder`."""
    folder = Path(folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    dev = tvm.device(manifest["device"], 0)
    vm = relax.VirtualMachine(tvm.runtime.load_module(str(folder / "lib.so")), dev)
    with np.load(folder / "params.npz", allow_pickle=False) as npz:
        params = [tvm.runtime.tensor(typed(npz[p["key"]], p["dtype"]), dev) for p in manifest["params"]]

    def flatten(out):
        return [out.numpy()] if hasattr(out, "numpy") else [a for o in out for a in flatten(o)]

    def run(*inputs):
        assert len(inputs) == len(manifest["inputs"]), f"{len(inputs)} inputs, expected {len(manifest['inputs'])}"
        args = [tvm.runtime.tensor(typed(a, s["dtype"]), dev) for a, s in zip(inputs, manifest["inputs"])]
        return flatten(vm["main"](*args, *params))

    run.manifest = manifest
    return run


def main(argv):
    run = load(Path(__file__).resolve().parent)
    specs = run.manifest["inputs"]
    if argv:
        with np.load(argv[0], allow_pickle=False) as npz:
            inputs = [npz[s["name"]] for s in specs]
    else:
        rng = np.random.default_rng(0)
        inputs = [typed(rng.uniform(-1, 1, s["shape"]), s["dtype"]) if s["dtype"].startswith(("float", "bfloat"))
                  else rng.integers(0, 100, s["shape"]).astype(s["dtype"]) for s in specs]
    outputs = run(*inputs)
    for i, out in enumerate(outputs):
        print(f"output{i}: shape {list(out.shape)} {out.dtype}")
    if len(argv) > 1:
        np.savez(argv[1], **{f"output{i}": o.astype(np.float32) if str(o.dtype) == "bfloat16" else o
                             for i, o in enumerate(outputs)})


if __name__ == "__main__":
    main(sys.argv[1:])
'''


def make_model_manifest(model: ImportedModel, built: BuiltModel, target: Any, *, latency_ms: float | None = None,
                        tasks: Sequence[dict] = (), spec: dict | None = None, report: dict | None = None) -> dict:
    """manifest.json of a model artifact: inputs, outputs, params (npz keys in call order), tasks."""
    def tensor(s: TensorSpec) -> dict:
        return {"name": s.name, "shape": list(s.shape), "dtype": s.dtype}

    return {
        "format": MODEL_MANIFEST_FORMAT,
        "kind": "model",
        "function": "main",
        "call": 'vm["main"](*inputs, *params)',
        "usage": "python run.py [inputs.npz [outputs.npz]]; or from run import load; outputs = load('.')(*inputs)",
        "inputs": [tensor(s) for s in model.inputs],
        "outputs": [tensor(s) for s in model.outputs],
        # the parameters "main" takes: the model's, transformed at build time (packed layouts), in call order
        "params": [{"key": f"p{i}", "shape": list(a.shape), "dtype": str(a.dtype)}
                   for i, a in enumerate(built.params)],
        "model_params": [{"name": n, "shape": list(a.shape), "dtype": str(a.dtype)}
                         for n, a in zip(model.param_names, model.params)],
        "tasks": list(tasks) or [{"name": t.name, "workload_key": t.workload_key, "weight": t.weight,
                                  "complex": t.complex} for t in model.tasks],
        "target": str(target),
        "device": target_info(target).device_type,
        "latency_ms": latency_ms,
        "spec": spec or {},
        # how it was checked and measured (the whole-model check, latencies of the untuned model and torch)
        "report": report or {},
        "tvm_version": tvm.__version__,
    }


def write_model_artifact(dest: str | os.PathLike, model: ImportedModel, built: BuiltModel, target: Any, *,
                         latency_ms: float | None = None, tasks: Sequence[dict] = (),
                         spec: dict | None = None, report: dict | None = None) -> Path:
    """Writes the model artifact (.tar.gz, atomically): lib.so, params.npz, manifest.json, run.py.

    Args:
        dest: the .tar.gz path (parents created, an existing file replaced).
        model: the imported model.
        built: `build_model`'s result (its library and transformed parameters are written).
        target: the target it was built for.
        latency_ms: measured end-to-end latency, if any.
        tasks: per-task facts for the manifest (name, key, weight, latency...); the model's tasks when empty.
        spec: the job spec, recorded as given.
        report: the job's report (the whole-model check, latencies), recorded as given.
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    manifest = make_model_manifest(model, built, target, latency_ms=latency_ms, tasks=tasks, spec=spec, report=report)
    with tempfile.TemporaryDirectory(prefix="altune-model-") as tmp:
        folder = Path(tmp)
        built.ex.export_library(str(folder / "lib.so"))
        np.savez(folder / "params.npz", **{f"p{i}": a for i, a in enumerate(built.params)})
        (folder / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
        (folder / "run.py").write_text(RUN_PY)
        partial = dest.with_name(f".{dest.name}.{os.getpid()}.partial")
        try:
            with tarfile.open(partial, "w:gz") as tar:
                for name in MODEL_ARTIFACT_FILES:
                    tar.add(folder / name, arcname=name)
            os.replace(partial, dest)
        finally:
            partial.unlink(missing_ok=True)
    return dest


def extract_model_artifact(path: str | os.PathLike, dest_dir: str | os.PathLike) -> Path:
    """Extracts the known files of a model artifact (regular files only, no paths) into `dest_dir`."""
    return extract_artifact(path, dest_dir, MODEL_ARTIFACT_FILES)


def torch_arguments(module: Any, inputs: Sequence[Any]) -> tuple[tuple, dict]:
    """The positional and keyword arguments to call `module` with, from the model's flat inputs.

    `inputs` (numpy or torch) are the model's tensors in the order the Relax import takes them: the leaves of
    its arguments in `pytree` order (positional arguments, then keyword arguments; nested tuples, lists and
    dicts flattened). An exported program's module (`ep.module()`, which keeps the program's `_in_spec`) gets
    them rebuilt into its arguments' pytrees; any other module gets them positionally (pytrees of arrays
    converted leaf by leaf).
    """
    from torch.utils import _pytree as pytree  # heavy: torch only where the exported program runs

    tensors = [pytree.tree_map(to_torch, a) for a in inputs]
    in_spec = getattr(module, "_in_spec", None)
    if isinstance(in_spec, pytree.TreeSpec) and in_spec.num_leaves == len(tensors):
        return pytree.tree_unflatten(tensors, in_spec)
    return tuple(tensors), {}


def torch_outputs(module: Any, inputs: Sequence[Any]) -> list[np.ndarray]:
    """A torch module's outputs on numpy or torch inputs (`torch_arguments`), flattened, as numpy (the reference).

    The outputs are the leaves of whatever pytree the module returns (tuples, lists, dicts, namedtuples,
    nested), in `tree_leaves` order: the order of the exported graph's outputs, which is the order of the
    Relax import's flattened outputs.
    """
    import torch  # heavy: torch only where the exported program runs
    from torch.utils import _pytree as pytree  # heavy: torch only where the exported program runs

    args, kwargs = torch_arguments(module, inputs)
    with torch.no_grad():
        out = module(*args, **kwargs)
    leaves = pytree.tree_leaves(out)
    assert all(isinstance(t, torch.Tensor) for t in leaves), (
        f"non-tensor outputs: {[type(t).__name__ for t in leaves if not isinstance(t, torch.Tensor)]}")
    return [to_numpy(t) for t in leaves]
