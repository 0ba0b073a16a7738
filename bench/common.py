"""What every benchmark shares: the report's JSON shape, speedups, the table, where results go.

A report is one run on one target:

    {"suite": str, "target": str, "budget": int,
     "cases": [{"name": str, "ours_ms": float | None, "metaschedule_ms": float | None,
                "torch_ms": float | None, "ours_tune_s": float, "metaschedule_tune_s": float | None,
                "layout": str | None, "correct": bool, ...}, ...],
     "geomean": {"vs_metaschedule": float | None, "vs_torch": float | None},
     "environment": {"commit": str | None, "cpu": str, ...}, ...}

`bench.ops` rows also carry the commit they ran on: a suite run in pieces
(`--resume`, `--merge`) may span versions of the code. A case's "torch_ms" is the best
of the torch variants it ran (`torch_variants_ms`: variant -> ms or null, `torch_best`:
the fastest variant's name).

Timing: every program is timed in a fresh process of its own, one at a time, in shuffled
order (`time_fresh`): TVM's thread pool keeps a worker spinning for about 0.4 s after a
run, which would steal a core from whatever runs next, and torch's OpenMP threads and
TVM's compete in one process. A TVM program travels as an exported library and its
arguments (`TvmProgram`), a torch program as a module-level factory that builds it in
the child (`TorchProgram`), an ONNX model as its file and inputs (`OnnxProgram`), so the
parent never times torch, ONNX Runtime or a TVM program itself. The child's side is one small module per
runtime (`bench.timing_tvm`, `bench.timing_torch`, `bench.timing_onnx`), each importing its runtime at its top;
this module imports none of them (every child imports it for the program's description), and the child is
`bench.child`, a process that imports only what its call names.

A speedup is the baseline's latency over ours (> 1: ours is faster); the
geomean is the geometric mean of the per-case speedups over the cases where
both latencies exist (None when there are none). Cases may carry more fields.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import pickle
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

RESULTS_DIR = Path(__file__).resolve().parent / "results"

# key -> allowed types of every case (None means JSON null is allowed)
CASE_FIELDS: dict[str, tuple[type | None, ...]] = {
    "name": (str,),
    "ours_ms": (float, None),  # None only when ours failed (then "error" says why and correct is False)
    "metaschedule_ms": (float, None),
    "torch_ms": (float, None),
    "ours_tune_s": (float,),
    "metaschedule_tune_s": (float, None),
    "layout": (str, None),
    "correct": (bool,),
}
# optional fields, checked where present
OPTIONAL_CASE_FIELDS: dict[str, tuple[type | None, ...]] = {
    "torch_variants_ms": (dict,),  # variant ("eager", "channels_last", "compile") -> ms or null
    "torch_best": (str, None),
    "timing": (str,),
    "onnxruntime_ms": (float, None),  # bench.models: ONNX Runtime (CPU) on the torch.onnx export
}
TORCH_VARIANTS = ("eager", "channels_last", "compile")


def speedup(baseline_ms: float | None, ours_ms: float | None) -> float | None:
    """baseline / ours, or None when either is missing."""
    if baseline_ms is None or ours_ms is None or ours_ms <= 0:
        return None
    return baseline_ms / ours_ms


def geomean(values: Iterable[float | None]) -> float | None:
    """Geometric mean of the values that are not None; None when there are none."""
    present = [v for v in values if v is not None]
    if not present:
        return None
    assert all(v > 0 for v in present), f"geomean of non-positive values: {present}"
    return math.exp(sum(math.log(v) for v in present) / len(present))


def geomeans(cases: Sequence[dict]) -> dict[str, float | None]:
    """The report's "geomean" block from its cases."""
    return {
        "vs_metaschedule": geomean(speedup(c.get("metaschedule_ms"), c.get("ours_ms")) for c in cases),
        "vs_torch": geomean(speedup(c.get("torch_ms"), c.get("ours_ms")) for c in cases),
    }


def check_report(report: dict) -> None:
    """Raises ValueError naming the first field of `report` that breaks the shape above."""

    def fail(where: str, value: Any, expected: str) -> None:
        raise ValueError(f"{where}: expected {expected}, got {value!r}")

    def is_a(value: Any, kinds: tuple[type | None, ...]) -> bool:
        if value is None:
            return None in kinds
        if isinstance(value, bool):
            return bool in kinds
        if isinstance(value, int) and float in kinds:  # JSON does not distinguish 1 from 1.0
            return True
        return any(k is not None and isinstance(value, k) for k in kinds)

    for key, kinds in (("suite", (str,)), ("target", (str,)), ("budget", (int,)), ("cases", (list,)),
                       ("geomean", (dict,))):
        if key not in report or not is_a(report[key], kinds) or isinstance(report[key], bool):
            fail(key, report.get(key), " or ".join(k.__name__ for k in kinds if k))
    def names(kinds: tuple[type | None, ...]) -> str:
        return " or ".join(k.__name__ if k else "null" for k in kinds)

    for i, case in enumerate(report["cases"]):
        for key, kinds in CASE_FIELDS.items():
            if key not in case or not is_a(case[key], kinds):
                fail(f"cases[{i}].{key}", case.get(key), names(kinds))
        for key, kinds in OPTIONAL_CASE_FIELDS.items():
            if key in case and not is_a(case[key], kinds):
                fail(f"cases[{i}].{key}", case[key], names(kinds))
        for variant, ms in case.get("torch_variants_ms", {}).items():
            if variant not in TORCH_VARIANTS or not is_a(ms, (float, None)):
                fail(f"cases[{i}].torch_variants_ms.{variant}", ms, f"float or null of a variant in {TORCH_VARIANTS}")
    for key in ("vs_metaschedule", "vs_torch"):
        if key not in report["geomean"] or not is_a(report["geomean"][key], (float, None)):
            fail(f"geomean.{key}", report["geomean"].get(key), "float or null")


def default_json_path(bench: str, suite: str) -> Path:
    """bench/results/<bench>-<suite>-<UTC time>.json: a new file per run, never overwritten."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    return RESULTS_DIR / f"{bench}-{suite}-{stamp}.json"


def write_json(report: dict, path: Path | None = None, *, bench: str = "ops") -> Path:
    """Checks `report` and writes it (atomically) to `path`, or under `RESULTS_DIR` when None."""
    check_report(report)
    path = Path(path) if path is not None else default_json_path(bench, report["suite"])
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    partial.write_text(json.dumps(report, indent=2, sort_keys=False) + "\n")
    os.replace(partial, path)
    return path


def source_commit() -> str | None:
    """The git commit of the code that runs (suffixed "+dirty" with uncommitted changes), None outside git."""
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                              check=True, timeout=10).stdout.strip()
        # results written meanwhile (a report saved after every case) are not the code
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                                ":(exclude)bench/results"], cwd=root,
                               capture_output=True, text=True, check=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+dirty" if dirty else "")


def cpu_model() -> str | None:
    """The processor's name as the OS reports it (/proc/cpuinfo "model name"), None where unknown."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


# ---------------------------------------------------------------------------
# Tables


@dataclass(frozen=True)
class Column:
    """One table column: header, how to get the cell from a row, right-aligned or not."""

    header: str
    cell: Callable[[dict], str]
    right: bool = True


def fmt_ms(value: float | None) -> str:
    """Milliseconds: 3 decimals, 4 below 0.1 ms, 1 from 100 ms ("-" for missing)."""
    if value is None:
        return "-"
    if value >= 100:
        return f"{value:.1f}"
    return f"{value:.3f}" if value >= 0.1 else f"{value:.4f}"


def fmt_x(value: float | None) -> str:
    """A speedup as "1.23x" ("-" for missing)."""
    return "-" if value is None else f"{value:.2f}x"


def fmt_share(share: float | None) -> str:
    """A share of the machine's peak as a percentage, "-" when missing."""
    return "-" if share is None else f"{100 * share:.0f}%"


def peak_text(report: dict) -> str:
    """What a table's "%peak" means, with the report's measured peak; "" when it was not measured."""
    peak = report.get("peak")
    return f"; %peak = fp32 GFLOP/s over the measured FMA peak, {peak['gflops']:.0f} GFLOP/s" if peak else ""


def fmt_s(value: float | None) -> str:
    """Seconds, whole ("-" for missing)."""
    return "-" if value is None else f"{value:.0f}"


def format_table(columns: Sequence[Column], rows: Sequence[dict], footer: Sequence[dict] = ()) -> str:
    """A plain-text table, one line per row, a rule above the footer rows."""
    body = [[c.cell(r) for c in columns] for r in rows]
    foot = [[c.cell(r) for c in columns] for r in footer]
    widths = [max(len(c.header), *(len(line[i]) for line in body + foot)) for i, c in enumerate(columns)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            cell.rjust(w) if c.right else cell.ljust(w) for c, cell, w in zip(columns, cells, widths)
        ).rstrip()

    rule = "-" * len(line([c.header for c in columns]))
    out = [line([c.header for c in columns]), rule, *map(line, body)]
    if foot:
        out += [rule, *map(line, foot)]
    return "\n".join(out)


# ---------------------------------------------------------------------------
# Timing, each program in a fresh process

MIN_REPEAT_MS = 50.0  # each timed repeat runs the program for at least this long
REPEAT = 5  # repeats whose median is the latency


@dataclass(frozen=True)
class TvmProgram:
    """A compiled TVM program to time: an exported library and the arguments of its "main".

    Attributes:
        lib_path: the library (`export_library`).
        args_path: an .npz of every argument in call order, the output last (`save_args`);
            None: random arguments of `specs`.
        specs: (shape, dtype) of every argument, when `args_path` is None.
        vm: the library is a Relax VM executable (a model): its "main" takes the arguments
            (inputs, then parameters; no output) and returns the output.
    """

    lib_path: str
    args_path: str | None = None
    specs: tuple = ()
    vm: bool = False


@dataclass(frozen=True)
class TorchProgram:
    """A torch program to time, built in the child by `factory(*args) -> (callable, inputs)`.

    `factory` is a module-level function (the child imports it by name). `variant` is one of
    `TORCH_VARIANTS`: "eager" runs the callable as it is (NCHW), "channels_last" converts its
    4-D / 5-D inputs and an `nn.Module`'s parameters to channels-last memory first, "compile"
    runs `torch.compile` (inductor) with `freezing=True`, so an `nn.Module`'s parameters are
    constants it may fold and prepack.
    """

    factory: Callable[..., tuple[Any, list]]
    args: tuple = ()
    variant: str = "eager"


@dataclass(frozen=True)
class OnnxProgram:
    """An ONNX model to time with ONNX Runtime's CPU provider (every graph optimization on, as many
    intra-op threads as torch gets): the model file and an .npz of its inputs in order (`save_args`)."""

    model_path: str
    args_path: str


def save_args(arrays: Sequence[Any], path: Path) -> str:
    """Writes the arguments of a `TvmProgram` (numpy arrays, the output last) to `path` (.npz)."""
    with open(path, "wb") as f:
        np.savez(f, *[np.ascontiguousarray(a) for a in arrays])
    return str(path)


def calibrate(call: Callable[[], Any], min_repeat_ms: float) -> int:
    """Warms `call` up and returns how many calls last at least `min_repeat_ms`."""
    call()  # first call: oneDNN picks and JIT-compiles its kernel; torch.compile compiles
    number = 1
    while True:
        start = time.perf_counter()
        for _ in range(number):
            call()
        elapsed_ms = (time.perf_counter() - start) * 1e3
        if elapsed_ms >= min_repeat_ms:
            return number
        # aim 20% past the threshold, at least doubling (TVM's time_evaluator grows the same way)
        target = number * min_repeat_ms * 1.2 / elapsed_ms if elapsed_ms > 0 else number * 2
        number = max(number * 2, math.ceil(target))


def time_calls(call: Callable[[], Any]) -> float:
    """ms per `call()`: the median of `REPEAT` readings, each of as many calls as last `MIN_REPEAT_MS`
    (`calibrate`, which warms up first); how a torch or ONNX Runtime program is timed in its child."""
    number = calibrate(call, MIN_REPEAT_MS)
    readings = []
    for _ in range(REPEAT):
        start = time.perf_counter()
        for _ in range(number):
            call()
        readings.append((time.perf_counter() - start) / number * 1e3)
    return statistics.median(readings)


@dataclass(frozen=True)
class ChildFunction:
    """A function named by its module and name, imported where it is called: in the child that times a program.

    `time_fresh` hands the child one of these, not the function: this module stays free of TVM, torch and ONNX
    Runtime (every child imports it for the program's description), and each child loads the one runtime it
    times (`bench.timing_tvm`, `bench.timing_torch`, `bench.timing_onnx`)."""

    module: str
    name: str

    def __call__(self, *args: Any) -> Any:
        return getattr(importlib.import_module(self.module), self.name)(*args)


time_library = ChildFunction("bench.timing_tvm", "time_library")  # (TvmProgram, seed) -> ms
time_torch = ChildFunction("bench.timing_torch", "time_torch")  # (TorchProgram, threads) -> ms
time_onnx = ChildFunction("bench.timing_onnx", "time_onnx")  # (OnnxProgram, threads) -> ms
CHILD = Path(__file__).resolve().parent / "child.py"


def in_fresh_process(fn: Callable[..., Any], *args: Any, timeout_s: float = 900, log: Any = None) -> Any:
    """`fn(*args)` in a new process (`bench.child`: it imports what `fn` and `args` name, not this process's entry
    module), one at a time; None when it fails (said on `log`, stderr by default): a crash or a timeout of one
    program never hides the others. `fn` and `args` are pickled, so `fn` is a module's function or a
    `ChildFunction`, not one of an entry script's `__main__`."""
    with tempfile.TemporaryDirectory(prefix="altune-fresh-") as tmp:
        call, result = Path(tmp) / "call.pkl", Path(tmp) / "result.pkl"
        with open(call, "wb") as f:
            pickle.dump(sys.path, f)
            pickle.dump((fn, args), f)
        try:
            # -P: bench/ is not put first on the child's path (its modules would shadow any of the same name)
            done = subprocess.run([sys.executable, "-P", str(CHILD), str(call), str(result)], timeout=timeout_s,
                                  check=False)
            ok, value = (pickle.loads(result.read_bytes()) if result.exists()
                         else (False, f"ChildProcessError: the child exited with {done.returncode}"))
        except subprocess.TimeoutExpired:
            ok, value = False, f"TimeoutError: no result in {timeout_s:g} s"
    if ok:
        return value
    print(f"  timing failed: {value}", file=log or sys.stderr, flush=True)
    return None


@dataclass
class Timings:
    """What `time_fresh` measured: program -> median ms (None: every reading failed), the order, and
    program -> every reading in the order taken (failures left out: the spread a median hides)."""

    ms: dict[Hashable, float | None]
    order: list[Hashable] = field(default_factory=list)
    readings: dict[Hashable, list[float]] = field(default_factory=dict)


def time_fresh(programs: Mapping[Hashable, TvmProgram | TorchProgram | OnnxProgram], *, seed: int = 0, rounds: int = 1,
               threads: int | None = None, log: Any = None) -> Timings:
    """Times every program in a fresh process of its own, one at a time, in shuffled order.

    Args:
        programs: name -> program.
        seed: seeds the order (and random TVM arguments).
        rounds: each round times every program once, in a new shuffled order; a program's
            latency is the median of its rounds' readings.
        threads: torch's and ONNX Runtime's intra-op threads (default: the cores this process may use).
        log: where a line per reading goes (None: nowhere).
    """
    threads = threads or _affinity_cores()
    rng = random.Random(seed)
    readings: dict[Hashable, list[float]] = {name: [] for name in programs}
    order: list[Hashable] = []
    for _ in range(rounds):
        names = list(programs)
        rng.shuffle(names)
        for name in names:
            program = programs[name]
            if isinstance(program, TvmProgram):
                ms = in_fresh_process(time_library, program, seed, log=log)
            elif isinstance(program, OnnxProgram):
                ms = in_fresh_process(time_onnx, program, threads, log=log)
            else:
                ms = in_fresh_process(time_torch, program, threads, log=log)
            order.append(name)
            if ms is not None:
                readings[name].append(ms)
            if log is not None:
                print(f"    {name}: {fmt_ms(ms)} ms", file=log, flush=True)
    return Timings({name: statistics.median(r) if r else None for name, r in readings.items()}, order, readings)


def _affinity_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1
