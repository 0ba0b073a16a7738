"""bench.ops: the smoke suite end to end, and the report helpers without tuning."""

from __future__ import annotations

import json
import math
import re

import pytest

from bench import common, ops


def _finite(value) -> bool:
    return isinstance(value, float) and math.isfinite(value) and value > 0


@pytest.mark.bench
@pytest.mark.tunes
@pytest.mark.timeout(600)
def test_smoke_suite_writes_a_correct_report(tmp_path, capsys):
    """Ours, MetaSchedule (weights layout-free) and torch's variants on the smoke conv at budget 4, every
    program timed in a fresh process of its own (ALT-OL left out: it is ours again, in a fixed layout, and the
    fresh processes cost what it saves). The suite's only MetaSchedule run: a weight it rewrites is packed
    beforehand and the program still checked correct, and its run folder is kept under --work-dir."""
    path = tmp_path / "smoke.json"
    work = tmp_path / "ms"

    # one case: the conv has every torch variant (the dense case adds nothing the test checks, only minutes)
    assert ops.main(["--suite", "smoke", "--cases", "conv2d_tiny", "--budget", "4", "--json", str(path),
                     "--no-loop-only", "--work-dir", str(work)]) == 0

    report = json.loads(path.read_text())
    common.check_report(report)
    assert report["suite"] == "smoke"
    assert report["budget"] == 4
    assert report["target"].startswith("llvm -mcpu=")
    assert [c["name"] for c in report["cases"]] == ["conv2d_tiny"]
    for case in report["cases"]:
        assert case["correct"] is True, case.get("error") or case.get("metaschedule_error")
        for key in ("ours_ms", "metaschedule_ms", "torch_ms", "untuned_ms", "ours_tune_s", "metaschedule_tune_s"):
            assert _finite(case[key]), f"{case['name']}.{key} = {case[key]!r}"
        assert case["ours_trials"] <= 4 and case["metaschedule_trials"] <= 4
        assert _finite(case["ours_final_ms"]) and "ours_loop_only_ms" not in case
        # the commit each row ran on (HEAD may move during a run in a shared checkout: a format check)
        assert re.fullmatch(r"[0-9a-f]{7,40}(\+dirty)?", case["commit"]), case["commit"]
        variants = case["torch_variants_ms"]  # channels_last only where the data has channels
        assert list(variants) == (["eager", "channels_last", "compile"] if case["operator"] == "conv2d"
                                  else ["eager", "compile"])
        assert all(_finite(ms) for ms in variants.values()), variants
        assert case["torch_ms"] == min(variants.values()) == variants[case["torch_best"]]
        # the weight may go in another layout, packed beforehand; the data always goes in as it is
        assert set(case["metaschedule_rewritten"]) <= {"weight"}, case["metaschedule_rewritten"]
        # each program once, in a fresh process, in shuffled order
        assert case["timing"] == "fresh-process"
        assert sorted(case["timing_order"]) == sorted(["ours", "metaschedule", *(f"torch_{v}" for v in variants)])
    assert _finite(report["geomean"]["vs_metaschedule"]) and _finite(report["geomean"]["vs_torch"])
    # the machine's fp32 FMA peak, measured once, and the pick's share of it
    peak = report["peak"]["gflops"]
    assert _finite(peak) and report["peak"]["cores"] >= 1
    (case,) = report["cases"]
    assert case["ours_peak_share"] == pytest.approx(case["flops"] / case["ours_ms"] / 1e6 / peak)
    # a fresh MetaSchedule run folder under --work-dir, with its logs
    (run_dir,) = [d for d in work.iterdir() if (d / "logs").is_dir()]
    assert (run_dir / "logs" / "console.log").exists()
    out = capsys.readouterr().out
    assert "geomean" in out and "conv2d_tiny" in out and str(path) in out
    assert f"measured FMA peak, {peak:.0f} GFLOP/s" in out and f"{100 * case['ours_peak_share']:.0f}%" in out

    # --retime: the pick rebuilt from the report's configuration and timed again with torch (eager here), two
    # rounds, nothing searched; MetaSchedule's schedule is not in the report, so its reading is the run's
    again = tmp_path / "retimed.json"
    assert ops.main(["--retime", str(path), "--rounds", "2", "--torch-variants", "eager", "--json", str(again)]) == 0
    retimed = json.loads(again.read_text())
    common.check_report(retimed)
    (row,) = retimed["cases"]
    (before,) = report["cases"]
    assert row["retimed"] == ["ours", "torch_eager"] and row["rounds"] == 2 and row["correct"] is True
    assert sorted(row["timing_order"]) == ["ours", "ours", "torch_eager", "torch_eager"]
    assert _finite(row["ours_ms"]) and list(row["torch_variants_ms"]) == ["eager"]
    assert row["vs_torch"] == pytest.approx(row["torch_ms"] / row["ours_ms"])
    assert row["metaschedule_ms"] == before["metaschedule_ms"] and row["config"] == before["config"]
    assert row["ours_tune_s"] == before["ours_tune_s"]  # the search's own record stays


def test_retime_refuses_a_report_of_another_cpu(tmp_path, capsys):
    report = {"suite": "smoke", "target": "llvm -mcpu=cortex-a72 -num-cores=2", "budget": 4, "budgets": [4],
              "cases": [_case("a", 1.0, 2.0, 0.5)], "geomean": common.geomeans([_case("a", 1.0, 2.0, 0.5)])}
    path = tmp_path / "arm.json"
    path.write_text(json.dumps(report))
    with pytest.raises(SystemExit):
        ops.main(["--retime", str(path)])
    assert "measured on 'llvm -mcpu=cortex-a72" in capsys.readouterr().err


def _case(name: str, ours: float | None, ms: float | None, torch: float | None) -> dict:
    return {"name": name, "ours_ms": ours, "metaschedule_ms": ms, "torch_ms": torch, "ours_tune_s": 1.0,
            "metaschedule_tune_s": 2.0 if ms else None, "layout": None, "correct": ours is not None}


def test_geomean_is_over_per_case_ratios_and_skips_missing():
    cases = [_case("a", 1.0, 2.0, 0.5), _case("b", 2.0, 8.0, None), _case("c", None, 1.0, 1.0)]
    g = common.geomeans(cases)
    assert g["vs_metaschedule"] == pytest.approx(math.sqrt(2.0 * 4.0))
    assert g["vs_torch"] == pytest.approx(0.5)
    assert common.geomean([]) is None


def test_check_report_names_the_bad_field():
    report = {"suite": "s", "target": "llvm", "budget": 4, "cases": [_case("a", 1.0, 2.0, 0.5)],
              "geomean": common.geomeans([_case("a", 1.0, 2.0, 0.5)])}
    common.check_report(report)
    report["cases"][0]["torch_variants_ms"] = {"eager": 1.0, "channels_last": None, "compile": 0.5}
    common.check_report(report)
    report["cases"][0]["torch_variants_ms"]["nchw"] = 1.0
    with pytest.raises(ValueError, match=r"cases\[0\]\.torch_variants_ms\.nchw"):
        common.check_report(report)
    del report["cases"][0]["torch_variants_ms"]
    del report["cases"][0]["layout"]
    with pytest.raises(ValueError, match=r"cases\[0\]\.layout"):
        common.check_report(report)


def test_write_json_defaults_under_results(tmp_path, monkeypatch):
    monkeypatch.setattr(common, "RESULTS_DIR", tmp_path / "results")
    report = {"suite": "smoke", "target": "llvm", "budget": 4, "cases": [], "geomean": common.geomeans([])}
    path = common.write_json(report)
    assert path.parent == tmp_path / "results" and path.name.startswith("ops-smoke-")
    assert json.loads(path.read_text()) == report


def test_table_has_one_row_per_case_and_a_geomean():
    cases = [_case("a", 1.0, 2.0, 0.5) | {"untuned_ms": 10.0}]
    report = {"suite": "s", "target": "llvm", "budget": 4, "cases": cases, "geomean": common.geomeans(cases)}
    text = ops.table(report)
    assert "2.00x" in text and "0.50x" in text and text.count("\na ") == 1 and "geomean" in text


def test_suites_are_valid_workloads():
    from compiler.workloads import make_workload

    assert len(ops.SUITES["quick"][0]) == 8
    assert len({c.operator for c in ops.SUITES["quick"][0]}) == 8
    for cases, _ in ops.SUITES.values():
        assert len({c.name for c in cases}) == len(cases)
        for case in cases:
            make_workload(case.operator, case.params, case.dtype, case.epilogue)
    full = ops.SUITES["full"][0]
    assert all(sum(c.operator == op for c in full) == 3 for op in {c.operator for c in full})


def test_select_rejects_unknown_cases():
    assert [c.name for c in ops.select("quick", ["gemm_512", "conv2d_resnet"])] == ["gemm_512", "conv2d_resnet"]
    with pytest.raises(ValueError, match="nope"):
        ops.select("quick", ["nope"])


def test_spec_file_is_validated_like_the_api(tmp_path):
    spec = {"kind": "operator", "operator": "dense", "params": {"m": 8, "n": 8, "k": 8}, "dtype": "float32",
            "epilogue": "relu", "target": "host", "budget": 16, "seed": 3}
    path = tmp_path / "specs.json"
    path.write_text(json.dumps([spec]))
    (case,) = ops.load_specs(path)
    assert (case.case.operator, case.case.epilogue, case.budget, case.seed) == ("dense", "relu", 16, 3)

    path.write_text(json.dumps([spec | {"bogus": 1}]))
    with pytest.raises(ValueError, match=r"spec \[0\]"):
        ops.load_specs(path)
    path.write_text(json.dumps([spec | {"params": {"m": 8}}]))
    with pytest.raises(ValueError, match="params.n"):
        ops.load_specs(path)


class _Stopped(Exception):
    pass


def _fake_run_case(calls: list, stop_at: str | None = None):
    """A stand-in for `ops.run_case` that records its calls and stops the run at `stop_at`."""

    def run_case(case, target_name, budget, seed, options):
        if case.name == stop_at:
            raise _Stopped(case.name)
        calls.append((case.name, budget, options.layout_levels))
        return _case(case.name, 1.0, 2.0, 4.0)

    return run_case


@pytest.fixture
def no_peak(monkeypatch):
    """Runs of fake cases measure no FMA peak (a compile and a process of their own each)."""
    monkeypatch.setattr(ops, "measure_peak", lambda target: None)


def test_peak_share_is_of_float32_picks_only():
    peak = {"gflops": 100.0}
    key = "dense[k=8,m=8,n=8]:{}:none"
    fp32 = {"name": "a", "correct": True, "flops": 2e6, "workload_key": key.format("float32"), "ours_ms": 0.04,
            "ablation_xgb_ms": 0.08, "ours_loop_only_ms": None}
    int8 = {"name": "b", "correct": True, "flops": 2e6, "workload_key": key.format("int8"), "ours_ms": 0.01}
    report = ops.report("quick", "llvm", [4], [fp32, int8], env={}, peak=peak)
    assert report["peak"] == peak
    assert fp32["ours_peak_share"] == pytest.approx(0.5)  # 2e6 flops in 0.04 ms: 50 GFLOP/s
    assert fp32["ablation_xgb_peak_share"] == pytest.approx(0.25)
    assert fp32["ours_loop_only_peak_share"] is None
    assert int8["ours_peak_share"] is None  # int8 operations against an fp32 peak would say nothing
    assert "50%" in ops.table(report) and "measured FMA peak, 100 GFLOP/s" in ops.table(report)
    ops.report("quick", "llvm", [4], [fp32], env={})
    assert fp32["ours_peak_share"] is None


def test_a_stopped_run_keeps_its_finished_cases_and_resume_runs_only_the_rest(tmp_path, monkeypatch, no_peak):
    path = tmp_path / "quick.json"
    names = ["gemm_512", "conv1d", "conv2d_resnet"]
    calls: list = []
    monkeypatch.setattr(ops, "run_case", _fake_run_case(calls, stop_at="conv1d"))
    with pytest.raises(_Stopped):
        ops.main(["--suite", "quick", "--cases", ",".join(names), "--budget", "4", "--json", str(path)])
    assert [c["name"] for c in json.loads(path.read_text())["cases"]] == ["gemm_512"]

    calls.clear()
    monkeypatch.setattr(ops, "run_case", _fake_run_case(calls))
    assert ops.main(["--suite", "quick", "--cases", ",".join(names), "--budget", "4", "--json", str(path),
                     "--resume", "--layout-levels", "2"]) == 0
    assert calls == [("conv1d", 4, 2), ("conv2d_resnet", 4, 2)]  # gemm_512 not again; layout levels reach the case
    report = json.loads(path.read_text())
    common.check_report(report)
    assert [c["name"] for c in report["cases"]] == names
    assert report["geomean"]["vs_metaschedule"] == pytest.approx(2.0)

    with pytest.raises(SystemExit):  # a report of another budget is not this run's to go on with
        ops.main(["--suite", "quick", "--cases", "conv1d", "--budget", "8", "--json", str(path), "--resume"])
    with pytest.raises(SystemExit):
        ops.main(["--suite", "quick", "--resume"])



def test_resume_with_other_cases_adds_them_and_keeps_the_report_s_own(tmp_path, monkeypatch, no_peak):
    # the full suite runs in pieces: `--resume --cases X` goes on with a report that holds other cases
    path = tmp_path / "full.json"
    calls: list = []
    monkeypatch.setattr(ops, "run_case", _fake_run_case(calls))
    assert ops.main(["--suite", "quick", "--cases", "gemm_512,conv1d", "--budget", "4", "--json", str(path)]) == 0
    assert ops.main(["--suite", "quick", "--cases", "conv2d_resnet,conv1d", "--budget", "4", "--json", str(path),
                     "--resume"]) == 0
    assert [c[0] for c in calls] == ["gemm_512", "conv1d", "conv2d_resnet"]  # conv1d not again
    report = json.loads(path.read_text())
    assert sorted(c["name"] for c in report["cases"]) == ["conv1d", "conv2d_resnet", "gemm_512"]

def test_merge_joins_reports_of_one_target(tmp_path, capsys):
    def report(target: str, *cases: dict) -> dict:
        return {"suite": "full", "target": target, "budget": 300, "cases": list(cases),
                "geomean": common.geomeans(cases), "environment": {"date_utc": target}}

    a = tmp_path / "a.json"
    b = tmp_path / "b.json"
    out = tmp_path / "merged.json"
    a.write_text(json.dumps(report("llvm", _case("x", 1.0, 2.0, 1.0), _case("y", 1.0, 1.0, 1.0))))
    b.write_text(json.dumps(report("llvm", _case("y", 1.0, 8.0, 1.0))))

    assert ops.main(["--merge", str(a), str(b), "--json", str(out)]) == 0
    merged = json.loads(out.read_text())
    assert [c["name"] for c in merged["cases"]] == ["x", "y"]
    assert merged["geomean"]["vs_metaschedule"] == pytest.approx(4.0)  # y from the later report: 8x
    assert "4.00x" in capsys.readouterr().out

    b.write_text(json.dumps(report("llvm -mcpu=znver4", _case("z", 1.0, 2.0, 1.0))))
    with pytest.raises(SystemExit):
        ops.main(["--merge", str(a), str(b), "--json", str(out)])


def test_no_seeds_reaches_every_search_of_ours_and_the_ablation_table_says_so(monkeypatch, no_peak, tmp_path):
    import tuner.operator
    from tuner.task import TuneResult

    calls: list = []

    def fake_tune(task, budget, **options):  # every search of ours: ALT, ALT-OL, (a), (b); nothing correct
        calls.append(options)
        return TuneResult(None, [], None)

    monkeypatch.setattr(tuner.operator, "tune", fake_tune)  # tune_operator calls the `tune` it imported
    path = tmp_path / "ablation.json"
    assert ops.main(["--suite", "quick", "--cases", "gemm_512", "--budget", "4", "--ablation", "--no-seeds",
                     "--no-metaschedule", "--no-torch", "--no-untuned", "--json", str(path)]) == 0
    assert len(calls) == 4 and all(c["seeds"] is False for c in calls)
    assert {c.get("cost_model") for c in calls} == {None, "random"} and sum(c.get("ppo") is False for c in calls) == 2
    report = json.loads(path.read_text())
    assert report["cases"][0]["seeds"] is False
    assert "no seeds in any search" in ops.ablation_table(report)
    report["cases"][0]["seeds"] = True
    assert "the same seeds" in ops.ablation_table(report)
