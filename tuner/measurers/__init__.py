"""Measurers: where candidates are built, checked and timed.

`base.py` holds the interface (`Measurer`, `Candidate`, `MeasureResult`); each implementation is one file:
`local.py` (this machine, worker processes), `rpc.py` (devices leased from TVM's RPC tracker),
`simulated.py` (no device: latencies from a hash, for tests and scaling benchmarks). A new measurer is
one new file and one line in `MEASURERS`.

Layering: `tuner` never imports `service`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from .base import Candidate, Measurer, MeasureResult
from .local import LocalMeasurer
from .rpc import DeviceUnavailable, RpcMeasurer
from .simulated import SimulatedMeasurer

MeasurerKind = Literal["local", "rpc", "simulated"]

MEASURERS: dict[str, Callable[..., Measurer]] = {
    "local": LocalMeasurer,
    "rpc": RpcMeasurer,
    "simulated": SimulatedMeasurer,
}


def make_measurer(kind: MeasurerKind, **options: Any) -> Measurer:
    """The measurer called `kind`, made with `options`: "local" (`LocalMeasurer`), "rpc" (`RpcMeasurer`:
    `tracker="host:port"`, `key=` a device key, and `LocalMeasurer`'s options) or "simulated"
    (`SimulatedMeasurer`).

    Raises:
        ValueError: no measurer is called `kind`.
    """
    if kind not in MEASURERS:
        raise ValueError(f"unknown measurer: {kind}")
    return MEASURERS[kind](**options)


__all__ = [
    "MEASURERS",
    "Candidate",
    "DeviceUnavailable",
    "LocalMeasurer",
    "MeasureResult",
    "Measurer",
    "MeasurerKind",
    "RpcMeasurer",
    "SimulatedMeasurer",
    "make_measurer",
]
