"""Known loop nests of the loop space, as an expert would write them: oneDNN-like register blocking
(`blocked_config`), and its dot-product form (`_dot_config`). A search measures them first (the space's
`seed_configs`); they are our addition to the searches, not part of ALT's or Ansor's algorithm.

Layering: `tuner` never imports `service`.
"""

from __future__ import annotations

from collections.abc import Callable

from compiler.target import VectorUnit

from .base import Config, InvalidConfig, Knob
from .divisors import divisors
from .loop_knobs import REGISTER_ROWS, SPATIAL_LEVELS, TENSORIZE_ORDER, UNROLL_STEPS
from .loop_structure import Axis, Structure


class LoopSeeds:
    """`LoopSpace`'s known nests (a mixin: it reads the space's structure, vector unit, knobs and the main
    block's reads, and validates what it builds)."""

    structure: Structure
    unit: VectorUnit
    _knobs: tuple[Knob, ...]
    _by_name: dict[str, Knob]
    _vector_block_axes: tuple[Axis, ...]
    _main_reads: tuple[list[list], Callable[[list, Axis], bool]]
    validate: Callable[[Config], Config]

    def blocked_config(self, lanes: int | None = None, column: bool | None = None, wide: bool = False) -> Config:
        """A oneDNN-like loop nest: a register block of the two innermost spatial loops at the innermost
        level -- columns of the last: one or two whole vectors (a layout's channel tile: one), else the
        widest narrower vector (8 of 56), else what divides; rows of the one before up to `REGISTER_ROWS`
        and the unit's `accumulators` vector registers in all, as large as divisors allow -- with its last loop
        vectorized; the first reduction loop split by `lanes` (the input's channel tile) and the others (the
        kernel window) whole in the inner reduction level, as oneDNN's direct convolution (each channel of
        the tile, each kernel tap: broadcast, multiply-add; 1.2-1.7x faster than the window outside the
        block on the quick suite's convolutions); the reduction between the parallel outer loops and the
        block (order SSRSRS), unrolled whole.

        A last loop that no vector fits, not even half of one (7 of a 7x7 depthwise conv: a 7-lane vector
        ran 2x slower than scalar code there) takes a column of scalar accumulators instead: rows of
        the loop before innermost, not vectorized (LLVM's SLP vectorizer packs the unrolled rows), the last
        loop whole in the second tile level, each column written back from a cache there (`write_at` 2,
        3x faster than writing the output in place) and the producers computed in each parallel tile
        (`read_at` 1), as MetaSchedule's best program for that conv. `column` True takes the column
        anyway (where the last loop is read with a stride, a stride-2 depthwise conv: 0.38 ms, the vector
        nest 1.75 ms), False never; None decides as above.

        `wide`: columns of several vectors where they hold more sums than one vector's rows do, within the
        accumulators less two (each column's weight vector): the output block of a template's layout (the axis
        besides the lanes that indexes the weight but not an input broadcast to the lanes) at the innermost level
        too, so each broadcast feeds several FMAs (a depthwise conv broadcasts nothing: not widened). A GEMM in
        `M/8 N/16 8 16` holds 8 x 1 sums of AVX-512's 28, 8 x 2 wide: 1.50-1.73 ms against 1.74-1.89 (cascadelake,
        512^3); a conv's 14-row block is not widened (7 x 2 holds no more), and 14 x 2 in
        all 28 accumulators ran 1.95 ms against 1.04. Otherwise the same as the narrow block.

        A program in the dot-product form (a `G` axis) gets `_dot_config(wide)` instead."""
        if self.structure.group is not None:
            return self._dot_config(wide)
        lanes = self.unit.lanes if lanes is None else lanes
        config: Config = {k.name: 1 for k in self._knobs if k.name.startswith("tile.")}
        spatial = [a for a in self.structure.axes if a.kind == "S" and a.extent > 1]
        if len(spatial) < 2:
            column = False
        if spatial:
            fits = [d for d in divisors(spatial[-1].extent) if d <= 2 * lanes]
            whole = [d for d in fits if d % lanes == 0]
            narrower = [d for d in fits if d >= 4 and lanes % d == 0]
            if column is None:
                column = not (whole or narrower) and max(fits) < lanes // 2
            if column:
                cols, config[spatial[-1].knob(1)] = 1, spatial[-1].extent
            else:
                cols = config[spatial[-1].knob(SPATIAL_LEVELS - 1)] = max(whole or narrower or fits)
            if len(spatial) > 1:
                vectors = -(-cols // lanes)

                def rows(blocks: int, room: int) -> int:
                    return max(d for d in divisors(spatial[-2].extent)
                               if d <= REGISTER_ROWS and d * blocks * vectors <= room)

                narrow = config[spatial[-2].knob(SPATIAL_LEVELS - 1)] = rows(1, self.unit.accumulators)
                lanes_last = spatial[-1] == self.structure.spatial[-1]  # the weight's lanes: the block's columns
                block = self._wide_block_axis(spatial[-2]) if wide and not column and lanes_last else None
                if block is not None:
                    room = self.unit.accumulators - 2  # each block's vector of the weight besides its sums
                    r, v = max(((rows(v, room), v) for v in divisors(block.extent) if 1 < v <= 4),
                               key=lambda rv: (rv[0] * rv[1], rv[0]), default=(0, 1))
                    if r * v > narrow:
                        config[spatial[-2].knob(SPATIAL_LEVELS - 1)], config[block.knob(SPATIAL_LEVELS - 1)] = r, v
        reduction = [a for a in self.structure.axes if a.kind == "R" and a.extent > 1]
        if reduction:
            config[reduction[0].knob(1)] = max(d for d in divisors(reduction[0].extent) if d <= lanes)
        if not column:  # the vector block's inner reduction: the channel tile by the whole kernel window (a long
            # reduction, a mean over 112 rows, by the largest inner tile the space has)
            config.update({a.knob(1): max(self._by_name[a.knob(1)].choices) for a in reduction[1:]})
        config.update(order=0, parallel=1, vectorize=int(not column), unroll=UNROLL_STEPS[-1], write_at=0, licm=1,
                      transpose=1)
        if column and 2 in self._by_name["write_at"].choices:
            config["write_at"] = 2
        if "inline" in self._by_name:
            config.update(inline=0, read_at=int(column))
        return self.validate(config)

    def _dot_config(self, wide: bool = False) -> Config:
        """`blocked_config` of the dot-product form (`compiler.workloads.model.legalize.conv2d_nhwc_dot`: spatial
        axes ..., row, output block, lanes; reductions ..., channel chunks; the group): the instruction's
        register block -- the lanes whole, one or two output blocks (one vector each), rows of the axis before
        them up to `REGISTER_ROWS`, the most accumulators the unit holds -- the kernel window (at most the largest
        inner tile the space has) and up to 16 channel chunks in the inner reduction level, marked for the
        instruction (order SSRSRS), unrolled whole.

        A layout template's dot-product form (`compiler.layout.templates`: spatial axes ..., output block, ...,
        the spatial tiles, lanes) has rows, not an output block, before the lanes (the axis before the lanes does
        not index the weight): one vector, rows of that axis; `wide`: also up to 4 vectors of its output block
        (`_vector_block_axes`, which `_apply` puts under the rows), the most accumulators the unit holds. On
        znver5 a bf16 255^3 GEMM ran 0.066 ms with 8 rows x 2 vectors against 0.084 with one vector, an int8
        127x1000x127 0.048 against 0.095 with 8 x 3; an int8 conv's 11 rows x 2 vectors tied with one (1.12 ms)
        or spilled (1.64 against 1.15 as seeds), so both are seeds (`tuner.searches.alt`). Where blocks tie in
        accumulators, the wide one takes more rows (8 x 2 rather than 4 x 4: 0.066 against 0.086 ms)."""
        config: Config = {k.name: 1 for k in self._knobs if k.name.startswith("tile.")}
        *outer, block, lane = self.structure.spatial  # (a unit block or rows axis has no knob)
        widths: tuple[int, ...] = (2, 1) if block.extent % 2 == 0 else (1,)
        prefer = 1  # where two blocks hold as many accumulators: the one of more vectors (-1: of more rows)
        if block not in self._vector_block_axes:  # the weight does not depend on `block`: a template's form,
            outer = [block]  # `block` holds the rows, one vector (or `wide`)
            wider = [a for a in self._vector_block_axes if a.extent > 1] if wide else []
            block = wider[-1] if wider else None
            # several vectors (one only where no other divides): where one vector of more rows holds as many
            # accumulators (AVX2's 12: 12 x 1 against 4 x 3), the narrow seed is that block already
            widths = tuple(sorted((d for d in divisors(block.extent) if 1 < d <= 4), reverse=True) or (1,)) \
                if block else (1,)
            prefer = -1  # 8 rows x 2 vectors ran 0.066 ms where 4 x 4 ran 0.086 (the bf16 255^3 GEMM)
        outer = [a for a in outer if a.extent > 1]
        if lane.extent > 1:
            config[lane.knob(SPATIAL_LEVELS - 1)] = lane.extent
        vectors = widths[0]
        if outer:
            # the block of most accumulators (two vectors before one where they tie): 7 rows of one vector
            # where 7 x 2 is more than the unit holds (AVX2's 12) and one row of two would leave no rows loop
            rows, vectors = max(((max(d for d in divisors(outer[-1].extent)
                                      if d <= REGISTER_ROWS and d * v <= self.unit.accumulators), v) for v in widths),
                                key=lambda rv: (rv[0] * rv[1], prefer * rv[1]))
            config[outer[-1].knob(SPATIAL_LEVELS - 1)] = rows
        if block is not None and block.extent > 1:
            config[block.knob(SPATIAL_LEVELS - 1)] = vectors
        chunks = self._chunk_axis(*self._main_reads)
        # the kernel window whole (a window longer than the space's inner tiles, 1x80: the largest inner tile it
        # has, as `blocked_config`'s), up to 16 channel chunks
        config.update({a.knob(1): max(self._by_name[a.knob(1)].choices) for a in self.structure.reduce
                       if a.extent > 1 and a != chunks})
        if chunks is not None and chunks.extent > 1:
            config[chunks.knob(1)] = max(d for d in divisors(chunks.extent) if d <= 16)
        config.update(order=TENSORIZE_ORDER, parallel=1, vectorize=1, unroll=UNROLL_STEPS[-1], write_at=0, licm=1,
                      tensorize=1, transpose=1)
        if "inline" in self._by_name:
            config.update(inline=0, read_at=0)
        try:
            return self.validate(config)
        except InvalidConfig:  # a register block over the unit's limit: one vector
            if block is not None and block.extent > 1:
                config[block.knob(SPATIAL_LEVELS - 1)] = 1
            return self.validate(config)

    def _wide_block_axis(self, rows: Axis) -> Axis | None:
        """The axis a wide register block takes several vectors of (`blocked_config(wide=True)`): the last output
        block besides `rows` that indexes the weight but not an input broadcast to the lanes; None where none does
        (a depthwise conv broadcasts nothing)."""
        reads, uses = self._main_reads
        broadcast = [r for r in reads if not uses(r, self.structure.spatial[-1])]  # read once for all lanes
        return next((a for a in reversed(self._vector_block_axes) if a.extent > 1 and a != rows
                     and any(not uses(r, a) for r in broadcast)), None)


    def _chunk_axis(self, reads: list[list], uses: Callable[[list, Axis], bool]) -> Axis | None:
        """The reduction over channel chunks of the dot-product form: the reduce axis (not the group) that indexes
        the data (the operand the lanes do not index) where no spatial axis does -- its channel dims (`rc * G +
        g`; `ko` and `g` apart in a GEMM's `M/mt K/G mt G`), not the kernel window's (`y + kh`). It comes last in
        `conv2d_nhwc_dot`, first in a template's conv."""
        st = self.structure
        for indices in reads:
            if uses(indices, st.spatial[-1]):
                continue  # the weight
            for e in indices:
                if not any(uses([e], a) for a in st.spatial):
                    found = [a for a in st.reduce if uses([e], a)]
                    if found:
                        return found[0]
        return None

