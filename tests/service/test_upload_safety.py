"""Upload safety: nothing from an uploaded file is evaluated, its size is bounded before it is held in
memory or inflated, and it is loaded in a confined child process.

Each door of torch's loader is a real `.pt2` (`torch.export.save` of a tiny module with a dynamic
dimension) with a member rewritten to carry a payload that would touch a marker file, or import a
module with a visible side effect; it is posted through the API (422 naming the problem, no marker,
nothing stored, no job) and given to the worker's loader directly.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import sys
import zipfile

import pytest

torch = pytest.importorskip("torch")

from support.jobs import upload_model  # noqa: E402
from support.models import program_bytes  # noqa: E402

from compiler.workloads import pt2  # noqa: E402
from service import sandbox  # noqa: E402
from service.db import session_scope  # noqa: E402
from service.models import Job  # noqa: E402


class Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x)) + x.shape[0]


@pytest.fixture
def settings(sqlite_url, tmp_path):
    """SQLite only: what these tests check happens before the database (storing a job is test_models.py's)."""
    from service.settings import Settings

    return Settings(database_url=sqlite_url, data_dir=tmp_path, lease_seconds=5, poll_seconds=0.2)


@pytest.fixture(scope="module")
def program() -> bytes:
    """A genuine program with a dynamic batch (2..64, exported at 5): its sizes are `expr_str`s."""
    batch = torch.export.Dim("batch", min=2, max=64)
    return program_bytes(torch.export.export(Tiny(), (torch.randn(5, 4),), dynamic_shapes={"x": {0: batch}}))


@pytest.fixture(scope="module")
def static_program() -> bytes:
    """The same with static shapes: the old import went on to `run_decompositions` with these."""
    return program_bytes(torch.export.export(Tiny(), (torch.randn(5, 4),)))


@pytest.fixture(scope="module")
def bomb(static_program) -> bytes:
    """A genuine program plus an unused weight record of 10^9 zero bytes, deflated to about 1 MB."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(static_program)) as src, zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist():
            dst.writestr(info, src.read(info))
        info = zipfile.ZipInfo(f"{src.infolist()[0].filename.split('/')[0]}/data/weights/weight_99")
        info.compress_type = zipfile.ZIP_DEFLATED
        with dst.open(info, "w", force_zip64=True) as f:
            zeros = bytes(10**9 // 64)
            for _ in range(64):
                f.write(zeros)
    return out.getvalue()


def _rewrite(data: bytes, model=None, members: dict[str, bytes] | None = None, deflate: bool = False) -> bytes:
    """`data` with `model(json)` applied to models/model.json and `members` (under the root) added or replaced."""
    members = dict(members or {})
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as src, zipfile.ZipFile(out, "w") as dst:
        root = src.infolist()[0].filename.split("/")[0]
        for info in src.infolist():
            rest = info.filename.split("/", 1)[1]
            body = members.pop(rest) if rest in members else src.read(info)
            if rest == "models/model.json" and model is not None:
                parsed = json.loads(body)
                model(parsed)
                body = json.dumps(parsed).encode()
            dst.writestr(info, body)
        for rest, body in members.items():
            dst.writestr(f"{root}/{rest}", body, zipfile.ZIP_DEFLATED if deflate else zipfile.ZIP_STORED)
    return out.getvalue()


def _touch(marker) -> str:
    return f"__import__('os').system('touch {marker}')"


def _node(model: dict, target: str) -> dict:
    return next(n for n in model["graph_module"]["graph"]["nodes"] if n["target"] == target)


def _spec(model: dict) -> dict:
    return model["graph_module"]["module_call_graph"][0]["signature"]


def _treespec(typ: str, context) -> str:
    return json.dumps([1, {"type": typ, "context": context, "children_spec": []}])


# door -> (edit of models/model.json given the marker, what the 422 names, a module its payload imports);
# the program is the static one but for the doors in DYNAMIC
DOORS = {
    "expr_str": (lambda m, mark: m["graph_module"]["graph"]["tensor_values"]["x"]["sizes"][0]["as_expr"].update(
        expr_str=_touch(mark)), "symbolic expression (expr_str)", None),
    "guards_code": (lambda m, mark: m.update(guards_code=[_touch(mark)]), "guards_code entry", None),
    "in_spec enum": (lambda m, mark: _spec(m).update(in_spec=_treespec(
        "builtins.dict", json.dumps([{"__enum__": True, "fqn": "this:s", "name": "x"}]))), "enum", "this"),
    "out_spec defaultdict": (lambda m, mark: _spec(m).update(out_spec=_treespec(
        "collections.defaultdict", {"default_factory_module": "__hello__", "default_factory_name": "main",
                                    "dict_context": []})), "collections.defaultdict", "__hello__"),
    "target": (lambda m, mark: _node(m, "torch.ops.aten.relu.default").update(
        target="torch.os.system", inputs=[{"name": "", "arg": {"as_string": f"touch {mark}"}, "kind": 1}]),
        "'torch.os.system' is not an aten operator", None),
    "node name": (lambda m, mark: _node(m, "torch.ops.aten.relu.default").update(name=f"relu; {_touch(mark)}"),
                  "not a Python identifier", None),
    "parameter name": (lambda m, mark: m["graph_module"]["signature"]["input_specs"][0]["parameter"].update(
        parameter_name=f"linear.weight\r{_touch(mark)}"), "is not an attribute path", None),
    "parameter name quote": (lambda m, mark: m["graph_module"]["signature"]["input_specs"][0]["parameter"].update(
        parameter_name=f'linear.a"); {_touch(mark)}; ("'), "is not an attribute path", None),
    "stack trace": (lambda m, mark: _node(m, "torch.ops.aten.relu.default")["metadata"].update(
        stack_trace=f'File "a.py", line 1, in f\n    x\r{_touch(mark)}'), "carriage return", None),
    # torch counts up to an unbacked symbol's number, and sympy computes the power: both hang the old loader
    "range_constraints": (lambda m, mark: m["range_constraints"].update({"u999999999999": {
        "min_val": 0, "max_val": 1}}), "range_constraints", None),
    "sym_int_values": (lambda m, mark: m["graph_module"]["graph"]["sym_int_values"].update(
        sym_size_int_1={"as_expr": {"expr_str": "Pow(Integer(10), Integer(10000000000))", "hint": None}}),
        "Pow whose second argument is not a literal up to 64", None),
    "custom object": (lambda m, mark: m["graph_module"]["graph"]["custom_obj_values"].update(
        obj={"name": "obj", "class_fqn": "__torch__.torch.classes.os.system"}), "custom objects", None),
    "subgraph": (lambda m, mark: _node(m, "torch.ops.aten.relu.default").update(
        target="torch.ops.higher_order.cond"), "higher-order operator", None),
}
DYNAMIC = {"expr_str", "range_constraints", "sym_int_values"}
# the doors that ran code (or imported a module) in the API process before this loader
EXECUTED = ["expr_str", "guards_code", "in_spec enum", "out_spec defaultdict"]


@pytest.fixture
def door_file(program, static_program, tmp_path):
    """door name -> the program carrying it, its payload aimed at tmp_path/pwned."""
    def make(name: str) -> bytes:
        edit = DOORS[name][0]
        return _rewrite(program if name in DYNAMIC else static_program, lambda m: edit(m, tmp_path / "pwned"))

    return make


def _stored(settings) -> list[str]:
    """Everything in the models folder, temporary files included."""
    folder = settings.resolved_artifact_dir / "models"
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def _jobs(settings) -> int:
    with session_scope(settings.resolved_database_url) as s:
        return s.query(Job).count()


def _refused(response, text: str, loc=("body", "file")) -> str:
    assert response.status_code == 422, response.text
    (detail,) = response.json()["detail"]
    assert tuple(detail["loc"]) == loc and text in detail["msg"], detail
    return detail["msg"]


@pytest.mark.sandbox
@pytest.mark.parametrize("door", EXECUTED)
def test_upload_that_would_run_code_is_422_and_runs_nothing(client, settings, door_file, tmp_path, door):
    marker, module = tmp_path / "pwned", DOORS[door][2]
    if module is not None and module in sys.modules:
        pytest.skip(f"{module} was imported before this test")
    r = upload_model(client, door_file(door))
    _refused(r, DOORS[door][1])
    assert not marker.exists()
    assert module is None or module not in sys.modules
    assert _stored(settings) == [] and _jobs(settings) == 0


@pytest.mark.parametrize("door", sorted(DOORS))
def test_worker_loader_refuses_every_door(door_file, tmp_path, door):
    marker = tmp_path / "pwned"
    path = tmp_path / "door.pt2"
    path.write_bytes(door_file(door))
    with pytest.raises(pt2.ModelError) as info:
        pt2.load_exported_program(path)
    assert info.value.field == "file" and DOORS[door][1] in info.value.message, info.value.message
    assert not marker.exists()


class KwargsNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)

    def forward(self, x: torch.Tensor, *, k: torch.Tensor) -> torch.Tensor:
        return self.linear(x) * k


@pytest.fixture(scope="module")
def kwargs_program() -> bytes:
    """A genuine program of `forward(self, x, *, k)`: its in_spec's kwargs dict has the key "k"."""
    return program_bytes(torch.export.export(KwargsNet(), (torch.randn(2, 4),), {"k": torch.randn(2, 3)}))


def _kwargs_key_door(data: bytes, statement: str) -> bytes:
    """The kwargs key edited so that FX's source for `ep.module()` runs `statement` at module level."""
    key = f"q':k}}), self._in_spec)\n{statement}\ndef _u(self=None,x=None,k=None):\n    _=(([x],{{'q"

    def edit(m: dict) -> None:
        spec = json.loads(_spec(m)["in_spec"])
        spec[1]["children_spec"][1]["context"] = json.dumps([key])
        _spec(m)["in_spec"] = json.dumps(spec)

    return _rewrite(data, edit)


KWARGS_PAYLOADS = {
    # the sandbox's audit hook sees os.system at once; this one waits for a process outside the sandbox
    "quiet": lambda mark: f"if 'sandbox' not in __import__('os').environ.get('HOME', ''): "
                          f"__import__('os').system('touch {mark}')",
    "loud": lambda mark: _touch(mark),
}


@pytest.mark.parametrize("payload", sorted(KWARGS_PAYLOADS))
def test_loader_refuses_kwargs_key_payloads(kwargs_program, tmp_path, payload):
    """The worker's loader, given the stored file: refused, naming the key, and nothing ran."""
    marker, path = tmp_path / "pwned", tmp_path / "door.pt2"
    path.write_bytes(_kwargs_key_door(kwargs_program, KWARGS_PAYLOADS[payload](marker)))
    with pytest.raises(pt2.ModelError) as info:
        pt2.load_exported_program(path)
    assert info.value.field == "file" and "keyword argument \"q':k})" in info.value.message, info.value.message
    assert not marker.exists()


@pytest.mark.sandbox
@pytest.mark.parametrize("payload", sorted(KWARGS_PAYLOADS))
def test_kwargs_key_payloads_leave_no_marker_in_the_api_or_the_worker(client, settings, kwargs_program, tmp_path,
                                                                     payload):
    """The payload uploaded: 422 and nothing ran. The same payload put in place of a stored job's file: the job
    fails in the worker's sandbox (the worker itself never loads it), and nothing ran."""
    from service.worker import Worker

    marker = tmp_path / "pwned"
    door = _kwargs_key_door(kwargs_program, KWARGS_PAYLOADS[payload](marker))
    _refused(upload_model(client, door), "keyword argument")
    assert not marker.exists() and _jobs(settings) == 0
    r = upload_model(client, kwargs_program)
    assert r.status_code == 201, r.text
    job = r.json()
    with open(job["spec"]["model_file"], "wb") as f:
        f.write(door)
    assert Worker(settings).run_once() == job["id"]
    done = client.get(f"/api/v1/jobs/{job['id']}").json()
    assert done["status"] == "failed" and "keyword argument" in done["error"], done["error"]
    assert not marker.exists()


def test_loader_loads_genuine_kwargs_program(kwargs_program, tmp_path):
    path = tmp_path / "kw.pt2"
    path.write_bytes(kwargs_program)
    ep = pt2.load_exported_program(path)
    assert ep.module()(torch.ones(2, 4), k=torch.ones(2, 3)).shape == (2, 3)


@pytest.mark.builds_model
@pytest.mark.parametrize("name", ["regnet_x_400mf", "gpt_block", "transformer_decoder", "dict_out"])
def test_loader_accepts_real_models_names_and_constants(tmp_path, name):
    """regnet's module paths have hyphens (`block4-11`), causal masks write `-Infinity`, dict outputs keys such
    as "aux-features": each a file as `torch.export.save` writes it, loaded from disk."""
    corpus = pytest.importorskip("bench.corpus")
    path = tmp_path / f"{name}.pt2"
    ep = corpus.export(name)
    torch.export.save(ep, path)
    loaded = pt2.load_exported_program(path)
    assert set(loaded.state_dict) == set(ep.state_dict)
    if name == "regnet_x_400mf":
        assert any("-" in fqn for fqn in loaded.state_dict), sorted(loaded.state_dict)[:5]


@pytest.mark.sandbox
def test_worker_refuses_a_stored_file_that_was_swapped(client, settings, static_program, door_file, tmp_path):
    """A job whose stored file carries a payload (stored before this loader, or changed on disk) fails."""
    from service.worker import Worker

    r = upload_model(client, static_program)
    assert r.status_code == 201, r.text
    job = r.json()
    marker = tmp_path / "pwned"
    with open(job["spec"]["model_file"], "wb") as f:
        f.write(door_file("expr_str"))
    assert Worker(settings).run_once() == job["id"]
    done = client.get(f"/api/v1/jobs/{job['id']}").json()
    assert done["status"] == "failed" and "symbolic expression (expr_str)" in done["error"], done["error"]
    assert not marker.exists()


def test_payload_members_that_unpickle_are_refused(program, tmp_path):
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    evil = pickle.dumps(Evil())
    cases = {
        "opaque constant": (_rewrite(program, members={"data/constants/opaque_obj_0": evil}), "opaque_obj_0"),
        "custom object": (_rewrite(program, members={"data/constants/custom_obj_0": evil}), "custom_obj_0"),
        "legacy weights": (_rewrite(program, members={"data/weights/model.pt": evil}), "model.pt"),
        "second program": (_rewrite(program, members={"models/other.json": b"{}"}), "other.json"),
    }
    with zipfile.ZipFile(io.BytesIO(program)) as z:
        name = next(n for n in z.namelist() if n.endswith("model_weights_config.json"))
        config = json.loads(z.read(name))
    entry = next(iter(config["config"].values()))
    entry["use_pickle"] = True
    cases["use_pickle"] = (_rewrite(program, members={name.split("/", 1)[1]: json.dumps(config).encode()}),
                           "pickled")
    entry["use_pickle"], entry["tensor_meta"]["sizes"] = False, [{"as_int": 10**6}, {"as_int": 10**6}]
    cases["tensor past its record"] = (_rewrite(program, members={name.split("/", 1)[1]: json.dumps(config).encode()}),
                                       "reaching element")
    buf = io.BytesIO()
    torch.save(Evil(), buf)
    cases["sample inputs"] = (_rewrite(program, members={"data/sample_inputs/model.pt": buf.getvalue()}),
                              "posix system")
    for case, (data, text) in cases.items():
        with pytest.raises(pt2.ModelError) as info:
            pt2.load_exported_program(data)
        assert text in info.value.message, (case, info.value.message)
    assert not marker.exists()


def test_expressions_torch_writes_are_accepted():
    """What `torch.export.save` writes for dynamic shapes (sympy srepr), unbacked symbols and guards."""
    for text in ["Symbol('s77', positive=True, integer=True)",
                 "FloorDiv(Add(Mul(Integer(4), Symbol('s17', positive=True, integer=True)), Integer(-1)), Integer(3))",
                 "Mod(Add(Symbol('s17', integer=True), Symbol('s77', integer=True)), Integer(5))",
                 "StrictLessThan(Symbol('u0', integer=True), Integer(10))",
                 "Pow(Symbol('s0', integer=True), Integer(2))",
                 "Max(Integer(1), Symbol('s0'))", "Float('1.5', precision=53)", "true", "2*s39", "s0 + 1"]:
        pt2.check_sym_expr(text)
    for text in ["((4*L['y'].size()[0] + 4*L['x'].size()[0]) // 3) <= 4*L['y'].size()[0]",
                 "L['x'].size()[0] > 3", "L['y'].stride()[1] == L['x'].size()[1] and not L['x'].storage_offset()"]:
        pt2.check_guard(text)
    for text in ["Symbol('s0').__class__", "Integer(1) if True else 0", "Pow(Integer(10), Integer(100000))",
                 "Symbol('__import__')", "Integer(10**100)", "(lambda: 0)()", "getattr(Integer, 'x')", "s0[0]",
                 "Symbol('s0', evaluate=eval)"]:
        with pytest.raises(pt2.ModelError):
            pt2.check_sym_expr(text)
    for text in ["L['x'].size()[0] > open('f').read()", "L['x'].__class__", "L['x\"'].size()[0] > 1",
                 "L['x'].size()[0] > 1 if True else 0", "[i for i in ()]"]:
        with pytest.raises(pt2.ModelError):
            pt2.check_guard(text)


# ---------------------------------------------------------------------------
# Sizes: zip bombs, uploads over the limit


@pytest.mark.sandbox
def test_zip_bomb_is_refused_before_inflating(client, settings, bomb):
    """10^9 bytes deflated into about 1 MB: refused by its ratio, read from the central directory."""
    assert len(bomb) < 2 << 20
    msg = _refused(upload_model(client, bomb), "weight_99")
    assert "a zip bomb" in msg
    assert _stored(settings) == [] and _jobs(settings) == 0


@pytest.fixture
def small_client(settings, admin_token):
    from fastapi.testclient import TestClient

    from service.api import create_app

    small = settings.model_copy(update={"max_upload_bytes": 64 << 10, "max_unpacked_bytes": 1 << 20})
    with TestClient(create_app(small), headers={"Authorization": f"Bearer {admin_token}"}) as c:
        yield c


@pytest.mark.sandbox
def test_unpacked_total_over_the_limit_is_refused(small_client, settings, static_program):
    data = _rewrite(static_program, members={"extra/blob.txt": bytes(2 << 20)}, deflate=True)
    assert len(data) < 64 << 10
    _refused(upload_model(small_client, data), "unpacks to more than 1048576 bytes")
    assert _stored(settings) == [] and _jobs(settings) == 0


def test_declared_size_bounds_what_zipfile_inflates(program):
    """A member whose central directory says 100 bytes but that inflates to 8 MB: zipfile gives 100 bytes."""
    import zlib

    data = bytearray(_rewrite(program, members={"extra/notes.txt": bytes(8 << 20)}, deflate=True))
    with zipfile.ZipFile(io.BytesIO(bytes(data))) as z:
        info = z.getinfo(next(n for n in z.namelist() if n.endswith("extra/notes.txt")))
    central = data.rfind(info.filename.encode()) - 46  # the central directory entry's header
    assert data[central:central + 4] == b"PK\x01\x02"
    data[central + 16:central + 20] = zlib.crc32(bytes(100)).to_bytes(4, "little")
    data[central + 24:central + 28] = (100).to_bytes(4, "little")
    with zipfile.ZipFile(io.BytesIO(bytes(data))) as z, z.open(info.filename) as f:
        assert f.read() == bytes(100)
    pt2.load_exported_program(bytes(data))  # and the total counts 100


def test_upload_over_the_limit_is_413_before_reading(small_client, settings):
    r = upload_model(small_client, bytes(4 << 20))  # Content-Length says so: refused before the body is read
    assert r.status_code == 413, r.text
    assert r.json()["detail"] == f"the file is larger than {64 << 10} bytes (the limit)"
    assert _stored(settings) == [] and _jobs(settings) == 0


def test_streaming_reader_stops_at_the_limit(tmp_path, run_async):
    """No Content-Length: the body is read as it comes and reading stops at the first chunk over the limit."""
    from fastapi import HTTPException
    from starlette.requests import Request

    from service.api.uploads import receive_upload

    boundary, chunk, sent = b"xyz", 4096, []
    head = (b"--xyz\r\nContent-Disposition: form-data; name=\"spec\"\r\n\r\n{}\r\n"
            b"--xyz\r\nContent-Disposition: form-data; name=\"file\"; filename=\"m.pt2\"\r\n\r\n")

    async def receive() -> dict:
        body = head if not sent else bytes(chunk)
        sent.append(len(body))
        return {"type": "http.request", "body": body, "more_body": len(sent) < 10_000}

    scope = {"type": "http", "method": "POST", "path": "/", "headers": [
        (b"content-type", b"multipart/form-data; boundary=" + boundary)]}
    with pytest.raises(HTTPException) as info:
        run_async(receive_upload(Request(scope, receive), tmp_path, max_file_bytes=10 * chunk))
    assert info.value.status_code == 413
    assert len(sent) == 1 + 11  # the headers, ten chunks within the limit, the one over it; no more
    assert list(tmp_path.iterdir()) == []


def test_streaming_reader_keeps_the_file_on_disk(tmp_path, run_async):
    import hashlib

    from starlette.requests import Request

    from service.api.uploads import receive_upload

    payload = os.urandom(100_000)
    body = (b"--b\r\nContent-Disposition: form-data; name=\"file\"; filename=\"net.pt2\"\r\n"
            b"Content-Type: application/octet-stream\r\n\r\n" + payload +
            b"\r\n--b\r\nContent-Disposition: form-data; name=\"spec\"\r\n\r\n{\"budget\": 8}\r\n--b--\r\n")
    pieces = [body[i:i + 1000] for i in range(0, len(body), 1000)]

    async def receive() -> dict:
        return {"type": "http.request", "body": pieces.pop(0), "more_body": bool(pieces)}

    scope = {"type": "http", "method": "POST", "path": "/", "headers": [
        (b"content-type", b"multipart/form-data; boundary=b"), (b"content-length", str(len(body)).encode())]}
    upload = run_async(receive_upload(Request(scope, receive), tmp_path, max_file_bytes=len(payload)))
    assert upload.path.parent == tmp_path and upload.path.read_bytes() == payload
    assert upload.size == len(payload) and upload.sha256 == hashlib.sha256(payload).hexdigest()
    assert upload.filename == "net.pt2" and upload.fields == {"spec": "{\"budget\": 8}"}


def test_upload_form_is_described_in_openapi(client):
    op = client.get("/openapi.json").json()["paths"]["/api/v1/models"]["post"]
    schema = op["requestBody"]["content"]["multipart/form-data"]["schema"]
    assert schema["required"] == ["file"] and set(schema["properties"]) == {"file", "spec"}
    assert schema["properties"]["file"]["format"] == "binary"
    assert {"413", "422"} <= set(op["responses"])


# ---------------------------------------------------------------------------
# Genuine programs still upload; the sandbox


@pytest.mark.sandbox
def test_dynamic_dimension_uploads_and_worker_imports_the_same(client, settings, program):
    from compiler.target import resolve_target
    from compiler.workloads.model import import_model

    r = upload_model(client, program, layout="none")
    assert r.status_code == 201, r.text
    job = r.json()
    assert job["spec"]["input_shapes"] == [[5, 4]] and job["tasks"], job  # the example size
    stored = _stored(settings)
    assert stored == [f"{job['spec']['sha256']}.pt2"]  # no temporary file left
    again = upload_model(client, program, input_shapes=[[3, 4]], layout="none")
    assert again.status_code == 201 and again.json()["spec"]["input_shapes"] == [[3, 4]], again.text
    _refused(upload_model(client, program, input_shapes=[[100, 4]]), "cannot take [[100, 4]]",
             loc=("body", "spec", "input_shapes"))
    # the worker's load path gives the tasks the API stored
    ep = pt2.static_shapes(pt2.load_exported_program(job["spec"]["model_file"]), job["spec"]["input_shapes"])
    model = import_model(ep, job["spec"]["input_shapes"], layout="none", target=resolve_target("host"))
    assert [t.workload_key for t in model.tasks] == [t["workload_key"] for t in job["tasks"]]


@pytest.mark.sandbox
def test_sandbox_child_runs_confined():
    limits = sandbox.Limits(memory_bytes=6 << 30, cpu_seconds=120, wall_seconds=120)
    facts = sandbox.run("probe", {}, limits=limits)
    assert facts["rlimits"]["RLIMIT_AS"] == [6 << 30, 6 << 30]
    assert facts["rlimits"]["RLIMIT_CPU"] == [120, 125] and facts["rlimits"]["RLIMIT_CORE"] == [0, 0]
    if os.geteuid() == 0:
        assert (facts["uid"], facts["euid"], facts["gid"], facts["groups"]) == (65534, 65534, 65534, [])
    for action in ("os.system", "subprocess", "socket", "write /tmp"):
        assert facts[action].startswith("the sandbox refuses"), (action, facts[action])
    assert facts["write home"] == "allowed"
    if facts["network"] == "isolated":
        assert facts["interfaces"] == ["lo"]


def test_sandbox_time_limit_is_a_422_reason():
    with pytest.raises(pt2.ModelError, match="took more than 0.5 s"):
        sandbox.run("probe", {}, limits=sandbox.Limits(wall_seconds=0.5))
