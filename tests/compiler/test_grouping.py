"""Graph-level grouping: chains of complex operators of a model merged into one task that basteln fuses."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
tvm = pytest.importorskip("tvm")

from compiler.passes.basteln import basteln  # noqa: E402
from compiler.passes.grouping import find_chains, group_chains  # noqa: E402
from compiler.workloads.model import group_model  # noqa: E402
from compiler.target import resolve_target  # noqa: E402
from compiler.workloads.model import build_model, import_model, run_model, torch_outputs  # noqa: E402


class Separable(torch.nn.Module):
    """MobileNet's separable conv: depthwise 3x3 -> relu -> pointwise 1x1 -> relu, then a 1x1 head."""

    def __init__(self, c: int = 16, out: int = 32):
        super().__init__()
        self.dw = torch.nn.Conv2d(c, c, 3, padding=1, groups=c)
        self.pw = torch.nn.Conv2d(c, out, 1)

    def forward(self, x):
        return torch.relu(self.pw(torch.relu(self.dw(x))))


def imported(model: torch.nn.Module, shape: tuple[int, ...]):
    torch.manual_seed(0)
    x = torch.randn(*shape)
    ep = torch.export.export(model.eval(), (x,))
    return ep, import_model(ep), x


def test_a_depthwise_pointwise_chain_becomes_one_task_that_basteln_fuses_and_the_model_stays_right():
    torch.manual_seed(0)
    ep, model, x = imported(Separable(), (1, 16, 28, 28))
    assert len([t for t in model.tasks if "conv2d" in t.name]) == 2
    [chain] = group_model(model, min_bytes=0)
    assert len(chain.functions) == 2 and all("conv2d" in f for f in chain.functions)
    [task] = [t for t in model.tasks if t.name.startswith("grouped")]
    fused = basteln(task.prim_func, [1, 32, 4, 28], 1.0)  # tiles of 4 rows, every channel
    assert fused.decisions and all(d.depth > 0 for d in fused.decisions)  # the depthwise conv in the pw tiles
    # rows of one untiled tile gain no locality: nothing is fused under them (it would only take the parallel loops)
    assert all(d.depth == 0 for d in basteln(task.prim_func, [1, 1, 28, 28], 1.0).decisions)
    target = resolve_target("host")
    built = build_model(model, target, {task.workload_key: fused.sch.mod})
    [out] = run_model(built, [x.numpy()], target)
    [want] = torch_outputs(ep.module(), [x])
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)


def test_small_intermediates_and_single_complex_operators_are_left_alone():
    _, model, _ = imported(Separable(4, 4), (1, 4, 6, 6))  # a 576-byte intermediate stays in cache anyway
    assert find_chains(model.mod) == []
    assert group_chains(model.mod)[0] is model.mod

    class Two(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Conv2d(8, 8, 3, padding=1)
            self.b = torch.nn.Conv2d(8, 8, 3, padding=1)

        def forward(self, x):
            y = torch.relu(self.a(x))
            return self.b(y), y  # y is an output too: the chain would have to keep it

    _, model, _ = imported(Two(), (1, 8, 32, 32))
    assert find_chains(model.mod, min_bytes=0) == []
