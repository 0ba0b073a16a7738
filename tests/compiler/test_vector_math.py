"""float32 `exp` as vectorizable arithmetic (`compiler.passes.vector_math`): within 2 ulp of the exact value over
float32's range, the special values right, and no call of LLVM's scalar `exp` left in what our pipeline builds."""

from __future__ import annotations

import numpy as np
import pytest

tvm = pytest.importorskip("tvm")

from tvm import s_tir, te  # noqa: E402

from compiler.build import build, compile_module  # noqa: E402

N = 1 << 16


def _exp_module(lanes: int):
    x = te.placeholder((N,), name="x")
    y = te.compute((N,), lambda i: te.exp(x[i]), name="y")
    sch = s_tir.Schedule(te.create_prim_func([x, y]).with_attr("global_symbol", "main"))
    _, inner = sch.split(sch.get_loops(sch.get_sblock("y"))[0], [None, lanes])
    sch.vectorize(inner)
    return sch.mod


@pytest.mark.parametrize("lanes", [1, 8, 16])
def test_exp_is_within_two_ulp_and_keeps_the_special_values(lanes, host_target):
    specials = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 88.72, 88.73, -87.4, -103.9, -104.5, 1e-30, -1e-30],
                        "float32")
    xs = np.concatenate([np.linspace(-104, 89, N - len(specials), dtype="float32"), specials])
    out = tvm.runtime.tensor(np.zeros(N, "float32"))
    build(_exp_module(lanes), host_target)["main"](tvm.runtime.tensor(xs), out)
    got, exact = out.numpy(), np.exp(xs.astype("float64"))
    normal = np.isfinite(exact) & (exact >= np.finfo("float32").tiny) & (exact <= np.finfo("float32").max)
    ulp = np.spacing(exact[normal].astype("float32")).astype("float64")
    assert np.max(np.abs(got[normal] - exact[normal]) / ulp) <= 2.0
    tail = got[-len(specials):]
    assert np.isnan(tail[0]) and tail[1] == np.inf and tail[2] == 0.0 and tail[3] == tail[4] == 1.0
    assert tail[6] == np.inf and tail[9] == 0.0  # above ln(FLT_MAX); below the smallest denormal
    # denormal results: within one denormal step of the exact value rounded to float32
    np.testing.assert_allclose(tail[7:9], np.exp(specials[7:9].astype("float64")).astype("float32"), rtol=0,
                               atol=1.5e-45)
    np.testing.assert_array_equal(tail[10:], [1.0, 1.0])


def test_our_pipeline_leaves_no_scalar_exp_call(host_target):
    ours = compile_module(_exp_module(16), host_target).mod.inspect_source("ll")
    tvms = compile_module(_exp_module(16), host_target, "default").mod.inspect_source("ll")
    assert "llvm.exp" in tvms and "expf" not in tvms  # TVM's own: LLVM's intrinsic, one libm call per lane
    assert "llvm.exp" not in ours and "expf" not in ours


def _elementwise(fn, lanes: int, n: int = N):
    x = te.placeholder((n,), name="x")
    y = te.compute((n,), lambda i: fn(x[i]), name="y")
    sch = s_tir.Schedule(te.create_prim_func([x, y]).with_attr("global_symbol", "main"))
    _, inner = sch.split(sch.get_loops(sch.get_sblock("y"))[0], [None, lanes])
    sch.vectorize(inner)
    return sch.mod


@pytest.mark.parametrize("name", ["sigmoid", "tanh", "erf"])
def test_sigmoid_tanh_and_erf_stay_vectorized_and_accurate(name, host_target):
    """TVM lowers sigmoid and tanh into `llvm.exp` after our pass, and erf to one libm `erff` call per lane (GELU):
    ours leaves neither, within a few ulp of the exact value, NaN kept."""
    import math

    fn = {"sigmoid": te.sigmoid, "tanh": te.tanh, "erf": te.erf}[name]
    exact = {"sigmoid": lambda v: 1 / (1 + np.exp(-v)), "tanh": np.tanh, "erf": np.vectorize(math.erf)}[name]
    specials = np.array([np.nan, 0.0, 1e-6, -1e-6, 30.0, -30.0], "float32")
    xs = np.concatenate([np.linspace(-12, 12, N - len(specials), dtype="float32"), specials])
    mod = _elementwise(fn, 16)
    source = compile_module(mod, host_target).mod.inspect_source("ll")
    assert "llvm.exp" not in source and "erff" not in source and "expf" not in source
    out = tvm.runtime.tensor(np.zeros(N, "float32"))
    build(mod, host_target)["main"](tvm.runtime.tensor(xs), out)
    got, want = out.numpy(), exact(xs.astype("float64"))
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=5e-7, atol=5e-7)
    assert np.isnan(got[-len(specials)])
