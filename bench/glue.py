"""Where a model's glue time goes: every non-complex task (layout conversions, pools, means, concats, shuffles,
element-wise chains, softmax, layer norm) timed with its default schedule, against torch eager's whole model and
against a copy of the same bytes.

    python -m bench.glue                                   # the default models, one after another
    python -m bench.glue --models shufflenet_v2_x0_5,gpt_block --top 8

Per model: the corpus export (`bench.corpus.export`), translated and lowered untuned in `--layout` ("blocked": convs
in NCHWc, conversions where the graph leaves that layout). Each task that is not complex (no conv, no matmul) is
built with `compiler.workloads.model.default_schedule` (what an untuned task runs in the artifact), checked and
timed by a `tuner` local measurer (`tuner.graph_layout.default_schedule_latency`: a child process, median of 3
repeats of at least 20 ms); right before it, by the same measurer, under the plain rule alone
(`default_cpu_schedule(..., glue=False)`: the schedule before `compiler.workloads.model.glue`'s rules), so the two
compare in one run. A task whose function is a reshape pattern is left out: the build rewrites its calls to views
(`relax.transform.RewriteDataflowReshape`), so the artifact never runs it.

Columns: weight (calls per model run), plain ms (the plain rule), ms (one call, the default schedule), ms x weight,
its share of torch eager's model time (`compiler.workloads.model.check.time_torch`, the faster of every core and
one thread: on a loaded machine torch's threads wait for each other, and a share of a slowed-down model would hide
the glue), bytes (every argument once: inputs read, outputs written; a gather's source is counted whole), GB/s
achieved, and the same bytes copied (`copy GB/s`): the best of a one-thread and a parallel vectorized copy of that
many bytes (rounded up to a power of two), timed by the same measurer, `TRIES` times each; `of copy` = copy time /
task time (100%: the task runs as fast as a copy of its bytes; small tensors are in cache, so the copy's rate is
the cache's, not DRAM's).

Only `bench` runs this (bench -> tuner -> compiler); JSON goes to `bench/results/glue-<cpu>.json` unless `--json`.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import tvm
from tvm import relax, s_tir, te

from bench.common import RESULTS_DIR, Column, fmt_ms, format_table
from bench.corpus import export, flat_inputs
from bench.environment import environment
from compiler.target import resolve_target, target_key, vector_lanes
from compiler.workloads.model.build import default_cpu_schedule
from compiler.workloads.model.check import time_torch
from compiler.workloads.model.importer import translate_model
from compiler.workloads.model.tasks import ModelTask
from tuner import make_measurer
from tuner.graph_layout import DEFAULT_CONFIG, default_schedule_latency
from tuner.measurers import Candidate, Measurer
from tuner.model import lower_model
from tuner.request import ModelTuneRequest
from tuner.task import Task

MODELS = ("efficientnet_b0", "mobilenet_v3_small", "shufflenet_v2_x0_5", "squeezenet1_1", "transformer_encoder",
          "gpt_block")


@dataclass
class GlueTask:
    """One non-complex task of a model, timed with its default schedule."""

    name: str
    workload_key: str
    weight: int
    shapes: list[list[int]]
    bytes: int
    ms: float | None = None
    copy_ms: float | None = None  # a copy of `bytes` (rounded up to a power of two), the best schedule of two
    plain_ms: float | None = None  # the plain rule alone (`default_cpu_schedule(..., glue=False)`)
    error: str | None = None

    @property
    def total_ms(self) -> float | None:
        return None if self.ms is None else self.ms * self.weight

    @property
    def gbps(self) -> float | None:
        return None if not self.ms else self.bytes / (self.ms * 1e6)


@dataclass
class ModelGlue:
    """A model's glue tasks and its torch eager time."""

    name: str
    torch_ms: float | None = None  # every core
    torch_1_ms: float | None = None  # one thread
    tasks: list[GlueTask] = field(default_factory=list)
    views: list[str] = field(default_factory=list)  # reshape tasks: views in the build, never run
    complex_tasks: int = 0

    @property
    def glue_ms(self) -> float:
        return sum(t.total_ms or 0.0 for t in self.tasks)

    @property
    def plain_glue_ms(self) -> float:
        return sum((t.plain_ms or 0.0) * t.weight for t in self.tasks)

    @property
    def torch_best_ms(self) -> float | None:
        known = [t for t in (self.torch_ms, self.torch_1_ms) if t]
        return min(known) if known else None


def task_bytes(task: ModelTask) -> int:
    """Every argument once: what a task that reads each input and writes each output at least moves."""
    return sum(math.prod(a.shape) * tvm.DataType(a.dtype).bits // 8 for a in task.args)


def copy_func(elements: int, lanes: int, cores: int, parallel: bool) -> tvm.tirx.PrimFunc:
    """A float32 copy of `elements` values, vectorized `lanes` wide, parallel over `cores` chunks or on one thread."""
    a = te.placeholder((elements,), name="a")
    b = te.compute((elements,), lambda i: a[i], name="b")
    sch = s_tir.Schedule(te.create_prim_func([a, b]))
    (loop,) = sch.get_loops(sch.get_sblock("b"))
    outer, inner = sch.split(loop, [None, lanes])
    sch.vectorize(inner)
    if parallel:
        chunks, _ = sch.split(outer, [cores, None])
        sch.parallel(chunks)
    return sch.mod["main"]


TRIES = 3  # a copy's time is the best of this many measurements of each of its two schedules


class CopyReference:
    """The time of copying n bytes on this target (n rounded up to a power of two), measured once per size: the
    best of `TRIES` measurements of each of a one-thread and a parallel copy."""

    def __init__(self, measurer: Measurer, target: tvm.target.Target) -> None:
        self.measurer, self.target = measurer, target
        self.lanes = vector_lanes(target)
        self.cores = int(target.attrs.get("num-cores", 1) or 1)
        self.known: dict[int, float | None] = {}

    def ms(self, moved: int) -> float | None:
        # a copy moves each element twice (read, write); at least two vectors per core
        elements = max(2 * self.lanes * self.cores, 1 << max(0, math.ceil(math.log2(max(moved, 8) / 8))))
        if elements not in self.known:
            self.known[elements] = self._measure(elements)
        found = self.known[elements]
        return None if found is None else found * moved / (8 * elements)

    def _measure(self, elements: int) -> float | None:
        best = None
        for parallel in (False, True) * TRIES:
            func = copy_func(elements, self.lanes, self.cores, parallel)
            task = Task(f"copy{elements}", f"copy:{elements}", copy_func(elements, self.lanes, self.cores, False),
                        self.target)
            result = self.measurer.measure_one(task, Candidate({}, tvm.IRModule({"main": func})))
            if result.latencies_ms:
                ms = statistics.median(result.latencies_ms)
                best = ms if best is None else min(best, ms)
        return best


def measure_model(name: str, measurer: Measurer, copies: CopyReference, target: tvm.target.Target,
                  layout: str) -> ModelGlue:
    """Exports, lowers and times the model's glue tasks (see the module docstring)."""
    ep = export(name)
    model = lower_model(translate_model(ep), ModelTuneRequest(target="host", budget=0, layout=layout))
    out = ModelGlue(name, complex_tasks=sum(t.complex for t in model.tasks))
    for mt in model.tasks:
        if mt.complex:
            continue
        if relax.analysis.has_reshape_pattern(mt.prim_func):
            out.views.append(mt.name)
            continue
        glue = GlueTask(mt.name, mt.workload_key, mt.weight, [list(a.shape) for a in mt.args], task_bytes(mt))
        task = Task(mt.name, mt.workload_key, mt.prim_func, target)
        plain = default_cpu_schedule(mt.prim_func, copies.cores, copies.lanes, glue=False)
        result = measurer.measure_one(task, Candidate(dict(DEFAULT_CONFIG), tvm.IRModule({"main": plain})))
        glue.plain_ms = statistics.median(result.latencies_ms) if result.latencies_ms else None
        latencies, glue.error = default_schedule_latency(measurer, task)
        glue.ms = statistics.median(latencies) if latencies else None
        glue.copy_ms = copies.ms(glue.bytes)
        out.tasks.append(glue)
        print(f"  {mt.name} x{mt.weight}: plain {fmt_ms(glue.plain_ms)} ms, {fmt_ms(glue.ms)} ms"
              f"{'  ' + glue.error if glue.error else ''}", file=sys.stderr, flush=True)
    out.torch_ms = time_torch(ep.module(), flat_inputs(ep))
    out.torch_1_ms = time_torch(ep.module(), flat_inputs(ep), threads=1)
    return out


def _share(part: float | None, whole: float | None) -> str:
    return "-" if part is None or not whole else f"{100 * part / whole:.1f}%"


def report(model: ModelGlue, top: int) -> str:
    """The model's glue table: its top tasks by ms x weight, then the totals."""
    tasks = sorted(model.tasks, key=lambda t: -(t.total_ms or 0.0))
    columns = [
        Column("task", lambda r: r["task"], right=False),
        Column("weight", lambda r: r["weight"]),
        Column("shapes", lambda r: r["shapes"], right=False),
        Column("plain ms", lambda r: r["plain"]),
        Column("ms", lambda r: r["ms"]),
        Column("ms x w", lambda r: r["total"]),
        Column("of torch", lambda r: r["share"]),
        Column("bytes", lambda r: r["bytes"]),
        Column("GB/s", lambda r: r["gbps"]),
        Column("copy GB/s", lambda r: r["copy"]),
        Column("of copy", lambda r: r["of_copy"]),
    ]
    def row(t: GlueTask) -> dict:
        return {
            "task": t.name[:48], "weight": str(t.weight), "shapes": " ".join("x".join(map(str, s)) for s in t.shapes)[:60],
            "plain": fmt_ms(t.plain_ms), "ms": fmt_ms(t.ms) if t.error is None else "ERROR",
            "total": fmt_ms(t.total_ms), "share": _share(t.total_ms, model.torch_best_ms), "bytes": str(t.bytes),
            "gbps": "-" if t.gbps is None else f"{t.gbps:.1f}",
            "copy": "-" if not t.copy_ms else f"{t.bytes / (t.copy_ms * 1e6):.1f}",
            "of_copy": _share(t.copy_ms, t.ms),
        }

    copy_total = sum((t.copy_ms or 0.0) * t.weight for t in tasks)
    footer = {"task": f"glue ({len(tasks)} tasks)", "weight": str(sum(t.weight for t in tasks)), "shapes": "",
              "plain": fmt_ms(model.plain_glue_ms), "ms": "", "total": fmt_ms(model.glue_ms),
              "share": _share(model.glue_ms, model.torch_best_ms), "bytes": str(sum(t.bytes * t.weight for t in tasks)),
              "gbps": "", "copy": "", "of_copy": _share(copy_total, model.glue_ms)}
    lines = [f"{model.name}: torch eager {fmt_ms(model.torch_ms)} ms ({fmt_ms(model.torch_1_ms)} ms on one thread), "
             f"glue {fmt_ms(model.glue_ms)} ms x weight ({fmt_ms(model.plain_glue_ms)} ms with the plain rule), "
             f"{model.complex_tasks} complex tasks, {len(model.views)} reshapes (views)",
             format_table(columns, [row(t) for t in tasks[:top]], [footer])]
    errors = [f"  {t.name}: {t.error}" for t in tasks if t.error]
    return "\n".join(lines + errors)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(MODELS), help="corpus names, comma-separated")
    parser.add_argument("--layout", default="blocked", choices=("none", "blocked"))
    parser.add_argument("--top", type=int, default=10, help="tasks shown per model")
    parser.add_argument("--json", type=Path, default=None, help="where the report goes")
    args = parser.parse_args(argv)
    target = resolve_target("host")
    measurer = make_measurer("local", pipeline="licm")
    copies = CopyReference(measurer, target)
    models = []
    try:
        print(f"target {target_key('host')}, layout {args.layout}", flush=True)
        for name in args.models.split(","):
            print(f"{name} ...", file=sys.stderr, flush=True)
            models.append(measure_model(name, measurer, copies, target, args.layout))
            print("\n" + report(models[-1], args.top), flush=True)
    finally:
        measurer.close()
    path = args.json or RESULTS_DIR / f"glue-{target_key('host').split('mcpu=')[-1].split()[0]}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"environment": environment(), "target": target_key("host"), "layout": args.layout,
                                "models": [asdict(m) | {"glue_ms": m.glue_ms, "plain_glue_ms": m.plain_glue_ms} for m in models]},
                               indent=1))
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
