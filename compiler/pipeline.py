"""Our TIR pipelines and the one place a module is compiled: every build of ours goes through
`compile_module` (or `build`, its runnable form), with a pipeline named by `Pipeline`.

Layering: above `compiler.passes` (the pipelines run our passes), below `compiler.workloads.model`,
`compiler.layout` and the artifacts (`compiler.build`); `compiler` never imports `tuner` or `service`.
"""

from __future__ import annotations

from typing import Any, Literal

import tvm
from tvm.tirx import compilation_pipeline

from .passes import make_pass
from .target import use_all_cores

Pipeline = Literal["licm", "default", "hoist-expression"]
TVM_DEFAULT = "tvm-default"  # in a pipeline: TVM's default TIR passes, at this point
# our pipelines: the passes (`compiler.passes.PASSES`) in order around TVM's default ones; "default" is TVM's
# default pipeline alone, as TVM registers it
PIPELINES: dict[str, tuple[str, ...]] = {
    # what every build of ours uses unless a job turns it off: our tensorize pass in front (it touches only
    # functions with a loop marked for a tensor instruction), then TVM's, float32 `exp` kept vectorized, our LICM
    "licm": ("tensorize", TVM_DEFAULT, "vector_math", "licm"),
    # the comparison `python -m bench.licm` makes: TVM's own HoistExpression in place of our LICM
    "hoist-expression": ("tensorize", TVM_DEFAULT, "vector_math", "hoist_expression"),
}


def tir_pipeline(pipeline: Pipeline = "licm") -> str:
    """The name TVM knows a TIR pipeline of ours by (registered in this process on first use): "default" is
    TVM's default pipeline alone, the others are the passes `PIPELINES` names.

    Every build of ours names its pipeline here before anything it built runs, so this is also where TVM's
    CPU thread count is set (`use_all_cores`; a user's own `TVM_NUM_THREADS` wins).
    """
    use_all_cores()
    if pipeline == "default":
        return "default"
    if pipeline not in PIPELINES:
        raise ValueError(f"unknown TIR pipeline: {pipeline!r} (one of default, {', '.join(PIPELINES)})")
    name = f"altune-{pipeline}"
    if name not in compilation_pipeline.PIPELINE_MAP:
        compilation_pipeline.register_tir_pipeline(name, lambda: _sequence(PIPELINES[pipeline]))
    return name


def _sequence(names: tuple[str, ...]) -> tuple:
    """TVM's (passes, finalize host, finalize device) with our passes around TVM's default ones."""
    default, finalize_host, finalize_device = compilation_pipeline.get_default_tir_pipeline(tvm.target.Target("llvm"))
    passes = [default if name == TVM_DEFAULT else make_pass(name) for name in names]
    return tvm.transform.Sequential(passes), finalize_host, finalize_device


def compile_module(mod: tvm.IRModule, target: tvm.target.Target, pipeline: Pipeline = "licm") -> Any:
    """`tvm.compile` through one of our TIR pipelines (`tir_pipeline`): every build of ours goes here."""
    return tvm.compile(mod, target=target, tir_pipeline=tir_pipeline(pipeline))


def build(mod: tvm.IRModule, target: tvm.target.Target, pipeline: Pipeline = "licm") -> tvm.runtime.Module:
    """Compiles a (scheduled) TIR module.

    Args:
        mod: an IRModule whose "main" is a PrimFunc.
        target: the TVM target (see `compiler.target.resolve_target`).
        pipeline: the TIR pipeline (`tir_pipeline`): with our LICM by default.

    Returns:
        A runnable runtime module: `lib["main"](*args)` and `lib.time_evaluator`.
    """
    return compile_module(mod, target, pipeline).jit()
