"""The uniform kernel with int8 activations (compute_int8.py): byte planes, exactness against
the activations it rounds, accuracy against float32, the spec's rules, and a tuning run."""

import numpy as np
import pytest
import torch

from qcompile.errors import SpecError
from qcompile.formats import bitpack
from qcompile.kernels import UniformSpec, get_family
from qcompile.kernels.tir import activations, int8_dot
from qcompile.kernels.tir import planes as tir_planes
from qcompile.kernels.uniform import compute_int8
from qcompile.testing.kernels import compile_fixed, relative_error, tune_and_load
from schedules.cpu import uniform_int8

FAMILY = get_family("uniform")
K, N = 256, 64


def decode_planes(planes: np.ndarray, bits: int) -> np.ndarray:
    """Codes [K, N] from byte planes [U, P, N, 4] by the module docstring's rules (not the
    kernel's expression): the inverse the kernel relies on."""
    units, _, n, _ = planes.shape
    rows = tir_planes.unit_rows(bits)
    codes = np.zeros((units * rows, n), dtype=np.int64)
    for u in range(units):
        for j in range(4):
            if bits == 3:
                for s in range(2):
                    for p in range(4):
                        low = (planes[u, s, :, j] >> (2 * p)) & 3
                        high = (planes[u, 2, :, j] >> (4 * s + p)) & 1
                        codes[u * 32 + s * 16 + j * 4 + p] = low | (high << 2)
            else:
                per = 8 // bits
                for p in range(per):
                    codes[u * rows + j * per + p] = (planes[u, 0, :, j] >> (bits * p)) & (
                        (1 << bits) - 1)
    return codes


@pytest.mark.parametrize("bits", [2, 3, 4])
def test_byte_planes_hold_every_code(bits):
    rng = np.random.default_rng(bits)
    codes = rng.integers(0, 1 << bits, size=(K, N))
    planes = tir_planes.byte_planes(bitpack.pack(codes, bits), bits)
    assert planes.dtype == np.uint8
    assert planes.shape == (K // tir_planes.unit_rows(bits), tir_planes.planes(bits), N, 4)
    assert planes.nbytes == K * N * bits // 8  # no byte more than GPTQ's packing
    np.testing.assert_array_equal(decode_planes(planes, bits), codes)


@pytest.mark.parametrize("bits", [2, 3, 4])
def test_storage_order_is_a_permutation_within_blocks(bits):
    rows = [int(tir_planes.storage_to_row(p, bits)) for p in range(64)]
    block = tir_planes.order_block(bits)
    assert sorted(rows) == list(range(64))
    assert all(r // block == p // block for p, r in enumerate(rows))


def test_chunks_fit_int16():
    for bits, limit in ((2, 172), (3, 72), (4, 32)):
        assert int8_dot.chunk_limit(bits) == limit
        worst = limit // 4 * 2 * 127 * ((1 << bits) - 1)  # every pair at its largest
        assert worst <= 32767
    spec = UniformSpec(k=8192, n=64, bits=3, group_size=-1, int8_activations=True)
    assert compute_int8.chunk_rows(spec) == 64  # largest multiple of 32 dividing K, <= 72
    spec = UniformSpec(k=768, n=64, bits=3, group_size=96, int8_activations=True)
    assert compute_int8.chunk_rows(spec) == 32  # 48 fits but is not a whole 3-bit unit


def tiled_register_tile(sch, spec, hw, tiles):
    """The int8 sketch with fixed decisions, in its column-tile layout."""
    uniform_int8.with_layout(sch, spec, tiles["t_u"])
    return uniform_int8.register_tile(sch, spec, hw, tiles)


@pytest.mark.parametrize("m", [1, 3])
@pytest.mark.parametrize("group_size", [32, 128, -1])
@pytest.mark.parametrize("bits", [2, 3, 4])
def test_kernel_is_exact_on_the_activations_it_rounds(avx2, bits, group_size, m):
    spec = UniformSpec(k=K, n=N, bits=bits, group_size=group_size, m=m, int8_activations=True)
    tiles = {"t_u": 2, "m_u": 2, "n_blk": 1}
    function = compile_fixed(spec, avx2, tiled_register_tile, tiles)
    rng = np.random.default_rng(bits * 100 + m)
    tensors = FAMILY.example_tensors(spec, rng)
    from qcompile.kernels.layouts import uniform as layout

    weights = FAMILY.prepare(spec, layout=layout.n_tiled(tiles["t_u"] * 8), **tensors)
    x = rng.standard_normal((m, K)).astype(np.float32)
    x[0, :5] = 0.0  # zeros and an all-zero group must not divide by zero
    if group_size == 32:
        x[0, 32:64] = 0.0
    y = torch.empty((m, N), dtype=torch.float32)
    function(torch.from_numpy(x), *weights.tensors, y)
    weight = FAMILY.reference_weight(spec, **tensors).astype(np.float64)
    exact = activations.quantized_activations(x, group_size) @ weight
    assert relative_error(y, exact) < 1e-5
    # Against float32 activations: the rounding of x to int8, about 1e-2 of max |y|.
    assert relative_error(y, x.astype(np.float64) @ weight) < 3e-2


def test_spec_rules_name_the_numbers():
    with pytest.raises(SpecError, match="2-, 3- or 4-bit weights; got bits=8"):
        UniformSpec(k=256, n=64, bits=8, int8_activations=True)
    with pytest.raises(SpecError, match="float32 x; got dtype='float16'"):
        UniformSpec(k=256, n=64, dtype="float16", int8_activations=True)
    with pytest.raises(SpecError, match="act_order"):
        UniformSpec(k=256, n=64, act_order=True, int8_activations=True)
    with pytest.raises(SpecError, match="N divisible by 8.*got N=36"):
        UniformSpec(k=256, n=36, int8_activations=True)
    plain = UniformSpec(k=256, n=64)
    assert "int8_activations" not in plain.to_dict()  # old specs keep their digest
    int8 = UniformSpec(k=256, n=64, int8_activations=True)
    assert int8.digest() != plain.digest() and int8.name().endswith("_xi8")
    assert UniformSpec.from_dict(int8.to_dict()) == int8


def test_tune_build_and_run_from_the_database(avx2, tmp_path):
    """The design space through MetaSchedule: records replay (tensorize included) in a build."""
    spec = UniformSpec(k=K, n=128, bits=2, group_size=128, int8_activations=True)
    kernel = tune_and_load(spec, avx2, tmp_path)
    assert kernel.layout["kind"] == "n_tiled"
    rng = np.random.default_rng(0)
    tensors = FAMILY.example_tensors(spec, rng)
    weights = kernel.prepare(**tensors)
    x = rng.standard_normal((1, K)).astype(np.float32)
    y = kernel(torch.from_numpy(x), weights).numpy()
    exact = activations.quantized_activations(x, 128) @ FAMILY.reference_weight(spec, **tensors)
    assert relative_error(y, exact) < 1e-5


@pytest.mark.parametrize("bits", [2, 3, 4])
@pytest.mark.parametrize("group_size", [32, 64, 128, -1])
def test_plans_keep_shift_counts_constant_and_registers_free(avx2, bits, group_size):
    """Every m_u candidate is a whole number of field periods (constant shifts in the unrolled
    body), t_u fits the 16 registers and divides N/8, and the seeds are candidates."""
    hw = avx2.hardware()
    for n in (64, 4096, 28672):
        spec = UniformSpec(k=8192, n=n, bits=bits, group_size=group_size, int8_activations=True)
        steps = compute_int8.chunk_rows(spec) // tir_planes.STEP
        for plan in uniform_int8.plans(spec, hw):
            assert plan.t_u <= uniform_int8.MAX_T_U and (n // 8) % plan.t_u == 0
            assert plan.m_u.values and plan.m_u.seed in plan.m_u.values
            assert plan.n_blk.seed in plan.n_blk.values
            for m_u in plan.m_u.values:
                assert m_u % uniform_int8.field_period(bits) == 0 and steps % m_u == 0
