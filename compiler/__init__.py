"""Our compiler: workloads, layouts, passes and builds on TVM.

Importing it has no side effect. TVM's CPU thread count (`compiler.target.use_all_cores`: TVM's own default
runs one thread per two x86 cores) is set by every build (`compiler.pipeline.tir_pipeline`) and artifact load
(`compiler.build.load_artifact`), before anything of ours runs a parallel loop; an entry point that starts
measurement workers before its first build calls `use_all_cores` itself first.
"""
