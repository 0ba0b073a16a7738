"""Jobs: submit, list, read, trials, cancel, artifact."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query
from fastapi.responses import FileResponse
from sqlalchemy import update

from service.api.common import JobId, Offset, errors
from service.api.deps import SessionDep, SettingsDep, invalid
from service.db import utcnow
from service.models import FINISHED, Artifact, Job, TrialRow
from service.schemas import JobPublic, JobsPublic, OperatorJobCreate, TrialsPublic

router = APIRouter(prefix="/jobs", tags=["jobs"])

StatusFilter = Annotated[
    str | None, Query(pattern="^(queued|running|succeeded|failed|cancelled)$", description="only jobs in this status")
]


def job_public(session: SessionDep, job: Job) -> JobPublic:
    """The job as the API shows it: its row, whether it has an artifact, and its trials per stage."""
    out = JobPublic.model_validate(job)
    out.has_artifact = Artifact.find_by_job(session, job.id) is not None
    out.trials_by_stage, out.last_trial_at = TrialRow.stage_summary(session, job.id)
    return out


def _job_or_404(session: SessionDep, job_id: int) -> Job:
    try:
        return Job.find_or_raise_by_id(session, job_id)
    except KeyError:
        raise HTTPException(404, f"job {job_id} not found") from None


def validate_operator_job(body: OperatorJobCreate, settings: SettingsDep) -> dict:
    """Check an operator job spec against the catalog and the server's limits; return it normalized.

    Raises:
        RequestValidationError: naming the offending field.
    """
    from compiler.target import TargetError, check_available
    from compiler.workloads import WorkloadError, validate

    if body.budget > settings.max_budget:
        raise invalid(("body", "budget"), f"budget must be at most {settings.max_budget}, got {body.budget}")
    try:
        check_available(body.target)
    except TargetError as e:
        raise invalid(("body", "target"), str(e)) from None
    try:
        params = validate(body.operator, body.params, body.dtype, body.epilogue, settings.max_tensor_elements)
    except WorkloadError as e:
        raise invalid(("body", *e.field.split(".")), e.message) from None
    return body.model_dump() | {"params": params}


@router.post("", status_code=201, response_model=JobPublic, responses=errors(400, 403))
def create_job(body: OperatorJobCreate, session: SessionDep, settings: SettingsDep) -> JobPublic:
    """Submit an operator to tune; answers at once, a worker runs it."""
    spec = validate_operator_job(body, settings)
    job = Job(kind=body.kind, name=body.operator, spec=spec, target=body.target, budget=body.budget)
    session.add(job)
    session.flush()
    return job_public(session, job)


@router.get("", response_model=JobsPublic)
def read_jobs(
    session: SessionDep,
    status: StatusFilter = None,
    workload: Annotated[str | None, Query(description="only jobs with a task of this workload key")] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Offset = 0,
) -> JobsPublic:
    """List jobs, newest first."""
    jobs, count = Job.where_filter(session, status=status, workload=workload, limit=limit, offset=offset)
    return JobsPublic(data=[job_public(session, j) for j in jobs], count=count)


@router.get("/{job_id}", response_model=JobPublic, responses=errors(404))
def read_job(job_id: JobId, session: SessionDep) -> JobPublic:
    """Status, progress and best latency of one job, with its tasks."""
    return job_public(session, _job_or_404(session, job_id))


@router.get("/{job_id}/trials", response_model=TrialsPublic, responses=errors(404))
def read_trials(
    job_id: JobId,
    session: SessionDep,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Offset = 0,
) -> TrialsPublic:
    """Page through every measured trial of a job, in measurement order."""
    _job_or_404(session, job_id)
    rows, count = TrialRow.where_job(session, job_id, limit, offset)
    return TrialsPublic(data=rows, count=count)


@router.post("/{job_id}/cancel", response_model=JobPublic, responses=errors(403, 404, 409))
def cancel_job(job_id: JobId, session: SessionDep) -> JobPublic:
    """Stop a job; what was measured is kept. A queued job is cancelled at once, a running one within seconds."""
    job = _job_or_404(session, job_id)
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
def read_artifact(job_id: JobId, session: SessionDep) -> FileResponse:
    """Download the compiled artifact: library, manifest and TVMScript of the best schedule."""
    job = _job_or_404(session, job_id)
    artifact = Artifact.find_by_job(session, job_id)
    if artifact is None or not Path(artifact.path).is_file():
        raise HTTPException(404, f"job {job_id} has no artifact (status {job.status})")
    return FileResponse(artifact.path, media_type="application/gzip", filename=f"altune-job-{job_id}.tar.gz")
