"""QIGen's model (eq. 4 and 5), the hardware overrides it reads, and how it shapes the space."""

import itertools

import pytest

import targets
from qcompile.errors import SpecError
from qcompile.kernels import UniformSpec
from qcompile.kernels.tir.codes import fields_per_word
from schedules import qigen_model as model
from schedules.cpu import uniform
from targets import host, overrides
from targets.hardware import CpuHardware

AVX2_HW = CpuHardware(l1d_bytes=32 << 10, l2_bytes=512 << 10, l3_bytes=32 << 20,
                      vector_registers=16, vector_bits=256, cores=2)
AVX512_HW = CpuHardware(l1d_bytes=48 << 10, l2_bytes=2 << 20, l3_bytes=32 << 20,
                        vector_registers=32, vector_bits=512, cores=8)


def test_micro_kernels_are_the_maximal_solutions_of_eq4():
    assert [(mk.m_u, mk.t_u) for mk in model.micro_kernels(16)] == [
        (1, 7), (2, 4), (3, 3), (4, 2), (7, 1)]
    for eta in (8, 16, 32):
        found = model.micro_kernels(eta)
        for mk in found:
            assert mk.m_u + mk.m_u * mk.t_u + mk.t_u <= eta
            assert model.MicroKernel(mk.m_u + 1, mk.t_u).registers > eta
            assert model.MicroKernel(mk.m_u, mk.t_u + 1).registers > eta
        # every solution of eq. 4 is dominated by a maximal one
        for m, t in itertools.product(range(1, eta), range(1, eta)):
            if model.MicroKernel(m, t).registers <= eta:
                assert any(mk.m_u >= m and mk.t_u >= t for mk in found)
    assert (2, 10) in [(mk.m_u, mk.t_u) for mk in model.micro_kernels(32)]
    with pytest.raises(SpecError, match="at least 3"):
        model.micro_kernels(2)


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize("gamma_kib", [32, 48])
def test_mini_gemv_matches_brute_force(bits, gamma_kib):
    gamma = gamma_kib * 1024 * 8
    m_values = [128 * d for d in model.divisors(64)]
    t_values = [32 * d for d in model.divisors(896)]
    best = max(model.eq5_bits(m, t, bits) for m in m_values for t in t_values
               if model.eq5_bits(m, t, bits) <= gamma)
    found = model.mini_gemv(gamma, bits, m_values, t_values)
    assert found.bits_used == best == model.eq5_bits(found.m_b, found.t_b, bits)
    assert found.bits_used <= gamma and found.m_b in m_values and found.t_b in t_values


def test_mini_gemv_reports_overflow_and_bad_candidates():
    over = model.mini_gemv(1000, 4, [128], [32])
    assert over.fill > 1 and (over.m_b, over.t_b) == (128, 32)
    with pytest.raises(SpecError, match="non-empty and positive"):
        model.mini_gemv(1000, 4, [], [32])
    with pytest.raises(SpecError, match="not among the candidates"):
        model.seeded_prior([1, 2], 3)
    assert model.seeded_prior([1, 2, 4], 2) == [0.25, 0.5, 0.25]


@pytest.mark.parametrize("hw", [AVX2_HW, AVX512_HW], ids=["avx2", "avx512"])
@pytest.mark.parametrize("shape", [(4096, 4096), (4096, 11008), (11008, 4096), (8192, 28672)])
@pytest.mark.parametrize("bits,group_size", [(2, 128), (3, 128), (4, 128), (4, -1), (8, 32)])
def test_plans_respect_both_equations(hw, shape, bits, group_size):
    spec = UniformSpec(k=shape[0], n=shape[1], bits=bits, group_size=group_size)
    plans = uniform.plans(spec, hw)
    assert 1 <= len(plans) <= uniform.MAX_SKETCH_TU
    lanes = hw.fp32_lanes
    for plan in plans:
        t_u = plan.micro.t_u
        assert plan.micro.registers <= hw.vector_registers  # eq. 4
        assert spec.n % plan.tile_n == 0 and plan.tile_n == t_u * lanes
        for m_u in plan.m_u.values:
            assert m_u <= plan.micro.m_u and uniform.units_per_group(spec) % m_u == 0
        # eq. 5's divisibility: t_b mod (t_u lanes) = 0, m_b mod (m_u rows) = 0
        assert plan.mini.t_b % plan.tile_n == 0
        assert plan.mini.m_b % (plan.m_u.seed * fields_per_word(bits)) == 0
        for knob in (plan.m_u, plan.n_blk, plan.g_in):
            assert knob.seed in knob.values and len(knob.values) <= uniform.MAX_CANDIDATES
        tiles = spec.n // plan.tile_n
        assert all(tiles % b == 0 and tiles // b >= hw.cores for b in plan.n_blk.values)
        if plan.mini.fill <= 1:
            assert plan.mini.bits_used == max(
                model.eq5_bits(g * spec.effective_group_size, b * plan.tile_n, bits)
                for g in model.divisors(spec.groups)
                for b in model.divisors(tiles) if tiles // b >= hw.cores
                if model.eq5_bits(g * spec.effective_group_size, b * plan.tile_n, bits)
                <= hw.gamma_bits)


def test_hardware_overrides(monkeypatch):
    assert overrides.parse("l1d=48K, l2=2M,l3=1G,cores=8") == {
        "l1d_bytes": 48 << 10, "l2_bytes": 2 << 20, "l3_bytes": 1 << 30, "cores": 8}
    monkeypatch.setenv("QCOMPILE_HW", "l1d=48K,cores=6")
    hw = targets.get("avx2").hardware()
    assert hw.l1d_bytes == 48 << 10 and hw.cores == 6 and hw.gamma_bits == 48 * 1024 * 8
    assert targets.get("avx2").hardware(cores=3).cores == 3  # an argument beats the env
    assert targets.get("avx2").hardware(override="cores=5").cores == 5
    for bad, rule in [("l1d", "key=value"), ("l4=1M", "key=value"), ("l1d=lots", "size"),
                      ("vector_bits=300", "128, 256 or 512"), ("cores=0", "positive")]:
        with pytest.raises(SpecError, match=rule):
            overrides.parse(bad)


def test_cache_probes_fall_back_to_cpuid_and_never_raise(monkeypatch, tmp_path):
    monkeypatch.setattr(host, "_CPU_SYSFS", tmp_path / "missing")
    assert host.cache_bytes(1) is None
    value = host.detected_cache_bytes(1)  # getconf (CPUID) or None; never an exception
    assert value is None or value >= 4096
    monkeypatch.setattr(host, "_getconf_all", lambda: {"LEVEL1_DCACHE_SIZE": "junk"})
    assert host.cpuid_cache_bytes(1) is None and host.cpuid_cache_bytes(9) is None
    hw = targets.get("avx2").hardware()
    assert hw.l1d_bytes == 32 << 10  # the documented fallback
