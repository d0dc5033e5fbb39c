"""The mixed family's n_tiled weight layout (qcompile/kernels/layouts/mixed.py): packing, the
CPU design space applying it, kernels in it against the reference, and a kernel refusing
weights packed for another layout."""

import numpy as np
import pytest
import torch

import qcompile
from qcompile import _tvm
from qcompile.build import build_untuned
from qcompile.errors import ArgumentError, SpecError
from qcompile.kernels import MixedSpec, get_family
from qcompile.kernels.layouts import mixed as mixed_layout
from qcompile.kernels.mixed.measure import alloc_arguments
from qcompile.testing.kernels import relative_error
from schedules import variants
from schedules.cpu import mixed as cpu_mixed
from schedules.variants import compute_for

FAMILY = get_family("mixed")
SPEC = MixedSpec(k=512, n=256, m=2, g4=64, outlier_share=0.01)


@pytest.mark.parametrize("as_torch", [False, True], ids=["numpy", "torch"])
def test_pack_round_trip_and_shapes(as_torch):
    tensors = FAMILY.example_tensors(SPEC, np.random.default_rng(0))
    if as_torch:
        tensors = {name: torch.from_numpy(a) for name, a in tensors.items()}
    layout = mixed_layout.n_tiled(32)
    packed = mixed_layout.pack(tensors, layout, SPEC.g2)
    lay = SPEC.layout
    assert tuple(packed["codes2"].shape) == (SPEC.n // 32, lay.rows2 // 16, 32)
    assert tuple(packed["scale2"].shape) == (SPEC.n // 32, lay.groups2, 32 // SPEC.g2)
    assert tuple(packed["zeros4"].shape) == (SPEC.n // 32, lay.scale_groups4, 32)
    # tile j, row r, column c is column j*T + c of the default layout
    assert packed["codes2"][3, 5, 7] == tensors["codes2"][5, 3 * 32 + 7]
    assert packed["scale2"][2, 4, 1] == tensors["scale2"][4, 2 * 2 + 1]
    for name in ("order", "row_ptr", "cols", "values"):  # indexed by data: unchanged
        assert packed[name] is tensors[name]
    back = mixed_layout.unpack(packed, layout, SPEC.g2)
    for name, array in tensors.items():
        np.testing.assert_array_equal(np.asarray(back[name]), np.asarray(array))
    assert mixed_layout.pack(tensors, None, SPEC.g2) == tensors


def test_a_tile_must_hold_whole_second_order_groups():
    tensors = FAMILY.example_tensors(SPEC, np.random.default_rng(0))
    with pytest.raises(SpecError, match="multiple of g2=16"):
        mixed_layout.pack(tensors, mixed_layout.n_tiled(8), SPEC.g2)
    with pytest.raises(SpecError, match="unknown weight layout"):
        mixed_layout.pack(tensors, {"kind": "z_order"}, SPEC.g2)


@pytest.mark.parametrize("tiles", [{"n_blk": 1, "n_reg": 4, "g_unroll": 2},
                                   {"n_blk": 2, "n_reg": 2, "g_unroll": 1}],
                         ids=["r4-u2", "r2-b2"])
def test_tiled_kernel_matches_reference(avx2, tiles):
    hw = avx2.hardware()
    tile_n = tiles["n_reg"] * cpu_mixed.vector_lanes(SPEC, hw)
    sch = cpu_mixed.with_layout(_tvm.Schedule(compute_for(SPEC, "cpu")), SPEC, tile_n)
    sch = cpu_mixed.register_tile(sch, SPEC, hw, tiles)
    func = next(iter(sch.mod.functions.values()))
    layout = variants.get("mixed_cpu").layout(SPEC, func)
    assert layout == mixed_layout.n_tiled(tile_n)
    function = _tvm.tvm.compile(sch.mod, target=_tvm.Target(avx2.tvm_target(hw)))[SPEC.name()]
    rng = np.random.default_rng(7)
    tensors = FAMILY.example_tensors(SPEC, rng)
    x = rng.standard_normal((SPEC.m, SPEC.k)).astype(np.float32)
    prepared = FAMILY.prepare(SPEC, **tensors, layout=layout)
    assert prepared.extras["layout"] == layout
    y = FAMILY.run(SPEC, function, torch.from_numpy(x), prepared)
    assert relative_error(y.numpy(), FAMILY.reference(SPEC, x, **tensors)) < 1e-5


def test_design_space_applies_the_layout_of_each_sketch(avx2):
    hw = avx2.hardware()
    spaces = cpu_mixed.design_space(_tvm.Schedule(compute_for(SPEC, "cpu"), seed=3), SPEC, hw)
    lanes = cpu_mixed.vector_lanes(SPEC, hw)
    layout = variants.get("mixed_cpu").layout
    tiles = [layout(SPEC, next(iter(s.mod.functions.values())))["tile_n"] for s in spaces]
    assert tiles == [r * lanes for r in cpu_mixed.tile_widths(SPEC, hw)] and tiles
    for sch in spaces:
        assert "T.parallel" in sch.mod.script()
        assert "transform_layout" in str(sch.trace)  # the layout replays from a record


def test_untuned_build_records_the_layout_and_refuses_other_weights(tmp_path, avx2):
    kernel = qcompile.load(build_untuned(SPEC, avx2, tmp_path).so_path)
    assert kernel.layout["kind"] == "n_tiled"
    assert kernel.manifest.data["layout"] == kernel.layout
    rng = np.random.default_rng(11)
    tensors = FAMILY.example_tensors(SPEC, rng)
    x = rng.standard_normal((SPEC.m, SPEC.k)).astype(np.float32)
    prepared = kernel.prepare(**tensors)
    assert prepared.extras["layout"] == kernel.layout
    assert relative_error(kernel(x, prepared), FAMILY.reference(SPEC, x, **tensors)) < 1e-5
    default = FAMILY.prepare(SPEC, **tensors)
    with pytest.raises(ArgumentError, match="reads n_tiled"):
        kernel(x, default)
    relaid = kernel.relayout(default)
    np.testing.assert_array_equal(kernel(x, relaid), kernel(x, prepared))


def test_measurement_operands_follow_the_candidates_layout(avx2):
    hw = avx2.hardware()
    sch = cpu_mixed.heuristic_schedule(_tvm.Schedule(compute_for(SPEC, "cpu")), SPEC, hw)
    func = next(iter(sch.mod.functions.values()))
    args_info = [(None, None, [int(d) for d in p.shape]) for p in func.params]
    (arrays,) = alloc_arguments(SPEC.to_json(), _tvm.tvm.cpu(0), args_info, 1)
    assert [tuple(a.shape) for a in arrays] == [tuple(info[2]) for info in args_info]
