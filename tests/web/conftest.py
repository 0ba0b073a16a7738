"""Fixtures for the dashboard and event-stream tests: an API-only server, a stand-in tuner, a headless chromium."""

from __future__ import annotations

import os
import random
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

CHROMIUM = os.environ.get("ALTUNE_TEST_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
SCREENSHOTS = Path(__file__).resolve().parents[2] / "test-output" / "screenshots"


# -- servers -------------------------------------------------------------------------------------------------


class ApiServer:
    """The real API on a loopback port, without a worker: tests write the rows a worker would."""

    def __init__(self, settings) -> None:
        import uvicorn

        from service.api import create_app
        self.settings = settings
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(
            uvicorn.Config(create_app(settings), host="127.0.0.1", port=self.port, log_level="warning",
                           timeout_graceful_shutdown=2)
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> ApiServer:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline, "server did not start in 30 s"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(30)


@pytest.fixture
def fast_events(monkeypatch):
    """Streams poll every 0.1 s instead of 0.5 s, so tests wait less."""
    from service.api import events

    monkeypatch.setattr(events, "POLL_SECONDS", 0.1)
    return events


@pytest.fixture
def api_server(settings, fast_events) -> Iterator[ApiServer]:
    """Open to anonymous reads and writes (the dashboard's token is tested by test_dashboard_keeps_the_token)."""
    with ApiServer(settings.model_copy(update={"anonymous": "all"})) as server:
        yield server


@pytest.fixture
def auth_api_server(settings, fast_events) -> Iterator[ApiServer]:
    """Auth on (the default): `auth_api_server.token` is an admin token."""
    from service.db import session_scope
    from service.tokens import create_token

    with session_scope(settings.resolved_database_url) as session:
        _, token = create_token(session, "admin", "browser")
    with ApiServer(settings) as server:
        server.token = token
        yield server


# -- a stand-in tuner with a steady pace and both stages ---------------------------------------------------------------------

FAKE_TRIAL_SECONDS = 0.35
FAKE_LAYOUT = "N H/4 W/16 O/16 4 16 16"


def _fake_tune(task, budget: int, *, seed: int = 0, prior: Sequence = (), start_from: Sequence[dict] = (),
               on_trial: Callable = lambda t: None, should_stop: Callable[[], bool] = lambda: False,
               measurer=None):
    """Emits plausible trials at a steady pace: a joint stage with layouts, then loop-only, a few errors."""
    from tuner import Trial, TuneResult

    rng = random.Random(seed)
    trials = list(prior)
    for i in range(len(trials), budget):
        if should_stop():
            break
        time.sleep(FAKE_TRIAL_SECONDS)
        stage = "joint" if i < budget // 2 else "loop"
        config = {"tile_i": rng.choice([1, 2, 4, 8, 16]), "tile_j": rng.choice([4, 8, 16, 32]),
                  "unroll": rng.choice([0, 16, 64])}
        error = None
        latencies = None
        if i % 5 == 3:
            error = "timeout: the candidate ran longer than 10.0 s" if i % 10 == 3 else (
                "wrong result: max abs difference 0.37 > 1e-4\nat output[3, 7]")
        else:
            lat = 0.05 * (0.93 ** i) * rng.uniform(1.0, 1.6)
            latencies = [lat, lat * 1.01, lat * 0.99]
        trial = Trial(index=i, config=config, latencies_ms=latencies, error=error, predicted=rng.random(),
                       stage=stage, extra={"layout": FAKE_LAYOUT})  # loop-only keeps the best layout
        on_trial(trial)
        trials.append(trial)
    measured = [t for t in trials if t.latency_ms is not None]
    best = min(measured, key=lambda t: t.latency_ms) if measured else None
    return TuneResult(best=best, trials=trials, baseline_ms=0.4)


def _fake_apply_config(task, config: dict):
    import tvm

    return tvm.IRModule({"main": task.prim_func})


@pytest.fixture
def tuner_kind(monkeypatch) -> str:
    """'real', or with ALTUNE_TEST_FAKE_TUNER=1 a stand-in that paces trials (joint then loop stage, some errors)."""
    import tuner

    if os.environ.get("ALTUNE_TEST_FAKE_TUNER") != "1":
        return "real"
    monkeypatch.setattr(tuner, "tune", _fake_tune, raising=False)
    monkeypatch.setattr(tuner, "apply_config", _fake_apply_config, raising=False)
    return "fake"


# -- the browser ---------------------------------------------------------------------------------------------


def _browser_skip_reason() -> str | None:
    if not Path(CHROMIUM).exists():
        return (f"no chromium at {CHROMIUM}: run scripts/install-chromium.sh (apt-get install chromium); "
                "`playwright install` cannot download here")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install -e '.[dev]')"
    return None


@pytest.fixture(scope="session")
def browser():
    reason = _browser_skip_reason()
    if reason:
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.when == "call":
        item.call_failed = report.failed
    return report


@pytest.fixture
def page(browser, request):
    """A fresh tab at laptop size; fails the test on any uncaught script error; a screenshot if the test failed."""
    context = browser.new_context(viewport={"width": 1280, "height": 900}, accept_downloads=True)
    context.set_default_timeout(20_000)
    tab = context.new_page()
    errors: list[str] = []
    tab.on("pageerror", lambda e: errors.append(str(e)))
    # shown by pytest when a test fails
    tab.on("console", lambda m: print(f"console {m.type}: {m.text}"))
    tab.on("requestfailed", lambda r: print(f"request failed: {r.method} {r.url} {r.failure}"))
    yield tab
    if getattr(request.node, "call_failed", False):
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        tab.screenshot(path=str(SCREENSHOTS / f"FAILED-{request.node.name}.png"), full_page=True)
    context.close()
    assert not errors, f"script errors in the page: {errors}"


@pytest.fixture(scope="session")
def screenshots() -> Callable:
    """shot(page, name): a full-page PNG under test-output/screenshots/."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)

    def shot(tab, name: str) -> Path:
        path = SCREENSHOTS / f"{name}.png"
        tab.screenshot(path=str(path), full_page=True)
        return path

    return shot
