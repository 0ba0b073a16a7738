"""Input an attacker or a fuzzer sends: every answer is a 4xx that says what to fix, never a 5xx, and a write
from a web page of another origin changes nothing.

Each case here answered 500 or 503 (or was accepted and failed later in the worker) before the API bounded
its integers, refused non-finite numbers with valid JSON, refused targets it cannot serve, and checked the
`Origin` of state-changing requests.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from service.schemas import MAX_INT32, MAX_INT64
from tuner import MAX_SEED

DENSE = {"kind": "operator", "operator": "dense", "params": {"m": 16, "n": 16, "k": 16}, "budget": 2}


def _strict_json(text: str):
    """JSON as the standard defines it: NaN and Infinity are not numbers there."""

    def refuse(token: str):
        raise AssertionError(f"the response is not valid JSON: it holds {token}")

    return json.loads(text, parse_constant=refuse)


def _job_count(client) -> int:
    return client.get("/api/v1/jobs").json()["count"]


@pytest.mark.parametrize("path", [
    f"/api/v1/jobs/{MAX_INT64 + 1}",
    f"/api/v1/jobs/{MAX_INT32 + 1}",
    f"/api/v1/jobs/{2**70}/trials",
    f"/api/v1/jobs?offset={MAX_INT64 + 1}",
    f"/api/v1/jobs/1/trials?offset={2**64}",
    f"/api/v1/schedules?offset={MAX_INT64 + 1}",
])
def test_integers_beyond_their_columns_are_a_422_naming_the_parameter(client, path):
    r = client.get(path)
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"][-1] in ("job_id", "offset")


def test_the_largest_id_and_offset_are_answered(client):
    assert client.get(f"/api/v1/jobs/{MAX_INT32}").status_code == 404
    assert client.get(f"/api/v1/jobs/{MAX_INT32}/trials").status_code == 404
    assert client.get(f"/api/v1/jobs/{MAX_INT32}/artifact").status_code == 404
    assert client.post(f"/api/v1/jobs/{MAX_INT32}/cancel").status_code == 404
    for path in ("/api/v1/jobs", "/api/v1/jobs/1/trials", "/api/v1/schedules"):
        r = client.get(f"{path}?offset={MAX_INT64}")
        assert r.status_code in (200, 404) and r.json().get("data", []) == [], (path, r.text)


@pytest.mark.parametrize(("path", "headers", "status"), [
    (f"/api/v1/jobs/{MAX_INT32 + 1}/events", {}, 422),
    ("/api/v1/jobs/1/events", {"last-event-id": str(2**70)}, 400),
    (f"/api/v1/jobs/1/events?last_event_id={2**64}", {}, 422),
    ("/api/v1/jobs/1/events", {"last-event-id": "yesterday"}, 400),
    ("/api/v1/events", {"last-event-id": "not a time"}, 400),
])
def test_event_stream_parameters_are_bounded(client, path, headers, status):
    r = client.get(path, headers=headers)
    assert r.status_code == status, r.text


def test_the_jobs_stream_takes_the_oldest_timestamp(settings, run_async):
    """Year 1 as Last-Event-ID: the stream reads a window behind it, which underflowed (a 500 in the stream)."""
    import asyncio

    from service.api.events import _list_events, _parse_watermark
    from service.api.stream_limits import TokenWatch
    from service.tokens import Caller

    since = _parse_watermark("0001-01-01T00:00:00")
    url = settings.resolved_database_url

    async def first_two() -> list[bytes]:
        stream = _list_events(url, since, None, TokenWatch(url, Caller.anonymous("read")))
        # 2 s: four of the stream's polls (POLL_SECONDS), each of which read the window that underflowed
        return [await anext(stream), await asyncio.wait_for(anext(stream), 2)]

    with pytest.raises(TimeoutError):  # no job: nothing to send, and nothing raised
        run_async(first_two())


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e400"])
@pytest.mark.parametrize("field", ["budget", "seed", "params.m"])
def test_non_finite_numbers_are_a_422_in_valid_json(client, literal, field):
    body = json.dumps(DENSE).replace('"m": 16', '"m": @' if field == "params.m" else '"m": 16')
    if field != "params.m":
        body = body[:-1] + f', "{field}": @}}'
    r = client.post("/api/v1/jobs", content=body.replace("@", literal), headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text
    detail = _strict_json(r.text)["detail"]
    assert detail[0]["loc"][-1] == field.split(".")[-1]
    assert _job_count(client) == 0


def test_a_seed_beyond_what_the_tuner_takes_is_refused(client):
    r = client.post("/api/v1/jobs", json=DENSE | {"seed": 2**70})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "seed"]
    assert client.post("/api/v1/jobs", json=DENSE | {"seed": MAX_SEED}).status_code == 201


def test_the_largest_seed_runs_in_the_tuner():
    """MAX_SEED is what every seeded part of the search takes: numpy, torch (PPO) and XGBoost."""
    import numpy as np
    import torch

    from tuner import XGBModel
    from tuner.ppo import Critic

    np.random.default_rng([MAX_SEED, 7]).random()
    Critic(4, seed=MAX_SEED)
    model = XGBModel(seed=MAX_SEED, min_samples=2)
    x = np.random.default_rng(0).random((8, 3)).astype(np.float32)
    model.update(x, x.sum(1))
    assert np.isfinite(model.predict(x)).all()
    torch.manual_seed(MAX_SEED)


def test_cuda_is_refused_at_submit_as_not_supported_yet_even_with_a_gpu(client, monkeypatch):
    """Nothing schedules GPU threads yet: an operator or model job naming cuda is a 422 saying so, on a server with
    a GPU too, and the catalog offers only the CPU targets."""
    import compiler.target as target

    for arch in (None, "sm_90"):
        monkeypatch.setattr(target, "cuda_arch", lambda arch=arch: arch)
        r = client.post("/api/v1/jobs", json=DENSE | {"target": "cuda"})
        assert r.status_code == 422, r.text
        assert r.json()["detail"][0]["loc"] == ["body", "target"]
        assert "target cuda is not supported yet" in r.json()["detail"][0]["msg"]
        r = client.post("/api/v1/models/zoo", json={"model": "small_cnn", "target": "cuda"})
        assert r.status_code == 422 and "not supported yet" in r.text, r.text
        assert client.get("/api/v1/operators").json()["targets"] == ["host", "llvm"]
    assert _job_count(client) == 0


# -- cross-origin writes -------------------------------------------------------------------------------------


@pytest.mark.parametrize("headers", [
    {"origin": "http://evil.example"},
    {"origin": "null"},  # a sandboxed iframe or a file:// page
    {"origin": "http://testserver.evil.example"},
    {"sec-fetch-site": "cross-site"},
], ids=["other-origin", "null-origin", "lookalike-origin", "fetch-metadata"])
def test_writes_from_another_origin_are_refused_and_change_nothing(client, headers):
    queued = client.post("/api/v1/jobs", json=DENSE).json()["id"]

    r = client.post("/api/v1/jobs", json=DENSE, headers=headers)
    assert r.status_code == 403 and "cross-origin" in r.json()["detail"]
    r = client.post(f"/api/v1/jobs/{queued}/cancel", headers=headers)
    assert r.status_code == 403
    r = client.post("/api/v1/models", files={"file": ("m.pt2", b"PK\x05\x06" + bytes(18))}, headers=headers)
    assert r.status_code == 403
    r = client.post("/api/v1/models/zoo", json={"model": "small_cnn"}, headers=headers)
    assert r.status_code == 403

    assert _job_count(client) == 1
    assert client.get(f"/api/v1/jobs/{queued}").json()["status"] == "queued"


def test_same_origin_and_non_browser_writes_pass(client):
    assert client.post("/api/v1/jobs", json=DENSE, headers={"origin": "http://testserver"}).status_code == 201
    assert client.post("/api/v1/jobs", json=DENSE, headers={"sec-fetch-site": "same-origin",
                                                           "origin": "http://testserver"}).status_code == 201
    assert client.post("/api/v1/jobs", json=DENSE).status_code == 201  # curl, the CLI
    # reads stay open, and no CORS header lets a page elsewhere read the answer
    r = client.get("/api/v1/jobs", headers={"origin": "http://evil.example"})
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers


def test_allowed_origins_may_write(settings, admin_token):
    from fastapi.testclient import TestClient

    from service.api import create_app

    settings.allowed_origins = ["https://dash.example.com"]
    with TestClient(create_app(settings), headers={"Authorization": f"Bearer {admin_token}"}) as client:
        ok = client.post("/api/v1/jobs", json=DENSE, headers={"origin": "https://dash.example.com"})
        assert ok.status_code == 201
        assert client.post("/api/v1/jobs", json=DENSE, headers={"origin": "https://evil.example"}).status_code == 403


# -- the OpenAPI schema describes every answer -----------------------------------------------------------------


def test_a_wrong_method_lists_every_method_of_the_path(client):
    r = client.delete("/api/v1/jobs")
    assert r.status_code == 405 and set(r.headers["allow"].split(", ")) == {"GET", "POST"}


def test_every_error_the_routes_raise_is_in_the_openapi_schema(client):
    paths = client.get("/openapi.json").json()["paths"]
    for path, operations in paths.items():
        for method, op in operations.items():
            codes = set(op["responses"])
            assert "503" in codes, f"{method} {path}: the database may be down"
            if "{job_id}" in path:
                assert {"404", "422"} <= codes, f"{method} {path}: {codes}"
            if method == "post":
                assert {"403", "422"} <= codes, f"{method} {path}: {codes}"
            if "requestBody" in op:
                assert "400" in codes, f"{method} {path}: a body that is not JSON"
    assert "409" in paths["/api/v1/jobs/{job_id}/cancel"]["post"]["responses"]


@pytest.mark.fuzz
def test_schemathesis_finds_no_server_error_and_no_undocumented_answer(api_server, tmp_path):
    """A bounded `st run --checks all` over the whole API (but the endless event streams).

    Left out, with reasons: positive_data_acceptance (the schema cannot say which operator takes which
    parameters, nor that an upload must be a torch.export zip, so schema-valid requests are rightly 422),
    and use_after_free / ensure_resource_availability (a just-created job has no artifact until it finishes).
    """
    cmd = [str(Path(sys.executable).parent / "st"), "run", f"{api_server.url}/openapi.json",
           "--checks", "all", "--exclude-checks", "positive_data_acceptance,use_after_free,ensure_resource_availability",
           "--max-examples", "25", "--exclude-path-regex", "events$",
           "--request-timeout", "60", "--seed", "20261125", "--no-color",
           "--header", f"Authorization: Bearer {api_server.token}"]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]


@pytest.mark.parametrize(("spec", "field"), [
    ('{"seed": 1180591620717411303424}', "seed"),
    ('{"budget": NaN}', "budget"),
    ('{"input_shapes": [[1, Infinity]]}', "input_shapes"),
    ('{"target": "cuda"}', "target"),
    ('{"seed": true}', "seed"),
])
def test_model_specs_are_bounded_like_operator_specs(client, monkeypatch, spec, field):
    import compiler.target as target

    monkeypatch.setattr(target, "cuda_arch", lambda: None)
    r = client.post("/api/v1/models", files={"file": ("m.pt2", b"not checked: the spec is refused first")},
                    data={"spec": spec})
    assert r.status_code == 422, r.text
    assert field in _strict_json(r.text)["detail"][0]["loc"], r.text
    zoo = json.loads(spec.replace("NaN", "1.5").replace("Infinity", "2.5")) | {"model": "small_cnn"}
    r = client.post("/api/v1/models/zoo", json=zoo)
    assert r.status_code == 422 and field in r.json()["detail"][0]["loc"], r.text
    assert _job_count(client) == 0
