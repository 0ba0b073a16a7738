"""Arrays around a program: its arguments' shapes, reproducible random inputs, the output check, the device.

One place for what the measurer, the model worker, the artifact checks and the benchmarks all need, so a
candidate, a model and a baseline are fed and judged alike.

Layering: `compiler` never imports `tuner` or `service`. numpy and TVM are imported inside functions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from compiler.target import target_info

if TYPE_CHECKING:
    import numpy as np
    import tvm

# fp32 sums in another order differ by a few ulps of the largest partial sums: `atol` is scaled by max |expected|
RTOL = 1e-3
ATOL = 1e-3

# low-precision outputs: rounded to 8 (bfloat16) or 11 (float16) significant bits after float32 accumulation,
# so two correct programs differ by an ulp or two of the result: the tolerance is at least this
LOW_PRECISION_TOL = {"bfloat16": 1 / 64, "float16": 1 / 512}

ArgSpec = tuple[tuple[int, ...], str]  # (shape, dtype)


def arg_specs(prim_func: tvm.tirx.PrimFunc) -> list[ArgSpec]:
    """(shape, dtype) of every parameter of `prim_func`, in call order (the output last)."""
    # heavy: the catalog and the sandbox's parent import arrays without it
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo

    return [(tuple(int(d) for d in a.shape), str(a.dtype)) for a in ArgInfo.from_prim_func(prim_func)]


def random_inputs(specs: Sequence[ArgSpec], seed: int = 0) -> list[np.ndarray]:
    """Arrays of the given shapes and dtypes, reproducible from `seed`: floats uniform in [-1, 1), integers
    in [0, 100) (token ids, indices)."""
    import numpy as np  # heavy: the catalog and the sandbox's parent import arrays without it

    rng = np.random.default_rng(seed)
    return [rng.uniform(-1.0, 1.0, size=shape).astype(dtype) if str(dtype).startswith(("float", "bfloat"))
            else rng.integers(0, 100, size=shape).astype(dtype) for shape, dtype in specs]


def to_torch(array: Any) -> Any:
    """A numpy array (or a torch tensor, returned as it is) as a torch tensor; ml_dtypes' bfloat16 becomes
    torch.bfloat16 (through float32, exactly)."""
    import numpy as np  # heavy: the catalog and the sandbox's parent import arrays without it
    import torch  # heavy: the catalog and the sandbox's parent import arrays without it

    if isinstance(array, torch.Tensor):
        return array
    array = np.asarray(array)
    if str(array.dtype) == "bfloat16":
        return torch.from_numpy(array.astype(np.float32)).to(torch.bfloat16)
    return torch.from_numpy(array)


def to_numpy(tensor: Any) -> np.ndarray:
    """A torch tensor as a numpy array; torch.bfloat16 becomes ml_dtypes' bfloat16 (through float32, exactly)."""
    import torch  # heavy: the catalog and the sandbox's parent import arrays without it

    tensor = tensor.detach()
    if tensor.dtype == torch.bfloat16:
        import ml_dtypes  # heavy: the catalog and the sandbox's parent import arrays without it

        return tensor.float().numpy().astype(ml_dtypes.bfloat16)
    return tensor.numpy()


def loaded(array: np.ndarray) -> np.ndarray:
    """An array as `np.load` gave it back, bfloat16 again: np.savez / np.save store an ml_dtypes bfloat16 array as
    2-byte voids (the only such type we save); other arrays as they are."""
    if array.dtype.kind != "V" or array.dtype.itemsize != 2:
        return array
    import ml_dtypes  # heavy: the catalog and the sandbox's parent import arrays without it

    return array.view(ml_dtypes.bfloat16)


def check_close(actual: np.ndarray, expected: np.ndarray, rtol: float = RTOL, atol: float = ATOL) -> str | None:
    """None when `actual` matches `expected`, else a one-line "wrong result: ..." naming the worst element.

    `atol` is scaled by max(1, max |expected|), since fp32 sums over long reductions differ in the last
    bits with the order; NaN never matches.
    """
    import numpy as np  # heavy: the catalog and the sandbox's parent import arrays without it

    if actual.shape != expected.shape:
        return f"wrong result: output shape {actual.shape} != expected {expected.shape}"
    floor = LOW_PRECISION_TOL.get(str(expected.dtype), LOW_PRECISION_TOL.get(str(actual.dtype)))
    if floor is not None:  # compared in float32 (numpy's allclose does not take ml_dtypes' bfloat16)
        rtol, atol = max(rtol, floor), max(atol, floor)
        actual, expected = actual.astype(np.float32), expected.astype(np.float32)
    tol = atol * max(1.0, float(np.nanmax(np.abs(expected), initial=0.0)))
    if np.allclose(actual, expected, rtol=rtol, atol=tol, equal_nan=False):
        return None
    diff = np.abs(actual.astype(np.float64) - expected.astype(np.float64))
    diff[np.isnan(diff)] = np.inf  # a NaN on either side is the worst mismatch
    where = tuple(int(i) for i in np.unravel_index(diff.argmax(), diff.shape)) if diff.size else ()
    return f"wrong result: max abs diff {diff.max(initial=0.0):.4g} at {where} (rtol {rtol}, atol {tol:.3g})"


def device(target: tvm.target.Target | Any) -> tvm.runtime.Device:
    """The device a program compiled for `target` runs on (device 0 of its kind; the CPU for llvm)."""
    return target_info(target).device()
