"""Small workloads and a fake measurer shared by the tuner tests (unique module name: tests are not packages)."""

from __future__ import annotations

import math

# One small instance per operator kind, each with an epilogue variant somewhere.
SMALL: list[tuple[str, dict[str, int], str]] = [
    ("conv2d", dict(batch=1, in_channels=3, height=9, width=8, out_channels=4, kernel=3, stride=2, padding=1), "bias_relu"),
    ("depthwise_conv2d", dict(batch=1, channels=4, height=8, width=7, kernel=3, padding=2, dilation=2), "none"),
    ("group_conv2d", dict(batch=1, in_channels=4, height=7, width=7, out_channels=6, kernel=3, groups=2, padding=1), "relu"),
    ("dilated_conv2d", dict(batch=1, in_channels=3, height=9, width=9, out_channels=4, kernel=3), "none"),
    ("conv1d", dict(batch=1, in_channels=3, width=16, out_channels=5, kernel=3, stride=2, padding=1), "bias"),
    ("conv3d", dict(batch=1, in_channels=2, depth=4, height=5, width=5, out_channels=3, kernel=3, padding=1), "none"),
    ("conv2d_transpose", dict(batch=1, in_channels=4, height=5, width=5, out_channels=6, kernel=4, stride=2,
                              padding=1, output_padding=1, groups=2), "bias_relu"),
    ("dense", dict(m=8, n=12, k=16), "bias"),
    ("batch_matmul", dict(batch=2, m=6, n=8, k=10), "none"),
]


def workload(operator: str, params: dict, epilogue: str = "none"):
    from compiler.workloads import make_workload

    return make_workload(operator, params, epilogue=epilogue)


def host():
    from compiler.target import resolve_target

    return resolve_target("host")


def task_of(wl, **kw):
    from tuner import Task

    return Task(wl.operator, wl.key, wl.prim_func, host(), **kw)


def run(mod, inputs, out_shape):
    """Builds `mod` in this process as every build of ours (with our LICM) and runs it on `inputs`."""
    import numpy as np
    import tvm

    from compiler.build import compile_module

    lib = compile_module(mod, host()).jit()
    dev = tvm.cpu(0)
    args = [tvm.runtime.tensor(a, dev) for a in inputs] + [tvm.runtime.tensor(np.zeros(out_shape, "float32"), dev)]
    lib["main"](*args)
    return args[-1].numpy()


class FakeMeasurer:
    """A deterministic stand-in for the device: latency is an analytic function of the config."""

    def __new__(cls, space):
        from tuner.measurers import MeasureResult, Measurer

        class _Fake(Measurer):
            def __init__(self) -> None:
                self.measured: list[dict] = []

            def measure_one(self, task, candidate):
                self.measured.append(candidate.config)
                c = candidate.config
                vec = math.log2(space.factors(c, space.structure.spatial[-1])[-1])
                lat = 1.0 + abs(vec - 3) + 0.3 * abs(c["unroll"] - 64) / 64 + 0.5 * c["order"] + 0.2 * (1 - c["vectorize"])
                return MeasureResult([lat, lat * 1.01, lat * 0.99], None)

            def baseline_ms(self, task):
                return 100.0

        return _Fake()
