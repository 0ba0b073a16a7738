"""basteln's copies of a producer shared by outputs of different spaces (Fig. 11b), against computing it once.

    python -m bench.copies [--json FILE] [--rounds N] [--quick]

Two programs whose two outputs have different spaces and read one producer:

- "chunk": a 1x1 conv written as a matmul (56*56 pixels, 64 -> 384 channels) whose result the two outputs
  read in parts of different widths (a ReLU of the first 256 channels, the last 128 scaled): the parts do
  not intersect, so the copies recompute nothing (sec. 5.3);
- "branches": a 1x1 conv (64 -> 64) that two 1x1 convs (-> 64, -> 96) both read whole, as Inception's
  branches do: each copy computes all of it (overlap 1, fused only at threshold 1, sec. 5.4).

Each program is built by basteln three ways, with the target's micro-kernels: `copies` (threshold 1: the
producer copied into each class of outputs, whatever the overlap), `threshold 0` (copied only where the parts
are disjoint) and `no copies` (`copies=False`: the producer computed once, whole, before both outputs, the
pass before Fig. 11b). The rows of a tile are picked from a small grid per way, by a first timing in this
process; the picks are then checked against numpy and timed each in a fresh process of its own, one at a
time, in shuffled order, `--rounds` times (median). Intermediate storage: the bytes of the producer's
buffers after the pass (per-tile scratch where fused).

Only `bench` runs this (bench -> tuner -> compiler).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import tvm
from tvm import te, tirx

from bench.common import RESULTS_DIR, Column, TvmProgram, fmt_ms, fmt_x, format_table, in_fresh_process, save_args
from bench.common import time_library
from bench.environment import environment
from compiler.arrays import arg_specs, check_close, random_inputs
from compiler.build import build
from compiler.passes.basteln import basteln
from compiler.target import resolve_target, vector_unit

PIXELS, C_IN = 56 * 56, 64
ROWS = (28, 56, 112, 224)  # the tile rows tried
QUICK_PIXELS, QUICK_ROWS = 14 * 14, (28,)  # --quick: a smoke run
WAYS = {"copies": {"threshold": 1.0}, "threshold 0": {"threshold": 0.0}, "no copies": {"copies": False}}


def program(case: str, pixels: int = PIXELS) -> Any:
    """The case's TensorIR function (TE), its two outputs last."""
    x = te.placeholder((pixels, C_IN), name="X")
    r = te.reduce_axis((0, C_IN), "r")
    if case == "chunk":
        w = te.placeholder((C_IN, 384), name="W")
        y = te.compute((pixels, 384), lambda p, c: te.sum(x[p, r] * w[r, c], axis=r), name="Y")
        o1 = te.compute((pixels, 256), lambda p, c: tirx.max(y[p, c], tirx.const(0, "float32")), name="out1")
        o2 = te.compute((pixels, 128), lambda p, c: y[p, 256 + c] * tirx.const(0.5, "float32"), name="out2")
        return te.create_prim_func([x, w, o1, o2]).with_attr("global_symbol", "main")
    w = te.placeholder((C_IN, 64), name="W")
    y = te.compute((pixels, 64), lambda p, c: te.sum(x[p, r] * w[r, c], axis=r), name="Y")
    w1, w2 = te.placeholder((64, 64), name="W1"), te.placeholder((64, 96), name="W2")
    r1, r2 = te.reduce_axis((0, 64), "r1"), te.reduce_axis((0, 64), "r2")
    o1 = te.compute((pixels, 64), lambda p, c: te.sum(y[p, r1] * w1[r1, c], axis=r1), name="out1")
    o2 = te.compute((pixels, 96), lambda p, c: te.sum(y[p, r2] * w2[r2, c], axis=r2), name="out2")
    return te.create_prim_func([x, w, w1, w2, o1, o2]).with_attr("global_symbol", "main")


def reference(case: str, args: list) -> list:
    y = args[0] @ args[1]
    if case == "chunk":
        return [np.maximum(y[:, :256], 0), 0.5 * y[:, 256:]]
    return [y @ args[2], y @ args[3]]


def build_way(case: str, way: str, rows: int, target: Any, pixels: int = PIXELS) -> Any:
    lanes = vector_unit(target).lanes
    func = program(case, pixels)
    width = 256 if case == "chunk" else 64
    return basteln(func, [rows, width], vector=2 * lanes, register=4, register2=2, tensorize=True, lanes=lanes,
                   **WAYS[way])


def run_case(case: str, target: Any, folder: Path, seed: int, pixels: int = PIXELS,
             rows_grid: tuple[int, ...] = ROWS) -> tuple[dict, dict]:
    """Builds every way of `case` (the best tile rows of each by a first timing) and checks it; its row and
    its programs to time."""
    specs = arg_specs(program(case, pixels))
    inputs = random_inputs(specs[:-2], seed)
    expected = reference(case, inputs)
    row: dict[str, Any] = {"case": case, "ways": {}}
    programs = {}
    dev = tvm.cpu(0)
    for way in WAYS:
        best = None
        for rows in rows_grid:
            fused = build_way(case, way, rows, target, pixels)
            lib = build(fused.sch.mod, target)
            args = [tvm.runtime.tensor(a, dev) for a in inputs]
            args += [tvm.runtime.tensor(np.zeros(s, d), dev) for s, d in specs[-2:]]
            lib["main"](*args)
            for out, ref in zip(args[-2:], expected):
                problem = check_close(out.numpy(), ref)
                if problem is not None:
                    raise SystemExit(f"{case} ({way}, {rows} rows): {problem}")
            ms = statistics.median(lib.time_evaluator("main", dev, number=1, repeat=5, min_repeat_ms=50)(*args).results)
            if best is None or ms < best[0]:
                best = (ms, rows, fused, lib, args)
        _, rows, fused, lib, args = best
        path = folder / f"{case}-{way.replace(' ', '_')}"
        lib.export_library(str(path.with_suffix(".so")))
        programs[(case, way)] = TvmProgram(str(path.with_suffix(".so")),
                                           save_args([a.numpy() for a in args], path.with_suffix(".npz")))
        row["ways"][way] = {"rows": rows, "copies": [(d.group, list(d.copies), d.overlap) for d in fused.duplications],
                            "decisions": [(d.group, d.depth, d.redundancy, d.reason) for d in fused.decisions],
                            "scratch_bytes": fused.scratch_bytes, "intermediate_bytes": fused.intermediate_bytes}
    return row, programs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.copies", description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="host")
    parser.add_argument("--rounds", type=int, default=3, help="fresh-process readings per program (0: build and check only)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_PIXELS} pixels, tiles of {QUICK_ROWS} rows")
    parser.add_argument("--json", type=Path, default=None, help="the report (default bench/results/copies-<mcpu>.json)")
    args = parser.parse_args(argv)

    target = resolve_target(args.target)
    folder = Path(tempfile.mkdtemp(prefix="bench-copies-"))
    rows, programs = [], {}
    for case in ("chunk", "branches"):
        row, progs = (run_case(case, target, folder, args.seed, QUICK_PIXELS, QUICK_ROWS) if args.quick
                      else run_case(case, target, folder, args.seed))
        rows.append(row)
        programs.update(progs)
    readings: dict[tuple[str, str], list[float]] = {k: [] for k in programs}
    for r in range(args.rounds):
        order = list(programs)
        random.Random(args.seed + r).shuffle(order)
        for key in order:
            ms = in_fresh_process(time_library, programs[key], args.seed)
            if ms is not None:
                readings[key].append(ms)
    for row in rows:
        for way, facts in row["ways"].items():
            got = readings[(row["case"], way)]
            facts["ms"] = statistics.median(got) if got else None
        base = row["ways"]["no copies"]["ms"]
        for facts in row["ways"].values():
            facts["vs_no_copies"] = base / facts["ms"] if base and facts["ms"] else None

    table_rows = [{"case": row["case"], "way": way, **facts} for row in rows for way, facts in row["ways"].items()]
    columns = [
        Column("case", lambda r: r["case"]), Column("way", lambda r: r["way"]),
        Column("rows", lambda r: str(r["rows"])), Column("ms", lambda r: fmt_ms(r["ms"])),
        Column("vs no copies", lambda r: fmt_x(r["vs_no_copies"])),
        Column("copied (overlap)", lambda r: ", ".join(f"{g} ({o:.2f})" for g, _, o in r["copies"]) or "-"),
        Column("producer KiB", lambda r: f"{r['scratch_bytes'] / 1024:.0f}"),
    ]
    env = environment()
    print(f"bench.copies on {env.get('cpu_model')} (-mcpu={env.get('cpu')}), {env.get('cores')} cores, "
          f"{args.rounds} fresh-process rounds")
    print(format_table(columns, table_rows))
    report = {"bench": "copies", "target": str(target), "mcpu": env.get("cpu"), "rounds": args.rounds,
              "environment": env, "cases": rows}
    path = args.json or RESULTS_DIR / f"copies-{env.get('cpu')}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"report: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
