"""compiler.tir_util: the one copy of the IR helpers every pass uses (rewriting, substitution, extents)."""

from __future__ import annotations

import pytest

tvm = pytest.importorskip("tvm")

from tvm import te, tirx  # noqa: E402

from compiler import tir_util  # noqa: E402
from compiler.layout.primitives import LayoutError  # noqa: E402
from compiler.layout.primitives import substitute as layout_substitute  # noqa: E402


def test_rewrite_keeps_what_does_not_change_and_rebuilds_the_rest():
    x, y = tirx.Var("x", "int32"), tirx.Var("y", "int32")
    e = tirx.Select(x < 4, tirx.Cast("float32", x * 2 + y), tirx.const(0.0, "float32"))
    assert tir_util.rewrite(e, lambda _: None).same_as(e)
    z = tirx.Var("z", "int32")
    swapped = tir_util.subst(e, {tir_util.key(y): z})
    assert not swapped.same_as(e)
    assert tir_util.var_names(swapped) == {"x", "z"}
    assert tir_util.uses(swapped, z) and not tir_util.uses(swapped, y)


def test_substitute_rewrites_te_loads_and_refuses_nested_reductions():
    a = te.placeholder((8, 8), name="A")
    c = te.compute((8, 8), lambda i, j: a[i, j] + 1.0, name="C")
    i, j = (iv.var for iv in c.op.axis)
    seen = []

    def load(tensor, new, old):
        seen.append((tensor.name, len(new), len(old)))
        return tensor(*reversed(new))

    out = tir_util.substitute(c.op.body[0], {tir_util.key(i): j}, load)
    assert seen == [("A", 2, 2)]
    assert "tensor_load(metadata[\"te.Tensor\"][0], j, j)" in str(out), out
    k = te.reduce_axis((0, 8), "k")
    nested = te.compute((8,), lambda r: te.sum(a[r, k], axis=k), name="S").op.body[0] + 1.0
    with pytest.raises(tir_util.UnsupportedExpr, match="nested reductions"):
        tir_util.substitute(nested, {})
    with pytest.raises(LayoutError, match="nested reductions"):  # the layout pass's own error
        layout_substitute(nested, {})


def test_children_and_rebuild_agree():
    x = tirx.Var("x", "int32")
    e = tirx.Ramp(x * 4, 1, 4)
    assert tir_util.expr_shape(e) == "ramp"
    assert tir_util.rebuild(e, tir_util.children(e)).same_as(e)
    other = tir_util.rebuild(e, [x, tirx.const(2, "int32")])
    assert isinstance(other, tirx.Ramp) and tir_util.const_int(other.stride) == 2


def test_const_extent_of_a_loop_and_of_an_iteration_variable():
    n = tirx.Var("n", "int32")
    body = tirx.Evaluate(0)
    assert tir_util.const_extent(tirx.For(tirx.Var("i", "int32"), 0, 16, tirx.ForKind.SERIAL, body)) == 16
    assert tir_util.const_extent(tirx.For(tirx.Var("i", "int32"), 0, n, tirx.ForKind.SERIAL, body)) is None
    a = te.placeholder((8, 12), name="A")
    c = te.compute((8, 12), lambda i, j: a[i, j] * 2.0, name="C")
    assert [tir_util.const_extent(iv) for iv in c.op.axis] == [8, 12]
