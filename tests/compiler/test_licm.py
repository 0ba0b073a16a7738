"""Loop-invariant code motion (`compiler.passes.licm`): the paper's examples come out hoisted, programs with
side effects are left alone, and every program computes what it computed before (within 1e-5)."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import tirx
from tvm.script import tirx as T

from compiler.arrays import arg_specs, random_inputs
from compiler.build import PIPELINES, compile_module, tir_pipeline
from compiler.passes import PASSES, make_pass
from compiler.pipeline import TVM_DEFAULT
from compiler.passes.licm import cost, licm, without_licm

# ---------------------------------------------------------------------------
# The programs (flattened buffers, as the pass sees them at the end of TVM's pipeline)


@T.prim_func
def vector_add(A: T.Buffer((128,), "float32"), B: T.Buffer((128,), "float32"), C: T.Buffer((128,), "float32")):
    for io in range(4):
        for ii in range(32):
            C[io * 32 + ii] = A[io * 32 + ii] + B[io * 32 + ii]


@T.prim_func
def tiled_matmul(A: T.Buffer((4096,), "float32"), B: T.Buffer((4096,), "float32"), C: T.Buffer((4096,), "float32")):
    # the paper's Sec. II-A matmul after tile(32, 32), split(k, 32), reorder(xo, yo, ko, ki, xi, yi) at 64^3, bn=16
    for xo in range(4):
        for yo in range(4):
            for xi_init in range(16):
                for yi_init in range(16):
                    C[xo * 1024 + xi_init * 64 + yo * 16 + yi_init] = T.float32(0)
            for ko in range(4):
                for ki in range(16):
                    for xi in range(16):
                        for yi in range(16):
                            C[xo * 1024 + xi * 64 + yo * 16 + yi] = (
                                C[xo * 1024 + xi * 64 + yo * 16 + yi]
                                + A[xo * 1024 + xi * 64 + ko * 16 + ki] * B[ko * 1024 + ki * 64 + yo * 16 + yi])


@T.prim_func
def padded_copy(A: T.Buffer((3600,), "float32"), B: T.Buffer((3600,), "float32")):
    # expression (1): only i is the loop variable the condition is evaluated in
    for j in range(60):
        for i in range(60):
            B[j * 60 + i] = T.if_then_else(((3 < i and 3 < j) and i < 56) and j < 56, A[j * 60 + i], T.float32(0))


@T.prim_func
def nested_padded_copy(A: T.Buffer((3600,), "float32"), B: T.Buffer((3600,), "float32")):
    # expression (3): two conditionals with the same "else"
    for j in range(60):
        for i in range(60):
            B[j * 60 + i] = T.if_then_else(3 < i and 3 < j,
                                           T.if_then_else(i < 56 and j < 56, A[j * 60 + i], T.float32(0)),
                                           T.float32(0))


@T.prim_func
def nested_select(A: T.Buffer((3600,), "float32"), B: T.Buffer((3600,), "float32")):
    for j in range(60):
        for i in range(60):
            B[j * 60 + i] = T.Select(3 < i and 3 < j, T.Select(i < 56 and j < 56, A[j * 60 + i], T.float32(0)),
                                     T.float32(0))


@T.prim_func
def branches(A: T.Buffer((1024,), "float32"), B: T.Buffer((1024,), "float32"), C: T.Buffer((1024,), "float32")):
    for j in range(32):
        for i in range(32):
            if i < 20:
                if j < 10:
                    B[j * 32 + i] = A[j * 32 + i] * T.float32(2)
            if i < 20:
                C[j * 32 + i] = A[j * 32 + i] + T.float32(1)


@T.prim_func
def nested_ifs(A: T.Buffer((1024,), "float32"), B: T.Buffer((1024,), "float32")):
    for j in range(32):
        for i in range(32):
            if i < 20:
                if j < 10:
                    B[j * 32 + i] = A[j * 32 + i] * T.float32(2)


@T.prim_func
def accumulate(A: T.Buffer((16,), "float32"), B: T.Buffer((1024,), "float32")):
    # A[j] changes every iteration of i: a load is never hoisted
    for j in range(16):
        A[j] = T.float32(0)
        for i in range(64):
            A[j] = A[j] + B[j * 64 + i]


@T.prim_func
def opaque_call(C: T.Buffer((1024,), "int32")):
    for j in range(16):
        for i in range(64):
            C[j * 64 + i] = T.call_extern("int32", "rand") + j * 3


@T.prim_func
def small_inner(A: T.Buffer((256,), "float32"), C: T.Buffer((256,), "float32")):
    for j in range(64):
        for i in range(4):
            C[j * 4 + i] = A[j * 4 + i]


@T.prim_func
def float_chain(A: T.Buffer((1024,), "float32"), C: T.Buffer((1024,), "float32")):
    for j in range(16):
        for i in range(64):
            C[j * 64 + i] = (A[j * 64 + i] + T.float32(1.5)) + T.float32(2.25)


# ---------------------------------------------------------------------------
# Reading the result


def _walk(stmt, depth=0):
    """(statement, its loop depth) for every statement, outermost first."""
    yield stmt, depth
    if isinstance(stmt, tirx.SeqStmt):
        for s in stmt.seq:
            yield from _walk(s, depth)
    elif isinstance(stmt, tirx.For):
        yield from _walk(stmt.body, depth + 1)
    elif isinstance(stmt, tirx.IfThenElse):
        yield from _walk(stmt.then_case, depth)
        if stmt.else_case is not None:
            yield from _walk(stmt.else_case, depth)
    elif isinstance(stmt, tirx.AttrStmt):
        yield from _walk(stmt.body, depth)


def _binds(func):
    """{str(value): depth} of the names the pass bound."""
    return {str(s.value): d for s, d in _walk(func.body) if isinstance(s, tirx.Bind) and s.var.name.startswith("licm")}


def _stores(func):
    return [(s, d) for s, d in _walk(func.body) if isinstance(s, tirx.BufferStore)]


def _count(expr, kind):
    n = 1 if isinstance(expr, kind) else 0
    for field in ("a", "b", "condition", "true_value", "false_value", "value", "base"):
        child = getattr(expr, field, None)
        if isinstance(child, tvm.ir.Expr):
            n += _count(child, kind)
    for child in list(getattr(expr, "args", None) or []) + list(getattr(expr, "indices", None) or []):
        n += _count(child, kind)
    return n


def _run(func, pipeline, inputs):
    mod = tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
    lib = compile_module(mod, tvm.target.Target("llvm"), pipeline)
    args = [tvm.runtime.tensor(a.copy()) for a in inputs]
    lib["main"](*args)
    return [a.numpy() for a in args]


def _assert_same_results(func, transformed):
    inputs = random_inputs(arg_specs(func))
    before = _run(func, "default", inputs)
    after = _run(transformed, "default", inputs)
    for b, a in zip(before, after, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------


def test_vector_add_hoists_the_outer_index():
    out = licm(vector_add)
    assert _binds(out) == {"io * 32": 1}, out.script()
    (store, depth), = _stores(out)
    assert depth == 2 and str(store.indices[0]) == "licm1 + ii", out.script()
    assert _count(store.value, tirx.Mul) == 0
    _assert_same_results(vector_add, out)


def test_matmul_index_expressions_hoisted_to_their_loops():
    out = licm(tiled_matmul)
    binds = _binds(out)
    # every prefix of an index, rebuilt in rank order, is bound in the loop it last depends on
    # xo and yo have 4 iterations (LLVM unrolls such loops): xo * 1024 waits for yo's term
    assert binds.get("xo * 1024 + yo * 16") == 2 and binds.get("yo * 16 + ko * 1024") == 3, out.script()
    update, depth = _stores(out)[-1]
    assert depth == 6
    # in the innermost loop: no integer multiply; each index is a name, or a name + yi
    for index in [update.indices[0], *(load.indices[0] for load in _loads(update.value))]:
        assert isinstance(index, tvm.ir.Var) or (isinstance(index, tirx.Add) and isinstance(index.a, tvm.ir.Var)
                                                 and index.b.name == "yi"), (str(index), out.script())
    assert _count(update.value, tirx.Mul) == 1  # the float multiply A * B alone
    _assert_same_results(tiled_matmul, out)


def _loads(expr):
    if isinstance(expr, tvm.ir.TensorLoad):
        return [expr]
    found = []
    for field in ("a", "b", "condition", "true_value", "false_value", "value"):
        child = getattr(expr, field, None)
        if isinstance(child, tvm.ir.Expr):
            found += _loads(child)
    for child in getattr(expr, "args", None) or []:
        found += _loads(child)
    return found


def test_expression_1_is_regrouped_by_rank_and_its_invariant_half_hoisted():
    out = licm(padded_copy)
    assert _binds(out).get("3 < j and j < 56") == 1, out.script()  # expression (2)'s invariant half
    (store, _), = _stores(out)
    cond = store.value.args[0]
    assert isinstance(cond, tirx.And) and isinstance(cond.a, tvm.ir.Var), str(cond)
    assert str(cond.b) == "3 < i and i < 56", str(cond)
    _assert_same_results(padded_copy, out)


@pytest.mark.parametrize("func", [nested_padded_copy, nested_select], ids=["if_then_else", "select"])
def test_expression_3_collapses_into_expression_4(func):
    out = licm(func)
    (store, _), = _stores(out)
    value = store.value
    then = value.args[1] if isinstance(value, tvm.ir.Call) else value.true_value
    cond = value.args[0] if isinstance(value, tvm.ir.Call) else value.condition
    assert isinstance(then, tvm.ir.TensorLoad), f"one conditional left: {value}"
    assert _binds(out).get("3 < j and j < 56") == 1 and str(cond.b) == "3 < i and i < 56", out.script()
    _assert_same_results(func, out)


def test_nested_ifs_collapse_and_adjacent_ifs_merge():
    out = licm(branches)
    ifs = [s for s, _ in _walk(out.body) if isinstance(s, tirx.IfThenElse)]
    # the two adjacent if (i < 20) became one; inside it, if (j < 10) tests a name bound outside the i loop
    assert len(ifs) == 2 and str(ifs[0].condition) == "i < 20", out.script()
    assert ifs[1].condition.same_as(next(s.var for s, _ in _walk(out.body) if isinstance(s, tirx.Bind)
                                         and str(s.value) == "j < 10")), out.script()
    _assert_same_results(branches, out)
    out = licm(nested_ifs)
    (branch,) = [s for s, _ in _walk(out.body) if isinstance(s, tirx.IfThenElse)]
    assert isinstance(branch.condition, tirx.And), out.script()
    assert {str(branch.condition.a), str(branch.condition.b)} == {"i < 20", "licm1"}, out.script()
    assert _binds(out).get("j < 10") == 1, out.script()
    _assert_same_results(nested_ifs, out)


def test_loads_that_a_loop_changes_stay_in_it():
    out = licm(accumulate)
    (_, _), (update, depth) = _stores(out)
    assert depth == 2 and len(_loads(update.value)) == 2, out.script()
    assert all("A[" not in value for value in _binds(out)), out.script()
    _assert_same_results(accumulate, out)


def test_calls_with_side_effects_are_left_in_place():
    out = licm(opaque_call)
    (store, depth), = _stores(out)
    assert depth == 2 and "rand" in str(store.value), out.script()
    assert all("rand" not in value for value in _binds(out)), out.script()


def test_loops_llvm_unrolls_count_for_nothing():
    assert _binds(licm(small_inner)) == {}, "i has 4 iterations: LLVM unrolls it, hoisting saves nothing"
    out = licm(small_inner, unrolled_extent=2)
    assert _binds(out) == {"j * 4": 1}, out.script()
    _assert_same_results(small_inner, out)


def test_a_function_marked_without_licm_is_left_alone():
    assert licm(without_licm(vector_add)).body.same_as(vector_add.body)


def test_threshold_gates_what_is_hoisted():
    assert _binds(licm(vector_add, threshold=2)) == {}, "io * 32 costs 1"
    assert cost(tirx.FloorDiv(tirx.Var("x", "int32"), 1024) + tirx.Var("y", "int32")) == 4  # the paper's x/1024+y


def test_floating_point_is_not_reassociated():
    out = licm(float_chain)
    (store, _), = _stores(out)
    # (A[...] + 1.5) + 2.25 as written: 1.5 + 2.25 first would round differently
    assert isinstance(store.value.a, tirx.Add) and isinstance(store.value.a.a, tvm.ir.TensorLoad), str(store.value)
    assert float(store.value.b.value) == 2.25
    _assert_same_results(float_chain, out)


def test_every_build_runs_the_pass_last_and_keeps_its_names():
    """Through `compile_module`: the names survive TVM's whole pipeline, and all three pipelines agree."""
    from tvm import te
    from tvm.tirx import compilation_pipeline

    n = 64
    A = te.placeholder((n, n), name="A")
    B = te.placeholder((n, n), name="B")
    k = te.reduce_axis((0, n), "k")
    C = te.compute((n, n), lambda x, y: te.sum(A[x, k] * B[k, y], axis=k), name="C")
    sch = tvm.s_tir.Schedule(te.create_prim_func([A, B, C]))
    x, y, kk = sch.get_loops(sch.get_sblock("C"))
    xo, xi = sch.split(x, [None, 16])
    yo, yi = sch.split(y, [None, 16])
    ko, ki = sch.split(kk, [None, 16])
    sch.reorder(xo, yo, ko, ki, xi, yi)
    target = tvm.target.Target("llvm")
    lowering, _, _ = compilation_pipeline.get_tir_pipeline(tir_pipeline("licm"))
    lowered = lowering(tvm.tirx.transform.BindTarget(target.with_host(target))(sch.mod))
    text = "\n".join(f.script() for _, f in lowered.functions.items())
    assert "licm" in text, "our names were substituted back or never made"
    a, b = np.random.default_rng(0).standard_normal((2, n, n)).astype("float32")
    for pipeline in ("default", *PIPELINES):
        lib = compile_module(sch.mod, target, pipeline)
        c = tvm.runtime.tensor(np.zeros((n, n), "float32"))
        lib["main"](tvm.runtime.tensor(a), tvm.runtime.tensor(b), c)
        np.testing.assert_allclose(c.numpy(), a @ b, rtol=1e-5, atol=1e-4, err_msg=pipeline)
    with pytest.raises(ValueError, match="unknown TIR pipeline"):
        tir_pipeline("fast")
    with pytest.raises(ValueError, match="unknown pass: fast"):
        make_pass("fast")
    assert all(name in PASSES for names in PIPELINES.values() for name in names if name != TVM_DEFAULT)
