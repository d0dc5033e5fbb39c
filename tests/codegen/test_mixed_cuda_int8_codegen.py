"""The mixed family's int8-activation CUDA kernels (dp4a), checked on this machine without a
GPU: the compute's numbers (dp4a spelt in plain arithmetic, built for the CPU), both kernels of
every sketch run one after the other on the CPU emulator, the weight layout, ptxas's report and
the export. The kernels themselves run in tests/cuda/test_mixed_int8_cuda.py on a GPU."""

import json

import numpy as np
import pytest

import targets
from qcompile import _tvm
from qcompile.build import build_untuned
from qcompile.kernels import MixedSpec, get_family
from qcompile.kernels.layouts import mixed as layout
from qcompile.kernels.mixed.compute_cuda_int8 import COMPUTE_NAME, mixed_compute_cuda_int8
from qcompile.kernels.tir.attrs import COMPUTE_ATTR
from qcompile.testing.cuda_emulator import aligned, emulate_all, ptxas_report
from qcompile.testing.kernels import relative_error
from schedules.cuda import mixed_int8
from schedules.variants import compute_for

FAMILY = get_family("mixed")
PRESET = targets.get("cuda")
HW = PRESET.hardware()
TARGET = _tvm.Target(PRESET.tvm_target())


def operands(spec, seed):
    """(x, the format's arrays, the kernel's operands by name in layout plane_words)."""
    rng = np.random.default_rng(seed)
    tensors = FAMILY.example_tensors(spec, rng)
    prepared = FAMILY.prepare(spec, **tensors, layout=layout.plane_words())
    x = rng.standard_normal((spec.m, spec.k)).astype(np.float32)
    return x, tensors, {n: t.numpy() for n, t in zip(prepared.names, prepared.tensors,
                                                       strict=True)}


@pytest.mark.parametrize("spec", [
    MixedSpec(k=1024, n=64, m=1, outlier_share=0.01, int8_activations=True),
    MixedSpec(k=2048, n=64, m=3, g1=32, g2=8, g4=128, int8_activations=True),
], ids=["g16-m1", "g32-m3"])
def test_compute_matches_the_int8_reference(spec):
    """The compute itself (x in storage order per part, each dp4a step's codes, first-order
    scale codes, zero-points, outliers with the float x), built for the CPU."""
    mod = _tvm.normalize_mod(mixed_compute_cuda_int8(spec, portable=True))
    function = _tvm.tvm.compile(mod, target=_tvm.Target({"kind": "llvm"}))[spec.name()]
    x, tensors, ops = operands(spec, spec.m)
    args = [_tvm.tvm.runtime.tensor(np.asarray(a)) for a in
            (x, *ops.values(), np.zeros((spec.m, spec.n), np.float32))]
    function(*args)
    y = args[-1].numpy()
    assert relative_error(y, FAMILY.kernel_reference(spec, x, **tensors)) < 1e-6
    assert relative_error(y, FAMILY.reference(spec, x, **tensors)) < 3e-2


def test_plane_words_are_the_format_words_and_unpack_back():
    spec = MixedSpec(k=1024, n=64, int8_activations=True)
    tensors = FAMILY.example_tensors(spec, np.random.default_rng(0))
    _, _, ops = operands(spec, 0)
    for name in ("codes2", "codes4"):
        assert ops[name].dtype == np.int32
        np.testing.assert_array_equal(ops[name][:, 0, :], tensors[name])
    planes = FAMILY.kernel_operands(spec, tensors, None)
    back = layout.unpack(layout.pack(planes, layout.plane_words(), spec.g2),
                         layout.plane_words(), spec.g2)
    for name in ("codes2", "codes4"):
        np.testing.assert_array_equal(back[name], planes[name])


def _emulated(spec, sketch, knobs, seed):
    sch = mixed_int8.sketch(_tvm.Schedule(_tvm.normalize_mod(compute_for(spec, "cuda"))),
                            spec, HW, sketch, knobs)
    x, tensors, ops = operands(spec, seed)
    lay = spec.layout
    y = aligned(np.full((spec.m, spec.n), np.nan, np.float32))
    buffers = {"x": aligned(x), **{n: aligned(a) for n, a in ops.items()}, "y": y,
               # the global buffers the quantize-x kernel hands to the GEMV, poisoned
               "xq_words": aligned(np.full((spec.m, lay.groups * lay.g1 // 4), -1, np.int32)),
               "xq_sum": aligned(np.full((spec.m, lay.groups), -1, np.int32)),
               "x_step": aligned(np.full((spec.m, lay.groups), np.nan, np.float32))}
    emulate_all(sch.mod, TARGET, buffers)
    assert not np.isnan(y).any(), "the kernels left outputs unwritten"
    return y, FAMILY.kernel_reference(spec, x, **tensors)


@pytest.mark.parametrize(("sketch", "m", "knobs"), [
    ("sync+k_warps", 1, {"k_lanes": 4, "n_lanes": 8, "load_groups": 2, "unroll": 64}),
    ("async+k_warps", 1, {"k_lanes": 4, "n_lanes": 8, "load_groups": 4, "unroll": 64}),
    ("async+k_warps", 3, {"k_lanes": 2, "n_lanes": 16, "load_groups": 2, "unroll": 0}),
    ("sync", 2, {"k_lanes": 4, "n_lanes": 4, "load_groups": 1, "unroll": 512}),
    ("async", 1, {"k_lanes": 4, "n_lanes": 8, "load_groups": 1, "unroll": 64}),
])
def test_emulated_kernels_match_the_int8_reference(sketch, m, knobs):
    spec = MixedSpec(k=1024, n=256, m=m, outlier_share=0.01, int8_activations=True)
    y, reference = _emulated(spec, sketch, knobs, seed=m)
    assert relative_error(y, reference) < 1e-6


def test_the_untuned_kernel_at_the_measured_shape_uses_dp4a_without_spills():
    spec = MixedSpec(k=8192, n=28672, outlier_share=0.002, int8_activations=True)
    name, knobs = mixed_int8.heuristic_knobs(spec, HW)
    assert (name, knobs) == ("async+k_warps", {"k_lanes": 8, "n_lanes": 16, "load_groups": 4,
                                               "unroll": 64})
    assert mixed_int8.heuristic_knobs(MixedSpec(k=8192, n=28672, m=4, int8_activations=True),
                                      HW)[0] == "sync+k_warps"
    sch = mixed_int8.heuristic_schedule(
        _tvm.Schedule(_tvm.normalize_mod(compute_for(spec, "cuda"))), spec, HW)
    lib = _tvm.tvm.compile(sch.mod, target=TARGET)
    (device,) = [m for m in lib.mod.imports if m.kind == "cuda"]
    source = device.inspect_source()
    assert source.count('extern "C" __global__ void __launch_bounds__') == 4  # 2 declared + 2
    assert "__dp4a(" in source and "*(int4*)(codes2_local_ptr" in source
    report = ptxas_report(source, arch=HW.arch)
    if report is None:
        pytest.skip("nvcc is not installed: ptxas cannot report registers")
    assert report["spill_stores"] == 0 and report["spill_loads"] == 0


def test_design_space_holds_every_sketch():
    spec = MixedSpec(k=1024, n=256, int8_activations=True)
    spaces = mixed_int8.design_space(
        _tvm.Schedule(_tvm.normalize_mod(compute_for(spec, "cuda")), seed=1), spec, HW)
    assert len(spaces) == len(mixed_int8.SKETCHES)


def test_export_records_the_layout_and_its_compute(tmp_path):
    spec = MixedSpec(k=1024, n=256, m=2, int8_activations=True)
    assert compute_for(spec, "cuda").attrs[COMPUTE_ATTR] == COMPUTE_NAME
    result = build_untuned(spec, PRESET, tmp_path)
    manifest = json.loads(result.manifest_path.read_text())
    assert manifest["layout"] == layout.plane_words()
    assert "__dp4a(" in (tmp_path / f"{spec.name()}.cu").read_text()
