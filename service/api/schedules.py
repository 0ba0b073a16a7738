"""The best known schedule per workload and target."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from compiler.target import TARGET_NAMES, TARGETS
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
    target: Annotated[str | None, Query(description="a stored target key (`llvm -mcpu=znver4 -num-cores=16`), or a "
                                                    "target name (host, llvm): every target of its kind, on "
                                                    "whichever CPU its workers ran")] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    offset: Offset = 0,
) -> SchedulesPublic:
    """Best known configurations, filtered by workload key and target."""
    named = target in TARGET_NAMES
    rows, count = Schedule.where_filter(
        session, workload=workload, search=search, target_key=None if named else target,
        target_kind=TARGETS[target].kind if named else None, limit=limit, offset=offset,
    )
    return SchedulesPublic(data=rows, count=count)
