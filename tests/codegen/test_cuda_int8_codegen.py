"""The uniform family's int8-activation CUDA kernels (dp4a), checked on this machine without a
GPU: the compute's numbers (dp4a spelt in plain arithmetic, built for the CPU), the design
space, the generated CUDA C and ptxas's report, the weight layout and the export. The kernels
themselves run in tests/cuda/test_uniform_int8_cuda.py on the GPU machine."""

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
from qcompile.kernels.tir.planes import byte_planes
from qcompile.kernels.uniform.compute_cuda_int8 import COMPUTE_NAME, uniform_compute_cuda_int8
from qcompile.testing.cuda_emulator import aligned, emulate, ptxas_report
from qcompile.testing.kernels import relative_error
from schedules.cuda import uniform_int8
from schedules.variants import compute_for

FAMILY = get_family("uniform")
PRESET = targets.get("cuda")
HW = PRESET.hardware()
TARGET = _tvm.Target(PRESET.tvm_target())


def _mod(spec):
    """The dp4a compute (the family takes tensor cores from 8 rows where they fit)."""
    return _tvm.normalize_mod(uniform_compute_cuda_int8(spec))


def cuda_source(sch) -> str:
    lib = _tvm.tvm.compile(sch.mod, target=TARGET)
    (device,) = [m for m in lib.mod.imports if m.kind == "cuda"]
    return device.inspect_source()


@pytest.mark.parametrize("bits,group_size,m", [(4, 128, 1), (2, 64, 3), (3, 32, 2), (4, -1, 2)])
def test_compute_matches_the_int8_reference(bits, group_size, m):
    """The compute itself (storage order of x, the codes of each dp4a step, zero-points and
    scales), with dp4a in plain arithmetic, built for the CPU and run on GPTQ tensors prepared
    in the kernel's layout."""
    spec = UniformSpec(k=512, n=64, bits=bits, group_size=group_size, m=m,
                       int8_activations=True)
    mod = _tvm.normalize_mod(uniform_compute_cuda_int8(spec, portable=True))
    function = _tvm.tvm.compile(mod, target=_tvm.Target({"kind": "llvm"}))[spec.name()]
    rng = np.random.default_rng(bits * 10 + m)
    tensors = FAMILY.example_tensors(spec, rng)
    weights = FAMILY.prepare(spec, **tensors, layout=layout.plane_words())
    x = rng.standard_normal((m, spec.k)).astype(np.float32)
    args = [_tvm.tvm.runtime.tensor(np.asarray(a)) for a in
            (x, *(t.numpy() for t in weights.tensors), np.zeros((m, spec.n), np.float32))]
    function(*args)
    weight = FAMILY.reference_weight(spec, **tensors).astype(np.float64)
    y = args[-1].numpy()
    assert relative_error(y, quantized_activations(x, spec.group_size) @ weight) < 1e-6
    assert relative_error(y, x.astype(np.float64) @ weight) < 3e-2


def test_plane_words_are_the_byte_planes_as_int32():
    spec = UniformSpec(k=256, n=32, bits=3, group_size=64, int8_activations=True)
    tensors = FAMILY.example_tensors(spec, np.random.default_rng(0))
    weights = FAMILY.prepare(spec, **tensors, layout=layout.plane_words())
    qweight = weights.tensors[0].numpy()
    planes = byte_planes(tensors["qweight"], spec.bits)          # uint8 [U, P, N, 4]
    assert qweight.dtype == np.int32 and qweight.shape == planes.shape[:3]
    assert qweight.tobytes() == planes.tobytes()
    with pytest.raises(SpecError, match=r"uint8 \[U, P, N, 4\]; got int32"):
        layout.pack({"qweight": weights.tensors[0]}, layout.plane_words())


@pytest.mark.parametrize("bits,group_size,m", [(4, 128, 1), (4, 128, 16), (2, 128, 4),
                                               (3, 128, 1), (3, 64, 8)])
def test_heuristic_kernels_use_dp4a_without_spills(bits, group_size, m):
    spec = UniformSpec(k=8192, n=28672, bits=bits, group_size=group_size, m=m,
                       int8_activations=True)
    source = cuda_source(uniform_int8.heuristic_schedule(_tvm.Schedule(_mod(spec)), spec, HW))
    definitions = re.findall(r'extern "C" __global__[^;{]*\{', source)
    assert len(definitions) == 2                               # quantize x, then the GEMV
    assert "__dp4a(" in source and "*(int4*)(qweight_local_ptr" in source
    report = ptxas_report(source, arch=HW.arch)
    if report is None:
        pytest.skip("nvcc is not installed: ptxas cannot report registers")
    assert report["spill_stores"] == 0 and report["spill_loads"] == 0
    assert report["stack_bytes"] == 0


def test_every_sketch_schedules_and_candidates_divide_their_loops():
    spec = UniformSpec(k=4096, n=4096, bits=4, group_size=128, m=4, int8_activations=True)
    cands = uniform_int8.knob_candidates(spec)
    assert cands["k_lanes"] == [1, 2, 4, 8, 16, 32] and cands["load_words"] == [1, 2, 4, 8]
    names = uniform_int8.sketches_for(spec, HW)
    assert names == ["x_block", "x_chunk", "x_registers", "x_quant_block"]
    spaces = uniform_int8.design_space(_tvm.Schedule(_mod(spec), seed=3), spec, HW)
    assert len(spaces) == len(names) + 1
    big = UniformSpec(k=28672, n=8192, m=16, int8_activations=True)
    assert "x_block" not in uniform_int8.sketches_for(big, HW)  # 448 KiB of x


def test_too_few_groups_are_refused_with_the_rule():
    spec = UniformSpec(k=1024, n=256, group_size=256, int8_activations=True)
    with pytest.raises(SpecError, match=r"at least 8 groups.*has 4"):
        uniform_int8.sketches_for(spec, HW)


def test_export_records_the_layout_and_its_compute(tmp_path):
    spec = UniformSpec(k=1024, n=2048, m=1, bits=3, int8_activations=True)
    assert compute_for(spec, "cuda").attrs[COMPUTE_ATTR] == COMPUTE_NAME  # 3 bits: dp4a
    result = build_untuned(spec, PRESET, tmp_path)
    manifest = json.loads(result.manifest_path.read_text())
    assert manifest["layout"] == layout.plane_words()
    assert "__dp4a(" in (tmp_path / f"{spec.name()}.cu").read_text()


@pytest.mark.parametrize("bits,m,knobs", [
    (4, 1, dict(k_lanes=4, n_lanes=8, n_vecs=1, m_lanes=1, load_words=2, unroll=64)),
    (2, 2, dict(k_lanes=2, n_lanes=4, n_vecs=2, m_lanes=2, load_words=1, unroll=0)),
    (3, 1, dict(k_lanes=4, n_lanes=8, n_vecs=1, m_lanes=1, load_words=1, unroll=64)),
])
def test_quantizing_in_the_block_matches_the_int8_reference(bits, m, knobs):
    """The one-kernel sketch (x quantized by every block into shared memory), its CUDA C run on
    the CPU emulator: group maxima and sums as shuffle reductions over a row's threads."""
    spec = UniformSpec(k=1024, n=256, bits=bits, group_size=128, m=m, int8_activations=True)
    sch = uniform_int8.sketch(_tvm.Schedule(_mod(spec)), spec, HW, uniform_int8.IN_BLOCK, knobs)
    kernel = emulate(sch.mod, TARGET)
    rng = np.random.default_rng(bits + m)
    tensors = FAMILY.example_tensors(spec, rng)
    qweight, scales, zeros = (t.numpy() for t in
                              FAMILY.prepare(spec, **tensors, layout=layout.plane_words()).tensors)
    x = rng.standard_normal((m, spec.k)).astype(np.float32)
    y = aligned(np.full((m, spec.n), np.nan, dtype=np.float32))
    kernel(x=aligned(x), qweight=aligned(qweight), scales=aligned(scales), zeros=aligned(zeros),
           y=y)
    weight = FAMILY.reference_weight(spec, **tensors).astype(np.float64)
    assert not np.isnan(y).any()
    assert relative_error(y, quantized_activations(x, spec.group_size) @ weight) < 1e-6
