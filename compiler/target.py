"""Targets as data: `TARGETS` holds a `TargetInfo` per target name a job may give (how it resolves to a TVM
target, its key, its device, its vector unit, its default pipeline, the search spaces that apply), and
`target_info` looks one up by name or TVM target, failing loudly. A new target is one `TargetInfo` and one
line in `TARGETS`. "cuda" is not one yet: nothing schedules GPU threads, so it is refused everywhere
(`target_info`, `resolve_target`, `check_available`) until a GPU search space exists.

Host detection, never hard-coded:

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
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import tvm

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
    def bits(self) -> int:
        """The width of one vector register in bits (512 for AVX-512)."""
        return self.lanes * 32

    @property
    def register_tile(self) -> int:
        """fp32 values all registers hold: a register block larger than this spills."""
        return self.registers * self.lanes


AVX512 = VectorUnit(lanes=16, registers=32)
AVX2 = VectorUnit(lanes=8, registers=16)


def vector_unit(target: Any = None) -> VectorUnit:
    """The vector unit of a target (this machine's, as `resolve_target("host")` describes it, when None).

    Raises:
        ValueError: for a target `target_info` does not know (a GPU target: not supported yet).
    """
    if target is None:
        return _host_vector_unit()
    return target_info(target).vector_unit(target)


def _llvm_vector_unit(target: tvm.target.Target) -> VectorUnit:
    """An LLVM target's vector unit, from the CPU features LLVM enables for the target's CPU and `-mattr` (TVM's
    `llvm_get_vector_width` answers 512 for an AVX2 CPU too): x86 with AVX-512 16 lanes and 32 registers
    (zmm0-31), with AVX 8 and 16 (ymm0-15), else 4 and 16 (xmm); AArch64 4 lanes and 32 registers (v0-31)."""
    from tvm.target import codegen  # heavy: the API imports target for its names without TVM

    triple = str(target.attrs.get("mtriple", "") or codegen.llvm_get_system_triple())
    if triple.startswith(("aarch64", "arm64")):
        return VectorUnit(lanes=4, registers=32)
    features = codegen.llvm_get_cpu_features(target)
    if "avx512f" in features:
        return AVX512
    return AVX2 if "avx" in features else VectorUnit(lanes=4, registers=16)


def vector_lanes(target: Any, dtype: str = "float32") -> int:
    """How many `dtype` values one vector register of the target holds (16 for float32 on AVX-512)."""
    import tvm  # heavy: the API imports target for its names without TVM

    return max(1, vector_unit(target).bits // tvm.DataType(dtype).bits)


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
    """The "sm_XY" of CUDA device 0, or None where no CUDA device is visible. Unused until a GPU target is in
    `TARGETS` (cuda is `UNSUPPORTED`): what a cuda `TargetInfo` will resolve with."""
    import tvm  # heavy: the API imports target for its names without TVM

    try:
        dev = tvm.cuda(0)
        if not dev.exist:
            return None
        return "sm_" + str(dev.compute_version).replace(".", "")
    except Exception:  # a TVM built without CUDA raises instead of reporting absence
        return None


class TargetError(ValueError):
    """A target name this machine cannot tune for: unknown, or one not supported yet (a GPU target)."""


def _llvm_config() -> dict:
    config = {"kind": "llvm", "mcpu": host_cpu(), "num-cores": host_cores()}
    if host_mattr():
        config["mattr"] = list(host_mattr())
    return config


def _llvm_key() -> str:
    mattr = f" -mattr={','.join(host_mattr())}" if host_mattr() else ""
    return f"llvm -mcpu={host_cpu()}{mattr} -num-cores={host_cores()}"


@dataclass(frozen=True)
class TargetInfo:
    """What altune knows of one target a job may name.

    Attributes:
        name: the name a job spec gives ("host").
        kind: TVM's target kind ("llvm"); a TVM target of this kind is looked up to the first such entry.
        description: one line for the catalog.
        config: how it resolves: the TVM target's config, detected on this machine (`resolve`).
        key_of: its key in DB rows beside workload keys (`key`); names that compile the same code share it.
        device_type: the device a program built for it runs on (`device`: device 0 of this type).
        vector_unit: its vector unit, from a resolved TVM target (`VectorUnit.bits`: the width in bits).
        pipeline: the TIR pipeline its builds use by default (`compiler.pipeline.Pipeline`).
        spaces: the search spaces that apply to it (`tuner.spaces`' names).
    """

    name: str
    kind: str
    description: str
    config: Callable[[], dict] = field(repr=False)
    key_of: Callable[[], str] = field(repr=False)
    device_type: str
    vector_unit: Callable[[Any], VectorUnit] = field(repr=False)
    pipeline: str = "licm"
    spaces: tuple[str, ...] = ("loop", "fusion", "layout")

    def resolve(self) -> tvm.target.Target:
        """The TVM target (detected CPU and core count; built once per process)."""
        return _resolve(self.name)

    def key(self) -> str:
        """e.g. "llvm -mcpu=znver4 -num-cores=2", "llvm -mcpu=znver4 -mattr=-avx512f,... -num-cores=2" (a CPU
        without some of its model's vector units)."""
        return self.key_of()

    def device(self) -> tvm.runtime.Device:
        """Device 0 of `device_type` (`tvm.cpu(0)` for the CPU)."""
        import tvm  # heavy: the API imports target for its names without TVM

        return tvm.device(self.device_type, 0)

    @property
    def is_cpu(self) -> bool:
        """Whether programs for it run on the CPU: our CPU default schedules and tensor instructions apply."""
        return self.device_type == "cpu"

    def vector_bits(self, target: Any = None) -> int:
        """The width of one vector register in bits, of `target` (this entry resolved, when None)."""
        return self.vector_unit(self.resolve() if target is None else target).bits


_CPU = dict(kind="llvm", config=_llvm_config, key_of=_llvm_key, device_type="cpu", vector_unit=_llvm_vector_unit)
TARGETS: dict[str, TargetInfo] = {
    "host": TargetInfo(name="host", description="this machine's CPU (detected -mcpu, -mattr, cores)", **_CPU),
    "llvm": TargetInfo(name="llvm", description="the same as host: LLVM for this machine's CPU", **_CPU),
}
TARGET_NAMES = tuple(TARGETS)
# target kinds TVM has and altune does not schedule yet -> why
UNSUPPORTED = {"cuda": "nothing schedules GPU threads (no GPU search space yet); use host or llvm"}


def target_info(target: str | tvm.target.Target) -> TargetInfo:
    """The `TargetInfo` of a target name (a job's "host") or of a TVM target (by its kind).

    Raises:
        ValueError: "target cuda is not supported yet: ..." for a kind in `UNSUPPORTED`; "unknown target: ..."
            for anything else not in `TARGETS`.
    """
    if isinstance(target, str):
        name = target
        found = TARGETS.get(name)
    else:
        name = str(target.kind.name)
        found = next((info for info in TARGETS.values() if info.kind == name), None)
    if found is not None:
        return found
    if name in UNSUPPORTED:
        raise ValueError(f"target {name} is not supported yet: {UNSUPPORTED[name]}")
    raise ValueError(f"unknown target: {name!r}; known: {', '.join(TARGETS)}")


def available_targets() -> tuple[str, ...]:
    """The target names this machine can tune and measure for."""
    return TARGET_NAMES


def check_available(name: str) -> None:
    """Raises TargetError, saying what to use instead, unless this machine can serve target `name`."""
    try:
        target_info(name)
    except ValueError as e:
        raise TargetError(str(e)) from None


def resolve_target(name: str) -> tvm.target.Target:
    """Turns a target name from a job spec into a TVM target (`TargetInfo.resolve`).

    Args:
        name: a name in `TARGETS` ("host" or "llvm": this CPU, detected `mcpu`, `mattr` and `num-cores`).

    Returns:
        The target.

    Raises:
        ValueError: for a name not in `TARGETS` (cuda: not supported yet).
    """
    return target_info(name).resolve()


@functools.cache
def _resolve(name: str) -> tvm.target.Target:
    import tvm  # heavy: the API imports target for its names without TVM

    return tvm.target.Target(TARGETS[name].config())


def target_key(name: str) -> str:
    """A stable string for a target name, stored in DB rows beside workload keys (`TargetInfo.key`).

    "host" and "llvm" give the same key, since they compile the same code.

    Raises:
        ValueError: for a name not in `TARGETS`.
    """
    return target_info(name).key()
