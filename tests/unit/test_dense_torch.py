"""The torch dequantization of the GPU's prefill path (qcompile/kernels/uniform/dense_torch.py),
run here on the CPU: every bit width (3-bit codes straddle words), group size and act_order
gives the float32 weight of the numpy reference exactly, rounded once to fp16/bf16."""

import numpy as np
import pytest
import torch

from qcompile.kernels import UniformSpec, get_family
from qcompile.kernels.uniform import dense_torch
from qcompile.kernels.uniform.dense_torch import dequantize_on_device

FAMILY = get_family("uniform")


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize(("group_size", "act_order"), [(32, False), (128, True), (-1, False)])
def test_dense_weight_is_the_reference(bits, group_size, act_order, monkeypatch):
    # chunks of 5 blocks of 32 rows: K's 132 blocks end in a partial chunk
    monkeypatch.setattr(dense_torch, "_CHUNK_ELEMENTS", 5 * 32 * 64)
    spec = UniformSpec(k=128 * 33, n=64, bits=bits, group_size=group_size)
    rng = np.random.default_rng(bits)
    tensors = FAMILY.example_tensors(spec, rng)
    if act_order:
        tensors["g_idx"] = rng.permutation(tensors["g_idx"]).astype(np.int32)
    reference = FAMILY.reference_weight(spec, **tensors)
    prepared = FAMILY.prepare(spec, **tensors)  # rows sorted by group: extras["perm"]
    order = prepared.extras["perm"].numpy() if act_order else np.arange(spec.k)
    weight = dequantize_on_device(spec, prepared, torch.float32)
    assert np.array_equal(weight.numpy(), reference[order])
    for dtype in (torch.float16, torch.bfloat16):
        out = torch.empty((spec.k, spec.n), dtype=dtype)
        assert dequantize_on_device(spec, prepared, dtype, out=out) is out
        assert torch.equal(out, torch.from_numpy(reference[order]).to(dtype))


def test_a_wrong_out_buffer_is_one_line():
    spec = UniformSpec(k=128, n=32, bits=4, group_size=32)
    prepared = FAMILY.prepare(spec, **FAMILY.example_tensors(spec, np.random.default_rng(0)))
    with pytest.raises(ValueError, match=r"out must be a contiguous torch.float16 \[128, 32\]"):
        dequantize_on_device(spec, prepared, torch.float16, out=torch.empty((32, 128)))
