"""Model jobs: upload a `torch.export` program (or name a zoo model) to tune end to end.

`POST /api/v1/models` takes multipart form data: `file` (the `torch.export.save`
file) and `spec` (JSON: `input_shapes`, `target`, `layout`, `budget`, `seed`, `name`).
`POST /api/v1/models/zoo` takes JSON naming a built-in model (`GET /api/v1/models/zoo`
lists them). Both import the model before answering, so a bad upload is answered 422
naming the problem and leaves nothing behind; a good one is stored content-addressed
under `<artifact dir>/models/<sha256>.pt2` and becomes a queued job of kind
"model" with one task per distinct fused subgraph, created in the same
transaction. A worker runs it with `service.model_worker.run_model_job`.

An upload is untrusted: it is streamed to a temporary file in the models folder under
`max_upload_bytes` (`service.api.uploads`: 413 before the body is read when `Content-Length` says so,
else at the first byte over), then loaded and imported in a confined child process
(`service.sandbox`) by the loader that evaluates nothing from the file
(`compiler.workloads.pt2`); only then is it moved into the store. Zoo models are built by our own
code and imported in-process.
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

from service.api.auth import WriteCaller, in_auth_thread, too_many
from service.api.common import errors
from service.api.deps import SettingsDep, invalid
from service.db import API_CONNECTIONS, MODEL_SESSIONS, session_scope
from service.api.uploads import Upload, receive_upload
from service.models import Job, TuningTask
from service.quotas import QuotaExceeded, check_new_job, check_upload
from service.tokens import Caller
from service.schemas import MAX_INT32, JobPublic, ZooModelPublic, ZooModelsPublic
from tuner import MAX_SEED

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
    target: str = Field("host", max_length=32, description="where to tune and run: host, llvm, cuda (only where the "
                                                         "server has a GPU)")
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
    fusion: Literal["none", "chains"] = Field(
        "none", description="`chains`: chains of complex operators whose results are used once (conv -> conv, "
                            "depthwise -> pointwise, matmul -> softmax -> matmul) and whose intermediates hold at least "
                            "half the L2 cache become one task each, tiled and fused by basteln and tuned in its "
                            "space; `none`: Relax's own fusion (element-wise operators into a complex one)")
    budget: int = Field(64, ge=1, le=MAX_INT32, description="on-device measurements for the whole model (at most "
                                                            "the server's ALTUNE_MAX_BUDGET)")
    seed: int = Field(0, ge=0, le=MAX_SEED, description="random seed of the search and of the check's inputs")
    licm: bool = Field(True, description="build every task and the model with our loop-invariant code motion; "
                                         "false: TVM's default TIR pipeline")


class ZooJobCreate(ModelJobSpec):
    """Tune a built-in model (`compiler.workloads.zoo`): resnet18, mobilenet_v2, bert_tiny, small_cnn, ..."""

    model: str = Field(max_length=64, description="zoo model name")


def _check_spec(spec: ModelJobSpec, settings: Any, loc: str) -> None:
    from compiler.target import TargetError, check_available

    if spec.budget > settings.max_budget:
        raise invalid(("body", loc, "budget"), f"budget must be at most {settings.max_budget}, got {spec.budget}")
    try:
        check_available(spec.target)
    except TargetError as e:
        raise invalid(("body", loc, "target"), str(e)) from None


def _import(data: bytes, spec: ModelJobSpec, settings: Any, loc: tuple[str, ...]) -> Any:
    """The imported model (in-process: for zoo models, built by our own code), or a 422 naming the field."""
    from compiler.target import resolve_target
    from compiler.workloads.model import ModelError, import_model, load_exported_program

    try:
        ep = load_exported_program(data, max_bytes=settings.max_upload_bytes)
        return import_model(ep, spec.input_shapes, layout=spec.layout, target=resolve_target(spec.target),
                            fusion=spec.fusion,
                            max_tensor_elements=settings.max_tensor_elements)
    except ModelError as e:
        raise _model_error(e, loc) from None


def _model_error(e: Any, loc: tuple[str, ...]) -> Exception:
    """A ModelError as a 422: "file" and "model" blame the upload, "input_shapes" the spec field."""
    where = ("body", "spec", "input_shapes") if e.field == "input_shapes" else loc
    return invalid(where, e.message)


def _store_upload(data: bytes, settings: Any) -> tuple[Path, str]:
    digest = hashlib.sha256(data).hexdigest()
    folder = settings.resolved_artifact_dir / "models"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{digest}.pt2"
    if not path.exists():
        partial = folder / f".{digest}.{os.getpid()}.partial"
        partial.write_bytes(data)
        os.replace(partial, path)
    return path, digest


def _create(session: Any, name: str, spec: ModelJobSpec, imported: Any, path: Path, digest: str,
            extra: dict, caller: Caller, upload_bytes: int) -> Job:
    record = spec.model_dump() | extra | {
        "kind": "model", "name": name, "model_file": str(path), "sha256": digest,
        "input_shapes": [list(s.shape) for s in imported.inputs],
    }
    job = Job(kind="model", name=name[:64], spec=record, target=spec.target, budget=spec.budget,
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
    from service.api.jobs import job_public

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
_UPLOAD_ERRORS: dict[int | str, dict[str, Any]] = errors(400, 403, 413, 429) | {
    422: {"description": "Validation Error: the spec, or the file (not a plain torch.export program, "
                         "a string torch would evaluate, a zip bomb, an unsupported operator), named in `loc`",
          "content": {"application/json": {"schema": {"$ref": "#/components/schemas/HTTPValidationError"}}}},
}


@router.post("", status_code=201, response_model=JobPublic, responses=_UPLOAD_ERRORS,
             openapi_extra={"requestBody": _UPLOAD_BODY})
async def create_model_job(request: Request, settings: SettingsDep, caller: WriteCaller) -> JobPublic:
    """Upload a torch.export program to tune end to end; answers at once, a worker runs it."""
    declared = request.headers.get("content-length", "")
    try:  # over the daily upload quota by the declared size: refused before a byte of the body is read
        await in_auth_thread(_check_upload, settings, caller, int(declared) if declared.isdigit() else 0)
    except QuotaExceeded as e:
        raise too_many(e) from None
    folder = settings.resolved_artifact_dir / "models"
    upload = await receive_upload(request, folder, max_file_bytes=settings.max_upload_bytes)
    try:
        return await run_in_threadpool(_create_from_upload, settings, upload, caller)
    finally:
        upload.path.unlink(missing_ok=True)  # refused, or already moved into the store


def _check_upload(settings: Any, caller: Caller, incoming: int) -> None:
    with session_scope(settings.resolved_database_url, API_CONNECTIONS) as session:
        check_upload(session, caller, settings, incoming)


def _create_from_upload(settings: Any, upload: Upload, caller: Caller) -> JobPublic:
    from compiler.workloads.model import ModelError
    from service.sandbox import SandboxError, import_upload

    try:
        parsed = ModelJobSpec.model_validate(json.loads(upload.fields.get("spec", "{}")))
    except json.JSONDecodeError as e:
        raise invalid(("body", "spec"), f"not JSON: {e}") from None
    except ValidationError as e:
        first = e.errors()[0]
        raise invalid(("body", "spec", *first["loc"]), first["msg"]) from None
    _check_spec(parsed, settings, "spec")
    try:
        imported = import_upload(upload.path, settings, input_shapes=parsed.input_shapes, layout=parsed.layout,
                                 target=parsed.target, fusion=parsed.fusion)
    except ModelError as e:
        raise _model_error(e, ("body", "file")) from None
    except SandboxError as e:  # the server's fault (limits too low for torch and TVM): try later
        raise HTTPException(503, str(e)) from e
    path = upload.path.parent / f"{upload.sha256}.pt2"
    stored = path.exists()
    os.replace(upload.path, path)  # content-addressed: the same bytes again replace themselves
    name = parsed.name or Path(upload.filename or "model.pt2").stem or "model"
    try:
        return _store_job(settings, name, parsed, imported, path, upload.sha256, {"source": "upload"}, caller,
                          upload.size)
    except BaseException:  # over quota, or the database failed: a refused upload leaves nothing behind
        if not stored:
            path.unlink(missing_ok=True)
        raise


# the import takes seconds: a model submission opens its session only once it has a job to write (not as a
# SessionDep, whose slot it would hold all along), on connections of its own (db.MODEL_SESSIONS)
_model_sessions = threading.BoundedSemaphore(MODEL_SESSIONS)


def _store_job(settings: Any, name: str, spec: ModelJobSpec, imported: Any, path: Path, digest: str,
               extra: dict, caller: Caller, upload_bytes: int = 0) -> JobPublic:
    """Write the job and its tasks, within the caller's quota (else 429, and nothing is written)."""
    with _model_sessions, session_scope(settings.resolved_database_url, API_CONNECTIONS) as session:
        job = _create(session, name, spec, imported, path, digest, extra, caller, upload_bytes)
        try:
            check_new_job(session, caller, settings)
        except QuotaExceeded as e:
            raise too_many(e) from None
        return _public(session, job)


@router.get("/zoo", response_model=ZooModelsPublic)
def read_zoo_models() -> ZooModelsPublic:
    """List the built-in models: the names `POST /api/v1/models/zoo` takes, with example input shapes.

    Read from the zoo's table (`compiler.workloads.zoo.MODELS`): nothing is built or exported.
    """
    from compiler.workloads import zoo

    data = [
        ZooModelPublic(name=m.name, description=m.description, input_shapes=[list(s) for s in m.input_shapes],
                       input_dtypes=list(m.input_dtypes))
        for m in zoo.MODELS.values()
    ]
    return ZooModelsPublic(data=data, count=len(data))


@router.post("/zoo", status_code=201, response_model=JobPublic, responses=errors(400, 403, 429))
def create_zoo_job(body: ZooJobCreate, settings: SettingsDep, caller: WriteCaller) -> JobPublic:
    """Tune a built-in model (random weights, nothing downloaded)."""
    import io

    import torch

    from compiler.workloads import zoo

    if body.model not in zoo.MODELS:
        raise invalid(("body", "model"), f"unknown model {body.model!r}; known: {', '.join(zoo.MODELS)}")
    _check_spec(body, settings, "spec")
    buf = io.BytesIO()
    torch.export.save(zoo.export(body.model, body.seed), buf)
    data = buf.getvalue()
    imported = _import(data, body, settings, ("body", "model"))
    path, digest = _store_upload(data, settings)
    spec = ModelJobSpec.model_validate(body.model_dump(exclude={"model"}))
    return _store_job(settings, body.name or body.model, spec, imported, path, digest,
                      {"source": "zoo", "model": body.model}, caller)
