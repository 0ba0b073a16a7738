"""Model import (safe loading, fusion, task extraction), build with and without tuned tasks, the artifact."""

from __future__ import annotations

import io
import os
import pickle
import subprocess
import sys
import zipfile

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from compiler.workloads import model as M  # noqa: E402
from compiler.workloads import zoo  # noqa: E402


class Evil:
    """Unpickling this creates the marker file: the test fails if it ever exists."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """name -> path of the model's `torch.export.save` file."""
    folder = tmp_path_factory.mktemp("pt2")
    out = {}
    for name in ("small_cnn", "small_transformer"):
        out[name] = folder / f"{name}.pt2"
        torch.export.save(zoo.export(name), out[name])
    return out


@pytest.fixture(scope="module")
def imported(saved):
    return {name: M.import_model(M.load_exported_program(path)) for name, path in saved.items()}


def _reference(name):
    module, inputs = zoo.create(name)
    return [i.numpy() for i in inputs], M.torch_outputs(module, inputs)


def test_tasks_are_deduplicated_and_weighted(imported, saved):
    cnn = imported["small_cnn"]
    assert [s.shape for s in cnn.inputs] == [(1, 3, 16, 16)] and [s.shape for s in cnn.outputs] == [(1, 10)]
    assert cnn.param_names[:2] == ["conv1.weight", "conv1.bias"]
    calls = M.call_counts(cnn.mod["main"])
    assert sum(t.weight for t in cnn.tasks) == sum(calls.values())
    assert len({t.workload_key for t in cnn.tasks}) == len(cnn.tasks)
    # conv2 and conv3 (+bias, relu) are one task called twice; conv1 with its batch norm folded in is another
    conv_relu = sorted((t for t in cnn.tasks if t.name == "fused_conv2d_add_relu"), key=lambda t: t.weight)
    assert [t.weight for t in conv_relu] == [1, 2] and all(t.complex for t in conv_relu)
    assert {t.name for t in cnn.tasks if t.complex} >= {"fused_conv2d_add_relu", "fused_matmul_add"}
    assert not any(t.complex for t in cnn.tasks if t.name in ("fused_relu", "transpose"))
    # keys depend on content only: a second import gives the same ones
    again = M.import_model(M.load_exported_program(saved["small_cnn"].read_bytes()))
    assert [t.workload_key for t in again.tasks] == [t.workload_key for t in cnn.tasks]
    # the transformer block: every call_tir belongs to one task, the projections are complex tasks
    tf = imported["small_transformer"]
    assert sum(t.weight for t in tf.tasks) == sum(M.call_counts(tf.mod["main"]).values())
    assert any(t.complex and "matmul" in t.name for t in tf.tasks)


@pytest.mark.parametrize("name", ["small_cnn", "small_transformer"])
def test_untuned_build_matches_torch(imported, name, host_target):
    model = imported[name]
    inputs, expected = _reference(name)
    built = M.build_model(model, host_target)
    outs = M.run_model(built, inputs, host_target)
    assert len(outs) == len(expected)
    for out, ref in zip(outs, expected):
        np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.builds_model
def test_tuned_task_build_and_artifact(imported, host_target, tmp_path):
    from tuner import Task, apply_config, tune

    model = imported["small_cnn"]
    task = next(t for t in model.tasks if t.name == "fused_conv2d_add_relu")
    result = tune(Task(task.name, task.workload_key, task.prim_func, host_target), 2, seed=0)
    assert result.best is not None, [t.error for t in result.trials]
    scheduled = apply_config(Task(task.name, task.workload_key, task.prim_func, host_target), result.best.config)
    mod = M.apply_schedules(model, {task.workload_key: scheduled})
    for name in task.functions:
        assert not mod[name].same_as(model.mod[name])
    built = M.build_model(model, host_target, {task.workload_key: scheduled})
    inputs, expected = _reference("small_cnn")
    np.testing.assert_allclose(M.run_model(built, inputs, host_target)[0], expected[0], rtol=1e-4, atol=1e-4)

    dest = M.write_model_artifact(tmp_path / "model.tar.gz", model, built, host_target, latency_ms=1.0)
    folder = M.extract_model_artifact(dest, tmp_path / "unpacked")
    assert sorted(p.name for p in folder.iterdir()) == sorted(M.MODEL_ARTIFACT_FILES)
    np.savez(tmp_path / "in.npz", x=inputs[0])
    done = subprocess.run([sys.executable, "run.py", str(tmp_path / "in.npz"), str(tmp_path / "out.npz")],
                          cwd=folder, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "output0: shape [1, 10]" in done.stdout
    with np.load(tmp_path / "out.npz") as out:
        np.testing.assert_allclose(out["output0"], expected[0], rtol=1e-4, atol=1e-4)


@pytest.mark.builds_model
def test_task_layouts_pack_weights_at_build_time(imported, host_target):
    from tvm import s_tir

    model = imported["small_cnn"]
    task = next(t for t in model.tasks if t.name == "fused_conv2d_add_relu")
    sch = s_tir.Schedule(task.prim_func)
    conv = sch.get_sblock("conv2d_nchw")
    weight_map = lambda o, i, h, w: [o // 4, i, h, w, o % 4]  # noqa: E731 - O/4 I H W 4o
    out_map = lambda n, c, h, w: [n, c // 4, h, w, c % 4]  # noqa: E731 - N C/4 H W 4c
    sch.transform_layout(conv, ("read", 1), weight_map)
    sch.transform_layout(sch.get_sblock("compute"), ("write", 0), out_map)
    layout = M.TaskLayout(sch.mod["main"], (None, weight_map, None, out_map))
    built = M.build_model(model, host_target, layouts={task.workload_key: layout})
    # both weights of the task were packed once, at build time: (8, 8, 3, 3) -> (2, 8, 3, 3, 4)
    shapes = [p.shape for p in built.params]
    assert shapes.count((2, 8, 3, 3, 4)) == 2 and (8, 8, 3, 3) not in shapes, shapes
    inputs, expected = _reference("small_cnn")
    np.testing.assert_allclose(M.run_model(built, inputs, host_target)[0], expected[0], rtol=1e-4, atol=1e-4)
    # with a tuned schedule of the layout function too
    from tuner import Task, apply_config, tune

    ltask = Task(task.name, task.workload_key + ":packed", layout.prim_func.with_attr("global_symbol", "main"),
                 host_target)
    result = tune(ltask, 2, seed=0)
    assert result.best is not None, [t.error for t in result.trials]
    built = M.build_model(model, host_target, {task.workload_key: apply_config(ltask, result.best.config)},
                          {task.workload_key: layout})
    np.testing.assert_allclose(M.run_model(built, inputs, host_target)[0], expected[0], rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------
# Bad files


def _error(source, **kwargs) -> M.ModelError:
    with pytest.raises(M.ModelError) as info:
        M.import_model(M.load_exported_program(source, **kwargs))
    return info.value


def test_random_bytes_are_not_a_program():
    err = _error(np.random.default_rng(0).bytes(4096))
    assert err.field == "file" and "not a zip" in err.message


def test_malicious_pickles_never_run(tmp_path, saved):
    marker = tmp_path / "pwned"
    # a bare pickle, and torch.save's zip around one
    assert _error(pickle.dumps(Evil(str(marker)))).field == "file"
    buf = io.BytesIO()
    torch.save(Evil(str(marker)), buf)
    err = _error(buf.getvalue())
    assert "data.pkl" in err.message
    # a real program whose sample-input file is replaced by the malicious pickle
    err = _error(_replace_member(saved["small_cnn"], "data/sample_inputs/", buf.getvalue()))
    assert err.field == "file" and "sample_inputs" in err.message
    # a weight marked use_pickle (torch.export.load would torch.load it with weights_only=False)
    with zipfile.ZipFile(saved["small_cnn"]) as z:
        name = next(n for n in z.namelist() if n.endswith("_weights_config.json"))
        config = z.read(name).decode().replace('"use_pickle": false', '"use_pickle": true', 1)
    err = _error(_replace_member(saved["small_cnn"], name, config.encode(), exact=True))
    assert "pickled" in err.message
    # an extra member that is not part of a plain program (e.g. a compiled AOTInductor library)
    err = _error(_add_member(saved["small_cnn"], "data/aotinductor/model/model.so", b"\x7fELF"))
    assert "aotinductor" in err.message
    assert not marker.exists()


def _replace_member(path, part, data, exact=False):
    out = io.BytesIO()
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist():
            hit = info.filename == part if exact else part in info.filename
            dst.writestr(info, data if hit else src.read(info))
    return out.getvalue()


def _add_member(path, rest, data):
    out = io.BytesIO()
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist():
            dst.writestr(info, src.read(info))
        dst.writestr(src.infolist()[0].filename.split("/")[0] + "/" + rest, data)
    return out.getvalue()


def test_unsupported_operator_is_named(tmp_path):
    class Spectrum(torch.nn.Module):
        def forward(self, x):
            return torch.fft.rfft(x).abs()

    path = tmp_path / "fft.pt2"
    torch.export.save(torch.export.export(Spectrum(), (torch.randn(8),)), path)
    err = _error(path)
    assert err.field == "model" and "_fft_r2c" in err.message


def test_sizes_and_shapes_are_checked(saved):
    ep = M.load_exported_program(saved["small_cnn"])
    with pytest.raises(M.ModelError) as info:
        M.import_model(ep, input_shapes=[(1, 3, 32, 32)])
    assert info.value.field == "input_shapes" and "(1, 3, 16, 16)" in info.value.message
    with pytest.raises(M.ModelError) as info:
        M.import_model(ep, max_tensor_elements=500)
    assert info.value.field == "input_shapes" and "more than the limit 500" in info.value.message
    err = _error(saved["small_cnn"], max_bytes=1000)
    assert err.field == "file" and "limit 1000" in err.message


def test_conv_blocks():
    assert M.conv_blocks(64, 3, 16) == (16, 3)  # RGB input: one whole block
    assert M.conv_blocks(24, 144, 16) == (8, 16)
    assert M.conv_blocks(8, 8, 16) == (8, 8)
    assert M.conv_blocks(10, 6, 8) == (2, 6)  # a block divides the channels; 6 < 8 is one block
    assert M.conv_blocks(512, 256, 8) == (8, 8)


@pytest.mark.builds_model
def test_blocked_layout_is_carried_through_the_graph(saved, host_target):
    """Graph-level layouts: every conv in N C/c H W c, element-wise and pooling tasks take the blocked
    tensors as they are, weights are packed at build time, and the model still matches torch."""
    from tuner import Task, apply_config, tune

    model = M.import_model(M.load_exported_program(saved["small_cnn"]), layout="blocked", target=host_target)
    lanes = M.vector_lanes(host_target)
    o1, i1 = M.conv_blocks(8, 3, lanes)
    o2, i2 = M.conv_blocks(8, 8, lanes)
    convs = {t.args[0].shape: t for t in model.tasks if "conv2d_NCHWc" in t.name}
    assert set(convs) == {(1, 3 // i1, 16, 16, i1), (1, 8 // i2, 16, 16, i2)}, [t.args for t in model.tasks]
    assert convs[(1, 8 // i2, 16, 16, i2)].weight == 2
    assert convs[(1, 8 // i2, 16, 16, i2)].args[1].shape == (8 // o2, 8 // i2, 3, 3, i2, o2)
    # a conversion runs only where the layout enters (the image); where it leaves (the pooled 1x1 image before the
    # flatten) the channels are in the same order in both layouts: a reshape, no kernel (`keeps_order`);
    # the relu between the convs and the pooling take the blocked tensor
    transforms = [t for t in model.tasks if "layout_transform" in t.name]
    assert sum(t.weight for t in transforms) == 1 and transforms[0].args[0].shape == (1, 3, 16, 16), \
        [(t.name, t.args) for t in transforms]
    for t in model.tasks:
        if t.name.startswith(("fused_relu", "adaptive_avg_pool", "mean")):
            assert len(t.args[0].shape) == 5, (t.name, t.args)

    inputs, expected = _reference("small_cnn")
    built = M.build_model(model, host_target)
    assert (8 // o2, 8 // i2, 3, 3, i2, o2) in [p.shape for p in built.params]  # packed once, at build time
    np.testing.assert_allclose(M.run_model(built, inputs, host_target)[0], expected[0], rtol=1e-4, atol=1e-4)

    # and with a tuned schedule of a blocked conv task
    conv = convs[(1, 8 // i2, 16, 16, i2)]
    task = Task(conv.name, conv.workload_key, conv.prim_func, host_target)
    result = tune(task, 3, seed=0)
    assert result.best is not None, [t.error for t in result.trials]
    built = M.build_model(model, host_target, {conv.workload_key: apply_config(task, result.best.config)})
    np.testing.assert_allclose(M.run_model(built, inputs, host_target)[0], expected[0], rtol=1e-4, atol=1e-4)


def test_unknown_layout_is_refused(saved):
    with pytest.raises(M.ModelError, match="unknown layout 'NHWC'"):
        M.import_model(M.load_exported_program(saved["small_cnn"]), layout="NHWC")


def test_blocked_layout_through_relu6_and_depthwise(host_target):
    """MobileNet's pattern: ReLU6 (clip, which ConvertLayout cannot carry, rewritten to max/min) and a
    depthwise conv stay blocked; a grouped (not depthwise) conv keeps NCHW with conversions around it."""
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.expand = nn.Conv2d(8, 32, 1)
            self.dw = nn.Conv2d(32, 32, 3, 2, 1, groups=32)
            self.project = nn.Conv2d(32, 8, 1)
            self.grouped = nn.Conv2d(8, 8, 3, 1, 1, groups=2)

        def forward(self, x):
            y = nn.functional.relu6(self.dw(nn.functional.relu6(self.expand(x))))
            return self.grouped(self.project(y))

    torch.manual_seed(0)
    module, x = Block().eval(), torch.randn(1, 8, 12, 12)
    model = M.import_model(torch.export.export(module, (x,)), layout="blocked", target=host_target)
    names = {t.name: t for t in model.tasks}
    assert any(n.startswith("fused_depthwise_conv2d_NCHWc") and n.endswith("maximum_minimum") for n in names), names
    assert "fused_conv2d_add" in names and len(names["fused_conv2d_add"].args[0].shape) == 4  # the grouped conv
    transforms = [t for t in model.tasks if "layout_transform" in t.name]
    # in (image), around nothing else but the grouped conv's input
    assert sum(t.weight for t in transforms) == 2, [(t.name, t.args) for t in transforms]
    built = M.build_model(model, host_target)
    with torch.no_grad():
        expected = module(x).numpy()
    np.testing.assert_allclose(M.run_model(built, [x.numpy()], host_target)[0], expected, rtol=1e-4, atol=1e-4)


def test_blocked_layout_is_carried_through_concat_resize_and_transposed_conv(host_target):
    """A U-Net's joins: a concat's inputs and output are one layout group with one block; a concat of a blocked and
    a plain tensor (the transposed conv's, which keeps NCHW) and a nearest resize are done in the block
    (`carry_layouts`: ConvertLayout would put both in NCHW), so the conversions left are the image's, the output's
    and the two around the transposed conv."""
    from torch import nn

    from compiler.workloads.model.importer import translate_model
    from compiler.workloads.model.layouts import layout_groups
    from compiler.workloads.model.tasks import conversions

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Conv2d(3, 8, 3, 1, 1), nn.Conv2d(8, 16, 3, 2, 1)
            self.up = nn.ConvTranspose2d(16, 8, 2, 2)
            self.c, self.d, self.e = nn.Conv2d(16, 8, 1), nn.Conv2d(8, 8, 3, 1, 1), nn.Conv2d(16, 4, 1)

        def forward(self, x):
            s = torch.relu(self.a(x))
            z = torch.relu(self.c(torch.cat([self.up(torch.relu(self.b(s))), s], 1)))
            w = torch.relu(self.d(nn.functional.max_pool2d(z, 2)))
            return self.e(torch.cat([nn.functional.interpolate(w, scale_factor=2), z], 1))

    torch.manual_seed(0)
    module, x = Net().eval(), torch.randn(1, 3, 16, 16)
    ep = torch.export.export(module, (x,))
    lanes = M.vector_lanes(host_target)
    groups = layout_groups(translate_model(ep).mod, lanes, host_target)
    joined = next(g for g in groups if "p_c_weight" in g.readers)
    assert set(joined.writers) == {"p_a_weight"} and set(joined.readers) == {"p_b_weight", "p_c_weight"}
    assert joined.channels == (8, 16) and joined.default == M.conv_blocks(8, 8, lanes)[0] == 8

    model = M.import_model(ep, layout="blocked", target=host_target)
    assert model.notes == [] and model.blocks["b.weight"][1] == M.conv_blocks(16, 16, lanes)[0], model.blocks
    assert model.blocks["c.weight"][0] == model.blocks["e.weight"][0] == 8
    assert conversions(model.mod) == 4, [t.name for t in model.tasks]
    joins = [t for t in model.tasks if "concatenate" in t.name or "resize2d" in t.name]
    assert len(joins) >= 2 and all(len(t.args[0].shape) == 5 for t in joins), [(t.name, t.args) for t in joins]
    assert any("conv2d_transpose" in t.name and len(t.args[0].shape) == 4 for t in model.tasks)
    with torch.no_grad():
        expected = module(x).numpy()
    out = M.run_model(M.build_model(model, host_target), [x.numpy()], host_target)[0]
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)

    # the last conv reading the second concat in block 16 (its inputs have 8 channels): the concat is still done
    # in block 8, then one conversion from block 8 to block 16
    model = M.import_model(ep, layout="blocked", target=host_target, blocks={"c.weight": [8, 8], "e.weight": [16, 4]})
    assert model.notes == [] and conversions(model.mod) == 5, [t.name for t in model.tasks]
    out = M.run_model(M.build_model(model, host_target), [x.numpy()], host_target)[0]
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)


def test_a_conversion_that_moves_nothing_is_a_reshape(host_target):
    """`keeps_order`: the channels of a 1x1 image, or of a tensor with no image left, are in the same order in or
    out of their block, so that conversion is a reshape (a view, no kernel); over a larger image, or with padding to
    a whole block, the elements move. In a model: the pooled output leaves its block as a reshape, the conv's own
    output (a 6x6 image) through a conversion, and both match torch."""
    from torch import nn
    from tvm import relax

    from compiler.workloads.model.carry import keeps_order
    from compiler.workloads.model.tasks import conversions

    bb = relax.BlockBuilder()

    def conversion(shape, index_map, pad_value=None):
        x = relax.Var("x", relax.TensorType(shape, "float32"))
        return bb.normalize(relax.op.layout_transform(x, index_map=index_map, pad_value=pad_value))

    def unblock(b):
        return lambda n, c, h, w, i: (n, c * b + i, h, w)

    assert keeps_order(conversion((1, 2, 1, 1, 8), unblock(8)))
    assert keeps_order(conversion((1, 1, 8), lambda n, c, i: (n, c * 8 + i)))
    assert keeps_order(conversion((1, 8, 1, 1), lambda n, c, h, w: (n, c // 4, h, w, c % 4)))
    assert not keeps_order(conversion((1, 1, 6, 6, 8), unblock(8)))
    assert not keeps_order(conversion((1, 2, 1, 1), lambda n, c, h, w: (n, c // 4, h, w, c % 4), 0.0))  # padded
    assert not keeps_order(conversion((1, 2, 1, 1, 8), unblock(8)), max_elements=8)

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 16, 3)

        def forward(self, x):
            y = torch.relu(self.conv(x))
            return y.mean((2, 3)), y

    torch.manual_seed(0)
    module, x = Net().eval(), torch.randn(1, 3, 8, 8)
    model = M.import_model(torch.export.export(module, (x,)), layout="blocked", target=host_target)
    transforms = [t for t in model.tasks if "layout_transform" in t.name]
    assert sorted(t.args[0].shape[2:4] for t in transforms) == [(6, 6), (8, 8)], [t.args for t in transforms]
    assert conversions(model.mod) == 2
    outs = M.run_model(M.build_model(model, host_target), [x.numpy()], host_target)
    for out, expected in zip(outs, M.torch_outputs(module, [x]), strict=True):
        np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)


def test_gelu_softmax_and_tanh_use_vectorizable_math(host_target):
    """GELU (exact and tanh), softmax and tanh become TVM's polynomial exp/erf/tanh (no libm call, so they
    vectorize); the model still matches torch to float32 rounding, also where erf and tanh saturate."""
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(16, 64)

        def forward(self, x):
            h = self.fc(x)
            a = nn.functional.gelu(h) + nn.functional.gelu(h, approximate="tanh") + torch.tanh(h)
            return torch.softmax(a, dim=-1)

    torch.manual_seed(0)
    module, x = Block().eval(), 4 * torch.randn(2, 8, 16)
    model = M.import_model(torch.export.export(module, (x,)), target=host_target)
    names = " ".join(t.name for t in model.tasks)
    assert "fast_erf" in names and "fast_tanh" in names and "fast_softmax" in names, names
    assert "gelu" not in names, names
    scripts = " ".join(t.prim_func.script() for t in model.tasks)
    assert "T.erf(" not in scripts and "T.tanh(" not in scripts and "T.exp(" not in scripts
    built = M.build_model(model, host_target)
    with torch.no_grad():
        expected = module(x).numpy()
    np.testing.assert_allclose(M.run_model(built, [x.numpy()], host_target)[0], expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["small_cnn", "small_transformer"])
def test_a_bfloat16_model_imports_and_matches_torch(name, host_target):
    """`module.to(torch.bfloat16)`: convs, addmm and bmm accumulate in float32 and round back, layer norm and
    softmax run on float32 copies (TVM's layer_norm refuses bfloat16), as torch computes them on a CPU."""
    from compiler.arrays import LOW_PRECISION_TOL, check_close, to_numpy

    module, inputs = zoo.create(name)
    module, inputs = module.to(torch.bfloat16), [x.to(torch.bfloat16) for x in inputs]
    model = M.import_model(torch.export.export(module, tuple(inputs)), target=host_target)
    assert [s.dtype for s in model.inputs] == ["bfloat16"] and model.outputs[0].dtype == "bfloat16"
    if name == "small_transformer":  # imported at all: TVM refuses a bfloat16 layer_norm
        assert any("layer_norm" in t.name for t in model.tasks), [t.name for t in model.tasks]
    built = M.build_model(model, host_target)
    (out,) = M.run_model(built, [to_numpy(x) for x in inputs], host_target)
    (expected,) = M.torch_outputs(module, inputs)
    assert str(out.dtype) == str(expected.dtype) == "bfloat16"
    assert check_close(out, expected) is None, check_close(out, expected)
    # the tolerance is bfloat16's: an output off by a few bfloat16 ulps more is caught
    wrong = (expected.astype(np.float32) * (1 + 8 * LOW_PRECISION_TOL["bfloat16"]) + 0.5).astype(expected.dtype)
    assert check_close(wrong, expected) is not None


@pytest.mark.parametrize("mcpu", [None, "haswell"])
def test_bfloat16_convs_and_linears_take_the_dot_product_form_and_tensorize(mcpu, host_target):
    """In the default layouts a bfloat16 conv whose channels fit the target's bf16 dot product (16 or 8 output
    lanes, pairs of input channels) is `conv2d_nhwc_dot` in NHWC, and so is a linear on tokens (torch makes it a
    `bmm` of the broadcast weight: a 1x1 conv over all its rows, the rounding fused into it); the 3-channel
    first conv too, its input channels padded to 4 with zero weights. Each dot task
    scheduled with the space's seed is tensorized (vdpbf16ps where the CPU has AVX512_BF16), and the model
    built with those schedules matches torch within bfloat16's tolerance; on the host and on an AVX2 target
    (haswell: 8 lanes, the widened pairs), which every x86 CI machine runs."""
    import tvm
    from torch import nn

    from compiler.arrays import check_close, to_numpy
    from compiler.passes.tensorize import tensorize_module
    from compiler.workloads.model.layouts import dot_instruction
    from tuner.spaces import LoopSpace

    target = host_target if mcpu is None else tvm.target.Target({"kind": "llvm", "mcpu": mcpu})
    if dot_instruction(host_target, "bfloat16") is None:
        pytest.skip("this CPU has no bf16 dot product (no AVX2)")
    lanes = dot_instruction(target, "bfloat16")[0]

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Conv2d(3, 32, 3, padding=1), nn.Conv2d(32, 32, 3, padding=1)
            self.fc = nn.Linear(32, 16)

        def forward(self, x):
            x = torch.relu(self.b(torch.relu(self.a(x))))
            return self.fc(x.flatten(2).transpose(1, 2))  # tokens: a linear on a 3-D input

    torch.manual_seed(0)
    module, x = Net().eval().to(torch.bfloat16), torch.randn(1, 3, 12, 12).to(torch.bfloat16)
    ep = torch.export.export(module, (x,))
    model = M.import_model(ep, layout="blocked", target=target)
    dot = [t for t in model.tasks if "conv2d_nhwc_dot" in t.name]
    assert len(dot) == 3 and not any("NCHWc" in t.name for t in model.tasks), [t.name for t in model.tasks]
    packed = sorted(a.shape[3:5] for t in dot for a in t.args if len(a.shape) == 6)
    assert packed == [(2, lanes), (16, lanes), (16, lanes)], packed  # 3 -> 4 channels: 2 pairs
    assert all(t.name.endswith("_cast") or "_cast_" in t.name for t in dot), [t.name for t in dot]  # rounding fused
    schedules, used = {}, set()
    for task in dot:
        space = LoopSpace(task.prim_func)
        mod = space.apply(space.blocked_config()).mod
        _, reports = tensorize_module(tvm.tirx.transform.BindTarget(target)(mod))
        used |= {name for r in reports.values() for name in r.used}
        schedules[task.workload_key] = mod
    assert used & {"dot_bf16_avx512bf16", "dot_bf16_fma512", "dot_bf16_fma256"}, used
    assert mcpu != "haswell" or used == {"dot_bf16_fma256"}, used
    built = M.build_model(model, target, schedules)
    (out,) = M.run_model(built, [to_numpy(x)], target)
    (expected,) = M.torch_outputs(module, [x])
    assert check_close(out, expected) is None, check_close(out, expected)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_batch_norm_is_folded_into_the_conv_before_it(dtype, host_target):
    """conv -> batch norm (with and without a conv bias) becomes conv -> bias add on folded parameters; the batch
    norm of a conv whose output something else reads too becomes `x * s + t` (gamma := s, beta := beta - mean * s);
    the model still matches torch. In bfloat16 too:
    the float32 sums, the folded bias added before the rounding (the first conv's 3 input channels padded to the
    dot product's 4 where the target has one)."""
    from torch import nn

    from compiler.arrays import check_close, to_numpy

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.bn_a = nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)
            self.b, self.bn_b = nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8)
            self.c, self.bn_c = nn.Conv2d(8, 8, 1), nn.BatchNorm2d(8)

        def forward(self, x):
            x = torch.relu(self.bn_a(self.a(x)))
            x = torch.relu(self.bn_b(self.b(x)))
            y = self.c(x)
            return self.bn_c(y) + y  # the conv's output is read twice: its batch norm is x * s + t

    torch.manual_seed(0)
    net = Net().eval()
    for bn in (net.bn_a, net.bn_b, net.bn_c):  # statistics that are not the identity
        bn.running_mean.uniform_(-1, 1), bn.running_var.uniform_(0.5, 2), bn.weight.data.uniform_(0.5, 2)
    net, x = net.to(getattr(torch, dtype)), torch.randn(1, 3, 8, 8).to(getattr(torch, dtype))
    model = M.import_model(torch.export.export(net, (x,)), layout="none", target=host_target)
    names = sorted(t.name for t in model.tasks)
    cast = "_cast" if dtype == "bfloat16" else ""  # the float32 sums rounded after the bias
    assert names.count(f"fused_conv2d_add{cast}_relu") == 2, names  # a and b: the batch norm is a bias now
    # c: its bias add, then its batch norm as a scale and a shift (no subtraction, no division), the residual add
    assert not [n for n in names if "subtract" in n or "divide" in n], names
    assert [n for n in names if "multiply" in n], names
    weights = dict(zip(model.param_names, model.params))
    assert weights["a.weight"].dtype == dtype
    original = {k: v.detach().float().numpy() for k, v in net.state_dict().items()}
    assert not np.allclose(weights["a.weight"].astype(np.float32), original["a.weight"]), "a's weight carries the scale"
    np.testing.assert_array_equal(weights["c.weight"].astype(np.float32), original["c.weight"])
    bn = net.bn_c
    scale = original["bn_c.weight"] / np.sqrt(original["bn_c.running_var"] + bn.eps)
    np.testing.assert_allclose(weights["bn_c.weight"].astype(np.float32), scale, rtol=1e-2 if cast else 1e-6)
    np.testing.assert_allclose(weights["bn_c.bias"].astype(np.float32),
                               original["bn_c.bias"] - original["bn_c.running_mean"] * scale, rtol=1e-2 if cast else 1e-5,
                               atol=1e-2 if cast else 1e-6)
    (out,) = M.run_model(M.build_model(model, host_target), [to_numpy(x)], host_target)
    (expected,) = M.torch_outputs(net, [x])
    if dtype == "float32":
        np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)
    else:
        assert check_close(out, expected) is None, check_close(out, expected)


def test_default_schedule_keeps_small_functions_on_one_thread():
    """The default schedule of an untuned function (a layout conversion, an element-wise op) runs a small one on
    one thread (waking the pool costs more than its work) and a large one in parallel; both compute the same
    values as the unscheduled function."""
    import tvm
    from tvm import te, topi

    from compiler.workloads.model.build import PARALLEL_MIN_WORK, default_cpu_schedule

    def conversion(channels: int, size: int):
        x = te.placeholder((1, channels, size, size), name="x")
        return te.create_prim_func([x, topi.layout_transform(x, "NCHW", "NCHW8c")])

    small, large = conversion(8, 16), conversion(64, 32)  # 2,048 and 65,536 elements
    assert 8 * 16 * 16 < PARALLEL_MIN_WORK <= 64 * 32 * 32
    scheduled = {name: default_cpu_schedule(f, 2, 8) for name, f in (("small", small), ("large", large))}
    assert "T.parallel" not in scheduled["small"].script()
    assert "T.parallel" in scheduled["large"].script()
    assert "T.parallel" in default_cpu_schedule(small, 2, 8, min_parallel_work=0).script()
    dev = tvm.cpu(0)
    for name, channels, size in (("small", 8, 16), ("large", 64, 32)):
        x = np.random.default_rng(0).standard_normal((1, channels, size, size)).astype("float32")
        outs = []
        for func in (scheduled[name], small if name == "small" else large):
            lib = tvm.compile(tvm.IRModule({"main": func}), target="llvm")
            out = tvm.runtime.tensor(np.zeros((1, channels // 8, size, size, 8), "float32"), dev)
            lib(tvm.runtime.tensor(x, dev), out)
            outs.append(out.numpy())
        np.testing.assert_array_equal(outs[0], outs[1])
        np.testing.assert_array_equal(outs[0], x.reshape(1, channels // 8, 8, size, size).transpose(0, 1, 3, 4, 2))
