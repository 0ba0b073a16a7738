"""Our compiler: workloads, layouts, passes and builds on TVM.

Layers inside `compiler`, bottom to top; a module imports only from its own layer or below (no cycles,
`tests/test_layering.py` and the import contracts in pyproject.toml check it):

1. `target` (targets as data), `tir_util` (IR helpers), `arrays`, `archive`;
2. `passes` (basteln, grouping, licm, tensorize, vector_math);
3. `pipeline` (our TIR pipelines; every build goes through `compile_module`);
4. `workloads` (the operator catalog, `pt2` loading, `model`: import, tasks, build, artifact);
5. `layout` (ALT's layouts over a workload's TE graph), `build` (the operator artifact).

`compiler` never imports `tuner` or `service`. The catalog (`workloads` without `model`), `target` and
`arrays` load neither TVM nor torch at import: the API imports them.

Importing it has no side effect. TVM's CPU thread count (`compiler.target.use_all_cores`: TVM's own default
runs one thread per two x86 cores) is set by every build (`compiler.pipeline.tir_pipeline`) and artifact load
(`compiler.build.load_artifact`), before anything of ours runs a parallel loop; an entry point that starts
measurement workers before its first build calls `use_all_cores` itself first.
"""
