"""Tensor instructions with loop partitioning (Liang, Hua and Su, "融合循环划分的张量指令生成优化": tensor
instruction generation fused with loop partitioning), for CPU instructions chosen from the target's features.

The flow (the paper's Fig. 2), one module each:

1. `mark.py`: the schedule marks a loop (`mark(sch, loop, kind)`, the paper's pragma); the search decides where.
2. `pipeline.py`: in a build (`compiler.build` runs `tensorize_pass` in front of TVM's TIR pipeline), each
   marked function is lowered to loops (TVM's passes up to `LowerOpaqueBlock`), then
3. `preprocess.py`: Alg. 1 (ALIGN, LAYOUT, COM),
4. `partition.py`: Alg. 2 (loop partitioning on the conditions of the body, with TVM's arithmetic analyzer),
5. `select.py`: instruction selection by tree patterns with parameter extraction (outer-product micro-kernel,
   element-wise, and `transpose.py`'s in-register transpose of a layout conversion's tile), rewriting each
   marked nest that matches, leaving the others as they were;
6. `instructions.py`: the instructions (fp32 FMA, int8 VNNI / vpmaddubsw / sdot, bf16), offered to a target
   only when LLVM enables every feature each needs;
7. `kernels.py`: GEMM, conv2d and element-wise operators in the instructions' layouts, with default schedules
   that mark them.

Layering: `compiler` never imports `tuner` or `service`.
"""

from __future__ import annotations

from .instructions import INSTRUCTIONS, Instruction, available, choose
from .mark import ANNOTATION, DOT_GROUP, mark
from .partition import eliminate_conditions, partition
from .pipeline import lower, tensorize_module, tensorize_pass, without_tensorize
from .preprocess import preprocess
from .select import tensorize
from .transpose import schedule_transpose

__all__ = ["ANNOTATION", "DOT_GROUP", "INSTRUCTIONS", "Instruction", "available", "choose", "eliminate_conditions", "lower",
           "mark", "partition", "preprocess", "schedule_transpose", "tensorize", "tensorize_module",
           "tensorize_pass", "without_tensorize"]
