"""The best known schedule per workload and target."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from service.api.common import Offset
from service.api.deps import SessionDep
from service.models import Schedule
from service.schemas import SchedulesPublic

router = APIRouter(prefix="/schedules", tags=["schedules"])


@router.get("", response_model=SchedulesPublic)
def read_schedules(
    session: SessionDep,
    workload: Annotated[str | None, Query(description="exact workload key (as in a job's tasks)")] = None,
    search: Annotated[str | None, Query(description="substring of the workload key")] = None,
    target: Annotated[str | None, Query(description="target name (host, llvm) or a stored target key")] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    offset: Offset = 0,
) -> SchedulesPublic:
    """Best known configurations, filtered by workload key and target."""
    target_key = None
    if target:
        from compiler.target import TARGET_NAMES, target_key as key_of

        target_key = key_of(target) if target in TARGET_NAMES else target
    rows, count = Schedule.where_filter(
        session, workload=workload, search=search, target_key=target_key, limit=limit, offset=offset
    )
    return SchedulesPublic(data=rows, count=count)
