"""The search: spaces, searches, cost models and measurers (one package per family, each with a registry),
features, the PPO agents, and the entry points `tune` and `apply_config`.

Layering: `service -> tuner -> compiler`; `tuner` never imports `service`. Importing `tuner` imports TVM
(which loads torch), numpy and xgboost: the API process does not import it.
"""

from __future__ import annotations

from compiler.target import use_all_cores

from .cost_models import CostModel, RandomModel, XGBModel, make_cost_model, pairwise_accuracy
from .measurers import Candidate, LocalMeasurer, MeasureResult, Measurer, make_measurer
from .searches import ALTSearch, Proposal, Search, XGBSearch, make_search
from .spaces import (
    InvalidConfig,
    Knob,
    LayoutSpace,
    LoopSpace,
    ScheduleFailed,
    SearchSpace,
    config_key,
    layout_of_config,
    make_space,
    split_config,
)
from .task import MAX_SEED, Task, Trial, TuneResult, build_pipeline, task_from_spec, tune_options
from .tune import apply_config, tune

use_all_cores()  # TVM's CPU thread count (every core) before any measurement worker starts

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
