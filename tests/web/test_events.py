"""The event streams over real HTTP: order, reconnection with Last-Event-ID, the end of a job, the jobs list.

A real uvicorn serves the API (no worker); the tests write the rows a worker would, with the same statements.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import queue
import socket
import threading
import time
from dataclasses import dataclass

import httpx
import pytest
from sqlalchemy import update
from support.auth import bearer, new_token
from support.jobs import add_job, finish_job
from support.servers import LiveServer

from service.api import events
from service.db import session_scope, utcnow
from service.models import Job, Token, TrialRow, TuningTask
from service.tokens import revoke_token

DENSE = {"kind": "operator", "operator": "dense", "params": {"m": 32, "n": 32, "k": 32}, "dtype": "float32",
         "epilogue": "none", "target": "host", "budget": 6, "seed": 0}


@dataclass
class Event:
    event: str
    data: dict | None
    id: str | None


class Stream:
    """Reads a server-sent event stream in a thread; `next()` returns parsed events (comments as 'comment')."""

    def __init__(self, url: str, headers: dict | None = None, params: dict | None = None) -> None:
        self.events: queue.Queue[Event | None] = queue.Queue()
        self.status: int | None = None
        self.content_type: str | None = None
        self._client = httpx.Client(timeout=httpx.Timeout(10, read=60))
        self._ready = threading.Event()
        self._response: httpx.Response | None = None
        self._thread = threading.Thread(target=self._read, args=(url, headers or {}, params or {}), daemon=True)
        self._thread.start()
        assert self._ready.wait(10), "no response headers in 10 s"

    def _read(self, url, headers, params) -> None:
        try:
            with self._client.stream("GET", url, headers=headers, params=params) as r:
                self._response = r
                self.status, self.content_type = r.status_code, r.headers.get("content-type")
                self._ready.set()
                fields: dict[str, str] = {}
                for line in r.iter_lines():
                    if line == "":
                        if fields:
                            data = fields.get("data")
                            self.events.put(Event(fields.get("event", "message"), json.loads(data) if data else None,
                                                  fields.get("id")))
                        fields = {}
                    elif line.startswith(":"):
                        self.events.put(Event("comment", {"text": line[1:].strip()}, None))
                    else:
                        name, _, value = line.partition(":")
                        fields[name] = value[1:] if value.startswith(" ") else value
        except (httpx.HTTPError, RuntimeError, OSError, ValueError):
            pass  # closed from `close()`
        finally:
            self._ready.set()
            self.events.put(None)  # closed

    def next(self, timeout: float = 10, skip_comments: bool = True) -> Event | None:
        deadline = time.monotonic() + timeout
        while True:
            ev = self.events.get(timeout=max(deadline - time.monotonic(), 0.01))
            if ev is None or not (skip_comments and ev.event == "comment"):
                return ev

    def until(self, predicate, timeout: float = 10) -> list[Event]:
        """Events up to and including the first that satisfies `predicate`."""
        seen = []
        deadline = time.monotonic() + timeout
        while True:
            ev = self.next(max(deadline - time.monotonic(), 0.01))
            assert ev is not None, f"stream closed before the expected event; got {seen}"
            seen.append(ev)
            if predicate(ev):
                return seen

    def close(self) -> None:
        """Drops the connection, as a client going away does (the reading thread sees the socket close)."""
        if self._response is not None:
            # shutting the socket down wakes the reader blocked in recv(); closing the response would not
            sock = self._response.extensions["network_stream"].get_extra_info("socket")
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self._client.close()
        self._thread.join(5)
        assert not self._thread.is_alive(), "the stream reader did not stop"


def _submit(server) -> int:
    r = httpx.post(f"{server.url}/api/v1/jobs", json=DENSE)
    assert r.status_code == 201, r.text
    return r.json()["id"]


def _start(url: str, job_id: int) -> int:
    """What a worker does on claiming: running, with a lease, and the job's task."""
    with session_scope(url) as s:
        s.execute(update(Job).where(Job.id == job_id).values(status="running", worker_id="test-worker",
                                                            started_at=utcnow(), attempts=1))
        task = TuningTask(job_id=job_id, index=0, name="dense", workload_key="dense[k=32,m=32,n=32]:float32:none",
                          weight=1, budget=DENSE["budget"])
        s.add(task)
        s.flush()
        return task.id


def _record(url: str, job_id: int, task_id: int, index: int, latency: float | None, stage: str = "loop") -> int:
    """What a worker does per trial: the trial row and the job's progress, in one transaction."""
    with session_scope(url) as s:
        s.execute(update(Job).where(Job.id == job_id).values(trials_done=Job.trials_done + 1,
                                                            errors=Job.errors + int(latency is None)))
        row = TrialRow(job_id=job_id, task_id=task_id, index=index, config={"tile": index},
                       latencies_ms=None if latency is None else [latency], latency_ms=latency,
                       error="timeout: ran longer than 10 s" if latency is None else None, stage=stage, extra={})
        s.add(row)
        s.flush()
        return row.id


def test_job_stream_snapshot_then_trials_in_order_then_end(api_server):
    url = api_server.settings.resolved_database_url
    job_id = _submit(api_server)
    stream = Stream(f"{api_server.url}/api/v1/jobs/{job_id}/events")
    try:
        assert stream.status == 200 and stream.content_type.startswith("text/event-stream")
        first = stream.next()
        assert first.event == "job" and first.data["id"] == job_id and first.data["status"] == "queued"
        assert first.id == "0", "the cursor of a job without trials"

        task_id = _start(url, job_id)
        running = stream.until(lambda e: e.event == "job" and e.data["status"] == "running")[-1]
        assert running.data["tasks"][0]["id"] == task_id

        ids = [_record(url, job_id, task_id, i, None if i == 2 else 2.0 - 0.1 * i, "joint" if i < 3 else "loop")
               for i in range(6)]
        finish_job(url, job_id)
        events = stream.until(lambda e: e.event == "end", timeout=15)
        assert stream.next() is None, "the stream closes after `end`"
    finally:
        stream.close()

    trials = [e for e in events if e.event == "trial"]
    assert [int(e.id) for e in trials] == ids, "every trial once, in measurement order"
    assert [e.data["index"] for e in trials] == list(range(6))
    assert trials[2].data["error"] and trials[2].data["latency_ms"] is None
    assert [e.data["stage"] for e in trials] == ["joint"] * 3 + ["loop"] * 3
    jobs = [e.data for e in events if e.event == "job"]
    done = [j["trials_done"] for j in jobs]
    assert done == sorted(done), f"snapshots never go back: {done}"
    assert jobs[-1]["status"] == "succeeded" and jobs[-1]["trials_done"] == 6 and jobs[-1]["errors"] == 1
    assert events[-1].data == {"status": "succeeded"} and events[-1].id == str(ids[-1])
    # a snapshot follows the trials it counts: no job event counts a trial that was not sent before it
    sent = 0
    for e in events:
        sent += e.event == "trial"
        if e.event == "job":
            assert e.data["trials_done"] <= sent, f"{e.data['trials_done']=} > {sent=}"


def test_reconnect_with_last_event_id_gets_current_state_and_only_missed_trials(api_server):
    url = api_server.settings.resolved_database_url
    job_id = _submit(api_server)
    task_id = _start(url, job_id)
    index = itertools.count()
    first = Stream(f"{api_server.url}/api/v1/jobs/{job_id}/events")
    try:
        assert first.next().event == "job"
        seen = [_record(url, job_id, task_id, next(index), 3.0) for _ in range(2)]
        got = first.until(lambda e: e.event == "trial" and e.id == str(seen[-1]))
        assert [int(e.id) for e in got if e.event == "trial"] == seen
    finally:
        first.close()  # the connection drops

    last_seen = str(seen[-1])
    for how in ("header", "query"):
        missed = [_record(url, job_id, task_id, next(index), 1.0) for _ in range(2)]  # while disconnected
        cursor = {"headers": {"Last-Event-ID": last_seen}} if how == "header" else {"params": {"last_event_id": last_seen}}
        again = Stream(f"{api_server.url}/api/v1/jobs/{job_id}/events", **cursor)
        try:
            snap = again.next()
            assert snap.event == "job", "a reconnecting client gets the current state first"
            assert snap.data["status"] == "running" and snap.data["trials_done"] == len(seen) + len(missed)
            assert snap.id == last_seen
            trials = [again.next(), again.next()]
            assert [t.event for t in trials] == ["trial", "trial"]
            assert [int(t.id) for t in trials] == missed, f"only the missed trials, not {seen}"
        finally:
            again.close()
        seen += missed
        last_seen = str(seen[-1])


def test_replay_all_trials_and_finished_job_stream_ends_at_once(api_server):
    url = api_server.settings.resolved_database_url
    job_id = _submit(api_server)
    task_id = _start(url, job_id)
    ids = [_record(url, job_id, task_id, i, 1.0) for i in range(3)]
    finish_job(url, job_id, "cancelled")
    stream = Stream(f"{api_server.url}/api/v1/jobs/{job_id}/events", params={"last_event_id": 0})
    try:
        events = stream.until(lambda e: e.event == "end")
        assert stream.next() is None
    finally:
        stream.close()
    assert [e.event for e in events] == ["job", "trial", "trial", "trial", "end"]
    assert [int(e.id) for e in events[1:4]] == ids and events[0].data["status"] == "cancelled"
    assert events[-1].data == {"status": "cancelled"}


def test_unknown_job_is_404_and_bad_cursor_400(api_server):
    r = httpx.get(f"{api_server.url}/api/v1/jobs/999/events")
    assert r.status_code == 404 and r.json()["detail"] == "job 999 not found"
    job_id = _submit(api_server)
    r = httpx.get(f"{api_server.url}/api/v1/jobs/{job_id}/events", headers={"Last-Event-ID": "nope"})
    assert r.status_code == 400 and "Last-Event-ID" in r.json()["detail"]


def test_heartbeat_comment_when_nothing_happens(api_server, monkeypatch):
    from service.api import events

    monkeypatch.setattr(events, "HEARTBEAT_SECONDS", 0.3)
    job_id = _submit(api_server)
    stream = Stream(f"{api_server.url}/api/v1/jobs/{job_id}/events")
    try:
        assert stream.next().event == "job"
        ping = stream.next(skip_comments=False)
        assert ping.event == "comment" and ping.data == {"text": "ping"}
    finally:
        stream.close()


def test_jobs_stream_pushes_each_change(api_server):
    url = api_server.settings.resolved_database_url
    old = _submit(api_server)  # exists before connecting: not replayed
    stream = Stream(f"{api_server.url}/api/v1/events")
    try:
        assert stream.status == 200 and stream.content_type.startswith("text/event-stream")
        time.sleep(0.3)
        new = _submit(api_server)
        created = stream.until(lambda e: e.event == "job")[-1]
        assert created.data["id"] == new and created.data["status"] == "queued"
        task_id = _start(url, old)
        _record(url, old, task_id, 0, 1.5)
        progressed = stream.until(lambda e: e.event == "job" and e.data["id"] == old and e.data["trials_done"] == 1)
        assert all(e.data["id"] in (old, new) for e in progressed if e.event == "job")
        r = httpx.post(f"{api_server.url}/api/v1/jobs/{new}/cancel")
        assert r.status_code == 200
        cancelled = stream.until(lambda e: e.event == "job" and e.data["id"] == new)[-1]
        assert cancelled.data["status"] == "cancelled"
        watermark = cancelled.id
    finally:
        stream.close()

    # reconnecting with the last id: only jobs changed since (within the overlap window, resent at most)
    finish_job(url, old)
    again = Stream(f"{api_server.url}/api/v1/events", headers={"Last-Event-ID": watermark})
    try:
        finished = again.until(lambda e: e.event == "job" and e.data["id"] == old and e.data["status"] == "succeeded")
        assert all(e.data["id"] in (old, new) for e in finished if e.event == "job")
    finally:
        again.close()


@pytest.mark.parametrize("path", ["/", "/jobs/1", "/submit", "/schedules", "/compare"])
def test_dashboard_pages_and_assets_are_served(client, path):
    r = client.get(path)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert '<script type="module" src="/static/app.js">' in r.text
    for asset in ("/static/app.js", "/static/views/job.js", "/vendor/uPlot.esm.js", "/static/style.css"):
        a = client.get(asset)
        assert a.status_code == 200, asset
        assert a.headers["cache-control"] == "no-cache"


# -- caps, revoked tokens, replay in pages -------------------------------------------------------------------


@pytest.fixture
def capped_server(settings, fast_events):
    """Auth on, at most 3 streams open and 2 per token."""
    capped = settings.model_copy(update={"max_streams": 3, "max_streams_per_token": 2})
    with LiveServer(capped, worker=False) as server:
        yield server


def _refusal(url: str, token: str) -> httpx.Response | None:
    """The answer to opening a stream when it is refused; None when it opens (it is closed again at once)."""
    with httpx.Client(timeout=10) as client, client.stream("GET", url, headers=bearer(token)) as r:
        if r.status_code == 200:
            return None
        r.read()
        return r


def test_streams_over_a_cap_are_refused_and_a_closed_one_frees_its_slot(capped_server):
    url, base = capped_server.settings.resolved_database_url, capped_server.url
    alice, bob = new_token(url, "read", "alice"), new_token(url, "read", "bob")
    job_id = add_job(url, DENSE)
    mine = [Stream(f"{base}/api/v1/jobs/{job_id}/events", headers=bearer(alice)),
            Stream(f"{base}/api/v1/events", headers=bearer(alice))]
    theirs: list[Stream] = []
    try:
        assert [s.status for s in mine] == [200, 200] and mine[0].next().event == "job"
        refused = _refusal(f"{base}/api/v1/jobs/{job_id}/events", alice)
        assert refused is not None and refused.status_code == 429 and refused.headers["retry-after"]
        detail = refused.json()["detail"]
        assert "token 'alice' has 2 event streams open" in detail and "ALTUNE_MAX_STREAMS_PER_TOKEN=2" in detail

        theirs.append(Stream(f"{base}/api/v1/events", headers=bearer(bob)))  # the third: the server's cap
        assert theirs[0].status == 200
        refused = _refusal(f"{base}/api/v1/events", bob)
        assert refused is not None and refused.status_code == 429
        assert "the server has 3 event streams open" in refused.json()["detail"]
        assert "raise ALTUNE_MAX_STREAMS" in refused.json()["detail"]

        mine.pop(0).close()  # a client goes away: its slot comes back
        deadline = time.monotonic() + 10
        while _refusal(f"{base}/api/v1/events", bob) is not None:
            assert time.monotonic() < deadline, "the closed stream's slot never came back"
            time.sleep(0.1)
        # a refused request and a 404 hold no slot either
        assert httpx.get(f"{base}/api/v1/jobs/99999/events", headers=bearer(bob)).status_code == 404
        assert _refusal(f"{base}/api/v1/events", bob) is None
    finally:
        for s in mine + theirs:
            s.close()


def _until_closed(stream: Stream, timeout: float = 10) -> list[Event]:
    """Every event and comment until the server ends the stream."""
    seen: list[Event] = []
    deadline = time.monotonic() + timeout
    while (ev := stream.next(max(deadline - time.monotonic(), 0.01), skip_comments=False)) is not None:
        seen.append(ev)
        assert time.monotonic() < deadline, f"the stream is still open: {seen[-5:]}"
    return seen


def test_streams_of_a_revoked_or_deleted_token_end(capped_server, monkeypatch):
    from service.api import stream_limits

    monkeypatch.setattr(stream_limits, "TOKEN_CHECK_SECONDS", 0.2)
    url, base = capped_server.settings.resolved_database_url, capped_server.url
    carol, dave = new_token(url, "read", "carol"), new_token(url, "read", "dave")
    job_id = add_job(url, DENSE)
    job_stream = Stream(f"{base}/api/v1/jobs/{job_id}/events", headers=bearer(carol))
    list_stream = Stream(f"{base}/api/v1/events", headers=bearer(dave))
    try:
        assert job_stream.next().event == "job" and list_stream.status == 200
        time.sleep(0.5)
        assert None not in list(job_stream.events.queue) + list(list_stream.events.queue), \
            "a valid token's streams stay open"
        with session_scope(url) as s:
            revoke_token(s, "carol")
            s.delete(Token.find_by_id_or_name(s, "dave"))
        for stream in (job_stream, list_stream):
            seen = _until_closed(stream)
            assert seen[-1].event == "comment" and "token was revoked" in seen[-1].data["text"]
    finally:
        job_stream.close()
        list_stream.close()
    r = httpx.get(f"{base}/api/v1/jobs/{job_id}/events", headers=bearer(carol))
    assert r.status_code == 401, "reconnecting with it is refused"


def test_replay_from_an_old_id_goes_out_in_pages(api_server, monkeypatch):
    monkeypatch.setattr(events, "TRIAL_BATCH", 4)
    polled: list[int] = []
    poll_job = events._poll_job

    def counted(*args):
        job, trials, gone = poll_job(*args)
        polled.append(len(trials))
        return job, trials, gone

    monkeypatch.setattr(events, "_poll_job", counted)
    url = api_server.settings.resolved_database_url
    job_id = _submit(api_server)
    task_id = _start(url, job_id)
    ids = [_record(url, job_id, task_id, i, 1.0 + i) for i in range(15)]
    finish_job(url, job_id)
    stream = Stream(f"{api_server.url}/api/v1/jobs/{job_id}/events", params={"last_event_id": ids[1]})
    try:
        got = stream.until(lambda e: e.event == "end")
    finally:
        stream.close()
    assert [int(e.id) for e in got if e.event == "trial"] == ids[2:], "every missed trial once, in order"
    assert max(polled) == 4 and sum(polled) == 13, f"read 4 rows a query at most: {polled}"


def test_streams_of_one_job_read_its_change_once(api_server, monkeypatch):
    reads: list[int] = []
    snapshot = events._snapshot

    def counted(session, job):
        reads.append(job.id)
        return snapshot(session, job)

    monkeypatch.setattr(events, "_snapshot", counted)
    url = api_server.settings.resolved_database_url
    job_id = _submit(api_server)
    streams = [Stream(f"{api_server.url}/api/v1/jobs/{job_id}/events") for _ in range(4)]
    try:
        assert all(s.next().event == "job" for s in streams)
        reads.clear()
        _start(url, job_id)  # one change of the row
        for s in streams:
            s.until(lambda e: e.event == "job" and e.data["status"] == "running")
        # one read, or two where two streams' polls met the change at the same moment: not one per stream
        assert set(reads) == {job_id} and len(reads) <= 2, reads
    finally:
        for s in streams:
            s.close()
