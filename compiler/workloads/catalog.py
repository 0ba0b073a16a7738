"""The catalog's front door: `validate` a workload description (an operator of `operators` or a subgraph of
`subgraphs`) and `make_workload` from it. Pure Python, so the API checks and keys a job without TVM.

Layering: above `operators`, `subgraphs` and `workload`; `compiler` never imports `tuner` or `service`.
"""

from __future__ import annotations

import math
import numbers

from .operators import OPERATORS
from .operators import check as check_operator
from .operators import shapes as operator_shapes
from .spec import (
    DEFAULT_MAX_TENSOR_ELEMENTS,
    DTYPES,
    EPILOGUES,
    INT8_MAX_REDUCTION,
    REQUANTIZE,
    STORAGE,
    TensorSpec,
    WorkloadError,
    workload_key,
)
from .subgraphs import SUBGRAPHS, make_subgraph, subgraph_shapes
from .workload import Workload


def validate(
    operator: str,
    params: dict,
    dtype: str = "float32",
    epilogue: str = "none",
    max_tensor_elements: int = DEFAULT_MAX_TENSOR_ELEMENTS,
) -> dict[str, int]:
    """Checks a workload description and fills in defaults.

    Args:
        operator: a name in `OPERATORS`.
        params: the operator's integer parameters; optional ones may be left out.
        dtype: element type, one of `DTYPES`.
        epilogue: one of `EPILOGUES`.
        max_tensor_elements: the largest number of elements any input or output may have.

    Returns:
        The normalized parameters: every parameter of the operator, in catalog order.

    Raises:
        WorkloadError: with `.field` naming what is wrong ("operator", "dtype",
            "epilogue", "params", "params.<name>").
    """
    catalog = {**OPERATORS, **SUBGRAPHS}
    op = catalog.get(operator) if isinstance(operator, str) else None
    if op is None:
        raise WorkloadError("operator", f"unknown operator {operator!r}; known: {', '.join(catalog)}")
    if dtype not in op.dtypes:
        takes = ", ".join(name for name, o in OPERATORS.items() if dtype in o.dtypes) if dtype in DTYPES else ""
        raise WorkloadError("dtype", f"unsupported dtype {dtype!r} for {operator}; supported for {operator}: "
                            f"{', '.join(op.dtypes)}" + (f" ({dtype} is supported for {takes})" if takes else
                                                         f"; known dtypes: {', '.join(DTYPES)}"))
    if epilogue not in EPILOGUES:
        raise WorkloadError("epilogue", f"unknown epilogue {epilogue!r}; known: {', '.join(EPILOGUES)}")
    if epilogue in REQUANTIZE and dtype != "int8":
        raise WorkloadError("epilogue", f"{epilogue!r} requantizes the int32 sums of an int8 operator to uint8; "
                            f"dtype {dtype!r} has none: use dtype 'int8', or epilogue "
                            f"{epilogue.removesuffix('requantize').rstrip('_') or 'none'!r}")
    if not isinstance(params, dict):
        raise WorkloadError("params", f"params must be an object of integers, got {type(params).__name__}")
    known = {p.name for p in op.params}
    for name in params:
        if name not in known:
            raise WorkloadError(
                f"params.{name}",
                f"unknown parameter {name!r} for {operator}; known: {', '.join(p.name for p in op.params)}",
            )
    normalized: dict[str, int] = {}
    for p in op.params:
        value = params.get(p.name, p.default)
        if value is None:
            raise WorkloadError(
                f"params.{p.name}", f"missing required parameter {p.name!r} ({p.description})"
            )
        # bool is an Integral in Python; a JSON true must not pass as 1
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise WorkloadError(f"params.{p.name}", f"{p.name} must be an integer, got {value!r}")
        value = int(value)
        if not p.minimum <= value <= p.maximum:
            raise WorkloadError(
                f"params.{p.name}", f"{p.name}={value} is out of range [{p.minimum}, {p.maximum}]"
            )
        normalized[p.name] = value
    if operator in SUBGRAPHS:
        tensors = subgraph_shapes(operator, normalized, epilogue)
    else:
        check_operator(operator, normalized)
        shapes = operator_shapes(operator, normalized)
        tensors = [("data", shapes.data), ("weight", shapes.weight), ("output", shapes.output)]
        reduction = shapes.macs // math.prod(shapes.output)
        if dtype == "int8" and reduction > INT8_MAX_REDUCTION:
            raise WorkloadError("params", f"int8 {operator} sums {reduction} products per output, more than "
                                f"{INT8_MAX_REDUCTION}: its int32 accumulator could overflow")
    for role, shape in tensors:
        size = math.prod(shape)
        if size > max_tensor_elements:
            raise WorkloadError(
                "params",
                f"{role} tensor {'x'.join(map(str, shape))} has {size} elements, "
                f"more than the limit {max_tensor_elements}",
            )
    return normalized


def make_workload(
    operator: str,
    params: dict,
    dtype: str = "float32",
    epilogue: str = "none",
    max_tensor_elements: int = DEFAULT_MAX_TENSOR_ELEMENTS,
) -> Workload:
    """Validates a workload description and returns the workload (a `Subgraph` for the names in
    `compiler.workloads.subgraphs.SUBGRAPHS`).

    Args:
        operator: a name in `OPERATORS` or `SUBGRAPHS`.
        params: the operator's parameters (defaults filled in by `validate`).
        dtype: element type, one of `DTYPES`.
        epilogue: one of `EPILOGUES`; bias, and a requantization's scale and zero point, are per output
            channel (per N column for dense and batch_matmul).
        max_tensor_elements: the largest number of elements any tensor may have.

    Returns:
        The workload; its `prim_func` is built on first access.

    Raises:
        WorkloadError: see `validate`.
    """
    normalized = validate(operator, params, dtype, epilogue, max_tensor_elements)
    if operator in SUBGRAPHS:  # a chain of operators, fused by `compiler.passes.basteln`
        return make_subgraph(operator, normalized, dtype, epilogue, workload_key(operator, normalized, dtype, epilogue))
    shapes = operator_shapes(operator, normalized)
    data_t, weight_t, out_t = STORAGE[dtype]
    inputs = [TensorSpec("data", shapes.data, data_t), TensorSpec("weight", shapes.weight, weight_t)]
    channels = (shapes.output[shapes.bias_axis],)
    if epilogue.startswith("bias"):
        inputs.append(TensorSpec("bias", channels, out_t))
    if epilogue in REQUANTIZE:
        inputs += [TensorSpec("scale", channels, "float32"), TensorSpec("zero_point", channels, "int32")]
    out_size = math.prod(shapes.output)
    # requantization: a multiply, a rounding, an add and the two clips
    epilogue_flops = out_size * (("bias" in epilogue) + ("relu" in epilogue) + 5 * (epilogue in REQUANTIZE))
    return Workload(
        operator=operator,
        params=normalized,
        dtype=dtype,
        epilogue=epilogue,
        key=workload_key(operator, normalized, dtype, epilogue),
        inputs=tuple(inputs),
        output=TensorSpec("output", shapes.output, "uint8" if epilogue in REQUANTIZE else out_t),
        flops=2 * shapes.macs + epilogue_flops,
        _bias_axis=shapes.bias_axis,
        _reduction=shapes.macs // out_size,
    )
