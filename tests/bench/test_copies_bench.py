"""bench.copies: basteln's copies of a shared producer (Fig. 11b) built three ways, checked, timed in fresh processes."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("tvm")

from bench import copies  # noqa: E402


@pytest.mark.bench
def test_quick_run_builds_and_checks_every_way_and_reports_what_was_copied(tmp_path, capsys):
    """`--rounds 0`: every way built and checked against numpy, no fresh-process timing (that path is
    `bench.common`'s, tested with the other benches)."""
    out = tmp_path / "copies.json"
    assert copies.main(["--quick", "--rounds", "0", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["bench"] == "copies" and report["mcpu"]
    ways = {row["case"]: row["ways"] for row in report["cases"]}
    assert set(ways) == {"chunk", "branches"}
    for case in ways.values():
        assert set(case) == {"copies", "threshold 0", "no copies"}
        assert all(w["ms"] is None and w["rows"] == 28 for w in case.values())
        assert case["no copies"]["copies"] == []
    # the chunk's parts do not intersect: copied even at threshold 0; the branches' overlap whole: only at 1
    assert ways["chunk"]["threshold 0"]["copies"] == [["Y", ["Y_copy1"], 0.0]]
    assert ways["branches"]["threshold 0"]["copies"] == []
    assert ways["branches"]["copies"]["copies"] == [["Y", ["Y_copy1"], 1.0]]
    # fused copies keep per-tile scratch; the producer computed whole keeps its whole buffer
    assert ways["chunk"]["copies"]["scratch_bytes"] < ways["chunk"]["no copies"]["scratch_bytes"]
    assert "-mcpu=" in capsys.readouterr().out
