"""Workloads: the operator catalog (TE definitions with torch references)."""

from __future__ import annotations

from .operators import (
    DEFAULT_MAX_TENSOR_ELEMENTS,
    DTYPES,
    EPILOGUES,
    OPERATORS,
    OperatorDef,
    Param,
    TensorSpec,
    Workload,
    WorkloadError,
    make_workload,
    validate,
    workload_key,
)

__all__ = [
    "DEFAULT_MAX_TENSOR_ELEMENTS",
    "DTYPES",
    "EPILOGUES",
    "OPERATORS",
    "OperatorDef",
    "Param",
    "TensorSpec",
    "Workload",
    "WorkloadError",
    "make_workload",
    "validate",
    "workload_key",
]
