"""The confined child of `service.sandbox`: `python -m service.sandbox_child <command> <request JSON>`.

The parent side (`service.sandbox.run`) starts it; this module is what runs in it: `confine` (rlimits, a network
namespace of its own), the preload of torch and TVM on a model of its own, `drop_privileges`, the audit hook
(`install_audit_hook`), then one command (`COMMANDS`) and its answer as one JSON object on stdout. See
`service.sandbox` for the walls and the commands.

`prepare` may also time torch.compile (`_time_compiled`, when the request asks): inductor generates C++ from the
program's ATen graph, compiles it with the system's C++ compiler and loads the library, so for that call alone the
hook lets through starting the compiler (`COMPILERS`, from the system's folders) and loading libraries from the
child's home (`_allowing`); it runs under a timer that leaves the rest of the sandbox's time to the answer, and
whatever goes wrong in it only leaves the timing out.

torch, TVM and the project's compiler are imported inside the functions here on purpose: the child applies its
limits (`confine`) before anything heavy is imported, and only then imports them (`_preload`).
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from service.sandbox import (
    BLOCKED_EVENTS,
    CLONE_NEWNET,
    CLONE_NEWUSER,
    DOING,
    PR_SET_NO_NEW_PRIVS,
    PREPARED,
    UNHOOKED,
    Limits,
    nobody_ids,
)

_refused: list[str] = []  # what the audit hook refused, for the answer
_allowed: dict[str, Callable[[tuple], bool]] = {}  # event -> whether these arguments may pass (`_allowing`)
_STARTED = time.monotonic()  # the parent's wall-clock limit runs from about here

# torch.compile's C++ compilers (inductor's `cpp_compiler()`), run only from the system's folders
COMPILERS = frozenset({"g++", "gcc", "c++", "cc", "clang++", "clang"})
COMPILER_DIRS = ("/usr/bin", "/bin", "/usr/local/bin")
COMPILE_RESERVE_SECONDS = 20.0  # of the sandbox's wall and CPU limits, left to the timing and the answer
COMPILE_MIN_SECONDS = 30.0  # less than this left for torch.compile: not tried
_compile_broken: str | None = None  # why the warm-up compile (`_preload_compile`) failed


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
        uid, gid = nobody_ids()
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
        allowed = _allowed.get(event)
        if allowed is not None and allowed(args):
            return
        if event in BLOCKED_EVENTS:
            _refuse(event, args)
        elif event == "open" and len(args) >= 3 and isinstance(args[0], str | bytes):
            mode, flags = args[1], args[2]
            writes = any(c in mode for c in "wax+") if isinstance(mode, str) else bool((flags or 0) & write_flags)
            path = os.fsdecode(args[0])
            if writes and not os.path.realpath(path).startswith(home):
                _refuse(event, (path, mode))

    sys.addaudithook(hook)


@contextlib.contextmanager
def _allowing(rules: dict[str, Callable[[tuple], bool]]) -> Iterator[None]:
    """Lets the hook pass the events of `rules` whose arguments their check accepts, while the block runs."""
    _allowed.update(rules)
    try:
        yield
    finally:
        _allowed.clear()


def _compiler_rules(home: str) -> dict[str, Callable[[tuple], bool]]:
    """What torch.compile needs past the hook: the C++ compiler started (by name, or from the system's folders),
    libraries it wrote loaded from `home`."""
    home = os.path.realpath(home) + os.sep

    def compiler(args: tuple) -> bool:
        exe = os.fsdecode(args[0]) if args and isinstance(args[0], str | bytes) else ""
        folder, name = os.path.split(exe)
        return name in COMPILERS and (folder == "" or folder in COMPILER_DIRS)

    def library(args: tuple) -> bool:
        name = args[0] if args else None
        return isinstance(name, str | bytes) and os.path.realpath(os.fsdecode(name)).startswith(home)

    return {"subprocess.Popen": compiler, "os.posix_spawn": compiler, "ctypes.dlopen": library}


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


def _preload_compile(home: str) -> None:
    """Compiles a model of its own with torch.compile (as `_time_compiled` will), for the reason `_preload` imports:
    as `nobody` the interpreter's files may be unreadable, and a first compile imports some 1,000 modules (dynamo,
    inductor, setuptools' compiler helpers) and tests the compiler and the CPU's vector instructions. Inductor's
    cache goes in the home, handed to `nobody` afterwards. A failure here only leaves torch.compile's timing out
    (`_compile_broken`)."""
    global _compile_broken
    cache = os.path.join(home, "inductor")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
    try:
        import torch
        import torch._inductor.choices  # noqa: F401 -- imported by a second compile, not by the first
        import torch._inductor.config as inductor_config

        inductor_config.freezing = True  # frozen weights, as bench.timing_torch compiles
        inductor_config.compile_threads = 1  # its pool of compile workers would be processes of python

        class Warm(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.fc = torch.nn.Linear(4, 4)

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                return torch.relu(self.fc(x)) * 2

        _python_headers_for_nobody(home)
        x = torch.ones(2, 4)
        with torch.no_grad():
            torch.compile(torch.export.export(Warm().eval(), (x,)).module())(x)
        torch._dynamo.reset()
    except Exception as e:  # noqa: BLE001 - no compiler, a torch that cannot compile here: no timing, no failure
        traceback.print_exc()
        _compile_broken = f"torch.compile does not work in the sandbox: {type(e).__name__}: {str(e).strip()[:300]}"
    if os.geteuid() == 0 and os.path.isdir(cache):
        uid, gid = nobody_ids()
        for folder, dirs, files in os.walk(cache):
            for name in [folder, *(os.path.join(folder, n) for n in dirs + files)]:
                os.lchown(name, uid, gid)


def _python_headers_for_nobody(home: str) -> None:
    """Inductor's kernels are Python extensions (they include Python.h): when root becomes `nobody` and the
    interpreter's headers are out of its reach (an interpreter under /root), they are copied into the home and
    inductor is pointed at the copy."""
    import sysconfig

    import torch._inductor.cpp_builder as cpp_builder

    def reachable(path: Path) -> bool:
        return all(os.stat(p).st_mode & 0o005 == 0o005 for p in [path, *path.parents])

    include = Path(sysconfig.get_path("include"))
    if os.geteuid() != 0 or reachable(include):
        return
    copy = os.path.join(home, "python-include")
    shutil.copytree(include, copy)
    # the compiler refuses an include folder it cannot read; the library folder it may not read is left out
    libdirs = [d for d in [sysconfig.get_config_var("LIBDIR")] if d and os.path.isdir(d) and reachable(Path(d))]
    cpp_builder._get_python_related_args = lambda: ([copy], libdirs)


def _preload_build() -> None:
    """Runs the whole build on a model of its own (x @ w + x, through `service.model_build.build_from_files`), so that every module a
    build imports on first use (zipfile's codecs, the linker's driver, statistics, tarfile) is loaded while the
    interpreter's files are readable."""
    import numpy as np
    import tvm
    from tvm import relax

    from compiler.workloads.model.exchange import save_graph
    from compiler.workloads.model.importer import ModelGraph
    from compiler.workloads.operators import TensorSpec
    from service.model_build import SCHEDULES, build_from_files

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
    request = {"tune": {"target": "host", "max_tensor_elements": 1 << 20}, "blocks": None,
               "max_total_bytes": 1 << 30, "report": {}, "facts": {}, "spec": {}, "torch_ms": None}
    from compiler.arrays import random_inputs

    inputs = random_inputs([((4, 4), "float32")], 0)
    with tempfile.TemporaryDirectory() as tmp:
        save_graph(graph, tmp, expected=[inputs[0] @ eye + inputs[0]])
        Path(tmp, SCHEDULES).write_text("{}")
        assert build_from_files(Path(tmp), request)["error"] is None
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
            "tasks": [{"name": t.name, "workload_key": t.workload_key, "weight": t.weight, "complex": t.complex}
                      for t in model.tasks]}


def _prepare(request: dict, _facts: dict) -> dict:
    """Everything a model job needs of torch: the translated graph, the reference outputs on the job's random
    inputs (`ep.module()`), torch eager's latency; written as data (`exchange.save_graph`) into `graph/`. With
    `request["time_torch_compile"]`, torch.compile's latency too (`_time_compiled`), after the graph is written.

    Returns:
        {"torch_ms": eager ms or None, "torch_compile_ms": compiled ms or None, "torch_compile_note": why the
        compiled latency is missing, or None}.
    """
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
    eager_cpu = _cpu_seconds()
    if request.get("time_torch", True):
        try:
            torch_ms = time_torch(module, inputs)
        except Exception:  # noqa: BLE001 - the reference ran; a timing failure is not the model's
            traceback.print_exc()
    eager_cpu = _cpu_seconds() - eager_cpu
    save_graph(graph, Path(request["home"]) / PREPARED, expected=expected)
    compiled_ms, note = None, "not asked for"
    if request.get("time_torch_compile", False):
        limits = Limits(**request["limits"]) if "limits" in request else Limits()
        # the compiled model's timing costs about what eager's did, on every core: kept out of the compile's share
        compiled_ms, note = _time_compiled(module, inputs, request["home"], limits, 2 * eager_cpu)
    return {"torch_ms": torch_ms, "torch_compile_ms": compiled_ms, "torch_compile_note": note}


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _time_compiled(module: Any, inputs: list, home: str, limits: Limits,
                   timing_cpu: float) -> tuple[float | None, str | None]:
    """torch.compile's latency (inductor, frozen weights, as `bench.timing_torch`'s "compile" variant; timed as
    `time_torch` times eager), or None and why: not tried when less than `COMPILE_MIN_SECONDS` of the sandbox's
    wall or CPU limit is left; stopped by a timer before the limit would kill the child; any failure only
    leaves the timing out. The compiler and its libraries pass the audit hook meanwhile (`_compiler_rules`)."""
    import torch
    import torch._inductor.config as inductor_config

    from compiler.target import host_cores
    from compiler.workloads.model import time_torch
    from compiler.workloads.model.artifact import torch_arguments

    if _compile_broken is not None:
        return None, _compile_broken
    seconds = min(limits.wall_seconds - (time.monotonic() - _STARTED),
                  limits.cpu_seconds - _cpu_seconds() - timing_cpu) - COMPILE_RESERVE_SECONDS
    if seconds < COMPILE_MIN_SECONDS:
        return None, (f"skipped: {max(seconds, 0):.0f} s of the sandbox's time limits left, under the "
                      f"{COMPILE_MIN_SECONDS:g} s torch.compile is given at least")
    inductor_config.freezing = True  # as `_preload_compile` set them, for a caller that did not run it
    inductor_config.compile_threads = 1
    refused = len(_refused)
    threads = torch.get_num_threads()
    torch.set_num_threads(host_cores())  # inductor's kernels take their thread count at compile time
    try:
        compiled = torch.compile(module)
        args, kwargs = torch_arguments(module, inputs)
        with _allowing(_compiler_rules(home)), _timer(seconds), torch.no_grad():
            compiled(*args, **kwargs)  # compiles (guarded on no_grad, as the timing runs)
            return time_torch(compiled, inputs), None
    except (Exception, _TimeUp) as e:  # noqa: BLE001 - torch.compile's failure is torch's, not the model's or the job's
        traceback.print_exc()
        return None, f"failed: {type(e).__name__}: {str(e).strip()[:300]}"
    finally:
        torch.set_num_threads(threads)
        if len(_refused) > refused:
            # inductor asked for more than the compiler: refused (so it failed), and not the file's doing
            del _refused[refused:]


class _TimeUp(BaseException):
    """Not an `Exception`: no handler of torch's that falls back (to eager) may take it for a compile error."""


@contextlib.contextmanager
def _timer(seconds: float) -> Iterator[None]:
    """Raises `_TimeUp` in this (the main) thread after `seconds` of wall clock."""
    def ring(_signum: int, _frame: Any) -> None:
        raise _TimeUp(f"torch.compile and its timing took more than {seconds:.0f} s (what the sandbox's time "
                      "limits left it)")

    previous = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _build(request: dict, _facts: dict) -> dict:
    """A model job's final build (`tuner.model.serve_model`) on the files the parent put in the home."""
    from service.model_build import build_from_files

    return build_from_files(Path(request["home"]), request)


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


COMMANDS = {"import": _import, "prepare": _prepare, "probe": _probe, "build": _build, "zoo": _zoo}


def _answer(command: str, request: dict, facts: dict, limits: Limits) -> dict:
    from compiler.workloads.pt2 import ModelError

    try:
        answer = {"ok": True, "result": COMMANDS[command](request, facts)}
    except ModelError as e:
        answer = {"ok": False, "field": e.field, "message": e.message}
    except MemoryError:
        answer = {"ok": False, "field": "file",
                  "message": f"{DOING.get(command, command)} needs more than {limits.memory_bytes} bytes of memory "
                             "(the sandbox's limit); refused"}
    except Exception as e:  # an import error of TVM's, or one the hook caused
        traceback.print_exc()
        if isinstance(e, RuntimeError) and "can't allocate memory" in str(e):  # torch's allocator, not MemoryError
            answer = {"ok": False, "field": "model",
                      "message": f"{DOING.get(command, command)} needs more than {limits.memory_bytes} bytes of "
                                 f"memory (the sandbox's limit, ALTUNE_SANDBOX_MEMORY_BYTES); refused"}
        else:
            what = "the build" if command in UNHOOKED else "import"
            answer = {"ok": False, "field": "model", "message": f"{what} failed: {type(e).__name__}: {str(e)[:300]}"}
    if _refused:  # whatever torch made of the refusal, the file tried something: say what
        answer = {"ok": False, "field": "file", "message": f"loading the file tried {_refused[0]}; refused"}
    return answer


def main(argv: list[str] | None = None) -> None:
    """The child: `python -m service.sandbox_child <command> <request JSON>`; the answer, one JSON object, on stdout."""
    argv = sys.argv[1:] if argv is None else argv
    command, request = argv[0], json.loads(argv[1])
    answer_fd = os.dup(1)
    os.dup2(2, 1)  # what libraries print goes to stderr: stdout carries the answer alone
    limits = Limits(**request["limits"])  # `_prepare` reads them too
    try:
        facts = confine(limits)
        _preload(command)  # before dropping root: the interpreter's own files may be unreadable to nobody
        if command == "prepare" and request.get("time_torch_compile"):
            _preload_compile(request["home"])
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
