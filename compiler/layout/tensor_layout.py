"""`Layout`: the layout of one tensor as a recorded sequence of ALT's primitives (`compiler.layout.primitives`),
built by chaining (`Layout(shape, "N C H W").split(1, 16).reorder(...)`): its shapes, forward and backward
index maps, inverse, and the same transformation on numpy arrays (`pack`, `unpack`).

Layering: above `primitives`; `compiler` never imports `tuner` or `service`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from .primitives import (
    AccessContext,
    DecoupleAt,
    Fuse,
    LayoutError,
    Pad,
    Primitive,
    Reorder,
    Shape,
    Split,
    StoreAt,
    Unfold,
)


@dataclass(frozen=True)
class Layout:
    """The layout of one tensor: its original shape, dimension names and the primitives applied, in order.

    Build it by chaining (each call returns a new `Layout`)::

        Layout((1, 64, 112, 112), "N O H W").split(2, 4).split(4, 16).split(1, 16).reorder(0, 2, 4, 1, 3, 5, 6)

    `name` is the display form (`N H/4 W/16 O/16 4 16 16`); equality ignores the
    dimension names.
    """

    shape: Shape
    dim_names: tuple[str, ...] = field(default=(), compare=False)
    prims: tuple[Primitive, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))
        names = self.dim_names
        if isinstance(names, str):
            names = tuple(names.split())
        if not names:
            names = tuple(f"d{k}" for k in range(len(self.shape)))
        assert len(names) == len(self.shape), f"{names=} does not match {self.shape=}"
        object.__setattr__(self, "dim_names", tuple(names))
        self.shapes  # validates every primitive against its input shape

    # -- construction -------------------------------------------------------

    @classmethod
    def identity(cls, shape: Sequence[int], dim_names: str | Sequence[str] = ()) -> Layout:
        return cls(tuple(shape), tuple(dim_names.split()) if isinstance(dim_names, str) else tuple(dim_names))

    def then(self, *prims: Primitive) -> Layout:
        """This layout followed by `prims`."""
        return Layout(self.shape, self.dim_names, self.prims + tuple(prims))

    def split(self, dim: int, *factors: int) -> Layout:
        """split(dim, factors). One factor `f` means (ceil(D/f), f); -1 as the first is inferred."""
        d = self.new_shape[dim] if 0 <= dim < len(self.new_shape) else None
        if d is None:
            raise LayoutError(f"split: dim {dim} out of range for {self.new_shape}")
        fs = list(factors)
        if len(fs) == 1:
            fs = [-1, fs[0]]
        if fs[0] == -1:
            fs[0] = math.ceil(d / math.prod(fs[1:]))
        return self.then(Split(dim, tuple(int(f) for f in fs)))

    def reorder(self, *perm: int) -> Layout:
        return self.then(Reorder(tuple(perm)))

    def fuse(self, *dims: int) -> Layout:
        return self.then(Fuse(tuple(dims)))

    def unfold(self, dim: int, tile: int, stride: int) -> Layout:
        return self.then(Unfold(dim, tile, stride))

    def pad(self, dim: int, before: int, after: int) -> Layout:
        return self.then(Pad(dim, before, after))

    def store_at(self, tensor: str, dim: int) -> Layout:
        return self.then(StoreAt(tensor, dim))

    # -- shapes and names ---------------------------------------------------

    @property
    def shapes(self) -> tuple[Shape, ...]:
        """The shape before every primitive and after the last (len(prims) + 1 entries)."""
        out = [self.shape]
        for p in self.prims:
            out.append(tuple(int(s) for s in p.out_shape(out[-1])))
        return tuple(out)

    @property
    def new_shape(self) -> Shape:
        return self.shapes[-1]

    @property
    def labels(self) -> tuple[str, ...]:
        names, shapes = self.dim_names, self.shapes
        for p, s in zip(self.prims, shapes):
            names = p.labels(names, s)
        return names

    @property
    def name(self) -> str:
        return " ".join(self.labels)

    def __str__(self) -> str:
        return self.name

    @property
    def is_identity(self) -> bool:
        return all(p.trivial(s) for p, s in zip(self.prims, self.shapes))

    @property
    def is_basic(self) -> bool:
        """Only split/reorder/fuse, or advanced primitives that change nothing (propagatable)."""
        return all(p.basic or p.trivial(s) for p, s in zip(self.prims, self.shapes))

    @property
    def attachments(self) -> tuple[tuple[str, int], ...]:
        """(tensor name, primitive position) of every store_at in the sequence."""
        return tuple((p.tensor, k) for k, p in enumerate(self.prims) if isinstance(p, StoreAt))

    # -- index maps ---------------------------------------------------------

    def forward(self, idx: Sequence, ctx: AccessContext | None = None, start: int = 0) -> list:
        """Old coordinates -> new ones (primitives `start`.. of the sequence)."""
        idx = list(idx)
        shapes = self.shapes
        assert len(idx) == len(shapes[start]), f"{len(idx)=} != rank {len(shapes[start])} of {self.name}"
        for p, s in zip(self.prims[start:], shapes[start:]):
            idx = p.forward(idx, s, ctx)
        return idx

    def backward(self, idx: Sequence) -> tuple[list, list]:
        """New coordinates -> (old coordinates, conditions for the coordinate to hold real data)."""
        idx = list(idx)
        assert len(idx) == len(self.new_shape), f"{len(idx)=} != rank of {self.name}"
        conds: list = []
        for p, s in reversed(list(zip(self.prims, self.shapes))):
            idx, c = p.backward(idx, s)
            conds += c
        return idx, conds

    def attached_forward(self, tensor: str, idx: Sequence, ctx: AccessContext | None = None) -> list:
        """Where `tensor[idx]` (attached by store_at) lives in this layout's coordinates."""
        for name, k in self.attachments:
            if name == tensor:
                prim = self.prims[k]
                assert isinstance(prim, StoreAt)
                host_idx = prim.attached_index(list(idx), self.shapes[k])
                return self.forward(host_idx, ctx, start=k + 1)
        raise LayoutError(f"{tensor!r} is not stored in {self.name}")

    def attached_shape(self, tensor: str) -> Shape:
        for name, k in self.attachments:
            if name == tensor:
                prim = self.prims[k]
                assert isinstance(prim, StoreAt)
                return prim.attached_shape(self.shapes[k])
        raise LayoutError(f"{tensor!r} is not stored in {self.name}")

    # -- inverse and numpy --------------------------------------------------

    def inverse(self) -> Layout:
        """The layout that maps `new_shape` back to `shape` (fold, unpad, decouple_at, ...)."""
        prims: list[Primitive] = []
        for p, s in reversed(list(zip(self.prims, self.shapes))):
            prims += p.inverse(s)
        return Layout(self.new_shape, self.labels, tuple(prims))

    def pack(self, array: np.ndarray, attached: dict[str, np.ndarray] | None = None) -> np.ndarray:
        """Transforms an array from the original layout to this one (numpy, build time)."""
        assert tuple(array.shape) == self.shape, f"{array.shape=} != {self.shape=} for {self.name}"
        out = np.asarray(array)
        for p, s in zip(self.prims, self.shapes):
            out = p.pack(out, s, attached or {})
        return np.ascontiguousarray(out)

    def unpack(self, array: np.ndarray) -> np.ndarray:
        """Transforms an array in this layout back to the original one."""
        return self.inverse().pack(array)

    def decouple(self, array: np.ndarray, tensor: str) -> np.ndarray:
        """The tensor attached by store_at, read back out of a packed host array."""
        inv = self.inverse()
        out = array
        for p, s in zip(inv.prims, inv.shapes):
            if isinstance(p, DecoupleAt) and p.tensor == tensor:
                return p.extract(out, s)
            out = p.pack(out, s, {})
        raise LayoutError(f"{tensor!r} is not stored in {self.name}")
