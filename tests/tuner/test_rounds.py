"""A model task's round (`tuner.rounds`): through JSON as it travels between workers, and run to its `n` from the
trials a dead worker left (simulated device: nothing built)."""

from __future__ import annotations

import json

from tuner import make_measurer
from tuner.rounds import InlineRounds, Round, run_round
from tuner.task import Task
from tuner_cases import host, task_of, workload


def _round(n: int = 6, prior: int = 0, start_from=()) -> Round:
    base = task_of(workload("dense", {"m": 16, "n": 16, "k": 16}))
    task = Task("dense", base.workload_key, base.prim_func, base.target)
    return Round(3, task, n, prior, list(start_from), seeds=True, seed=1, weight=2)


def test_a_round_survives_json_and_measures_the_same_trials():
    rnd = _round()
    back = Round.from_json(json.loads(json.dumps(rnd.to_json("host"))))
    assert (back.index, back.n, back.prior, back.seed, back.weight) == (3, 6, 0, 1, 2)
    assert back.task.workload_key == rnd.task.workload_key
    assert back.task.prim_func.script() == rnd.task.prim_func.script()
    assert str(back.task.target) == str(host())
    first = run_round(rnd, [], make_measurer("simulated")).trials
    second = run_round(back, [], make_measurer("simulated")).trials
    assert [t.config for t in first] == [t.config for t in second] and len(first) == 6


def test_a_round_taken_over_spends_only_what_is_left_and_numbers_after_the_written_trials():
    measurer = make_measurer("simulated")
    whole = run_round(_round(n=6), [], measurer).trials
    written = whole[:2]  # the dead worker wrote two trials of its round
    start = whole[0].config
    heard = []
    rest = run_round(_round(n=6, start_from=[start]), written, measurer, on_trial=heard.append).trials
    assert len(rest) == 4 and [t.index for t in heard] == [2, 3, 4, 5]
    assert start not in [t.config for t in rest], "a start configuration already measured is not measured again"


def test_inline_rounds_run_as_submitted_and_hand_back_every_trial():
    heard = []
    rounds = InlineRounds(make_measurer("simulated"), on_trial=lambda r, t: heard.append((r.index, t.index)))
    assert rounds.free(0) and not rounds.free(1)
    rounds.submit(_round(n=4), [])
    done = rounds.wait(True)
    assert done.spent == 4 and [t.index for t in done.trials] == [0, 1, 2, 3] and done.error is None
    assert heard == [(3, 0), (3, 1), (3, 2), (3, 3)]
    assert rounds.wait(True) is None
