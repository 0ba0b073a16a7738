"""Cost models: feature vectors -> scores (higher = predicted faster).

`XGBModel` is trained online on every measurement of a task so far: the target
of a candidate is its log speed relative to the task's best, `log(best /
latency)` <= 0, a failed candidate one below the worst, regressed with squared
error. (MetaSchedule's `best / latency` in (0, 1] squeezes every slow candidate
near 0, so with a few dozen samples the trees only learn "like the best or
not" and the top of a batch ties.) The model is refit from scratch at each
`update` (a few hundred samples train in well under a second). `RandomModel` scores uniformly at random (the
ablation, and the warm-up before any data).

Layering: `tuner` never imports `service`. xgboost and numpy are imported inside functions.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
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


def targets(latencies_ms: Sequence[float | None]) -> np.ndarray:
    """Training targets: log(best / latency) <= 0 (0 for the task's best); a failure
    scores one below the worst correct candidate (or -1 when none is correct)."""
    import numpy as np

    valid = [x for x in latencies_ms if x is not None and x > 0]
    best = min(valid) if valid else 1.0
    scores = [math.log(best / x) if x is not None and x > 0 else None for x in latencies_ms]
    floor = min((v for v in scores if v is not None), default=0.0) - 1.0
    return np.asarray([floor if v is None else v for v in scores], dtype=np.float32)


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


class _DataModel(CostModel):
    """Keeps every (features, latency) it was given; `save`/`load` write/read them."""

    def __init__(self) -> None:
        self._x: list[np.ndarray] = []
        self._y: list[float | None] = []

    def _add(self, features: np.ndarray, latencies_ms: Sequence[float | None]) -> None:
        import numpy as np

        features = np.asarray(features, dtype=np.float32)
        assert len(features) == len(latencies_ms), f"{len(features)=} != {len(latencies_ms)=}"
        self._x += list(features)
        self._y += [None if x is None else float(x) for x in latencies_ms]

    def save(self, path: str | Path) -> None:
        import numpy as np

        y = np.asarray([np.nan if v is None else v for v in self._y], dtype=np.float64)
        x = np.stack(self._x) if self._x else np.zeros((0, 0), dtype=np.float32)
        with open(path, "wb") as f:  # np.savez would append .npz to a str path
            np.savez(f, x=x, y=y)

    def load(self, path: str | Path) -> None:
        import numpy as np

        data = np.load(path)
        self._x, self._y = [], []
        if len(data["y"]):
            self.update(data["x"], [None if np.isnan(v) else float(v) for v in data["y"]])


class XGBModel(_DataModel):
    """XGBoost regression on normalized throughput, refit on all data at every update."""

    def __init__(self, seed: int = 0, num_rounds: int = 60, min_samples: int = 4, threads: int = 1):
        """
        Args:
            seed: XGBoost's seed.
            num_rounds: boosting rounds per fit.
            min_samples: correct measurements needed before the model is fit.
            threads: XGBoost threads (1 keeps fits deterministic and the shared machine quiet).
        """
        super().__init__()
        self.seed, self.num_rounds, self.min_samples, self.threads = seed, num_rounds, min_samples, threads
        self._booster = None

    @property
    def trained(self) -> bool:
        return self._booster is not None

    def update(self, features: np.ndarray, latencies_ms: Sequence[float | None]) -> None:
        import numpy as np
        import xgboost as xgb

        self._add(features, latencies_ms)
        if sum(v is not None for v in self._y) < self.min_samples:
            return
        dtrain = xgb.DMatrix(np.stack(self._x), label=targets(self._y))
        params = {
            "objective": "reg:squarederror",
            "eta": 0.2,
            "max_depth": 6,
            "min_child_weight": 1,
            "subsample": 1.0,
            "seed": self.seed,
            "nthread": self.threads,
            "verbosity": 0,
        }
        self._booster = xgb.train(params, dtrain, num_boost_round=self.num_rounds)

    def predict(self, features: np.ndarray) -> np.ndarray:
        import numpy as np
        import xgboost as xgb

        features = np.asarray(features, dtype=np.float32)
        if self._booster is None:
            return np.zeros(len(features), dtype=np.float32)
        return self._booster.predict(xgb.DMatrix(features))


class RandomModel(_DataModel):
    """Uniform random scores (seeded): the no-model ablation."""

    def __init__(self, seed: int = 0):
        super().__init__()
        import numpy as np

        self._rng = np.random.default_rng(seed)

    @property
    def reads_features(self) -> bool:
        return False

    def update(self, features: np.ndarray, latencies_ms: Sequence[float | None]) -> None:
        self._add(features, latencies_ms)

    def predict(self, features: np.ndarray) -> np.ndarray:
        return self._rng.random(len(features))


CostModelKind = Literal["xgb", "random"]


def make_cost_model(kind: CostModelKind, seed: int = 0) -> CostModel:
    """The cost model called `kind`."""
    if kind == "xgb":
        return XGBModel(seed=seed)
    if kind == "random":
        return RandomModel(seed=seed)
    raise ValueError(f"unknown cost model: {kind}")
