import numpy as np
import pytest

from qcompile.errors import FormatError
from qcompile.formats import bitpack
from qcompile.formats.act_order import (
    is_trivial,
    permute_packed_rows,
    sequential_permutation,
)
from qcompile.formats.gptq import GptqTensors
from qcompile.quantize.rtn import quantize_rtn


def scrambled_g_idx(k, group_size, seed):
    """g_idx as GPTQ writes it with desc_act: groups formed in a permuted order."""
    perm = np.random.default_rng(seed).permutation(k)
    inverse = np.argsort(perm)
    return (np.arange(k) // group_size)[inverse].astype(np.int32)


@pytest.mark.parametrize("bits", bitpack.SUPPORTED_BITS)
def test_reorder_preserves_the_product(bits):
    k, n, gs = 256, 64, 64
    t = quantize_rtn(np.random.default_rng(0).standard_normal((k, n)), bits, gs)
    g_idx = scrambled_g_idx(k, gs, seed=bits)
    layer = GptqTensors.from_tensors(qweight=t.qweight, scales=t.scales, qzeros=t.qzeros,
                                     bits=bits, group_size=gs, g_idx=g_idx)
    perm = sequential_permutation(g_idx)
    assert is_trivial(g_idx[perm], gs) and not is_trivial(g_idx, gs)
    reordered = GptqTensors.from_tensors(
        qweight=permute_packed_rows(t.qweight, perm, bits), scales=t.scales, qzeros=t.qzeros,
        bits=bits, group_size=gs)
    x = np.random.default_rng(1).standard_normal((3, k))
    np.testing.assert_allclose(x[:, perm] @ reordered.dequantize(), x @ layer.dequantize(),
                               rtol=1e-5, atol=1e-5)


def test_trivial_detection_and_errors():
    assert is_trivial(np.arange(256) // 128, 128)
    assert is_trivial(np.zeros(256, np.int32), -1)
    with pytest.raises(FormatError, match="every row index"):
        permute_packed_rows(np.zeros((2, 4), np.int32), np.zeros(16, np.int64), 4)
    with pytest.raises(FormatError, match=r"shape \[K\]=\(16,\); got \(8,\)"):
        permute_packed_rows(np.zeros((2, 4), np.int32), np.arange(8), 4)
