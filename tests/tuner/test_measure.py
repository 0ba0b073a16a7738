"""LocalMeasurer: correct candidates are timed, wrong ones, crashes and hangs become errors."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

from tuner_cases import task_of, workload

DENSE = {"m": 8, "n": 12, "k": 16}


def _fault(config: dict) -> None:
    """Runs in the measuring process before it builds: simulates a crashing or hanging candidate."""
    if config.get("fault") == "exit":
        os._exit(7)
    if config.get("fault") == "hang":
        time.sleep(120)


@pytest.fixture(scope="module")
def setup():
    import cloudpickle

    import tuner_cases
    from tuner import LocalMeasurer, LoopSpace

    # the child process cannot import the test modules: send their functions by value
    cloudpickle.register_pickle_by_value(__import__(__name__))
    cloudpickle.register_pickle_by_value(tuner_cases)
    wl = workload("dense", DENSE)
    task = task_of(wl)
    space = LoopSpace(wl.prim_func)
    measurer = LocalMeasurer(timeout_s=10, min_repeat_ms=5, child_hook=_fault)
    yield wl, task, space, measurer
    measurer.close()


def _good(space):
    from tuner import Candidate

    config = space.sample(np.random.default_rng(0), 1)[0]
    return Candidate(config, space.apply(config).mod)


def test_correct_candidate_is_timed_and_baseline_known(setup):
    wl, task, space, measurer = setup
    result = measurer.measure_one(task, _good(space))
    assert result.error is None, result.error
    assert len(result.latencies_ms) == 3 and all(x > 0 for x in result.latencies_ms)
    assert measurer.baseline_ms(task) > 0


def test_wrong_program_is_an_error(setup):
    from tvm import te

    from tuner import Candidate

    wl, task, space, measurer = setup
    data = te.placeholder((8, 16), name="data")
    weight = te.placeholder((12, 16), name="weight")
    k = te.reduce_axis((0, 16), name="k")
    # transposed operand: same signature, wrong numbers
    out = te.compute((8, 12), lambda i, j: te.sum(data[i, k] * weight[(j + 1) % 12, k], axis=k), name="out")
    wrong = te.create_prim_func([data, weight, out]).with_attr("global_symbol", "main")
    import tvm

    result = measurer.measure_one(task, Candidate({"wrong": 1}, tvm.IRModule({"main": wrong})))
    assert result.latencies_ms is None
    assert result.error.startswith("wrong result: max abs diff"), result.error


@pytest.mark.tunes
@pytest.mark.parametrize("fault,message", [("exit", "crashed"), ("hang", "timed out")])
def test_crash_and_hang_become_errors_and_the_worker_recovers(setup, fault, message):
    from tuner import Candidate

    wl, task, space, measurer = setup
    good = _good(space)
    started = time.monotonic()
    result = measurer.measure_one(task, Candidate({**good.config, "fault": fault}, good.mod))
    assert result.latencies_ms is None and message in result.error, result.error
    assert time.monotonic() - started < 40
    after = measurer.measure_one(task, good)
    assert after.error is None, after.error


def test_broken_reference_makes_every_candidate_an_error(setup):
    from tuner import LocalMeasurer

    wl, task, space, _ = setup
    # expected output of the wrong shape: nothing can match it
    bad_task = task_of(wl, expected=np.zeros((3, 3), dtype="float32"))
    with LocalMeasurer(timeout_s=10, min_repeat_ms=5) as measurer:
        result = measurer.measure_one(bad_task, _good(space))
    assert result.error is not None and "shape" in result.error, result.error


@pytest.mark.tunes
def test_a_batch_built_ahead_is_measured_like_one_built_alone(setup):
    """Builds together, then runs one at a time: wrong, crashing and hanging builds become errors of their
    own candidates only, and no library outlives its measurement."""
    from tuner import Candidate

    wl, task, space, measurer = setup
    good = _good(space)
    other = space.sample(np.random.default_rng(1), 1)[0]
    crash = Candidate({**good.config, "fault": "exit"}, space.apply(good.config).mod)
    hang = Candidate({**good.config, "fault": "hang"}, space.apply(good.config).mod)
    batch = [good, crash, hang, Candidate(other, space.apply(other).mod)]

    measurer.prebuild([(task, c) for c in batch])
    libs = sorted(os.listdir(measurer._lib_dir.name))
    assert len(libs) == 2, libs  # the crash and the hang built nothing
    results = [measurer.measure_one(task, c) for c in batch]

    assert results[0].error is None and len(results[0].latencies_ms) == 3 and results[0].build_s > 0
    assert "building process crashed" in results[1].error, results[1].error
    assert "timed out" in results[2].error and "(build)" in results[2].error, results[2].error
    assert results[3].error is None, results[3].error
    assert os.listdir(measurer._lib_dir.name) == []
    alone = measurer.measure_one(task, good)  # not built ahead: built in the measuring process
    assert alone.error is None and alone.build_s > 0


def test_candidates_are_built_with_the_pipeline_the_spec_asks_for(setup):
    """Every other test here builds with our LICM (the default); `"licm": false` is TVM's pipeline alone."""
    from tuner import LocalMeasurer, build_pipeline

    wl, task, space, _ = setup
    assert build_pipeline({}) == build_pipeline({"licm": True}) == "licm"
    assert build_pipeline({"licm": False}) == "default"
    with LocalMeasurer(timeout_s=10, min_repeat_ms=5, pipeline="default") as measurer:
        result = measurer.measure_one(task, _good(space))
    assert result.error is None and len(result.latencies_ms) == 3, result.error


def _hold_timing_lock(out):
    import time as _time

    from tuner.measurers.child import timing_lock

    with timing_lock():
        start = _time.monotonic()
        _time.sleep(0.3)
        out.put((start, _time.monotonic()))


def test_two_processes_never_time_at_the_same_time():
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_hold_timing_lock, args=(out,)) for _ in range(2)]
    for p in procs:
        p.start()
    spans = sorted(out.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(10)
    assert spans[0][1] <= spans[1][0], f"the two timings overlapped: {spans}"
