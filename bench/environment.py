"""The versions and machine facts recorded with every benchmark report (its "environment")."""

from __future__ import annotations

import platform
import time
from typing import Any

import torch
import tvm

from bench.common import cpu_model, source_commit
from compiler.target import host_cores, host_cpu


def environment() -> dict[str, Any]:
    """Versions and machine facts recorded with every report."""
    return {
        "commit": source_commit(),
        "cpu": host_cpu(),
        "cpu_model": cpu_model(),
        "cores": host_cores(),
        "machine": platform.machine(),
        "tvm": tvm.__version__,
        "torch": torch.__version__,
        "torch_threads": host_cores(),
        "python": platform.python_version(),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
