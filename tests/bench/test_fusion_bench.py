"""bench.fusion: a small subgraph tuned fused and unfused, each program built, timed in a fresh process of its
own, and the row's numbers and storage filled in."""

from __future__ import annotations

import math

import pytest

from bench import fusion


@pytest.mark.bench
@pytest.mark.tunes
@pytest.mark.timeout(600)
def test_a_small_subgraph_is_tuned_fused_and_unfused_and_timed(tmp_path):
    from compiler.target import resolve_target

    case = fusion.Case("tiny dw->pw", "depthwise_pointwise",
                       {"channels": 8, "height": 8, "width": 8, "out_channels": 16, "kernel": 3},
                       ({"operator": "depthwise_conv2d", "params": {"batch": 1, "channels": 8, "height": 8, "width": 8,
                                                                    "kernel": 3, "stride": 1, "padding": 1},
                         "epilogue": "relu"},
                        fusion._conv(8, 8, 8, 16, 1, 0, "relu")))
    row = fusion.run_case(case, 4, resolve_target("host"), tmp_path, seed=0, metaschedule=False)
    assert row["ours_config"] is not None and "tensorize" in row["ours_config"]
    assert set(row["programs"]) == {"ours", "unfused", "torch_eager", "torch_channels_last", "torch_compile"}
    assert len(row["programs"]["unfused"]) == 2 and None not in row["programs"]["unfused"]
    # the unfused program hands the 8 x 8 x 8 depthwise output to the pointwise conv through memory
    assert row["unfused_bytes"] == 4 * 8 * 8 * 8
    # one torch variant is enough here: each child imports torch and TVM, inductor's compile takes longer still
    del row["programs"]["torch_compile"], row["programs"]["torch_channels_last"]
    fusion.time_all([row], threads=1, seed=0)  # one round (time_fresh's medians over rounds: test_baselines)
    for key in ("ours_ms", "unfused_ms", "torch_ms"):
        assert isinstance(row[key], float) and math.isfinite(row[key]) and row[key] > 0, (key, row)
    assert row["unfused_ms"] == pytest.approx(row["times"]["unfused.0"] + row["times"]["unfused.1"])
    assert row["torch_best"] == "eager" and "programs" not in row
    assert set(row["readings"]) == {"ours", "unfused.0", "unfused.1", "torch_eager"}
    for name, readings in row["readings"].items():  # one round: its reading is the time
        assert readings == [row["times"][name]], name


def test_the_peak_bounds_what_fusion_can_gain_over_the_unfused_operators():
    # 2 GFLOP at a 400 GFLOP/s peak take 5 ms at least: unfused at 10 ms runs at half the peak, and no fused
    # program of the same multiply-adds can be more than 2x faster than it
    row = {"flops": 2_000_000_000, "ours_ms": 12.5, "unfused_ms": 10.0}
    fusion.add_peak(row, {"gflops": 400.0})
    assert row["unfused_peak_share"] == pytest.approx(0.5)
    assert row["ours_peak_share"] == pytest.approx(0.4)
    assert row["fusion_ceiling"] == pytest.approx(2.0)
    # without the peak (it failed to measure) or without a time, nothing is claimed
    missing = {"flops": 2_000_000_000, "ours_ms": None, "unfused_ms": 10.0}
    fusion.add_peak(missing, {"gflops": 400.0})
    assert missing["ours_peak_share"] is None and missing["fusion_ceiling"] == pytest.approx(2.0)
    fusion.add_peak(missing, None)
    assert missing["unfused_peak_share"] is None and missing["fusion_ceiling"] is None


def test_a_batched_case_scales_the_subgraph_and_every_part_and_its_intermediates_with_it():
    from compiler.workloads import make_workload

    conv = next(c for c in fusion.CASES if c.operator == "conv3x3_conv1x1")
    at8 = fusion.batched(conv, 8)
    assert at8.name.endswith("x8") and at8.params["batch"] == 8 and fusion.batched(conv, 1) is conv
    assert [p["params"]["batch"] for p in at8.parts] == [8, 8]
    assert make_workload(at8.operator, at8.params).flops == 8 * make_workload(conv.operator, conv.params).flops
    attention = fusion.batched(next(c for c in fusion.CASES if c.operator == "matmul_softmax_matmul"), 4)
    assert attention.params["heads"] == 48  # batch x heads, as the subgraph takes them
    assert [p["params"]["batch"] if "params" in p else p["shape"][0] for p in attention.parts] == [48, 48, 48]


def test_the_memory_bandwidth_is_measured_beyond_the_caches():
    from bench.ops import measure_bandwidth

    found = measure_bandwidth("host")
    assert found is not None and found["megabytes"] == 256 and found["cores"] >= 1
    assert 0.1 < found["gbs"] < 10_000  # GB/s: a number, not a failure or a cache's speed in a unit off by 1000
