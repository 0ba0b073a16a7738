"""`SimulatedMeasurer`: a stand-in device for tests and scaling benchmarks: nothing is built or run.

A candidate's latency is a fixed function of (the task's workload key, the configuration): the sha256
of their canonical JSON, read as a number u in [0, 1), placed log-uniformly in [`low_ms`, `high_ms`].
So the same configuration of the same workload always reads the same, in any process and any order,
and a search that proposes the same configurations gets the same trials. `delay_s` sleeps that long per
measurement, to stand in for a device's time without using the CPU.

Layering: `tuner` never imports `service`.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from typing import Any

from ..task import Task
from .base import Candidate, Measurer, MeasureResult


class SimulatedMeasurer(Measurer):
    """Latencies derived from a hash of (workload key, configuration); no build, no run."""

    def __init__(self, *, low_ms: float = 0.1, high_ms: float = 10.0, delay_s: float = 0.0, repeat: int = 3):
        """
        Args:
            low_ms: the fastest latency a configuration can read.
            high_ms: the slowest.
            delay_s: wall-clock seconds each measurement takes (a sleep: a device's time, no CPU work).
            repeat: readings per measurement (all the same value).
        """
        assert 0 < low_ms <= high_ms, f"{low_ms=} must be > 0 and <= {high_ms=}"
        assert delay_s >= 0 and repeat >= 1, f"{delay_s=} must be >= 0, {repeat=} >= 1"
        self.low_ms, self.high_ms, self.delay_s, self.repeat = low_ms, high_ms, delay_s, repeat
        self.measured = 0  # measurements made (the baseline's included)

    def latency_ms(self, workload_key: str, config: Any) -> float:
        """The latency a configuration of a workload reads: log-uniform in [low_ms, high_ms] by a sha256."""
        text = json.dumps({"workload": workload_key, "config": config}, sort_keys=True, separators=(",", ":"))
        u = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") / 2**64
        return self.low_ms * math.exp(u * math.log(self.high_ms / self.low_ms))

    def _reading(self, workload_key: str, config: Any) -> list[float]:
        if self.delay_s:
            time.sleep(self.delay_s)
        self.measured += 1
        return [self.latency_ms(workload_key, config)] * self.repeat

    def measure_one(self, task: Task, candidate: Candidate) -> MeasureResult:
        return MeasureResult(self._reading(task.workload_key, candidate.config), None, run_s=self.delay_s)

    def baseline_ms(self, task: Task) -> float | None:
        """The untransformed program's latency: the reading of the configuration None."""
        return self._reading(task.workload_key, None)[0]
