"""What the loop space learns about a program once: its main (reduction) block, the block's loops, which
producers and consumers can be inlined, how the epilogue is aligned, and what the main block reads.

Layering: `tuner` never imports `service`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import tvm
from tvm import s_tir, sym, tirx

from compiler.passes.tensorize.mark import DOT_GROUP

from .base import tvm_error
from .loop_knobs import REDUCE_LEVELS, SPATIAL_LEVELS


@dataclass(frozen=True)
class Axis:
    """A loop of the main block: its knob name, extent and kind ("S" spatial, "R" reduction, "G" the group of
    a dot-product instruction: a reduction kept whole, never tiled)."""

    name: str
    extent: int
    kind: Literal["S", "R", "G"]

    @property
    def levels(self) -> int:
        return {"S": SPATIAL_LEVELS, "R": REDUCE_LEVELS, "G": 1}[self.kind]

    def knob(self, level: int) -> str:
        return f"tile.{self.name}.{level}"


@dataclass(frozen=True)
class Structure:
    """What `LoopSpace` learned about a program once: the blocks it schedules and its loops."""

    main: str  # the reduction block
    axes: tuple[Axis, ...]  # in the main block's loop order
    inlinable: tuple[str, ...]  # injective producers that compute_inline accepts, nearest first
    epilogue_inline: tuple[str, ...]  # consumers inlined into the last consumer
    epilogue: str | None  # the output block after main (relu / bias_add), None: main writes the output

    @property
    def spatial(self) -> tuple[Axis, ...]:
        return tuple(a for a in self.axes if a.kind == "S")

    @property
    def reduce(self) -> tuple[Axis, ...]:
        return tuple(a for a in self.axes if a.kind == "R")

    @property
    def group(self) -> Axis | None:
        """The dot-product group axis (`compiler.passes.tensorize.DOT_GROUP`), if the block has one."""
        return next((a for a in self.axes if a.kind == "G"), None)


def as_module(prim_func: tvm.tirx.PrimFunc | tvm.IRModule) -> tvm.IRModule:
    """`prim_func` as a module whose "main" it is (a module as it is)."""
    if isinstance(prim_func, tvm.IRModule):
        return prim_func
    return tvm.IRModule({"main": prim_func.with_attr("global_symbol", "main")})


def analyze(prim_func: tvm.tirx.PrimFunc | tvm.IRModule) -> Structure:
    """Finds the main block, its loops, and which producers/consumers can be inlined.

    Raises:
        ValueError: if the program has no reduction block, or its loops do not
            match the block's iterators one to one (not a TE-made program).
    """
    mod = as_module(prim_func)
    sch = s_tir.Schedule(mod)
    blocks = sch.get_child_blocks(sch.get_sblock("root"))
    names = [sch.get(b).name_hint for b in blocks]

    def volume(b) -> int:
        return math.prod(int(iv.dom.extent) for iv in sch.get(b).iter_vars)

    reductions = [
        b for b in blocks if any(iv.iter_type == tirx.IterVar.CommReduce for iv in sch.get(b).iter_vars)
    ]
    if not reductions:
        raise ValueError(f"no reduction block among {names}: nothing for LoopSpace to tile")
    main_rv = max(reductions, key=volume)
    main = sch.get(main_rv).name_hint
    block = sch.get(main_rv)
    loops = sch.get_loops(main_rv)
    assert len(loops) == len(block.iter_vars), f"{main}: {len(loops)=} != {len(block.iter_vars)=}"
    group = int(block.annotations[DOT_GROUP]) if DOT_GROUP in block.annotations else 0
    axes, seen = [], set()
    for k, (loop, iv) in enumerate(zip(loops, block.iter_vars)):
        extent = int(sch.get(loop).extent)
        assert extent == int(iv.dom.extent), f"{main}: loop extent {extent} != iterator extent {iv.dom.extent}"
        name = str(iv.var.name)
        name = name[2:] if name.startswith("v_") else name
        while name in seen:
            name += "_"
        seen.add(name)
        kind = "R" if iv.iter_type == tirx.IterVar.CommReduce else "S"
        if kind == "R" and k == len(loops) - 1 and extent == group:  # the instruction's group: innermost, whole
            kind = "G"
        axes.append(Axis(name, extent, kind))

    index = names.index(main)
    # Producers, nearest first: inlining the padding first leaves the dilation feeding main directly.
    inlinable = []
    trial = s_tir.Schedule(mod)
    for name in reversed(names[:index]):
        try:
            trial.compute_inline(trial.get_sblock(name))
            inlinable.append(name)
        except (s_tir.ScheduleError, tvm_error()):
            pass
    consumers = names[index + 1 :]
    epilogue_inline: list[str] = []
    epilogue = consumers[-1] if consumers else None
    trial = s_tir.Schedule(mod)
    for name in consumers[:-1]:
        try:
            trial.compute_inline(trial.get_sblock(name))
            epilogue_inline.append(name)
        except (s_tir.ScheduleError, tvm_error()):
            epilogue = None  # several epilogue blocks left: keep them all at the root
    if epilogue is not None and len(epilogue_inline) != len(consumers) - 1:
        epilogue = None
    return Structure(main, tuple(axes), tuple(inlinable), tuple(epilogue_inline), epilogue)


def align_epilogue(mod: tvm.IRModule, st: Structure) -> tuple[tvm.IRModule, bool]:
    """`mod` with its epilogue iterating over the coordinates of the main block's output, and whether
    the epilogue may be placed inside a tile.

    A conversion from a tiled layout back to the user's (`compiler.layout`'s `layout_convert_*_out`)
    iterates over the user's coordinates v and reads the tile at u = f(v): a gather whose region
    inside a tile TVM over-approximates, and which at the root visits each tile's cache lines once
    per channel (on a conv3d with a 12.8 MB output, half the run time). Re-indexed by f
    (`transform_block_layout`) it iterates over u and writes `user[f^-1(u)]`: it reads exactly what
    the main block wrote, so `reverse_compute_at` can place it in a tile, and its loops visit each
    tile once. An element-wise epilogue (bias, relu) is already aligned; one whose f is not a
    bijection (a layout that pads) is left as it is, at the root.
    """
    if st.epilogue is None:
        return mod, True
    sch = s_tir.Schedule(mod)
    block_rv = sch.get_sblock(st.epilogue)
    block = sch.get(block_rv)
    produced = {sch.get(sch.get_sblock(name)).writes[0].source.name for name in (st.main, *st.epilogue_inline)}
    reads = [r for r in block.reads if r.source.name in produced]
    iters = [iv.var for iv in block.iter_vars]
    if len(reads) != 1 or any(int(rng.extent) != 1 for rng in reads[0].region if isinstance(rng.extent, tirx.IntImm)):
        return mod, False
    index = [rng.min for rng in reads[0].region]
    if len(index) == len(iters) and all(i.same_as(v) for i, v in zip(index, iters)):
        return mod, True  # element-wise
    # The coordinate of u along which the user's innermost dimension advances by one goes last: the
    # innermost (vectorized) loop then stores a contiguous run of a row, gathering from one tile in
    # cache (on a 12.8 MB conversion 2.5x faster than at first; storing whole rows, from several
    # tiles, or the tile's own order, which scatters the stores, were slower).
    analyzer = sym.Analyzer()
    imap = tirx.IndexMap(iters, index, None)

    def at(last: int) -> list[int | None]:
        point = [tirx.const(0, v.ty.dtype) for v in iters[:-1]] + [tirx.const(last, iters[-1].ty.dtype)]
        return [int(e) if isinstance(e, tirx.IntImm) else None for e in map(analyzer.simplify, imap.map_indices(point))]

    origin, step = at(0), at(1)
    unit = [k for k, (a, b) in enumerate(zip(origin, step)) if a is not None and b is not None and b - a == 1]
    if len(unit) == 1:
        index = [e for k, e in enumerate(index) if k != unit[0]] + [index[unit[0]]]
    try:
        sch.transform_block_layout(block_rv, tirx.IndexMap(iters, index, None))
    except (s_tir.ScheduleError, tvm_error()):
        return mod, False
    return sch.mod, True


def tensorizable(mod: tvm.IRModule, st: Structure) -> bool:
    """Whether `tensorize` is offered: the main block computes in float32 from float32 operands, the form of the
    fp32 FMA micro-kernels, or it is in the dot-product form (a `G` axis: a model's quantized or bf16 conv,
    `compiler.workloads.model.layouts.conv2d_nhwc_dot`, or a catalog int8 / bf16 operator in its layout
    template's dot-product form, `compiler.layout.templates`), whose group loop `_apply` then puts innermost,
    below the lanes, as the instructions take it. Another int8 (u8 x s8 -> s32) or bf16 (-> fp32) program (the
    catalog's own layouts) is not offered it: their dot-product instructions take groups of 4 (2) consecutive
    reduction elements of weights packed `[N/L, K/G, L, G]`; marked, their nests would never match."""
    if st.group is not None:
        return True
    sch = s_tir.Schedule(mod)
    block = sch.get(sch.get_sblock(st.main))
    buffers = [block.writes[0].source, *(r.source for r in block.reads)]
    return all(str(b.dtype) == "float32" for b in buffers)


def main_reads(mod: tvm.IRModule, st: Structure) -> tuple[list[list], Callable[[list, Axis], bool]]:
    """The index expressions of each region the main block reads, and `uses(indices, axis)`: whether any of
    them uses the axis's iterator."""
    sch = s_tir.Schedule(mod)
    block = sch.get(sch.get_sblock(st.main))
    var = {a.name: iv.var for a, iv in zip(st.axes, block.iter_vars)}

    def uses(indices: list, axis: Axis) -> bool:
        return any(u.same_as(var[axis.name]) for e in indices for u in tirx.analysis.undefined_vars(e))

    return [[r.min for r in read.region] for read in block.reads], uses


def vector_block_axes(st: Structure, reads: list[list], uses: Callable[[list, Axis], bool]) -> tuple[Axis, ...]:
    """The spatial axes besides the lanes that index the operand the lanes index (the weight): a register
    block's columns of whole vectors. The instruction's pattern (`compiler.passes.tensorize.select`) takes
    them under the rows; a layout template's output block comes before its rows in axis order."""
    *rest, lane = st.spatial
    weight = [r for r in reads if uses(r, lane)]
    return tuple(a for a in rest if any(uses(r, a) for r in weight))
