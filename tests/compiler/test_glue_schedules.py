"""The default schedule's glue rules (`compiler.workloads.model.glue`): each takes the blocks of its kind, leaves
the others, and computes what the unscheduled function computes; a corpus model built untuned still matches
torch. No timings here (`python -m bench.glue` measures them)."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable

import numpy as np
import pytest
import tvm
from tvm import relax, s_tir, te, topi
from tvm.s_tir.dlight.analysis import normalize_prim_func
from tvm.s_tir.dlight.base import try_inline_contiguous_spatial

from compiler.arrays import arg_specs
from compiler.pipeline import compile_module
from compiler.workloads.model import build as B
from compiler.workloads.model import glue

CORES = 2


def _run(func: tvm.tirx.PrimFunc, args: list[np.ndarray], target: object) -> list[np.ndarray]:
    """The arguments after one call: built as the model build does for `target`, with TVM's defaults for None."""
    lib = tvm.compile(tvm.IRModule({"main": func}), target="llvm") if target is None else \
        compile_module(tvm.IRModule({"main": func}), target)
    dev = tvm.cpu(0)
    arrays = [tvm.runtime.tensor(a, dev) for a in args]
    lib(*arrays)
    return [a.numpy() for a in arrays]


def _inputs(func: tvm.tirx.PrimFunc, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(dtype) for shape, dtype in arg_specs(func)]


def _taken(func: tvm.tirx.PrimFunc, lanes: int) -> list[str]:
    """The glue rules that take the function's blocks, one name per block (after dlight's preamble)."""
    sch = s_tir.Schedule(func)
    names = []
    for info in try_inline_contiguous_spatial(sch, normalize_prim_func(sch)):
        rule = next((r for r in glue.GLUE_RULES if r(sch, info, CORES, lanes, B.PARALLEL_MIN_WORK)), None)
        names.append(rule.__name__ if rule else "plain")
    return names


def _check(func: tvm.tirx.PrimFunc, lanes: int, min_parallel_work: int, host_target: object, exact: bool) -> None:
    """The default schedule (glue rules on) computes what the unscheduled function computes, and differs from the
    plain rule's (a rule took a block and nothing fell back)."""
    scheduled = B.default_cpu_schedule(func, CORES, lanes, min_parallel_work)
    plain = B.default_cpu_schedule(func, CORES, lanes, min_parallel_work, glue=False)
    assert not _same(scheduled, plain), "no glue rule changed the function"
    args = _inputs(func)
    got = _run(scheduled, [a.copy() for a in args], host_target)[-1]  # the output, the last argument
    want = _run(func, [a.copy() for a in args], None)[-1]
    if exact:  # a copy moves values
        np.testing.assert_array_equal(got, want)
    else:  # a reduction in another order: the last bits may differ
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _same(a: tvm.tirx.PrimFunc, b: tvm.tirx.PrimFunc) -> bool:
    try:
        tvm.ir.assert_structural_equal(a, b)
    except ValueError:
        return False
    return True


# -- channel reductions: means and pools in NCHWc ------------------------------------------------------------------


def _mean(shape: tuple[int, ...]) -> tvm.tirx.PrimFunc:
    x = te.placeholder(shape, name="x")
    total = topi.sum(x, axis=(2, 3), keepdims=True)
    return te.create_prim_func([x, topi.divide(total, float(shape[2] * shape[3]))])


def _pool(shape: tuple[int, ...], kind: str) -> tvm.tirx.PrimFunc:
    x = te.placeholder(shape, name="x")
    out = topi.nn.pool2d(x, (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), kind, layout=f"NCHW{shape[-1]}c",
                         count_include_pad=False)
    return te.create_prim_func([x, out])


CHANNEL_CASES = {
    "mean 14x14 c16": lambda: _mean((1, 6, 14, 14, 16)),  # squeeze-excite's mean in NCHW16c
    "mean 13x13 c8": lambda: _mean((1, 5, 13, 13, 8)),
    "mean one block": lambda: _mean((1, 1, 28, 28, 16)),  # no outer spatial loop but the channels'
    "max pool c8": lambda: _pool((1, 3, 28, 28, 8), "max"),
    "avg pool c16": lambda: _pool((1, 2, 15, 15, 16), "avg"),
}


@pytest.mark.parametrize("lanes", [8, 16])
@pytest.mark.parametrize("min_parallel_work", [0, B.PARALLEL_MIN_WORK])
@pytest.mark.parametrize("case", sorted(CHANNEL_CASES))
def test_channel_reductions_vectorize_the_channel_block(case, lanes, min_parallel_work, host_target):
    func = CHANNEL_CASES[case]()
    assert "channel_reduction" in _taken(func, lanes)
    _check(func, lanes, min_parallel_work, host_target, exact=False)


def test_a_reduction_over_the_contiguous_axis_is_no_channel_reduction():
    """A mean over W in NCHW reads W contiguously: that is a row reduction, not a channel one."""
    x = te.placeholder((1, 8, 4, 64), name="x")
    func = te.create_prim_func([x, topi.sum(x, axis=3)])
    assert _taken(func, 16) == ["row_reduction"]


# -- row reductions: softmax, layer norm --------------------------------------------------------------------------


def _softmax(shape: tuple[int, ...], fast: bool = False) -> tvm.tirx.PrimFunc:
    x = te.placeholder(shape, name="x")
    return te.create_prim_func([x, (topi.nn.fast_softmax if fast else topi.nn.softmax)(x, -1)])


def _layer_norm(shape: tuple[int, ...]) -> tvm.tirx.PrimFunc:
    x = te.placeholder(shape, name="x")
    gamma, beta = te.placeholder(shape[-1:], name="gamma"), te.placeholder(shape[-1:], name="beta")
    return te.create_prim_func([x, gamma, beta, topi.nn.layer_norm(x, gamma, beta, [-1])])


ROW_CASES = {
    "softmax 32": lambda: _softmax((1, 4, 32, 32)),
    "fast softmax 16": lambda: _softmax((1, 4, 16, 16), fast=True),  # one vector per row
    "softmax 256": lambda: _softmax((8, 256)),
    "layer norm 64": lambda: _layer_norm((1, 32, 64)),
    "layer norm 768": lambda: _layer_norm((2, 768)),
}


@pytest.mark.parametrize("lanes", [8, 16])
@pytest.mark.parametrize("min_parallel_work", [0, B.PARALLEL_MIN_WORK])
@pytest.mark.parametrize("case", sorted(ROW_CASES))
def test_row_reductions_reduce_in_vectors(case, lanes, min_parallel_work, host_target):
    func = ROW_CASES[case]()
    assert "row_reduction" in _taken(func, lanes)
    _check(func, lanes, min_parallel_work, host_target, exact=False)


def test_rows_that_no_vector_divides_keep_the_plain_rule(host_target):
    func = _softmax((1, 4, 20, 20))
    assert "row_reduction" not in _taken(func, 16)
    args = _inputs(func)
    got = _run(B.default_cpu_schedule(func, CORES, 16), [a.copy() for a in args], host_target)
    np.testing.assert_allclose(got[-1], _run(func, [a.copy() for a in args], None)[-1], rtol=1e-5, atol=1e-5)


# -- layout copies: NCHW <-> NCHWc, transposes ----------------------------------------------------------------------


def _transform(shape: tuple[int, ...], index_map: Callable[..., tuple]) -> tvm.tirx.PrimFunc:
    """Relax's `layout_transform` as a model has it (legalized: a block over the input, writing where the map
    sends each element), the conversions `compiler.workloads.model` inserts."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        bb.emit_func_output(bb.emit(relax.op.layout_transform(x, index_map)))
    mod = relax.transform.LegalizeOps()(bb.get())
    (func,) = [f for _, f in mod.functions.items() if isinstance(f, tvm.tirx.PrimFunc)]
    return func.with_attr("global_symbol", "main")  # as a model's task has it


def _blocked(c: int) -> Callable[..., tuple]:
    return lambda n, ch, h, w: (n, ch // c, h, w, ch % c)


def _unblocked(c: int) -> Callable[..., tuple]:
    return lambda n, ch, h, w, cb: (n, ch * c + cb, h, w)


COPY_CASES = {
    "NCHW to NCHW16c": lambda: _transform((1, 48, 28, 28), _blocked(16)),
    "NCHW8c to NCHW": lambda: _transform((1, 6, 28, 28, 8), _unblocked(8)),
    "NCHW16c to NCHW 14x14": lambda: _transform((1, 3, 14, 14, 16), _unblocked(16)),
    "image to NCHW3c": lambda: _transform((1, 3, 64, 64), _blocked(3)),  # rows of 3: tiles read along W
    "NCHW8c to NCHW wide": lambda: _transform((1, 2, 4, 128, 8), _unblocked(8)),  # rows of 128, split
}


@pytest.mark.parametrize("lanes", [8, 16])
@pytest.mark.parametrize("min_parallel_work", [0, B.PARALLEL_MIN_WORK])
@pytest.mark.parametrize("case", sorted(COPY_CASES))
def test_layout_copies_store_in_the_written_order(case, lanes, min_parallel_work, host_target):
    func = COPY_CASES[case]()
    assert _taken(func, lanes) == ["layout_copy"]
    _check(func, lanes, min_parallel_work, host_target, exact=True)


@pytest.mark.parametrize("func", [
    # NCHW16c -> NCHW at 7x7: rows of 7 are under half a vector, and the written axis is not one loop of the
    # read order
    lambda: _transform((1, 12, 7, 7, 16), _unblocked(16)),
    # TE's own transforms and transposes are computed in the written order already: the plain rule's order
    lambda: te.create_prim_func([x := te.placeholder((1, 48, 28, 28), name="x"),
                                 topi.layout_transform(x, "NCHW", "NCHW16c")]),
    lambda: te.create_prim_func([x := te.placeholder((48, 64), name="x"), topi.transpose(x, (1, 0))]),
])
def test_copies_the_plain_rule_already_orders_keep_it(func):
    func = func()
    assert _taken(func, 16) == ["plain"]
    tvm.ir.assert_structural_equal(B.default_cpu_schedule(func, CORES, 16),
                                   B.default_cpu_schedule(func, CORES, 16, glue=False))


def test_elementwise_concat_and_shuffle_keep_the_plain_rule():
    x, y = te.placeholder((1, 3, 14, 14, 16), name="x"), te.placeholder((1, 3, 14, 14, 16), name="y")
    concat = te.create_prim_func([x, y, topi.concatenate([x, y], axis=1)])
    gelu = te.create_prim_func([x, topi.multiply(x, topi.sigmoid(topi.multiply(x, 1.702)))])
    for func in (concat, gelu):
        assert set(_taken(func, 16)) == {"plain"}
        tvm.ir.assert_structural_equal(B.default_cpu_schedule(func, CORES, 16),
                                       B.default_cpu_schedule(func, CORES, 16, glue=False))


def test_convolutions_and_matrix_products_keep_the_plain_rule():
    """Complex operators are tuned or get their own schedule: an untuned conv in NCHWc (its output channel block
    innermost, like a pool's) or a matrix product along contiguous rows (like a row reduction) is no glue."""
    a, w = te.placeholder((32, 64), name="a"), te.placeholder((48, 64), name="w")
    k = te.reduce_axis((0, 64), "k")
    dense = te.create_prim_func([a, w, te.compute((32, 48), lambda i, j: te.sum(a[i, k] * w[j, k], axis=k))])
    data, kernel = te.placeholder((1, 2, 14, 14, 16), name="x"), te.placeholder((2, 2, 3, 3, 16, 16), name="k")
    with tvm.target.Target("llvm"):  # topi's NCHWc conv asks the target
        out = topi.nn.conv2d_NCHWc(data, kernel, 1, 1, 1, "NCHW16c", "NCHW16c")
    conv = te.create_prim_func([data, kernel, out])
    for func in (dense, conv):
        assert "channel_reduction" not in _taken(func, 16) and "row_reduction" not in _taken(func, 16)
        tvm.ir.assert_structural_equal(B.default_cpu_schedule(func, CORES, 16),
                                       B.default_cpu_schedule(func, CORES, 16, glue=False))


def test_a_rule_refused_half_way_leaves_the_function_to_the_plain_rule(monkeypatch):
    """A glue rule that changed the schedule and then raised: the whole function gets the plain rule, from the
    unscheduled function (never a half-applied schedule)."""

    def broken(sch, info, cores, lanes, min_parallel_work):
        sch.split(info.get_loops()[-1], [None, 2])
        raise RuntimeError("refused")

    func = _mean((1, 6, 14, 14, 16))
    monkeypatch.setattr(B, "GLUE_RULES", (broken,))
    tvm.ir.assert_structural_equal(B.default_cpu_schedule(func, CORES, 16),
                                   B.default_cpu_schedule(func, CORES, 16, glue=False))


# -- a corpus model built untuned ------------------------------------------------------------------------------------


@pytest.mark.builds_model
@pytest.mark.parametrize("name", ["gpt_block", "squeezenet1_1", "shufflenet_v2_x0_5"])
def test_corpus_model_built_untuned_matches_torch(name, host_target):
    """The untuned build (every task under the default schedule) of a corpus model whose glue the rules take:
    the GPT block's softmax and layer norms, SqueezeNet's image conversion, pools and NCHWc mean, ShuffleNet's
    conversions between NCHW and NCHWc."""
    pytest.importorskip("torch")
    if importlib.util.find_spec("torchvision") is None:  # imported through bench.corpus' stub, never directly
        pytest.skip("torchvision is not installed (pip install -e '.[dev]')")
    from bench.corpus import export, flat_inputs
    from compiler.workloads import model as M

    ep = export(name)
    inputs = flat_inputs(ep)
    model = M.import_model(ep, layout="blocked", target=host_target)
    lanes = M.vector_lanes(host_target)
    taken = {rule for t in model.tasks if not t.complex for rule in _taken(t.prim_func, lanes)} - {"plain"}
    assert taken, [t.name for t in model.tasks]
    outs = M.run_model(M.build_model(model, host_target), inputs, host_target)
    problem = M.compare_outputs(outs, M.reference_outputs(ep, inputs), **M.tolerance(model))
    assert problem is None, problem
