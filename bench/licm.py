"""Our loop-invariant code motion against none and against TVM's `HoistExpression`, each program under a fixed
schedule (the paper's experiment, Sec. IV, on this CPU):

    python -m bench.licm [--quick] [--cases SUBSTRING] [--no-layouts] [--out FILE]

Two parts:

- a TOPI-like suite: 27 kinds of TOPI operator (conv2d NCHW/NHWC, conv3d NCDHW/NDHWC, depthwise NCHW/NHWC, group,
  transposed 1-D/2-D/3-D, conv1d, dense, batch_matmul, pooling 1-D/2-D/3-D/adaptive/global, resize,
  upsampling, LRN, softmax, log-softmax, sum and max reductions, layout transforms, depth-to-space, padding)
  in 169 shapes, each under one fixed schedule (`compiler.workloads.model.default_cpu_schedule`: the cheap
  schedule every untuned function of a model job gets: leading spatial loops fused and parallel, the
  innermost spatial loop vectorized);
- the quick suite's layouts (`bench.ops`' QUICK cases): each operator in the user's layouts and in ALT's
  first tiled layout, with the oneDNN-like `blocked_config` loop nest the search starts from.

Every program is built three times: TVM's default TIR pipeline ("default"), then with our pass ("licm"), and
with TVM's `HoistExpression`, every hoisting kind enabled, in its place ("hoist-expression"). Each build's
output is checked against the default build's (within 1e-5); each library is then timed in a process of its
own, one at a time, the three builds of a case one after another. A speedup is the default's latency over
the variant's; "faster"/"slower" means by more than 1% (the paper's noise band); "changed" says whether the
pass changed the lowered program at all (the paper counts only those). The table and a JSON report
(`bench/results/licm-<cpu>.json`) name the target, `-mcpu` and `-mattr` included.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import tvm
from tvm import te, topi
from tvm.tirx import compilation_pipeline

from bench.common import RESULTS_DIR, geomean
from bench.environment import environment
from bench.ops_cases import QUICK
from compiler.arrays import arg_specs, random_inputs
from compiler.build import compile_module, tir_pipeline
from compiler.target import host_cpu, resolve_target, target_key
from compiler.workloads.model import default_cpu_schedule
from compiler.workloads.model.layouts import vector_lanes
from tuner import LayoutSpace, apply_config
from tuner.operator import task_from_request
from tuner.request import TuneRequest
from tuner.searches.alt_seeds import first_layout
from tuner.spaces.layout import join_config

VARIANTS = ("default", "licm", "hoist-expression")
NOISE = 0.01


@dataclass(frozen=True)
class Case:
    """One operator at one shape."""

    name: str
    operator: str
    params: dict[str, Any] = field(hash=False)


# ---------------------------------------------------------------------------
# The operators: params -> [inputs..., output] TE tensors


def _ph(shape: Sequence[int], name: str) -> Any:
    return te.placeholder(tuple(shape), name=name, dtype="float32")


def _conv(layout: str, n: int, c: int, size: int, o: int, k: int, stride: int = 1, pad: int = 0,
          dil: int = 1) -> list:
    if layout == "nchw":
        x, w = _ph((n, c, size, size), "data"), _ph((o, c, k, k), "weight")
        return [x, w, topi.nn.conv2d_nchw(x, w, stride, pad, dil)]
    x, w = _ph((n, size, size, c), "data"), _ph((k, k, c, o), "weight")
    return [x, w, topi.nn.conv2d_nhwc(x, w, stride, pad, dil)]


def _conv3d(layout: str, n: int, c: int, d: int, size: int, o: int, k: int, stride: int = 1, pad: int = 0) -> list:
    if layout == "ncdhw":
        x, w = _ph((n, c, d, size, size), "data"), _ph((o, c, k, k, k), "weight")
        return [x, w, topi.nn.conv3d_ncdhw(x, w, stride, pad, 1, 1)]
    x, w = _ph((n, d, size, size, c), "data"), _ph((k, k, k, c, o), "weight")
    return [x, w, topi.nn.conv3d_ndhwc(x, w, stride, pad, 1, 1)]


def _depthwise(layout: str, n: int, c: int, size: int, k: int, stride: int = 1, pad: int = 0) -> list:
    if layout == "nchw":
        x, w = _ph((n, c, size, size), "data"), _ph((c, 1, k, k), "weight")
        return [x, w, topi.nn.depthwise_conv2d_nchw(x, w, stride, pad, 1)]
    x, w = _ph((n, size, size, c), "data"), _ph((k, k, c, 1), "weight")
    return [x, w, topi.nn.depthwise_conv2d_nhwc(x, w, stride, pad, 1, kernel_layout="HWOI")]


def _group(n: int, c: int, size: int, o: int, k: int, groups: int, stride: int = 1, pad: int = 0) -> list:
    x, w = _ph((n, c, size, size), "data"), _ph((o, c // groups, k, k), "weight")
    return [x, w, topi.nn.group_conv2d_nchw(x, w, stride, pad, 1, groups)]


def _transposed(dims: int, n: int, c: int, size: int, o: int, k: int, stride: int, pad: int) -> list:
    x, w = _ph((n, c, *[size] * dims), "data"), _ph((c, o, *[k] * dims), "weight")
    make = {1: topi.nn.conv1d_transpose_ncw, 2: topi.nn.conv2d_transpose_nchw,
            3: topi.nn.conv3d_transpose_ncdhw}[dims]
    s, p = (stride if dims == 1 else (stride,) * dims), (pad if dims == 1 else (pad,) * dims * 2)
    return [x, w, make(x, w, s, p, "float32", 0 if dims == 1 else (0,) * dims)]


def _conv1d(n: int, c: int, width: int, o: int, k: int, stride: int = 1, pad: int = 0) -> list:
    x, w = _ph((n, c, width), "data"), _ph((o, c, k), "weight")
    return [x, w, topi.nn.conv1d_ncw(x, w, stride, pad)]


def _dense(m: int, n: int, k: int) -> list:
    x, w = _ph((m, k), "data"), _ph((n, k), "weight")
    return [x, w, topi.nn.dense(x, w)]


def _batch_matmul(b: int, m: int, n: int, k: int) -> list:
    x, y = _ph((b, m, k), "a"), _ph((b, n, k), "b")
    return [x, y, topi.nn.batch_matmul(x, y)]


def _pool(dims: int, kind: str, n: int, c: int, size: int, k: int, stride: int, pad: int = 0) -> list:
    x = _ph((n, c, *[size] * dims), "data")
    make = {1: topi.nn.pool1d, 2: topi.nn.pool2d, 3: topi.nn.pool3d}[dims]
    return [x, make(x, (k,) * dims, (stride,) * dims, (1,) * dims, (pad,) * dims * 2, kind)]


def _adaptive_pool(kind: str, n: int, c: int, size: int, out: int) -> list:
    x = _ph((n, c, size, size), "data")
    return [x, topi.nn.adaptive_pool(x, (out, out), kind)]


def _global_pool(kind: str, n: int, c: int, size: int) -> list:
    x = _ph((n, c, size, size), "data")
    return [x, topi.nn.global_pool(x, kind)]


def _resize(method: str, n: int, c: int, size: int, out: int) -> list:
    x = _ph((n, c, size, size), "data")
    return [x, topi.image.resize2d(x, (0.0, 0.0, 0.0, 0.0), (out, out), method=method)]


def _upsampling(method: str, n: int, c: int, size: int, scale: int) -> list:
    x = _ph((n, c, size, size), "data")
    return [x, topi.nn.upsampling(x, scale, scale, method=method)]


def _lrn(n: int, c: int, size: int, window: int) -> list:
    x = _ph((n, c, size, size), "data")
    return [x, topi.nn.lrn(x, window)]


def _softmax(log: bool, rows: int, cols: int) -> list:
    x = _ph((rows, cols), "data")
    return [x, (topi.nn.log_softmax if log else topi.nn.softmax)(x)]


def _reduce(kind: str, shape: Sequence[int], axis: int) -> list:
    x = _ph(shape, "data")
    return [x, (topi.sum if kind == "sum" else topi.max)(x, axis=axis)]


def _layout_transform(src: str, dst: str, shape: Sequence[int]) -> list:
    x = _ph(shape, "data")
    return [x, topi.layout_transform(x, src, dst)]


def _depth_to_space(n: int, c: int, size: int, block: int) -> list:
    x = _ph((n, c, size, size), "data")
    return [x, topi.nn.depth_to_space(x, block)]


def _pad(n: int, c: int, size: int, pad: int) -> list:
    x = _ph((n, c, size, size), "data")
    return [x, topi.nn.pad(x, (0, 0, pad, pad), (0, 0, pad, pad))]


OPERATORS: dict[str, Callable[..., list]] = {
    "conv2d_nchw": lambda **p: _conv("nchw", **p), "conv2d_nhwc": lambda **p: _conv("nhwc", **p),
    "conv3d_ncdhw": lambda **p: _conv3d("ncdhw", **p), "conv3d_ndhwc": lambda **p: _conv3d("ndhwc", **p),
    "depthwise_nchw": lambda **p: _depthwise("nchw", **p), "depthwise_nhwc": lambda **p: _depthwise("nhwc", **p),
    "group_conv2d": _group, "conv1d": _conv1d,
    "conv1d_transpose": lambda **p: _transposed(1, **p), "conv2d_transpose": lambda **p: _transposed(2, **p),
    "conv3d_transpose": lambda **p: _transposed(3, **p),
    "dense": _dense, "batch_matmul": _batch_matmul,
    "pool1d": lambda **p: _pool(1, **p), "pool2d": lambda **p: _pool(2, **p), "pool3d": lambda **p: _pool(3, **p),
    "adaptive_pool": _adaptive_pool, "global_pool": _global_pool, "resize2d": _resize, "upsampling": _upsampling,
    "lrn": _lrn, "softmax": lambda **p: _softmax(False, **p), "log_softmax": lambda **p: _softmax(True, **p),
    "reduce": _reduce, "layout_transform": _layout_transform, "depth_to_space": _depth_to_space, "pad": _pad,
}


def _cases() -> list[Case]:
    cases: list[Case] = []

    def add(op: str, **params: Any) -> None:
        name = op + "_" + "_".join(f"{k}{v}" if not isinstance(v, (list, tuple)) else f"{k}{'x'.join(map(str, v))}"
                                   for k, v in params.items())
        cases.append(Case(name, op, params))

    # ResNet, VGG, MobileNet and U-Net layers at batch 1 (and a few at batch 4)
    convs = [(1, 3, 224, 64, 7, 2, 3), (1, 64, 56, 64, 3, 1, 1), (1, 64, 56, 128, 3, 2, 1), (1, 128, 28, 128, 3, 1, 1),
             (1, 128, 28, 256, 3, 2, 1), (1, 256, 14, 256, 3, 1, 1), (1, 512, 7, 512, 3, 1, 1), (1, 64, 56, 256, 1, 1, 0),
             (1, 256, 56, 64, 1, 1, 0), (1, 32, 112, 32, 3, 1, 1), (4, 64, 28, 64, 3, 1, 1), (1, 96, 35, 96, 3, 1, 1)]
    for n, c, s, o, k, st, p in convs:
        add("conv2d_nchw", n=n, c=c, size=s, o=o, k=k, stride=st, pad=p)
        add("conv2d_nhwc", n=n, c=c, size=s, o=o, k=k, stride=st, pad=p)
    for n, c, s, o, k, st, p in [(1, 64, 28, 64, 3, 1, 1), (1, 256, 14, 256, 3, 1, 2)]:
        add("conv2d_nchw", n=n, c=c, size=s, o=o, k=k, stride=st, pad=p, dil=2)
    for n, c, d, s, o, k, st, p in [(1, 3, 16, 56, 64, 3, 1, 1), (1, 64, 8, 28, 64, 3, 1, 1), (1, 64, 8, 28, 128, 3, 2, 1),
                                    (1, 128, 4, 14, 128, 3, 1, 1), (1, 256, 2, 7, 256, 3, 1, 1), (1, 32, 8, 28, 32, 1, 1, 0)]:
        add("conv3d_ncdhw", n=n, c=c, d=d, size=s, o=o, k=k, stride=st, pad=p)
        add("conv3d_ndhwc", n=n, c=c, d=d, size=s, o=o, k=k, stride=st, pad=p)
    for n, c, s, k, st, p in [(1, 32, 112, 3, 1, 1), (1, 96, 112, 3, 2, 1), (1, 144, 56, 3, 1, 1), (1, 192, 28, 3, 1, 1),
                              (1, 384, 14, 3, 1, 1), (1, 576, 14, 3, 2, 1), (1, 960, 7, 3, 1, 1), (1, 64, 56, 5, 1, 2)]:
        add("depthwise_nchw", n=n, c=c, size=s, k=k, stride=st, pad=p)
        add("depthwise_nhwc", n=n, c=c, size=s, k=k, stride=st, pad=p)
    for n, c, s, o, k, g, st, p in [(1, 64, 56, 64, 3, 4, 1, 1), (1, 128, 28, 128, 3, 32, 1, 1), (1, 256, 14, 256, 3, 32, 1, 1),
                                    (1, 512, 7, 512, 3, 32, 1, 1), (1, 128, 56, 128, 3, 8, 2, 1), (1, 64, 28, 128, 1, 2, 1, 0)]:
        add("group_conv2d", n=n, c=c, size=s, o=o, k=k, groups=g, stride=st, pad=p)
    for n, c, w, o, k, st, p in [(1, 16, 1024, 64, 3, 1, 1), (1, 64, 256, 64, 3, 1, 1), (1, 128, 512, 128, 5, 2, 2),
                                 (1, 256, 128, 256, 3, 1, 1), (4, 64, 256, 64, 3, 1, 1), (1, 80, 3000, 80, 3, 1, 1)]:
        add("conv1d", n=n, c=c, width=w, o=o, k=k, stride=st, pad=p)
    for dims, n, c, s, o, k, st, p in [(1, 1, 64, 256, 32, 4, 2, 1), (1, 1, 128, 128, 64, 4, 2, 1), (1, 1, 32, 512, 16, 3, 1, 1),
                                       (2, 1, 64, 28, 32, 4, 2, 1), (2, 1, 128, 14, 64, 4, 2, 1), (2, 1, 256, 7, 128, 4, 2, 1),
                                       (2, 1, 32, 56, 16, 3, 1, 1), (2, 1, 512, 7, 256, 4, 2, 1),
                                       (3, 1, 32, 8, 16, 4, 2, 1), (3, 1, 64, 4, 32, 4, 2, 1), (3, 1, 16, 16, 8, 3, 1, 1)]:
        add({1: "conv1d_transpose", 2: "conv2d_transpose", 3: "conv3d_transpose"}[dims], n=n, c=c, size=s, o=o, k=k,
            stride=st, pad=p)
    for m, n, k in [(1, 1000, 512), (1, 1000, 2048), (16, 768, 768), (128, 768, 768), (128, 3072, 768), (256, 256, 256),
                    (512, 512, 512), (64, 1024, 256), (1, 4096, 4096), (32, 128, 1280)]:
        add("dense", m=m, n=n, k=k)
    for b, m, n, k in [(12, 128, 128, 64), (12, 128, 64, 128), (8, 64, 64, 64), (16, 32, 32, 128), (4, 256, 256, 64),
                       (1, 512, 512, 512)]:
        add("batch_matmul", b=b, m=m, n=n, k=k)
    for kind in ("max", "avg"):
        for n, c, s, k, st, p in [(1, 64, 112, 3, 2, 1), (1, 128, 56, 2, 2, 0), (1, 256, 28, 3, 1, 1), (1, 512, 14, 2, 2, 0)]:
            add("pool2d", kind=kind, n=n, c=c, size=s, k=k, stride=st, pad=p)
        for n, c, s, k, st in [(1, 64, 1024, 3, 2), (1, 128, 256, 2, 2)]:
            add("pool1d", kind=kind, n=n, c=c, size=s, k=k, stride=st)
        for n, c, s, k, st in [(1, 64, 16, 2, 2), (1, 32, 32, 3, 2)]:
            add("pool3d", kind=kind, n=n, c=c, size=s, k=k, stride=st)
        for n, c, s, out in [(1, 512, 7, 1), (1, 256, 14, 3), (1, 64, 56, 7)]:
            add("adaptive_pool", kind=kind, n=n, c=c, size=s, out=out)
        for n, c, s in [(1, 2048, 7), (1, 512, 14)]:
            add("global_pool", kind=kind, n=n, c=c, size=s)
    for method in ("nearest_neighbor", "linear", "cubic"):
        for n, c, s, out in [(1, 64, 28, 56), (1, 32, 56, 112), (1, 128, 14, 21)]:
            add("resize2d", method=method, n=n, c=c, size=s, out=out)
    for method in ("nearest_neighbor", "bilinear"):
        for n, c, s, scale in [(1, 64, 28, 2), (1, 128, 14, 2), (1, 32, 56, 4)]:
            add("upsampling", method=method, n=n, c=c, size=s, scale=scale)
    for n, c, s, window in [(1, 64, 56, 5), (1, 192, 28, 5), (1, 256, 14, 3)]:
        add("lrn", n=n, c=c, size=s, window=window)
    for rows, cols in [(128, 128), (1536, 128), (64, 1000), (8, 30522), (512, 512)]:
        add("softmax", rows=rows, cols=cols)
        add("log_softmax", rows=rows, cols=cols)
    for kind in ("sum", "max"):
        for shape, axis in [((64, 512, 7), 2), ((1, 256, 56, 56), 1), ((1024, 1024), 0), ((1024, 1024), 1)]:
            add("reduce", kind=kind, shape=shape, axis=axis)
    for src, dst, shape in [("NCHW", "NCHW16c", (1, 64, 56, 56)), ("NCHW", "NCHW8c", (1, 128, 28, 28)),
                            ("NCHW16c", "NCHW", (1, 4, 56, 56, 16)), ("NCHW", "NHWC", (1, 64, 56, 56)),
                            ("NHWC", "NCHW", (1, 56, 56, 64)), ("NCHW", "NCHW4c", (1, 256, 14, 14)),
                            ("OIHW", "OIHW16i16o", (64, 64, 3, 3)), ("NCDHW", "NCDHW8c", (1, 32, 8, 28, 28))]:
        add("layout_transform", src=src, dst=dst, shape=shape)
    for n, c, s, block in [(1, 64, 28, 2), (1, 256, 14, 4), (1, 128, 56, 2)]:
        add("depth_to_space", n=n, c=c, size=s, block=block)
    for n, c, s, p in [(1, 64, 56, 1), (1, 3, 224, 3), (1, 256, 14, 2)]:
        add("pad", n=n, c=c, size=s, pad=p)
    return cases


CASES = _cases()
QUICK_CASES = ("conv2d_nchw_n1_c64_size56_o64_k3_stride1_pad1", "depthwise_nhwc_n1_c144_size56_k3_stride1_pad1",
               "pool2d_kindmax_n1_c64_size112_k3_stride2_pad1", "layout_transform_srcNCHW_dstNCHW16c_shape1x64x56x56")


# ---------------------------------------------------------------------------
# Programs: a case (or a quick-suite layout) -> a scheduled IRModule


def topi_program(case: Case, target: Any) -> Any:
    """The case's operator under the fixed schedule."""

    func = te.create_prim_func(OPERATORS[case.operator](**case.params))
    cores = int(target.attrs.get("num-cores", 1) or 1)
    scheduled = default_cpu_schedule(func, cores, vector_lanes(target))
    return tvm.IRModule({"main": scheduled.with_attr("global_symbol", "main")})


def layout_programs(target_name: str) -> list[tuple[str, str, Any, Any]]:
    """(case name, layout, scheduled module, task) of the quick suite: user's and ALT's first tiled layout."""
    out = []
    for case in QUICK:
        task = task_from_request(TuneRequest(case.operator, case.params, case.dtype, case.epilogue, target_name))
        space = LayoutSpace(task)
        choices = [("user", {})]
        if space.template.params:
            choices.append(("alt-first", space.full_choice(first_layout(space.template, space.unit))))
        for name, choice in choices:
            loops = space.loops_of(join_config(choice, {}) if choice else {})
            try:
                config = join_config(choice, loops.blocked_config()) if choice else loops.blocked_config()
                out.append((case.name, space.program(choice).name if choice else "user", apply_config(task, config),
                            task))
            except Exception as e:  # noqa: BLE001 - a layout without a blocked loop nest is left out, said why
                print(f"  {case.name} {name}: no blocked loop nest ({type(e).__name__}: {e})", file=sys.stderr)
    return out


# ---------------------------------------------------------------------------
# Building, checking, timing


def lowered_text(mod: Any, target: Any, pipeline: str) -> str:
    """The TIR a pipeline hands to LLVM (to tell whether the pass changed anything)."""

    lowering, _, _ = compilation_pipeline.get_tir_pipeline(tir_pipeline(pipeline))
    lowered = lowering(tvm.tirx.transform.BindTarget(target.with_host(target))(mod))
    return "\n".join(f.script() for _, f in sorted(lowered.functions.items(), key=lambda kv: kv[0].name_hint))


def build_variants(mod: Any, target: Any, folder: Path, inputs_path: Path) -> dict:
    """Builds the three variants into `folder`, checks licm and hoist-expression against default (1e-5)."""

    specs = arg_specs(mod["main"])
    inputs = random_inputs(specs[:-1], seed=0)
    np.savez(inputs_path, *inputs)
    row: dict[str, Any] = {}
    outputs = {}
    for variant in VARIANTS:
        start = time.perf_counter()
        lib = compile_module(mod, target, variant)
        row[f"{variant}_build_s"] = round(time.perf_counter() - start, 3)
        path = folder / f"{variant}.so"
        lib.export_library(str(path))
        args = [tvm.runtime.tensor(a) for a in inputs] + [tvm.runtime.tensor(np.zeros(*specs[-1][:1], specs[-1][1]))]
        lib["main"](*args)
        outputs[variant] = args[-1].numpy()
    reference = outputs["default"]
    scale = max(1.0, float(np.abs(reference).max(initial=0.0)))
    for variant in VARIANTS[1:]:
        err = float(np.abs(outputs[variant] - reference).max(initial=0.0)) / scale
        row[f"{variant}_max_rel_err"] = err
        row[f"{variant}_correct"] = bool(err <= 1e-5)
    row["changed"] = lowered_text(mod, target, "licm") != lowered_text(mod, target, "default")
    return row


def time_in_own_process(lib_path: Path, inputs_path: Path, output: tuple, repeat: int, min_repeat_ms: int) -> float:
    """Median latency (ms) of the library's "main", measured by a fresh Python process."""
    code = (
        "import sys, json, numpy as np, tvm\n"
        f"lib = tvm.runtime.load_module({str(lib_path)!r})\n"
        f"data = np.load({str(inputs_path)!r})\n"
        "args = [tvm.runtime.tensor(data[f'arr_{i}']) for i in range(len(data.files))]\n"
        f"args.append(tvm.runtime.tensor(np.zeros({tuple(output[0])!r}, {output[1]!r})))\n"
        "lib['main'](*args)\n"
        f"t = lib.time_evaluator('main', tvm.cpu(0), number=1, repeat={repeat}, min_repeat_ms={min_repeat_ms})\n"
        "r = sorted(t(*args).results)\n"
        "print(json.dumps(r[len(r) // 2] * 1e3))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    return float(done.stdout.strip().splitlines()[-1])


def measure(name: str, operator: str, mod: Any, target: Any, repeat: int, min_repeat_ms: int) -> dict:
    """One row: builds, checks, then times default, licm and hoist-expression, each in its own process."""
    row: dict[str, Any] = {"name": name, "operator": operator}
    try:
        with tempfile.TemporaryDirectory(prefix="altune-licm-") as tmp:
            folder = Path(tmp)
            row.update(build_variants(mod, target, folder, folder / "inputs.npz"))
            output = arg_specs(mod["main"])[-1]
            for variant in VARIANTS:
                row[f"{variant}_ms"] = time_in_own_process(folder / f"{variant}.so", folder / "inputs.npz", output,
                                                           repeat, min_repeat_ms)
    except Exception as e:  # noqa: BLE001 - one failing case is a row that says why, not the end of the run
        row["error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[-1][:300] if str(e).strip() else ''}"
    for variant in VARIANTS[1:]:
        if row.get("default_ms") and row.get(f"{variant}_ms"):
            row[f"{variant}_speedup"] = row["default_ms"] / row[f"{variant}_ms"]
    return row


# ---------------------------------------------------------------------------
# Summaries


def summarize(rows: list[dict], variant: str) -> dict:
    """Share faster/slower by more than 1%, geomean and max speedup, wrong results, per case and per operator."""
    timed = [r for r in rows if r.get(f"{variant}_speedup") is not None]
    speedups = [r[f"{variant}_speedup"] for r in timed]
    operators: dict[str, list[float]] = {}
    for r in timed:
        operators.setdefault(r["operator"], []).append(r[f"{variant}_speedup"])
    op_means = {op: sum(v) / len(v) for op, v in operators.items()}  # the paper's per-operator mean speedup
    return {
        "cases": len(rows),
        "timed": len(timed),
        "changed": sum(1 for r in timed if r.get("changed")),
        "faster": sum(1 for s in speedups if s > 1 + NOISE),
        "slower": sum(1 for s in speedups if s < 1 - NOISE),
        "wrong": sum(1 for r in rows if r.get(f"{variant}_correct") is False),
        "failed": sum(1 for r in rows if "error" in r),
        "geomean": geomean(speedups),
        "max": max(speedups, default=None),
        "min": min(speedups, default=None),
        "operators": len(op_means),
        "operators_faster": sorted(op for op, m in op_means.items() if m > 1 + NOISE),
        "operators_slower": sorted(op for op, m in op_means.items() if m < 1 - NOISE),
    }


def table(report: dict) -> str:
    lines = [f"Target: {report['target']}  (CPU: {report['environment'].get('cpu', '?')})", ""]
    for part in ("topi", "layouts"):
        rows = report[part]
        if not rows:
            continue
        lines.append(f"## {part}: {len(rows)} cases")
        lines.append(f"{'case':<58} {'default ms':>10} {'licm':>8} {'hoist':>8} {'changed':>7}")
        for r in rows:
            if "error" in r:
                lines.append(f"{r['name'][:58]:<58} error: {r['error'][:80]}")
                continue
            lines.append(f"{r['name'][:58]:<58} {r['default_ms']:>10.4f} {r.get('licm_speedup', 0):>7.3f}x "
                         f"{r.get('hoist-expression_speedup', 0):>7.3f}x {'yes' if r.get('changed') else 'no':>7}")
        for variant in VARIANTS[1:]:
            s = report["summary"][part][variant]
            if not s["timed"]:
                continue
            lines.append(
                f"{variant}: {s['faster']}/{s['timed']} cases faster by >1% ({100 * s['faster'] / s['timed']:.1f}%), "
                f"{s['slower']} slower by >1%, geomean {s['geomean']:.3f}x, max {s['max']:.3f}x, min {s['min']:.3f}x, "
                f"{s['wrong']} wrong, {s['failed']} failed; operators faster {len(s['operators_faster'])}/"
                f"{s['operators']} ({', '.join(s['operators_faster']) or '-'}), slower: "
                f"{', '.join(s['operators_slower']) or '-'}")
        lines.append("")
    return "\n".join(lines)


def run(cases: list[Case], layouts: bool, repeat: int, min_repeat_ms: int, target_name: str = "host",
        log: Callable[[str], None] = print) -> dict:
    """Measures the cases (and the quick suite's layouts) and returns the report."""
    target = resolve_target(target_name)
    topi_rows = []
    for i, case in enumerate(cases):
        try:
            mod = topi_program(case, target)
        except Exception as e:  # noqa: BLE001
            topi_rows.append({"name": case.name, "operator": case.operator, "error": f"{type(e).__name__}: {e}"})
            continue
        topi_rows.append(measure(case.name, case.operator, mod, target, repeat, min_repeat_ms))
        r = topi_rows[-1]
        log(f"[{i + 1}/{len(cases)}] {case.name}: " + (r.get("error") or
            f"{r['default_ms']:.4f} ms, licm {r.get('licm_speedup', 0):.3f}x, "
            f"hoist {r.get('hoist-expression_speedup', 0):.3f}x{'' if r.get('changed') else ' (unchanged)'}"))
    layout_rows = []
    if layouts:
        for name, layout, mod, task in layout_programs(target_name):
            layout_rows.append(measure(f"{name} [{layout}]", task.workload.operator, mod, task.target, repeat,
                                       min_repeat_ms))
            r = layout_rows[-1]
            log(f"{name} [{layout}]: " + (r.get("error") or f"{r['default_ms']:.4f} ms, licm {r['licm_speedup']:.3f}x"))
    report = {"benchmark": "licm", "target": target_key(target_name), "topi": topi_rows, "layouts": layout_rows,
              "environment": environment(), "repeat": repeat, "min_repeat_ms": min_repeat_ms}
    report["summary"] = {part: {v: summarize(report[part], v) for v in VARIANTS[1:]} for part in ("topi", "layouts")}
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.licm", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"only {len(QUICK_CASES)} TOPI cases and no layouts")
    parser.add_argument("--cases", help="only the TOPI cases whose name contains this")
    parser.add_argument("--no-layouts", action="store_true", help="skip the quick suite's layouts")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--min-repeat-ms", type=int, default=100)
    parser.add_argument("--out", type=Path, help="where to write the JSON report (default bench/results/licm-CPU.json)")
    args = parser.parse_args(argv)

    cases = [c for c in CASES if (not args.quick or c.name in QUICK_CASES) and (not args.cases or args.cases in c.name)]
    report = run(cases, not (args.quick or args.no_layouts), args.repeat, args.min_repeat_ms,
                 log=lambda line: print(line, flush=True))
    out = args.out or RESULTS_DIR / f"licm-{host_cpu()}{'-quick' if args.quick else ''}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    print(table(report))
    print(f"report written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
