"""Layout primitives and their inverses: numpy packing, TVM index maps, names, the paper's examples."""

from __future__ import annotations

import numpy as np
import pytest

from compiler.layout import Layout, LayoutError
from compiler.layout.rewrite import conversion


def _run_conversion(source_layout: Layout, target: Layout, array: np.ndarray) -> np.ndarray:
    """Builds the TE conversion op source_layout -> target and runs it on `array` (stored in source_layout)."""
    import tvm
    from tvm import te

    src = te.placeholder(source_layout.new_shape, "float32", name="src")
    out = conversion(src, source_layout, target, "convert")
    func = te.create_prim_func([src, out])
    lib = tvm.compile(tvm.IRModule({"main": func}), "llvm")
    a = tvm.runtime.tensor(array.astype("float32"))
    b = tvm.runtime.tensor(np.zeros(target.new_shape, "float32"))
    lib["main"](a, b)
    return b.numpy()


SHAPE = (2, 6, 7, 5)
LAYOUTS = {
    "split": Layout(SHAPE, "N C H W").split(1, 3),
    "split_padded": Layout(SHAPE, "N C H W").split(2, 4),
    "split_3way": Layout(SHAPE, "N C H W").split(1, -1, 2, 3),
    "reorder": Layout(SHAPE, "N C H W").reorder(0, 2, 3, 1),
    "fuse": Layout(SHAPE, "N C H W").fuse(2, 3),
    "unfold": Layout(SHAPE, "N C H W").unfold(2, 3, 2),
    "unfold_overhang": Layout(SHAPE, "N C H W").unfold(3, 4, 3),
    "pad": Layout(SHAPE, "N C H W").pad(3, 1, 2),
    "combined": Layout(SHAPE, "N C H W").split(1, 2).unfold(3, 5, 4).pad(1, 0, 1).reorder(0, 2, 3, 4, 5, 1).fuse(3, 4),
}


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_pack_then_unpack_is_identity(name: str):
    layout = LAYOUTS[name]
    x = np.random.default_rng(0).uniform(-1, 1, SHAPE).astype("float32")
    packed = layout.pack(x)
    assert packed.shape == layout.new_shape, f"{packed.shape=} != {layout.new_shape=}"
    np.testing.assert_array_equal(layout.unpack(packed), x)
    inverse = layout.inverse()
    assert inverse.new_shape == SHAPE, f"{inverse.new_shape=}"


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_tvm_index_maps_agree_with_numpy(name: str):
    """The TE rewriting (forward and backward maps) computes what numpy packing computes, both ways."""
    layout = LAYOUTS[name]
    x = np.random.default_rng(1).uniform(-1, 1, SHAPE).astype("float32")
    identity = Layout.identity(SHAPE)
    np.testing.assert_array_equal(_run_conversion(identity, layout, x), layout.pack(x))
    np.testing.assert_array_equal(_run_conversion(layout, identity, layout.pack(x)), x)


def test_split_numbers():
    x = np.arange(10)
    np.testing.assert_array_equal(Layout((10,)).split(0, 4).pack(x), [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 0, 0]])
    np.testing.assert_array_equal(Layout((10,)).split(0, 4).unpack(Layout((10,)).split(0, 4).pack(x)), x)


def test_reorder_and_fuse_numbers():
    x = np.arange(6).reshape(2, 3)
    np.testing.assert_array_equal(Layout((2, 3)).reorder(1, 0).pack(x), x.T)
    np.testing.assert_array_equal(Layout((2, 3)).fuse(0, 1).pack(x), np.arange(6))


def test_paper_unfold_example():
    """Sec. 4.1.2: {1,2,3,4,5} unfolded with B=3, S=2 is {{1,2,3},{3,4,5}}; fold gives it back."""
    layout = Layout((5,), "D").unfold(0, 3, 2)
    x = np.array([1, 2, 3, 4, 5], "float32")
    packed = layout.pack(x)
    np.testing.assert_array_equal(packed, [[1, 2, 3], [3, 4, 5]])
    assert layout.new_shape == (2, 3)
    np.testing.assert_array_equal(layout.unpack(packed), x)
    np.testing.assert_array_equal(_run_conversion(Layout.identity((5,)), layout, x), packed)
    np.testing.assert_array_equal(_run_conversion(layout, Layout.identity((5,)), packed), x)


def test_pad_and_unpad_numbers():
    layout = Layout((3,)).pad(0, 1, 2)
    np.testing.assert_array_equal(layout.pack(np.array([1, 2, 3])), [0, 1, 2, 3, 0, 0])
    np.testing.assert_array_equal(layout.unpack(np.array([9, 1, 2, 3, 9, 9])), [1, 2, 3])
    assert layout.inverse().prims[0].__class__.__name__ == "Unpad"


def test_store_at_and_decouple_at():
    """store_at puts the bias beside every weight row; decouple_at takes it back out."""
    w = np.arange(12, dtype="float32").reshape(3, 4)
    b = np.array([100, 200, 300], "float32")
    layout = Layout((3, 4), "N K").store_at("bias", 1).split(0, 3)
    packed = layout.pack(w, {"bias": b})
    assert packed.shape == (1, 3, 5), packed.shape
    np.testing.assert_array_equal(packed[0, :, 4], b)
    np.testing.assert_array_equal(layout.unpack(packed), w)
    np.testing.assert_array_equal(layout.decouple(packed, "bias"), b)
    assert [type(p).__name__ for p in layout.inverse().prims] == ["Fuse", "DecoupleAt"]
    with pytest.raises(LayoutError, match="store_at needs"):
        layout.pack(w)


def test_paper_nhwc_access_expressions():
    """Sec. 4.1.1: fuse(H,W,O), split into (O/4, 4, HW), reorder -> T[n][e/(HW4)][e mod HW][e/HW mod 4]."""
    from tvm import sym, tirx

    n_, h_, w_, o_ = 2, 3, 5, 8
    layout = Layout((n_, h_, w_, o_), "N H W O").fuse(1, 2, 3).split(1, o_ // 4, 4, h_ * w_).reorder(0, 1, 3, 2)
    assert layout.name == "N (H W O)/60 15 4", layout.name  # the paper writes N (O/4) (HW) 4
    n, h, w, o = (tirx.Var(v, "int32") for v in "nhwo")
    analyzer = sym.Analyzer()
    for v, extent in zip((n, h, w, o), (n_, h_, w_, o_)):
        analyzer.bind(v, __import__("tvm").ir.Range(0, extent))
    got = layout.forward([n, h, w, o])
    e = h * (w_ * o_) + w * o_ + o
    hw = h_ * w_
    want = [n, tirx.floordiv(e, hw * 4), tirx.floormod(e, hw), tirx.floormod(tirx.floordiv(e, hw), 4)]
    assert len(got) == 4
    for g, x in zip(got, want):
        assert analyzer.can_prove_equal(g, x), f"{g} != {x}"
    assert layout.new_shape == (n_, o_ // 4, hw, 4)


def test_readable_names():
    out = Layout((1, 64, 112, 112), "N O H W").split(2, 4).split(4, 16).split(1, 16).reorder(0, 3, 5, 1, 4, 6, 2)
    assert out.name == "N H/4 W/16 O/16 4 16 16", out.name
    assert out.new_shape == (1, 28, 7, 4, 4, 16, 16), out.new_shape
    assert Layout((1, 64, 56, 56), "N O H W").split(1, 16).reorder(0, 1, 3, 4, 2).name == "N O/16 H W 16"
    assert Layout((5,), "D").unfold(0, 3, 2).name == "D/2 [3]"


def test_errors_name_the_problem():
    with pytest.raises(LayoutError, match="permutation"):
        Layout((2, 3)).reorder(0, 0)
    with pytest.raises(LayoutError, match="consecutive"):
        Layout((2, 3, 4)).fuse(0, 2)
    with pytest.raises(LayoutError, match="drop elements"):
        Layout((8,)).unfold(0, 2, 3)
    with pytest.raises(LayoutError, match="out of range"):
        Layout((8,)).split(1, 2)


def test_is_basic_and_identity():
    assert Layout((4, 4)).split(0, 2).reorder(1, 0, 2).is_basic
    assert not Layout((4, 4)).unfold(0, 2, 1).is_basic
    assert Layout((4, 4)).pad(0, 0, 0).is_basic  # a trivial advanced primitive propagates
    assert Layout((4, 4)).reorder(0, 1).is_identity
    assert Layout((4, 4)) == Layout((4, 4), "A B")  # names are for display only
