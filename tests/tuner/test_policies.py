"""PPO policies across jobs: kept per target by operator family and dimensions, warm-started, versioned."""

from __future__ import annotations

import logging

import pytest
import torch
from tuner_cases import task_of, workload

from tuner import tune
from tuner.knowledge import Knowledge
from tuner.measurers import SimulatedMeasurer
from tuner.ppo import POLICY_VERSION, Critic, LayoutActor, LoopActor, policy_key
from tuner.searches.alt import ALTSearch
from tuner.searches.alt_points import IDENTITY
from tuner.searches.alt_seeds import first_layout
from tuner.spaces.layout import LayoutSpace

CONV_A = dict(batch=1, in_channels=8, height=8, width=8, out_channels=16, kernel=3, padding=1)
CONV_B = dict(batch=1, in_channels=16, height=6, width=10, out_channels=8, kernel=3, padding=1)
OPTIONS = dict(search="alt", batch_size=16, top_k=4, seed=0)


def _task(params):
    wl = workload("conv2d", params)
    return task_of(wl, workload=wl)


def _params(actor) -> list[torch.Tensor]:
    return [p.detach().clone() for p in [*actor.net.parameters(), *actor.critic.net.parameters()]]


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def _stored(data: bytes, actor_type, dims: tuple[int, int, int]) -> list[torch.Tensor]:
    """The parameters a policy's bytes hold, read into a fresh agent of those dimensions."""
    state_dim, n_params, width = dims
    actor = actor_type(state_dim, n_params, Critic(width, seed=9), seed=9)
    assert actor.load_state(data)
    return _params(actor)


@pytest.fixture(scope="module")
def first_job() -> Knowledge:
    """One job on conv2d A: what its agents learned, as the service hands it to the next job on the target."""
    k = Knowledge()
    tune(_task(CONV_A), 16, measurer=SimulatedMeasurer(), knowledge=k, **OPTIONS)
    return Knowledge(policies=dict(k.updated_policies))


def test_a_job_keeps_its_agents_policies_by_family_agent_and_dimensions(first_job):
    layout = policy_key("conv2d/float32", "layout", 8, 4)
    assert layout == f"ppo{POLICY_VERSION}/conv2d/float32/layout/8x4"
    assert layout in first_job.policies
    loops = [k for k in first_job.policies if k.startswith(f"ppo{POLICY_VERSION}/conv2d/float32/loop")]
    assert loops, first_job.policies.keys()  # the user's layouts' loop actor and the tiled layouts' (one per key)


def test_a_second_job_on_the_same_family_loads_the_stored_policies(first_job, monkeypatch):
    """On another conv2d, the layout actor starts from the stored parameters (before any update), not a cold
    actor's, and so do the loop actors whose keys were stored; what they learn is kept back."""
    made: list[ALTSearch] = []
    at_start: dict[str, list[torch.Tensor]] = {}
    init, loop_actor = ALTSearch.__init__, ALTSearch.loop_actor

    def spy_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        made.append(self)
        at_start["layout"] = _params(self.layout_actor)

    def spy_loop_actor(self, p):
        new = p.actor is None
        actor = loop_actor(self, p)
        if new:
            at_start[self.agent_key(actor, self.loop_agent(p))] = _params(actor)
        return actor

    monkeypatch.setattr(ALTSearch, "__init__", spy_init)
    monkeypatch.setattr(ALTSearch, "loop_actor", spy_loop_actor)
    k = Knowledge(policies=first_job.policies)
    tune(_task(CONV_B), 16, measurer=SimulatedMeasurer(), knowledge=k, **OPTIONS)
    monkeypatch.undo()

    (search,) = made
    layout_key = search.agent_key(search.layout_actor, "layout")
    stored = _stored(first_job.policies[layout_key], LayoutActor, (8, 4, 8))
    assert search.warm_layout and _same(at_start["layout"], stored)
    cold = ALTSearch(_task(CONV_B), LayoutSpace(_task(CONV_B)), SimulatedMeasurer(), seed=0)
    assert not cold.warm_layout and not _same(_params(cold.layout_actor), stored)
    warm_loops = [key for key in at_start if key in first_job.policies and "/loop" in key]
    assert warm_loops, (at_start.keys(), first_job.policies.keys())
    for key in warm_loops:
        n = int(key.rsplit("/", 1)[1].split("x")[0])
        assert _same(at_start[key], _stored(first_job.policies[key], LoopActor, (n, n, n))), key
    # it learned on from there, and keeps that for the caller to persist
    assert search.layout_actor.updates > 0
    assert k.updated_policies[layout_key] != first_job.policies[layout_key]


def test_a_warm_layout_actor_proposes_the_first_joint_round_and_gets_the_blocked_seeds(first_job):
    """No oneDNN-like start: the first joint round is in the actor's layout, seeded with the blocked nest; the
    user's own layouts come second."""
    task = _task(CONV_B)
    search = ALTSearch(task, LayoutSpace(task), SimulatedMeasurer(), batch_size=16, top_k=4, seed=0,
                       knowledge=Knowledge(policies=first_job.policies))
    assert search.warm_layout
    trials = search.run(16)
    start = search.key(search.full_choice(first_layout(search.template, search.space.unit)))
    first_round = [t for t in trials if t.extra["round"] == trials[0].extra["round"]]
    assert search.order[0] == search.blocked_key != start, (search.order, start)
    assert search.order[1] == IDENTITY
    assert {t.extra["layout"] for t in first_round} == {search.points[search.blocked_key].name}
    assert "blocked" in {t.extra.get("origin") for t in first_round}
    assert search.layout_actor.updates > 0


def test_without_a_stored_policy_the_search_is_what_it_was_cold():
    plain = tune(_task(CONV_B), 12, measurer=SimulatedMeasurer(), **OPTIONS)
    k = Knowledge()
    empty = tune(_task(CONV_B), 12, measurer=SimulatedMeasurer(), knowledge=k, **OPTIONS)
    assert [t.config for t in empty.trials] == [t.config for t in plain.trials]
    assert k.updated_policies  # and it keeps what it learned


def test_the_agents_ablation_neither_loads_nor_keeps_policies(first_job):
    task = _task(CONV_B)
    k = Knowledge(policies=first_job.policies)
    search = ALTSearch(task, LayoutSpace(task), SimulatedMeasurer(), batch_size=16, top_k=4, seed=0, knowledge=k,
                       ppo=False)
    assert not search.warm_layout
    search.run(12)
    assert not k.updated_policies


def _foreign(data: bytes, monkeypatch) -> bytes:
    """`data`'s agent written by a tuner of another policy version."""
    import tuner.ppo as ppo

    actor = LayoutActor(8, 4, Critic(8, seed=0), seed=0)
    assert actor.load_state(data)
    monkeypatch.setattr(ppo, "POLICY_VERSION", POLICY_VERSION + 1)
    out = actor.state_bytes()
    monkeypatch.undo()
    return out


@pytest.mark.parametrize("kind", ["version", "shape", "garbage"])
def test_a_policy_of_another_version_or_shape_is_ignored_with_a_log_line(first_job, kind, monkeypatch, caplog):
    task = _task(CONV_B)
    key = policy_key("conv2d/float32", "layout", 8, 4)
    if kind == "version":
        data, said = _foreign(first_job.policies[key], monkeypatch), f"of version {POLICY_VERSION + 1} ignored"
    elif kind == "shape":
        data, said = LayoutActor(6, 3, Critic(6)).state_bytes(), "of shape 6x3/6 ignored"
    else:
        data, said = b"not a policy", "unreadable"
    cold = ALTSearch(task, LayoutSpace(task), SimulatedMeasurer(), seed=0)
    with caplog.at_level(logging.WARNING, logger="tuner.ppo"):
        search = ALTSearch(task, LayoutSpace(task), SimulatedMeasurer(), seed=0,
                           knowledge=Knowledge(policies={key: data}))
    assert not search.warm_layout
    assert _same(_params(search.layout_actor), _params(cold.layout_actor))
    assert any(said in r.getMessage() and "starting cold" in r.getMessage() for r in caplog.records), caplog.text
    # an older version's key is never even looked up: the version is in it
    assert policy_key("conv2d/float32", "layout", 8, 4).startswith(f"ppo{POLICY_VERSION}/")


def test_the_graph_layout_search_keeps_and_loads_its_policy():
    """The graph-level actor: stored under its own key after a search, loaded warm by the next one (which then
    proposes every group's block in its first round after the rule's, instead of every group plain)."""
    torch_export = pytest.importorskip("torch").export
    from compiler.target import resolve_target
    from compiler.workloads.model.importer import translate_model
    from tuner.graph_layout import GRAPH_FAMILY, GraphLayoutSearch

    class Two(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.c1 = torch.nn.Conv2d(3, 16, 3, padding=1)
            self.c2 = torch.nn.Conv2d(16, 8, 1)

        def forward(self, x):
            return self.c2(torch.relu(self.c1(x)))

    graph = translate_model(torch_export.export(Two().eval(), (torch.randn(1, 3, 8, 8),)))
    target = resolve_target("host")
    k = Knowledge()
    first = GraphLayoutSearch(graph, target, SimulatedMeasurer(), knowledge=k, joint_trials=1)
    assert not first.warm
    result = first.run(12, max_rounds=4)
    key = policy_key(GRAPH_FAMILY, "layout", 6, 1)
    assert first.policy_key == key and key in k.updated_policies
    assert "plain" in [r["source"] for r in result.rounds]

    stored = Knowledge(policies=dict(k.updated_policies))
    second = GraphLayoutSearch(graph, target, SimulatedMeasurer(), knowledge=stored, joint_trials=1)
    assert second.warm and _same(_params(second.actor), _stored(stored.policies[key], LayoutActor, (6, 1, 6)))
    result = second.run(12, max_rounds=4)
    assert [r["source"] for r in result.rounds][:2] == ["rule", "actor"]
