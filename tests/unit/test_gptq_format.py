import numpy as np
import pytest

from qcompile.errors import FormatError
from qcompile.formats import bitpack
from qcompile.formats.gptq import GptqTensors, pack_zeros, unpack_zeros
from qcompile.quantize.rtn import quantize_rtn

BITS = bitpack.SUPPORTED_BITS


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("convention", ["v1", "v2"])
def test_zero_points_round_trip_including_zero(bits, convention):
    rng = np.random.default_rng(bits)
    zeros = rng.integers(0, 1 << bits, size=(3, 64))
    zeros[0, :] = 0  # asymmetric z = 0: v1 stores -1, which borrows from the next field
    packed = pack_zeros(zeros, bits, convention)
    assert packed.shape == (3, 64 * bits // 32) and packed.dtype == np.int32
    np.testing.assert_array_equal(unpack_zeros(packed, bits, 64, convention), zeros)


def test_v1_stores_z_minus_one():
    packed = pack_zeros(np.full((1, 8), 8), 4, "v1")
    assert packed.view(np.uint32)[0, 0] == 0x77777777
    packed = pack_zeros(np.full((1, 8), 8), 4, "v2")
    assert packed.view(np.uint32)[0, 0] == 0x88888888


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("group_size", [32, 64, -1])
@pytest.mark.parametrize("sym", [True, False])
def test_dequantize_matches_the_formula(bits, group_size, sym):
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((128, 64)).astype(np.float32)
    t = quantize_rtn(weight, bits, group_size, sym=sym)
    q = bitpack.unpack(t.qweight, bits)
    z = unpack_zeros(t.qzeros, bits, 64, "v1")
    g = np.arange(128) // (128 if group_size == -1 else group_size)
    expected = t.scales.astype(np.float32)[g] * (q - z[g])
    np.testing.assert_array_equal(t.dequantize(), expected)
    if not sym:  # asymmetric RTN covers [min, max]; the rounded zero-point shifts the grid by at
        # most half a step, so no weight is off by more than one step
        step = t.scales.astype(np.float32)[g]
        assert np.all(np.abs(t.dequantize() - weight) <= step * 1.001)


def _layer(bits=4, k=256, n=64, group_size=64):
    weight = np.random.default_rng(1).standard_normal((k, n)).astype(np.float32)
    return quantize_rtn(weight, bits, group_size)


def test_validation_names_tensor_rule_and_numbers():
    t = _layer()
    ok = dict(qweight=t.qweight, scales=t.scales, qzeros=t.qzeros, bits=4, group_size=64)
    GptqTensors.from_tensors(**ok)
    with pytest.raises(FormatError, match=r"scales must have shape \[G, N\]=\(4, 64\).*\(3, 64\)"):
        GptqTensors.from_tensors(**{**ok, "scales": t.scales[:3]})
    with pytest.raises(FormatError, match=r"qzeros must have shape.*\(4, 8\).*\(4, 7\)"):
        GptqTensors.from_tensors(**{**ok, "qzeros": t.qzeros[:, :7]})
    with pytest.raises(FormatError, match="qweight must be int32 or uint32; got float32"):
        GptqTensors.from_tensors(**{**ok, "qweight": t.qweight.astype(np.float32)})
    with pytest.raises(FormatError, match="bits=5"):
        GptqTensors.from_tensors(**{**ok, "bits": 5})
    with pytest.raises(FormatError, match="K=256 must be divisible by group_size=96"):
        GptqTensors.from_tensors(**{**ok, "group_size": 96})
    bad_g_idx = np.arange(256) // 64
    bad_g_idx[0] = 1
    with pytest.raises(FormatError, match="group 0 has 63 rows"):
        GptqTensors.from_tensors(**ok, g_idx=bad_g_idx)
    with pytest.raises(FormatError, match=r"g_idx must have shape \[K\]=\(256,\); got \(255,\)"):
        GptqTensors.from_tensors(**ok, g_idx=np.zeros(255, np.int32))
