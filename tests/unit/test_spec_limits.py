"""Sizes no kernel can run, and rules that prepare would enforce later, are refused when a spec
is made: every buffer below 2**31 elements (TVM indexes with int32), and for the uniform family
N divisible by qzeros' packing. A spec that is accepted can be prepared."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qcompile.errors import SpecError
from qcompile.kernels import FAMILIES, BcqSpec, MixedSpec, UniformSpec, get_family
from qcompile.kernels.base import MAX_BUFFER_ELEMENTS

LIMIT = f"{MAX_BUFFER_ELEMENTS} (2**31 - 1)"


def test_the_limit_is_int32():
    assert MAX_BUFFER_ELEMENTS == 2**31 - 1


@pytest.mark.parametrize("bits, block", [(2, 16), (3, 32), (4, 8), (8, 4)])
def test_uniform_n_must_fill_qzeros_blocks(bits, block):
    with pytest.raises(SpecError, match=f"N={block + block // 2} must be divisible by {block}: "
                                        f"qzeros packs the {bits}-bit zero-points"):
        UniformSpec(k=256, n=block + block // 2, bits=bits)
    UniformSpec(k=256, n=3 * block, bits=bits)  # whole blocks: fine


def test_the_issue_case_is_refused_at_once():
    with pytest.raises(SpecError, match="N=4095 must be divisible by 8"):
        UniformSpec(k=4096, n=4095)


@pytest.mark.parametrize("kwargs, message", [
    (dict(k=65536, n=65536), "the dequantized weight W [K, N] = 65536 x 65536 = 4294967296"),
    (dict(k=32768, n=65536, group_size=-1), "W [K, N] = 32768 x 65536 = 2147483648"),
    (dict(k=4096, n=4096, m=524288), "x [M, K] = 524288 x 4096 = 2147483648"),
    (dict(k=128, n=4194304, m=1024), "y [M, N] = 1024 x 4194304 = 4294967296"),
])
def test_uniform_sizes_beyond_int32_are_refused_with_the_limit(kwargs, message):
    with pytest.raises(SpecError) as raised:
        UniformSpec(**kwargs)
    assert message in str(raised.value) and LIMIT in str(raised.value)


def test_uniform_just_below_the_limit_is_accepted():
    spec = UniformSpec(k=32760, n=65536, group_size=-1)  # 2146959360 elements
    assert spec.k * spec.n <= MAX_BUFFER_ELEMENTS
    UniformSpec(k=16384, n=128256)  # the largest lm_head we know: 2.10e9


@pytest.mark.parametrize("kwargs, message", [
    (dict(k=65536, n=32768, q=8, group_size=8, mu=8), "alpha [G, q, N] = 8192 x 8 x 32768"),
    (dict(k=32768, n=64, m=2048, mu=8), "the lookup tables [M, K/mu, 2**mu] = 2048 x 4096 x 256"),
    (dict(k=65536, n=65536, m=1, q=1, group_size=-1, mu=8), None),  # 2**32 weights, 1 plane
])
def test_bcq_buffers(kwargs, message):
    if message is None:
        BcqSpec(**kwargs)  # planes [1, 2048, 65536]: no buffer over the limit
        return
    with pytest.raises(SpecError) as raised:
        BcqSpec(**kwargs)
    assert message in str(raised.value) and LIMIT in str(raised.value)


def test_mixed_buffers():
    with pytest.raises(SpecError) as raised:
        MixedSpec(k=65536, n=1 << 20)
    assert "codes2 [3072, 1048576] = 3072 x 1048576" in str(raised.value)
    assert LIMIT in str(raised.value)
    with pytest.raises(SpecError, match="K=131072 exceeds 65536"):
        MixedSpec(k=131072, n=64)
    MixedSpec(k=65536, n=65536)


def test_every_family_lists_its_buffers():
    for family in FAMILIES.values():
        assert callable(getattr(family.spec_type, "buffers", None)), family.name


@pytest.mark.parametrize("family, kwargs", [
    ("uniform", dict(k=True, n=64)), ("uniform", dict(k=256, n=64, group_size="128")),
    ("uniform", dict(k=256, n=64, bits=4.0)), ("bcq", dict(k=256, n=64, group_size="128")),
    ("bcq", dict(k=256, n=64, mu=8.0)), ("mixed", dict(k=256, n=64, m=False)),
])
def test_mistyped_fields_are_spec_errors(family, kwargs):
    with pytest.raises(SpecError):
        get_family(family).spec_type(**kwargs)


# ---- an accepted spec can be prepared -----------------------------------------------------------

@settings(max_examples=40, deadline=None)
@given(bits=st.sampled_from([2, 3, 4, 8]), k_blocks=st.integers(1, 8),
       n=st.integers(1, 160), group=st.sampled_from([-1, 32, 64, 128]))
def test_an_accepted_uniform_spec_takes_its_checkpoint_tensors(bits, k_blocks, n, group):
    k = 128 * k_blocks
    try:
        spec = UniformSpec(k=k, n=n, bits=bits, group_size=group)
    except SpecError:
        return
    family = get_family("uniform")
    tensors = family.example_tensors(spec, np.random.default_rng(0))
    layer = family.checkpoint_tensors(spec, **tensors)  # prepare's checks, without torch
    assert (layer.in_features, layer.out_features) == (k, n)
