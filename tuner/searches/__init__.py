"""Search strategies: which configurations of a space to measure, round after round.

`base.py` holds the interface (`Search`, its lifecycle `run`, `Proposal`); each search is one file:
`xgb.py` (`XGBSearch`: model-ranked sampling and mutations; `random_search`, the no-model ablation),
`alt.py` (`ALTSearch`: ALT's joint layout and loop search with PPO agents, its helpers in `alt_points.py`
and `alt_seeds.py`). `picks.py` is how both pick from a ranked pool. A new search is one new file and one
line in `SEARCHES`.

Layering: `tuner` never imports `service`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from ..measurers.base import Measurer
from ..spaces.base import SearchSpace
from ..task import Task
from .alt import ALTSearch
from .base import Proposal, Search, never, noop
from .xgb import XGBSearch, random_search

SearchKind = Literal["alt", "xgb", "random"]

# kind -> (task, space, measurer, **options) -> the search; "alt" takes a `LayoutSpace`
SEARCHES: dict[str, Callable[..., Search]] = {
    "alt": ALTSearch,
    "xgb": XGBSearch,
    "random": random_search,
}


def make_search(kind: SearchKind, task: Task, space: SearchSpace, measurer: Measurer, **options: Any) -> Search:
    """The search called `kind`: "alt" (layouts and loops, over a `LayoutSpace`), "xgb" (model-ranked
    loops) or "random" (the same, random scores), made with `options`.

    Raises:
        ValueError: no search is called `kind`.
    """
    if kind not in SEARCHES:
        raise ValueError(f"unknown search: {kind}")
    return SEARCHES[kind](task, space, measurer, **options)


__all__ = ["SEARCHES", "ALTSearch", "Proposal", "Search", "SearchKind", "XGBSearch", "make_search", "never", "noop",
           "random_search"]
