"""Devices: the queue of the TVM RPC tracker that jobs naming a `device` are measured through."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException

from service.api.common import errors
from service.api.deps import SettingsDep
from service.schemas import DevicePublic, DevicesPublic
from service.settings import Settings

router = APIRouter(prefix="/devices", tags=["devices"])


def device_keys(settings: Settings) -> list[DevicePublic]:
    """The tracker's queue, per key.

    Raises:
        HTTPException: 503 when the tracker does not answer (naming its address).
    """
    from tuner.measurers.rpc import tracker_queue

    assert settings.rpc_tracker is not None
    try:
        queue = tracker_queue(settings.rpc_tracker)
    except (OSError, RuntimeError) as e:
        raise HTTPException(503, f"the RPC tracker at ALTUNE_RPC_TRACKER={settings.rpc_tracker} does not answer "
                                 f"({e}); start it (python -m tvm.exec.rpc_tracker) or fix the setting") from e
    return [DevicePublic(key=q.key, total=q.total, free=q.free, pending=q.pending) for q in queue]


def check_device(key: str, settings: Settings, loc: tuple[str, ...] = ("body", "device")) -> None:
    """A job's `device` (at `loc` in the request): the server has a tracker, and a server of that key is
    registered with it.

    Raises:
        HTTPException: 422 saying what to change, 503 when the tracker does not answer.
    """
    from service.api.deps import invalid

    if settings.rpc_tracker is None:
        raise invalid(loc, f"device {key!r} asked for, but this server has no RPC tracker: start "
                                          "it with ALTUNE_RPC_TRACKER=HOST:PORT, or leave `device` out to measure "
                                          "on the worker")
    keys = {d.key: d for d in device_keys(settings)}
    if key not in keys or keys[key].total == 0:
        known = ", ".join(k for k, d in keys.items() if d.total) or "none"
        raise invalid(loc, f"no device {key!r} is registered with the RPC tracker at "
                                          f"{settings.rpc_tracker} (registered keys: {known}); start one with "
                                          f"python -m tvm.exec.rpc_server --tracker {settings.rpc_tracker} "
                                          f"--key {key}")


@router.get("", response_model=DevicesPublic, responses=errors(503))
def read_devices(settings: SettingsDep) -> DevicesPublic:
    """The RPC tracker's queue per device key: servers registered, free, requests pending."""
    if settings.rpc_tracker is None:
        return DevicesPublic(tracker=None, data=[], count=0)
    data = device_keys(settings)
    return DevicesPublic(tracker=settings.rpc_tracker, data=data, count=len(data))
