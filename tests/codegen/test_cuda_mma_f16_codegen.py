"""The uniform family's fp16/bf16 tensor-core kernel (mma.sync m16n8k16), built here without a
GPU: which specs take it and why others do not, the generated CUDA (the mma of the activation
dtype, one kernel, no spills at the large shapes), the mma_f16 packing, and the numbers, run on
the CPU emulator (its m16n8k16 exchanges the lanes' fragments as the warp does) against the
float64 product for each bit width, group size and activation dtype. The GPU runs the same
checks at full size (tests/cuda/test_uniform_mma_f16_cuda.py)."""

import json
import re

import numpy as np
import pytest
import torch

import targets
from qcompile import _tvm
from qcompile.build import build_untuned
from qcompile.errors import SpecError
from qcompile.formats import bitpack
from qcompile.kernels import UniformSpec, get_family
from qcompile.kernels.layouts import uniform as layout
from qcompile.kernels.tir.attrs import COMPUTE_ATTR
from qcompile.kernels.uniform.compute_cuda_mma_f16 import (
    COMPUTE_NAME,
    UNIT_ROWS,
    block_rows,
    check_spec,
    code_position,
    k_split,
    partial_scope,
    register_plan,
    resident_warps,
    ring_words,
    stages,
    unit_slice,
    word_position,
    x_row,
)
from qcompile.testing.cuda_emulator import aligned, emulate, ptxas_report
from schedules import untuned_schedule
from schedules.variants import choose, compute_for

FAMILY = get_family("uniform")
PRESET = targets.get("cuda")
HW = PRESET.hardware()
TARGET = _tvm.Target(PRESET.tvm_target())
TOLERANCE = {"float16": 2e-3, "bfloat16": 1e-2}


def scheduled(spec):
    mod = _tvm.normalize_mod(compute_for(spec, "cuda"))
    return untuned_schedule(_tvm.Schedule(mod), spec, "cuda", HW)


def cuda_source(spec) -> str:
    lib = _tvm.tvm.compile(scheduled(spec).mod, target=TARGET)
    (device,) = [m for m in lib.mod.imports if m.kind == "cuda"]
    return device.inspect_source()


def test_half_activations_take_tensor_cores_where_the_layout_fits():
    def variant(**kw):
        return choose(UniformSpec(**{"k": 4096, "n": 4096, "dtype": "float16", **kw}),
                      "cuda").name

    for fields in ({"m": 1}, {"m": 16}, {"m": 7, "dtype": "bfloat16"}, {"bits": 2}, {"bits": 3},
                   {"bits": 8}, {"group_size": 32}, {"group_size": -1}, {"act_order": True}):
        assert variant(**fields) == "uniform_cuda_mma_f16", fields
    for fields in ({"dtype": "float32"}, {"m": 17},
                   {"bits": 8, "dtype": "bfloat16"}, {"n": 4104}):
        assert variant(**fields) == "uniform_cuda", fields
    spec = UniformSpec(k=4096, n=4096, m=16, dtype="bfloat16")
    assert compute_for(spec, "cuda").attrs[COMPUTE_ATTR] == COMPUTE_NAME


def test_rules_name_the_numbers():
    with pytest.raises(SpecError, match=r"int8_activations must be False.*M=17 must be at "
                                        r"most 16"):
        check_spec(UniformSpec(k=1024, n=1024, m=17, int8_activations=True))
    with pytest.raises(SpecError, match=r"N=1040 must be a multiple of 32"):
        check_spec(UniformSpec(k=1024, n=1040, dtype="float16"))
    with pytest.raises(SpecError, match=r"8-bit codes need fp16 x"):
        check_spec(UniformSpec(k=1024, n=1024, bits=8, dtype="bfloat16"))
    with pytest.raises(SpecError, match=r"dtype=float32 must be float16 or bfloat16"):
        check_spec(UniformSpec(k=1024, n=1024))
    with pytest.raises(SpecError, match=r"K=1056 must be a multiple of 128"):
        check_spec(UniformSpec(k=1056, n=1024, group_size=32, dtype="float16"))


def test_k_split_keeps_every_block_in_the_first_wave():
    """The split keeps all blocks resident at once (132 SMs, the planned registers), within 2
    units a warp; an even split of the units where it holds 70% of the most warps, else the
    most, the units split unevenly."""
    def split(k, n, m=16):
        return k_split(UniformSpec(k=k, n=n, m=m, dtype="float16"))

    for k, n, m in [(8192, 28672, 1), (8192, 28672, 16), (28672, 8192, 1), (28672, 8192, 16),
                    (8192, 8192, 1), (4096, 4096, 16), (4096, 11008, 1), (11008, 4096, 4),
                    (3584, 8192, 1)]:
        spec = UniformSpec(k=k, n=n, m=m, dtype="float16")
        blocks_per_sm = -(-(n // 32) // 132)
        assert blocks_per_sm * split(k, n, m) <= resident_warps(spec), (k, n, m)
    # 896 slices: 7 blocks an SM; one tile of rows stages its words, 28 warps an SM (by shared
    # memory: 3 stages of 2 KB and 1 KB of sums a warp): 4 a block over 64 units; two tiles
    # keep them in registers, 18 warps: 2
    assert (split(8192, 28672, 1), split(8192, 28672, 16)) == (4, 2)
    # 256 slices, 2 blocks an SM: 14 warps a block staged (224 units, 16 each); at two tiles
    # at most 9 in registers, 8 divide 224 units
    assert (split(28672, 8192, 1), split(28672, 8192, 16)) == (14, 8)
    assert split(3584, 8192, 1) == 11                          # 28 units: 7 divide, < 70% of 11
    assert split(4096, 4096) == 16                             # 128 slices: 1 block an SM
    assert split(512, 4096) == 2                               # 4 units: 2 per warp at least
    assert split(1024, 32 * 132 * 30) == 1                     # 30 blocks an SM: no split fits


def test_unit_slices_cover_the_units_once():
    spec = UniformSpec(k=8192, n=28672, m=16, dtype="float16")        # 64 units over 2 warps
    assert [unit_slice(spec, part) for part in range(k_split(spec))] == [(0, 32), (32, 32)]
    spec = UniformSpec(k=8192, n=8192, m=1, dtype="float16")          # 64 units over 14 warps
    slices = [unit_slice(spec, part) for part in range(k_split(spec))]
    assert slices[:8] == [(5 * i, 5) for i in range(8)] and slices[8:] == [
        (40 + 4 * i, 4) for i in range(6)]


def test_words_are_staged_where_a_warp_has_units_to_keep_in_flight():
    """One tile of rows stages 3 units of words in shared memory when the split leaves a
    warp at least 4 units; two tiles, and slices of 2 or 3 units, keep register buffers. The
    ring holds every warp's stages (declared past 48 KB where the block passes it: see
    ``ring_words``)."""
    def spec(k, n, m):
        return UniformSpec(k=k, n=n, m=m, dtype="float16")

    assert [stages(spec(8192, 28672, m)) for m in (1, 8, 9, 16)] == [3, 3, 0, 0]
    assert stages(spec(4096, 12288, 1)) == 3                      # 32 units, 8 warps: 4 each
    assert stages(spec(4096, 4096, 1)) == stages(spec(3584, 8192, 1)) == 0   # 2 and 3 each
    for k, n in [(4096, 12288), (28672, 8192), (8192, 28672), (8192, 14336)]:
        s = spec(k, n, 1)
        ring = k_split(s) * stages(s) * 32 * 2 * 8 * 4               # 4 bits: 2 tiles x 8 words
        total = ring + k_split(s) * 8 * 32 * 4
        assert ring_words(s) * 4 == (max(ring, 48 * 1024 + 128) if total > 48 * 1024
                                     else ring)


@pytest.mark.parametrize(("k", "n", "scope"), [(8192, 14336, "shared.dyn"),
                                               (4096, 12288, "shared"), (8192, 28672, "shared")])
def test_a_block_past_48_kb_keeps_all_its_shared_memory_dynamic(k, n, scope):
    """CUDA refused to launch the 8192x14336 kernel (Llama-70B's up shard at TP = 2) while its
    43008-byte dynamic ring sat beside 7168 bytes of static partial sums: a block past 48 KB
    that TVM did not opt in, since it raises the limit only for a dynamic allocation that
    large. There the sums are dynamic too, one allocation that reuses the ring after a
    barrier; a ring of 48 KB or more (4096x12288), or a block under 48 KB, keeps them static."""
    spec = UniformSpec(k=k, n=n, m=1, dtype="float16")
    assert partial_scope(spec) == scope
    source = cuda_source(spec)
    shared = [line.strip() for line in source.splitlines() if "__shared__" in line]
    assert shared[0].startswith("extern __shared__")
    assert len(shared) == (1 if scope == "shared.dyn" else 2), shared
    if scope == "shared.dyn":
        body = source[source.index("extern __shared__"):]
        assert "__syncthreads" in body[:body.index("((float*)")]  # the sums wait for every warp


@pytest.mark.parametrize("m,bits,dtype", [(16, 4, "float16"), (1, 4, "bfloat16"),
                                          (16, 2, "float16"), (16, 3, "float16")])
def test_generated_kernel_uses_mma_without_spills(m, bits, dtype):
    spec = UniformSpec(k=8192, n=28672, m=m, bits=bits, dtype=dtype)
    source = cuda_source(spec)
    kind = {"float16": "f16", "bfloat16": "bf16"}[dtype]
    assert f"mma.sync.aligned.m16n8k16.row.col.f32.{kind}.{kind}.f32" in source
    assert len(re.findall(r'extern "C" __global__[^;{]*\{', source)) == 1
    kernel = source[source.index('extern "C" __global__'):]
    assert not re.search(r"int2half|int2bfloat16|\((half|nv_bfloat16)\)\(+u?int", kernel)
    report = ptxas_report(source, arch=HW.arch)
    if report is None:
        pytest.skip("nvcc is not installed: ptxas cannot report registers")
    assert report["spill_stores"] == 0 and report["stack_bytes"] == 0


@pytest.mark.parametrize("bits,group_size", [(2, 128), (3, 32), (4, 32), (8, 64), (4, -1)])
def test_mma_f16_puts_every_code_where_its_lane_decodes_it(bits, group_size):
    """Packed for the kernel, qweight [N/16, K/128, 64 b]: every field code_position names
    holds its code's bits, every bit of the lane's words belongs to one field, and the rows of
    each lane's codes are the rows its x registers hold (x_row): within each block of K, rows
    block/4 t .. block/4 (t + 1) - 1 of lane thread t = l % 4, each step within its group."""
    spec = UniformSpec(k=256, n=64, m=4, bits=bits, group_size=group_size, dtype="float16")
    block = block_rows(spec)
    tensors = FAMILY.example_tensors(spec, np.random.default_rng(bits))
    prepared = FAMILY.prepare(spec, **tensors, layout=layout.mma_f16(bits, block))
    packed = prepared.tensors[0].numpy().view(np.uint32)
    codes = bitpack.unpack(tensors["qweight"], bits)            # [K, N]
    assert packed.shape == (spec.n // 16, spec.k // UNIT_ROWS, 64 * bits)
    run = block // 4
    for lane in range(32):
        t = lane % 4
        used = np.zeros((2 * bits, 32), dtype=bool)
        rows_of_column = {}
        for word, bit, width, code_bit, row, column in code_position(bits, "float16", block,
                                                                     lane):
            assert not used[word, bit:bit + width].any()
            used[word, bit:bit + width] = True
            got = packed[:, :, word_position(lane, word, bits)] >> np.uint32(bit)
            want = codes[row::UNIT_ROWS, column::16].T
            np.testing.assert_array_equal(got & np.uint32((1 << width) - 1),
                                          (want >> code_bit) & ((1 << width) - 1))
            rows_of_column.setdefault((column, code_bit), []).append(row)
        assert used.all()
        for rows in rows_of_column.values():                    # each column: every row once
            assert sorted(rows) == [b + run * t + i for b in range(0, UNIT_ROWS, block)
                                    for i in range(run)]
        for s in range(8):                                       # a step stays in its group
            assert {x_row(t, s, h, e, block) // block for h in (0, 1) for e in (0, 1)} == \
                {s * 16 // block}


def test_register_plan_decodes_in_place_where_the_mantissa_allows():
    """Each register's code lands at its offset, inside the mantissa; a0/a1 and a2/a3 share
    their offsets (each pair meets one B register); 4-bit fp16 needs one shift per word."""
    for bits, dtype in [(2, "float16"), (3, "float16"), (4, "float16"), (8, "float16"),
                        (2, "bfloat16"), (3, "bfloat16"), (4, "bfloat16")]:
        mantissa = 10 if dtype == "float16" else 7
        for registers in register_plan(bits, dtype):
            assert registers[0].offset == registers[1].offset
            assert registers[2].offset == registers[3].offset
            for register in registers:
                assert register.offset + bits <= mantissa
                assert sum(f.width for f in register.fields) == bits
    shifts = {register.shift(field) for registers in register_plan(4, "float16")
              for register in registers for field in register.fields}
    assert shifts == {0, 8}


@pytest.mark.parametrize(("m", "bits", "group_size", "dtype", "k", "n"), [
    (3, 4, 128, "float16", 512, 64), (16, 4, 128, "bfloat16", 512, 64),
    (1, 2, 32, "float16", 512, 64), (9, 8, -1, "float16", 512, 64),
    (16, 2, 64, "bfloat16", 1024, 32), (5, 4, 32, "float16", 256, 96),
    (7, 3, 128, "float16", 512, 64), (2, 3, 32, "bfloat16", 256, 64)])
def test_emulated_kernel_matches_the_float64_product(m, bits, group_size, dtype, k, n):
    spec = UniformSpec(k=k, n=n, m=m, bits=bits, group_size=group_size, dtype=dtype)
    tensors = FAMILY.example_tensors(spec, np.random.default_rng(m))
    error = emulated_error(spec, tensors)
    assert error <= TOLERANCE[dtype], error


def emulated_error(spec, tensors) -> float:
    """max |y - ref| / max |ref| of ``spec``'s kernel on the CPU emulator, for GPTQ
    ``tensors`` (packed by ``prepare`` into the kernel's layout) and x seeded by M."""
    m, k, n, dtype = spec.m, spec.k, spec.n, spec.dtype
    prepared = FAMILY.prepare(spec, **tensors,
                              layout=layout.mma_f16(spec.bits, block_rows(spec)))
    operands = {name: aligned(t.numpy())
                for name, t in zip(prepared.names, prepared.tensors, strict=True)}
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(getattr(torch, dtype))
    bits16 = np.float16 if dtype == "float16" else np.uint16   # bf16 passes as its bits
    y = aligned(np.zeros((m, n), bits16))
    emulate(scheduled(spec).mod, TARGET)(
        x=aligned(x.view(torch.int16).numpy().view(bits16)), y=y, **operands)
    got = torch.from_numpy(y.view(np.int16)).view(x.dtype).double().numpy()
    reference = FAMILY.reference(spec, x.double().numpy(), **tensors)
    return float(np.abs(got - reference).max() / np.abs(reference).max())


@pytest.mark.parametrize(("m", "bits", "group_size", "dtype"), [
    (1, 4, 128, "float16"), (11, 3, 32, "bfloat16"), (4, 2, 64, "float16"),
    (16, 8, 128, "float16")])
def test_emulated_act_order_kernel_gathers_x_itself(m, bits, group_size, dtype):
    """act_order specs take x in the checkpoint's order and a perm operand: the kernel reads
    x[:, perm[k]] for the reordered row k (no gather before the call), same product."""
    from qcompile.tp.synthetic import random_act_order_layer

    k, n = 512, 64
    spec = UniformSpec(k=k, n=n, m=m, bits=bits, group_size=group_size, dtype=dtype,
                       act_order=True)
    layer = random_act_order_layer(k, n, bits, group_size, np.random.default_rng(bits))
    tensors = {"qweight": layer.qweight, "scales": layer.scales, "qzeros": layer.qzeros,
               "g_idx": layer.g_idx}
    assert not np.array_equal(layer.g_idx, np.arange(k) // group_size)  # scrambled
    prepared = FAMILY.prepare(spec, **tensors, layout=layout.mma_f16(bits, block_rows(spec)))
    assert prepared.names == ("qweight", "scales", "zeros", "perm")
    error = emulated_error(spec, tensors)
    assert error <= TOLERANCE[dtype], error


@pytest.mark.parametrize(("buffers", "bits", "m", "dtype"), [
    (3, 4, 1, "float16"), (4, 2, 9, "bfloat16"), (5, 3, 4, "float16")])
def test_emulated_kernel_with_more_word_buffers(monkeypatch, buffers, bits, m, dtype):
    """WORD_BUFFERS > 2 (units in flight per warp; a knob the split study sweeps): a warp
    walking 7 units, whole rings and a tail, gives the same product."""
    from qcompile.kernels.uniform import compute_cuda_mma_f16 as kernel_module

    monkeypatch.setitem(kernel_module.WORD_BUFFERS, bits, buffers)
    monkeypatch.setattr(kernel_module, "k_split", lambda spec: 1)  # one warp per K: 7 units
    k, n = 7 * UNIT_ROWS, 32
    spec = UniformSpec(k=k, n=n, m=m, bits=bits, group_size=64, dtype=dtype)
    tensors = FAMILY.example_tensors(spec, np.random.default_rng(buffers))
    error = emulated_error(spec, tensors)
    assert error <= TOLERANCE[dtype], error


@pytest.mark.parametrize(("staged", "split", "bits", "m", "dtype", "act_order"), [
    (3, 2, 4, 3, "float16", False), (2, 1, 4, 1, "float16", False),
    (4, 3, 2, 9, "bfloat16", False), (5, 2, 3, 16, "float16", True),
    (3, 3, 8, 1, "float16", False), (3, 7, 4, 8, "bfloat16", True)])
def test_emulated_kernel_with_staged_words(monkeypatch, staged, split, bits, m, dtype,
                                           act_order):
    """Words staged in shared memory (cp.async, ``staged`` units a warp): slices of 7 units
    over 1-3 warps, even and uneven, slices shorter than the ring (7 warps: one unit each),
    both tiles of rows, act_order: every unit is multiplied once. (The emulator copies at once:
    the GPU tests check that each unit is waited for.)"""
    from qcompile.kernels.uniform import compute_cuda_mma_f16 as kernel_module

    monkeypatch.setattr(kernel_module, "stages", lambda spec: staged)
    monkeypatch.setattr(kernel_module, "k_split", lambda spec: split)
    spec = UniformSpec(k=7 * UNIT_ROWS, n=64, m=m, bits=bits, group_size=64, dtype=dtype,
                       act_order=act_order)
    assert "cp.async.cg.shared.global" in cuda_source(spec)
    if act_order:
        from qcompile.tp.synthetic import random_act_order_layer

        layer = random_act_order_layer(spec.k, spec.n, bits, 64, np.random.default_rng(split))
        tensors = {"qweight": layer.qweight, "scales": layer.scales, "qzeros": layer.qzeros,
                   "g_idx": layer.g_idx}
    else:
        tensors = FAMILY.example_tensors(spec, np.random.default_rng(staged + split))
    error = emulated_error(spec, tensors)
    assert error <= TOLERANCE[dtype], error


@pytest.mark.parametrize(("split", "buffers", "act_order"), [
    (2, 2, False), (3, 2, True), (3, 3, False), (2, 4, False)])
def test_emulated_kernel_with_uneven_k_slices(monkeypatch, split, buffers, act_order):
    """Slices of 4 and 3 units (an even count and an extra unit loaded during the loop), of
    3, 2 and 2 (odd, the extra one after it), with two word buffers and with a ring: every
    unit is multiplied once."""
    from qcompile.kernels.uniform import compute_cuda_mma_f16 as kernel_module

    monkeypatch.setitem(kernel_module.WORD_BUFFERS, 4, buffers)
    monkeypatch.setattr(kernel_module, "k_split", lambda spec: split)
    spec = UniformSpec(k=7 * UNIT_ROWS, n=64, m=3, bits=4, group_size=128, dtype="float16",
                       act_order=act_order)
    assert kernel_module.unit_slice(spec, split - 1)[1] < kernel_module.unit_slice(spec, 0)[1]
    tensors = FAMILY.example_tensors(spec, np.random.default_rng(split + buffers))
    error = emulated_error(spec, tensors)
    assert error <= TOLERANCE["float16"], error


def test_export_records_the_layout(tmp_path):
    spec = UniformSpec(k=1024, n=512, m=16, bits=4, dtype="bfloat16")
    result = build_untuned(spec, PRESET, tmp_path)
    manifest = json.loads(result.manifest_path.read_text())
    assert manifest["layout"] == layout.mma_f16(4, 128)
    assert "m16n8k16" in (tmp_path / f"{spec.name()}.cu").read_text()


@pytest.mark.parametrize("bits,dtype,m", [(4, "float16", 1), (3, "bfloat16", 16),
                                          (2, "float16", 9), (8, "float16", 4)])
def test_tuning_can_estimate_the_compute(bits, dtype, m):
    """MetaSchedule estimates each workload's flops before it tunes; its estimator takes no
    vector expressions in a compute (the kernel writes vector loops instead)."""
    spec = UniformSpec(k=1024, n=512, m=m, bits=bits, dtype=dtype)
    mod = _tvm.normalize_mod(compute_for(spec, "cuda"))
    assert _tvm.tvm.s_tir.analysis.estimate_tir_flops(mod) > 0


def test_the_search_keeps_the_one_schedule_whose_ring_passes_48_kb(monkeypatch):
    """MetaSchedule's VerifyGPUCode counts all shared memory against the target's 48 KB, so it
    dropped the kernel's only schedule wherever a ring of 48 KB or more (which TVM opts into
    more) took the block past it: tuning such a spec measured nothing and stored no record.
    The variant's search leaves that check out and samples its one point once."""
    from qcompile.kernels.uniform import compute_cuda_mma_f16 as kernel_module
    from schedules import search_strategy, space_generator

    monkeypatch.setattr(kernel_module, "SMS", 4)  # three blocks an SM, as 4096x12288 on 132
    spec = UniformSpec(k=4096, n=384, m=1, bits=4, dtype="float16")
    assert stages(spec) and ring_words(spec) * 4 > 48 * 1024
    mod = _tvm.normalize_mod(compute_for(spec, "cuda"))
    strategy = search_strategy(spec, "cuda")
    assert strategy.population_size == 1
    context = _tvm.tune_context(mod=mod, target=TARGET,
                                space_generator=space_generator(spec, "cuda", HW),
                                search_strategy=strategy, task_name="ring", num_threads=1)
    (space,) = context.space_generator.generate_design_space(mod)
    assert all(postproc.apply(space) for postproc in context.space_generator.postprocs)
    verify = _tvm.ms.postproc.VerifyGPUCode()
    verify._initialize_with_tune_context(context)
    assert not verify.apply(space)  # what the search did with it before


def test_the_search_keeps_the_one_schedule_with_uneven_k_slices():
    """Where K's groups do not divide evenly among a column's blocks, a block's K loop is
    bounded by its block index; MetaSchedule's DisallowDynamicLoop dropped that kernel's only
    schedule (Llama-2-70B's 8192x8192 at M = 1 tuned to no record). The variant leaves that
    check out."""
    from schedules import space_generator

    spec = UniformSpec(k=8192, n=8192, m=1, bits=4, dtype="float16")
    mod = _tvm.normalize_mod(compute_for(spec, "cuda"))
    context = _tvm.tune_context(mod=mod, target=TARGET,
                                space_generator=space_generator(spec, "cuda", HW),
                                task_name="uneven", num_threads=1)
    (space,) = context.space_generator.generate_design_space(mod)
    assert all(postproc.apply(space) for postproc in context.space_generator.postprocs)
    assert not _tvm.ms.postproc.DisallowDynamicLoop().apply(space)  # what the search did
