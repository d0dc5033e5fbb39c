"""The uniform family's one-row int8 GEMV that rounds x inside its one kernel
(compute_cuda_gemv_int8.py), checked here without a GPU: its CUDA C run on the CPU emulator
(the shuffles that reduce and pass x between a lane's threads, the packing of x in storage
order, the dp4a steps), the rules with their numbers, ptxas's report and the export. The kernel
runs on the GPU in tests/cuda/test_uniform_int8_cuda.py."""

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
from qcompile.kernels.tir.activations import quantized_activations
from qcompile.kernels.tir.attrs import COMPUTE_ATTR
from qcompile.kernels.uniform.compute_cuda_gemv_int8 import (
    COMPUTE_NAME,
    check_spec,
    thread_shape,
    uniform_compute_cuda_gemv_int8,
)
from qcompile.testing.cuda_emulator import aligned, emulate, ptxas_report
from qcompile.testing.kernels import relative_error
from schedules.cuda import uniform_gemv_int8
from schedules.variants import compute_for

FAMILY = get_family("uniform")
PRESET = targets.get("cuda")
HW = PRESET.hardware()
TARGET = _tvm.Target(PRESET.tvm_target())


def _schedule(spec, cols=None, k_lanes=None):
    func = uniform_compute_cuda_gemv_int8(spec, cols, k_lanes)
    return uniform_gemv_int8.sketch(_tvm.Schedule(_tvm.normalize_mod(func)), spec, HW)


@pytest.mark.parametrize("bits,group_size,groups,cols,k_lanes", [
    (4, 128, 16, 4, 16), (4, 64, 32, 2, 16), (4, 32, 32, 1, 32), (2, 128, 16, 4, 16),
    (2, 64, 16, 1, 16), (4, 128, 22, 2, 16), (4, 128, 21, 2, 16), (2, 32, 10, 1, 4),
])
def test_kernel_matches_the_int8_reference(bits, group_size, groups, cols, k_lanes):
    """The generated CUDA C on the emulator against x rounded on the host
    (tir.activations.quantized_activations) times the dequantized weight: groups of 4 to 16 units
    (threads past a group's units must stay out of its sum), 1 to 4 columns a thread, and
    group counts the lanes do not divide (lanes past the last group skip the step; their
    warp's other lane still shuffles)."""
    spec = UniformSpec(k=groups * group_size, n=16 * cols * 2, bits=bits,
                       group_size=group_size, m=1, int8_activations=True)
    kernel = emulate(_schedule(spec, cols, k_lanes).mod, TARGET)
    rng = np.random.default_rng(bits * 100 + group_size)
    tensors = FAMILY.example_tensors(spec, rng)
    qweight, scales, zeros = (t.numpy() for t in
                              FAMILY.prepare(spec, **tensors, layout=layout.plane_words()).tensors)
    x = rng.standard_normal((1, spec.k)).astype(np.float32)
    x[0, :group_size] = 0.0                      # an all-zero group rounds to zeros
    y = aligned(np.full((1, spec.n), np.nan, dtype=np.float32))
    kernel(x=aligned(x), qweight=aligned(qweight), scales=aligned(scales), zeros=aligned(zeros),
           y=y)
    weight = FAMILY.reference_weight(spec, **tensors).astype(np.float64)
    assert not np.isnan(y).any()
    assert relative_error(y, quantized_activations(x, spec.group_size) @ weight) < 1e-6


def test_rules_state_their_numbers():
    with pytest.raises(SpecError, match=r"M=4 must be 1"):
        check_spec(UniformSpec(k=4096, n=4096, m=4, int8_activations=True))
    with pytest.raises(SpecError, match=r"bits=3 must be 2 or 4"):
        check_spec(UniformSpec(k=4096, n=4096, bits=3, int8_activations=True))
    with pytest.raises(SpecError, match=r"group size 256 must be one of \(32, 64, 128\)"):
        check_spec(UniformSpec(k=4096, n=4096, group_size=256, int8_activations=True))
    with pytest.raises(SpecError, match=r"N=4104 must be a multiple of 16"):
        check_spec(UniformSpec(k=4096, n=4104, int8_activations=True))
    with pytest.raises(SpecError, match=r"lanes of K come in pairs \(a warp\): got 3"):
        uniform_compute_cuda_gemv_int8(UniformSpec(k=4096, n=4096, int8_activations=True),
                                       k_lanes=3)
    with pytest.raises(SpecError, match=r"int8_activations must be True"):
        check_spec(UniformSpec(k=4096, n=4096))
    spec = UniformSpec(k=4096, n=4096, int8_activations=True)
    with pytest.raises(SpecError, match=r"3 columns per thread need N % 48 == 0"):
        uniform_compute_cuda_gemv_int8(spec, cols=3)


@pytest.mark.parametrize("k,n,shape", [
    (8192, 28672, (2, 16)),   # 32 lanes would be 1.7 waves
    (8192, 8192, (2, 32)),
    (4096, 4096, (1, 32)),    # a quarter wave at 2 columns: 1
    (14336, 4096, (1, 32)),   # 112 groups: the last step has work for 16 of the 32 lanes
    (11008, 4096, (1, 32)),   # 86 groups: the lanes need not divide them
    (1024, 2048, (1, 8)),     # 8 groups: no more lanes than groups
])
def test_thread_shape_is_the_measured_rule(k, n, shape):
    """The most lanes whose grid is one wave at 2 columns a thread, 1 column under a third of
    a wave (the measured choices, tools/results/h200/uniform_gemv_int8_shapes.json)."""
    assert thread_shape(UniformSpec(k=k, n=n, m=1, int8_activations=True)) == shape


def test_one_kernel_without_spills():
    spec = UniformSpec(k=8192, n=28672, bits=4, group_size=128, m=1, int8_activations=True)
    lib = _tvm.tvm.compile(_schedule(spec).mod, target=TARGET)
    (device,) = [m for m in lib.mod.imports if m.kind == "cuda"]
    source = device.inspect_source()
    assert len(re.findall(r'extern "C" __global__[^;{]*\{', source)) == 1
    assert "__shfl_sync(" in source and "__shfl_xor_sync(" in source and "__dp4a(" in source
    assert "*(int2*)(words_ptr" in source and "*(float4*)(xf_ptr" in source  # 2 columns
    report = ptxas_report(source, arch=HW.arch)
    if report is None:
        pytest.skip("nvcc is not installed: ptxas cannot report registers")
    assert report["spill_stores"] == 0 and report["spill_loads"] == 0


def test_export_records_the_compute_and_plane_words(tmp_path):
    spec = UniformSpec(k=1024, n=2048, m=1, int8_activations=True)
    assert compute_for(spec, "cuda").attrs[COMPUTE_ATTR] == COMPUTE_NAME
    result = build_untuned(spec, PRESET, tmp_path)
    manifest = json.loads(result.manifest_path.read_text())
    assert manifest["layout"] == layout.plane_words()
    source = (tmp_path / f"{spec.name()}.cu").read_text()
    assert len(re.findall(r'extern "C" __global__[^;{]*\{', source)) == 1
