"""Cost models: feature vectors -> scores (higher = predicted faster).

`base.py` holds the interface (`CostModel`); each implementation is one file: `xgb.py` (`XGBModel`,
XGBoost on the log speed), `random.py` (`RandomModel`, the ablation). A new model is one new file and
one line in `COST_MODELS`.

Layering: `tuner` never imports `service`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from .base import CostModel, pairwise_accuracy
from .random import RandomModel
from .xgb import XGBModel

CostModelKind = Literal["xgb", "random"]

COST_MODELS: dict[str, Callable[..., CostModel]] = {
    "xgb": XGBModel,
    "random": RandomModel,
}


def make_cost_model(kind: CostModelKind, seed: int = 0, **options: Any) -> CostModel:
    """The cost model called `kind`, seeded with `seed` and made with `options`.

    Raises:
        ValueError: no cost model is called `kind`.
    """
    if kind not in COST_MODELS:
        raise ValueError(f"unknown cost model: {kind}")
    return COST_MODELS[kind](seed=seed, **options)


__all__ = ["COST_MODELS", "CostModel", "CostModelKind", "RandomModel", "XGBModel", "make_cost_model",
           "pairwise_accuracy"]
