"""The dashboard's Devices view: the RPC tracker's queue per key, from `GET /api/v1/devices`.

The tracker's answer is stood in for (`tuner.measurers.rpc.tracker_queue`): a real tracker and server are in
tests/service/test_rpc_devices.py; here the page is under test.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.browser


@pytest.fixture
def settings(sqlite_url, tmp_path):
    from service.settings import Settings

    return Settings(database_url=sqlite_url, data_dir=tmp_path, rpc_tracker="127.0.0.1:9190")


def test_devices_page_shows_the_tracker_queue(api_server, page, screenshots, monkeypatch):
    import tuner.measurers.rpc
    from tuner.measurers.rpc import DeviceQueue

    queue = [DeviceQueue("rasp4", 2, 1, 3), DeviceQueue("x86-avx2", 1, 1, 0)]
    monkeypatch.setattr(tuner.measurers.rpc, "tracker_queue", lambda address, timeout_s=5.0: queue)
    page.goto(f"{api_server.url}/")
    page.click("nav a[data-nav='devices']")
    page.wait_for_selector("#devices-table tbody tr")
    assert page.title().startswith("Devices")
    rows = [[c.inner_text() for c in r.locator("td").all()] for r in page.locator("#devices-table tbody tr").all()]
    assert rows == [["rasp4", "2", "1", "3"], ["x86-avx2", "1", "1", "0"]]
    assert "Tracker 127.0.0.1:9190: 2 keys" in page.locator("[role=status]").inner_text()
    screenshots(page, "devices")

    def unreachable(address, timeout_s=5.0):
        raise ConnectionError(f"the RPC tracker at {address} does not answer: refused")

    monkeypatch.setattr(tuner.measurers.rpc, "tracker_queue", unreachable)
    page.reload()
    page.wait_for_selector("text=Could not load devices")
    assert "does not answer" in page.locator("[role=status]").inner_text()
