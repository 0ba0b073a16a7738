"""Subgraph workloads: chains of complex operators a user submits as one operator, tuned as one fused
program by `compiler.passes.basteln` (conv3x3 -> conv1x1, depthwise -> pointwise as in MobileNet,
pad -> conv -> bias -> relu, and attention's matmul -> softmax -> matmul).

A `Subgraph` offers what the service and the tuner use of a catalog `Workload` (key, inputs, output,
flops, `prim_func`, `random_inputs`, `reference`); `compiler.workloads.make_workload` returns one for
the names in `SUBGRAPHS`. Each program is built in TE with every operator a stage of its own (the
unfused program), so the fusion is the pass's, not the definition's.

Layering: `compiler` never imports `tuner` or `service`; TVM and torch are imported inside functions.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from compiler.arrays import random_inputs

from .spec import OperatorDef, Param, TensorSpec, WorkloadError

if TYPE_CHECKING:
    import numpy as np
    import tvm


def _p(name: str, lo: int, hi: int, default: int | None, what: str) -> Param:
    return Param(name, lo, hi, default, what)


_BATCH = _p("batch", 1, 64, 1, "batch size N")
_HW = (_p("height", 1, 4096, None, "input height"), _p("width", 1, 4096, None, "input width"))

SUBGRAPHS: dict[str, OperatorDef] = {
    op.name: op
    for op in (
        OperatorDef("conv3x3_conv1x1", "subgraph: conv 3x3 (pad 1) -> relu -> conv 1x1 -> relu, NCHW",
                    (_BATCH, _p("in_channels", 1, 4096, None, "input channels"), *_HW,
                     _p("mid_channels", 1, 4096, None, "channels between the two convs"),
                     _p("out_channels", 1, 4096, None, "output channels"))),
        OperatorDef("depthwise_pointwise", "subgraph: depthwise conv (pad k//2) -> relu -> pointwise conv 1x1 -> relu "
                    "(MobileNet's separable conv), NCHW",
                    (_BATCH, _p("channels", 1, 4096, None, "input channels"), *_HW,
                     _p("out_channels", 1, 4096, None, "output channels"),
                     _p("kernel", 1, 7, 3, "depthwise kernel size (odd)"))),
        OperatorDef("pad_conv_bias_relu", "subgraph: zero padding -> conv -> bias -> relu, NCHW",
                    (_BATCH, _p("in_channels", 1, 4096, None, "input channels"), *_HW,
                     _p("out_channels", 1, 4096, None, "output channels"),
                     _p("kernel", 1, 11, 3, "kernel size (square)"), _p("padding", 0, 5, 1, "zero padding"))),
        OperatorDef("matmul_softmax_matmul", "subgraph: attention, softmax(Q K^T / sqrt(dim)) V per head",
                    (_p("heads", 1, 256, 1, "batch x heads"), _p("seq", 1, 4096, None, "sequence length"),
                     _p("dim", 1, 1024, None, "head dimension"))),
    )
}


@dataclass(frozen=True)
class _Def:
    check: Callable[[dict[str, int]], None]
    inputs: Callable[[dict[str, int]], list[tuple[str, tuple[int, ...]]]]
    output: Callable[[dict[str, int]], tuple[int, ...]]
    flops: Callable[[dict[str, int]], int]
    te: Callable[[dict[str, int], list[Any]], Any]
    reference: Callable[[dict[str, int], list[Any]], Any]


def _relu(t: Any, name: str) -> Any:
    from tvm import te, tirx  # heavy: subgraphs are made and keyed without TVM or torch (the API)

    return te.compute(t.shape, lambda *i: tirx.max(t(*i), tirx.const(0, t.dtype)), name=name)


def _conv(data: Any, weight: Any, padding: int, name: str, depthwise: bool = False) -> Any:
    """NCHW x OIHW conv with stride 1, its padding a stage of its own (`<name>_pad`); stage names are unique
    in the subgraph, so that layouts can be asked for per operator (`compiler.layout.subgraph_layout`)."""
    from tvm import te, topi  # heavy: subgraphs are made and keyed without TVM or torch (the API)

    n, c, h, w = (int(d) for d in data.shape)
    o, i, kh, kw = (int(d) for d in weight.shape)
    padded = topi.nn.pad(data, (0, 0, padding, padding), (0, 0, padding, padding), name=f"{name}_pad") if padding else data
    ry, rx = te.reduce_axis((0, kh), f"{name}_ry"), te.reduce_axis((0, kw), f"{name}_rx")
    shape = (n, o, h + 2 * padding - kh + 1, w + 2 * padding - kw + 1)
    if depthwise:
        return te.compute(shape, lambda b, k, y, x: te.sum(padded[b, k, y + ry, x + rx] * weight[k, 0, ry, rx],
                                                           axis=[ry, rx]), name=name)
    rc = te.reduce_axis((0, i), f"{name}_rc")
    return te.compute(shape, lambda b, k, y, x: te.sum(padded[b, rc, y + ry, x + rx] * weight[k, rc, ry, rx],
                                                       axis=[rc, ry, rx]), name=name)


def _c33_te(p: dict[str, int], xs: list[Any]) -> Any:
    x, w1, w2 = xs
    mid = _relu(_conv(x, w1, 1, "conv3x3"), "relu1")
    return _relu(_conv(mid, w2, 0, "conv1x1"), "relu2")


def _c33_ref(p: dict[str, int], xs: list[Any]) -> Any:
    import torch.nn.functional as F  # heavy: subgraphs are made and keyed without TVM or torch (the API)

    x, w1, w2 = xs
    return F.relu(F.conv2d(F.relu(F.conv2d(x, w1, padding=1)), w2))


def _dwpw_te(p: dict[str, int], xs: list[Any]) -> Any:
    x, wd, wp = xs
    k = p["kernel"]
    dw = _conv(x, wd, k // 2, "depthwise", depthwise=True)
    return _relu(_conv(_relu(dw, "relu1"), wp, 0, "pointwise"), "relu2")


def _dwpw_ref(p: dict[str, int], xs: list[Any]) -> Any:
    import torch.nn.functional as F  # heavy: subgraphs are made and keyed without TVM or torch (the API)

    x, wd, wp = xs
    k = p["kernel"]
    return F.relu(F.conv2d(F.relu(F.conv2d(x, wd, padding=k // 2, groups=p["channels"])), wp))


def _pcbr_te(p: dict[str, int], xs: list[Any]) -> Any:
    from tvm import te, topi  # heavy: subgraphs are made and keyed without TVM or torch (the API)

    x, w, b = xs
    pad = p["padding"]
    padded = topi.nn.pad(x, (0, 0, pad, pad), (0, 0, pad, pad), name="pad")
    conv = _conv(padded, w, 0, "conv")
    biased = te.compute(conv.shape, lambda n, c, h, w_: conv[n, c, h, w_] + b[c], name="bias_add")
    return _relu(biased, "relu")


def _pcbr_ref(p: dict[str, int], xs: list[Any]) -> Any:
    import torch.nn.functional as F  # heavy: subgraphs are made and keyed without TVM or torch (the API)

    x, w, b = xs
    return F.relu(F.conv2d(x, w, b, padding=p["padding"]))


def _attn_te(p: dict[str, int], xs: list[Any]) -> Any:
    from tvm import te, tirx  # heavy: subgraphs are made and keyed without TVM or torch (the API)

    q, k, v = xs
    heads, seq, dim = p["heads"], p["seq"], p["dim"]
    scale = tirx.const(1.0 / math.sqrt(dim), q.dtype)
    d = te.reduce_axis((0, dim), "d")
    s = te.compute((heads, seq, seq), lambda b, i, j: te.sum(q[b, i, d] * k[b, j, d], axis=d), name="scores")
    j = te.reduce_axis((0, seq), "j")
    mx = te.compute((heads, seq), lambda b, i: te.max(s[b, i, j], axis=j), name="row_max")
    ex = te.compute((heads, seq, seq), lambda b, i, j_: tirx.exp((s[b, i, j_] - mx[b, i]) * scale), name="exp")
    j2 = te.reduce_axis((0, seq), "j2")
    sm = te.compute((heads, seq), lambda b, i: te.sum(ex[b, i, j2], axis=j2), name="row_sum")
    pr = te.compute((heads, seq, seq), lambda b, i, j_: ex[b, i, j_] / sm[b, i], name="probs")
    j3 = te.reduce_axis((0, seq), "j3")
    return te.compute((heads, seq, dim), lambda b, i, e: te.sum(pr[b, i, j3] * v[b, j3, e], axis=j3), name="attend")


def _attn_ref(p: dict[str, int], xs: list[Any]) -> Any:
    import torch  # heavy: subgraphs are made and keyed without TVM or torch (the API)

    q, k, v = xs
    return torch.softmax(q @ k.transpose(1, 2) / math.sqrt(p["dim"]), dim=-1) @ v


def _need(cond: bool, field_: str, message: str) -> None:
    if not cond:
        raise WorkloadError(field_, message)


def _dw_check(p: dict[str, int]) -> None:
    _need(p["kernel"] % 2 == 1, "params.kernel", f"kernel={p['kernel']} must be odd (the output keeps the input size)")


def _pcbr_check(p: dict[str, int]) -> None:
    for axis in ("height", "width"):
        _need(p[axis] + 2 * p["padding"] >= p["kernel"], f"params.{axis}",
              f"{axis}={p[axis]} with padding {p['padding']} is smaller than the kernel {p['kernel']}")


def _nchw(p: dict[str, int], c: int) -> tuple[int, ...]:
    return (p["batch"], c, p["height"], p["width"])


def _pcbr_out(p: dict[str, int]) -> tuple[int, ...]:
    k, pad = p["kernel"], p["padding"]
    return (p["batch"], p["out_channels"], p["height"] + 2 * pad - k + 1, p["width"] + 2 * pad - k + 1)


_DEFS: dict[str, _Def] = {
    "conv3x3_conv1x1": _Def(
        lambda p: None,
        lambda p: [("data", _nchw(p, p["in_channels"])), ("weight1", (p["mid_channels"], p["in_channels"], 3, 3)),
                   ("weight2", (p["out_channels"], p["mid_channels"], 1, 1))],
        lambda p: _nchw(p, p["out_channels"]),
        lambda p: 2 * p["batch"] * p["height"] * p["width"] * p["mid_channels"] * (9 * p["in_channels"] + p["out_channels"]),
        _c33_te, _c33_ref),
    "depthwise_pointwise": _Def(
        _dw_check,
        lambda p: [("data", _nchw(p, p["channels"])), ("weight_dw", (p["channels"], 1, p["kernel"], p["kernel"])),
                   ("weight_pw", (p["out_channels"], p["channels"], 1, 1))],
        lambda p: _nchw(p, p["out_channels"]),
        lambda p: 2 * p["batch"] * p["height"] * p["width"] * p["channels"] * (p["kernel"] ** 2 + p["out_channels"]),
        _dwpw_te, _dwpw_ref),
    "pad_conv_bias_relu": _Def(
        _pcbr_check,
        lambda p: [("data", _nchw(p, p["in_channels"])),
                   ("weight", (p["out_channels"], p["in_channels"], p["kernel"], p["kernel"])),
                   ("bias", (p["out_channels"],))],
        _pcbr_out,
        lambda p: 2 * math.prod(_pcbr_out(p)) * p["in_channels"] * p["kernel"] ** 2,
        _pcbr_te, _pcbr_ref),
    "matmul_softmax_matmul": _Def(
        lambda p: None,
        lambda p: [(n, (p["heads"], p["seq"], p["dim"])) for n in ("query", "key", "value")],
        lambda p: (p["heads"], p["seq"], p["dim"]),
        lambda p: 4 * p["heads"] * p["seq"] * p["seq"] * p["dim"],
        _attn_te, _attn_ref),
}
assert set(_DEFS) == set(SUBGRAPHS), f"{sorted(_DEFS)=} != {sorted(SUBGRAPHS)=}"


@dataclass(frozen=True, eq=False)
class Subgraph:
    """One subgraph instance: shapes, a content key, the unfused TE program and its torch reference.

    Equality and hashing follow `key`; `prim_func` is built on first access (it needs TVM).
    """

    operator: str
    params: dict[str, int]
    dtype: str
    key: str
    inputs: tuple[TensorSpec, ...]
    output: TensorSpec
    flops: int
    epilogue: str = field(default="none")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Subgraph) and other.key == self.key

    def __hash__(self) -> int:
        return hash(self.key)

    @property
    def args(self) -> tuple[TensorSpec, ...]:
        """All arguments of `prim_func` in call order: inputs, then the output."""
        return (*self.inputs, self.output)

    def te_tensors(self) -> tuple[list[Any], Any]:
        """The TE graph: the placeholders in call order and the output, one stage per operator (unique names)."""
        from tvm import te  # heavy: subgraphs are made and keyed without TVM or torch (the API)

        placeholders = [te.placeholder(s.shape, s.dtype, name=s.name) for s in self.inputs]
        out = _DEFS[self.operator].te(self.params, placeholders)
        assert tuple(int(d) for d in out.shape) == self.output.shape, (
            f"{self.operator}: TE output shape {tuple(out.shape)} != expected {self.output.shape}")
        return placeholders, out

    @functools.cached_property
    def prim_func(self) -> tvm.tirx.PrimFunc:
        """The unfused program (global_symbol "main"): one block per operator stage."""
        from tvm import te  # heavy: subgraphs are made and keyed without TVM or torch (the API)

        placeholders, out = self.te_tensors()
        return te.create_prim_func([*placeholders, out]).with_attr("global_symbol", "main")

    def random_inputs(self, seed: int = 0) -> list[np.ndarray]:
        """Uniform [-1, 1) inputs in call order, reproducible from `seed` (`compiler.arrays.random_inputs`)."""
        return random_inputs([(tuple(s.shape), s.dtype) for s in self.inputs], seed)

    def reference(self, inputs: list[np.ndarray]) -> np.ndarray:
        """Computes the subgraph with torch: the ground truth every candidate is checked against."""
        import torch  # heavy: subgraphs are made and keyed without TVM or torch (the API)

        assert len(inputs) == len(self.inputs), f"{len(inputs)=} != {len(self.inputs)=}"
        with torch.no_grad():
            out = _DEFS[self.operator].reference(self.params, [torch.from_numpy(a) for a in inputs]).numpy()
        assert out.shape == self.output.shape, f"{out.shape=} != {self.output.shape=}"
        return out


def make_subgraph(operator: str, params: dict[str, int], dtype: str, epilogue: str, key: str) -> Subgraph:
    """The subgraph `operator` with normalized `params` (`compiler.workloads.validate` checked them)."""
    subgraph_shapes(operator, params, epilogue)
    d = _DEFS[operator]
    inputs = tuple(TensorSpec(name, shape, dtype) for name, shape in d.inputs(params))
    return Subgraph(operator, params, dtype, key, inputs, TensorSpec("output", d.output(params), dtype), d.flops(params))


def subgraph_shapes(operator: str, params: dict[str, int], epilogue: str = "none") -> list[tuple[str, tuple[int, ...]]]:
    """Every tensor of the subgraph (inputs, then "output") with its shape, for the size limit.

    Raises:
        WorkloadError: an epilogue was asked for (a subgraph carries its own) or the parameters do not fit.
    """
    if epilogue != "none":
        raise WorkloadError("epilogue", f"{operator} carries its own epilogue; give epilogue 'none', not {epilogue!r}")
    d = _DEFS[operator]
    d.check(params)
    return [*d.inputs(params), ("output", d.output(params))]
