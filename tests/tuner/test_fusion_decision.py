"""A model job's fusion decision ("fusion": "auto", the default): a chain of complex operators whose
intermediate fits in the L2 cache is never fused (not even tuned fused), one whose intermediate does not is tuned
both ways and fused where that measured faster; the served model computes what torch computes either way."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from compiler.arrays import random_inputs  # noqa: E402
from compiler.target import host_caches  # noqa: E402
from compiler.workloads.model.importer import translate_model  # noqa: E402
from tuner import LocalMeasurer  # noqa: E402
from tuner.model import serve_model, tune_model  # noqa: E402
from tuner.request import ModelTuneRequest  # noqa: E402

pytestmark = [pytest.mark.tunes, pytest.mark.builds_model]

CHANNELS = 16


class Separable(torch.nn.Module):
    """depthwise 3x3 -> pointwise: MobileNet's chain, its intermediate CHANNELS x side x side floats."""

    def __init__(self):
        super().__init__()
        self.dw = torch.nn.Conv2d(CHANNELS, CHANNELS, 3, padding=1, groups=CHANNELS)
        self.pw = torch.nn.Conv2d(CHANNELS, 32, 1)

    def forward(self, x):
        return torch.relu(self.pw(torch.relu(self.dw(x))))


def side_for(intermediate_bytes: int) -> int:
    """The image side whose intermediate holds about `intermediate_bytes` (a multiple of 8)."""
    return max(8, 8 * round(math.sqrt(intermediate_bytes / (4 * CHANNELS)) / 8))


class SlowMemory(LocalMeasurer):
    """This machine, except that the chain's operators on their own read 4x slower: a machine whose memory is
    far slower than its caches, where the intermediate's trip through memory dominates (the decision is then
    certain; what it chooses is still built, checked and timed for real)."""

    def _slowed(self, task, result):
        if task.name.startswith("grouped") or not result.latencies_ms:
            return result
        return dataclasses.replace(result, latencies_ms=[4 * v for v in result.latencies_ms])

    def measure_one(self, task, candidate):
        return self._slowed(task, super().measure_one(task, candidate))

    def measure(self, task, candidates):
        return [self._slowed(task, r) for r in super().measure(task, candidates)]

    def baseline_ms(self, task):
        ms = super().baseline_ms(task)
        return ms if ms is None or task.name.startswith("grouped") else 4 * ms


def tune_and_serve(side: int, budget: int, measurer, tmp_path: Path):
    torch.manual_seed(0)
    module = Separable().eval()
    x = torch.randn(1, CHANNELS, side, side)
    graph = translate_model(torch.export.export(module, (x,)))
    request = ModelTuneRequest(budget=budget)
    assert request.fusion == "auto"  # the default
    with measurer:
        tuned = tune_model(graph, request, measurer=measurer)
    inputs = random_inputs([(tuple(i.shape), i.dtype) for i in tuned.model.inputs], request.seed)
    with torch.no_grad():
        expected = [module(torch.from_numpy(inputs[0])).numpy()]
    served = serve_model(tuned.model, request, tuned.schedules, inputs, expected, dest=tmp_path / "model.tar.gz",
                         facts=tuned.facts, report=tuned.report, alternatives=tuned.alternatives)
    return tuned, served, inputs, expected


def test_a_chain_whose_intermediate_fits_in_l2_is_not_fused(tmp_path):
    side = side_for(host_caches().l2 // 4)
    tuned, served, _, _ = tune_and_serve(side, 0, LocalMeasurer(), tmp_path)
    assert tuned.model.chain_options == [] and tuned.model.chains == []
    assert tuned.fusion == [] and tuned.alternatives == {}
    assert not any(o.model_task.name.startswith("grouped") for o in tuned.outcomes)  # not even tuned fused
    assert served["error"] is None and served["report"]["check"]["passed"]
    assert served["report"]["fusion"] == {"chains": [], "fused": 0}


def test_a_chain_whose_intermediate_exceeds_l2_is_tuned_both_ways_and_fused_where_faster(tmp_path):
    side = side_for(4 * host_caches().l2)
    tuned, served, inputs, expected = tune_and_serve(side, 24, SlowMemory(), tmp_path)
    [decision] = tuned.fusion
    assert decision["intermediate_bytes"] == 4 * CHANNELS * side * side > host_caches().l2
    names = {o.model_task.name: len(o.trials) for o in tuned.outcomes}
    assert any(n.startswith("grouped") and k > 0 for n, k in names.items()), names  # the fused side measured
    assert any(n.startswith("fused_conv2d") and k > 0 for n, k in names.items()), names  # and the unfused side
    assert decision["fused"] and decision["fused_ms"] < decision["unfused_ms"]
    assert [t.name for t in tuned.model.tasks if t.name.startswith("grouped")], "the fused chain is one task"
    # its one option fused is every chain fused: the other model timed whole is the unfused one
    assert set(tuned.alternatives) == {"unfused"}
    assert not any(t.name.startswith("grouped") for t in tuned.alternatives["unfused"].tasks)

    # both models were built, checked against torch and timed whole; the faster one is served
    report = served["report"]
    assert served["error"] is None and report["check"]["passed"]
    assert report["fusion"]["fused"] == 1
    timed = report["fusion"]["end_to_end_ms"]
    assert set(timed) == {"chosen", "unfused"} and report["fusion"]["served"] == min(timed, key=timed.get)
    assert served["latency_ms"] == min(timed.values())
    assert report["fusion"]["served_chains"] == (1 if report["fusion"]["served"] == "chosen" else 0)


def test_the_measured_decision_matches_the_measurements(tmp_path):
    """On this machine as it is: whichever way it goes, the decision follows the two sides' measurements and the
    served model matches torch."""
    side = side_for(4 * host_caches().l2)
    tuned, served, _, _ = tune_and_serve(side, 24, LocalMeasurer(), tmp_path)
    [decision] = tuned.fusion
    assert decision["fused_ms"] is not None and decision["unfused_ms"] is not None
    assert decision["fused"] == (decision["fused_ms"] < decision["unfused_ms"])
    assert bool(tuned.model.chains) == decision["fused"]
    # the other choice of the one chain is timed whole too, and the faster of the two served
    assert set(tuned.alternatives) == {"every chain" if not decision["fused"] else "unfused"}
    timed = served["report"]["fusion"]["end_to_end_ms"]
    assert served["latency_ms"] == min(timed.values())
    assert served["error"] is None and served["report"]["check"]["passed"]
    assert np.isfinite(served["latency_ms"])
