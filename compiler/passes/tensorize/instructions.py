"""The tensor instructions of CPUs, each with what it computes and the target features it needs; an instruction
is offered to a target only when LLVM enables every feature it needs for that target (`-mcpu`, `-mattr`).

Every instruction here is a micro-kernel step `acc[l] += sum_g A[g] * B[l, g]` for `l < lanes`, `g < group`:
the accumulator is a vector of `lanes` elements of `c_dtype`, `A` a group of `group` elements broadcast to every
lane, `B` `lanes * group` contiguous elements. fp32 FMA is the group-1 case (an outer-product step).

| name               | A x B -> C        | lanes x group | needs                 | instruction             |
|--------------------|-------------------|---------------|-----------------------|-------------------------|
| fma_f32_avx512     | f32 x f32 -> f32  | 16 x 1        | avx512f               | vfmadd231ps zmm         |
| fma_f32_avx2       | f32 x f32 -> f32  | 8 x 1         | avx2, fma             | vfmadd231ps ymm         |
| fma_f32_neon       | f32 x f32 -> f32  | 4 x 1         | aarch64 neon          | fmla v.4s               |
| dot_u8i8_vnni512   | u8 x i8 -> i32    | 16 x 4        | avx512vnni            | vpdpbusd zmm            |
| dot_u8i8_avxvnni   | u8 x i8 -> i32    | 8 x 4         | avxvnni               | {vex} vpdpbusd ymm      |
| dot_u8i8_wd512     | u8 x i8 -> i32    | 16 x 2        | avx512bw              | vpmovsxbw + vpmaddwd zmm|
| dot_u8i8_wd256     | u8 x i8 -> i32    | 8 x 2         | avx2                  | vpmovsxbw + vpmaddwd ymm|
| dot_u8i8_avx512bw  | u8 x i8 -> i32    | 16 x 4        | avx512bw              | vpmaddubsw + vpmaddwd   |
| dot_u8i8_avx2      | u8 x i8 -> i32    | 8 x 4         | avx2                  | vpmaddubsw + vpmaddwd   |
| dot_i8i8_sdot      | i8 x i8 -> i32    | 4 x 4         | aarch64 dotprod       | sdot v.4s               |
| dot_bf16_avx512bf16| bf16 x bf16 -> f32| 16 x 2        | avx512bf16            | vdpbf16ps zmm           |
| dot_bf16_fma512    | bf16 x bf16 -> f32| 16 x 2        | avx512f, fma          | vpslld/vpandd + 2 vfmadd|
| dot_bf16_fma256    | bf16 x bf16 -> f32| 8 x 2         | avx2, fma             | vpslld/vpand + 2 vfmadd |

`vpmaddubsw` adds two u8 x i8 products into an int16 with saturation: the pair sum of `a0*b0 + a1*b1` is exact
only while it stays within int16, which holds for activations below 128 (7-bit quantization, what oneDNN
asks of this path on CPUs without VNNI) and not for all of uint8 (255 * -128 * 2 < -32768). TVM's own
AVX-512 int8 intrinsic has the same property. The VNNI instructions accumulate into int32 and are exact.
The `wd` forms are the exact int8 dot product of CPUs without VNNI: a pair of activations is widened to two
int16 once per broadcast, each weight vector sign-extended as it is loaded (`vpmovsxbw`), and `vpmaddwd`
adds the two int16 x int16 products of each pair into int32 lanes, exactly (at most 2 * 255 * 128). Half the
group of `vpmaddubsw`, twice the multiply-adds per instruction of fp32 FMA (on znver3 a 512^3 GEMM runs level
with fp32: 159 GOP/s, fp32 156-177, `vpmaddubsw` 311-364); what a full-range uint8 program (a quantized
model's) gets on AVX2 and on AVX-512 without VNNI.

bf16: AVX512_BF16's `vdpbf16ps` takes `<32 x bfloat>` operands in LLVM (the signature of LLVM 18 on; older LLVMs
get the widened form below); TVM 0.27's LLVM code
generator crashes (segfault) on a `bfloat16x32` call operand, and its BF16 legalization turns bf16 values into
fp32 before code generation anyway, so TIR cannot call it directly. `dot_bf16_avx512bf16` calls a function of
our own instead, `altune_dpbf16ps_512(<16 x float>, <16 x i32>, <16 x i32>)`, written in LLVM IR
(`Instruction.llvm_ir`): it bitcasts the 32-bit words (two bf16 each) to `<32 x bfloat>` and calls the
intrinsic. The tensorize pass hands that IR to TVM's code generator (the `pragma_import_llvm` attribute),
which links it into the module as always-inline, so the kernel holds `vdpbf16ps` itself, no call. Like the
instruction, it rounds nothing but the sums, in fp32 (denormal inputs and results flushed to zero).
Elsewhere the bf16 instructions widen instead: a bf16 is the high half of an fp32, so each pair is split out
of its 32-bit word by one shift and one mask and multiplied by fp32 FMA (exact products, fp32 sums, the way
oneDNN runs bf16 on AVX-512 without BF16). The bf16 data stays bf16 in memory (half the bytes of fp32).

Layering: `compiler` never imports `tuner` or `service`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import tvm
from tvm import tirx
from tvm.target import codegen

from compiler.target import target_info


@dataclass(frozen=True)
class Instruction:
    """One micro-kernel step of a CPU (see the module docstring).

    Attributes:
        name: short unique name.
        a_dtype, b_dtype, c_dtype: the operand and accumulator types.
        lanes: accumulator lanes (elements of `c_dtype` in one register).
        group: elements of A and B summed into each lane per step.
        arch: "x86" or "aarch64".
        needs: LLVM features that must all be enabled for the target.
        exact: False where the instruction saturates (see the module docstring).
        min_llvm: the oldest LLVM whose intrinsic has the operand types `emit` and `llvm_ir` use.
    """

    name: str
    a_dtype: str
    b_dtype: str
    c_dtype: str
    lanes: int
    group: int
    arch: str
    needs: tuple[str, ...]
    exact: bool = True
    min_llvm: int = 0

    @property
    def llvm_ir(self) -> str | None:
        """LLVM IR that defines the function `emit` calls, for the code generator to link in (module docstring);
        None where `emit` uses LLVM intrinsics directly."""
        if self.name != "dot_bf16_avx512bf16":
            return None
        return _DPBF16PS_512

    def emit(self, acc: Any, a: Any, b: Any) -> Any:
        """The expression `acc + A x B` of one step.

        Args:
            acc: the accumulator, `c_dtype x lanes`.
            a: the group of A: a scalar (`group` 1) or `a_dtype x group`.
            b: `b_dtype x (lanes * group)`, lane-major (`B[l, g]` at `l * group + g`).
        """
        call = tvm.tirx.call_llvm_pure_intrin
        vec = f"{self.c_dtype}x{self.lanes}"
        if self.group == 1:
            return call(vec, "llvm.fma", tirx.Broadcast(a, self.lanes), b, acc)
        if self.name.startswith("dot_u8i8_wd"):
            # the pair as two int16 in one 32-bit word, broadcast; the weights sign-extended to int16
            pairs = _reinterpret(tirx.Broadcast(tirx.reinterpret("uint16", a), self.lanes), f"uint8x{2 * self.lanes}")
            wide = tirx.Cast(f"int16x{2 * self.lanes}", pairs)
            sums = call(vec, "llvm.x86.avx512.pmaddw.d.512" if self.lanes == 16 else "llvm.x86.avx2.pmadd.wd",
                        wide, tirx.Cast(f"int16x{2 * self.lanes}", b))
            return acc + sums
        word = tirx.reinterpret("int32", a)  # the group as one 32-bit word
        words = tirx.Broadcast(word, self.lanes)
        if self.name == "dot_bf16_avx512bf16":
            return tvm.tirx.call_pure_extern(vec, _DPBF16PS_512_NAME, acc, words,
                                             _reinterpret(b, f"int32x{self.lanes}"))
        if self.name.startswith("dot_u8i8_vnni") or self.name == "dot_u8i8_avxvnni":
            intrin = "llvm.x86.avx512.vpdpbusd.512" if self.lanes == 16 else "llvm.x86.avx512.vpdpbusd.256"
            if _vnni_takes_bytes():
                return call(vec, intrin, acc, _reinterpret(words, f"uint8x{4 * self.lanes}"), b)
            return call(vec, intrin, acc, words, _reinterpret(b, f"int32x{self.lanes}"))
        if self.name.startswith("dot_u8i8_avx"):
            n = self.lanes * 4
            pairs = call(f"int16x{2 * self.lanes}",
                         "llvm.x86.avx512.pmaddubs.w.512" if self.lanes == 16 else "llvm.x86.avx2.pmadd.ub.sw",
                         _reinterpret(words, f"uint8x{n}"), b)
            sums = call(vec, "llvm.x86.avx512.pmaddw.d.512" if self.lanes == 16 else "llvm.x86.avx2.pmadd.wd",
                        pairs, tirx.Broadcast(tirx.const(1, "int16"), 2 * self.lanes))
            return acc + sums
        if self.name == "dot_i8i8_sdot":
            return call(vec, "llvm.aarch64.neon.sdot", acc, _reinterpret(words, "int8x16"), b)
        if self.name.startswith("dot_bf16_fma"):
            # a bf16 is the upper half of an fp32: of each 32-bit word (two bf16, element 0 low), `w << 16`
            # is the first as fp32 and `w & 0xffff0000` the second; then two exact-input fp32 FMAs
            b_words = _reinterpret(b, f"int32x{self.lanes}")
            shift = tirx.Broadcast(tirx.const(16, "int32"), self.lanes)
            high = tirx.Broadcast(tirx.const(-65536, "int32"), self.lanes)
            f32 = f"float32x{self.lanes}"
            first = call(vec, "llvm.fma", _reinterpret(tirx.shift_left(words, shift), f32),
                         _reinterpret(tirx.shift_left(b_words, shift), f32), acc)
            return call(vec, "llvm.fma", _reinterpret(tirx.bitwise_and(words, high), f32),
                        _reinterpret(tirx.bitwise_and(b_words, high), f32), first)
        raise AssertionError(f"no emitter for {self.name}")


_DPBF16PS_512_NAME = "altune_dpbf16ps_512"
_DPBF16PS_512 = f"""
declare <16 x float> @llvm.x86.avx512bf16.dpbf16ps.512(<16 x float>, <32 x bfloat>, <32 x bfloat>)
define <16 x float> @{_DPBF16PS_512_NAME}(<16 x float> %acc, <16 x i32> %a, <16 x i32> %b) {{
  %x = bitcast <16 x i32> %a to <32 x bfloat>
  %y = bitcast <16 x i32> %b to <32 x bfloat>
  %r = call <16 x float> @llvm.x86.avx512bf16.dpbf16ps.512(<16 x float> %acc, <32 x bfloat> %x, <32 x bfloat> %y)
  ret <16 x float> %r
}}
"""


def _vnni_takes_bytes() -> bool:
    """LLVM 21 retyped vpdpbusd's operands from <N x i32> to <4N x i8>."""
    return int(codegen.llvm_version_major()) >= 21


def _reinterpret(e: Any, dtype: str) -> Any:
    return tirx.reinterpret(dtype, e)


INSTRUCTIONS: tuple[Instruction, ...] = (
    # preference order within a (dtypes) class: widest and exact first
    Instruction("fma_f32_avx512", "float32", "float32", "float32", 16, 1, "x86", ("avx512f", "fma")),
    Instruction("fma_f32_avx2", "float32", "float32", "float32", 8, 1, "x86", ("avx2", "fma")),
    Instruction("fma_f32_neon", "float32", "float32", "float32", 4, 1, "aarch64", ("neon",)),
    Instruction("dot_u8i8_vnni512", "uint8", "int8", "int32", 16, 4, "x86", ("avx512vnni", "avx512bw")),
    Instruction("dot_u8i8_avxvnni", "uint8", "int8", "int32", 8, 4, "x86", ("avxvnni",)),
    Instruction("dot_u8i8_wd512", "uint8", "int8", "int32", 16, 2, "x86", ("avx512bw",)),
    Instruction("dot_u8i8_wd256", "uint8", "int8", "int32", 8, 2, "x86", ("avx2",)),
    Instruction("dot_u8i8_avx512bw", "uint8", "int8", "int32", 16, 4, "x86", ("avx512bw",), exact=False),
    Instruction("dot_u8i8_avx2", "uint8", "int8", "int32", 8, 4, "x86", ("avx2",), exact=False),
    Instruction("dot_i8i8_sdot", "int8", "int8", "int32", 4, 4, "aarch64", ("dotprod",)),
    Instruction("dot_bf16_avx512bf16", "bfloat16", "bfloat16", "float32", 16, 2, "x86", ("avx512bf16",),
                min_llvm=18),
    Instruction("dot_bf16_fma512", "bfloat16", "bfloat16", "float32", 16, 2, "x86", ("avx512f", "fma")),
    Instruction("dot_bf16_fma256", "bfloat16", "bfloat16", "float32", 8, 2, "x86", ("avx2", "fma")),
)


def target_arch(target: tvm.target.Target) -> str:
    """"x86", "aarch64" or "other" for an LLVM target."""
    triple = str(target.attrs.get("mtriple", "") or codegen.llvm_get_system_triple())
    if triple.startswith(("aarch64", "arm64")):
        return "aarch64"
    return "x86" if triple.startswith(("x86_64", "i686", "i386")) else "other"


def target_features(target: tvm.target.Target) -> frozenset[str]:
    """The CPU features LLVM enables for `target` (its `-mcpu` and `-mattr`)."""
    features = frozenset(str(f) for f in codegen.llvm_get_cpu_features(target))
    if target_arch(target) == "aarch64":
        features |= {"neon"}  # AArch64 always has Advanced SIMD; LLVM names it "neon" only sometimes
    return features


def available(target: tvm.target.Target) -> tuple[Instruction, ...]:
    """The instructions `target` has, in preference order."""
    if not target_info(target).is_cpu:
        return ()

    arch, features = target_arch(target), target_features(target)
    llvm = int(codegen.llvm_version_major())
    return tuple(i for i in INSTRUCTIONS
                 if i.arch == arch and all(f in features for f in i.needs) and llvm >= i.min_llvm)


def candidates_for(target: tvm.target.Target, a_dtype: str, b_dtype: str, c_dtype: str, group: int | None = None,
                   exact: bool = False) -> tuple[Instruction, ...]:
    """The instructions of `target` for these operand types (and group size, where given), preferred first.

    Args:
        exact: take only instructions that never saturate.
    """
    return tuple(ins for ins in available(target)
                 if (ins.a_dtype, ins.b_dtype, ins.c_dtype) == (a_dtype, b_dtype, c_dtype)
                 and (group is None or ins.group == group) and (ins.exact or not exact))


def choose(target: tvm.target.Target, a_dtype: str, b_dtype: str, c_dtype: str, group: int | None = None,
           exact: bool = False) -> Instruction | None:
    """The preferred instruction of `target` for these operand types (and group size, where given), or None.

    Args:
        exact: take only instructions that never saturate.
    """
    found = candidates_for(target, a_dtype, b_dtype, c_dtype, group, exact)
    return found[0] if found else None

