"""Tensor instructions with loop partitioning (`compiler.passes.tensorize`) on shapes that do not divide the
instruction (the paper's Table II: 55x55 maps, 255 and 127 channels), against the same schedule without
them, TVM MetaSchedule and torch, with the machine's measured fp32 peak beside each GEMM:

    python -m bench.tensorize [--quick] [--cases SUBSTRING] [--ms-budget N] [--out FILE] [--update REPORT]

Cases: fp32, int8 (u8 x s8 -> s32) and bf16 (-> fp32) GEMM and NHWC conv2d (3x3, stride 1, same padding),
and fp32 element-wise add/sub/mul/relu. Variants of each:

- "ours": the default micro-kernel schedule (`kernels.schedule_*`), marked, partitioned and tensorized;
- "no-partition": the same, instructions selected without partitioning first (only nests that divide match);
- "plain": the same schedule unmarked (the innermost loops left to LLVM's vectorizer);
- "metaschedule": TVM MetaSchedule (`bench.baselines.metaschedule`, `--ms-budget` measurements) on the same
  program (packed weights included: it sees what ours sees);
- "torch": eager torch on the same data (NHWC as channels_last; int8 GEMM through `torch._int_mm` with
  s8 activations where this torch has it, int8 conv2d: none).

Every program is checked against numpy (float64) and timed in a fresh process of its own (`time_evaluator`,
median of `--repeat`), one after another. "peak" is an FMA loop on every core (independent accumulators,
the target's widest fp32 FMA), timed the same way; GEMM rows give ours as a share of it. The table names the
target (`-mcpu`, `-mattr`) and the JSON goes to `bench/results/tensorize-<cpu>[-quick].json`.

`--quick` runs four small cases with MetaSchedule at 4 measurements (a minute or two): it shows the
benchmark works, its numbers mean nothing. Numbers worth reading need a quiet machine and the full run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import tvm
from tvm import s_tir, te, tirx

from bench.baselines import metaschedule
from bench.common import RESULTS_DIR, geomean
from bench.environment import environment
from compiler.build import compile_module
from compiler.passes.tensorize import choose, kernels, tensorize_module, without_tensorize
from compiler.target import host_cores, host_cpu, resolve_target, target_key

VARIANTS = ("ours", "no-partition", "plain", "metaschedule", "torch")
PEAK_ACCUMULATORS = 12  # independent FMA chains per core: more than latency x throughput (4 x 2)


@dataclass(frozen=True)
class Case:
    """One operator instance: kind "gemm" (m, n, k), "conv2d" (n, h, w, c, f, kernel) or an element-wise op
    (shape)."""

    name: str
    kind: str
    dtype: str
    params: dict[str, Any] = field(hash=False)

    @property
    def flops(self) -> int:
        p = self.params
        if self.kind == "gemm":
            return 2 * p["m"] * p["n"] * p["k"]
        if self.kind == "conv2d":
            return 2 * p["n"] * p["h"] * p["w"] * p["f"] * p["c"] * p["kernel"] ** 2
        size = 1
        for d in p["shape"]:
            size *= d
        return size


def _cases() -> list[Case]:
    cases = []
    for dtype in ("float32", "int8", "bfloat16"):
        short = {"float32": "f32", "int8": "i8", "bfloat16": "bf16"}[dtype]
        for m, n, k in ((512, 512, 512), (3025, 127, 255), (3025, 255, 128), (255, 255, 255), (127, 1000, 127)):
            cases.append(Case(f"gemm_{short}_{m}x{n}x{k}", "gemm", dtype, {"m": m, "n": n, "k": k}))
        for h, c, f in ((55, 128, 255), (55, 255, 127), (55, 64, 127), (56, 128, 128)):
            cases.append(Case(f"conv2d_{short}_{h}x{h}x{c}_to_{f}", "conv2d", dtype,
                              {"n": 1, "h": h, "w": h, "c": c, "f": f, "kernel": 3}))
    for op in ("add", "sub", "mul", "relu"):
        for shape in ((255, 55, 55), (127, 55, 55), (255, 27, 27), (256, 56, 56)):
            cases.append(Case(f"{op}_{'x'.join(map(str, shape))}", op, "float32", {"shape": shape}))
    return cases


CASES = _cases()
QUICK = (
    Case("gemm_f32_55x127x255", "gemm", "float32", {"m": 55, "n": 127, "k": 255}),
    Case("gemm_i8_55x127x255", "gemm", "int8", {"m": 55, "n": 127, "k": 255}),
    Case("conv2d_bf16_13x13x64_to_127", "conv2d", "bfloat16", {"n": 1, "h": 13, "w": 13, "c": 64, "f": 127,
                                                               "kernel": 3}),
    Case("add_31x55x55", "add", "float32", {"shape": (31, 55, 55)}),
)


# ---------------------------------------------------------------------------
# Programs and data


def programs(case: Case, target: Any) -> tuple[Any, dict[str, Any]]:
    """(the untransformed PrimFunc, variant -> scheduled module) of `case` on `target`."""

    if case.kind in kernels.ELEMENTWISE:
        lanes = kernels.blocking(target, "float32").lanes
        func = kernels.elementwise(case.kind, tuple(case.params["shape"]))
        ours = kernels.schedule_elementwise(func, lanes)
        plain = kernels.schedule_elementwise(func, lanes, marked=False)
    else:
        blk = kernels.blocking(target, case.dtype)
        types = kernels.operands(target, case.dtype)
        p = case.params
        if case.kind == "gemm":
            func = kernels.gemm(p["m"], p["n"], p["k"], case.dtype, blk.lanes, types=types)
            ours, plain = kernels.schedule_gemm(func, blk), kernels.schedule_gemm(func, blk, marked=False)
        else:
            func = kernels.conv2d(p["n"], p["h"], p["w"], p["c"], p["f"], p["kernel"], case.dtype, blk.lanes,
                                  types=types)
            ours, plain = kernels.schedule_conv2d(func, blk), kernels.schedule_conv2d(func, blk, marked=False)
    no_partition = tvm.IRModule({"main": without_tensorize(ours["main"], "no-partition")})
    return func, {"ours": ours, "no-partition": no_partition, "plain": plain}


def data(case: Case, target: Any, seed: int = 0) -> tuple[list[Any], Any, list[Any]]:
    """(TVM inputs in call order, the float64/int64 reference output, the logical inputs for torch)."""

    rng = np.random.default_rng(seed)
    if case.kind in kernels.ELEMENTWISE:
        shape = tuple(case.params["shape"])
        xs = [rng.standard_normal(shape).astype(np.float32) for _ in range(1 if case.kind == "relu" else 2)]
        ref = {"add": np.add, "sub": np.subtract, "mul": np.multiply,
               "relu": lambda x: np.maximum(x, 0)}[case.kind](*[x.astype(np.float64) for x in xs])
        return xs, ref, xs
    blk = kernels.blocking(target, case.dtype)
    a_t, b_t, _ = kernels.operands(target, case.dtype)

    def make(shape: tuple, dtype: str) -> Any:
        if case.dtype == "int8":
            return rng.integers(0 if dtype == "uint8" else -128, 128, shape).astype(dtype)
        np_t = np.float32 if case.dtype == "float32" else ml_dtypes.bfloat16
        return rng.standard_normal(shape).astype(np_t)

    p = case.params
    if case.kind == "gemm":
        a, b = make((p["m"], p["k"]), a_t), make((p["k"], p["n"]), b_t)
        ref = a.astype(np.float64) @ b.astype(np.float64)
        return [a, kernels.pack_gemm_weight(b, blk.lanes, blk.group)], ref, [a, b]
    x = make((p["n"], p["h"], p["w"], p["c"]), a_t)
    w = make((p["kernel"], p["kernel"], p["c"], p["f"]), b_t)
    pad = p["kernel"] // 2
    xp = np.pad(x.astype(np.float64), ((0, 0), (pad, pad), (pad, pad), (0, 0)))
    ref = sum(np.einsum("nhwc,cf->nhwf", xp[:, i:i + p["h"], j:j + p["w"], :], w[i, j].astype(np.float64))
              for i in range(p["kernel"]) for j in range(p["kernel"]))
    weight = kernels.pack_conv_weight(w, blk.lanes, blk.group)
    return [x, weight], ref, [x, w]


# ---------------------------------------------------------------------------
# Measuring


def save_inputs(path: Path, arrays: list) -> None:
    """The arrays to `path` (.npz); bf16 as its bits, its dtype beside it (`load_inputs` restores it)."""
    np.savez(path, *[a.view(np.uint16) if a.dtype.name == "bfloat16" else a for a in arrays],
             dtypes=np.array([a.dtype.name for a in arrays]))


_LOAD = """
import numpy as np, ml_dtypes
data = np.load({path!r})
names = list(data["dtypes"])
arrays = [data[f"arr_{{i}}"].view(ml_dtypes.bfloat16) if names[i] == "bfloat16" else data[f"arr_{{i}}"]
          for i in range(len(names))]
"""


def time_in_own_process(lib_path: Path, inputs_path: Path, output: tuple, repeat: int, min_repeat_ms: int) -> float:
    """Median latency (ms) of the library's "main" on the saved inputs (`save_inputs`), measured by a fresh
    Python process (as `bench.licm.time_in_own_process`, with bf16 inputs)."""
    code = (
        "import json, tvm\n" + _LOAD.format(path=str(inputs_path)) +
        f"lib = tvm.runtime.load_module({str(lib_path)!r})\n"
        "args = [tvm.runtime.tensor(a) for a in arrays]\n"
        f"args.append(tvm.runtime.tensor(np.zeros({tuple(output[0])!r}, {output[1]!r})))\n"
        "lib['main'](*args)\n"
        f"t = lib.time_evaluator('main', tvm.cpu(0), number=1, repeat={repeat}, min_repeat_ms={min_repeat_ms})\n"
        "r = sorted(t(*args).results)\n"
        "print(json.dumps(r[len(r) // 2] * 1e3))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError((done.stderr.strip() or "no output").splitlines()[-1][:200])
    return float(done.stdout.strip().splitlines()[-1])


def _export_and_check(mod: Any, target: Any, inputs: list, ref: Any, out_dtype: str, path: Path,
                      pipeline: str = "licm") -> tuple[bool, float]:
    """Builds `mod` (our pipeline), writes the library to `path`, runs it once: (correct, max relative error)."""

    lib = compile_module(mod, target, pipeline) if pipeline else tvm.compile(mod, target=target)
    lib.export_library(str(path))
    args = [tvm.runtime.tensor(a) for a in inputs] + [tvm.runtime.tensor(np.zeros(ref.shape, out_dtype))]
    lib.jit()["main"](*args)
    out = args[-1].numpy().astype(np.float64)
    err = float(np.abs(out - ref).max(initial=0.0)) / max(1.0, float(np.abs(ref).max(initial=0.0)))
    return err <= (0 if out_dtype == "int32" else 1e-4), err


_TORCH = r"""
import json, statistics, sys, time
import numpy as np, torch
import torch.nn.functional as F
sys.path.insert(0, {root!r})
from bench.common import calibrate
torch.set_num_threads({threads})
kind, dtype = {kind!r}, {dtype!r}
{load}
xs = arrays
def tensor(a):
    if a.dtype.name == "bfloat16":
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)
ts = [tensor(a) for a in xs]
if kind == "gemm":
    if dtype == "int8":
        a, b = ts[0].to(torch.int8), ts[1].to(torch.int8)   # torch._int_mm: s8 x s8 -> s32 (data below 128)
        call = lambda: torch._int_mm(a, b)
    else:
        call = lambda: ts[0] @ ts[1]
elif kind == "conv2d":
    if dtype == "int8":
        raise SystemExit("no int8 conv2d in eager torch")
    x = ts[0].permute(0, 3, 1, 2).contiguous(memory_format=torch.channels_last)
    w = ts[1].permute(3, 2, 0, 1).contiguous(memory_format=torch.channels_last)
    call = lambda: F.conv2d(x, w, padding={pad})
else:
    fn = {{"add": torch.add, "sub": torch.sub, "mul": torch.mul}}.get(kind)
    call = (lambda: fn(ts[0], ts[1])) if fn else (lambda: torch.relu(ts[0]))
with torch.inference_mode():
    number = calibrate(call, {min_repeat_ms})
    readings = []
    for _ in range({repeat}):
        start = time.perf_counter()
        for _ in range(number):
            call()
        readings.append((time.perf_counter() - start) / number * 1e3)
print(json.dumps(statistics.median(readings)))
"""


def torch_ms(case: Case, torch_inputs: list, folder: Path, repeat: int, min_repeat_ms: int) -> float:
    """Median latency (ms) of the torch op in a fresh process."""
    path = folder / "torch_inputs.npz"
    save_inputs(path, torch_inputs)
    code = _TORCH.format(root=str(Path(__file__).resolve().parent.parent), threads=host_cores(), kind=case.kind,
                         dtype=case.dtype, load=_LOAD.format(path=str(path)), pad=case.params.get("kernel", 1) // 2,
                         min_repeat_ms=min_repeat_ms, repeat=repeat)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError((done.stderr.strip() or done.stdout.strip()).splitlines()[-1][:200])
    return float(done.stdout.strip().splitlines()[-1])


def peak_gflops(target: Any, repeat: int, min_repeat_ms: int, iterations: int = 200_000) -> dict:
    """The fp32 FMA peak of this machine (GFLOP/s): on every core, `PEAK_ACCUMULATORS` independent vector FMA
    chains of the target's widest fp32 FMA, timed in a process of its own."""

    ins = choose(target, "float32", "float32", "float32", 1)
    lanes = ins.lanes if ins is not None else 4
    cores = host_cores()
    vec = f"float32x{lanes}"
    out = tirx.decl_buffer((cores * PEAK_ACCUMULATORS * lanes,), "float32", "out")
    core, it = tirx.Var("core", "int32"), tirx.Var("it", "int32")
    acc = tirx.decl_buffer((PEAK_ACCUMULATORS,), vec, "acc", scope="local")
    x = tirx.Broadcast(tirx.const(0.999, "float32"), lanes)
    y = tirx.Broadcast(tirx.const(0.001, "float32"), lanes)
    init = [tirx.BufferStore(acc, tirx.Broadcast(tirx.Cast("float32", core + a), lanes), [a])
            for a in range(PEAK_ACCUMULATORS)]
    step = [tirx.BufferStore(acc, tvm.tirx.call_llvm_pure_intrin(vec, "llvm.fma", tirx.BufferLoad(acc, [a]), x, y)
                             if ins is not None else tirx.BufferLoad(acc, [a]) * x + y, [a])
            for a in range(PEAK_ACCUMULATORS)]
    store = [tirx.BufferStore(out, tirx.BufferLoad(acc, [a]),
                              [tirx.Ramp((core * PEAK_ACCUMULATORS + a) * lanes, 1, lanes)])
             for a in range(PEAK_ACCUMULATORS)]
    body = tirx.SeqStmt([tirx.AllocBuffer(acc), *init,
                         tirx.For(it, 0, iterations, tirx.ForKind.SERIAL, tirx.SeqStmt(step)), *store])
    func = tirx.PrimFunc([out], tirx.For(core, 0, cores, tirx.ForKind.PARALLEL, body)).with_attr(
        "global_symbol", "main")
    with tempfile.TemporaryDirectory(prefix="altune-peak-") as tmp:
        lib_path, inputs = Path(tmp) / "peak.so", Path(tmp) / "inputs.npz"
        tvm.compile(tvm.IRModule({"main": func}), target=target).export_library(str(lib_path))
        save_inputs(inputs, [])
        ms = time_in_own_process(lib_path, inputs, ((cores * PEAK_ACCUMULATORS * lanes,), "float32"), repeat,
                                 min_repeat_ms)
    flops = 2 * cores * iterations * PEAK_ACCUMULATORS * lanes
    return {"gflops": flops / ms / 1e6, "lanes": lanes, "cores": cores, "instruction": ins.name if ins else None}


def bandwidth_gbs(target: Any, repeat: int, min_repeat_ms: int, megabytes: int = 256) -> dict:
    """This machine's memory bandwidth (GB/s, bytes read plus written): a copy of `megabytes` of fp32 on every
    core (a parallel, vectorized loop: far beyond any cache), timed in a process of its own."""

    lanes = (ins.lanes if (ins := choose(target, "float32", "float32", "float32", 1)) is not None else 4)
    n = megabytes * 1024 * 1024 // 4
    a = te.placeholder((n,), "float32", name="a")
    out = te.compute((n,), lambda i: a[i], name="copy")
    sch = s_tir.Schedule(te.create_prim_func([a, out]).with_attr("global_symbol", "main"))
    outer, inner = sch.split(sch.get_loops(sch.get_sblock("copy"))[0], [None, 4096])
    sch.parallel(outer)
    _, vec = sch.split(inner, [None, lanes])
    sch.vectorize(vec)
    with tempfile.TemporaryDirectory(prefix="altune-bandwidth-") as tmp:
        lib_path, inputs = Path(tmp) / "copy.so", Path(tmp) / "inputs.npz"
        tvm.compile(sch.mod, target=target).export_library(str(lib_path))
        save_inputs(inputs, [np.ones(n, "float32")])
        ms = time_in_own_process(lib_path, inputs, ((n,), "float32"), repeat, min_repeat_ms)
    return {"gbs": 2 * n * 4 / ms / 1e6, "megabytes": megabytes, "cores": host_cores()}


def measure(case: Case, target: Any, ms_budget: int, repeat: int, min_repeat_ms: int, torch: bool = True,
            variants: tuple[str, ...] = VARIANTS) -> dict:
    """One row: every variant built, checked against numpy and timed in its own process."""

    row: dict[str, Any] = {"name": case.name, "kind": case.kind, "dtype": case.dtype, "params": case.params,
                           "flops": case.flops}
    func, mods = programs(case, target)
    inputs, ref, torch_inputs = data(case, target)
    out_dtype = "int32" if case.dtype == "int8" else "float32"
    _, reports = tensorize_module(tvm.tirx.transform.BindTarget(target)(mods["ours"]))
    row["instructions"] = sorted(set(reports["main"].used)) if "main" in reports else []
    row["left_alone"] = len(reports["main"].left) if "main" in reports else 0
    with tempfile.TemporaryDirectory(prefix="altune-tensorize-") as tmp:
        folder = Path(tmp)
        save_inputs(folder / "inputs.npz", inputs)
        libs: dict[str, Path] = {}
        for variant, mod in mods.items():
            if variant not in variants:
                continue
            try:
                libs[variant] = folder / f"{variant}.so"
                row[f"{variant}_correct"], row[f"{variant}_err"] = _export_and_check(
                    mod, target, inputs, ref, out_dtype, libs[variant])
            except Exception as e:  # noqa: BLE001 - a failing variant is a cell that says why
                row[f"{variant}_error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[-1][:200]}"
                libs.pop(variant)
        if ms_budget > 0 and "metaschedule" in variants:
            start = time.perf_counter()
            expected = ref.astype(out_dtype)
            base = metaschedule(func, target, ms_budget, inputs=inputs, expected=expected)
            row["metaschedule_tune_s"] = round(time.perf_counter() - start, 1)
            if base.mod is not None and base.error is None:
                libs["metaschedule"] = folder / "metaschedule.so"
                row["metaschedule_correct"], row["metaschedule_err"] = _export_and_check(
                    base.mod, target, inputs, ref, out_dtype, libs["metaschedule"], pipeline="")
            else:
                row["metaschedule_error"] = base.error
        for variant, path in libs.items():
            row[f"{variant}_ms"] = time_in_own_process(path, folder / "inputs.npz", (ref.shape, out_dtype), repeat,
                                                       min_repeat_ms)
        try:
            if torch and "torch" in variants:
                row["torch_ms"] = torch_ms(case, torch_inputs, folder, repeat, min_repeat_ms)
        except Exception as e:  # noqa: BLE001
            row["torch_error"] = str(e)
    for variant in VARIANTS[1:]:
        if row.get("ours_ms") and row.get(f"{variant}_ms"):
            row[f"speedup_vs_{variant}"] = row[f"{variant}_ms"] / row["ours_ms"]
    if row.get("ours_ms") and case.kind in ("gemm", "conv2d"):
        row["ours_gflops"] = case.flops / row["ours_ms"] / 1e6
    return row


# ---------------------------------------------------------------------------
# Report


def summarize(rows: list[dict], peak: dict) -> dict:
    """Geometric-mean speedups of ours over each variant, and ours as a share of the fp32 peak on GEMMs."""
    out: dict[str, Any] = {}
    for variant in VARIANTS[1:]:
        ratios = [r[f"speedup_vs_{variant}"] for r in rows if r.get(f"speedup_vs_{variant}")]
        out[f"geomean_vs_{variant}"] = geomean(ratios)
        out[f"max_vs_{variant}"] = max(ratios, default=None)
    shares = {r["name"]: r["ours_gflops"] / peak["gflops"] for r in rows
              if r["kind"] == "gemm" and r["dtype"] == "float32" and r.get("ours_gflops")}
    out["fp32_gemm_share_of_peak"] = shares
    out["wrong"] = sorted(r["name"] for r in rows for v in VARIANTS if r.get(f"{v}_correct") is False)
    return out


def _cell(row: dict, variant: str) -> str:
    if f"{variant}_ms" in row:
        mark = "" if row.get(f"{variant}_correct", True) else "!"
        return f"{row[f'{variant}_ms']:.4f}{mark}"
    return "err" if f"{variant}_error" in row else "-"


def table(report: dict) -> str:
    peak = report["peak"]
    lines = [f"Target: {report['target']}  (CPU: {report['environment'].get('cpu', '?')}, "
             f"{peak['cores']} cores; fp32 peak {peak['gflops']:.0f} GFLOP/s with {peak['instruction']})", "",
             f"{'case':<30} {'instructions':<34} " + " ".join(f"{v:>12}" for v in VARIANTS)
             + f" {'GFLOP/s':>8} {'%peak':>6}"]
    for r in report["rows"]:
        gflops = r.get("ours_gflops")
        share = f"{100 * gflops / peak['gflops']:.0f}%" if gflops and r["dtype"] == "float32" else ""
        lines.append(f"{r['name'][:30]:<30} {','.join(r.get('instructions', []))[:34]:<34} "
                     + " ".join(f"{_cell(r, v):>12}" for v in VARIANTS)
                     + f" {gflops or 0:>8.1f} {share:>6}")
    s = report["summary"]
    lines.append("")
    lines.append("ms per call (median, each in a process of its own; '!' = wrong result). ours over: "
                 + ", ".join(f"{v} {s[f'geomean_vs_{v}']:.2f}x (max {s[f'max_vs_{v}']:.2f}x)"
                             for v in VARIANTS[1:] if s.get(f"geomean_vs_{v}")))
    if s["wrong"]:
        lines.append(f"WRONG RESULTS: {', '.join(s['wrong'])}")
    return "\n".join(lines)


def run(cases: list[Case], ms_budget: int, repeat: int, min_repeat_ms: int, log: Any = print,
        torch: bool = True, variants: tuple[str, ...] = VARIANTS, peak: dict | None = None,
        mcpu: str | None = None) -> dict:
    """Measures `cases` (the `variants` of each) and the fp32 peak (unless given) and returns the report; `mcpu`:
    ours, MetaSchedule and the peak built for that CPU instead of this one (e.g. "haswell": an AVX2 target, which
    a CPU with AVX-512 also runs; torch runs what it runs on this CPU)."""

    target = resolve_target("host") if mcpu is None else tvm.target.Target(
        {"kind": "llvm", "mcpu": mcpu, "num-cores": host_cores()})
    peak = peak or peak_gflops(target, repeat, min_repeat_ms)
    log(f"fp32 peak: {peak['gflops']:.0f} GFLOP/s ({peak['instruction']}, {peak['cores']} cores)")
    rows = []
    for i, case in enumerate(cases):
        try:
            rows.append(measure(case, target, ms_budget, repeat, min_repeat_ms, torch, variants))
        except Exception as e:  # noqa: BLE001
            rows.append({"name": case.name, "kind": case.kind, "dtype": case.dtype, "error": f"{type(e).__name__}: {e}"})
        r = rows[-1]
        log(f"[{i + 1}/{len(cases)}] {case.name}: " + (r.get("error") or ", ".join(
            f"{v} {r[f'{v}_ms']:.4f} ms" for v in VARIANTS if f"{v}_ms" in r)))
    return {"benchmark": "tensorize", "target": target_key("host") if mcpu is None else f"llvm -mcpu={mcpu} -num-cores={host_cores()}",
            "peak": peak,
            "rows": rows,
            "summary": summarize(rows, peak), "environment": environment(), "ms_budget": ms_budget,
            "repeat": repeat, "min_repeat_ms": min_repeat_ms}


def update(base: dict, new: dict) -> dict:
    """`base` with `new`'s rows in place of its rows of the same names (new names appended), the summary
    recomputed and `new`'s environment (commit, date) and cases listed under "updates"; a case that failed now
    keeps its old row (the error listed under the update's "failed")."""
    if base["target"] != new["target"]:
        raise ValueError(f"cannot update a report of {base['target']} with rows of {new['target']}")
    rows = {r["name"]: r for r in base["rows"]}
    measured = [r for r in new["rows"] if "error" not in r]
    rows.update({r["name"]: r for r in measured})
    out = {**base, "rows": list(rows.values())}
    out["summary"] = summarize(out["rows"], base["peak"])
    failed = {r["name"]: r["error"] for r in new["rows"] if "error" in r}
    out["updates"] = [*base.get("updates", []), {"cases": [r["name"] for r in measured],
                                                   "environment": new["environment"], **({"failed": failed} if failed else {})}]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tensorize", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"{len(QUICK)} small cases, MetaSchedule at 4 trials")
    parser.add_argument("--cases", help="only the cases whose name contains this")
    parser.add_argument("--ms-budget", type=int, help="MetaSchedule's measurements per case (default 64; 0: skip)")
    parser.add_argument("--no-torch", action="store_true", help="leave torch out")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--min-repeat-ms", type=int, default=100)
    parser.add_argument("--out", type=Path, help="the JSON report (default bench/results/tensorize-CPU.json)")
    parser.add_argument("--update", type=Path, metavar="REPORT",
                        help="write the cases measured now into REPORT (a full run's JSON, same CPU) in place of "
                             "its rows of the same names, the summary recomputed, and the commit of each update "
                             "listed under 'updates'; the peak stays REPORT's")
    parser.add_argument("--mcpu", help="build ours, MetaSchedule and the peak for this LLVM CPU instead of the host's "
                                       "(e.g. haswell: AVX2 on a machine with AVX-512; torch stays the host's)")
    args = parser.parse_args(argv)

    cases = [c for c in (QUICK if args.quick else CASES) if not args.cases or args.cases in c.name]
    budget = args.ms_budget if args.ms_budget is not None else (4 if args.quick else 64)
    repeat, min_repeat_ms = (3, 20) if args.quick else (args.repeat, args.min_repeat_ms)
    base = json.loads(args.update.read_text()) if args.update else None
    report = run(cases, budget, repeat, min_repeat_ms, log=lambda line: print(line, flush=True),
                 torch=not args.no_torch, mcpu=args.mcpu, peak=base["peak"] if base else None)
    if base is not None:
        report = update(base, report)
    cpu = host_cpu() if args.mcpu is None else f"{args.mcpu}-on-{host_cpu()}"
    out = args.out or args.update or RESULTS_DIR / f"tensorize-{cpu}{'-quick' if args.quick else ''}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1, default=str))
    print(table(report))
    print(f"report written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
