"""The dashboard: one HTML page for every view, its ES modules and styles from `web/`.

The page talks to the public REST API and the event stream only; the views
route on the client (`/`, `/jobs/{id}`, `/submit`, `/schedules`,
`/compare`, `/devices`), and the server answers each of those paths with the same page so
links and reloads work.
"""

from __future__ import annotations

from fastapi import APIRouter, FastAPI
from fastapi.responses import FileResponse
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

from web import ROOT as WEB_ROOT

router = APIRouter(include_in_schema=False)

_NO_CACHE = {"Cache-Control": "no-cache"}


class _RevalidatedFiles(StaticFiles):
    """Static files the browser must revalidate (ETag) before use, so an upgraded server never runs stale modules."""

    async def get_response(self, path: str, scope: Scope):
        response = await super().get_response(path, scope)
        response.headers.update(_NO_CACHE)
        return response


def _page() -> FileResponse:
    return FileResponse(WEB_ROOT / "index.html", media_type="text/html", headers=_NO_CACHE)


@router.get("/")
def read_dashboard() -> FileResponse:
    """The jobs table."""
    return _page()


@router.get("/jobs/{job_id}")
def read_job_page(job_id: int) -> FileResponse:
    """One job, live."""
    return _page()


@router.get("/submit")
@router.get("/schedules")
@router.get("/compare")
@router.get("/devices")
def read_view() -> FileResponse:
    """The submit form, the schedules and the comparison views."""
    return _page()


def mount_static(app: FastAPI) -> None:
    """Serve `web/static` at /static and the vendored libraries at /vendor."""
    app.mount("/static", _RevalidatedFiles(directory=WEB_ROOT / "static"), name="static")
    app.mount("/vendor", _RevalidatedFiles(directory=WEB_ROOT / "vendor"), name="vendor")
