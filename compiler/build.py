"""Scheduled IRModule -> compiled module, and the deployable artifact (.tar.gz).

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

import io
import json
import os
import tarfile
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import tvm

    from .workloads import Workload

MANIFEST_FORMAT = 1
ARTIFACT_FILES = ("lib.so", "manifest.json", "schedule.py")
CALL_USAGE = 'lib["main"](*inputs, out)'
PACKED_CALL_USAGE = (
    'packed = [empty(c["shape"]) for c in manifest["pack"]["outputs"]]; '
    'lib["pack_constants"](*constants, *packed)  # once; then: lib["main"](data, *packed, out)'
)


Pipeline = Literal["licm", "default", "hoist-expression"]
PIPELINES: tuple[Pipeline, ...] = ("licm", "default", "hoist-expression")


def tir_pipeline(pipeline: Pipeline = "licm") -> str:
    """The name TVM knows a TIR pipeline of ours by (registered in this process on first use).

    - "licm": TVM's default pipeline, then our loop-invariant code motion (`compiler.passes.licm`);
      what every build of ours uses unless a job turns it off;
    - "default": TVM's default pipeline alone;
    - "hoist-expression": TVM's default pipeline, then TVM's own `HoistExpression` with every kind of
      conditional and let binding enabled (the comparison `python -m bench.licm` makes).
    """
    from tvm.tirx import compilation_pipeline

    if pipeline == "default":
        return "default"
    if pipeline not in PIPELINES:
        raise ValueError(f"unknown TIR pipeline: {pipeline!r} (one of {', '.join(PIPELINES)})")
    name = f"altune-{pipeline}"
    if name not in compilation_pipeline.PIPELINE_MAP:
        compilation_pipeline.register_tir_pipeline(name, lambda: _then(_last_pass(pipeline)))
    return name


def _last_pass(pipeline: Pipeline) -> tvm.transform.Pass:
    import tvm

    if pipeline == "licm":
        from .passes.licm import licm_pass

        return licm_pass()
    from tvm.s_tir import transform
    from tvm.tirx.transform import HoistedConditionals, HoistedLetBindings

    hoist = transform.HoistExpression()
    config = {"s_tir.HoistExpression": {"hoisted_conditionals": HoistedConditionals.All.value,
                                        "hoisted_let_bindings": HoistedLetBindings.All.value}}

    @tvm.transform.module_pass(opt_level=0, name="altune.HoistExpressionAll")
    def _hoist(mod: tvm.IRModule, _ctx: Any) -> tvm.IRModule:
        with tvm.transform.PassContext(config=config):
            return hoist(mod)

    return _hoist


def _then(last: tvm.transform.Pass) -> tuple:
    """TVM's default TIR pipeline (its passes, its finalization), with `last` after its last pass.

    In front of it runs our tensorize pass (`compiler.passes.tensorize`), which touches only functions
    with a loop marked for a tensor instruction (`tensorize.mark`) and returns all others as they are; after
    it, `compiler.passes.vector_math` (float32 `exp` as arithmetic that stays vectorized).
    """
    import tvm
    from tvm.tirx import compilation_pipeline

    from .passes.tensorize import tensorize_pass
    from .passes.vector_math import vector_math_pass

    default, finalize_host, finalize_device = compilation_pipeline.get_default_tir_pipeline(tvm.target.Target("llvm"))
    return (tvm.transform.Sequential([tensorize_pass(), default, vector_math_pass(), last]), finalize_host,
            finalize_device)


def compile_module(mod: tvm.IRModule, target: tvm.target.Target, pipeline: Pipeline = "licm") -> Any:
    """`tvm.compile` through one of our TIR pipelines (`tir_pipeline`): every build of ours goes here."""
    import tvm

    return tvm.compile(mod, target=target, tir_pipeline=tir_pipeline(pipeline))


def build(mod: tvm.IRModule, target: tvm.target.Target, pipeline: Pipeline = "licm") -> tvm.runtime.Module:
    """Compiles a (scheduled) TIR module.

    Args:
        mod: an IRModule whose "main" is a PrimFunc.
        target: the TVM target (see `compiler.target.resolve_target`).
        pipeline: the TIR pipeline (`tir_pipeline`): with our LICM by default.

    Returns:
        A runnable runtime module: `lib["main"](*args)` and `lib.time_evaluator`.
    """
    return compile_module(mod, target, pipeline).jit()


def _as_target(target: Any) -> tvm.target.Target:
    import tvm

    if isinstance(target, tvm.target.Target):
        return target
    from .target import resolve_target

    return resolve_target(target)


def make_manifest(
    workload: Workload, target: tvm.target.Target, latency_ms: float | None, spec: dict, layout: Any = None
) -> dict:
    """The manifest.json content of an artifact (see the module docstring)."""
    import tvm

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
                _add_bytes(tar, "manifest.json", json.dumps(manifest, indent=2, sort_keys=True).encode())
                _add_bytes(tar, "schedule.py", mod.script().encode())
            os.replace(partial, dest)
        finally:
            partial.unlink(missing_ok=True)
    return dest


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))


def extract_artifact(path: str | os.PathLike, dest_dir: str | os.PathLike,
                     files: Sequence[str] = ARTIFACT_FILES) -> Path:
    """Extracts the known artifact files of `path` into `dest_dir` and returns it.

    Only regular files named in `files` (an operator artifact's by default; a model's are
    `compiler.workloads.model.MODEL_ARTIFACT_FILES`) are extracted, so an archive from
    elsewhere cannot write outside `dest_dir`.
    """
    dest_dir = Path(dest_dir)
    dest_dir.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "r:gz") as tar:
        members = [m for m in tar.getmembers() if m.isfile() and m.name in files]
        missing = set(files) - {m.name for m in members}
        if missing:
            raise ValueError(f"{path}: not an altune artifact, missing {sorted(missing)}")
        for member in members:
            source = tar.extractfile(member)
            assert source is not None, f"{member.name} has no content"
            (dest_dir / member.name).write_bytes(source.read())
    return dest_dir


def load_artifact(path: Path, extract_dir: Path | None = None) -> tuple[tvm.runtime.Module, dict]:
    """Loads an artifact written by `write_artifact`.

    Args:
        path: the .tar.gz.
        extract_dir: where to extract it; a temporary folder (removed after
            loading; the loaded library stays mapped) when None.

    Returns:
        (runtime module, manifest); call it as `lib["main"](*inputs, out)`.
    """
    import tvm

    if extract_dir is not None:
        folder = extract_artifact(path, extract_dir)
        lib = tvm.runtime.load_module(str(folder / "lib.so"))
        return lib, json.loads((folder / "manifest.json").read_text())
    with tempfile.TemporaryDirectory(prefix="altune-load-") as tmp:
        return load_artifact(path, Path(tmp))
