import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from qcompile.errors import FormatError
from qcompile.formats import bitpack


@st.composite
def codes_and_bits(draw):
    bits = draw(st.sampled_from(bitpack.SUPPORTED_BITS))
    values, _ = bitpack.block_shape(bits)
    blocks = draw(st.integers(1, 4))
    cols = draw(st.integers(1, 5))
    codes = draw(hnp.arrays(np.int64, (blocks * values, cols),
                            elements=st.integers(0, (1 << bits) - 1)))
    return codes, bits


@settings(max_examples=200, deadline=None)
@given(codes_and_bits())
def test_pack_unpack_round_trip(data):
    codes, bits = data
    words = bitpack.pack(codes, bits)
    assert words.dtype == np.int32
    assert words.shape == (codes.shape[0] * bits // 32, codes.shape[1])
    np.testing.assert_array_equal(bitpack.unpack(words, bits), codes)


@settings(max_examples=100, deadline=None)
@given(codes_and_bits())
def test_value_j_sits_at_bit_offset_bits_times_j(data):
    """The layout is one little-endian bit stream per 32-value block (gptq.md)."""
    codes, bits = data
    words = bitpack.pack(codes, bits).view(np.uint32).astype(object)
    values, per_block = bitpack.block_shape(bits)
    for block in range(codes.shape[0] // values):
        for col in range(codes.shape[1]):
            stream = sum(int(words[block * per_block + w, col]) << (32 * w)
                         for w in range(per_block))
            for j in range(values):
                field = (stream >> (bits * j)) & ((1 << bits) - 1)
                assert field == codes[block * values + j, col]


@pytest.mark.parametrize("bits, value, expected", [
    (4, 7, [0x77777777]),
    (8, 0x7F, [0x7F7F7F7F]),
    (2, 1, [0x55555555]),
    (3, 3, [0xDB6DB6DB, 0xB6DB6DB6, 0x6DB6DB6D]),  # the symmetric v1 qzeros words
])
def test_known_words(bits, value, expected):
    values, _ = bitpack.block_shape(bits)
    words = bitpack.pack(np.full((values, 1), value), bits).view(np.uint32).ravel()
    assert [int(w) for w in words] == expected


def test_bad_inputs_name_the_numbers():
    with pytest.raises(FormatError, match="bits=5"):
        bitpack.pack(np.zeros((8, 1)), 5)
    with pytest.raises(FormatError, match=r"divisible by 32; got 40"):
        bitpack.pack(np.zeros((40, 1)), 3)
    with pytest.raises(FormatError, match=r"\[0, 15\]; got values in \[16, 16\]"):
        bitpack.pack(np.full((8, 1), 16), 4)
    with pytest.raises(FormatError, match="int32 or uint32"):
        bitpack.unpack(np.zeros((1, 1), np.float32), 4)
