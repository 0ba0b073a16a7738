"""Our compiler passes over TVM's TensorIR, each in a module or package of its own:

- `basteln/`: tiling and fusion after basteln (tile the live-out spaces first, derive producer tiles from
  what each tile needs, fuse after tiling, across complex operators), with our CPU schedule inside the tiles;
- `grouping.py`: chains of complex operators of a model merged into one task, for basteln to fuse;
- `licm.py`: loop-invariant code motion for tensor programs (normalize, then hoist what pays);
- `tensorize/`: tensor instructions with loop partitioning (partition, preprocess, patterns, intrinsics);
- `vector_math.py`: float32 `exp` as arithmetic that stays vectorized.

`compiler.pipeline` runs licm, tensorize and vector_math in every build; basteln and grouping are called by
the search and the model import.

Layering: above `compiler.target` and `compiler.tir_util`, below `compiler.pipeline` and
`compiler.workloads.model`: a pass never imports a workload or the model package. `compiler` never imports
`tuner` or `service`.
"""
