"""basteln tiling and fusion: numbers against numpy/torch, fused tiles and shrunken intermediates in the IR."""

from __future__ import annotations

import numpy as np
import pytest

tvm = pytest.importorskip("tvm")

from tvm import te, tirx  # noqa: E402

from compiler.passes.basteln import BastelnError, basteln, scratch_bytes  # noqa: E402
from compiler.workloads import make_workload  # noqa: E402


def run(mod, inputs: list[np.ndarray], out_shape: tuple[int, ...]) -> np.ndarray:
    lib = tvm.compile(mod, "llvm")
    out = tvm.runtime.tensor(np.zeros(out_shape, "float32"))
    lib["main"](*[tvm.runtime.tensor(x) for x in inputs], out)
    return out.numpy()


def figure1(h: int = 20, w: int = 20, k: int = 3):
    """The paper's Figure 1(a): quantization -> 2-D convolution -> ReLU."""
    x = te.placeholder((h, w), name="X")
    b = te.placeholder((k, k), name="B")
    a = te.compute((h, w), lambda i, j: x[i, j] * tirx.const(0.5, "float32"), name="quant")
    kh, kw = te.reduce_axis((0, k), "kh"), te.reduce_axis((0, k), "kw")
    c = te.compute((h - k + 1, w - k + 1), lambda i, j: te.sum(a[i + kh, j + kw] * b[kh, kw], axis=[kh, kw]), name="conv")
    d = te.compute(c.shape, lambda i, j: tirx.max(c[i, j], tirx.const(0, "float32")), name="relu")
    return te.create_prim_func([x, b, d]).with_attr("global_symbol", "main")


def figure1_reference(x: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = x * 0.5
    k = b.shape[0]
    oh, ow = x.shape[0] - k + 1, x.shape[1] - k + 1
    out = sum(a[i:i + oh, j:j + ow] * b[i, j] for i in range(k) for j in range(k))
    return np.maximum(out, 0)


def loop_names(fused, block: str) -> list[str]:
    """The loops around `block` (a reduction's update block once its initialization is split off), outermost first."""
    names = {fused.sch.get(b).name_hint for b in fused.sch.get_child_blocks(fused.sch.get_sblock("root"))}
    rv = None
    for candidate in (block, block + "_update"):
        try:
            rv = fused.sch.get_sblock(candidate)
            break
        except Exception:
            continue
    assert rv is not None, f"no block {block} among {names}"
    return [str(fused.sch.get(loop).loop_var) for loop in fused.sch.get_loops(rv)]


def test_figure1_fuses_the_quantization_into_overlapped_conv_tiles():
    rng = np.random.default_rng(0)
    x, b = rng.standard_normal((20, 20), "float32"), rng.standard_normal((3, 3), "float32")
    fused = basteln(figure1(), [4, 4], threshold=1.0, vector=8)
    [decision] = fused.decisions
    assert decision.group == "quant" and decision.depth == 2
    assert 0 < decision.redundancy < 1.5  # 6x6 footprints of 4x4 tiles overlap by the 2-wide halo
    # the quantization runs inside the conv's tile loop, on a 6x6 footprint of each 4x4 tile
    assert loop_names(fused, "quant")[0] == loop_names(fused, "relu")[0] == loop_names(fused, "conv_update")[0]
    # intermediates shrink to one tile: quant 6x6 and conv 4x4 floats instead of 20x20 and 18x18
    assert fused.intermediate_bytes == (20 * 20 + 18 * 18) * 4
    assert fused.scratch_bytes == (6 * 6 + 4 * 4) * 4
    np.testing.assert_allclose(run(fused.sch.mod, [x, b], (18, 18)), figure1_reference(x, b), rtol=1e-5, atol=1e-5)


def test_threshold_zero_refuses_recomputation():
    fused = basteln(figure1(), [4, 4], threshold=0.0)
    [decision] = fused.decisions
    assert decision.depth == 0 and decision.reason.startswith("threshold")
    assert fused.scratch_bytes == (20 * 20 + 4 * 4) * 4  # the quantization whole, the conv per tile
    rng = np.random.default_rng(1)
    x, b = rng.standard_normal((20, 20), "float32"), rng.standard_normal((3, 3), "float32")
    np.testing.assert_allclose(run(fused.sch.mod, [x, b], (18, 18)), figure1_reference(x, b), rtol=1e-5, atol=1e-5)


def blur(h: int = 34, w: int = 40):
    x = te.placeholder((h, w), name="img")
    third = tirx.const(1 / 3, "float32")
    bx = te.compute((h, w - 2), lambda i, j: (x[i, j] + x[i, j + 1] + x[i, j + 2]) * third, name="blur_x")
    by = te.compute((h - 2, w - 2), lambda i, j: (bx[i, j] + bx[i + 1, j] + bx[i + 2, j]) * third, name="blur_y")
    return te.create_prim_func([x, by]).with_attr("global_symbol", "main")


def test_two_stage_blur_computes_the_horizontal_pass_per_output_tile():
    img = np.random.default_rng(2).standard_normal((34, 40), "float32")
    fused = basteln(blur(), [8, 19], threshold=1.0, vector=8)
    [decision] = fused.decisions
    assert decision.group == "blur_x" and decision.depth == 2
    assert loop_names(fused, "blur_x")[0] == loop_names(fused, "blur_y")[0]
    assert fused.scratch_bytes == 10 * 19 * 4  # 8 + 2 rows of one 19-wide tile
    bx = (img[:, :-2] + img[:, 1:-1] + img[:, 2:]) / 3
    want = (bx[:-2] + bx[1:-1] + bx[2:]) / 3
    np.testing.assert_allclose(run(fused.sch.mod, [img], (32, 38)), want, rtol=1e-5, atol=1e-5)


SUBGRAPH_CASES = {
    "conv3x3_conv1x1": (dict(in_channels=8, height=14, width=14, mid_channels=16, out_channels=8), [1, 8, 7, 7]),
    "depthwise_pointwise": (dict(channels=16, height=14, width=14, out_channels=24), [1, 8, 7, 14]),
    "pad_conv_bias_relu": (dict(in_channels=8, height=14, width=14, out_channels=16, kernel=3, padding=1),
                           [1, 16, 2, 14]),
    "matmul_softmax_matmul": (dict(heads=2, seq=32, dim=16), [1, 8, 16]),
}


@pytest.mark.parametrize("name", sorted(SUBGRAPH_CASES))
def test_each_catalog_subgraph_fuses_into_one_tiled_program_equal_to_torch(name: str):
    params, tiles = SUBGRAPH_CASES[name]
    w = make_workload(name, params)
    fused = basteln(w.prim_func, tiles, threshold=1.0)
    assert fused.decisions and all(d.depth > 0 for d in fused.decisions), fused.decisions
    # every intermediate now lives in the output's tile loops, shrunk to what one tile needs
    first = {loop_names(fused, b)[0] for b in (*fused.fused, fused.outputs[0])}
    assert len(first) == 1, first
    assert fused.scratch_bytes < fused.intermediate_bytes / 2, (fused.scratch_bytes, fused.intermediate_bytes)
    inputs = w.random_inputs()
    np.testing.assert_allclose(run(fused.sch.mod, inputs, w.output.shape), w.reference(inputs), rtol=1e-4, atol=1e-4)


def test_a_space_with_fewer_parallel_loops_stays_above_the_tile_loops_it_cannot_follow():
    w = make_workload("matmul_softmax_matmul", dict(heads=2, seq=32, dim=16))
    fused = basteln(w.prim_func, [1, 8, 8], threshold=1.0)  # the head dimension tiled too
    by_group = {d.group: d for d in fused.decisions}
    # the probabilities may be recomputed once per head-dimension tile (threshold 1), row_sum has only 2
    # parallel dimensions and cannot sit under the 3 tiled loops (the paper's m > n)
    assert by_group["probs"].depth == 3 and by_group["probs"].redundancy == pytest.approx(1.0)
    assert by_group["row_sum"].depth == 2 and by_group["row_sum"].reason == "m > n"
    inputs = w.random_inputs(3)
    np.testing.assert_allclose(run(fused.sch.mod, inputs, w.output.shape), w.reference(inputs), rtol=1e-4, atol=1e-4)


def test_softmax_reduces_its_rows_in_vectors_along_them_inside_the_attention_tiles():
    """The row max and row sum read a row contiguously: partial results one vector a row (`rfactor`), that
    block's innermost loop the lanes, vectorized (not a vector across rows, one element each, a gather);
    the partial blocks fuse into the output tiles like the rest, and the attention equals torch."""
    w = make_workload("matmul_softmax_matmul", dict(heads=2, seq=32, dim=16))
    fused = basteln(w.prim_func, [1, 4, 16], threshold=1.0, vector=8)  # rows of 4, 4 vectors of 8 a row
    depth = {d.group: d.depth for d in fused.decisions}
    sch = fused.sch
    for name in ("row_max", "row_sum"):
        assert depth[f"{name}_rf"] > 0 and depth[name] > 0, fused.decisions
        partial = sch.get(sch.get_sblock(f"{name}_rf_update"))
        lanes = partial.iter_vars[0]  # rfactor's lane variable, the dimension it adds to the partial buffer
        assert int(lanes.dom.extent) == 8 and lanes.iter_type != tirx.IterVar.CommReduce
        write = partial.writes[0]
        (read,) = [r for r in partial.reads if not r.source.same_as(write.source)]
        assert write.region[-1].min.same_as(lanes.var)  # partial[..., lane]
        coeffs = tvm.sym.detect_linear_equation(read.region[-1].min, [v.var for v in partial.iter_vars])
        assert [int(c) for c in coeffs[:-1]] == [1, 0, 0, 8], coeffs  # row[vj_0 * 8 + lane]: one element a lane
        inner = sch.get(sch.get_loops(sch.get_sblock(f"{name}_rf_update"))[-1])
        assert inner.kind == tvm.tirx.ForKind.VECTORIZED and int(inner.extent) == 8, inner
    inputs = w.random_inputs(5)
    np.testing.assert_allclose(run(fused.sch.mod, inputs, w.output.shape), w.reference(inputs), rtol=1e-4, atol=1e-4)


def test_a_variance_reads_its_mean_once_a_row_and_still_reduces_in_vectors():
    """Layer norm's statistics: the mean reduces x, the variance reduces x and reads the mean once a row;
    both get partial blocks along the rows, and the normalized rows equal numpy's."""
    rows, width = 24, 64
    x = te.placeholder((rows, width), name="x")
    k = te.reduce_axis((0, width), "k")
    total = te.compute((rows,), lambda i: te.sum(x[i, k], axis=k), name="total")
    mean = te.compute((rows,), lambda i: total[i] / width, name="mean")
    k2 = te.reduce_axis((0, width), "k2")
    squares = te.compute((rows,), lambda i: te.sum((x[i, k2] - mean[i]) * (x[i, k2] - mean[i]), axis=k2),
                         name="squares")
    out = te.compute((rows, width), lambda i, j: (x[i, j] - mean[i]) / tirx.sqrt(squares[i] / width + 1e-5),
                     name="norm")
    func = te.create_prim_func([x, out]).with_attr("global_symbol", "main")
    fused = basteln(func, [8, 64], threshold=1.0, vector=16)
    names = {fused.sch.get(b).name_hint for b in fused.sch.get_child_blocks(fused.sch.get_sblock("root"))}
    partial = {n.removesuffix("_update") for n in names if n.endswith("_rf_update")}
    assert partial == {"total_rf", "squares_rf"}, names
    xs = np.random.default_rng(0).standard_normal((rows, width)).astype("float32")
    want = (xs - xs.mean(1, keepdims=True)) / np.sqrt(xs.var(1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(run(fused.sch.mod, [xs], (rows, width)), want, rtol=1e-4, atol=1e-4)


def two_outputs(h: int = 17, w: int = 17):
    """A producer shared by two outputs that read overlapping parts of it (Fig. 11 of the paper)."""
    x = te.placeholder((h, w), name="x")
    s = te.compute((h, w), lambda i, j: x[i, j] * tirx.const(2, "float32"), name="shared")
    o1 = te.compute((h - 1, w - 1), lambda i, j: s[i, j] + s[i + 1, j + 1], name="out1")
    o2 = te.compute((h - 1, w - 1), lambda i, j: s[i, j] * tirx.const(3, "float32"), name="out2")
    return te.create_prim_func([x, o1, o2]).with_attr("global_symbol", "main")


@pytest.mark.parametrize("threshold,fused_depth", [(0.0, 0), (1.0, 2)])
def test_multiple_outputs_share_tiles_and_fuse_their_producer_only_within_the_threshold(threshold, fused_depth):
    fused = basteln(two_outputs(), [4, 4], threshold=threshold)
    [decision] = fused.decisions
    assert decision.group == "shared" and decision.depth == fused_depth
    assert sorted(fused.outputs) == ["out1", "out2"]
    # equal output spaces: one tile loop for both (independent groups with equal tile sizes)
    assert loop_names(fused, "out1")[0] == loop_names(fused, "out2")[0]
    x = np.random.default_rng(4).standard_normal((17, 17), "float32")
    lib = tvm.compile(fused.sch.mod, "llvm")
    o1, o2 = (tvm.runtime.tensor(np.zeros((16, 16), "float32")) for _ in range(2))
    lib["main"](tvm.runtime.tensor(x), o1, o2)
    np.testing.assert_allclose(o1.numpy(), 2 * x[:-1, :-1] + 2 * x[1:, 1:], rtol=1e-6)
    np.testing.assert_allclose(o2.numpy(), 6 * x[:-1, :-1], rtol=1e-6)


def branches(m: int = 16, k: int = 8, n1: int = 6, n2: int = 10, *, split: bool):
    """A matmul whose result two outputs of different spaces read (Fig. 11(a) with op1 and op2 of different
    shapes): `split`, each its own columns (a chunk, as in a GLU: the parts do not intersect); else both read
    all of it (the branches of an Inception block: every element is needed twice)."""
    x = te.placeholder((m, k), name="X")
    w = te.placeholder((k, n1 + n2 if split else k), name="W")
    r = te.reduce_axis((0, k), "r")
    y = te.compute((m, w.shape[1]), lambda i, j: te.sum(x[i, r] * w[r, j], axis=r), name="Y")
    if split:
        o1 = te.compute((m, n1), lambda i, j: tirx.max(y[i, j], tirx.const(0, "float32")), name="out1")
        o2 = te.compute((m, n2), lambda i, j: y[i, n1 + j] * tirx.const(2, "float32"), name="out2")
        return te.create_prim_func([x, w, o1, o2]).with_attr("global_symbol", "main")
    w1, w2 = te.placeholder((k, n1), name="W1"), te.placeholder((k, n2), name="W2")
    r1, r2 = te.reduce_axis((0, k), "r1"), te.reduce_axis((0, k), "r2")
    o1 = te.compute((m, n1), lambda i, j: te.sum(y[i, r1] * w1[r1, j], axis=r1), name="out1")
    o2 = te.compute((m, n2), lambda i, j: te.sum(y[i, r2] * w2[r2, j], axis=r2), name="out2")
    return te.create_prim_func([x, w, w1, w2, o1, o2]).with_attr("global_symbol", "main")


def same_tile_loop(fused, a: str, b: str) -> bool:
    """Whether blocks `a` and `b` sit in the same outermost loop (the loop itself, not its name)."""
    sch = fused.sch
    first = [sch.get(sch.get_loops(sch.get_sblock(n if n in names else n + "_update"))[0])
             for n, names in ((a, blocks(sch)), (b, blocks(sch)))]
    return first[0].same_as(first[1])


def blocks(sch) -> set[str]:
    return {sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))}


def run_branches(fused, target, split: bool, m: int = 16, k: int = 8, n1: int = 6, n2: int = 10) -> None:
    rng = np.random.default_rng(5)
    x = rng.standard_normal((m, k), "float32")
    w = rng.standard_normal((k, n1 + n2 if split else k), "float32")
    ws = [] if split else [rng.standard_normal((k, n), "float32") for n in (n1, n2)]
    outs = [tvm.runtime.tensor(np.zeros((m, n), "float32")) for n in (n1, n2)]
    tvm.compile(fused.sch.mod, target)["main"](*[tvm.runtime.tensor(a) for a in (x, w, *ws)], *outs)
    y = x @ w
    want = [np.maximum(y[:, :n1], 0), 2 * y[:, n1:]] if split else [y @ ws[0], y @ ws[1]]
    for got, ref in zip(outs, want):
        np.testing.assert_allclose(got.numpy(), ref, rtol=1e-5, atol=1e-5)


def test_a_producer_of_outputs_of_different_spaces_is_split_between_their_tiles_without_redundancy(host_target):
    fused = basteln(branches(split=True), [4, 6], threshold=0.0, vector=8)
    # Fig. 11(b): the parts the two outputs need do not intersect, so each computes its own part in its tiles
    assert [(d.group, d.copies, d.overlap) for d in fused.duplications] == [("Y", ("Y_copy1",), 0.0)]
    assert {d.group: d.depth for d in fused.decisions} == {"Y": 2, "Y_copy1": 2}
    assert same_tile_loop(fused, "Y", "out1") and same_tile_loop(fused, "Y_copy1", "out2")
    assert not same_tile_loop(fused, "out1", "out2")
    # each copy shrinks to its tile: 4 rows of its output's columns (6 and 10: out1 takes its rows whole, so out2
    # does), not the 16 x 16 matmul twice
    assert fused.scratch_bytes == 4 * (6 + 10) * 4 < fused.intermediate_bytes
    run_branches(fused, host_target, split=True)
    # without copies (the pass before Fig. 11b): the matmul runs once, whole, before both outputs
    whole = basteln(branches(split=True), [4, 6], threshold=0.0, vector=8, copies=False)
    assert whole.duplications == [] and [(d.group, d.depth) for d in whole.decisions] == [("Y", 0)]
    assert whole.scratch_bytes == whole.intermediate_bytes
    run_branches(whole, host_target, split=True)


@pytest.mark.parametrize("threshold", [0.0, 1.0])
def test_a_producer_both_outputs_need_whole_is_copied_only_when_the_threshold_allows(threshold, host_target):
    fused = basteln(branches(split=False), [4, 6], threshold=threshold, vector=8)
    by_group = {d.group: d for d in fused.decisions}
    if threshold == 0:  # a copy would compute every element twice: computed once, whole, before both
        assert fused.duplications == [] and by_group["Y"].depth == 0
        assert by_group["Y"].reason.startswith("shared by outputs of different spaces (1.00")
        assert fused.scratch_bytes == fused.intermediate_bytes == 16 * 8 * 4
    else:  # sec. 5.4 at 1: one fused program per output, the redundancy accepted
        assert [(d.group, d.overlap) for d in fused.duplications] == [("Y", 1.0)]
        # each under its output's tiles of 4 whole rows: no more recomputation than the copy itself
        assert (by_group["Y"].depth, by_group["Y"].redundancy) == (2, 0.0)
        assert (by_group["Y_copy1"].depth, by_group["Y_copy1"].redundancy) == (2, 0.0)
        assert same_tile_loop(fused, "Y", "out1") and same_tile_loop(fused, "Y_copy1", "out2")
        assert fused.scratch_bytes == 2 * 4 * 8 * 4 < 2 * fused.intermediate_bytes
    run_branches(fused, host_target, split=False)


def test_the_producers_of_a_copied_producer_are_shared_by_the_copies_in_turn(host_target):
    """X -> A (a 3-row window sum) -> Y (a matmul) -> out1 | out2, each output reading its own columns of Y."""
    m, k, n1, n2 = 16, 8, 6, 10
    x = te.placeholder((m + 2, k), name="X")
    r0 = te.reduce_axis((0, 3), "r0")
    a = te.compute((m, k), lambda i, c: te.sum(x[i + r0, c], axis=r0), name="A")
    w = te.placeholder((k, n1 + n2), name="W")
    r = te.reduce_axis((0, k), "r")
    y = te.compute((m, n1 + n2), lambda i, j: te.sum(a[i, r] * w[r, j], axis=r), name="Y")
    o1 = te.compute((m, n1), lambda i, j: y[i, j] + tirx.const(1, "float32"), name="out1")
    o2 = te.compute((m, n2), lambda i, j: y[i, n1 + j] * tirx.const(2, "float32"), name="out2")
    func = te.create_prim_func([x, w, o1, o2]).with_attr("global_symbol", "main")
    rng = np.random.default_rng(6)
    xs, ws = rng.standard_normal((m + 2, k), "float32"), rng.standard_normal((k, n1 + n2), "float32")
    ref = (xs[:-2] + xs[1:-1] + xs[2:]) @ ws
    for threshold in (0.0, 1.0):
        fused = basteln(func, [4, 6], threshold=threshold, vector=8)
        copied = {d.group: (d.copies, d.overlap) for d in fused.duplications}
        by_group = {d.group: d for d in fused.decisions}
        # Y first (its parts are disjoint); then A, which both copies of Y read whole
        assert copied["Y"] == (("Y_copy1",), 0.0)
        if threshold == 0:
            assert "A" not in copied and by_group["A"].depth == 0 and by_group["A"].reason.startswith("shared")
        else:
            assert copied["A"] == (("A_copy1",), 1.0)
            assert same_tile_loop(fused, "A", "out1") and same_tile_loop(fused, "A_copy1", "out2")
        outs = [tvm.runtime.tensor(np.zeros((m, n), "float32")) for n in (n1, n2)]
        tvm.compile(fused.sch.mod, host_target)["main"](tvm.runtime.tensor(xs), tvm.runtime.tensor(ws), *outs)
        np.testing.assert_allclose(outs[0].numpy(), ref[:, :n1] + 1, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(outs[1].numpy(), ref[:, n1:] * 2, rtol=1e-5, atol=1e-5)


def test_element_wise_chains_are_inlined_and_reductions_keep_their_epilogue():
    w = make_workload("pad_conv_bias_relu", dict(in_channels=4, height=8, width=8, out_channels=8))
    fused = basteln(w.prim_func, [1, 8, 4, 8])
    assert fused.inlined == ["bias_add"]  # one consumer reading each element once (Alg. 5)
    # the output's epilogue stays a block of its own, run per tile after the reduction (Alg. 1)
    assert loop_names(fused, "relu")[0] == loop_names(fused, fused.outputs[0])[0]


def test_scratch_bytes_of_an_untiled_program_is_every_intermediate():
    func = figure1()
    assert scratch_bytes(tvm.IRModule({"main": func})) == (20 * 20 + 18 * 18) * 4


def test_tiles_that_do_not_fit_are_refused():
    with pytest.raises(BastelnError, match="do not fit"):
        basteln(figure1(), [4, 40])
    with pytest.raises(BastelnError, match="do not fit"):
        basteln(figure1(), [4])


@pytest.mark.parametrize("name", sorted(SUBGRAPH_CASES))
def test_each_catalog_subgraph_in_blocked_layouts_keeps_its_interface_and_equals_torch(name: str):
    from compiler.layout import subgraph_layout

    params, tiles = SUBGRAPH_CASES[name]
    w = make_workload(name, params)
    func = subgraph_layout(w, 8)
    from compiler.arrays import arg_specs

    assert [tuple(shape) for shape, _ in arg_specs(func)] == [s.shape for s in w.args]  # the user's layouts
    blocks = _block_names(func)
    converted = sorted(b for b in blocks if b.startswith("layout_convert_"))
    if name == "conv3x3_conv1x1":  # the two convs agree on relu1's layout: no conversion between them
        assert converted == ["layout_convert_relu2_out", "layout_convert_weight1", "layout_convert_weight2"], converted
    fused = basteln(func, tiles, threshold=1.0, vector=8, register=4, register2=2)
    inputs = w.random_inputs()
    want = w.reference(inputs)
    np.testing.assert_allclose(run(tvm.IRModule({"main": func}), inputs, w.output.shape), want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(run(fused.sch.mod, inputs, w.output.shape), want, rtol=1e-4, atol=1e-4)
    if name == "conv3x3_conv1x1":  # every tile needs all of each weight: converted once, outside the tiles
        assert {d.group: d.depth for d in fused.decisions if d.group.startswith("layout_convert_weight")} == {
            "layout_convert_weight1": 0, "layout_convert_weight2": 0}, fused.decisions


def test_a_channel_count_the_block_does_not_divide_is_blocked_whole():
    """MobileNet-V2's projection to 24 channels with 16 lanes: the pointwise weight keeps its 24 output
    channels whole and innermost (a vector over them loads it contiguously), not unblocked (each lane a
    separate row of the weight: a gather)."""
    from compiler.arrays import arg_specs
    from compiler.layout import subgraph_layout

    w = make_workload("depthwise_pointwise", dict(channels=32, height=8, width=8, out_channels=24))
    func = subgraph_layout(w, 16)
    sch = tvm.s_tir.Schedule(func)
    weight = sch.get(sch.get_sblock("layout_convert_weight_pw")).writes[0].source
    assert [int(d) for d in weight.shape] == [1, 2, 1, 1, 16, 24], weight.shape  # O/24 I/16 KH KW 16i 24o
    assert [tuple(shape) for shape, _ in arg_specs(func)] == [s.shape for s in w.args]
    fused = basteln(func, [1, 24, 2, 8], threshold=1.0, vector=16, register=4, register2=2)
    inputs = w.random_inputs(2)
    np.testing.assert_allclose(run(fused.sch.mod, inputs, w.output.shape), w.reference(inputs), rtol=1e-4, atol=1e-4)


def _block_names(func) -> set[str]:
    sch = tvm.s_tir.Schedule(func)
    return {sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))}


def test_a_blocked_conv_gets_an_outer_product_register_block_of_columns_and_channel_blocks():
    from compiler.layout import subgraph_layout

    w = make_workload("conv3x3_conv1x1", dict(in_channels=16, height=6, width=6, mid_channels=16, out_channels=16))
    fused = basteln(subgraph_layout(w, 8), [1, 16, 2, 6], threshold=1.0, vector=8, register=4, register2=2)
    sch = fused.sch
    loops = sch.get_loops(sch.get_sblock("conv1x1_update"))
    inner = [sch.get(loop) for loop in loops[-3:]]
    # 3 output columns (the largest divisor of 6 up to 4) x 2 channel blocks of 8 lanes, inside the reduction
    unrolled, vectorized = tvm.tirx.ForKind.UNROLLED, tvm.tirx.ForKind.VECTORIZED
    assert [(int(lp.extent), lp.kind) for lp in inner] == [(3, unrolled), (2, unrolled), (8, vectorized)], inner
    assert int(sch.get(loops[-4]).extent) == 16  # the reduction over the 16 input channels
    inputs = w.random_inputs()
    np.testing.assert_allclose(run(sch.mod, inputs, w.output.shape), w.reference(inputs), rtol=1e-4, atol=1e-4)


def test_a_depthwise_conv_blocks_its_columns_in_registers_not_its_channel_blocks():
    """Every loop of a channel-blocked depthwise conv moves some vector load; the column moves only the
    input (each weight vector is reused across the register block), the channel block moves both."""
    from compiler.layout import subgraph_layout

    w = make_workload("depthwise_pointwise", dict(channels=32, height=8, width=14, out_channels=16))
    fused = basteln(subgraph_layout(w, 16), [1, 16, 2, 14], threshold=1.0, vector=16, register=8)
    sch = fused.sch
    loops = [sch.get(loop) for loop in sch.get_loops(sch.get_sblock("depthwise_update"))]
    # 7 of the 14 columns (the largest divisor up to 8; the 2 channel blocks would give 2), then 16 lanes
    assert [(int(lp.extent), lp.kind) for lp in loops[-2:]] == [(7, tvm.tirx.ForKind.UNROLLED),
                                                             (16, tvm.tirx.ForKind.VECTORIZED)], loops[-2:]
    inputs = w.random_inputs(1)
    np.testing.assert_allclose(run(sch.mod, inputs, w.output.shape), w.reference(inputs), rtol=1e-4, atol=1e-4)


def test_a_row_longer_than_a_vector_puts_its_vectors_outside_the_reduction_in_a_register_block():
    """A GEMM chain (as BERT's MLP): the 64 columns are 4 vectors of 16; each is an accumulator of the outer
    product, not a loop inside the reduction that reloads and stores its sums every step."""
    a = te.placeholder((16, 32), name="A")
    b = te.placeholder((32, 48), name="B")
    c = te.placeholder((48, 64), name="C")
    k = te.reduce_axis((0, 32), "k")
    h = te.compute((16, 48), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="hidden")
    g = te.compute((16, 48), lambda i, j: tirx.max(h[i, j], tirx.const(0, "float32")), name="relu")
    k2 = te.reduce_axis((0, 48), "k2")
    out = te.compute((16, 64), lambda i, j: te.sum(g[i, k2] * c[k2, j], axis=k2), name="out")
    func = te.create_prim_func([a, b, c, out]).with_attr("global_symbol", "main")
    fused = basteln(func, [4, 64], threshold=1.0, vector=16, register=4, register2=2)
    sch = fused.sch
    loops = sch.get_loops(sch.get_sblock("out_update"))
    inner = [sch.get(loop) for loop in loops[-4:]]
    unrolled, vectorized = tvm.tirx.ForKind.UNROLLED, tvm.tirx.ForKind.VECTORIZED
    # the reduction (48), 4 rows, 2 of the row's 4 vectors, 16 lanes
    assert [(int(lp.extent), lp.kind) for lp in inner][1:] == [(4, unrolled), (2, unrolled), (16, vectorized)], inner
    assert int(inner[0].extent) == 48
    xs = [np.random.default_rng(i).standard_normal(s).astype("float32") for i, s in enumerate([(16, 32), (32, 48), (48, 64)])]
    want = np.maximum(xs[0] @ xs[1], 0) @ xs[2]
    np.testing.assert_allclose(run(sch.mod, xs, (16, 64)), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", sorted(SUBGRAPH_CASES))
@pytest.mark.parametrize("block", [0, 8])
def test_tensorize_runs_each_fused_reduction_on_the_targets_fma_micro_kernel(name: str, block: int, host_target):
    """Marked, each register-blocked reduction in the fused tiles is rewritten to the target's outer-product
    micro-kernel (its longest reduction loop innermost, the accumulators loaded once per it) and the program
    still equals torch; a depthwise conv (no outer product) is left as it was."""
    from compiler.build import build
    from compiler.layout import subgraph_layout
    from compiler.passes.tensorize import tensorize_module
    from compiler.passes.tensorize.instructions import available
    from compiler.target import vector_unit

    params, tiles = SUBGRAPH_CASES[name]
    w = make_workload(name, params)
    func = subgraph_layout(w, block) if block else w.prim_func
    lanes = vector_unit(host_target).lanes
    fused = basteln(func, tiles, threshold=1.0, vector=lanes, register=4, register2=2, tensorize=True)
    _, reports = tensorize_module(fused.sch.mod, host_target)
    fma = [i.name for i in available(host_target) if i.a_dtype == "float32" and i.group == 1]
    if fma:  # every x86 target with FMA (AVX2, AVX-512) and NEON
        # no outer product: the depthwise conv (both operands vary along the lanes) and, as written, Q K^T
        # (K's rows are the lanes, strided; K packed `K/b N/b b b` in the blocked layout is one); unmarked: the
        # blocked conv1x1, whose 7 columns have no register block of at most 4
        reductions = {"conv3x3_conv1x1": 2 - bool(block), "depthwise_pointwise": 1, "pad_conv_bias_relu": 1,
                      "matmul_softmax_matmul": 1 + bool(block)}[name]
        # the instruction whose lanes fit the lane loop (AVX-512's, or AVX2's where the block is 8 lanes)
        kernels = [u for u in reports["main"].used if not u.startswith("transpose")]  # conversions: their own test
        # a reduction the partition cuts in pieces is one kernel per piece: on AVX2's 8 lanes (znver3) the
        # unblocked depthwise -> pointwise reads 2 where AVX-512 reads 1, and a tile whose padded conversion is
        # transposed is cut where the padding is decided (the blocked pad -> conv: 3)
        assert len(kernels) >= reductions and set(kernels) <= set(fma), reports["main"]
    inputs = w.random_inputs()
    out = tvm.runtime.tensor(np.zeros(w.output.shape, "float32"))
    build(fused.sch.mod, host_target)["main"](*[tvm.runtime.tensor(x) for x in inputs], out)
    np.testing.assert_allclose(out.numpy(), w.reference(inputs), rtol=1e-4, atol=1e-4)


def test_a_micro_kernel_of_whole_and_partial_vectors_per_row_builds_and_equals_torch(host_target):
    """Rows of 28 lanes in vectors of 2 x lanes: each row a whole vector and a partial one (16 + 12, or 8 + 6 of
    14 on AVX2). The partial vectors' lanes are added to C after every whole vector is stored (TVM's
    StorageRewrite refused the accumulators when a whole vector followed a partial one)."""
    from compiler.build import build
    from compiler.target import vector_unit

    w = make_workload("conv3x3_conv1x1", dict(in_channels=8, height=4, width=28, mid_channels=16, out_channels=8))
    lanes = vector_unit(host_target).lanes
    fused = basteln(w.prim_func, [1, 8, 2, 28], threshold=1.0, vector=2 * lanes, register=4, register2=2,
                    tensorize=True)
    inputs = w.random_inputs()
    out = tvm.runtime.tensor(np.zeros(w.output.shape, "float32"))
    build(fused.sch.mod, host_target)["main"](*[tvm.runtime.tensor(x) for x in inputs], out)
    np.testing.assert_allclose(out.numpy(), w.reference(inputs), rtol=1e-4, atol=1e-4)


def test_tensorize_turns_the_blocked_outputs_conversion_into_register_transposes(host_target):
    """The output's conversion back to N C H W inside each tile (`c // b, c % b` read, `w` written) becomes
    lanes x lanes transposes in registers, the ReLU applied to the transposed vectors."""
    from compiler.build import build
    from compiler.layout import subgraph_layout
    from compiler.passes.tensorize import tensorize_module
    from compiler.target import vector_unit

    lanes = vector_unit(host_target).lanes
    w = make_workload("conv3x3_conv1x1", dict(in_channels=lanes, height=4, width=2 * lanes, mid_channels=lanes,
                                              out_channels=2 * lanes))
    fused = basteln(subgraph_layout(w, lanes), [1, 2 * lanes, 2, 2 * lanes], threshold=1.0, vector=lanes,
                    register=4, register2=1, tensorize=True, lanes=lanes)
    _, reports = tensorize_module(fused.sch.mod, host_target)
    assert f"transpose{lanes}" in reports["main"].used, reports["main"]
    inputs = w.random_inputs()
    out = tvm.runtime.tensor(np.zeros(w.output.shape, "float32"))
    build(fused.sch.mod, host_target)["main"](*[tvm.runtime.tensor(x) for x in inputs], out)
    np.testing.assert_allclose(out.numpy(), w.reference(inputs), rtol=1e-4, atol=1e-4)
