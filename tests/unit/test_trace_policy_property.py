"""Every trace our design spaces produce passes the trace policy (qcompile.trust.traces).

For random specs of each of the 14 design-space variants (family x target class x compute),
random seeds (so random sampled decisions) and, on CPUs, random hardware models (another host's
caches, cores and vector width), each sketch the space returns, as MetaSchedule stores it
(``EnterPostproc`` appended, converted as ``record_json`` converts it), passes the policy that
was derived for the spec with its fixed seed and models. Scheduling only: nothing is compiled.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st

import targets
from qcompile import _tvm
from qcompile.errors import SpecError
from qcompile.kernels import BcqSpec, MixedSpec, UniformSpec
from qcompile.kernels.bcq import compute_cuda_rotated as rotated
from qcompile.kernels.tir.attrs import compute_name
from qcompile.kernels.uniform import compute_cuda_gemv_int8 as gemv
from qcompile.kernels.uniform import compute_cuda_mma as mma
from qcompile.kernels.uniform import compute_cuda_mma_f16 as mma_f16
from qcompile.trust.traces import check_trace, policy_for
from schedules import get_design_space
from schedules.variants import compute_for
from targets.hardware import CpuHardware
from tuning_db.database import _plain_json

DIGEST = "0123456789ab" + "0" * 52

#: Values per packing block for each bit width (formats/bitpack.block_shape).
_VALUES = {2: 16, 3: 32, 4: 8, 8: 4}


@st.composite
def uniform_specs(draw, *, int8: bool, cuda: bool, bits=(2, 3, 4, 8), m=(1, 8),
                  group_sizes=(-1, 32, 64, 128), n_step: int = 8,
                  dtypes=("float32", "float16", "bfloat16")) -> UniformSpec:
    bits = draw(st.sampled_from([b for b in bits if not int8 or b in (2, 3, 4)]))
    group = draw(st.sampled_from([g for g in group_sizes if g == -1 or g % _VALUES[bits] == 0]))
    k = (group if group != -1 else 128) * draw(st.integers(1, 8))
    return UniformSpec(
        k=k, n=n_step * draw(st.integers(1, 512 // n_step)), bits=bits, group_size=group,
        m=draw(st.integers(*m)),
        dtype="float32" if int8 else draw(st.sampled_from(dtypes)),
        act_order=False if int8 or cuda else draw(st.booleans()), int8_activations=int8)


@st.composite
def bcq_specs(draw, *, rotated_fit: bool = False) -> BcqSpec:
    if rotated_fit:  # mu 8, one row, 4..32 chunks a group, whole warps of columns
        group = rotated.MU * draw(st.sampled_from([4, 8, 16, 32]))
        return BcqSpec(k=group * draw(st.integers(1, 8)), q=draw(st.integers(1, 8)),
                       n=rotated.SLOTS * rotated.COLS * draw(st.integers(1, 4)),
                       group_size=group, m=1, mu=rotated.MU)
    mu = draw(st.integers(2, 8))
    chunks = draw(st.sampled_from([1, 2, 4, 8, 16]))
    group = mu * chunks
    unit = group * 32 // _gcd(group, 32)  # K: whole groups and whole 32-row words
    return BcqSpec(k=unit * draw(st.integers(1, 4)), n=8 * draw(st.integers(1, 64)),
                   q=draw(st.integers(1, 8)), group_size=group, m=draw(st.integers(1, 4)),
                   mu=mu)


@st.composite
def mixed_specs(draw, *, int8: bool) -> MixedSpec:
    g1 = draw(st.sampled_from([16, 32]))
    g4 = g1 * draw(st.sampled_from([1, 2, 4]))
    return MixedSpec(k=g4 * draw(st.integers(1, 8)), n=8 * draw(st.integers(1, 64)),
                     m=draw(st.integers(1, 4)), g1=g1, g2=draw(st.sampled_from([16, 32])),
                     g4=g4, four_bit_share=draw(st.sampled_from([0.0, 0.25, 0.5])),
                     outlier_share=draw(st.sampled_from([0.0, 0.002, 0.01])),
                     int8_activations=int8)


def _gcd(a: int, b: int) -> int:
    while b:
        a, b = b, a % b
    return a


#: variant -> (spec strategy, target class, the compute the family must pick for it).
VARIANTS = {
    "uniform-cpu-float": (uniform_specs(int8=False, cuda=False), "cpu", None),
    "uniform-cpu-int8": (uniform_specs(int8=True, cuda=False), "cpu", None),
    "uniform-cuda-float": (uniform_specs(int8=False, cuda=True).filter(
        lambda s: mma_f16.problems_with(s)), "cuda", "uniform.cuda.v2"),
    "uniform-cuda-mma-f16": (uniform_specs(int8=False, cuda=True, m=(1, 16),
                                           n_step=mma_f16.WARP_COLUMNS,
                                           dtypes=("float16", "bfloat16")).filter(
        lambda s: not mma_f16.problems_with(s)), "cuda", mma_f16.COMPUTE_NAME),
    "uniform-cuda-int8-dp4a": (uniform_specs(int8=True, cuda=True, bits=(3,), m=(1, 8)),
                               "cuda", "uniform.cuda_int8.v1"),
    "uniform-cuda-int8-mma": (uniform_specs(int8=True, cuda=True, bits=(2, 4),
                                            m=(2, mma.TILE_M), group_sizes=mma.GROUP_SIZES,
                                            n_step=mma.WARP_COLUMNS),
                              "cuda", mma.COMPUTE_NAME),
    "uniform-cuda-int8-gemv": (uniform_specs(int8=True, cuda=True, bits=(2, 4), m=(1, 1),
                                             group_sizes=gemv.GROUP_SIZES,
                                             n_step=gemv.LANE_THREADS),
                               "cuda", gemv.COMPUTE_NAME),
    "bcq-cpu": (bcq_specs(), "cpu", None),
    "bcq-cuda-tables": (bcq_specs().filter(lambda s: rotated.unfit_reason(s) is not None),
                        "cuda", ""),
    "bcq-cuda-rotated": (bcq_specs(rotated_fit=True), "cuda", rotated.COMPUTE_NAME),
    "mixed-cpu-float": (mixed_specs(int8=False), "cpu", None),
    "mixed-cpu-int8": (mixed_specs(int8=True), "cpu", None),
    "mixed-cuda-float": (mixed_specs(int8=False), "cuda", None),
    "mixed-cuda-int8": (mixed_specs(int8=True), "cuda", "mixed.cuda_int8.v1"),
}

cpu_models = st.builds(
    CpuHardware,
    l1d_bytes=st.sampled_from([32 << 10, 48 << 10, 64 << 10]),
    l2_bytes=st.sampled_from([256 << 10, 512 << 10, 1 << 20, 2 << 20]),
    l3_bytes=st.sampled_from([4 << 20, 16 << 20, 32 << 20, 96 << 20]),
    vector_registers=st.sampled_from([16, 32]),
    vector_bits=st.sampled_from([256, 512]),
    cores=st.sampled_from([1, 2, 3, 4, 8, 16, 64, 128]),
)
cuda_models = st.sampled_from(
    [p.hardware() for p in targets.PRESETS.values() if p.kind == "cuda"])


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@settings(max_examples=2, deadline=None, derandomize=False,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(data=st.data(), seed=st.integers(1, 2**31 - 1))
def test_every_trace_our_spaces_produce_passes(variant, data, seed):
    strategy, target_kind, expected_compute = VARIANTS[variant]
    try:
        spec = data.draw(strategy, label="spec")
        mod = _tvm.normalize_mod(compute_for(spec, target_kind))
    except SpecError:
        reject()
    if expected_compute is not None:
        assert compute_name(mod["main"]) == expected_compute, spec
    hw = data.draw(cpu_models if target_kind == "cpu" else cuda_models, label="hw")
    try:
        schedules = get_design_space(spec, target_kind)(_tvm.Schedule(mod, seed=seed), spec, hw)
    except SpecError:  # this model cannot take the spec (a GPU's shared memory, say)
        reject()
    policy = policy_for(spec, target_kind)
    for sch in schedules:
        sch.enter_postproc()
        check_trace(_plain_json(sch.trace.as_json()), policy, digest=DIGEST)
