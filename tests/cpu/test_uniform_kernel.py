"""Compiled uniform kernels (fixed schedules from each sketch) against the numpy reference."""

import numpy as np
import pytest
import torch

from qcompile.kernels import UniformSpec, get_family
from qcompile.testing.kernels import compile_fixed, relative_error
from schedules.cpu import uniform as cpu_uniform

FAMILY = get_family("uniform")


@pytest.mark.parametrize("group_size", [32, 64, 128, -1])
@pytest.mark.parametrize("sketch", cpu_uniform.SKETCHES, ids=lambda s: s.__name__)
def test_4bit_kernel_matches_reference(cpu_preset, group_size, sketch):
    spec = UniformSpec(k=512, n=256, bits=4, group_size=group_size)
    tiles = {"n_blk": 2, "n_reg": 2, "g_in": 1 if group_size == -1 else 2}
    function = compile_fixed(spec, cpu_preset, sketch, tiles)
    rng = np.random.default_rng(group_size + 7)
    tensors = FAMILY.example_tensors(spec, rng)
    x = rng.standard_normal(spec.k).astype(np.float32)
    y = FAMILY.run(spec, function, torch.from_numpy(x), FAMILY.prepare(spec, **tensors))
    assert y.shape == (spec.n,) and y.dtype == torch.float32
    assert relative_error(y.numpy(), FAMILY.reference(spec, x, **tensors)) < 1e-5


@pytest.mark.parametrize("bits", [2, 3, 8])
def test_other_bit_widths_match_reference(avx2, bits):
    spec = UniformSpec(k=256, n=128, bits=bits, group_size=64)
    function = compile_fixed(spec, avx2, cpu_uniform.register_tile, {"n_blk": 1, "n_reg": 4})
    rng = np.random.default_rng(bits)
    tensors = FAMILY.example_tensors(spec, rng)
    x = rng.standard_normal(spec.k).astype(np.float32)
    y = FAMILY.run(spec, function, x, FAMILY.prepare(spec, **tensors))
    assert relative_error(y.numpy(), FAMILY.reference(spec, x, **tensors)) < 1e-5


def test_v2_zero_points_give_the_same_output(avx2):
    from qcompile.formats.gptq import pack_zeros, unpack_zeros

    spec = UniformSpec(k=256, n=128, bits=4, group_size=64)
    function = compile_fixed(spec, avx2, cpu_uniform.register_tile, {"n_blk": 1, "n_reg": 4})
    tensors = FAMILY.example_tensors(spec, np.random.default_rng(3))
    zeros = unpack_zeros(tensors["qzeros"], 4, spec.n, "v1")
    v2 = {**tensors, "qzeros": pack_zeros(zeros, 4, "v2")}
    x = np.random.default_rng(4).standard_normal(spec.k).astype(np.float32)
    y1 = FAMILY.run(spec, function, x, FAMILY.prepare(spec, **tensors))
    y2 = FAMILY.run(spec, function, x, FAMILY.prepare(spec, zero_convention="v2", **v2))
    torch.testing.assert_close(y1, y2, rtol=0, atol=0)
