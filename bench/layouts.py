"""ALT's case study (paper Table 3) on this CPU: one layer under four layouts, same loop-tuning budget.

The ResNet-18 first layer: pad 3, conv2d 7x7 stride 2, 3 -> 64 channels at
224x224, bias, relu. Layouts (output & weight; the input follows):

* NOHW: the user's layouts, untouched;
* NHWO: output N H W O, input N H W I, weight KH KW I O;
* N O/ot H W ot (ot=16): output channels tiled, input N I/it H W it (it=3), weight O/16 I/3 KH KW 3 16;
* N H/ht W/wt O/ot ht wt ot (ht=4, wt=16, ot=16): the tiled template, input unfolded by the output tile.

Every layout's program keeps data in NCHW (the pad writes the new layout, no
conversion op), weights packed once, output in the tuned layout (as the next
layer would consume it). Each program is loop-tuned with the same budget by
`tuner.tune` when the tuner is importable, else by MetaSchedule (`--search`).

    python -m bench.layouts [--json PATH] [--budget N] [--search auto|tuner|metaschedule]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import tvm
from tvm.s_tir import meta_schedule as ms

import tuner
from compiler.layout import Layout, apply_layout
from compiler.target import resolve_target
from compiler.workloads import make_workload

PARAMS = dict(batch=1, in_channels=3, height=224, width=224, out_channels=64, kernel=7, stride=2, padding=3)


def layouts_for(workload: Any) -> dict[str, Any]:
    """The four layout choices of the case study: name -> apply_layout choice."""
    out = Layout(workload.output.shape, "N O H W")
    weight = Layout(workload.inputs[1].shape, "O I KH KW")
    pad_shape = (1, 3, 230, 230)
    return {
        "NOHW": {},
        "NHWO": {
            "output": out.reorder(0, 2, 3, 1),
            "pad_temp": Layout(pad_shape, "N I H W").reorder(0, 2, 3, 1),
            "weight": weight.reorder(2, 3, 1, 0),  # the paper's rsIO
        },
        "N O/ot H W ot": {
            "output": out.split(1, 16).reorder(0, 1, 3, 4, 2),
            "pad_temp": Layout(pad_shape, "N I H W").split(1, 3).reorder(0, 1, 3, 4, 2),
            "weight": weight.split(0, 16).split(2, 3).reorder(0, 2, 4, 5, 3, 1),  # O/ot I/it KH KW it ot
        },
        "N H/ht W/wt O/ot ht wt ot": {"ot": 16, "ht": 4, "wt": 16, "it": 1, "kot": 16, "kit": 3},
    }


def _time_ms(lib: Any, args: list, repeat: int = 7) -> float:
    timer = lib.time_evaluator("main", tvm.cpu(0), number=1, repeat=repeat, min_repeat_ms=100)
    return statistics.median(timer(*args).results) * 1e3


def _tune_with_tuner(prog: Any, xs: list, expected: Any, target: Any, budget: int, seed: int) -> tuple[Any, int]:
    task = tuner.Task(name=f"layouts:{prog.name}", workload_key=prog.workload.key, prim_func=prog.prim_func,
                      target=target, inputs=prog.pack_inputs(xs), expected=prog.pack_output(expected))
    result = tuner.tune(task, budget, seed=seed)
    if result.best is None:
        raise RuntimeError(f"tuner found no valid schedule in {len(result.trials)} trials")
    return tuner.apply_config(task, result.best.config), len(result.trials)


def _tune_with_metaschedule(prog: Any, target: Any, budget: int, seed: int, work_dir: Path) -> tuple[Any, int]:
    mod = tvm.IRModule({"main": prog.prim_func})
    database = ms.tune_tir(mod, target, str(work_dir), max_trials_global=budget,
                           num_trials_per_iter=min(64, budget), seed=seed)
    sch = ms.tir_integration.compile_tir(database, mod, target)
    if sch is None:
        raise RuntimeError(f"MetaSchedule found no valid schedule in {budget} trials")
    return sch.mod, len(database.get_all_tuning_records())


def run(budget: int, search: str, seed: int = 0) -> dict:
    """Tunes the layer under every layout; returns the rows of the table."""

    if search == "auto":
        search = "tuner" if hasattr(tuner, "tune") and hasattr(tuner, "Task") else "metaschedule"
    target = resolve_target("host")
    workload = make_workload("conv2d", PARAMS, epilogue="bias_relu")
    xs = workload.random_inputs(seed=seed)
    expected = workload.reference(xs)
    rows = []
    for name, choice in layouts_for(workload).items():
        prog = apply_layout(workload, choice)
        assert not prog.conversions, f"{name}: unexpected conversion ops {prog.conversions}"
        args = [tvm.runtime.tensor(a) for a in prog.pack_inputs(xs)]
        row: dict[str, Any] = {"layout": name, "program": prog.name, "search": search, "budget": budget}
        start = time.perf_counter()
        try:
            with tempfile.TemporaryDirectory(prefix="altune-layouts-") as tmp:
                if search == "tuner":
                    mod, trials = _tune_with_tuner(prog, xs, expected, target, budget, seed)
                else:
                    mod, trials = _tune_with_metaschedule(prog, target, budget, seed, Path(tmp))
            row["tune_s"] = round(time.perf_counter() - start, 1)
            row["trials"] = trials
            lib = tvm.compile(mod, target).jit()
            out = tvm.runtime.tensor(np.zeros(prog.args[-1].shape, "float32"))
            lib["main"](*args, out)
            err = float(np.abs(prog.unpack_output(out.numpy()) - expected).max())
            row["max_abs_err"] = err
            row["correct"] = err < 1e-3
            row["latency_ms"] = _time_ms(lib, [*args, out]) if row["correct"] else None
        except Exception as e:  # one failing layout is a row of the table, not the end of the run
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
            row["latency_ms"] = None
        rows.append(row)
        print(f"  {name}: {row.get('latency_ms')} ms, tuned in {row.get('tune_s')} s ({row.get('error', 'ok')})",
              file=sys.stderr, flush=True)
    return {"benchmark": "layouts", "workload": workload.key, "target": str(target.attrs.get("mcpu", "")),
            "budget": budget, "search": search, "rows": rows}


def table(result: dict) -> str:
    lines = [f"ResNet-18 layer 1 ({result['workload']}), loop search: {result['search']}, budget {result['budget']}",
             f"{'layout':<28} {'latency ms':>11} {'tune s':>7}  program"]
    for r in result["rows"]:
        lat = f"{r['latency_ms']:.3f}" if r.get("latency_ms") is not None else r.get("error", "-")[:30]
        lines.append(f"{r['layout']:<28} {lat:>11} {r.get('tune_s', '-')!s:>7}  {r['program'] or '(user layouts)'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    parser.add_argument("--budget", type=int, default=32, help="loop-tuning measurements per layout")
    parser.add_argument("--search", choices=("auto", "tuner", "metaschedule"), default="auto")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    result = run(args.budget, args.search, args.seed)
    print(table(result))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
