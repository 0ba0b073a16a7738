"""ALT's layout tuning templates (paper sec. 5.1): a few split factors -> a layout per tensor.

A template exposes only tile sizes; the reorder is fixed by the paper's
observations (the tiled channel innermost for reuse and SIMD, spatial tiles
contiguous for the prefetcher):

* convolutions (conv1d/2d/3d, depthwise, group, dilated, transposed), output
  `N S1/s1t .. Sk/skt O/ot s1t .. skt ot`; the tensor the convolution reads,
  `N S1/.. Sk/.. I/it [B1] .. [Bk] it` with `unfold(Sj, Bj, Vj*sjt)` derived
  from the output tile and the access `Vj*s + r` (no tunable of its own);
  weight `O/kot I/kit K.. kit kot`;
* GEMMs (dense, batch_matmul): `M/mt N/nt mt nt`, `M/mt K/kt mt kt`, `K/kt N/nt kt nt`.

The dot-product form (`dot=(L, G)`: an int8 or bf16 operator on a target with a dot-product instruction of L
lanes summing groups of G, `compiler.workloads.model.layouts.dot_instruction`): the template gets a `group`
parameter (G) and its weight is packed as the instruction reads it, the group innermost below the lanes --
`O/kot I/G K.. kot G` (conv), `N/nt K/G nt G` (GEMM) -- with the output's channel tile (`ot`, `nt`, and so
`kot`) one vector of L lanes and the input's channel tile (`it`, `kt`) whole groups. The complex op's
channel reduction is then split the same way, `r = ro * G + g`, the group `g` its last axis, annotated
(`LayoutTemplate.reduction_split`, applied by `compiler.layout.rewrite`): the loop search finds the group axis
there and the tensorize pass rewrites the nest to the instruction. A channel count that G does not divide
reads the layouts' zero padding in its last group (COM: no remainder branch, `0 * 0` added).

A factor of 1 leaves its dimension untiled. Any factor is valid (a split that
does not divide pads with zeros); `TemplateParam.candidates` lists the divisors,
which is what a search should start from.

Layering: `compiler` never imports `tuner` or `service`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tvm import sym, tirx

from compiler.tir_util import key

from .primitives import LayoutError, substitute
from .propagate import Graph
from .rewrite import GroupedReduction
from .tensor_layout import Layout

_SPATIAL_NAMES = {1: ("W",), 2: ("H", "W"), 3: ("D", "H", "W")}
OUTER_SUFFIX = "2"  # a second-level factor's name: its first-level factor's and this ("ot2")
GROUP_PARAM = "group"  # the dot-product form's group (a template parameter, so a stored choice rebuilds it)


@dataclass(frozen=True)
class TemplateParam:
    """One tunable split factor of a template."""

    name: str  # "ot", "ht", "it", "kot", "mt", ...
    tensor: str  # the tensor it tiles: "output" or the name the complex op reads ("pad_temp", "weight", ...)
    dim: str  # the dimension's name in that tensor ("O", "H", ...)
    extent: int  # the dimension's size
    candidates: tuple[int, ...]  # divisors of extent


@dataclass(frozen=True)
class LayoutTemplate:
    """A layout space: the tunable factors and how a choice of them becomes layouts."""

    kind: str  # "conv" or "gemm"
    complex_op: str  # name of the complex op in the graph (the workload's compute block)
    params: tuple[TemplateParam, ...]
    _build: Any  # (choice) -> dict[str, Layout]
    channel_reduction: int | None = None  # index of the complex op's reduce axis over input channels (K)
    # output dims the dot form computes past their extent without a guard, with the factor that pads them: their
    # padding reads only padding the operands' layouts allocate (channels and a GEMM's rows: zeros; a conv's
    # spatial tiles: the unfolded input's), and the output's conversion drops it
    zero_padded: tuple[tuple[int, str], ...] = ()

    def default(self) -> dict[str, int]:
        """Every factor 1: no tiling, channels last (NHWO / NHWI / OIHW; MN / MK / KN); in the dot-product form
        the least it has: the channels in one vector of lanes and single groups (NHW O/L L, `O/L I/G .. L G`)."""
        return {p.name: 1 if 1 in p.candidates else min(p.candidates) for p in self.params}

    def layouts(self, choice: Mapping[str, int]) -> dict[str, Layout]:
        """The requested layouts ("output" and each tensor the complex op reads) for a choice.

        Raises:
            LayoutError: unknown parameter names or factors < 1.
        """
        names = {p.name for p in self.params}
        unknown = set(choice) - names
        if unknown:
            raise LayoutError(f"unknown template parameters {sorted(unknown)}; this template has {sorted(names)}")
        full = {**self.default(), **{k: int(v) for k, v in choice.items()}}
        for name, value in full.items():
            if value < 1:
                raise LayoutError(f"template parameter {name}={value} must be >= 1")
        return self._build(full)

    def reduction_split(self, choice: Mapping[str, int]) -> GroupedReduction | None:
        """The dot-product form's reduction `r = ro * G + g` (module docstring) and the output dims it leaves
        unguarded; None outside the form (no `group` in `choice`, or 1)."""
        group = int(choice.get(GROUP_PARAM, 1))
        if group == 1:
            return None
        if self.channel_reduction is None:
            raise LayoutError(f"{self.complex_op}: no reduction over the weight's input channels to group by {group}")
        # a second-level tile pads the output past the operand's padding: that dim keeps its guard
        padded = tuple(dim for dim, name in self.zero_padded if choice.get(name + OUTER_SUFFIX, 1) == 1)
        return GroupedReduction(self.channel_reduction, group, padded)


def _divisors(n: int) -> tuple[int, ...]:
    return tuple(d for d in range(1, n + 1) if n % d == 0)


def _ceil_to(n: int, m: int) -> int:
    return -(-n // m) * m


def _groups(extent: int, group: int) -> tuple[int, ...]:
    """Channel tiles of whole groups: the multiples of `group` dividing `extent` rounded up to groups, and the
    powers of two times `group` below it (their padding is never read: the reduction ends at the last group)."""
    whole = _ceil_to(extent, group)
    powers = {group << j for j in range(whole.bit_length()) if group << j <= whole}
    return tuple(sorted({d for d in _divisors(whole) if d % group == 0} | powers))


ROW_TILES = (4, 6, 8, 12, 16)  # the dot-product GEMM's row tiles besides M's divisors (their padding reads zeros)


def _dot_params(params: list[TemplateParam], dot: tuple[int, int], lanes_of: tuple[str, ...],
                groups_of: tuple[str, ...], weight: Any) -> list[TemplateParam]:
    """`params` restricted to the dot-product form: the output channel tiles (`lanes_of`) one vector, the input
    channel tile (`groups_of`: the data's, then the weight's) whole groups (the weight's: one), and the `group`
    parameter."""
    lanes, group = dot
    out = []
    for p in params:
        if p.name in lanes_of:
            p = TemplateParam(p.name, p.tensor, p.dim, p.extent, (lanes,))
        elif p.name in groups_of:
            one = p.name != groups_of[0]
            p = TemplateParam(p.name, p.tensor, p.dim, p.extent, (group,) if one else _groups(p.extent, group))
        out.append(p)
    return [*out, TemplateParam(GROUP_PARAM, weight.op.name, "I", group, (group,))]


def _group_of(c: Mapping[str, int], data_tile: str) -> int:
    """The choice's group (1 outside the dot-product form), checked against the input's channel tile."""
    group = c.get(GROUP_PARAM, 1)
    if group > 1 and c[data_tile] % group:
        raise LayoutError(f"{data_tile}={c[data_tile]}: the dot-product form's input channel tile must be whole "
                          f"groups of {group}")
    return group


def _first_load(op: Any, tensor: Any) -> list | None:
    """The indices of `op`'s first load of `tensor` (None: it reads none)."""
    loads: list[list] = []

    def load(t: Any, new: list, old: list) -> Any:
        if key(t.op) == key(tensor.op):
            loads.append(old)
        return t(*new)

    substitute(op.body[0].source[0] if isinstance(op.body[0], tirx.Reduce) else op.body[0], {}, load)
    return loads[0] if loads else None


def _reduce_axis_at(op: Any, tensor: Any, dim: int) -> int | None:
    """Index of the reduce axis that `op` reads `tensor`'s dimension `dim` with (None: no single one)."""
    indices = _first_load(op, tensor)
    if indices is None:
        return None
    return next((k for k, rv in enumerate(op.reduce_axis) if indices[dim].same_as(rv.var)), None)


def _tile(layout: Layout, dim: int, factor: int) -> tuple[Layout, bool]:
    """split(dim, factor) unless factor is 1; says whether it split."""
    if factor == 1:
        return layout, False
    return layout.split(dim, factor), True


def _window(op: Any, tensor: Any, dim: int, axis: int) -> tuple[int, int] | None:
    """(V, M) of the access `tensor[.., V*s + r, ..]` at `dim`, with `s` = output axis `axis`.

    V is the coefficient of the output index, M the extent of the window the
    reduction variables sweep (kernel extent with dilation). None when the index
    does not have that form.
    """
    indices = _first_load(op, tensor)
    if indices is None:
        return None
    e = indices[dim]
    analyzer = sym.Analyzer()

    def at(s: int, reduce_at_max: bool) -> int | None:
        vmap = {key(ax.var): tirx.const(s if k == axis else 0, ax.var.ty) for k, ax in enumerate(op.axis)}
        for rv in op.reduce_axis:
            value = rv.dom.min + rv.dom.extent - 1 if reduce_at_max else rv.dom.min
            vmap[key(rv.var)] = value
        v = analyzer.simplify(substitute(e, vmap))
        return int(v) if isinstance(v, tirx.IntImm) else None

    lo, hi, step = at(0, False), at(0, True), at(1, False)
    if lo is None or hi is None or step is None or step - lo < 1 or hi < lo:
        return None
    # affine in the output index, not only from 0 to 1 (a transposed conv reads `(s + pad) // stride`)
    extent = int(op.axis[axis].dom.extent)
    for s in range(2, min(extent, 8)):
        if at(s, False) != lo + s * (step - lo):
            return None
    return step - lo, hi - lo + 1


def _inputs_by_role(graph: Graph, op: Any) -> tuple[Any, Any]:
    """(data-like, weight-like) tensors the complex op reads, found by the placeholder they come from."""

    def origin(t: Any) -> set[str]:
        if Graph.is_placeholder(t.op):
            return {t.op.name}
        out: set[str] = set()
        for s in t.op.input_tensors:
            out |= origin(s)
        return out

    inputs = list(op.input_tensors)
    data = [t for t in inputs if "data" in origin(t)]
    # a weight comes from constants only ("weight", or "weight1", "weight_dw", ... in a subgraph)
    weight = [t for t in inputs if origin(t) and all(n.startswith("weight") for n in origin(t))]
    if (len(data), len(weight)) != (1, 1) and len(inputs) == 2:  # two activations (attention's Q K^T): in order
        data, weight = inputs[:1], inputs[1:]
    assert len(data) == 1 and len(weight) == 1, f"{op.name}: {[t.op.name for t in inputs]}"
    return data[0], weight[0]


def _tile_output(layout: Layout, start: int, names: list[str], c: Mapping[str, int], *, channel_last: bool) -> Layout:
    """Dims `start..` of `layout` (one per name in `names`) tiled by `c[name]` and, with two levels, again by
    `c[name + "2"]`: outer parts, then the second-level tiles, then the first-level tiles, each group in
    `names`' order, or with the first name (the channel) last when `channel_last`. A factor of 1 adds no dim."""
    groups: list[list[int]] = [[], [], []]  # positions of the outer parts, second-level tiles, first-level tiles
    pos = start
    for name in names:
        inner, outer = c[name], c.get(name + OUTER_SUFFIX, 1)
        factors = [f for f in (outer, inner) if f > 1]
        if factors:
            layout = layout.split(pos, -1, *factors)
        groups[0].append(pos)
        if outer > 1:
            groups[1].append(pos + 1)
        if inner > 1:
            groups[2].append(pos + len(factors))
        pos += 1 + len(factors)
    channel = [True, c.get(names[0] + OUTER_SUFFIX, 1) > 1, c[names[0]] > 1]  # the first name's part in each group
    perm = list(range(start))
    for group, has_channel in zip(groups, channel):
        perm += [*group[1:], group[0]] if channel_last and has_channel else group
    return layout.reorder(*perm)


def _second_level(params: list[TemplateParam], names: tuple[str, ...]) -> list[TemplateParam]:
    """The two-level template's extra factors: one more tile of each output dimension in `names`, in
    units of the first tile (`ot2` = 4 with `ot` = 16: O/64 4 16); a product that does not divide pads."""
    return [TemplateParam(p.name + OUTER_SUFFIX, p.tensor, p.dim, p.extent, p.candidates)
            for p in params if p.name in names]


def conv_template(graph: Graph, op: Any, levels: int = 1, weight_is_io: bool = False,
                  dot: tuple[int, int] | None = None) -> LayoutTemplate:
    """The sec. 5.1 convolution template for complex op `op` (output N O S..., input N I S..., weight O I K...,
    or I O K... with `weight_is_io`, a transposed convolution's: swapped for free, weights are packed once).

    `levels=2` is the paper's two-level output template, N H/(ht' ht) W/(wt' wt) O/(ot' ot) ht' wt' ot' ht wt ot
    (params `ht2`, `wt2`, `ot2`); the input and weight stay one-level, following the first tiles.
    `dot=(L, G)`: the dot-product form (module docstring).
    """
    if levels not in (1, 2):
        raise LayoutError(f"levels={levels}: layout templates have one or two levels")
    if dot is not None and weight_is_io:
        raise LayoutError("the dot-product form is for convolutions whose weight is O I K..., not transposed ones")
    data, weight = _inputs_by_role(graph, op)
    out_shape = graph.shape(op)
    data_shape = tuple(int(s) for s in data.shape)
    weight_shape = tuple(int(s) for s in weight.shape)
    w_o, w_i = (1, 0) if weight_is_io else (0, 1)  # weight dims holding O and I
    k = len(out_shape) - 2
    spatial = _SPATIAL_NAMES[k]
    windows = [_window(op, data, 2 + j, 2 + j) for j in range(k)]
    params = [TemplateParam("ot", "output", "O", out_shape[1], _divisors(out_shape[1]))]
    params += [
        TemplateParam(f"{s.lower()}t", "output", s, out_shape[2 + j], _divisors(out_shape[2 + j]))
        for j, s in enumerate(spatial)
    ]
    params += [
        TemplateParam("it", data.op.name, "I", data_shape[1], _divisors(data_shape[1])),
        TemplateParam("kot", weight.op.name, "O", weight_shape[w_o], _divisors(weight_shape[w_o])),
        TemplateParam("kit", weight.op.name, "I", weight_shape[w_i], _divisors(weight_shape[w_i])),
    ]
    if levels == 2:
        params += _second_level(params, ("ot", *(f"{s.lower()}t" for s in spatial)))
    if dot is not None:
        params = _dot_params(params, dot, ("ot", "kot"), ("it", "kit"), weight)

    def build(c: dict[str, int]) -> dict[str, Layout]:
        group = _group_of(c, "it")
        # output: N O S1..Sk -> N S1/.. Sk/.. O/.. [s1t' .. skt' ot'] s1t .. skt ot
        out = _tile_output(Layout.identity(out_shape, ("N", "O", *spatial)), 1,
                           ["ot", *(f"{s.lower()}t" for s in spatial)], c, channel_last=True)

        # input: unfold every spatial dim by the output tile, split I by it
        inp = Layout.identity(data_shape, ("N", "I", *spatial))
        unfolded = []
        for j in reversed(range(k)):
            st, win = c[f"{spatial[j].lower()}t"], windows[j]
            if st > 1 and win is not None:
                v, m = win
                inp = inp.unfold(2 + j, v * (st - 1) + m, v * st)
                unfolded.append(j)
        dims = ["N", "I"]
        for j in range(k):
            dims += [f"T{j}", f"B{j}"] if j in unfolded else [f"S{j}"]
        inp, split_i = _tile(inp, 1, c["it"])
        if split_i:
            dims = ["N", "I/it", "it", *dims[2:]]
        order = ["N"] + [d for d in dims if d.startswith(("T", "S"))] + (["I/it"] if split_i else ["I"])
        order += [d for d in dims if d.startswith("B")] + (["it"] if split_i else [])
        inp = inp.reorder(*[dims.index(d) for d in order])

        # weight: O I K.. -> O/kot I/kit K.. kit kot (the dot-product form: O/kot I/G K.. kot G)
        if group > 1 and c["kit"] not in (1, group):
            raise LayoutError(f"kit={c['kit']}: the dot-product form's weight is tiled by its group ({group})")
        if group > 1 and c["kot"] != c["ot"]:  # the output channels' padding computes zero on the weight's
            raise LayoutError(f"kot={c['kot']}: the dot-product form's weight is tiled as its output (ot={c['ot']})")
        spatial_k = tuple(f"K{s}" for s in spatial)
        if weight_is_io:
            w = Layout.identity(weight_shape, ("I", "O", *spatial_k)).reorder(1, 0, *range(2, 2 + k))
        else:
            w = Layout.identity(weight_shape, ("O", "I", *spatial_k))
        wdims = ["O", "I", *(f"K{j}" for j in range(k))]
        w, split_o = _tile(w, 0, c["kot"])
        if split_o:
            wdims = ["O/", "o", *wdims[1:]]
        ipos = wdims.index("I")
        w, split_wi = _tile(w, ipos, group if group > 1 else c["kit"])
        if split_wi:
            wdims = [*wdims[:ipos], "I/", "i", *wdims[ipos + 1 :]]
        worder = [wdims.index("O/" if split_o else "O"), wdims.index("I/" if split_wi else "I")]
        worder += [wdims.index(f"K{j}") for j in range(k)]
        inner = ([wdims.index("i")] if split_wi else []) + ([wdims.index("o")] if split_o else [])
        w = w.reorder(*worder, *(reversed(inner) if group > 1 else inner))
        return {"output": out, data.op.name: inp, weight.op.name: w}

    # the output channels' padding: the weight's (kot = ot), zeros; a spatial dim's padding (wt that does not
    # divide the width): the input unfolded by the output's tiles has as many tiles, so the padded outputs read
    # the input layout's own padding -- values the output's conversion drops, computed without a guard, which
    # in the reduction's body kept the nest from the instruction (a 55-wide int8 conv with wt = 8: 69 ms)
    unfolded = tuple((2 + j, f"{s.lower()}t") for j, s in enumerate(spatial) if windows[j] is not None)
    return LayoutTemplate("conv", op.name, tuple(params), build, _reduce_axis_at(op, weight, w_i),
                          ((1, "ot"), *unfolded))


def gemm_template(graph: Graph, op: Any, weight_is_nk: bool, levels: int = 1,
                  dot: tuple[int, int] | None = None) -> LayoutTemplate:
    """The sec. 5.1 GEMM template: `M/mt N/nt mt nt`, `M/mt K/kt mt kt`, `K/kt N/nt kt nt`.

    `levels=2`: the output two-level, `M/(mt' mt) N/(nt' nt) mt' nt' mt nt` (params `mt2`, `nt2`).
    `dot=(L, G)`: the dot-product form (module docstring), weight `N/nt K/G nt G`.
    """
    if levels not in (1, 2):
        raise LayoutError(f"levels={levels}: layout templates have one or two levels")
    data, weight = _inputs_by_role(graph, op)
    out_shape = graph.shape(op)
    batch = len(out_shape) - 2
    m, n = out_shape[batch], out_shape[batch + 1]
    kdim = int(data.shape[batch + 1])
    params = [
        TemplateParam("mt", "output", "M", m, _divisors(m)),
        TemplateParam("nt", "output", "N", n, _divisors(n)),
        TemplateParam("kt", data.op.name, "K", kdim, _divisors(kdim)),
    ]
    if levels == 2:
        params += _second_level(params, ("mt", "nt"))
    if dot is not None:
        params = _dot_params(params, dot, ("nt",), ("kt",), weight)
        # rows padded to a register block's height: the data's zero rows, computed without a guard
        params[0] = TemplateParam("mt", "output", "M", m, tuple(sorted(set(params[0].candidates)
                                                                       | {r for r in ROW_TILES if r < m})))
    b = ("B",) * batch

    def tile2(layout: Layout, f0: int, f1: int) -> Layout:
        """[..., X, Y] -> [..., X/f0, Y/f1, f0, f1] (untiled dims stay single)."""
        layout, s0 = _tile(layout, batch, f0)
        layout, s1 = _tile(layout, batch + 1 + s0, f1)
        pre = list(range(batch))
        x_out, x_in = batch, (batch + 1 if s0 else None)
        y_out = batch + 1 + s0
        y_in = y_out + 1 if s1 else None
        return layout.reorder(*pre, x_out, y_out, *(d for d in (x_in, y_in) if d is not None))

    def build(c: dict[str, int]) -> dict[str, Layout]:
        group = _group_of(c, "kt")
        out = _tile_output(Layout.identity(out_shape, (*b, "M", "N")), batch, ["mt", "nt"], c, channel_last=False)
        inp = tile2(Layout.identity(tuple(int(s) for s in data.shape), (*b, "M", "K")), c["mt"], c["kt"])
        wshape = tuple(int(s) for s in weight.shape)
        if weight_is_nk:  # (N, K) -> K/kt N/nt kt nt: the swap is free, weights are packed once
            w = Layout.identity(wshape, (*b, "N", "K")).reorder(*range(batch), batch + 1, batch)
        else:
            w = Layout.identity(wshape, (*b, "K", "N"))
        if group > 1:  # K N -> N/nt K/G nt G
            w = tile2(w, group, c["nt"]).reorder(*range(batch), *(batch + d for d in ((1, 0, 3, 2) if c["nt"] > 1
                                                                                       else (1, 0, 2))))
        else:
            w = tile2(w, c["kt"], c["nt"])
        return {"output": out, data.op.name: inp, weight.op.name: w}

    # the rows' padding is the data's (the same mt), the columns' the weight's (nt): zeros
    return LayoutTemplate("gemm", op.name, tuple(params), build, _reduce_axis_at(op, weight, batch + int(weight_is_nk)),
                          ((batch, "mt"), (batch + 1, "nt")))
