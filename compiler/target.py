"""Target names -> TVM targets, with the host CPU detected (never hard-coded).

Without `mcpu` LLVM emits generic x86-64 code (no AVX-512), roughly 5x slower on
a tuned matmul here, so "host" and "llvm" always carry the detected CPU and core
count. Detection runs once per process.

LLVM names the CPU from its family and model, so a virtual machine that hides
some of its vector units (a Zen 4 without AVX-512 here) still gets "znver4" and code
that dies with SIGILL: `host_mattr` turns off every vector feature of that CPU
which the kernel does not report (`/proc/cpuinfo`), and the target carries it. The
other way too: a CPU newer than LLVM's name for it (a "rocketlake" with bf16 and
AVX-VNNI) gets those features turned on.

TVM's CPU thread pool halves the logical core count on x86 (it assumes
hyper-threading), so on a 2-core machine without SMT it ran every parallel loop
on one thread: `use_all_cores` (called by the entry points and by every build, `compiler.pipeline`) sets
`TVM_NUM_THREADS` to the cores this process may use, unless the user set it.

`ALTUNE_HOST_CPU` (an LLVM CPU name, e.g. "haswell") makes "host" that CPU instead of the detected one: the
test suite and the product then run as on that CPU (an AVX2 machine's targets, spaces and instructions on an
AVX-512 one). Only features of the named CPU that this machine lacks are turned off; none are added.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import tvm

TARGET_NAMES = ("host", "llvm", "cuda")


HOST_CPU_ENV = "ALTUNE_HOST_CPU"


@functools.cache
def host_cpu() -> str:
    """The LLVM name of this machine's CPU (e.g. "znver4"), as LLVM detects it, or `ALTUNE_HOST_CPU`'s."""
    from tvm.target import codegen  # heavy: the API imports target for its names without TVM

    return os.environ.get(HOST_CPU_ENV) or str(codegen.llvm_get_system_cpu())


# LLVM feature names that /proc/cpuinfo reports under another name
_CPUINFO_NAMES = {"bmi1": "bmi", "sha_ni": "sha", "pclmulqdq": "pclmul", "sse4_1": "sse4.1", "sse4_2": "sse4.2"}
_CHECKED = ("avx", "fma", "f16c", "gfni", "vaes", "vpclmulqdq", "amx", "sha", "bmi", "sse4")  # prefixes


# vector features a CPU may have beyond what LLVM's model of it assumes (a newer CPU LLVM names after an
# older model: a Sapphire Rapids VM seen as "rocketlake" has avx512_bf16 and avx_vnni): /proc/cpuinfo's
# name -> LLVM's; only these are turned on, so LLVM never meets a name it does not know
_ADDABLE = {"avx512_bf16": "avx512bf16", "avx_vnni": "avxvnni", "avx512_vnni": "avx512vnni",
            "avx512_fp16": "avx512fp16", "avx512_vbmi2": "avx512vbmi2", "avx512_bitalg": "avx512bitalg",
            "avx512_vpopcntdq": "avx512vpopcntdq", "gfni": "gfni", "vaes": "vaes", "vpclmulqdq": "vpclmulqdq"}


@functools.cache
def host_mattr() -> tuple[str, ...]:
    """"-feature" for each vector feature LLVM assumes of `host_cpu` that this machine does not have, and
    "+feature" for each of `_ADDABLE` it has that LLVM's model of the CPU lacks.

    Empty where the kernel's flags cannot be read (not Linux): LLVM's CPU model is then trusted.
    """
    import tvm  # heavy: the API imports target for its names without TVM
    from tvm.target import codegen  # heavy: the API imports target for its names without TVM

    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), None)
    except OSError:
        return ()
    if flags is None:
        return ()
    present = {_CPUINFO_NAMES.get(flag, flag.replace("_", "")) for flag in flags}
    assumed = codegen.llvm_get_cpu_features(tvm.target.Target({"kind": "llvm", "mcpu": host_cpu()}))
    off = [f"-{feature}" for feature in sorted(assumed) if feature.startswith(_CHECKED) and feature not in present]
    on = [f"+{name}" for flag, name in sorted(_ADDABLE.items()) if flag in flags and name not in assumed]
    return tuple(off + (on if not os.environ.get(HOST_CPU_ENV) else []))  # a CPU named by the user: as it is


@dataclass(frozen=True)
class VectorUnit:
    """What a CPU's vector unit holds: fp32 lanes per register and architectural vector registers."""

    lanes: int
    registers: int

    @property
    def accumulators(self) -> int:
        """Registers a register block may keep its sums in (the rest hold the broadcast input and loads)."""
        return self.registers - 4

    @property
    def register_tile(self) -> int:
        """fp32 values all registers hold: a register block larger than this spills."""
        return self.registers * self.lanes


AVX512 = VectorUnit(lanes=16, registers=32)
AVX2 = VectorUnit(lanes=8, registers=16)


def vector_unit(target: Any = None) -> VectorUnit:
    """The vector unit of an LLVM target (this machine's, as `resolve_target("host")` describes it, when None).

    From the CPU features LLVM enables for the target's CPU and `-mattr` (TVM's `llvm_get_vector_width`
    answers 512 for an AVX2 CPU too): x86 with AVX-512 16 lanes and 32 registers (zmm0-31), with AVX 8 and
    16 (ymm0-15), else 4 and 16 (xmm); AArch64 4 lanes and 32 registers (v0-31).
    """
    if target is None:
        return _host_vector_unit()
    if target.kind.name != "llvm":  # a GPU target: the CPU's, its host's (the loop spaces are CPU spaces)
        return vector_unit(target.host) if target.host is not None else _host_vector_unit()
    from tvm.target import codegen  # heavy: the API imports target for its names without TVM

    triple = str(target.attrs.get("mtriple", "") or codegen.llvm_get_system_triple())
    if triple.startswith(("aarch64", "arm64")):
        return VectorUnit(lanes=4, registers=32)
    features = codegen.llvm_get_cpu_features(target)
    if "avx512f" in features:
        return AVX512
    return AVX2 if "avx" in features else VectorUnit(lanes=4, registers=16)


@functools.cache
def _host_vector_unit() -> VectorUnit:
    return vector_unit(resolve_target("host"))


@dataclass(frozen=True)
class Caches:
    """Data cache sizes in bytes, per core (L1d, L2) and shared (L3; 0 where there is none)."""

    l1: int
    l2: int
    l3: int


DEFAULT_CACHES = Caches(l1=32 * 1024, l2=1024 * 1024, l3=0)  # what a CPU of the last decade has at least


@functools.cache
def host_caches() -> Caches:
    """This machine's data caches, from the kernel (`/sys/devices/system/cpu/cpu0/cache`); the defaults
    where it does not say (not Linux, a container without sysfs)."""
    sizes: dict[int, int] = {}
    root = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for entry in sorted(os.listdir(root)):
            if not entry.startswith("index"):
                continue
            with open(f"{root}/{entry}/type") as f:
                kind = f.read().strip()
            if kind not in ("Data", "Unified"):
                continue
            with open(f"{root}/{entry}/level") as f:
                level = int(f.read())
            with open(f"{root}/{entry}/size") as f:
                text = f.read().strip().upper()
            scale = {"K": 1024, "M": 1024 * 1024}.get(text[-1:], 1)
            sizes[level] = int(text.rstrip("KM")) * scale
    except (OSError, ValueError):
        return DEFAULT_CACHES
    if 1 not in sizes or 2 not in sizes:
        return DEFAULT_CACHES
    return Caches(l1=sizes[1], l2=sizes[2], l3=sizes.get(3, 0))


@functools.cache
def host_cores() -> int:
    """CPU cores this process may run on (respects taskset / cgroup affinity)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def use_all_cores() -> None:
    """Lets TVM's CPU runtime run parallel loops on every core `host_cores` counts.

    Sets `TVM_NUM_THREADS` (a user's own setting wins). TVM reads it when a process starts its
    thread pool (its first parallel loop), and child processes (measurement workers,
    MetaSchedule's runners) inherit it, so this must run before either.
    """
    os.environ.setdefault("TVM_NUM_THREADS", str(host_cores()))


@functools.cache
def cuda_arch() -> str | None:
    """The "sm_XY" of CUDA device 0, or None where no CUDA device is visible."""
    import tvm  # heavy: the API imports target for its names without TVM

    try:
        dev = tvm.cuda(0)
        if not dev.exist:
            return None
        return "sm_" + str(dev.compute_version).replace(".", "")
    except Exception:  # a TVM built without CUDA raises instead of reporting absence
        return None


class TargetError(ValueError):
    """A target name this machine cannot tune for: unknown, or a GPU target on a host without a GPU."""


def available_targets() -> tuple[str, ...]:
    """The target names this machine can tune and measure for: the CPU always, "cuda" where a GPU is visible."""
    return tuple(name for name in TARGET_NAMES if name != "cuda" or cuda_arch() is not None)


def check_available(name: str) -> None:
    """Raises TargetError, saying what to use instead, unless this machine can serve target `name`."""
    if name not in TARGET_NAMES:
        raise TargetError(f"unknown target {name!r}; known: {', '.join(TARGET_NAMES)}")
    if name not in available_targets():
        raise TargetError(f"target {name!r} cannot be served: this server has no CUDA device; "
                          f"available: {', '.join(available_targets())}")


def _check(name: str) -> None:
    if name not in TARGET_NAMES:
        raise ValueError(f"unknown target {name!r}; valid names: {', '.join(TARGET_NAMES)}")


def _llvm_config() -> dict:
    config = {"kind": "llvm", "mcpu": host_cpu(), "num-cores": host_cores()}
    if host_mattr():
        config["mattr"] = list(host_mattr())
    return config


def resolve_target(name: str) -> tvm.target.Target:
    """Turns a target name from a job spec into a TVM target.

    Args:
        name: "host" or "llvm" (this CPU, detected `mcpu` and `num-cores`), or
            "cuda" (GPU 0's `arch` where a GPU is visible, else plain cuda; host
            code for this CPU).

    Returns:
        The target.

    Raises:
        ValueError: for a name not in `TARGET_NAMES`.
    """
    _check(name)
    return _resolve(name)


@functools.cache
def _resolve(name: str) -> tvm.target.Target:
    import tvm  # heavy: the API imports target for its names without TVM

    if name in ("host", "llvm"):
        return tvm.target.Target(_llvm_config())
    config: dict = {"kind": "cuda"}
    arch = cuda_arch()
    if arch is not None:
        config["arch"] = arch
    return tvm.target.Target(config, host=_llvm_config())


def target_key(name: str) -> str:
    """A stable string for a target name, stored in DB rows beside workload keys.

    "host" and "llvm" give the same key, since they compile the same code.

    Args:
        name: a name in `TARGET_NAMES`.

    Returns:
        e.g. "llvm -mcpu=znver4 -num-cores=2", "llvm -mcpu=znver4 -mattr=-avx512f,... -num-cores=2"
        (a CPU without some of its model's vector units) or "cuda -arch=sm_90".

    Raises:
        ValueError: for a name not in `TARGET_NAMES`.
    """
    _check(name)
    if name in ("host", "llvm"):
        mattr = f" -mattr={','.join(host_mattr())}" if host_mattr() else ""
        return f"llvm -mcpu={host_cpu()}{mattr} -num-cores={host_cores()}"
    arch = cuda_arch()
    return "cuda" if arch is None else f"cuda -arch={arch}"
