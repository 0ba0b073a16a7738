"""What the tuner works on and what it produces: tasks, trials, results.

Layering: `tuner` never imports `service`.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tvm

from compiler.build import Pipeline
from compiler.target import resolve_target
from compiler.workloads import make_workload

# The largest search seed: torch.manual_seed, numpy's generators and XGBoost's `seed` all take it
MAX_SEED = 2**31 - 1


@dataclass(frozen=True, eq=False)
class Task:
    """One program to tune on one target.

    Attributes:
        name: a short name ("conv2d").
        workload_key: the content key of the workload (caches and DB rows use it).
        prim_func: the untransformed program; its last parameter is the output.
        target: the TVM target the candidates are compiled for.
        inputs: input arrays in call order; None: uniform [-1, 1) from seed 0.
        expected: the correct output for `inputs`; None: the measurer computes it
            by running the untransformed program.
        workload: the catalog workload `prim_func` implements (`compiler.workloads`); the
            ALT search needs it (layout templates); None: loop-only search.
    """

    name: str
    workload_key: str
    prim_func: tvm.tirx.PrimFunc
    target: tvm.target.Target
    inputs: list[np.ndarray] | None = None
    expected: np.ndarray | None = None
    workload: Any = None  # compiler.workloads.Workload


def task_from_spec(spec: Mapping[str, Any], *, max_tensor_elements: int | None = None) -> Task:
    """The task an operator job spec describes, with its catalog workload, so `tune` runs ALT's joint search.

    The worker, `altune tune` and `bench.ops` all build their operator tasks here, so a job, a local run
    and a benchmark of one spec search the same space.

    Args:
        spec: as `POST /api/v1/jobs` validates it: operator, params, dtype, epilogue, target.
        max_tensor_elements: the largest tensor accepted (None: the catalog's default).

    Raises:
        WorkloadError: the operator or its parameters are not in the catalog.
    """
    limit = {} if max_tensor_elements is None else {"max_tensor_elements": max_tensor_elements}
    workload = make_workload(spec["operator"], spec["params"], spec.get("dtype", "float32"),
                             spec.get("epilogue", "none"), **limit)
    inputs = expected = None
    if workload.dtype != "float32":
        # the workload's own inputs (int8: every uint8/int8 value, signed weights; the measurer's default
        # draws non-negative integers) and torch's output, so every search checks candidates against torch
        inputs = workload.random_inputs(0)
        expected = workload.reference(inputs)
    return Task(name=workload.operator, workload_key=workload.key, prim_func=workload.prim_func,
                target=resolve_target(spec.get("target", "host")), inputs=inputs, expected=expected,
                workload=workload)


def build_pipeline(spec: Mapping[str, Any]) -> Pipeline:
    """The TIR pipeline a job spec asks for: our LICM unless `"licm": false` (`compiler.build.tir_pipeline`)."""
    return "licm" if spec.get("licm", True) else "default"


def tune_options(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The `tune` arguments a job spec sets: its seed and ALT's layout template levels."""
    return {"seed": int(spec.get("seed", 0)), "layout_levels": int(spec.get("layout_levels", 1))}


@dataclass
class Trial:
    """One on-device measurement of a configuration.

    Attributes:
        index: position in the task's sequence of measurements (prior trials first).
        config: the configuration (JSON-serializable dict of integer knobs).
        latencies_ms: one latency per timed repeat; None when the trial failed.
        error: why it failed (schedule error, build error, wrong result, crash,
            timeout); None when it ran correctly.
        predicted: the cost model's score when it was picked (higher is better), if any.
        stage: the search stage that produced it ("joint", "loop").
        extra: free-form facts, e.g. "model_accuracy" (pairwise ranking accuracy
            of the model on its batch so far, before training on it), "source"
            ("model", "random", "start_from"), "round", "build_s", "run_s", "layout"
            (the output layout of a layout configuration, e.g. "N H W/14 O/16 14 16").
    """

    index: int
    config: dict
    latencies_ms: list[float] | None
    error: str | None
    predicted: float | None = None
    stage: str = "loop"
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def latency_ms(self) -> float | None:
        """Median latency in ms, None for a failed trial."""
        if self.error is not None or not self.latencies_ms:
            return None
        return float(statistics.median(self.latencies_ms))


@dataclass
class TuneResult:
    """The outcome of `tune`.

    Attributes:
        best: the fastest correct trial (prior trials included), None if none ran correctly.
        trials: every trial of this call (not the prior ones), in measurement order.
        baseline_ms: median latency of the untransformed program, None if it failed.
        final: the trial to deploy: with re-measurement (`tune(remeasure=k)`), the fastest of
            the `k` best trials measured again after the search; else `best`.
        final_ms: `final`'s latency: its re-measured one with re-measurement (what the artifact
            runs at, not the lucky reading that won the search), else `best`'s.
        remeasured_ms: trial index -> its re-measured latency (None: it failed then), for every
            finalist; empty without re-measurement.
    """

    best: Trial | None
    trials: list[Trial]
    baseline_ms: float | None
    final: Trial | None = None
    final_ms: float | None = None
    remeasured_ms: dict[int, float | None] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.final is None and not self.remeasured_ms:  # no re-measurement: the search's best
            self.final = self.best
            self.final_ms = self.best.latency_ms if self.best is not None else None


def best_trial(trials: list[Trial]) -> Trial | None:
    """The correct trial with the smallest median latency (earliest on ties)."""
    valid = [t for t in trials if t.latency_ms is not None]
    return min(valid, key=lambda t: t.latency_ms) if valid else None
