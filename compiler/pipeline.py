"""Our TIR pipelines and the one place a module is compiled: every build of ours goes through
`compile_module` (or `build`, its runnable form), with a pipeline named by `Pipeline`.

Layering: above `compiler.passes` (the pipelines run our passes), below `compiler.workloads.model`,
`compiler.layout` and the artifacts (`compiler.build`); `compiler` never imports `tuner` or `service`.
"""

from __future__ import annotations

from typing import Any, Literal

import tvm
from tvm.s_tir import transform
from tvm.tirx import compilation_pipeline
from tvm.tirx.transform import HoistedConditionals, HoistedLetBindings

from .passes.licm import licm_pass
from .passes.tensorize import tensorize_pass
from .passes.vector_math import vector_math_pass
from .target import use_all_cores

Pipeline = Literal["licm", "default", "hoist-expression"]
PIPELINES: tuple[Pipeline, ...] = ("licm", "default", "hoist-expression")


def tir_pipeline(pipeline: Pipeline = "licm") -> str:
    """The name TVM knows a TIR pipeline of ours by (registered in this process on first use).

    - "licm": TVM's default pipeline, then our loop-invariant code motion (`compiler.passes.licm`);
      what every build of ours uses unless a job turns it off;
    - "default": TVM's default pipeline alone;
    - "hoist-expression": TVM's default pipeline, then TVM's own `HoistExpression` with every kind of
      conditional and let binding enabled (the comparison `python -m bench.licm` makes).

    Every build of ours names its pipeline here before anything it built runs, so this is also where TVM's
    CPU thread count is set (`use_all_cores`; a user's own `TVM_NUM_THREADS` wins).
    """
    use_all_cores()
    if pipeline == "default":
        return "default"
    if pipeline not in PIPELINES:
        raise ValueError(f"unknown TIR pipeline: {pipeline!r} (one of {', '.join(PIPELINES)})")
    name = f"altune-{pipeline}"
    if name not in compilation_pipeline.PIPELINE_MAP:
        compilation_pipeline.register_tir_pipeline(name, lambda: _then(_last_pass(pipeline)))
    return name


def _last_pass(pipeline: Pipeline) -> tvm.transform.Pass:
    if pipeline == "licm":
        return licm_pass()

    hoist = transform.HoistExpression()
    config = {"s_tir.HoistExpression": {"hoisted_conditionals": HoistedConditionals.All.value,
                                        "hoisted_let_bindings": HoistedLetBindings.All.value}}

    @tvm.transform.module_pass(opt_level=0, name="altune.HoistExpressionAll")
    def _hoist(mod: tvm.IRModule, _ctx: Any) -> tvm.IRModule:
        with tvm.transform.PassContext(config=config):
            return hoist(mod)

    return _hoist


def _then(last: tvm.transform.Pass) -> tuple:
    """TVM's default TIR pipeline (its passes, its finalization), with `last` after its last pass.

    In front of it runs our tensorize pass (`compiler.passes.tensorize`), which touches only functions
    with a loop marked for a tensor instruction (`tensorize.mark`) and returns all others as they are; after
    it, `compiler.passes.vector_math` (float32 `exp` as arithmetic that stays vectorized).
    """
    default, finalize_host, finalize_device = compilation_pipeline.get_default_tir_pipeline(tvm.target.Target("llvm"))
    return (tvm.transform.Sequential([tensorize_pass(), default, vector_math_pass(), last]), finalize_host,
            finalize_device)


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
