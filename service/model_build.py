"""A model job's final build, whole-model check, timing and artifact, run in a child process with limits.

    result = build_in_child(settings, graph_dir, request, schedules, dest, should_stop=run.stop_check)

The worker tunes a model's tasks itself (each candidate is built and measured in the measurer's own
processes), but the build of the whole model with its weights, its run against the reference and its timing
allocate what the model allocates: that runs in a child of `service.sandbox` (the `build` command) with the
sandbox's address-space limit, `build_cpu_seconds`, `build_timeout_seconds`, no network and no privileges,
so a model that needs more memory or time fails as a job, and the worker lives on. The child reads only files
the worker put in its folder: the translated model (`compiler.workloads.model.exchange`, checked as data again),
the scheduled functions and the request; it writes the artifact and answers with the report.

The step itself is `tuner.model.serve_model`, the one a benchmark runs in its own process: build with the tuned
schedules, check whole against torch's outputs (removing schedules whose model does not match), time the artifact
and the untuned model, serve the untuned build when it is faster end to end, write the artifact.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable, Mapping
from dataclasses import asdict
from pathlib import Path
import tvm

from compiler.arrays import random_inputs
from compiler.passes.grouping import Chain
from compiler.workloads.model import ImportedModel
from compiler.workloads.model.exchange import EXPECTED, GRAPH, META, PARAMS, load_graph
from compiler.workloads.model.importer import with_chains
from compiler.workloads.pt2 import ModelError
from service import sandbox
from service.settings import Settings
from tuner.model import ModelTuneRequest, ModelTuneResult, lower_model, serve_model

SCHEDULES = "schedules.json"
ARTIFACT = "artifact.tar.gz"
GRAPH_FILES = (GRAPH, PARAMS, EXPECTED, META)


def build_from_files(home: Path, request: dict) -> dict:
    """The child's side (the `build` command of `service.sandbox_child`): `tuner.model.serve_model` on the files in
    `home`: the translated graph (checked as data again), the scheduled functions, the request."""
    tune = ModelTuneRequest(**request["tune"])
    graph, expected = load_graph(home, max_tensor_elements=tune.max_tensor_elements,
                                 max_total_bytes=request["max_total_bytes"])
    unmerged = lower_model(graph, tune, request["blocks"])  # lowered once: fusion "auto" merges chains of it

    def merged(chains: list[dict]) -> ImportedModel:
        return with_chains(unmerged, [Chain.from_json(c) for c in chains], tune.max_tensor_elements)

    model = merged(request.get("chains") or [])
    # fusion "auto": the models with other chains fused, timed against it end to end
    alternatives = {name: merged(other) for name, other in (request.get("alternatives") or {}).items()}
    texts = json.loads((home / SCHEDULES).read_text())
    schedules = {key: tvm.ir.load_json(text) for key, text in texts.items()}
    inputs = random_inputs([(tuple(x.shape), x.dtype) for x in model.inputs], tune.seed)
    return serve_model(model, tune, schedules, inputs, expected, dest=home / ARTIFACT, facts=request["facts"],
                       report=request["report"], torch_ms=request["torch_ms"], spec=request["spec"],
                       alternatives=alternatives)


def build_in_child(settings: Settings, graph_dir: Path, tuned: ModelTuneResult, dest: Path, *, spec: dict,
                   torch_ms: Mapping[str, float | None] | None,
                   should_stop: Callable[[], str | None] | None = None) -> dict:
    """Runs `tuner.model.serve_model` in a confined child on the graph in `graph_dir` with `tuned`'s picks; the
    artifact lands at `dest`. `torch_ms` is torch's latencies for the report (`prepare_model`'s
    `{"eager", "compile"}`). Returns `serve_model`'s answer.

    Raises:
        ModelError: the build failed, ran out of memory, CPU or time (named).
        sandbox.Stopped: `should_stop` gave a reason; the child was killed.
    """
    request = {"tune": asdict(tuned.request), "blocks": tuned.model.blocks if tuned.request.layout == "search" else None,
               "max_total_bytes": settings.sandbox_memory_bytes, "report": tuned.report, "facts": tuned.facts,
               "spec": spec, "torch_ms": dict(torch_ms) if torch_ms is not None else None,
               "chains": [c.to_json() for c in tuned.model.chains] if tuned.request.fusion == "auto" else [],
               "alternatives": {name: [c.to_json() for c in m.chains] for name, m in tuned.alternatives.items()}}
    dest.parent.mkdir(parents=True, exist_ok=True)
    scratch = dest.with_name(f".{dest.name}.{os.getpid()}.schedules.json")
    scratch.write_text(json.dumps({key: tvm.ir.save_json(mod) for key, mod in tuned.schedules.items()}))
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
