"""torch.export programs as a user saves them (files or bytes), and the zoo's (`jobs.upload_model` uploads one)."""

from __future__ import annotations

import functools
import io
from pathlib import Path

import torch

from compiler.workloads import zoo


def program_bytes(ep: torch.export.ExportedProgram) -> bytes:
    """The `.pt2` file `torch.export.save` writes for `ep`."""
    buf = io.BytesIO()
    torch.export.save(ep, buf)
    return buf.getvalue()


def save_program(module: torch.nn.Module, args: tuple, path: Path) -> Path:
    """`module` (in eval mode) exported at `args` and saved to `path`: the path."""
    torch.export.save(torch.export.export(module.eval(), args), path)
    return path


@functools.cache
def zoo_program(name: str) -> bytes:
    """The zoo model's `.pt2` file (exported once per test process)."""
    return program_bytes(zoo.export(name))
