"""Which candidates of a ranked pool a round measures: the model's best by tie class, an epsilon share at
random, and the round's seeds whatever the model thinks of them. Both searches pick so.

Layering: `tuner` never imports `service`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

TIE_DECIMALS = 4  # scores (log speed) equal to this many decimals are one tie class for `pick`


def pick(scores: np.ndarray | None, pool: int, n: int, epsilon: float,
         rng: np.random.Generator) -> list[tuple[int, str]]:
    """Which of a pool of `pool` candidates to measure: up to `n` (pool index, "model" or "random").

    Without scores (no model yet), `n` at random. Else the model's best `n` less an `epsilon` share,
    then that share at random from the rest. The model's picks take one candidate per tie class
    (scores equal to `TIE_DECIMALS` decimals) before a second of any, in score order: a tree model
    scores alike what it cannot tell apart, and nothing above the best measured (its target's
    maximum), so the best's near copies (a knob it never saw matter changed) fill the top of a
    batch as ties. Measuring all of them spends a round on one plateau; one tests the model's
    claim, and the next classes get the other picks. (On a fake device whose latency ignores most
    knobs, the search's excess over the optimum, summed over 24 seeds at budget 64, fell 3.1 -> 1.2.)
    """
    if scores is None:
        return [(int(i), "random") for i in rng.choice(pool, size=min(n, pool), replace=False)]
    scores = np.asarray(scores, dtype=np.float64)
    classes = np.round(scores, TIE_DECIMALS)
    seen: dict[float, int] = {}
    nth = np.zeros(pool, dtype=np.int64)  # 0 for the first of its class in score order, 1 the second...
    for i in np.argsort(-scores, kind="stable"):
        nth[i] = seen.get(classes[i], 0)
        seen[classes[i]] = nth[i] + 1
    order = [int(i) for i in np.lexsort((np.arange(pool), -scores, nth))]
    n_random = min(pool, int(round(epsilon * n)))
    picks = [(i, "model") for i in order[: n - n_random]]
    rest = order[n - n_random:]
    if rest and n_random:
        chosen = rng.choice(len(rest), size=min(n_random, len(rest)), replace=False)
        picks += [(rest[int(j)], "random") for j in chosen]
    return picks


def seat_seeds(picks: list[tuple[int, str]], sources: Sequence[str], seed_sources: set[str]) -> None:
    """Puts every pool entry whose source is a seed's among `picks` (pool index, source), in place of the
    lowest-ranked picks: a round measures its seeds whatever the model thinks of them."""
    picked = {i for i, _ in picks}
    missing = [i for i, source in enumerate(sources) if source in seed_sources and i not in picked]
    for k, i in enumerate(missing[: len(picks)]):
        picks[len(picks) - 1 - k] = (i, sources[i])
