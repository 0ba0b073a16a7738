"""Model jobs: upload a `torch.export` program (or name a zoo model) to tune end to end.

`POST /api/v1/models` takes multipart form data: `file` (the `torch.export.save`
file) and `spec` (JSON: `input_shapes`, `target`, `layout`, `budget`, `seed`, `name`).
`POST /api/v1/models/zoo` takes JSON naming a built-in model (`GET /api/v1/models/zoo`
lists them). Both import the model before answering, so a bad upload is answered 422
naming the problem and leaves nothing behind; a good one is stored content-addressed
under `<artifact dir>/models/<sha256>.pt2` and becomes a queued job of kind
"model" with one task per distinct fused subgraph, created in the same
transaction. A worker runs it with `service.model_worker.run_model_job`.

Both routes are async and take a place (`slots.SubmissionSlot`, 503 with Retry-After when every one is
taken) before they use a request thread; both check the token's quotas from what the request says (the
declared size, the spec's budget) before the import (`quotas.check_submission`), and again, authoritatively,
in the transaction that writes the job.

An upload is untrusted: it is streamed to a temporary file in the models folder under
`max_upload_bytes` (`service.api.uploads`: 413 before the body is read when `Content-Length` says so,
else at the first byte over), then loaded and imported in a confined child process
(`service.sandbox`) by the loader that evaluates nothing from the file
(`compiler.workloads.pt2`); only then is it moved into the store. A zoo model is exported by a
confined child too (the sandbox's `zoo` command: the API process never imports torch), which saves the
file in its home for this process to store and imports it as an upload.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException, Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.concurrency import run_in_threadpool

from compiler.target import TargetError
from compiler.workloads import zoo
from compiler.workloads.operators import TensorSpec
from compiler.workloads.pt2.rules import ModelError
from service import sandbox
from service.api.auth import WriteCaller, in_auth_thread, too_many
from service.api.common import check_target, errors
from service.api.deps import SettingsDep, invalid
from service.api.devices import check_device
from service.api.jobs import job_public
from service.api.slots import RETRY_SECONDS, SubmissionSlot
from service.api.uploads import Upload, receive_upload
from service.db import API_CONNECTIONS, MODEL_SESSIONS, session_scope
from service.models import Job, TuningTask
from service.quotas import QuotaExceeded, check_new_job, check_submission
from service.schemas import MAX_INT32, MAX_SEED, ErrorPublic, default_model_budget, JobPublic, ZooModelPublic, ZooModelsPublic
from service.settings import Settings
from service.tokens import Caller

router = APIRouter(prefix="/models", tags=["models"])


Shape = Annotated[list[Annotated[int, Field(ge=0, le=MAX_INT32)]], Field(max_length=8)]


class ModelJobSpec(BaseModel):
    """The JSON fields of a model upload."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    name: str | None = Field(None, max_length=64, description="a name for the job; default: the file's name")
    input_shapes: list[Shape] | None = Field(
        None, max_length=64,
        description="example input shapes in call order; must match the exported program's (default: its own)"
    )
    target: str = Field("host", max_length=32, description="where to tune and run: host (this CPU, detected) or "
                                                         "llvm; cuda is refused: no GPU schedule space yet")
    layout: Literal["blocked", "search", "none"] = Field(
        "blocked", description="graph-level layouts: `blocked` puts every dense and depthwise conv2d in N C/c H W "
                               "c (block factors for the target's vector width), weights packed at build time, "
                               "the layout carried through element-wise, pooling, reduction, concat and resize "
                               "operators (the tensors a concat joins share one block; a transposed conv keeps NCHW); "
                               "a conv whose layout TVM's layout pass cannot carry keeps NCHW, with conversions at "
                               "its boundary; `search`: the same, with the channel blocks chosen by ALT's joint stage "
                               "(a layout actor proposes blocks, or NCHW, per group across the graph, each choice measured whole with "
                               "its conversions, about 30% of the budget; the tasks listed at submission are the "
                               "rule's, the job adds those of the layouts it tries); `none` keeps NCHW everywhere")
    fusion: Literal["auto", "none", "chains"] = Field(
        "auto", description="`auto` (the default): each chain of complex operators whose results are used once "
                            "(conv -> conv, depthwise -> pointwise, matmul -> softmax -> matmul) and whose "
                            "intermediates exceed this machine's L2 cache is tuned both ways, fused by basteln as one "
                            "task and as its own operators; the job fuses it where that measured faster, then times "
                            "that model, the one with no chain fused and the one with every chain fused whole and "
                            "serves the fastest (`report.fusion`); `chains`: every "
                            "such chain whose intermediates hold at least half the L2 cache fused, unmeasured; "
                            "`none`: Relax's own fusion only (element-wise operators into a complex one)")
    budget: int | None = Field(
        None, ge=0, le=MAX_INT32,
        description="on-device measurements for the whole model (at most the server's ALTUNE_MAX_BUDGET); omitted: "
                    "chosen from the model, 8 per conv or matmul task, between 64 and 512 (the job's `budget`, and "
                    "`spec.budget_chosen`); 0: nothing measured, every task served from what is known (its stored "
                    "schedule, a similar workload's carried to its shapes, the rule's register-blocked seed)")
    seed: int = Field(0, ge=0, le=MAX_SEED, description="random seed of the search and of the check's inputs")
    licm: bool = Field(True, description="build every task and the model with our loop-invariant code motion; "
                                         "false: TVM's default TIR pipeline")
    device: str | None = Field(
        None, min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._-]+$",
        description="measure every task on a device of this key leased from the server's TVM RPC tracker (`GET "
                    "/api/v1/devices`; the server needs ALTUNE_RPC_TRACKER); the whole model is still checked and "
                    "timed on the worker, for `target`, which must be what the device runs. Omitted: on the worker")


class ZooJobCreate(ModelJobSpec):
    """Tune a built-in model (`compiler.workloads.zoo`): resnet18, mobilenet_v2, bert_tiny, small_cnn, ..."""

    model: str = Field(max_length=64, description="zoo model name")


def _check_spec(spec: ModelJobSpec, settings: Settings, loc: str) -> None:
    if spec.budget is not None and spec.budget > settings.max_budget:
        raise invalid(("body", loc, "budget"), f"budget must be at most {settings.max_budget}, got {spec.budget}")
    try:
        check_target(spec.target)
    except TargetError as e:
        raise invalid(("body", loc, "target"), str(e)) from None
    if spec.device is not None:
        check_device(spec.device, settings, ("body", loc, "device"))


def _model_error(e: ModelError, loc: tuple[str, ...]) -> Exception:
    """A ModelError as a 422: "file" and "model" blame the upload, "input_shapes" the spec field."""
    where = ("body", "spec", "input_shapes") if e.field == "input_shapes" else loc
    return invalid(where, e.message)


def _create(session: Any, name: str, spec: ModelJobSpec, imported: sandbox.ModelSummary, path: Path, digest: str,
            extra: dict, caller: Caller, upload_bytes: int, max_budget: int) -> Job:
    chosen = default_model_budget(sum(t.complex for t in imported.tasks))
    budget = spec.budget if spec.budget is not None else min(chosen, max_budget)
    record = spec.model_dump() | extra | {
        "kind": "model", "name": name, "model_file": str(path), "sha256": digest,
        "input_shapes": [list(s.shape) for s in imported.inputs], "budget": budget,
        "budget_chosen": spec.budget is None,
    }
    job = Job(kind="model", name=name[:64], spec=record, target=spec.target, budget=budget,
              owner_id=caller.token_id, upload_bytes=upload_bytes)
    session.add(job)
    session.flush()
    for index, task in enumerate(imported.tasks):
        session.add(TuningTask(job_id=job.id, index=index, name=task.name[:128], workload_key=task.workload_key,
                               weight=task.weight, budget=0))
    session.flush()
    session.refresh(job)
    return job


def _public(session: Any, job: Job) -> JobPublic:
    return job_public(session, job)


_UPLOAD_BODY = {
    "required": True,
    "content": {"multipart/form-data": {"schema": {
        "type": "object", "title": "ModelUpload", "required": ["file"],
        "properties": {
            "file": {"type": "string", "format": "binary", "contentMediaType": "application/octet-stream",
                     "description": "a torch.export.save file (.pt2), at most `ALTUNE_MAX_UPLOAD_BYTES`"},
            "spec": {"type": "string", "default": "{}",
                     "description": "JSON: input_shapes, target, layout, budget, seed, name"},
        },
    }}},
}
_BUSY: dict[int | str, dict[str, Any]] = {503: {
    "model": ErrorPublic,
    "description": f"every place for a model submission is taken (`ALTUNE_SANDBOX_PROCESSES` + `ALTUNE_UPLOAD_QUEUE`: "
                   f"`Retry-After`, {RETRY_SECONDS} s), the sandbox could not start, or the database cannot be "
                   "reached"}}
_UPLOAD_ERRORS: dict[int | str, dict[str, Any]] = errors(400, 403, 413, 429) | _BUSY | {
    422: {"description": "Validation Error: the spec, or the file (not a plain torch.export program, "
                         "a string torch would evaluate, a zip bomb, an unsupported operator), named in `loc`",
          "content": {"application/json": {"schema": {"$ref": "#/components/schemas/HTTPValidationError"}}}},
}


async def _within_quota(settings: Settings, caller: Caller, *, trials: int = 0, upload_bytes: int = 0) -> None:
    """429 now, before any import, when one more job of `trials` and `upload_bytes` would pass a quota."""
    try:
        await in_auth_thread(_check_submission, settings, caller, trials, upload_bytes)
    except QuotaExceeded as e:
        raise too_many(e) from None


def _check_submission(settings: Settings, caller: Caller, trials: int, upload_bytes: int) -> None:
    with session_scope(settings.resolved_database_url, API_CONNECTIONS) as session:
        check_submission(session, caller, settings, trials=trials, upload_bytes=upload_bytes)


@router.post("", status_code=201, response_model=JobPublic, responses=_UPLOAD_ERRORS,
             openapi_extra={"requestBody": _UPLOAD_BODY})
async def create_model_job(request: Request, settings: SettingsDep, caller: WriteCaller,
                           _slot: SubmissionSlot) -> JobPublic:
    """Upload a torch.export program to tune end to end; answers once it is imported, a worker runs it."""
    declared = request.headers.get("content-length", "")
    # over a quota by the declared size (or a full queue): refused before a byte of the body is read
    await _within_quota(settings, caller, upload_bytes=int(declared) if declared.isdigit() else 0)
    folder = settings.resolved_artifact_dir / "models"
    upload = await receive_upload(request, folder, max_file_bytes=settings.max_upload_bytes)
    try:
        spec = _parse_spec(upload)
        await run_in_threadpool(_check_spec, spec, settings, "spec")
        await _within_quota(settings, caller, trials=spec.budget or 0, upload_bytes=upload.size)
        return await run_in_threadpool(_create_from_upload, settings, upload, spec, caller)
    finally:
        upload.path.unlink(missing_ok=True)  # refused, or already moved into the store


def _parse_spec(upload: Upload) -> ModelJobSpec:
    try:
        return ModelJobSpec.model_validate(json.loads(upload.fields.get("spec", "{}")))
    except json.JSONDecodeError as e:
        raise invalid(("body", "spec"), f"not JSON: {e}") from None
    except ValidationError as e:
        first = e.errors()[0]
        raise invalid(("body", "spec", *first["loc"]), first["msg"]) from None


def _create_from_upload(settings: Settings, upload: Upload, spec: ModelJobSpec, caller: Caller) -> JobPublic:
    try:
        imported = sandbox.import_upload(upload.path, settings, input_shapes=spec.input_shapes, layout=spec.layout,
                                         target=spec.target, fusion=spec.fusion)
    except ModelError as e:
        raise _model_error(e, ("body", "file")) from None
    except sandbox.SandboxError as e:  # the server's fault (limits too low for torch and TVM): try later
        raise HTTPException(503, str(e)) from e
    path = upload.path.parent / f"{upload.sha256}.pt2"
    created = _link(upload.path, path)  # content-addressed: the same bytes again are the same file
    name = spec.name or Path(upload.filename or "model.pt2").stem or "model"
    try:
        job = _store_job(settings, name, spec, imported, path, upload.sha256, {"source": "upload"}, caller,
                         upload.size)
    except BaseException:  # over quota, or the database failed: a refused upload leaves nothing behind
        if created:
            path.unlink(missing_ok=True)
        raise
    # deleting the last other job of these bytes, while this one was not committed yet, removed the file
    _link(upload.path, path)
    return job


def _link(received: Path, path: Path) -> bool:
    """Store the received file as `path` (a hard link: the caller removes `received`); False if it was there."""
    try:
        os.link(received, path)
    except FileExistsError:
        return False
    return True


# the import takes seconds: a model submission opens its session only once it has a job to write (not as a
# SessionDep, whose slot it would hold all along), on connections of its own (db.MODEL_SESSIONS)
_model_sessions = threading.BoundedSemaphore(MODEL_SESSIONS)


def _store_job(settings: Settings, name: str, spec: ModelJobSpec, imported: sandbox.ModelSummary, path: Path,
               digest: str, extra: dict, caller: Caller, upload_bytes: int = 0) -> JobPublic:
    """Write the job and its tasks, within the caller's quota (else 429, and nothing is written)."""
    with _model_sessions, session_scope(settings.resolved_database_url, API_CONNECTIONS) as session:
        job = _create(session, name, spec, imported, path, digest, extra, caller, upload_bytes, settings.max_budget)
        try:
            check_new_job(session, caller, settings, job)
        except QuotaExceeded as e:
            raise too_many(e) from None
        return _public(session, job)


ZOO_FILE = "zoo.pt2"  # where in its home the sandbox's `zoo` command saves the export (`request["file"]`)


@router.get("/zoo", response_model=ZooModelsPublic)
async def read_zoo_models() -> ZooModelsPublic:
    """List the built-in models: the names `POST /api/v1/models/zoo` takes, with example input shapes.

    Read from the zoo's table (`compiler.workloads.zoo.MODELS`): nothing is built or exported.
    """
    data = [
        ZooModelPublic(name=m.name, description=m.description, input_shapes=[list(s) for s in m.input_shapes],
                       input_dtypes=list(m.input_dtypes))
        for m in zoo.MODELS.values()
    ]
    return ZooModelsPublic(data=data, count=len(data))


@router.post("/zoo", status_code=201, response_model=JobPublic, responses=errors(400, 403, 429) | _BUSY)
async def create_zoo_job(body: ZooJobCreate, settings: SettingsDep, caller: WriteCaller,
                         _slot: SubmissionSlot) -> JobPublic:
    """Tune a built-in model (random weights, nothing downloaded); exported and imported in a confined process."""
    if body.model not in zoo.MODELS:
        raise invalid(("body", "model"), f"unknown model {body.model!r}; known: {', '.join(zoo.MODELS)}")
    await run_in_threadpool(_check_spec, body, settings, "spec")
    await _within_quota(settings, caller, trials=body.budget or 0)
    return await run_in_threadpool(_create_zoo_job, body, settings, caller)


def _create_zoo_job(body: ZooJobCreate, settings: Settings, caller: Caller) -> JobPublic:
    folder = settings.resolved_artifact_dir / "models"
    folder.mkdir(parents=True, exist_ok=True)
    request = {
        "model": body.model, "seed": body.seed, "file": ZOO_FILE,
        "input_shapes": body.input_shapes, "layout": body.layout, "target": body.target, "fusion": body.fusion,
        "max_tensor_elements": settings.max_tensor_elements, "max_bytes": settings.max_upload_bytes,
        "max_unpacked_bytes": settings.max_unpacked_bytes, "max_ratio": settings.max_zip_ratio,
    }
    try:
        result, (path, digest) = sandbox.run("zoo", request, limits=sandbox.limits_from(settings),
                                             collect=lambda home: _store_file(home / ZOO_FILE, folder))
    except ModelError as e:
        raise _model_error(e, ("body", "model")) from None
    except sandbox.SandboxError as e:
        raise HTTPException(503, str(e)) from e
    imported = sandbox.ModelSummary(
        inputs=[TensorSpec(name, tuple(shape), dtype) for name, shape, dtype in result["inputs"]],
        tasks=[sandbox.TaskSummary(**t) for t in result["tasks"]])
    spec = ModelJobSpec.model_validate(body.model_dump(exclude={"model"}))
    return _store_job(settings, body.name or body.model, spec, imported, path, digest,
                      {"source": "zoo", "model": body.model}, caller)


def _store_file(source: Path, folder: Path) -> tuple[Path, str]:
    """Copy `source` into the content-addressed store in `folder`: its path there and its SHA-256."""
    digest = hashlib.sha256()
    partial = folder / f".zoo-{os.getpid()}-{threading.get_ident()}.partial"
    with open(source, "rb") as src, open(partial, "wb") as dst:
        while chunk := src.read(1 << 20):
            digest.update(chunk)
            dst.write(chunk)
    path = folder / f"{digest.hexdigest()}.pt2"
    os.replace(partial, path)
    return path, digest.hexdigest()
