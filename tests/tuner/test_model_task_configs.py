"""Every configuration a model task's search proposes fits that task's space (issue 61: EfficientNet-B0's
squeeze-excite mean failed its job with `InvalidConfig: tile.k3.1=112 not in [1, 2, 4, 7, 8, 14, 16, 28, 56]`,
raised inside `tune` by the loop space's own seed, `blocked_config`, which took the 112-row reduction whole where
the space's inner tiles stop at 64; fixed in 078a05a).

Checked on the offending task's own program, on a dot-product conv whose kernel window is longer than the inner
tiles (the dot form's seed, `_dot_config`, took the window whole too), and on every tunable task of real models
lowered as a model job lowers them; each tuned with the simulated device (nothing is built or run).
"""

from __future__ import annotations

import importlib.util

import pytest
import tvm
from tvm import te
from tvm.script import tirx as T

from bench.corpus import export
from compiler.target import AVX512, resolve_target, vector_unit
from compiler.workloads.model.importer import translate_model
from compiler.workloads.model.legalize import conv2d_nhwc_dot
from tuner import LoopSpace, Task, make_measurer, tune
from tuner.graph_layout import tunable
from tuner.model import lower_model
from tuner.request import ModelTuneRequest
from tuner.spaces import SearchSpace, make_space, reductions

# a znver4's vector unit (AVX-512: 16 lanes, 32 registers), as the issue's machine, whatever this one is
ZNVER4 = tvm.target.Target({"kind": "llvm", "mcpu": "znver4", "num-cores": 2})


# efficientnet_b0's first squeeze-excite mean (`mean:0f417f4ca1ca9101`) as `lower_model` gives it in the blocked
# layout: 1x2x112x112x16 -> 1x2x1x1x16, a reduction over 112 x 112 after the channels
@T.prim_func(s_tir=True)
def se_mean_112(lv9: T.Buffer((T.int64(1), T.int64(2), T.int64(112), T.int64(112), T.int64(16)), "float32"),
                T_divide: T.Buffer((T.int64(1), T.int64(2), T.int64(1), T.int64(1), T.int64(16)), "float32")):
    T.func_attr({"op_pattern": 4, "tirx.noalias": True})
    lv9_red = T.sblock_alloc_buffer((T.int64(1), T.int64(2), T.int64(1), T.int64(1), T.int64(16)))
    for ax0, ax1, ax2, ax3, ax4, k2, k3 in T.grid(T.int64(1), T.int64(2), T.int64(1), T.int64(1), T.int64(16),
                                                  T.int64(112), T.int64(112)):
        with T.sblock("lv9_red"):
            v_ax0, v_ax1, v_ax2, v_ax3, v_ax4, v_k2, v_k3 = T.axis.remap("SSSSSRR", [ax0, ax1, ax2, ax3, ax4, k2, k3])
            T.reads(lv9[v_ax0, v_ax1, v_k2, v_k3, v_ax4])
            T.writes(lv9_red[v_ax0, v_ax1, v_ax2, v_ax3, v_ax4])
            with T.init():
                lv9_red[v_ax0, v_ax1, v_ax2, v_ax3, v_ax4] = T.float32(0.0)
            lv9_red[v_ax0, v_ax1, v_ax2, v_ax3, v_ax4] = (lv9_red[v_ax0, v_ax1, v_ax2, v_ax3, v_ax4]
                                                          + lv9[v_ax0, v_ax1, v_k2, v_k3, v_ax4])
    for ax0, ax1, ax2, ax3, ax4 in T.grid(T.int64(1), T.int64(2), T.int64(1), T.int64(1), T.int64(16)):
        with T.sblock("T_divide"):
            v_ax0, v_ax1, v_ax2, v_ax3, v_ax4 = T.axis.remap("SSSSS", [ax0, ax1, ax2, ax3, ax4])
            T.reads(lv9_red[v_ax0, v_ax1, v_ax2, v_ax3, v_ax4])
            T.writes(T_divide[v_ax0, v_ax1, v_ax2, v_ax3, v_ax4])
            T_divide[v_ax0, v_ax1, v_ax2, v_ax3, v_ax4] = (lv9_red[v_ax0, v_ax1, v_ax2, v_ax3, v_ax4]
                                                           / T.float32(12544.0))


def dot_conv_1x80() -> tvm.tirx.PrimFunc:
    """An int8 conv in the dot-product form (`conv2d_nhwc_dot`, 16 lanes x groups of 4) with a 1x80 kernel (a
    long 1-d filter written as a conv2d): the window's 80 taps are more than an inner reduction tile holds (64)."""
    data = te.placeholder((1, 1, 143, 8), "uint8", name="data")
    kernel = te.placeholder((1, 1, 80, 2, 16, 4), "int8", name="kernel")
    out = conv2d_nhwc_dot(data, kernel, (1, 1), (0, 0, 0, 0), (1, 1))
    return te.create_prim_func([data, kernel, out])


def tuned_configs(task: Task, budget: int, **options) -> list[dict]:
    """The configurations `tune` measures for `task` with the simulated device, in order."""
    with make_measurer("simulated") as measurer:
        result = tune(task, budget, measurer=measurer, **options)
    return [t.config for t in result.trials]


def assert_in_space(space: SearchSpace, configs: list[dict]) -> None:
    """Each configuration validates in `space` as it is (its canonical form: nothing missing, nothing clamped)."""
    for config in configs:
        assert space.validate(config) == config, config


def test_efficientnet_se_mean_seeds_and_proposals_fit_its_space():
    space = LoopSpace(se_mean_112, AVX512)
    choices = {k.name: k.choices for k in space.knobs}
    assert {a.name: a.extent for a in space.structure.reduce} == {"k2": 112, "k3": 112}
    assert max(choices["tile.k3.1"]) == 56
    seeds = space.seed_configs()
    assert [source for _, source in seeds] == ["untuned", "blocked"]
    assert_in_space(space, [c for c, _ in seeds])
    assert seeds[1][0]["tile.k3.1"] == 56  # the largest inner tile the space has, not the whole 112

    task = Task("mean", "mean:0f417f4ca1ca9101:1x2x112x112x16,1x2x1x1x16:float32", se_mean_112, ZNVER4)
    configs = tuned_configs(task, 16, batch_size=16)  # two rounds: the seeds, then mutations of the best
    assert len(configs) == 16 and all(c in configs for c, _ in seeds)
    assert_in_space(space, configs)


def test_dot_form_seed_of_a_kernel_window_longer_than_the_inner_tiles_fits_its_space():
    prim_func = dot_conv_1x80()
    space = LoopSpace(prim_func, AVX512)
    assert space.structure.group is not None
    assert max({k.name: k.choices for k in space.knobs}["tile.kw.1"]) == 40
    blocked = [space.blocked_config(), space.blocked_config(wide=True)]
    assert_in_space(space, blocked)
    assert all(c["tile.kw.1"] == 40 and c["tensorize"] == 1 for c in blocked)

    task = Task("conv2d_nhwc_dot", "conv2d_nhwc_dot:1x80", prim_func, ZNVER4)
    configs = tuned_configs(task, 8, batch_size=16)
    assert blocked[0] in configs
    assert_in_space(space, configs)


MODELS = ["efficientnet_b0", "mobilenet_v3_small", "shufflenet_v2_x0_5"]


@pytest.mark.tunes
@pytest.mark.builds_model
@pytest.mark.skipif(importlib.util.find_spec("torchvision") is None, reason="torchvision is not installed")
@pytest.mark.parametrize("name", MODELS)
def test_every_proposal_for_every_tunable_task_of_a_model_fits_the_task_space(name):
    """Each distinct tunable task of the model, lowered as a model job at the default settings lowers it (blocked
    layouts, this machine), searched as `tune_model` searches it (`tune`: the space and search it picks) for two
    rounds: the seeds, then the cost model's picks of mutations and samples."""
    request = ModelTuneRequest(target="host", budget=64, layout="blocked")
    model = lower_model(translate_model(export(name)), request)
    target = resolve_target(request.target)
    tasks = {t.workload_key: t for t in model.tasks if tunable(t.prim_func)}
    assert tasks
    for key, t in tasks.items():
        task = Task(t.name, key, t.prim_func, target)
        space = make_space("fusion" if reductions(t.prim_func) > 1 else "loop", t.prim_func, None,
                           vector_unit(target))
        assert_in_space(space, [c for c, _ in space.seed_configs()])
        assert_in_space(space, tuned_configs(task, 16, batch_size=8))
