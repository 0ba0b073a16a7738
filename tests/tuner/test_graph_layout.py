"""ALT's graph level: layout groups, per-conv blocks in the import, the joint stage's search over them."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from compiler.target import resolve_target  # noqa: E402
from compiler.workloads import model as M  # noqa: E402
from compiler.workloads.model.importer import graph_blocks, lower_graph, translate_model  # noqa: E402
from compiler.workloads.model.layouts import PLAIN, conv_sites, group_blocks, layout_groups, vector_lanes  # noqa: E402
from compiler.workloads.model.tasks import conv_calls, conversions  # noqa: E402
from tuner import LocalMeasurer  # noqa: E402
from tuner.graph_layout import DEFAULT_CONFIG, GraphLayoutSearch  # noqa: E402


class Residual(torch.nn.Module):
    """conv -> relu -> conv -> (+ the relu's output) -> relu -> 1x1 conv: a residual join between the convs."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.c1 = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.c2 = torch.nn.Conv2d(16, 16, 3, padding=1)
        self.c3 = torch.nn.Conv2d(16, 8, 1)

    def forward(self, x):
        a = torch.relu(self.c1(x))
        return self.c3(torch.relu(self.c2(a) + a))


@pytest.fixture(scope="module")
def residual():
    module = Residual().eval()
    x = torch.randn(1, 3, 12, 12)
    with torch.no_grad():
        expected = module(x).numpy()
    return torch.export.export(module, (x,)), x.numpy(), expected


@pytest.fixture(scope="module")
def target():
    return resolve_target("host")


def test_groups_follow_elementwise_paths_and_blocks_apply(residual, target):
    ep, x, expected = residual
    graph = translate_model(ep)
    lanes = vector_lanes(target)
    groups = layout_groups(graph.mod, lanes)
    by_writer = {w: g for g in groups for w in g.writers}
    # c1's output, the residual add and c2's output are one group: c2 and c3 read it, c1 and c2 write it
    joined = by_writer["p_c1_weight"]
    assert set(joined.writers) == {"p_c1_weight", "p_c2_weight"}
    assert set(joined.readers) == {"p_c2_weight", "p_c3_weight"}
    assert joined.candidates == tuple(b for b in (4, 8, 16, 32) if 16 % b == 0 and b <= 2 * lanes)

    sites = conv_sites(graph.mod, lanes)
    blocks = group_blocks(groups, {joined.index: 4}, sites)
    assert blocks["p_c2_weight"] == (4, 4) and blocks["p_c3_weight"][0] == 4
    model = lower_graph(graph, layout="blocked", target=target, blocks=blocks)
    assert model.blocks["c2.weight"] == [4, 4] and model.blocks["c1.weight"] == [3, 4]
    # conversions only where the layout enters (the image) and leaves (the output): none between the convs
    assert conversions(model.mod) == 2
    calls = conv_calls(model.mod, {s.weight for s in sites})
    assert calls["p_c2_weight"].conversions == () and calls["p_c3_weight"].conversions == ()
    assert [a.shape for a in next(t for t in model.tasks if t.functions[0] == calls["p_c2_weight"].function).args][0] \
        == (1, 4, 12, 12, 4)
    out = M.run_model(M.build_model(model, target), [x], target)[0]
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)

    # the joined group plain: c1 and c2 (which write it) and c3 (which reads it) keep NCHW, the graph has no
    # conversion left (c1's input group plain too), and the model still matches torch
    plain = group_blocks(groups, {joined.index: PLAIN}, sites)
    assert plain == {"p_c1_weight": (PLAIN, PLAIN), "p_c2_weight": (PLAIN, PLAIN), "p_c3_weight": (PLAIN, PLAIN)}
    model = lower_graph(graph, layout="blocked", target=target, blocks=plain)
    assert conversions(model.mod) == 0 and not any("NCHWc" in t.name for t in model.tasks)
    assert model.blocks == {"c1.weight": [PLAIN, PLAIN], "c2.weight": [PLAIN, PLAIN], "c3.weight": [PLAIN, PLAIN]}
    np.testing.assert_allclose(M.run_model(M.build_model(model, target), [x], target)[0], expected, rtol=1e-4,
                               atol=1e-4)
    # c3's output group plain alone: c3 keeps NCHW, so one conversion before it (c1, c2 blocked), none after it
    c3_out = next(g for g in groups if "p_c3_weight" in g.writers)
    mixed = group_blocks(groups, {c3_out.index: PLAIN}, sites)
    assert mixed["p_c3_weight"] == (PLAIN, PLAIN) and PLAIN not in mixed["p_c2_weight"]
    model = lower_graph(graph, layout="blocked", target=target, blocks=mixed)
    assert conversions(model.mod) == 2
    assert len(conv_calls(model.mod, {s.weight for s in sites})["p_c3_weight"].conversions) == 1
    np.testing.assert_allclose(M.run_model(M.build_model(model, target), [x], target)[0], expected, rtol=1e-4,
                               atol=1e-4)

    # the user-facing form (torch names) is checked against each conv's candidates; [0, 0] keeps a conv in NCHW
    assert graph_blocks(graph, {"c2.weight": [8, 8]}, target) == {"p_c2_weight": (8, 8)}
    assert graph_blocks(graph, {"c2.weight": [0, 0]}, target) == {"p_c2_weight": (PLAIN, PLAIN)}
    with pytest.raises(M.ModelError, match="c2.weight.*takes an input block in"):
        graph_blocks(graph, {"c2.weight": [3, 8]}, target)
    with pytest.raises(M.ModelError, match="'nope.weight' is not the weight of a conv2d"):
        graph_blocks(graph, {"nope.weight": [8, 8]}, target)


@pytest.mark.tunes
def test_joint_stage_measures_whole_choices_and_keeps_the_best(residual, target):
    ep, x, expected = residual
    graph = translate_model(ep)
    measured = []
    measurer = LocalMeasurer(timeout_s=30)
    try:
        search = GraphLayoutSearch(graph, target, measurer, seed=0, joint_trials=2,
                                   on_measure=lambda task, trial: measured.append((task, trial)))
        result = search.run(12)
    finally:
        measurer.close()
    assert result.rounds[0]["source"] == "rule" and len(result.rounds) >= 2, result.rounds
    # round 1 keeps every group in the model's own layout: no conversion at all
    assert result.rounds[1]["source"] == "plain" and result.rounds[1]["conversions"] == 0
    assert set(result.rounds[1]["blocks"].values()) == {PLAIN}
    # every round's choice was measured whole: every task of its model has a latency
    assert result.measurements == len(measured) and result.measurements <= 12 + len(result.model.tasks)
    assert all(t.workload_key in result.costs for t in result.model.tasks)
    assert math.isclose(result.estimate_ms, sum(t.weight * result.costs[t.workload_key] for t in result.model.tasks))
    assert result.estimate_ms == min(r["estimate_ms"] for r in result.rounds) <= result.rule_ms
    # convs get a short loop search (stage "joint"), the other tasks their default schedule (stage "layout")
    stages = {trial.stage for _, trial in measured}
    assert stages == {"joint", "layout"}
    assert all(trial.config == DEFAULT_CONFIG for task, trial in measured if trial.stage == "layout")
    assert all("conv" in task.name for task, trial in measured if trial.stage == "joint")
    # the model in the chosen blocks is correct
    out = M.run_model(M.build_model(result.model, target), [x], target)[0]
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)


def test_bf16_convs_in_the_dot_product_form_keep_it_under_the_search(target):
    """bfloat16 convs whose channels fit the target's bf16 dot product take the dot-product form whatever
    blocks the graph-level search gives: they are no search sites, and a block given to a blockable conv beside
    them leaves them in `conv2d_nhwc_dot`."""
    from compiler.workloads.model.layouts import dot_instruction

    if dot_instruction(target, "bfloat16") is None:
        pytest.skip("this CPU has no bf16 dot product (no AVX2)")
    lanes = vector_lanes(target)
    module = Residual().eval().to(torch.bfloat16)
    graph = translate_model(torch.export.export(module, (torch.randn(1, 3, 12, 12).to(torch.bfloat16),)))
    every = {s.weight for s in conv_sites(graph.mod, lanes)}
    sites = {s.weight for s in conv_sites(graph.mod, lanes, target)}
    assert len(every) == 3 and {"p_c2_weight", "p_c3_weight"} <= every  # c1's weight: padded to 4 channels
    # c1 (3 -> 16, padded to pairs) and c2 (16 -> 16) fit 16 or 8 lanes; c3's 8 outputs fit only AVX2's 8
    assert sites == ({"p_c3_weight"} if dot_instruction(target, "bfloat16")[0] == 16 else set())
    blocks = {w: (4, 4) for w in every}
    model = lower_graph(graph, layout="blocked", target=target, blocks=blocks)
    dot = [t.name for t in model.tasks if "conv2d_nhwc_dot" in t.name]
    assert len(dot) == 3 - len(sites), [t.name for t in model.tasks]
