"""Tensorization with loop partitioning (`compiler.passes.tensorize`): the paper's MEMCPY example partitions
as the paper shows; GEMM, conv2d and element-wise operators on shapes that do not divide the instruction
compute what numpy computes with the instructions in the code; a target without a feature never gets the
instruction; AArch64 gets NEON FMA and SDOT (cross-compiled, not run)."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import tirx
from tvm.script import tirx as T

from compiler.build import compile_module
from compiler.passes.tensorize import (
    ANNOTATION,
    available,
    eliminate_conditions,
    kernels,
    lower,
    partition,
    tensorize_module,
    without_tensorize,
)
from compiler import tir_util

ml_dtypes = pytest.importorskip("ml_dtypes")

HASWELL = {"kind": "llvm", "mcpu": "haswell"}  # AVX2 + FMA, no AVX-512, no VNNI
GENERIC = {"kind": "llvm", "mcpu": "x86-64"}  # SSE2 only
CASCADELAKE = {"kind": "llvm", "mcpu": "cascadelake"}  # AVX-512 VNNI
ALDERLAKE = {"kind": "llvm", "mcpu": "alderlake"}  # AVX-VNNI (VEX, ymm), no AVX-512
AARCH64 = {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon", "+dotprod"]}


def _host_has(flag: str) -> bool:
    """Whether the host target has the feature (/proc/cpuinfo's name): what this machine runs and "host"
    targets (less under `ALTUNE_HOST_CPU`)."""
    from tvm.target import codegen

    from compiler.target import resolve_target

    return flag.replace("_", "") in codegen.llvm_get_cpu_features(resolve_target("host"))


# ---------------------------------------------------------------------------
# Alg. 2: the paper's MEMCPY example (Sec. IV-C): (H, W) = (4, 14) copied by 4 cores in slices of 4


@T.prim_func
def memcpy(A: T.Buffer((56,), "float32"), AL: T.Buffer((16,), "float32")):
    tid = T.launch_thread("threadIdx.x", 4)
    for i in T.serial(4, annotations={"altune.tensorize": "auto"}):
        for j in range(4):
            if tid * 4 + j < 14:
                AL[i * 4 + j] = A[i * 14 + tid * 4 + j]


def _ifs(s):
    return [x for x in tir_util.walk(s) if isinstance(x, tirx.IfThenElse)]


def _loops(s):
    return {x.loop_var.name: (int(x.min), int(x.extent)) for x in tir_util.walk(s) if isinstance(x, tirx.For)}


def test_memcpy_partitions_as_the_paper_shows():
    out = partition(memcpy).body
    assert isinstance(out, tirx.AttrStmt) and out.attr_key == "thread_extent"
    branch = out.body
    assert isinstance(branch, tirx.IfThenElse), out
    assert str(branch.condition) == "tid < 3", branch.condition
    # tid < 3: the whole slice is inside the data, the branch is gone
    assert _ifs(branch.then_case) == [] and _loops(branch.then_case) == {"i": (0, 4), "j": (0, 4)}
    # tid >= 3: j < 2 is true on [0, 2) and false on [2, 4): the loop shrinks to 2 and the branch is gone
    assert _ifs(branch.else_case) == [] and _loops(branch.else_case) == {"i": (0, 4), "j": (0, 2)}
    marked = [x for x in tir_util.walk(out) if isinstance(x, tirx.For) and ANNOTATION in x.annotations]
    assert len(marked) == 2, "each piece keeps the mark"


def test_eliminate_conditions_decides_by_ranges():
    j = tirx.Var("j", "int32")
    store = tirx.BufferStore(memcpy.params[1], tirx.const(0.0, "float32"), [j])
    body = tirx.For(j, 0, 4, tirx.ForKind.SERIAL, tirx.IfThenElse(j < 6, store, None))
    assert _ifs(eliminate_conditions(body, {})) == []
    never = tirx.For(j, 0, 4, tirx.ForKind.SERIAL, tirx.IfThenElse(j > 9, store, None))
    assert tir_util.is_noop(eliminate_conditions(never, {}))


def _gemm_mod(m, n, k, dtype, target, marked=True, exact=True):
    blk = kernels.blocking(target, dtype, exact)
    types = kernels.operands(target, dtype)
    func = kernels.gemm(m, n, k, dtype, blk.lanes, types=types, group=blk.group)
    return kernels.schedule_gemm(func, blk, marked), blk


def test_partition_leaves_the_main_part_without_branches(host_target):
    mod, blk = _gemm_mod(55, 55, 64, "float32", host_target)
    func = partition(lower(mod)["main"])
    marked = [x for x in tir_util.walk(func.body) if isinstance(x, tirx.For) and ANNOTATION in x.annotations]
    # rows 55 = 4 x 12 + 7 on AVX-512 (11 x 5 on AVX2), columns 55 = 32 + 23 (48 + 7): a main part and a
    # remainder of the columns, of the rows where they do not divide; none with a branch inside
    assert len(marked) == 2 * (2 if 55 % blk.rows else 1), func.script()
    assert all(_ifs(x) == [] for x in marked)
    lane = [x.loop_var.name for x in tir_util.walk(marked[0]) if isinstance(x, tirx.For)][-1]
    lane_extents = {int(x.extent) for m in marked for x in tir_util.walk(m) if isinstance(x, tirx.For)
                    and x.loop_var.name == lane}
    assert lane_extents == {blk.lanes, 55 % blk.lanes}, lane_extents


def test_partition_of_every_loop_computes_what_the_loops_computed(host_target):
    shape = (3, 55)
    mod = kernels.schedule_elementwise(kernels.elementwise("add", shape), 16, marked=False)
    lowered = lower(tvm.tirx.transform.BindTarget(host_target)(mod))["main"]
    assert _ifs(lowered.body), "the split left a guard"
    parted = partition(lowered, marked_only=False)
    assert partition(lowered) is lowered, "nothing marked: nothing to do"
    assert not _ifs(parted.body), parted.script()
    rng = np.random.default_rng(6)
    x, y = (rng.standard_normal(shape).astype(np.float32) for _ in range(2))
    got, _ = _run(tvm.IRModule({"main": parted}), host_target, [x, y], shape, "float32")
    np.testing.assert_array_equal(got, x + y)


def test_align_expands_scratch_buffers_a_marked_nest_touches():
    from compiler.passes.tensorize.preprocess import expand_allocations

    @T.prim_func
    def scratch(A: T.Buffer((4, 13), "float32"), B: T.Buffer((4, 13), "float32")):
        S = T.alloc_buffer((4, 13), "float32")
        for i in T.serial(4, annotations={"altune.tensorize": "auto"}):
            for j in range(13):
                S[i, j] = A[i, j] * T.float32(2)
        for i, j in T.grid(4, 13):
            B[i, j] = S[i, j]

    out = expand_allocations(lower(tvm.IRModule({"main": scratch}))["main"], 16)
    allocs = [x for x in tir_util.walk(out.body) if isinstance(x, tirx.AllocBuffer)]
    assert [list(map(int, a.buffer.shape)) for a in allocs] == [[4, 16]], out.script()
    a = np.arange(52, dtype=np.float32).reshape(4, 13)
    got, _ = _run(tvm.IRModule({"main": out}), tvm.target.Target(HASWELL), [a], (4, 13), "float32")
    np.testing.assert_array_equal(got, 2 * a)


# ---------------------------------------------------------------------------
# numerical equality on shapes that do not divide the instruction


def _gemm_data(m, n, k, dtype, types, rng, unsigned_max=256):
    a_t, b_t, _ = types
    if dtype == "int8":
        a = rng.integers(0 if a_t == "uint8" else -128, unsigned_max if a_t == "uint8" else 128, (m, k)).astype(a_t)
        b = rng.integers(-128, 128, (k, n)).astype(b_t)
        return a, b, a.astype(np.int64) @ b.astype(np.int64)
    np_t = np.float32 if dtype == "float32" else ml_dtypes.bfloat16
    a = rng.standard_normal((m, k)).astype(np_t)
    b = rng.standard_normal((k, n)).astype(np_t)
    return a, b, a.astype(np.float64) @ b.astype(np.float64)


def _run(mod, target, args, out_shape, out_dtype):
    lib = compile_module(mod, target)
    out = tvm.runtime.tensor(np.zeros(out_shape, out_dtype))
    lib.jit()["main"](*[tvm.runtime.tensor(a) for a in args], out)
    return out.numpy(), lib


def _check(got, ref, dtype):
    if dtype == "int8":
        np.testing.assert_array_equal(got, ref)
    else:
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-3 * np.abs(ref).max())


@pytest.mark.parametrize("dtype", ["float32", "int8", "bfloat16"])
def test_gemm_non_divisible_equals_numpy(dtype, host_target):
    m, n, k = 55, 127, 255
    mod, blk = _gemm_mod(m, n, k, dtype, host_target)
    types = kernels.operands(host_target, dtype)
    _, report = tensorize_module(tvm.tirx.transform.BindTarget(host_target)(mod))
    assert report["main"].used, report
    # the lane remainder (127 = 7 x 16 + 15) is tensorized too (a whole vector on B's padding), and so is the
    # reduction's group remainder (255 = 63 x 4 + 3, or 127 x 2 + 1 for pairs): the reduction runs over a
    # zero-padded copy of A's whole groups (COM), so no nest is left
    assert report["main"].left == [], report
    assert (dtype == "float32") == ("A_pad" not in mod.script()), mod.script()
    a, b, ref = _gemm_data(m, n, k, dtype, types, np.random.default_rng(0))
    got, _ = _run(mod, host_target, [a, kernels.pack_gemm_weight(b, blk.lanes, blk.group)], (m, n), types[2])
    _check(got, ref, dtype)


@pytest.mark.parametrize("dtype", ["float32", "int8", "bfloat16"])
def test_one_row_without_a_rows_loop_is_tensorized(dtype, host_target):
    """A one-row GEMM (a batch-1 linear) scheduled without a rows loop: the columns sit right under the marked
    reduction, and the micro-kernel takes them as one row."""
    from tvm import s_tir

    blk = kernels.blocking(host_target, dtype, exact=True)
    types = kernels.operands(host_target, dtype)
    n, k = 100, 255
    sch = s_tir.Schedule(kernels.gemm(1, n, k, dtype, blk.lanes, types=types, group=blk.group))
    c = sch.get_sblock("C")
    i, j, r = sch.get_loops(c)
    jo, jl = sch.split(j, [None, blk.lanes])
    if blk.group > 1:
        ro, rg = sch.split(r, [None, blk.group])
        sch.reorder(jo, i, ro, jl, rg)
    else:
        ro = r
        sch.reorder(jo, i, ro, jl)
    sch.decompose_reduction(c, ro)
    kernels.mark(sch, ro, "outer_product")
    _, report = tensorize_module(tvm.tirx.transform.BindTarget(host_target)(sch.mod))
    assert report["main"].used and not report["main"].left, report
    a, b, ref = _gemm_data(1, n, k, dtype, types, np.random.default_rng(10))
    got, _ = _run(sch.mod, host_target, [a, kernels.pack_gemm_weight(b, blk.lanes, blk.group)], (1, n), types[2])
    _check(got, ref, dtype)


@pytest.mark.parametrize("dtype", ["float32", "int8", "bfloat16"])
def test_conv2d_255_channels_equals_numpy(dtype, host_target):
    n, h, w, c, f, kh = 1, 11, 11, 255, 127, 3
    blk = kernels.blocking(host_target, dtype, exact=True)
    types = kernels.operands(host_target, dtype)
    func = kernels.conv2d(n, h, w, c, f, kh, dtype, blk.lanes, types=types, group=blk.group)
    mod = kernels.schedule_conv2d(func, blk)
    _, report = tensorize_module(tvm.tirx.transform.BindTarget(host_target)(mod))
    # 255 channels padded to whole groups with the input (COM): no group remainder left scalar
    assert report["main"].used and report["main"].left == [], report
    rng = np.random.default_rng(1)
    if dtype == "int8":
        x = rng.integers(0, 256, (n, h, w, c)).astype(types[0])
        wt = rng.integers(-128, 128, (kh, kh, c, f)).astype(types[1])
    else:
        np_t = np.float32 if dtype == "float32" else ml_dtypes.bfloat16
        x = rng.standard_normal((n, h, w, c)).astype(np_t)
        wt = rng.standard_normal((kh, kh, c, f)).astype(np_t)
    xp = np.pad(x.astype(np.float64), ((0, 0), (1, 1), (1, 1), (0, 0)))
    ref = sum(np.einsum("nhwc,cf->nhwf", xp[:, i:i + h, j:j + w, :], wt[i, j].astype(np.float64))
              for i in range(kh) for j in range(kh))
    weight = kernels.pack_conv_weight(wt, blk.lanes, blk.group)
    got, _ = _run(mod, host_target, [x, weight], (n, h, w, f), types[2])
    _check(got, ref.astype(np.int64) if dtype == "int8" else ref, dtype)


@pytest.mark.parametrize("op", kernels.ELEMENTWISE)
def test_elementwise_non_divisible_equals_numpy(op, host_target):
    shape = (7, 55, 55)
    mod = kernels.schedule_elementwise(kernels.elementwise(op, shape), 16)
    _, report = tensorize_module(tvm.tirx.transform.BindTarget(host_target)(mod))
    assert report["main"].used == ["elementwise"], report
    rng = np.random.default_rng(2)
    xs = [rng.standard_normal(shape).astype(np.float32) for _ in range(1 if op == "relu" else 2)]
    ref = {"add": np.add, "sub": np.subtract, "mul": np.multiply}[op](*xs) if op != "relu" else np.maximum(xs[0], 0)
    got, _ = _run(mod, host_target, xs, shape, "float32")
    np.testing.assert_array_equal(got, ref)


def test_without_partition_the_branches_block_the_match(host_target):
    mod, _ = _gemm_mod(55, 55, 64, "float32", host_target)
    mod = tvm.tirx.transform.BindTarget(host_target)(mod)
    _, full = tensorize_module(mod)
    main = mod["main"]
    _, none = tensorize_module(tvm.IRModule({"main": without_tensorize(main, "no-partition")}))
    assert full["main"].used and not none["main"].used, (full, none)
    _, off = tensorize_module(tvm.IRModule({"main": without_tensorize(main, "off")}))
    assert off == {}


def test_a_nest_that_does_not_match_is_left_alone(host_target):
    from tvm import s_tir

    func = kernels.gemm(20, 20, 8, "float32", 16, packed=False)
    sch = s_tir.Schedule(func)
    i, j, k = sch.get_loops(sch.get_sblock("C"))
    kernels.mark(sch, i, "outer_product")  # rows around lanes around the reduction: not the pattern
    _, report = tensorize_module(tvm.tirx.transform.BindTarget(host_target)(sch.mod))
    assert report["main"].used == [] and len(report["main"].left) == 1, report
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((20, 8)).astype(np.float32), rng.standard_normal((8, 20)).astype(np.float32)
    got, _ = _run(sch.mod, host_target, [a, b], (20, 20), "float32")
    np.testing.assert_allclose(got, a @ b, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------
# instructions by target feature


def _asm(lib):
    return lib.mod.inspect_source("asm")


def test_avx2_target_never_gets_avx512_or_vnni_and_still_computes(host_target):
    target = tvm.target.Target(HASWELL)
    names = {i.name for i in available(target)}
    assert names == {"fma_f32_avx2", "dot_u8i8_wd256", "dot_u8i8_avx2", "dot_bf16_fma256"}, names
    m, n, k = 23, 37, 61
    mod, blk = _gemm_mod(m, n, k, "int8", target, exact=False)
    assert blk.lanes == 8
    # vpmaddubsw saturates int16 pair sums: exact for activations below 128 (see instructions.py)
    a, b, ref = _gemm_data(m, n, k, "int8", kernels.OPERANDS["int8"], np.random.default_rng(4), unsigned_max=128)
    got, lib = _run(mod, target, [a, kernels.pack_gemm_weight(b, 8, 4)], (m, n), "int32")
    np.testing.assert_array_equal(got, ref)
    asm = _asm(lib)
    assert "vpmaddubsw" in asm and "vpdpbusd" not in asm and "zmm" not in asm


@pytest.mark.parametrize("mcpu,zmm", [("haswell", False), ("skylake-avx512", True)])
def test_without_vnni_full_range_uint8_gets_the_exact_pairs(mcpu, zmm, host_target):
    # vpmaddubsw saturates on activations >= 128; the exact form of a CPU without VNNI is vpmaddwd on pairs
    # sign-extended to int16 (what a quantized model's full-range uint8 data gets)
    from compiler.workloads.model.layouts import dot_instruction

    target = tvm.target.Target({"kind": "llvm", "mcpu": mcpu})
    lanes = 16 if zmm else 8
    assert dot_instruction(target) == (lanes, 2)
    mod, blk = _gemm_mod(19, 45, 131, "int8", target)
    assert (blk.lanes, blk.group) == (lanes, 2)
    _, report = tensorize_module(tvm.tirx.transform.BindTarget(target)(mod))
    assert f"dot_u8i8_wd{32 * lanes}" in report["main"].used, report
    # a remainder of the lanes may take the 8-lane pairs; never the saturating vpmaddubsw
    assert set(report["main"].used) <= {"dot_u8i8_wd512", "dot_u8i8_wd256"}, report
    lib = compile_module(mod, target)
    asm = _asm(lib)
    assert "vpmaddwd" in asm and "vpmaddubsw" not in asm and "vpdpbusd" not in asm
    assert ("zmm" in asm) == zmm
    if zmm and not _host_has("avx512bw"):
        return
    a, b, ref = _gemm_data(19, 45, 131, "int8", kernels.OPERANDS["int8"], np.random.default_rng(8))
    assert a.max() >= 250 and b.min() == -128
    out = tvm.runtime.tensor(np.zeros((19, 45), "int32"))
    lib.jit()["main"](tvm.runtime.tensor(a), tvm.runtime.tensor(kernels.pack_gemm_weight(b, lanes, 2)), out)
    np.testing.assert_array_equal(out.numpy(), ref)


def test_generic_x86_gets_no_instruction():
    target = tvm.target.Target(GENERIC)
    assert available(target) == ()
    mod, _ = _gemm_mod(16, 16, 16, "float32", target)
    _, report = tensorize_module(tvm.tirx.transform.BindTarget(target)(mod))
    assert report["main"].used == [] and "no instruction" in report["main"].left[0], report
    assert "vfmadd" not in _asm(compile_module(mod, target))


def test_vnni_target_gets_vpdpbusd():
    target = tvm.target.Target(CASCADELAKE)
    assert "dot_u8i8_vnni512" in {i.name for i in available(target)}
    mod, _ = _gemm_mod(17, 33, 64, "int8", target)
    assert "vpdpbusd" in _asm(compile_module(mod, target))


def test_avxvnni_target_gets_the_vex_form_without_avx512():
    target = tvm.target.Target(ALDERLAKE)
    assert [i.name for i in available(target) if i.a_dtype == "uint8"][0] == "dot_u8i8_avxvnni"
    mod, blk = _gemm_mod(17, 33, 64, "int8", target)
    assert blk.lanes == 8
    asm = _asm(compile_module(mod, target))
    assert "{vex}\tvpdpbusd" in asm and "zmm" not in asm


@pytest.mark.parametrize("mcpu,has", [("cascadelake", False), ("cooperlake", True), ("znver4", True)])
def test_avx512_bf16_targets_get_vdpbf16ps_through_our_llvm_function(mcpu, has):
    # vdpbf16ps is called through LLVM IR of ours that TVM links in and inlines (instructions.py); a CPU without
    # AVX512_BF16 gets the widened pairs instead
    target = tvm.target.Target({"kind": "llvm", "mcpu": mcpu})
    assert ("dot_bf16_avx512bf16" in {i.name for i in available(target)}) == has
    mod, blk = _gemm_mod(21, 40, 70, "bfloat16", target)
    assert (blk.lanes, blk.group) == (16, 2)
    out, report = tensorize_module(tvm.tirx.transform.BindTarget(target)(mod))
    assert report["main"].used[0] == ("dot_bf16_avx512bf16" if has else "dot_bf16_fma512"), report
    assert ("pragma_import_llvm" in out["main"].script()) == has
    lib = compile_module(mod, target)
    asm = _asm(lib)
    assert ("vdpbf16ps" in asm) == has and "altune_dpbf16ps" not in asm  # inlined, no call
    if not _host_has("avx512f") or (has and not _host_has("avx512_bf16")):
        return  # this CPU cannot run the program (an AVX2 one: an illegal instruction ended the test process)
    a, b, ref = _gemm_data(21, 40, 70, "bfloat16", kernels.OPERANDS["bfloat16"], np.random.default_rng(9))
    out = tvm.runtime.tensor(np.zeros((21, 40), "float32"))
    lib.jit()["main"](tvm.runtime.tensor(a), tvm.runtime.tensor(kernels.pack_gemm_weight(b, 16, 2)), out)
    _check(out.numpy(), ref, "bfloat16")


@pytest.mark.skipif(not _host_has("avx512_vnni"), reason="this machine has no AVX-512 VNNI")
def test_vnni_runs_exact_on_full_uint8(host_target):
    # 40 columns = 32 + 8: the 8-lane remainder must not go to the saturating 8-lane vpmaddubsw (LAYOUT
    # replaces an instruction only by an equivalent one)
    mod, blk = _gemm_mod(19, 40, 130, "int8", host_target)
    _, report = tensorize_module(tvm.tirx.transform.BindTarget(host_target)(mod))
    # an 8-lane remainder may take AVX-VNNI's ymm form where the CPU has it: exact too
    assert "dot_u8i8_vnni512" in report["main"].used, report
    assert set(report["main"].used) <= {"dot_u8i8_vnni512", "dot_u8i8_avxvnni"}, report
    a, b, ref = _gemm_data(19, 40, 130, "int8", kernels.OPERANDS["int8"], np.random.default_rng(5))
    got, lib = _run(mod, host_target, [a, kernels.pack_gemm_weight(b, blk.lanes, blk.group)], (19, 40), "int32")
    np.testing.assert_array_equal(got, ref)
    assert "vpdpbusd" in _asm(lib) and "vpmaddubsw" not in _asm(lib)


@pytest.mark.parametrize("dtype,instruction", [("float32", "fmla"), ("int8", "sdot")])
def test_aarch64_cross_compiles_to_neon(dtype, instruction):
    target = tvm.target.Target(AARCH64)
    mod, blk = _gemm_mod(13, 20, 36, dtype, target)
    assert blk.lanes == 4
    _, report = tensorize_module(tvm.tirx.transform.BindTarget(target)(mod))
    assert set(report["main"].used) == {"fma_f32_neon" if dtype == "float32" else "dot_i8i8_sdot"}, report
    assert instruction in _asm(compile_module(mod, target)), instruction
    no_dot = tvm.target.Target({"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon", "-dotprod"]})
    if dtype == "int8":
        mod, _ = _gemm_mod(13, 20, 36, dtype, no_dot)
        assert "sdot" not in tvm.compile(mod, target=no_dot).mod.inspect_source("asm")


def test_a_mark_on_any_loop_keeps_the_result_exact(host_target):
    from tvm import s_tir

    blk = kernels.blocking(host_target, "int8", exact=True)
    func = kernels.gemm(29, 45, 37, "int8", blk.lanes, group=blk.group)
    base = kernels.schedule_gemm(func, blk, marked=False)
    a, b, ref = _gemm_data(29, 45, 37, "int8", kernels.OPERANDS["int8"], np.random.default_rng(7))
    weight = kernels.pack_gemm_weight(b, blk.lanes, blk.group)
    used = set()
    for index in range(len(s_tir.Schedule(base).get_loops("C_update"))):
        sch = s_tir.Schedule(base)
        kernels.mark(sch, sch.get_loops("C_update")[index], "auto")
        _, report = tensorize_module(tvm.tirx.transform.BindTarget(host_target)(sch.mod))
        used |= set(report["main"].used)
        got, _ = _run(sch.mod, host_target, [a, weight], (29, 45), "int32")
        np.testing.assert_array_equal(got, ref, err_msg=f"mark on loop {index}")
    assert used, "some loop's nest matched"
