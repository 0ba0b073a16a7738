"""Graph-level layouts of a model: the blocked `N C/c H W c` policy for convolutions, its block factors from
the target's vector width, the conv sites and layout groups the graph-level search chooses blocks for, and
`convert_layouts`, which applies a choice (with `legalize`'s kernels and `carry`'s rewrites).

Layering: `compiler` never imports `tuner` or `service`. torch is imported inside the functions that run the
exported program: building and running the model needs only TVM.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import tvm
import tvm_ffi
from tvm import relax

from compiler.passes.tensorize.instructions import choose
from compiler.target import target_info
from compiler.target import vector_lanes as vector_lanes  # re-exported: callers import it from here

from .carry import carry_layouts
from .legalize import depthwise_conv2d_nchwc as depthwise_conv2d_nchwc  # re-exported
from .legalize import legalize_conv2d

# Graph-level layouts of a model (ALT sec. 4.2): "none" keeps the operators' own layouts; "blocked"
# puts every dense and depthwise conv2d in N C/c H W c (weights O/o I/i KH KW i o, transformed at build time) and
# lets ConvertLayout carry the layout along element-wise, pooling and reduction paths (and `carry_layouts` through
# the concats and resizes where ConvertLayout drops it), so conversions remain only where an operator cannot take
# it (inputs, outputs, flatten, grouped and transposed convs).
# "search" imports as "blocked" (the rule's blocks, where the search starts); `tuner.graph_layout` then chooses the
# blocks of the convs' layout groups, which `import_model(blocks=...)` applies.
MODEL_LAYOUTS = ("blocked", "search", "none")

# the "block" of a conv side or a layout group that keeps the model's own layout (NCHW): a conv with either side
# plain stays wholly in NCHW, with conversions where it meets blocked neighbours. The graph-level search offers it
# for every group: on a small model a conversion can cost more than what the blocked layout saves.
PLAIN = 0


def conv_blocks(out_channels: int, in_channels: int, lanes: int) -> tuple[int, int]:
    """(output block o, input block i) of a conv2d in the blocked layout: the largest power of two up
    to `lanes` that divides the channel count; a channel count below `lanes` that no power of two
    >= 4 divides (3 RGB channels) is one whole block."""

    def block(c: int) -> int:
        if c <= lanes and all(c % b for b in (4, 8, 16, 32, 64) if b <= c):
            return c
        return next(b for b in (64, 32, 16, 8, 4, 2, 1) if b <= lanes and c % b == 0)

    return block(out_channels), block(in_channels)


# the operand types (data, weight, accumulator) of a conv the dot-product form takes, by the name
# `dot_instruction` knows them by: a quantized conv's (u8 x s8 -> s32) and a bfloat16 conv's (-> fp32)
DOT_OPERANDS = {("uint8", "int8", "int32"): "int8", ("bfloat16", "bfloat16", "float32"): "bfloat16"}


def dot_instruction(target: Any, dtype: str = "int8") -> tuple[int, int] | None:
    """(lanes, group) of the preferred dot-product instruction `target` has for `dtype` convs; None where it
    has none.

    int8 (u8 x s8 -> s32): the exact ones, AVX-512 VNNI or AVX-VNNI (groups of 4), else `vpmaddwd` on
    sign-extended pairs (AVX-512BW, AVX2: groups of 2); `vpmaddubsw` saturates its pair sums, so a model's
    full-range uint8 data never gets it. bfloat16 (-> fp32): AVX512_BF16's `vdpbf16ps`, else the pairs widened
    to fp32 FMA (AVX-512, AVX2), groups of 2."""
    if target is None or not target_info(target).is_cpu:
        return None
    operands = next(types for types, name in DOT_OPERANDS.items() if name == dtype)
    ins = choose(target, *operands, exact=True)
    return (ins.lanes, ins.group) if ins is not None else None


def dot_conv_layouts(call: Any, dots: dict[str, tuple[int, int] | None]) -> list[str] | None:
    """[data, kernel, out] layouts of a quantized conv2d (uint8 data, int8 weight, int32 sum; `quantized`'s) or
    a bfloat16 one (float32 sum; `converters`') in the dot-product form: NHWC data and output, the weight
    `OHWI{L}o{G}i` (`conv2d_nhwc_dot`), so that a group of G input channels is one 32-bit word of the data and
    L output channels one vector of sums; None where the target has no instruction for its types (`dots`:
    `dot_instruction` by type name) or the conv does not fit it (grouped, channels that L or G does not
    divide)."""
    attrs = call.attrs
    data, weight = call.args[0].ty, call.args[1].ty
    dot = dots.get(DOT_OPERANDS.get((str(data.dtype), str(weight.dtype), str(attrs.out_dtype)), ""))
    if dot is None:
        return None
    lanes, group = dot
    kernel = str(attrs.kernel_layout)
    if str(attrs.data_layout) not in ("NCHW", "NHWC") or sorted(kernel) != sorted("OIHW"):
        return None
    out_channels, in_channels = int(weight.shape[kernel.index("O")]), int(weight.shape[kernel.index("I")])
    if int(attrs.groups) != 1 or out_channels % lanes or in_channels % group:
        return None
    return ["NHWC", f"OHWI{lanes}o{group}i", "NHWC"]


def blocked_conv_layouts(lanes: int, dots: dict[str, tuple[int, int] | None] | None = None) -> Any:
    """`ConvertLayout`'s per-call callback: the dot-product form for quantized and bfloat16 convs where the
    target's instruction (`dots`, `dot_instruction` by type name) fits them (`dot_conv_layouts`), else the
    blocked layout for dense and depthwise NCHW conv2d (a quantized conv keeps its own), nothing else (other
    grouped convs, every other operator: ConvertLayout's own rules)."""

    def layouts(call: Any) -> dict:
        op = getattr(call, "op", None)
        if getattr(op, "name", "") == "relax.nn.conv2d_transpose":  # its own, said explicitly: from a blocked
            attrs = call.attrs  # producer ConvertLayout fails ("Layouts must have the same size")
            return {"relax.nn.conv2d_transpose": [str(attrs.data_layout), str(attrs.kernel_layout),
                                                  str(attrs.out_layout)]}
        if getattr(op, "name", "") != "relax.nn.conv2d":
            return {}
        attrs = call.attrs
        own = [str(attrs.data_layout), str(attrs.kernel_layout), str(attrs.out_layout)]
        dot = dot_conv_layouts(call, dots or {})
        if dot is not None:
            return {"relax.nn.conv2d": dot}
        if str(call.args[0].ty.dtype) == "uint8":  # quantized (NCHW, or a quantized linear's NHWC 1x1 form)
            return {"relax.nn.conv2d": own}
        if attrs.data_layout != "NCHW" or attrs.kernel_layout != "OIHW":
            return {"relax.nn.conv2d": own}
        shape = call.args[1].ty.shape
        out_channels, in_channels, groups = int(shape[0]), int(shape[1]), int(attrs.groups)
        if groups == out_channels and in_channels == 1:  # depthwise: one block for data and output
            ob, _ = conv_blocks(out_channels, out_channels, lanes)
            return {"relax.nn.conv2d": [f"NCHW{ob}c", f"OIHW1i{ob}o", f"NCHW{ob}c"]}
        if groups != 1:  # other grouped convs keep NCHW (conversions around them); said explicitly, since
            return {"relax.nn.conv2d": ["NCHW", "OIHW", "NCHW"]}  # {} would try the producer's blocked layout
        ob, ib = conv_blocks(out_channels, in_channels, lanes)
        return {"relax.nn.conv2d": [f"NCHW{ib}c", f"OIHW{ib}i{ob}o", f"NCHW{ob}c"]}

    return layouts


def block_candidates(channels: int, lanes: int) -> tuple[int, ...]:
    """The channel blocks the graph-level layout search may give a conv's tensor of `channels` channels: the
    powers of two from a quarter of the vector width to twice it that divide `channels` (at least 4), and
    `conv_blocks`' choice (a whole block for 3 RGB channels)."""
    ours = conv_blocks(channels, channels, lanes)[0]
    blocks = {b for b in (lanes // 4, lanes // 2, lanes, 2 * lanes) if b >= 4 and channels % b == 0}
    return tuple(sorted(blocks | {ours}))


@dataclass(frozen=True)
class ConvSite:
    """A conv2d of a model whose layout the graph-level search chooses (ALT sec. 4.2: the complex operators).

    Attributes:
        weight: the name of its weight, a parameter of "main" ("p_conv1_weight"): which conv it is.
        out_channels, in_channels: its channel counts.
        depthwise: one block serves data and output (`NCHW{b}c` in and out).
        spatial: output height x width (for the layout actor's state).
        kernel: kernel height x width.
        in_blocks, out_blocks: the candidate channel blocks of its input and output (`block_candidates`).
        default: `conv_blocks`' (input block, output block), the rule the search starts from.
    """

    weight: str
    out_channels: int
    in_channels: int
    depthwise: bool
    spatial: int
    kernel: int
    in_blocks: tuple[int, ...]
    out_blocks: tuple[int, ...]
    default: tuple[int, int]


def conv_sites(mod: Any, lanes: int, target: Any = None) -> list[ConvSite]:
    """The conv2d calls of "main" the blocked layout applies to (dense and depthwise, NCHW/OIHW), in graph
    order, one per weight; with a `target`, not those that take the dot-product form there (an int8 or bf16
    conv its instruction fits, `dot_conv_layouts`: that form is theirs, no block is chosen for them)."""
    sites: dict[str, ConvSite] = {}
    policy = blocked_conv_layouts(lanes)
    dots = {name: dot_instruction(target, name) for name in DOT_OPERANDS.values()} if target is not None else {}
    for block in mod["main"].body.blocks:
        for binding in block.bindings:
            call = binding.value
            if not (isinstance(call, relax.Call) and getattr(call.op, "name", "") == "relax.nn.conv2d"
                    and isinstance(call.args[1], relax.Var)) or call.args[1].name in sites:
                continue
            wanted = policy(call)["relax.nn.conv2d"]
            if wanted[0] == str(call.attrs.data_layout):  # not blockable (grouped, or another layout)
                continue
            if dots and dot_conv_layouts(call, dots) is not None:
                continue
            out_c, in_c, kh, kw = (int(d) for d in call.args[1].ty.shape)
            depthwise = int(call.attrs.groups) > 1
            out_shape = [int(d) for d in binding.var.ty.shape]
            default = conv_blocks(out_c, out_c if depthwise else in_c, lanes)
            sites[call.args[1].name] = ConvSite(
                weight=call.args[1].name, out_channels=out_c, in_channels=out_c if depthwise else in_c,
                depthwise=depthwise, spatial=out_shape[2] * out_shape[3], kernel=kh * kw,
                in_blocks=block_candidates(out_c if depthwise else in_c, lanes),
                out_blocks=block_candidates(out_c, lanes), default=(default[1], default[0]))
    return list(sites.values())


def site_layouts(site: ConvSite, blocks: tuple[int, int]) -> list[str]:
    """`ConvertLayout`'s [data, kernel, out] layouts of a conv in blocks (input block, output block); either
    block `PLAIN`: its own NCHW layout."""
    ib, ob = blocks
    if PLAIN in (ib, ob):
        return ["NCHW", "OIHW", "NCHW"]
    if site.depthwise:
        assert ib == ob, f"depthwise conv {site.weight}: one block for data and output, got {blocks}"
        return [f"NCHW{ob}c", f"OIHW1i{ob}o", f"NCHW{ob}c"]
    return [f"NCHW{ib}c", f"OIHW{ib}i{ob}o", f"NCHW{ob}c"]


def _blockable_convs(mod: Any, policy: Any) -> list[str]:
    """Names of the weights of "main"'s conv2d calls that `policy` would block, in graph order (a weight is a
    parameter of "main", so its name says which conv a `ConvertLayout` callback is looking at)."""
    names: list[str] = []
    for block in mod["main"].body.blocks:
        for binding in block.bindings:
            call = binding.value
            if not (isinstance(call, relax.Call) and getattr(call.op, "name", "") == "relax.nn.conv2d"):
                continue
            key = weight_key(call)  # hashes a constant weight's values: once per conv
            if key is not None and key not in names:
                wanted = policy(call).get("relax.nn.conv2d", ["NCHW", "OIHW"])
                if list(wanted[:2]) != [str(call.attrs.data_layout), str(call.attrs.kernel_layout)]:
                    names.append(key)
    return names


def weight_key(call: Any) -> str | None:
    """Which conv2d `call` is, by its weight: the parameter's name, or for a weight bound as a constant (the
    int8 weights of a quantized program are buffers, which TVM's importer binds) "constant <shape> #<hash of its
    value>"; None for a computed weight."""
    weight = call.args[1]
    if isinstance(weight, relax.Var):
        return weight.name
    if type(weight).__name__ == "GenericConst":  # TVM 0.27's relax constant
        shape = "x".join(str(int(d)) for d in weight.ty.shape)
        return f"constant {shape} #{tvm_ffi.structural_hash(weight) & 0xFFFFFFFF:08x}"
    return None


def unlegalized(mod: Any) -> list[str]:
    """The operators of "main" that `LegalizeOps` left as they were although they have a legalization: it
    declined them, in a layout it does not take (a transposed conv in `NCHW16c`); the VM cannot run them."""
    found: set[str] = set()
    for block in mod["main"].body.blocks:
        for binding in block.bindings:
            call = binding.value
            if (isinstance(call, relax.Call) and isinstance(call.op, tvm.ir.Op)
                    and call.op.get_attr("FLegalize") is not None):
                found.add(str(call.op.name))
    return sorted(found)


def convert_layouts(mod: Any, lanes: int, target: Any, *, legalize: bool = False,
                    blocks: dict[str, tuple[int, int]] | None = None) -> tuple[Any, list[str]]:
    """`relax.transform.ConvertLayout` with the blocked policy (`blocked_conv_layouts`), for every conv2d it can
    be applied to: the result, and the weights (parameter names in "main") of the convs left in their own layout.

    `blocks` (weight name -> (input block, output block), the graph-level search's choice) overrides the
    policy's blocks of the convs it names (`PLAIN`: its own layout); where neighbours disagree `ConvertLayout` puts
    a conversion. `carry_layouts` then carries blocks through the concats and resizes ConvertLayout leaves in NCHW.

    TVM's layout pass fails on some graphs with an internal error ("Invalid layout axis" at a concat of different
    blocks, `std::bad_alloc` on 1-D pooling; "Layouts must have the same size" where a blocked tensor reaches a
    transposed conv, which the policy prevents by pinning it to its own layout). Then the convs are tried one at a time in graph order, each kept blocked
    only if the graph with it (and those kept before) still converts (and, with `legalize`, legalizes: slower,
    for when the converted graph fails later); a conv left out keeps NCHW, so `ConvertLayout` puts conversions
    at its boundary. With no conv blocked the module is returned as it is (no layout pass at all)."""
    rule = blocked_conv_layouts(lanes, {name: dot_instruction(target, name) for name in DOT_OPERANDS.values()})
    sites = {site.weight: site for site in conv_sites(mod, lanes, target)} if blocks else {}

    def policy(call: Any) -> dict:
        name = (weight_key(call)
                if getattr(getattr(call, "op", None), "name", "") == "relax.nn.conv2d" else None)
        if name in sites and name in blocks:
            return {"relax.nn.conv2d": site_layouts(sites[name], tuple(blocks[name]))}
        return rule(call)

    convs = _blockable_convs(mod, policy)

    def attempt(blocked: set[str]) -> Any:
        def layouts(call: Any) -> dict:
            if (getattr(getattr(call, "op", None), "name", "") == "relax.nn.conv2d"
                    and weight_key(call) not in blocked):
                attrs = call.attrs  # said explicitly: {} would take the producer's blocked layout
                return {"relax.nn.conv2d": [str(attrs.data_layout), str(attrs.kernel_layout),
                                            str(attrs.out_layout)]}
            return policy(call)

        try:
            converted = carry_layouts(relax.transform.ConvertLayout({}, layouts)(mod))
            if legalize:
                with target:
                    legalized = relax.transform.LegalizeOps({"relax.nn.conv2d": legalize_conv2d})(converted)
                if unlegalized(legalized):
                    return None
        except Exception:  # noqa: BLE001 - TVM's internal errors (InternalError, bad_alloc as RuntimeError)
            return None
        return converted

    if not convs:
        return mod, []
    converted = attempt(set(convs))
    if converted is not None:
        return converted, []
    kept: set[str] = set()
    for name in convs:
        if attempt(kept | {name}) is not None:
            kept.add(name)
    left = [c for c in convs if c not in kept]
    if not kept:
        return mod, left
    converted = attempt(kept)
    assert converted is not None, f"blocked {sorted(kept)} converted one at a time but not together"
    return converted, left


@dataclass(frozen=True)
class LayoutGroup:
    """Tensors of a model that must share one channel block: those joined by element-wise, pooling, concat and
    other non-conv operators (ALT's propagation along element-wise paths), with the convs that write and read them.

    TVM's `ConvertLayout` converts between a blocked and the plain layout, but not between two blocks of the
    same rank (it takes that for a transpose and fails), so the layout a conv gives its output is propagated
    to every tensor the group holds and to the input of every conv that reads it: the graph-level search
    chooses one block per group, and a conv's (input block, output block) is its two groups' blocks.

    Attributes:
        index: position among the model's groups (graph order of first appearance).
        channels: the channel counts of its tensors.
        candidates: the blocks every member's channel count takes (`block_candidates`); one: nothing to choose.
        default: the block `conv_blocks` gives its first conv, or where the group's channel counts do not all
            take that one (a concat's inputs and output), the largest block they all take, and `PLAIN` where they
            take none: the rule's block, where the search starts from.
        writers: weights of the convs whose output it holds.
        readers: weights of the convs whose input it holds.
    """

    index: int
    channels: tuple[int, ...]
    candidates: tuple[int, ...]
    default: int
    writers: tuple[str, ...]
    readers: tuple[str, ...]

    @property
    def weights(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys((*self.writers, *self.readers)))


def layout_groups(mod: Any, lanes: int, target: Any = None) -> list[LayoutGroup]:
    """The layout groups of "main" (before `ConvertLayout`) that hold a blockable conv's input or output
    (`conv_sites`: with a `target`, the dot-product form's convs are not blockable)."""
    sites = {s.weight: s for s in conv_sites(mod, lanes, target)}
    parent: dict[Any, Any] = {}

    def find(v: Any) -> Any:  # Python wrappers of one TVM object differ: compared with same_as
        while not parent.setdefault(v, v).same_as(v):
            parent[v] = parent[parent[v]]
            v = parent[v]
        return v

    def union(a: Any, b: Any) -> None:
        parent[find(a)] = find(b)

    def rank4(v: Any) -> bool:
        ty = getattr(v, "ty", None)
        return isinstance(ty, relax.TensorType) and ty.ndim == 4

    reads: list[tuple[str, Any]] = []
    writes: list[tuple[str, Any]] = []
    tuples: dict[Any, Any] = {}  # var bound to a tuple -> its fields (batch norm returns one)
    for block in mod["main"].body.blocks:
        for binding in block.bindings:
            call = binding.value
            if isinstance(call, relax.Tuple):
                tuples[binding.var] = call.fields
            elif isinstance(call, relax.TupleGetItem) and call.tuple_value in tuples:
                field = tuples[call.tuple_value][call.index]
                if isinstance(field, relax.Var) and rank4(field) and rank4(binding.var):
                    union(field, binding.var)
            if not isinstance(call, relax.Call):
                continue
            weight = call.args[1] if len(call.args) > 1 else None
            if getattr(call.op, "name", "") == "relax.nn.conv2d" and getattr(weight, "name", None) in sites:
                reads.append((weight.name, call.args[0]))
                writes.append((weight.name, binding.var))
                if sites[weight.name].depthwise:
                    union(call.args[0], binding.var)
                continue
            if getattr(call.op, "name", "") in ("relax.nn.conv2d", "relax.nn.conv2d_transpose") or \
                    not rank4(binding.var):
                continue  # another conv (kept in its own layout) or a change of rank: no propagation
            for arg in call.args:  # a concat's inputs are the fields of its tuple
                for v in (arg.fields if isinstance(arg, relax.Tuple) else [arg]):
                    if isinstance(v, relax.Var) and rank4(v):
                        union(v, binding.var)

    roots = list(dict.fromkeys(find(v) for _, v in [*reads, *writes]))
    members: dict[Any, list[Any]] = {}
    for v in list(parent):
        members.setdefault(find(v), []).append(v)
    order = sorted(roots, key=lambda r: min(i for i, (_, v) in enumerate(writes + reads) if find(v).same_as(r)))
    groups = []
    for index, root in enumerate(order):
        channels = tuple(sorted({int(v.ty.shape[1]) for v in members[root] if rank4(v)}))
        candidates = set(block_candidates(channels[0], lanes))
        for c in channels[1:]:
            candidates &= set(block_candidates(c, lanes))
        writers = tuple(w for w, v in writes if find(v).same_as(root))
        readers = tuple(w for w, v in reads if find(v).same_as(root))
        first = writers[0] if writers else readers[0]
        default = sites[first].default[1] if writers else sites[first].default[0]
        if not candidates:  # channel counts no block divides (a concat of 3 and 8): the group keeps NCHW
            default = PLAIN
        elif default not in candidates:  # a concat's channel counts: the largest block they all take
            default = max(candidates, key=lambda b: (b <= lanes, b))
        groups.append(LayoutGroup(index, channels, tuple(sorted(candidates)) or (default,), default, writers,
                                  readers))
    return groups


def group_blocks(groups: list[LayoutGroup], choice: dict[int, int], sites: list[ConvSite]) -> dict[str, tuple[int, int]]:
    """Each conv's (input block, output block) when group `i` has block `choice[i]` (a group not in `choice`: its
    default); a conv with a `PLAIN` group on either side is (PLAIN, PLAIN)."""
    block = {g.index: choice.get(g.index, g.default) for g in groups}
    out = {s.weight: s.default for s in sites}
    for g in groups:
        for w in g.readers:
            out[w] = (block[g.index], out[w][1])
        for w in g.writers:
            out[w] = (out[w][0], block[g.index])
    return {w: (PLAIN, PLAIN) if PLAIN in pair else pair for w, pair in out.items()}
