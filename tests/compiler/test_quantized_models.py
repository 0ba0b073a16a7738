"""PT2E-quantized models (`compiler.workloads.model.quantized`): quantized convs and linears computed in integers
(u8 x s8 -> s32) and checked against torch; the float fallback; torch's rounding; the operators not supported."""

from __future__ import annotations

import io

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from compiler.workloads import model as M  # noqa: E402
from compiler.workloads import zoo  # noqa: E402
from compiler.workloads.pt2 import ModelError, load_exported_program  # noqa: E402

import torch.ao.quantization.fx._decomposed  # noqa: E402, F401, F811 - registers torch.ops.quantized_decomposed

Q = torch.ops.quantized_decomposed


class Quantized(torch.nn.Module):
    """What torchao's `convert_pt2e` writes for conv -> relu -> grouped conv -> mean -> linear, by hand: uint8
    activations per tensor (the input's zero point 121, so its padding is not 0), int8 weights per output channel
    stored as buffers and dequantized in the graph."""

    def __init__(self, weight_zero_point: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        for name, shape in (("w1", (8, 3, 3, 3)), ("w2", (8, 2, 3, 3)), ("w3", (5, 8))):
            self.register_buffer(name, torch.randint(-128, 128, shape, generator=g, dtype=torch.int8))
            self.register_buffer(f"s{name[1]}", torch.rand(shape[0], generator=g) * 0.004 + 0.001)
            self.register_buffer(f"z{name[1]}", torch.full((shape[0],), weight_zero_point, dtype=torch.int64))
            self.register_buffer(f"b{name[1]}", torch.randn(shape[0], generator=g) * 0.1)

    def _weight(self, i: int) -> torch.Tensor:
        w, s, z = (getattr(self, f"{k}{i}") for k in "wsz")
        return Q.dequantize_per_channel(w, s, z, 0, -128, 127, torch.int8)

    @staticmethod
    def _requantize(x: torch.Tensor, scale: float, zero_point: int) -> torch.Tensor:
        q = Q.quantize_per_tensor(x, scale, zero_point, 0, 255, torch.uint8)
        return Q.dequantize_per_tensor(q, scale, zero_point, 0, 255, torch.uint8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self._requantize(x, 0.02, 121)
        x = torch.relu(torch.nn.functional.conv2d(x, self._weight(1), self.b1, padding=1))
        x = self._requantize(x, 0.03, 0)
        x = torch.nn.functional.conv2d(x, self._weight(2), self.b2, stride=2, padding=1, groups=4)
        x = self._requantize(x.mean((2, 3)), 0.01, 64)
        return torch.nn.functional.linear(x, self._weight(3), self.b3)


def _saved(ep: torch.export.ExportedProgram, tmp_path) -> torch.export.ExportedProgram:
    """`ep` through a file and our loader, as an upload reaches a job."""
    path = tmp_path / "q.pt2"
    torch.export.save(ep, path)
    return load_exported_program(path)


def _integer_tasks(model: M.ImportedModel) -> list[str]:
    """The tasks that read a uint8 tensor and an int8 one and write through an int32 sum (a conv or a matmul)."""
    return [t.name for t in model.tasks
            if {"uint8", "int8"} <= {a.dtype for a in t.args} and '"int32"' in t.prim_func.script()]


def _run(model, ep, inputs, target):
    built = M.build_model(model, target)
    outs = M.run_model(built, inputs, target)
    return outs, M.reference_outputs(ep, inputs)


def test_quantized_convs_and_linear_compute_in_integers_and_match_torch(host_target, tmp_path):
    module = Quantized().eval()
    x = torch.randn(1, 3, 12, 12)
    ep = _saved(torch.export.export(module, (x,)), tmp_path)
    model = M.import_model(ep, layout="blocked", target=host_target)
    assert model.quantized
    integer = _integer_tasks(model)
    # the two convs and the linear (a 1x1 conv over its rows)
    assert sum("conv2d" in n for n in integer) == 3, \
        [(t.name, [str(a.dtype) for a in t.args]) for t in model.tasks]
    # the first conv's input is padded with its zero point (121) before the integer conv; no float conv is left
    script = model.mod.script()
    assert "T.uint8(121)" in script
    assert not [t.name for t in model.tasks if "conv2d" in t.name and t.name not in integer]
    outs, expected = _run(model, ep, [x.numpy()], host_target)
    assert M.compare_outputs(outs, expected, **M.tolerance(model)) is None
    # exact integer sums against float32 ones: here not one value crosses a quantization step
    np.testing.assert_allclose(outs[0], expected[0], rtol=1e-5, atol=1e-6)


def test_weights_with_a_zero_point_compute_in_float_and_still_match(host_target, tmp_path):
    """Weights quantized with a zero point other than 0 have no integer form here: the conv runs in float on the
    dequantized values, as the program does."""
    module = Quantized(weight_zero_point=3).eval()
    x = torch.randn(1, 3, 12, 12)
    ep = _saved(torch.export.export(module, (x,)), tmp_path)
    model = M.import_model(ep, layout="none", target=host_target)
    assert not _integer_tasks(model)
    outs, expected = _run(model, ep, [x.numpy()], host_target)
    assert M.compare_outputs(outs, expected, **M.tolerance(model)) is None


class QuantizeOnly(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return Q.quantize_per_tensor(x, 0.5, 3, 0, 255, torch.uint8)


def test_quantize_rounds_half_to_even_as_torch(host_target, tmp_path):
    """Values exactly halfway between two steps (x / scale = k + 0.5) round to the even step, as torch.round does;
    values past the range clip to quant_min / quant_max."""
    x = torch.tensor([[-3.0, -2.25, -1.75, -0.25, 0.25, 0.75, 1.25, 100.0, 127.25, 127.75, 200.0, -1.5]])
    ep = _saved(torch.export.export(QuantizeOnly(), (x,)), tmp_path)
    model = M.import_model(ep, target=host_target)
    outs, expected = _run(model, ep, [x.numpy()], host_target)
    assert outs[0].dtype == np.uint8
    np.testing.assert_array_equal(outs[0], expected[0])


class TensorScale(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = Q.quantize_per_tensor.tensor(x, torch.tensor(0.1), torch.tensor(3), 0, 255, torch.uint8)
        return Q.dequantize_per_tensor.tensor(q, torch.tensor(0.1), torch.tensor(3), 0, 255, torch.uint8)


def test_quantization_with_tensor_parameters_is_named_as_unsupported(host_target, tmp_path):
    """The `.tensor` overloads (dynamic quantization's) are loaded but not converted: the error names them."""
    ep = _saved(torch.export.export(TensorScale(), (torch.randn(2, 4),)), tmp_path)
    with pytest.raises(ModelError) as err:
        M.import_model(ep, target=host_target)
    assert err.value.field == "model" and "quantize_per_tensor.tensor" in str(err.value), str(err.value)


def pt2e_quantized(name: str) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...], torch.export.ExportedProgram]:
    """Zoo model `name` quantized as a user would (`zoo.quantized`: torchao's PT2E flow, its X86 quantizer), the
    inputs and the quantized module's export."""
    pytest.importorskip("torchao")
    converted, inputs = zoo.quantized(name)
    return converted, inputs, torch.export.export(converted, inputs)


def test_a_pt2e_quantized_model_imports_in_integers_and_matches_torch(host_target, tmp_path):
    converted, inputs, ep = pt2e_quantized("small_cnn")
    buf = io.BytesIO()
    torch.export.save(ep, buf)
    path = tmp_path / "small_cnn_int8.pt2"
    path.write_bytes(buf.getvalue())
    ep = load_exported_program(path)
    model = M.import_model(ep, layout="blocked", target=host_target)
    assert model.quantized and any("conv2d" in n for n in _integer_tasks(model))
    outs, _ = _run(model, ep, [i.numpy() for i in inputs], host_target)
    with torch.no_grad():
        expected = converted(*inputs).numpy()
    assert M.compare_outputs(outs, [expected], **M.tolerance(model)) is None


SKYLAKE_AVX512 = {"kind": "llvm", "mcpu": "skylake-avx512"}  # AVX-512 BW, no VNNI: vpmaddwd, 16 lanes x pairs
HASWELL = {"kind": "llvm", "mcpu": "haswell"}  # AVX2, no VNNI: vpmaddwd, 8 lanes x pairs
GENERIC = {"kind": "llvm", "mcpu": "x86-64"}  # SSE2: no int8 instruction of ours
CASCADELAKE = {"kind": "llvm", "mcpu": "cascadelake"}  # AVX-512 VNNI: 16 int32 lanes x groups of 4
ALDERLAKE = {"kind": "llvm", "mcpu": "alderlake"}  # AVX-VNNI (ymm): 8 lanes x 4


class Wide(torch.nn.Module):
    """A PT2E-form quantized net whose convs the dot-product instructions fit (channels that 16 and 4 divide):
    3 -> 16 (its input padded to 4 channels), 16 -> 32 (3x3, zero point 0: the conv pads), 32 -> 32 (3x3,
    stride 2, zero point 5: padded with it before), mean, linear 32 -> 16 (a 1x1 conv over its one row)."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(1)
        for i, shape in enumerate(((16, 3, 3, 3), (32, 16, 3, 3), (32, 32, 3, 3), (16, 32)), start=1):
            self.register_buffer(f"w{i}", torch.randint(-128, 128, shape, generator=g, dtype=torch.int8))
            self.register_buffer(f"s{i}", torch.rand(shape[0], generator=g) * 0.002 + 0.0005)
            self.register_buffer(f"z{i}", torch.zeros(shape[0], dtype=torch.int64))
            self.register_buffer(f"b{i}", torch.randn(shape[0], generator=g) * 0.1)

    _weight = Quantized._weight
    _requantize = staticmethod(Quantized._requantize)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        conv = torch.nn.functional.conv2d
        x = self._requantize(x, 0.02, 121)
        x = self._requantize(torch.relu(conv(x, self._weight(1), self.b1, padding=1)), 0.03, 0)
        x = self._requantize(torch.relu(conv(x, self._weight(2), self.b2, padding=1)), 0.02, 5)
        x = self._requantize(conv(x, self._weight(3), self.b3, stride=2, padding=1).mean((2, 3)), 0.01, 64)
        return torch.nn.functional.linear(x, self._weight(4), self.b4)


def _dot_tasks(model):
    return [t for t in model.tasks if "conv2d_nhwc_dot" in t.name]


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    x = torch.randn(1, 3, 12, 12)
    return _saved(torch.export.export(Wide().eval(), (x,)), tmp_path_factory.mktemp("wide")), x


@pytest.mark.parametrize(("target", "lanes", "group"), [(CASCADELAKE, 16, 4), (ALDERLAKE, 8, 4),
                                                      (SKYLAKE_AVX512, 16, 2), (HASWELL, 8, 2), (GENERIC, None, 0)])
def test_quantized_convs_take_the_dot_product_layout_where_the_target_has_an_exact_instruction(
        wide, target, lanes, group):
    """With the default (blocked) layouts a quantized conv or linear whose channels fit runs NHWC with its
    weight packed `O/L KH KW I/G L G` for the target's exact instruction: VNNI's groups of 4, or on a CPU without
    VNNI the pairs of `vpmaddwd` (never the saturating `vpmaddubsw`); the 3-channel conv's input padded to 4
    channels. A CPU with no int8 instruction at all keeps every conv in its own layout."""
    from tvm.target import Target

    ep, _ = wide
    model = M.import_model(ep, layout="blocked", target=Target(target))
    dot = _dot_tasks(model)
    if lanes is None:
        assert not dot, [t.name for t in model.tasks]
        return
    assert len(dot) == 4, [t.name for t in model.tasks]
    kernels = sorted(a.shape for t in dot for a in t.args if a.dtype == "int8")
    # the RGB conv's 3 input channels padded to 4 (zero weights), the others', the linear's
    # (output, kernel, input channels) of each
    shapes = [(16, 3, 4), (32, 3, 16), (32, 3, 32), (16, 1, 32)]
    assert kernels == sorted((o // lanes, k, k, i // group, lanes, group) for o, k, i in shapes), kernels


def test_the_dot_product_form_is_searched_with_its_group_innermost(wide):
    """The loop space of a dot-form conv: the group is an axis with no tile knob; marked for the instruction,
    the group loop is the innermost, below the register block's lanes; unmarked it stays with the outer
    reduction loops, the lanes innermost."""
    from tvm.target import Target

    from compiler.target import vector_unit
    from tuner.spaces import LoopSpace

    ep, _ = wide
    target = Target(CASCADELAKE)
    task = _dot_tasks(M.import_model(ep, layout="blocked", target=target))[0]
    space = LoopSpace(task.prim_func, unit=vector_unit(target))
    assert [a.kind for a in space.structure.axes][-1] == "G" and space.structure.group.extent == 4
    assert not [k for k in space.knobs if k.name.startswith("tile.g.")]
    seed = space.blocked_config()
    assert seed["tensorize"] == 1 and seed["tile.ol.3"] == 16

    def innermost(config):
        sch = space.apply(config)
        update = sch.get_sblock(f"{space.structure.main}_update")  # decompose_reduction's name of the sum
        return [str(sch.get(loop).loop_var.name) for loop in sch.get_loops(update)]

    assert innermost(seed)[-1].startswith("g") and innermost(seed)[-2].startswith("ol")
    assert innermost({**seed, "tensorize": 0})[-1].startswith("ol")


def test_a_tensorized_dot_product_model_matches_torch(wide, host_target):
    """On a CPU with an exact int8 instruction (VNNI, or vpmaddwd's pairs without it): each dot-form conv
    scheduled with the space's seed (marked) is tensorized, and the model built with those schedules (the
    linear's too) matches the quantized program."""
    import tvm

    from compiler.passes.tensorize import tensorize_module
    from compiler.workloads.model.layouts import dot_instruction
    from tuner.spaces import LoopSpace

    if dot_instruction(host_target) is None:
        pytest.skip("this CPU has no exact u8 x s8 dot-product instruction")
    ep, x = wide
    model = M.import_model(ep, layout="blocked", target=host_target)
    schedules, tensorized = {}, []
    for task in _dot_tasks(model):
        space = LoopSpace(task.prim_func)
        mod = space.apply(space.blocked_config()).mod
        _, reports = tensorize_module(tvm.tirx.transform.BindTarget(host_target)(mod), exact=True)
        if any(r.used for r in reports.values()):
            tensorized.append(next(a.shape for a in task.args if a.dtype == "int8"))
        schedules[task.workload_key] = mod
    # the convs and the linear (its packed weight is 1x1): its one row leaves no rows loop, and the micro-kernel
    # takes it as one row (select.py)
    assert len(schedules) == 4 and len(tensorized) == 4, tensorized
    assert sorted(shape[1:3] for shape in tensorized) == [(1, 1), (3, 3), (3, 3), (3, 3)], tensorized
    built = M.build_model(model, host_target, schedules)
    outs = M.run_model(built, [x.numpy()], host_target)
    assert M.compare_outputs(outs, M.reference_outputs(ep, [x.numpy()]), **M.tolerance(model)) is None


def test_a_transformers_linears_on_tokens_compute_in_integers(host_target):
    """torch's decompositions (the import runs them) make a linear on 3-D tokens `view -> mm -> view`; the integer
    form looks through the view
    of the dequantized tokens: the ViT block's qkv, projection and two MLP linears compute in integers, as its
    head (on the class token: 2-D) and its patch embedding (a conv) do, and the model matches the program."""
    _, inputs, ep = pt2e_quantized("vit_block")
    model = M.import_model(ep, layout="none", target=host_target)
    integer = _integer_tasks(model)
    # one int8 weight per integer task: the embedding's 4x4 kernel and the five linears' (a 1x1 conv each)
    weights = sorted(tuple(a.shape) for t in model.tasks if t.name in integer for a in t.args if a.dtype == "int8")
    assert weights == sorted([(32, 4, 4, 4), (96, 1, 1, 32), (32, 1, 1, 32), (64, 1, 1, 32), (32, 1, 1, 64),
                              (10, 1, 1, 32)]), weights
    arrays = [i.numpy() for i in inputs]
    outs, expected = _run(model, ep, arrays, host_target)
    assert M.compare_outputs(outs, expected, **M.tolerance(model)) is None


@pytest.mark.parametrize("name", ["unet", "vit_block", "audio_cnn", "video_cnn", "fpn"])
def test_pt2e_quantized_zoo_models_import_and_match_torch(name, host_target):
    """Zoo models quantized by torchao's PT2E flow import under the default layouts and match the quantized
    program: a transposed conv on dequantized data (unet: its blocked layout is not legalized, so it keeps
    its own), attention and layer norm (vit_block), 1-D convs computed in integers, a video net whose 3-D
    convs the X86 quantizer leaves in float (only its linear is quantized), an FPN's adds and upsampling on
    dequantized tensors."""
    _, inputs, ep = pt2e_quantized(name)
    model = M.import_model(ep, layout="blocked", target=host_target)
    assert model.quantized
    integer = _integer_tasks(model)
    kind = {"audio_cnn": "conv1d"}.get(name, "conv2d")  # video_cnn's, vit_block's: their linears (1x1 convs)
    assert any(kind in n for n in integer), [t.name for t in model.tasks]
    arrays = [i.numpy() for i in inputs]
    outs, expected = _run(model, ep, arrays, host_target)
    assert M.compare_outputs(outs, expected, **M.tolerance(model)) is None
