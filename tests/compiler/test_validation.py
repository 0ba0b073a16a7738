"""validate(): every kind of bad input names its field."""

from __future__ import annotations

import pytest

from compiler.workloads import WorkloadError, make_workload, validate

from compiler_cases import SMALL

CONV = dict(batch=1, in_channels=8, height=8, width=8, out_channels=8, kernel=3)


@pytest.mark.parametrize(
    ("operator", "params", "kwargs", "field", "words"),
    [
        ("conv9d", CONV, {}, "operator", "unknown operator"),
        ("conv2d", CONV, {"dtype": "float16"}, "dtype", "unsupported dtype"),
        ("conv2d", CONV, {"epilogue": "gelu"}, "epilogue", "unknown epilogue"),
        ("conv2d", {k: v for k, v in CONV.items() if k != "kernel"}, {}, "params.kernel", "missing"),
        ("conv2d", dict(CONV, kernal=3), {}, "params.kernal", "unknown parameter"),
        ("conv2d", dict(CONV, kernel=0), {}, "params.kernel", "out of range"),
        ("conv2d", dict(CONV, stride=17), {}, "params.stride", "out of range"),
        ("conv2d", dict(CONV, batch=2.5), {}, "params.batch", "integer"),
        ("conv2d", dict(CONV, batch=True), {}, "params.batch", "integer"),
        ("conv2d", dict(CONV, height="8"), {}, "params.height", "integer"),
        ("conv2d", dict(CONV, kernel=9), {}, "params.kernel", "larger than the padded input"),
        ("dilated_conv2d", dict(CONV, kernel=5), {}, "params.kernel", "larger than the padded input"),
        ("conv1d", dict(batch=1, in_channels=2, width=2, out_channels=2, kernel=3), {}, "params.kernel", "width"),
        ("group_conv2d", CONV, {}, "params.groups", "missing"),
        ("group_conv2d", dict(CONV, in_channels=6, groups=4), {}, "params.in_channels", "not divisible"),
        ("group_conv2d", dict(CONV, out_channels=6, groups=4), {}, "params.out_channels", "not divisible"),
        ("conv2d_transpose", dict(CONV, stride=2, output_padding=2), {}, "params.output_padding", "smaller"),
        ("conv2d_transpose", dict(CONV, padding=6), {}, "params.padding", "too large"),
        ("conv2d_transpose", dict(CONV, groups=3), {}, "params.in_channels", "not divisible"),
        ("dense", dict(m=4096, n=4096, k=4096), {"max_tensor_elements": 2**20}, "params", "more than the limit"),
        ("conv2d", CONV, {"max_tensor_elements": 100}, "params", "elements"),
    ],
)
def test_errors_name_the_field(operator, params, kwargs, field, words):
    with pytest.raises(WorkloadError) as info:
        validate(operator, params, **kwargs)
    assert info.value.field == field
    assert words in info.value.message
    assert str(info.value).startswith(f"{field}: ")
    assert isinstance(info.value, ValueError)


def test_size_limit_message_gives_numbers():
    with pytest.raises(WorkloadError, match=r"has 16777216 elements, more than the limit 1048576"):
        validate("dense", dict(m=4096, n=4096, k=4096), max_tensor_elements=2**20)


def test_default_limit_allows_the_benchmark_shapes():
    validate("dense", dict(m=512, n=512, k=512))
    validate("conv3d", dict(batch=1, in_channels=32, depth=8, height=28, width=28, out_channels=32, kernel=3))


def test_make_workload_validates():
    with pytest.raises(WorkloadError) as info:
        make_workload("dense", dict(SMALL["dense"], n=0))
    assert info.value.field == "params.n"


def test_numpy_integers_are_accepted():
    import numpy as np

    assert validate("dense", dict(m=np.int64(4), n=4, k=4))["m"] == 4
