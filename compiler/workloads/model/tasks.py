"""A model's tasks: one per distinct fused PrimFunc, deduplicated by structural hash and weighted by calls.

Layering: `compiler` never imports `tuner` or `service`. torch is imported inside the functions that run the
exported program: building and running the model needs only TVM.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import tvm
import tvm_ffi
from tvm import relax
from tvm.s_tir.meta_schedule.arg_info import ArgInfo

from ..operators import TensorSpec
from ..pt2 import ModelError

DEFAULT_MAX_TENSOR_ELEMENTS = 1 << 28  # any input, parameter or intermediate tensor


COMPLEX_OPS = ("conv", "matmul", "dense")  # fused-function name parts that mark a complex op (ALT templates)


@dataclass(frozen=True, eq=False)
class ModelTask:
    """One distinct fused PrimFunc of a model.

    Attributes:
        name: the fused function's name without numeric suffixes ("fused_conv2d_add_relu").
        workload_key: "<name>:<structural hash, 16 hex>:<arg shapes>:<dtype>", stable across imports.
        prim_func: the untuned PrimFunc, global symbol "main" (what `tuner.Task` takes).
        weight: how many times the model calls it.
        complex: it contains a convolution or a matrix product (ALT layout templates apply).
        functions: names of the model's global functions that are copies of it.
        args: its parameters (inputs, then outputs), with shapes and dtypes.
    """

    name: str
    workload_key: str
    prim_func: tvm.tirx.PrimFunc
    weight: int
    complex: bool
    functions: tuple[str, ...]
    args: tuple[TensorSpec, ...]


def tensor_spec(name: str, sinfo: Any) -> TensorSpec:
    shape = tuple(int(d) for d in sinfo.shape)
    return TensorSpec(name, shape, str(sinfo.dtype))


def flatten_sinfo(sinfo: Any) -> list[Any]:
    if isinstance(sinfo, relax.TupleType):
        return [s for f in sinfo.fields for s in flatten_sinfo(f)]
    return [sinfo]


def call_counts(main: Any) -> dict[str, int]:
    """How often "main" calls each global function with call_tir on data that depends on a user
    input. Calls on parameters and constants alone (weight layout transforms, batch-norm constants)
    are left out: `build_model` moves them to build time."""
    call_tir = tvm.ir.Op.get("relax.call_tir")
    counts: dict[str, int] = {}
    live = set(main.params[:int(main.attrs["num_input"])])
    for block in main.body.blocks:
        for binding in block.bindings:
            if not any(v in live for v in relax.analysis.free_vars(binding.value)):
                continue
            live.add(binding.var)
            expr = binding.value
            if isinstance(expr, relax.Call) and expr.op.same_as(call_tir) and isinstance(expr.args[0], tvm.ir.GlobalVar):
                name = expr.args[0].name_hint
                counts[name] = counts.get(name, 0) + 1
    return counts


def func_args(func: Any) -> tuple[TensorSpec, ...]:
    return tuple(TensorSpec(f"arg{i}", tuple(int(d) for d in a.shape), str(a.dtype))
                 for i, a in enumerate(ArgInfo.from_prim_func(func)))


def structural_key(func: Any) -> int:
    """The structural hash of a PrimFunc, its name and global symbol left out."""
    return int(tvm_ffi.structural_hash(func.without_attr("global_symbol"), map_free_vars=True))


def extract_tasks(mod: tvm.IRModule, *, max_tensor_elements: int = DEFAULT_MAX_TENSOR_ELEMENTS) -> list[ModelTask]:
    """One task per distinct PrimFunc called by "main" (structural hash), weighted by its calls.

    Raises:
        ModelError: "input_shapes" when an intermediate tensor exceeds `max_tensor_elements`.
    """
    counts = call_counts(mod["main"])
    groups: dict[int, list[tuple[str, Any]]] = {}
    for gv, func in mod.functions.items():
        if isinstance(func, tvm.tirx.PrimFunc) and counts.get(gv.name_hint):
            groups.setdefault(structural_key(func), []).append((gv.name_hint, func))
    tasks = []
    for digest, members in groups.items():
        members.sort()
        name = re.sub(r"\d+(?=_|$)", "", members[0][0])
        func = members[0][1]
        args = func_args(func)
        for spec in args:
            if spec.size > max_tensor_elements:
                raise ModelError("input_shapes", f"tensor {spec.name} {'x'.join(map(str, spec.shape))} of {name} "
                                                 f"has {spec.size} elements, more than the limit {max_tensor_elements}")
        shapes = ",".join("x".join(map(str, a.shape)) for a in args)
        dtypes = sorted({a.dtype for a in args})
        key = f"{name}:{digest & (2**64 - 1):016x}:{shapes}:{'/'.join(dtypes)}"
        tasks.append(ModelTask(
            name=name, workload_key=key, prim_func=func.with_attr("global_symbol", "main"),
            weight=sum(counts[n] for n, _ in members), complex=any(p in name for p in COMPLEX_OPS),
            functions=tuple(n for n, _ in members), args=args,
        ))
    tasks.sort(key=lambda t: (-t.weight, t.name, t.workload_key))
    return tasks


@dataclass(frozen=True)
class ConvCall:
    """Where a conv sits in the lowered "main": the function that computes it (with its fused epilogue) and the
    layout conversions feeding it (ALT's conversion operators, which a layout choice adds or cancels).

    Attributes:
        weight: the conv's weight, a parameter name of "main" (`layouts.ConvSite.weight`).
        function: the global function called for it ("fused_conv2d_NCHWc_add_relu3").
        conversions: functions called on the input path right before it that convert a layout (their names
            hold "layout_transform"), in call order.
    """

    weight: str
    function: str
    conversions: tuple[str, ...]


def conv_calls(mod: tvm.IRModule, weights: set[str]) -> dict[str, ConvCall]:
    """The call of each conv of "main" whose weight is in `weights`, found by the weight that reaches its
    arguments through calls on parameters alone (the weight's layout transform, batch-norm folding)."""
    call_tir = tvm.ir.Op.get("relax.call_tir")
    main = mod["main"]
    origin: dict[Any, set[str]] = {p: ({p.name} & weights) for p in main.params}  # var -> weights it derives from
    producer: dict[Any, str] = {}  # var -> function that computed it
    live = set(main.params[:int(main.attrs["num_input"])])
    out: dict[str, ConvCall] = {}
    for block in main.body.blocks:
        for binding in block.bindings:
            free = relax.analysis.free_vars(binding.value)
            expr = binding.value
            callee = (expr.args[0].name_hint if isinstance(expr, relax.Call) and expr.op.same_as(call_tir)
                      and isinstance(expr.args[0], tvm.ir.GlobalVar) else None)
            if not any(v in live for v in free):  # parameters alone: carries its weights along
                origin[binding.var] = set().union(*(origin.get(v, set()) for v in free))
                continue
            live.add(binding.var)
            if callee is None:
                continue
            producer[binding.var] = callee
            derived = set().union(*(origin.get(v, set()) for v in free if v not in live))
            for weight in derived:
                if weight in out:
                    continue
                convs = []
                for v in free:
                    name = producer.get(v)
                    if v in live and name is not None and "layout_transform" in name:
                        convs.append(name)
                out[weight] = ConvCall(weight, callee, tuple(convs))
    return out


def conversions(mod: tvm.IRModule) -> int:
    """How many layout conversions "main" runs on data (calls of functions named "...layout_transform..." on
    what depends on an input; the weights' are done at build time)."""
    return sum(n for name, n in call_counts(mod["main"]).items() if "layout_transform" in name)
