"""Workloads: the operator catalog (TE definitions with torch references) and its subgraphs of several operators."""

from __future__ import annotations

from .operators import (
    DEFAULT_MAX_TENSOR_ELEMENTS,
    DTYPES,
    EPILOGUES,
    OPERATORS,
    OperatorDef,
    Param,
    REQUANTIZE,
    TensorSpec,
    Workload,
    WorkloadError,
    make_workload,
    validate,
    workload_key,
)
from .subgraphs import SUBGRAPHS, Subgraph

__all__ = [
    "DEFAULT_MAX_TENSOR_ELEMENTS",
    "DTYPES",
    "EPILOGUES",
    "OPERATORS",
    "OperatorDef",
    "SUBGRAPHS",
    "Subgraph",
    "Param",
    "REQUANTIZE",
    "TensorSpec",
    "Workload",
    "WorkloadError",
    "make_workload",
    "validate",
    "workload_key",
]
