"""The uniform family's operands without compilation: zero-point conventions through
``prepare``, act_order's reorder, the bias, and the new spec fields."""

import numpy as np
import pytest
import torch

from qcompile.errors import FormatError, SpecError
from qcompile.formats import bitpack
from qcompile.formats.gptq import GptqTensors, pack_zeros
from qcompile.kernels import UniformSpec, spec_from_dict
from qcompile.kernels.uniform import FAMILY
from qcompile.quantize.rtn import quantize_rtn


def dense(spec, prepared):
    """W [K, N] from prepare's operands, in numpy."""
    qweight, scales, zeros = (t.numpy() for t in prepared.tensors[:3])
    group = np.arange(spec.k) // spec.effective_group_size
    codes = bitpack.unpack(qweight, spec.bits).astype(np.float32)
    return scales.astype(np.float32)[group] * (codes - zeros.astype(np.float32)[group])


@pytest.mark.parametrize("bits", bitpack.SUPPORTED_BITS)
@pytest.mark.parametrize("convention", ["v1", "v2"])
@pytest.mark.parametrize("sym", [True, False])
def test_prepared_weights_dequantize_to_the_reference(bits, convention, sym):
    """prepare's operands (reordered rows, unpacked zero-points) describe the same W[P]."""
    rng = np.random.default_rng(bits)
    k, n, gs = 256, 64, 64
    t = quantize_rtn(rng.standard_normal((k, n)).astype(np.float32), bits, gs, sym=sym)
    zeros = t.zeros()
    if not sym:
        zeros[0, :5] = 0  # v1 cannot store z = 0 field-wise: the whole-word convention must hold
    g_idx = (np.arange(k) // gs)[np.argsort(rng.permutation(k))].astype(np.int32)
    layer = GptqTensors.from_tensors(qweight=t.qweight, scales=t.scales,
                                     qzeros=pack_zeros(zeros, bits, convention), bits=bits,
                                     group_size=gs, g_idx=g_idx, zero_convention=convention)
    spec = UniformSpec(k=k, n=n, bits=bits, group_size=gs)
    prepared = FAMILY.prepare(spec, qweight=layer.qweight, scales=layer.scales,
                              qzeros=layer.qzeros, g_idx=g_idx, zero_convention=convention)
    permutation = prepared.extras["perm"].numpy()
    np.testing.assert_array_equal(np.sort(g_idx[permutation]), g_idx[permutation])
    np.testing.assert_array_equal(dense(spec, prepared), layer.dequantize()[permutation])


def test_trivial_g_idx_costs_nothing():
    t = quantize_rtn(np.ones((128, 32), np.float32), 4, 32)
    spec = UniformSpec(k=128, n=32, bits=4, group_size=32)
    prepared = FAMILY.prepare(spec, qweight=t.qweight, scales=t.scales, qzeros=t.qzeros,
                              g_idx=np.arange(128) // 32)
    assert "perm" not in prepared.extras and prepared.names == ("qweight", "scales", "zeros")
    np.testing.assert_array_equal(prepared.tensors[0].numpy(), t.qweight)
    fused = UniformSpec(k=128, n=32, bits=4, group_size=32, act_order=True)
    prepared = FAMILY.prepare(fused, qweight=t.qweight, scales=t.scales, qzeros=t.qzeros)
    np.testing.assert_array_equal(prepared.tensors[3].numpy(), np.arange(128))


def test_bias_is_checked():
    t = quantize_rtn(np.ones((128, 32), np.float32), 4, 32)
    spec = UniformSpec(k=128, n=32, bits=4, group_size=32)
    ok = dict(qweight=t.qweight, scales=t.scales, qzeros=t.qzeros)
    prepared = FAMILY.prepare(spec, **ok, bias=torch.ones(32, dtype=torch.bfloat16))
    assert prepared.extras["bias"].dtype == torch.float32
    with pytest.raises(FormatError, match=r"bias must have shape \[N\]=\(32,\); got \(31,\)"):
        FAMILY.prepare(spec, **ok, bias=torch.ones(31))
    with pytest.raises(FormatError, match="bias must be float16, bfloat16 or float32; got int32"):
        FAMILY.prepare(spec, **ok, bias=torch.ones(32, dtype=torch.int32))


def test_spec_fields_names_and_digests():
    base = UniformSpec(k=4096, n=4096)
    # act_order is left out of a False spec's JSON: digests (and tuned records) of specs from
    # before the field existed stay valid
    assert "act_order" not in base.to_dict()
    assert base.digest() == "4ae4e3e77e2f14414d97ad42cdd01ecebf815dea03eeb3c577857d82a6076284"
    fused = UniformSpec(k=4096, n=4096, act_order=True, dtype="bfloat16", m=8)
    assert fused.name() == "uniform_b4_g128_k4096_n4096_m8_bf16_ao"
    assert spec_from_dict(fused.to_dict()) == fused and fused.digest() != base.digest()
    assert UniformSpec(k=4096, n=4096, dtype="float16").name().endswith("_m1_f16")
    with pytest.raises(SpecError, match="act_order must be True or False; got 1"):
        UniformSpec(k=4096, n=4096, act_order=1)
    with pytest.raises(SpecError, match="dtype='float64' is not supported"):
        UniformSpec(k=4096, n=4096, dtype="float64")
