"""Tiling and fusion after basteln (Zhao et al., MICRO 2020 / TOCS): `basteln(prim_func, tiles, threshold)`
tiles the live-out spaces of a TensorIR program and fuses its intermediate spaces into their tiles.

`algorithm.py` is the pass, in the paper's order (its docstring maps each step to the paper); `spaces.py`,
`footprints.py`, `plan.py` and `copies.py` are its pieces; `cpu_schedule.py` is our own schedule of the loops
inside the tiles. This module re-exports what the rest of altune uses.

Layering: `compiler` never imports `tuner` or `service`.
"""

from __future__ import annotations

from .algorithm import basteln, scratch_bytes
from .footprints import redundancy
from .plan import Decision, Duplication, Fused
from .spaces import Access, Affine, BastelnError, Group, Nonlinear, Space, spaces_of

__all__ = ["Access", "Affine", "BastelnError", "Decision", "Duplication", "Fused", "Group", "Nonlinear", "Space",
           "basteln", "redundancy", "scratch_bytes", "spaces_of"]
