"""The baselines: MetaSchedule at a tiny budget, torch, the untuned program."""

from __future__ import annotations

import math
import os

import pytest

from bench.baselines import (Baseline, TorchTimer, interleaved_ms, metaschedule, torch_latency, torch_output,
                             untuned_latency)

TINY_DENSE = {"m": 16, "n": 16, "k": 16}


def _workload(operator: str, params: dict, epilogue: str = "none"):
    from compiler.workloads import make_workload

    return make_workload(operator, params, epilogue=epilogue)


def _host():
    from compiler.target import resolve_target

    return resolve_target("host")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_metaschedule_tiny_dense_is_correct_and_uses_the_budget(tmp_path):
    wl = _workload("dense", TINY_DENSE)
    inputs = wl.random_inputs()

    result = metaschedule(wl.prim_func, _host(), 4, tmp_path, inputs=inputs, expected=wl.reference(inputs))

    assert isinstance(result, Baseline)
    assert result.error is None, result.error
    assert result.correct is True
    assert result.latency_ms is not None and math.isfinite(result.latency_ms) and result.latency_ms > 0
    assert result.tune_s > 0
    assert result.mod is not None
    assert 1 <= result.trials <= 4, f"{result.trials=}"
    # a fresh run folder under the given work_dir, with MetaSchedule's logs in it
    run_dirs = list(tmp_path.iterdir())
    assert [str(d) for d in run_dirs] == [result.work_dir]
    assert (run_dirs[0] / "logs" / "console.log").exists()


def test_torch_latency_is_finite():
    ms = torch_latency(_workload("dense", TINY_DENSE), repeat=3, min_repeat_ms=5)
    assert math.isfinite(ms) and ms > 0


def test_torch_timer_reads_in_a_process_of_its_own():
    wl = _workload("dense", TINY_DENSE)
    with TorchTimer(wl, min_repeat_ms=5) as timer:
        readings = [timer(), timer()]
        child = timer._pool.submit(os.getpid).result()
    assert all(math.isfinite(ms) and ms > 0 for ms in readings)
    assert child != os.getpid()


def test_interleaved_timers_are_taken_in_turn_and_give_their_medians():
    calls = []

    def timer(name, values):
        values = iter(values)
        return lambda: calls.append(name) or next(values)

    result = interleaved_ms({"a": timer("a", [3.0, 1.0, 2.0]), "b": timer("b", [10.0, 30.0, 20.0])}, rounds=3,
                            settle_s=0)
    assert result == {"a": 2.0, "b": 20.0}
    assert calls == ["a", "b"] * 3


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

    wl = _workload(operator, params, epilogue)
    inputs = wl.random_inputs()
    np.testing.assert_allclose(torch_output(wl, inputs), wl.reference(inputs), rtol=1e-5, atol=1e-5)
