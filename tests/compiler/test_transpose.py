"""Layout conversions as in-register transposes (`compiler.passes.tensorize.transpose`): scheduled, matched,
rewritten to loads, shuffles and stores, and equal to numpy, on shapes that do not divide the lanes too."""

from __future__ import annotations

import numpy as np
import pytest

tvm = pytest.importorskip("tvm")

from tvm import s_tir, te, tirx  # noqa: E402

from compiler.build import build  # noqa: E402
from compiler.passes.tensorize import schedule_transpose, tensorize_module  # noqa: E402
from compiler.target import vector_unit  # noqa: E402


def _lanes(target) -> int:
    return vector_unit(target).lanes


def _run(func, target, inputs, out_shape, dtype="float32"):
    out = tvm.runtime.tensor(np.zeros(out_shape, dtype))
    build(tvm.IRModule({"main": func}), target)["main"](*[tvm.runtime.tensor(x) for x in inputs], out)
    return out.numpy()


def _scheduled(func):
    sch = s_tir.Schedule(func)
    block = sch.get_child_blocks(sch.get_sblock("root"))[0]
    return sch, block, list(sch.get_loops(block))


@pytest.mark.parametrize("width", [32, 20])  # 20: the partition's remainder piece, a lanes x 4 tile
def test_blocked_to_nchw_with_relu_becomes_a_transpose(width, host_target):
    lanes = _lanes(host_target)
    c, h = 2 * lanes, 3
    x = te.placeholder((h, width, c // lanes, lanes), name="x")
    y = te.compute((c, h, width), lambda ci, hi, wi: tirx.max(x[hi, wi, ci // lanes, ci % lanes],
                                                              tirx.const(0, "float32")), name="convert")
    sch, block, loops = _scheduled(te.create_prim_func([x, y]).with_attr("global_symbol", "main"))
    assert schedule_transpose(sch, block, loops, lanes)
    _, reports = tensorize_module(sch.mod, host_target)
    assert reports["main"].used == [f"transpose{lanes}"] * (1 if width % lanes == 0 else 2), reports["main"]
    data = np.random.default_rng(0).standard_normal((h, width, c // lanes, lanes)).astype("float32")
    want = np.maximum(data.transpose(2, 3, 0, 1).reshape(c, h, width), 0)
    np.testing.assert_array_equal(_run(sch.mod["main"], host_target, [data], (c, h, width)), want)


def test_nchw_to_blocked_with_a_cast_becomes_a_transpose(host_target):
    lanes = _lanes(host_target)
    c, h, w = 2 * lanes, 2, 3 * lanes
    x = te.placeholder((c, h, w), name="x", dtype="int32")
    y = te.compute((h, w, c // lanes, lanes), lambda hi, wi, cb, cl: x[cb * lanes + cl, hi, wi].astype("float32"),
                   name="convert")
    sch, block, loops = _scheduled(te.create_prim_func([x, y]).with_attr("global_symbol", "main"))
    assert schedule_transpose(sch, block, loops, lanes)
    _, reports = tensorize_module(sch.mod, host_target)
    assert reports["main"].used == [f"transpose{lanes}"], reports["main"]
    data = np.random.default_rng(1).integers(-1000, 1000, (c, h, w)).astype("int32")
    want = data.reshape(c // lanes, lanes, h, w).transpose(2, 3, 0, 1).astype("float32")
    np.testing.assert_array_equal(_run(sch.mod["main"], host_target, [data], want.shape), want)


# 13: a padded row of 15, no multiple of any lane count; fused: the rows and columns one parallel loop, where
# the partition cannot decide the padding (`fused % 3`): each tile checks it at its corners instead
@pytest.mark.parametrize("width,fused", [(14, False), (13, False), (13, True)])
def test_a_padded_conversion_transposes_its_inner_tiles_and_stores_zeros_at_the_border(width, fused, host_target):
    """A padded conv's input in a blocked layout (`N C H W` -> `N H+2 W+2 C/L L`, zero borders): the padding's
    `if_then_else` is scheduled like a copy, the partition splits rows and columns where it is decided, the
    inner tiles are transposes and the border rows stores of zero; equal to numpy's `pad`."""
    lanes = _lanes(host_target)
    c, h = 2 * lanes, 3
    x = te.placeholder((c, h, width), name="x")
    y = te.compute((h + 2, width + 2, c // lanes, lanes), lambda hi, wi, cb, cl: tirx.if_then_else(
        tirx.all(1 <= hi, hi < h + 1, 1 <= wi, wi < width + 1), x[cb * lanes + cl, hi - 1, wi - 1],
        tirx.const(0, "float32")), name="pad")
    sch, block, loops = _scheduled(te.create_prim_func([x, y]).with_attr("global_symbol", "main"))
    assert schedule_transpose(sch, block, loops, lanes)
    if fused:
        outer = sch.get_loops(block)[:-2]
        sch.parallel(sch.fuse(*outer))
    _, reports = tensorize_module(sch.mod, host_target)
    used = reports["main"].used
    assert used and set(used) == {f"transpose{lanes}"}, reports["main"]
    data = np.random.default_rng(2).standard_normal((c, h, width)).astype("float32")
    want = np.pad(data, ((0, 0), (1, 1), (1, 1))).reshape(c // lanes, lanes, h + 2, width + 2).transpose(2, 3, 0, 1)
    np.testing.assert_array_equal(_run(sch.mod["main"], host_target, [data], want.shape), want)


def test_a_copy_that_does_not_transpose_is_left_to_the_caller(host_target):
    lanes = _lanes(host_target)
    x = te.placeholder((4, 4 * lanes), name="x")
    y = te.compute(x.shape, lambda i, j: x[i, j] + x[i, j], name="copy")
    sch, block, loops = _scheduled(te.create_prim_func([x, y]).with_attr("global_symbol", "main"))
    assert not schedule_transpose(sch, block, loops, lanes)  # two loads, and no transpose
    z = te.compute(x.shape, lambda i, j: x[i, j], name="copy")
    sch, block, loops = _scheduled(te.create_prim_func([x, z]).with_attr("global_symbol", "main"))
    assert not schedule_transpose(sch, block, loops, lanes)  # both contiguous in j


def test_a_layouts_own_domain_back_to_nchw_transposes_its_rectangular_tiles(host_target):
    """The loop space's output conversion iterates the layout's domain (`N H W/14 O/b 14 b`, the column and the
    channel each split in two variables): the tiles are b x 14, loaded 14 rows of b lanes and stored b columns
    of 14 lanes (b x 8 and b x 6 where b is 8)."""
    lanes = _lanes(host_target)
    c, h, w = 2 * lanes, 2, 28
    # written as the layout rewriter writes it: one block over the layout's domain storing into N C H W
    from tvm.script import tirx as T

    @T.prim_func(s_tir=True)
    def convert(a: T.Buffer((1, h, w // 14, c // lanes, 14, lanes), "float32"),
                b: T.Buffer((1, c, h, w), "float32")):
        T.func_attr({"global_symbol": "main", "tirx.noalias": True})
        for v0, v1, v2, v3, v4, v5 in T.grid(1, h, w // 14, c // lanes, 14, lanes):
            with T.sblock("convert"):
                n, hi, wo, co, wi, ci = T.axis.remap("SSSSSS", [v0, v1, v2, v3, v4, v5])
                b[n, co * lanes + ci, hi, wo * 14 + wi] = T.max(
                    a[n, hi, (wo * 14 + wi) // 14, (co * lanes + ci) // lanes, (wo * 14 + wi) % 14,
                      (co * lanes + ci) % lanes], T.float32(0))

    sch, block, loops = _scheduled(convert)
    assert schedule_transpose(sch, block, loops, lanes)
    _, reports = tensorize_module(sch.mod, host_target)
    # AVX2's 8 lanes split the 14 columns into 8 + 6: the second tile's indices have constant strides only given
    # the enclosing piece of the partition (`v4_0 == 1`)
    assert reports["main"].used == [f"transpose{lanes}"] * (1 if lanes >= 14 else 2), reports["main"]
    data = np.random.default_rng(2).standard_normal((1, h, w // 14, c // lanes, 14, lanes)).astype("float32")
    want = np.maximum(data.transpose(0, 3, 5, 1, 2, 4).reshape(1, c, h, w), 0)
    np.testing.assert_array_equal(_run(sch.mod["main"], host_target, [data], (1, c, h, w)), want)
