"""`exp` of float32 as arithmetic that stays vectorized: the pass our TIR pipelines run after TVM's own passes.

TVM lowers `exp` to LLVM's `llvm.exp` intrinsic; without a vector math library LLVM calls the C library's
`expf` once per lane, so a softmax over BERT-base's attention scores (12 x 128 x 128) took 0.33 ms on two
cores where its loads and adds take a few microseconds. Here every float32 `exp` call is replaced by the
classic range reduction and polynomial (Cody and Waite; Cephes' `expf` coefficients), which LLVM keeps in
vector registers:

    n = floor(x * log2(e) + 1/2)             x clamped to [-103.97, 88.72]
    r = x - n * ln2_hi - n * ln2_lo          |r| <= ln(2) / 2, ln2 split so that n * ln2_hi is exact
    p = 1 + r + r^2 * P(r)                   P of degree 5 (minimax): about 1 ulp
    exp(x) = p * 2^(n >> 1) * 2^(n - (n >> 1))   each power built in the exponent bits (never out of range)

with exp(x) = +inf above 88.72 (float32 overflows there), 0 below -103.97 (below the smallest denormal), and
NaN for NaN (told by its bits). Denormal results are rounded by the last multiplication, as the hardware rounds them.

Layering: `compiler` never imports `tuner` or `service`; TVM is imported inside functions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .tensorize import _ir

if TYPE_CHECKING:
    import tvm

LOG2E = 1.44269504088896341
LN2_HI = 0.693359375  # 8 significant bits: n * LN2_HI is exact for |n| < 2^16
LN2_LO = -2.12194440e-4
# Cephes expf: exp(r) ~ 1 + r + r^2 * P(r) on [-ln2/2, ln2/2]
P = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1)
HIGH = 88.72283905206835  # ln(FLT_MAX)
LOW = -103.97207708  # ln(2^-150): below it exp rounds to 0


def exp_f32(x: tvm.ir.PrimExpr) -> tvm.ir.PrimExpr:
    """The expression above for a float32 (scalar or vector) `x`."""
    from tvm import tirx

    dtype = str(x.ty.dtype)
    lanes = x.ty.dtype.lanes
    int_type = "int32" if lanes == 1 else f"int32x{lanes}"

    def c(v: float) -> Any:
        return tirx.const(v, "float32") if lanes == 1 else tirx.Broadcast(tirx.const(v, "float32"), lanes)

    def ci(v: int) -> Any:
        return tirx.const(v, "int32") if lanes == 1 else tirx.Broadcast(tirx.const(v, "int32"), lanes)

    xc = tirx.Max(tirx.Min(x, c(HIGH)), c(LOW))
    n = tirx.floor(xc * c(LOG2E) + c(0.5))
    r = xc - n * c(LN2_HI) - n * c(LN2_LO)
    p = c(P[0])
    for coefficient in P[1:]:
        p = p * r + c(coefficient)
    y = p * (r * r) + r + c(1.0)
    ni = tirx.Cast(int_type, n)
    half = tirx.shift_right(ni, ci(1))

    def power(k: Any) -> Any:  # 2^k for k in [-126, 127]: the exponent bits
        return tirx.reinterpret(dtype, tirx.shift_left(k + ci(127), ci(23)))

    value = y * power(half) * power(ni - half)
    value = tirx.Select(x > c(HIGH), c(float("inf")), tirx.Select(x < c(LOW), c(0.0), value))
    # NaN stays NaN (the clamp made it a number); told by its bits: TVM compiles with LLVM's NoNaNsFPMath, under
    # which `x != x` folds to false
    nan = tirx.reinterpret(int_type, x) & ci(0x7FFFFFFF) > ci(0x7F800000)
    return tirx.Select(nan, x, value)


def rewrite_exp(func: tvm.tirx.PrimFunc) -> tvm.tirx.PrimFunc:
    """`func` with every float32 `exp` call replaced by `exp_f32` (the same object where there is none)."""
    import tvm

    exp = tvm.ir.Op.get("tirx.exp")

    found = []

    def fn(e: Any) -> Any | None:
        if isinstance(e, tvm.ir.expr.Call) and e.op.same_as(exp) and str(e.ty.dtype).split("x")[0] == "float32":
            found.append(e)
            return exp_f32(_ir.rewrite(e.args[0], fn))
        return None

    body = _ir.map_stmt(func.body, lambda e: _ir.rewrite(e, fn))
    return func.with_body(body) if found else func


def vector_exp_pass() -> tvm.transform.Pass:
    """The module pass: `rewrite_exp` on every PrimFunc."""
    import tvm

    @tvm.transform.module_pass(opt_level=0, name="altune.VectorExp")
    def _pass(mod: tvm.IRModule, _ctx: Any) -> tvm.IRModule:
        out = {}
        for gv, func in mod.functions.items():
            if isinstance(func, tvm.tirx.PrimFunc):
                new = rewrite_exp(func)
                if not new.same_as(func):
                    out[gv] = new
        if not out:
            return mod
        mod = tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
        for gv, func in out.items():
            mod[gv] = func
        return mod

    return _pass
