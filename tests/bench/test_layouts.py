"""bench.layouts: the four case-study layouts are built as the paper names them, and the table prints."""

from __future__ import annotations

from bench.layouts import PARAMS, layouts_for, table
from compiler.layout import apply_layout
from compiler.workloads import make_workload


def test_case_study_layouts_need_no_conversion_op():
    wl = make_workload("conv2d", PARAMS, epilogue="bias_relu")
    names = {}
    for name, choice in layouts_for(wl).items():
        prog = apply_layout(wl, choice)
        assert prog.conversions == (), (name, prog.conversions)
        assert prog.args[0].shape == (1, 3, 224, 224), "data stays NCHW: the pad writes the new layout"
        names[name] = "identity" if prog.layouts["output"].is_identity else prog.layouts["output"].name
    assert names == {
        "NOHW": "identity",
        "NHWO": "N H W O",
        "N O/ot H W ot": "N O/16 H W 16",
        "N H/ht W/wt O/ot ht wt ot": "N H/4 W/16 O/16 4 16 16",
    }


def test_table_formats_rows_and_errors():
    result = {"workload": "conv2d[...]", "search": "tuner", "budget": 2, "rows": [
        {"layout": "NOHW", "program": "", "latency_ms": 1.5, "tune_s": 3.0},
        {"layout": "NHWO", "program": "output N H W O", "latency_ms": None, "error": "RuntimeError: boom"},
    ]}
    text = table(result)
    assert "1.500" in text and "RuntimeError: boom" in text and "(user layouts)" in text
