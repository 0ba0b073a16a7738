"""Built-in models: ResNet-18, MobileNet-V2, BERT-tiny, and two small test models, as torch.nn modules.

Defined here with random weights (a fixed seed), nothing downloaded. Each entry
gives the module and its example input shapes (the paper's end-to-end setup,
ALT sec. 7.2: batch 1, 3x224x224 images, BERT sequences of 128 tokens).

    model, inputs = zoo.create("resnet18")         # eval-mode module, example input tensors
    ep = zoo.export("small_cnn")                   # torch.export.ExportedProgram

torch is imported inside functions, so listing the zoo (`MODELS`) is cheap.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class ZooModel:
    """One built-in model.

    Attributes:
        name: the zoo name ("resnet18").
        description: one line.
        input_shapes: example input shapes in call order.
        input_dtypes: their dtypes ("float32", "int64" for token ids).
        build: makes the torch module (random weights from `seed`).
    """

    name: str
    description: str
    input_shapes: tuple[tuple[int, ...], ...]
    input_dtypes: tuple[str, ...]
    build: Callable[[], Any]


# ---------------------------------------------------------------------------
# Model definitions (built lazily: torch is imported in `_modules`)


def _modules() -> dict[str, Any]:
    """The torch.nn classes, defined on first use so that importing this module needs no torch."""
    import torch
    from torch import nn

    class BasicBlock(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.down = None
            if stride != 1 or cin != cout:
                self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):
            y = torch.relu(self.bn1(self.conv1(x)))
            y = self.bn2(self.conv2(y))
            return torch.relu(y + (x if self.down is None else self.down(x)))

    class ResNet18(nn.Module):
        def __init__(self, classes: int = 1000) -> None:
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
                                      nn.MaxPool2d(3, 2, 1))
            blocks, cin = [], 64
            for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
                blocks += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
                cin = cout
            self.blocks = nn.Sequential(*blocks)
            self.fc = nn.Linear(512, classes)

        def forward(self, x):
            x = self.blocks(self.stem(x))
            return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))

    def conv_bn(cin: int, cout: int, k: int, stride: int, groups: int = 1, act: bool = True) -> nn.Sequential:
        layers = [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
        if act:
            layers.append(nn.ReLU6())
        return nn.Sequential(*layers)

    class InvertedResidual(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int, expand: int) -> None:
            super().__init__()
            hidden = cin * expand
            layers = [] if expand == 1 else [conv_bn(cin, hidden, 1, 1)]
            layers += [conv_bn(hidden, hidden, 3, stride, groups=hidden), conv_bn(hidden, cout, 1, 1, act=False)]
            self.body = nn.Sequential(*layers)
            self.residual = stride == 1 and cin == cout

        def forward(self, x):
            y = self.body(x)
            return x + y if self.residual else y

    class MobileNetV2(nn.Module):
        # (expansion t, channels c, repeats n, stride s) of Sandler et al., table 2
        SETTINGS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                    (6, 320, 1, 1))

        def __init__(self, classes: int = 1000) -> None:
            super().__init__()
            layers, cin = [conv_bn(3, 32, 3, 2)], 32
            for t, c, n, s in self.SETTINGS:
                for i in range(n):
                    layers.append(InvertedResidual(cin, c, s if i == 0 else 1, t))
                    cin = c
            layers.append(conv_bn(cin, 1280, 1, 1))
            self.features = nn.Sequential(*layers)
            self.classifier = nn.Linear(1280, classes)

        def forward(self, x):
            x = nn.functional.adaptive_avg_pool2d(self.features(x), 1)
            return self.classifier(torch.flatten(x, 1))

    class EncoderLayer(nn.Module):
        """Post-norm transformer encoder layer (BERT's), attention written out (no fused SDPA)."""

        def __init__(self, hidden: int, heads: int, ffn: int) -> None:
            super().__init__()
            self.heads = heads
            self.qkv = nn.Linear(hidden, 3 * hidden)
            self.proj = nn.Linear(hidden, hidden)
            self.norm1 = nn.LayerNorm(hidden)
            self.ffn1 = nn.Linear(hidden, ffn)
            self.ffn2 = nn.Linear(ffn, hidden)
            self.norm2 = nn.LayerNorm(hidden)

        def forward(self, x):
            b, s, h = x.shape
            d = h // self.heads
            q, k, v = self.qkv(x).reshape(b, s, 3, self.heads, d).permute(2, 0, 3, 1, 4)
            att = torch.softmax(q @ k.transpose(-1, -2) * (1.0 / d**0.5), dim=-1)
            y = (att @ v).transpose(1, 2).reshape(b, s, h)
            x = self.norm1(x + self.proj(y))
            return self.norm2(x + self.ffn2(nn.functional.gelu(self.ffn1(x))))

    class Bert(nn.Module):
        def __init__(self, vocab: int, hidden: int, layers: int, heads: int, ffn: int, max_len: int) -> None:
            super().__init__()
            self.tokens = nn.Embedding(vocab, hidden)
            self.positions = nn.Parameter(torch.randn(1, max_len, hidden) * 0.02)
            self.norm = nn.LayerNorm(hidden)
            self.layers = nn.Sequential(*(EncoderLayer(hidden, heads, ffn) for _ in range(layers)))
            self.pool = nn.Linear(hidden, hidden)

        def forward(self, ids):
            x = self.norm(self.tokens(ids) + self.positions[:, : ids.shape[1]])
            x = self.layers(x)
            return torch.tanh(self.pool(x[:, 0]))

    class SmallCNN(nn.Module):
        """conv-bn-relu twice (the second block repeated: a task of weight 2), pool, linear."""

        def __init__(self) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(3, 8, 3, 1, 1)
            self.conv2 = nn.Conv2d(8, 8, 3, 1, 1)
            self.conv3 = nn.Conv2d(8, 8, 3, 1, 1)
            self.bn = nn.BatchNorm2d(8)
            self.fc = nn.Linear(8, 10)

        def forward(self, x):
            x = torch.relu(self.bn(self.conv1(x)))
            x = torch.relu(self.conv2(x))
            x = torch.relu(self.conv3(x))
            return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))

    class SmallTransformer(nn.Module):
        """One encoder layer on float inputs (batch 1, sequence 16, hidden 32, 2 heads)."""

        def __init__(self) -> None:
            super().__init__()
            self.layer = EncoderLayer(32, 2, 64)

        def forward(self, x):
            return self.layer(x)

    return {
        "ResNet18": ResNet18, "MobileNetV2": MobileNetV2, "Bert": Bert, "SmallCNN": SmallCNN,
        "SmallTransformer": SmallTransformer,
    }


def _make(cls_name: str, **kwargs: Any) -> Callable[[], Any]:
    def build() -> Any:
        return _modules()[cls_name](**kwargs)

    return build


MODELS: dict[str, ZooModel] = {
    m.name: m
    for m in (
        ZooModel("resnet18", "ResNet-18 (He et al. 2016), 1000 classes, 3x224x224",
                 ((1, 3, 224, 224),), ("float32",), _make("ResNet18")),
        ZooModel("mobilenet_v2", "MobileNet-V2 (Sandler et al. 2018), width 1.0, 1000 classes, 3x224x224",
                 ((1, 3, 224, 224),), ("float32",), _make("MobileNetV2")),
        ZooModel("bert_tiny", "BERT-tiny (2 layers, hidden 128, 2 heads, FFN 512), sequence 128",
                 ((1, 128),), ("int64",),
                 _make("Bert", vocab=30522, hidden=128, layers=2, heads=2, ffn=512, max_len=512)),
        ZooModel("small_cnn", "test model: three 3x3 convs on 3x16x16, pool, linear",
                 ((1, 3, 16, 16),), ("float32",), _make("SmallCNN")),
        ZooModel("small_transformer", "test model: one transformer encoder layer, 16 tokens of 32",
                 ((1, 16, 32),), ("float32",), _make("SmallTransformer")),
    )
}


def get(name: str) -> ZooModel:
    """The zoo entry called `name` (ValueError naming the known ones otherwise)."""
    if name not in MODELS:
        raise ValueError(f"unknown model: {name!r}; known: {', '.join(MODELS)}")
    return MODELS[name]


def example_inputs(name: str, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Random example inputs of model `name`: uniform [-1, 1) floats, token ids in [0, 1000)."""
    import torch

    entry = get(name)
    gen = torch.Generator().manual_seed(seed)
    out = []
    for shape, dtype in zip(entry.input_shapes, entry.input_dtypes):
        if dtype.startswith("int"):
            out.append(torch.randint(0, 1000, shape, generator=gen, dtype=getattr(torch, dtype)))
        else:
            out.append(torch.rand(shape, generator=gen, dtype=getattr(torch, dtype)) * 2 - 1)
    return tuple(out)


def create(name: str, seed: int = 0) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """Model `name` in eval mode with random weights from `seed`, and example inputs."""
    import torch

    torch.manual_seed(seed)
    model = get(name).build().eval()
    with torch.no_grad():  # non-trivial batch-norm statistics, so folding them is tested
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.running_mean.uniform_(-0.1, 0.1)
                module.running_var.uniform_(0.5, 1.5)
    return model, example_inputs(name, seed)


def export(name: str, seed: int = 0) -> torch.export.ExportedProgram:
    """`torch.export.export` of model `name` on its example inputs."""
    import torch

    model, inputs = create(name, seed)
    return torch.export.export(model, inputs)
