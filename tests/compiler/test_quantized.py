"""int8 (u8 x s8 -> s32) and bfloat16 (-> fp32) operators of the catalog: their programs against torch (int8 bit for
bit), a target without VNNI, an int8 job tuned into an artifact, and the validation of operator x dtype."""

from __future__ import annotations

import numpy as np
import pytest

from compiler.workloads import WorkloadError, make_workload, validate
from compiler.workloads.operators import DTYPES, INT8_MAX_REDUCTION, OPERATORS

tvm = pytest.importorskip("tvm")
pytest.importorskip("torch")
pytest.importorskip("ml_dtypes")

DENSE = {"m": 7, "n": 21, "k": 37}  # nothing divides a vector or a group of 4
BMM = {"batch": 2, "m": 5, "n": 19, "k": 13}
CONV = {"batch": 1, "in_channels": 5, "height": 9, "width": 9, "out_channels": 6, "kernel": 3, "padding": 1}


def _run(mod, workload, inputs, target="host"):
    from compiler.build import compile_module
    from compiler.target import resolve_target

    target = resolve_target(target) if isinstance(target, str) else tvm.target.Target(target)
    lib = compile_module(mod, target).jit()
    args = [tvm.runtime.tensor(a) for a in inputs]
    args.append(tvm.runtime.tensor(np.zeros(workload.output.shape, workload.output.dtype)))
    lib["main"](*args)
    return args[-1].numpy()


def _check(workload, out, expected):
    assert out.dtype == expected.dtype == np.dtype(workload.output.dtype)
    if workload.dtype == "int8":
        np.testing.assert_array_equal(out, expected)  # integer sums: bit for bit
    else:
        np.testing.assert_allclose(out, expected, rtol=1e-3, atol=1e-3 * max(1.0, float(np.abs(expected).max())))


@pytest.mark.parametrize("dtype", ["int8", "bfloat16"])
@pytest.mark.parametrize(("operator", "params", "epilogue"), [
    ("dense", DENSE, "none"), ("batch_matmul", BMM, "bias"), ("conv2d", CONV, "bias_relu")])
def test_program_equals_torch(dtype, operator, params, epilogue):
    wl = make_workload(operator, params, dtype, epilogue)
    data_t, weight_t = {"int8": ("uint8", "int8"), "bfloat16": ("bfloat16", "bfloat16")}[dtype]
    out_t = {"int8": "int32", "bfloat16": "float32"}[dtype]
    assert [s.dtype for s in wl.inputs] == [data_t, weight_t] + [out_t] * (epilogue != "none")
    assert wl.output.dtype == out_t
    xs = wl.random_inputs(0)
    if dtype == "int8":  # every value of the types, signed weights
        assert xs[0].min() == 0 and xs[0].max() == 255 and xs[1].min() == -128 and xs[1].max() == 127
    expected = wl.reference(xs)
    _check(wl, _run(tvm.IRModule({"main": wl.prim_func}), wl, xs), expected)


@pytest.mark.parametrize(("operator", "params", "epilogue"), [
    ("dense", DENSE, "requantize"), ("batch_matmul", BMM, "bias_requantize"), ("conv2d", CONV, "bias_relu_requantize")])
def test_requantized_program_equals_the_reference(operator, params, epilogue):
    """The requantizing epilogues: a float32 scale and an int32 zero point per output channel after the operands
    (and the bias), a uint8 output; the program equals the reference bit for bit, on random inputs whose outputs
    round, clip at 0 (at the zero point after a ReLU) and 255, and spread over the range."""
    wl = make_workload(operator, params, "int8", epilogue)
    channels = (wl.output.shape[wl._bias_axis],)
    assert [(s.name, s.dtype) for s in wl.inputs[-2:]] == [("scale", "float32"), ("zero_point", "int32")]
    assert wl.inputs[-1].shape == wl.inputs[-2].shape == channels and wl.output.dtype == "uint8"
    assert [s.dtype for s in wl.inputs[:-2]] == ["uint8", "int8"] + ["int32"] * epilogue.startswith("bias")
    xs = wl.random_inputs(0)
    expected = wl.reference(xs)
    view = [1] * len(wl.output.shape)
    view[wl._bias_axis] = -1
    floor = xs[-1].reshape(view) if "relu" in epilogue else 0  # a ReLU before requantizing: the zero point
    assert (expected >= floor).all() and (expected == floor).any() and expected.max() == 255
    assert len(np.unique(expected)) > 50
    _check(wl, _run(tvm.IRModule({"main": wl.prim_func}), wl, xs), expected)


def test_requantization_is_torch_ao_s():
    """The reference's requantization is what torch.ao's x86 quantized linear computes (FBGEMM's, rounding half to
    even): a per-channel int8 weight, a uint8 input, bias and ReLU. Scales that are powers of two make the combined
    multiplier exact and put many products exactly halfway between two steps."""
    import torch

    from compiler.target import resolve_target
    from compiler.workloads.model.layouts import dot_instruction

    m, n, k = 33, 40, 70
    wl = make_workload("dense", {"m": m, "n": n, "k": k}, "int8", "bias_relu_requantize")
    rng = np.random.default_rng(0)
    # without VNNI, FBGEMM multiplies with `vpmaddubsw`, whose pair sums saturate for activations >= 128 (what our
    # jobs avoid with `vpmaddwd`): torch is exact there only on 7-bit activations
    dot = dot_instruction(resolve_target("host"), "int8")
    vnni = dot is not None and dot[1] == 4  # groups of 4: VNNI
    x = rng.integers(0, 256 if vnni else 128, (m, k)).astype(np.uint8)
    w = rng.integers(-128, 128, (n, k)).astype(np.int8)
    bias = rng.integers(-2**14, 2**14, n).astype(np.int32)
    x_scale, y_scale, zero_point = 2.0**-4 if vnni else 2.0**-3, 2.0, 100  # half the activations: twice the scale
    w_scales = 2.0 ** -rng.integers(5, 9, n)
    ours = wl.reference([x, w, bias, (x_scale * w_scales / y_scale).astype(np.float32),
                         np.full(n, zero_point, np.int32)])
    assert len(np.unique(ours)) > 50 and (ours == 255).any() and (ours == zero_point).any()
    qx = torch._make_per_tensor_quantized_tensor(torch.from_numpy(x), x_scale, 0)  # deprecated, what torch.ao runs
    qw = torch._make_per_channel_quantized_tensor(torch.from_numpy(w), torch.from_numpy(w_scales),
                                                  torch.zeros(n, dtype=torch.long), 0)
    if "x86" not in torch.backends.quantized.supported_engines:
        pytest.skip("this torch has no x86 quantized engine")
    engine, torch.backends.quantized.engine = torch.backends.quantized.engine, "x86"
    try:
        packed = torch.ops.quantized.linear_prepack(qw, torch.from_numpy((bias * x_scale * w_scales).astype(np.float32)))
        theirs = torch.ops.quantized.linear_relu(qx, packed, y_scale, zero_point).int_repr().numpy()
    finally:
        torch.backends.quantized.engine = engine
    np.testing.assert_array_equal(ours, theirs)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_requantization_needs_int8(dtype):
    with pytest.raises(WorkloadError) as e:
        validate("dense", DENSE, dtype, "bias_relu_requantize")
    assert e.value.field == "epilogue"
    assert "requantizes the int32 sums of an int8 operator" in e.value.message and "'bias_relu'" in e.value.message


def test_int8_reference_is_exact_beyond_float32():
    """Sums above 2**24 (where fp32 would round) still come out exact: the reference runs in float64."""
    wl = make_workload("dense", {"m": 2, "n": 3, "k": 1100}, "int8")
    xs = [np.full((2, 1100), 255, np.uint8), np.full((3, 1100), -128, np.int8)]
    xs[0][0, 0] = 254
    out = wl.reference(xs)
    assert out.dtype == np.int32
    assert out[0, 0] == 255 * -128 * 1099 + 254 * -128 and out[1, 0] == 255 * -128 * 1100


@pytest.mark.parametrize("target", [{"kind": "llvm", "mcpu": "haswell"}, {"kind": "llvm", "mtriple": "x86_64-linux-gnu"}],
                         ids=["haswell", "x86-64"])
def test_int8_without_vnni(target):
    """AVX2 without VNNI and baseline x86-64: the same exact result (the tuned variant: see the tuner's test)."""
    from compiler.passes.tensorize import available

    t = tvm.target.Target(target)
    assert not {i.name for i in available(t)} & {"dot_u8i8_vnni512", "dot_u8i8_avxvnni"}
    wl = make_workload("conv2d", CONV, "int8")
    xs = wl.random_inputs(1)
    _check(wl, _run(tvm.IRModule({"main": wl.prim_func}), wl, xs, target), wl.reference(xs))


@pytest.mark.tunes
def test_int8_job_tunes_to_an_exact_artifact(tmp_path):
    """An int8 operator job, as the worker runs it: ALT's search with a tiny budget, the best into an artifact,
    the artifact's output equal to torch's bit for bit."""
    from compiler.build import load_artifact, write_artifact
    from tuner import apply_config, layout_of_config
    from tuner.task import task_from_spec
    from tuner.tune import tune

    spec = {"operator": "dense", "params": {"m": 8, "n": 24, "k": 40}, "dtype": "int8", "epilogue": "bias_relu",
            "target": "host"}
    task = task_from_spec(spec)
    assert task.inputs is not None and task.expected.dtype == np.int32
    result = tune(task, 3, batch_size=8, top_k=3)
    assert result.best is not None, [t.error for t in result.trials]
    wl = task.workload
    path = write_artifact(tmp_path / "a.tar.gz", wl, apply_config(task, result.best.config), task.target,
                          result.best.latency_ms, spec, layout_of_config(task, result.best.config))
    lib, manifest = load_artifact(path)
    assert manifest["workload"]["dtype"] == "int8"
    xs = wl.random_inputs(7)  # not the inputs the search checked
    user = dict(zip((s.name for s in wl.inputs), xs))
    if "pack" in manifest:
        packed = [tvm.runtime.tensor(np.zeros(c["shape"], c["dtype"])) for c in manifest["pack"]["outputs"]]
        lib["pack_constants"](*[tvm.runtime.tensor(user[c["name"]]) for c in manifest["pack"]["inputs"]], *packed)
        by_name = {c["name"]: p for c, p in zip(manifest["pack"]["outputs"], packed)}
        args = [by_name[a["name"]] if a["role"] == "constant" else tvm.runtime.tensor(user[a["name"]])
                for a in manifest["args"][:-1]]
    else:
        args = [tvm.runtime.tensor(a) for a in xs]
    out = tvm.runtime.tensor(np.zeros(wl.output.shape, wl.output.dtype))
    lib["main"](*args, out)
    np.testing.assert_array_equal(out.numpy(), wl.reference(xs))


def test_catalog_dtypes():
    assert DTYPES == ("float32", "int8", "bfloat16")
    quantized = sorted(name for name, op in OPERATORS.items() if "int8" in op.dtypes)
    assert quantized == ["batch_matmul", "conv2d", "dense"]
    assert all("bfloat16" in OPERATORS[name].dtypes for name in quantized)


@pytest.mark.parametrize(("operator", "params", "dtype", "needle"), [
    ("conv3d", {"batch": 1, "in_channels": 2, "depth": 4, "height": 4, "width": 4, "out_channels": 2, "kernel": 3},
     "int8", "unsupported dtype 'int8' for conv3d; supported for conv3d: float32 (int8 is supported for conv2d, "
             "dense, batch_matmul)"),
    ("depthwise_conv2d", {"batch": 1, "channels": 4, "height": 8, "width": 8, "kernel": 3}, "bfloat16",
     "supported for depthwise_conv2d: float32 (bfloat16 is supported for conv2d, dense, batch_matmul)"),
    ("dense", DENSE, "float16", "unsupported dtype 'float16' for dense; supported for dense: float32, int8, "
                                "bfloat16; known dtypes: float32, int8, bfloat16"),
    ("conv3x3_conv1x1", {"batch": 1, "in_channels": 4, "height": 8, "width": 8, "mid_channels": 4,
                         "out_channels": 4}, "int8", "supported for conv3x3_conv1x1: float32"),
])
def test_unsupported_dtype_names_the_supported(operator, params, dtype, needle):
    with pytest.raises(WorkloadError) as e:
        validate(operator, params, dtype)
    assert e.value.field == "dtype"  # the API answers 422 with this field (service.api.jobs)
    assert needle in e.value.message


def test_int8_reduction_that_could_overflow_is_refused():
    validate("dense", {"m": 1, "n": 1, "k": INT8_MAX_REDUCTION}, "int8")
    with pytest.raises(WorkloadError, match="int32 accumulator could overflow") as e:
        validate("dense", {"m": 1, "n": 1, "k": INT8_MAX_REDUCTION + 1}, "int8")
    assert e.value.field == "params"
    validate("dense", {"m": 1, "n": 1, "k": INT8_MAX_REDUCTION + 1}, "float32")
