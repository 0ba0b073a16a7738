"""`Workload`: one instance of a catalog operator -- its shapes, content key and flops -- made and keyed in
pure Python, with its TE program, random inputs and torch reference built on first use.

The heavy parts live in their own modules (`operator_programs`: TVM; `operator_inputs`: numpy;
`operator_reference`: numpy and torch) and are imported inside the methods that use them, on purpose: the API
and the job queue make, validate and key workloads (`compiler.workloads.make_workload`) without loading TVM,
numpy or torch (`tests/compiler/test_operators.py::test_catalog_imports_without_tvm_or_torch`).

Layering: `compiler` never imports `tuner` or `service`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .spec import REQUANTIZE, TensorSpec

if TYPE_CHECKING:
    import numpy as np
    import tvm


@dataclass(frozen=True, eq=False)
class Workload:
    """One operator instance: shapes, a content key, the TE program and its torch reference.

    Equality and hashing follow `key`. `prim_func` is built on first access (it
    needs TVM), so a workload can be made and keyed where TVM is not loaded.
    """

    operator: str
    params: dict[str, int]
    dtype: str
    epilogue: str
    key: str
    inputs: tuple[TensorSpec, ...]  # data, weight, then bias, scale and zero_point (if any): the call order
    output: TensorSpec
    flops: int
    _bias_axis: int = field(repr=False, default=1)  # the output's channel axis (of bias, scale, zero_point)
    _reduction: int = field(repr=False, default=1)  # products summed into each output

    @property
    def requantizes(self) -> bool:
        """Whether the int32 sums are requantized to a uint8 output (the `REQUANTIZE` epilogues)."""
        return self.epilogue in REQUANTIZE

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Workload) and other.key == self.key

    def __hash__(self) -> int:
        return hash(self.key)

    @property
    def args(self) -> tuple[TensorSpec, ...]:
        """All arguments of `prim_func` in call order: inputs, then the output."""
        return (*self.inputs, self.output)

    def te_tensors(self, topi: bool = False) -> tuple[list[tvm.te.Tensor], tvm.te.Tensor]:
        """A fresh TE graph of the workload: its placeholders (in `inputs` order) and its output.

        The epilogue stages are separate ops named `bias_add`, `relu` and `requantize`. `topi`: the operator
        as TVM's topi defines it, where ours differs (see `topi_prim_func`).
        """
        from .operator_programs import te_tensors  # TVM: see the module docstring

        return te_tensors(self.operator, self.params, self.epilogue, self.inputs, self.output, self._bias_axis,
                          use_topi=topi)

    @functools.cached_property
    def prim_func(self) -> tvm.tirx.PrimFunc:
        """The untransformed TIR program (global_symbol "main"), from `te.create_prim_func`."""
        from .operator_programs import as_prim_func  # TVM: see the module docstring

        return as_prim_func(*self.te_tensors())

    @functools.cached_property
    def topi_prim_func(self) -> tvm.tirx.PrimFunc:
        """The program with the operator as TVM's topi defines it: what a TVM user would hand MetaSchedule.

        `prim_func` itself except for conv2d_transpose, where topi dilates the input with zeros
        (stride**2 times our multiply-adds) and ours is the stride-phase form.
        """
        from .operator_programs import TOPI_COMPUTE, as_prim_func  # TVM: see the module docstring

        if self.operator not in TOPI_COMPUTE:
            return self.prim_func
        return as_prim_func(*self.te_tensors(topi=True))

    @functools.cached_property
    def compute_block(self) -> str:
        """Name of the operator's reduction block in `prim_func` (e.g. "conv2d_nchw")."""
        from .operator_programs import reduction_block  # TVM: see the module docstring

        return reduction_block(self.prim_func, self.key)

    def random_inputs(self, seed: int = 0) -> list[np.ndarray]:
        """Inputs in call order, reproducible from `seed`: floats uniform in [-1, 1) (`compiler.arrays.
        random_inputs`; bfloat16 rounded from them); int8 jobs every value of their types (uint8 data in
        [0, 256), int8 weights in [-128, 128): the saturating u8 x s8 instructions are never used for catalog
        programs, so the full range is valid and tests it) and an int32 bias in [-2**16, 2**16). A requantizing
        job's zero points are any uint8 value and its scales spread the sums over about +-64 around them
        (`_requantization_inputs`), so that the outputs round, and some clip at 0 and 255."""
        from .operator_inputs import random_inputs  # numpy: see the module docstring

        return random_inputs(self.inputs, self.dtype, self.epilogue, self._reduction, seed)

    def reference(self, inputs: list[np.ndarray]) -> np.ndarray:
        """Computes the workload with torch: the ground truth every candidate is checked against.

        Args:
            inputs: arrays in the shapes and order of `inputs`.

        Returns:
            The output as a numpy array of `output.shape`.
        """
        from .operator_reference import reference  # numpy and torch: see the module docstring

        return reference(self.operator, self.params, self.dtype, self.epilogue, self.inputs, self.output,
                         self._bias_axis, inputs)
