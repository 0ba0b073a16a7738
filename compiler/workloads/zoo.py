"""Built-in models: ResNet-18, MobileNet-V2, BERT-tiny, and small architectures of every common kind, as torch.nn
modules.

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
    import torch  # heavy: the API reads the zoo's table without torch
    from torch import nn  # heavy: the API reads the zoo's table without torch

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


    # -- small architectures (tiny shapes, so that every one imports, tunes and is checked in seconds) --

    class UNet(nn.Module):
        """Encoder/decoder: conv blocks, max pooling down, a transposed conv and a nearest upsampling up,
        each skip joined by a channel concat."""

        def __init__(self) -> None:
            super().__init__()

            def block(cin: int, cout: int) -> nn.Sequential:
                return nn.Sequential(nn.Conv2d(cin, cout, 3, 1, 1), nn.BatchNorm2d(cout), nn.ReLU())

            self.enc1, self.enc2, self.mid = block(3, 8), block(8, 16), block(16, 32)
            self.up2 = nn.ConvTranspose2d(32, 16, 2, 2)
            self.dec2 = block(32, 16)
            self.up1 = nn.Conv2d(16, 8, 1)
            self.dec1 = block(16, 8)
            self.head = nn.Conv2d(8, 2, 1)

        def forward(self, x):
            e1 = self.enc1(x)
            e2 = self.enc2(nn.functional.max_pool2d(e1, 2))
            m = self.mid(nn.functional.max_pool2d(e2, 2))
            d2 = self.dec2(torch.cat([self.up2(m), e2], dim=1))
            up = nn.functional.interpolate(self.up1(d2), scale_factor=2, mode="nearest")
            return self.head(self.dec1(torch.cat([up, e1], dim=1)))

    class ViTBlock(nn.Module):
        """Patch embedding (a strided conv), a class token and positions, one pre-norm block (layer norm,
        multi-head attention, GELU MLP), a head on the class token."""

        def __init__(self, size: int = 16, patch: int = 4, dim: int = 32, heads: int = 2, classes: int = 10) -> None:
            super().__init__()
            self.heads = heads
            self.embed = nn.Conv2d(3, dim, patch, patch)
            self.cls = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
            self.pos = nn.Parameter(torch.randn(1, (size // patch) ** 2 + 1, dim) * 0.02)
            self.norm1, self.norm2, self.norm = nn.LayerNorm(dim), nn.LayerNorm(dim), nn.LayerNorm(dim)
            self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
            self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))
            self.head = nn.Linear(dim, classes)

        def forward(self, x):
            x = self.embed(x).flatten(2).transpose(1, 2)
            x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
            b, s, h = x.shape
            q, k, v = self.qkv(self.norm1(x)).reshape(b, s, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
            att = torch.softmax(q @ k.transpose(-1, -2) * (h // self.heads) ** -0.5, dim=-1)
            x = x + self.proj((att @ v).transpose(1, 2).reshape(b, s, h))
            x = x + self.mlp(self.norm2(x))
            return self.head(self.norm(x)[:, 0])

    class MLPMixer(nn.Module):
        """Patches by a strided conv, two mixer layers (token mixing across patches, channel mixing across
        features, each a layer norm and a GELU MLP with a residual), mean over tokens, a head."""

        def __init__(self, size: int = 16, patch: int = 4, dim: int = 32, layers: int = 2, classes: int = 10) -> None:
            super().__init__()
            tokens = (size // patch) ** 2
            self.embed = nn.Conv2d(3, dim, patch, patch)

            def mlp(n: int, hidden: int) -> nn.Sequential:
                return nn.Sequential(nn.Linear(n, hidden), nn.GELU(), nn.Linear(hidden, n))

            self.token_norms = nn.ModuleList(nn.LayerNorm(dim) for _ in range(layers))
            self.token_mlps = nn.ModuleList(mlp(tokens, 2 * tokens) for _ in range(layers))
            self.channel_norms = nn.ModuleList(nn.LayerNorm(dim) for _ in range(layers))
            self.channel_mlps = nn.ModuleList(mlp(dim, 2 * dim) for _ in range(layers))
            self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, classes)

        def forward(self, x):
            x = self.embed(x).flatten(2).transpose(1, 2)
            for tn, tm, cn, cm in zip(self.token_norms, self.token_mlps, self.channel_norms, self.channel_mlps):
                x = x + tm(tn(x).transpose(1, 2)).transpose(1, 2)
                x = x + cm(cn(x))
            return self.head(self.norm(x).mean(dim=1))

    class AudioCNN(nn.Module):
        """1-D convs over a waveform (a strided front end, batch norm, max pooling, a dilated conv), global
        average pooling, a head."""

        def __init__(self, classes: int = 10) -> None:
            super().__init__()
            self.front = nn.Sequential(nn.Conv1d(1, 8, 9, 4, 4), nn.BatchNorm1d(8), nn.ReLU(), nn.MaxPool1d(2))
            self.body = nn.Sequential(nn.Conv1d(8, 16, 5, 1, 2), nn.ReLU(), nn.Conv1d(16, 16, 3, 1, 2, dilation=2),
                                      nn.ReLU(), nn.AvgPool1d(2))
            self.head = nn.Linear(16, classes)

        def forward(self, x):
            return self.head(nn.functional.adaptive_avg_pool1d(self.body(self.front(x)), 1).flatten(1))

    class VideoCNN(nn.Module):
        """3-D convs over a short clip (batch norm, ReLU, 3-D max and adaptive average pooling), a head."""

        def __init__(self, classes: int = 10) -> None:
            super().__init__()
            self.body = nn.Sequential(
                nn.Conv3d(3, 8, 3, 1, 1), nn.BatchNorm3d(8), nn.ReLU(), nn.MaxPool3d((1, 2, 2)),
                nn.Conv3d(8, 16, 3, (1, 2, 2), 1), nn.ReLU(), nn.AdaptiveAvgPool3d(1))
            self.head = nn.Linear(16, classes)

        def forward(self, x):
            return self.head(self.body(x).flatten(1))

    class PoolNet(nn.Module):
        """Pooling variants: max (padded, strided), average (ceil mode, padding not counted), adaptive
        average and adaptive max to odd sizes, global max."""

        def __init__(self, classes: int = 10) -> None:
            super().__init__()
            self.conv1, self.conv2 = nn.Conv2d(3, 8, 3, 1, 1), nn.Conv2d(8, 16, 3, 1, 1)
            self.head = nn.Linear(16 * 9 + 16 * 4 + 16, classes)

        def forward(self, x):
            x = nn.functional.max_pool2d(torch.relu(self.conv1(x)), 3, 2, 1)
            x = nn.functional.avg_pool2d(torch.relu(self.conv2(x)), 3, 2, 1, ceil_mode=True, count_include_pad=False)
            a = nn.functional.adaptive_avg_pool2d(x, 3).flatten(1)
            m = nn.functional.adaptive_max_pool2d(x, 2).flatten(1)
            g = torch.amax(x, dim=(2, 3))
            return self.head(torch.cat([a, m, g], dim=1))

    class GroupedNet(nn.Module):
        """ResNeXt-style grouped 3x3 convs and a depthwise-separable block, with residuals, then a channel
        shuffle (ShuffleNet's reshape and transpose)."""

        def __init__(self, classes: int = 10) -> None:
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1), nn.BatchNorm2d(16), nn.ReLU())
            self.grouped = nn.Sequential(nn.Conv2d(16, 32, 1), nn.ReLU(), nn.Conv2d(32, 32, 3, 1, 1, groups=4),
                                         nn.BatchNorm2d(32), nn.ReLU(), nn.Conv2d(32, 16, 1))
            self.depthwise = nn.Sequential(nn.Conv2d(16, 16, 5, 1, 2, groups=16), nn.BatchNorm2d(16), nn.ReLU6(),
                                           nn.Conv2d(16, 32, 1), nn.Hardswish())
            self.head = nn.Linear(32, classes)

        def forward(self, x):
            x = self.stem(x)
            x = torch.relu(x + self.grouped(x))
            x = self.depthwise(x)
            b, c, h, w = x.shape
            x = x.reshape(b, 4, c // 4, h, w).transpose(1, 2).reshape(b, c, h, w)
            return self.head(x.mean(dim=(2, 3)))

    class DenseNet(nn.Module):
        """DenseNet-style: every layer's output concatenated onto its input; a transition (1x1 conv, average
        pooling) between two dense blocks."""

        def __init__(self, growth: int = 8, classes: int = 10) -> None:
            super().__init__()
            self.stem = nn.Conv2d(3, 16, 3, 1, 1)

            def layer(cin: int) -> nn.Sequential:
                return nn.Sequential(nn.BatchNorm2d(cin), nn.ReLU(), nn.Conv2d(cin, growth, 3, 1, 1, bias=False))

            self.block1 = nn.ModuleList(layer(16 + i * growth) for i in range(2))
            self.transition = nn.Sequential(nn.BatchNorm2d(32), nn.ReLU(), nn.Conv2d(32, 16, 1), nn.AvgPool2d(2))
            self.block2 = nn.ModuleList(layer(16 + i * growth) for i in range(2))
            self.head = nn.Linear(32, classes)

        def forward(self, x):
            x = self.stem(x)
            for f in self.block1:
                x = torch.cat([x, f(x)], dim=1)
            x = self.transition(x)
            for f in self.block2:
                x = torch.cat([x, f(x)], dim=1)
            return self.head(nn.functional.adaptive_avg_pool2d(x, 1).flatten(1))

    class SENet(nn.Module):
        """Squeeze-and-excitation: a channel gate (global pooling, two 1x1 convs, SiLU and sigmoid)
        multiplied back onto the feature map, with a strided residual block."""

        def __init__(self, classes: int = 10) -> None:
            super().__init__()
            self.conv1, self.conv2 = nn.Conv2d(3, 16, 3, 1, 1), nn.Conv2d(16, 32, 3, 2, 1)
            self.short = nn.Conv2d(16, 32, 1, 2)
            self.squeeze, self.excite = nn.Conv2d(32, 8, 1), nn.Conv2d(8, 32, 1)
            self.head = nn.Linear(32, classes)

        def forward(self, x):
            x = nn.functional.silu(self.conv1(x))
            y = self.conv2(x)
            gate = torch.sigmoid(self.excite(nn.functional.silu(self.squeeze(y.mean(dim=(2, 3), keepdim=True)))))
            x = torch.relu(y * gate + self.short(x))
            return self.head(x.mean(dim=(2, 3)))

    class FPN(nn.Module):
        """Feature pyramid: a strided backbone, lateral 1x1 convs, bilinear upsampling and additions top-down,
        a transposed-conv head back to full resolution."""

        def __init__(self) -> None:
            super().__init__()
            self.c1, self.c2, self.c3 = nn.Conv2d(3, 8, 3, 2, 1), nn.Conv2d(8, 16, 3, 2, 1), nn.Conv2d(16, 32, 3, 2, 1)
            self.l1, self.l2, self.l3 = nn.Conv2d(8, 16, 1), nn.Conv2d(16, 16, 1), nn.Conv2d(32, 16, 1)
            self.smooth = nn.Conv2d(16, 16, 3, 1, 1)
            self.head = nn.ConvTranspose2d(16, 4, 4, 2, 1)

        def forward(self, x):
            f1 = torch.relu(self.c1(x))
            f2 = torch.relu(self.c2(f1))
            f3 = torch.relu(self.c3(f2))
            p = self.l3(f3)
            p = self.l2(f2) + nn.functional.interpolate(p, scale_factor=2, mode="bilinear", align_corners=False)
            p = self.l1(f1) + nn.functional.interpolate(p, scale_factor=2, mode="bilinear", align_corners=False)
            return self.head(torch.relu(self.smooth(p)))

    class TextCNN(nn.Module):
        """Token embedding, parallel 1-D convs of widths 2, 3 and 4 over the sequence, max over time, concat,
        a head (Kim 2014)."""

        def __init__(self, vocab: int = 1000, dim: int = 32, classes: int = 4) -> None:
            super().__init__()
            self.embed = nn.Embedding(vocab, dim)
            self.convs = nn.ModuleList(nn.Conv1d(dim, 16, k) for k in (2, 3, 4))
            self.head = nn.Linear(48, classes)

        def forward(self, ids):
            x = self.embed(ids).transpose(1, 2)
            return self.head(torch.cat([torch.relu(c(x)).amax(dim=2) for c in self.convs], dim=1))

    return {
        "ResNet18": ResNet18, "MobileNetV2": MobileNetV2, "Bert": Bert, "SmallCNN": SmallCNN,
        "SmallTransformer": SmallTransformer, "UNet": UNet, "ViTBlock": ViTBlock, "MLPMixer": MLPMixer,
        "AudioCNN": AudioCNN, "VideoCNN": VideoCNN, "PoolNet": PoolNet, "GroupedNet": GroupedNet,
        "DenseNet": DenseNet, "SENet": SENet, "FPN": FPN, "TextCNN": TextCNN,
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
        ZooModel("unet", "U-Net-like encoder/decoder: max pooling, transposed conv and nearest upsampling, "
                 "skips joined by concat; 3x16x16", ((1, 3, 16, 16),), ("float32",), _make("UNet")),
        ZooModel("vit_block", "ViT block: patch embedding, class token, layer norm, attention, GELU MLP; "
                 "3x16x16 in 4x4 patches", ((1, 3, 16, 16),), ("float32",), _make("ViTBlock")),
        ZooModel("mlp_mixer", "MLP-Mixer: two layers of token and channel mixing (layer norm, GELU); 3x16x16",
                 ((1, 3, 16, 16),), ("float32",), _make("MLPMixer")),
        ZooModel("audio_cnn", "1-D conv audio net: strided, dilated convs, max and average pooling; 1x1024 waveform",
                 ((1, 1, 1024),), ("float32",), _make("AudioCNN")),
        ZooModel("video_cnn", "3-D conv video net: conv3d, batch norm, 3-D max and adaptive pooling; 3x4x16x16 clip",
                 ((1, 3, 4, 16, 16),), ("float32",), _make("VideoCNN")),
        ZooModel("pool_net", "pooling variants: max, average (ceil mode), adaptive average and max, global max; "
                 "3x16x16", ((1, 3, 16, 16),), ("float32",), _make("PoolNet")),
        ZooModel("grouped_net", "ResNeXt grouped and depthwise-separable convs, ReLU6, hardswish, channel shuffle; "
                 "3x16x16", ((1, 3, 16, 16),), ("float32",), _make("GroupedNet")),
        ZooModel("dense_net", "DenseNet-style dense blocks (concat of every layer) and a transition; 3x16x16",
                 ((1, 3, 16, 16),), ("float32",), _make("DenseNet")),
        ZooModel("se_net", "squeeze-and-excitation gate (SiLU, sigmoid) and a strided residual block; 3x16x16",
                 ((1, 3, 16, 16),), ("float32",), _make("SENet")),
        ZooModel("fpn", "feature pyramid: strided backbone, lateral convs, bilinear upsampling, transposed-conv "
                 "head; 3x16x16", ((1, 3, 16, 16),), ("float32",), _make("FPN")),
        ZooModel("text_cnn", "text CNN: embedding, 1-D convs of widths 2-4, max over time, concat; 32 tokens",
                 ((1, 32),), ("int64",), _make("TextCNN")),
    )
}


def get(name: str) -> ZooModel:
    """The zoo entry called `name` (ValueError naming the known ones otherwise)."""
    if name not in MODELS:
        raise ValueError(f"unknown model: {name!r}; known: {', '.join(MODELS)}")
    return MODELS[name]


def example_inputs(name: str, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Random example inputs of model `name`: uniform [-1, 1) floats, token ids in [0, 1000)."""
    import torch  # heavy: the API reads the zoo's table without torch

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
    import torch  # heavy: the API reads the zoo's table without torch

    torch.manual_seed(seed)
    model = get(name).build().eval()
    with torch.no_grad():  # non-trivial batch-norm statistics, so folding them is tested
        for module in model.modules():
            if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
                module.running_mean.uniform_(-0.1, 0.1)
                module.running_var.uniform_(0.5, 1.5)
    return model, example_inputs(name, seed)


def export(name: str, seed: int = 0) -> torch.export.ExportedProgram:
    """`torch.export.export` of model `name` on its example inputs."""
    import torch  # heavy: the API reads the zoo's table without torch

    model, inputs = create(name, seed)
    return torch.export.export(model, inputs)


def quantized(name: str, seed: int = 0) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """Model `name` quantized as a user quantizes for an x86 CPU: torchao's PT2E flow (`prepare_pt2e`, one
    calibration run on the example inputs, `convert_pt2e`) with its X86 quantizer's default configuration
    (uint8 activations per tensor, int8 weights per output channel, symmetric); the quantized module (an
    fx GraphModule computing with torch's quantized_decomposed operators) and the inputs.

    Needs `torchao` (the dev extra: tests and benchmarks quantize; the service only loads what users quantized).
    """
    import torch  # heavy: the API reads the zoo's table without torch

    try:
        from torchao.quantization.pt2e import quantize_pt2e  # heavy: the API reads the zoo's table without torch
        # heavy: the API reads the zoo's table without torch
        from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer as x86
    except ImportError as e:  # pragma: no cover - the dev extra installs it
        raise RuntimeError("quantizing a zoo model needs torchao (pip install -e '.[dev]')") from e

    module, inputs = create(name, seed)
    quantizer = x86.X86InductorQuantizer().set_global(x86.get_default_x86_inductor_quantization_config())
    prepared = quantize_pt2e.prepare_pt2e(torch.export.export(module, inputs).module(), quantizer)
    prepared(*inputs)
    return quantize_pt2e.convert_pt2e(prepared), inputs
