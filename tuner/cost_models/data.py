"""`DataModel`: the part of a cost model that keeps its training data and saves and loads it.

Layering: `tuner` never imports `service`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .base import CostModel


class DataModel(CostModel):
    """Keeps every (features, latency) it was given; `save`/`load` write/read them."""

    def __init__(self) -> None:
        self._x: list[np.ndarray] = []
        self._y: list[float | None] = []

    def _add(self, features: np.ndarray, latencies_ms: Sequence[float | None]) -> None:
        features = np.asarray(features, dtype=np.float32)
        assert len(features) == len(latencies_ms), f"{len(features)=} != {len(latencies_ms)=}"
        self._x += list(features)
        self._y += [None if x is None else float(x) for x in latencies_ms]

    def save(self, path: str | Path) -> None:
        y = np.asarray([np.nan if v is None else v for v in self._y], dtype=np.float64)
        x = np.stack(self._x) if self._x else np.zeros((0, 0), dtype=np.float32)
        with open(path, "wb") as f:  # np.savez would append .npz to a str path
            np.savez(f, x=x, y=y)

    def load(self, path: str | Path) -> None:
        data = np.load(path)
        self._x, self._y = [], []
        if len(data["y"]):
            self.update(data["x"], [None if np.isnan(v) else float(v) for v in data["y"]])
