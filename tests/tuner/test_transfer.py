"""Schedule transfer: signatures shared by workloads whose configurations carry over, stored schedules ranked by
distance, configurations adapted to another task's shapes that validate, apply and compute the right answer."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

torch = pytest.importorskip("torch")
tvm = pytest.importorskip("tvm")

from compiler.arrays import arg_specs, random_inputs  # noqa: E402
from compiler.target import AVX2, AVX512, resolve_target  # noqa: E402
from compiler.workloads.model import import_model  # noqa: E402
from tuner import Task  # noqa: E402
from tuner.spaces.loop_knobs import SPATIAL_LEVELS  # noqa: E402
from tuner.spaces.loop_structure import as_module  # noqa: E402
from tuner.transfer import (  # noqa: E402
    StoredSchedule,
    TransferKey,
    adapt,
    distance,
    rank,
    signature,
    space_of,
    transferred,
)
from tuner.tune import apply_config  # noqa: E402
from tuner_cases import host, run, task_of, workload  # noqa: E402

CONV = dict(batch=1, in_channels=8, height=12, width=12, out_channels=16, kernel=3, padding=1)
WIDER = dict(batch=2, in_channels=16, height=8, width=8, out_channels=32, kernel=3, padding=1)  # another conv


class SmallCNN(torch.nn.Module):
    """Four 3x3 convs with bias and relu (other channels, strides and sizes: one signature in NCHWc), a 1x1 conv,
    a global mean and a linear layer."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.c1 = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.c2 = torch.nn.Conv2d(16, 32, 3, padding=1, stride=2)
        self.c3 = torch.nn.Conv2d(32, 32, 3, padding=1)
        self.c4 = torch.nn.Conv2d(32, 16, 1)
        self.c5 = torch.nn.Conv2d(16, 48, 3, padding=1)
        self.fc = torch.nn.Linear(48, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.c1(x))
        x = torch.relu(self.c2(x))
        x = torch.relu(self.c3(x))
        x = torch.relu(self.c5(self.c4(x)))
        return self.fc(x.mean((2, 3)))


@pytest.fixture(scope="module")
def cnn_tasks() -> list[Task]:
    """The small CNN's tasks in NCHWc (`layout="blocked"`), for this machine."""
    target = resolve_target("host")
    model = import_model(torch.export.export(SmallCNN().eval(), (torch.randn(2, 3, 16, 16),)), layout="blocked",
                         target=target)
    return [Task(t.name, t.workload_key, t.prim_func, target) for t in model.tasks]


def cpu(mcpu: str) -> tvm.target.Target:
    """An LLVM target for another CPU than this one (its vector unit from `mcpu`, as an AVX2 machine's would be)."""
    return tvm.target.Target({"kind": "llvm", "mcpu": mcpu})


def conv_task(params: dict, epilogue: str = "bias_relu") -> Task:
    return task_of(workload("conv2d", params, epilogue))


def test_convs_of_other_shapes_share_a_signature_and_other_operators_do_not(cnn_tasks):
    a, b = signature(conv_task(CONV)), signature(conv_task(WIDER))
    assert a is not None and b is not None
    assert a.signature == b.signature and a.extents != b.extents
    assert len(a.signature) == 16 and len(a.extents) == 7  # nn ff yy xx rc ry rx
    # a batch of 1 (an axis of extent 1, without knobs) is the same nest as a batch of 2
    assert signature(conv_task({**WIDER, "batch": 1})).signature == a.signature
    # as is padding 0 (topi's conv2d keeps its padding stage, a copy then) and a stride of 2
    assert signature(conv_task({**CONV, "padding": 0, "stride": 2})).signature == a.signature
    others = [
        signature(task_of(workload("dense", dict(m=16, n=32, k=64)))),
        signature(task_of(workload("batch_matmul", dict(batch=2, m=16, n=32, k=64)))),
        signature(conv_task(CONV, epilogue="none")),  # another epilogue
        signature(conv_task({**CONV, "kernel": 1, "padding": 0})),  # a 1x1 conv: a GEMM over channels
        signature(task_of(workload("depthwise_conv2d", dict(batch=1, channels=8, height=12, width=12, kernel=3,
                                                            padding=1)))),
    ]
    assert all(k is not None for k in others)
    assert len({a.signature, *(k.signature for k in others)}) == 1 + len(others)
    # the same conv for another vector unit: configurations are carried within one target
    avx2 = Task("conv2d", "k", conv_task(CONV).prim_func, cpu("haswell"))
    avx512 = Task("conv2d", "k", conv_task(CONV).prim_func, cpu("skylake-avx512"))
    assert signature(avx2).signature != signature(avx512).signature
    # model tasks: the NCHWc 3x3 convs share one, the 1x1 conv, the mean, the linear layer have their own, the
    # element-wise ones (a layout conversion, a reshape) none
    keys = {t.workload_key: signature(t) for t in cnn_tasks}
    convs = {k.signature for t in cnn_tasks if (k := keys[t.workload_key]) and "conv2d" in t.name
             and k.extents[-1] == 3}
    assert len(convs) == 1 and signature(conv_task(CONV)).signature not in convs  # NCHWc is not NCHW
    assert any(k is None for k in keys.values())


def test_distance_is_the_sum_of_log_ratios():
    assert distance((1, 16, 8, 8), (1, 16, 8, 8)) == 0
    assert distance((1, 16, 8, 8), (2, 32, 4, 8)) == pytest.approx(3.0)
    assert distance((3,), (12,)) == distance((12,), (3,)) == pytest.approx(2.0)


def test_adapting_to_the_same_task_returns_the_configuration():
    task = conv_task(CONV)
    space = space_of(task)
    configs = [space.blocked_config(), space.untuned_config(), *space.sample(np.random.default_rng(0), 30)]
    for config in configs:
        assert adapt(config, task) == config
    older = {k: v for k, v in space.blocked_config().items() if k not in ("licm", "read_at", "tensorize")}
    assert adapt(older, task) == space.validate(older)  # a stored configuration older than some knobs


def test_the_blocked_seed_of_one_conv_carried_to_another_computes_the_right_answer():
    source, dest = conv_task(CONV), conv_task(WIDER)
    config = space_of(source).blocked_config()
    carried = adapt(config, dest)
    assert carried is not None and space_of(dest).validate(carried) == carried
    # the register block and the kernel window as they were, the channel tile the divisor of 16 nearest 8
    for knob in ("tile.xx.3", "tile.ff.3", "tile.ry.1", "tile.rx.1", "order", "parallel", "unroll", "vectorize"):
        assert carried[knob] == config[knob], knob
    assert carried["tile.rc.1"] == config["tile.rc.1"]
    wl = workload("conv2d", WIDER, "bias_relu")
    inputs = wl.random_inputs(0)
    out = run(apply_config(dest, carried), inputs, wl.output.shape)
    np.testing.assert_allclose(out, wl.reference(inputs), rtol=1e-3, atol=1e-3)


def test_a_configuration_that_cannot_be_carried_is_none(cnn_tasks):
    task = conv_task(CONV)
    config = space_of(task).blocked_config()
    assert adapt({"layout.ot": 16, **config}, task) is None  # ALT's joint space: another program's loops
    assert adapt({"tile.0": 4, "threshold": 25, "register": 2}, task) is None  # basteln's fusion space
    assert adapt({**config, "order": "SSRSRS"}, task) is None  # not an integer
    assert adapt({**config, "parallel": 2, "write_at": 1}, task) is None  # a placement invalid at the source too
    elementwise = next(t for t in cnn_tasks if signature(t) is None)
    assert adapt(config, elementwise) is None and transferred(elementwise, []) == []


def test_a_register_block_too_large_for_the_target_is_shrunk():
    """AVX-512's 8 rows x 32 columns of a dense do not fit AVX2's 16 registers of 8 lanes: the rows shrink first."""
    prim_func = workload("dense", dict(m=64, n=64, k=64)).prim_func
    wide = Task("dense", "k", prim_func, cpu("skylake-avx512"))
    narrow = Task("dense", "k", prim_func, cpu("haswell"))
    assert space_of(wide).unit == AVX512 and space_of(narrow).unit == AVX2
    config = space_of(wide).blocked_config()
    rows, cols = (a.knob(SPATIAL_LEVELS - 1) for a in space_of(wide).structure.spatial)
    assert config[rows] * config[cols] > AVX2.register_tile
    carried = adapt(config, narrow)
    assert carried is not None and carried[cols] == config[cols] and carried[rows] < config[rows]
    assert carried[rows] * carried[cols] <= AVX2.register_tile


def test_rank_orders_by_distance_then_latency():
    key = TransferKey("sig", (1, 16, 8, 8))

    def stored(name: str, extents: tuple[int, ...], latency_ms: float, sig: str = "sig") -> StoredSchedule:
        return StoredSchedule(name, extents, {"order": 0}, latency_ms, sig)

    candidates = [
        stored("far", (1, 64, 2, 8), 0.1),
        stored("near-slow", (2, 16, 8, 8), 2.0),
        stored("near-fast", (1, 32, 8, 8), 1.0),
        stored("other-operator", (1, 16, 8, 8), 0.1, sig="other"),
        stored("same", (1, 16, 8, 8), 5.0),
        stored("middle", (1, 32, 16, 8), 0.5),
    ]
    assert [s.workload_key for s in rank(candidates, key, limit=10)] == ["same", "near-fast", "near-slow", "middle",
                                                                          "far"]
    assert [s.workload_key for s in rank(iter(candidates), key)] == ["same", "near-fast", "near-slow"]
    assert rank(candidates, key, limit=0) == [] and rank([], key) == []
    # rows a query already selected by signature carry none
    unsigned = [StoredSchedule("b", (1, 16, 8, 16), {}, 1.0), StoredSchedule("a", (1, 16, 8, 4), {}, 0.5)]
    assert [s.workload_key for s in rank(unsigned, key)] == ["a", "b"]


def test_transferred_adapts_the_nearest_and_keeps_distinct_ones():
    dest, near, far = conv_task(WIDER), conv_task({**WIDER, "out_channels": 16}), conv_task(CONV)
    key_near, key_far = signature(near), signature(far)
    near_config = space_of(near).blocked_config()
    far_config = space_of(far).sample(np.random.default_rng(1), 1)[0]
    candidates = [
        StoredSchedule("far", key_far.extents, far_config, 1.0, key_far.signature),
        StoredSchedule("near", key_near.extents, near_config, 1.0, key_near.signature),
        StoredSchedule("near-again", key_near.extents, near_config, 3.0, key_near.signature),  # adapts alike
        StoredSchedule("dense", (16, 32, 64), {"order": 0}, 0.1, "another"),
    ]
    got = transferred(dest, candidates)
    assert [source for _, source in got] == ["near", "far"]
    assert got[0][0] == adapt(near_config, dest) and got[1][0] == adapt(far_config, dest)
    assert transferred(dest, candidates, limit=1) == got[:1]


def test_every_conv_pair_of_a_small_cnn_with_one_signature_adapts(cnn_tasks):
    """The property over real model tasks (NCHWc, fused bias and relu): every configuration of one conv's space
    (its seeds, samples) carried to every conv of the same signature validates there; one pair is also applied and
    checked against the untransformed program."""
    keyed = [(t, signature(t)) for t in cnn_tasks if "conv2d" in t.name]
    pairs = [(a, b) for (a, ka), (b, kb) in itertools.permutations(keyed, 2) if ka.signature == kb.signature]
    assert len(pairs) >= 6  # four 3x3 convs of one signature
    rng = np.random.default_rng(0)
    for a, b in pairs:
        source, dest = space_of(a), space_of(b)
        for config in [source.blocked_config(), source.untuned_config(), *source.sample(rng, 8)]:
            carried = adapt(config, b)
            assert carried is not None, (a.workload_key, b.workload_key, config)
            assert dest.validate(carried) == carried
    a, b = pairs[0]
    carried = adapt(space_of(a).blocked_config(), b)
    specs = arg_specs(b.prim_func)
    inputs = random_inputs(specs[:-1], seed=2)
    expected = run(as_module(b.prim_func), inputs, specs[-1][0])  # the untransformed program
    out = run(apply_config(b, carried), inputs, specs[-1][0])
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)


def test_a_task_searched_in_another_space_has_no_signature():
    """A program of several reductions, and a catalog subgraph even of one (`tune` searches both in basteln's
    `FusionSpace`)."""
    several = Task("s", "k", workload("depthwise_pointwise", dict(channels=8, height=10, width=10,
                                                                  out_channels=16)).prim_func, host())
    wl = workload("pad_conv_bias_relu", dict(batch=1, in_channels=4, height=8, width=8, out_channels=8, kernel=3))
    subgraph = task_of(wl, workload=wl)
    for task in (several, subgraph):
        assert signature(task) is None and adapt({"order": 0}, task) is None
