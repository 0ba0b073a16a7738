"""ALT's graph level for a whole model (paper sec. 4.2 and 6.1): the joint stage that chooses the layouts of the
complex operators across the graph, before the loop stage tunes each task in them.

The variables are the model's layout groups (`compiler.workloads.model.layouts.layout_groups`): the tensors
joined by element-wise and other non-conv operators share one channel block, which the conv writing them gives
its output and every conv reading them takes as its input; a conv's layout is its (input group's, output
group's) blocks. That is ALT's propagation along element-wise paths, with conversions only where a blocked
tensor meets an operator that takes the plain layout (TVM cannot convert between two blocks of one rank).

Every group may also keep the model's own layout (`PLAIN`): its convs stay in NCHW, with conversions where they
meet blocked neighbours; on a small model a conversion can cost more than the blocked layout saves.
A round proposes a block for every group at once (one shared `LayoutActor`; round 0 is the `conv_blocks` rule,
round 1 every group plain),
lowers the whole model in that choice and measures every task the round made that was not measured before: a
task the loop search can tune (a conv in its new layout) by a short loop search (`joint_trials` measurements,
the first the loop space's register-blocked nest, its "blocked" seed; stage "joint"; the loop stage later goes
on from them), the others (conversions, element-wise and pooling
tasks) with their default schedule (stage "layout").
A group's cost in a round is what its convs cost (their tasks and the conversions right before them); its
reward, the log of its round-0 cost over it. At the end each group takes the block of its lowest mean cost;
that choice is lowered and measured too, and the model keeps whichever measured choice has the lowest
estimated latency (sum over its tasks of calls x their latency, conversions included).

The actor carries over between model jobs on a target (`knowledge`, `tuner.knowledge`): it loads the stored
policy of its key (`GRAPH_FAMILY`, `tuner.ppo.policy_key`) and, at the end of `run`, keeps what it learned. A warm
actor proposes from round 1: every group's block is its draw, in place of the hand-enumerated "every group plain"
(`PLAIN` is one of its actions: it has learned where a model's own layout pays). Round 0, the rule, stays: it is
the reference every reward is measured against, and the result's `rule_ms`.

Layering: `tuner` never imports `service`; it imports `compiler`.
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import tvm

from compiler.target import vector_unit
from compiler.workloads.model import ImportedModel, ModelTask, default_schedule
from compiler.workloads.model.importer import ModelGraph, lower_graph
from compiler.workloads.model.layouts import PLAIN, conv_sites, group_blocks, layout_groups, vector_lanes
from compiler.workloads.model.tasks import conv_calls, conversions

from .knowledge import Knowledge
from .measurers.base import Candidate, Measurer
from .ppo import Critic, LayoutActor, policy_key
from .spaces import make_space, reductions
from .spaces.loop import LoopSpace
from .task import Task, Trial
from .tune import tune

log = logging.getLogger("altune.graph_layout")

JOINT_SHARE = 0.3  # of a model's budget, for the joint stage (the rest: the loop stage)
DEFAULT_CONFIG = {"schedule": "default"}  # a trial of the default schedule (the joint stage's measurements)
LAYOUT_STAGE = "layout"
GRAPH_FAMILY = "graph/float32"  # the actor's policy key names it (every model's groups, float32 convs' blocks)


@dataclass
class LayoutSearchResult:
    """The joint stage's outcome.

    Attributes:
        model: the model lowered in the chosen layouts.
        blocks: its convs' [input block, output block] by weight torch name (`ImportedModel.blocks`).
        estimate_ms: its estimated latency (calls x default-schedule latency over its tasks).
        rule_ms: the same for the `conv_blocks` rule (round 0).
        measurements: on-device measurements spent.
        rounds: per round: the source ("rule", "actor", "best per group"), the estimate, the conversions.
        costs: default-schedule latency by workload key, every task measured.
    """

    model: ImportedModel
    blocks: dict[str, list[int]]
    estimate_ms: float | None
    rule_ms: float | None
    measurements: int
    rounds: list[dict] = field(default_factory=list)
    costs: dict[str, float] = field(default_factory=dict)


def joint_budget(budget: int) -> int:
    """The joint stage's share (`JOINT_SHARE`) of a model's budget of `budget` measurements."""
    return max(1, int(budget * JOINT_SHARE))


def default_schedule_latency(measurer: Measurer, task: Task) -> tuple[list[float] | None, str | None]:
    """The latencies of the task's default schedule (`compiler.workloads.model.default_schedule`, what the
    artifact runs for an untuned task), or (None, why it failed)."""
    func = default_schedule(task.prim_func, task.target)
    result = measurer.measure_one(task, Candidate(dict(DEFAULT_CONFIG), tvm.IRModule({"main": func})))
    return result.latencies_ms, result.error


def tunable(prim_func: tvm.tirx.PrimFunc) -> bool:
    """A task the search can tune: one reduction (`LoopSpace`) or several (basteln's `FusionSpace`)."""
    try:
        make_space("fusion" if reductions(prim_func) > 1 else "loop", prim_func)
    except Exception:  # noqa: BLE001 - element-wise functions and programs neither space takes stay untuned
        return False
    return True


def candidate_of(candidates: tuple[int, ...], action: float) -> int:
    """The layout actor's action in (0, 1) -> one of a group's candidates (`PLAIN`, then the blocks, ascending),
    each an equal share of the interval."""
    return candidates[min(int(action * len(candidates)), len(candidates) - 1)]


def action_of(candidates: tuple[int, ...], candidate: int) -> float:
    """The inverse of `candidate_of`: the middle of the candidate's share."""
    return (candidates.index(candidate) + 0.5) / len(candidates)


def _median(values: list[float]) -> float:
    values = sorted(values)
    return values[len(values) // 2]


class GraphLayoutSearch:
    """The joint stage over one model (see the module docstring)."""

    def __init__(self, graph: ModelGraph, target: tvm.target.Target, measurer: Measurer, *, seed: int = 0, fusion: str = "none",
                 max_tensor_elements: int | None = None, joint_trials: int = 4,
                 known: dict[str, float] | None = None,
                 on_measure: Callable[[ModelTask, Trial], None] | None = None,
                 should_stop: Callable[[], bool] | None = None, knowledge: Knowledge | None = None) -> None:
        """
        Args:
            graph: the translated model (`compiler.workloads.model.translate_model`).
            target: the TVM target.
            measurer: what measures (a `tuner.LocalMeasurer` or RPC one).
            joint_trials: measurements of the short loop search of each new tunable task.
            known: latencies already measured, by workload key (a resumed job's).
            on_measure: called with each measurement: the task and its trial (stage "joint" for a loop search's,
                "layout" for a default schedule's, whose config is `DEFAULT_CONFIG`; indices from 0 per task).
            should_stop: polled between measurements.
            knowledge: the target's (`tuner.knowledge`): the actor starts from its policy where it holds one
                (`warm`), and what it learns is kept into it at the end of `run`; None: cold.
        """
        self.graph, self.target, self.measurer = graph, target, measurer
        self.fusion, self.max_tensor_elements = fusion, max_tensor_elements
        self.on_measure, self.should_stop = on_measure, should_stop or (lambda: False)
        self.seed, self.joint_trials = seed, joint_trials
        lanes = vector_lanes(target, "float32")
        self.sites = conv_sites(graph.mod, lanes, target)  # the dot-product form's convs are not searched
        # every group may also keep the model's own layout (`PLAIN`, first): its convs unblocked, no conversions
        self.groups = [replace(g, candidates=tuple(dict.fromkeys((PLAIN, *g.candidates))))
                       for g in layout_groups(graph.mod, lanes, target)]
        self.costs: dict[str, float] = dict(known or {})
        self.spent = 0
        self.observed: dict[int, dict[int, list[float]]] = {g.index: {} for g in self.groups}
        self.actor = LayoutActor(6, 1, Critic(6, seed=seed), seed=seed)
        self.knowledge = knowledge
        self.policy_key = policy_key(GRAPH_FAMILY, "layout", self.actor.state_dim, self.actor.n_params)
        stored = knowledge.policy(self.policy_key) if knowledge is not None else None
        self.warm = stored is not None and self.actor.load_state(stored, source=self.policy_key)
        self.move_share = 0.25  # the share of groups the actor moves in a round

    def state(self, group: Any) -> list[float]:
        by_weight = {s.weight: s for s in self.sites}
        convs = [by_weight[w] for w in group.weights]
        return [math.log2(min(group.channels)), math.log2(max(s.spatial for s in convs)),
                sum(s.kernel for s in convs) / len(convs) / 9.0, len(group.writers), len(group.readers),
                float(any(s.depthwise for s in convs))]

    def lower(self, choice: dict[int, int]) -> ImportedModel:
        kwargs = {} if self.max_tensor_elements is None else {"max_tensor_elements": self.max_tensor_elements}
        return lower_graph(self.graph, layout="blocked", target=self.target, fusion=self.fusion,
                           blocks=group_blocks(self.groups, choice, self.sites), **kwargs)

    def measure(self, model: ImportedModel, budget: int) -> bool:
        """Measures the model's tasks not measured yet, within `budget` measurements in all; False when the
        budget or a stop request left some unmeasured."""
        for t in model.tasks:
            if t.workload_key in self.costs:
                continue
            if self.spent >= budget or self.should_stop():
                return False
            task = Task(t.name, t.workload_key, t.prim_func, self.target)
            self.costs[t.workload_key] = self.measure_task(t, task, budget)
        return True

    def measure_task(self, t: ModelTask, task: Task, budget: int) -> float:
        """A short loop search of a tunable task (its best latency), the default schedule of another."""
        record = (lambda trial: self.on_measure(t, trial)) if self.on_measure is not None else (lambda _: None)
        if tunable(t.prim_func):
            n = max(1, min(self.joint_trials, budget - self.spent))
            # the first measurement is the loop space's register-blocked nest (its "blocked" seed), so that with
            # one or two measurements a layout is judged by a good nest, not by a random or the untuned one
            unit = vector_unit(task.target)
            start = [LoopSpace(t.prim_func, unit).blocked_config()] if reductions(t.prim_func) == 1 else []
            result = tune(task, n, seed=self.seed, measurer=self.measurer, should_stop=self.should_stop,
                          start_from=start, on_trial=lambda trial: record(replace(trial, stage="joint")),
                          replay=False)
            self.spent += len(result.trials)
            return result.best.latency_ms if result.best is not None else math.inf
        latencies, error = default_schedule_latency(self.measurer, task)
        self.spent += 1
        record(Trial(index=0, config=dict(DEFAULT_CONFIG), latencies_ms=latencies, error=error, stage=LAYOUT_STAGE))
        return _median(latencies) if latencies else math.inf

    def estimate(self, model: ImportedModel) -> float:
        return sum(t.weight * self.costs[t.workload_key] for t in model.tasks)

    def group_costs(self, model: ImportedModel) -> dict[int, float]:
        """Each group's cost in `model`: its convs' tasks and the conversions right before them."""
        key_of = {f: t.workload_key for t in model.tasks for f in t.functions}
        calls = conv_calls(model.mod, {s.weight for s in self.sites})
        out = {}
        for g in self.groups:
            total = 0.0
            for w in g.weights:
                call = calls.get(w)
                if call is None:
                    continue
                total += sum(self.costs.get(key_of.get(f, ""), 0.0) for f in (call.function, *call.conversions))
            out[g.index] = total
        return out

    def best_choice(self) -> dict[int, int]:
        """Each group's block of the lowest mean cost observed."""
        return {g.index: min(self.observed[g.index], key=lambda b: sum(self.observed[g.index][b])
                             / len(self.observed[g.index][b])) for g in self.groups}

    def run(self, budget: int, max_rounds: int = 64) -> LayoutSearchResult:
        """Rounds until `budget` measurements are spent (the round that crosses it is not finished), then the
        best block per group; at least the rule's choice is lowered (and measured if the budget allows). What
        the actor learned is kept into `knowledge` (nothing if it never updated: the stored policy stays)."""
        result = self._rounds(budget, max_rounds)
        if self.knowledge is not None and self.actor.updates:
            self.knowledge.keep_policy(self.policy_key, self.actor.state_bytes())
        return result

    def _rounds(self, budget: int, max_rounds: int) -> LayoutSearchResult:
        rng = random.Random(self.seed)
        rounds: list[dict] = []
        measured: list[tuple[float, dict[int, int], ImportedModel]] = []

        def evaluate(choice: dict[int, int], source: str, model: ImportedModel | None = None) -> ImportedModel:
            model = model if model is not None else self.lower(choice)
            if not self.measure(model, budget):
                return model
            estimate = self.estimate(model)
            rounds.append({"source": source, "estimate_ms": estimate, "conversions": conversions(model.mod),
                           "blocks": {str(g.index): choice.get(g.index, g.default) for g in self.groups},
                           "measurements": self.spent})
            measured.append((estimate, choice, model))
            return model

        rule = {g.index: g.default for g in self.groups}
        first_model = self.lower(rule)
        # a small budget shortens each task's loop search, so the rule's round and a few others fit in it
        self.joint_trials = max(1, min(self.joint_trials, budget // (3 * max(1, len(first_model.tasks)))))
        first = evaluate(rule, "rule", first_model)
        if not measured or not self.groups:
            return self._result(first, measured, rounds)
        reference = self.group_costs(first)
        seen = {tuple(sorted(rule.items())): reference}
        repeats = 0
        for g in self.groups:
            self.observed[g.index].setdefault(g.default, []).append(reference[g.index])
            self.actor.record(self.state(g), [action_of(g.candidates, g.default)], 0.0)
        # round 1: every group in the model's own layout (no conversions at all), the other end of the choice;
        # a warm actor's own choice for every group instead (below)
        plain = {g.index: PLAIN for g in self.groups}
        before = len(measured)
        plain_model = evaluate(plain, "plain") if not self.warm else None
        if plain_model is not None and len(measured) > before:
            costs = seen[tuple(sorted(plain.items()))] = self.group_costs(plain_model)
            for g in self.groups:
                self.observed[g.index].setdefault(PLAIN, []).append(costs[g.index])
                ref, cost = reference[g.index], costs[g.index]
                self.actor.record(self.state(g), [action_of(g.candidates, PLAIN)],
                                  math.log(ref / cost) if ref > 0 and 0 < cost < math.inf else -1.0)
            self.actor.update()
        for i in range(max_rounds):
            if self.spent >= budget or self.should_stop():
                break
            # the actor moves a few groups from the best choice so far (the rest keep it), so a round makes
            # few new tasks and a group's cost changes mostly by its own block; a warm actor's first round moves
            # every group: the whole model in what it learned on others
            choice = self.best_choice()
            if i == 0 and self.warm:
                moved = list(self.groups)
            else:
                moved = [g for g in self.groups if rng.random() < self.move_share] or [rng.choice(self.groups)]
            for g in moved:
                (action,) = self.actor.act(self.state(g))
                choice[g.index] = candidate_of(g.candidates, action[0])
            key = tuple(sorted(choice.items()))
            if key in seen:  # measured before: rewarded by what it cost then; the search stops when it only repeats
                costs, repeats = seen[key], repeats + 1
                if repeats > 8:
                    self.actor.buffer.steps = [s for s in self.actor.buffer.steps if s.reward is not None]
                    break
            else:
                before = len(measured)
                model = evaluate(choice, "actor")
                if len(measured) == before:  # the budget ran out inside the round: its actions get no reward
                    self.actor.buffer.steps = [s for s in self.actor.buffer.steps if s.reward is not None]
                    break
                costs, repeats = self.group_costs(model), 0
                seen[key] = costs
            rewards = []
            for g in self.groups:
                self.observed[g.index].setdefault(choice[g.index], []).append(costs[g.index])
            for g in moved:
                ref, cost = reference[g.index], costs[g.index]
                rewards.append(math.log(ref / cost) if ref > 0 and 0 < cost < math.inf else -1.0)
            self.actor.reward_last(rewards)
            self.actor.update()
        best = self.best_choice()
        if all(best != c for _, c, _ in measured) and not self.should_stop():
            model = self.lower(best)
            if self.measure(model, self.spent + len(model.tasks)):  # this last one may cross the budget
                estimate = self.estimate(model)
                rounds.append({"source": "best per group", "estimate_ms": estimate,
                               "conversions": conversions(model.mod),
                               "blocks": {str(k): v for k, v in best.items()}, "measurements": self.spent})
                measured.append((estimate, best, model))
        return self._result(first, measured, rounds)

    def _result(self, first: ImportedModel, measured: list, rounds: list[dict]) -> LayoutSearchResult:
        if not measured:
            return LayoutSearchResult(first, dict(first.blocks), None, None, self.spent, rounds, dict(self.costs))
        estimate, _, model = min(measured, key=lambda m: m[0])
        log.info("layout search: %d rounds, %d measurements, rule %.3f ms -> %.3f ms", len(rounds), self.spent,
                 measured[0][0], estimate)
        return LayoutSearchResult(model, dict(model.blocks), estimate, measured[0][0], self.spent, rounds,
                                  dict(self.costs))


def search_layouts(graph: ModelGraph, target: tvm.target.Target, measurer: Measurer, budget: int, *,
                   knowledge: Knowledge | None = None, **kwargs: Any) -> LayoutSearchResult:
    """`GraphLayoutSearch(graph, target, measurer, knowledge=knowledge, **kwargs).run(budget)`."""
    return GraphLayoutSearch(graph, target, measurer, knowledge=knowledge, **kwargs).run(budget)
