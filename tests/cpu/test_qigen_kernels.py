"""Kernels from the QIGen-shaped design space (tiled weight layout, seeded knobs) against the
numpy reference, and the layout's trip from schedule to manifest to ``prepare``."""

import json

import numpy as np
import pytest
import torch

import qcompile
from qcompile import _tvm
from qcompile.build import build_untuned
from qcompile.errors import ArgumentError
from qcompile.kernels import UniformSpec, get_family
from qcompile.kernels.layouts import uniform as weight_layout
from qcompile.testing.kernels import relative_error
from schedules.cpu import uniform as cpu_uniform
from schedules.variants import compute_for

FAMILY = get_family("uniform")


def check(spec, function, layout, seed):
    rng = np.random.default_rng(seed)
    tensors = FAMILY.example_tensors(spec, rng)
    x = rng.standard_normal((spec.m, spec.k)).astype(np.float32)
    prepared = FAMILY.prepare(spec, layout=layout, **tensors)
    y = FAMILY.run(spec, function, torch.from_numpy(x), prepared)
    assert relative_error(y.numpy(), FAMILY.reference(spec, x, **tensors)) < 1e-5


@pytest.mark.parametrize("bits,group_size", [
    (4, 32), (4, 64), (4, 128), (4, -1), (2, 64), (2, -1), (3, 128), (3, -1), (8, 32), (8, -1)])
def test_every_sketch_of_the_space_matches_reference(avx2, bits, group_size):
    spec = UniformSpec(k=512, n=128, bits=bits, group_size=group_size, m=2)
    hw = avx2.hardware()
    mod = _tvm.normalize_mod(compute_for(spec, "cpu"))
    target = _tvm.Target(avx2.tvm_target(hw))
    spaces = cpu_uniform.design_space(_tvm.Schedule(mod, seed=bits), spec, hw)
    assert len(spaces) == 2 * len(cpu_uniform.plans(spec, hw))
    for i, sch in enumerate(spaces):
        layout = weight_layout.layout_of(sch.mod["main"])
        assert layout["kind"] == "n_tiled"
        function = _tvm.tvm.compile(sch.mod, target=target)["main"]
        check(spec, function, layout, seed=i)


def test_model_point_builds_loads_and_packs_its_layout(avx2, tmp_path):
    spec = UniformSpec(k=256, n=256, bits=4, group_size=64)
    result = build_untuned(spec, avx2, tmp_path)
    manifest = json.loads(result.manifest_path.read_text())
    plan = cpu_uniform.plans(spec, avx2.hardware())[0]
    assert manifest["layout"] == {"kind": "n_tiled", "tile_n": plan.tile_n}
    kernel = qcompile.load(result.so_path)
    tensors = FAMILY.example_tensors(spec, np.random.default_rng(0))
    weights = kernel.prepare(**tensors)
    assert tuple(weights.tensors[0].shape) == (256 // plan.tile_n, spec.packed_rows, plan.tile_n)
    x = np.random.default_rng(1).standard_normal(spec.k).astype(np.float32)
    assert relative_error(kernel(x, weights), FAMILY.reference(spec, x, **tensors)) < 1e-5
    gptq = FAMILY.prepare(spec, **tensors)  # GPTQ layout: refused with the rule, not a crash
    with pytest.raises(ArgumentError, match="layout gptq .* reads n_tiled"):
        kernel(x, gptq)
    y = kernel(x, kernel.relayout(gptq))  # a shared GPTQ copy packed for this kernel
    assert relative_error(y, FAMILY.reference(spec, x, **tensors)) < 1e-5


def test_pack_is_a_permutation_of_the_gptq_operands():
    q = torch.arange(4 * 64, dtype=torch.int32).reshape(4, 64)
    s = torch.arange(2 * 64, dtype=torch.float16).reshape(2, 64)
    z = (torch.arange(2 * 64) % 200).to(torch.uint8).reshape(2, 64)
    out = weight_layout.pack({"qweight": q, "scales": s, "zeros": z, "perm": "kept"},
                             weight_layout.n_tiled(16))
    assert out["perm"] == "kept" and tuple(out["qweight"].shape) == (4, 4, 16)
    for j in range(4):
        assert torch.equal(out["qweight"][j], q[:, 16 * j:16 * (j + 1)])
        assert torch.equal(out["scales"][j], s[:, 16 * j:16 * (j + 1)])
    with pytest.raises(Exception, match="must divide N=64"):
        weight_layout.pack({"qweight": q, "scales": s, "zeros": z}, weight_layout.n_tiled(24))
