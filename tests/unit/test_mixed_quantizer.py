"""The mixed 2/4/16-bit format and quantizer: average bits, layout rules, the quantizer's
choices on constructed weights, outliers only in 2-bit groups, second-order scales."""

import itertools

import numpy as np
import pytest

from qcompile.errors import FormatError
from qcompile.formats import bitpack
from qcompile.formats.mixed import MixedLayout, average_bits, storage_rows
from qcompile.quantize.mixed import quantize, quantize_scales

K, N = 512, 256


def test_paper_setting_stays_under_three_bits():
    """25% 4-bit, g1 = g2 = 16, 0.2% outliers: eq. (10) gives the paper's 2.84, and every
    stored bit (4-bit scales and zeros, outliers, row pointers, group order) stays <= 3.0."""
    for (k, n), g4 in itertools.product(((4096, 4096), (8192, 28672), (4096, 11008)),
                                        (64, 128)):
        layout = MixedLayout.from_shares(k, n, g1=16, g2=16, g4=g4, four_bit_share=0.25,
                                         outlier_share=0.002)
        bits = average_bits(layout)
        assert layout.groups4 * 4 == layout.groups
        assert bits.eq10 == pytest.approx(0.75 * (2 + 6 / 16 + 20 / 256) + 0.25 * 4)
        assert bits.eq10 == pytest.approx(2.84, abs=5e-3)
        assert bits.outliers == pytest.approx(32 * 0.002, rel=1e-3)
        assert bits.total <= 3.0, (k, n, bits.to_dict())


def test_average_bits_counts_every_component():
    layout = MixedLayout(k=1024, n=512, g1=32, g2=8, g4=64, groups4=10, nnz=77)
    bits = average_bits(layout)
    weights = 1024 * 512
    w2, w4 = (32 - 10) * 32 * 512, 10 * 32 * 512
    stored = (2 * w2 + (2 + 4) * w2 / 32 + (4 + 16) * w2 / (32 * 8) + 4 * w4 + 20 * w4 / 64
              + 32 * 77 + 32 * 513 + 32 * 32)
    assert bits.total == pytest.approx(stored / weights)


@pytest.mark.parametrize(("kwargs", "rule"), [
    ({"g1": 8}, "multiple of 16"),
    ({"g2": 7}, "divisible by g2=7"),
    ({"g4": 40}, "multiple of g1=16"),
    ({"four_bit_share": 0.0}, "at least 1"),
    ({"four_bit_share": 1.5}, "four_bit_share must lie in"),
])
def test_layout_rules_name_the_numbers(kwargs, rule):
    with pytest.raises(FormatError, match=rule):
        MixedLayout.from_shares(K, N, **{"g4": 64, **kwargs})


def _calibration(rng, k=K, rows=512, hot=()):
    x = rng.standard_normal((rows, k))
    for group in hot:
        x[:, group * 16:(group + 1) * 16] *= 10.0
    return x


def test_groups_of_large_range_go_4bit():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((K, N)).astype(np.float32) * 0.02
    wide = [3, 10, 17, 30]
    for group in wide:
        w[group * 16:(group + 1) * 16] *= 8.0
    layout = MixedLayout.from_shares(K, N, g4=64, four_bit_share=0.25, outlier_share=0.0)
    result = quantize(w, layout, x=_calibration(rng))
    four = set(result.tensors.order[layout.groups2:].tolist())
    assert set(wide) <= four and len(four) == 8


def test_groups_of_large_hessian_weight_go_4bit():
    """Equal weight ranges; the channels calibration drives hardest have the smallest
    [H^-1]_kk, hence the largest eq. (9) sensitivity."""
    rng = np.random.default_rng(2)
    w = rng.standard_normal((K, N)).astype(np.float32) * 0.02
    hot = [1, 2, 21, 28, 31]
    layout = MixedLayout.from_shares(K, N, g4=64, four_bit_share=0.25, outlier_share=0.0)
    result = quantize(w, layout, x=_calibration(rng, hot=hot))
    four = set(result.tensors.order[layout.groups2:].tolist())
    assert set(hot) <= four
    assert np.argsort(-result.sensitivity)[: len(hot)].tolist() == sorted(
        hot, key=lambda g: -result.sensitivity[g])


def test_outliers_come_only_from_2bit_groups_and_are_exact():
    rng = np.random.default_rng(3)
    w = rng.standard_normal((K, N)).astype(np.float32) * 0.02
    wide = [2, 5, 8, 11, 14, 20, 25, 29]  # these 8 groups go 4-bit ...
    for group in wide:
        w[group * 16:(group + 1) * 16] *= 8.0
    w[45, 7] = 1.0   # ... and a spike in one of them must not become an outlier
    spikes = [(300, 5), (301, 200), (17, 99)]  # rows in groups that stay 2-bit
    for r, c in spikes:
        w[r, c] = 0.5
    layout = MixedLayout.from_shares(K, N, g4=64, four_bit_share=0.25, outlier_share=0.002)
    result = quantize(w, layout, x=_calibration(rng))
    t = result.tensors
    assert sorted(t.order[layout.groups2:]) == wide
    columns = np.repeat(np.arange(N), np.diff(t.row_ptr))
    outliers = set(zip(t.cols[: layout.nnz].tolist(), columns.tolist(), strict=True))
    assert len(outliers) == layout.nnz
    rows2 = set(storage_rows(t.order, 16)[: layout.rows2].tolist())
    assert all(r in rows2 for r, _ in outliers)
    assert set(spikes) <= outliers and (45, 7) not in outliers
    # the 2-bit code under each outlier is its group's zero: the dense part adds exactly 0
    w2, _ = t.dense_parts()
    storage_index = {r: i for i, r in enumerate(storage_rows(t.order, 16)[: layout.rows2])}
    for r, c in outliers:
        assert w2[storage_index[r], c] == 0.0
    deq = t.dequantize()
    for r, c in spikes:
        assert deq[r, c] == np.float16(0.5)


def test_outliers_lower_the_error():
    rng = np.random.default_rng(4)
    w = (rng.standard_t(3, size=(K, N)) * 0.02).astype(np.float32)
    x = _calibration(rng)
    errors = []
    for share in (0.0, 0.002, 0.01):
        layout = MixedLayout.from_shares(K, N, g4=64, outlier_share=share)
        errors.append(quantize(w, layout, x=x).output_error)
    assert errors[0] > errors[1] > errors[2]


def test_dequantize_matches_the_formulas():
    rng = np.random.default_rng(5)
    w = rng.standard_normal((K, N)).astype(np.float32) * 0.02
    layout = MixedLayout.from_shares(K, N, g4=64)
    t = quantize(w, layout, h=np.eye(K)).tensors
    rows = storage_rows(t.order, 16)
    q2 = bitpack.unpack(t.codes2, 2)
    r, c = 37, 101  # a 2-bit weight, from the documented formula
    g = r // 16
    s1 = ((t.meta2[g, c] >> 2) + t.zero2[g, c // 16]) * np.float32(t.scale2[g, c // 16])
    expect = (q2[r, c] - (t.meta2[g, c] & 3)) * s1
    outlier = t.cols[t.row_ptr[c]:t.row_ptr[c + 1]]
    if rows[r] not in outlier:
        assert t.dequantize()[rows[r], c] == pytest.approx(expect, rel=1e-6)
    q4 = bitpack.unpack(t.codes4, 4)
    r4 = 70
    expect4 = (q4[r4, c] - t.zeros4[r4 // 64, c]) * np.float32(t.scales4[r4 // 64, c])
    assert t.dequantize()[rows[layout.rows2 + r4], c] == pytest.approx(expect4, rel=1e-6)


def test_second_order_scales_are_close_and_positive():
    rng = np.random.default_rng(6)
    scales = rng.uniform(0.001, 0.05, size=(12, 64))
    scales[3] = 0.02  # a flat row: min == max
    scales[5, :16] = np.linspace(0.03, 0.031, 16)  # tight range: zero offset near 15
    s1q, scale2, zero2, dq = quantize_scales(scales, 16)
    assert s1q.max() <= 15 and zero2.max() <= 15 and np.all(dq > 0)
    step = np.repeat(scale2.astype(np.float64), 16, axis=1)
    guarded = (dq == step.astype(np.float32)) & (scales < 0.5 * step)  # code 0 raised to 1
    assert np.all(np.abs(dq - scales)[~guarded] <= 0.5 * step[~guarded] + 1e-6)
    assert np.all(np.abs(dq - scales)[guarded] <= step[guarded])


def test_quantizer_rejects_bad_inputs():
    layout = MixedLayout.from_shares(K, N, g4=64)
    w = np.zeros((K, N), np.float32)
    with pytest.raises(FormatError, match=r"weight must be \[K, N\]=\[512, 256\]"):
        quantize(w[:10], layout, h=np.eye(K))
    with pytest.raises(FormatError, match="exactly one of x"):
        quantize(w, layout)
    with pytest.raises(FormatError, match="K=512 columns"):
        quantize(w, layout, x=np.ones((4, 100)))
    with pytest.raises(FormatError, match="not positive definite"):
        quantize(w, layout, h=-np.eye(K), damp=0.0)


def test_cli_quantize_writes_arrays_the_kernel_prepares(tmp_path, capsys):
    from qcompile.cli import main
    from qcompile.kernels import MixedSpec, get_family

    rng = np.random.default_rng(7)
    np.save(tmp_path / "w.npy", rng.standard_normal((K, N)).astype(np.float32) * 0.02)
    np.save(tmp_path / "x.npy", rng.standard_normal((64, K)).astype(np.float32))
    out = tmp_path / "w.npz"
    code = main(["quantize", "--family", "mixed", "--shape", f"{K}x{N}", "--g4", "64",
                 "--weight", str(tmp_path / "w.npy"), "--calibration", str(tmp_path / "x.npy"),
                 "--out", str(out)])
    assert code == 0
    assert "bits per weight (eq. 10: 2.840)" in capsys.readouterr().out
    spec = MixedSpec(k=K, n=N)
    family = get_family("mixed")
    arrays = dict(np.load(out))
    prepared = family.prepare(spec, **arrays)
    assert prepared.names == tuple(spec.layout.shapes())
    expect = quantize(np.load(tmp_path / "w.npy"), spec.layout,
                      x=np.load(tmp_path / "x.npy")).tensors.dequantize()
    np.testing.assert_array_equal(family.reference_weight(spec, **arrays), expect)
    code = main(["quantize", "--family", "uniform", "--shape", f"{K}x{N}",
                 "--weight", str(tmp_path / "w.npy"), "--out", str(out)])
    assert code == 2 and "has no quantizer" in capsys.readouterr().err
