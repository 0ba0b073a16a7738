"""The corpus' models (`bench.corpus`), in torch only: what a factory builds, its example inputs, its export.

    CORPUS[name]() -> (module, args, kwargs)             # a fresh module in eval mode, random weights
    export(name) -> torch.export.ExportedProgram
    flat_call(module, args, kwargs) -> (callable, leaves) # one calling convention: the inputs' tensor leaves

Every torchvision classification model that `torch.export` takes at 1x3x224x224 (also at other batches and
resolutions: `Corpus`), its segmentation models (they return dicts), `torch.nn.TransformerEncoder` and `TransformerDecoder` with causal masks, a GPT-style causal block
(`masked_fill(mask, float('-inf'))`), and small models whose inputs and outputs are every pytree form
`torch.export` allows (tuples, lists, dicts, nested, keyword arguments, namedtuples). Always random weights
(`weights=None`, `weights_backbone=None`): nothing downloads.

torchvision (0.28, the release for torch 2.13) installs beside the CPU torch, but its compiled operators do not
load with it: `import_torchvision` stubs `torchvision._meta_registrations` (which registers meta kernels for those
operators) before importing it. Its model definitions are plain Python and need none of them.

This module imports torch (and torchvision) only, never TVM: a benchmark's torch timing child builds a corpus
model from here (`bench.torch_programs.torch_corpus_model`) without loading TVM beside torch. `bench.corpus`
(the untuned import check) re-exports it.
"""

from __future__ import annotations

import collections
import sys
import types
from collections.abc import Callable

import torch
from torch import nn
from torch.utils import _pytree as pytree

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


class Corpus(dict):
    """The corpus by name; a torchvision model also at another batch or resolution, by a suffix its listing
    leaves out: "resnet50@b16" (16 images of 224x224), "lraspp_mobilenet_v3_large@512" (one of 512x512),
    "resnet50@b8@512" (both)."""

    def __missing__(self, name: str) -> Factory:
        base, *suffixes = name.split("@")
        if not suffixes or base not in self or base in TRANSFORMERS or base in PYTREE_MODELS:
            raise KeyError(name)
        batch, side = IMAGE[0], IMAGE[2]
        for suffix in suffixes:
            if suffix.startswith("b") and suffix[1:].isdigit() and int(suffix[1:]) > 0:
                batch = int(suffix[1:])
            elif suffix.isdigit() and int(suffix) >= 32:
                side = int(suffix)
            else:
                raise KeyError(name)
        factory = dict.__getitem__(self, base)

        def make() -> tuple[nn.Module, tuple, dict]:
            module, _, kwargs = factory()
            return module, (_image(batch, 3, side, side),), kwargs

        return make

    def __contains__(self, name: object) -> bool:
        try:
            self[name]
        except KeyError:
            return False
        return True


CORPUS: Corpus = Corpus({**TRANSFORMERS, **PYTREE_MODELS, **_torchvision_models()})


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


class FlatCall(nn.Module):
    """`module` called on the tensor leaves of its arguments, positionally (`tree_leaves((args, kwargs))`, the order
    the Relax import takes them in), its arguments' pytrees rebuilt from `spec`."""

    def __init__(self, module: nn.Module, spec: pytree.TreeSpec) -> None:
        super().__init__()
        self.module, self.spec = module, spec

    def forward(self, *leaves: torch.Tensor) -> object:
        args, kwargs = pytree.tree_unflatten(list(leaves), self.spec)
        return self.module(*args, **kwargs)


def flat_call(module: nn.Module, args: tuple, kwargs: dict) -> tuple[nn.Module, list[torch.Tensor]]:
    """`module` and its example inputs as a caller that passes tensors positionally takes them: the module itself
    where its arguments are tensors and there are no keyword arguments, else wrapped in `FlatCall`; and the
    inputs' tensor leaves (what `flat_inputs` gives of its export, as torch tensors)."""
    leaves, spec = pytree.tree_flatten((args, kwargs))
    assert all(isinstance(t, torch.Tensor) for t in leaves), (
        f"non-tensor inputs: {[type(t).__name__ for t in leaves if not isinstance(t, torch.Tensor)]}")
    if not kwargs and all(isinstance(a, torch.Tensor) for a in args):
        return module, list(args)
    return FlatCall(module, spec).eval(), leaves
