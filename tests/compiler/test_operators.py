"""Every catalog operator, built untransformed for the host, against torch."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from compiler.workloads import EPILOGUES, OPERATORS, make_workload, validate

from compiler_cases import SMALL


def run_host(workload, target, inputs):
    """Builds the untransformed prim_func and runs it once on the inputs."""
    import tvm

    from compiler.build import build

    lib = build(tvm.IRModule({"main": workload.prim_func}), target)
    out = tvm.runtime.tensor(np.zeros(workload.output.shape, workload.output.dtype))
    lib["main"](*[tvm.runtime.tensor(a) for a in inputs], out)
    return out.numpy()


def test_small_cases_cover_the_catalog():
    assert set(SMALL) == set(OPERATORS)


@pytest.mark.parametrize("epilogue", ["none", "bias_relu"])
@pytest.mark.parametrize("operator", sorted(OPERATORS))
def test_operator_matches_torch(operator, epilogue, host_target):
    workload = make_workload(operator, SMALL[operator], epilogue=epilogue)
    inputs = workload.random_inputs(seed=3)
    expected = workload.reference(inputs)
    assert expected.shape == workload.output.shape
    np.testing.assert_allclose(run_host(workload, host_target, inputs), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    ("operator", "params", "epilogue"),
    [
        ("conv2d", SMALL["conv2d"], "bias"),
        ("dense", SMALL["dense"], "relu"),
        ("batch_matmul", SMALL["batch_matmul"], "bias"),
        # the stride-phase form: a kernel the stride does not divide (guarded taps), padding past
        # kernel - 1 (torch allows it), groups 1
        ("conv2d_transpose", dict(SMALL["conv2d_transpose"], groups=1, stride=3, output_padding=2), "none"),
        ("conv2d_transpose", dict(SMALL["conv2d_transpose"], groups=1, kernel=3, stride=2, padding=3), "bias"),
        ("conv2d_transpose", dict(SMALL["conv2d_transpose"], groups=1, kernel=4, stride=2, padding=1,
                                  output_padding=1), "relu"),
        ("depthwise_conv2d", dict(SMALL["depthwise_conv2d"], stride=2), "bias"),
    ],
)
def test_more_variants_match_torch(operator, params, epilogue, host_target):
    workload = make_workload(operator, params, epilogue=epilogue)
    inputs = workload.random_inputs(seed=5)
    np.testing.assert_allclose(
        run_host(workload, host_target, inputs), workload.reference(inputs), rtol=1e-4, atol=1e-4
    )


def test_catalog_entries_are_well_formed():
    for op in OPERATORS.values():
        assert op.description and "\n" not in op.description, op.name
        names = [p.name for p in op.params]
        assert len(names) == len(set(names)), op.name
        for p in op.params:
            assert p.description, (op.name, p.name)
            assert p.minimum <= p.maximum, (op.name, p)
            assert p.default is None or p.minimum <= p.default <= p.maximum, (op.name, p)
    assert EPILOGUES == ("none", "bias", "relu", "bias_relu",
                         "requantize", "bias_requantize", "relu_requantize", "bias_relu_requantize")


def test_defaults_are_filled():
    assert validate("dilated_conv2d", SMALL["dilated_conv2d"])["dilation"] == 2
    conv = validate("conv2d", SMALL["conv2d"])
    assert conv["dilation"] == 1 and conv["stride"] == 2 and conv["padding"] == 1
    assert list(conv) == [p.name for p in OPERATORS["conv2d"].params]


def test_key_is_canonical():
    params = dict(batch=1, in_channels=8, height=6, width=6, out_channels=8, kernel=3)
    a = make_workload("conv2d", params)
    b = make_workload("conv2d", dict(reversed(list(params.items())), stride=1, padding=0))
    assert a.key == b.key and a == b and hash(a) == hash(b)
    assert a.key == (
        "conv2d[batch=1,dilation=1,height=6,in_channels=8,kernel=3,out_channels=8,"
        "padding=0,stride=1,width=6]:float32:none"
    )
    assert make_workload("conv2d", params, epilogue="relu").key != a.key


def test_shapes_and_flops():
    w = make_workload(
        "conv2d",
        dict(batch=1, in_channels=64, height=56, width=56, out_channels=64, kernel=3, padding=1),
        epilogue="bias_relu",
    )
    assert [s.name for s in w.inputs] == ["data", "weight", "bias"]
    assert [s.shape for s in w.inputs] == [(1, 64, 56, 56), (64, 64, 3, 3), (64,)]
    assert w.output.shape == (1, 64, 56, 56)
    out = 64 * 56 * 56
    assert w.flops == 2 * out * 64 * 9 + 2 * out
    gemm = make_workload("dense", dict(m=512, n=256, k=128), epilogue="bias")
    assert gemm.inputs[1].shape == (256, 128) and gemm.inputs[2].shape == (256,)
    assert gemm.flops == 2 * 512 * 256 * 128 + 512 * 256
    t = make_workload("conv2d_transpose", dict(batch=1, in_channels=64, height=28, width=28, out_channels=32,
                                               kernel=4, stride=2, padding=1))
    assert t.output.shape == (1, 32, 56, 56) and t.inputs[1].shape == (64, 32, 4, 4)


def test_prim_func_signature_and_blocks():
    w = make_workload("conv2d", SMALL["conv2d"], epilogue="bias_relu")
    func = w.prim_func
    assert func.attrs["global_symbol"] == "main"
    # the output parameter keeps the last TE stage's name ("relu"); TensorSpec calls it "output"
    assert [p.name for p in func.params] == ["data", "weight", "bias", "relu"]
    assert len(func.params) == len(w.args)
    assert w.compute_block == "conv2d_nchw"
    # block names are part of the interface the tuner schedules by name
    script = func.script()
    for block in ("pad_temp", "conv2d_nchw", "bias_add", "relu"):
        assert f'T.sblock("{block}")' in script, block
    assert make_workload("conv2d", SMALL["conv2d"], epilogue="bias_relu").prim_func.script() == script


def test_random_inputs_are_reproducible():
    w = make_workload("dense", SMALL["dense"], epilogue="bias")
    a, b = w.random_inputs(seed=7), w.random_inputs(seed=7)
    assert [x.shape for x in a] == [s.shape for s in w.inputs]
    for x, y in zip(a, b):
        assert x.dtype == np.float32
        np.testing.assert_array_equal(x, y)
        assert x.min() >= -1.0 and x.max() < 1.0
    assert not np.array_equal(a[0], w.random_inputs(seed=8)[0])


def test_catalog_imports_without_tvm_or_torch():
    code = (
        "import sys; from compiler.workloads import make_workload; "
        "w = make_workload('dense', {'m': 4, 'n': 4, 'k': 4}); "
        "assert 'tvm' not in sys.modules and 'torch' not in sys.modules, w.key"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


MAIN_BLOCKS = {
    "conv2d": "conv2d_nchw",
    "dilated_conv2d": "conv2d_nchw",
    "group_conv2d": "group_conv2d_nchw",
    "depthwise_conv2d": "DepthwiseConv2d",
    "conv1d": "conv1d_ncw",
    "conv3d": "conv3d_ncdhw",
    "conv2d_transpose": "conv2d_transpose_nchw",
    "dense": "T_matmul_NT",
    "batch_matmul": "T_batch_matmul_NN",
}


@pytest.mark.parametrize("operator", sorted(OPERATORS))
def test_main_block_names_are_documented(operator):
    """The names in docs/design.md's operator table."""
    assert make_workload(operator, SMALL[operator]).compute_block == MAIN_BLOCKS[operator]


@pytest.mark.parametrize(("kernel", "stride"), [(4, 2), (3, 1), (6, 3)])
def test_transposed_conv_multiplies_no_zeros(kernel, stride):
    """A stride the kernel divides: ours runs stride**2 times fewer multiply-adds than topi's definition,
    which dilates the input with zeros (and both give torch's numbers: test_operator_matches_torch)."""
    from tvm import s_tir

    def multiply_adds(func, block_name):
        sch = s_tir.Schedule(func)
        block = sch.get(sch.get_sblock(block_name))
        return int(np.prod([int(iv.dom.extent) for iv in block.iter_vars]))

    params = dict(batch=1, in_channels=4, height=5, width=5, out_channels=6, kernel=kernel, stride=stride,
                  padding=kernel - stride)
    w = make_workload("conv2d_transpose", params)
    ours = multiply_adds(w.prim_func, w.compute_block)
    topi = multiply_adds(w.topi_prim_func, "compute")
    assert ours * stride**2 == topi
    # the MetaSchedule baseline's program (bench.ops) computes the same
    import tvm

    inputs = w.random_inputs(seed=1)
    out = tvm.runtime.tensor(np.zeros(w.output.shape, w.output.dtype))
    tvm.compile(w.topi_prim_func, "llvm")(*[tvm.runtime.tensor(a) for a in inputs], out)
    np.testing.assert_allclose(out.numpy(), w.reference(inputs), rtol=1e-4, atol=1e-4)
