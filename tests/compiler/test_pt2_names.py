"""The upload loader's string classes (`compiler.workloads.pt2`): what torch turns into source is refused unless
safe by construction, and what cannot reach source (hyphenated module paths, inf/nan constants, dict keys of
outputs) never refuses a valid model.

The treespec payloads are made by editing one string of a real export of `forward(self, x, *, k)`: the key of
the keyword-argument dict in the signature's `in_spec`, which FX pastes into the source of `ep.module()`.
"""

from __future__ import annotations

import collections
import io
import json
import subprocess
import sys
import zipfile

import pytest

torch = pytest.importorskip("torch")

from compiler.workloads import pt2  # noqa: E402
from compiler.workloads.model import reference_outputs, torch_outputs  # noqa: E402


class Kw(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, *, k: torch.Tensor) -> torch.Tensor:
        return self.linear(x) + k


class Hyphens(torch.nn.Module):
    """Module paths as torchvision's regnet has them (`trunk_output.block4.block4-11.activation`)."""

    def __init__(self) -> None:
        super().__init__()
        self.trunk_output = torch.nn.Sequential(collections.OrderedDict(
            (f"block4-{i}", torch.nn.Sequential(collections.OrderedDict(
                conv=torch.nn.Conv2d(4, 4, 3, padding=1), bn=torch.nn.BatchNorm2d(4),
                activation=torch.nn.ReLU()))) for i in range(2)))
        self.add_module("head out", torch.nn.Linear(4, 3))  # any module name but a dot: a space, too

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return getattr(self, "head out")(self.trunk_output(x).mean(dim=(2, 3)))


class CausalBlock(torch.nn.Module):
    """Attention with `masked_fill(mask, float('-inf'))` and the other non-finite constants."""

    def __init__(self, n: int = 8, d: int = 16) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.register_buffer("mask", torch.tril(torch.ones(n, n, dtype=torch.bool)), persistent=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        att = (q @ k.transpose(-2, -1)).masked_fill(~self.mask, float("-inf")).softmax(-1)
        clipped = torch.clamp(x, min=float("-inf"), max=float("inf"))
        return att @ v, clipped.masked_fill(x > 3, float("nan"))


def _save(ep) -> bytes:
    buf = io.BytesIO()
    torch.export.save(ep, buf)
    return buf.getvalue()


def _edit(data: bytes, edit) -> bytes:
    """`data` with `edit(json)` applied to models/model.json."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as src, zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist():
            body = src.read(info)
            if info.filename.endswith("models/model.json"):
                model = json.loads(body)
                edit(model)
                body = json.dumps(model).encode()
            dst.writestr(info, body)
    return out.getvalue()


def _signature(model: dict) -> dict:
    return model["graph_module"]["module_call_graph"][0]["signature"]


def kwargs_key_payload(data: bytes, statement: str) -> bytes:
    """The export of `Kw` with its kwargs key replaced so that `ep.module()` runs `statement` at module level."""
    key = f"q':k}}), self._in_spec)\n{statement}\ndef _u(self=None,x=None,k=None):\n    _=(([x],{{'q"

    def edit(model: dict) -> None:
        spec = json.loads(_signature(model)["in_spec"])
        assert json.loads(spec[1]["children_spec"][1]["context"]) == ["k"], spec
        spec[1]["children_spec"][1]["context"] = json.dumps([key])
        _signature(model)["in_spec"] = json.dumps(spec)

    return _edit(data, edit)


def _quiet(marker) -> str:
    """Runs only outside the upload sandbox (whose HOME names it): what got past the sandbox's audit hook."""
    return f"if 'sandbox' not in __import__('os').environ.get('HOME', ''): __import__('os').system('touch {marker}')"


def _loud(marker) -> str:
    return f"__import__('os').system('touch {marker}')"


PAYLOADS = {"quiet": _quiet, "loud": _loud}


@pytest.fixture(scope="module")
def kw_program() -> bytes:
    return _save(torch.export.export(Kw(), (torch.randn(2, 4),), {"k": torch.randn(2, 4)}))


def test_kwargs_key_payload_runs_code_in_torchs_own_loader(kw_program, tmp_path):
    """The payload is genuine: `torch.export.load` + `ep.module()` (what the loader must never reach) runs it."""
    marker, path = tmp_path / "pwned", tmp_path / "door.pt2"
    path.write_bytes(kwargs_key_payload(kw_program, _quiet(marker)))
    code = f"import torch; torch.export.load({str(path)!r}).module()"
    subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120, env={"HOME": str(tmp_path)})
    assert marker.exists()


@pytest.mark.parametrize("payload", sorted(PAYLOADS))
def test_kwargs_key_payload_is_refused_and_runs_nothing(kw_program, tmp_path, payload):
    marker = tmp_path / "pwned"
    with pytest.raises(pt2.ModelError) as e:
        pt2.load_exported_program(kwargs_key_payload(kw_program, PAYLOADS[payload](marker)))
    assert "keyword argument \"q':k})" in str(e.value) and "not a Python identifier" in str(e.value)
    assert not marker.exists()


def test_genuine_kwargs_program_loads_and_runs(kw_program):
    ep = pt2.load_exported_program(kw_program)
    x, k = torch.randn(2, 4), torch.randn(2, 4)
    assert torch.allclose(ep.module()(x, k=k), Kw.forward(_with_weights(ep), x, k=k))


def _with_weights(ep) -> Kw:
    module = Kw()
    module.load_state_dict(ep.state_dict)
    return module


@pytest.mark.parametrize("key", ["a-b", "x y", "", "class", "k\n", "__k"])
def test_kwargs_keys_that_are_not_python_names_are_refused_by_name(kw_program, key):
    def edit(model: dict) -> None:
        spec = json.loads(_signature(model)["in_spec"])
        spec[1]["children_spec"][1]["context"] = json.dumps([key])
        _signature(model)["in_spec"] = json.dumps(spec)

    with pytest.raises(pt2.ModelError, match=r"keyword argument .* is not a Python identifier"):
        pt2.load_exported_program(_edit(kw_program, edit))


@pytest.mark.parametrize("name", ["x=__import__('os').system('id')", "x.y", "def", "x\n"])
def test_forward_argument_names_must_be_python_names(kw_program, name):
    with pytest.raises(pt2.ModelError, match="an argument name"):
        pt2.load_exported_program(_edit(kw_program, lambda m: _signature(m).update(forward_arg_names=[name, "k"])))


def test_hyphenated_module_paths_are_accepted_and_load():
    """torchvision's regnet names a block `block4-11`: only attribute paths, written as getattr(m, "block4-11")."""
    torch.manual_seed(0)
    module, x = Hyphens().eval(), torch.randn(1, 4, 8, 8)
    ep = pt2.load_exported_program(_save(torch.export.export(module, (x,))))
    assert "trunk_output.block4-1.conv.weight" in ep.state_dict and "head out.weight" in ep.state_dict
    [got] = reference_outputs(ep, [x.numpy()])
    [want] = torch_outputs(module, [x])
    assert abs(got - want).max() < 1e-5


@pytest.mark.parametrize("fqn", ['a."); __import__("os").system("id")#', "a.__class__", "a\\b", "a.{x}", "a'b",
                                 "a..b", "a\nb"])
def test_attribute_paths_that_could_leave_a_literal_are_refused(fqn):
    ep = torch.export.export(Hyphens().eval(), (torch.randn(1, 4, 8, 8),))

    def edit(model: dict) -> None:
        model["graph_module"]["signature"]["input_specs"][0]["parameter"]["parameter_name"] = fqn

    with pytest.raises(pt2.ModelError, match="is not an attribute path"):
        pt2.load_exported_program(_edit(_save(ep), edit))


def test_non_finite_float_constants_are_accepted_and_load():
    """`float('-inf')` (a causal mask), inf and nan are written as "-Infinity", "Infinity", "NaN"."""
    torch.manual_seed(0)
    module, x = CausalBlock().eval(), torch.randn(1, 8, 16) * 3
    data = _save(torch.export.export(module, (x,)))
    text = zipfile.ZipFile(io.BytesIO(data)).read(next(
        n for n in zipfile.ZipFile(io.BytesIO(data)).namelist() if n.endswith("model.json"))).decode()
    assert all(f'"as_float": "{w}"' in text for w in ("-Infinity", "Infinity", "NaN")), "torch writes them so"
    ep = pt2.load_exported_program(data)
    got, want = reference_outputs(ep, [x.numpy()]), torch_outputs(module, [x])
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(torch.from_numpy(g), torch.from_numpy(w), equal_nan=True)


@pytest.mark.parametrize("value", ["inf", "1e308", "__import__('os')", "Infinity "])
def test_floats_are_numbers_or_torchs_three_spellings(value):
    data = _save(torch.export.export(CausalBlock().eval(), (torch.randn(1, 8, 16),)))

    def edit(model: dict) -> None:
        node = next(n for n in model["graph_module"]["graph"]["nodes"]
                    if n["target"] == "torch.ops.aten.masked_fill.Scalar")
        node["inputs"][2]["arg"]["as_float"] = value

    with pytest.raises(pt2.ModelError, match="is not a number, 'Infinity', '-Infinity' or 'NaN'"):
        pt2.load_exported_program(_edit(data, edit))


def test_float_spellings_are_names_nowhere_else():
    data = _save(torch.export.export(CausalBlock().eval(), (torch.randn(1, 8, 16),)))

    def edit(model: dict) -> None:
        model["graph_module"]["graph"]["nodes"][0]["name"] = "-Infinity"

    with pytest.raises(pt2.ModelError, match="not a Python identifier"):
        pt2.load_exported_program(_edit(data, edit))


@pytest.mark.parametrize("name", ["relu.x", "relu; import os", "__class__", "relu\n"])
def test_node_names_are_python_identifiers(kw_program, name):
    """FX sets node.name unsanitized and writes it as a variable: a dotted name was accepted before."""
    def edit(model: dict) -> None:
        node = model["graph_module"]["graph"]["nodes"][-1]
        node["name"] = name

    with pytest.raises(pt2.ModelError, match="not a Python identifier"):
        pt2.load_exported_program(_edit(kw_program, edit))


class DictKeys(torch.nn.Module):
    def forward(self, batch: dict) -> dict:
        return {"out-put": batch["in put"] * 2, "it's": (batch["in put"] + 1,), 3: [batch["x{y}"]]}


def test_dict_keys_of_inputs_and_outputs_are_data():
    """Keys of dicts other than the keyword arguments never reach source: any printable key loads."""
    batch = {"in put": torch.randn(2), "x{y}": torch.randn(2)}
    ep = pt2.load_exported_program(_save(torch.export.export(DictKeys(), (batch,))))
    out = ep.module()(batch)
    assert set(out) == {"out-put", "it's", 3}
    assert [a.tolist() for a in reference_outputs(ep, [batch["in put"].numpy(), batch["x{y}"].numpy()])] == [
        a.tolist() for a in torch_outputs(DictKeys(), [batch])]


@pytest.mark.parametrize("context", [json.dumps([{"__enum__": True, "fqn": "os:path", "name": "x"}]),
                                     json.dumps([["a"]]), json.dumps(["a\x00"]), json.dumps(["a", "b"])])
def test_dict_contexts_hold_one_plain_key_per_child(context):
    ep = torch.export.export(DictKeys(), ({"in put": torch.randn(2), "x{y}": torch.randn(2)},))

    def edit(model: dict) -> None:
        spec = json.loads(_signature(model)["out_spec"])
        spec[1]["context"] = context.replace('"b"]', '"b", "c", "d"]')
        _signature(model)["out_spec"] = json.dumps(spec)

    with pytest.raises(pt2.ModelError, match="out_spec"):
        pt2.load_exported_program(_edit(_save(ep), edit))


Point = collections.namedtuple("Point", ["logits", "features"])
torch.utils._pytree._register_namedtuple(Point, serialized_type_name="tests.compiler.test_pt2_names.Point")


class NamedOut(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> Point:
        return Point(x.sum(-1), x * 2)


def test_namedtuple_outputs_load_where_their_type_is_not_registered(tmp_path):
    """torch looks a namedtuple up by its registered name: the loader gives it a stand-in of the same fields."""
    path = tmp_path / "named.pt2"
    path.write_bytes(_save(torch.export.export(NamedOut(), (torch.randn(2, 3),))))
    code = (f"import torch; from compiler.workloads import pt2; ep = pt2.load_exported_program({str(path)!r}); "
            "out = ep.module()(torch.ones(2, 3)); print(out._fields, out.logits.tolist())")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "('logits', 'features') [3.0, 3.0]" in done.stdout, done.stderr[-2000:]


@pytest.mark.parametrize("fields", [["a", "os.system('id')"], ["a", "class"]])
def test_namedtuple_fields_are_python_names(fields):
    ep = torch.export.export(NamedOut(), (torch.randn(2, 3),))

    def edit(model: dict) -> None:
        model["graph_module"]["treespec_namedtuple_fields"] = {
            "tests.compiler.test_pt2_names.Point": {"field_names": fields}}

    with pytest.raises(pt2.ModelError, match="a namedtuple field"):
        pt2.load_exported_program(_edit(_save(ep), edit))
