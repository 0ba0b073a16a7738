"""Targets as data (`TARGETS`, `target_info`): target names -> TVM targets with the detected host CPU."""

from __future__ import annotations

import os

import pytest

from compiler.target import TARGET_NAMES, TARGETS, check_available, host_mattr, resolve_target, target_info, target_key


@pytest.mark.parametrize("name", ["host", "llvm"])
def test_host_target_has_cpu_and_cores(name):
    target = resolve_target(name)
    assert target.kind.name == "llvm"
    assert str(target.attrs["mcpu"]), "mcpu must be detected, never empty"
    assert int(target.attrs["num-cores"]) == len(os.sched_getaffinity(0))


def test_target_key_is_stable_and_names_the_cpu():
    target = resolve_target("host")
    key = target_key("host")
    mattr = f" -mattr={','.join(target.attrs['mattr'])}" if "mattr" in target.attrs else ""
    assert key == target_key("llvm") == (f"llvm -mcpu={target.attrs['mcpu']}{mattr} "
                                         f"-num-cores={target.attrs['num-cores']}")


def test_features_the_kernel_does_not_report_are_turned_off():
    """LLVM names the CPU by family and model; a VM may hide some of its vector units (SIGILL if used)."""
    from tvm.target import codegen

    from compiler.target import HOST_CPU_ENV

    if os.environ.get(HOST_CPU_ENV):
        pytest.skip(f"{HOST_CPU_ENV} names the host CPU")
    with open("/proc/cpuinfo") as f:
        flags = {w.replace("_", "") for line in f if line.startswith("flags") for w in line.split(":", 1)[1].split()}
    target = resolve_target("host")
    assert list(target.attrs.get("mattr", [])) == list(host_mattr())
    enabled = codegen.llvm_get_cpu_features(target)
    for feature in ("avx512f", "avx512vnni", "avx512bf16", "avx2", "fma", "avxvnni"):
        assert (feature in enabled) == (feature in flags), (feature, sorted(enabled))


def test_cuda_is_not_supported_yet_anywhere():
    """Nothing schedules GPU threads: a cuda target is refused by name and as a TVM target, with the reason."""
    import tvm

    from compiler.target import TargetError

    for target in ("cuda", tvm.target.Target("cuda")):
        with pytest.raises(ValueError, match="target cuda is not supported yet: nothing schedules GPU threads"):
            target_info(target)
    with pytest.raises(ValueError, match="target cuda is not supported yet"):
        resolve_target("cuda")
    with pytest.raises(ValueError, match="target cuda is not supported yet"):
        target_key("cuda")
    with pytest.raises(TargetError, match="target cuda is not supported yet"):
        check_available("cuda")


@pytest.mark.parametrize("name", ["x86", "", "HOST"])
def test_unknown_target_names_the_valid_ones(name):
    with pytest.raises(ValueError, match=f"unknown target: {name!r}; known: host, llvm"):
        target_info(name)
    with pytest.raises(ValueError, match="known: host, llvm"):
        resolve_target(name)
    with pytest.raises(ValueError):
        target_key(name)
    assert TARGET_NAMES == tuple(TARGETS) == ("host", "llvm")


@pytest.mark.parametrize("name", ["host", "llvm"])
def test_a_target_is_data(name):
    """Each entry says how it resolves, its key, its device, its vector unit, its pipeline and spaces; a TVM
    target is looked up by its kind."""
    import tvm

    from compiler.target import vector_lanes, vector_unit

    info = target_info(name)
    target = info.resolve()
    assert target is resolve_target(name) and info.key() == target_key(name)
    assert target_info(target).kind == info.kind == "llvm" and info.is_cpu
    assert info.device() == tvm.cpu(0)
    assert info.vector_bits() == vector_unit(target).bits == vector_unit(target).lanes * 32
    assert vector_lanes(target, "float32") == vector_unit(target).lanes
    assert vector_lanes(target, "int8") == 4 * vector_unit(target).lanes
    assert info.pipeline == "licm" and "loop" in info.spaces


@pytest.mark.parametrize("preset", [None, "1"])
@pytest.mark.parametrize("how", ["use_all_cores", "build"])
def test_tvm_runtime_runs_on_every_core_unless_the_user_says(preset, how):
    """TVM's own default halves x86 cores (one thread on a 2-core machine); `use_all_cores`, which every build
    calls (`compiler.pipeline.tir_pipeline`), fixes it; a user's TVM_NUM_THREADS wins."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TVM_NUM_THREADS"}
    if preset is not None:
        env["TVM_NUM_THREADS"] = preset
    call = {"use_all_cores": "from compiler.target import use_all_cores; use_all_cores()",
            "build": "from compiler.pipeline import tir_pipeline; tir_pipeline()"}[how]
    code = f"{call}; import tvm; print(tvm.runtime.num_threads())"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    expected = int(preset) if preset is not None else len(os.sched_getaffinity(0))
    assert int(out.stdout.strip()) == expected


def test_importing_compiler_leaves_the_environment_alone():
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TVM_NUM_THREADS"}
    code = "import os, compiler, compiler.workloads, compiler.target; print('TVM_NUM_THREADS' in os.environ)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_vector_unit_follows_the_features_not_the_cpu_name():
    import tvm

    from compiler.target import AVX2, AVX512, vector_unit

    assert vector_unit(tvm.target.Target({"kind": "llvm", "mcpu": "znver4"})) == AVX512
    assert vector_unit(tvm.target.Target({"kind": "llvm", "mcpu": "znver4", "mattr": ["-avx512f"]})) == AVX2
    assert vector_unit(tvm.target.Target({"kind": "llvm", "mcpu": "haswell"})) == AVX2
    assert vector_unit(tvm.target.Target({"kind": "llvm", "mtriple": "aarch64-linux-gnu"})).registers == 32
    from compiler.target import HOST_CPU_ENV

    with open("/proc/cpuinfo") as f:
        avx512 = any("avx512f" in line.split() for line in f if line.startswith("flags"))
    if os.environ.get(HOST_CPU_ENV):  # a host CPU named by the user: its unit
        avx512 = vector_unit(tvm.target.Target({"kind": "llvm", "mcpu": os.environ[HOST_CPU_ENV]})) == AVX512
    assert vector_unit() == (AVX512 if avx512 else AVX2)


def test_cache_sizes_come_from_the_kernel():
    import os

    from compiler.target import DEFAULT_CACHES, host_caches

    caches = host_caches()
    assert 0 < caches.l1 < caches.l2
    root = "/sys/devices/system/cpu/cpu0/cache/index0"
    if not os.path.exists(root):
        assert caches == DEFAULT_CACHES
        return
    with open(f"{root}/size") as f:
        size = f.read().strip()
    with open(f"{root}/type") as f:
        kind = f.read().strip()
    if kind == "Data":  # index0 is the L1 data cache on x86 Linux
        assert caches.l1 == int(size.rstrip("KM")) * (1024 if size.endswith("K") else 1024 * 1024)


def test_the_host_cpu_can_be_named_and_gets_no_feature_this_machine_lacks(tmp_path):
    """`ALTUNE_HOST_CPU=haswell`: "host" is an AVX2 CPU whatever this machine is (8 lanes, 16 registers), with
    no AVX-512 feature added from this machine's flags."""
    import subprocess
    import sys

    code = ("from compiler.target import resolve_target, vector_unit, host_cpu; from tvm.target import codegen; "
            "t = resolve_target('host'); f = codegen.llvm_get_cpu_features(t); u = vector_unit(); "
            "print(host_cpu(), u.lanes, u.registers, 'avx2' in f, any(x.startswith('avx512') for x in f))")
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "ALTUNE_HOST_CPU": "haswell"},
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == ["haswell", "8", "16", "True", "False"], out
