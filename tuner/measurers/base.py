"""The measurer interface: build, check and time scheduled candidates of a task on a device.

A measurer answers every candidate with a `MeasureResult`; a candidate that fails (a build error, a
wrong output, a crash, a timeout) is a result with its `error`, never an exception. `prebuild` is a
hint: a measurer that can build ahead builds the candidates it will be asked for next together.

Layering: `tuner` never imports `service`.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import tvm

from ..spaces.base import Config
from ..task import Task


@dataclass(frozen=True)
class Candidate:
    """A configuration and the scheduled module it gives."""

    config: Config
    mod: tvm.IRModule


@dataclass(frozen=True)
class MeasureResult:
    """Latencies of one candidate (one per timed repeat), or why there are none."""

    latencies_ms: list[float] | None
    error: str | None
    build_s: float = 0.0
    run_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


class Measurer(abc.ABC):
    """Measures candidates of a task on a device."""

    @abc.abstractmethod
    def measure_one(self, task: Task, candidate: Candidate) -> MeasureResult:
        """Builds, checks and times one candidate; failures are results, never raised."""

    def measure(self, task: Task, candidates: Sequence[Candidate]) -> list[MeasureResult]:
        """`measure_one` for each candidate, in order (built ahead, together)."""
        self.prebuild([(task, c) for c in candidates])
        return [self.measure_one(task, c) for c in candidates]

    def prebuild(self, batch: Sequence[tuple[Task, Candidate]]) -> None:
        """Builds candidates that `measure_one` will be asked for next, together, before any runs.

        A hint: candidates not measured afterwards cost only their build, and a
        measurer that cannot build ahead ignores it.
        """

    def baseline_ms(self, task: Task) -> float | None:
        """Median latency of the untransformed program, None where unknown."""
        return None

    def close(self) -> None:
        """Releases worker processes and temporary files."""

    def __enter__(self) -> Measurer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
