"""The baselines: torch and its variants, the untuned program, and timing each program in a fresh process in
shuffled order (MetaSchedule, with its constants layout-free, runs in test_ops' smoke suite)."""

from __future__ import annotations

import math
import os

import pytest

from bench import common
from bench.baselines import torch_operator, torch_output, untuned_latency

TINY_DENSE = {"m": 16, "n": 16, "k": 16}


def _workload(operator: str, params: dict, epilogue: str = "none", dtype: str = "float32"):
    from compiler.workloads import make_workload

    return make_workload(operator, params, dtype, epilogue)


def _host():
    from compiler.target import resolve_target

    return resolve_target("host")


def test_time_fresh_times_each_program_once_per_round_in_shuffled_order(monkeypatch):
    spawned = []

    def fake_in_fresh_process(fn, program, *args, log=None):
        spawned.append(program.lib_path)
        return {"a": 1.0, "b": 2.0, "c": None}[program.lib_path] if len(spawned) <= 3 else 3.0

    monkeypatch.setattr(common, "in_fresh_process", fake_in_fresh_process)
    programs = {name: common.TvmProgram(name) for name in "abc"}
    timings = common.time_fresh(programs, seed=1, rounds=2)
    assert sorted(spawned[:3]) == sorted(spawned[3:]) == ["a", "b", "c"], "each round times each program once"
    assert timings.order == spawned
    assert timings.ms == {"a": 2.0, "b": 2.5, "c": 3.0}, "the median of each program's readings; failures left out"
    assert timings.readings == {"a": [1.0, 3.0], "b": [2.0, 3.0], "c": [3.0]}, "every reading, in the order taken"
    orders = {tuple(common.time_fresh(programs, seed=s).order) for s in range(8)}
    assert len(orders) > 1, "the order is shuffled"


def test_a_torch_variant_is_timed_and_a_program_runs_in_a_fresh_process(monkeypatch):
    """The child's work, here in this process (the smoke suite runs every variant in fresh processes)."""
    import torch

    monkeypatch.setattr(common, "MIN_REPEAT_MS", 1.0)
    threads = torch.get_num_threads()
    try:
        program = common.TorchProgram(torch_operator, ("conv2d", {"batch": 1, "in_channels": 4, "height": 8,
                                                                   "width": 8, "out_channels": 4, "kernel": 3},
                                                       "float32", "bias"), "channels_last")
        ms = common.time_torch(program, 1)
    finally:
        torch.set_num_threads(threads)
    assert math.isfinite(ms) and ms > 0
    with pytest.raises(ValueError, match="unknown torch variant"):
        common.time_torch(common.TorchProgram(program.factory, program.args, "nchw"), 1)
    assert common.in_fresh_process(os.getpid) != os.getpid()


def test_untuned_latency_is_finite():
    wl = _workload("dense", TINY_DENSE)
    ms = untuned_latency(wl.prim_func, _host(), wl.random_inputs(), repeat=2)
    assert math.isfinite(ms) and ms > 0


@pytest.mark.parametrize(
    ("operator", "params", "epilogue"),
    [
        ("conv2d", {"batch": 1, "in_channels": 4, "height": 8, "width": 8, "out_channels": 4, "kernel": 3,
                    "padding": 1}, "bias_relu"),
        ("group_conv2d", {"batch": 1, "in_channels": 4, "height": 6, "width": 6, "out_channels": 4, "kernel": 3,
                          "groups": 2}, "none"),
        ("depthwise_conv2d", {"batch": 1, "channels": 4, "height": 6, "width": 6, "kernel": 3, "padding": 1},
         "relu"),
        ("dilated_conv2d", {"batch": 1, "in_channels": 3, "height": 9, "width": 9, "out_channels": 2, "kernel": 3},
         "none"),
        ("conv1d", {"batch": 2, "in_channels": 3, "width": 10, "out_channels": 4, "kernel": 3}, "bias"),
        ("conv3d", {"batch": 1, "in_channels": 2, "depth": 4, "height": 4, "width": 4, "out_channels": 2,
                    "kernel": 3}, "none"),
        ("conv2d_transpose", {"batch": 1, "in_channels": 4, "height": 5, "width": 5, "out_channels": 2,
                              "kernel": 4, "stride": 2, "padding": 1}, "bias"),
        ("dense", TINY_DENSE, "bias_relu"),
        ("batch_matmul", {"batch": 2, "m": 3, "n": 4, "k": 5}, "bias"),
    ],
)
def test_torch_baseline_computes_the_workload(operator, params, epilogue):
    import numpy as np

    import torch

    wl = _workload(operator, params, epilogue)
    inputs = wl.random_inputs()
    np.testing.assert_allclose(torch_output(wl, inputs), wl.reference(inputs), rtol=1e-5, atol=1e-5)
    module, activations = torch_operator(operator, params, epilogue=epilogue)  # what the torch variants run
    assert len(activations) == 1 and len(list(module.parameters())) == len(inputs) - 1, "the constants are parameters"
    with torch.inference_mode():
        np.testing.assert_allclose(module(*activations).numpy(), wl.reference(inputs), rtol=1e-5, atol=1e-5)


def _host_has_vnni() -> bool:
    """Whether this CPU's exact int8 dot product takes groups of 4 (VNNI), as the host target says."""
    from compiler.target import resolve_target
    from compiler.workloads.model.layouts import dot_instruction

    dot = dot_instruction(resolve_target("host"), "int8")
    return dot is not None and dot[1] == 4


@pytest.mark.parametrize(("operator", "params", "epilogue"), [
    ("conv2d", {"batch": 1, "in_channels": 15, "height": 9, "width": 9, "out_channels": 20, "kernel": 3, "padding": 1,
                "stride": 2}, "bias_relu_requantize"),
    ("dense", {"m": 13, "n": 20, "k": 30}, "requantize"),
])
def test_a_requantizing_int8_operator_has_torch_ao_s_as_its_baseline(operator, params, epilogue):
    """torch.ao's quantized conv2d / linear (x86 engine) computes the requantizing int8 workload bit for bit where
    the zero point is one for all channels (torch's output zero point is per tensor); an int8 workload with the
    int32 output, which torch has no operator for, is refused."""
    import numpy as np

    import torch

    from bench.torch_operators import _torch_quantized

    wl = _workload(operator, params, epilogue, "int8")
    inputs = wl.random_inputs()
    inputs[-1][:] = inputs[-1][0]
    if not _host_has_vnni():
        # without VNNI, fbgemm multiplies with `vpmaddubsw`, whose pair sums saturate for activations >= 128
        # (what altune's jobs avoid with `vpmaddwd`): torch is exact there only on 7-bit activations
        inputs[0] //= 2
    module, activations = _torch_quantized(wl, inputs)
    with torch.inference_mode():
        out = module(*activations).int_repr().numpy()
    expected = wl.reference(inputs)
    assert len(np.unique(expected)) > 20
    np.testing.assert_array_equal(out, expected)
    module, activations = torch_operator(operator, params, "int8", epilogue)  # what bench.ops times
    assert activations[0].is_quantized and activations[0].shape == wl.inputs[0].shape
    with pytest.raises(ValueError, match="no uint8 x int8 operator with an int32 output"):
        torch_operator(operator, params, "int8", epilogue.removesuffix("requantize").rstrip("_") or "none")
