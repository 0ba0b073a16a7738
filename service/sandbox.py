"""Work on an untrusted file in a confined child process: everything torch does with an uploaded model.

    summary = import_upload(path, settings, input_shapes=None, layout="blocked", target="host")
    summary.inputs, summary.tasks                      # what the API stores; ModelError -> 422
    result, collected = run("prepare", request, stdin=f, limits=..., collect=copy_out, should_stop=run.stop_check)

Commands: `import` (the API: load, import, the task list), `zoo` (the API: a built-in model exported and imported
outside the API process), `prepare` (a model job's first step in the worker: load, translate to Relax, the
reference outputs of `ep.module()` and torch eager's latency, written as data files for the worker to check,
`compiler.workloads.model.exchange`), `build` (a model job's last step: `service.model_build` on files the
worker checked; no audit hook, since the artifact is linked by the system's compiler, and nothing of the upload
runs there) and `probe` (what the child may do, for tests). The API and the worker run the same child.

The parent runs `python -m service.sandbox_child <command> <request JSON>` (the child's side is that module) with the file as its stdin (an open
descriptor: the child needs no permission on the models folder), in a new session, with a minimal
environment and a private home and temp folder (holding only the files the caller gave it); it kills the
session after `sandbox_timeout_seconds`, or as soon as the caller's `should_stop` gives a reason (a cancel, a
lost lease, a job's deadline), and runs at most `sandbox_processes` children at once. What the child wrote in
its home is the caller's to read (`collect`), as hostile data, before the folder goes. Before it reads the
file, the child confines itself:

1. `confine`, while it has one thread: rlimits on address space (`RLIMIT_AS`), CPU seconds, file size,
   open files and core dumps; a network namespace of its own (`unshare(CLONE_NEWNET)`: a loopback that
   is down; unprivileged, with a user namespace; neither permitted, e.g. in a container without
   CAP_SYS_ADMIN: the network stays, the audit hook still refuses sockets, and the probe says so);
2. imports torch and TVM and runs the loader and the import once on a model of its own (as `nobody`
   the interpreter's own files may be unreadable, and first imports start processes);
3. `drop_privileges`: when root, `nobody` with no supplementary groups; `PR_SET_NO_NEW_PRIVS`;
4. `install_audit_hook` (`sys.addaudithook`, for good): refuses starting processes (`os.system`,
   `subprocess.Popen`, `os.exec*`, `os.posix_spawn`, `os.fork`), sockets, `ctypes` loading libraries,
   signals and opening files for writing outside its temp folder.

The answer is one JSON object on the child's stdout (libraries' prints go to stderr). A refusal, a
child killed by a limit or timed out is a `ModelError` (422, naming the limit); a child that could not
set itself up (limits too low for torch and TVM) a `SandboxError` (the API answers 503).

The loader itself (`compiler.workloads.pt2`) evaluates nothing from the file; the sandbox is the second
wall, and what bounds memory and time, which no check of the file can.
"""

from __future__ import annotations

import functools
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, TypeVar

from compiler.workloads.pt2.rules import ModelError
from compiler.workloads.spec import TensorSpec

if TYPE_CHECKING:
    from service.settings import Settings

T = TypeVar("T")
HOST_CPU_ENV = "ALTUNE_HOST_CPU"  # compiler.target.HOST_CPU_ENV (the API imports no TVM)
ROOT = Path(__file__).resolve().parents[1]  # `python -m service.sandbox` runs from here
CLONE_NEWUSER, CLONE_NEWNET, PR_SET_NO_NEW_PRIVS = 0x10000000, 0x40000000, 38
ANSWER_LIMIT = 16 << 20  # bytes of the child's answer read back
BLOCKED_EVENTS = frozenset({
    "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "pty.spawn",
    "subprocess.Popen", "socket.__new__", "socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg",
    "socket.getaddrinfo", "socket.gethostbyname", "ctypes.dlopen", "os.kill", "os.killpg", "signal.pthread_kill",
    "webbrowser.open",
})


@dataclass(frozen=True)
class Limits:
    """What the child may use. Defaults: 8 GiB of address space, 5 minutes of CPU and of wall clock.

    `processes` children run at once in this process (the others wait their turn), so that several
    uploads together stay within `processes` x `memory_bytes`.
    """

    memory_bytes: int = 8 << 30
    cpu_seconds: int = 300
    wall_seconds: float = 300.0
    file_bytes: int = 256 << 20  # its stderr and anything torch or TVM write to its temp folder
    open_files: int = 256
    processes: int = 2


@dataclass(frozen=True)
class TaskSummary:
    name: str
    workload_key: str
    weight: int
    complex: bool = False  # a conv or a matrix product (`ModelTask.complex`)


@dataclass(frozen=True)
class ModelSummary:
    """What the API keeps of an imported upload: the inputs (as `TensorSpec`s) and the tasks."""

    inputs: list[Any]
    tasks: list[TaskSummary]


def limits_from(settings: Settings) -> Limits:
    return Limits(memory_bytes=settings.sandbox_memory_bytes, cpu_seconds=settings.sandbox_cpu_seconds,
                  wall_seconds=settings.sandbox_timeout_seconds, processes=settings.sandbox_processes,
                  # the translated weights are written back as files: as large as the unpacked upload
                  file_bytes=max(Limits.file_bytes, settings.max_unpacked_bytes + (64 << 20)))


@functools.cache
def _slots(processes: int) -> threading.BoundedSemaphore:
    return threading.BoundedSemaphore(processes)


def import_upload(path: str | os.PathLike, settings: Settings, *, input_shapes: list[list[int]] | None,
                  layout: str, target: str, fusion: str = "none") -> ModelSummary:
    """Loads and imports an uploaded `.pt2` in the sandbox (`compiler.workloads.model.import_model` there).

    Raises:
        ModelError: what the loader or the import blames ("file", "model", "input_shapes", "layout"), or
            "file" when the child exceeded a limit or died.
        SandboxError: the child could not set itself up.
    """
    if not zipfile.is_zipfile(path):  # reads the end-of-archive record only; spares junk a child process
        raise ModelError("file", "not a torch.export program (.pt2): the file is not a zip archive")
    request = {
        "input_shapes": input_shapes, "layout": layout, "target": target, "fusion": fusion,
        "max_tensor_elements": settings.max_tensor_elements, "max_bytes": settings.max_upload_bytes,
        "max_unpacked_bytes": settings.max_unpacked_bytes, "max_ratio": settings.max_zip_ratio,
    }
    with open(path, "rb") as f:
        result = run("import", request, stdin=f, limits=limits_from(settings))
    return ModelSummary(inputs=[TensorSpec(name, tuple(shape), dtype) for name, shape, dtype in result["inputs"]],
                        tasks=[TaskSummary(**t) for t in result["tasks"]])


class SandboxError(RuntimeError):
    """The child could not set itself up (limits too low for torch and TVM, a broken install): not the file's fault."""


def run(command: str, request: dict, *, stdin: IO[bytes] | None = None, limits: Limits = Limits(),
        files: dict[str, Path] | None = None, collect: Callable[[Path], T] | None = None,
        should_stop: Callable[[], str | None] | None = None) -> dict | tuple[dict, T]:
    """Runs `command` of `service.sandbox_child` in a confined child (waiting for one of `limits.processes`); its result.

    Args:
        files: copied into the child's private home folder before it starts (name -> source), readable by it.
        collect: called with the home folder after the child answered and before the folder is removed (what
            the child wrote there is hostile data: read it as such); then `(result, collect(home))` is returned.
        should_stop: polled while the child runs; a reason it returns kills the child's session at once, and
            `Stopped(reason)` is raised.

    Raises:
        ModelError: the child's own refusal (loader or import), or a limit it ran into.
        SandboxError: the child could not set itself up.
        Stopped: `should_stop` asked for it.
    """
    with _slots(limits.processes):
        return _run(command, request, stdin, limits, files or {}, collect, should_stop)


class Stopped(RuntimeError):
    """The child was killed because the caller's `should_stop` gave a reason (a cancel, a deadline, a lost lease)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _run(command: str, request: dict, stdin: IO[bytes] | None, limits: Limits, files: dict[str, Path],
         collect: Callable[[Path], Any] | None, should_stop: Callable[[], str | None] | None) -> Any:
    nobody = nobody_ids() if os.geteuid() == 0 else None
    with tempfile.TemporaryDirectory(prefix="altune-sandbox-") as home, \
            tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        for name, source in files.items():
            shutil.copyfile(source, Path(home) / name)
            os.chmod(Path(home) / name, 0o644)
        if nobody is not None:
            os.chown(home, *nobody)
        env = {"PATH": "/usr/bin:/bin", "HOME": home, "TMPDIR": home, "LANG": "C.UTF-8", "MALLOC_ARENA_MAX": "2",
               "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": str(ROOT)}
        if command not in UNHOOKED:  # a build times the model on every core, as it will run
            env |= {"OMP_NUM_THREADS": "1", "TVM_NUM_THREADS": "1"}
        if os.environ.get(HOST_CPU_ENV):  # the CPU the user named: the child's target is the parent's
            env[HOST_CPU_ENV] = os.environ[HOST_CPU_ENV]
        argv = [sys.executable, "-s", "-m", "service.sandbox_child", command,
                json.dumps(request | {"limits": asdict(limits), "home": home})]
        proc = subprocess.Popen(argv, stdin=stdin if stdin is not None else subprocess.DEVNULL, stdout=out,
                                stderr=err, cwd=ROOT, env=env, start_new_session=True, close_fds=True)
        deadline = time.monotonic() + limits.wall_seconds
        code, reason = None, None
        while code is None:
            try:
                code = proc.wait(timeout=min(0.5, max(deadline - time.monotonic(), 0.01)))
            except subprocess.TimeoutExpired:
                reason = should_stop() if should_stop is not None else None
                if reason is None and time.monotonic() < deadline:
                    continue
                os.killpg(proc.pid, signal.SIGKILL)  # the session: the child and anything it started
                proc.wait()
                if reason is not None:
                    raise Stopped(reason) from None
                raise ModelError("file", f"{DOING.get(command, command)} took more than {limits.wall_seconds:g} s "
                                         "(the sandbox's limit); refused") from None
        _reap(proc.pid)
        out.seek(0)
        answer = out.read(ANSWER_LIMIT)
        err.seek(max(0, err.seek(0, os.SEEK_END) - 2000))
        tail = err.read().decode(errors="replace").strip().splitlines()
        try:
            parsed = json.loads(answer)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict) and parsed.get("ok") is True:
            return (parsed["result"], collect(Path(home))) if collect is not None else parsed["result"]
    if isinstance(parsed, dict) and "setup" in parsed:
        raise SandboxError(f"the sandbox could not start: {parsed['setup']}")
    if isinstance(parsed, dict) and parsed.get("ok") is False:
        raise ModelError(str(parsed.get("field", "file")), str(parsed.get("message")))
    raise ModelError("file", _death(command, code, limits, tail[-1] if tail else ""))


DOING = {"import": "loading the model", "prepare": "loading the model", "build": "building the model"}
PREPARED = "graph"  # the folder `prepare` writes its files into, in the child's home
# commands that run no uploaded program (a build on data the worker checked): no audit hook, since the
# build links a shared library with the system's compiler; the limits, the network and the user still apply
UNHOOKED = frozenset({"build"})


def _reap(pid: int) -> None:
    """Kills whatever the child left running in its session (a process it started and did not wait for)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _death(command: str, code: int, limits: Limits, last: str) -> str:
    what = DOING.get(command, command)
    if code in (-signal.SIGXCPU, -signal.SIGKILL):
        return (f"{what} was stopped after {limits.cpu_seconds} s of CPU or out of memory "
                f"({limits.memory_bytes} bytes, the sandbox's limits); refused")
    if code < 0:
        return f"{what} crashed (signal {-code}); refused"
    return f"{what} failed (exit {code}: {last[-300:]}); refused"


def nobody_ids() -> tuple[int, int]:
    try:
        entry = pwd.getpwnam("nobody")
        return entry.pw_uid, entry.pw_gid
    except KeyError:
        return 65534, 65534
