"""The fusion space: basteln's knobs over a subgraph, applied and checked against torch (a whole job through a
worker: tests/service/test_subgraph_jobs.py)."""

from __future__ import annotations

import numpy as np
import pytest

tvm = pytest.importorskip("tvm")

from compiler.target import AVX2  # noqa: E402
from tuner import InvalidConfig, task_from_spec  # noqa: E402
from tuner.spaces import FusionSpace, is_fusion_config, reductions  # noqa: E402

SEPARABLE = {"operator": "depthwise_pointwise", "params": {"channels": 8, "height": 10, "width": 10, "out_channels": 16},
             "target": "host"}


def test_knobs_are_the_output_tiles_and_the_pass_options():
    task = task_from_spec(SEPARABLE)
    space = FusionSpace(task.prim_func, AVX2)
    names = [k.name for k in space.knobs]
    assert names == ["tile.0", "tile.1", "tile.2", "tile.3", "threshold", "register", "register2", "vector", "unroll",
                     "layout", "tensorize"]
    assert dict((k.name, k.choices) for k in space.knobs)["layout"] == (0,)  # no workload: the program as it is
    assert dict((k.name, k.choices) for k in FusionSpace(task.prim_func, AVX2, workload=task.workload).knobs)[
        "layout"] == (0, 8)  # a catalog subgraph: also its operators blocked by the vector unit's lanes
    assert dict((k.name, k.choices) for k in space.knobs)["tile.1"] == (1, 2, 4, 8, 16)  # divisors of 16 channels
    assert dict((k.name, k.choices) for k in space.knobs)["vector"] == (8, 16, 32)  # AVX2's 8 lanes
    assert is_fusion_config(space.untuned_config()) and reductions(task.prim_func) == 2
    with pytest.raises(InvalidConfig, match="tile.1=3"):
        space.validate({**space.untuned_config(), "tile.1": 3})
    with pytest.raises(InvalidConfig, match="missing or unknown"):
        space.validate({"tile.0": 1})
    assert all(space.validate(c) == c for c in space.neighbors(space.untuned_config()))


def test_a_configuration_stored_before_the_layout_second_register_and_tensorize_knobs_still_applies():
    task = task_from_spec(SEPARABLE)
    space = FusionSpace(task.prim_func, AVX2, workload=task.workload)
    old = {k: v for k, v in space.untuned_config().items() if k not in ("layout", "register2", "tensorize")}
    assert space.validate(old) == space.untuned_config()


@pytest.mark.parametrize("spec", [SEPARABLE, {"operator": "conv3x3_conv1x1", "target": "host", "params": {
    "in_channels": 16, "height": 6, "width": 6, "mid_channels": 16, "out_channels": 8}}, {
    "operator": "matmul_softmax_matmul", "target": "host", "params": {"heads": 2, "seq": 16, "dim": 8}}],
    ids=lambda s: s["operator"])
@pytest.mark.slow
def test_every_sampled_configuration_computes_the_subgraph(spec):
    """Built as a job builds it (our pipeline, the tensorize pass included, for the host)."""
    from compiler.build import build
    from compiler.target import resolve_target

    task = task_from_spec(spec)
    space = FusionSpace(task.prim_func, AVX2, workload=task.workload)
    w = task.workload
    inputs = w.random_inputs(5)
    want = w.reference(inputs)
    configs = space.sample(np.random.default_rng(0), 6)
    assert {c["layout"] for c in configs} == {0, 8}, configs  # both the user's layouts and the blocked ones
    assert {c["tensorize"] for c in configs} == {0, 1}, configs
    for config in configs:
        lib = build(space.apply(config).mod, resolve_target("host"))
        out = tvm.runtime.tensor(np.zeros(w.output.shape, "float32"))
        lib["main"](*[tvm.runtime.tensor(x) for x in inputs], out)
        np.testing.assert_allclose(out.numpy(), want, rtol=1e-4, atol=1e-4, err_msg=str(config))


def test_the_first_round_measures_blocked_seeds_in_each_layout_shaped_by_the_vector_unit():
    from compiler.target import AVX512
    from tuner import make_search

    task = task_from_spec({"operator": "conv3x3_conv1x1", "target": "host", "params": {
        "in_channels": 16, "height": 12, "width": 12, "mid_channels": 16, "out_channels": 32}})
    space = FusionSpace(task.prim_func, AVX2, workload=task.workload)
    blocked, plain = space.blocked_configs()
    # every output channel, rows of 4, the last dimension whole; columns x 2 channel blocks in AVX2's 12 accumulators
    assert [blocked[f"tile.{i}"] for i in range(4)] == [1, 32, 4, 12]
    assert (blocked["layout"], blocked["register"], blocked["register2"], blocked["vector"]) == (8, 4, 2, 8)
    assert (plain["layout"], plain["register"], plain["register2"]) == (0, 4, 2)  # 4 channels x 2 vectors of a row
    assert blocked["tensorize"] == plain["tensorize"] == 1  # the register blocks on the target's micro-kernel
    assert FusionSpace(task.prim_func, AVX512, workload=task.workload).blocked_configs()[0]["register"] == 8
    search = make_search("xgb", task, space, None, seed=0)
    assert [(c["layout"], source) for c, source in search.seed_configs()] == [(0, "untuned"), (8, "blocked"),
                                                                             (0, "blocked")]
