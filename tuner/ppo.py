"""PPO agents of the ALT search (paper sec. 5.2): a layout split actor and loop actors, each with a critic of its own.

* `LayoutActor`: one action a in (0, 1) per layout template parameter (a
  Beta distribution per parameter); the factor is F = R(D * a) (eq. 2), D the
  dimension's extent and R rounding to the nearest valid candidate (a divisor).
  Its state is the concatenation of the primitive states of all the operator's
  tensors (per split: log2 of the extent and of the chosen factor).
* `LoopActor`: one direction in {-1, 0, +1} per loop parameter (a categorical
  per parameter); the search walks each parameter one step from the best
  configuration of a sampled batch.
* `Critic`: a value network. Each actor has its own, over its own state (an
  input that means one thing: the layout critic sees layout states, a loop
  critic the knob positions of one layout's space), and trains it with its
  policy (one optimizer over both). The paper shares one critic; here none is
  shared: `ALTSearch` makes one per actor (the layout actor's, and one per
  layout's loop actor), and `GraphLayoutSearch` one for its layout actor.

Every step is a one-step episode (a contextual bandit, as the paper's per-round
rewards): rewards are standardized by the actor's running mean and deviation
(a layout episode updates with one step, so a batch normalization would have
nothing to normalize), advantage = reward - V(state), PPO's clipped surrogate
with a few epochs per `update`, value loss on the critic, and an entropy bonus.
The caller's rewards are log speedups over a reference (see `tuner.searches.alt`), not
eq. (3)'s U - latency, which scores every layout alike when U is the untuned
latency.

An agent persists (`_Actor.state_bytes`, `_Actor.load_state`): its policy net, its critic's net, their optimizer
and its running reward statistics, as one `torch.save` of a dict read back with `weights_only=True` (nothing a
stored policy holds can run code). `tuner.knowledge.Knowledge` keeps them per target by `policy_key`, which
names the operator family, the agent and its dimensions, and `POLICY_VERSION`: a policy of another version is
never even looked up, and bytes of another version or shape handed to `load_state` are ignored with a log line
(the agent stays cold), never mis-read.

Layering: `tuner` never imports `service`.
"""

from __future__ import annotations

import io
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

log = logging.getLogger(__name__)

HIDDEN = 64
# what a stored policy is: bump when the networks, their inputs (an agent's state) or their actions' meaning change
POLICY_VERSION = 1


def policy_key(family: str, agent: str, state_dim: int, n_params: int) -> str:
    """The key an agent's policy is kept under on a target (the target itself is the store's): e.g.
    "ppo1/conv2d/float32/layout/8x4" for the layout actor of float32 conv2d's 4 template parameters."""
    return f"ppo{POLICY_VERSION}/{family}/{agent}/{state_dim}x{n_params}"


def _torch() -> Any:
    """torch, set to one thread when an agent uses it (not at import: the process's other torch work keeps its own)."""
    torch.set_num_threads(1)  # tiny nets; keep the shared cores for measurements
    return torch


def round_to(candidates: Sequence[int], value: float) -> int:
    """R(x): the candidate nearest to `value` on a log scale (ties to the smaller)."""
    value = max(value, 1.0)
    return min(candidates, key=lambda c: (abs(math.log(c) - math.log(value)), c))


def factor_of(candidates: Sequence[int], extent: int, action: float) -> int:
    """F = R(D * a) (eq. 2), with `a` in (0, 1) mapped on a log scale so small tiles are as reachable as big ones."""
    return round_to(candidates, math.exp(action * math.log(max(extent, 1))))


def action_of(extent: int, factor: int) -> float:
    """The inverse of `factor_of` (the action that gives `factor`), clipped into (0, 1)."""
    if extent <= 1:
        return 0.5
    return min(max(math.log(factor) / math.log(extent), 0.02), 0.98)


@dataclass
class _Step:
    actor: str
    state: list[float]
    action: list[float]
    logp: float
    reward: float | None = None


@dataclass
class _Buffer:
    steps: list[_Step] = field(default_factory=list)


class Critic:
    """V(state) of one actor (never shared): an MLP; states are zero-padded (or cut) to `width`."""

    def __init__(self, width: int, seed: int = 0):
        torch = _torch()
        torch.manual_seed(seed)
        self.width = width
        self.net = torch.nn.Sequential(
            torch.nn.Linear(width, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, 1)
        )

    def pad(self, states: Any) -> Any:
        torch = _torch()
        states = torch.as_tensor(states, dtype=torch.float32)
        if states.shape[1] >= self.width:
            return states[:, : self.width]
        return torch.nn.functional.pad(states, (0, self.width - states.shape[1]))

    def __call__(self, states: Any) -> Any:
        return self.net(self.pad(states)).squeeze(-1)


class _Actor:
    """Common PPO machinery: a policy network, a buffer of steps, the clipped update."""

    name = "actor"

    def __init__(self, state_dim: int, n_params: int, critic: Critic, *, seed: int = 0, lr: float = 3e-3,
                 clip: float = 0.2, epochs: int = 8, entropy: float = 0.01):
        torch = _torch()
        torch.manual_seed(seed)
        self.state_dim, self.n_params, self.critic = state_dim, n_params, critic
        self.clip, self.epochs, self.entropy = clip, epochs, entropy
        self.net = self._make_net(torch)
        self.opt = torch.optim.Adam([*self.net.parameters(), *critic.net.parameters()], lr=lr)
        self.gen = torch.Generator().manual_seed(seed)
        self.buffer = _Buffer()
        self.seen, self.mean, self.m2 = 0, 0.0, 0.0  # running reward statistics (Welford)
        self.updates = 0  # updates in this process (not persisted): whether it learned anything worth keeping

    def _make_net(self, torch: Any) -> Any:
        raise NotImplementedError

    def _dist(self, states: Any) -> Any:
        raise NotImplementedError

    def _sample(self, dist: Any) -> Any:
        raise NotImplementedError

    def act(self, state: Sequence[float], n: int = 1) -> list[list[float]]:
        """`n` actions for `state` (recorded; give each its reward with `reward`)."""
        torch = _torch()
        with torch.no_grad():
            states = torch.as_tensor([list(state)] * n, dtype=torch.float32)
            dist = self._dist(states)
            actions = self._sample(dist)
            logp = dist.log_prob(actions).sum(-1)
        out = []
        for a, lp in zip(actions.tolist(), logp.tolist()):
            self.buffer.steps.append(_Step(self.name, list(state), a, lp))
            out.append(a)
        return out

    def record(self, state: Sequence[float], action: Sequence[float], reward: float | None = None) -> None:
        """Adds an externally chosen step (a heuristic first layout, replayed history); reward None: later."""
        torch = _torch()
        with torch.no_grad():
            dist = self._dist(torch.as_tensor([list(state)], dtype=torch.float32))
            lp = float(dist.log_prob(torch.as_tensor([list(action)], dtype=torch.float32)).sum(-1))
        reward = None if reward is None else float(reward)
        self.buffer.steps.append(_Step(self.name, list(state), list(action), lp, reward))

    def reward_last(self, rewards: Sequence[float]) -> None:
        """Rewards for the last `len(rewards)` unrewarded steps, in order."""
        pending = [s for s in self.buffer.steps if s.reward is None]
        assert len(rewards) <= len(pending), f"{len(rewards)=} > {len(pending)=} pending steps"
        for step, r in zip(pending[len(pending) - len(rewards):], rewards):
            step.reward = float(r)

    def update(self) -> float | None:
        """One PPO update on the rewarded steps (then forgets them); returns the mean reward."""
        torch = _torch()
        steps = [s for s in self.buffer.steps if s.reward is not None]
        self.buffer.steps = [s for s in self.buffer.steps if s.reward is None]
        if not steps:
            return None
        states = torch.as_tensor([s.state for s in steps], dtype=torch.float32)
        actions = torch.as_tensor([s.action for s in steps], dtype=torch.float32)
        old_logp = torch.as_tensor([s.logp for s in steps], dtype=torch.float32)
        for step in steps:
            self.seen += 1
            delta = step.reward - self.mean
            self.mean += delta / self.seen
            self.m2 += delta * (step.reward - self.mean)
        scale = math.sqrt(self.m2 / (self.seen - 1)) if self.seen > 1 and self.m2 > 0 else 1.0
        rewards = torch.as_tensor([(s.reward - self.mean) / scale if self.seen > 1 else s.reward for s in steps],
                                  dtype=torch.float32)
        raw = float(sum(s.reward for s in steps) / len(steps))
        self.updates += 1
        for _ in range(self.epochs):
            values = self.critic(states)
            adv = (rewards - values).detach()
            if len(steps) > 1:
                adv = (adv - adv.mean()) / (adv.std() + 1e-6)
            dist = self._dist(states)
            logp = dist.log_prob(actions).sum(-1)
            ratio = torch.exp(logp - old_logp)
            surrogate = torch.min(ratio * adv, torch.clamp(ratio, 1 - self.clip, 1 + self.clip) * adv)
            value_loss = ((values - rewards) ** 2).mean()
            loss = -surrogate.mean() + 0.5 * value_loss - self.entropy * dist.entropy().sum(-1).mean()
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
        return raw

    def _shapes(self) -> dict[str, list[int]]:
        return {**{f"actor.{k}": list(v.shape) for k, v in self.net.state_dict().items()},
                **{f"critic.{k}": list(v.shape) for k, v in self.critic.net.state_dict().items()}}

    def state_bytes(self) -> bytes:
        """The policy, its critic, their optimizer and the reward statistics (`load_state` reads them back)."""
        torch = _torch()
        buf = io.BytesIO()
        torch.save({"version": POLICY_VERSION, "agent": self.name, "state_dim": self.state_dim,
                    "n_params": self.n_params, "critic_width": self.critic.width, "actor": self.net.state_dict(),
                    "critic": self.critic.net.state_dict(), "optimizer": self.opt.state_dict(),
                    "seen": self.seen, "mean": self.mean, "m2": self.m2}, buf)
        return buf.getvalue()

    def load_state(self, data: bytes, *, source: str = "policy") -> bool:
        """Warm-starts from what `state_bytes` wrote; False (with a log line saying why, the agent untouched)
        when `data` is not a policy, is of another `POLICY_VERSION` or of another agent or shape."""
        torch = _torch()
        try:  # weights_only: tensors, numbers, strings and containers, never code
            state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        except Exception as e:  # noqa: BLE001 - whatever a foreign file makes torch raise
            log.warning("policy %s unreadable (%s); starting cold", source, (str(e).splitlines() or [type(e)])[0])
            return False
        version = state.get("version") if isinstance(state, dict) else None
        if version != POLICY_VERSION:
            log.warning("policy %s of version %s ignored (this tuner reads %s); starting cold", source, version,
                        POLICY_VERSION)
            return False
        try:
            shapes = {**{f"actor.{k}": list(v.shape) for k, v in state["actor"].items()},
                      **{f"critic.{k}": list(v.shape) for k, v in state["critic"].items()}}
            seen, mean, m2 = int(state["seen"]), float(state["mean"]), float(state["m2"])
            agent, dims = state["agent"], f"{state['state_dim']}x{state['n_params']}/{state['critic_width']}"
        except (KeyError, AttributeError, TypeError, ValueError) as e:
            log.warning("policy %s of version %s incomplete (%r); starting cold", source, version, e)
            return False
        if agent != self.name or shapes != self._shapes():
            log.warning("policy %s of a %s agent of shape %s ignored (this %s agent's is %dx%d/%d); starting cold",
                        source, agent, dims, self.name, self.state_dim, self.n_params, self.critic.width)
            return False
        self.net.load_state_dict(state["actor"])
        self.critic.net.load_state_dict(state["critic"])
        settings = [{k: v for k, v in g.items() if k != "params"} for g in self.opt.param_groups]
        try:  # the moments carry over; the settings (learning rate, ...) stay this code's
            self.opt.load_state_dict(state["optimizer"])
            for group, own in zip(self.opt.param_groups, settings):
                group.update(own)
        except (KeyError, ValueError, TypeError) as e:
            log.info("policy %s: optimizer state not restored (%s); its moments start afresh", source, e)
            self.opt.state.clear()
        self.seen, self.mean, self.m2 = seen, mean, m2
        return True


class LayoutActor(_Actor):
    """Split-factor actions a in (0, 1), one per layout parameter (Beta policy)."""

    name = "layout"

    def _make_net(self, torch: Any) -> Any:
        return torch.nn.Sequential(
            torch.nn.Linear(self.state_dim, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, 2 * self.n_params)
        )

    def _dist(self, states: Any) -> Any:
        torch = _torch()
        out = self.net(states)
        ab = torch.nn.functional.softplus(out) + 1.0
        return torch.distributions.Beta(ab[:, : self.n_params], ab[:, self.n_params:])

    def _sample(self, dist: Any) -> Any:
        torch = _torch()
        # Beta.sample takes no generator: draw under a global seed taken from ours (reproducible)
        seed = int(torch.randint(2**31 - 1, (1,), generator=self.gen))
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            sample = dist.sample()
        return sample.clamp(1e-3, 1 - 1e-3)


DIRECTIONS = (-1, 0, 1)


class LoopActor(_Actor):
    """A direction in {-1, 0, +1} per loop parameter (a categorical policy per parameter)."""

    name = "loop"

    def _make_net(self, torch: Any) -> Any:
        net = torch.nn.Sequential(
            torch.nn.Linear(self.state_dim, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, 3 * self.n_params)
        )
        with torch.no_grad():  # start mostly still: most parameters keep their value in a step
            net[-1].bias.view(self.n_params, 3)[:, 1] += 3.0
        return net

    def _dist(self, states: Any) -> Any:
        torch = _torch()
        logits = self.net(states).view(-1, self.n_params, 3)
        return torch.distributions.Categorical(logits=logits)

    def _sample(self, dist: Any) -> Any:
        torch = _torch()
        probs = dist.probs
        flat = probs.reshape(-1, 3)
        picks = torch.multinomial(flat, 1, generator=self.gen).view(probs.shape[:-1])
        return picks.float()

    def directions(self, state: Sequence[float], n: int) -> list[list[int]]:
        """`n` direction vectors (entries in `DIRECTIONS`) for `state`, recorded for `reward_last`."""
        return [[DIRECTIONS[int(i)] for i in a] for a in self.act(state, n)]
