"""The zoo under the default settings (blocked layouts), the import fallback, our converters, the whole-model check."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from compiler.workloads import model as M  # noqa: E402
from compiler.workloads import zoo  # noqa: E402

BIG = ("resnet18", "mobilenet_v2", "bert_tiny")  # 224x224 / 128 tokens: bench material, too slow for a unit test
SMALL = [name for name in zoo.MODELS if name not in BIG]
# small_cnn and small_transformer are checked against torch in test_model.py (blocked and default layouts)
CHECKED_HERE = [name for name in SMALL if name not in ("small_cnn", "small_transformer")]
DEFAULT_LAYOUT = "blocked"  # a model job's default (service.api.models.ModelJobSpec.layout)


def _export(name):
    module, inputs = zoo.create(name)
    return torch.export.export(module, inputs), [i.numpy() for i in inputs]


@pytest.fixture(scope="module")
def imported(host_target):
    """name -> (exported program, example inputs, model imported under the default layout), made once."""
    cache = {}

    def get(name):
        if name not in cache:
            ep, inputs = _export(name)
            cache[name] = ep, inputs, M.import_model(ep, layout=DEFAULT_LAYOUT, target=host_target)
        return cache[name]

    return get


def test_the_zoo_has_every_kind():
    assert len(zoo.MODELS) >= 12 and len(SMALL) >= 12, sorted(zoo.MODELS)
    assert {"unet", "vit_block", "mlp_mixer", "audio_cnn", "video_cnn", "pool_net", "grouped_net", "dense_net",
            "fpn"} <= set(zoo.MODELS)


def test_default_layout_is_the_model_jobs():
    from service.api.models import ModelJobSpec

    assert ModelJobSpec().layout == DEFAULT_LAYOUT


@pytest.mark.parametrize("name", CHECKED_HERE)
def test_zoo_model_imports_and_matches_torch(name, imported, host_target):
    """Every small zoo model imports under the default layout policy, and its untuned build matches the
    exported program (torch) on the model's example inputs."""
    ep, inputs, model = imported(name)
    assert model.tasks and sum(t.weight for t in model.tasks) == sum(M.call_counts(model.mod["main"]).values())
    built = M.build_model(model, host_target)
    outs = M.run_model(built, inputs, host_target)
    assert M.compare_outputs(outs, M.reference_outputs(ep, inputs)) is None


def test_layout_fallback_is_per_conv(imported, host_target):
    """Blocks that disagree where a concat joins two convs' outputs (3 and 8 channels in blocks 3 and 8, as a job
    may name them) fail TVM's layout pass ("Invalid layout axis"): the later conv keeps NCHW, with conversions at
    its boundary, named in the notes; the earlier one stays blocked and the model matches torch. Under the rule the
    concat's layout group takes no common block and keeps NCHW; the zoo's U-Net (a concat, a resize, a transposed
    conv) needs no fallback. The 1-D audio net (ConvertLayout: std::bad_alloc) has no conv2d and skips the pass."""
    from torch import nn

    from compiler.workloads.model.tasks import conversions

    class Mixed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b, self.c = nn.Conv2d(3, 3, 3, 1, 1), nn.Conv2d(3, 8, 3, 1, 1), nn.Conv2d(11, 8, 1)

        def forward(self, x):
            return self.c(torch.cat([self.a(x), self.b(x)], 1))

    torch.manual_seed(0)
    x = torch.randn(1, 3, 8, 8)
    ep = torch.export.export(Mixed().eval(), (x,))
    expected = M.reference_outputs(ep, [x.numpy()])
    model = M.import_model(ep, layout="blocked", target=host_target, blocks={"a.weight": [3, 3], "b.weight": [3, 8]})
    assert len(model.notes) == 1 and "(b.weight)" in model.notes[0], model.notes
    assert model.blocks["a.weight"] == [3, 3] and "b.weight" not in model.blocks
    assert any(t.name.startswith("fused_conv2d_NCHWc") for t in model.tasks) and conversions(model.mod) > 0
    assert M.compare_outputs(M.run_model(M.build_model(model, host_target), [x.numpy()], host_target), expected) is None

    model = M.import_model(ep, layout="blocked", target=host_target)
    assert model.notes == [] and set(map(tuple, model.blocks.values())) == {(0, 0)} and conversions(model.mod) == 0
    assert imported("unet")[2].notes == [] and imported("audio_cnn")[2].notes == []


def test_converters_for_operators_tvm_lacks(host_target):
    from torch import nn

    class Ops(nn.Module):
        def forward(self, x):
            values, _ = nn.functional.adaptive_max_pool2d(x, 3, return_indices=True)
            var, mean = torch.var_mean(x, dim=(2, 3))
            return (torch.amax(x, dim=(2, 3)) + torch.amin(x, dim=-1).sum(-1) + var + mean,
                    values, torch.exp2(x) + torch.hypot(x, x), nn.functional.adaptive_max_pool3d(x[None], 2))

    class Video(nn.Module):  # torch decomposes 3-D upsampling into index arithmetic TVM cannot import
        def __init__(self) -> None:
            super().__init__()
            self.up = nn.ConvTranspose3d(4, 4, 3, 2, 1, output_padding=1)

        def forward(self, x):
            return (self.up(x) + nn.functional.interpolate(x, scale_factor=2)
                    + nn.functional.interpolate(x, scale_factor=2, mode="trilinear"))

    for module, x in ((Ops(), torch.randn(1, 4, 8, 7)), (Video().eval(), torch.randn(1, 4, 3, 6, 5))):
        ep = torch.export.export(module, (x,))
        model = M.import_model(ep, target=host_target)
        outs = M.run_model(M.build_model(model, host_target), [x.numpy()], host_target)
        assert M.compare_outputs(outs, M.reference_outputs(ep, [x.numpy()])) is None


def test_unsupported_operator_names_its_node():
    class Spectrum(torch.nn.Module):
        def forward(self, x):
            return torch.fft.rfft(x).abs()

    with pytest.raises(M.ModelError) as info:
        M.import_model(torch.export.export(Spectrum(), (torch.randn(8),)))
    assert info.value.field == "model" and "_fft_r2c.default at node _fft_r2c" in info.value.message

    class Indices(torch.nn.Module):  # a converter that cannot do what the graph asks
        def forward(self, x):
            return nn_pool(x)[1].float()

    nn_pool = lambda x: torch.nn.functional.adaptive_max_pool2d(x, 2, return_indices=True)  # noqa: E731
    with pytest.raises(M.ModelError) as info:
        M.import_model(torch.export.export(Indices(), (torch.randn(1, 2, 4, 4),)))
    assert "adaptive_max_pool2d" in info.value.message and "at node adaptive_max_pool2d" in info.value.message


def _wrong_program(task):
    """A PrimFunc with the task's signature that computes something else (every output element 0.5)."""
    from tvm import te

    *ins, out = task.args
    placeholders = [te.placeholder(a.shape, a.dtype, name=f"in{i}") for i, a in enumerate(ins)]
    result = te.compute(out.shape, lambda *_: te.const(0.5, out.dtype), name="wrong")
    return te.create_prim_func([*placeholders, result])


def test_whole_model_check_removes_a_wrong_schedule(imported, host_target):
    """A schedule that computes something else (each task passes its own check when measured; this one is
    injected) makes the model mismatch torch: the check finds it by bisection, removes it, and the build it
    returns is the model without it, which matches."""
    ep, inputs, model = imported("small_cnn")
    expected = M.reference_outputs(ep, inputs)
    convs = [t for t in model.tasks if "conv" in t.name]
    good = {t.workload_key: M.default_schedule(t.prim_func, host_target) for t in convs[1:]}
    wrong = convs[0]
    checked = M.build_checked(model, host_target, {**good, wrong.workload_key: _wrong_program(wrong)}, inputs,
                              expected)
    assert checked.built is not None and checked.error is None
    assert checked.removed == [wrong.workload_key] and set(checked.schedules) == set(good)
    assert checked.mismatches and "wrong result" in checked.mismatches[0]
    assert M.compare_outputs(M.run_model(checked.built, inputs, host_target), expected) is None
    # a reference the untuned model cannot match: nothing to serve
    bad = M.build_checked(model, host_target, {}, inputs, [e + 1 for e in expected])
    assert bad.built is None and "untuned model does not match" in bad.error


def test_a_graph_that_fails_after_the_layout_pass_keeps_its_own_layouts(monkeypatch, host_target):
    """Lowering the converted graph fails (TVM raised): the convs are searched again with legalization in every
    try, and when that fails too every operator keeps its own layout; the model imports, matches torch, and
    says so in its notes."""
    from compiler.workloads.model import importer

    real, calls = importer._lower, []

    def lower(mod, target):
        calls.append(mod)
        if len(calls) <= 2:  # the quick search's graph, then the legalizing search's
            raise RuntimeError("InternalError: injected")
        return real(mod, target)

    monkeypatch.setattr(importer, "_lower", lower)
    ep, inputs = _export("small_cnn")
    model = M.import_model(ep, layout=DEFAULT_LAYOUT, target=host_target)
    assert len(calls) == 3 and "failed to lower (RuntimeError: InternalError: injected)" in model.notes[0]
    assert not any("NCHWc" in t.name or "layout_transform" in t.name for t in model.tasks), model.tasks
    outs = M.run_model(M.build_model(model, host_target), inputs, host_target)
    assert M.compare_outputs(outs, M.reference_outputs(ep, inputs)) is None
