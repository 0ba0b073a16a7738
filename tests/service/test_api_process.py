"""The API process answers without loading TVM, torch, xgboost or the tuner: at start-up and on every route a
user's first hour touches (the catalog, submitting an operator job, a refused target, the zoo's list, the
schedules of a target name, an upload refused, jobs, metrics, devices without a tracker).

import-linter's forbidden contract (pyproject.toml) checks the imports statically; the modules the API uses from
`compiler` import TVM or torch only inside functions the API never calls, which only a run can show: this test.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import json, sys, tempfile, pathlib
from fastapi.testclient import TestClient
from service.api import create_app
from service.db import session_scope, upgrade
from service.settings import Settings
from service.tokens import create_token

HEAVY = ("tvm", "torch", "xgboost", "tuner")
loaded = lambda: sorted(m for m in HEAVY if m in sys.modules)
tmp = pathlib.Path(tempfile.mkdtemp())
url = f"sqlite:///{tmp / 'a.db'}"
upgrade(url)
with session_scope(url) as s:
    token = create_token(s, "admin", "t")[1]
dense = {"kind": "operator", "operator": "dense", "params": {"m": 8, "n": 8, "k": 8}, "budget": 2}
out = {"start-up": loaded()}
with TestClient(create_app(Settings(database_url=url, data_dir=tmp)),
                headers={"Authorization": f"Bearer {token}"}) as c:
    for name, call in [
        ("operators", lambda: c.get("/api/v1/operators")),
        ("submit", lambda: c.post("/api/v1/jobs", json=dense)),
        ("subgraph", lambda: c.post("/api/v1/jobs", json=dense | {"operator": "matmul_softmax_matmul",
                                                                   "params": {"seq": 8, "dim": 8}})),
        ("cuda", lambda: c.post("/api/v1/jobs", json=dense | {"target": "cuda"})),
        ("bad params", lambda: c.post("/api/v1/jobs", json=dense | {"params": {"m": 0}})),
        ("zoo", lambda: c.get("/api/v1/models/zoo")),
        ("schedules", lambda: c.get("/api/v1/schedules", params={"target": "host"})),
        ("upload", lambda: c.post("/api/v1/models", files={"file": ("x.pt2", b"not a zip", "application/zip")},
                                  data={"spec": "{}"})),
        ("jobs", lambda: c.get("/api/v1/jobs")),
        ("metrics", lambda: c.get("/metrics")),
        ("devices", lambda: c.get("/api/v1/devices")),
    ]:
        r = call()
        out[name] = [r.status_code, loaded()]
print(json.dumps(out))
"""


def test_the_api_answers_without_tvm_torch_xgboost_or_the_tuner():
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out.pop("start-up") == []
    statuses = {name: status for name, (status, _) in out.items()}
    assert statuses == {"operators": 200, "submit": 201, "subgraph": 201, "cuda": 422, "bad params": 422,
                        "zoo": 200, "schedules": 200, "upload": 422, "jobs": 200, "metrics": 200, "devices": 200}
    assert {name: heavy for name, (_, heavy) in out.items() if heavy} == {}
