"""Jobs: submit, list, read, trials, cancel, artifact."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from fastapi import APIRouter, HTTPException, Query
from fastapi.responses import FileResponse
from sqlalchemy import delete, func, select, update

from service import trial_reads
from service.api.auth import ReadCaller, WriteCaller, too_many, visible_owner
from service.api.common import JobId, Offset, check_target, errors
from service.api.deps import SessionDep, SettingsDep, invalid
from service.db import utcnow
from service.models import FINISHED, Artifact, Job
from service.quotas import QuotaExceeded, check_new_job
from service.settings import Settings
from service.tokens import Caller
from service.schemas import JobPublic, JobsPublic, OperatorJobCreate, TrialChartPublic, TrialPublic, TrialsPublic
from service.trial_reads import Cursor, TrialSort, TrialStatus

router = APIRouter(prefix="/jobs", tags=["jobs"])

StatusFilter = Annotated[
    str | None, Query(pattern="^(queued|running|succeeded|failed|cancelled)$", description="only jobs in this status")
]


def job_public(session: SessionDep, job: Job) -> JobPublic:
    """The job as the API shows it: its row, whether it has an artifact, and its trials per stage."""
    out = JobPublic.model_validate(job)
    out.has_artifact = Artifact.find_by_job(session, job.id) is not None
    summary = trial_reads.stage_summaries(session, [job.id])
    out.trials_by_stage, out.last_trial_at = summary.get(job.id, ({}, None))
    return out


def jobs_public(session: SessionDep, jobs: list[Job]) -> list[JobPublic]:
    """`job_public` of a page of jobs in two queries, not two per job (the list is the dashboard's busiest read)."""
    ids = [j.id for j in jobs]
    with_artifact = Artifact.where_jobs(session, ids)
    summaries = trial_reads.stage_summaries(session, ids)
    out = []
    for job in jobs:
        public = JobPublic.model_validate(job)
        public.has_artifact = job.id in with_artifact
        public.trials_by_stage, public.last_trial_at = summaries.get(job.id, ({}, None))
        out.append(public)
    return out


def job_or_404(session: SessionDep, job_id: int, caller: Caller, settings: Settings) -> Job:
    """The job, if it exists and the caller may read it (`ALTUNE_JOBS_VISIBLE=own`: its own); else 404."""
    job = Job.find_by_id(session, job_id)
    owner = visible_owner(caller, settings)
    if job is None or (owner is not None and job.owner_id != owner.token_id):
        raise HTTPException(404, f"job {job_id} not found")
    return job


def add_job(session: SessionDep, caller: Caller, settings: Settings, job: Job) -> Job:
    """Write a new job of the caller's, within its quota.

    Raises:
        HTTPException: 429 naming the limit passed and when it frees (the transaction rolls back).
    """
    job.owner_id = caller.token_id
    session.add(job)
    session.flush()
    try:
        check_new_job(session, caller, settings, job)
    except QuotaExceeded as e:
        raise too_many(e) from None
    return job


def validate_operator_job(body: OperatorJobCreate, settings: SettingsDep) -> dict:
    """Check an operator job spec against the catalog and the server's limits; return it normalized.

    Raises:
        RequestValidationError: naming the offending field.
    """
    from compiler.target import TargetError
    from compiler.workloads import WorkloadError, validate

    if body.budget > settings.max_budget:
        raise invalid(("body", "budget"), f"budget must be at most {settings.max_budget}, got {body.budget}")
    try:
        check_target(body.target)
    except TargetError as e:
        raise invalid(("body", "target"), str(e)) from None
    try:
        params = validate(body.operator, body.params, body.dtype, body.epilogue, settings.max_tensor_elements)
    except WorkloadError as e:
        raise invalid(("body", *e.field.split(".")), e.message) from None
    if body.device is not None:
        from service.api.devices import check_device

        check_device(body.device, settings)
    return body.model_dump(exclude_none=True) | {"params": params}


@router.post("", status_code=201, response_model=JobPublic, responses=errors(400, 403, 429, 503))
def create_job(body: OperatorJobCreate, session: SessionDep, settings: SettingsDep, caller: WriteCaller) -> JobPublic:
    """Submit an operator to tune; answers at once, a worker runs it."""
    spec = validate_operator_job(body, settings)
    job = Job(kind=body.kind, name=body.operator, spec=spec, target=body.target, budget=body.budget)
    return job_public(session, add_job(session, caller, settings, job))


@router.get("", response_model=JobsPublic)
def read_jobs(
    session: SessionDep,
    settings: SettingsDep,
    caller: ReadCaller,
    status: StatusFilter = None,
    workload: Annotated[str | None, Query(description="only jobs with a task of this workload key")] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Offset = 0,
) -> JobsPublic:
    """List jobs, newest first (with `ALTUNE_JOBS_VISIBLE=own`, only the caller's)."""
    jobs, count = Job.where_filter(session, status=status, workload=workload, limit=limit, offset=offset,
                                   owner=visible_owner(caller, settings))
    return JobsPublic(data=jobs_public(session, jobs), count=count)


@router.get("/{job_id}", response_model=JobPublic, responses=errors(404))
def read_job(job_id: JobId, session: SessionDep, settings: SettingsDep, caller: ReadCaller) -> JobPublic:
    """Status, progress and best latency of one job, with its tasks."""
    return job_public(session, job_or_404(session, job_id, caller, settings))


@router.get("/{job_id}/trials", response_model=TrialsPublic, responses=errors(404))
def read_trials(
    job_id: JobId,
    session: SessionDep,
    settings: SettingsDep,
    caller: ReadCaller,
    limit: Annotated[int, Query(ge=1, le=1000, description="trials per page")] = 100,
    cursor: Annotated[str | None, Query(max_length=64, description="the `next` of the page before")] = None,
    sort: Annotated[TrialSort, Query(description="`id`: measurement order; `latency`: the measured trials fastest "
                                                 "first, then the error trials")] = "id",
    order: Annotated[Literal["asc", "desc"], Query(description="`desc`: newest (or slowest) first")] = "asc",
    status: Annotated[TrialStatus, Query(description="`ok`: measured trials only; `error`: failed ones only")] = "all",
    offset: Offset = 0,
) -> TrialsPublic:
    """Page through a job's trials: in measurement order, or by latency; `next` is the cursor of the next page.

    Each page is one indexed query, however many trials the job has. `offset` (by id only) is the older way of
    paging, kept for clients that use it; it costs the rows it skips.
    """
    if offset and (cursor is not None or sort != "id"):
        raise invalid(("query", "offset"), "offset pages by id only and not with a cursor: follow `next` instead")
    try:
        after = None if cursor is None else Cursor.decode(cursor, sort)
    except ValueError as e:
        raise invalid(("query", "cursor"), str(e)) from None
    job_or_404(session, job_id, caller, settings)
    rows, following = trial_reads.where_page(session, job_id, limit=limit, sort=sort, desc=order == "desc",
                                             status=status, cursor=after, offset=offset)
    return TrialsPublic(data=rows, count=trial_reads.count_trials(session, job_id, status),
                        next=None if following is None else following.encode(sort))


@router.get("/{job_id}/trials/chart", response_model=TrialChartPublic, responses=errors(404))
def read_trial_chart(
    job_id: JobId,
    session: SessionDep,
    settings: SettingsDep,
    caller: ReadCaller,
    points: Annotated[int, Query(ge=10, le=5000, description="at most this many buckets")] = 1000,
) -> TrialChartPublic:
    """A job's search curve in at most `points` buckets, with trials per stage and each task's best trial.

    Each bucket holds consecutive trials: their fastest and slowest latency, the errors among them, the job's best
    latency so far. Computed in the database from an index (no trial's configuration is read), so a job of
    100,000 trials answers as fast as one of 1,000.
    """
    job_or_404(session, job_id, caller, settings)
    out = TrialChartPublic.model_validate(trial_reads.chart(session, job_id, points))
    out.best = [TrialPublic.model_validate(t) for t in trial_reads.where_best_per_task(session, job_id)]
    return out


@router.post("/{job_id}/cancel", response_model=JobPublic, responses=errors(403, 404, 409))
def cancel_job(job_id: JobId, session: SessionDep, settings: SettingsDep, caller: WriteCaller) -> JobPublic:
    """Stop a job; what was measured is kept. A queued job is cancelled at once, a running one within seconds.

    Only the token that submitted the job, or an admin token, may cancel it.
    """
    job = job_or_404(session, job_id, caller, settings)
    if not caller.may_change(job.owner_id):
        raise HTTPException(403, f"job {job_id} belongs to another token; only its owner or an admin token "
                                 "may cancel it")
    if job.status in FINISHED:
        raise HTTPException(409, f"job {job_id} is already {job.status}")
    # one conditional statement, so a worker claiming the job at this moment cannot be missed
    now = utcnow()
    session.execute(
        update(Job).where(Job.id == job_id, Job.status == "queued").values(status="cancelled", finished_at=now)
    )
    session.execute(update(Job).where(Job.id == job_id, Job.status == "running").values(cancel_requested=True))
    session.refresh(job)
    return job_public(session, job)


@router.get(
    "/{job_id}/artifact",
    response_class=FileResponse,
    responses={200: {"content": {"application/gzip": {}}, "description": "tar.gz: lib.so, manifest.json, schedule.py"}}
    | errors(404),
)
def read_artifact(job_id: JobId, session: SessionDep, settings: SettingsDep, caller: ReadCaller) -> FileResponse:
    """Download the compiled artifact: library, manifest and TVMScript of the best schedule."""
    job = job_or_404(session, job_id, caller, settings)
    artifact = Artifact.find_by_job(session, job_id)
    if artifact is None or not Path(artifact.path).is_file():
        raise HTTPException(404, f"job {job_id} has no artifact (status {job.status})")
    return FileResponse(artifact.path, media_type="application/gzip", filename=f"altune-job-{job_id}.tar.gz")


@router.delete("/{job_id}", status_code=204, responses=errors(403, 404, 409))
def delete_job(job_id: JobId, session: SessionDep, settings: SettingsDep, caller: WriteCaller) -> None:
    """Delete a finished job with its tasks, trials, artifact and uploaded model (its best schedules stay known).

    Only the token that submitted the job, or an admin token, may delete it; a job still queued or running is
    cancelled first. The model file goes when no other job uses the same bytes; what the job counted against
    its token's daily quotas stays counted.
    """
    job = job_or_404(session, job_id, caller, settings)
    if not caller.may_change(job.owner_id):
        raise HTTPException(403, f"job {job_id} belongs to another token; only its owner or an admin token "
                                 "may delete it")
    if job.status not in FINISHED:
        raise HTTPException(409, f"job {job_id} is {job.status}: cancel it first")
    artifact = Artifact.find_by_job(session, job_id)
    files = [Path(artifact.path)] if artifact is not None else []
    model_file = job.spec.get("model_file") if job.kind == "model" else None
    # tasks, trials and the artifact's row go with it (ON DELETE CASCADE); schedules keep their configuration
    session.execute(delete(Job).where(Job.id == job_id, Job.status.in_(FINISHED)))
    models = settings.resolved_artifact_dir / "models"
    if model_file is not None and Path(model_file).parent == models and not _model_file_used(session, model_file):
        files.append(Path(model_file))
    for path in files:
        path.unlink(missing_ok=True)


def _model_file_used(session: SessionDep, model_file: str) -> bool:
    """Whether a job (besides those deleted in this session) still refers to the stored model file."""
    used = select(func.count()).select_from(Job).where(Job.kind == "model",
                                                       Job.spec["model_file"].as_string() == model_file)
    return (session.scalar(used) or 0) > 0
