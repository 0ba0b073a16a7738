"""bench.models' ONNX Runtime side (export, check, fresh-process timing) and its columns, without tuning; a
`--quantize` run on a small model; the corpus' models, `--budgets` and the time to beat torch.compile."""

from __future__ import annotations

import math

import pytest

from bench import common, models

pytest.importorskip("onnxruntime")


def _small_cnn():
    from compiler.workloads import zoo
    from compiler.workloads.model import torch_outputs

    module, inputs = zoo.create("small_cnn", 0)
    return module, inputs, torch_outputs(module, inputs)


@pytest.mark.builds_model
@pytest.mark.bench
def test_onnxruntime_program_is_checked_then_timed_in_a_fresh_process(tmp_path):
    module, inputs, expected = _small_cnn()
    facts, program = models.onnxruntime_program(module, inputs, expected, tmp_path)
    assert facts["onnxruntime_correct"] is True and facts["onnxruntime_error"] is None, facts
    assert isinstance(program, common.OnnxProgram) and (tmp_path / "model.onnx").stat().st_size > 0
    timings = common.time_fresh({"onnxruntime": program}, threads=1)
    ms = timings.ms["onnxruntime"]
    assert timings.order == ["onnxruntime"] and math.isfinite(ms) and ms > 0


def test_onnxruntime_that_disagrees_with_torch_is_not_timed(tmp_path):
    module, inputs, expected = _small_cnn()
    facts, program = models.onnxruntime_program(module, inputs, [e + 1.0 for e in expected], tmp_path)
    assert program is None and facts["onnxruntime_correct"] is False
    assert facts["onnxruntime_error"].startswith("ONNX Runtime: "), facts


def test_the_table_has_onnxruntime_columns_and_its_geomean():
    row = {"name": "net", "ours_ms": 2.0, "metaschedule_ms": 4.0, "torch_ms": 3.0, "onnxruntime_ms": 5.0,
           "ours_tune_s": 1.0, "metaschedule_tune_s": 1.0, "layout": "blocked", "correct": True,
           "ours_correct": True, "vs_onnxruntime": 2.5, "onnxruntime_error": None}
    report = {"suite": "models", "target": "llvm -mcpu=x", "budget": 4, "cases": [row],
              "geomean": common.geomeans([row]) | {"vs_onnxruntime": 2.5}}
    common.check_report(report)
    text = models.table(report)
    head, _, line, *_ = text.splitlines()[1:]
    assert "ORT ms" in head and "vs ORT" in head
    assert "5.000" in line or "5.00" in line
    assert text.count("2.50x") == 2, text  # the row and the geomean


def test_also_layouts_take_chains_and_refuse_what_is_not_a_layout(capsys):
    from bench.models import main

    for bad in ("blocked+fused", "tiled", "blocked"):  # "blocked" is --layout's own
        with pytest.raises(SystemExit) as e:
            main(["--models", "resnet18", "--also-layouts", bad])
        assert e.value.code == 2
        assert "--also-layouts" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["--models", "resnet18", "--ms-trials-per-iter", "0"])
    assert e.value.code == 2 and "--ms-trials-per-iter" in capsys.readouterr().err


@pytest.mark.tunes
@pytest.mark.builds_model
@pytest.mark.bench
def test_quantize_benchmarks_the_pt2e_quantized_model_on_every_side(tmp_path, capsys):
    """`--quantize`: ours tunes the torchao-quantized model (checked within a quantization step), torch times the
    quantized module, ONNX Runtime says why it is not run; the report says the models were quantized."""
    import json

    pytest.importorskip("torchao")
    out = tmp_path / "q.json"
    assert models.main(["--models", "se_net", "--budget", "2", "--quantize", "--no-metaschedule", "--no-untuned",
                 "--torch-variants", "eager", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    row = report["cases"][0]
    assert report["quantized"] and row["quantized"]
    assert row["ours_correct"] and row["ours_ms"] > 0 and row["torch_variants_ms"]["eager"] > 0, row
    assert row["readings_ms"]["ours"] == [row["ours_ms"]], "one round: its one reading is the median"
    assert row["readings_ms"]["torch_eager"] == [row["torch_variants_ms"]["eager"]]
    assert "quantized_decomposed" in row["onnxruntime_error"]


@pytest.mark.tunes
@pytest.mark.builds_model
@pytest.mark.bench
def test_bf16_benchmarks_the_bfloat16_model_on_every_side(tmp_path):
    """`--bf16`: ours tunes the bfloat16 model (its convs in the dot-product form) and matches torch within
    bfloat16's tolerance, MetaSchedule runs from our translation, torch times the bf16 module, ONNX Runtime says
    why it is not run; the report says so."""
    import json

    out = tmp_path / "b.json"
    assert models.main(["--models", "small_transformer", "--budget", "2", "--bf16", "--no-untuned",
                        "--torch-variants", "eager", "--trials-per-round", "2", "--ms-trials-per-iter", "1",
                        "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    row = report["cases"][0]
    assert report["bf16"] and row["bf16"] and row["correct"], row
    assert row["metaschedule_trials_per_iter"] == 1 and 0 < row["metaschedule_trials"] <= 2, row
    assert row["ours_ms"] > 0 and row["metaschedule_ms"] > 0 and row["torch_variants_ms"]["eager"] > 0, row
    assert "bfloat16" in row["onnxruntime_error"]
    with pytest.raises(SystemExit):  # two precisions at once
        models.main(["--models", "small_cnn", "--bf16", "--quantize"])


@pytest.mark.tunes
def test_metaschedule_iterations_are_cut_to_the_budgets_share_so_that_every_task_is_tuned(tmp_path):
    """MetaSchedule's task scheduler gives every task one iteration first: at 64 per iteration a budget of 4 would
    go to the first task alone (MobileNet-V2 at 1,000 reached 18 of its 34 tasks). The iteration is cut to the
    budget's share per task, and the row says how many tasks have a record."""
    import torch

    from compiler.target import resolve_target

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = torch.nn.Linear(16, 32), torch.nn.Linear(32, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(torch.relu(self.a(x)))

    ep = torch.export.export(Net().eval(), (torch.randn(2, 16),))
    ms = models.run_metaschedule(ep, resolve_target("host"), 4, 0, tmp_path, 64)
    assert ms["metaschedule_tasks"] >= 2, ms
    assert ms["metaschedule_trials_per_iter"] == max(1, 4 // ms["metaschedule_tasks"]), ms
    assert ms["metaschedule_tuned_tasks"] == min(ms["metaschedule_tasks"], 4), ms


@pytest.mark.tunes
@pytest.mark.builds_model
def test_metaschedule_gets_our_translation_where_tvms_importer_lacks_an_operator(tmp_path):
    """TVM's importer has no `amax` (text_cnn's max over time): MetaSchedule is given our translation, the program
    ours starts from, and its build matches torch."""
    import numpy as np
    import torch

    from compiler.target import resolve_target

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = torch.nn.Linear(16, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.a(x)).amax(dim=1)

    module, x = Net().eval(), torch.randn(2, 4, 16)
    ep = torch.export.export(module, (x,))
    ms = models.run_metaschedule(ep, resolve_target("host"), 2, 0, tmp_path, 64)
    assert ms["metaschedule_importer"] == "ours", ms
    out = models.run_vm(ms["ex"], [x.numpy()], ms["params"])
    with torch.no_grad():
        np.testing.assert_allclose(out[0], module(x).numpy(), rtol=1e-5, atol=1e-5)


def test_a_wrong_metaschedule_output_is_traced_to_the_task_whose_schedule_computes_something_else():
    import tvm
    from tvm import s_tir, te, tirx

    from compiler.target import resolve_target

    def func(scale: float, name: str, index: bool = False) -> tvm.tirx.PrimFunc:
        x = te.placeholder((4, 64), name="x")
        i = te.placeholder((4,), "int64", name="i")
        y = te.compute((4, 64), lambda r, c: x[i[r] if index else r, c] * tirx.const(scale, "float32"), name="y")
        return te.create_prim_func([x, i, y] if index else [x, y]).with_attr("global_symbol", name)

    before = tvm.IRModule({"gather": func(2.0, "gather", index=True), "scale": func(2.0, "scale"),
                           "same": func(5.0, "same")})
    sch = s_tir.Schedule(before["gather"])
    _, c = sch.get_loops(sch.get_sblock("y"))
    sch.vectorize(sch.split(c, [None, 16])[1])  # scheduled, still right (its indices are 0: in range)
    after = tvm.IRModule({"gather": sch.mod["main"], "scale": func(3.0, "scale"), "same": before["same"]})
    assert models.wrong_tasks(before, after, resolve_target("host")) == ["scale"]


def test_a_partly_read_weight_is_not_handed_to_metaschedule_as_layout_free():
    """MetaSchedule's layout rewrite of a weight read only in part (BERT's position table, a slice of it) packs
    the whole buffer by the read part's index map, which overwrites it; such a weight is left in its layout."""
    import tvm
    from tvm import te

    def func(name: str) -> tvm.tirx.PrimFunc:
        x = te.placeholder((8, 16), name="x")
        table = te.placeholder((32, 16), name="table")  # rows 0-7 read: a slice
        w = te.placeholder((16, 16), name="w")  # read whole
        ids = te.placeholder((8,), "int64", name="ids")
        emb = te.placeholder((100, 16), name="emb")  # a gather: which rows is not known
        k = te.reduce_axis((0, 16), name="k")
        y = te.compute((8, 16), lambda r, c: te.sum((x[r, k] + table[r, k]) * w[k, c], axis=k), name="y")
        z = te.compute((8, 16), lambda r, c: y[r, c] + emb[ids[r], c], name="z")
        return te.create_prim_func([x, table, w, ids, emb, z]).with_attr("global_symbol", name)

    assert models.partly_read(func("f")) == [1]
    mod = tvm.IRModule({"f": func("f").with_attr("layout_free_buffers", [1, 2, 4]), "g": func("g")})
    out, taken = models.whole_layout_free(mod)
    assert taken == ["f: table"]
    assert [int(i) for i in out["f"].attrs["layout_free_buffers"]] == [2, 4]
    assert out["g"].same_as(mod["g"])


def test_an_interrupted_run_keeps_the_models_it_finished(tmp_path, monkeypatch):
    import json

    def run_model(name, *args, **kwargs):
        if name == "unet":
            raise KeyboardInterrupt  # the run stopped during its second model
        return [{"name": name, "budget": 8, "budget_given": "8", "ours_ms": 1.5, "metaschedule_ms": None,
                 "torch_ms": 3.0, "ours_tune_s": 2.0, "metaschedule_tune_s": None, "layout": "blocked",
                 "correct": True}]

    monkeypatch.setattr(models, "run_model", run_model)
    path = tmp_path / "models.json"
    with pytest.raises(KeyboardInterrupt):
        models.main(["--models", "small_cnn,unet,text_cnn", "--budget", "8", "--json", str(path)])
    report = json.loads(path.read_text())
    assert [c["name"] for c in report["cases"]] == ["small_cnn"]
    assert report["geomean"]["vs_torch"] == pytest.approx(2.0)


def test_budgets_are_numbers_or_default_and_default_is_a_model_jobs():
    assert models.parse_budgets("0,default,2000") == (0, "default", 2000)
    assert models.parse_budgets("64,64,default") == (64, "default")
    for bad in ("", "-1", "ten", "1.5", "0,,4"):
        with pytest.raises(ValueError):
            models.parse_budgets(bad)
    # "default" is a model job's: 8 per conv or matmul task, between 64 and 512
    class Task:
        def __init__(self, complex_: bool) -> None:
            self.complex = complex_

    class Model:
        def __init__(self, complex_tasks: int, others: int = 3) -> None:
            self.tasks = [Task(True)] * complex_tasks + [Task(False)] * others

    assert models.resolve_budgets((0, "default", 2000), Model(2)) == [(0, "0"), (64, "default"), (2000, "2000")]
    assert models.resolve_budgets((64, "default"), Model(2)) == [(64, "64")], "the same budget twice is one row"
    assert models.resolve_budgets(("default",), Model(28)) == [(224, "default")]
    assert models.resolve_budgets(("default",), Model(100)) == [(512, "default")]


def test_the_time_to_beat_is_the_first_estimate_below_the_baseline():
    curve = [[12.0, 24, 9.0], [20.5, 32, 6.0], [31.0, 40, 4.9], [44.0, 48, 4.0], [50.0, 56, 5.5]]
    assert models.time_to_beat(curve, 5.0) == (31.0, 40)
    assert models.time_to_beat(curve, 9.5) == (12.0, 24)
    assert models.time_to_beat(curve, 4.0) is None, "equal is not below"
    assert models.time_to_beat(curve, None) is None and models.time_to_beat([], 5.0) is None


def test_corpus_names_the_preset_and_metaschedule_on_resnet50_only(tmp_path, monkeypatch, capsys):
    """`--models corpus` is issue 61's set; corpus and zoo names mix; MetaSchedule runs by default on every zoo
    model and on resnet50 of the corpus; each model runs at every budget as given."""
    import json

    calls = []

    def run_model(name, target, budgets, seed, options, log):
        calls.append((name, budgets, options["metaschedule_models"]))
        return [{"name": name, "budget": 0 if b == 0 else 64 if b == "default" else b, "budget_given": str(b),
                 "ours_ms": 1.0, "metaschedule_ms": None, "torch_ms": 2.0, "ours_tune_s": 0.0,
                 "metaschedule_tune_s": None, "layout": "blocked", "correct": True,
                 "torch_variants_ms": {"compile": 2.0}, "vs_compile": 2.0} for b in budgets]

    monkeypatch.setattr(models, "run_model", run_model)
    out = tmp_path / "c.json"
    assert models.main(["--models", "corpus,small_cnn", "--budgets", "0,default,2000", "--json", str(out)]) == 0
    assert [c[0] for c in calls] == [*models.CORPUS_DEFAULT, "small_cnn"]
    assert {c[1] for c in calls} == {(0, "default", 2000)}
    assert calls[0][2] == {"resnet50", "small_cnn"}
    report = json.loads(out.read_text())
    assert report["budgets"] == [0, "default", 2000] and report["budget"] == 2000
    assert set(report["geomean_by_budget"]) == {"0", "default", "2000"}
    assert report["geomean"]["vs_compile"] == pytest.approx(2.0)
    text = capsys.readouterr().out
    assert "-mcpu=" in text.splitlines()[0] and "64 (default)" in text and "beat compile s (est.)" in text

    for argv, what in ((["--models", "resnet50", "--budget", "4", "--budgets", "0"], "--budget"),
                       (["--models", "resnet50", "--budgets", "0,lots"], "--budgets"),
                       (["--models", "resnet51"], "unknown model"),
                       (["--models", "gpt_block", "--quantize"], "zoo models only"),
                       (["--models", "gpt_block", "--metaschedule-models", "resnet50"], "--metaschedule-models")):
        with pytest.raises(SystemExit) as e:
            models.main(argv)
        assert e.value.code == 2 and what in capsys.readouterr().err, argv


def test_a_corpus_models_torch_program_takes_its_inputs_leaves_and_its_child_never_loads_tvm():
    """A corpus model with keyword arguments is called on its inputs' tensor leaves (`flat_call`), with the
    outputs of the module called as the user calls it; the factory's module imports no TVM (the timing child)."""
    import subprocess
    import sys

    import torch

    from bench.corpus_models import CORPUS
    from bench.torch_programs import torch_corpus_model

    fn, leaves = torch_corpus_model("kwargs_in")
    module, args, kwargs = CORPUS["kwargs_in"]()
    assert len(leaves) == 3 and all(isinstance(t, torch.Tensor) for t in leaves)
    with torch.no_grad():
        torch.testing.assert_close(fn(*leaves), module(*args, **kwargs))
    fn, leaves = torch_corpus_model("gpt_block")
    assert isinstance(fn, CORPUS["gpt_block"]()[0].__class__), "a model on plain tensors is not wrapped"
    probe = "import sys, bench.torch_programs; assert 'tvm' not in sys.modules, 'tvm loaded'"
    subprocess.run([sys.executable, "-c", probe], check=True)


@pytest.mark.builds_model
@pytest.mark.bench
def test_a_corpus_model_at_budget_0_is_served_checked_and_timed_against_torch(tmp_path):
    """The smallest corpus model with keyword arguments, at budget 0: ours serves the untuned build with its
    default schedules (checked against torch, timed in a fresh process), every torch variant timed on its inputs'
    leaves; no estimate, so no time to beat torch.compile."""
    import json

    out = tmp_path / "kw.json"
    assert models.main(["--models", "kwargs_in", "--budgets", "0", "--no-metaschedule", "--no-onnxruntime",
                        "--no-untuned", "--rounds", "1", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    common.check_report(report)
    [row] = report["cases"]
    assert row["source"] == "corpus" and row["budget"] == 0 and row["ours_trials"] == 0, row
    assert row["ours_correct"] and row["correct"] and math.isfinite(row["ours_ms"]) and row["ours_ms"] > 0, row
    assert row["readings_ms"]["ours"] == [row["ours_ms"]], "one round: its one reading is the median"
    assert set(row["torch_variants_ms"]) == {"eager", "channels_last", "compile"}, row
    assert all(ms is not None and ms > 0 for ms in row["torch_variants_ms"].values()), row
    assert row["vs_compile"] == pytest.approx(row["torch_variants_ms"]["compile"] / row["ours_ms"])
    assert row["estimate_curve"] == [] and row["estimate_beats_compile_s"] is None
