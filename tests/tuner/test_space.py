"""LoopSpace: sampling, validation, neighbors, and scheduled programs that compute the right thing."""

from __future__ import annotations

import json

import numpy as np
import pytest

from compiler.target import AVX2, AVX512
from tuner_cases import SMALL, run, workload


@pytest.mark.parametrize("operator,params,epilogue", SMALL, ids=[f"{o}-{e}" for o, _, e in SMALL])
def test_sampled_schedules_match_the_reference(operator, params, epilogue):
    from tuner import LoopSpace

    wl = workload(operator, params, epilogue)
    space = LoopSpace(wl.prim_func)
    assert space.structure.main == wl.compute_block
    inputs = wl.random_inputs(1)
    expected = wl.reference(inputs)
    rng = np.random.default_rng(0)
    configs = space.sample(rng, 3)
    # cover the write-back / epilogue placements and both inline settings at least once
    configs.append(space.validate({**configs[0], "parallel": 1, "write_at": 1, **({"inline": 0} if "inline" in configs[0] else {})}))
    # one thread: no parallel loop anywhere, the epilogue still placeable in the outer tile
    configs.append(space.validate({**configs[0], "parallel": 0, "write_at": 1}))
    if "read_at" in configs[0]:  # the producers computed in each tile of either level
        configs += [space.validate({**configs[0], "parallel": 1, "inline": 0, "read_at": r}) for r in (1, 2)]
    # the nearest to the untuned program: reduction innermost, one thread, no tiles
    untuned = space.untuned_config()
    assert untuned["order"] == 3 and untuned["parallel"] == 0
    assert all(v == 1 for k, v in untuned.items() if k.startswith("tile."))
    configs.append(untuned)
    # oneDNN's register blocking: the two innermost spatial loops whole at the innermost level (or, where
    # the last is too narrow for a vector, a column: rows innermost, the last loop in level 1)
    blocked = space.blocked_config()  # this machine's vector unit
    rows, cols = [a for a in space.structure.axes if a.kind == "S" and a.extent > 1][-2:]
    column = not blocked["vectorize"]
    # (rows may be 1: 11 columns take two 8-lane vectors on AVX2, and 2 x 11 rows would not fit 12 registers)
    assert blocked[cols.knob(1 if column else 3)] > 1 and blocked["order"] == 0
    assert blocked[rows.knob(3)] * -(-blocked[cols.knob(3)] // space.unit.lanes) <= space.unit.accumulators
    configs.append(blocked)
    for config in configs:
        assert json.loads(json.dumps(config)) == config
        mod = space.apply(config).mod
        assert ("T.parallel" in mod.script()) == (config["parallel"] > 0), config
        out = run(mod, inputs, wl.output.shape)
        np.testing.assert_allclose(out, expected, rtol=1e-3, atol=1e-3, err_msg=f"{config}")


def test_one_thread_keeps_outer_loops_apart_and_blocking_picks_whole_or_narrower_vectors():
    """A fused serial loop's div/mod indices kept LLVM from vectorizing the untuned depthwise rows (10x
    slower); register blocking takes whole vectors where they divide, else a narrower one (8 of 56)."""
    from tuner import LoopSpace

    depthwise = LoopSpace(workload("depthwise_conv2d", dict(batch=1, channels=8, height=56, width=56, kernel=3,
                                                            padding=1)).prim_func, AVX512)
    script = depthwise.apply(depthwise.untuned_config()).mod.script()
    assert "fused" not in script and "T.parallel" not in script
    blocked = depthwise.blocked_config(16)
    assert (blocked["tile.j.3"], blocked["tile.i.3"]) == (8, 14) and blocked["unroll"] == 512
    dense = LoopSpace(workload("dense", dict(m=64, n=64, k=64)).prim_func, AVX512)
    blocked = dense.blocked_config(16)
    cols, rows = (blocked[a.knob(3)] for a in dense.structure.spatial[::-1])
    assert (cols, rows) == (32, 8) and blocked[dense.structure.reduce[0].knob(1)] == 16


def test_the_register_block_fits_the_machines_vector_unit():
    """AVX2 has 16 registers of 8 fp32 lanes, AVX-512 32 of 16: the same dense gets blocks of 4x16 and 8x32,
    and a block that would spill on AVX2 is not a configuration there."""
    from tuner import InvalidConfig, LoopSpace

    prim_func = workload("dense", dict(m=64, n=64, k=64)).prim_func
    for unit, block in ((AVX2, (16, 4, 8)), (AVX512, (32, 8, 16))):
        space = LoopSpace(prim_func, unit)
        blocked = space.blocked_config()
        cols, rows = (blocked[a.knob(3)] for a in space.structure.spatial[::-1])
        assert (cols, rows, blocked[space.structure.reduce[0].knob(1)]) == block, unit
    avx512_block = LoopSpace(prim_func, AVX512).blocked_config()
    with pytest.raises(InvalidConfig, match="16 vector registers of 8 lanes"):
        LoopSpace(prim_func, AVX2).validate(avx512_block)


def test_the_vector_block_reduces_the_channel_tile_by_the_whole_kernel_window_inside():
    """oneDNN's direct convolution: inside the register block, each input channel of the tile and each kernel
    tap (on the quick suite's first tiled layouts 1.2-1.7x faster than the window outside the block); the
    scalar column keeps the window outside."""
    from tuner import LoopSpace

    wl = workload("conv2d", dict(batch=1, in_channels=32, height=14, width=14, out_channels=16, kernel=3, padding=1))
    space = LoopSpace(wl.prim_func, AVX512)
    blocked = space.blocked_config(16)
    rc, ry, rx = (a for a in space.structure.axes if a.kind == "R")
    assert (blocked[rc.knob(1)], blocked[ry.knob(1)], blocked[rx.knob(1)]) == (16, 3, 3)
    inputs = wl.random_inputs(4)
    np.testing.assert_allclose(run(space.apply(blocked).mod, inputs, wl.output.shape), wl.reference(inputs),
                               rtol=1e-4, atol=1e-4)
    column = LoopSpace(workload("depthwise_conv2d", dict(batch=1, channels=32, height=7, width=7, kernel=3,
                                                          padding=1)).prim_func, AVX512)
    blocked = column.blocked_config(16)
    assert [blocked[a.knob(1)] for a in column.structure.axes if a.kind == "R"] == [3, 1]


def test_blocking_a_last_loop_narrower_than_half_a_vector_takes_a_scalar_column():
    """7 of a 7x7 depthwise conv fits no vector: the blocked nest keeps a column of scalar accumulators
    (rows innermost, the 7 columns in tile level 1, written back from a cache there, the padding computed
    per parallel tile) instead of a 7-lane vector (on dep_b1_c960 the search then found 8.5 us, not 16.4);
    14 still takes a vector (14 of 16 lanes)."""
    from tuner import LoopSpace

    wl = workload("depthwise_conv2d", dict(batch=1, channels=32, height=7, width=7, kernel=3, padding=1))
    space = LoopSpace(wl.prim_func, AVX512)
    blocked = space.blocked_config(16)
    assert (blocked["tile.i.3"], blocked["tile.j.3"], blocked["tile.j.1"]) == (7, 1, 7)
    assert (blocked["vectorize"], blocked["write_at"], blocked["read_at"]) == (0, 2, 1)
    script = space.apply(blocked).mod.script()
    assert "T.vectorized" not in script.split('T.sblock("PaddedInput")')[1]  # only the padding copy is
    assert script.count("T.parallel") == 1 and "_global" in script  # the write-back cache
    inputs = wl.random_inputs(3)
    np.testing.assert_allclose(run(space.apply(blocked).mod, inputs, wl.output.shape), wl.reference(inputs),
                               rtol=1e-4, atol=1e-4)
    wider = LoopSpace(workload("depthwise_conv2d", dict(batch=1, channels=32, height=14, width=14, kernel=3,
                                                       padding=1)).prim_func, AVX512).blocked_config(16)
    assert (wider["tile.j.3"], wider["vectorize"], wider["write_at"]) == (14, 1, 0)


def test_producers_computed_in_the_tile_have_no_loop_nest_of_their_own():
    """read_at computes the padding in each tile of the parallel loop, as MetaSchedule's compute location:
    one parallel loop instead of two (on a 7x7 depthwise conv with 960 channels 11.5 -> 7.8 us)."""
    from tuner import InvalidConfig, LoopSpace

    wl = workload("depthwise_conv2d", dict(batch=1, channels=32, height=7, width=7, kernel=3, padding=1))
    space = LoopSpace(wl.prim_func, AVX512)
    config = {**space.blocked_config(16), "tile.c.2": 2, "read_at": 0}
    at_root = space.apply(config).mod.script()
    assert at_root.count("T.parallel") == 2  # padding and convolution, each its own parallel loop
    in_tile = space.apply({**config, "read_at": 1}).mod.script()
    assert in_tile.count("T.parallel") == 1
    assert in_tile.index("T.parallel") < in_tile.index('T.sblock("PaddedInput")')
    inputs = wl.random_inputs(2)
    np.testing.assert_allclose(run(space.apply({**config, "read_at": 1}).mod, inputs, wl.output.shape),
                               wl.reference(inputs), rtol=1e-4, atol=1e-4)
    # a configuration stored before the knob existed means the producers at the root
    older = {k: v for k, v in config.items() if k != "read_at"}
    assert space.validate(older) == config
    for bad in ({**config, "read_at": 1, "inline": 1}, {**config, "read_at": 1, "parallel": 2}):
        with pytest.raises(InvalidConfig, match="read_at"):
            space.validate(bad)


def test_producers_of_a_strided_access_computed_in_a_tile_are_scheduled_and_correct():
    """In a tile of the stride-phase transposed conv, a producer's region may depend on the loop: its
    innermost loop then has no constant extent and is not vectorized, and the schedule still applies
    (it raised TypeError, which stopped a whole benchmark run)."""
    from tuner import LoopSpace

    wl = workload("conv2d_transpose", dict(batch=1, in_channels=64, height=28, width=28, out_channels=32, kernel=4,
                                           stride=2, padding=1))
    space = LoopSpace(wl.prim_func)
    config = {"tile.o.1": 2, "tile.o.2": 8, "tile.o.3": 2, "tile.y.1": 1, "tile.y.2": 7, "tile.y.3": 8, "tile.x.1": 8,
              "tile.x.2": 1, "tile.x.3": 7, "tile.ic.1": 4, "tile.jy.1": 1, "tile.jx.1": 1, "order": 3, "parallel": 0,
              "vectorize": 1, "unroll": 512, "write_at": 2, "inline": 0, "read_at": 2}
    inputs = wl.random_inputs(3)
    np.testing.assert_allclose(run(space.apply(config).mod, inputs, wl.output.shape), wl.reference(inputs),
                               rtol=1e-3, atol=1e-3)


def test_sampling_is_deterministic_and_valid():
    from tuner import LoopSpace

    wl = workload(*SMALL[0])
    space = LoopSpace(wl.prim_func)
    a = space.sample(np.random.default_rng(7), 20)
    b = space.sample(np.random.default_rng(7), 20)
    assert a == b
    for config in a:
        assert space.validate(config) == config
        assert {k.name for k in space.knobs} == set(config)


def test_invalid_configs_are_rejected():
    from tuner import InvalidConfig, LoopSpace

    wl = workload("dense", {"m": 8, "n": 12, "k": 16})
    space = LoopSpace(wl.prim_func)
    good = space.sample(np.random.default_rng(0), 1)[0]
    bad = [
        {**good, "bogus": 1},
        {k: v for k, v in good.items() if k != "order"},
        {**good, "tile.i1.3": 5},  # not a divisor of 12
        {**good, "tile.i1.1": 4, "tile.i1.2": 4, "tile.i1.3": 1},  # 16 does not divide 12
        {**good, "parallel": 2, "write_at": 1},  # epilogue inside the fused parallel loop
        {**good, "vectorize": True},
        {**good, "unroll": 7},
    ]
    for config in bad:
        with pytest.raises(InvalidConfig):
            space.apply(config)


def test_neighbors_are_valid_and_one_step_away():
    from tuner import LoopSpace

    wl = workload(*SMALL[0])
    space = LoopSpace(wl.prim_func)
    config = space.sample(np.random.default_rng(3), 1)[0]
    near = space.neighbors(config)
    assert near
    for other in near:
        assert space.validate(other) == other
        changed = {k for k in config if config[k] != other[k]}
        # a tile move changes at most two levels of one axis
        assert len(changed) <= 2 and len({k.rsplit(".", 1)[0] for k in changed}) == 1, changed


def test_an_error_tvm_raises_while_scheduling_is_a_schedule_failure(monkeypatch):
    """What TVM's C++ side raises (a schedule error, a failed check) reaches the search as `ScheduleFailed`,
    which it records as an error trial, and nothing else."""
    import tvm
    from tvm import s_tir

    from tuner import LoopSpace, ScheduleFailed

    wl = workload(*SMALL[0][:2])
    space = LoopSpace(wl.prim_func)
    config = space.sample(np.random.default_rng(0), 1)[0]

    def check_failed(self, config):
        sch = s_tir.Schedule(self.mod)
        sch.get_sblock("no_such_block")  # TVM raises its own error here

    monkeypatch.setattr(LoopSpace, "_apply", check_failed)
    with pytest.raises(ScheduleFailed, match="schedule failed"):
        space.apply(config)

    def internal(self, config):
        raise tvm.error.InternalError("Check failed: (x) is false")

    monkeypatch.setattr(LoopSpace, "_apply", internal)
    with pytest.raises(ScheduleFailed, match="InternalError"):
        space.apply(config)


def test_program_without_reduction_is_refused():
    from tvm import te

    from tuner import LoopSpace

    a = te.placeholder((8,), name="a")
    b = te.compute((8,), lambda i: a[i] * 2, name="b")
    with pytest.raises(ValueError, match="no reduction block"):
        LoopSpace(te.create_prim_func([a, b]).with_attr("global_symbol", "main"))


def test_unknown_space_kind():
    from tuner import make_space

    with pytest.raises(ValueError, match="unknown search space: nope"):
        make_space("nope", None)


def test_licm_is_a_knob_and_older_configurations_keep_it_on():
    """On tuned nests LLVM hoists most of what our LICM would, and the pass sometimes loses (bench.licm): the
    search decides per candidate. licm=0 marks the function so the pipeline's pass leaves it alone."""
    from tuner import LoopSpace

    wl = workload("conv2d", dict(batch=1, in_channels=8, height=10, width=10, out_channels=8, kernel=3, padding=1))
    space = LoopSpace(wl.prim_func)
    assert space.knobs[[k.name for k in space.knobs].index("licm")].choices == (0, 1)
    blocked = space.blocked_config()
    older = {k: v for k, v in blocked.items() if k != "licm"}
    assert space.validate(older)["licm"] == 1 and blocked["licm"] == 1 and space.untuned_config()["licm"] == 1
    inputs = wl.random_inputs(5)
    for licm in (0, 1):
        mod = space.apply({**blocked, "licm": licm}).mod
        attrs = mod["main"].attrs
        assert (attrs is not None and "altune.licm" in attrs and not attrs["altune.licm"]) == (licm == 0)
        np.testing.assert_allclose(run(mod, inputs, wl.output.shape), wl.reference(inputs), rtol=1e-4, atol=1e-4)
    assert {c["licm"] for c in space.sample(np.random.default_rng(0), 40)} == {0, 1}


def test_tensorize_is_a_knob_that_marks_the_register_block():
    """tensorize=1 marks the inner reduction loop above the register block; where the nest is an outer product
    (NCHW conv: rows over output channels, lanes over the width) the build runs the target's fp32 FMA
    micro-kernel and computes the same; with rows over the height (the input depends on them) the nest is still
    one: one row of the broadcast weight times the input's vectors, the height a loop of columns; where the
    target has no instruction, the nest is left as it was. 0, and configurations older than the knob,
    give today's program; int8 and bf16 programs in the catalog's own layouts are not offered it (their dot products
    need packed weights: test_alt's dot-product form has them)."""
    import tvm

    from compiler.passes.tensorize import ANNOTATION, tensorize_module
    from compiler.target import resolve_target
    from compiler.workloads import make_workload
    from tuner import LoopSpace

    wl = workload("conv2d", dict(batch=1, in_channels=8, height=6, width=16, out_channels=8, kernel=3, padding=1),
                  "bias_relu")
    space = LoopSpace(wl.prim_func)
    assert space.knobs[[k.name for k in space.knobs].index("tensorize")].choices == (0, 1)
    blocked = space.blocked_config()
    older = {k: v for k, v in blocked.items() if k != "tensorize"}
    assert space.validate(older)["tensorize"] == 0 and blocked["tensorize"] == 0
    assert space.validate({**blocked, "tensorize": 1, "order": 1})["tensorize"] == 0  # no block under a reduction
    assert space.apply(older).mod.script() == space.apply(blocked).mod.script()
    assert ANNOTATION not in space.apply(blocked).mod.script()
    outer_product = space.validate({**blocked, "tile.yy.3": 1, "tile.ff.3": 4, "tensorize": 1})
    across_rows = space.validate({**blocked, "tensorize": 1})  # yy under the mark: a loop of columns
    inputs = wl.random_inputs(3)
    host = resolve_target("host")
    bare = tvm.target.Target({"kind": "llvm", "mtriple": "x86_64-linux-gnu"})  # SSE2 only: no FMA
    for config, target, used in ((outer_product, host, True), (across_rows, host, True),
                                 (outer_product, bare, False)):
        mod = space.apply(config).mod
        _, reports = tensorize_module(mod, target)
        assert bool(reports["main"].used) == used and (target is bare) <= bool(reports["main"].left), reports
        if target is host:
            np.testing.assert_allclose(run(mod, inputs, wl.output.shape), wl.reference(inputs), rtol=1e-4, atol=1e-4)
    assert space.knob_features(outer_product)[-2] == 1.0 and space.knob_features(blocked)[-2] == 0.0
    samples = space.sample(np.random.default_rng(0), 40)
    assert {c["tensorize"] for c in samples} == {0, 1}
    assert all(c["order"] == 0 for c in samples if c["tensorize"])
    for dtype in ("int8", "bfloat16"):
        assert "tensorize" not in {k.name for k in LoopSpace(make_workload("dense", {"m": 8, "n": 16, "k": 8},
                                                                            dtype).prim_func).knobs}


def test_blocked_nest_of_a_long_second_reduction_stays_in_the_space():
    """efficientnet_b0's squeeze-excite mean reduces over 112 rows after its channels: the blocked nest's inner
    reduction (the whole window for a conv) is the largest inner tile the space has, not the whole 112
    (`InvalidConfig: tile.k3.1=112 not in [...]` failed the model's job)."""
    from tvm import te

    from tuner import LoopSpace

    data = te.placeholder((32, 8, 112), name="data")
    i, j = te.reduce_axis((0, 8), "i"), te.reduce_axis((0, 112), "j")
    out = te.compute((32, 16), lambda c, w: te.sum(data[c, i, j] * 2.0, axis=[i, j]), name="out")
    space = LoopSpace(te.create_prim_func([data, out]))
    inner = {a.knob(1): a.extent for a in space.structure.axes if a.kind == "R"}
    assert 112 in inner.values()
    config = space.blocked_config()
    assert config[next(k for k, e in inner.items() if e == 112)] == 56
