"""Our compiler passes over TVM's TensorIR, each in a module or package of its own:

- `basteln/`: tiling and fusion after basteln (tile the live-out spaces first, derive producer tiles from
  what each tile needs, fuse after tiling, across complex operators), with our CPU schedule inside the tiles;
- `grouping.py`: chains of complex operators of a model merged into one task, for basteln to fuse;
- `licm.py`: loop-invariant code motion for tensor programs (normalize, then hoist what pays);
- `tensorize/`: tensor instructions with loop partitioning (partition, preprocess, patterns, intrinsics);
- `vector_math.py`: float32 `exp` as arithmetic that stays vectorized.

- `hoist_expression.py`: TVM's own `HoistExpression` with every kind of conditional and let binding on (what
  `python -m bench.licm` compares our LICM with).

The TIR passes a build runs are registered in `PASSES` by name (`make_pass`); `compiler.pipeline` names the
pipelines as sequences of them, so a new TIR pass is one new module here and one line in `PASSES` (and its name in
the pipelines that run it). basteln and grouping are not TIR passes of a build: the search and the model import
call them.

Layering: above `compiler.target` and `compiler.tir_util`, below `compiler.pipeline` and
`compiler.workloads.model`: a pass never imports a workload or the model package. `compiler` never imports
`tuner` or `service`.
"""

from __future__ import annotations

from collections.abc import Callable

import tvm

from .hoist_expression import hoist_expression_pass
from .licm import licm_pass
from .tensorize import tensorize_pass
from .vector_math import vector_math_pass

PASSES: dict[str, Callable[[], tvm.transform.Pass]] = {
    "tensorize": tensorize_pass,
    "vector_math": vector_math_pass,
    "licm": licm_pass,
    "hoist_expression": hoist_expression_pass,
}


def make_pass(name: str) -> tvm.transform.Pass:
    """The TIR pass registered as `name`, made with its defaults.

    Raises:
        ValueError: no pass is registered as `name`.
    """
    if name not in PASSES:
        raise ValueError(f"unknown pass: {name}")
    return PASSES[name]()
