"""What a caller asks the tuner for, typed: an operator (`TuneRequest`) or a whole model (`ModelTuneRequest`).

The service turns a job's spec into one of these once (`service.requests`); the CLI and the benchmarks build them
directly. Nothing below the service reads a job spec by key.

Layering: `tuner` imports `compiler`, never `service` or `bench`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from compiler.build import Pipeline

Layout = Literal["none", "blocked", "search"]
Fusion = Literal["auto", "none", "chains"]


@dataclass(frozen=True)
class TuneRequest:
    """One catalog operator to tune (a job of kind "operator").

    Attributes:
        operator: the catalog's name ("conv2d").
        params: its integer parameters.
        dtype: the element type ("float32", "int8", "bfloat16").
        epilogue: the element-wise stages fused after it ("none", "bias", "bias_relu", ...).
        target: the target string ("host", "llvm -mcpu=znver4").
        budget: measurements in all.
        seed: makes the search deterministic given the same measurements.
        layout_levels: ALT's layout templates: 1 or 2 levels of output tiling.
        pipeline: the TIR pipeline of every build ("licm" or "default").
        device: the RPC tracker's device key to measure on; None: this machine.
    """

    operator: str
    params: dict[str, int] = field(default_factory=dict)
    dtype: str = "float32"
    epilogue: str = "none"
    target: str = "host"
    budget: int = 64
    seed: int = 0
    layout_levels: int = 1
    pipeline: Pipeline = "licm"
    device: str | None = None


@dataclass(frozen=True)
class ModelTuneRequest:
    """A whole model to tune (a job of kind "model"; `tuner.model.tune_model`).

    Attributes:
        target: the target string ("host", "llvm -mcpu=znver4").
        budget: measurements in all, the joint stage's included.
        seed: makes the search deterministic given the same measurements; also the check's input seed.
        layout: "none" (NCHW), "blocked" (convs in NCHWc by rule) or "search" (ALT's joint stage).
        fusion: "auto" (chains of complex operators whose intermediates exceed the L2 cache tuned fused and unfused,
            fused where faster: `tuner.model.decide_fusion`), "none" or "chains" (every chain fused, unmeasured).
        pipeline: the TIR pipeline of every build ("licm" or "default").
        device: the RPC tracker's device key to measure on; None: this machine.
        trials_per_round: the gradient scheduler's largest round.
        max_tensor_elements: the largest tensor a lowering may make (None: the compiler's default).
    """

    target: str = "host"
    budget: int = 64
    seed: int = 0
    layout: Layout = "none"
    fusion: Fusion = "auto"
    pipeline: Pipeline = "licm"
    device: str | None = None
    trials_per_round: int = 8
    max_tensor_elements: int | None = None

