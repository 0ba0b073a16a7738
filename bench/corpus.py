"""A corpus of real published models, as users export them: each one exported, saved, loaded back through the
upload loader, imported and built untuned, and checked against torch.

    python -m bench.corpus                               # every model
    python -m bench.corpus --models gpt_block,resnet18   # some
    python -m bench.corpus --list                        # the names

    CORPUS[name]() -> (module, args, kwargs)             # a fresh module in eval mode, random weights
    export(name) -> torch.export.ExportedProgram

The corpus: every torchvision classification model that `torch.export` takes at 1x3x224x224, its segmentation
models (they return dicts), `torch.nn.TransformerEncoder` and `TransformerDecoder` with causal masks, a
GPT-style causal block (`masked_fill(mask, float('-inf'))`), and small models whose inputs and outputs are every
pytree form `torch.export` allows (tuples, lists, dicts, nested, keyword arguments, namedtuples). Always random
weights (`weights=None`, `weights_backbone=None`): nothing downloads.

torchvision (0.28, the release for torch 2.13) installs beside the CPU torch, but its compiled operators do not
load with it: `import_torchvision` stubs `torchvision._meta_registrations` (which registers meta kernels for those
operators) before importing it. Its model definitions are plain Python and need none of them.

`main` prints, per model, how long export and load+import took, how many tasks the import made and whether the
untuned build matches `reference_outputs`; a failing step is recorded in its row and the run goes on. It is the
benchmark entry point later tuning runs will drive (`--budget`, unused until then).

Layering: bench may import everything below it (`compiler`); nothing imports bench.
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import time
import traceback
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from compiler.target import resolve_target
from compiler.workloads import model as M
from compiler.workloads.pt2 import DEFAULT_MAX_FILE_BYTES, load_exported_program, short_error

Factory = Callable[[], tuple[nn.Module, tuple, dict]]

IMAGE = (1, 3, 224, 224)


def import_torchvision() -> types.ModuleType:
    """torchvision, imported with its meta registrations stubbed (its compiled operators do not load beside this
    CPU torch; the model definitions need none of them)."""
    if "torchvision" not in sys.modules:
        sys.modules.setdefault("torchvision._meta_registrations", types.ModuleType("torchvision._meta_registrations"))
    import torchvision

    return torchvision


def _image(*shape: int) -> torch.Tensor:
    return torch.randn(*(shape or IMAGE), generator=torch.Generator().manual_seed(0))


def _classification(name: str) -> Factory:
    def make() -> tuple[nn.Module, tuple, dict]:
        torch.manual_seed(0)
        tv = import_torchvision()
        return tv.models.get_model(name, weights=None).eval(), (_image(),), {}

    return make


def _segmentation(name: str) -> Factory:
    def make() -> tuple[nn.Module, tuple, dict]:
        torch.manual_seed(0)
        tv = import_torchvision()
        return tv.models.get_model(name, weights=None, weights_backbone=None).eval(), (_image(),), {}

    return make


# ---------------------------------------------------------------------------
# Transformers with masks


def causal_mask(n: int) -> torch.Tensor:
    """The float mask `nn.Transformer.generate_square_subsequent_mask` makes: -inf above the diagonal."""
    return torch.triu(torch.full((n, n), float("-inf")), diagonal=1)


class TransformerEncoderNet(nn.Module):
    """`nn.TransformerEncoder` over embedded tokens, with a causal `mask` (a causal language model's trunk)."""

    def __init__(self, d: int = 64, heads: int = 4, layers: int = 2, n: int = 16) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(d, heads, dim_feedforward=4 * d, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.register_buffer("mask", causal_mask(n), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x, mask=self.mask, is_causal=True)


class TransformerDecoderNet(nn.Module):
    """`nn.TransformerDecoder`: a causal `tgt_mask` over the target, full attention to the memory."""

    def __init__(self, d: int = 64, heads: int = 4, layers: int = 2) -> None:
        super().__init__()
        layer = nn.TransformerDecoderLayer(d, heads, dim_feedforward=4 * d, dropout=0.0, batch_first=True)
        self.decoder = nn.TransformerDecoder(layer, layers)

    def forward(self, tgt: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1])
        return self.decoder(tgt, memory, tgt_mask=mask, tgt_is_causal=True)


class GPTBlock(nn.Module):
    """A GPT-2 block: causal self-attention written out (`masked_fill(mask, float('-inf'))`) and a GELU MLP."""

    def __init__(self, d: int = 64, heads: int = 4, n: int = 32) -> None:
        super().__init__()
        self.heads = heads
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.c_attn, self.c_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(approximate="tanh"), nn.Linear(4 * d, d))
        self.register_buffer("bias", torch.tril(torch.ones(n, n, dtype=torch.bool)).view(1, 1, n, n),
                             persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(c, dim=2)
        q, k, v = (a.view(b, t, self.heads, c // self.heads).transpose(1, 2) for a in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / (c // self.heads) ** 0.5)
        att = att.masked_fill(~self.bias[:, :, :t, :t], float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, c)
        x = x + self.c_proj(y)
        return x + self.mlp(self.ln_2(x))


# ---------------------------------------------------------------------------
# Every pytree form of inputs and outputs

Pair = collections.namedtuple("Pair", ["logits", "features"])
torch.utils._pytree._register_namedtuple(Pair, serialized_type_name="bench.corpus.Pair")


class _Trunk(nn.Module):
    """A small conv trunk the pytree models share: an image -> (logits, features)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.head = nn.Linear(8, 10)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv(x))

    def logits(self, f: torch.Tensor) -> torch.Tensor:
        return self.head(f.mean(dim=(2, 3)))


class TupleOut(_Trunk):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        f = self.features(x)
        return self.logits(f), f


class ListOut(_Trunk):
    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        f = self.features(x)
        return [self.logits(f), f, x * 2]


class DictOut(_Trunk):
    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        f = self.features(x)
        return {"out": self.logits(f), "aux-features": f}


class NamedTupleOut(_Trunk):
    def forward(self, x: torch.Tensor) -> Pair:
        f = self.features(x)
        return Pair(self.logits(f), f)


class NestedOut(_Trunk):
    def forward(self, x: torch.Tensor) -> dict:
        f = self.features(x)
        return {"heads": (self.logits(f), [f, f.sigmoid()]), "extra": {"pooled": f.amax(dim=(2, 3))}}


class TupleIn(_Trunk):
    def forward(self, pair: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        a, b = pair
        return self.logits(self.features(a + b))


class ListIn(_Trunk):
    def forward(self, xs: list[torch.Tensor]) -> torch.Tensor:
        return self.logits(self.features(sum(xs)))


class DictIn(_Trunk):
    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.logits(self.features(batch["image"] * batch["scale"]))


class NestedIn(_Trunk):
    def forward(self, x: torch.Tensor, extra: dict) -> dict:
        a, [b] = extra["pair"]
        f = self.features(x + a - b)
        return {"out": self.logits(f) + extra["bias"], "f": (f,)}


class KwargsIn(_Trunk):
    def forward(self, x: torch.Tensor, *, scale: torch.Tensor, shift: torch.Tensor | None = None) -> torch.Tensor:
        f = self.features(x * scale)
        return self.logits(f) + (shift if shift is not None else 0)


def _small(cls: type[nn.Module], args: Callable[[], tuple], kwargs: Callable[[], dict] = dict) -> Factory:
    def make() -> tuple[nn.Module, tuple, dict]:
        torch.manual_seed(0)
        return cls().eval(), args(), kwargs()

    return make


def _x(n: int = 16) -> torch.Tensor:
    return _image(1, 3, n, n)


PYTREE_MODELS: dict[str, Factory] = {
    "tuple_out": _small(TupleOut, lambda: (_x(),)),
    "list_out": _small(ListOut, lambda: (_x(),)),
    "dict_out": _small(DictOut, lambda: (_x(),)),
    "namedtuple_out": _small(NamedTupleOut, lambda: (_x(),)),
    "nested_out": _small(NestedOut, lambda: (_x(),)),
    "tuple_in": _small(TupleIn, lambda: ((_x(), _x() * 0.5),)),
    "list_in": _small(ListIn, lambda: ([_x(), _x() + 1, _x() * 3],)),
    "dict_in": _small(DictIn, lambda: ({"image": _x(), "scale": torch.full((1, 3, 1, 1), 0.5)},)),
    "nested_in": _small(NestedIn, lambda: (_x(), {"pair": (_x() * 2, [_x() - 1]), "bias": torch.ones(1, 10)})),
    "kwargs_in": _small(KwargsIn, lambda: (_x(),), lambda: {"scale": torch.full((1, 3, 1, 1), 2.0),
                                                            "shift": torch.ones(1, 10)}),
}

TRANSFORMERS: dict[str, Factory] = {
    "gpt_block": _small(GPTBlock, lambda: (_image(1, 32, 64),)),
    "transformer_encoder": _small(TransformerEncoderNet, lambda: (_image(1, 16, 64),)),
    "transformer_decoder": _small(TransformerDecoderNet, lambda: (_image(1, 16, 64), _image(1, 24, 64) * 0.5)),
}


def _torchvision_models() -> dict[str, Factory]:
    tv = import_torchvision()
    models = {name: _classification(name) for name in tv.models.list_models(module=tv.models)}
    models |= {name: _segmentation(name) for name in tv.models.list_models(module=tv.models.segmentation)}
    return models


CORPUS: dict[str, Factory] = {**TRANSFORMERS, **PYTREE_MODELS, **_torchvision_models()}


def export(name: str) -> torch.export.ExportedProgram:
    """`torch.export.export` of the corpus model `name` on its example inputs.

    Raises:
        KeyError: no such model.
    """
    module, args, kwargs = CORPUS[name]()
    with torch.no_grad():
        return torch.export.export(module, args, kwargs)


def flat_inputs(ep: torch.export.ExportedProgram) -> list:
    """The example inputs of `ep` as the model takes them after import: its tensor leaves, as numpy."""
    args, kwargs = ep.example_inputs
    return [t.numpy() for t in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]


# ---------------------------------------------------------------------------
# The table


@dataclass
class Row:
    """One model's run: seconds per step (None: not reached), the task count, and what failed where."""

    name: str
    export_s: float | None = None
    load_import_s: float | None = None
    tasks: int | None = None
    build_s: float | None = None
    matches: bool | None = None
    failed: str = ""  # "export", "load", "import", "build", "match"
    error: str = ""

    def line(self) -> str:
        def s(v: float | None) -> str:
            return "-" if v is None else f"{v:.1f}"

        match = {None: "-", True: "yes", False: "NO"}[self.matches]
        tasks = "-" if self.tasks is None else str(self.tasks)
        return (f"{self.name:32} {s(self.export_s):>8} {s(self.load_import_s):>8} {tasks:>5} {s(self.build_s):>8} "
                f"{match:>5}  {self.failed + ': ' + self.error if self.failed else ''}")


HEADER = f"{'model':32} {'export s':>8} {'load+imp':>8} {'tasks':>5} {'build s':>8} {'match':>5}  failure"


def check_model(name: str, target: object, workdir: Path, *, max_bytes: int = DEFAULT_MAX_FILE_BYTES) -> Row:
    """Exports `name`, saves it, loads it with the upload loader (files up to `max_bytes`, the service's upload
    limit by default), imports it (blocked layouts), builds it untuned and compares its outputs with the
    exported program's; the first failing step ends the row."""
    row, step = Row(name), "export"
    try:
        start = time.perf_counter()
        ep = export(name)
        row.export_s = time.perf_counter() - start
        inputs = flat_inputs(ep)
        path = workdir / f"{name}.pt2"
        torch.export.save(ep, path)
        step = "load"
        start = time.perf_counter()
        loaded = load_exported_program(path, max_bytes=max_bytes)
        step = "import"
        model = M.import_model(loaded, layout="blocked", target=target)
        row.load_import_s = time.perf_counter() - start
        row.tasks = len(model.tasks)
        step = "build"
        start = time.perf_counter()
        built = M.build_model(model, target)
        outs = M.run_model(built, inputs, target)
        row.build_s = time.perf_counter() - start
        step = "match"
        problem = M.compare_outputs(outs, M.reference_outputs(loaded, inputs), **M.tolerance(model))
        row.matches = problem is None
        if problem:
            row.failed, row.error = step, short_error(problem, 200)
    except Exception as e:  # noqa: BLE001 - a corpus run records every failure and goes on
        row.failed, row.error = step, short_error(f"{type(e).__name__}: {e}", 300)
        if step not in ("load", "import", "export"):
            traceback.print_exc(file=sys.stderr)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.corpus", description=__doc__.split("\n")[0])
    parser.add_argument("--models", help="comma-separated corpus names (default: all)")
    parser.add_argument("--skip", help="comma-separated names to leave out")
    parser.add_argument("--budget", type=int, default=0, help="tuning trials per model (0: untuned; tuning is "
                                                             "not driven from here yet)")
    parser.add_argument("--target", default="host")
    parser.add_argument("--max-file-gib", type=float, default=DEFAULT_MAX_FILE_BYTES / (1 << 30),
                        help="the largest file the loader takes (default: the service's upload limit); "
                             "vit_l_16, vit_l_32, vit_h_14 and regnet_y_128gf are over 1 GiB")
    parser.add_argument("--list", action="store_true", help="print the corpus' names and exit")
    args = parser.parse_args(argv)
    if args.list:
        print("\n".join(CORPUS))
        return 0
    names = args.models.split(",") if args.models else list(CORPUS)
    unknown = [n for n in names if n not in CORPUS]
    if unknown:
        parser.error(f"unknown model(s): {', '.join(unknown)}")
    skip = set(args.skip.split(",")) if args.skip else set()
    target = resolve_target(args.target)
    print(HEADER, flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="altune-corpus-") as tmp:
        for name in names:
            if name in skip:
                continue
            rows.append(check_model(name, target, Path(tmp), max_bytes=int(args.max_file_gib * (1 << 30))))
            print(rows[-1].line(), flush=True)
            (Path(tmp) / f"{name}.pt2").unlink(missing_ok=True)
    bad = [r for r in rows if not r.matches]
    print(f"\n{len(rows) - len(bad)}/{len(rows)} models match torch untuned; failed: "
          f"{', '.join(f'{r.name} ({r.failed})' for r in bad) or 'none'}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
