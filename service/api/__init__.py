"""The FastAPI application."""

from __future__ import annotations

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from sqlalchemy import text

from service.api import deps, devices, events, jobs, metrics, models, operators, schedules, web
from service.api.auth import WritesNeedAToken, require_read
from service.api.common import BodyLimit, SameOriginWrites, errors, http_error, validation_error
from service.api.stream_limits import StreamSlots
from service.api.deps import SettingsDep
from service.db import StorageError, get_engine
from service.schemas import Health
from service.settings import Settings, get_settings


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the app; `settings` defaults to the environment."""
    app = FastAPI(
        lifespan=deps.lifespan,  # the request threads, sized to the sessions SessionDep admits
        title="altune",
        version="0.1.0",
        description="Auto-tuning service for deep-learning compilation: submit an operator, "
        "workers tune data layouts and loops on Apache TVM, download the compiled artifact.",
    )
    app.state.settings = settings or get_settings()
    app.state.streams = StreamSlots()  # the event streams open, against ALTUNE_MAX_STREAMS(_PER_TOKEN)

    # every route under /api/v1 needs a read token (or ALTUNE_ANONYMOUS); writes ask for more themselves
    api = APIRouter(prefix="/api/v1", responses=errors(401, 413, 503), dependencies=[Depends(require_read)])
    api.include_router(jobs.router)
    api.include_router(schedules.router)
    api.include_router(models.router)
    api.include_router(operators.router)
    api.include_router(events.router)
    api.include_router(devices.router)
    app.include_router(api)
    app.include_router(metrics.router)
    app.include_router(web.router)
    web.mount_static(app)

    app.add_middleware(WritesNeedAToken, settings=app.state.settings)  # before FastAPI parses the body
    app.add_middleware(SameOriginWrites, allowed_origins=app.state.settings.allowed_origins)
    # outermost: FastAPI parses a JSON body before it checks the token; the upload streams under its own limit
    app.add_middleware(BodyLimit, max_bytes=app.state.settings.max_json_body_bytes,
                       exempt=[("POST", "/api/v1/models")])
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(StarletteHTTPException, http_error)

    @app.exception_handler(StorageError)
    async def storage_error(_request: Request, exc: StorageError) -> JSONResponse:
        return JSONResponse(status_code=503, content={"detail": str(exc)})

    @app.get("/healthz", response_model=Health, tags=["health"], responses=errors(503))
    def read_health(settings: SettingsDep) -> Health:
        """200 when the API and its database answer."""
        try:
            with get_engine(settings.resolved_database_url).connect() as conn:
                conn.execute(text("SELECT 1"))
        except Exception as e:  # any driver error means: not healthy
            raise HTTPException(503, f"database unreachable: {e}") from e
        return Health(status="ok", database="ok")

    return app
