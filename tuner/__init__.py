"""The search: spaces, cost model, features, measurement, search strategies.

Layering: `service -> tuner -> compiler`; `tuner` never imports `service`.
TVM, numpy and xgboost are imported where used, so importing `tuner` is cheap.
"""

from __future__ import annotations

import compiler  # noqa: F401 - sets TVM's CPU thread count before any measurement worker starts

from .alt import ALTSearch, layout_of_config, split_config
from .layout_space import LayoutSpace
from .cost_model import CostModel, RandomModel, XGBModel, make_cost_model, pairwise_accuracy
from .measure import Candidate, LocalMeasurer, MeasureResult, Measurer, make_measurer
from .search import Proposal, Search, XGBSearch, make_search
from .space import InvalidConfig, Knob, LoopSpace, ScheduleFailed, SearchSpace, config_key, make_space
from .task import MAX_SEED, Task, Trial, TuneResult, build_pipeline, task_from_spec, tune_options
from .tune import apply_config, tune

__all__ = [
    "MAX_SEED",
    "ALTSearch",
    "layout_of_config",
    "split_config",
    "Candidate",
    "CostModel",
    "InvalidConfig",
    "Knob",
    "LayoutSpace",
    "LocalMeasurer",
    "LoopSpace",
    "MeasureResult",
    "Measurer",
    "Proposal",
    "RandomModel",
    "ScheduleFailed",
    "Search",
    "SearchSpace",
    "Task",
    "Trial",
    "TuneResult",
    "task_from_spec",
    "tune_options",
    "build_pipeline",
    "XGBModel",
    "XGBSearch",
    "apply_config",
    "config_key",
    "make_cost_model",
    "make_measurer",
    "make_search",
    "make_space",
    "pairwise_accuracy",
    "tune",
]
