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
from qcompile.kernels.uniform import layout
from qcompile.kernels.uniform.compute_cuda import COMPUTE_ATTR
from qcompile.kernels.uniform.compute_cuda_mma import (
    COMPUTE_NAME,
    check_spec,
    k_split,
    unit_position,
    units_per_group,
    uses_tensor_cores,
)
from qcompile.kernels.uniform.compute_int8 import byte_planes
from qcompile.testing.cuda_emulator import ptxas_report
from schedules import untuned_schedule

FAMILY = get_family("uniform")
PRESET = targets.get("cuda")
HW = PRESET.hardware()
TARGET = _tvm.Target(PRESET.tvm_target())


def cuda_source(spec) -> str:
    mod = _tvm.normalize_mod(FAMILY.compute_for(spec, "cuda"))
    sch = untuned_schedule(_tvm.Schedule(mod), spec, "cuda", HW)
    lib = _tvm.tvm.compile(sch.mod, target=TARGET)
    (device,) = [m for m in lib.mod.imports if m.kind == "cuda"]
    return device.inspect_source()


def test_int8_specs_take_tensor_cores_from_eight_rows():
    def spec(**kw):
        return UniformSpec(**{"k": 4096, "n": 4096, "int8_activations": True, **kw})

    assert uses_tensor_cores(spec(m=8)) and uses_tensor_cores(spec(m=16, bits=2))
    assert not uses_tensor_cores(spec(m=4))                    # dp4a is faster there
    assert not uses_tensor_cores(spec(m=16, bits=3))           # no layout: dp4a
    assert not uses_tensor_cores(spec(m=16, group_size=-1))
    assert FAMILY.compute_for(spec(m=16), "cuda").attrs[COMPUTE_ATTR] == COMPUTE_NAME
    assert FAMILY.compute_for(spec(m=4), "cuda").attrs[COMPUTE_ATTR] != COMPUTE_NAME


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

    assert (split(8192, 28672), split(28672, 8192), split(4096, 4096)) == (2, 8, 8)
    assert split(512, 4096) == 1                               # 4 groups: one warp walks all


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


def test_x_is_stored_in_fragment_order_and_words_load_as_vectors():
    """One warp's load of x fragments reads consecutive words (lane l's at 4 l, M = 16); a
    lane's packed words arrive in 128-bit loads."""
    source = cuda_source(UniformSpec(k=4096, n=4096, m=16, int8_activations=True))
    gemm = source[source.index("kernel_1("):]
    assert re.search(r"xq_words_ptr\[[^\]]*\(\(int\)threadIdx\.x\) \* 4\)", gemm)
    assert "*(int4*)(raw_ptr + 0) = *(int4*)(qweight_ptr" in gemm


@pytest.mark.parametrize("bits,group_size", [(4, 128), (2, 64), (4, 32)])
def test_mma_words_hold_each_lanes_words_together(bits, group_size):
    """Packed for the kernel: qweight [G, N, U] holds every word of the GPTQ matrix once, unit u
    of group g at unit_position(u); a lane's words are one run (4-bit: even units, then odd)."""
    spec = UniformSpec(k=512, n=64, m=16, bits=bits, group_size=group_size,
                       int8_activations=True)
    units = units_per_group(spec)
    tensors = FAMILY.example_tensors(spec, np.random.default_rng(bits))
    prepared = FAMILY.prepare(spec, **tensors, layout=layout.mma_words(bits, units))
    packed = prepared.tensors[0].numpy()
    words = layout.plane_words_of(byte_planes(tensors["qweight"], bits))[:, 0, :]  # [U, N]
    assert packed.shape == (spec.groups, spec.n, units)
    for u in range(words.shape[0]):
        g, unit = divmod(u, units)
        np.testing.assert_array_equal(packed[g, :, unit_position(unit, bits, units)], words[u])
    if bits == 4:
        assert [unit_position(u, 4, 16) for u in (0, 2, 1, 3)] == [0, 1, 8, 9]


def test_export_records_mma_words(tmp_path):
    spec = UniformSpec(k=1024, n=512, m=16, int8_activations=True)
    result = build_untuned(spec, PRESET, tmp_path)
    manifest = json.loads(result.manifest_path.read_text())
    assert manifest["layout"] == layout.mma_words(4, 16)
    assert "mma.sync" in (tmp_path / f"{spec.name()}.cu").read_text()
