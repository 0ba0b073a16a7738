"""Models through the product as a user meets it: `altune serve` on a fresh data folder, each model uploaded over
HTTP at the default settings, tuned by its worker, its artifact checked whole against torch by the job itself.

    python -m bench.jobs --models gpt_block,resnet18,dict_out          # corpus names (bench.corpus)
    python -m bench.jobs --all --json bench/results/jobs-corpus.json   # the whole corpus, one after another

Per model: the upload's seconds (the API's confined import included), the job's seconds from its first claim to
its end (the worker's sandboxed preparation, tuning, and the final build in its child), its status, whether its
whole-model check passed, the artifact's and torch eager's latency as the job measured them, and the error of a
failed job. Nothing here is timed for comparison: this is the product's path, end to end, at `--budget` (the
API's default, 64, unless given).

Layering: bench may import everything below it; nothing imports bench.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
import torch

from bench import corpus
from compiler.target import target_key

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class JobRow:
    name: str
    upload_s: float | None = None
    upload_status: int | None = None
    tune_s: float | None = None
    status: str = "-"
    check_passed: bool | None = None
    tasks: int | None = None
    ours_ms: float | None = None
    torch_eager_ms: float | None = None
    error: str = ""

    def line(self) -> str:
        def f(v: float | None, digits: int = 1) -> str:
            return "-" if v is None else f"{v:.{digits}f}"

        check = {None: "-", True: "yes", False: "NO"}[self.check_passed]
        return (f"{self.name:32} {f(self.upload_s):>8} {f(self.tune_s):>8} {self.status:>10} {check:>6} "
                f"{self.tasks if self.tasks is not None else '-':>5} {f(self.ours_ms, 3):>9} "
                f"{f(self.torch_eager_ms, 3):>9}  {self.error[:160]}")


HEADER = (f"{'model':32} {'upload s':>8} {'tune s':>8} {'status':>10} {'check':>6} {'tasks':>5} {'ours ms':>9} "
          f"{'eager ms':>9}  error")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_model(client: httpx.Client, name: str, folder: Path, budget: int | None, timeout_s: float) -> JobRow:
    """Exports `name`, uploads it, waits for its job; the row."""
    row = JobRow(name)
    try:
        path = folder / f"{name}.pt2"
        torch.export.save(corpus.export(name), path)
    except Exception as e:  # noqa: BLE001 - a corpus run records every failure and goes on
        row.status, row.error = "no export", f"{type(e).__name__}: {e}"[:300]
        return row
    spec = {} if budget is None else {"budget": budget}
    start = time.perf_counter()
    with path.open("rb") as f:
        r = client.post("/api/v1/models", files={"file": (path.name, f, "application/octet-stream")},
                        data={"spec": json.dumps(spec)}, timeout=900)
    row.upload_s, row.upload_status = time.perf_counter() - start, r.status_code
    path.unlink(missing_ok=True)
    if r.status_code != 201:
        row.status, row.error = f"upload {r.status_code}", r.text[:300]
        return row
    job_id = r.json()["id"]
    deadline = time.monotonic() + timeout_s
    while True:
        job = client.get(f"/api/v1/jobs/{job_id}", timeout=60).json()
        if job["status"] not in ("queued", "running") or time.monotonic() > deadline:
            break
        time.sleep(2)
    row.status, row.error = job["status"], (job.get("error") or "")[:300].replace("\n", " ")
    row.tasks = len(job.get("tasks") or [])
    if job.get("started_at") and job.get("finished_at"):
        from datetime import datetime

        row.tune_s = (datetime.fromisoformat(job["finished_at"]) - datetime.fromisoformat(job["started_at"])
                      ).total_seconds()
    report = job.get("report") or {}
    row.check_passed = (report.get("check") or {}).get("passed")
    latency = report.get("latency_ms") or {}
    row.ours_ms, row.torch_eager_ms = latency.get("artifact"), latency.get("torch_eager")
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.jobs", description=__doc__.split("\n")[0])
    parser.add_argument("--models", help="comma-separated corpus names")
    parser.add_argument("--all", action="store_true", help="every model of bench.corpus")
    parser.add_argument("--budget", type=int, help="the job's budget (default: the API's default)")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds to wait for one job")
    parser.add_argument("--json", type=Path, help="write the rows here")
    args = parser.parse_args(argv)
    names = list(corpus.CORPUS) if args.all else (args.models or "").split(",")
    unknown = [n for n in names if n not in corpus.CORPUS]
    if unknown or not names:
        parser.error(f"unknown model(s): {', '.join(unknown) or 'none given'}")
    rows: list[JobRow] = []
    with tempfile.TemporaryDirectory(prefix="altune-bench-jobs-") as tmp:
        port = _free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("ALTUNE_") or k == "ALTUNE_HOST_CPU"}
        env |= {"ALTUNE_DATA_DIR": tmp, "ALTUNE_PORT": str(port), "ALTUNE_ANONYMOUS": "all"}
        log = open(Path(tmp) / "serve.log", "wb")
        subprocess.run([sys.executable, "-m", "service.cli", "db", "upgrade"], env=env, cwd=ROOT, check=True,
                       stdout=log, stderr=subprocess.STDOUT)
        server = subprocess.Popen([sys.executable, "-m", "service.cli", "serve", "--workers", "1"], env=env,
                                  cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}") as client:
                for _ in range(600):
                    try:
                        if client.get("/healthz", timeout=2).status_code == 200:
                            break
                    except httpx.HTTPError:
                        pass
                    time.sleep(0.5)
                print(f"models through `altune serve` at the default settings, target {target_key('host')}",
                      flush=True)
                print(HEADER, flush=True)
                for name in names:
                    rows.append(run_model(client, name, Path(tmp), args.budget, args.timeout))
                    print(rows[-1].line(), flush=True)
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
            log.close()
    good = [r for r in rows if r.status == "succeeded" and r.check_passed]
    print(f"\n{len(good)}/{len(rows)} models uploaded, tuned and matched torch", flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"target": target_key("host"), "budget": args.budget,
                                         "rows": [asdict(r) for r in rows]}, indent=1) + "\n")
    return 0 if len(good) == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
