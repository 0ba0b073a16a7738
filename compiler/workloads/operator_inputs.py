"""Reproducible random inputs of a catalog workload (`Workload.random_inputs`): numpy, without torch or TVM, so a
measurement child makes them cheaply.

Layering: numpy at the top; `compiler` never imports `tuner` or `service`.
"""

from __future__ import annotations

import math
from typing import Any

import ml_dtypes
import numpy as np

from compiler.arrays import random_inputs as random_arrays

from .spec import REQUANTIZE, TensorSpec


def random_inputs(inputs: tuple[TensorSpec, ...], dtype: str, epilogue: str, reduction: int, seed: int = 0) -> list[np.ndarray]:
    """Inputs of a catalog workload (`Workload.random_inputs`: its `inputs`, element type, epilogue and the
    products summed into each output) in call order, reproducible from `seed`: floats uniform in [-1, 1) (`compiler.arrays.
    random_inputs`; bfloat16 rounded from them); int8 jobs every value of their types (uint8 data in
    [0, 256), int8 weights in [-128, 128): the saturating u8 x s8 instructions are never used for catalog
    programs, so the full range is valid and tests it) and an int32 bias in [-2**16, 2**16). A requantizing
    job's zero points are any uint8 value and its scales spread the sums over about +-64 around them
    (`_requantization_inputs`), so that the outputs round, and some clip at 0 and 255."""
    if dtype != "int8":
        arrays = random_arrays([(tuple(s.shape), "float32") for s in inputs], seed)
        return [a.astype(_numpy_dtype(s.dtype)) for a, s in zip(arrays, inputs)]
    rng = np.random.default_rng(seed)
    requantizes = epilogue in REQUANTIZE
    bounds = {"uint8": (0, 256), "int8": (-128, 128), "int32": (-2**16, 2**16)}
    operands = inputs[:-2] if requantizes else inputs
    arrays = [rng.integers(*bounds[s.dtype], size=s.shape).astype(s.dtype) for s in operands]
    if requantizes:
        arrays += _requantization_inputs(rng, inputs[-1].shape[0], reduction)
    return arrays


def _requantization_inputs(rng: np.random.Generator, channels: int, reduction: int) -> list[np.ndarray]:
    """Random (scale, zero_point) per output channel for `channels` sums of `reduction` full-range u8 x s8
    products: the product's standard deviation is about 10922 (sqrt(E[x^2] E[w^2]) for uniform x in [0, 256)
    and w in [-128, 128)), so a scale of 64 / (10922 sqrt(reduction)), times a factor in [0.5, 2), spreads a
    channel's sums over about +-64 steps."""
    typical = 64.0 / (10922.0 * math.sqrt(reduction))
    scale = (typical * rng.uniform(0.5, 2.0, size=channels)).astype(np.float32)
    zero_point = rng.integers(0, 256, size=channels).astype(np.int32)
    return [scale, zero_point]


def _numpy_dtype(dtype: str) -> Any:
    """The numpy type of a TVM dtype name (bfloat16 is `ml_dtypes.bfloat16`, which TVM also takes)."""
    if dtype == "bfloat16":
        return ml_dtypes.bfloat16
    return dtype
