"""ONNX Runtime's side: a CPU session of a model, and the child's side of timing one (`bench.common.OnnxProgram`).

`time_onnx` runs in a fresh process of its own (`bench.common.time_fresh`); this module imports ONNX Runtime (a
dev extra: only `bench.models` uses it) and numpy, nothing of TVM or torch.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort

from bench.common import OnnxProgram, time_calls


def onnx_session(path: str, threads: int, *, spin: bool = True) -> ort.InferenceSession:
    """An ONNX Runtime CPU session of the model at `path`, all graph optimizations on (its NCHWc layout
    rewrite for x86 included); `spin=False` for a check in a process that goes on to other work."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    if not spin:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def time_onnx(program: OnnxProgram, threads: int) -> float:
    """Child: times an ONNX Runtime session like `time_torch` (`time_calls`)."""
    session = onnx_session(program.model_path, threads)
    with np.load(program.args_path) as data:
        arrays = [data[f"arr_{i}"] for i in range(len(data.files))]
    feeds = {spec.name: a for spec, a in zip(session.get_inputs(), arrays, strict=True)}
    return time_calls(lambda: session.run(None, feeds))
