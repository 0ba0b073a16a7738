"""bench.tensorize: the suite holds the paper's non-divisible shapes in every dtype, a case is built every way,
checked against numpy and timed in processes of their own, and the table names the target."""

from __future__ import annotations

from bench.tensorize import CASES, QUICK, Case, run, summarize, table


def test_suite_covers_the_dtypes_and_shapes_asked_for():
    kinds = {(c.kind, c.dtype) for c in CASES}
    for dtype in ("float32", "int8", "bfloat16"):
        assert ("gemm", dtype) in kinds and ("conv2d", dtype) in kinds
    assert {"add", "sub", "mul", "relu"} <= {c.kind for c in CASES}
    assert any(c.params == {"m": 512, "n": 512, "k": 512} for c in CASES), "the 512^3 GEMM of the peak target"
    assert any(c.params.get("h") == 55 and 255 in (c.params["c"], c.params["f"]) for c in CASES)
    assert len({c.name for c in CASES}) == len(CASES), "case names are unique"
    assert len(QUICK) <= 4


def test_the_peak_loop_runs():
    from bench.tensorize import peak_gflops
    from compiler.target import resolve_target

    peak = peak_gflops(resolve_target("host"), repeat=1, min_repeat_ms=1, iterations=1000)
    assert peak["gflops"] > 0 and peak["cores"] >= 1 and peak["lanes"] in (4, 8, 16)


def test_one_small_case_is_built_checked_and_timed():
    # two variants built and checked, one timed in a process of its own (each process starts TVM: seconds)
    case = Case("gemm_bf16_tiny", "gemm", "bfloat16", {"m": 9, "n": 20, "k": 11})
    report = run([case], ms_budget=0, repeat=1, min_repeat_ms=1, log=lambda _: None, torch=False,
                 variants=("ours",), peak={"gflops": 100.0, "cores": 1, "lanes": 16, "instruction": "x"})
    (row,) = report["rows"]
    assert "error" not in row, row
    assert row["instructions"], row
    assert row["ours_correct"] and row["ours_ms"] > 0, row
    assert "plain_ms" not in row
    text = table(report)
    assert "gemm_bf16_tiny" in text and report["target"].startswith("llvm -mcpu=") and report["target"] in text


def test_summary_takes_geomeans_and_the_share_of_peak():
    rows = [{"name": "a", "kind": "gemm", "dtype": "float32", "speedup_vs_plain": 2.0, "ours_gflops": 50.0},
            {"name": "b", "kind": "add", "dtype": "float32", "speedup_vs_plain": 0.5, "ours_correct": False}]
    s = summarize(rows, {"gflops": 100.0})
    assert s["geomean_vs_plain"] == 1.0 and s["max_vs_plain"] == 2.0
    assert s["fp32_gemm_share_of_peak"] == {"a": 0.5} and s["wrong"] == ["b"]


def test_an_update_replaces_the_rows_it_measured_and_recomputes_the_summary():
    import pytest

    from bench.tensorize import update

    peak = {"gflops": 100.0}
    base = {"target": "llvm -mcpu=x", "peak": peak, "environment": {"commit": "a"},
            "rows": [{"name": "a", "kind": "gemm", "dtype": "float32", "speedup_vs_plain": 2.0, "ours_gflops": 50.0},
                     {"name": "b", "kind": "gemm", "dtype": "float32", "speedup_vs_plain": 1.0, "ours_gflops": 20.0}]}
    base["summary"] = summarize(base["rows"], peak)
    new = {"target": "llvm -mcpu=x", "environment": {"commit": "b"},
           "rows": [{"name": "b", "kind": "gemm", "dtype": "float32", "speedup_vs_plain": 8.0, "ours_gflops": 80.0}]}
    out = update(base, new)
    assert [r["name"] for r in out["rows"]] == ["a", "b"] and out["rows"][1]["ours_gflops"] == 80.0
    assert out["summary"]["geomean_vs_plain"] == 4.0 and out["summary"]["fp32_gemm_share_of_peak"]["b"] == 0.8
    assert out["updates"] == [{"cases": ["b"], "environment": {"commit": "b"}}] and out["peak"] is peak
    assert base["rows"][1]["ours_gflops"] == 20.0  # the base report itself is not changed
    broken = update(base, {**new, "rows": [{"name": "a", "kind": "gemm", "dtype": "float32", "error": "E: x"}]})
    assert broken["rows"] == base["rows"] and broken["updates"][0] == {
        "cases": [], "environment": {"commit": "b"}, "failed": {"a": "E: x"}}  # a failed case keeps its row
    with pytest.raises(ValueError, match="cannot update"):
        update(base, {**new, "target": "llvm -mcpu=y"})
