"""The torch programs of whole models and subgraphs: the factories `bench.common.TorchProgram`s name.

A factory (`torch_model`, `torch_quantized_model`, `torch_bf16_model`, `torch_corpus_model`, `torch_subgraph`) runs
in the child that times its program (`bench.common.time_fresh`, `bench.timing_torch`), so this module imports torch,
the TVM-free catalog (`compiler.workloads`, its `zoo` and `subgraphs`) and the corpus' torch definitions
(`bench.corpus_models`, not `bench.corpus`, which imports TVM for its check) only: that child never loads TVM. An operator's factory is
`bench.torch_operators.torch_operator`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from bench.corpus_models import CORPUS, flat_call
from compiler.workloads import make_workload, zoo
from compiler.workloads.subgraphs import _DEFS


def torch_model(name: str, seed: int) -> tuple[Any, list]:
    """`bench.common.TorchProgram` factory: zoo model `name` in eval mode (random weights from `seed`), its inputs."""
    module, inputs = zoo.create(name, seed)
    return module, list(inputs)


def torch_corpus_model(name: str) -> tuple[Any, list]:
    """`bench.common.TorchProgram` factory: corpus model `name` (`bench.corpus_models.CORPUS`: eval mode, its fixed
    random weights and example inputs; no seed, the corpus has one) called on its inputs' tensor leaves
    (`flat_call`: the module itself where it takes tensors positionally, so eager and torch.compile see what a
    user runs)."""
    return flat_call(*CORPUS[name]())


def torch_quantized_model(name: str, seed: int) -> tuple[Any, list]:
    """`bench.common.TorchProgram` factory of `--quantize`: zoo model `name` quantized by torchao's PT2E flow
    (`zoo.quantized`; its inductor lowering runs the quantized convs and linears with oneDNN's int8 kernels)."""
    module, inputs = zoo.quantized(name, seed)
    return module, list(inputs)


def torch_bf16_model(name: str, seed: int) -> tuple[Any, list]:
    """`bench.common.TorchProgram` factory of `--bf16`: zoo model `name` in bfloat16 (`module.to(torch.bfloat16)`,
    its floating inputs too; torch's CPU kernels for bf16 are oneDNN's, with AVX512_BF16 / AMX where present)."""
    module, inputs = torch_model(name, seed)
    return bf16(module, inputs)


def bf16(module: Any, inputs: Sequence[Any]) -> tuple[Any, list]:
    """`module` and its floating `inputs` in bfloat16 (token ids stay integers)."""
    return module.to(torch.bfloat16), [x.to(torch.bfloat16) if x.is_floating_point() else x for x in inputs]


def torch_subgraph(operator: str, params: dict, seed: int) -> tuple[Any, list]:
    """`bench.common.TorchProgram` factory: the subgraph in torch (its reference) and its inputs, in the child."""
    w = make_workload(operator, params)
    xs = [torch.from_numpy(a) for a in w.random_inputs(seed)]
    return (lambda *t: _DEFS[operator].reference(w.params, list(t))), xs
