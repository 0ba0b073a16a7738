"""The cost model interface: feature vectors -> scores (higher = predicted faster).

A model learns from measured candidates (`update`) and ranks unmeasured ones (`predict`); `save` and
`load` keep what it learned. `pairwise_accuracy` says how well scores ordered what was then measured.

Layering: `tuner` never imports `service`.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from pathlib import Path

import numpy as np


class CostModel(abc.ABC):
    """Learns from measured candidates and ranks unmeasured ones."""

    @abc.abstractmethod
    def update(self, features: np.ndarray, latencies_ms: Sequence[float | None]) -> None:
        """Adds measurements: one feature row per candidate, its latency (None = failed)."""

    @abc.abstractmethod
    def predict(self, features: np.ndarray) -> np.ndarray:
        """Scores of the rows of `features`; higher means predicted faster."""

    @abc.abstractmethod
    def save(self, path: str | Path) -> None:
        """Writes the model (its training data) to `path` (.npz)."""

    @abc.abstractmethod
    def load(self, path: str | Path) -> None:
        """Restores a model written by `save`."""

    @property
    def trained(self) -> bool:
        """Whether predictions carry information (else they are arbitrary)."""
        return False

    @property
    def reads_features(self) -> bool:
        """Whether `predict` depends on the features at all (else a search need not compute the costly ones)."""
        return True


def pairwise_accuracy(predicted: Sequence[float], latencies_ms: Sequence[float | None]) -> float | None:
    """Fraction of pairs of correct candidates with different latency that `predicted` orders right.

    The faster of a pair must have the higher score (ties in score count half).
    None when there is no such pair.
    """
    pairs = [(p, x) for p, x in zip(predicted, latencies_ms) if x is not None]
    right = total = 0.0
    for i in range(len(pairs)):
        for j in range(i + 1, len(pairs)):
            (pi, xi), (pj, xj) = pairs[i], pairs[j]
            if xi == xj:
                continue
            total += 1
            if pi == pj:
                right += 0.5
            elif (pi > pj) == (xi < xj):
                right += 1
    return right / total if total else None
