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

The parent runs `python -m service.sandbox <command> <request JSON>` with the file as its stdin (an open
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
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, TypeVar

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
    import zipfile

    from compiler.workloads.operators import TensorSpec
    from compiler.workloads.pt2 import ModelError

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
    """Runs `command` of this module's `main` in a confined child (waiting for one of `limits.processes`); its result.

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
    from compiler.workloads.pt2 import ModelError

    nobody = _nobody() if os.geteuid() == 0 else None
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
        argv = [sys.executable, "-s", "-m", "service.sandbox", command,
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
                raise ModelError("file", f"{_WHAT.get(command, command)} took more than {limits.wall_seconds:g} s "
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


_WHAT = {"import": "loading the model", "prepare": "loading the model", "build": "building the model"}


def _reap(pid: int) -> None:
    """Kills whatever the child left running in its session (a process it started and did not wait for)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _death(command: str, code: int, limits: Limits, last: str) -> str:
    what = _WHAT.get(command, command)
    if code in (-signal.SIGXCPU, -signal.SIGKILL):
        return (f"{what} was stopped after {limits.cpu_seconds} s of CPU or out of memory "
                f"({limits.memory_bytes} bytes, the sandbox's limits); refused")
    if code < 0:
        return f"{what} crashed (signal {-code}); refused"
    return f"{what} failed (exit {code}: {last[-300:]}); refused"


def _nobody() -> tuple[int, int]:
    import pwd

    try:
        entry = pwd.getpwnam("nobody")
        return entry.pw_uid, entry.pw_gid
    except KeyError:
        return 65534, 65534


# ---------------------------------------------------------------------------
# The child


_refused: list[str] = []  # what the audit hook refused, for the answer


def confine(limits: Limits) -> dict:
    """Applies the limits to this process and leaves the network (while it has one thread); what was done."""
    import ctypes
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (limits.memory_bytes, limits.memory_bytes))
    resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_seconds, limits.cpu_seconds + 5))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_bytes, limits.file_bytes))
    resource.setrlimit(resource.RLIMIT_NOFILE, (limits.open_files, limits.open_files))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    libc = ctypes.CDLL(None, use_errno=True)
    facts: dict[str, Any] = {"network": "isolated"}
    if libc.unshare(CLONE_NEWNET) != 0:
        # without CAP_SYS_ADMIN: a user namespace of our own may still create a network namespace
        first = os.strerror(ctypes.get_errno())
        if os.geteuid() == 0 or libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) != 0:
            facts["network"] = f"shared (unshare: {first})"
    return facts


def drop_privileges() -> dict:
    """Root becomes `nobody`, with no supplementary groups and no way to gain privileges by exec; the ids."""
    import ctypes

    if os.geteuid() == 0:
        uid, gid = _nobody()
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)  # glibc applies it to every thread
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    return {"uid": os.getuid(), "euid": os.geteuid(), "gid": os.getgid(), "groups": os.getgroups()}


def install_audit_hook(home: str) -> None:
    """Refuses `BLOCKED_EVENTS` and opening files for writing outside `home` from now on (no way back)."""
    home = os.path.realpath(home) + os.sep
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC

    def hook(event: str, args: tuple) -> None:
        if event in BLOCKED_EVENTS:
            _refuse(event, args)
        elif event == "open" and len(args) >= 3 and isinstance(args[0], str | bytes):
            mode, flags = args[1], args[2]
            writes = any(c in mode for c in "wax+") if isinstance(mode, str) else bool((flags or 0) & write_flags)
            path = os.fsdecode(args[0])
            if writes and not os.path.realpath(path).startswith(home):
                _refuse(event, (path, mode))

    sys.addaudithook(hook)


def _refuse(event: str, args: tuple) -> None:
    detail = f"{event}{_brief_args(args)}"
    _refused.append(detail)
    raise PermissionError(f"the sandbox refuses {detail}")


def _brief_args(args: tuple) -> str:
    text = repr(args)
    return text[:200] + ("..." if len(text) > 200 else "")


def _preload(command: str) -> None:
    """Imports what loading and importing use and runs both once on a model of its own, before the hook
    (imports may start processes or load libraries) and before dropping root (as `nobody`, the
    interpreter's own library may be unreadable: a module first imported later would fail)."""
    if command in UNHOOKED:
        _preload_build()
        return
    import encodings.ascii  # noqa: F401 -- zipfile decodes names as cp437, sockets hosts as idna
    import encodings.cp437  # noqa: F401
    import encodings.idna  # noqa: F401
    import encodings.latin_1  # noqa: F401
    import io

    import torch

    from compiler.target import resolve_target
    from compiler.workloads.model import import_model
    from compiler.workloads.pt2 import load_exported_program, static_shapes

    class Warm(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(4, 4, 3, padding=1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.conv(x)).mean((2, 3)) + x.shape[0]

    program = torch.export.export(Warm(), (torch.ones(2, 4, 4, 4),),
                                  dynamic_shapes=({0: torch.export.Dim("batch", min=2, max=8)},))
    buf = io.BytesIO()
    torch.export.save(program, buf)
    for target in ("host",):
        import_model(static_shapes(load_exported_program(buf.getvalue())), layout="blocked",
                     target=resolve_target(target))


def _preload_build() -> None:
    """Runs the whole build on a model of its own (x @ w + x, through `build_served_from`), so that every module a
    build imports on first use (zipfile's codecs, the linker's driver, statistics, tarfile) is loaded while the
    interpreter's files are readable."""
    import numpy as np
    import tvm
    from tvm import relax

    from compiler.workloads.model.exchange import save_graph
    from compiler.workloads.model.importer import ModelGraph
    from compiler.workloads.operators import TensorSpec
    from service.model_build import SCHEDULES, build_served_from

    x = relax.Var("x", relax.TensorType((4, 4), "float32"))
    w = relax.Var("w", relax.TensorType((4, 4), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, w], attrs={"num_input": 1}):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(relax.op.add(relax.op.matmul(x, w), x)))
        bb.emit_func_output(out)
    eye = np.eye(4, dtype="float32")
    graph = ModelGraph(bb.get(), [eye], ["w"], [TensorSpec("x", (4, 4), "float32")],
                       [TensorSpec("output0", (4, 4), "float32")], {"w": "w"})
    request = {"target": "host", "layout": "none", "fusion": "none", "blocks": None, "max_tensor_elements": 1 << 20,
               "max_total_bytes": 1 << 30, "seed": 0, "pipeline": "licm", "report": {}, "tasks": {}, "spec": {},
               "torch_ms": None}
    from compiler.arrays import random_inputs

    inputs = random_inputs([((4, 4), "float32")], 0)
    with tempfile.TemporaryDirectory() as tmp:
        save_graph(graph, tmp, expected=[inputs[0] @ eye + inputs[0]])
        Path(tmp, SCHEDULES).write_text("{}")
        assert build_served_from(Path(tmp), request)["error"] is None
        tvm.ir.load_json(tvm.ir.save_json(graph.mod))


def _load(request: dict) -> Any:
    """The upload on stdin, loaded by the checking loader, its dynamic dimensions fixed."""
    from compiler.workloads.pt2 import load_exported_program, static_shapes

    with os.fdopen(0, "rb", closefd=False) as f:
        ep = load_exported_program(f, max_bytes=request["max_bytes"], max_unpacked_bytes=request["max_unpacked_bytes"],
                                   max_ratio=request["max_ratio"])
    return static_shapes(ep, request["input_shapes"], max_tensor_elements=request["max_tensor_elements"])


def _import(request: dict, _facts: dict) -> dict:
    from compiler.target import resolve_target
    from compiler.workloads.model import import_model

    ep = _load(request)
    model = import_model(ep, request["input_shapes"], layout=request["layout"],
                         target=resolve_target(request["target"]),
                         max_tensor_elements=request["max_tensor_elements"], fusion=request.get("fusion", "none"))
    return {"inputs": [[s.name, list(s.shape), s.dtype] for s in model.inputs],
            "tasks": [{"name": t.name, "workload_key": t.workload_key, "weight": t.weight} for t in model.tasks]}


def _prepare(request: dict, _facts: dict) -> dict:
    """Everything a model job needs of torch: the translated graph, the reference outputs on the job's random
    inputs (`ep.module()`), torch eager's latency; written as data (`exchange.save_graph`) into `graph/`."""
    from compiler.arrays import random_inputs
    from compiler.workloads.model import reference_outputs, time_torch
    from compiler.workloads.model.exchange import save_graph
    from compiler.workloads.model.importer import translate_model

    ep = _load(request)
    graph = translate_model(ep, request["input_shapes"], max_tensor_elements=request["max_tensor_elements"])
    inputs = random_inputs([(tuple(x.shape), x.dtype) for x in graph.inputs], request["seed"])
    module = ep.module()
    expected = reference_outputs(ep, inputs)
    torch_ms = None
    if request.get("time_torch", True):
        try:
            torch_ms = time_torch(module, inputs)
        except Exception:  # noqa: BLE001 - the reference ran; a timing failure is not the model's
            traceback.print_exc()
    save_graph(graph, Path(request["home"]) / PREPARED, expected=expected)
    return {"torch_ms": torch_ms}


def _build(request: dict, _facts: dict) -> dict:
    """A model job's final build (`service.model_build.build_served`) on the files the parent put in the home."""
    from service.model_build import build_served_from

    return build_served_from(Path(request["home"]), request)


def _probe(_request: dict, facts: dict) -> dict:
    """What the child runs under, and what it may not do (for tests and operators)."""
    import resource
    import socket

    def refused(action: Any) -> str:
        try:
            action()
        except PermissionError as e:
            return str(e)
        except OSError as e:  # allowed by the hook but failed: the network namespace, the user
            return f"failed: {e}"
        return "allowed"

    limits = {name: resource.getrlimit(getattr(resource, name))
              for name in ("RLIMIT_AS", "RLIMIT_CPU", "RLIMIT_FSIZE", "RLIMIT_NOFILE", "RLIMIT_CORE")}
    answer = facts | {
        "rlimits": limits, "interfaces": [name for _, name in socket.if_nameindex()],
        "os.system": refused(lambda: os.system("true")),
        "subprocess": refused(lambda: subprocess.run(["true"], check=False)),
        "socket": refused(lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM).connect(("127.0.0.1", 9))),
        "write /tmp": refused(lambda: open("/tmp/altune-sandbox-probe", "w").close()),
        "write home": refused(lambda: open(os.path.join(os.environ["HOME"], "probe"), "w").close()),
    }
    _refused.clear()  # refused on purpose
    return answer


def _zoo(request: dict, facts: dict) -> dict:
    """Exports zoo model `request["model"]` (`compiler.workloads.zoo.export` with `request["seed"]`), saves it as
    `request["file"]` in the home for the parent to collect (so the API process never imports torch), and
    imports that file as `_import` imports an upload; the same summary."""
    import torch

    from compiler.workloads import zoo

    name = request["file"]
    assert os.sep not in name and name not in (".", ".."), f"{name=} is not a plain file name"
    path = Path(request["home"]) / name
    torch.export.save(zoo.export(request["model"], request["seed"]), path)
    with open(path, "rb") as f:
        os.dup2(f.fileno(), 0)  # `_load` reads the program on stdin
    return _import(request, facts)


PREPARED = "graph"  # the folder `prepare` writes its files into, in the child's home
COMMANDS = {"import": _import, "prepare": _prepare, "probe": _probe, "build": _build, "zoo": _zoo}
# commands that run no uploaded program (a build on data the worker checked): no audit hook, since the
# build links a shared library with the system's compiler; the limits, the network and the user still apply
UNHOOKED = frozenset({"build"})


def _answer(command: str, request: dict, facts: dict, limits: Limits) -> dict:
    from compiler.workloads.pt2 import ModelError

    try:
        answer = {"ok": True, "result": COMMANDS[command](request, facts)}
    except ModelError as e:
        answer = {"ok": False, "field": e.field, "message": e.message}
    except MemoryError:
        answer = {"ok": False, "field": "file",
                  "message": f"{_WHAT.get(command, command)} needs more than {limits.memory_bytes} bytes of memory "
                             "(the sandbox's limit); refused"}
    except Exception as e:  # an import error of TVM's, or one the hook caused
        traceback.print_exc()
        if isinstance(e, RuntimeError) and "can't allocate memory" in str(e):  # torch's allocator, not MemoryError
            answer = {"ok": False, "field": "model",
                      "message": f"{_WHAT.get(command, command)} needs more than {limits.memory_bytes} bytes of "
                                 f"memory (the sandbox's limit, ALTUNE_SANDBOX_MEMORY_BYTES); refused"}
        else:
            what = "the build" if command in UNHOOKED else "import"
            answer = {"ok": False, "field": "model", "message": f"{what} failed: {type(e).__name__}: {str(e)[:300]}"}
    if _refused:  # whatever torch made of the refusal, the file tried something: say what
        answer = {"ok": False, "field": "file", "message": f"loading the file tried {_refused[0]}; refused"}
    return answer


def main(argv: list[str] | None = None) -> None:
    """The child: `python -m service.sandbox <command> <request JSON>`; the answer, one JSON object, on stdout."""
    argv = sys.argv[1:] if argv is None else argv
    command, request = argv[0], json.loads(argv[1])
    answer_fd = os.dup(1)
    os.dup2(2, 1)  # what libraries print goes to stderr: stdout carries the answer alone
    limits = Limits(**request.pop("limits"))
    try:
        facts = confine(limits)
        _preload(command)  # before dropping root: the interpreter's own files may be unreadable to nobody
        facts |= drop_privileges()
        if command not in UNHOOKED:
            install_audit_hook(request["home"])
    except BaseException as e:  # the sandbox itself failed (limits too low for torch and TVM): not the file's fault
        traceback.print_exc()
        answer = {"ok": False, "setup": f"{type(e).__name__}: {str(e)[:300]}"}
    else:
        answer = _answer(command, request, facts, limits)
    with os.fdopen(answer_fd, "w") as out:
        json.dump(answer, out)


if __name__ == "__main__":
    main()
