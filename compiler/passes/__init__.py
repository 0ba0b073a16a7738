"""Our compiler passes over TVM's TensorIR, each in a module of its own (none is written yet):

- `basteln.py`: tiling and fusion after basteln (tile the live-out spaces first, derive producer tiles from
  what each tile needs, fuse after tiling, across complex operators);
- `licm.py`: loop-invariant code motion for tensor programs (normalize, then hoist what pays);
- `tensorize/`: tensor instructions with loop partitioning (partition, preprocess, patterns, intrinsics).

Layering: `compiler` never imports `tuner` or `service`.
"""
