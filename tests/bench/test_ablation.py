"""bench.ablation: train and run end to end on a tiny case (simulated device), and the report's arithmetic."""

from __future__ import annotations

import json

import pytest

from bench import ablation
from bench.ops_cases import Case
from bench.ablation_report import (ARMS, arm_name, best_so_far, seed_in_band, settle, summary, table,
                                   to_band)
from tuner.knowledge import Knowledge
from tuner.measurers.simulated import SimulatedMeasurer


@pytest.fixture(scope="module")
def trained_path(tmp_path_factory):
    """`train` on the tiny conv2d, 20 simulated measurements."""
    path = tmp_path_factory.mktemp("ablation") / "knowledge.npz"
    ablation.train(ablation.SMOKE_TRAIN, 20, path, measurer=SimulatedMeasurer())
    return path


@pytest.mark.bench
@pytest.mark.tunes
@pytest.mark.timeout(300)
def test_train_then_run_on_a_tiny_case(trained_path, tmp_path):
    """`train` leaves a knowledge file with a model and the PPO policies; `run` loads it into the warm arms (their
    first round is ranked by it, the cold arms' cannot be) and writes every arm's curve and band."""
    path = trained_path
    trained = Knowledge.load(path)
    assert trained.cost_model is not None and trained.cost_model.rows == 20
    assert len(trained.samples) > 0

    out = tmp_path / "ablation.json"
    ablation.run(ablation.SMOKE_HELD_OUT, 8, path, out, with_metaschedule=False, measurer=SimulatedMeasurer())
    report = json.loads(out.read_text())
    assert report["budget"] == 8 and report["knowledge_rows"] == 20
    assert report["target"].startswith("llvm") and report["environment"]["cpu"]
    [row] = report["cases"]
    assert row["name"] == "tiny_grp" and row["search"] == "alt"
    assert set(row["arms"]) == {arm_name(a, s) for a in ARMS for s in (True, False)}
    assert row["band_ms"] == pytest.approx(1.02 * row["best_ms"])
    assert row["best_ms"] == min(a["best_ms"] for a in row["arms"].values())
    for name, arm in row["arms"].items():
        assert arm["trials"] == len(arm["curve"]) == len(arm["latencies_ms"]) <= 8, name
        assert arm["curve"] == best_so_far(arm["latencies_ms"]), name
        assert arm["to_band"] == to_band(arm["curve"], row["band_ms"]), name
        if arm["warm"]:
            assert arm["first_round_predicted"] == arm["first_round"] > 0, name  # ranked by the loaded model
            assert isinstance(arm["policies_stored"], list) and isinstance(arm["policies_new"], list), name
        else:
            assert arm["first_round_predicted"] == 0, name
    assert any(a["to_band"] is not None for a in row["arms"].values())  # the best arm reaches its own band
    assert {"without_seeds", "with_seeds"} == set(report["summary"]["d_over_a"])
    md = out.with_suffix(".md").read_text()
    assert "tiny_grp" in md and "(d)/(a) without seeds" in md
    assert row["warm_unused"] == []


@pytest.mark.bench
@pytest.mark.tunes
@pytest.mark.timeout(300)
def test_a_fused_subgraph_runs_d_as_c_and_its_warm_arm_is_ranked_by_the_trained_model(trained_path):
    """Attention is searched over the fusion space: no PPO agents, so (d) is (c) and not run again; its candidates
    have program features, so the model trained on operators ranks its warm arm's first round."""
    case = Case("tiny_attention", "matmul_softmax_matmul", {"heads": 2, "seq": 16, "dim": 8})
    row = ablation.run_case(case, 6, Knowledge.load(trained_path), arms=("b", "c", "d"), seed_modes=(True,),
                            with_metaschedule=False, measurer=SimulatedMeasurer())
    assert row["search"] == "xgb (fusion space)"
    assert row["arms"]["d+seeds"]["same_as"] == "c+seeds"
    assert row["arms"]["d+seeds"]["curve"] == row["arms"]["c+seeds"]["curve"]
    assert row["warm_unused"] == []


def _arm(latencies, origins=None, **extra):
    return {"latencies_ms": latencies, "origins": origins or ["sample"] * len(latencies),
            "curve": best_so_far(latencies), "best_ms": min((v for v in latencies if v), default=None), **extra}


def test_band_seeds_and_ratios_from_hand_made_rows():
    """The band is 1.02 x our arms' best (MetaSchedule read against it), a seed in it is flagged with its
    measurement, and the (d)/(a) ratio is a ratio of geometric means, an arm that never gets there counted at budget + 1."""
    rows = [
        settle({"name": "x", "arms": {
            "a+seeds": _arm([2.0, 1.0, 0.5], ["blocked", "untuned", "walk"]),
            "d+seeds": _arm([1.0, 0.505], ["walk", "untuned"]),
            "a-seeds": _arm([None, 3.0, 0.6, 0.5]),
            "d-seeds": _arm([0.509]),
            "metaschedule": {"curve": best_so_far([0.4, 0.3]), "best_ms": 0.3},
        }}),
        settle({"name": "y", "arms": {"a-seeds": _arm([1.0, 1.0]), "d-seeds": _arm([2.0, 1.0])}}),
    ]
    x = rows[0]
    assert x["best_ms"] == 0.5 and x["band_ms"] == pytest.approx(0.51)
    assert [x["arms"][n]["to_band"] for n in ("a+seeds", "d+seeds", "a-seeds", "d-seeds", "metaschedule")] == \
        [3, 2, 4, 1, 1]
    assert x["arms"]["d+seeds"]["seed_in_band_at"] == 2 and x["arms"]["a+seeds"]["seed_in_band_at"] is None
    assert x["seeds_in_band"] and not rows[1]["seeds_in_band"]
    assert x["warm_unused"] == []
    s = summary(rows, budget=4)
    assert s["geomean_to_band"]["a-seeds"]["geomean"] == pytest.approx((4 * 1) ** 0.5)
    assert s["geomean_to_band"]["d-seeds"]["geomean"] == pytest.approx((1 * 2) ** 0.5)
    assert s["d_over_a"]["without_seeds"]["ratio"] == pytest.approx(2 ** 0.5 / 2)
    assert s["d_over_a"]["without_seeds"]["met"] is False
    assert s["d_over_a"]["with_seeds"]["ratio"] == pytest.approx(2 / 3)
    never = settle({"name": "z", "arms": {"a-seeds": _arm([1.0]), "d-seeds": _arm([5.0])}})
    assert never["arms"]["d-seeds"]["to_band"] is None
    assert summary([never], budget=9)["geomean_to_band"]["d-seeds"] == \
        {"geomean": pytest.approx(10.0), "cases": 1, "never": 1}
    text = table({"budget": 4, "target": "llvm", "environment": {"cpu": "znver5"}, "cases": rows,
                  "summary": s})
    assert "x *" in text and "d+seeds at measurement 2" in text and "MS" in text


def test_seed_in_band_reads_only_seeds():
    assert seed_in_band([1.0, 0.5], ["walk", "blocked"], 0.6) == 2
    assert seed_in_band([0.5, 0.5], ["walk", "placement"], 0.6) is None
    assert to_band([None, 2.0, 1.0], None) is None


def test_metaschedule_database_read_in_commit_order(tmp_path):
    """Each record's mean run time in ms, a failed one (MetaSchedule's 1e10 s) as None."""
    path = tmp_path / "database_tuning_record.json"
    lines = [[0, [["trace"], [0.002, 0.004], {"kind": "llvm"}, []]],
             [0, [["trace"], [1e10], {"kind": "llvm"}, []]],
             [0, [["trace"], [0.001], {"kind": "llvm"}, []]]]
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    got = ablation.database_latencies(path)
    assert got[0] == pytest.approx(3.0) and got[1] is None and got[2] == pytest.approx(1.0)


def test_cases_are_held_out_of_training():
    """No held-out case is a training workload, and every case names a catalog operator or subgraph."""
    train = {(c.operator, tuple(sorted(c.params.items()))) for c in ablation.TRAIN}
    assert not any((c.operator, tuple(sorted(c.params.items()))) in train for c in ablation.HELD_OUT)
    assert {c.operator for c in ablation.TRAIN} == {"conv2d", "dense", "depthwise_conv2d"}
    with pytest.raises(ValueError, match="unknown case"):
        ablation.pick(ablation.HELD_OUT, ["nope"])
