"""Graph-level grouping for basteln: chains of complex operators of a model become one task.

Relax's `FuseOps` fuses element-wise operators into a complex one (conv + bias + relu) but never two
complex operators into one program, so every tensor between convolutions, or between attention's two
matrix products, goes through memory. `group_chains` runs after `FuseOps`/`FuseTIR`: it finds chains
of fused calls in "main" where each result is used once, by the next call of the chain, and the chain
holds two or three functions with a reduction (conv -> conv, depthwise -> pointwise as in MobileNet,
matmul -> softmax -> matmul as in attention) with element-wise functions between them; it wraps each
chain in a Relax function marked `Primitive` and lets `relax.transform.FuseTIR` merge its PrimFuncs into
one. The merged program is then a task of its own, which `compiler.passes.basteln` tiles and fuses.

When a chain pays is a rule here, not a measurement: its intermediate tensors together hold at least
`min_bytes` (by default half this machine's L2 cache: smaller ones stay in cache between the calls anyway)
and no tensor of the chain exceeds `max_bytes`.

Layering: `compiler` never imports `tuner` or `service`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import tvm
from tvm import relax, s_tir, tirx

from compiler.target import host_caches
from compiler.tir_util import const_extent

MAX_BYTES = 64 * 1024 * 1024
MAX_COMPLEX = 3  # functions with a reduction in one chain


@dataclass(frozen=True)
class Chain:
    """Bindings of "main" grouped into one function: their positions in its dataflow block."""

    positions: tuple[int, ...]
    functions: tuple[str, ...]
    intermediate_bytes: int = 0  # the tensors between its functions, together (what fusing keeps out of memory)

    def to_json(self) -> dict:
        return {"positions": list(self.positions), "functions": list(self.functions),
                "intermediate_bytes": self.intermediate_bytes}

    @classmethod
    def from_json(cls, data: dict) -> Chain:
        return cls(tuple(data["positions"]), tuple(data["functions"]), int(data.get("intermediate_bytes", 0)))


def _has_reduction(func: Any) -> bool:
    try:
        sch = s_tir.Schedule(func)
        blocks = sch.get_child_blocks(sch.get_sblock("root"))
    except Exception:  # no root block (an opaque or lowered function): not ours to fuse
        return False
    return any(any(iv.iter_type == tirx.IterVar.CommReduce and _longer_than_one(iv) for iv in sch.get(b).iter_vars)
               for b in blocks)


def _longer_than_one(iv: Any) -> bool:
    """Whether an iteration variable runs over more than one value (a symbolic extent: taken as more)."""
    extent = const_extent(iv)
    return extent is None or extent > 1


def _tensor_bytes(ty: Any) -> int:
    shape = getattr(ty, "shape", None)
    values = getattr(shape, "values", None)
    if values is None or not all(hasattr(v, "value") for v in values):
        return 1 << 62
    bits = tvm_dtype_bits(str(ty.dtype))
    return math.prod(int(v.value) for v in values) * bits // 8


def tvm_dtype_bits(dtype: str) -> int:
    t = tvm.DataType(dtype)
    return t.bits * t.lanes


def _callee_name(binding: Any) -> str | None:
    v = binding.value
    if isinstance(v, relax.Call) and getattr(v.op, "name", None) == "relax.call_tir" \
            and isinstance(v.args[0], relax.GlobalVar):
        return v.args[0].name_hint
    return None


def find_chains(mod: tvm.IRModule, *, min_bytes: int | None = None, max_bytes: int = MAX_BYTES,
                max_complex: int = MAX_COMPLEX) -> list[Chain]:
    """The chains of "main"'s dataflow block worth one program (see the module docstring).

    `min_bytes` None: half of `compiler.target.host_caches().l2`.
    """
    min_bytes = host_caches().l2 // 2 if min_bytes is None else min_bytes

    main = mod["main"]
    blocks = main.body.blocks
    if len(blocks) != 1 or not isinstance(blocks[0], relax.DataflowBlock):
        return []
    bindings = list(blocks[0].bindings)
    uses: dict[Any, int] = {}

    def count(expr: Any) -> None:
        relax.analysis.post_order_visit(expr, lambda e: uses.__setitem__(e, uses.get(e, 0) + 1)
                                        if isinstance(e, relax.Var) else None)

    for b in bindings:
        count(b.value)
    count(main.body.body)

    def callee(b: Any) -> str | None:
        v = b.value
        if not isinstance(v, relax.Call) or getattr(v.op, "name", None) != "relax.call_tir":
            return None
        gv = v.args[0]
        return gv.name_hint if isinstance(gv, relax.GlobalVar) and isinstance(mod[gv], type(mod[gv])) else None

    complex_cache: dict[str, bool] = {}

    def is_complex(name: str) -> bool:
        if name not in complex_cache:
            func = mod[name]
            complex_cache[name] = hasattr(func, "buffer_map") or _has_reduction(func)
        return complex_cache[name]

    position = {b.var: i for i, b in enumerate(bindings)}
    consumer: dict[Any, int] = {}
    for i, b in enumerate(bindings):
        if callee(b) is None:
            continue
        for arg in b.value.args[1].fields:
            if isinstance(arg, relax.Var) and arg in position:
                consumer.setdefault(arg, i) if consumer.get(arg, i) == i else consumer.__setitem__(arg, -1)
    chains: list[Chain] = []
    taken: set[int] = set()
    for start, b in enumerate(bindings):
        name = callee(b)
        if start in taken or name is None or not is_complex(name):
            continue
        members, names, n_complex, inter = [start], [name], 1, 0
        best: tuple[list[int], list[str], int] | None = None  # members, names, intermediate bytes
        current = b
        while True:
            out = current.var
            nxt = consumer.get(out, -1)
            if uses.get(out, 0) != 1 or nxt < 0 or nxt in taken or callee(bindings[nxt]) is None:
                break
            size = _tensor_bytes(out.ty)
            if size > max_bytes:
                break
            nname = callee(bindings[nxt])
            cplx = is_complex(nname)
            if cplx and n_complex == max_complex:
                break
            inter += size
            members.append(nxt)
            names.append(nname)
            current = bindings[nxt]
            if cplx:
                n_complex += 1
                if inter >= min_bytes:
                    best = (list(members), list(names), inter)
        if best is not None:
            chains.append(Chain(tuple(best[0]), tuple(best[1]), best[2]))
            taken.update(best[0])
    return chains


def grouped_name(chain: Chain, k: int) -> str:
    """The name of the function `group_chains` merges the `k`th of its chains into."""
    return "grouped_" + "_".join(n.removeprefix("fused_") for n in chain.functions)[:80] + f"_{k}"


def group_chains(mod: tvm.IRModule, *, min_bytes: int | None = None, max_bytes: int = MAX_BYTES,
                 max_complex: int = MAX_COMPLEX, chains: list[Chain] | None = None) -> tuple[tvm.IRModule, list[Chain]]:
    """Merges every chain `find_chains` finds into one PrimFunc (see the module docstring).

    Args:
        chains: merge these instead (`find_chains`' of this very module, a selection of them: a model job's
            fusion decisions); a chain whose positions no longer call its functions raises ValueError.

    Returns:
        The module (unchanged when there is no chain) and the chains merged.
    """
    if chains is None:
        chains = find_chains(mod, min_bytes=min_bytes, max_bytes=max_bytes, max_complex=max_complex)
    if not chains:
        return mod, []
    main = mod["main"]
    bindings = list(main.body.blocks[0].bindings)
    for chain in chains:
        called = [_callee_name(bindings[i]) if i < len(bindings) else None for i in chain.positions]
        if called != list(chain.functions):
            raise ValueError(f"chain {list(chain.functions)} is not at positions {list(chain.positions)} of main "
                             f"(they call {called}): the model was lowered differently")
    replace: dict[int, Any] = {}
    drop: set[int] = set()
    new_funcs: dict[str, Any] = {}
    for k, chain in enumerate(chains):
        members = [bindings[i] for i in chain.positions]
        inside = {b.var for b in members}
        outer: list[Any] = []
        for b in members:
            for arg in b.value.args[1].fields:
                if arg not in inside and not any(arg.same_as(o) for o in outer):
                    outer.append(arg)
        params = [relax.Var(f"p{i}", a.ty) for i, a in enumerate(outer)]
        remap = {o: p for o, p in zip(outer, params)}
        inner_bindings, local = [], {}
        for b in members:
            args = [local.get(a, remap.get(a, a)) for a in b.value.args[1].fields]
            call = relax.call_tir(b.value.args[0], args, out_ty=b.var.ty)
            var = relax.DataflowVar(b.var.name, b.var.ty) if b is not members[-1] else relax.Var(b.var.name, b.var.ty)
            inner_bindings.append(relax.VarBinding(var, call))
            local[b.var] = var
        out_var = inner_bindings[-1].var
        body = relax.SeqExpr([relax.DataflowBlock(inner_bindings)], out_var)
        name = grouped_name(chain, k)
        func = relax.Function(params, body, out_var.ty).with_attr("Primitive", True) \
            .with_attr("global_symbol", name)
        new_funcs[name] = (func, outer, members[-1])
        for i in chain.positions[:-1]:
            drop.add(i)
        replace[chain.positions[-1]] = name
    bb = relax.BlockBuilder(mod)
    gvs = {name: bb.add_func(func, name) for name, (func, _, _) in new_funcs.items()}
    updated = bb.get()
    new_bindings = []
    for i, b in enumerate(bindings):
        if i in drop:
            continue
        if i in replace:
            _, outer, last = new_funcs[replace[i]]
            new_bindings.append(relax.VarBinding(b.var, relax.Call(gvs[replace[i]], outer)))
        else:
            new_bindings.append(b)
    new_main = relax.Function(main.params, relax.SeqExpr([relax.DataflowBlock(new_bindings)], main.body.body),
                              main.ret_ty, main.is_pure, main.attrs)
    updated[updated.get_global_var("main")] = new_main
    fused = relax.transform.DeadCodeElimination()(relax.transform.FuseTIR()(updated))
    # mark the merged PrimFuncs, so a build knows them (`compiler.workloads.model.build.default_cpu_schedule`)
    marked = {}
    for gv, func in fused.functions.items():
        if gv.name_hint in new_funcs and not isinstance(func, relax.Function):
            marked[gv] = func.with_attr("altune.grouped", True)
    for gv, func in marked.items():
        fused[gv] = func
    return fused, chains
