"""`XGBSearch`: model-ranked sampling with mutations of the best, epsilon-greedy.

Each round samples a batch of fresh configurations not measured yet plus
mutations (one knob step) of the best measured ones, ranks them with the cost
model, and measures the top-k plus a few random picks (epsilon-greedy). Before
the model has data, the picks are random; the first round also measures the
space's known loop nests (`seed_configs`: the untuned nest, oneDNN-like
register blocking). With the random cost model (`random_search`) it is the
no-model ablation.

Layering: `tuner` never imports `service`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..cost_models import CostModel, CostModelKind, make_cost_model
from ..features import Featurizer
from ..knowledge import Knowledge
from ..measurers.base import Measurer
from ..spaces.base import Config, InvalidConfig, ScheduleFailed, SearchSpace, config_key, sample_unique
from ..task import Task, Trial
from .base import Proposal, Search
from .picks import pick, seat_seeds

log = logging.getLogger(__name__)


class XGBSearch(Search):
    """Model-ranked sampling with mutations of the best, epsilon-greedy (see the module doc)."""

    def __init__(
        self,
        task: Task,
        space: SearchSpace,
        measurer: Measurer,
        *,
        cost_model: CostModelKind | CostModel = "xgb",
        seed: int = 0,
        batch_size: int = 128,
        top_k: int = 8,
        epsilon: float = 0.125,
        mutation_fraction: float = 0.5,
        elite: int = 8,
        ms_features: bool = True,
        seeds: bool = True,
        knowledge: Knowledge | None = None,
    ):
        """
        Args:
            task: the task.
            space: its search space.
            measurer: measures the picks.
            cost_model: a model or its kind.
            seed: seeds sampling, picks and the model: the same measurements give
                the same sequence of configurations.
            batch_size: candidates ranked per round.
            top_k: candidates measured per round.
            epsilon: fraction of each round's picks taken at random from the batch.
            mutation_fraction: share of the batch made of mutations of the best trials.
            elite: how many of the best trials are mutated.
            ms_features: add MetaSchedule's per-store features to the knob features.
            seeds: measure the space's known nests first (`seed_configs`); False: samples and mutations only.
            knowledge: the target's (`tuner.knowledge`): its cost model warms an "xgb" model (with MetaSchedule's
                features on), and every measurement is recorded into it.
        """
        super().__init__(task, space, measurer)
        self.rng = np.random.default_rng(seed)
        self.knowledge = knowledge
        self.model = make_cost_model(cost_model, seed) if isinstance(cost_model, str) else cost_model
        self.batch_size, self.top_k, self.epsilon = batch_size, top_k, epsilon
        self.mutation_fraction, self.elite = mutation_fraction, elite
        self.seeded = seeds
        # MetaSchedule's features cost about as much as applying the batch's schedules: only for a model that reads them
        self.featurize = Featurizer(space, task.target, use_ms=ms_features and self.model.reads_features)
        if cost_model == "xgb" and knowledge is not None and knowledge.cost_model is not None \
                and self.featurize.program_features:
            self.model = make_cost_model("xgb", seed, base=knowledge.cost_model)
        self._features: dict[str, np.ndarray] = {}  # config key -> feature row of a proposal
        self._best: list[tuple[float, Config]] = []  # (latency, config) of correct trials

    def pre_tuning(self, prior: Sequence[Trial]) -> None:
        usable = []
        for trial in prior:
            try:
                usable.append((self.space.validate(trial.config), trial))
            except InvalidConfig:
                continue  # from another space version: counts toward the budget, teaches nothing
        if not usable:
            return
        feats = self.featurize([c for c, _ in usable])
        self.model.update(feats, [t.latency_ms for _, t in usable])
        for config, trial in usable:
            self._remember(config, trial.latency_ms)

    def _remember(self, config: Config, latency: float | None) -> None:
        if latency is not None:
            self._best.append((latency, config))
            self._best.sort(key=lambda x: x[0])
            del self._best[self.elite :]

    def _mutants(self, n: int, exclude: set[str]) -> list[Config]:
        out: list[Config] = []
        if not self._best or n <= 0:
            return out
        for _ in range(4 * n):
            _, parent = self._best[int(self.rng.integers(len(self._best)))]
            child = self.space.mutate(parent, self.rng)
            # a second step now and then, to leave a local optimum
            if self.rng.random() < 0.3:
                child = self.space.mutate(child, self.rng)
            key = config_key(child)
            if key not in exclude:
                exclude.add(key)
                out.append(child)
                if len(out) == n:
                    break
        return out

    def generate_candidates(self, n: int) -> list[Proposal]:
        n = min(n, self.top_k)
        exclude = set(self.measured)
        mutants = self._mutants(int(self.batch_size * self.mutation_fraction), exclude)
        fresh = sample_unique(self.space, self.rng, self.batch_size - len(mutants), exclude=list(exclude))
        pool, schedules, sources = [], [], []
        # the known nests until each is measured: a search that starts from prior trials (a model job's
        # joint stage, another job's schedule) still measures them
        seeds = [(c, source) for c, source in (self.seed_configs() if self.seeded else [])
                 if config_key(c) not in self.measured]
        seed_keys = {config_key(c) for c, _ in seeds}
        drawn = [(c, "mutation") for c in mutants] + [(c, "sample") for c in fresh]
        for config, source in seeds + [(c, source) for c, source in drawn if config_key(c) not in seed_keys]:
            try:
                schedules.append(self.space.apply(config))
            except (InvalidConfig, ScheduleFailed) as e:
                log.debug("dropping config that does not apply: %s", e)
                continue
            pool.append(config)
            sources.append(source)
        if not pool:
            return []
        feats = self.featurize(pool, schedules)
        scores = np.asarray(self.model.predict(feats), dtype=np.float64) if self.model.trained else None
        picks = pick(scores, len(pool), n, self.epsilon, self.rng)
        seat_seeds(picks, sources, {source for _, source in seeds})
        out = []
        for i, source in picks:
            self._features[config_key(pool[i])] = feats[i]
            predicted = None if scores is None else float(scores[i])
            out.append(Proposal(pool[i], schedules[i].mod, predicted, source, {"origin": sources[i]}))
        return out

    def seed_configs(self) -> list[tuple[Config, str]]:
        """Known schedules the first round measures (the space's `seed_configs`): the nearest to the untuned
        program ("untuned", small memory-bound programs run fastest so) and oneDNN-like register blocking
        ("blocked": in a fusion space, one per layout it offers)."""
        return self.space.seed_configs()

    def notify_results(self, trials: Sequence[Trial]) -> None:
        rows, latencies, missing = [], [], []
        for trial in trials:
            key = config_key(trial.config)
            row = self._features.pop(key, None)
            if row is None:
                missing.append(trial)
                continue
            rows.append(row)
            latencies.append(trial.latency_ms)
            self._remember(trial.config, trial.latency_ms)
        valid = []
        for t in missing:  # start_from trials, prior trials learned at once: featurize now
            try:
                valid.append((self.space.validate(t.config), t))
            except InvalidConfig:
                continue  # from another space version: counts toward the budget, teaches nothing
        if valid:
            rows += list(self.featurize([c for c, _ in valid]))
            latencies += [t.latency_ms for _, t in valid]
            for c, t in valid:
                self._remember(c, t.latency_ms)
        if rows:
            self.model.update(np.stack(rows), latencies)
            if self.knowledge is not None and self.featurize.program_features:
                self.knowledge.record(self.task.workload_key, np.stack(rows), latencies)


def random_search(task: Task, space: SearchSpace, measurer: Measurer, **options: Any) -> XGBSearch:
    """`XGBSearch` with the random cost model: the no-model ablation."""
    return XGBSearch(task, space, measurer, **{**options, "cost_model": "random"})
