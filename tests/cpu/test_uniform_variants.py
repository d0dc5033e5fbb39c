"""Compiled uniform kernels against the float64 reference over bits x group size x sym x v1/v2 x
act_order x M x activation dtype. The weights' variants (sym, v1/v2, act_order's separate
gather) change only ``prepare``, so each compiled kernel serves all of them."""

import numpy as np
import pytest
import torch

from qcompile.formats.gptq import GptqTensors, pack_zeros
from qcompile.kernels import UniformSpec, get_family
from qcompile.quantize.rtn import quantize_rtn
from qcompile.testing.kernels import compile_fixed, relative_error
from schedules.cpu import uniform as cpu_uniform

FAMILY = get_family("uniform")
TILES = {"n_blk": 1, "n_reg": 2, "g_in": 2}
K, N = 256, 128

#: Largest error of the output's own rounding, relative to max |y| (fp32: accumulation only).
TOLERANCE = {"float32": 1e-5, "float16": 1e-3, "bfloat16": 8e-3}


def scrambled_g_idx(k, group_size, rng):
    """g_idx as GPTQ writes it with desc_act: groups formed in a permuted order."""
    size = k if group_size == -1 else group_size
    return (np.arange(k) // size)[np.argsort(rng.permutation(k))].astype(np.int32)


def layer(bits, group_size, sym, convention, act_order, seed):
    rng = np.random.default_rng(seed)
    t = quantize_rtn(rng.standard_normal((K, N)).astype(np.float32) * 0.05, bits, group_size,
                     sym=sym)
    qzeros = pack_zeros(t.zeros(), bits, convention)
    g_idx = scrambled_g_idx(K, group_size, rng) if act_order else None
    return GptqTensors.from_tensors(qweight=t.qweight, scales=t.scales, qzeros=qzeros, bits=bits,
                                    group_size=group_size, g_idx=g_idx,
                                    zero_convention=convention)


@pytest.mark.parametrize("m", [1, 8])
@pytest.mark.parametrize("group_size", [32, 128, -1])
@pytest.mark.parametrize("bits", [2, 3, 4, 8])
def test_kernel_matches_reference_for_every_weight_variant(avx2, bits, group_size, m):
    spec = UniformSpec(k=K, n=N, bits=bits, group_size=group_size, m=m)
    function = compile_fixed(spec, avx2, cpu_uniform.register_tile, TILES)
    rng = np.random.default_rng(bits * 1000 + m)
    x = torch.from_numpy(rng.standard_normal((m, K)).astype(np.float32))
    for sym in (True, False):
        for convention in ("v1", "v2"):
            for act_order in (False, True):
                t = layer(bits, group_size, sym, convention, act_order, seed=bits + m)
                prepared = FAMILY.prepare(spec, qweight=t.qweight, scales=t.scales,
                                          qzeros=t.qzeros, g_idx=t.g_idx,
                                          zero_convention=convention)
                assert ("perm" in prepared.extras) == (act_order and group_size != -1)
                y = FAMILY.run(spec, function, x, prepared)
                ref = x.numpy().astype(np.float64) @ t.dequantize().astype(np.float64)
                error = relative_error(y, ref)
                assert error < TOLERANCE["float32"], (sym, convention, act_order, error)


@pytest.mark.parametrize("sketch", cpu_uniform.SKETCHES, ids=lambda s: s.__name__)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("fused", [False, True], ids=["gather-step", "gather-fused"])
def test_half_activations_and_fused_gather(avx2, dtype, fused, sketch):
    m = 3
    spec = UniformSpec(k=K, n=N, bits=4, group_size=32, m=m, dtype=dtype, act_order=fused)
    function = compile_fixed(spec, avx2, sketch, TILES)
    t = layer(4, 32, False, "v1", True, seed=5)
    bias = torch.linspace(-1, 1, N)
    prepared = FAMILY.prepare(spec, qweight=t.qweight, scales=t.scales, qzeros=t.qzeros,
                              g_idx=t.g_idx, bias=bias)
    assert prepared.names[-1] == ("perm" if fused else "zeros")
    x = torch.randn(m, K, generator=torch.Generator().manual_seed(0)).to(getattr(torch, dtype))
    y = FAMILY.run(spec, function, x, prepared)
    assert y.dtype == x.dtype and y.shape == (m, N)
    ref = x.double().numpy() @ t.dequantize().astype(np.float64) + bias.double().numpy()
    assert relative_error(y, ref) < TOLERANCE[dtype]


def test_fused_float32_gather(avx2):
    spec = UniformSpec(k=K, n=N, bits=3, group_size=64, m=2, act_order=True)
    function = compile_fixed(spec, avx2, cpu_uniform.k_blocked, TILES)
    t = layer(3, 64, True, "v2", True, seed=9)
    prepared = FAMILY.prepare(spec, qweight=t.qweight, scales=t.scales, qzeros=t.qzeros,
                              g_idx=t.g_idx, zero_convention="v2")
    x = torch.randn(2, K, generator=torch.Generator().manual_seed(1))
    ref = x.double().numpy() @ t.dequantize().astype(np.float64)
    assert relative_error(FAMILY.run(spec, function, x, prepared), ref) < TOLERANCE["float32"]


def test_activation_dtype_is_checked(avx2):
    spec = UniformSpec(k=K, n=N, bits=4, group_size=32, m=1, dtype="float16")
    function = compile_fixed(spec, avx2, cpu_uniform.register_tile, TILES)
    t = layer(4, 32, True, "v1", False, seed=1)
    prepared = FAMILY.prepare(spec, qweight=t.qweight, scales=t.scales, qzeros=t.qzeros)
    with pytest.raises(ValueError, match="x must be float16 for this kernel; got float32"):
        FAMILY.run(spec, function, torch.zeros(K), prepared)


@pytest.mark.parametrize("bits, group_size", [(2, 32), (3, 64), (4, 128), (8, -1)])
def test_dense_dequantize_kernel(avx2, bits, group_size):
    """The prefill path's compiled dequantization gives the reference weight, rows in P order."""
    from qcompile.kernels.uniform.dense import dequantize

    spec = UniformSpec(k=K, n=N, bits=bits, group_size=group_size)
    t = layer(bits, group_size, False, "v1", True, seed=11)
    prepared = FAMILY.prepare(spec, qweight=t.qweight, scales=t.scales, qzeros=t.qzeros,
                              g_idx=t.g_idx)
    permutation = prepared.extras["perm"].numpy() if "perm" in prepared.extras else np.arange(K)
    np.testing.assert_array_equal(dequantize(spec, prepared, avx2).numpy(),
                                  t.dequantize()[permutation])
