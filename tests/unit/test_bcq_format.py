"""BCQ format: sign-plane packing, table keys, the exact uniform -> BCQ conversion, the
quantizer."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from qcompile.errors import FormatError
from qcompile.formats import bcq
from qcompile.formats.act_order import reorder
from qcompile.formats.gptq import GptqTensors
from qcompile.quantize.bcq import quantize_bcq
from qcompile.quantize.rtn import quantize_rtn


@st.composite
def sign_planes(draw):
    q = draw(st.integers(1, 4))
    words = draw(st.integers(1, 3))
    cols = draw(st.integers(1, 4))
    return draw(hnp.arrays(np.int8, (q, words * 32, cols), elements=st.sampled_from([-1, 1])))


@settings(max_examples=150, deadline=None)
@given(sign_planes())
def test_pack_unpack_round_trip(signs):
    planes = bcq.pack_planes(signs)
    assert planes.dtype == np.int32
    assert planes.shape == (signs.shape[0], signs.shape[1] // 32, signs.shape[2])
    np.testing.assert_array_equal(bcq.unpack_planes(planes), signs)


@settings(max_examples=100, deadline=None)
@given(sign_planes(), st.data())
def test_bit_k_mod_32_of_word_k_div_32_is_the_sign_of_row_k(signs, data):
    planes = bcq.pack_planes(signs).view(np.uint32)
    i = data.draw(st.integers(0, signs.shape[0] - 1))
    k = data.draw(st.integers(0, signs.shape[1] - 1))
    n = data.draw(st.integers(0, signs.shape[2] - 1))
    assert bool(planes[i, k // 32, n] >> np.uint32(k % 32) & 1) == (signs[i, k, n] == 1)


@settings(max_examples=100, deadline=None)
@given(sign_planes(), st.integers(2, 8))
def test_table_key_bit_j_is_the_sign_of_row_c_mu_plus_j(signs, mu):
    k = signs.shape[1] // mu * mu
    keys = bcq.table_keys(bcq.pack_planes(signs), mu) if signs.shape[1] % mu == 0 else None
    if keys is None:
        with pytest.raises(FormatError, match="multiple of mu"):
            bcq.table_keys(bcq.pack_planes(signs), mu)
        return
    for c in range(k // mu):
        for j in range(mu):
            np.testing.assert_array_equal((keys[:, c] >> j) & 1, signs[:, c * mu + j] > 0)


def test_pack_refuses_bad_input():
    with pytest.raises(FormatError, match="K=40 must be a multiple of 32"):
        bcq.pack_planes(np.ones((1, 40, 2), dtype=np.int8))
    with pytest.raises(FormatError, match="-1 or \\+1; found 0"):
        bcq.pack_planes(np.zeros((1, 32, 2), dtype=np.int8))


def test_from_tensors_names_the_rule():
    planes = np.zeros((3, 4, 8), dtype=np.int32)
    with pytest.raises(FormatError, match=r"alpha must be float16 \[G, q, N\]=\(1, 3, 8\)"):
        bcq.BcqTensors.from_tensors(planes=planes, alpha=np.zeros((1, 2, 8), np.float16),
                                    z=np.zeros((1, 8), np.float32), group_size=128)
    with pytest.raises(FormatError, match="divisible by group_size=48"):
        bcq.BcqTensors.from_tensors(planes=planes, alpha=np.zeros((1, 3, 8), np.float16),
                                    z=np.zeros((1, 8), np.float32), group_size=48)


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize("group_size", [32, 128, -1])
def test_uniform_to_bcq_is_exact(bits, group_size):
    rng = np.random.default_rng(bits * 100 + group_size)
    layer = quantize_rtn(rng.standard_normal((256, 32)).astype(np.float32) * 0.05, bits,
                         group_size)
    converted = bcq.from_uniform(layer)
    assert converted.q == bits and converted.group_size == group_size
    np.testing.assert_array_equal(converted.dequantize(), layer.dequantize())
    # alpha_i = 2**(i-1) s, exactly
    scales = layer.scales.astype(np.float32)
    for i in range(bits):
        np.testing.assert_array_equal(converted.alpha[:, i].astype(np.float32),
                                      scales * 2.0 ** (i - 1))


def test_uniform_to_bcq_after_act_order_reorder():
    rng = np.random.default_rng(5)
    layer = quantize_rtn(rng.standard_normal((128, 8)).astype(np.float32), 4, 32)
    perm_g = rng.permutation(np.arange(128) // 32).astype(np.int32)
    shuffled = GptqTensors.from_tensors(qweight=layer.qweight, scales=layer.scales,
                                        qzeros=layer.qzeros, g_idx=perm_g, bits=4, group_size=32)
    with pytest.raises(FormatError, match="reorder the layer first"):
        bcq.from_uniform(shuffled)
    permutation, sequential = reorder(shuffled)
    converted = bcq.from_uniform(sequential)
    np.testing.assert_array_equal(converted.dequantize(), shuffled.dequantize()[permutation])


def test_uniform_to_bcq_refuses_float32_scales():
    layer = quantize_rtn(np.ones((64, 8), np.float32), 4, 32)
    f32 = GptqTensors.from_tensors(qweight=layer.qweight, scales=layer.scales.astype(np.float32),
                                   qzeros=layer.qzeros, bits=4, group_size=32)
    with pytest.raises(FormatError, match="scales must be float16"):
        bcq.from_uniform(f32)


def test_quantizer_error_falls_as_q_rises():
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((256, 48)) * 0.02
    errors = []
    for q in (1, 2, 3, 4):
        tensors, report = quantize_bcq(weight, q, 64, iterations=8)
        measured = np.linalg.norm(tensors.dequantize() - weight) / np.linalg.norm(weight)
        assert report.relative_error == pytest.approx(measured, rel=1e-4)
        errors.append(report.relative_error)
    assert all(a > b for a, b in zip(errors, errors[1:], strict=False)), errors
    assert errors[-1] < 0.12  # 4 planes, 64 weights per alpha


def test_refinement_improves_on_greedy_and_never_rises():
    rng = np.random.default_rng(1)
    weight = rng.standard_normal((128, 32)) + 0.3   # an offset: the bias z pays off
    _, report = quantize_bcq(weight, 3, 32, iterations=10)
    assert report.history[-1] < report.greedy_error
    assert all(b <= a + 1e-12 for a, b in zip(report.history, report.history[1:], strict=False))
    assert report.relative_error <= report.greedy_error


def test_quantizer_represents_uniform_grids_exactly():
    """Weights already on a 2-bit uniform grid per group: ALS finds zero error."""
    rng = np.random.default_rng(2)
    codes = rng.integers(0, 4, size=(64, 8))
    weight = (codes - 1.5) * 0.25 + 1.0
    tensors, report = quantize_bcq(weight, 2, 32, iterations=10)
    assert report.relative_error < 1e-6
    np.testing.assert_allclose(tensors.dequantize(), weight, atol=1e-6)
