"""The ALT search (paper sec. 5): joint layout + loop tuning with PPO, then loop-only tuning.

Cross exploration (Fig. 8), in two stages over one measurement budget:

1. joint (`joint_fraction` of the budget, 30% by default): the layout actor
   (`tuner.ppo.LayoutActor`) picks the split factors of the operator's layout template
   (`compiler.layout.layout_template`; the weight's factors are tied to the
   consumer's: kot = ot, kit = it); the search then runs `rounds_per_layout`
   rounds of loop tuning in that layout and rewards the layout with the log
   speedup of its best latency over the geometric mean of the layouts tried so
   far (eq. 3's U - latency with U the untuned latency gave every layout nearly
   the same reward: 0.98-0.99 for conv2d).
2. loop (the rest): loop tuning only, in the best layout found. A layout's one
   joint round ranks it roughly, so the joint stage's finalists (at most `finalists`
   layouts within `margin` of its best latency) share the first half of the loop
   stage round by round (successive halving, one rung); the best layout then
   takes the rest.

A round of loop tuning in a layout: a batch (`batch_size`, the paper's episode
length 128) of loop configurations -- walks of the loop actor (`tuner.ppo.LoopActor`,
one direction per knob) from the best configurations measured in this layout (or,
before any, from the model's best of a sampled batch), mutations of them, and
fresh samples -- is ranked by one XGBoost cost model shared by all layouts
(features: the layout's factors, layout-independent knob summaries and
MetaSchedule's per-store features), and only the `top_k` best (a few of them
epsilon-random) are built and measured. The loop actor learns from measurements
only: a walk that is measured is rewarded with the log speedup of its latency
over its start's (an error: -1); walks the model did not pick are forgotten.
Each actor has a critic of its own. With `ppo=False` (the ablation of the
agents) layouts are drawn at random and walks step in random directions. In the loop stage, each new best configuration's other placements
(`LoopSpace.placements`: where the producers and the epilogue are computed, one
knob changed) are measured in the next round, up to half of it: discrete choices
the model, trained mostly on one of them, ranks poorly.

A configuration is one flat JSON dict: `layout.<param>` (template factors; none
when the template has no parameter) plus the loop knobs of `LoopSpace` over the
layout's program. Each trial keeps the readable layout in `extra["layout"]`
(the output layout, e.g. "N H W/14 O/16 14 16"), its stage ("joint" / "loop")
and the model's prediction.

Candidates run as the artifact will: data and output in the user's layouts,
converted inside the program (the data conversion is a producer the loop space
inlines or computes at the root or in a tile; the output conversion is the
epilogue, at the root or in a tile), constants (weight, bias) packed once beforehand and not timed. The
user's own layouts (the untransformed program, nothing converted) are one more
layout point, tried first in the joint stage: a layout is kept only where its
gains pay for its conversions.

The agents carry over between jobs on a target (`tuner.knowledge`, with `ppo` on): the layout actor and every
layout's loop actor load the stored policy of their key (`tuner.ppo.policy_key`: the operator family, e.g.
"conv2d/float32", the agent and its dimensions) and, at the end of `run`, give back what they learned. A warm
layout actor proposes from the joint stage's first round: the hand-enumerated layouts (the oneDNN-like one,
channels last untiled) are not tried, the user's own layouts come second, and the blocked seeds go to the
actor's first layout (`next_layout`, `seed_configs`). Without a stored policy the search is what it was cold.

The search is this module; what it keeps per layout and the helpers of a round are `alt_points`, where it
starts beyond the paper (a oneDNN-like first layout, known loop nests) `alt_seeds`, and its agents' policies across
jobs `alt_policies`.

Over 600 lines: one search's lifecycle, whose two stages, layout choices and loop rounds all read and write the
same per-layout state; what stands apart (points, seeds, policies) is in its own modules already.

Layering: `tuner` never imports `service`; it imports `compiler`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from compiler.layout import GROUP_PARAM, LayoutError

from ..cost_models import CostModel, CostModelKind, make_cost_model
from ..features import MSFeatures
from ..knowledge import Knowledge
from ..measurers.base import Candidate, Measurer
from ..ppo import Critic, LayoutActor, LoopActor, action_of, factor_of
from ..spaces.base import Config, InvalidConfig, ScheduleFailed, config_key, sample_unique
from ..spaces.layout import LayoutSpace, has_layout, interface_space, join_config, split_config
from ..spaces.loop import LoopSpace, loop_space
from ..task import Task, Trial
from .alt_policies import CarriedPolicies
from .alt_points import IDENTITY, LayoutPoint, point_features, random_directions, walk
from .alt_seeds import first_layout, loop_seeds
from .base import Proposal, Search, never, noop
from .picks import pick, seat_seeds

log = logging.getLogger(__name__)


class ALTSearch(CarriedPolicies, Search):
    """ALT's two-stage cross exploration (see the module doc)."""

    def __init__(
        self,
        task: Task,
        space: LayoutSpace,
        measurer: Measurer,
        *,
        cost_model: CostModelKind | CostModel = "xgb",
        seed: int = 0,
        batch_size: int = 128,
        top_k: int = 8,
        epsilon: float = 0.125,
        joint_fraction: float = 0.3,
        rounds_per_layout: int = 1,
        finalists: int = 3,
        margin: float = 1.25,
        layout: dict[str, int] | None = None,
        elite: int = 8,
        ms_features: bool = True,
        ppo: bool = True,
        seeds: bool = True,
        knowledge: Knowledge | None = None,
    ):
        """
        Args:
            task: the task; `task.workload` is required (the layout template comes from it).
            space: its joint layout and loop space (`LayoutSpace(task, layout_levels)`).
            measurer: measures the picks.
            cost_model: a model or its kind.
            seed: seeds sampling, the agents and the model.
            batch_size: candidates ranked per round (the episode length).
            top_k: candidates measured per round.
            epsilon: share of each round's picks taken at random from the batch.
            joint_fraction: share of the budget for the joint stage (0: loop-only in `layout`).
            rounds_per_layout: loop-tuning rounds per layout in the joint stage.
            finalists: at most this many of the joint stage's layouts share the loop stage's first half.
            margin: a finalist's best joint-stage latency is within this factor of the best's.
            layout: a fixed layout choice (the ALT-OL ablation: loop-only in it); {} is the
                template's default (channels last, no tiling); None lets the joint stage search.
            elite: how many of a layout's best configurations walks and mutations start from.
            ms_features: add MetaSchedule's per-store features.
            ppo: the PPO agents choose layouts and walks; False: at random (the ablation).
            seeds: a layout's first visit measures known nests (`seed_configs`) and the joint stage tries the
                oneDNN-like layout (`first_layout`) first (a warm layout actor's first layout instead, see
                `next_layout`); False: neither (the unseeded ablation).
            knowledge: the target's (`tuner.knowledge`): its cost model warms an "xgb" model (with MetaSchedule's
                features on), and every measurement is recorded into it; with `ppo` its policies warm the layout
                actor (`warm_layout`) and the loop actors, and what they learn is kept into it (`keep_policies`).
        """
        if task.workload is None:
            raise ValueError("the ALT search needs task.workload (the layout template comes from it)")
        super().__init__(task, space, measurer)
        self.space: LayoutSpace = space
        self.rng = np.random.default_rng(seed)
        self.seed = seed
        self.model = make_cost_model(cost_model, seed) if isinstance(cost_model, str) else cost_model
        self.batch_size, self.top_k, self.epsilon, self.elite = batch_size, top_k, epsilon, elite
        self.joint_fraction = 0.0 if layout is not None else joint_fraction
        self.rounds_per_layout = rounds_per_layout
        self.finalists, self.margin = finalists, margin
        self.shared_until = 0  # measurement count up to which the finalists share the loop stage
        self.ms_features = ms_features and self.model.reads_features  # the random model reads none
        self.knowledge = knowledge
        if cost_model == "xgb" and knowledge is not None and knowledge.cost_model is not None and self.ms_features:
            self.model = make_cost_model("xgb", seed, base=knowledge.cost_model)
        self.template = space.template
        self.free = list(space.free)
        self.fixed = None if layout is None else {**self.template.default(), **layout}
        self.points: dict[str, LayoutPoint] = {}
        self.order: list[str] = []  # layout keys in the order first tried
        self.count = 0  # measurements so far (prior included)
        self.joint_budget = 0
        self.current: str | None = None  # layout of the running joint episode
        self.episode_rounds = 0
        self._features: dict[str, np.ndarray] = {}
        self._reference: tuple[list, Any] | None = None
        self.upper: float | None = None  # U of eq. (3)
        self.ppo, self.seeded = ppo, seeds
        width = max(2 * len(self.free), 1)
        self.layout_actor = LayoutActor(width, max(len(self.free), 1), Critic(width, seed=seed), seed=seed)
        self.family = f"{task.workload.operator}/{task.workload.dtype}"  # what the policies' keys name
        # a stored layout policy: the actor proposes from the first joint round (`next_layout`)
        self.warm_layout = bool(self.free) and self._warm(self.layout_actor, "layout")
        self.blocked_key: str | None = None  # the warm actor's first layout, seeded as the oneDNN-like one is
        self._walk_steps: dict[str, tuple[Any, Any, float | None]] = {}  # config key -> (actor, step, start ms)

    # -- layouts --------------------------------------------------------------

    def full_choice(self, choice: dict[str, int]) -> dict[str, int]:
        return self.space.full_choice(choice)

    @staticmethod
    def key(choice: dict[str, int]) -> str:
        return LayoutSpace.key(choice)

    def point(self, choice: dict[str, int]) -> LayoutPoint:
        """The `LayoutPoint` of a choice (built on first use; its task runs as the artifact will, see the module
        doc). Raises `LayoutError` if it does not apply."""
        choice = self.full_choice(choice)
        k = self.key(choice)
        if k in self.points:
            return self.points[k]
        prog = self.space.program(choice)
        xs, ref = self.reference()
        sub = Task(f"{self.task.name}@{prog.requested['output'].name}", self.task.workload_key, prog.prim_func,
                   self.task.target, inputs=prog.pack_inputs(xs), expected=ref, workload=self.task.workload)
        space = interface_space(prog, self.space.unit)
        ms = MSFeatures(space.mod, self.task.target) if self.ms_features else None
        p = LayoutPoint(choice, prog, space, sub, ms, prog.requested["output"].name)
        self.points[k] = p
        self.order.append(k)
        return p

    @property
    def dot_form(self) -> bool:
        """Whether the template is in the dot-product form (an int8 / bf16 operator, `compiler.layout.templates`)."""
        return any(q.name == GROUP_PARAM for q in self.template.params)

    def identity_point(self) -> LayoutPoint:
        """The user's own layouts: loops of the untransformed program, nothing converted."""
        if IDENTITY in self.points:
            return self.points[IDENTITY]
        xs, ref = self.reference()
        space = loop_space(self.task.prim_func, self.space.unit)
        sub = Task(self.task.name, self.task.workload_key, self.task.prim_func, self.task.target, inputs=xs,
                   expected=ref, workload=self.task.workload)
        ms = MSFeatures(space.mod, self.task.target) if self.ms_features else None
        default = self.template.layouts(self.template.default())["output"]
        p = LayoutPoint({}, None, space, sub, ms, " ".join(default.dim_names), identity=True)
        self.points[IDENTITY] = p
        self.order.append(IDENTITY)
        return p

    def point_of(self, config: Config) -> LayoutPoint:
        """The layout point a flat configuration belongs to (no `layout.*` knob: the user's layouts)."""
        if not has_layout(config) and self.template.params:
            return self.identity_point()
        return self.point(split_config(config)[0])

    def measured_as(self, config: Config) -> tuple[Task, Candidate]:
        """In its layout's task (inputs packed, the reference computed once), as the search measured it."""
        point = self.point_of(config)
        return point.task, Candidate(config, point.space.apply(split_config(config)[1]).mod)

    def key_of(self, config: Config) -> str:
        if not has_layout(config) and self.template.params:
            return IDENTITY
        return self.key(self.full_choice(split_config(config)[0]))

    def reference(self) -> tuple[list, Any]:
        """User-layout inputs and the expected output (the task's, else seed 0 and torch)."""
        if self._reference is None:
            wl = self.task.workload
            xs = list(self.task.inputs) if self.task.inputs is not None else wl.random_inputs(0)
            ref = self.task.expected if self.task.expected is not None else wl.reference(xs)
            self._reference = (xs, ref)
        return self._reference

    def layout_state(self) -> list[float]:
        """Concatenated primitive states: per split of every tensor, log2(extent) and the chosen factor's share."""
        best = self.best_point()
        choice = best.choice if best is not None else self.full_choice(first_layout(self.template, self.space.unit))
        out = []
        for p in self.free:
            out.append(math.log2(max(p.extent, 1)) / 10)
            out.append(math.log2(choice.get(p.name, 1)) / max(math.log2(max(p.extent, 2)), 1))
        return out

    def best_point(self) -> LayoutPoint | None:
        scored = [p for p in self.points.values() if p.best]
        return min(scored, key=lambda p: p.best_ms) if scored else None

    def _choice_of(self, action: Sequence[float]) -> dict[str, int]:
        return {p.name: factor_of(p.candidates, p.extent, a) for p, a in zip(self.free, action)}

    def next_layout(self) -> LayoutPoint:
        """The next layout: the user's own first, then the oneDNN-like start, then channels last
        untiled (ALT-OL's layout, so the joint stage never misses it), then the layout actor's
        (untried ones preferred). In the dot-product form (an int8 / bf16 template with a `group`) the start
        comes before the user's layouts, which no instruction fits: a small budget's joint stage has a round
        or two.

        With a warm layout actor (`warm_layout`: a policy learned on this operator family in earlier jobs) the
        actor proposes from the first round and the hand-enumerated layouts are not tried (unless it proposes
        them): it has learned where they stand (the oneDNN-like and the untiled layouts are among its actions),
        and a small budget's one or two joint rounds are better spent on what it learned than on a guess made
        for every workload. The user's own layouts come second, right after the actor's first proposal: no
        action of the actor is the identity, which stays the fallback a layout must beat to pay for its
        conversions (and on small memory-bound operators the fastest), so a joint stage of two rounds still
        measures it. The price: the actor's first layout ends its episode with only itself tried, so its reward
        (log speedup over the layouts tried so far) is 0, neutral."""
        started = any(k != IDENTITY for k in self.points)
        identity_first = not (self.dot_form or self.warm_layout)
        if self.template.params and IDENTITY not in self.points and (started or identity_first):
            return self.identity_point()
        state = self.layout_state()
        if not started and self.seeded and not self.warm_layout:
            choice = first_layout(self.template, self.space.unit)
            try:
                p = self.point(choice)
                # rewarded at the episode's end, like the actor's own actions
                self.layout_actor.record(state, [action_of(q.extent, choice[q.name]) for q in self.free])
                return p
            except LayoutError as e:
                log.info("first layout %s does not apply: %s", choice, e)
        default = self.full_choice({})
        if self.key(default) not in self.points and not self.warm_layout:  # channels last, untiled: ALT-OL's
            try:
                p = self.point(default)
                self.layout_actor.record(state, [action_of(q.extent, default[q.name]) for q in self.free])
                return p
            except LayoutError as e:
                log.info("channels-last layout does not apply: %s", e)
        for _ in range(16):
            if self.ppo:
                action = self.layout_actor.act(state, 1)[0]
            else:  # the ablation: a uniform draw, recorded so the episode's bookkeeping stays the same
                action = [float(a) for a in self.rng.uniform(0.02, 0.98, len(self.free))]
                self.layout_actor.record(state, action)
            choice = self._choice_of(action)
            k = self.key(self.full_choice(choice))
            try:
                p = self.point(choice)
            except Exception as e:  # noqa: BLE001 - a layout the rewriter refuses is a bad action
                log.info("layout %s does not apply: %s", choice, e)
                self.layout_actor.reward_last([-1.0])
                continue
            if k in self.points and self.points[k].trials and _ < 15:
                self.layout_actor.reward_last([self.layout_reward(self.points[k])])
                continue
            if not started and self.warm_layout:  # its first layout: the blocked seeds' (`seed_configs`)
                self.blocked_key = k
            return p
        best = self.best_point()
        return best if best is not None else self.point({})

    def final_points(self) -> list[LayoutPoint]:
        """The joint stage's finalists, best first: at most `finalists` layouts within `margin` of its best."""
        ranked = sorted((p for p in self.points.values() if p.joint_ms is not None), key=lambda p: p.joint_ms)
        return [p for p in ranked[: self.finalists] if p.joint_ms <= self.margin * ranked[0].joint_ms]

    def loop_point(self) -> LayoutPoint:
        """The loop stage's layout this round: while the shared half lasts, the finalist measured least in
        the loop stage (ties: the better in the joint stage); then the best layout found."""
        finalists = self.final_points()
        if len(finalists) > 1 and self.count < self.shared_until:
            return min(finalists, key=lambda p: p.loop_trials)  # min is stable: best first among ties
        return self.best_point() or self.next_layout()

    def layout_reward(self, p: LayoutPoint) -> float:
        """log(reference / best latency): the reference is the geometric mean of the best latencies of the
        layouts tried so far (the user's own included), so a layout better than the usual one scores above
        0 and a worse one below, whatever the untuned latency; clipped to [-2, 2]; no correct trial: -2."""
        if p.best_ms is None:
            return -2.0
        tried = [q.best_ms for q in self.points.values() if q.best_ms]
        reference = math.exp(sum(math.log(t) for t in tried) / len(tried))
        return max(-2.0, min(2.0, math.log(reference / p.best_ms)))

    def end_episode(self) -> None:
        if self.current is None:
            return
        p = self.points[self.current]
        self.current = None
        if p.identity:  # not the layout actor's action
            return
        if any(s.reward is None for s in self.layout_actor.buffer.steps):
            self.layout_actor.reward_last([self.layout_reward(p)])
        if self.ppo:
            self.layout_actor.update()
        else:
            self.layout_actor.buffer.steps.clear()

    # -- configurations --------------------------------------------------------

    def stage(self) -> str:
        return "joint" if self.count < self.joint_budget else "loop"

    def features(self, p: LayoutPoint, configs: Sequence[Config], schedules: Sequence[Any] | None = None) -> np.ndarray:
        """Feature rows of loop configurations in layout `p` for the shared cost model (`alt_points.point_features`)."""
        return point_features(p, self.template.params, configs, schedules)

    def _remember(self, p: LayoutPoint, loops: Config, latency: float | None, stage: str | None) -> None:
        p.trials += 1
        if stage == "loop":
            p.loop_trials += 1
        elif stage == "joint" and latency is not None and (p.joint_ms is None or latency < p.joint_ms):
            p.joint_ms = latency
        if latency is not None:
            p.best.append((latency, loops))
            p.best.sort(key=lambda x: x[0])
            del p.best[self.elite:]

    def pre_tuning(self, prior: Sequence[Trial]) -> None:
        """Rebuilds the layouts of prior trials, retrains the model, restores the stage and episode."""
        rows, lats = [], []
        for trial in prior:
            _, loops = split_config(trial.config)
            try:
                p = self.point_of(trial.config)
                loops = p.space.validate(loops)
            except Exception:  # noqa: BLE001 - from another version of the space
                continue
            rows.append(self.features(p, [loops])[0])
            lats.append(trial.latency_ms)
            self._remember(p, loops, trial.latency_ms, trial.stage)
            if self.upper is None and trial.latency_ms is not None:
                self.upper = 2 * trial.latency_ms
        self.count = len(prior)
        if rows:
            self.model.update(np.stack(rows), lats)
        # replay the finished joint episodes into the layout actor; continue the last one
        joint = [t for t in prior if t.stage == "joint"]
        episodes: list[str] = []
        for t in joint:
            k = self.key_of(t.config)
            if not episodes or episodes[-1] != k:
                episodes.append(k)
        for i, k in enumerate(episodes):
            if k not in self.points:
                continue
            p = self.points[k]
            action = [action_of(q.extent, p.choice.get(q.name, 1)) for q in self.free]
            if i == len(episodes) - 1 and prior and prior[-1].stage == "joint":
                if not p.identity:
                    self.layout_actor.record(self.layout_state(), action)  # rewarded when the episode ends
                self.current = k
                self.episode_rounds = math.ceil(sum(1 for t in joint if self.key_of(t.config) == k) / self.top_k)
            elif not p.identity:
                self.layout_actor.record(self.layout_state(), action, self.layout_reward(p))
        self.layout_actor.update()

    def run(self, budget: int, *, prior: Sequence[Trial] = (), start_from: Sequence[Config] = (),
            on_trial: Callable[[Trial], None] = noop, should_stop: Callable[[], bool] = never,
            replay: bool = True) -> list[Trial]:
        self.joint_budget = 0 if self.fixed is not None else int(round(self.joint_fraction * budget))
        self.shared_until = self.joint_budget + (budget - self.joint_budget) // 2 if self.joint_budget else 0
        trials = super().run(budget, prior=prior, start_from=start_from, on_trial=on_trial,
                             should_stop=should_stop, replay=replay)
        self.keep_policies()
        return trials

    def _start_proposals(self, start_from: Sequence[Config]) -> list[Proposal]:
        out = []
        for config in start_from:
            _, loops = split_config(config)
            try:
                p = self.point_of(config) if self.fixed is None else self.point(self.fixed)
                if self.fixed is not None and self.key_of(config) != self.key(p.choice):
                    continue
                loops = p.space.validate(loops)
                mod = p.space.apply(loops).mod
            except Exception as e:  # noqa: BLE001 - a stale schedule from another space
                log.warning("%s: skipping start_from config %s: %s", self.task.name, config, e)
                continue
            full = join_config(p.choice, loops)
            if config_key(full) in self.measured:
                continue
            out.append(Proposal(full, mod, None, "start_from", {"layout": p.name}, task=p.task, stage=self.stage()))
        return out

    def generate_candidates(self, n: int) -> list[Proposal]:
        # the round's randomness depends only on (seed, measurements so far): a resumed search
        # draws what the uninterrupted one would have drawn at the same point
        self.rng = np.random.default_rng([self.seed, self.count])
        stage = self.stage()
        if self.fixed is not None:
            p = self.point(self.fixed)
        elif stage == "joint":
            if self.current is None or self.episode_rounds >= self.rounds_per_layout:
                self.end_episode()
                p = self.next_layout()
                self.current, self.episode_rounds = IDENTITY if p.identity else self.key(p.choice), 0
            p = self.points[self.current]
            self.episode_rounds += 1
            n = min(n, self.joint_budget - self.count)
        else:
            self.end_episode()
            p = self.loop_point()
        n = min(n, self.top_k)
        if self.upper is None:  # the untransformed program's
            base = self.measurer.baseline_ms(self.task)
            self.upper = base if base else None

        exclude: set[str] = set()
        pool: list[Config] = []
        sources: list[str] = []

        def add(config: Config, source: str) -> None:
            k = config_key(join_config(p.choice, config))
            if k in self.measured or k in exclude:
                return
            exclude.add(k)
            pool.append(config)
            sources.append(source)

        # a layout's first visit measures known loop nests too (`seed_configs`), and walks start from
        # one if it is the best
        seeds = self.seed_configs(p) if p.trials == 0 and self.seeded else []
        # in the loop stage, the best's other placements (`LoopSpace.placements`), once per best: the
        # model ranks a compute location it has rarely seen measured poorly, and a sweep costs a few trials
        if stage == "loop" and p.best and config_key(p.best[0][1]) not in p.swept:
            p.swept.add(config_key(p.best[0][1]))
            seeds += [(c, "placement") for c in p.space.placements(p.best[0][1])][: max(n // 2, 1)]
        for seed in seeds:
            add(*seed)
        starts = [c for _, c in p.best]
        if not starts:  # the model's best of a sampled batch
            sampled = sample_unique(p.space, self.rng, self.batch_size)
            if sampled and self.model.trained:
                scores = self.model.predict(self.features(p, sampled))
                starts = [sampled[int(i)] for i in np.argsort(-scores)[: self.elite]]
            else:
                starts = sampled[: self.elite]
            for c in sampled:
                add(c, "sample")
        # loop actor walks from the best configurations
        walks: list[tuple[Config, Any, float | None]] = []  # (config, the actor's step, its start's latency)
        if starts:
            actor = self.loop_actor(p)
            # walks picked in an earlier round whose measurement never came (a build that failed before it ran,
            # a stop) would hold the actor's update back: forget them
            actor.buffer.steps = [s for s in actor.buffer.steps if s.reward is not None]
            self._walk_steps = {k: v for k, v in self._walk_steps.items() if v[0] is not actor}
            state = self.loop_state(p, starts[0])
            steps = self._directions(actor, state, len(p.space.knobs), self.batch_size // 2)
            recorded = actor.buffer.steps[-len(steps):] if self.ppo else [None] * len(steps)
            start_ms = dict((config_key(c), ms) for ms, c in p.best)
            for d, step in zip(steps, recorded):
                start = starts[int(self.rng.integers(len(starts)))] if self.rng.random() < 0.5 else starts[0]
                walks.append((self.walk(p.space, start, d), step, start_ms.get(config_key(start))))
        walk_of: dict[str, tuple[Any, float | None]] = {}
        for c, step, ms in walks:
            if config_key(c) not in walk_of:
                walk_of[config_key(c)] = (step, ms)
            add(c, "walk")
        for _ in range(self.batch_size // 4):
            if starts:
                parent = starts[int(self.rng.integers(len(starts)))]
                add(p.space.mutate(parent, self.rng), "mutation")
        if len(pool) < self.batch_size:
            for c in sample_unique(p.space, self.rng, self.batch_size - len(pool)):
                add(c, "sample")
        schedules, keep = [], []
        for i, c in enumerate(pool):
            try:
                schedules.append(p.space.apply(c))
                keep.append(i)
            except (InvalidConfig, ScheduleFailed) as e:
                log.debug("dropping config that does not apply: %s", e)
        pool = [pool[i] for i in keep]
        sources = [sources[i] for i in keep]
        if not pool:
            return []
        feats = self.features(p, pool, schedules)
        scores = np.asarray(self.model.predict(feats), dtype=np.float64) if self.model.trained else None
        picks = pick(scores, len(pool), n, self.epsilon, self.rng)
        seat_seeds(picks, sources, {source for _, source in seeds})
        if walks and self.ppo:  # the loop actor learns from the walks that are measured, nothing else
            actor = self.loop_actor(p)
            picked = set()
            for i, source in picks:
                k = config_key(pool[i])
                if sources[i] == "walk" and k in walk_of and walk_of[k][0] is not None:
                    step, ms = walk_of[k]
                    self._walk_steps[config_key(join_config(p.choice, pool[i]))] = (actor, step, ms)
                    picked.add(id(step))
            actor.buffer.steps = [s for s in actor.buffer.steps if id(s) in picked or s.reward is not None]
        out = []
        for i, source in picks:
            full = join_config(p.choice, pool[i])
            self._features[config_key(full)] = feats[i]
            predicted = None if scores is None else float(scores[i])
            out.append(Proposal(full, schedules[i].mod, predicted, source,
                                {"origin": sources[i], "layout": p.name}, task=p.task, stage=stage))
        return out

    def seed_configs(self, p: LayoutPoint) -> list[tuple[Config, str]]:
        """The known loop nests a layout's first round measures, with their sources (`alt_seeds.loop_seeds`): in
        the user's layouts `untuned_config` and `blocked_config` both ways; in the first tiled layout
        `blocked_config`, oneDNN's blocking, with one output vector and, where it differs, with several (in the
        dot-product form also in its least layout); none elsewhere.

        The first tiled layout is the oneDNN-like one (`first_layout`), or with a warm layout actor, which does not
        start from it (`next_layout`), the actor's first proposal (`blocked_key`): the layout the joint stage
        measures first is judged by a good nest, not by walks from a random batch, whichever chose it."""
        # ALT-OL (a fixed layout) gets the same seeds, so "vs ALT-OL" compares searches, not seeds
        start = self.blocked_key or self.key(self.full_choice(first_layout(self.template, self.space.unit)))
        first = self.fixed is not None or self.key(p.choice) == start
        # in the dot-product form also the least dot layout (rows from the loops, not a row tile: the data is
        # converted by a padded row copy, not a gather into tiles; 0.39 ms against 0.49 on an int8 3025x127x255)
        least = self.dot_form and self.key(p.choice) == self.key(self.full_choice({}))
        return loop_seeds(p, p.identity or first or least)

    def loop_actor(self, p: LayoutPoint) -> LoopActor:
        """The layout's loop actor, made on first use, warm where `knowledge` holds a policy of its key."""
        if p.actor is None:
            n = len(p.space.knobs)
            p.actor = LoopActor(n, n, Critic(n, seed=self.seed), seed=self.seed)
            self._warm(p.actor, self.loop_agent(p))
        return p.actor

    def _directions(self, actor: LoopActor, state: list[float], n_knobs: int, n: int) -> list[list[int]]:
        """`n` walks' directions: the loop actor's, or (the ablation) random with the untrained actor's odds."""
        if self.ppo:
            return actor.directions(state, n)
        return random_directions(self.rng, n_knobs, n)

    @staticmethod
    def loop_state(p: LayoutPoint, config: Config) -> list[float]:
        return [k.choices.index(config[k.name]) / max(len(k.choices) - 1, 1) for k in p.space.knobs]

    def walk(self, space: LoopSpace, config: Config, directions: Sequence[int]) -> Config:
        """One step per knob in its direction, in random order, keeping each step that stays valid."""
        return walk(space, config, directions, self.rng)

    def notify_results(self, trials: Sequence[Trial]) -> None:
        rows, lats = [], []
        rewarded: set[Any] = set()
        for trial in trials:
            self.count += 1
            _, loops = split_config(trial.config)
            try:
                p = self.point_of(trial.config)
                loops = p.space.validate(loops)
            except Exception:  # noqa: BLE001 - a prior trial from another version of the space
                continue
            row = self._features.pop(config_key(trial.config), None)
            if row is None:
                row = self.features(p, [loops])[0]
            rows.append(row)
            lats.append(trial.latency_ms)
            self._remember(p, loops, trial.latency_ms, trial.stage)
            if self.upper is None and trial.latency_ms is not None:
                self.upper = 2 * trial.latency_ms
            walk = self._walk_steps.pop(config_key(trial.config), None)
            if walk is not None:
                actor, step, start_ms = walk
                if trial.latency_ms is None:
                    step.reward = -1.0
                else:
                    start = start_ms or (p.best[0][0] if p.best else trial.latency_ms)
                    step.reward = max(-1.0, min(1.0, math.log(start / trial.latency_ms)))
                rewarded.add(actor)
        for actor in rewarded:
            if all(s.reward is not None for s in actor.buffer.steps):
                actor.update()
        if rows:
            self.model.update(np.stack(rows), lats)
            if self.knowledge is not None and self.ms_features:
                self.knowledge.record(self.task.workload_key, np.stack(rows), lats)
