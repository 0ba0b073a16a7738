"""Transposing copies as in-register transposes: the inner tile of a layout conversion (`N H W C/16 16` back to
`N C H W`, a weight's `O I` to `I/16 O 16`, ...) whose input is contiguous along one loop and whose output along
another.

Vectorized along the output, such a copy reads its input with a stride: TVM's LLVM code generator loads each
lane on its own (16 scalar loads and inserts per vector). The pattern (over lowered TIR, as `select.py`'s):

    for a in [a0, a0 + A):              <- the marked loop ("transpose")
      for b in [b0, b0 + B):            2 <= A, B <= L, the target's vector lanes of the element type
        O[o] = f(I[i])                  f: element-wise (casts, min/max with constants: a ReLU), one load

    with I's offset of stride 1 in a and O's of stride 1 in b (neither stride 0 in the other loop),

is rewritten to B vector loads of I (row k: the A lanes of a at b = b0 + k, widened to L), log2(L) stages of
two-source shuffles (stage d swaps the off-diagonal d x d blocks of each 2d x 2d block: L/2 pairs, 2 shuffles
each) on the rows (those past B zero), and A vector stores of f(column), B lanes each, to O. A layout's own
tiles need not be square: `N H W/14 O/16 14 16` back to `N C H W` is 16 x 14. On AVX-512, 16 x 16 floats take 16
loads, 64 two-source shuffles and 16 stores, where the strided form took 256 scalar loads and inserts. A nest that
does not match is left alone.

A padded conversion (`pad[n, c/16, h, w, c%16] = if_then_else(1 <= h < 57 && 1 <= w < 57, data[n, c, h - 1,
w - 1], 0)`, the input a padded conv reads in a blocked layout) is scheduled the same way (`schedule_transpose`
takes an `if_then_else` whose else is a constant and whose condition loads nothing); the loop partition
(`partition.py`) then splits its loops where the condition is decided, so the inner tiles are plain copies that
match, and the border ones stores of the constant. Where the partition cannot decide it (the rows and columns
fused into one parallel loop: `fused % 4 // 2 * 8 + w_i`), and under a split's guard (`if w_o * 8 + w_i < 10`),
the tile is versioned: the conditions, conjunctions of comparisons linear in a and b, hold on the whole tile
where they hold at its four corners, so `if <corners>: transposed tile else: the nest as it was`.

Layering: `compiler` never imports `tuner` or `service`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import tvm
from tvm import tirx
from tvm.ir.prim import expr as prim

from ... import tir_util
from .mark import ANNOTATION, mark

_OPS = ("Cast", "Min", "Max", "Add", "Sub", "Mul", "IntImm", "FloatImm")


@dataclass(frozen=True)
class Transpose:
    """The parameters of a matched nest (module docstring)."""

    a: Any  # the marked For
    b: Any
    store: Any  # the BufferStore O[o] = f(I[i])
    load: Any  # I[i]
    lanes: int
    rows: int  # B: the extent of b, the rows loaded
    columns: int  # A: the extent of a, the columns stored
    in_stride: int  # I's stride in b (from one row to the next)
    out_stride: int  # O's stride in a (from one column to the next)
    outer: tuple[tuple[Any, int, int], ...] = ()  # the enclosing loops (var, min, extent)
    conditions: tuple[Any, ...] = ()  # the guard's and the padding's (`if`, `if_then_else`), all linear in a, b


def match_transpose(a: Any, vector_bits: int, outer: list[tuple[Any, int, int]] = ()) -> tuple[Transpose | None, str]:
    """The pattern on the marked loop `a`, or (None, why).

    Args:
        outer: the enclosing loops (var, min, extent): a tile's index `(wo * 14 + wi) // 14` has a constant
            stride only given them (the piece `wi_o == 1` of a partitioned `wi = wi_o * 8 + wi_i < 14`).
    """
    kinds = (tirx.ForKind.SERIAL, tirx.ForKind.VECTORIZED, tirx.ForKind.UNROLLED)
    b = a.body
    if a.kind not in kinds or not isinstance(b, tirx.For) or b.kind not in kinds:
        return None, "not two loops"
    store = b.body
    conditions = []
    if isinstance(store, tirx.IfThenElse) and store.else_case is None:  # a split's guard: `if w_o * 8 + w_i < 10`
        conditions.append(store.condition)
        store = store.then_case
    if not isinstance(store, tirx.BufferStore):
        return None, "not one store under two loops"
    loads: list[Any] = []
    if not _elementwise_of_loads(store.value, loads, conditional=True) or len(loads) != 1:
        return None, "not an element-wise function of one load"
    load = loads[0]
    conditions += [c.args[0] for c in tir_util.conditionals(store.value)]
    bits = tvm.DataType(str(store.buffer.dtype)).bits
    if tvm.DataType(str(load.source.dtype)).bits != bits or vector_bits % bits:
        return None, "the load and the store differ in width"
    lanes = vector_bits // bits
    ea, eb = tir_util.const_int(a.extent), tir_util.const_int(b.extent)
    if ea is None or eb is None or not (2 <= ea <= lanes and 2 <= eb <= lanes):
        return None, f"extents {a.extent} x {b.extent}: not within 2 .. {lanes} each"
    analyzer = tvm.sym.Analyzer()
    for var, lo, extent in outer:
        analyzer.bind(var, tvm.ir.Range.from_min_extent(lo, extent))
    for loop in (a, b):
        analyzer.bind(loop.loop_var, tvm.ir.Range.from_min_extent(loop.min, loop.extent))
    o = analyzer.simplify(tir_util.flat_offset(store.buffer, list(store.indices)))
    i = analyzer.simplify(tir_util.flat_offset(load.source, list(load.indices)))
    strides = [tir_util.coefficient(analyzer, o, b.loop_var), tir_util.coefficient(analyzer, i, a.loop_var),
               tir_util.coefficient(analyzer, o, a.loop_var), tir_util.coefficient(analyzer, i, b.loop_var)]
    if strides[:2] != [1, 1] or None in strides[2:] or 0 in strides[2:]:
        return None, f"strides {strides}: not a transpose (output along the inner loop, input along the marked one)"
    for cond in conditions:
        if not _convex(analyzer, cond, (a.loop_var, b.loop_var)):
            return None, f"condition {cond}: not a conjunction of comparisons linear in the tile's loops"
    return Transpose(a, b, store, load, lanes, eb, ea, strides[3], strides[2], tuple(outer), tuple(conditions)), ""


def _convex(analyzer: Any, cond: Any, tile_vars: tuple[Any, Any]) -> bool:
    """Whether `cond` holds on a convex set of the tile's (a, b): a conjunction of comparisons, each linear in
    both. It then holds on the whole tile where it holds at the tile's four corners."""
    if isinstance(cond, tirx.And):
        return _convex(analyzer, cond.a, tile_vars) and _convex(analyzer, cond.b, tile_vars)
    if not isinstance(cond, tirx.LT | tirx.LE | tirx.GT | tirx.GE | tirx.EQ):
        return False
    diff = analyzer.simplify(cond.b - cond.a)
    return all(tir_util.coefficient(analyzer, diff, v) is not None for v in tile_vars)


def rewrite_transpose(m: Transpose) -> Any:
    """The loads, shuffle stages and stores of a match (module docstring)."""
    analyzer = tvm.sym.Analyzer()
    for var, lo, extent in m.outer:
        analyzer.bind(var, tvm.ir.Range.from_min_extent(lo, extent))
    lanes = m.lanes
    a, b = m.a, m.b
    a0, b0 = a.min, b.min
    dtype = str(m.load.source.dtype)
    vec = f"{dtype}x{lanes}"
    out_vec = f"{m.store.buffer.dtype}x{m.rows}"

    def flat(buf: Any) -> Any:
        size = 1
        for n in buf.shape:
            size *= int(n)
        return tirx.decl_buffer((size,), str(buf.dtype), f"{buf.name}_flat", data=buf.data)

    src, dst = flat(m.load.source), flat(m.store.buffer)
    i_off = tir_util.flat_offset(m.load.source, list(m.load.indices))
    o_off = tir_util.flat_offset(m.store.buffer, list(m.store.indices))

    def at(e: Any, av: Any, bv: Any) -> Any:
        return analyzer.simplify(tir_util.subst(e, {tir_util.key(a.loop_var): av, tir_util.key(b.loop_var): bv}))

    # the offsets are affine in a and b (the match proved their strides constant): each row and column is the
    # tile's first offset plus a multiple of a stride, without simplifying an index per row
    i0, o0 = at(i_off, a0, b0), at(o_off, a0, b0)

    stages = lanes.bit_length() - 1

    def row(k: int) -> Any:
        if k >= m.rows:
            return tirx.Broadcast(tirx.const(0, dtype), lanes)
        v = tirx.BufferLoad(src, [tirx.Ramp(i0 + k * m.in_stride, 1, m.columns)])
        if m.columns == lanes:
            return v
        # widened by repeating it (a shuffle never has more lanes than its inputs, and a broadcast of one lane
        # is no vector): the lanes past the columns are never stored
        copies = -(-lanes // m.columns)
        return tirx.Shuffle([v] * copies, [tirx.const(j, "int32") for j in range(lanes)])

    # each stage's vectors are values bound to variables (`Bind`), which LLVM keeps in registers (a local
    # buffer of them was stored to the stack at every stage, the stores never removed)
    body: list[Any] = []

    def bind(name: str, value: Any) -> Any:
        var = tirx.Var(name, vec)
        body.append(tirx.Bind(var, value))
        return var

    regs = [bind(f"row{k}", row(k)) for k in range(lanes)]
    # row k holds I(a0 + j, b0 + k) in lane j; each stage swaps the off-diagonal d x d blocks of every 2d x 2d
    # block (rows k and k + d, lanes with bit d set against those without), so row j ends up as column j
    for s in range(stages):
        d = lanes >> (s + 1)
        new_regs: list[Any] = [None] * lanes
        for k in range(lanes):
            if k & d:
                continue
            x, y = regs[k], regs[k + d]
            low = [j if not j & d else lanes + j - d for j in range(lanes)]
            high = [j + d if not j & d else lanes + j for j in range(lanes)]
            for r, index in ((k, low), (k + d, high)):
                new_regs[r] = bind(f"t{s}_{r}", tirx.Shuffle([x, y], [tirx.const(v, "int32") for v in index]))
        regs = new_regs
    for j in range(m.columns):  # column j: O(a0 + j, b0 + t) in lane t < B
        column = regs[j]
        if m.rows < lanes:
            column = tirx.Shuffle([column], [tirx.const(t, "int32") for t in range(m.rows)])
        value = _vectorized(_taken(m.store.value), m.load, column, m.rows)
        body.append(tirx.BufferStore(dst, value if str(value.ty.dtype) == out_vec else tirx.Cast(out_vec, value),
                                     [tirx.Ramp(o0 + j * m.out_stride, 1, m.rows)]))
    decls = [tirx.DeclBuffer(src, data=m.load.source.data), tirx.DeclBuffer(dst, data=m.store.buffer.data)]
    # a loop of one iteration holds the report's annotation, as the outer product's loop does
    one = tirx.Var(f"{a.loop_var.name}_t", str(a.loop_var.ty.dtype))
    loop = tirx.For(one, tirx.const(0, str(one.ty.dtype)), tirx.const(1, str(one.ty.dtype)), tirx.ForKind.SERIAL,
                    tir_util.seq(body), None, {"altune.tensorized": f"transpose{lanes}"})
    fast = tirx.SeqStmt([*decls, loop])
    if not m.conditions:
        return fast
    # a tile the guard or the padding cuts (a border tile) runs the nest as it was: the conditions are linear in
    # a and b and conjunctions (`_convex`), so they hold on the whole tile where they hold at its corners
    whole = tirx.const(True, "bool")
    for av in (a0, a0 + m.columns - 1):
        for bv in (b0, b0 + m.rows - 1):
            for cond in m.conditions:
                whole = tirx.And(whole, at(cond, av, bv))
    whole = analyzer.simplify(whole)
    if analyzer.can_prove(whole):
        return fast
    annotations = {k: v for k, v in a.annotations.items() if k != ANNOTATION}
    slow = tirx.For(a.loop_var, a.min, a.extent, a.kind, a.body, a.thread_binding, annotations, a.step)
    # the condition bound to a variable first: TVM's common-subexpression pass, given it in the `if`, binds a
    # subexpression it shares with the branches (`fused % 7`) inside the then-branch, after its use there
    inside = tirx.Var(f"{a.loop_var.name}_inside", "bool")
    return tirx.SeqStmt([tirx.Bind(inside, whole), tirx.IfThenElse(inside, fast, slow)])


def _taken(e: Any) -> Any:
    """`e` with each `if_then_else` replaced by its `then` value (where the condition holds)."""
    return tir_util.rewrite(e, lambda x: _taken(x.args[1]) if tir_util.is_if_then_else(x) else None)


def _vectorized(e: Any, load: Any, column: Any, lanes: int) -> Any:
    """`e` (element-wise over `load`) on the vector `column` in place of the load, its constants broadcast."""
    def fn(x: Any) -> Any | None:
        if x.same_as(load):
            return column
        if isinstance(x, prim.IntImm | prim.FloatImm):
            return tirx.Broadcast(x, lanes)
        if isinstance(x, prim.Cast):
            return prim.Cast(f"{x.ty.dtype}x{lanes}", _vectorized(x.value, load, column, lanes))
        return None

    return tir_util.rewrite(e, fn)


def schedule_transpose(sch: tvm.s_tir.Schedule, block: Any, loops: list[Any], lanes: int) -> bool:
    """Schedules a transposing copy `block` (its `loops`, outermost first) for the pattern: the innermost loop
    of the block variable its input is contiguous in (stride 1) and that of the one its output is contiguous
    in, each split by `lanes` where longer, their outer parts where they were, the inner ones innermost (the
    input's marked "transpose", the output's vectorized: where the match fails, the copy is the vectorized loop
    it was). A padding's `if_then_else` (module docstring) is allowed: the partition removes it from the inner
    tiles. False, untouched, where `block` is no such copy (a reduction, several loads, no variable of stride
    1 on either side, or the same one, or no loop of its own for each)."""
    node = sch.get(block)
    store = node.body
    if node.init is not None or not isinstance(store, tirx.BufferStore) or lanes < 2:
        return False
    loads: list[Any] = []
    if not _elementwise_of_loads(store.value, loads, conditional=True) or len(loads) != 1:
        return False
    load = loads[0]
    if tvm.DataType(str(store.buffer.dtype)).bits != 32 or tvm.DataType(str(load.source.dtype)).bits != 32:
        return False
    analyzer = tvm.sym.Analyzer()
    for iv in node.iter_vars:
        analyzer.bind(iv.var, iv.dom)
    variables = [iv.var for iv in node.iter_vars]
    o = analyzer.simplify(tir_util.flat_offset(store.buffer, list(store.indices)))
    i = analyzer.simplify(tir_util.flat_offset(load.source, list(load.indices)))
    out_var = [v for v in variables if tir_util.coefficient(analyzer, o, v) == 1]
    in_var = [v for v in variables if tir_util.coefficient(analyzer, i, v) == 1]
    if len(out_var) != 1 or len(in_var) != 1 or out_var[0].same_as(in_var[0]):
        return False
    if tir_util.coefficient(analyzer, o, in_var[0]) in (0, None) or tir_util.coefficient(analyzer, i, out_var[0]) in (0, None):
        return False  # not a transpose: one side does not move along the other's variable
    feeds = list(zip(loops, tir_util.loop_feeds(sch, block, loops)))
    # the innermost loop of each (a tile loop outside feeds the variable too)
    la = next((loop for loop, vs in reversed(feeds) if vs == {in_var[0].name}), None)
    lb = next((loop for loop, vs in reversed(feeds) if vs == {out_var[0].name}), None)
    if la is None or lb is None:
        return False
    ext = [tir_util.const_int(sch.get(loop).extent) for loop in (la, lb)]
    if None in ext or min(ext) < 2:
        return False
    # every other loop keeps its place, a split loop's outer part takes the loop's; the two tile loops go innermost
    placed: dict[int, Any] = {}
    inner = []
    for k, (loop, extent) in enumerate(((la, ext[0]), (lb, ext[1]))):
        if extent > lanes:
            placed[k], tile = sch.split(loop, [None, lanes])
        else:
            tile = loop
        inner.append(tile)
    # only the loops from the outer of the two down: those above may hold other blocks (a tile's), no chain
    first = min(loops.index(la), loops.index(lb))
    order = [placed.get(0) if loop.same_as(la) else placed.get(1) if loop.same_as(lb) else loop
             for loop in loops[first:]]
    sch.reorder(*[loop for loop in order if loop is not None], *inner)
    sch.vectorize(inner[1])
    mark(sch, inner[0], "transpose")
    return True


def _elementwise_of_loads(e: Any, loads: list[Any], conditional: bool = False) -> bool:
    """Whether `e` is element-wise over loads (collected in `loads`); `conditional`: `if_then_else(cond, x,
    constant)` allowed too, its condition free of loads."""
    if isinstance(e, tvm.ir.TensorLoad):
        loads.append(e)
        return True
    if conditional and tir_util.is_if_then_else(e):
        cond, then, other = e.args
        in_cond: list[Any] = []
        tir_util.rewrite(cond, lambda x: in_cond.append(x) if isinstance(x, tvm.ir.TensorLoad) else None)
        return not in_cond and type(other).__name__ in ("IntImm", "FloatImm") \
            and _elementwise_of_loads(then, loads, conditional)
    name = type(e).__name__
    if name not in _OPS:
        return False
    if name == "Cast":
        return _elementwise_of_loads(e.value, loads, conditional)
    if hasattr(e, "a"):
        return _elementwise_of_loads(e.a, loads, conditional) and _elementwise_of_loads(e.b, loads, conditional)
    return True
