"""Applying a loop-space configuration: the main block tiled and reordered, the outer loops fused and
parallel, the inner one vectorized, producers and epilogue placed, the register block marked for a tensor
instruction, and the blocks left at the root scheduled on their own.

Layering: `tuner` never imports `service`.
"""

from __future__ import annotations

from collections.abc import Callable

import tvm
from tvm import s_tir, tirx

from compiler.passes.licm import without_licm
from compiler.passes.tensorize import mark, schedule_transpose
from compiler.target import VectorUnit

from .base import Config, ScheduleFailed, tvm_error
from .loop_knobs import MAX_EPILOGUE_VECTOR, MIN_PARALLEL_CHUNKS, ORDERS, REDUCE_LEVELS, SPATIAL_LEVELS
from .loop_structure import Axis, Structure


class LoopScheduling:
    """`LoopSpace`'s schedule application (a mixin: it reads the space's program, structure and vector unit,
    and validates the configuration first)."""

    mod: tvm.IRModule
    structure: Structure
    unit: VectorUnit
    _vector_block_axes: tuple[Axis, ...]
    validate: Callable[[Config], Config]
    factors: Callable[[Config, Axis], list[int]]

    def apply(self, config: Config) -> tvm.s_tir.Schedule:
        config = self.validate(config)
        try:
            sch = self._apply(config)
        except (s_tir.ScheduleError, tvm_error()) as e:
            text = str(e).strip().splitlines()
            raise ScheduleFailed(f"schedule failed: {type(e).__name__}: {text[-1] if text else ''}") from e
        if config.get("licm", 1):
            return sch
        mod = sch.mod
        return s_tir.Schedule(tvm.IRModule({**{gv: f for gv, f in mod.functions.items()},
                                            mod.get_global_var("main"): without_licm(mod["main"])}))

    def _apply(self, config: Config) -> tvm.s_tir.Schedule:
        st = self.structure
        sch = s_tir.Schedule(self.mod)
        if config.get("inline", 0):
            for name in st.inlinable:
                sch.compute_inline(sch.get_sblock(name))
        for name in st.epilogue_inline:
            sch.compute_inline(sch.get_sblock(name))
        main = sch.get_sblock(st.main)
        write_at = config["write_at"]
        epilogue = sch.get_sblock(st.epilogue) if st.epilogue is not None else None
        if epilogue is None and write_at:
            epilogue = sch.cache_write(main, 0, "global")

        loops = sch.get_loops(main)
        assert len(loops) == len(st.axes), f"{len(loops)=} != {len(st.axes)=}"
        levels: dict[tuple[str, int], list] = {}
        for loop, axis in zip(loops, st.axes):
            parts = sch.split(loop, factors=self.factors(config, axis), preserve_unit_iters=True)
            for level, part in enumerate(parts):
                levels.setdefault((axis.kind, level), []).append(part)
        if config.get("tensorize", 0):  # the register block as the instruction's pattern takes it: rows, then the
            inner = levels[("S", SPATIAL_LEVELS - 1)]  # output vectors (the weight's axes), then the lanes
            block = self._vector_block_axes
            levels[("S", SPATIAL_LEVELS - 1)] = (
                [loop for loop, a in zip(inner[:-1], st.spatial) if a not in block]
                + [loop for loop, a in zip(inner[:-1], st.spatial) if a in block] + inner[-1:])
        order = ORDERS[config["order"]]
        ordered = [loop for token in order for loop in levels.get(token, [])]
        if st.group is not None:  # the group loop: innermost under a tensorized register block, else with R0
            group = levels[("G", 0)]
            at = len(ordered) if config.get("tensorize", 0) else ordered.index(levels[("R", 0)][-1]) + 1
            ordered[at:at] = group
        sch.reorder(*ordered)

        threaded = config["parallel"] > 0
        outer_levels = max(config["parallel"], 1)
        outer = [loop for level in range(outer_levels) for loop in levels[("S", level)]]
        if threaded:
            fused = last = sch.fuse(*outer) if len(outer) > 1 else outer[0]
        else:
            # one thread: the outer loops stay apart -- a fused loop's div/mod indices keep LLVM from
            # vectorizing the rows on its own (the untuned depthwise nest ran 10x slower fused)
            fused, last = outer[0], outer[-1]
        def anchor(level: int):  # the last loop of spatial tile level `level` - 1 (the fused one if parallel)
            return last if level == outer_levels else levels[("S", level - 1)][-1]

        read_at = config.get("read_at", 0)
        if read_at:
            for name in st.inlinable:  # nearest first: each one's consumer is already under the anchor
                producer = sch.get_sblock(name)
                sch.compute_at(producer, anchor(read_at), preserve_unit_loops=True)
                self._vectorize_tail(sch, producer, config)
        if epilogue is not None:
            if write_at:
                sch.reverse_compute_at(epilogue, anchor(write_at), preserve_unit_loops=True)
                self._vectorize_tail(sch, epilogue, config)
            else:
                self._schedule_root(sch, epilogue, config)
        if threaded:
            sch.parallel(fused)
        if config["vectorize"] and order[-1][0] == "S" and self.factors(config, st.spatial[-1])[-1] > 1:
            sch.vectorize(levels[("S", SPATIAL_LEVELS - 1)][-1])
        if config["unroll"]:
            sch.annotate(fused, "pragma_auto_unroll_max_step", config["unroll"])
            # explicit: LLVM codegen ignores the implicit unroll hint
            sch.annotate(fused, "pragma_unroll_explicit", 1)
        if config.get("tensorize", 0):
            mark(sch, self._tensorize_loop(config, levels[("R", REDUCE_LEVELS - 1)]), "outer_product")
        first_reduce = levels[("R", 0)][0]
        sch.decompose_reduction(main, first_reduce)
        if not config.get("inline", 0) and not read_at:
            for name in st.inlinable:
                self._schedule_root(sch, sch.get_sblock(name), config)
        return sch

    def _tensorize_loop(self, config: Config, inner_reduce: list):
        """The loop `tensorize` marks: of the inner reduction level (one loop per reduction axis, in axis
        order, directly above the register block), the last that is no unit loop; TVM's lowering drops the
        unit loops after it, so the mark holds the register block. The last one where all are unit loops
        (the mark keeps it)."""
        factors = [self.factors(config, a)[-1] for a in self.structure.reduce]
        assert len(factors) == len(inner_reduce), f"{len(factors)=} != {len(inner_reduce)=}"
        wide = [k for k, f in enumerate(factors) if f > 1]
        return inner_reduce[wide[-1] if wide else -1]

    def _transposed(self, sch: tvm.s_tir.Schedule, block, config: Config) -> bool:
        """With `transpose`, a layout conversion (a copy whose input and output are contiguous along different
        loops) scheduled for transposed tiles in registers (`compiler.passes.tensorize.schedule_transpose`)."""
        if not (config.get("transpose", 0) and config["vectorize"]):
            return False
        return schedule_transpose(sch, block, list(sch.get_loops(block)), self.unit.lanes)

    def _vectorize_tail(self, sch: tvm.s_tir.Schedule, block, config: Config) -> None:
        """Vectorizes the innermost loop of a block placed in a tile (if short enough, and of a constant
        extent: a producer computed in a tile of a strided access may span a loop-dependent region); a layout
        conversion with `transpose`: transposed tiles."""
        if not config["vectorize"] or self._transposed(sch, block, config):
            return
        inner = sch.get_loops(block)[-1]
        extent = sch.get(inner).extent
        if isinstance(extent, tirx.IntImm) and 1 < int(extent) <= MAX_EPILOGUE_VECTOR:
            sch.vectorize(inner)

    def _schedule_root(self, sch: tvm.s_tir.Schedule, block, config: Config) -> None:
        """A block left at the root (a producer, a layout conversion, an epilogue): the fewest outer loops
        that make `MIN_PARALLEL_CHUNKS` chunks fused and parallel, the most inner loops that make at most
        `MAX_EPILOGUE_VECTOR` lanes fused and vectorized, the loops between them serial.

        Fusing every loop but the last into the parallel loop made a GEMM's data conversion (`M K/2 2`) 387,200
        parallel chunks of 2 lanes, each with its div/mod indices: rows in parallel and the rest serial took
        a bf16 3025x127x255 GEMM from 0.40 to 0.36 ms, and the 55x55 convs of the dot suite 3% down (znver5).

        A layout conversion with `transpose`: transposed tiles (`_transposed`), the loops outside the tile's two
        parallel as above."""
        if self._transposed(sch, block, config):
            if config["parallel"]:
                loops = sch.get_loops(block)[:-2]
                outer, chunks = 0, 1
                while outer < len(loops) and chunks < MIN_PARALLEL_CHUNKS:
                    chunks *= int(sch.get(loops[outer]).extent)
                    outer += 1
                if outer:
                    sch.parallel(sch.fuse(*loops[:outer]) if outer > 1 else loops[0])
            return
        loops = sch.get_loops(block)
        extents = [int(sch.get(loop).extent) for loop in loops]
        inner, lanes = len(loops), 1  # loops[inner:] are vectorized
        while inner > 1 and lanes * extents[inner - 1] <= MAX_EPILOGUE_VECTOR:
            inner -= 1
            lanes *= extents[inner]
        if config["parallel"] and len(loops) > 1:
            outer, chunks = 0, 1  # loops[:outer] are parallel
            while outer < min(inner, len(loops) - 1) and chunks < MIN_PARALLEL_CHUNKS:
                chunks *= extents[outer]
                outer += 1
            sch.parallel(sch.fuse(*loops[:outer]) if outer > 1 else loops[0])
        if config["vectorize"] and inner < len(loops) and lanes > 1:
            sch.vectorize(sch.fuse(*loops[inner:]) if len(loops) - inner > 1 else loops[inner])
