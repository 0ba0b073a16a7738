"""The operator benchmark's cases (`bench.ops`): the suites, the options of a run, and job specs read as cases.

Suites: `smoke` (two tiny cases, for CI), `quick` (one case per operator kind, ResNet/MobileNet/BERT-like shapes,
the table of ../shared/DESIGN.md), `full` (three shapes per operator kind), `dot` (int8 and bfloat16 on the
tensor-instruction paper's shapes); each with its default budget (`SUITES`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from bench.common import TORCH_VARIANTS
from compiler.workloads import WorkloadError, validate
from service.schemas import OperatorJobCreate


@dataclass(frozen=True)
class Case:
    """One operator instance to benchmark."""

    name: str
    operator: str
    params: dict[str, int] = field(hash=False)
    epilogue: str = "none"
    dtype: str = "float32"


def _op(operator: str, name: str, **params: int) -> Case:
    return Case(name, operator, params)


SMOKE = (
    _op("conv2d", "conv2d_tiny", batch=1, in_channels=4, height=8, width=8, out_channels=8, kernel=3, padding=1),
    _op("dense", "dense_tiny", m=16, n=16, k=16),
)

# The shapes of ../shared/DESIGN.md's reference table.
QUICK = (
    _op("conv2d", "conv2d_resnet", batch=1, in_channels=64, height=56, width=56, out_channels=64, kernel=3,
        padding=1),
    _op("group_conv2d", "group_conv2d", batch=1, in_channels=128, height=28, width=28, out_channels=128, kernel=3,
        padding=1, groups=4),
    _op("depthwise_conv2d", "depthwise_mobilenet", batch=1, channels=144, height=56, width=56, kernel=3,
        padding=1),
    _op("dilated_conv2d", "dilated_conv2d", batch=1, in_channels=128, height=28, width=28, out_channels=128,
        kernel=3, padding=2, dilation=2),
    _op("conv3d", "conv3d_r3d", batch=1, in_channels=32, depth=8, height=28, width=28, out_channels=32, kernel=3,
        padding=1),
    _op("conv1d", "conv1d", batch=1, in_channels=64, width=256, out_channels=64, kernel=3, padding=1),
    _op("dense", "gemm_512", m=512, n=512, k=512),
    _op("conv2d_transpose", "conv2d_transpose", batch=1, in_channels=64, height=28, width=28, out_channels=32,
        kernel=4, stride=2, padding=1),
)

# Three shapes per operator kind: batch 1 with few and with many channels, and
# batch 16; channel counts from ALT sec. 7.1 ({3, 16, 32, 64, 512, 960, 1280}),
# shapes from ResNet-18/3D-18, MobileNet-V2 and BERT layers.
FULL = (
    _op("conv2d", "c2d_b1_c3_stem", batch=1, in_channels=3, height=224, width=224, out_channels=64, kernel=7,
        stride=2, padding=3),
    _op("conv2d", "c2d_b1_c512", batch=1, in_channels=512, height=7, width=7, out_channels=512, kernel=3,
        padding=1),
    _op("conv2d", "c2d_b16_c64", batch=16, in_channels=64, height=56, width=56, out_channels=64, kernel=3,
        padding=1),
    _op("group_conv2d", "grp_b1_c64", batch=1, in_channels=64, height=56, width=56, out_channels=64, kernel=3,
        padding=1, groups=4),
    _op("group_conv2d", "grp_b1_c512", batch=1, in_channels=512, height=14, width=14, out_channels=512, kernel=3,
        padding=1, groups=32),
    _op("group_conv2d", "grp_b16_c32", batch=16, in_channels=32, height=28, width=28, out_channels=32, kernel=3,
        padding=1, groups=4),
    _op("depthwise_conv2d", "dep_b1_c32", batch=1, channels=32, height=112, width=112, kernel=3, padding=1),
    _op("depthwise_conv2d", "dep_b1_c960", batch=1, channels=960, height=7, width=7, kernel=3, padding=1),
    _op("depthwise_conv2d", "dep_b16_c64", batch=16, channels=64, height=56, width=56, kernel=3, stride=2,
        padding=1),
    _op("dilated_conv2d", "dil_b1_c64", batch=1, in_channels=64, height=56, width=56, out_channels=64, kernel=3,
        padding=2, dilation=2),
    _op("dilated_conv2d", "dil_b1_c512", batch=1, in_channels=512, height=14, width=14, out_channels=512,
        kernel=3, padding=2, dilation=2),
    _op("dilated_conv2d", "dil_b16_c32", batch=16, in_channels=32, height=28, width=28, out_channels=32,
        kernel=3, padding=2, dilation=2),
    _op("conv3d", "c3d_b1_c3", batch=1, in_channels=3, depth=16, height=56, width=56, out_channels=64, kernel=3,
        padding=1),
    _op("conv3d", "c3d_b1_c512", batch=1, in_channels=512, depth=2, height=7, width=7, out_channels=512, kernel=3,
        padding=1),
    _op("conv3d", "c3d_b16_c32", batch=16, in_channels=32, depth=8, height=14, width=14, out_channels=32,
        kernel=3, padding=1),
    _op("conv1d", "c1d_b1_c16", batch=1, in_channels=16, width=1024, out_channels=64, kernel=3, padding=1),
    _op("conv1d", "c1d_b1_c512", batch=1, in_channels=512, width=128, out_channels=512, kernel=3, padding=1),
    _op("conv1d", "c1d_b16_c64", batch=16, in_channels=64, width=256, out_channels=64, kernel=3, padding=1),
    _op("dense", "gemm_b1_c1280", m=1, n=1000, k=1280),  # MobileNet-V2 classifier
    _op("dense", "gemm_512", m=512, n=512, k=512),
    _op("dense", "gemm_b16_bert", m=16 * 128, n=768, k=768),  # BERT-base projection, 16 sequences of 128
    _op("conv2d_transpose", "t2d_b1_c512", batch=1, in_channels=512, height=7, width=7, out_channels=256,
        kernel=4, stride=2, padding=1),
    _op("conv2d_transpose", "t2d_b1_c64", batch=1, in_channels=64, height=28, width=28, out_channels=32,
        kernel=4, stride=2, padding=1),
    _op("conv2d_transpose", "t2d_b16_c32", batch=16, in_channels=32, height=28, width=28, out_channels=16,
        kernel=4, stride=2, padding=1),
)

# int8 and bfloat16 (-> fp32) operator jobs on the tensor-instruction paper's Table II shapes, which divide
# neither the instructions' lanes nor their groups (255, 127 channels; 55x55 maps): ours runs the layout
# template's dot-product form (`compiler.layout.templates`), tensorized where the target has the instruction.
# The int8 ones are a quantized network's layers: u8 x s8 -> s32, bias, ReLU and the requantization to uint8,
# against torch.ao's quantized conv2d / linear (x86 engine: FBGEMM / oneDNN); torch's bf16 operators are oneDNN's.
DOT = tuple(
    replace(case, name=f"{case.name}_{short}", dtype=dtype, epilogue=epilogue)
    for dtype, short, epilogue in (("int8", "i8", "bias_relu_requantize"), ("bfloat16", "bf16", "none"))
    for case in (
        _op("conv2d", "c2d_55x55_128_to_255", batch=1, in_channels=128, height=55, width=55, out_channels=255,
            kernel=3, padding=1),
        _op("conv2d", "c2d_55x55_255_to_127", batch=1, in_channels=255, height=55, width=55, out_channels=127,
            kernel=3, padding=1),
        _op("dense", "gemm_3025x127x255", m=3025, n=127, k=255),
        _op("dense", "gemm_255x255x255", m=255, n=255, k=255),
        _op("dense", "gemm_127x1000x127", m=127, n=1000, k=127),
    )
)

SUITES: dict[str, tuple[tuple[Case, ...], int]] = {  # name -> (cases, default budget)
    "smoke": (SMOKE, 8),
    "quick": (QUICK, 128),
    "full": (FULL, 300),
    "dot": (DOT, 64),
}


@dataclass(frozen=True)
class Options:
    """What to run beside ours, and where MetaSchedule writes its run folders."""

    metaschedule: bool = True
    torch: bool = True
    untuned: bool = True
    work_dir: Path | None = None
    loop_only: bool = True  # the ALT-OL ablation column
    layout_levels: int = 1  # ours: one- or two-level layout templates
    torch_variants: tuple[str, ...] = TORCH_VARIANTS
    rounds: int = 1  # fresh-process readings per program (median)
    ablation: bool = False  # also the seeds with random walks, and the XGBoost search without PPO (ABLATIONS)
    peak: bool = True  # measure this machine's fp32 FMA peak once per run (each pick's share of it)
    seeds: bool = True  # False: every search of ours without its known nests and oneDNN-like first layout


# the search ablation (`--ablation`): name -> `tune` options; full ALT is "ours", ALT-OL "ours_loop_only"
ABLATIONS: dict[str, dict[str, Any]] = {
    "ablation_seeds_random": {"ppo": False, "cost_model": "random"},  # (a) the seeds, random layouts and walks
    "ablation_xgb": {"ppo": False},  # (b) the seeds, random layouts and walks, ranked by the cost model
}


# ---------------------------------------------------------------------------
# Picking cases


def select(suite: str, names: list[str] | None) -> list[Case]:
    """The cases of `suite`, or the named ones in the given order (ValueError for an unknown name)."""
    if suite not in SUITES:
        raise ValueError(f"unknown suite: {suite!r}; known: {', '.join(SUITES)}")
    return pick(SUITES[suite][0], names, f" in suite {suite}")


def pick(cases: Sequence[Case], names: Sequence[str] | None, where: str = "") -> list[Case]:
    """The named cases of `cases` in the given order, all of them when `names` is empty (ValueError for an unknown
    name, saying `where` it was looked for)."""
    if not names:
        return list(cases)
    by_name = {c.name: c for c in cases}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise ValueError(f"unknown case(s){where}: {', '.join(unknown)}; known: {', '.join(by_name)}")
    return [by_name[n] for n in names]


@dataclass(frozen=True)
class SpecCase:
    """A case from a job spec: its own target, budget and seed."""

    case: Case
    target: str
    budget: int
    seed: int


def load_specs(path: Path) -> list[SpecCase]:
    """Reads a JSON list of operator job specs, validated as `POST /api/v1/jobs` validates them.

    Raises:
        ValueError: the file is not a JSON list, or a spec is invalid (with its index).
    """

    specs = json.loads(Path(path).read_text())
    if not isinstance(specs, list):
        raise ValueError(f"{path}: expected a JSON list of operator job specs, got {type(specs).__name__}")
    out = []
    for i, raw in enumerate(specs):
        try:
            spec = OperatorJobCreate.model_validate(raw)
            params = validate(spec.operator, spec.params, spec.dtype, spec.epilogue)
        except (ValidationError, WorkloadError) as e:
            raise ValueError(f"{path}: spec [{i}]: {e}") from e
        name = f"{i}_{spec.operator}" + ("" if spec.epilogue == "none" else f"_{spec.epilogue}")
        out.append(SpecCase(Case(name, spec.operator, params, spec.epilogue, spec.dtype),
                            spec.target, spec.budget, spec.seed))
    return out
