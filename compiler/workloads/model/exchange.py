"""A translated model as files, and those files checked as data: what crosses back from the sandbox.

    save_graph(graph, folder, expected=outputs)        # in the confined child that ran torch on the upload
    graph, expected = load_graph(folder, max_tensor_elements=..., max_total_bytes=...)   # in the worker

Everything torch does with an uploaded program happens in a confined child (`service.sandbox`); the worker
only ever reads what that child wrote, and treats it as hostile data, since the child may have run the
uploader's code:

- `graph.json`: the Relax module (`tvm.ir.save_json`). Before TVM parses it, every node's type must be a plain
  IR node (`ir.`, `relax.`, `tirx.`, `s_tir.`, `prim.`, and the containers, strings and tensors of `ffi.`;
  no `relax.expr.ExternFunc`, modules or functions by name), and every operator (`ir.Op`) one that computes on
  the tensors it is given: no operator that calls a function by name (`call_packed`, `call_dps_packed`,
  `call_extern`, `call_llvm_intrin`, VM builtins, ...). After parsing, "main" must be a Relax function whose
  parameters are the inputs and weights listed beside it, and every `call_tir` must call a PrimFunc of the module.
- `params.npz`, `expected.npz`: arrays read with `allow_pickle=False` (bfloat16 stored as its 16 bits), each
  checked against the shape and dtype the module declares.
- `meta.json`: names, shapes and dtypes, each checked by type.

Every tensor the module declares is bounded by `max_tensor_elements`, and their sum by `max_total_bytes`
(a graph of a few KB may otherwise allocate many tensors each under the limit).

Layering: `compiler` never imports `tuner` or `service`.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import tvm
from tvm import relax, tirx

from ..operators import TensorSpec
from ..pt2 import ModelError, short_error
from .importer import ModelGraph

GRAPH, PARAMS, EXPECTED, META = "graph.json", "params.npz", "expected.npz", "meta.json"
MAX_GRAPH_BYTES = 256 << 20
# node types a translated model is made of; anything else (an extern function, a module, a packed function)
# is refused before TVM builds an object of it
_NODE_PREFIXES = ("ir.", "relax.", "tirx.", "s_tir.", "prim.")
_NODE_TYPES = frozenset({"None", "int", "bool", "float", "DataType", "Device", "ffi.Array", "ffi.Map",
                         "ffi.String", "ffi.Bytes", "ffi.Tensor", "ffi.Shape", "ffi.SmallStr", "ffi.SmallBytes"})
_DENIED_TYPES = frozenset({"relax.expr.ExternFunc"})
# operators that call a function by name, or reach outside the tensors they are given
_DENIED_OP = re.compile(r".*(packed|extern|llvm_intrin|call_py|builtin|vm\.|print|callback|ffi|call_spirv|"
                        r"call_inplace|tvm_call|tvm_thread|tvm_struct|tvm_stack|rpc|device_api|memory\.).*")
_NUMPY_DTYPES = frozenset({"float64", "float32", "float16", "int64", "int32", "int16", "int8", "uint8", "uint16",
                           "uint32", "uint64", "bool"})
_STORED_AS = {"bfloat16": "uint16"}


def save_graph(graph: ModelGraph, folder: str | Path, *, expected: Sequence[np.ndarray] = ()) -> Path:
    """Writes `graph` (and the reference outputs `expected`) as the files `load_graph` reads; the folder."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / GRAPH).write_text(tvm.ir.save_json(graph.mod))
    np.savez(folder / PARAMS, **_stored(graph.params))
    np.savez(folder / EXPECTED, **_stored(expected))
    meta = {
        "param_names": list(graph.param_names),
        "inputs": [[s.name, list(s.shape), s.dtype] for s in graph.inputs],
        "outputs": [[s.name, list(s.shape), s.dtype] for s in graph.outputs],
        "names_by_var": dict(graph.names_by_var),
        "quantized": bool(graph.quantized),
        "params": [str(a.dtype) for a in graph.params],
        "expected": [str(a.dtype) for a in expected],
    }
    (folder / META).write_text(json.dumps(meta))
    return folder


def _stored(arrays: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
    return {f"a{i}": (a.view(_STORED_AS[str(a.dtype)]) if str(a.dtype) in _STORED_AS else np.ascontiguousarray(a))
            for i, a in enumerate(arrays)}


def load_graph(folder: str | Path, *, max_tensor_elements: int, max_total_bytes: int) -> tuple[ModelGraph, list]:
    """The graph and reference outputs `save_graph` wrote, each file checked as data (module docstring).

    Raises:
        ModelError: field "file": a file is missing, malformed, or holds what a translated model does not
            (named); field "model": a tensor over `max_tensor_elements`, or tensors over `max_total_bytes` in all.
    """
    folder = Path(folder)
    meta = _meta(_read(folder / META, 1 << 24))
    text = _read(folder / GRAPH, MAX_GRAPH_BYTES)
    check_graph_json(text)
    try:
        mod = tvm.ir.load_json(text)
    except Exception as e:  # noqa: BLE001 - TVM's reasons are many: all mean the file is not a module
        raise _bad(f"graph.json is not an IR module: {type(e).__name__}: {short_error(e, 160)}") from e
    params = _arrays(folder / PARAMS, meta["params"])
    expected = _arrays(folder / EXPECTED, meta["expected"])
    inputs = [TensorSpec(n, tuple(s), d) for n, s, d in meta["inputs"]]
    outputs = [TensorSpec(n, tuple(s), d) for n, s, d in meta["outputs"]]
    _check_module(mod, inputs, meta["param_names"], params, max_tensor_elements, max_total_bytes)
    if len(expected) != len(outputs) or any(tuple(a.shape) != o.shape or str(a.dtype) != o.dtype
                                            for a, o in zip(expected, outputs)):
        raise _bad(f"the reference outputs {[(tuple(a.shape), str(a.dtype)) for a in expected]} are not the "
                   f"model's outputs {[(o.shape, o.dtype) for o in outputs]}")
    graph = ModelGraph(mod, params, list(meta["param_names"]), inputs, outputs, dict(meta["names_by_var"]),
                       bool(meta["quantized"]))
    return graph, expected


def _bad(message: str) -> ModelError:
    return ModelError("file", f"the sandbox's translation of the model was refused: {message}")


def _read(path: Path, limit: int) -> str:
    try:
        if path.stat().st_size > limit:
            raise _bad(f"{path.name} is larger than {limit} bytes")
        return path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise _bad(f"{path.name} is unreadable ({short_error(e, 100)})") from e


def _meta(text: str) -> dict[str, Any]:
    try:
        meta = json.loads(text)
    except ValueError as e:
        raise _bad("meta.json is not JSON") from e
    specs = ("inputs", "outputs")
    ok = (isinstance(meta, dict)
          and all(isinstance(meta.get(k), list) for k in ("param_names", "params", "expected", *specs))
          and all(isinstance(n, str) for n in meta["param_names"])
          and all(isinstance(d, str) and d in _NUMPY_DTYPES | set(_STORED_AS) for d in meta["params"] + meta["expected"])
          and all(isinstance(s, list) and len(s) == 3 and isinstance(s[0], str) and isinstance(s[2], str)
                  and isinstance(s[1], list) and all(type(d) is int and d >= 0 for d in s[1])
                  for k in specs for s in meta[k])
          and isinstance(meta.get("names_by_var"), dict)
          and all(isinstance(k, str) and isinstance(v, str) for k, v in meta["names_by_var"].items())
          and isinstance(meta.get("quantized"), bool))
    if not ok:
        raise _bad("meta.json does not describe a model")
    return meta


def check_graph_json(text: str) -> None:
    """Refuses a `tvm.ir.save_json` text that holds a node type or an operator a translated model does not.

    Raises:
        ModelError: field "file", naming the node type or operator.
    """
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise _bad("graph.json is not JSON") from e
    nodes = data.get("nodes") if isinstance(data, dict) else None
    if not isinstance(nodes, list) or not isinstance(data.get("root_index"), int):
        raise _bad("graph.json is not a saved IR module")
    for node in nodes:
        kind = node.get("type") if isinstance(node, dict) else None
        if not isinstance(kind, str) or kind in _DENIED_TYPES or not (
                kind in _NODE_TYPES or kind.startswith(_NODE_PREFIXES)):
            raise _bad(f"graph.json holds a node of type {short_error(repr(kind), 80)}")
        if kind == "ir.Op" and not (isinstance(node.get("data"), str) and op_allowed(node["data"])):
            raise _bad(f"graph.json calls operator {short_error(repr(node.get('data')), 80)}")


def op_allowed(name: str) -> bool:
    """An operator that computes on the tensors it is given (Relax's and TIR's, none that calls by name)."""
    return name.startswith(("relax.", "tir.")) and not _DENIED_OP.fullmatch(name)


def _arrays(path: Path, dtypes: list[str]) -> list[np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as z:
            if sorted(z.files) != sorted(f"a{i}" for i in range(len(dtypes))):
                raise _bad(f"{path.name} holds {len(z.files)} arrays, expected {len(dtypes)}")
            arrays = [z[f"a{i}"] for i in range(len(dtypes))]
    except ModelError:
        raise
    except Exception as e:  # noqa: BLE001 - a damaged or pickled file
        raise _bad(f"{path.name} is not a file of plain arrays ({short_error(e, 100)})") from e
    out = []
    for a, dtype in zip(arrays, dtypes):
        stored = _STORED_AS.get(dtype, dtype)
        if str(a.dtype) != stored:
            raise _bad(f"{path.name}: an array of {a.dtype}, said to be {dtype}")
        out.append(a.view(dtype) if dtype in _STORED_AS else a)
    return out


def _check_module(mod: Any, inputs: list[TensorSpec], param_names: list[str], params: list[np.ndarray],
                  max_tensor_elements: int, max_total_bytes: int) -> None:
    if not isinstance(mod, tvm.IRModule) or "main" not in [g.name_hint for g in mod.get_global_vars()]:
        raise _bad("graph.json is not a module with a main function")
    funcs = {g.name_hint: f for g, f in mod.functions.items()}
    if any(not isinstance(f, relax.Function | tirx.PrimFunc) for f in funcs.values()):
        raise _bad("the module holds something other than Relax functions and PrimFuncs")
    main = funcs["main"]
    if not isinstance(main, relax.Function) or main.attrs is None or "num_input" not in main.attrs:
        raise _bad("main is not the translated Relax function")
    num_input = int(main.attrs["num_input"])
    if num_input != len(inputs) or len(main.params) != num_input + len(params) or len(param_names) != len(params):
        raise _bad(f"main takes {len(main.params)} arguments, not {len(inputs)} inputs and {len(params)} weights")
    for var, spec in zip(main.params, [*inputs, *params]):
        sinfo = var.ty
        shape = tuple(spec.shape)
        if not isinstance(sinfo, relax.TensorType) or sinfo.shape is None or tuple(
                int(d) for d in sinfo.shape) != shape or str(sinfo.dtype) != str(spec.dtype):
            raise _bad(f"main's argument {var.name} is not a tensor of {shape} {spec.dtype}")
    call_tir = tvm.ir.Op.get("relax.call_tir")
    tensors: list[tuple[str, int, int]] = []

    def visit(expr: Any) -> None:
        if isinstance(expr, relax.Call) and expr.op.same_as(call_tir):
            callee = expr.args[0]
            if not isinstance(callee, tvm.ir.GlobalVar) or not isinstance(funcs.get(callee.name_hint), tirx.PrimFunc):
                raise _bad("a call_tir that calls no PrimFunc of the module")
        elif isinstance(expr, relax.Call) and not isinstance(expr.op, tvm.ir.Op | tvm.ir.GlobalVar):
            raise _bad("a call of something other than an operator or a function of the module")
        size = _tensor_size(expr)
        if size is not None:
            tensors.append((getattr(expr, "name", "a tensor"), *size))

    for func in funcs.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    for name, elements, _ in tensors:
        if elements > max_tensor_elements:
            raise ModelError("model", f"tensor {name} has {elements} elements, more than the limit "
                                      f"{max_tensor_elements}")
    # what the import folds into constants while this process lowers the graph (`FoldConstant`): tensors made
    # from no input and no weight (zeros, full, arange and what is computed from them alone); a graph of a few
    # bytes may ask for many of them, each under the tensor limit. What the model allocates when it runs is
    # bounded by the build's child (`service.model_build`)
    sizes = [size for _, _, size in _constant_tensors(main)]
    total = sum(sizes)
    if total > max_total_bytes:
        raise ModelError("model", f"the model's constant tensors (computed from no input or weight) take {total} "
                                  f"bytes in all, more than the limit {max_total_bytes} (ALTUNE_SANDBOX_MEMORY_BYTES)")


def _tensor_size(expr: Any) -> tuple[int, int] | None:
    """(elements, bytes) of a Var's or a Call's static tensor type, None for anything else."""
    sinfo = getattr(expr, "ty", None) if isinstance(expr, relax.Var | relax.Call) else None
    if not isinstance(sinfo, relax.TensorType) or sinfo.shape is None or not all(
            isinstance(d, tvm.tirx.IntImm) for d in sinfo.shape):
        return None
    elements = math.prod(int(d) for d in sinfo.shape)
    return elements, elements * max(tvm.DataType(str(sinfo.dtype)).bits // 8, 1)


def _constant_tensors(main: Any) -> list[tuple[str, int, int]]:
    """The tensors "main" binds from no input and no weight: (name, elements, bytes)."""
    constant: set[Any] = set()
    found = []

    def from_constants(value: Any) -> bool:
        leaves: list[Any] = []
        relax.analysis.post_order_visit(value, lambda e: leaves.append(e) if isinstance(e, relax.Var) else None)
        return all(v in constant for v in leaves)

    body = main.body
    for block in body.blocks if isinstance(body, relax.SeqExpr) else ():
        for binding in block.bindings:
            if isinstance(binding, relax.VarBinding) and from_constants(binding.value):
                constant.add(binding.var)
                size = _tensor_size(binding.var)
                if size is not None:
                    found.append((binding.var.name, *size))
    return found
