"""The search interface: which configurations to measure, round after round.

`Search.run` is the tuning lifecycle (MetaSchedule's): `pre_tuning` (learn from
prior trials), then rounds of `generate_candidates` -> measure each (calling
`on_trial` at once, polling `should_stop` in between) -> `notify_results`.
A search also says how it measures a configuration (`measured_as`), so its
finalists can be measured again as they were in the search.

Layering: `tuner` never imports `service`.
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import tvm

from ..cost_models.base import pairwise_accuracy
from ..measurers.base import Candidate, Measurer
from ..spaces.base import Config, InvalidConfig, ScheduleFailed, SearchSpace, config_key
from ..task import Task, Trial

log = logging.getLogger(__name__)


@dataclass
class Proposal:
    """A configuration chosen for measurement, with its module and why it was chosen."""

    config: Config
    mod: tvm.IRModule
    predicted: float | None = None
    source: str = "model"  # "model", "random", "start_from"
    extra: dict[str, Any] = field(default_factory=dict)
    task: Task | None = None  # where it is measured (a per-layout task); None: the search's task
    stage: str = "loop"  # the search stage that proposed it ("joint", "loop")


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

    def measured_as(self, config: Config) -> tuple[Task, Candidate]:
        """How this search measures `config`: the task it is measured in and its candidate (re-measuring the
        finalists measures them so). Raises `InvalidConfig` or `ScheduleFailed` where it does not apply."""
        return self.task, Candidate(config, self.space.apply(config).mod)

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
