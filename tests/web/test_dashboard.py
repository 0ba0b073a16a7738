"""The dashboard in a real browser (headless Debian chromium via Playwright) against the real server and a worker.

Screenshots of every view go to test-output/screenshots/ at the repository root.
"""

from __future__ import annotations

import io
import json
import re
import tarfile
import time
from datetime import timedelta

import httpx
import pytest

from service.db import session_scope, utcnow
from service.models import Job, TrialRow, TuningTask

pytestmark = pytest.mark.browser

TINY = {"m": "16", "n": "16", "k": "16"}
TINY_INT = {k: int(v) for k, v in TINY.items()}


@pytest.fixture
def settings(sqlite_url, tmp_path):
    """SQLite only: the browser tests exercise the pages, the stream tests cover both backends."""
    from service.settings import Settings

    return Settings(database_url=sqlite_url, data_dir=tmp_path, lease_seconds=5, poll_seconds=0.2)


def _submit_through_form(page, base: str, operator: str, params: dict[str, str], budget: int) -> None:
    page.goto(f"{base}/submit")
    page.select_option("#f-operator", operator)
    for name, value in params.items():
        page.fill(f"#f-params-{name}", value)
    page.fill("#f-budget", str(budget))
    page.click("#submit-job")


def _job_id(page) -> int:
    page.wait_for_url(re.compile(r"/jobs/\d+$"))
    return int(page.url.rsplit("/", 1)[1])


def _progress(page) -> tuple[int, int]:
    """(progress bar value, points on the chart) as the page shows them now."""
    value = page.locator("#job-progress").get_attribute("value") or "0"
    points = page.locator("#trial-chart").get_attribute("data-points") or "0"
    return int(float(value)), int(points)


@pytest.mark.tunes
def test_submit_watch_download_cancel_validate(live_server, tuner_kind, page, screenshots):
    base = live_server.url

    # the jobs table, empty
    page.goto(base)
    page.wait_for_selector("text=No jobs yet")
    assert page.title() == "Jobs · altune"

    # submit a tiny job through the form generated from the operator catalog
    page.goto(f"{base}/submit")
    assert page.title() == "Submit a job · altune"
    page.select_option("#f-operator", "dense")
    for name, value in TINY.items():
        page.fill(f"#f-params-{name}", value)
    page.fill("#f-budget", "12")
    screenshots(page, "submit")
    page.click("#submit-job")
    first = _job_id(page)
    page.wait_for_function(f"document.title.startsWith('Job {first}: dense')")

    # watch it run: the progress bar and the chart move while it runs, pushed by the event stream
    seen: set[tuple[int, int]] = set()
    shot_running = False
    deadline = time.monotonic() + 240
    while True:
        status = page.locator(".head-status .badge").get_attribute("data-status")
        seen.add(_progress(page))
        if status == "running" and not shot_running and _progress(page)[1] >= 3:
            screenshots(page, "job-running")
            shot_running = True
        if status not in ("queued", "running"):
            break
        assert time.monotonic() < deadline, f"job {first} still {status} after 240 s"
        page.wait_for_timeout(100)
    assert status == "succeeded", page.locator("#job-error").inner_text() if status == "failed" else status
    page.wait_for_function("document.querySelector('#trial-chart')?.dataset.points === '12'")
    assert _progress(page) == (12, 12)
    moving = sorted(seen)
    assert len({v for v, _ in moving if 0 < v < 12}) >= 2, f"the progress bar moved while running: {moving}"
    assert len({p for _, p in moving if 0 < p < 12}) >= 2, f"the chart grew while running: {moving}"
    assert page.locator("#job-best").inner_text() != "—"
    assert page.locator("#job-speedup").inner_text().endswith("×")
    assert page.locator("#trial-chart canvas").count() >= 1

    # the finished job page: best config, TVMScript from the artifact, the trials table (sortable, paged)
    page.reload()
    page.wait_for_selector("#best-config")
    page.wait_for_function("document.querySelector('#trials-page-info')?.textContent.startsWith('1–12 of 12')")
    page.click(".script-box summary")
    page.wait_for_function("document.querySelector('#tvmscript')?.textContent.includes('T.prim_func')")
    assert page.locator("#trials-page-info").inner_text().startswith("1–12 of 12")
    page.click("button[data-sort='latency']")
    latencies = page.locator("#trials-table tbody tr:not(.err) td:nth-child(3)").all_inner_texts()
    assert latencies, "measured trials listed"
    if tuner_kind == "fake":
        assert page.locator("#best-layout").inner_text() == "N H/4 W/16 O/16 4 16 16"
        assert "1 timed out" in page.locator("dl.facts").first.inner_text()  # trial 3 of the stand-in
    screenshots(page, "job-finished")

    # download the artifact: a tar.gz with manifest.json
    with page.expect_download() as info:
        page.click("#download-artifact")
    data = open(info.value.path(), "rb").read()
    assert data[:2] == b"\x1f\x8b", "gzip"
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        assert "manifest.json" in tar.getnames()
        manifest = json.load(tar.extractfile("manifest.json"))
    assert manifest["workload"]["operator"] == "dense"

    # the jobs table shows it finished, with the speedup
    page.click("nav >> text=Jobs")
    row = page.locator(f"tr[data-job-id='{first}']")
    row.wait_for()
    assert row.get_attribute("data-status") == "succeeded"
    assert row.locator("td.speedup").inner_text().endswith("×")

    # a second, long job: it shows up in the live jobs table, then cancel it from its page
    _submit_through_form(page, base, "dense", {"m": "64", "n": "64", "k": "64"}, 2000)
    second = _job_id(page)
    page.click("nav >> text=Jobs")
    page.locator(f"tr[data-job-id='{second}']").wait_for()
    page.wait_for_function(
        f"document.querySelector(\"tr[data-job-id='{second}']\")?.dataset.status === 'running'", timeout=60_000)
    screenshots(page, "jobs")
    page.click(f"tr[data-job-id='{second}'] a")
    page.wait_for_url(f"**/jobs/{second}")
    page.click("#cancel-job")
    page.wait_for_function("document.querySelector('.head-status .badge')?.dataset.status === 'cancelled'",
                           timeout=60_000)
    screenshots(page, "job-cancelled")
    page.click("a:has-text('Tune again')")  # the form, filled from the job's spec
    page.wait_for_selector("#f-params-m")
    assert page.input_value("#f-params-m") == "64" and page.input_value("#f-budget") == "2000"

    # a bad field: the API's 422 is shown beside it
    _submit_through_form(page, base, "conv2d", {"batch": "1", "in_channels": "3", "height": "4", "width": "4",
                                                "out_channels": "8", "kernel": "7"}, 10)
    error = page.locator("[data-error-for='params.kernel']")
    error.wait_for(state="visible")
    assert "kernel" in error.inner_text() or error.inner_text()
    assert page.locator("#f-params-kernel").get_attribute("aria-invalid") == "true"
    screenshots(page, "submit-invalid")
    page.fill("#f-budget", "100000000")
    page.click("#submit-job")
    page.locator("#submit-form [data-error-for='budget']").wait_for(state="visible")
    assert "budget" in page.locator("#submit-form [data-error-for='budget']").inner_text()
    assert page.url.endswith("/submit"), "nothing submitted"

    # schedules: searchable, linking to the job that found the best
    page.goto(f"{base}/schedules?search=dense")
    page.wait_for_selector(f"#schedules-table a[href='/jobs/{first}']")
    assert page.title() == "Schedules matching “dense” · altune"
    page.fill("#schedule-search", "conv3d")
    page.wait_for_selector("text=No schedule matches.")
    page.fill("#schedule-search", "k=16")
    page.wait_for_selector(f"#schedules-table a[href='/jobs/{first}']")
    screenshots(page, "schedules")

    # compare the two jobs on one chart
    page.goto(f"{base}/compare?ids={first},{second}")
    page.wait_for_selector("#compare-chart canvas")
    assert page.locator("#compare-table tbody tr").count() == 2
    screenshots(page, "compare")

    # a phone
    page.set_viewport_size({"width": 390, "height": 844})
    page.goto(f"{base}/jobs/{first}")
    page.wait_for_selector("#best-config")
    page.wait_for_function("document.querySelector('#trials-page-info')?.textContent.startsWith('1–12 of 12')")
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 390 + 1, f"no horizontal scrolling of the page on a phone: {width}px"
    screenshots(page, "job-phone")
    page.goto(base)
    page.locator(f"tr[data-job-id='{first}']").wait_for()
    screenshots(page, "jobs-phone")


def test_unreachable_server_banner_and_keyboard(live_server, page, screenshots):
    base = live_server.url
    page.goto(base)
    page.wait_for_selector("text=No jobs yet")
    assert page.locator("#banner").is_hidden()

    # keyboard: skip link first, then the navigation, reachable with Tab
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent") == "Skip to content"
    page.keyboard.press("Tab")
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent") == "Jobs"
    page.keyboard.press("Tab")
    page.keyboard.press("Enter")
    page.wait_for_url("**/submit")
    page.wait_for_selector("#f-operator")
    assert page.evaluate("document.activeElement.tagName") == "H1", "focus moves to the new view's heading"

    # the server stops answering: a clear banner; it goes when the server is back
    page.route(re.compile(r"/(api/|healthz)"), lambda route: route.abort())
    page.click("nav >> text=Schedules")
    banner = page.locator("#banner")
    banner.wait_for(state="visible")
    assert "Cannot reach the altune server" in banner.inner_text()
    screenshots(page, "unreachable")
    page.unroute(re.compile(r"/(api/|healthz)"))
    banner.wait_for(state="hidden", timeout=15_000)


def test_big_job_loads_in_pages_and_stalled_job_warns(live_server, page, screenshots):
    """Rows written as a worker would: 2500 trials of a finished job, and a running job whose worker went quiet."""
    url = live_server.worker.url
    spec = {"kind": "operator", "operator": "dense", "params": {"m": 256, "n": 256, "k": 256}, "dtype": "float32",
            "epilogue": "none", "target": "host", "budget": 2500, "seed": 0}
    now = utcnow()
    with session_scope(url) as s:
        big = Job(kind="operator", name="dense", spec=spec, target="host", budget=2500, status="succeeded",
                  trials_done=2500, errors=250, best_latency_ms=0.5, baseline_ms=40.0, started_at=now - timedelta(hours=1),
                  finished_at=now, attempts=1)
        stalled = Job(kind="operator", name="dense", spec=spec | {"budget": 100}, target="host", budget=100,
                      status="running", trials_done=3, started_at=now - timedelta(minutes=10), attempts=1,
                      worker_id="ghost", lease_expires_at=now + timedelta(hours=1))
        s.add_all([big, stalled])
        s.flush()
        task = TuningTask(job_id=big.id, index=0, name="dense", workload_key="dense[k=256,m=256,n=256]:float32:none",
                          budget=2500, trials_done=2500, best_latency_ms=0.5, baseline_ms=40.0, best_config={"tile": 7})
        quiet = TuningTask(job_id=stalled.id, index=0, name="dense", workload_key=task.workload_key, budget=100,
                           trials_done=3)
        s.add_all([task, quiet])
        s.flush()
        s.add_all(
            TrialRow(job_id=big.id, task_id=task.id, index=i, config={"tile": i % 13},
                     latencies_ms=None if i % 10 == 9 else [1 + 20 / (i + 1)],
                     latency_ms=None if i % 10 == 9 else 1 + 20 / (i + 1),
                     error="build failed: out of registers" if i % 10 == 9 else None,
                     stage="joint" if i < 1000 else "loop", extra={"layout": ["N", "C/8", "H", "W", "8c"]},
                     created_at=now - timedelta(seconds=3600 - i))
            for i in range(2500)
        )
        s.add_all(
            TrialRow(job_id=stalled.id, task_id=quiet.id, index=i, config={"tile": i}, latencies_ms=[2.0],
                     latency_ms=2.0, stage="loop", extra={}, created_at=now - timedelta(minutes=9, seconds=-i))
            for i in range(3)
        )
        big_id, stalled_id = big.id, stalled.id

    asked: list[str] = []
    page.on("request", lambda r: asked.append(r.url) if "/trials" in r.url else None)
    page.goto(f"{live_server.url}/jobs/{big_id}")
    page.wait_for_selector("h1:has-text('Job #')")  # the header renders before the trials are in
    page.wait_for_function("document.querySelector('#trial-chart')?.dataset.points === '2500'", timeout=30_000)
    page.wait_for_function(
        "document.querySelector('#trials-page-info')?.textContent.startsWith('1–50 of 2500 · page 1 of 50')")
    assert page.locator(".loading-trials").is_hidden()
    assert page.locator("#trial-chart canvas").count() >= 1
    # the chart is the server's (one request), the table one page of 50: nothing pages through the 2500 trials
    assert sum("/trials/chart" in u for u in asked) == 1 and sum("/trials?" in u for u in asked) == 1, asked
    rows = page.locator("#trials-table tbody tr")
    assert rows.count() == 50 and rows.first.locator("td").first.inner_text() == "2499", "newest first"
    page.click("button[aria-label='next page']")
    page.wait_for_function("document.querySelector('#trials-page-info')?.textContent.startsWith('51–100 of 2500')")
    assert "cursor=" in asked[-1], "the next page by cursor"
    assert rows.first.locator("td").first.inner_text() == "2449"
    page.select_option("#trial-filter", "error")
    page.wait_for_function("document.querySelector('#trials-page-info')?.textContent.startsWith('1–50 of 250')")
    assert "status=error" in asked[-1]
    page.click("button[data-sort='latency']")  # fastest first, on the server
    page.select_option("#trial-filter", "ok")
    page.wait_for_function("document.querySelector('#trials-page-info')?.textContent.startsWith('1–50 of 2250')")
    assert "sort=latency" in asked[-1] and "order=asc" in asked[-1]
    assert rows.first.locator("td").nth(2).inner_text() == "1.008 ms"  # 1 + 20 / 2499: the last measured
    assert page.locator("#best-layout").inner_text() == "N C/8 H W 8c"
    screenshots(page, "job-big")

    page.goto(f"{live_server.url}/jobs/{stalled_id}")
    warning = page.locator(".stalled")
    warning.wait_for()
    assert "measured nothing for" in warning.inner_text()
    page.wait_for_function("document.querySelector('#trials-page-info')?.textContent.startsWith('1–3 of 3')")
    screenshots(page, "job-stalled")

    with httpx.Client(base_url=live_server.url) as client:
        assert client.get(f"/api/v1/jobs/{stalled_id}").json()["worker_id"] == "ghost"


def test_submit_model_from_zoo_and_bad_upload(api_server, page, screenshots):
    """The model form: a zoo model becomes a queued model job with its tasks; a bad upload's 422 sits by the file."""
    base = api_server.url
    page.goto(f"{base}/submit")
    page.wait_for_selector("#m-model option[value='small_cnn']", state="attached")
    assert page.is_checked("#m-source-zoo") and page.locator("#m-file").is_hidden()
    page.select_option("#m-model", "small_cnn")
    assert "3×16×16" in page.locator("#m-model-help").inner_text()
    page.select_option("#m-target", "host")
    assert page.input_value("#m-layout") == "blocked"  # graph-level layouts by default
    page.select_option("#m-layout", "none")
    page.fill("#m-budget", "8")
    page.locator("#tune-model").scroll_into_view_if_needed()
    screenshots(page, "submit-model")
    page.click("#submit-model")
    page.wait_for_url(re.compile(r"/jobs/\d+$"), timeout=120_000)  # the server exports and imports the model first
    job_id = int(page.url.rsplit("/", 1)[1])
    page.wait_for_function(f"document.title.startsWith('Job {job_id}: small_cnn')")
    with httpx.Client(base_url=base) as client:
        job = client.get(f"/api/v1/jobs/{job_id}").json()
    assert job["kind"] == "model" and job["status"] == "queued" and job["budget"] == 8, job
    assert job["spec"]["source"] == "zoo" and job["spec"]["model"] == "small_cnn" and job["spec"]["layout"] == "none"
    assert any(t["name"] == "fused_conv2d_add_relu" for t in job["tasks"]), "NCHW tasks, as asked"
    page.locator("#tasks-h").wait_for()
    assert page.locator("#tasks-h").inner_text() == f"Tasks ({len(job['tasks'])})"
    assert page.locator(".tasks-table tbody tr").count() == len(job["tasks"]) >= 2
    page.click("a:has-text('Tune again')")  # the model form, filled from the job's spec
    page.wait_for_selector("#m-model option[value='small_cnn']", state="attached")
    assert page.input_value("#m-model") == "small_cnn" and page.input_value("#m-budget") == "8"
    assert page.input_value("#m-layout") == "none"
    assert page.input_value("#f-budget") == "64", "the operator form keeps its defaults"
    page.click("#jump-model")  # moves within the page, not a route change
    assert page.evaluate("document.activeElement.id") == "tune-model-h" and page.url.endswith(f"?from={job_id}")

    # a few random bytes named x.pt2: the server's 422 is shown beside the file field, and no job is made
    page.goto(f"{base}/submit")
    page.wait_for_selector("#m-source-upload")
    page.check("#m-source-upload")
    assert page.locator("#m-model").is_hidden()
    page.set_input_files("#m-file", files=[{"name": "x.pt2", "mimeType": "application/octet-stream",
                                            "buffer": bytes(range(7, 71))}])
    page.click("#submit-model")
    error = page.locator("#model-form [data-error-for='file']")
    error.wait_for(state="visible")
    assert "not a torch.export program" in error.inner_text()
    assert page.locator("#m-file").get_attribute("aria-invalid") == "true"
    assert page.evaluate("document.activeElement.id") == "m-file", "focus goes to the first field blamed"
    assert page.locator("#m-file ~ [data-error-for='file']").count() == 1, "the error sits in the file's row"
    screenshots(page, "submit-model-invalid")

    # shapes that are not JSON are caught before sending, beside their field
    page.fill("#m-input_shapes", "[[1, 3")
    page.click("#submit-model")
    page.locator("#model-form [data-error-for='input_shapes']").wait_for(state="visible")
    assert page.locator("#model-form [data-error-for='file']").is_hidden()
    with httpx.Client(base_url=base) as client:
        assert client.get("/api/v1/jobs").json()["count"] == 1
    assert page.url.endswith("/submit")

    # the server stops answering: the form says so
    page.route(re.compile(r"/api/v1/models"), lambda route: route.abort())
    page.fill("#m-input_shapes", "")
    page.click("#submit-model")
    page.locator("#model-form .form-summary >> text=The server is unreachable").wait_for()
    page.unroute(re.compile(r"/api/v1/models"))

    # a phone: the form fits the width
    page.set_viewport_size({"width": 390, "height": 844})
    page.goto(f"{base}/submit")
    page.wait_for_selector("#m-source-upload")
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 390 + 1, f"no horizontal scrolling of the submit page on a phone: {width}px"



def test_dashboard_keeps_the_token_for_the_session(auth_api_server, page, screenshots):
    """Auth on: the URL `altune serve` prints carries the token; the page keeps it for the session (out of the
    address bar), sends it with its requests and, as a cookie, with its event streams; without one it asks."""
    base, token = auth_api_server.url, auth_api_server.token
    job = httpx.post(f"{base}/api/v1/jobs", json={"kind": "operator", "operator": "dense", "params": TINY_INT,
                                                  "target": "host", "budget": 4},
                     headers={"Authorization": f"Bearer {token}"}).json()
    page.goto(f"{base}/?token={token}")
    page.locator(f"tr[data-job-id='{job['id']}']").wait_for()
    assert "token" not in page.url and page.evaluate("sessionStorage.getItem('altune_token')") == token
    page.goto(f"{base}/jobs/{job['id']}")  # a new page load: the token comes from sessionStorage
    page.locator("#job-progress-text").wait_for()
    with session_scope(auth_api_server.settings.resolved_database_url) as s:
        s.get(Job, job["id"]).status = "running"  # the job's stream (EventSource, the cookie) shows the change
    page.wait_for_selector(".head-status >> text=running")
    screenshots(page, "job-with-token")

    fresh = page.context.browser.new_context()
    try:
        other = fresh.new_page()
        other.goto(base)
        form = other.locator("#token-form")
        form.wait_for()
        assert "altune token create" in form.inner_text()
        screenshots(other, "token-asked")
        other.fill("#token-input", token)
        other.click("#token-form button")
        other.locator(f"tr[data-job-id='{job['id']}']").wait_for()
    finally:
        fresh.close()
