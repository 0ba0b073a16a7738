"""`GET /metrics`: Prometheus' text format, from the database at scrape time (`service.metrics`)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from service.api.auth import ReadCaller
from service.api.common import errors
from service.api.deps import SessionDep
from service.metrics import DatabaseCollector

router = APIRouter(tags=["metrics"])


@router.get("/metrics", response_class=Response, responses={
    200: {"content": {"text/plain": {}}, "description": "Prometheus text exposition format"}} | errors(401, 503))
def read_metrics(session: SessionDep, _caller: ReadCaller) -> Response:
    """Jobs by state, trials measured, measurement errors, queue wait, lease takeovers (a read token)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DatabaseCollector(session))  # the request's admitted session: no connection of its own
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
