"""`bench.models`' programs besides the tuning: the outputs' check, the served artifact, a VM executable and ONNX
Runtime's session as programs for `bench.common.time_fresh`.

Layering: bench may import everything below it; nothing imports bench.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import tvm
from tvm import relax

from bench.common import OnnxProgram, TvmProgram, save_args
from bench.timing_onnx import onnx_session
from compiler.arrays import check_close
from compiler.workloads.model import QUANTIZED_ATOL, QUANTIZED_RTOL, flatten_outputs
from compiler.workloads.model.artifact import extract_model_artifact


def check_outputs(outs: list, expected: list, *, quantized: bool = False) -> str | None:
    """None when `outs` match `expected`; a quantized model's within `compiler.workloads.model.tolerance`'s bound
    (a value rounded across a quantization step moves what follows by one step)."""
    if len(outs) != len(expected):
        return f"{len(outs)} outputs, expected {len(expected)}"
    bounds = {"rtol": QUANTIZED_RTOL, "atol": QUANTIZED_ATOL} if quantized else {}
    for i, (out, ref) in enumerate(zip(outs, expected)):
        mismatch = check_close(out, ref, **bounds)
        if mismatch is not None:
            return f"output {i}: {mismatch}"
    return None


def artifact_program(artifact: Path, inputs: list, folder: Path) -> TvmProgram:
    """The served artifact (lib.so, its packed params) as a program for `time_fresh`."""
    extract_model_artifact(artifact, folder)
    with np.load(folder / "params.npz", allow_pickle=False) as npz:
        params = [npz[f"p{i}"] for i in range(len(npz.files))]
    return TvmProgram(str(folder / "lib.so"), save_args([*inputs, *params], folder / "args.npz"), vm=True)


def run_vm(ex: Any, inputs: list, params: list) -> list:
    """Runs a VM executable once on the inputs and the parameters it takes; its outputs."""
    dev = tvm.cpu(0)
    vm = relax.VirtualMachine(ex, dev)
    args = [tvm.runtime.tensor(np.ascontiguousarray(a), dev) for a in inputs]
    args += [tvm.runtime.tensor(p, dev) for p in params]
    return flatten_outputs(vm["main"](*args))


def export_vm(ex: Any, inputs: list, params: list, path: Path) -> TvmProgram:
    """A VM executable exported with its arguments (inputs, then parameters), for `time_fresh`."""
    ex.export_library(str(path.with_suffix(".so")))
    return TvmProgram(str(path.with_suffix(".so")), save_args([*inputs, *params], path.with_suffix(".npz")), vm=True)


def onnxruntime_program(module: Any, torch_inputs: list, expected: list, folder: Path) -> tuple[dict, OnnxProgram | None]:
    """ONNX Runtime's side: `module` exported to ONNX (`torch.onnx.export`, dynamo), run once and checked
    against torch's `expected`; (facts for the row, the program to time or None when it failed)."""
    facts: dict[str, Any] = {"onnxruntime_correct": None, "onnxruntime_error": None}
    path = folder / "model.onnx"
    try:
        start = time.perf_counter()
        logging.getLogger("torch.onnx").setLevel(logging.ERROR)  # "torchvision is not installed" per operator
        torch.onnx.export(module, tuple(torch_inputs), str(path), dynamo=True, verbose=False)
        facts["onnxruntime_export_s"] = round(time.perf_counter() - start, 2)
        arrays = [t.numpy() for t in torch_inputs]
        session = onnx_session(str(path), 1, spin=False)
        feeds = {spec.name: a for spec, a in zip(session.get_inputs(), arrays, strict=True)}
        mismatch = check_outputs(session.run(None, feeds), expected)
        del session
    except Exception as e:  # noqa: BLE001
        facts["onnxruntime_error"] = f"ONNX Runtime failed: {type(e).__name__}: {str(e)[:300]}"
        return facts, None
    facts["onnxruntime_correct"] = mismatch is None
    if mismatch is not None:
        facts["onnxruntime_error"] = f"ONNX Runtime: {mismatch}"
        return facts, None
    return facts, OnnxProgram(str(path), save_args(arrays, folder / "onnx-inputs.npz"))
