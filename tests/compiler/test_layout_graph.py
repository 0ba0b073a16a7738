"""Layouts applied to operators and small graphs: every catalog operator vs torch, propagation, conversions."""

from __future__ import annotations

import numpy as np
import pytest

from compiler.layout import (
    CONVERT_PREFIX,
    Graph,
    Layout,
    LayoutError,
    apply_layout,
    layout_template,
    propagate,
    rewrite,
)
from compiler.workloads import make_workload

CASES = [
    ("conv2d", dict(batch=1, in_channels=4, height=14, width=14, out_channels=8, kernel=3, padding=1), "bias_relu",
     {"ot": 4, "ht": 7, "wt": 2, "it": 2, "kot": 4, "kit": 2}),
    ("conv2d", dict(batch=1, in_channels=3, height=20, width=20, out_channels=8, kernel=7, stride=2, padding=3),
     "bias_relu", {"ot": 4, "ht": 5, "wt": 5, "kot": 8}),
    ("depthwise_conv2d", dict(batch=1, channels=8, height=12, width=12, kernel=3, stride=2, padding=1), "none",
     {"ot": 4, "ht": 3, "wt": 2, "it": 4, "kot": 4}),
    ("group_conv2d", dict(batch=1, in_channels=8, height=10, width=10, out_channels=8, kernel=3, padding=1, groups=2),
     "bias", {"ot": 4, "ht": 5, "wt": 2, "it": 2, "kot": 2, "kit": 2}),
    ("dilated_conv2d", dict(batch=1, in_channels=4, height=12, width=12, out_channels=8, kernel=3, padding=2), "relu",
     {"ot": 8, "ht": 4, "wt": 3, "it": 2, "kot": 4, "kit": 4}),
    ("conv1d", dict(batch=2, in_channels=4, width=20, out_channels=6, kernel=3, stride=2, padding=1), "none",
     {"ot": 3, "wt": 5, "it": 2, "kot": 2}),
    ("conv3d", dict(batch=1, in_channels=2, depth=6, height=6, width=6, out_channels=4, kernel=3, padding=1), "none",
     {"ot": 2, "dt": 3, "ht": 2, "wt": 3, "it": 2, "kot": 2}),
    ("conv2d_transpose", dict(batch=1, in_channels=4, height=5, width=5, out_channels=6, kernel=4, stride=2, padding=1),
     "none", {"ot": 3, "ht": 2, "wt": 5, "it": 2, "kot": 2, "kit": 2}),
    ("dense", dict(m=12, n=16, k=20), "bias_relu", {"mt": 4, "nt": 8, "kt": 5}),
    ("batch_matmul", dict(batch=2, m=6, n=8, k=10), "none", {"mt": 3, "nt": 4, "kt": 5}),
]


def _ids() -> list[str]:
    return [f"{op}-{ep}-{'-'.join(f'{k}{v}' for k, v in ch.items())}" for op, _, ep, ch in CASES]


@pytest.mark.parametrize(("operator", "params", "epilogue", "choice"), CASES, ids=_ids())
def test_template_layouts_match_torch(operator, params, epilogue, choice):
    wl = make_workload(operator, params, epilogue=epilogue)
    prog = apply_layout(wl, choice)
    xs = wl.random_inputs(seed=3)
    np.testing.assert_allclose(prog.run(xs), wl.reference(xs), rtol=1e-4, atol=1e-4)
    assert prog.conversions == (), prog.conversions
    # the tuner's view: packed inputs and expected output in the stored layouts
    assert [a.shape for a in prog.pack_inputs(xs)] == [s.shape for s in prog.args[:-1]]
    assert prog.pack_output(wl.reference(xs)).shape == prog.args[-1].shape


@pytest.mark.parametrize(("operator", "params", "epilogue", "choice"), [CASES[0], CASES[8]], ids=["conv2d", "dense"])
def test_keep_interface_takes_and_returns_user_layouts(operator, params, epilogue, choice):
    wl = make_workload(operator, params, epilogue=epilogue)
    prog = apply_layout(wl, choice, keep_interface=True)
    assert prog.args[0].shape == wl.inputs[0].shape and prog.args[-1].shape == wl.output.shape, prog.args
    xs = wl.random_inputs(seed=4)
    np.testing.assert_allclose(prog.run(xs), wl.reference(xs), rtol=1e-4, atol=1e-4)
    assert any(c.endswith("_out") for c in prog.conversions), prog.conversions
    manifest = prog.manifest()
    assert manifest["keep_interface"] and "pack_constants" in manifest["usage"]


def test_pack_func_matches_numpy_packing():
    import tvm

    wl = make_workload(CASES[0][0], CASES[0][1], epilogue=CASES[0][2])
    prog = apply_layout(wl, CASES[0][3])
    lib = tvm.compile(tvm.IRModule({"pack_constants": prog.pack_func}), "llvm")
    _, weight, bias = wl.random_inputs(seed=5)
    outs = [tvm.runtime.tensor(np.zeros(prog.layouts[n].new_shape, "float32")) for n in ("weight", "bias")]
    lib["pack_constants"](tvm.runtime.tensor(weight), tvm.runtime.tensor(bias), *outs)
    want = prog.pack_constants({"weight": weight, "bias": bias})
    np.testing.assert_array_equal(outs[0].numpy(), want["weight"])
    np.testing.assert_array_equal(outs[1].numpy(), want["bias"])


def test_template_space_and_the_paper_name():
    """The case-study layer: h_t=4, w_t=16, o_t=16 reads as N H/4 W/16 O/16 4 16 16."""
    wl = make_workload("conv2d", dict(batch=1, in_channels=3, height=224, width=224, out_channels=64, kernel=7,
                                      stride=2, padding=3), epilogue="bias_relu")
    template = layout_template(wl)
    assert [p.name for p in template.params] == ["ot", "ht", "wt", "it", "kot", "kit"]
    assert template.params[0].candidates == (1, 2, 4, 8, 16, 32, 64)
    layouts = template.layouts({"ot": 16, "ht": 4, "wt": 16, "kot": 16})
    assert layouts["output"].name == "N H/4 W/16 O/16 4 16 16"
    # unfold follows the output tile: B = 2*(4-1) + 7 = 13 rows, stride 2*4 = 8
    assert layouts["pad_temp"].name == "N H/8 W/32 I [13] [37]", layouts["pad_temp"].name
    assert layouts["weight"].name == "O/16 I KH KW 16"
    with pytest.raises(LayoutError, match="unknown template parameters"):
        template.layouts({"xt": 2})


def _blocks(func):
    from tvm import s_tir

    sch = s_tir.Schedule(func)
    return sch, {sch.get(b).name_hint: sch.get(b) for b in sch.get_child_blocks(sch.get_sblock("root"))}


def test_pad_conv_bias_relu_propagates_without_conversion():
    """Fig. 5(b) and 7: the pad writes the conv's input layout, bias and relu share the conv's loops."""
    wl = make_workload("conv2d", dict(batch=1, in_channels=3, height=16, width=16, out_channels=16, kernel=3,
                                      stride=1, padding=1), epilogue="bias_relu")
    prog = apply_layout(wl, {"ot": 8, "ht": 4, "wt": 8, "kot": 8})
    _, blocks = _blocks(prog.prim_func)
    assert set(blocks) == {"pad_temp", "conv2d_nchw", "bias_add", "relu"}, sorted(blocks)
    assert not any(n.startswith(CONVERT_PREFIX) for n in blocks)
    conv, bias, relu = blocks["conv2d_nchw"], blocks["bias_add"], blocks["relu"]
    spatial = [int(iv.dom.extent) for iv in conv.iter_vars if iv.iter_type == 0]
    assert spatial == [int(iv.dom.extent) for iv in bias.iter_vars] == [int(iv.dom.extent) for iv in relu.iter_vars]
    assert spatial == [1, 4, 2, 2, 4, 8, 8], spatial  # N H/4 W/8 O/8 4 8 8
    # bias_add reads the conv's buffer at exactly its own iterators: a 1:1 element-wise access
    read = next(r for r in bias.reads if r.source.name == "conv2d_nchw")
    assert [str(rg.min) for rg in read.region] == [str(iv.var) for iv in bias.iter_vars]
    assert prog.layouts["output"].name == "N H/4 W/8 O/8 4 8 8"
    xs = wl.random_inputs(seed=6)
    np.testing.assert_allclose(prog.run(xs), wl.reference(xs), rtol=1e-4, atol=1e-4)
    assert any("bias_add" in n and "propagated" in n for n in prog.notes), prog.notes


def test_advanced_primitives_are_not_propagated():
    """Constraint 2: an output layout with a pad is the conv's own; relu keeps its layout and remaps."""
    wl = make_workload("conv2d", dict(batch=1, in_channels=2, height=6, width=6, out_channels=4, kernel=3),
                       epilogue="relu")
    out = Layout(wl.output.shape, "N O H W").pad(1, 0, 4)
    prog = apply_layout(wl, {"output": out})
    assert prog.layouts["output"].is_identity
    xs = wl.random_inputs(seed=7)
    np.testing.assert_allclose(prog.run(xs), wl.reference(xs), rtol=1e-4, atol=1e-4)


def test_store_at_bias_beside_the_weight_rows():
    """Sec. 4.1.2: the dense bias stored as an extra column of the weight; bias is no longer an argument."""
    wl = make_workload("dense", dict(m=8, n=12, k=16), epilogue="bias")
    weight = Layout((12, 16), "N K").store_at("bias", 1).split(0, 4).reorder(0, 2, 1)
    prog = apply_layout(wl, {"weight": weight})
    assert [a.name for a in prog.args] == ["data", "weight", "output"], prog.args
    assert prog.args[1].shape == (3, 17, 4)
    assert prog.guests == {"bias": "weight"}
    xs = wl.random_inputs(seed=8)
    np.testing.assert_allclose(prog.run(xs), wl.reference(xs), rtol=1e-4, atol=1e-4)


def _two_convs(direct: bool):
    """x -> conv1 -> [pad ->] conv2, 1x1 then 3x3 convolutions written directly in TE."""
    from tvm import te, topi

    x = te.placeholder((1, 4, 8, 8), name="data")
    w1 = te.placeholder((8, 4, 1, 1), name="w1")
    w2 = te.placeholder((8, 8, 3, 3), name="w2")
    rc = te.reduce_axis((0, 4), name="rc")
    c1 = te.compute((1, 8, 8, 8), lambda n, o, h, w: te.sum(x[n, rc, h, w] * w1[o, rc, 0, 0], axis=rc), name="conv1")
    if direct:
        rc2, ry, rx = te.reduce_axis((0, 8), "rc2"), te.reduce_axis((0, 3), "ry"), te.reduce_axis((0, 3), "rx")
        c2 = te.compute((1, 8, 6, 6), lambda n, o, h, w: te.sum(
            c1[n, rc2, h + ry, w + rx] * w2[o, rc2, ry, rx], axis=[rc2, ry, rx]), name="conv2")
    else:
        c2 = topi.nn.conv2d_nchw(c1, w2, 1, 1, 1)
    return Graph([x, w1, w2], [c2])


def _run_graph(func, arrays, out_shape):
    import tvm

    lib = tvm.compile(tvm.IRModule({"main": func}), "llvm")
    out = tvm.runtime.tensor(np.zeros(out_shape, "float32"))
    lib["main"](*[tvm.runtime.tensor(a) for a in arrays], out)
    return out.numpy()


@pytest.mark.parametrize("direct", [True, False], ids=["conv-conv", "conv-pad-conv"])
def test_two_convs_get_a_conversion_unless_a_pad_is_between(direct: bool):
    """Constraint 3: each conv keeps its layout; conv1 -> conv2 reads through a conversion, a pad absorbs it."""
    import torch

    graph = _two_convs(direct)
    conv2 = [op for op in graph.ops if graph.is_complex(op)][-1]
    reads = {t.op.name: t for t in conv2.input_tensors}
    middle = "conv1" if direct else "pad_temp"
    mid_shape = tuple(int(s) for s in reads[middle].shape)
    out_shape = tuple(int(s) for s in conv2.output(0).shape)
    requests = {
        "conv1": {"output": Layout((1, 8, 8, 8), "N O H W").split(1, 4).reorder(0, 1, 3, 4, 2)},  # N O/4 H W 4
        conv2.name: {
            "output": Layout(out_shape, "N O H W").split(1, 2).reorder(0, 3, 4, 1, 2),
            middle: Layout(mid_shape, "N I H W").reorder(0, 2, 3, 1),  # NHWI
        },
    }
    plan = propagate(graph, requests)
    rewritten = rewrite(plan)
    if direct:
        assert plan.conversion_edges == [("conv1", "conv2")], plan.conversion_edges
        assert rewritten.conversions == ("layout_convert_conv1",)
    else:
        assert plan.conversion_edges == [] and rewritten.conversions == (), plan.notes
    rng = np.random.default_rng(9)
    x, w1, w2 = (rng.uniform(-1, 1, tuple(int(s) for s in t.shape)).astype("float32") for t in graph.inputs)
    out_layout = plan.layout(graph.outputs[0].op)
    got = out_layout.unpack(_run_graph(rewritten.prim_func(), [x, w1, w2], out_layout.new_shape))
    with torch.no_grad():
        y = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w1))
        want = torch.nn.functional.conv2d(y, torch.from_numpy(w2), padding=0 if direct else 1).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_tile_too_small_for_the_window_is_refused():
    wl = make_workload("conv2d", dict(batch=1, in_channels=2, height=8, width=8, out_channels=4, kernel=3))
    bad = Layout((1, 2, 8, 8), "N I H W").unfold(2, 3, 2)  # a 3x3 window at stride 1 needs 4 rows for 2 outputs
    with pytest.raises(LayoutError, match="does not hold the whole access window"):
        apply_layout(wl, {"output": Layout((1, 4, 6, 6)).split(2, 2), "pad_temp": bad})


TWO_LEVEL = [
    ("conv2d", dict(batch=1, in_channels=4, height=12, width=12, out_channels=16, kernel=3, padding=1), "bias_relu",
     {"ot": 4, "ot2": 2, "ht": 3, "ht2": 2, "wt": 2, "wt2": 3, "it": 2, "kot": 4, "kit": 2}),
    # a second level alone, and one whose product does not divide (O = 16, 4 x 3: padded)
    ("conv2d", dict(batch=1, in_channels=4, height=8, width=8, out_channels=16, kernel=3, padding=1), "none",
     {"ot": 4, "ot2": 3, "wt2": 2}),
    ("dense", dict(m=12, n=16, k=20), "bias_relu", {"mt": 2, "mt2": 3, "nt": 4, "nt2": 2, "kt": 5}),
]


@pytest.mark.parametrize(("operator", "params", "epilogue", "choice"), TWO_LEVEL,
                         ids=["conv2d", "conv2d-partial-padded", "dense"])
def test_two_level_templates_match_torch(operator, params, epilogue, choice):
    from compiler.layout import template_levels

    wl = make_workload(operator, params, epilogue=epilogue)
    assert template_levels(choice) == 2
    template = layout_template(wl, levels=2)
    assert {"ot2", "ht2", "wt2"} <= {p.name for p in template.params} or {"mt2", "nt2"} <= {p.name for p in template.params}
    prog = apply_layout(wl, choice)
    xs = wl.random_inputs(seed=3)
    np.testing.assert_allclose(prog.run(xs), wl.reference(xs), rtol=1e-4, atol=1e-4)


def test_two_level_output_is_the_papers():
    """N H/(ht' ht) W/(wt' wt) O/(ot' ot) ht' wt' ot' ht wt ot; a one-level choice keeps the one-level names."""
    wl = make_workload("conv2d", dict(batch=1, in_channels=8, height=16, width=16, out_channels=32, kernel=3,
                                      padding=1))
    two = layout_template(wl, levels=2).layouts({"ot": 8, "ot2": 2, "ht": 2, "ht2": 4, "wt": 4, "wt2": 2})
    assert two["output"].new_shape == (1, 2, 2, 2, 4, 2, 2, 2, 4, 8), two["output"].name
    one = layout_template(wl, levels=2).layouts({"ot": 8, "ht": 2, "wt": 4})
    assert one["output"].name == layout_template(wl).layouts({"ot": 8, "ht": 2, "wt": 4})["output"].name
    with pytest.raises(LayoutError, match="one or two levels"):
        layout_template(wl, levels=3)
    with pytest.raises(LayoutError, match="unknown template parameters"):
        layout_template(wl).layouts({"ot2": 2})
