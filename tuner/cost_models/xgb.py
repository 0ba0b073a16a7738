"""`XGBModel`: XGBoost regression on the log speed of each candidate, refit on all data at every update.

The model is trained online on every measurement of a task so far: the target
of a candidate is its log speed relative to the task's best, `log(best /
latency)` <= 0, a failed candidate one below the worst, regressed with squared
error. (MetaSchedule's `best / latency` in (0, 1] squeezes every slow candidate
near 0, so with a few dozen samples the trees only learn "like the best or
not" and the top of a batch ties.) The model is refit from scratch at each
`update` (a few hundred samples train in well under a second).

With a `base` (the target's model, `tuner.knowledge.TargetModel`, trained on every task measured on the target)
the model is warm: before the task has measurements its candidates are ranked by the base's predictions on
their program features (the rows' last `PROGRAM_WIDTH` columns), and its own trees are fit with those
predictions as the base margin, so they learn only where this task differs.

Layering: `tuner` never imports `service`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import xgboost as xgb

from ..knowledge import PROGRAM_WIDTH, TargetModel
from .data import DataModel


def targets(latencies_ms: Sequence[float | None]) -> np.ndarray:
    """Training targets: log(best / latency) <= 0 (0 for the task's best); a failure
    scores one below the worst correct candidate (or -1 when none is correct)."""
    valid = [x for x in latencies_ms if x is not None and x > 0]
    best = min(valid) if valid else 1.0
    scores = [math.log(best / x) if x is not None and x > 0 else None for x in latencies_ms]
    floor = min((v for v in scores if v is not None), default=0.0) - 1.0
    return np.asarray([floor if v is None else v for v in scores], dtype=np.float32)


class XGBModel(DataModel):
    """XGBoost regression on normalized throughput, refit on all data at every update."""

    def __init__(self, seed: int = 0, num_rounds: int = 60, min_samples: int = 4, threads: int = 1,
                 base: TargetModel | None = None):
        """
        Args:
            seed: XGBoost's seed.
            num_rounds: boosting rounds per fit.
            min_samples: correct measurements needed before the model is fit.
            threads: XGBoost threads (1 keeps fits deterministic and the shared machine quiet).
            base: the target's model (warm); None: cold, this task's measurements only.
        """
        super().__init__()
        self.seed, self.num_rounds, self.min_samples, self.threads = seed, num_rounds, min_samples, threads
        self.base = base
        self._booster = None

    @property
    def trained(self) -> bool:
        return self._booster is not None or self.base is not None

    def _margin(self, features: np.ndarray) -> np.ndarray | None:
        """The base's predictions of `features` (None: no base, or rows without program features)."""
        if self.base is None or features.ndim != 2 or features.shape[1] < PROGRAM_WIDTH:
            return None
        return self.base.predict(features[:, -PROGRAM_WIDTH:])

    def update(self, features: np.ndarray, latencies_ms: Sequence[float | None]) -> None:
        self._add(features, latencies_ms)
        if sum(v is not None for v in self._y) < self.min_samples:
            return
        x = np.stack(self._x)
        dtrain = xgb.DMatrix(x, label=targets(self._y), base_margin=self._margin(x))
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
        features = np.asarray(features, dtype=np.float32)
        margin = self._margin(features)
        if self._booster is None:
            return margin if margin is not None else np.zeros(len(features), dtype=np.float32)
        return self._booster.predict(xgb.DMatrix(features, base_margin=margin))
