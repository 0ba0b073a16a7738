"""The ALT search's agents across jobs (`tuner.knowledge`): which policy each agent loads and which it keeps.

`ALTSearch` is a `CarriedPolicies`: its layout actor and every layout's loop actor load the stored policy of their
key (`tuner.ppo.policy_key`: the operator family, e.g. "conv2d/float32", the agent and its dimensions) when the
search has `knowledge` and `ppo` on, and `keep_policies` gives back what they learned at the end of `run`.

Layering: `tuner` never imports `service`.
"""

from __future__ import annotations

import math
from typing import Any

from ..ppo import LayoutActor, LoopActor, policy_key
from .alt_points import LayoutPoint


class CarriedPolicies:
    """The policy side of `ALTSearch` (its attributes: `family`, `ppo`, `knowledge`, `free`, `layout_actor`,
    `points`)."""

    family: str
    ppo: bool
    knowledge: Any
    free: list
    layout_actor: LayoutActor
    points: dict[str, LayoutPoint]

    def agent_key(self, actor: LayoutActor | LoopActor, agent: str) -> str:
        """The key of an agent's policy on this search's target (`tuner.ppo.policy_key`)."""
        return policy_key(self.family, agent, actor.state_dim, actor.n_params)

    def _warm(self, actor: LayoutActor | LoopActor, agent: str) -> bool:
        """Loads the policy of the agent's key where `knowledge` holds one (with `ppo` only: the ablation's
        agents neither load nor store); whether it did."""
        if not self.ppo or self.knowledge is None:
            return False
        key = self.agent_key(actor, agent)
        data = self.knowledge.policy(key)
        return data is not None and actor.load_state(data, source=key)

    def keep_policies(self) -> None:
        """Keeps what the agents learned in this search into `knowledge` (an agent that never updated keeps
        nothing: the stored policy stays). Loop actors of layouts whose spaces have the same dimensions share a
        key: the one kept is the actor of the fastest layout among them, the layout the loop stage tuned in
        (so mostly also the one updated most), whose walks led to the best program; a layout tried for one
        joint round would overwrite it with a few walks' worth of learning."""
        if not self.ppo or self.knowledge is None:
            return
        if self.free and self.layout_actor.updates:
            self.knowledge.keep_policy(self.agent_key(self.layout_actor, "layout"), self.layout_actor.state_bytes())
        kept: set[str] = set()
        learned = [p for p in self.points.values() if p.actor is not None and p.actor.updates]
        for p in sorted(learned, key=lambda p: math.inf if p.best_ms is None else p.best_ms):
            key = self.agent_key(p.actor, self.loop_agent(p))
            if key not in kept:
                kept.add(key)
                self.knowledge.keep_policy(key, p.actor.state_bytes())

    @staticmethod
    def loop_agent(p: LayoutPoint) -> str:
        """The loop actor's agent name in its key: the user's layouts' loops (the untransformed program's) are
        another space than a layout program's, whose knobs include its conversions' placements."""
        return "loop-as-given" if p.identity else "loop"

