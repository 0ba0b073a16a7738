"""Operators in the forms the tensor instructions want, and default schedules that mark them: GEMM and NHWC
conv2d (fp32, u8 x i8 -> i32, bf16 -> fp32) and element-wise add/sub/mul/relu, on any shape (55x55, 255
channels, 127: shapes that do not divide the instruction).

The layouts are the instructions' (ALIGN of Alg. 1 at the layout level): weights are packed
`[ceil(N/L), ceil(K/G), L, G]` (GEMM) or `[ceil(F/L), KH, KW, ceil(C/G), L, G]` (conv2d), zero padded to
whole vectors and groups, as TVM's and oneDNN's VNNI kernels pack them; `pack_gemm_weight` /
`pack_conv_weight` do it in numpy, once per weight. conv2d reads an input padded by a stage of its own
(COM of Alg. 1: the enlarged input leaves the window reduction without a boundary branch), its channels to
whole groups too; a GEMM whose K is no multiple of the group reads A through a zero-padded copy of whole
groups (`A_pad`), so the reduction has no group remainder (K = 255 with VNNI's groups of 4: 64 whole groups,
the last one's fourth product 0 x 0) and every iteration takes the instruction.

The default schedule (`schedule_*`) is what the search starts from: a register block of `rows` x `vectors`
vectors of the target's lanes, the reduction loop marked for an outer-product instruction, the outer rows loop
parallel; the tuner may mark elsewhere and choose other blocks.

Layering: `compiler` never imports `tuner` or `service`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np
from tvm import s_tir, te

from ...target import vector_unit
from .instructions import choose, target_arch
from .mark import mark

if TYPE_CHECKING:
    import tvm

DType = Literal["float32", "int8", "bfloat16"]
DTYPES: tuple[DType, ...] = ("float32", "int8", "bfloat16")
# (A, B, C) storage types of each job dtype: int8 is u8 activations x s8 weights (x86's VNNI form)
OPERANDS = {"float32": ("float32", "float32", "float32"), "int8": ("uint8", "int8", "int32"),
            "bfloat16": ("bfloat16", "bfloat16", "float32")}
GROUP = {"float32": 1, "int8": 4, "bfloat16": 2}


def operands(target: tvm.target.Target, dtype: DType) -> tuple[str, str, str]:
    """(A, B, C) storage types of a `dtype` job on `target`: int8 is u8 x s8 on x86 (VNNI, vpmaddubsw take
    unsigned activations), s8 x s8 on AArch64 (sdot)."""
    if dtype == "int8" and target_arch(target) == "aarch64":
        return ("int8", "int8", "int32")
    return OPERANDS[dtype]


@dataclass(frozen=True)
class Blocking:
    """The register block of an outer-product schedule: `rows` accumulator rows of one `lanes` vector, the
    reduction split by `group`."""

    lanes: int
    group: int
    rows: int
    vectors: int = 1  # vectors of lanes per row (columns of the register block: vectors x lanes)
    k_block: int = 0  # the reduction split into blocks of this many (0: not split)


def blocking(target: tvm.target.Target, dtype: DType, exact: bool = False) -> Blocking:
    """The default register block for `target`: its preferred instruction's lanes (fp32 lanes where it has
    none for `dtype`: the schedule is then left to LLVM), two vectors per row (each broadcast of A serves
    two FMAs: ~25% faster than one on the 512^3 GEMM here), as many rows as leave two registers spare
    (AVX-512 12 x 32, AVX2 5 x 16, NEON 12 x 8).

    Args:
        exact: the preferred instruction that never saturates, whatever its group (on a CPU without VNNI,
            int8 gets `vpmaddwd`'s pairs rather than `vpmaddubsw`'s groups of 4, which are exact only for
            activations below 128); otherwise the preferred one of the dtype's usual group (`GROUP`).
    """
    a, b, c = operands(target, dtype)
    ins = choose(target, a, b, c, None, exact=True) if exact else choose(target, a, b, c, GROUP[dtype])
    unit = vector_unit(target)
    lanes = ins.lanes if ins is not None else unit.lanes
    vectors = 2
    rows = max(1, min(12, (unit.accumulators - 2) // vectors))
    return Blocking(lanes=lanes, group=ins.group if ins is not None else GROUP[dtype], rows=rows, vectors=vectors)


def ceil_to(n: int, m: int) -> int:
    return (n + m - 1) // m * m


# ---------------------------------------------------------------------------
# GEMM: C[M, N] = A[M, K] x B[K, N]


def gemm(m: int, n: int, k: int, dtype: DType, lanes: int, packed: bool = True,
         types: tuple[str, str, str] | None = None, group: int | None = None) -> tvm.tirx.PrimFunc:
    """GEMM as a PrimFunc (A, B or its packed form, C).

    Args:
        lanes, group: the lanes and group of the packed weight (`pack_gemm_weight`; group `GROUP[dtype]`
            by default).
        packed: B packed (always for int8 and bf16); fp32 B[K, N] as it is where False.
        types: (A, B, C) storage types (default `OPERANDS[dtype]`; see `operands`).
    """
    a_t, b_t, c_t = types or OPERANDS[dtype]
    g = group or GROUP[dtype]
    A = te.placeholder((m, k), a_t, name="A")
    r = te.reduce_axis((0, k), name="k")
    if dtype == "float32" and not packed:
        B = te.placeholder((k, n), b_t, name="B")
        C = te.compute((m, n), lambda i, j: te.sum(A[i, r] * B[r, j], axis=r), name="C")
    else:
        B = te.placeholder((ceil_to(n, lanes) // lanes, ceil_to(k, g) // g, lanes, g), b_t, name="B")
        source = A
        if k % g:  # COM: the reduction over whole groups of a zero-padded copy of A (B's padding is zero too)
            r = te.reduce_axis((0, ceil_to(k, g)), name="k")
            source = te.compute((m, ceil_to(k, g)), lambda i, kk: te.if_then_else(kk < k, A[i, kk], te.const(0, a_t)),
                                name="A_pad")
        C = te.compute((m, n), lambda i, j: te.sum(
            source[i, r].astype(c_t) * B[j // lanes, r // g, j % lanes, r % g].astype(c_t), axis=r), name="C")
    return te.create_prim_func([A, B, C])


def pack_gemm_weight(b: np.ndarray, lanes: int, group: int) -> np.ndarray:
    """B[K, N] -> [ceil(N/L), ceil(K/G), L, G], zero padded."""
    k, n = b.shape
    padded = np.zeros((ceil_to(k, group), ceil_to(n, lanes)), dtype=b.dtype)
    padded[:k, :n] = b
    return np.ascontiguousarray(padded.reshape(ceil_to(k, group) // group, group, ceil_to(n, lanes) // lanes, lanes)
                                .transpose(2, 0, 3, 1))


def schedule_gemm(func: tvm.tirx.PrimFunc, block: Blocking, marked: bool = True) -> tvm.IRModule:
    """The outer-product schedule: i -> (io parallel, ii = rows), j -> (jo, jl = lanes), k -> (ko, kg = group);
    order io, jo, ko, ii, jl, kg; the init decomposed out; ko marked; A's zero-padded copy (`gemm`), where there
    is one, computed per block of rows."""
    sch = s_tir.Schedule(func)
    c = sch.get_sblock("C")
    i, j, k = sch.get_loops(c)
    io, ii = sch.split(i, [None, block.rows])
    jo, *jv = sch.split(j, [None, block.lanes] if block.vectors == 1 else [None, block.vectors, block.lanes])
    jl = jv.pop()
    outer = [io, jo]
    if block.k_block and block.k_block < int(sch.get(k).extent):
        kb, k = sch.split(k, [None, block.k_block])
        outer = [jo, kb, io] if block.group == 1 else [io, jo, kb]
    if block.group > 1:
        ko, kg = sch.split(k, [None, block.group])
        sch.reorder(*outer, ko, ii, *jv, jl, kg)
    else:
        ko = k
        sch.reorder(*outer, ko, ii, *jv, jl)
    sch.parallel(outer[0])
    sch.decompose_reduction(c, outer[1] if len(outer) == 3 else ko)
    if any(sch.get(b).name_hint == "A_pad" for b in sch.get_producers(c)):
        sch.compute_at(sch.get_sblock("A_pad"), io)  # each parallel block of rows pads its own rows
    if marked:
        mark(sch, ko, "outer_product")
    return sch.mod


# ---------------------------------------------------------------------------
# conv2d, NHWC, stride 1, "same" padding: out[n, h, w, f] = sum data[n, h+rh, w+rw, c] * weight[rh, rw, c, f]


def conv2d(n: int, h: int, w: int, c: int, f: int, kernel: int, dtype: DType, lanes: int,
           types: tuple[str, str, str] | None = None, packed: bool = True, group: int | None = None
           ) -> tvm.tirx.PrimFunc:
    """conv2d as a PrimFunc (data, weight or its packed form, out); the input is padded by a stage "pad".

    Args:
        packed: the weight packed (`pack_conv_weight`; always for int8 and bf16); fp32 HWIO where False.
        group: the packed weight's group (`GROUP[dtype]` by default).
    """
    a_t, b_t, c_t = types or OPERANDS[dtype]
    g = group or GROUP[dtype]
    pad = kernel // 2
    data = te.placeholder((n, h, w, c), a_t, name="data")
    # the packed forms reduce over whole groups: the channels padded with zeros too (COM)
    channels = c if dtype == "float32" and not packed else ceil_to(c, g)
    padded = te.compute((n, h + 2 * pad, w + 2 * pad, channels), lambda b, y, x, ch: te.if_then_else(
        te.all(y >= pad, y < h + pad, x >= pad, x < w + pad, ch < c), data[b, y - pad, x - pad, ch],
        te.const(0, a_t)), name="pad")
    rh = te.reduce_axis((0, kernel), name="rh")
    rw = te.reduce_axis((0, kernel), name="rw")
    rc = te.reduce_axis((0, channels), name="rc")
    if dtype == "float32" and not packed:
        weight = te.placeholder((kernel, kernel, c, f), b_t, name="weight")
        out = te.compute((n, h, w, f), lambda b, y, x, o: te.sum(
            padded[b, y + rh, x + rw, rc] * weight[rh, rw, rc, o], axis=[rh, rw, rc]), name="conv")
    else:
        weight = te.placeholder((ceil_to(f, lanes) // lanes, kernel, kernel, ceil_to(c, g) // g, lanes, g), b_t,
                                name="weight")
        out = te.compute((n, h, w, f), lambda b, y, x, o: te.sum(
            padded[b, y + rh, x + rw, rc].astype(c_t)
            * weight[o // lanes, rh, rw, rc // g, o % lanes, rc % g].astype(c_t), axis=[rh, rw, rc]), name="conv")
    return te.create_prim_func([data, weight, out])


def pack_conv_weight(weight: np.ndarray, lanes: int, group: int) -> np.ndarray:
    """weight[KH, KW, C, F] -> [ceil(F/L), KH, KW, ceil(C/G), L, G], zero padded."""
    kh, kw, c, f = weight.shape
    cp, fp = ceil_to(c, group), ceil_to(f, lanes)
    padded = np.zeros((kh, kw, cp, fp), dtype=weight.dtype)
    padded[:, :, :c, :f] = weight
    return np.ascontiguousarray(padded.reshape(kh, kw, cp // group, group, fp // lanes, lanes)
                                .transpose(4, 0, 1, 2, 5, 3))


def schedule_conv2d(func: tvm.tirx.PrimFunc, block: Blocking, marked: bool = True) -> tvm.IRModule:
    """The outer-product schedule of conv2d: w -> (wo, wi = rows), f -> (fo, fl = lanes), rc -> (rco, rcg);
    order n, h (parallel), fo, wo, rh, rw, rco, wi, fl, rcg; rco marked; the pad stage computed at h."""
    sch = s_tir.Schedule(func)
    conv = sch.get_sblock("conv")
    b, y, x, o, rh, rw, rc = sch.get_loops(conv)
    xo, xi = sch.split(x, [None, block.rows])
    fo, *fv = sch.split(o, [None, block.lanes] if block.vectors == 1 else [None, block.vectors, block.lanes])
    fl = fv.pop()
    if block.group > 1:
        rco, rcg = sch.split(rc, [None, block.group])
        sch.reorder(b, y, fo, xo, rh, rw, rco, xi, *fv, fl, rcg)
    else:
        rco = rc
        sch.reorder(b, y, fo, xo, rh, rw, rco, xi, *fv, fl)
    sch.parallel(sch.fuse(b, y))
    sch.decompose_reduction(conv, rh)
    if marked:
        mark(sch, rco, "outer_product")
    return sch.mod


# ---------------------------------------------------------------------------
# element-wise


ELEMENTWISE = ("add", "sub", "mul", "relu")


def elementwise(op: str, shape: tuple[int, ...], dtype: str = "float32") -> tvm.tirx.PrimFunc:
    """`op` ("add", "sub", "mul": two inputs; "relu": one) over `shape`."""
    if op not in ELEMENTWISE:
        raise ValueError(f"unknown element-wise operator: {op!r} (one of {', '.join(ELEMENTWISE)})")
    x = te.placeholder(shape, dtype, name="x")
    if op == "relu":
        out = te.compute(shape, lambda *i: te.max(x(*i), te.const(0, dtype)), name="out")
        return te.create_prim_func([x, out])
    y = te.placeholder(shape, dtype, name="y")
    fn = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b}[op]
    out = te.compute(shape, lambda *i: fn(x(*i), y(*i)), name="out")
    return te.create_prim_func([x, y, out])


def schedule_elementwise(func: tvm.tirx.PrimFunc, lanes: int, marked: bool = True) -> tvm.IRModule:
    """The innermost loop split by `lanes` (its remainder guarded), the inner part marked "elementwise",
    the outermost loop parallel."""
    sch = s_tir.Schedule(func)
    blk = sch.get_sblock("out")
    loops = sch.get_loops(blk)
    wo, wl = sch.split(loops[-1], [None, lanes])
    if len(loops) > 1:
        sch.parallel(loops[0])
    if marked:
        mark(sch, wl, "elementwise")
    return sch.mod
