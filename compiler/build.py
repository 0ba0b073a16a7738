"""The deployable artifact of an operator (.tar.gz): a scheduled IRModule built, with its manifest.

Compiling itself is `compiler.pipeline`'s (`compile_module`, `build`, the TIR pipelines), re-exported
here where callers have always found it.

An artifact holds three files:

- `lib.so`: the compiled library (`export_library`), loadable with
  `tvm.runtime.load_module` and nothing of altune;
- `manifest.json`: function name, arguments in call order with shapes, dtypes and
  roles, target, measured latency, workload key, the job spec, TVM version; for a
  program tuned in other layouts (ALT), also `pack` (the "pack_constants"
  function that puts weight/bias into their tuned layouts, run once at load) and
  `layouts`: "main" then takes the data and writes the output in the user's
  layouts, and the constants packed;
- `schedule.py`: the TVMScript of the scheduled module, to read or rebuild.
"""

from __future__ import annotations

import json
import os
import tarfile
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import tvm

from .archive import add_bytes, extract_artifact
from .pipeline import PIPELINES, Pipeline, build, compile_module, tir_pipeline
from .target import resolve_target, use_all_cores

if TYPE_CHECKING:
    from .workloads import Workload

__all__ = ["ARTIFACT_FILES", "CALL_USAGE", "MANIFEST_FORMAT", "PACKED_CALL_USAGE", "PIPELINES", "Pipeline", "build",
           "compile_module", "extract_artifact", "load_artifact", "make_manifest", "tir_pipeline", "write_artifact"]

MANIFEST_FORMAT = 1
ARTIFACT_FILES = ("lib.so", "manifest.json", "schedule.py")
CALL_USAGE = 'lib["main"](*inputs, out)'
PACKED_CALL_USAGE = (
    'packed = [empty(c["shape"]) for c in manifest["pack"]["outputs"]]; '
    'lib["pack_constants"](*constants, *packed)  # once; then: lib["main"](data, *packed, out)'
)


def _as_target(target: Any) -> tvm.target.Target:
    if isinstance(target, tvm.target.Target):
        return target
    return resolve_target(target)


def make_manifest(
    workload: Workload, target: tvm.target.Target, latency_ms: float | None, spec: dict, layout: Any = None
) -> dict:
    """The manifest.json content of an artifact (see the module docstring)."""
    args = [
        {"name": s.name, "shape": list(s.shape), "dtype": s.dtype, "role": "input"} for s in workload.inputs
    ]
    out = workload.output
    args.append({"name": out.name, "shape": list(out.shape), "dtype": out.dtype, "role": "output"})
    manifest = {
        "format": MANIFEST_FORMAT,
        "function": "main",
        "args": args,
        "call": CALL_USAGE,
        "usage": (
            "lib = tvm.runtime.load_module('lib.so'); pass tvm.runtime.tensor arrays for the inputs "
            "and a preallocated output, in the order of 'args': " + CALL_USAGE
        ),
        "target": str(target),
        "target_kind": str(target.kind.name),
        "latency_ms": latency_ms,
        "workload_key": workload.key,
        "workload": {
            "operator": workload.operator,
            "params": dict(workload.params),
            "dtype": workload.dtype,
            "epilogue": workload.epilogue,
            "flops": workload.flops,
        },
        "spec": spec,
        "tvm_version": tvm.__version__,
    }
    if layout is not None:
        manifest.update(_layout_manifest(workload, layout))
    return manifest


def _layout_manifest(workload: Workload, layout: Any) -> dict:
    """Manifest entries of a program in tuned layouts (a `compiler.layout.LayoutProgram`, keep_interface)."""
    assert layout.keep_interface, "an artifact keeps the user's interface: build it with keep_interface=True"
    constants = [s.name for s in workload.inputs if s.name in layout.constants]
    packed = [s for s in layout.args[:-1] if s.name in constants]
    args = [{"name": s.name, "shape": list(s.shape), "dtype": s.dtype,
             "role": "constant" if s.name in constants else "input"} for s in layout.args[:-1]]
    out = layout.args[-1]
    args.append({"name": out.name, "shape": list(out.shape), "dtype": out.dtype, "role": "output"})
    user = {s.name: s for s in workload.inputs}
    return {
        "args": args,
        "user_args": [{"name": s.name, "shape": list(s.shape), "dtype": s.dtype} for s in workload.args],
        "call": PACKED_CALL_USAGE,
        "usage": (
            "lib = tvm.runtime.load_module('lib.so'); once: pack the constants (weight, bias; user layouts, "
            "in the order of pack.inputs) into preallocated arrays of pack.outputs with lib['pack_constants']; "
            "per call: lib['main'] with the arguments of 'args' (data and output in the user's layouts, "
            "constants packed). " + PACKED_CALL_USAGE
        ),
        "pack": {
            "function": "pack_constants",
            "inputs": [{"name": n, "shape": list(user[n].shape), "dtype": user[n].dtype} for n in constants
                       if n not in layout.guests],
            "outputs": [{"name": s.name, "shape": list(s.shape), "dtype": s.dtype} for s in packed],
        },
        "layouts": layout.manifest()["layouts"],
    }


def write_artifact(
    dest: Path,
    workload: Workload,
    mod: tvm.IRModule,
    target: tvm.target.Target | str,
    latency_ms: float | None,
    spec: dict,
    layout: Any = None,
    pipeline: Pipeline = "licm",
) -> Path:
    """Builds `mod` and writes the deployable artifact.

    Args:
        dest: path of the .tar.gz to write (parent folders are created); an existing
            file is replaced atomically, so readers never see half an archive.
        workload: the workload `mod` implements (its arguments and key go in the manifest).
        mod: the scheduled module ("main" with the workload's signature).
        target: a TVM target or a target name ("host", "llvm", "cuda").
        latency_ms: measured latency of this module, or None if not measured.
        spec: the job spec (JSON-serializable), recorded as given.
        layout: the `compiler.layout.LayoutProgram` (keep_interface) `mod` was scheduled
            from, when the program runs in tuned layouts: `mod` then also holds
            "pack_constants", and the manifest says how to call both.
        pipeline: the TIR pipeline it is built with (`tir_pipeline`).

    Returns:
        `dest`.
    """
    target = _as_target(target)
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    lib = build(mod, target, pipeline)
    manifest = make_manifest(workload, target, latency_ms, spec, layout)
    with tempfile.TemporaryDirectory(prefix="altune-artifact-") as tmp:
        lib_path = Path(tmp) / "lib.so"
        lib.export_library(str(lib_path))
        partial = dest.with_name(f".{dest.name}.{os.getpid()}.partial")
        try:
            with tarfile.open(partial, "w:gz") as tar:
                tar.add(lib_path, arcname="lib.so")
                add_bytes(tar, "manifest.json", json.dumps(manifest, indent=2, sort_keys=True).encode())
                add_bytes(tar, "schedule.py", mod.script().encode())
            os.replace(partial, dest)
        finally:
            partial.unlink(missing_ok=True)
    return dest


def load_artifact(path: Path, extract_dir: Path | None = None) -> tuple[tvm.runtime.Module, dict]:
    """Loads an artifact written by `write_artifact`.

    Args:
        path: the .tar.gz.
        extract_dir: where to extract it; a temporary folder (removed after
            loading; the loaded library stays mapped) when None.

    Returns:
        (runtime module, manifest); call it as `lib["main"](*inputs, out)`.
    """
    use_all_cores()
    if extract_dir is not None:
        folder = extract_artifact(path, extract_dir, ARTIFACT_FILES)
        lib = tvm.runtime.load_module(str(folder / "lib.so"))
        return lib, json.loads((folder / "manifest.json").read_text())
    with tempfile.TemporaryDirectory(prefix="altune-load-") as tmp:
        return load_artifact(path, Path(tmp))
