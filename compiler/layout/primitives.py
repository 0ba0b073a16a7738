"""ALT layout primitives (paper sec. 4.1); `compiler.layout.tensor_layout.Layout` records a sequence of them.

A primitive maps the coordinates of a tensor to the coordinates of its new
layout. Each one knows four things:

* `out_shape(shape)`: the shape after it (Table 1 of the paper);
* `forward(idx, shape, ctx)`: old index expressions -> new ones (how an access
  `T[i...]` in the program is rewritten);
* `backward(idx, shape)`: new index expressions -> old ones plus the conditions
  under which the new coordinate holds real data (how a loop nest built over the
  new layout finds the element it computes; padding gives conditions);
* `pack(array, shape, attached)`: the same transformation on a numpy array (the
  build-time packing of constants and the test oracle).

`inverse(shape)` returns the primitives that undo it: split <-> fuse (+ unpad
when the split padded), reorder <-> reorder, unfold <-> fold, pad <-> unpad,
store_at <-> decouple_at.

Dimensions are 0-based here (the paper counts from 1). Index expressions are
TVM `PrimExpr`s.

Layering: `compiler` never imports `tuner` or `service`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from tvm import tirx

from compiler import tir_util

Shape = tuple[int, ...]


class LayoutError(ValueError):
    """A primitive does not fit the tensor it is applied to, or an access it cannot remap."""


def substitute(expr: Any, vmap: dict[int, Any], load: Callable[[Any, list, list], Any] | None = None) -> Any:
    """`compiler.tir_util.substitute`, with what it cannot rewrite reported as a `LayoutError` (the layout
    does not fit the program)."""
    try:
        return tir_util.substitute(expr, vmap, load)
    except tir_util.UnsupportedExpr as e:
        raise LayoutError(str(e)) from e


@dataclass
class AccessContext:
    """What the index rewriting of one compute op knows: loop ranges and the reduction window."""

    analyzer: Any
    reduce_mins: dict[int, Any]

    def simplify(self, e: Any) -> Any:
        return self.analyzer.simplify(e)

    def window_start(self, e: Any) -> Any:
        """`e` with every reduction variable at its minimum: where the access window begins."""
        return self.simplify(substitute(e, self.reduce_mins)) if self.reduce_mins else e

    def can_prove(self, cond: Any) -> bool:
        return bool(self.analyzer.can_prove(cond))

    def require_within(self, e: Any, extent: int, what: str) -> None:
        bound = self.analyzer.const_int_bound(self.simplify(e))
        if bound.min_value < 0 or bound.max_value >= extent:
            raise LayoutError(
                f"{what}: offset {e} spans [{bound.min_value}, {bound.max_value}], outside the tile [0, {extent}): "
                "the tile does not hold the whole access window (choose tile >= stride*(t-1) + window)"
            )


def _check_dim(name: str, dim: int, shape: Shape) -> None:
    if not 0 <= dim < len(shape):
        raise LayoutError(f"{name}: dim {dim} out of range for shape {shape}")


def _floordiv(a: Any, b: int) -> Any:
    return a if b == 1 else tirx.floordiv(a, b)


def _floormod(a: Any, b: int) -> Any:
    return 0 * a if b == 1 else tirx.floormod(a, b)


class Primitive:
    """Base class of the layout primitives; see the module docstring for the contract."""

    basic: bool = True  # split, reorder, fuse: one-to-one, propagated freely

    def out_shape(self, shape: Shape) -> Shape:
        raise NotImplementedError

    def labels(self, names: tuple[str, ...], shape: Shape) -> tuple[str, ...]:
        raise NotImplementedError

    def forward(self, idx: list, shape: Shape, ctx: AccessContext | None) -> list:
        raise NotImplementedError

    def backward(self, idx: list, shape: Shape) -> tuple[list, list]:
        raise NotImplementedError

    def pack(self, array: np.ndarray, shape: Shape, attached: dict[str, np.ndarray]) -> np.ndarray:
        raise NotImplementedError

    def inverse(self, shape: Shape) -> tuple[Primitive, ...]:
        raise NotImplementedError

    def trivial(self, shape: Shape) -> bool:
        """True when the primitive changes nothing (an identity reorder, a pad of zero, ...)."""
        return False


# ---------------------------------------------------------------------------
# Basic primitives (Table 1)


@dataclass(frozen=True)
class Split(Primitive):
    """split(dim, factors): D -> F1 x ... x Fm; F1 may exceed D / prod(F2..Fm) (zero padding)."""

    dim: int
    factors: tuple[int, ...]

    def __post_init__(self) -> None:
        assert len(self.factors) >= 2 and all(f >= 1 for f in self.factors), f"{self.factors=}"

    def _check(self, shape: Shape) -> None:
        _check_dim("split", self.dim, shape)
        if math.prod(self.factors) < shape[self.dim]:
            raise LayoutError(f"split factors {self.factors} do not cover dim {self.dim} of size {shape[self.dim]}")

    def out_shape(self, shape: Shape) -> Shape:
        self._check(shape)
        return shape[: self.dim] + self.factors + shape[self.dim + 1 :]

    def labels(self, names: tuple[str, ...], shape: Shape) -> tuple[str, ...]:
        base = names[self.dim]
        inner = self.factors[1:]
        new = [f"{base}/{math.prod(inner)}"]
        new += [str(f) for f in inner]
        return names[: self.dim] + tuple(new) + names[self.dim + 1 :]

    def forward(self, idx: list, shape: Shape, ctx: AccessContext | None) -> list:
        i = idx[self.dim]
        parts = []
        for k in range(len(self.factors)):
            below = math.prod(self.factors[k + 1 :])
            part = _floordiv(i, below)
            parts.append(part if k == 0 else _floormod(part, self.factors[k]))
        return idx[: self.dim] + parts + idx[self.dim + 1 :]

    def backward(self, idx: list, shape: Shape) -> tuple[list, list]:
        m = len(self.factors)
        parts = idx[self.dim : self.dim + m]
        i = parts[0]
        for f, p in zip(self.factors[1:], parts[1:]):
            i = i * f + p
        conds = [i < shape[self.dim]] if math.prod(self.factors) > shape[self.dim] else []
        return idx[: self.dim] + [i] + idx[self.dim + m :], conds

    def pack(self, array: np.ndarray, shape: Shape, attached: dict[str, np.ndarray]) -> np.ndarray:
        total = math.prod(self.factors)
        if total > shape[self.dim]:
            widths = [(0, 0)] * array.ndim
            widths[self.dim] = (0, total - shape[self.dim])
            array = np.pad(array, widths)
        return array.reshape(self.out_shape(shape))

    def inverse(self, shape: Shape) -> tuple[Primitive, ...]:
        dims = tuple(range(self.dim, self.dim + len(self.factors)))
        excess = math.prod(self.factors) - shape[self.dim]
        return (Fuse(dims),) + ((Unpad(self.dim, 0, excess),) if excess else ())

    def trivial(self, shape: Shape) -> bool:
        return False


@dataclass(frozen=True)
class Reorder(Primitive):
    """reorder(perm): new dim k is old dim perm[k]."""

    perm: tuple[int, ...]

    def _check(self, shape: Shape) -> None:
        if sorted(self.perm) != list(range(len(shape))):
            raise LayoutError(f"reorder perm {self.perm} is not a permutation of {len(shape)} dims")

    def out_shape(self, shape: Shape) -> Shape:
        self._check(shape)
        return tuple(shape[p] for p in self.perm)

    def labels(self, names: tuple[str, ...], shape: Shape) -> tuple[str, ...]:
        return tuple(names[p] for p in self.perm)

    def forward(self, idx: list, shape: Shape, ctx: AccessContext | None) -> list:
        return [idx[p] for p in self.perm]

    def backward(self, idx: list, shape: Shape) -> tuple[list, list]:
        old = [None] * len(idx)
        for k, p in enumerate(self.perm):
            old[p] = idx[k]
        return old, []

    def pack(self, array: np.ndarray, shape: Shape, attached: dict[str, np.ndarray]) -> np.ndarray:
        return array.transpose(self.perm)

    def inverse(self, shape: Shape) -> tuple[Primitive, ...]:
        inv = [0] * len(self.perm)
        for k, p in enumerate(self.perm):
            inv[p] = k
        return (Reorder(tuple(inv)),)

    def trivial(self, shape: Shape) -> bool:
        return list(self.perm) == list(range(len(self.perm)))


@dataclass(frozen=True)
class Fuse(Primitive):
    """fuse(dims): consecutive dims k..k+m become one of size N_k * ... * N_{k+m}."""

    dims: tuple[int, ...]

    def _check(self, shape: Shape) -> None:
        d = self.dims
        if len(d) < 2 or list(d) != list(range(d[0], d[0] + len(d))) or d[-1] >= len(shape) or d[0] < 0:
            raise LayoutError(f"fuse dims {d} must be at least two consecutive dims of {shape}")

    def out_shape(self, shape: Shape) -> Shape:
        self._check(shape)
        k, e = self.dims[0], self.dims[-1] + 1
        return shape[:k] + (math.prod(shape[k:e]),) + shape[e:]

    def labels(self, names: tuple[str, ...], shape: Shape) -> tuple[str, ...]:
        k, e = self.dims[0], self.dims[-1] + 1
        return names[:k] + ("(" + " ".join(names[k:e]) + ")",) + names[e:]

    def forward(self, idx: list, shape: Shape, ctx: AccessContext | None) -> list:
        k, e = self.dims[0], self.dims[-1] + 1
        fused = idx[k]
        for d in range(k + 1, e):
            fused = fused * shape[d] + idx[d]
        return idx[:k] + [fused] + idx[e:]

    def backward(self, idx: list, shape: Shape) -> tuple[list, list]:
        k, e = self.dims[0], self.dims[-1] + 1
        f = idx[k]
        parts = []
        for d in range(k, e):
            below = math.prod(shape[d + 1 : e])
            part = _floordiv(f, below)
            parts.append(part if d == k else _floormod(part, shape[d]))
        return idx[:k] + parts + idx[k + 1 :], []

    def pack(self, array: np.ndarray, shape: Shape, attached: dict[str, np.ndarray]) -> np.ndarray:
        return array.reshape(self.out_shape(shape))

    def inverse(self, shape: Shape) -> tuple[Primitive, ...]:
        k, e = self.dims[0], self.dims[-1] + 1
        return (Split(k, tuple(shape[k:e])),)


# ---------------------------------------------------------------------------
# Advanced primitives (sec. 4.1.2) and the inverses


def _unfold_tiles(extent: int, tile: int, stride: int) -> int:
    return max(0, math.ceil((extent - tile) / stride)) + 1


@dataclass(frozen=True)
class Unfold(Primitive):
    """unfold(dim, tile_size B, stride S): D -> (ceil((D-B)/S)+1) x B, overlapping tiles.

    An access `T[e]` is rewritten to `T[t][e - S*t]` with `t` the tile holding the
    whole window of `e`: `t = floor(e0 / S)` where `e0` is `e` with every
    reduction variable at its minimum (paper eq. (1) when S is a multiple of the
    convolution stride). The rewrite proves that `e - S*t` stays in [0, B) for
    the whole reduction window and refuses the access otherwise.
    """

    dim: int
    tile: int
    stride: int
    basic = False

    def __post_init__(self) -> None:
        assert self.tile >= 1 and self.stride >= 1, f"{self.tile=} {self.stride=}"

    def tiles(self, shape: Shape) -> int:
        return _unfold_tiles(shape[self.dim], self.tile, self.stride)

    def out_shape(self, shape: Shape) -> Shape:
        _check_dim("unfold", self.dim, shape)
        if self.stride > self.tile:
            raise LayoutError(f"unfold stride {self.stride} > tile {self.tile} would drop elements")
        return shape[: self.dim] + (self.tiles(shape), self.tile) + shape[self.dim + 1 :]

    def labels(self, names: tuple[str, ...], shape: Shape) -> tuple[str, ...]:
        base = names[self.dim]
        return names[: self.dim] + (f"{base}/{self.stride}", f"[{self.tile}]") + names[self.dim + 1 :]

    def forward(self, idx: list, shape: Shape, ctx: AccessContext | None) -> list:
        e = idx[self.dim]
        e0 = ctx.window_start(e) if ctx is not None else e
        t = _floordiv(e0, self.stride)
        last = self.tiles(shape) - 1
        if ctx is None or not ctx.can_prove(t <= last):
            t = tirx.min(t, last)
        off = e - t * self.stride
        # Without a reduction window the clamped tile holds e by construction
        # ((T-1)*S + B >= D); with one, the whole window must fit: prove it.
        if ctx is not None and ctx.reduce_mins:
            ctx.require_within(off, self.tile, f"unfold(dim={self.dim}, tile={self.tile}, stride={self.stride})")
        return idx[: self.dim] + [t, off] + idx[self.dim + 1 :]

    def backward(self, idx: list, shape: Shape) -> tuple[list, list]:
        t, b = idx[self.dim], idx[self.dim + 1]
        i = t * self.stride + b
        conds = [i < shape[self.dim]] if (self.tiles(shape) - 1) * self.stride + self.tile > shape[self.dim] else []
        return idx[: self.dim] + [i] + idx[self.dim + 2 :], conds

    def pack(self, array: np.ndarray, shape: Shape, attached: dict[str, np.ndarray]) -> np.ndarray:
        d = shape[self.dim]
        pos = np.arange(self.tiles(shape))[:, None] * self.stride + np.arange(self.tile)[None, :]
        valid = pos < d
        out = np.take(array, np.minimum(pos, d - 1).reshape(-1), axis=self.dim)
        out = out.reshape(self.out_shape(shape))
        mask_shape = [1] * out.ndim
        mask_shape[self.dim], mask_shape[self.dim + 1] = valid.shape
        return np.where(valid.reshape(mask_shape), out, np.zeros((), out.dtype))

    def inverse(self, shape: Shape) -> tuple[Primitive, ...]:
        return (Fold(self.dim, self.tile, self.stride, shape[self.dim]),)

    def trivial(self, shape: Shape) -> bool:
        return False


@dataclass(frozen=True)
class Fold(Primitive):
    """fold(dim, tile, stride, extent): inverse of unfold; dims (dim, dim+1) = T x B -> extent."""

    dim: int
    tile: int
    stride: int
    extent: int
    basic = False

    def out_shape(self, shape: Shape) -> Shape:
        _check_dim("fold", self.dim + 1, shape)
        if shape[self.dim + 1] != self.tile or shape[self.dim] != _unfold_tiles(self.extent, self.tile, self.stride):
            raise LayoutError(f"fold {self} does not match dims {shape[self.dim : self.dim + 2]}")
        return shape[: self.dim] + (self.extent,) + shape[self.dim + 2 :]

    def labels(self, names: tuple[str, ...], shape: Shape) -> tuple[str, ...]:
        base = names[self.dim].split("/")[0]
        return names[: self.dim] + (base,) + names[self.dim + 2 :]

    def forward(self, idx: list, shape: Shape, ctx: AccessContext | None) -> list:
        t, b = idx[self.dim], idx[self.dim + 1]
        return idx[: self.dim] + [t * self.stride + b] + idx[self.dim + 2 :]

    def backward(self, idx: list, shape: Shape) -> tuple[list, list]:
        i = idx[self.dim]
        last = _unfold_tiles(self.extent, self.tile, self.stride) - 1
        t = tirx.min(_floordiv(i, self.stride), last)
        return idx[: self.dim] + [t, i - t * self.stride] + idx[self.dim + 1 :], []

    def pack(self, array: np.ndarray, shape: Shape, attached: dict[str, np.ndarray]) -> np.ndarray:
        i = np.arange(self.extent)
        t = np.minimum(i // self.stride, shape[self.dim] - 1)
        moved = np.moveaxis(array, (self.dim, self.dim + 1), (0, 1))
        out = moved[t, i - t * self.stride]
        return np.moveaxis(out, 0, self.dim)

    def inverse(self, shape: Shape) -> tuple[Primitive, ...]:
        return (Unfold(self.dim, self.tile, self.stride),)


@dataclass(frozen=True)
class Pad(Primitive):
    """pad(dim, before, after): append zeros on both sides of a dim."""

    dim: int
    before: int
    after: int
    basic = False

    def out_shape(self, shape: Shape) -> Shape:
        _check_dim("pad", self.dim, shape)
        assert self.before >= 0 and self.after >= 0, f"{self.before=} {self.after=}"
        return shape[: self.dim] + (shape[self.dim] + self.before + self.after,) + shape[self.dim + 1 :]

    def labels(self, names: tuple[str, ...], shape: Shape) -> tuple[str, ...]:
        return names[: self.dim] + (f"{names[self.dim]}+{self.before + self.after}",) + names[self.dim + 1 :]

    def forward(self, idx: list, shape: Shape, ctx: AccessContext | None) -> list:
        return idx[: self.dim] + [idx[self.dim] + self.before] + idx[self.dim + 1 :]

    def backward(self, idx: list, shape: Shape) -> tuple[list, list]:
        i = idx[self.dim] - self.before
        conds = []
        if self.before:
            conds.append(i >= 0)
        if self.after:
            conds.append(i < shape[self.dim])
        return idx[: self.dim] + [i] + idx[self.dim + 1 :], conds

    def pack(self, array: np.ndarray, shape: Shape, attached: dict[str, np.ndarray]) -> np.ndarray:
        widths = [(0, 0)] * array.ndim
        widths[self.dim] = (self.before, self.after)
        return np.pad(array, widths)

    def inverse(self, shape: Shape) -> tuple[Primitive, ...]:
        return (Unpad(self.dim, self.before, self.after),)

    def trivial(self, shape: Shape) -> bool:
        return self.before == 0 and self.after == 0


@dataclass(frozen=True)
class Unpad(Primitive):
    """unpad(dim, before, after): drop `before` leading and `after` trailing entries."""

    dim: int
    before: int
    after: int
    basic = False

    def out_shape(self, shape: Shape) -> Shape:
        _check_dim("unpad", self.dim, shape)
        size = shape[self.dim] - self.before - self.after
        if size < 1:
            raise LayoutError(f"unpad {self.before}+{self.after} leaves nothing of dim {self.dim} ({shape})")
        return shape[: self.dim] + (size,) + shape[self.dim + 1 :]

    def labels(self, names: tuple[str, ...], shape: Shape) -> tuple[str, ...]:
        return names[: self.dim] + (f"{names[self.dim]}-{self.before + self.after}",) + names[self.dim + 1 :]

    def forward(self, idx: list, shape: Shape, ctx: AccessContext | None) -> list:
        return idx[: self.dim] + [idx[self.dim] - self.before] + idx[self.dim + 1 :]

    def backward(self, idx: list, shape: Shape) -> tuple[list, list]:
        return idx[: self.dim] + [idx[self.dim] + self.before] + idx[self.dim + 1 :], []

    def pack(self, array: np.ndarray, shape: Shape, attached: dict[str, np.ndarray]) -> np.ndarray:
        sl = [slice(None)] * array.ndim
        sl[self.dim] = slice(self.before, shape[self.dim] - self.after)
        return array[tuple(sl)]

    def inverse(self, shape: Shape) -> tuple[Primitive, ...]:
        return (Pad(self.dim, self.before, self.after),)

    def trivial(self, shape: Shape) -> bool:
        return self.before == 0 and self.after == 0


@dataclass(frozen=True)
class StoreAt(Primitive):
    """store_at(tensor, dim) on a host: the host's `dim` grows by one slot holding `tensor`.

    `tensor` (shape = host shape[:dim]) is stored at host'[i..., D, 0, ...], e.g.
    the bias beside every weight row of a GEMM: weight (N, K) + bias (N,) ->
    (N, K+1). Accesses to `tensor` anywhere in the program read the host.
    """

    tensor: str
    dim: int
    basic = False

    def out_shape(self, shape: Shape) -> Shape:
        _check_dim("store_at", self.dim, shape)
        return shape[: self.dim] + (shape[self.dim] + 1,) + shape[self.dim + 1 :]

    def attached_shape(self, shape: Shape) -> Shape:
        return shape[: self.dim]

    def attached_index(self, idx: list, shape: Shape) -> list:
        """Where `tensor[idx]` lives in the host's coordinates after this primitive."""
        assert len(idx) == self.dim, f"{self.tensor}: {len(idx)=} != {self.dim=}"
        return list(idx) + [shape[self.dim]] + [0] * (len(shape) - self.dim - 1)

    def labels(self, names: tuple[str, ...], shape: Shape) -> tuple[str, ...]:
        return names[: self.dim] + (f"{names[self.dim]}+{self.tensor}",) + names[self.dim + 1 :]

    def forward(self, idx: list, shape: Shape, ctx: AccessContext | None) -> list:
        return list(idx)

    def backward(self, idx: list, shape: Shape) -> tuple[list, list]:
        return list(idx), [idx[self.dim] < shape[self.dim]]

    def pack(self, array: np.ndarray, shape: Shape, attached: dict[str, np.ndarray]) -> np.ndarray:
        if self.tensor not in attached:
            raise LayoutError(f"store_at needs the array of {self.tensor!r} to pack its host")
        value = np.asarray(attached[self.tensor])
        assert value.shape == self.attached_shape(shape), f"{value.shape=} != {self.attached_shape(shape)=}"
        slot = np.zeros(shape[: self.dim] + (1,) + shape[self.dim + 1 :], array.dtype)
        slot[(Ellipsis, 0) + (0,) * (len(shape) - self.dim - 1)] = value
        return np.concatenate([array, slot], axis=self.dim)

    def inverse(self, shape: Shape) -> tuple[Primitive, ...]:
        return (DecoupleAt(self.tensor, self.dim),)


@dataclass(frozen=True)
class DecoupleAt(Primitive):
    """decouple_at(tensor, dim): inverse of store_at; drops the last slot of `dim`.

    `Layout.decouple(array, name)` returns the detached tensor itself.
    """

    tensor: str
    dim: int
    basic = False

    def out_shape(self, shape: Shape) -> Shape:
        _check_dim("decouple_at", self.dim, shape)
        return shape[: self.dim] + (shape[self.dim] - 1,) + shape[self.dim + 1 :]

    def labels(self, names: tuple[str, ...], shape: Shape) -> tuple[str, ...]:
        return names[: self.dim] + (names[self.dim].split("+")[0],) + names[self.dim + 1 :]

    def forward(self, idx: list, shape: Shape, ctx: AccessContext | None) -> list:
        return list(idx)

    def backward(self, idx: list, shape: Shape) -> tuple[list, list]:
        return list(idx), []

    def extract(self, array: np.ndarray, shape: Shape) -> np.ndarray:
        """The detached tensor (shape[:dim])."""
        return array[(slice(None),) * self.dim + (shape[self.dim] - 1,) + (0,) * (len(shape) - self.dim - 1)]

    def pack(self, array: np.ndarray, shape: Shape, attached: dict[str, np.ndarray]) -> np.ndarray:
        sl = [slice(None)] * array.ndim
        sl[self.dim] = slice(0, shape[self.dim] - 1)
        return array[tuple(sl)]

    def inverse(self, shape: Shape) -> tuple[Primitive, ...]:
        return (StoreAt(self.tensor, self.dim),)
