"""The ALT search: PPO agents on toy objectives, a real small conv2d, resume after an interruption."""

from __future__ import annotations

import math

import numpy as np
import pytest
from tuner_cases import host, workload


def test_layout_actor_learns_a_toy_objective():
    from tuner.ppo import Critic, LayoutActor

    actor = LayoutActor(4, 2, Critic(8, seed=0), seed=0)
    target = (0.8, 0.2)
    means = []
    for _ in range(40):  # 320 steps
        actions = actor.act([0.1, 0.2, 0.3, 0.4], 8)
        actor.reward_last([-sum(abs(a - t) for a, t in zip(x, target)) for x in actions])
        means.append(actor.update())
    assert np.mean(means[-5:]) > np.mean(means[:5]) + 0.15, means


def test_loop_actor_learns_directions():
    from tuner.ppo import Critic, LoopActor

    actor = LoopActor(4, 5, Critic(8, seed=0), seed=0)
    want = [1, -1, 0, 1, -1]
    means = []
    for _ in range(20):  # 320 steps
        dirs = actor.directions([0.5] * 4, 16)
        actor.reward_last([sum(d == w for d, w in zip(x, want)) / 5 for x in dirs])
        means.append(actor.update())
    assert means[-1] > 0.9 and means[0] < 0.6, means


def test_factor_mapping_is_eq2():
    from tuner.ppo import action_of, factor_of

    cands = (1, 2, 4, 7, 8, 14, 28, 56)
    assert factor_of(cands, 56, 0.0) == 1 and factor_of(cands, 56, 1.0) == 56
    for f in cands:
        assert factor_of(cands, 56, action_of(56, f)) == f


SMALL_CONV = dict(batch=1, in_channels=8, height=12, width=12, out_channels=16, kernel=3, padding=1)


def _task(wl, seed=0):
    from tuner import Task

    xs = wl.random_inputs(seed)
    return Task(wl.operator, wl.key, wl.prim_func, host(), xs, wl.reference(xs), workload=wl), xs


@pytest.mark.parametrize("width, avx2, avx512", [(56, (8, 8), (14, 14)), (28, (14, 7), (14, 14)), (64, (16, 8), (16, 16))])
def test_the_first_layout_s_row_tile_is_one_the_unit_s_accumulators_hold(width, avx2, avx512):
    """The oneDNN-like first layout: channel tiles of one vector, and a row tile (of 4-16) whose register block
    (rows of it, one vector each, within the accumulators) holds the most rows, the longer tile where they tie --
    AVX2's 12 accumulators hold 8 rows of a 56-wide row's tile 8 but only 7 of tile 14; AVX-512's 28 hold 14 --
    and the seed in it is that register block."""
    from compiler.target import AVX2, AVX512
    from tuner.searches.alt_seeds import first_layout
    from tuner.spaces.layout import LayoutSpace, interface_space
    from tuner_cases import task_of

    wl = workload("conv2d", dict(batch=1, in_channels=16, height=4, width=width, out_channels=32, kernel=3,
                                 padding=1))
    space = LayoutSpace(task_of(wl, workload=wl))
    for unit, (row_tile, rows) in ((AVX2, avx2), (AVX512, avx512)):
        choice = first_layout(space.template, unit)
        assert (choice["ot"], choice["wt"]) == (unit.lanes, row_tile), unit
        loops = interface_space(space.program(space.full_choice(choice)), unit)
        blocked = loops.blocked_config()
        *_, row_axis, lane_axis = loops.structure.spatial
        assert (blocked[row_axis.knob(3)], blocked[lane_axis.knob(3)]) == (rows, unit.lanes), unit


@pytest.mark.parametrize("operator, params", [("dense", dict(m=32, n=64, k=48)),
                                              ("batch_matmul", dict(batch=2, m=16, n=32, k=24))])
def test_a_gemm_s_first_layout_packs_weight_panels_along_the_reduction_and_seeds_two_vectors_a_row(operator, params):
    """As BLAS packs B: the weight in panels of one vector of columns, each contiguous along the whole reduction
    (`K/K N/L K L`, not `K N/L L`, whose panel rows lie a weight row apart). The first layout's seeds: 8 rows x 1
    vector, and wide 8 rows x 2 vectors on AVX-512 (16 of its 28 accumulators); AVX2's 12 hold no wider block (4 x 2
    is no more sums), so there the two are one. Every seed computes the GEMM."""
    import tvm

    from compiler.build import compile_module
    from compiler.target import AVX2, AVX512
    from tuner.searches.alt_seeds import first_layout
    from tuner.spaces.layout import LayoutSpace, interface_space, join_config
    from tuner_cases import task_of

    wl = workload(operator, params)
    task = task_of(wl, workload=wl)
    xs = wl.random_inputs(0)
    space = LayoutSpace(task)
    k = params["k"]
    for unit, wide_block in ((AVX512, (8, 2)), (AVX2, (8, 1))):
        choice = space.full_choice(first_layout(space.template, unit))
        assert (choice["mt"], choice["nt"], choice["kt"]) == (8, unit.lanes, k), unit
        prog = space.program(choice)
        (weight,) = [lay for name, lay in prog.layouts.items() if lay.new_shape[-1] == unit.lanes and name != "output"]
        assert weight.new_shape[-4:] == (1, params["n"] // unit.lanes, k, unit.lanes), weight.name
        loops = interface_space(prog, unit)
        narrow, wide = loops.blocked_config(), loops.blocked_config(wide=True)
        *_, block, rows, lanes = loops.structure.spatial
        assert (narrow[rows.knob(3)], narrow[block.knob(3)], narrow[lanes.knob(3)]) == (8, 1, unit.lanes)
        assert (wide[rows.knob(3)], wide[block.knob(3)], wide[lanes.knob(3)]) == (*wide_block, unit.lanes), unit
        for config in (narrow, wide):
            lib = compile_module(space.apply(join_config(choice, config)).mod, task.target).jit()
            args = [tvm.runtime.tensor(a) for a in prog.pack_inputs(xs)]
            out = tvm.runtime.tensor(np.zeros(prog.args[-1].shape, prog.args[-1].dtype))
            lib["main"](*args, out)
            np.testing.assert_allclose(out.numpy(), wl.reference(xs), rtol=1e-4, atol=1e-4)


@pytest.mark.tunes
def test_alt_tunes_a_small_conv2d_correctly_and_keeps_its_best():
    from tuner import layout_of_config, tune

    wl = workload("conv2d", SMALL_CONV, "bias_relu")
    task, xs = _task(wl)
    records = []
    result = tune(task, 24, seed=0, batch_size=32, top_k=4, on_trial=records.append)
    assert len(result.trials) == 24 and records == result.trials
    assert {t.stage for t in result.trials} == {"joint", "loop"}
    assert [t.stage for t in result.trials].index("loop") == round(0.3 * 24)
    best = result.best
    assert best is not None and result.baseline_ms is not None  # speed is bench/'s: here, the bookkeeping
    assert best.latency_ms == min(t.latency_ms for t in result.trials if t.latency_ms is not None)
    assert all(t.predicted is not None for t in result.trials[4:])
    # the joint stage tried the user's own layouts (first) and tiled ones
    layouts = [t.extra["layout"] for t in result.trials if t.stage == "joint"]
    assert layouts[0] == "N O H W" and not any(k.startswith("layout.") for k in result.trials[0].config)
    assert any("/" in name for name in layouts)
    # its first round measured the loop nest nearest the untuned program
    from tuner import LoopSpace

    untuned = [t for t in result.trials if t.extra.get("source") == "untuned"]
    assert len(untuned) == 1 and untuned[0].extra["layout"] == "N O H W"
    assert untuned[0].config == LoopSpace(task.prim_func).untuned_config()
    # and register blocking, there both ways (vectors, a column of scalars) and in its first tiled layout
    # (the oneDNN-like one)
    from tuner.spaces.layout import interface_space, split_config

    blocked = [t for t in result.trials if t.extra.get("origin") == "blocked"]  # picked by the model or as a seed
    assert [t.extra["layout"] for t in blocked][:2] == ["N O H W"] * 2 and len(blocked) == 3
    space = LoopSpace(task.prim_func)
    assert sorted((t.config for t in blocked[:2]), key=lambda c: c["vectorize"]) == [
        space.blocked_config(column=True), space.blocked_config(column=False)]
    assert "/" in blocked[2].extra["layout"]
    space = interface_space(layout_of_config(task, blocked[2].config))
    assert split_config(blocked[2].config)[1] == space.blocked_config()

    # the best tiled layout's artifact program: constants packed once, data and output the user's
    tiled = min((t for t in result.trials if t.latency_ms is not None and "/" in t.extra["layout"]),
                key=lambda t: t.latency_ms)
    _check_artifact_program(task, wl, xs, tiled.config)


def _check_artifact_program(task, wl, xs, config):
    """A layout configuration's program as the artifact runs it (conv2d + bias): constants packed once by
    "pack_constants", data and output in the user's layouts; its output matches the reference."""
    import tvm

    from tuner import apply_config, layout_of_config

    prog = layout_of_config(task, config)
    lib = tvm.compile(apply_config(task, config), host()).jit()
    named = dict(zip([s.name for s in wl.inputs], xs))
    packed = [tvm.runtime.tensor(np.zeros(s.shape, "float32")) for s in prog.args[:-1] if s.name != "data"]
    lib["pack_constants"](*[tvm.runtime.tensor(named[n]) for n in ("weight", "bias")], *packed)
    out = tvm.runtime.tensor(np.zeros(wl.output.shape, "float32"))
    lib["main"](tvm.runtime.tensor(xs[0]), *packed, out)
    np.testing.assert_allclose(out.numpy(), wl.reference(xs), rtol=1e-4, atol=1e-4)


class _FakeDevice:
    """Deterministic latency from a layout configuration: vector-width channel tiles and register rows win."""

    def __new__(cls):
        from tuner.measurers import MeasureResult, Measurer

        class _Fake(Measurer):
            def measure_one(self, task, candidate):
                c = candidate.config
                lat = 1.0 + 0.4 * abs(math.log2(c.get("layout.ot", 1)) - 3)
                lat += 0.3 * abs(math.log2(c.get("layout.wt", 1)) - 2)
                lat += sum(0.1 * abs(math.log2(v) - 1) for k, v in c.items()
                           if k.startswith("tile.") and k.endswith(".3"))
                lat += 0.3 * c["order"] + 0.2 * (1 - c["vectorize"]) + 0.1 * abs(c["unroll"] - 64) / 64
                return MeasureResult([lat, lat, lat], None)

            def baseline_ms(self, task):
                return 20.0

        return _Fake()


@pytest.mark.tunes
def test_resumed_search_ends_no_worse_and_restores_its_stage():
    from tuner import tune
    from tuner.searches.alt import ALTSearch
    from tuner.spaces.layout import LayoutSpace

    wl = workload("conv2d", SMALL_CONV)
    task, _ = _task(wl)
    budget, cut = 40, 17
    for seed in (3, 4, 5):
        options = dict(seed=seed, batch_size=32, measurer=_FakeDevice())
        whole = tune(task, budget, **options)
        seen = []
        first = tune(task, budget, should_stop=lambda: len(seen) >= cut, on_trial=seen.append, **options)
        assert len(first.trials) == cut and first.trials[-1].stage == "loop"
        if seed == 3:
            search = ALTSearch(task, LayoutSpace(task), _FakeDevice(), seed=seed, batch_size=32)
            search.pre_tuning(first.trials)
            assert search.model.trained and search.count == cut and search.best_point() is not None
        rest = tune(task, budget, prior=first.trials, **options)
        assert len(rest.trials) == budget - cut and rest.trials[0].index == cut
        assert {t.stage for t in rest.trials} == {"loop"}
        done = {str(sorted(t.config.items())) for t in first.trials}
        assert not done & {str(sorted(t.config.items())) for t in rest.trials}, "prior trials are not re-measured"
        # the resume replays the prior trials through the search (model, agents, stage, round), so it
        # goes on exactly as the uninterrupted run did: the same configurations, the same best
        assert [t.config for t in rest.trials] == [t.config for t in whole.trials[cut:]]
        assert [t.stage for t in rest.trials] == [t.stage for t in whole.trials[cut:]]
        assert rest.best.latency_ms <= whole.best.latency_ms


def test_resume_from_foreign_trials_learns_them_and_finishes_the_budget():
    """Prior trials this search would not have proposed (another seed): learned at once, not replayed."""
    from tuner import tune

    wl = workload("conv2d", SMALL_CONV)
    task, _ = _task(wl)
    seen = []
    other = tune(task, 40, seed=9, batch_size=32, measurer=_FakeDevice(),
                 should_stop=lambda: len(seen) >= 12, on_trial=seen.append)
    rest = tune(task, 40, seed=3, batch_size=32, measurer=_FakeDevice(), prior=other.trials)
    assert len(rest.trials) == 28 and rest.trials[0].index == 12
    keys = {str(sorted(t.config.items())) for t in other.trials}
    assert not keys & {str(sorted(t.config.items())) for t in rest.trials}
    assert rest.best.latency_ms <= min(t.latency_ms for t in other.trials)


def test_fixed_layout_is_loop_only():
    from tuner import tune

    wl = workload("dense", dict(m=8, n=32, k=16))
    task, _ = _task(wl)
    result = tune(task, 8, seed=0, batch_size=16, layout={}, measurer=_FakeDevice())
    assert {t.stage for t in result.trials} == {"loop"}
    assert {t.extra["layout"] for t in result.trials} == {"M N"}


def test_loop_stage_measures_the_other_placements_of_each_new_best():
    """A compute location the model has not seen measured is ranked low: the loop stage sweeps the
    placement knobs of every new best (here the producers computed in a tile are 3x faster)."""
    from tuner import tune
    from tuner.measurers import MeasureResult, Measurer
    from tuner.spaces.loop_knobs import PLACEMENT_KNOBS

    class Device(Measurer):
        def measure_one(self, task, candidate):
            c = candidate.config
            lat = (1.0 if c["read_at"] else 3.0) + 0.3 * c["order"] + 0.2 * (1 - c["vectorize"])
            return MeasureResult([lat, lat, lat], None)

        def baseline_ms(self, task):
            return 20.0

    task, _ = _task(workload("conv2d", SMALL_CONV))
    result = tune(task, 24, seed=0, batch_size=16, layout={}, measurer=Device())
    swept = [t for t in result.trials if t.extra.get("origin") == "placement"]
    assert swept, "no placement of a best configuration was measured"
    for t in swept:  # each one placement knob away from a configuration measured before it
        earlier = [u.config for u in result.trials[: t.index]]
        changed = [{k for k in u if u[k] != t.config[k]} for u in earlier]
        assert any(c and c <= set(PLACEMENT_KNOBS) for c in changed), t.config
    assert result.best.config["read_at"] != 0


@pytest.mark.tunes
def test_joint_stage_finalists_share_the_loop_stage_first_half():
    """The layouts within `margin` of the joint stage's best (at most `finalists`) take the loop stage's
    rounds in turn until half of it is spent; the best layout found takes the rest."""
    from tuner.searches.alt import ALTSearch
    from tuner.spaces.layout import LayoutSpace

    task, _ = _task(workload("conv2d", SMALL_CONV))
    budget, top_k = 60, 4

    def search(**options):
        return ALTSearch(task, LayoutSpace(task), _FakeDevice(), seed=1, batch_size=16, top_k=top_k,
                         **options).run(budget)

    trials = search(finalists=3, margin=10.0)
    joint = [t for t in trials if t.stage == "joint" and t.latency_ms is not None]
    best_joint: dict[str, float] = {}
    for t in joint:
        best_joint[t.extra["layout"]] = min(t.latency_ms, best_joint.get(t.extra["layout"], math.inf))
    finalists = sorted(best_joint, key=best_joint.get)[:3]
    assert len(finalists) == 3
    loop = [t for t in trials if t.stage == "loop"]
    shared_until = len(joint) + (budget - len(joint)) // 2
    shared = [t.extra["layout"] for t in loop if t.index < shared_until]
    assert set(shared) == set(finalists)
    counts = [shared.count(name) for name in finalists]
    assert max(counts) - min(counts) <= top_k, counts  # round by round, the least measured first
    rest = {t.extra["layout"] for t in loop if t.index >= shared_until + top_k}  # the round under way may end
    assert len(rest) == 1 and rest <= set(finalists)
    # with margin 1.0 no other layout is near enough: the whole loop stage runs in the best one
    narrow = search(margin=1.0)
    assert len({t.extra["layout"] for t in narrow if t.stage == "loop"}) == 1


def test_unknown_search_is_refused():
    from tuner import make_search

    with pytest.raises(ValueError, match="unknown search"):
        make_search("nope", None, None, None)  # type: ignore[arg-type]


@pytest.mark.slow
def test_interface_program_is_correct_for_every_write_at():
    """The artifact's program (user data and output) must match torch whatever loop config won in the tuned layout."""
    import tvm

    from tuner import Task
    from tuner.spaces.layout import apply_layout_config, join_config, layout_program
    from tuner.spaces import LoopSpace

    wl = workload("dilated_conv2d", dict(batch=1, in_channels=16, height=28, width=28, out_channels=16, kernel=3,
                                         padding=2, dilation=2))
    xs = wl.random_inputs(0)
    choice = {"ht": 7, "it": 16, "kit": 16, "kot": 16, "ot": 16, "wt": 14}
    space = LoopSpace(layout_program(wl, choice).prim_func)
    task = Task("d", wl.key, wl.prim_func, host(), workload=wl)
    interface = layout_program(wl, choice, keep_interface=True)
    rng = np.random.default_rng(0)
    configs = [c for c in space.sample(rng, 40) if c["write_at"] and c["parallel"] == 2][:3]
    for config in configs:
        lib = tvm.compile(apply_layout_config(task, join_config(choice, config)), host()).jit()
        args = [tvm.runtime.tensor(a) for a in interface.pack_inputs(xs)]
        args.append(tvm.runtime.tensor(np.zeros(wl.output.shape, "float32")))
        lib["main"](*args)
        np.testing.assert_allclose(args[-1].numpy(), wl.reference(xs), rtol=1e-4, atol=1e-4)


def test_output_conversion_iterates_over_the_tiles_and_may_sit_inside_one():
    """The conversion of a tiled output back to the user's layout is re-indexed to iterate over the tiles
    (reading each element where the main block wrote it, the user's innermost dimension innermost), so it
    may be placed inside a tile; a layout that pads cannot be, and stays at the root. Every placement
    computes the reference."""
    from tvm import s_tir, sym, tirx

    from tuner.spaces.layout import interface_space, join_config, layout_program

    wl = workload("conv2d", SMALL_CONV, "bias_relu")
    task, xs = _task(wl)
    choice = {"ot": 8, "kot": 8, "wt": 4}
    prog = layout_program(wl, choice, keep_interface=True)
    space = interface_space(prog)
    assert space.knobs[[k.name for k in space.knobs].index("write_at")].choices == (0, 1, 2)
    sch = s_tir.Schedule(space.mod)
    convert = sch.get(sch.get_sblock(space.structure.epilogue))
    produced = {sch.get(sch.get_sblock(name)).writes[0].source.name
                for name in (space.structure.main, *space.structure.epilogue_inline)}  # conv, bias, relu
    iters = [iv.var for iv in convert.iter_vars]
    # iterates over the tiled output (N H W/4 O/8 4 8): reads it at its own coordinates, the 4 (W) last
    (read,) = [r for r in convert.reads if r.source.name in produced]
    assert [int(iv.dom.extent) for iv in convert.iter_vars] == [1, 12, 3, 2, 8, 4]
    analyzer = sym.Analyzer()
    for iv in convert.iter_vars:
        analyzer.bind(iv.var, iv.dom)
    index = [analyzer.simplify(r.min) for r in read.region]
    assert isinstance(index[0], tirx.IntImm) and all(isinstance(i, tirx.Var) for i in index[1:]), index  # N = 1
    assert [iters.index(i) for i in index[1:]] == [1, 2, 3, 5, 4], index
    rng = np.random.default_rng(1)
    configs = {c["write_at"]: c for c in space.sample(rng, 60) if c["parallel"] <= max(c["write_at"], 1)}
    assert set(configs) == {0, 1, 2}
    for config in configs.values():
        _check_artifact_program(task, wl, xs, join_config(choice, config))

    padded = {"ot": 5, "kot": 5, "wt": 5}  # 16 channels and 12 columns in tiles of 5: the tiled output pads
    space = interface_space(layout_program(wl, padded, keep_interface=True))
    assert space.knobs[[k.name for k in space.knobs].index("write_at")].choices == (0,)
    _check_artifact_program(task, wl, xs, join_config(padded, space.sample(rng, 1)[0]))


@pytest.mark.parametrize("kernel,read_at", [(1, 0), (3, 0), (3, 1)])
def test_the_transpose_knob_turns_the_layouts_conversions_into_register_transposes(kernel, read_at):
    """`transpose` 1: the conversions between the user's N C H W and the layout `N H W/b O/b b b` (each a copy
    whose input and output run along different loops) become register transposes on the host, and the program
    as measured and served (our pipeline, constants packed once) still computes the reference. A 3x3 conv's
    input conversion is its padding (`if_then_else`), computed at the root or in each tile (`read_at`): its
    tiles inside the border are transposes too."""
    import tvm

    from compiler.build import build
    from compiler.passes.tensorize import tensorize_module
    from compiler.target import resolve_target, vector_unit
    from tuner import apply_config, layout_of_config
    from tuner.spaces.layout import interface_space, join_config, layout_program

    target = resolve_target("host")
    lanes = vector_unit(target).lanes
    wl = workload("conv2d", dict(batch=1, in_channels=lanes, height=3, width=2 * lanes, out_channels=2 * lanes,
                                 kernel=kernel, padding=kernel // 2), "relu")
    task, xs = _task(wl)
    choice = {"ot": lanes, "kot": lanes, "it": lanes, "kit": lanes, "wt": lanes}
    space = interface_space(layout_program(wl, choice, keep_interface=True))
    blocked = space.blocked_config()
    assert blocked["transpose"] == 1 and space.validate({k: v for k, v in blocked.items() if k != "transpose"})[
        "transpose"] == 0  # a configuration stored before the knob: as it was
    for transpose in (0, 1):
        config = join_config(choice, {**blocked, "transpose": transpose, "write_at": 0, "inline": 0,
                                      "read_at": read_at})
        mod = apply_config(task, config)
        used = tensorize_module(mod, target)[1].get("main")
        transposes = [u for u in (used.used if used else []) if u.startswith("transpose")]
        assert len(transposes) >= 2 * transpose and (transposes == []) == (transpose == 0), used  # input and output
        lib = build(mod, target)
        prog = layout_of_config(task, config)
        packed = [tvm.runtime.tensor(np.zeros(s.shape, "float32")) for s in prog.args[:-1] if s.name != "data"]
        lib["pack_constants"](tvm.runtime.tensor(xs[1]), *packed)
        out = tvm.runtime.tensor(np.zeros(wl.output.shape, "float32"))
        lib["main"](tvm.runtime.tensor(xs[0]), *packed, out)
        np.testing.assert_allclose(out.numpy(), wl.reference(xs), rtol=1e-4, atol=1e-4)


@pytest.mark.tunes
def test_two_level_layout_search_gives_correct_programs():
    """`layout_levels=2`: the layout actor also picks second-level output tiles; every such configuration
    resolves on its own (resume, the artifact) and computes the reference."""
    from tuner import layout_of_config, tune

    wl = workload("conv2d", SMALL_CONV, "bias_relu")
    task, xs = _task(wl)
    result = tune(task, 40, seed=0, batch_size=16, top_k=4, layout_levels=2, measurer=_FakeDevice(), joint_fraction=0.7)
    outer = [t for t in result.trials if any(k.endswith("t2") and v > 1 for k, v in t.config.items()
                                             if k.startswith("layout."))]
    assert outer, [t.config for t in result.trials if "layout.ot" in t.config]
    trial = outer[-1]
    prog = layout_of_config(task, trial.config)
    assert len(prog.requested["output"].new_shape) > len(layout_of_config(
        task, {k: (1 if k.endswith("t2") else v) for k, v in trial.config.items()}).requested["output"].new_shape)
    _check_artifact_program(task, wl, xs, trial.config)


def test_layout_space_is_a_search_space_over_layouts_and_their_loops():
    """ALT's joint space works through `SearchSpace`: every sample validates, applies and has neighbours in
    other layouts; the user's own layouts are the untuned configuration."""
    from tuner import InvalidConfig, SearchSpace
    from tuner.spaces.layout import LAYOUT_PREFIX, LayoutSpace, has_layout, split_config

    task, _ = _task(workload("conv2d", SMALL_CONV))
    space = LayoutSpace(task)
    assert isinstance(space, SearchSpace) and space.knobs
    assert all(k.name.startswith(LAYOUT_PREFIX) for k in space.knobs)
    untuned = space.untuned_config()
    assert not has_layout(untuned) and space.validate(untuned) == untuned
    samples = space.sample(np.random.default_rng(0), 6)
    assert len(samples) == 6 and all(has_layout(c) for c in samples)
    for config in samples:
        assert space.validate(config) == config
        assert space.apply(config).mod["main"] is not None
        layouts = {space.key(split_config(n)[0]) for n in space.neighbors(config)}
        assert space.key(split_config(config)[0]) in layouts and len(layouts) > 1
    bad = dict(samples[0]) | {space.knobs[0].name: 3 * max(space.knobs[0].choices) + 1}
    with pytest.raises(InvalidConfig):
        space.validate(bad)


def test_the_agents_learn_from_measurements_and_rewards_rank_the_layouts():
    """Layout rewards are log speedups over the layouts tried (both signs, ordered by latency, not all ~1 as
    U - latency with U the untuned latency gave); the loop actors are rewarded once per measured walk."""
    from tuner.searches.alt import ALTSearch
    from tuner.spaces.layout import LayoutSpace

    task, _ = _task(workload("conv2d", SMALL_CONV))
    search = ALTSearch(task, LayoutSpace(task), _FakeDevice(), seed=2, batch_size=16, top_k=4)
    trials = search.run(40)
    points = [p for p in search.points.values() if p.best_ms is not None]
    assert len(points) >= 3
    rewards = {id(p): search.layout_reward(p) for p in points}
    ranked = sorted(points, key=lambda p: p.best_ms)
    assert [rewards[id(p)] for p in ranked] == sorted(rewards.values(), reverse=True)
    assert min(rewards.values()) < 0 < max(rewards.values())
    walks = [t for t in trials if t.extra.get("origin") == "walk"]
    actors = [p.actor for p in search.points.values() if p.actor is not None]
    assert walks and sum(a.seen for a in actors) == len(walks)
    assert search.layout_actor.seen > 0


def test_without_ppo_layouts_and_walks_are_random_and_no_agent_learns():
    from tuner.searches.alt import ALTSearch
    from tuner.spaces.layout import LayoutSpace

    task, _ = _task(workload("conv2d", SMALL_CONV))
    search = ALTSearch(task, LayoutSpace(task), _FakeDevice(), seed=2, batch_size=16, top_k=4, ppo=False)
    trials = search.run(24)
    assert len(trials) == 24 and any(t.extra.get("origin") == "walk" for t in trials)
    assert search.layout_actor.seen == 0
    assert all(p.actor is None or p.actor.seen == 0 for p in search.points.values())



def test_without_seeds_no_known_nest_is_measured_and_the_layouts_do_not_start_from_onednns():
    from tuner.searches.alt import ALTSearch
    from tuner.searches.alt_seeds import first_layout
    from tuner.spaces.layout import LayoutSpace

    task, _ = _task(workload("conv2d", SMALL_CONV))
    seeded = ALTSearch(task, LayoutSpace(task), _FakeDevice(), seed=2, batch_size=16, top_k=4)
    seeded_trials = seeded.run(24)
    assert {"untuned", "blocked"} <= {t.extra.get("origin") for t in seeded_trials}
    search = ALTSearch(task, LayoutSpace(task), _FakeDevice(), seed=2, batch_size=16, top_k=4, seeds=False)
    trials = search.run(24)
    assert len(trials) == 24
    assert not {"untuned", "blocked"} & {t.extra.get("origin") for t in trials}
    # the joint stage goes from the user's layout to channels last and the agent's, never to oneDNN's start
    start = search.key(search.full_choice(first_layout(search.template, search.space.unit)))
    assert start in seeded.order[:2] and start not in search.order[:2], (seeded.order, search.order)


DOT_CASES = [
    # channels that neither the lanes (16, 8) nor the groups (4, 2) divide: the layouts' zero padding (COM)
    ("conv2d", dict(batch=1, in_channels=15, height=9, width=9, out_channels=20, kernel=3, padding=1), "bias_relu"),
    ("dense", dict(m=13, n=20, k=30), "bias"),
    ("batch_matmul", dict(batch=2, m=7, n=20, k=15), "none"),
    ("dense", dict(m=5, n=16, k=260), "none"),  # more chunks (130 pairs) than an inner tile takes: the seed splits
]


@pytest.mark.parametrize("dtype", ["int8", "bfloat16"])
@pytest.mark.parametrize("target_name", ["host", "haswell"])
@pytest.mark.parametrize("operator,params,epilogue", DOT_CASES, ids=[f"{c[0]}_k{c[1].get('k', 0)}" for c in DOT_CASES])
def test_int8_and_bf16_operators_take_the_dot_product_form(operator, params, epilogue, dtype, target_name):
    """An int8 / bf16 operator's layout template is the dot-product form where the target has the instruction:
    its weight packed `O/L I/G .. L G`, the channel reduction split into whole groups, the group the block's last
    axis; the seed's loop nest is then rewritten to the target's instruction (VNNI or vpmaddwd, vdpbf16ps or the
    widened pairs: the haswell target is what an AVX2 machine gets, and this machine runs it) and computes what
    torch computes, exactly for int8."""
    _check_dot_form(operator, params, epilogue, dtype, target_name)


REQUANTIZE_CASES = [
    ("conv2d", DOT_CASES[0][1], "bias_relu_requantize"),
    ("dense", DOT_CASES[1][1], "requantize"),
    ("batch_matmul", DOT_CASES[2][1], "bias_requantize"),
]


@pytest.mark.parametrize("target_name", ["host", "haswell"])
@pytest.mark.parametrize("operator,params,epilogue", REQUANTIZE_CASES, ids=[c[0] for c in REQUANTIZE_CASES])
def test_requantizing_int8_operators_take_the_dot_product_form(operator, params, epilogue, target_name):
    """The same with the int32 sums requantized to uint8 (a scale and a zero point per output channel, read as the
    bias is): the instruction in the seed's nest, the output bit for bit."""
    _check_dot_form(operator, params, epilogue, "int8", target_name)


def _check_dot_form(operator, params, epilogue, dtype, target_name):
    import dataclasses

    import tvm

    from compiler.layout import GROUP_PARAM
    from compiler.passes.tensorize import DOT_GROUP, choose, kernels, tensorize_module
    from compiler.target import resolve_target
    from tuner.searches.alt_seeds import first_layout
    from tuner.spaces.layout import LayoutSpace, join_config
    from tuner.task import task_from_spec

    task = task_from_spec({"operator": operator, "params": params, "dtype": dtype, "epilogue": epilogue})
    target = resolve_target("host") if target_name == "host" else tvm.target.Target({"kind": "llvm",
                                                                                     "mcpu": target_name})
    task = dataclasses.replace(task, target=target)
    instruction = choose(target, *kernels.OPERANDS[dtype], exact=True)
    space = LayoutSpace(task)
    params_of = {p.name: p for p in space.template.params}
    assert params_of[GROUP_PARAM].candidates == (instruction.group,)
    lanes = params_of["nt" if operator != "conv2d" else "ot"]
    assert lanes.candidates == (instruction.lanes,)
    choice = space.full_choice(first_layout(space.template, space.unit))
    prog = space.program(choice)
    weight = prog.layouts["weight"].new_shape
    assert weight[-2:] == (instruction.lanes, instruction.group), prog.layouts["weight"].name
    loops = space.loops_of(join_config(choice, {}))
    assert loops.structure.group is not None and loops.structure.group.extent == instruction.group
    assert f'"{DOT_GROUP}": {instruction.group}' in prog.prim_func.script()
    configs = [loops.blocked_config()]
    # the register block of several output vectors (the output block's axis comes before the rows in a template's
    # form; the schedule puts it under them, where the instruction's pattern takes it)
    blocks = [a for a in loops._vector_block_axes if a.extent > 1]
    if blocks:
        configs.append(loops.blocked_config(wide=True))
        assert configs[-1][blocks[-1].knob(3)] == blocks[-1].extent, configs[-1]  # 2 here: two vectors
    from compiler.build import compile_module

    for config in configs:
        assert config["tensorize"] == 1
        mod = space.apply(join_config(choice, config)).mod
        _, reports = tensorize_module(mod, target)
        assert reports["main"].used == [instruction.name] and not reports["main"].left, reports
        lib = compile_module(mod, target).jit()
        args = [tvm.runtime.tensor(a) for a in prog.pack_inputs(task.inputs)]
        out = tvm.runtime.tensor(np.zeros(prog.args[-1].shape, prog.args[-1].dtype))
        lib["main"](*args, out)
        if dtype == "int8":
            np.testing.assert_array_equal(out.numpy(), task.expected)
        else:
            np.testing.assert_allclose(out.numpy(), task.expected, rtol=2e-2, atol=2e-2)


def test_two_level_dot_form_keeps_the_guards_past_the_operands_padding():
    """In the dot-product form the output's padded channels and rows compute zero from the operands' zero padding,
    and a conv's spatial tiles that do not divide the map (wt = 4 of 9; 2 of 5 at stride 2) read the unfolded input's
    padding, all without a guard; a second-level output tile pads past the operands' padding, so there the guard
    stays, and the program (the artifact's interface) still equals the int32 reference."""
    import tvm

    from compiler.build import compile_module
    from compiler.layout import apply_layout
    from tuner.task import task_from_spec

    cases = [("dense", {"m": 13, "n": 20, "k": 30}, {"mt": 6, "nt": 16, "kt": 4, "group": 4}, {"mt2": 2, "nt2": 2}),
             ("conv2d", dict(batch=1, in_channels=15, height=9, width=9, out_channels=20, kernel=3, padding=1),
              {"ot": 16, "kot": 16, "it": 4, "kit": 4, "group": 4, "wt": 9}, {"ot2": 2}),
             ("conv2d", dict(batch=1, in_channels=15, height=9, width=9, out_channels=20, kernel=3, padding=1),
              {"ot": 16, "kot": 16, "it": 4, "kit": 4, "group": 4, "wt": 4, "ht": 2}, {"ot2": 2}),
             ("conv2d", dict(batch=1, in_channels=8, height=9, width=9, out_channels=16, kernel=3, padding=1, stride=2),
              {"ot": 16, "kot": 16, "it": 8, "kit": 4, "group": 4, "wt": 2, "ht": 2}, {"ot2": 2})]
    for operator, params, one, two in cases:
        task = task_from_spec({"operator": operator, "params": params, "dtype": "int8"})
        for choice, guarded in ((one, False), ({**one, **two}, True)):
            prog = apply_layout(task.workload, choice, keep_interface=True)
            assert ("if_then_else" in _main_block(prog)) == guarded, (operator, choice)
            lib = compile_module(tvm.IRModule({"main": prog.prim_func}), task.target).jit()
            args = [tvm.runtime.tensor(a) for a in prog.pack_inputs(task.inputs)]
            out = tvm.runtime.tensor(np.zeros(prog.args[-1].shape, prog.args[-1].dtype))
            lib["main"](*args, out)
            np.testing.assert_array_equal(out.numpy(), task.expected)


def _main_block(prog) -> str:
    """The TVMScript of the layout program's complex-op block."""
    script = prog.prim_func.script()
    start = script.index(f'T.sblock("{prog.compute_block}")')
    return script[start:script.index("T.sblock(", start + 1)]


@pytest.mark.parametrize("cpu", ["cascadelake", "haswell"])
def test_dot_form_layouts_come_first_and_are_seeded(cpu):
    """In the dot-product form the joint stage starts at the start layout (the user's layouts, which no instruction
    fits, come second), and both the start and the least dot layout (rows from the loops) get the seed's loop nest
    in their first round, the start also with several output vectors; in the plain form only the start does. The
    group, the lanes and the register block come from the task's target (AVX-512 VNNI: groups of 4, 16 lanes;
    AVX2: `vpmaddwd`'s pairs, 8 lanes), not from this machine."""
    import dataclasses

    import tvm

    from compiler.passes.tensorize import choose, kernels
    from tuner import ALTSearch
    from tuner.spaces.layout import LayoutSpace
    from tuner.task import task_from_spec

    target = tvm.target.Target({"kind": "llvm", "mcpu": cpu})
    instruction = choose(target, *kernels.OPERANDS["int8"], exact=True)
    assert (instruction.group, instruction.lanes) == {"cascadelake": (4, 16), "haswell": (2, 8)}[cpu]
    task = task_from_spec({"operator": "dense", "params": {"m": 40, "n": 32, "k": 64}, "dtype": "int8"})
    task = dataclasses.replace(task, target=target)
    search = ALTSearch(task, LayoutSpace(task), _FakeDevice(), seed=0, batch_size=16, top_k=4)
    assert search.dot_form
    start = search.next_layout()
    assert not start.identity and start.choice["mt"] > 1
    assert search.next_layout().identity  # then the user's layouts
    least = search.point({})
    assert least.choice["mt"] == 1 and least.choice["group"] == instruction.group
    one, wide = search.seed_configs(start)  # one output vector of 8 rows, and several (N = 32)
    block = f"tile.n_{instruction.lanes}.3"
    assert one[1] == wide[1] == "blocked" and one[0][block] == 1 and wide[0][block] > 1
    assert [source for _, source in search.seed_configs(least)] == ["blocked"]  # M N/L L: its block has both
    plain = task_from_spec({"operator": "dense", "params": {"m": 40, "n": 32, "k": 64}})
    search = ALTSearch(plain, LayoutSpace(plain), _FakeDevice(), seed=0, batch_size=16, top_k=4)
    assert not search.dot_form and search.next_layout().identity
    assert search.seed_configs(search.point({})) == []
