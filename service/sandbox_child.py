"""The confined child of `service.sandbox`: `python -m service.sandbox_child <command> <request JSON>`.

The parent side (`service.sandbox.run`) starts it; this module is what runs in it: `confine` (rlimits, a network
namespace of its own), the preload of torch and TVM on a model of its own, `drop_privileges`, the audit hook
(`install_audit_hook`), then one command (`COMMANDS`) and its answer as one JSON object on stdout. See
`service.sandbox` for the walls and the commands.

torch, TVM and the project's compiler are imported inside the functions here on purpose: the child applies its
limits (`confine`) before anything heavy is imported, and only then imports them (`_preload`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import traceback
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
