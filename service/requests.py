"""A job's spec, read once: the typed request the tuner takes, and the key its schedules are stored under.

The spec is what the API validated (`service.schemas.JobCreate`, `service.api.models.ModelJobSpec`) and stored;
this is the only place below the API that reads it by key.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from compiler.target import target_key
from service.models import ScheduleKey
from service.settings import Settings
from tuner.request import ModelTuneRequest, TuneRequest
from tuner.version import SPACE_VERSION


def tune_request(spec: Mapping[str, Any], budget: int) -> TuneRequest:
    """An operator job's request."""
    return TuneRequest(operator=spec["operator"], params=dict(spec["params"]), dtype=spec.get("dtype", "float32"),
                       epilogue=spec.get("epilogue", "none"), target=spec.get("target", "host"), budget=budget,
                       seed=int(spec.get("seed", 0)), layout_levels=int(spec.get("layout_levels", 1)),
                       pipeline="licm" if spec.get("licm", True) else "default", device=spec.get("device"))


def model_tune_request(spec: Mapping[str, Any], budget: int, settings: Settings) -> ModelTuneRequest:
    """A model job's request (jobs made before graph-level layouts have no "layout": their tasks were made
    without one)."""
    return ModelTuneRequest(target=spec.get("target", "host"), budget=budget, seed=int(spec.get("seed", 0)),
                            layout=spec.get("layout", "none"), fusion=spec.get("fusion", "none"),
                            pipeline="licm" if spec.get("licm", True) else "default", device=spec.get("device"),
                            max_tensor_elements=settings.max_tensor_elements)


def schedule_key(workload_key: str, request: TuneRequest | ModelTuneRequest) -> ScheduleKey:
    """The key a task's schedule is stored and looked up under: valid for this workload, target, device, pipeline
    and version of the search spaces."""
    return ScheduleKey(workload_key=workload_key, target_key=target_key(request.target), device=request.device or "",
                       pipeline=request.pipeline, space_version=SPACE_VERSION)
