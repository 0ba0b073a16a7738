"""Fig. 11(b) of the paper: a producer that outputs of different spaces read is copied once per further class
of outputs (op0' and op0''), when the parts the classes need intersect in at most the threshold of it;
each class's consumers then read their own copy.

Layering: `compiler` never imports `tuner` or `service`.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

import tvm
from tvm import s_tir, tirx

from compiler.tir_util import key, rewrite

from .footprints import Footprints, box_volume
from .plan import SHARED, Duplication, class_sets, group_spaces, output_classes
from .spaces import BastelnError, Space, consumers_of, spaces_of


def duplicate_shared(sch: Any, spaces: dict[str, Space], params: set[str],
                      threshold: float) -> tuple[Any, list[Duplication], dict[str, float]]:
    """Copies each intermediate group that outputs of several classes read, one copy per further class, when
    the parts the classes need intersect in at most `threshold` of its instances (sec. 5.3: disjoint parts
    cost nothing; 5.4: a threshold allows some redundancy); each class's consumers then read their own copy,
    which post-tiling fusion places under that class's tile loops. The groups closest to the outputs go
    first, so that a copied group's producers are shared by its copies in turn.

    Returns the new schedule, the copies made, and the groups left shared with the fraction that refused them.
    """
    duplications: list[Duplication] = []
    refused: dict[str, float] = {}
    if not all(a.indices is not None for s in spaces.values() for a in s.reads):
        return sch, duplications, refused  # a read without index forms: the parts cannot be told apart
    while True:
        groups, member_of = group_spaces(spaces, params)
        classes = output_classes(spaces, groups, params)
        sets = class_sets(spaces, groups, member_of, classes, refused)
        order = list(spaces)
        candidates = [a for a, s in sets.items() if len(s) > 1 and SHARED not in s and a not in refused]
        if not candidates:
            return sch, duplications, refused
        anchor = max(candidates, key=order.index)
        group = groups[anchor]
        in_classes = sorted(sets[anchor])
        output_blocks = {b for c in classes for a in c for b in groups[a].blocks}
        members = [b for b in reversed(order) if b not in output_blocks]
        parts = []
        for ci in in_classes:
            boxes = Footprints(spaces, classes[ci]).boxes(
                {o: {v: (0, e - 1) for v, e in spaces[o].spatial} for o in classes[ci]}, members)
            parts.append(boxes.get(anchor))
        overlap = sum(box_volume(_intersect(a, b)) for a, b in itertools.combinations(parts, 2))
        overlap /= spaces[anchor].spatial_volume
        if overlap > threshold + 1e-9 or not all(spaces[b].identity_write for b in group.blocks):
            refused[anchor] = overlap
            continue
        func = sch.mod["main"]
        names = set(order)
        copies = []
        for ci in in_classes[1:]:
            readers = [c for b in group.blocks for c in consumers_of(spaces, b)
                       if c not in group.blocks and sets[member_of[c]] == {ci}]
            suffix = next(f"_copy{k}" for k in itertools.count(ci) if not names & {b + f"_copy{k}" for b in group.blocks})
            try:
                func = _copy_blocks(func, group.blocks, readers, suffix)
            except BastelnError:  # a block that is not one store (the copy would have to understand it)
                break
            names |= {b + suffix for b in group.blocks}
            copies.append(anchor + suffix)
        else:
            sch = s_tir.Schedule(func)
            spaces = {s.name: s for s in spaces_of(sch)}
            duplications.append(Duplication(anchor, tuple(copies), overlap))
            continue
        refused[anchor] = overlap


def _intersect(a: dict[str, tuple[int, int]] | None, b: dict[str, tuple[int, int]] | None) -> dict | None:
    if a is None or b is None:
        return None
    out = {}
    for var, (lo, hi) in a.items():
        lo, hi = max(lo, b[var][0]), min(hi, b[var][1])
        if lo > hi:
            return None
        out[var] = (lo, hi)
    return out


def _block_of(stmt: Any) -> Any:
    """The block of a root-level loop nest."""
    while isinstance(stmt, tirx.For):
        stmt = stmt.body
    return stmt.block


def _copy_blocks(func: Any, blocks: Sequence[str], readers: Sequence[str], suffix: str) -> Any:
    """`func` with the root-level blocks `blocks` (a group, in order) copied: new loop and block variables,
    names with `suffix`, each writing a new buffer of its own; the blocks `readers` read the copies' buffers
    instead of the originals'. The copies come right after the last of `blocks`."""
    realize = func.body
    root = realize.block
    seq = list(root.body.seq) if isinstance(root.body, tirx.SeqStmt) else [root.body]
    names = [_block_of(s).name_hint for s in seq]
    buffers: dict[int, Any] = {}
    new_buffers = []
    for b in blocks:
        old = _block_of(seq[names.index(b)]).writes[0].source
        new = tirx.decl_buffer(old.shape, str(old.dtype), old.name + suffix, scope=old.scope())
        buffers[key(old)] = new
        new_buffers.append(new)
    copies = [_copy_nest(seq[names.index(b)], buffers, suffix) for b in blocks]
    out = []
    last = max(names.index(b) for b in blocks)
    for i, stmt in enumerate(seq):
        out.append(_copy_nest(stmt, buffers, None) if names[i] in readers else stmt)
        if i == last:
            out.extend(copies)
    new_root = s_tir.SBlock(root.iter_vars, root.reads, root.writes, root.name_hint, tirx.SeqStmt(out), root.init,
                            [*root.alloc_buffers, *new_buffers], root.match_buffers, root.annotations)
    return func.with_body(s_tir.SBlockRealize(realize.iter_values, realize.predicate, new_root))


def _copy_nest(stmt: Any, buffers: dict[int, Any], suffix: str | None) -> Any:
    """A root-level loop nest of one block with the buffers in `buffers` (by handle) replaced; with a
    `suffix`, a copy of it: new loop and block variables, the block renamed."""
    fresh = suffix is not None
    variables: dict[int, Any] = {}

    def fn(x: Any) -> Any | None:
        if isinstance(x, tvm.ir.expr.Var):
            return variables.get(key(x), x)
        if isinstance(x, tvm.ir.TensorLoad):
            source = buffers.get(key(x.source), x.source)
            return tirx.BufferLoad(source, [expr(i) for i in x.indices])
        return None

    def expr(e: Any) -> Any:
        return rewrite(e, fn)

    def var(v: Any) -> Any:
        if not fresh:
            return v
        variables[key(v)] = new = tirx.Var(v.name, v.ty)
        return new

    def region(r: Any) -> Any:
        return tirx.BufferRegion(buffers.get(key(r.source), r.source),
                                 [tvm.ir.Range.from_min_extent(expr(x.min), expr(x.extent)) for x in r.region])

    def store(s: Any) -> Any:
        if not isinstance(s, tirx.BufferStore):
            raise BastelnError(f"cannot copy a block whose body is a {type(s).__name__}")
        return tirx.BufferStore(buffers.get(key(s.buffer), s.buffer), expr(s.value), [expr(i) for i in s.indices])

    def go(x: Any) -> Any:
        if isinstance(x, tirx.For):
            loop_var = var(x.loop_var)
            return tirx.For(loop_var, expr(x.min), expr(x.extent), x.kind, go(x.body), x.thread_binding,
                            x.annotations, x.step)
        b = x.block
        values = [expr(v) for v in x.iter_values]
        iter_vars = [tirx.IterVar(tvm.ir.Range.from_min_extent(expr(iv.dom.min), expr(iv.dom.extent)), var(iv.var),
                                  iv.iter_type) for iv in b.iter_vars]
        block = s_tir.SBlock(iter_vars, [region(r) for r in b.reads], [region(r) for r in b.writes],
                             b.name_hint + (suffix or ""), store(b.body), None if b.init is None else store(b.init),
                             b.alloc_buffers, b.match_buffers, b.annotations)
        return s_tir.SBlockRealize(values, expr(x.predicate), block)

    return go(stmt)


def buffer_bytes(buffer: Any) -> int:
    return math.prod(int(d) for d in buffer.shape) * ((buffer.dtype.bits * buffer.dtype.lanes + 7) // 8)
