"""Fixtures for the dashboard and event-stream tests: an API-only server, a stand-in tuner, a headless chromium."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support.auth import new_token, open_to_all
from support.servers import LiveServer

from service.api import events

CHROMIUM = os.environ.get("ALTUNE_TEST_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
SCREENSHOTS = Path(__file__).resolve().parents[2] / "test-output" / "screenshots"


# -- servers -------------------------------------------------------------------------------------------------


@pytest.fixture
def fast_events(monkeypatch):
    """Streams poll every 0.1 s instead of 0.5 s, so tests wait less."""
    monkeypatch.setattr(events, "POLL_SECONDS", 0.1)
    return events


@pytest.fixture
def api_server(settings, fast_events) -> Iterator[LiveServer]:
    """The real API without a worker (tests write the rows a worker would), open to anonymous reads and writes
    (the dashboard's token is tested by test_dashboard_keeps_the_token)."""
    with LiveServer(open_to_all(settings), worker=False) as server:
        yield server


@pytest.fixture
def auth_api_server(settings, fast_events) -> Iterator[LiveServer]:
    """Auth on (the default): `auth_api_server.token` is an admin token."""
    token = new_token(settings.resolved_database_url, "admin", "browser")
    with LiveServer(settings, worker=False) as server:
        server.token = token
        yield server


@pytest.fixture
def tuner_kind(monkeypatch) -> str:
    """'real', or with ALTUNE_TEST_FAKE_TUNER=1 a stand-in that paces trials (joint then loop stage, some errors:
    support.fake_tuner)."""
    if os.environ.get("ALTUNE_TEST_FAKE_TUNER") != "1":
        return "real"
    import tuner  # TVM: only where the stand-in replaces the real search
    from support import fake_tuner

    monkeypatch.setattr(tuner, "tune", fake_tuner.fake_tune, raising=False)
    monkeypatch.setattr(tuner, "apply_config", fake_tuner.fake_apply_config, raising=False)
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
