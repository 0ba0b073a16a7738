"""A model job's final build, whole-model check, timing and artifact, run in a child process with limits.

    result = build_in_child(settings, graph_dir, request, schedules, dest, should_stop=run.stop_check)

The worker tunes a model's tasks itself (each candidate is built and measured in the measurer's own
processes), but the build of the whole model with its weights, its run against the reference and its timing
allocate what the model allocates: that runs in a child of `service.sandbox` (`build` command) with the
sandbox's address-space limit, `build_cpu_seconds`, `build_timeout_seconds`, no network and no privileges,
so a model that needs more memory or time fails as a job, and the worker lives on. The child reads only files
the worker put in its folder: the translated model (`compiler.workloads.model.exchange`, checked as data again),
the scheduled functions and the request; it writes the artifact and answers with the report.

`build_served` is the step itself: build with the tuned schedules, check whole against torch's outputs (removing
schedules whose model does not match, `build_checked`), time the artifact and the untuned model, serve the
untuned build when it is faster end to end, write the artifact.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from compiler.arrays import random_inputs
from compiler.target import resolve_target
from compiler.workloads.model import (
    build_checked,
    build_model,
    compare_outputs,
    run_model,
    time_model,
    tolerance,
    write_model_artifact,
)
from compiler.workloads.model.exchange import EXPECTED, GRAPH, META, PARAMS, load_graph
from compiler.workloads.model.importer import ImportedModel, graph_blocks, lower_graph
from compiler.workloads.model.tasks import conversions
from compiler.workloads.pt2 import ModelError
from service import sandbox
from service.settings import Settings

SCHEDULES = "schedules.json"
ARTIFACT = "artifact.tar.gz"
GRAPH_FILES = (GRAPH, PARAMS, EXPECTED, META)


def lower_job_model(graph: Any, request: Mapping[str, Any]) -> ImportedModel:
    """The job's model in its layouts: `lower_graph` with the request's layout, fusion and blocks (torch names)."""
    target = resolve_target(request["target"])
    blocks = graph_blocks(graph, request["blocks"], target) if request.get("blocks") else None
    return lower_graph(graph, layout=request["layout"], target=target, fusion=request["fusion"], blocks=blocks,
                       max_tensor_elements=request["max_tensor_elements"])


def build_served(model: ImportedModel, target: Any, schedules: Mapping[str, Any], inputs: Sequence[Any],
                 expected: Sequence[Any], *, pipeline: str, report: dict, tasks: Mapping[str, dict], spec: dict,
                 torch_ms: float | None, dest: Path) -> dict:
    """Builds, checks and times the model with `schedules` and writes the artifact to `dest`.

    Args:
        tasks: per workload key, the tuning facts for the manifest (latency_ms, default_ms, untuned_ms).
        report: the job's report so far; the check, the schedules and the latencies are added.

    Returns:
        {"report", "latency_ms", "untuned_ms", "removed", "served", "error"}: `error` (nothing written) when even
        the untuned model does not match the exported program.
    """
    checked = build_checked(model, target, schedules, inputs, expected, pipeline=pipeline)
    names = {t.workload_key: t.name for t in model.tasks}
    report = dict(report)
    report["check"] = {
        "passed": checked.built is not None,
        "inputs": f"random, seed {spec.get('seed', 0)}",
        "reference": "torch: the exported program (ep.module()), run in the sandbox",
        "builds": checked.builds,
        "mismatches": checked.mismatches,
        "removed_schedules": [{"task": names.get(k, k), "workload_key": k} for k in checked.removed],
    }
    report.setdefault("schedules", {})["tuned"] = len(schedules)
    report["schedules"]["kept"] = len(checked.schedules)
    report["conversions"] = conversions(model.mod)
    result = {"report": report, "removed": list(checked.removed), "served": [], "latency_ms": None,
              "untuned_ms": None, "error": None}
    if checked.built is None:
        result["error"] = f"not served: {checked.error}"
        return result
    built, applied = checked.built, dict(checked.schedules)
    latency = time_model(built, inputs, target)
    untuned_built = checked.untuned if checked.untuned is not None else (
        built if not applied else build_model(model, target, pipeline=pipeline))
    untuned_latency = latency if untuned_built is built else time_model(untuned_built, inputs, target)
    report["served"] = "tuned" if applied else "untuned (no tuned schedule kept)"
    if untuned_built is not built and untuned_latency < latency:
        # each schedule beat its default on its own, but the model is slower with them: timed again (the
        # machine may be noisy), and if it still is, the untuned build (checked like the other) is served
        latency, untuned_latency = time_model(built, inputs, target), time_model(untuned_built, inputs, target)
        if untuned_latency < latency and (checked.untuned is not None or compare_outputs(
                run_model(untuned_built, inputs, target), expected, **tolerance(model)) is None):
            built, latency, applied = untuned_built, untuned_latency, {}
            report["served"] = "untuned: faster end to end than with the tuned schedules"
    report["schedules"]["served"] = len(applied)
    report["latency_ms"] = {"artifact": latency, "untuned": untuned_latency, "torch_eager": torch_ms}
    facts = []
    for t in model.tasks:
        known = tasks.get(t.workload_key, {})
        facts.append({"name": t.name, "workload_key": t.workload_key, "weight": t.weight, "complex": t.complex,
                      "tuned": t.workload_key in applied, "latency_ms": known.get("latency_ms"),
                      "default_ms": known.get("default_ms"), "untuned_ms": known.get("untuned_ms"),
                      "removed_by_check": t.workload_key in checked.removed})
    write_model_artifact(dest, model, built, target, latency_ms=latency, tasks=facts, spec=spec, report=report)
    result.update(latency_ms=latency, untuned_ms=untuned_latency, served=sorted(applied))
    return result


def build_served_from(home: Path, request: dict) -> dict:
    """The child's side: `build_served` on the files in `home` (the `build` command of `service.sandbox`)."""
    import tvm

    graph, expected = load_graph(home, max_tensor_elements=request["max_tensor_elements"],
                                 max_total_bytes=request["max_total_bytes"])
    model = lower_job_model(graph, request)
    texts = json.loads((home / SCHEDULES).read_text())
    schedules = {key: tvm.ir.load_json(text) for key, text in texts.items()}
    inputs = random_inputs([(tuple(x.shape), x.dtype) for x in model.inputs], int(request["seed"]))
    return build_served(model, resolve_target(request["target"]), schedules, inputs, expected,
                        pipeline=request["pipeline"], report=request["report"], tasks=request["tasks"],
                        spec=request["spec"], torch_ms=request["torch_ms"], dest=home / ARTIFACT)


def build_in_child(settings: Settings, graph_dir: Path, request: dict, schedules: Mapping[str, Any], dest: Path,
                   *, should_stop: Callable[[], str | None] | None = None) -> dict:
    """Runs `build_served` in a confined child on the graph in `graph_dir`; the artifact lands at `dest`.

    Raises:
        ModelError: the build failed, ran out of memory, CPU or time (named).
        sandbox.Stopped: `should_stop` gave a reason; the child was killed.
    """
    import tvm

    dest.parent.mkdir(parents=True, exist_ok=True)
    scratch = dest.with_name(f".{dest.name}.{os.getpid()}.schedules.json")
    scratch.write_text(json.dumps({key: tvm.ir.save_json(mod) for key, mod in schedules.items()}))
    limits = sandbox.Limits(memory_bytes=settings.sandbox_memory_bytes, cpu_seconds=settings.build_cpu_seconds,
                            wall_seconds=settings.build_timeout_seconds, processes=settings.sandbox_processes,
                            file_bytes=max(sandbox.Limits.file_bytes, settings.max_unpacked_bytes + (64 << 20)))
    files = {name: graph_dir / name for name in GRAPH_FILES} | {SCHEDULES: scratch}
    try:
        result, _ = sandbox.run("build", request, limits=limits, files=files, should_stop=should_stop,
                                collect=lambda home: copy_regular(home / ARTIFACT, dest, settings.max_upload_bytes * 4)
                                if (home / ARTIFACT).exists() else None)
    finally:
        scratch.unlink(missing_ok=True)
    return result


def copy_regular(source: Path, dest: Path, limit: int) -> Path:
    """Copies `source` to `dest` (atomically) only if it is a regular file of at most `limit` bytes, never
    following a link: what a child wrote into its folder is not trusted to point where it says.

    Raises:
        ModelError: "file", when it is a link, not a regular file, or too large.
    """
    try:
        fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as e:
        raise ModelError("file", f"{source.name}: not a plain file written by the child ({e.strerror})") from e
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
            raise ModelError("file", f"{source.name}: not a regular file of at most {limit} bytes")
        dest.parent.mkdir(parents=True, exist_ok=True)
        partial = dest.with_name(f".{dest.name}.{os.getpid()}.partial")
        with partial.open("wb") as out:
            while chunk := f.read(1 << 20):
                out.write(chunk)
        os.replace(partial, dest)
    return dest
