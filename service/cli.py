"""The `altune` command: serve, worker, submit, tune, token, db upgrade.

Heavy modules (TVM, torch, uvicorn) are imported inside the commands so that
`altune --help` answers at once.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import unquote_plus

import httpx
import uvicorn
import uvicorn.config
from fastapi.exceptions import RequestValidationError

from compiler.workloads import EPILOGUES
from service.api import create_app
from service.api.jobs import validate_operator_job
from service.db import SchemaOutdatedError, StorageError, check_schema, is_embedded, session_scope, upgrade
from service.models import Token
from service.schemas import OperatorJobCreate
from service.settings import Settings
from service.tokens import LIMITS, create_token, revoke_token


def _settings(args: argparse.Namespace) -> Settings:
    overrides = {k: v for k, v in {"database_url": getattr(args, "database_url", None),
                                   "host": getattr(args, "host", None),
                                   "port": getattr(args, "port", None)}.items() if v is not None}
    return Settings(**overrides)


def _parse_params(pairs: list[str]) -> dict[str, int]:
    params = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"--param takes NAME=VALUE, got {pair!r}")
        try:
            params[name] = int(value)
        except ValueError:
            raise SystemExit(f"--param {name} must be an integer, got {value!r}") from None
    return params


def _spec_from_args(args: argparse.Namespace) -> dict:
    if args.spec:
        return json.loads(Path(args.spec).read_text())
    if not args.operator:
        raise SystemExit("give a spec file or --operator with --param NAME=VALUE ...")
    return {"kind": "operator", "operator": args.operator, "params": _parse_params(args.param),
            "dtype": args.dtype, "epilogue": args.epilogue, "target": args.target, "budget": args.budget,
            "seed": args.seed, "layout_levels": args.layout_levels, "licm": args.licm}


def cmd_db_upgrade(args: argparse.Namespace) -> None:
    settings = _settings(args)
    upgrade(settings.resolved_database_url)
    print(f"database at {settings.resolved_database_url} is up to date")


def cmd_worker(args: argparse.Namespace) -> None:
    # the worker imports the tuner (TVM, xgboost, torch): only the processes that tune load it, not `altune serve`
    from service.worker import Worker

    settings = _settings(args)
    check_schema(settings.resolved_database_url)
    # below the API's priority: its measurement and build processes inherit it, and the dashboard stays responsive
    os.nice(settings.worker_nice)
    worker = Worker(settings)
    # SIGTERM (from `altune serve`, a process manager, or the kernel when the server dies) stops the worker:
    # the job in hand is released for the next worker, which resumes it from its trials
    signal.signal(signal.SIGTERM, _exit_on_signal)
    try:
        worker.run_forever()
    finally:  # the job in hand was released (or finished) on the way out
        _stop_own_group()


def _exit_on_signal(signum: int, _frame) -> None:
    raise SystemExit(128 + signum)


def _stop_own_group() -> None:
    """A stopping worker's last step: end its process group (itself and its measurement processes).

    Under `altune serve` the worker leads a process group of its own; when the server crashed, nobody else
    stops that group. A worker started by hand shares its shell's group, which is left alone.
    """
    if os.getpgrp() == os.getpid():
        # SIGKILL, this process included: the job is released and every trial committed, and a measurement
        # process (or a thread waiting on one at interpreter exit) must not keep the worker alive
        os.killpg(os.getpgrp(), signal.SIGKILL)


def _die_with_parent(parent: int) -> None:
    """In a child before exec: ask Linux to send SIGTERM when the parent dies (even by SIGKILL).

    Its own process group keeps a terminal's Ctrl-C away from it: the server stops its workers itself.
    """
    os.setpgrp()
    try:
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # not Linux: the worker outlives a crashed server (SIGTERM still stops it)
        pass
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def _stop_workers(workers: list[subprocess.Popen], grace: float = 10.0) -> None:
    """SIGTERM each worker (it hands its job back, then ends its process group), then SIGKILL what is left."""
    for w in workers:  # the worker alone: it releases its job, then ends its group (`_stop_own_group`)
        try:
            w.send_signal(signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace
    for w in workers:
        try:
            w.wait(max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            pass
        _signal_group(w, signal.SIGKILL)  # whatever is left of its group: a hung worker or an orphaned child
        w.wait()


log = logging.getLogger("altune.serve")
STABLE_SECONDS = 60.0  # a worker that ran this long before it died is restarted after the first wait again


class Workers:
    """The worker processes of `altune serve`, each restarted when it dies.

    A thread watches them; a worker that exited (killed by the kernel for memory, a crash in a native
    library) is logged, its process group killed (measurement processes it left), and a new one started after
    1 s, twice as long for each death in a row of that place, at most `restart_max_seconds`. The new one
    finds the job the dead one held by its lease. Linux sends a worker SIGTERM when the thread that started
    it ends (`_die_with_parent`); the watching thread ends only in `stop`, which stops the workers anyway.
    """

    def __init__(self, count: int, env: dict[str, str], restart_max_seconds: float) -> None:
        self.env = env
        self.restart_max_seconds = restart_max_seconds
        self.procs: list[subprocess.Popen] = [self._start() for _ in range(count)]
        self._started = [time.monotonic()] * count
        self._deaths = [0] * count
        self._stopping = threading.Event()
        self._lock = threading.Lock()  # `procs` is replaced by the watcher and read by `stop`
        self._watcher = threading.Thread(target=self._watch, name="altune-workers", daemon=True)
        if count:
            self._watcher.start()

    def _start(self) -> subprocess.Popen:
        parent = os.getpid()
        return subprocess.Popen([sys.executable, "-m", "service.cli", "worker"], env=self.env,
                                preexec_fn=lambda: _die_with_parent(parent))

    def _watch(self) -> None:
        restart_at: dict[int, float] = {}
        while not self._stopping.wait(0.5):
            for place, proc in enumerate(self.procs):
                code = proc.poll()
                if code is None:
                    continue
                now = time.monotonic()
                if place not in restart_at:
                    _signal_group(proc, signal.SIGKILL)  # what it left running (its measurement processes)
                    ran = now - self._started[place]
                    self._deaths[place] = 1 if ran >= STABLE_SECONDS else self._deaths[place] + 1
                    wait = min(2.0 ** (self._deaths[place] - 1), self.restart_max_seconds)
                    restart_at[place] = now + wait
                    log.warning("worker %d (pid %d) exited with %s after %.0f s; restarting it in %.0f s",
                                place, proc.pid, _exit_status(code), ran, wait)
                elif now >= restart_at[place]:
                    del restart_at[place]
                    try:
                        new = self._start()
                    except OSError as e:  # out of processes or memory: try again after the next wait
                        log.error("could not restart worker %d: %s", place, e)
                        self._started[place] = now
                        continue
                    with self._lock:
                        if self._stopping.is_set():  # `stop` began meanwhile: it no longer sees this one
                            _stop_workers([new])
                            return
                        self.procs[place] = new
                    self._started[place] = now
                    log.warning("worker %d restarted (pid %d)", place, new.pid)

    def stop(self) -> None:
        """Stop watching, then stop every worker (`_stop_workers`)."""
        with self._lock:
            self._stopping.set()
            procs = list(self.procs)
        _stop_workers(procs)


def _exit_status(code: int) -> str:
    return f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _migrated(settings: Settings) -> str:
    """The database URL, migrated first if it is the embedded SQLite file; exits naming the fix otherwise."""
    url = settings.resolved_database_url
    logging.getLogger("alembic").setLevel(logging.WARNING)  # a line per migration step says nothing to a user
    try:
        if is_embedded(url):  # the embedded default: create and migrate the file, nothing to run first
            upgrade(url)
        check_schema(url)
    except SchemaOutdatedError as e:  # a shared PostgreSQL is migrated on purpose, never behind users' backs
        raise SystemExit(str(e)) from None
    except StorageError as e:
        raise SystemExit(str(e)) from None
    return url


def first_token(url: str) -> str | None:
    """On a database without tokens: create an admin token named "first-admin" and return it (else None)."""
    with session_scope(url) as session:
        if Token.any_exists(session):
            return None
        return create_token(session, "admin", "first-admin")[1]


def _access_line(settings: Settings, base: str, token: str | None) -> str:
    """What `altune serve` prints about who may use it."""
    anonymous = {"none": "", "read": "; ALTUNE_ANONYMOUS=read: reads need no token",
                 "all": "; ALTUNE_ANONYMOUS=all: reads and writes need no token"}[settings.anonymous]
    if token is not None:
        return (f"altune: first start, an admin token was created (shown once, only its hash is stored): "
                f"open {base}?token={token}{anonymous}")
    return f"altune: tokens required (make one: altune token create --scope write){anonymous}"


_TOKEN_PARAM = re.compile(r"([?&])([^=&#\s]*)=([^&#\s]*)")
_TOKEN_VALUE = re.compile(r"alt_[\w-]{8,}")
REDACTED = "<redacted>"


def redact_tokens(text: str) -> str:
    """`text` with the value of every `token` query parameter, and anything shaped like a token, redacted."""
    def param(m: re.Match) -> str:
        return f"{m[1]}{m[2]}={REDACTED}" if unquote_plus(m[2]).lower() == "token" else m[0]

    return _TOKEN_VALUE.sub(REDACTED, _TOKEN_PARAM.sub(param, text))


class RedactTokens(logging.Filter):
    """On `uvicorn.access`: a GET takes its token as `?token=` (links, event streams, the first admin URL), and
    the access log would keep it; the request line's arguments are rewritten before any handler sees them."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(redact_tokens(a) if isinstance(a, str) else a for a in record.args)
        elif isinstance(record.msg, str):
            record.msg = redact_tokens(record.msg)
        return True


def serve_log_config() -> dict:
    """uvicorn's logging configuration with `RedactTokens` on its access log."""
    config = copy.deepcopy(uvicorn.config.LOGGING_CONFIG)
    config.setdefault("filters", {})["redact_tokens"] = {"()": RedactTokens}
    config["loggers"]["uvicorn.access"]["filters"] = ["redact_tokens"]
    return config


def cmd_serve(args: argparse.Namespace) -> None:


    settings = _settings(args)
    url = _migrated(settings)
    token = first_token(url)
    # uvicorn handles SIGTERM itself, then re-raises it once it has shut down: without a handler of ours the
    # default action would end this process before the `finally` below stops the workers
    signal.signal(signal.SIGTERM, _exit_on_signal)
    workers = Workers(args.workers, os.environ | {"ALTUNE_DATABASE_URL": url}, settings.worker_restart_max_seconds)
    base = f"http://{settings.host}:{settings.port}/"
    print(f"altune: API on {base} (docs at /docs), {args.workers} worker(s), database {url}", flush=True)
    print(_access_line(settings, base, token), flush=True)
    try:
        uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_level="info",
                    log_config=serve_log_config())
    finally:
        workers.stop()


def cmd_token_create(args: argparse.Namespace) -> None:
    url = _migrated(_settings(args))
    limits = {k: getattr(args, k) for k in ("max_queued", "max_running", "max_trials_per_day",
                                            "max_upload_bytes_per_day")}
    try:
        with session_scope(url) as session:
            row, token = create_token(session, args.scope, args.name, **limits)
    except ValueError as e:
        raise SystemExit(str(e)) from None
    print(f"token {row.id} ({row.name}, scope {row.scope}) created; it is shown this once, keep it:", file=sys.stderr)
    print(token)


def cmd_token_list(args: argparse.Namespace) -> None:
    url = _migrated(_settings(args))
    with session_scope(url) as session:
        rows = Token.where_all(session)
    print(f"{'id':>4}  {'name':<20} {'scope':<6} {'created (UTC)':<20} {'revoked (UTC)':<20} limits (default: -)")
    for r in rows:
        limits = " ".join(f"{k.removeprefix('max_')}={getattr(r, k) if getattr(r, k) is not None else '-'}"
                          for k in LIMITS)
        revoked = r.revoked_at.isoformat(" ", "seconds") if r.revoked_at else "-"
        print(f"{r.id:>4}  {r.name:<20} {r.scope:<6} {r.created_at.isoformat(' ', 'seconds'):<20} {revoked:<20} "
              f"{limits}")


def cmd_token_revoke(args: argparse.Namespace) -> None:
    url = _migrated(_settings(args))
    try:
        with session_scope(url) as session:
            row = revoke_token(session, args.token)
    except KeyError as e:
        raise SystemExit(e.args[0]) from None
    print(f"token {row.id} ({row.name}) revoked")


def cmd_submit(args: argparse.Namespace) -> None:
    spec = _spec_from_args(args)
    token = args.token or os.environ.get("ALTUNE_TOKEN")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with httpx.Client(base_url=args.server, timeout=30, headers=headers) as client:
        r = client.post("/api/v1/jobs", json=spec)
        if r.status_code != 201:
            raise SystemExit(f"rejected ({r.status_code}): {json.dumps(r.json().get('detail'), indent=1)}")
        job = r.json()
        print(f"job {job['id']} queued: {args.server}/api/v1/jobs/{job['id']}")
        if not args.wait:
            return
        while job["status"] in ("queued", "running"):
            time.sleep(2)
            job = client.get(f"/api/v1/jobs/{job['id']}").json()
            print(f"  {job['status']}: {job['trials_done']}/{job['budget']} trials, best {job['best_latency_ms']} ms",
                  flush=True)
        if job["status"] != "succeeded":
            raise SystemExit(f"job {job['id']} {job['status']}: {job['error'] or ''}")
        if args.out:
            data = client.get(f"/api/v1/jobs/{job['id']}/artifact")
            data.raise_for_status()
            Path(args.out).write_bytes(data.content)
            print(f"artifact written to {args.out}")


def cmd_tune(args: argparse.Namespace) -> None:
    """Tune locally, no server and no database: print progress, write the artifact."""


    settings = _settings(args)
    try:
        spec = validate_operator_job(OperatorJobCreate.model_validate(_spec_from_args(args)), settings)
    except RequestValidationError as e:
        raise SystemExit(f"invalid job: {e.errors()}") from None

    # the tuner and the compiler (TVM, torch): loaded by this command only, not by the CLI's others
    from compiler.build import write_artifact
    from service.job_run import measurer_for
    from service.requests import tune_request
    from tuner import apply_config, layout_of_config
    from tuner.operator import task_from_request, tune_operator

    request = tune_request(spec, spec["budget"])
    task = task_from_request(request, max_tensor_elements=settings.max_tensor_elements)
    started = time.perf_counter()
    trials_out = open(args.trials, "w") if args.trials else None  # noqa: SIM115 - closed below

    def show(trial) -> None:
        what = f"{trial.latency_ms:.4f} ms" if trial.latency_ms is not None else f"error: {trial.error[:80]}"
        print(f"  trial {trial.index + 1}/{spec['budget']} ({trial.stage}): {what}", flush=True)
        if trials_out is not None:
            trials_out.write(json.dumps({"index": trial.index, "config": trial.config, "stage": trial.stage,
                                         "latency_ms": trial.latency_ms, "error": trial.error}) + "\n")
            trials_out.flush()

    measurer = measurer_for(settings, request)
    try:
        result = tune_operator(task, request, on_trial=show, measurer=measurer)
    finally:
        measurer.close()
        if trials_out is not None:
            trials_out.close()
    best, best_ms = result.final, result.final_ms  # the re-measured pick, as a job serves it
    if best is None:
        raise SystemExit("no candidate built and ran correctly")
    print(f"best {best_ms:.4f} ms (untuned {result.baseline_ms} ms) "
          f"in {time.perf_counter() - started:.0f} s; config {json.dumps(best.config)}")
    if args.out:
        write_artifact(Path(args.out), task.workload, apply_config(task, best.config), task.target, best_ms, spec,
                       layout_of_config(task, best.config), request.pipeline)
        print(f"artifact written to {args.out}")


def _add_spec_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("spec", nargs="?", help="JSON file with a job spec (as POST /api/v1/jobs takes)")
    p.add_argument("--operator", help="operator name from the catalog, e.g. conv2d")
    p.add_argument("--param", action="append", default=[], metavar="NAME=VALUE", help="operator parameter, repeatable")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--epilogue", default="none", choices=EPILOGUES)
    p.add_argument("--target", default="host")
    p.add_argument("--budget", type=int, default=64, help="number of on-device measurements")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--layout-levels", type=int, default=1, choices=[1, 2],
                   help="ALT's layout templates: 1 (one-level tiling) or 2 (two-level, a larger space)")
    p.add_argument("--no-licm", dest="licm", action="store_false",
                   help="build without our loop-invariant code motion (TVM's default TIR pipeline)")
    p.add_argument("--out", help="where to write the artifact (.tar.gz)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="altune", description="auto-tuning service for deep-learning compilation")
    parser.add_argument("--database-url", help="SQLAlchemy URL (default: $ALTUNE_DATABASE_URL or var/altune.db)")
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("serve", help="run the API and worker(s)")
    p.add_argument("--host")
    p.add_argument("--port", type=int)
    p.add_argument("--workers", type=int, default=1, help="worker processes to start beside the API (0: none)")
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("worker", help="run one worker against the database")
    p.set_defaults(func=cmd_worker)

    p = sub.add_parser("submit", help="submit a job to a running server")
    _add_spec_args(p)
    p.add_argument("--server", default="http://127.0.0.1:8000")
    p.add_argument("--wait", action="store_true", help="wait for the job and print its progress")
    p.add_argument("--token", help="a write token (default: $ALTUNE_TOKEN)")
    p.set_defaults(func=cmd_submit)

    p = sub.add_parser("tune", help="tune an operator locally, without a server (the same search as a job)")
    _add_spec_args(p)
    p.add_argument("--trials", help="write every measured trial here as JSON lines (index, config, stage, latency)")
    p.set_defaults(func=cmd_tune)

    p = sub.add_parser("token", help="API tokens: create, list, revoke")
    tsub = p.add_subparsers(dest="token_command", required=True)
    t = tsub.add_parser("create", help="make a token; it is printed once, only its hash is stored")
    t.add_argument("--scope", required=True, choices=["read", "write", "admin"],
                   help="read: GET everything; write: also submit, cancel, upload, delete its own jobs; "
                        "admin: also cancel and delete anyone's")
    t.add_argument("--name", help="a name to list and revoke it by (default: token-<id>)")
    for limit, what in (("max-queued", "jobs queued at once"), ("max-running", "jobs running at once"),
                        ("max-trials-per-day", "trials (job budgets) submitted per UTC day"),
                        ("max-upload-bytes-per-day", "bytes of model uploads per UTC day")):
        t.add_argument(f"--{limit}", type=int, help=f"{what} (default: ALTUNE_TOKEN_{limit.upper().replace('-', '_')})")
    t.set_defaults(func=cmd_token_create)
    tsub.add_parser("list", help="every token: id, name, scope, created, revoked, limits").set_defaults(
        func=cmd_token_list)
    t = tsub.add_parser("revoke", help="revoke a token (it answers 401 from then on)")
    t.add_argument("token", help="the token's id or name")
    t.set_defaults(func=cmd_token_revoke)

    p = sub.add_parser("db", help="database maintenance")
    dbsub = p.add_subparsers(dest="db_command", required=True)
    dbsub.add_parser("upgrade", help="apply the migrations").set_defaults(func=cmd_db_upgrade)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    args.func(args)


if __name__ == "__main__":
    main()
