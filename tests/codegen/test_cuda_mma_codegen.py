"""The uniform family's tensor-core kernel (int8 x, mma.sync m16n8k32), built here without a
GPU: which specs take it, the generated CUDA (the mma, the fragment layout of x, no spills at
the measured shape), the rules with their numbers, and the export. An mma is a warp-collective
instruction the CPU emulator cannot run: the numbers are checked on a GPU
(tests/cuda/test_uniform_mma_cuda.py)."""

import json
import re

import numpy as np
import pytest

import targets
from qcompile import _tvm
from qcompile.build import build_untuned
from qcompile.errors import SpecError
from qcompile.kernels import UniformSpec, get_family
from qcompile.kernels.layouts import uniform as layout
from qcompile.kernels.tir.attrs import COMPUTE_ATTR
from qcompile.kernels.tir.planes import byte_planes
from qcompile.kernels.uniform.compute_cuda_gemv_int8 import COMPUTE_NAME as GEMV_COMPUTE_NAME
from qcompile.kernels.uniform.compute_cuda_int8 import COMPUTE_NAME as DP4A_COMPUTE_NAME
from qcompile.kernels.uniform.compute_cuda_mma import (
    COMPUTE_NAME,
    TILE_N,
    TILES_PER_WARP,
    check_spec,
    k_split,
    runs_per_column,
    scale_position,
    units_per_group,
    uses_tensor_cores,
    word_position,
)
from qcompile.testing.cuda_emulator import ptxas_report
from schedules import untuned_schedule
from schedules.variants import compute_for

FAMILY = get_family("uniform")
PRESET = targets.get("cuda")
HW = PRESET.hardware()
TARGET = _tvm.Target(PRESET.tvm_target())


def cuda_source(spec) -> str:
    mod = _tvm.normalize_mod(compute_for(spec, "cuda"))
    sch = untuned_schedule(_tvm.Schedule(mod), spec, "cuda", HW)
    lib = _tvm.tvm.compile(sch.mod, target=TARGET)
    (device,) = [m for m in lib.mod.imports if m.kind == "cuda"]
    return device.inspect_source()


def test_int8_specs_take_tensor_cores_from_two_rows():
    def spec(**kw):
        return UniformSpec(**{"k": 4096, "n": 4096, "int8_activations": True, **kw})

    assert uses_tensor_cores(spec(m=2)) and uses_tensor_cores(spec(m=16, bits=2))
    assert uses_tensor_cores(spec(m=2, n=8192))
    assert not uses_tensor_cores(spec(m=1))                    # one row: the one-row GEMV
    assert not uses_tensor_cores(spec(m=16, bits=3))           # no layout: dp4a
    assert not uses_tensor_cores(spec(m=16, group_size=-1))
    assert not uses_tensor_cores(spec(m=16, int8_activations=False))
    assert compute_for(spec(m=16), "cuda").attrs[COMPUTE_ATTR] == COMPUTE_NAME
    assert compute_for(spec(m=1), "cuda").attrs[COMPUTE_ATTR] == GEMV_COMPUTE_NAME
    assert compute_for(spec(m=16, bits=3), "cuda").attrs[COMPUTE_ATTR] == DP4A_COMPUTE_NAME


def test_rules_name_the_numbers():
    with pytest.raises(SpecError, match=r"bits=3 must be 2 or 4.*M=17 must be at most 16"):
        check_spec(UniformSpec(k=1024, n=1024, m=17, bits=3, int8_activations=True))
    with pytest.raises(SpecError, match=r"N=1000 must be a multiple of 32"):
        check_spec(UniformSpec(k=1024, n=1000, m=16, group_size=64, int8_activations=True))
    with pytest.raises(SpecError, match=r"group size 256 must be one of \(32, 64, 128\)"):
        check_spec(UniformSpec(k=1024, n=1024, m=16, group_size=256, int8_activations=True))


def test_k_split_fills_the_gpu_within_the_groups():
    def split(k, n):
        return k_split(UniformSpec(k=k, n=n, m=16, int8_activations=True))

    assert (split(8192, 28672), split(28672, 8192), split(4096, 4096)) == (2, 8, 16)
    assert split(512, 4096) == 2                               # 4 groups: 2 per warp at least


@pytest.mark.parametrize("m,bits", [(16, 4), (8, 2), (9, 4)])
def test_generated_kernel_uses_mma_without_spills(m, bits):
    spec = UniformSpec(k=8192, n=28672, m=m, bits=bits, int8_activations=True)
    source = cuda_source(spec)
    assert "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32" in source
    assert len(re.findall(r'extern "C" __global__[^;{]*\{', source)) == 2
    report = ptxas_report(source, arch=HW.arch)
    if report is None:
        pytest.skip("nvcc is not installed: ptxas cannot report registers")
    assert report["spill_stores"] == 0 and report["stack_bytes"] == 0
    assert report["shared_bytes"] <= HW.shared_memory_per_block_bytes


def test_every_operand_of_a_group_arrives_in_wide_loads():
    """At M = 16 a lane's x fragment (4 words at 4 l: fragment order), its packed words, its
    8 scales and 8 zeros, and x's step and sum of its two rows are each one vector load."""
    source = cuda_source(UniformSpec(k=4096, n=4096, m=16, int8_activations=True))
    gemm = source[source.index("kernel_1("):]
    assert re.search(r"a_ptr\[0\] = \*\(int4\*\)\(xq_words_ptr[^;]*\(\(int\)threadIdx\.x\) \* 4\)",
                     gemm)
    for load in ("*(int4*)(raw_ptr + 0) = *(int4*)(qweight_ptr",
                 "*(uint4*)(sc_ptr + 0) = *(uint4*)(scales_ptr",
                 "*(uint2*)(zr_ptr + 0) = *(uint2*)(zeros_ptr",
                 "*(float2*)(xs_ptr + 0) = *(float2*)(x_step_ptr",
                 "*(int2*)(xn_ptr + 0) = *(int2*)(xq_sum_ptr"):
        assert load in gemm
    assert not re.search(r"= (scales|zeros|xq_words)_ptr\[", gemm)   # no scalar loads left


def lane_reads(bits: int, units: int) -> dict:
    """What the kernel's load_words reads for each lane of a warp and tile: {(lane, v): the
    positions of vector v of its run} (the compute's formula, restated)."""
    runs = runs_per_column(bits)
    vec = min(4, units // runs)
    stride = TILE_N * runs * vec
    return {(lane, v): [v * stride + lane // 4 * runs * vec + lane % 4 // 2 % runs * vec + i
                        for i in range(vec)]
            for lane in range(32) for v in range(units // runs // vec)}


@pytest.mark.parametrize("bits,group_size", [(4, 128), (2, 64), (4, 32), (2, 128)])
def test_mma_tiles_give_each_lane_its_run_and_each_warp_load_one_stretch(bits, group_size):
    """Packed for the kernel: qweight [G, N/8, 8 U] holds every word of the GPTQ matrix once, at
    word_position; the words lane l reads are its column's units it shifts (4 bits: the even
    units for t = 0, 1 and the odd ones for t = 2, 3; 2 bits: all), in order, and one vector
    load of the warp reads one contiguous stretch. Scales and zeros: each lane's 2 columns of
    every tile together (scale_position)."""
    spec = UniformSpec(k=512, n=64, m=16, bits=bits, group_size=group_size,
                       int8_activations=True)
    units = units_per_group(spec)
    tensors = FAMILY.example_tensors(spec, np.random.default_rng(bits))
    prepared = FAMILY.prepare(spec, **tensors,
                              layout=layout.mma_tiles(bits, units, TILES_PER_WARP))
    packed, scales, zeros = (t.numpy() for t in prepared.tensors[:3])
    _, gptq_scales, gptq_zeros = (t.numpy() for t in FAMILY.prepare(spec, **tensors).tensors[:3])
    words = layout.plane_words_of(byte_planes(tensors["qweight"], bits))[:, 0, :]  # [U, N]
    assert packed.shape == (spec.groups, spec.n // TILE_N, TILE_N * units)
    for u in range(words.shape[0]):
        g, unit = divmod(u, units)
        for c in range(TILE_N):
            np.testing.assert_array_equal(packed[g, :, word_position(c, unit, bits, units)],
                                          words[u, c::TILE_N])
    reads = lane_reads(bits, units)
    for (lane, v), positions in reads.items():
        for i, position in enumerate(positions):
            index = v * len(positions) + i          # the lane's run, in order
            unit = 2 * index + lane % 4 // 2 if runs_per_column(bits) == 2 else index
            assert position == word_position(lane // 4, unit, bits, units)
    for v in {v for _, v in reads}:
        stretch = sorted({p for (_, w), ps in reads.items() if w == v for p in ps})
        assert stretch == list(range(stretch[0], stretch[0] + len(stretch)))
    columns = TILE_N * TILES_PER_WARP
    for col in range(spec.n):
        warp, inside = divmod(col, columns)
        at = warp * columns + scale_position(inside)
        np.testing.assert_array_equal(scales[:, at], gptq_scales[:, col])
        np.testing.assert_array_equal(zeros[:, at], gptq_zeros[:, col])
    lane = 5                                        # thread t = 1: columns 2, 3 of each tile
    assert [scale_position(t * TILE_N + 2 + j) for t in range(4) for j in (0, 1)] == \
        list(range(2 * TILES_PER_WARP * (lane % 4), 2 * TILES_PER_WARP * (lane % 4 + 1)))


def test_mma_tiles_of_another_warp_width_are_refused():
    spec = UniformSpec(k=512, n=64, m=16, int8_activations=True)
    tensors = FAMILY.example_tensors(spec, np.random.default_rng(0))
    with pytest.raises(SpecError, match=rf"2 tiles per warp; this version's kernel takes "
                                        rf"{TILES_PER_WARP}"):
        FAMILY.prepare(spec, **tensors, layout=layout.mma_tiles(4, units_per_group(spec), 2))


def test_export_records_mma_tiles(tmp_path):
    spec = UniformSpec(k=1024, n=512, m=16, int8_activations=True)
    result = build_untuned(spec, PRESET, tmp_path)
    manifest = json.loads(result.manifest_path.read_text())
    assert manifest["layout"] == layout.mma_tiles(4, 16, TILES_PER_WARP)
    assert "mma.sync" in (tmp_path / f"{spec.name()}.cu").read_text()
