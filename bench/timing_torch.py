"""The child's side of timing a torch program (`bench.common.TorchProgram`): built as its variant, then timed.

Runs in a fresh process of its own (`bench.common.time_fresh`); imports torch and nothing of TVM (a program's
factory, `bench.torch_programs`, may: an operator's constants are named by `compiler.layout`).
"""

from __future__ import annotations

import torch

from bench.common import TORCH_VARIANTS, TorchProgram, time_calls


def _channels_last(tensor: torch.Tensor) -> torch.Tensor:
    if tensor.dim() == 4:
        return tensor.contiguous(memory_format=torch.channels_last)
    if tensor.dim() == 5:
        return tensor.contiguous(memory_format=torch.channels_last_3d)
    return tensor


def time_torch(program: TorchProgram, threads: int) -> float:
    """Child: builds the torch program as its variant and times it like `time_library` (ms per call, median
    of `REPEAT` readings of at least `MIN_REPEAT_MS` each, after `calibrate`'s warm-up: `time_calls`)."""
    torch.set_num_threads(threads)
    fn, xs = program.factory(*program.args)
    if program.variant not in TORCH_VARIANTS:
        raise ValueError(f"unknown torch variant: {program.variant}")
    if program.variant == "channels_last":
        xs = [_channels_last(x) for x in xs]
        if isinstance(fn, torch.nn.Module):
            for param in fn.parameters():
                param.data = _channels_last(param.data)
    if program.variant == "compile":
        # only this variant: inductor is 2 s and 800 modules that an eager variant's child should not carry
        import torch._inductor.config as inductor_config

        inductor_config.freezing = True
        fn = torch.compile(fn)
    with torch.inference_mode():
        return time_calls(lambda: fn(*xs))
