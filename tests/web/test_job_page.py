"""A model job's page in a real browser: the end-to-end latency against torch eager and torch.compile first, the tasks
by their share of the model's time with schedules on demand, a page of reasonable height; a failed or cancelled
job shows no best latency, on its page or in the jobs list.

The rows are written as a worker writes them (`service.model_worker`): a ResNet-50-sized task list (40 tasks) and a
report with the latencies `tuner.model.serve_model` records.
"""

from __future__ import annotations

import random
from datetime import timedelta

import pytest

from service.db import session_scope, utcnow
from service.models import Job, TrialRow, TuningTask

pytestmark = pytest.mark.browser

KINDS = ["fused_conv2d_NCHWc_add_relu", "fused_conv2d_NCHWc_add", "fused_conv2d_NCHWc_add_add_relu",
         "fused_dense_add", "fused_max_pool2d", "fused_adaptive_avg_pool2d"]
TASKS = 40
# px at 1280 wide: the headline, 40 tasks' rows, the chart and a page of 50 trials, a line each; no keys or schedules
MAX_PAGE_HEIGHT = 5000


@pytest.fixture
def settings(sqlite_url, tmp_path):
    """SQLite only: the page is under test (the stream tests cover both backends)."""
    from service.settings import Settings

    return Settings(database_url=sqlite_url, data_dir=tmp_path)


def _config(rng: random.Random) -> dict:
    """A loop schedule as `tuner.spaces.loop` writes one: some twenty knobs."""
    tiles = {f"tile.{axis}.{level}": rng.choice([1, 2, 4, 8, 16]) for axis in "nchw" for level in (1, 2, 3)}
    return tiles | {"tile.rc.1": rng.choice([1, 4, 16]), "order": rng.randrange(6), "parallel": 1, "vectorize": 1,
                    "unroll": rng.choice([0, 16, 64]), "epilogue_at": 2, "cache_write": 1}


def _model_job(url: str, *, status: str, report: dict | None, best_latency_ms: float | None,
               error: str | None = None) -> tuple[int, list[tuple[str, float]]]:
    """A model job with `TASKS` tasks and two trials each: its id and its tasks' (name #index, calls x latency)."""
    rng = random.Random(7)
    now = utcnow()
    spec = {"kind": "model", "source": "zoo", "model": "resnet50", "input_shapes": [[1, 3, 224, 224]], "target": "host",
            "layout": "blocked", "fusion": "none", "budget": 2000, "seed": 0}
    with session_scope(url) as s:
        job = Job(kind="model", name="resnet50", spec=spec, target="host", budget=2000, status=status,
                  trials_done=2 * TASKS, best_latency_ms=best_latency_ms, error=error, report=report, attempts=1,
                  baseline_ms=204.0 if status == "succeeded" else None, started_at=now - timedelta(minutes=30),
                  finished_at=None if status == "running" else now, worker_id="w1",
                  lease_expires_at=now + timedelta(hours=1) if status == "running" else None)
        s.add(job)
        s.flush()
        shares = []
        for i in range(TASKS):
            kind = KINDS[i % len(KINDS)]
            key = (f"{kind}[x=1x{64 * (1 + i % 8)}x{56 // (1 + i % 4)}x{56 // (1 + i % 4)},w={64 * (1 + i % 8)}x"
                   f"{64 * (1 + i % 3)}x{1 + 2 * (i % 2)}x{1 + 2 * (i % 2)},stride={1 + i % 2},pad={i % 2}]"
                   f":float32:blocked[c={8 * (1 + i % 2)},k={16}]:llvm -mcpu=znver4 -num-cores=16")
            best, untuned, calls = rng.uniform(0.005, 0.9), rng.uniform(1.0, 12.0), rng.choice([1, 1, 2, 3, 5])
            task = TuningTask(job_id=job.id, index=i, name=kind, workload_key=key, weight=calls, budget=50,
                              trials_done=2, best_latency_ms=best, baseline_ms=untuned, best_config=_config(rng))
            s.add(task)
            s.flush()
            for n, (config, ms) in enumerate([(_config(rng), 2 * best), (task.best_config, best)]):
                s.add(TrialRow(job_id=job.id, task_id=task.id, index=n, config=config, latencies_ms=[ms],
                               latency_ms=ms, stage="loop", extra={"layout": ["N", "C/16", "H", "W", "16c"]},
                               created_at=now - timedelta(minutes=20, seconds=-2 * i - n)))
            shares.append((f"{kind} #{i}", best * calls))
        return job.id, shares


def _rows(page) -> list[tuple[str, float]]:
    """The tasks table as shown: (task, share %) per row, top to bottom."""
    rows = page.locator("#tasks-table tr.task")
    return [(r.locator("td").nth(1).inner_text().strip(), float(r.get_attribute("data-share")))
            for r in rows.all()]


def test_model_job_leads_with_latency_against_torch_and_lists_tasks_by_share(api_server, page, screenshots):
    url = api_server.settings.resolved_database_url
    report = {"latency_ms": {"artifact": 4.0, "untuned": 204.0, "torch_eager": 20.0, "torch_compile": 8.0},
              "torch_ms": {"eager": 20.0, "compile": 8.0}, "served": "tuned",
              "check": {"passed": True, "removed_schedules": [], "mismatches": []}}
    job_id, shares = _model_job(url, status="succeeded", report=report, best_latency_ms=4.0)
    page.goto(f"{api_server.url}/jobs/{job_id}")
    page.wait_for_selector("#tasks-table tbody tr")

    # the headline: the artifact end to end, and how many times faster than torch eager and torch.compile
    assert page.locator("#headline-latency").inner_text() == "4.000 ms"
    assert page.locator("#vs-eager").inner_text() == "5.00× vs torch eager (20.00 ms)"
    assert page.locator("#vs-compile").inner_text() == "2.00× vs torch.compile (8.000 ms)"
    assert "204.0 ms" in page.locator("#headline-untuned").inner_text()  # the untuned build: a secondary fact
    assert "51" not in page.locator(".headline-vs").inner_text()  # no speedup against the untuned build up front
    top = {name: page.locator(name).bounding_box()["y"] for name in ("#job-headline", "#tasks-table", "#trial-chart")}
    assert top["#job-headline"] < top["#tasks-table"] < top["#trial-chart"], top

    # the tasks by their share of the model's time (calls x best latency), largest first
    shown = _rows(page)
    assert len(shown) == TASKS
    total = sum(ms for _, ms in shares)
    expected = sorted(shares, key=lambda s: -s[1])
    assert [name for name, _ in shown] == [name for name, _ in expected]
    assert [pct for _, pct in shown] == pytest.approx([100 * ms / total for _, ms in expected], rel=1e-6)
    assert sum(pct for _, pct in shown) == pytest.approx(100)

    # nothing of the schedules or the keys until asked; a page of reasonable height
    assert page.locator("pre.config").count() == 0
    assert "tile.n.1" not in "".join(page.locator("#job-headline, .facts, section.tasks").all_inner_texts())
    assert page.locator("#task-keys").get_attribute("open") is None
    assert page.locator("#task-keys ol.keys").is_hidden()
    height = page.evaluate("document.documentElement.scrollHeight")
    assert height < MAX_PAGE_HEIGHT, height
    screenshots(page, "job-model")

    # a task's schedule when asked, in a row under the task's
    page.locator("#tasks-table tr.task").first.locator("button").click()
    config = page.locator("#tasks-table tr.task + tr.schedule-row pre.config")
    config.wait_for()
    assert '"tile.n.1"' in config.inner_text()
    assert "16c" in page.locator("tr.schedule-row code.layout").inner_text()
    assert page.locator("pre.config").count() == 1
    page.click("#task-keys summary")
    assert page.locator("#task-keys ol.keys li").count() == TASKS
    screenshots(page, "job-model-schedule")


def test_running_model_job_shows_the_estimate_as_one(api_server, page):
    url = api_server.settings.resolved_database_url
    job_id, _ = _model_job(url, status="running", report={"torch_ms": {"eager": 20.0, "compile": None}},
                           best_latency_ms=5.0)
    page.goto(f"{api_server.url}/jobs/{job_id}")
    page.wait_for_selector("#headline-latency")
    assert page.locator("#headline-latency").inner_text() == "≈ 5.000 ms"
    assert "Estimated" in page.locator(".headline-label").inner_text()
    assert page.locator("#vs-eager").inner_text() == "4.00× vs torch eager (20.00 ms)"
    assert page.locator("#vs-compile").inner_text() == "torch.compile: not timed"

    # the estimate moves with the job's stream; a schedule that was opened stays open
    page.locator("#tasks-table tr.task").first.locator("button").click()
    page.wait_for_selector("tr.schedule-row pre.config")
    with session_scope(url) as s:
        s.get(Job, job_id).best_latency_ms = 4.0
    page.wait_for_function("document.querySelector('#headline-latency').textContent === '≈ 4.000 ms'")
    assert page.locator("tr.schedule-row pre.config").count() == 1
    page.goto(api_server.url)
    cell = page.locator(f"tr[data-job-id='{job_id}'] td.best")
    cell.wait_for()
    assert cell.inner_text() == "≈ 4.000 ms" and "estimate" in cell.get_attribute("title")


def test_running_model_job_leads_with_its_anytime_build_and_the_time_left(api_server, page):
    url = api_server.settings.resolved_database_url
    report = {"torch_ms": {"eager": 60.0, "compile": 40.0},
              "anytime": {"latency_ms": 50.0, "untuned_ms": 2000.0, "measurements": 0, "served": "tuned",
                          "sources": {"seed": 28, "default": 2}, "build_s": 80.0},
              "progress": {"measurements": 30, "budget": 224, "eta_s": 330.0}}
    job_id, _ = _model_job(url, status="running", report=report, best_latency_ms=45.0)
    page.goto(f"{api_server.url}/jobs/{job_id}")
    page.wait_for_selector("#headline-latency")
    # the anytime build is measured, not an estimate: no "≈"; the tuning's estimate is a note under it
    assert page.locator("#headline-latency").inner_text() == "50.00 ms"
    assert "so far" in page.locator(".headline-label").inner_text()
    assert page.locator("#vs-compile").inner_text() == "0.80× vs torch.compile (40.00 ms)"
    assert "≈ 45.00 ms" in page.locator("#headline-anytime").inner_text()
    assert page.locator("#headline-eta").inner_text() == "30 of 224 measurements; about 6 min left"


def test_failed_and_cancelled_jobs_show_no_best_latency(api_server, page, screenshots):
    url = api_server.settings.resolved_database_url
    # what a model job that failed in its final build leaves: the running estimate in best_latency_ms
    failed, _ = _model_job(url, status="failed", report={"torch_ms": {"eager": 20.0, "compile": 8.0}},
                           best_latency_ms=0.0000396, error="file: building the model needs more than 8589934592 "
                                                             "bytes of memory (the sandbox's limit); refused")
    spec = {"kind": "operator", "operator": "dense", "params": {"m": 64, "n": 64, "k": 64}, "dtype": "float32",
            "epilogue": "none", "target": "host", "budget": 100, "seed": 0}
    with session_scope(url) as s:
        cancelled = Job(kind="operator", name="dense", spec=spec, target="host", budget=100, status="cancelled",
                        trials_done=10, best_latency_ms=0.0123, baseline_ms=0.5, attempts=1, started_at=utcnow(),
                        finished_at=utcnow())
        s.add(cancelled)
        s.flush()
        cancelled_id = cancelled.id

    page.goto(f"{api_server.url}/jobs/{failed}")
    page.wait_for_selector("#job-headline .headline-label")
    assert "needs more than 8589934592 bytes" in page.locator("#job-error").inner_text()
    assert page.locator(".headline-label").inner_text().startswith("Failed: no end-to-end latency")
    assert page.locator("#headline-latency").count() == 0
    assert "0.0396" not in page.locator("main").inner_text()
    assert page.locator("#vs-eager").inner_text() == "torch eager 20.00 ms"  # torch's own, no speedup
    screenshots(page, "job-model-failed")

    page.goto(f"{api_server.url}/jobs/{cancelled_id}")
    page.wait_for_selector("#job-best")
    assert page.locator("#job-best").inner_text() == "—" and page.locator("#job-speedup").inner_text() == "—"
    assert "12.3" not in page.locator(".facts").inner_text()

    page.goto(api_server.url)
    page.wait_for_selector(f"tr[data-job-id='{cancelled_id}']")
    for job_id in (failed, cancelled_id):
        row = page.locator(f"tr[data-job-id='{job_id}']")
        assert row.locator("td.best").inner_text() == "—" and row.locator("td.speedup").inner_text() == "—"
    assert "needs more than" in page.locator(f"tr[data-job-id='{failed}'] .row-error").inner_text()
    assert "0.0396" not in page.locator("#jobs-table").inner_text()
