"""Instruction selection (the paper's Sec. IV-D): a tree pattern per instruction family with parameter
extraction; the marked nest is rewritten to the instruction, or left exactly as it was when the match fails.

The patterns, over lowered TIR (after `LowerOpaqueBlock`, buffers still multi-dimensional; after `partition`,
so a nest that had a boundary branch has none in its main part):

outer product (a register-blocked micro-kernel; fp32 FMA with group 1, int8/bf16 dot products with group G):

    for r in [r0, r0 + R):              <- the marked loop (reduction)
      for i in [i0, i0 + MR):           rows (accumulator rows)
        [for v in [v0, v0 + NV):]       optional vector loop
          for l in [l0, l0 + NL):       lanes, NL a multiple of the instruction's lanes L
            [for g in [g0, g0 + G):]    the instruction's group (dot products)
              C[c] = C[c] + X(A[a]) * X(B[b])     X: nothing, or a cast to C's type

    a nest with no rows loop (a batch-1 linear) matches as one row (MR = 1);
    parameters extracted (row-major element offsets of the indices, strides by `tir_util.coefficient`):
    C's offset has stride 1 in l and 0 in r, g; A's stride 0 in v, l and 1 in g; B's stride 0 in i,
    1 in l (G = 1) or G in l and 1 in g; the operand types pick the instruction (`instructions.choose`).
    Rewrite: MR * NV * NL / L vector accumulators (a local buffer of vector type, constant indices, which
    LLVM keeps in registers) loaded from C before the r loop, one instruction per accumulator per r
    iteration (A's group broadcast, B's L * G contiguous elements), stored back after it.

elementwise (`C[c] = f(loads, constants)` with f of + - * min max casts, every access stride 0 or 1 in the
marked innermost loop): rewritten to vector code of the target's width (the loop split by the lane count
and vectorized; TVM's `VectorizeLoop` then emits the vector instructions).

Layering: `compiler` never imports `tuner` or `service`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import tvm
from tvm import tirx
from tvm_ffi import structural_equal

from ... import tir_util
from ...target import vector_unit
from .instructions import INSTRUCTIONS, Instruction, candidates_for
from .mark import ANNOTATION
from .transpose import match_transpose, rewrite_transpose

MAX_ACCUMULATORS = 32  # a rewrite of more accumulators than this would be all spills: left alone


def _groups(dtype: str) -> tuple[int, ...]:
    """The group sizes of the instructions that take `dtype` operands, largest first (int8: 4 for VNNI and
    `vpmaddubsw`, 2 for `vpmaddwd`)."""
    return tuple(sorted({i.group for i in INSTRUCTIONS if dtype in (i.a_dtype, i.b_dtype)}, reverse=True))


@dataclass(frozen=True)
class Columns:
    """One column group of an outer product: its loops below the rows and its accesses (buffer, offset).
    The partition may leave several groups side by side under the rows loop (a lane remainder beside whole
    vectors), each with its own loop variables."""

    v: Any | None
    l: Any  # noqa: E741 - the lane loop
    g: Any | None
    c: Any
    a: Any
    b: Any
    partial: bool  # its lane loop is no multiple of the lanes: the last vector is partial

    def vectors(self, lanes: int) -> int:
        return (tir_util.const_extent(self.v) if self.v is not None else 1) * -(-tir_util.const_extent(self.l) // lanes)


@dataclass(frozen=True)
class OuterProduct:
    """The parameters of a matched outer-product nest (see the module docstring)."""

    instruction: Instruction
    r: Any  # the marked For
    i: Any
    columns: tuple[Columns, ...]

    @property
    def accumulators(self) -> int:
        return tir_util.const_extent(self.i) * sum(c.vectors(self.instruction.lanes) for c in self.columns)


@dataclass
class Report:
    """What `tensorize` did to one function: instructions used, and marked nests left alone with the reason."""

    used: list[str]
    left: list[str]


def tensorize(func: tvm.tirx.PrimFunc, target: tvm.target.Target, exact: bool = False
              ) -> tuple[tvm.tirx.PrimFunc, Report]:
    """Rewrites every marked nest of a lowered, partitioned function that matches a pattern.

    Args:
        func: the function (after `LowerOpaqueBlock` and `partition.partition`).
        target: the LLVM target; only its instructions are used (`instructions.available`).
        exact: use only instructions that never saturate.

    Returns:
        The function and a `Report`.
    """
    report = Report([], [])
    ranges: dict[int, tuple[Any, int, int]] = {}  # the enclosing loops: handle -> (var, min, extent)

    def visit(s: Any) -> Any | None:
        if isinstance(s, tirx.For) and ANNOTATION in s.annotations:
            kind = str(s.annotations[ANNOTATION])
            out = None
            why = "no pattern"
            if kind in ("auto", "outer_product"):
                m, why = match_outer_product(s, target, exact, list(ranges.values()))
                if m is not None:
                    out = rewrite_outer_product(m)
                    report.used.append(m.instruction.name)
            if out is None and kind in ("auto", "elementwise"):
                out, why2 = rewrite_elementwise(s, target)
                if out is not None:
                    report.used.append("elementwise")
                why = why if kind == "outer_product" else why2 if kind == "elementwise" else f"{why}; {why2}"
            if out is None and kind in ("auto", "transpose"):
                t, why3 = match_transpose(s, vector_unit(target).bits, list(ranges.values()))
                if t is not None:
                    out = rewrite_transpose(t)
                    report.used.append(f"transpose{t.lanes}")
                why = why3 if kind == "transpose" else f"{why}; {why3}"
            if out is None:
                report.left.append(f"{s.loop_var.name}: {why}")
                return _unmark(s)
            return out
        if isinstance(s, tirx.For) and tir_util.const_int(s.min) is not None and tir_util.const_int(s.extent) is not None:
            ranges[tir_util.key(s.loop_var)] = (s.loop_var, tir_util.const_int(s.min), tir_util.const_int(s.extent))
            try:
                body = tir_util.map_stmt(s.body, lambda e: e, visit)
            finally:
                del ranges[tir_util.key(s.loop_var)]
            return tirx.For(s.loop_var, s.min, s.extent, s.kind, body, s.thread_binding, s.annotations, s.step)
        return None

    body = tir_util.map_stmt(func.body, lambda e: e, visit)
    for code in dict.fromkeys(ins.llvm_ir for ins in INSTRUCTIONS if ins.name in report.used and ins.llvm_ir):
        # the IR of an instruction's function, linked in by TVM's code generator (`Instruction.llvm_ir`)
        body = tirx.AttrStmt(tirx.const(0, "int32"), "pragma_import_llvm", tvm.ir.StringImm(code), body)
    return func.with_body(body), report


def _unmark(s: Any) -> Any:
    annotations = {k: v for k, v in s.annotations.items() if k != ANNOTATION}
    return tirx.For(s.loop_var, s.min, s.extent, s.kind, s.body, s.thread_binding, annotations, s.step)


def _column_kinds() -> tuple[Any, ...]:
    # a column loop the schedule vectorized (the tuner's lane loop) matches too: the rewrite replaces the
    # loops; where the match fails, the nest keeps its vectorized loop, as without the mark
    return (tirx.ForKind.SERIAL, tirx.ForKind.VECTORIZED)


def _chain(loop: Any) -> tuple[list[Any], Any]:
    """The perfect nest under `loop` (loops of constant range, one statement each) and its innermost statement."""
    loops, s = [], loop.body
    while isinstance(s, tirx.For) and tir_util.const_int(s.min) is not None and tir_util.const_int(s.extent) is not None \
            and s.kind in _column_kinds():
        loops.append(s)
        s = s.body
    return loops, s


def _strip_cast(e: Any, dtype: str) -> Any:
    if isinstance(e, tirx.Cast) and str(e.ty.dtype) == dtype:
        return e.value
    return e


def _is_load(e: Any) -> bool:
    return isinstance(e, tvm.ir.TensorLoad)


def match_outer_product(r: Any, target: tvm.target.Target, exact: bool = False,
                        outer: list[tuple[Any, int, int]] | None = None) -> tuple[OuterProduct | None, str]:
    """The tree pattern of the outer product (module docstring) on the marked loop `r`, with its parameters;
    (None, why) where it does not match.

    Under the rows loop: one column nest, or several side by side (what the partition leaves of a lane loop
    split by a vector loop), each matched on its own against the same instruction.

    Args:
        outer: the enclosing loops (var, min, extent): with them, a lane loop that is no multiple of the lanes
            still matches when whole vectors of B stay inside B (the extra lanes are computed, never stored).
    """
    if r.kind != tirx.ForKind.SERIAL:
        return None, "the marked loop is not serial"
    i = r.body
    if not isinstance(i, tirx.For):
        return None, "no rows loop under the marked loop"
    m, why = None, "no rows loop under the marked loop"
    if i.kind == tirx.ForKind.SERIAL and tir_util.const_int(i.extent) is not None:
        m, why = _match_rows(r, i, target, exact, outer)
    if m is None:
        # one row (a linear on one vector, batch 1): the schedule has no rows loop left, the columns sit right
        # under the reduction; matched as a rows loop of extent 1 that nothing depends on (a loop A depends
        # on is no column loop: the columns' checks refuse it)
        one = tirx.For(tirx.Var("row", "int32"), tirx.const(0, "int32"), tirx.const(1, "int32"),
                       tirx.ForKind.SERIAL, i)
        m, _ = _match_rows(r, one, target, exact, outer)
    return m, why if m is None else ""


def _match_rows(r: Any, i: Any, target: tvm.target.Target, exact: bool, outer: list[tuple[Any, int, int]] | None
                ) -> tuple[OuterProduct | None, str]:
    """`match_outer_product` with `i` as the rows loop."""
    nests = list(i.body.seq) if isinstance(i.body, tirx.SeqStmt) else [i.body]
    ins: Instruction | None = None
    columns = []
    for nest in nests:
        if not isinstance(nest, tirx.For):
            return None, "a statement under the rows loop is no loop"
        col, ins, why = _match_columns(r, i, nest, target, exact, outer, ins)
        if col is None:
            return None, why
        columns.append(col)
    assert ins is not None
    m = OuterProduct(ins, r, i, tuple(columns))
    if m.accumulators > MAX_ACCUMULATORS:
        return None, f"{m.accumulators} accumulators > {MAX_ACCUMULATORS}"
    return m, ""


def _match_columns(r: Any, i: Any, nest: Any, target: tvm.target.Target, exact: bool,
                   outer: list[tuple[Any, int, int]] | None, ins: Instruction | None
                   ) -> tuple[Columns | None, Instruction | None, str]:
    """One column nest `[for v] / for l / [for g]: C[c] = C[c] + X(A[a]) * X(B[b])` under rows `i` and
    reduction `r`, for the instruction `ins` (chosen here where None)."""
    if nest.kind not in _column_kinds() or tir_util.const_int(nest.min) is None or tir_util.const_int(nest.extent) is None:
        return None, ins, "a column loop is not serial (or vectorized) over a constant range"
    loops, store = _chain(nest)
    loops = [nest, *loops]
    if not isinstance(store, tirx.BufferStore) or len(loops) > 3:
        return None, ins, "not a nest of 1-3 loops around one store"
    value = store.value
    if not isinstance(value, tirx.Add):
        return None, ins, "the store is not an accumulation"
    acc, prod = (value.a, value.b) if _is_load(value.a) else (value.b, value.a)
    if not (_is_load(acc) and acc.source.same_as(store.buffer)
            and all(structural_equal(x, y) for x, y in zip(acc.indices, store.indices))):
        return None, ins, "the store does not add to its own element"
    if not isinstance(prod, tirx.Mul):
        return None, ins, "the addend is not a product"
    c_dtype = str(store.buffer.dtype)
    x, y = _strip_cast(prod.a, c_dtype), _strip_cast(prod.b, c_dtype)
    if not (_is_load(x) and _is_load(y)):
        return None, ins, "the factors are not loads"
    groups = _groups(str(x.source.dtype)) if ins is None else (ins.group,)
    if not groups:
        return None, ins, f"no instruction for {x.source.dtype}"
    # the group: the innermost loop's extent where an instruction sums that many, else 1 (fp32 FMA)
    group = next((g for g in groups if g > 1 and len(loops) >= 2 and tir_util.const_extent(loops[-1]) == g), min(groups))
    if group > 1:
        if len(loops) < 2 or tir_util.const_extent(loops[-1]) != group:
            return None, ins, f"no group loop of extent {' or '.join(map(str, groups))}"
        g, rest = loops[-1], loops[:-1]
    else:
        g, rest = None, loops
    if len(rest) not in (1, 2):
        return None, ins, "not lanes under the rows"
    v, l = (None, rest[0]) if len(rest) == 1 else (rest[0], rest[1])  # noqa: E741
    analyzer = tvm.sym.Analyzer()
    for loop in (r, i, *loops):
        analyzer.bind(loop.loop_var, tvm.ir.Range.from_min_extent(loop.min, loop.extent))
    offsets = {}
    for name, load in (("x", x), ("y", y), ("c", acc)):
        buf = load.source
        if buf.strides and len(buf.strides) > 0:
            return None, ins, f"{buf.name} has strides"
        offsets[name] = (buf, analyzer.simplify(tir_util.flat_offset(buf, list(load.indices))))

    def stride(name: str, loop: Any | None) -> int | None:
        if loop is None:
            return 0
        return tir_util.coefficient(analyzer, offsets[name][1], loop.loop_var)

    a_name, b_name = ("x", "y") if stride("x", l) == 0 else ("y", "x")
    a_buf, b_buf = offsets[a_name][0], offsets[b_name][0]
    partial = False
    if ins is None:
        # LAYOUT (Alg. 1): where the widest instruction's lanes do not divide the lane loop, an equivalent
        # narrower one (fewer constraints) of the same target takes its place
        candidates = candidates_for(target, str(a_buf.dtype), str(b_buf.dtype), c_dtype, group, exact)
        if not candidates:
            return None, ins, f"the target has no instruction for {a_buf.dtype} x {b_buf.dtype} -> {c_dtype}"
        if candidates[0].exact:  # only an equivalent instruction may replace it: never a saturating one
            candidates = tuple(c for c in candidates if c.exact)
        ins = next((c for c in candidates if tir_util.const_extent(l) % c.lanes == 0), None)
        if ins is None and outer is not None:
            ins = candidates[0]
        if ins is None:
            return None, ins, (f"lane loop {tir_util.const_extent(l)} is no multiple of "
                               f"{', '.join(str(c.lanes) for c in candidates)}")
    elif (str(a_buf.dtype), str(b_buf.dtype), c_dtype, group) != (ins.a_dtype, ins.b_dtype, ins.c_dtype,
                                                                   ins.group):
        return None, ins, "column nests of different types"
    if tir_util.const_extent(l) % ins.lanes:
        if outer is None:
            return None, ins, f"lane loop {tir_util.const_extent(l)} is no multiple of {ins.lanes}"
        partial = True  # COM (Alg. 1): the last vector computed whole on B's padding, its valid lanes stored
    checks = [
        (stride("c", l) == 1, "C is not contiguous in the lanes"),
        (stride("c", r) == 0 and stride("c", g) == 0, "C depends on the reduction"),
        (stride("c", i) is not None and stride("c", v) is not None, "C is not affine"),
        (stride(a_name, l) == 0 and stride(a_name, v) == 0, "A depends on the lanes"),
        (group == 1 or stride(a_name, g) == 1, "A's group is not contiguous"),
        (stride(b_name, i) == 0, "B depends on the rows"),
        (stride(b_name, l) == group and (group == 1 or stride(b_name, g) == 1), "B's lanes are not contiguous"),
        (not a_buf.same_as(offsets["c"][0]) and not b_buf.same_as(offsets["c"][0]), "C aliases an operand"),
    ]
    for ok, why in checks:
        if not ok:
            return None, ins, why
    if partial:
        for loop_var, lo, ext in outer or []:
            analyzer.bind(loop_var, tvm.ir.Range.from_min_extent(lo, ext), allow_override=True)
        b_off = offsets[b_name][1]
        size = 1
        for n in b_buf.shape:
            size *= int(n)
        start = {tir_util.key(l.loop_var): l.min + (tir_util.const_extent(l) // ins.lanes) * ins.lanes}
        if g is not None:
            start[tir_util.key(g.loop_var)] = g.min
        last = analyzer.const_int_bound(analyzer.simplify(tir_util.subst(b_off, start))).max_value \
            + ins.lanes * ins.group - 1
        if last >= size:
            return None, ins, f"lane loop {tir_util.const_extent(l)}: a whole vector would read past {b_buf.name}"
    return Columns(v, l, g, offsets["c"], offsets[a_name], offsets[b_name], partial), ins, ""


def rewrite_outer_product(m: OuterProduct) -> Any:
    """The micro-kernel of a match (module docstring)."""
    ins = m.instruction
    analyzer = tvm.sym.Analyzer()
    flat: dict[int, Any] = {}
    decls = []

    def flat_view(buf: Any) -> Any:
        if tir_util.key(buf) not in flat:
            size = 1
            for n in buf.shape:
                size *= int(n)
            fb = tirx.decl_buffer((size,), str(buf.dtype), f"{buf.name}_flat", data=buf.data)
            flat[tir_util.key(buf)] = fb
            decls.append(tirx.DeclBuffer(fb, data=buf.data))
        return flat[tir_util.key(buf)]

    vec = f"{ins.c_dtype}x{ins.lanes}"
    accs = tirx.decl_buffer((m.accumulators,), vec, "acc", scope="local")
    lanes_view = tirx.decl_buffer((m.accumulators * ins.lanes,), ins.c_dtype, "acc_lanes", data=accs.data,
                                  scope="local")

    def at(e: Any, binding: dict) -> Any:
        return analyzer.simplify(tir_util.subst(e, {tir_util.key(loop.loop_var): tirx.const(val, str(loop.loop_var.ty.dtype))
                                               for loop, val in binding.items()}))

    rows = range(tir_util.const_int(m.i.min), tir_util.const_int(m.i.min) + tir_util.const_extent(m.i))
    # the partial vectors' lanes are stored after every whole vector: TVM's StorageRewrite types the accumulators'
    # buffer by its accesses in program order and fails on a vector access after a scalar one of the same buffer
    init, update, final, final_lanes = [], [], [], []
    for col in m.columns:
        (c_buf, c_off), (a_buf, a_off), (b_buf, b_off) = col.c, col.a, col.b
        cf, af, bf = flat_view(c_buf), flat_view(a_buf), flat_view(b_buf)
        vs = [None] if col.v is None else list(range(tir_util.const_int(col.v.min),
                                                     tir_util.const_int(col.v.min) + tir_util.const_extent(col.v)))
        l0, n_lanes = tir_util.const_int(col.l.min), tir_util.const_extent(col.l)
        starts = [l0 + u * ins.lanes for u in range(-(-n_lanes // ins.lanes))]
        cols = [(vv, ll, min(ins.lanes, l0 + n_lanes - ll)) for vv in vs for ll in starts]
        g0 = None if col.g is None else tir_util.const_int(col.g.min)

        def with_v(binding: dict, vv: int | None, col: Columns = col) -> dict:
            return binding | ({col.v: vv} if col.v is not None else {})

        def with_g(binding: dict, col: Columns = col, g0: int | None = g0) -> dict:
            return binding | ({col.g: g0} if col.g is not None else {})

        b_vecs = [tirx.BufferLoad(bf, [tirx.Ramp(at(b_off, with_g(with_v({col.l: ll}, vv))), 1,
                                                 ins.lanes * ins.group)]) for vv, ll, _ in cols]
        for row in rows:
            a_base = at(a_off, with_g({m.i: row}))
            a = tirx.BufferLoad(af, [a_base]) if ins.group == 1 else \
                tirx.BufferLoad(af, [tirx.Ramp(a_base, 1, ins.group)])
            for n, (vv, ll, valid) in enumerate(cols):
                k = tirx.const(len(init), "int32")
                c_base = at(c_off, with_v({m.i: row, col.l: ll}, vv))
                update.append(tirx.BufferStore(accs, ins.emit(tirx.BufferLoad(accs, [k]), a, b_vecs[n]), [k]))
                if valid == ins.lanes:
                    c_vec = tirx.Ramp(c_base, 1, ins.lanes)
                    init.append(tirx.BufferStore(accs, tirx.BufferLoad(cf, [c_vec]), [k]))
                    final.append(tirx.BufferStore(cf, tirx.BufferLoad(accs, [k]), [c_vec]))
                    continue
                # a partial vector: its sums start at zero and only its valid lanes are added to C
                init.append(tirx.BufferStore(accs, tirx.Broadcast(tirx.const(0, ins.c_dtype), ins.lanes), [k]))
                for t in range(valid):
                    at_c = analyzer.simplify(c_base + t)
                    lane = tirx.BufferLoad(lanes_view, [tirx.const(int(k.value) * ins.lanes + t, "int32")])
                    final_lanes.append(tirx.BufferStore(cf, tirx.BufferLoad(cf, [at_c]) + lane, [at_c]))
    r = m.r
    loop = tirx.For(r.loop_var, r.min, r.extent, tirx.ForKind.SERIAL, tir_util.seq(update), None,
                    {"altune.tensorized": ins.name})
    views = [tirx.DeclBuffer(lanes_view, data=accs.data)] if final_lanes else []
    return tirx.SeqStmt([*decls, tirx.AllocBuffer(accs), *views, *init, loop, *final, *final_lanes])


_ELEMENTWISE_OPS = ("Add", "Sub", "Mul", "Min", "Max", "Cast", "IntImm", "FloatImm", "Var")


def rewrite_elementwise(j: Any, target: tvm.target.Target) -> tuple[Any | None, str]:
    """The elementwise pattern on the marked loop `j` (module docstring): the vectorized loop, or (None, why)."""
    store = j.body
    if j.kind != tirx.ForKind.SERIAL or not isinstance(store, tirx.BufferStore):
        return None, "not a serial loop around one store"
    analyzer = tvm.sym.Analyzer()
    analyzer.bind(j.loop_var, tvm.ir.Range.from_min_extent(j.min, j.extent))
    loads = []

    def ok(e: Any) -> bool:
        if _is_load(e):
            loads.append(e)  # its stride in j is checked below
            return True
        name = type(e).__name__
        if name not in _ELEMENTWISE_OPS:
            return False
        if name == "Var":
            return not e.same_as(j.loop_var)
        if name == "Cast":
            return ok(e.value)
        if hasattr(e, "a"):
            return ok(e.a) and ok(e.b)
        return True

    if not ok(store.value):
        return None, "not an elementwise expression"
    for buf, indices in [(store.buffer, store.indices)] + [(x.source, x.indices) for x in loads]:
        step = tir_util.coefficient(analyzer, analyzer.simplify(tir_util.flat_offset(buf, list(indices))), j.loop_var)
        if step not in ((1,) if buf.same_as(store.buffer) else (0, 1)):
            return None, f"{buf.name} is not contiguous in {j.loop_var.name}"
    bits = tvm.DataType(str(store.buffer.dtype)).bits
    lanes = vector_unit(target).bits // bits
    extent = tir_util.const_extent(j)
    if extent is None or extent % lanes:
        return None, f"extent {extent} is no multiple of {lanes} lanes"
    dtype = str(j.loop_var.ty.dtype)
    outer, inner = tirx.Var(f"{j.loop_var.name}_v", dtype), tirx.Var(f"{j.loop_var.name}_l", dtype)
    body = tir_util.subst_stmt(store, {tir_util.key(j.loop_var): j.min + outer * lanes + inner})
    vloop = tirx.For(inner, tirx.const(0, dtype), tirx.const(lanes, dtype), tirx.ForKind.VECTORIZED, body)
    if extent == lanes:
        return tirx.For(outer, tirx.const(0, dtype), tirx.const(1, dtype), tirx.ForKind.SERIAL, vloop), ""
    return tirx.For(outer, tirx.const(0, dtype), tirx.const(extent // lanes, dtype), tirx.ForKind.SERIAL,
                    vloop, None, {"altune.tensorized": f"vector{lanes}"}), ""
