"""Whole models: a `torch.export` file -> Relax -> fused tasks -> a tuned Relax VM executable -> an artifact.

    ep = load_exported_program(path)                   # safe: nothing from the file is evaluated (pt2.py)
    model = import_model(ep)                           # legalized and fused Relax, params, tasks
    model.tasks                                        # one per distinct fused PrimFunc, with its weight
    built = build_model(model, target, {task.workload_key: scheduled_mod, ...},
                        layouts={task.workload_key: TaskLayout(func_in_new_layouts, index_maps)})
    outs = run_model(built, inputs)                    # numpy in, numpy out
    write_model_artifact(dest, model, built, target, ...)  # lib.so, params.npz, manifest.json, run.py

Import: torch's core-ATen decompositions, then `relax.frontend.torch.from_exported_program(keep_params_as_input=True)`
(parameters stay arguments of "main", after the user inputs, so they ship
beside the library and are never baked into it), then `DecomposeOpsForInference`,
`LegalizeOps`, `AnnotateTIROpPattern`, `FoldConstant`, `FuseOps`, `FuseTIR`: the
fused PrimFuncs are what gets tuned. Tasks are deduplicated by the structural
hash of the PrimFunc (its name left out), and weighted by how many `call_tir`s
of "main" call one of its copies.

Build: scheduled PrimFuncs replace every copy of their task's function. A task
given a `TaskLayout` (its function rewritten for other buffer layouts) is swapped
in by `relax.transform.AlterOpImpl`, which wraps the call in `layout_transform`s;
`LiftTransformParams` then moves every parameter-only computation -- the weight
layout transforms, bias reshapes, batch-norm constants -- into
`main_transform_params`, which `build_model` runs once, so the parameters ship
already transformed; transforms of activations stay as conversions between
tasks. Element-wise producers and consumers inside a fused task share its
layout (FuseOps put them in the same PrimFunc); across tasks no propagation is
done yet (see docs/design.md).

Import never hands a TVM internal error to the user: `converters` adds converters for common ATen operators
TVM's importer lacks and names the operator and fx node of any it cannot import; a conv2d whose blocked layout
TVM's `ConvertLayout` cannot carry keeps NCHW (conversions at its boundary), and a graph that fails to lower
after the layout pass is lowered in the model's own layouts (`ImportedModel.notes` says which). `check`
builds a model with its tuned schedules and checks it whole against the exported program, removing the
schedules whose model does not match (`build_checked`).

The package, one module a step: `..pt2` (loading an upload safely), `converters` (translate: torch.export ->
Relax, our converters), `importer` (import_model, ImportedModel), `layouts` (the graph-level layout policy and
its per-conv fallback), `legalize` (the kernels of the blocked layouts), `carry` (the layouts carried through
the graph), `tasks` (ModelTask, extract_tasks), `build` (build_model, run_model, time_model,
default_schedule), `check` (build_checked, reference_outputs, time_torch), `artifact` (the downloadable
artifact). This module re-exports what the rest of altune uses.

Loading an upload safely: `load_exported_program` (`compiler.workloads.pt2`, re-exported here) checks
the archive and every string of the program's JSON that torch would evaluate, import or unpickle
before torch sees the file, and refuses what is not plain (see that module's docstring).

Layering: `compiler` never imports `tuner` or `service`. torch, TVM and numpy
are imported inside functions.
"""

from ..pt2 import DEFAULT_MAX_FILE_BYTES, ModelError, load_exported_program
from .artifact import (
    MODEL_ARTIFACT_FILES,
    MODEL_MANIFEST_FORMAT,
    RUN_PY,
    extract_model_artifact,
    make_model_manifest,
    torch_outputs,
    write_model_artifact,
)
from .build import (
    BuiltModel,
    TaskLayout,
    alter_layouts,
    apply_schedules,
    build_model,
    default_cpu_schedule,
    default_schedule,
    flatten_outputs,
    run_model,
    time_model,
)
from .check import (
    MODEL_ATOL,
    MODEL_RTOL,
    QUANTIZED_ATOL,
    QUANTIZED_RTOL,
    CheckedBuild,
    build_checked,
    compare_outputs,
    reference_outputs,
    time_torch,
    tolerance,
)
from .converters import CONVERTERS, translate
from .importer import ImportedModel, group_model, import_model
from .layouts import MODEL_LAYOUTS, blocked_conv_layouts, conv_blocks, convert_layouts, vector_lanes
from .legalize import depthwise_conv2d_nchwc, legalize_conv2d
from .tasks import (
    COMPLEX_OPS,
    DEFAULT_MAX_TENSOR_ELEMENTS,
    ModelTask,
    call_counts,
    extract_tasks,
    flatten_sinfo,
    func_args,
    structural_key,
    tensor_spec,
)

__all__ = [
    "BuiltModel",
    "CheckedBuild",
    "COMPLEX_OPS",
    "CONVERTERS",
    "DEFAULT_MAX_FILE_BYTES",
    "DEFAULT_MAX_TENSOR_ELEMENTS",
    "ImportedModel",
    "MODEL_ARTIFACT_FILES",
    "MODEL_ATOL",
    "MODEL_RTOL",
    "QUANTIZED_ATOL",
    "QUANTIZED_RTOL",
    "MODEL_LAYOUTS",
    "MODEL_MANIFEST_FORMAT",
    "ModelError",
    "ModelTask",
    "RUN_PY",
    "TaskLayout",
    "alter_layouts",
    "apply_schedules",
    "blocked_conv_layouts",
    "build_checked",
    "build_model",
    "call_counts",
    "compare_outputs",
    "conv_blocks",
    "convert_layouts",
    "default_cpu_schedule",
    "default_schedule",
    "depthwise_conv2d_nchwc",
    "extract_model_artifact",
    "extract_tasks",
    "flatten_outputs",
    "flatten_sinfo",
    "func_args",
    "group_model",
    "import_model",
    "legalize_conv2d",
    "load_exported_program",
    "make_model_manifest",
    "reference_outputs",
    "run_model",
    "structural_key",
    "tensor_spec",
    "time_model",
    "time_torch",
    "tolerance",
    "torch_outputs",
    "translate",
    "vector_lanes",
    "write_model_artifact",
]
