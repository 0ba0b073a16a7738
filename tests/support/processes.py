"""`altune serve` and `altune worker` as child processes, as a deployment runs them, and waiting on them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
LEASE_S = 3.0  # the workers' lease in `worker_env`: short, so that a takeover or a stop shows within seconds


def service_env(**settings: str) -> dict[str, str]:
    """This process's environment without its ALTUNE_ settings (but the host CPU), the repository importable,
    torch.compile's timing and the anytime build off (a minute, a build per model job), and `settings` (ALTUNE_ names) on top."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ALTUNE_") or k == "ALTUNE_HOST_CPU"}
    return env | {"PYTHONPATH": str(ROOT), "ALTUNE_TIME_TORCH_COMPILE": "0", "ALTUNE_ANYTIME_ARTIFACT": "0"} | settings


def worker_env(url: str, data_dir: Path, **settings: str) -> dict[str, str]:
    """`service_env` for processes on the database at `url`, with a `LEASE_S` lease and 0.2 s polls."""
    return service_env(ALTUNE_DATABASE_URL=url, ALTUNE_DATA_DIR=str(data_dir), ALTUNE_LEASE_SECONDS=str(LEASE_S),
                       ALTUNE_POLL_SECONDS="0.2", **settings)


@contextmanager
def cli_process(args: list[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen]:
    """`python -m service.cli *args` in a session of its own; on the way out its whole group is killed."""
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "service.cli", *args], env=env, cwd=ROOT, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield proc
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the process and what it left behind (measuring processes)
        except ProcessLookupError:
            pass
        proc.wait()


def wait_until(what: str, done: Callable[[], object], timeout: float = 300,
               procs: tuple[subprocess.Popen, ...] = (), logs: tuple[Path, ...] = ()) -> None:
    """Polls `done` every 0.1 s; fails naming `what`, with the tails of `logs`, on the timeout or as soon as one of
    `procs` exits."""
    deadline = time.monotonic() + timeout
    while not done():
        dead = [p.args[-1] for p in procs if p.poll() is not None]
        if dead or time.monotonic() > deadline:
            tails = "\n".join(log.read_text()[-3000:] for log in logs if log.exists())
            raise AssertionError(f"{'processes exited: ' + str(dead) if dead else 'timed out'} waiting for {what}\n"
                                 f"{tails}")
        time.sleep(0.1)


def answers(base: str) -> bool:
    """Whether the API at `base` answers its health check now."""
    try:
        return httpx.get(f"{base}/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
