"""`RandomModel`: uniform random scores (seeded): the no-model ablation, and the warm-up before any data.

Layering: `tuner` never imports `service`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .data import DataModel


class RandomModel(DataModel):
    """Uniform random scores (seeded): the no-model ablation."""

    def __init__(self, seed: int = 0):
        super().__init__()
        self._rng = np.random.default_rng(seed)

    @property
    def reads_features(self) -> bool:
        return False

    def update(self, features: np.ndarray, latencies_ms: Sequence[float | None]) -> None:
        self._add(features, latencies_ms)

    def predict(self, features: np.ndarray) -> np.ndarray:
        return self._rng.random(len(features))
