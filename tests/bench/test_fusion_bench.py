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
