"""Search strategies: which configurations to measure, round after round.

`Search.run` is the tuning lifecycle (MetaSchedule's): `pre_tuning` (learn from
prior trials), then rounds of `generate_candidates` -> measure each (calling
`on_trial` at once, polling `should_stop` in between) -> `notify_results`.

`XGBSearch`: each round samples a batch of fresh configurations not measured
yet plus mutations (one knob step) of the best measured ones, ranks them with
the cost model, and measures the top-k plus a few random picks (epsilon-greedy).
Before the model has data, the picks are random; the first round also measures
the space's known loop nests (`seed_configs`: the untuned nest, oneDNN-like
register blocking).

Layering: `tuner` never imports `service`. numpy is imported inside functions.
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from .cost_model import CostModel, CostModelKind, make_cost_model, pairwise_accuracy
from .features import Featurizer
from .measure import Candidate, Measurer
from .space import (
    Config,
    InvalidConfig,
    LoopSpace,
    ScheduleFailed,
    SearchSpace,
    config_key,
    sample_unique,
)
from .task import Task, Trial

if TYPE_CHECKING:
    import numpy as np
    import tvm

log = logging.getLogger(__name__)


@dataclass
class Proposal:
    """A configuration chosen for measurement, with its module and why it was chosen."""

    config: Config
    mod: Any  # tvm.IRModule
    predicted: float | None = None
    source: str = "model"  # "model", "random", "start_from"
    extra: dict[str, Any] = field(default_factory=dict)
    task: Task | None = None  # where it is measured (a per-layout task); None: the search's task
    stage: str = "loop"  # the search stage that proposed it ("joint", "loop")


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
    import numpy as np

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


def noop(trial: Trial) -> None:
    del trial


def never() -> bool:
    return False


class Search(abc.ABC):
    """A search strategy over one task's space, measuring with one measurer."""

    def __init__(self, task: Task, space: SearchSpace, measurer: Measurer):
        self.task, self.space, self.measurer = task, space, measurer
        self.measured: set[str] = set()  # config keys of every trial so far (prior included)

    @abc.abstractmethod
    def pre_tuning(self, prior: Sequence[Trial]) -> None:
        """Learns from trials measured before (resume); they are not measured again."""

    @abc.abstractmethod
    def generate_candidates(self, n: int) -> list[Proposal]:
        """Up to `n` unmeasured proposals to measure next; [] when the space is exhausted."""

    @abc.abstractmethod
    def notify_results(self, trials: Sequence[Trial]) -> None:
        """Learns from the trials of the last round."""

    def run(
        self,
        budget: int,
        *,
        prior: Sequence[Trial] = (),
        start_from: Sequence[Config] = (),
        on_trial: Callable[[Trial], None] = noop,
        should_stop: Callable[[], bool] = never,
        replay: bool = True,
    ) -> list[Trial]:
        """Measures up to `budget - len(prior)` candidates; returns the new trials in order.

        Resume is a replay: the search runs again from the start with the same seed and
        budget, and each proposal that is the next prior trial takes that trial's result
        instead of a measurement, so the search reaches the state the interrupted run was
        in (cost model, agents, stage, the round it was in) and goes on exactly as an
        uninterrupted run would have (given the same measurements). Where the replay
        proposes something else (prior trials from another version or seed), the prior
        trials not replayed are learned at once: by `pre_tuning` if none was replayed, else
        as one batch (`notify_results`).

        Args:
            budget: on-device measurements in all, the prior ones included.
            prior: trials of this task measured before (resume), in index order.
            start_from: configurations measured first (known good ones); invalid or
                already measured ones are skipped.
            on_trial: called with each trial the moment it is measured (not for prior ones).
            should_stop: polled before each measurement; True ends the search.
            replay: False learns the prior trials at once (`pre_tuning`) instead of replaying
                them: for callers that tune in many short rounds, each passing all trials so
                far (the model-job scheduler), where replaying every round again costs more
                than it gives.
        """
        queue = sorted(prior, key=lambda t: t.index)
        if queue and not replay:
            self.measured |= {config_key(t.config) for t in queue}
            self.pre_tuning(queue)
            budget -= len(queue)
            queue = []
        next_index = max((t.index for t in prior), default=-1) + 1
        remaining = budget  # the prior trials are taken from it as they are replayed
        trials: list[Trial] = []

        def learn_rest() -> None:
            """The replay diverged: learn the prior trials not replayed at once."""
            nonlocal remaining
            rest = list(queue)
            queue.clear()
            replayed = len(prior) - len(rest)
            self.measured |= {config_key(t.config) for t in rest}
            remaining -= len(rest)
            log.info("%s: resume replay diverged after %d prior trials; learning the other %d at once",
                     self.task.name, replayed, len(rest))
            if replayed:
                self.notify_results(rest)
            else:
                self.pre_tuning(rest)

        def measure(proposal: Proposal, round_: int) -> tuple[Trial, bool]:
            """(trial, whether it is new): the next prior trial if the proposal is it, else measured."""
            nonlocal next_index, remaining
            key = config_key(proposal.config)
            if queue and config_key(queue[0].config) == key:
                remaining -= 1
                self.measured.add(key)
                return queue.pop(0), False
            result = self.measurer.measure_one(proposal.task or self.task, Candidate(proposal.config, proposal.mod))
            extra = {"source": proposal.source, "round": round_, "build_s": round(result.build_s, 4),
                     "run_s": round(result.run_s, 4), **proposal.extra, **result.extra}
            trial = Trial(next_index, proposal.config, result.latencies_ms, result.error,
                          predicted=proposal.predicted, stage=proposal.stage, extra=extra)
            next_index += 1
            remaining -= 1
            self.measured.add(key)
            trials.append(trial)
            return trial, True

        def proceed(proposal: Proposal) -> bool | None:
            """Take `proposal` (True), skip it (None: learned from the prior meanwhile) or stop
            (False: no budget left, or stopped). A proposal that is not the next prior trial
            ends the replay first."""
            if remaining <= 0:
                return False
            if queue and config_key(queue[0].config) != config_key(proposal.config):
                learn_rest()
                if remaining <= 0:
                    return False
            if not queue and should_stop():
                return False
            return None if not queue and config_key(proposal.config) in self.measured else True

        def build_ahead(proposals: Sequence[Proposal]) -> None:
            """Has the measurer build together what this round will measure (replayed ones are not)."""
            if not queue and should_stop():
                return
            known = self.measured | {config_key(t.config) for t in queue}
            fresh = [p for p in proposals if config_key(p.config) not in known]
            ahead = fresh[:max(0, remaining - len(queue))]
            self.measurer.prebuild([(p.task or self.task, Candidate(p.config, p.mod)) for p in ahead])

        first = self._start_proposals(start_from)
        build_ahead(first)
        started: list[Trial] = []
        for proposal in first:
            go = proceed(proposal)
            if go is None:
                continue
            if not go:
                break
            trial, new = measure(proposal, 0)
            started.append(trial)
            if new:
                on_trial(trial)
        if started:
            self.notify_results(started)

        round_ = 0
        while remaining > 0 and (queue or not should_stop()):
            round_ += 1
            proposals = self.generate_candidates(remaining)
            if not proposals:
                if queue:
                    learn_rest()
                    continue
                log.info("%s: search space exhausted after %d trials", self.task.name, len(self.measured))
                break
            build_ahead(proposals)
            batch: list[Trial] = []
            for proposal in proposals:
                go = proceed(proposal)
                if go is None:
                    continue
                if not go:
                    break
                trial, new = measure(proposal, round_)
                batch.append(trial)
                if new:
                    scored = [t for t in batch if t.predicted is not None]
                    accuracy = pairwise_accuracy([t.predicted for t in scored], [t.latency_ms for t in scored])
                    if accuracy is not None:
                        trial.extra["model_accuracy"] = round(accuracy, 4)
                    on_trial(trial)
            if batch:
                self.notify_results(batch)
        return trials

    def _start_proposals(self, start_from: Sequence[Config]) -> list[Proposal]:
        out = []
        for config in start_from:
            try:
                config = self.space.validate(config)
            except InvalidConfig as e:
                log.warning("%s: skipping start_from config %s: %s", self.task.name, config, e)
                continue
            key = config_key(config)
            if key in self.measured or any(config_key(p.config) == key for p in out):
                continue
            try:
                mod = self.space.apply(config).mod
            except (InvalidConfig, ScheduleFailed) as e:
                log.warning("%s: skipping start_from config %s: %s", self.task.name, config, e)
                continue
            out.append(Proposal(config, mod, None, "start_from"))
        return out


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
        """
        import numpy as np

        super().__init__(task, space, measurer)
        self.rng = np.random.default_rng(seed)
        self.model = make_cost_model(cost_model, seed) if isinstance(cost_model, str) else cost_model
        self.batch_size, self.top_k, self.epsilon = batch_size, top_k, epsilon
        self.mutation_fraction, self.elite = mutation_fraction, elite
        self.seeded = seeds
        # MetaSchedule's features cost about as much as applying the batch's schedules: only for a model that reads them
        self.featurize = Featurizer(space, task.target, use_ms=ms_features and self.model.reads_features)
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
        import numpy as np

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
        """Known schedules the first round measures: the nearest to the untuned program ("untuned",
        small memory-bound programs run fastest so) and oneDNN-like register blocking ("blocked": in a
        fusion space, one per layout it offers)."""
        from .fusion_space import FusionSpace

        if isinstance(self.space, FusionSpace):
            blocked = self.space.blocked_configs()
        elif isinstance(self.space, LoopSpace):
            blocked = [self.space.blocked_config()]
        else:
            return []
        seeds = [(self.space.untuned_config(), "untuned")]
        for config in blocked:
            if all(config_key(config) != config_key(c) for c, _ in seeds):
                seeds.append((config, "blocked"))
        return seeds

    def notify_results(self, trials: Sequence[Trial]) -> None:
        import numpy as np

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


SearchKind = Literal["alt", "xgb", "random"]


def make_search(kind: SearchKind, task: Task, space: SearchSpace, measurer: Measurer, **options: Any) -> Search:
    """The search called `kind`: "alt" (layouts and loops, `tuner.alt`, over a `LayoutSpace`), "xgb"
    (model-ranked loops) or "random" (the same, random scores)."""
    if kind == "alt":
        from .alt import ALTSearch

        return ALTSearch(task, space, measurer, **options)  # type: ignore[arg-type]
    if kind == "xgb":
        return XGBSearch(task, space, measurer, **options)
    if kind == "random":
        return XGBSearch(task, space, measurer, **{**options, "cost_model": "random"})
    raise ValueError(f"unknown search: {kind}")
