"""Rounds of a model's tasks: what the gradient scheduler hands out, and who runs them.

`tune_model` gives its budget to tasks in rounds (`tuner.scheduler.GradientScheduler`): a `Round` is "measure `n`
more candidates of this task", a few measurements of one task's search (`tune` with the task's trials so far as
its prior). Rounds are independent of each other once dispatched: a round needs only its task's program, its
trials so far and the measurer, so any process that can read the task's trials can run it.

Who runs them is a `Rounds`:

- `InlineRounds`: in this process, one at a time, as it is submitted (a benchmark, a job on one worker with
  nothing else to spread to): the scheduler sees every round's result before choosing the next.
- the service's rounds (`service.rounds.JobRounds`): every round a row in the database, claimed under a lease by
  any worker on the same database (the job's own worker included), measured on its own CPU or a device it leases;
  the scheduler keeps one round more in flight than the workers running them, so adding workers adds rounds in
  flight while its choices stay global (one scheduler per job, on the job's worker).

A round on the wire (`Round.to_json` / `from_json`) carries the task's TIR function as TVM's JSON: written by the
job's own worker from the translated graph (checked data, never the user's program), read back by another worker.

Layering: `tuner` imports `compiler`, never `service` or `bench`.
"""

from __future__ import annotations

import abc
import logging
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import tvm

from compiler.target import resolve_target

from .knowledge import Knowledge
from .measurers import Measurer
from .spaces.base import config_key
from .task import Task, Trial, TuneResult, best_trial
from .tune import tune

log = logging.getLogger("altune.model")


@dataclass(frozen=True)
class Round:
    """`n` more measurements of one task's search.

    Attributes:
        index: the task's index in the scheduler (the caller's).
        task: the program and target.
        n: measurements this round may spend.
        prior: how many trials the task had when the round was dispatched (its trials from then on are the round's).
        start_from: configurations measured first (a task's first round: its start, carried schedules, seeds).
        seeds: the search's own seeds (`tune(seeds=)`): off for complex operators, whose register-blocked nests are
            in `start_from` already.
        seed: the search's random seed.
        weight: how often the model runs the task (for the caller's records).
    """

    index: int
    task: Task
    n: int
    prior: int
    start_from: list[dict] = field(default_factory=list)
    seeds: bool = True
    seed: int = 0
    weight: int = 1

    def to_json(self, target: str) -> dict[str, Any]:
        """The round as JSON data (`target`: the request's target string, which `resolve_target` reads back)."""
        return {"index": self.index, "name": self.task.name, "workload_key": self.task.workload_key,
                "prim_func": tvm.ir.save_json(self.task.prim_func), "target": target, "n": self.n,
                "prior": self.prior, "start_from": list(self.start_from), "seeds": self.seeds, "seed": self.seed,
                "weight": self.weight}

    @staticmethod
    def from_json(data: dict[str, Any]) -> Round:
        task = Task(data["name"], data["workload_key"], tvm.ir.load_json(data["prim_func"]),
                    resolve_target(data["target"]))
        return Round(int(data["index"]), task, int(data["n"]), int(data["prior"]), list(data["start_from"]),
                     bool(data["seeds"]), int(data["seed"]), int(data.get("weight", 1)))


@dataclass(frozen=True)
class RoundDone:
    """A finished round: the task's trials after it (all of them, the round's included), the untuned program's
    latency, and why its search failed (the task is given no more rounds)."""

    round: Round
    trials: list[Trial]
    baseline_ms: float | None = None
    error: str | None = None

    @property
    def best(self) -> Trial | None:
        return best_trial(self.trials)

    @property
    def spent(self) -> int:
        return max(0, len(self.trials) - self.round.prior)


def run_round(rnd: Round, prior: Sequence[Trial], measurer: Measurer, *, knowledge: Knowledge | None = None,
              on_trial: Callable[[Trial], None] = lambda _t: None,
              should_stop: Callable[[], bool] = lambda: False) -> TuneResult:
    """Runs a round whose task has measured `prior` so far (the round's own earlier trials included, when it is
    taken over from a worker that died mid-round): the rest of its `n`, each trial numbered after `prior` and
    handed to `on_trial` the moment it is measured. A start configuration already measured is not measured
    again."""
    tried = {config_key(t.config) for t in prior}
    start_from = [c for c in rnd.start_from if config_key(c) not in tried]
    count = len(prior)

    def numbered(trial: Trial) -> None:
        nonlocal count
        on_trial(replace(trial, index=count))
        count += 1

    return tune(rnd.task, rnd.prior + rnd.n, seed=rnd.seed, prior=list(prior), start_from=start_from,
                on_trial=numbered, should_stop=should_stop, measurer=measurer, replay=False, seeds=rnd.seeds,
                knowledge=knowledge)


class Rounds(abc.ABC):
    """Who runs a model's rounds (see the module docstring)."""

    @abc.abstractmethod
    def free(self, in_flight: int) -> bool:
        """Whether another round may be dispatched now, with `in_flight` rounds dispatched and not yet done."""

    @abc.abstractmethod
    def submit(self, rnd: Round, trials: Sequence[Trial]) -> None:
        """Dispatches a round of a task that has measured `trials` so far."""

    @abc.abstractmethod
    def wait(self, more: bool) -> RoundDone | None | bool:
        """The next finished round (blocking); True as soon as another round may be dispatched, when `more` (the
        scheduler has one to give); None when the tuning must stop (`should_stop`)."""

    def close(self) -> None:
        """Gives up the rounds still in flight (a stop); nothing to do when none are."""


class InlineRounds(Rounds):
    """Rounds run in this process as they are submitted, one at a time."""

    def __init__(self, measurer: Measurer, *, knowledge: Knowledge | None = None,
                 on_trial: Callable[[Round, Trial], None] = lambda _r, _t: None,
                 should_stop: Callable[[], bool] = lambda: False, reraise: Callable[[], None] = lambda: None) -> None:
        """`on_trial`: every trial the moment it is measured; `reraise`: raises again what aborted a round (a
        hook's exception, not the task's own failure), called before a failing round is recorded as the task's."""
        self.measurer, self.knowledge = measurer, knowledge
        self.on_trial, self.should_stop, self.reraise = on_trial, should_stop, reraise
        self.done: deque[RoundDone] = deque()

    def free(self, in_flight: int) -> bool:
        return in_flight == 0

    def submit(self, rnd: Round, trials: Sequence[Trial]) -> None:
        measured = list(trials)

        def record(trial: Trial) -> None:
            measured.append(trial)
            self.on_trial(rnd, trial)

        try:
            result = run_round(rnd, trials, self.measurer, knowledge=self.knowledge, on_trial=record,
                               should_stop=self.should_stop)
        except Exception as e:  # noqa: BLE001 - one task's failing search never fails the model
            self.reraise()
            log.exception("task %s: its search failed", rnd.task.name)
            self.done.append(RoundDone(rnd, measured, error=f"{type(e).__name__}: {str(e)[:300]}"))
            return
        self.done.append(RoundDone(rnd, measured, result.baseline_ms))

    def wait(self, more: bool) -> RoundDone | None | bool:
        return self.done.popleft() if self.done else None

