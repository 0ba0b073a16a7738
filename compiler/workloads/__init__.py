"""Workloads: the operator catalog (TE definitions with torch references), its subgraphs of several operators,
and whole models (`compiler.workloads.model`).

Importing this package loads neither TVM nor torch: the API validates and keys jobs with it.
"""

from __future__ import annotations

from .catalog import make_workload, validate
from .operators import OPERATORS
from .spec import (
    DEFAULT_MAX_TENSOR_ELEMENTS,
    DTYPES,
    EPILOGUES,
    REQUANTIZE,
    OperatorDef,
    Param,
    TensorSpec,
    WorkloadError,
    workload_key,
)
from .subgraphs import SUBGRAPHS, Subgraph
from .workload import Workload

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
