"""bench.licm: the suite is the size the issue asks for, a case is built three ways and checked, each build
timed in a process of its own, and the summary counts what it says it counts."""

from __future__ import annotations

import pytest

from bench.licm import CASES, OPERATORS, VARIANTS, Case, run, summarize, table


def test_suite_covers_the_topi_operators_asked_for():
    assert len(CASES) >= 150 and len({c.operator for c in CASES}) >= 20
    assert set(OPERATORS) >= {"conv2d_nchw", "conv2d_nhwc", "conv3d_ncdhw", "depthwise_nchw", "group_conv2d",
                              "conv2d_transpose", "dense", "batch_matmul", "pool2d", "resize2d", "reduce",
                              "softmax", "layout_transform"}
    assert len({c.name for c in CASES}) == len(CASES), "case names are unique"


@pytest.mark.bench
def test_one_case_is_built_three_ways_checked_and_timed():
    case = Case("pad_small", "pad", {"n": 1, "c": 4, "size": 8, "pad": 1})
    report = run([case], layouts=False, repeat=1, min_repeat_ms=1, log=lambda _: None)
    (row,) = report["topi"]
    assert "error" not in row, row
    assert all(row[f"{v}_ms"] > 0 for v in VARIANTS)
    assert row["licm_correct"] and row["hoist-expression_correct"], row
    assert row["licm_speedup"] == row["default_ms"] / row["licm_ms"]
    assert report["target"].startswith("llvm -mcpu=")
    assert "pad_small" in table(report) and report["summary"]["topi"]["licm"]["timed"] == 1


def test_summary_counts_cases_outside_the_noise_band_and_per_operator():
    rows = [{"name": "a", "operator": "x", "licm_speedup": 1.2, "changed": True, "licm_correct": True},
            {"name": "b", "operator": "x", "licm_speedup": 1.005, "changed": True, "licm_correct": True},
            {"name": "c", "operator": "y", "licm_speedup": 0.9, "changed": False, "licm_correct": False},
            {"name": "d", "operator": "z", "error": "BuildError: no"}]
    s = summarize(rows, "licm")
    assert (s["cases"], s["timed"], s["changed"], s["faster"], s["slower"], s["wrong"], s["failed"]) == (4, 3, 2, 1, 1,
                                                                                                          1, 1)
    assert s["max"] == 1.2 and s["min"] == 0.9 and abs(s["geomean"] - (1.2 * 1.005 * 0.9) ** (1 / 3)) < 1e-12
    assert s["operators_faster"] == ["x"] and s["operators_slower"] == ["y"] and s["operators"] == 2
