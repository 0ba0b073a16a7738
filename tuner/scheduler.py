"""Spending a model's measurement budget across its tasks: Ansor's gradient task scheduler.

The objective is the model's estimated latency, `sum_i weight_i * best_i` (a
task's best latency times how often the model runs it). After a round-robin
warm-up (one round per task, in order), every round goes to the task whose
objective can still drop most, estimated as in Ansor (Zheng et al., OSDI 2020,
sec. 6.2):

    grad_i = weight_i * (alpha * backward_i + (1 - alpha) * forward_i)
    backward_i = (best_i(t_i) - best_i(t_i - window)) / window      # recent slope, rounds
    forward_i  = -best_i / t_i                                       # optimistic: 1/t_i of it again

(`t_i` = rounds given to task i; both terms are <= 0). The task with the most
negative gradient is tuned next; ties are broken at random with `seed`. A
task whose rounds produce no correct program has no best latency: it gets one
more round after the warm-up only when nothing else can improve, and a task
whose callback reports that it spent nothing (its space is exhausted) is not
picked again.

The scheduler drives any per-task search through one callback,
`tune_round(task_index, n_trials) -> best latency so far (ms) or None`, or a
`RoundResult` when the round spent a different number of measurements.

Layering: `tuner` never imports `service`. Pure Python.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class RoundResult:
    """What one round of a task's search reports.

    Attributes:
        best_ms: the task's best latency so far (all its rounds), None when nothing ran correctly.
        trials: measurements this round spent (0: the task cannot spend more).
    """

    best_ms: float | None
    trials: int


@dataclass
class SchedulerState:
    """Per-task history: rounds given, trials spent, best latency after each of its rounds."""

    rounds: list[int]
    trials: list[int]
    history: list[list[float | None]]
    dead: list[bool]
    order: list[int] = field(default_factory=list)  # task index of every round, in order

    @property
    def best(self) -> list[float | None]:
        return [h[-1] if h else None for h in self.history]


TuneRound = Callable[[int, int], "float | None | RoundResult"]


class GradientScheduler:
    """Ansor's gradient-based task scheduler (see the module docstring).

    Args:
        weights: how often the model runs each task (> 0).
        tune_round: runs `n_trials` more measurements of task `i`; returns its best so far.
        budget: measurements in all, across tasks.
        trials_per_round: measurements per round (Ansor: 64; ALT's batch: 8).
        alpha: weight of the backward (observed) slope against the forward (optimistic) one.
        window: rounds over which the backward slope is taken.
        seed: breaks ties between equal gradients.
        should_stop: polled before every round (cancel, lost lease).
    """

    def __init__(
        self,
        weights: Sequence[float],
        tune_round: TuneRound,
        budget: int,
        *,
        trials_per_round: int = 8,
        alpha: float = 0.2,
        window: int = 3,
        seed: int = 0,
        should_stop: Callable[[], bool] = lambda: False,
    ) -> None:
        assert all(w > 0 for w in weights), f"weights must be > 0: {list(weights)}"
        assert budget >= 0 and trials_per_round >= 1, f"{budget=} {trials_per_round=}"
        assert 0.0 <= alpha <= 1.0 and window >= 1, f"{alpha=} {window=}"
        self.weights = list(weights)
        self.tune_round = tune_round
        self.budget = budget
        self.trials_per_round = trials_per_round
        self.alpha = alpha
        self.window = window
        self.rng = random.Random(seed)
        self.should_stop = should_stop
        n = len(self.weights)
        self.state = SchedulerState([0] * n, [0] * n, [[] for _ in range(n)], [False] * n)

    @property
    def spent(self) -> int:
        return sum(self.state.trials)

    def objective(self) -> float | None:
        """sum weight_i * best_i, None while some task has no best latency."""
        best = self.state.best
        if any(b is None for b in best):
            return None
        return sum(w * b for w, b in zip(self.weights, best))

    def gradients(self) -> list[float | None]:
        """d objective / d round for every task (<= 0; None: no estimate, the task has no best yet)."""
        out: list[float | None] = []
        for i, history in enumerate(self.state.history):
            best = history[-1] if history else None
            if best is None or self.state.dead[i]:
                out.append(None)
                continue
            t = self.state.rounds[i]
            backward = 0.0
            if t > self.window and history[-1 - self.window] is not None:
                backward = (best - history[-1 - self.window]) / self.window
            forward = -best / t
            out.append(self.weights[i] * (self.alpha * backward + (1 - self.alpha) * forward))
        return out

    def next_task(self, busy: Collection[int] = ()) -> int | None:
        """The task the next round goes to, None when none can spend more (`busy`: tasks with a round in flight,
        which get no second one)."""
        alive = [i for i in range(len(self.weights)) if not self.state.dead[i] and i not in busy]
        if not alive:
            return None
        fresh = [i for i in alive if self.state.rounds[i] == 0]
        if fresh:  # warm-up: round-robin in task order
            return fresh[0]
        grads = self.gradients()
        scored = [(g, i) for i, g in enumerate(grads) if g is not None and i in alive]
        if not scored:  # only tasks that never ran correctly are left: the least-tried first
            return min(alive, key=lambda i: (self.state.rounds[i], i))
        lowest = min(g for g, _ in scored)
        ties = [i for g, i in scored if g == lowest]
        return ties[0] if len(ties) == 1 else self.rng.choice(ties)

    def step(self) -> int | None:
        """Runs one round; returns the task index it went to, None when nothing was run."""
        left = self.budget - self.spent
        if left <= 0 or self.should_stop():
            return None
        i = self.next_task()
        if i is None:
            return None
        n = min(self.trials_per_round, left)
        self.complete(i, self.tune_round(i, n), n)
        return i

    def complete(self, i: int, result: float | None | RoundResult, n: int) -> None:
        """Records a finished round of task `i` that was given `n` measurements."""
        if not isinstance(result, RoundResult):
            result = RoundResult(result, n)
        assert result.trials >= 0, f"task {i} reported {result.trials} trials"
        self.state.rounds[i] += 1
        self.state.trials[i] += result.trials
        previous = self.state.history[i][-1] if self.state.history[i] else None
        best = result.best_ms
        if previous is not None and (best is None or best > previous):
            best = previous  # a best latency never gets worse
        self.state.history[i].append(best)
        self.state.order.append(i)
        if result.trials == 0:
            self.state.dead[i] = True

    def run_parallel(self, submit: Callable[[int, int], None],
                     wait: Callable[[bool], tuple[int, RoundResult] | None | bool],
                     free: Callable[[int], bool]) -> list[float | None]:
        """Runs rounds several at a time: while `free(in_flight)` says another may go, the next task (one without a
        round in flight) is given one (`submit(i, n)`); then `wait(more)` gives a finished round `(i, result)` back,
        True when another round may go now (only asked when `more`: there is one to give), None to stop. The
        budget counts what rounds in flight may spend. With `free` true only when nothing is in flight this is
        `run`, each choice seeing every earlier result; with more in flight each choice sees every round finished
        so far: the scheduler stays one, whoever runs the rounds."""
        in_flight: dict[int, int] = {}  # task -> measurements its round was given

        def next_round() -> tuple[int | None, int]:
            left = self.budget - self.spent - sum(in_flight.values())
            return (self.next_task(busy=in_flight) if left > 0 else None), left

        while True:
            while not self.should_stop() and free(len(in_flight)):
                i, left = next_round()
                if i is None:
                    break
                in_flight[i] = min(self.trials_per_round, left)
                submit(i, in_flight[i])
            if not in_flight:
                break
            finished = wait(not self.should_stop() and next_round()[0] is not None)
            if finished is None:
                break
            if finished is True:
                continue
            i, result = finished
            self.complete(i, result, in_flight.pop(i))
        return self.state.best

    def run(self) -> list[float | None]:
        """Runs rounds until the budget is spent, every task is exhausted, or `should_stop`; the best per task."""
        while self.step() is not None:
            pass
        return self.state.best


def round_size(budget: int, tasks: int, most: int = 8) -> int:
    """Measurements per scheduler round: at most `most` (ALT's top-k batch), fewer when the budget
    could not otherwise give every task its warm-up round."""
    return max(1, min(most, budget // max(1, tasks)))


def estimated_latency(weights: Sequence[float], best_ms: Sequence[float | None],
                      fallback_ms: Sequence[float | None] | None = None) -> float | None:
    """sum weight_i * latency_i, a task's `fallback_ms` (e.g. its untuned latency) standing in for a
    missing best; None when some task has neither."""
    total = 0.0
    for i, (w, b) in enumerate(zip(weights, best_ms)):
        value = b if b is not None else (fallback_ms[i] if fallback_ms is not None else None)
        if value is None:
            return None
        total += w * value
    return total
