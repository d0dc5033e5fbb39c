"""The uniform CUDA design space, pinned (sketches and knob decisions for a fixed seed), its knob
candidates and heuristic, and the categorical knobs. Scheduling only: nothing is compiled.

A change to schedules/cuda/ that changes the golden traces changes what stored CUDA records mean;
regenerate with QCOMPILE_UPDATE_GOLDEN=1 only for a deliberate change.
"""

import os
from pathlib import Path

import pytest

import targets
from qcompile import _tvm
from qcompile.errors import SpecError
from qcompile.kernels import UniformSpec, get_family
from qcompile.kernels.tir.attrs import COMPUTE_ATTR
from schedules import knobs
from schedules.cuda import uniform
from schedules.variants import compute_for

GOLDEN = Path(__file__).parent / "golden" / "uniform_cuda_design_space.txt"
HW = targets.get("cuda").hardware()
FAMILY = get_family("uniform")


def _mod(spec):
    return _tvm.normalize_mod(compute_for(spec, "cuda"))


def _traces() -> str:
    text = []
    for spec in (UniformSpec(k=512, n=128, bits=4, group_size=64, m=2),       # group_lanes
                 UniformSpec(k=512, n=128, bits=4, group_size=-1, m=2)):      # word_lanes
        spaces = uniform.design_space(_tvm.Schedule(_mod(spec), seed=1), spec, HW)
        text += [f"# {spec.name()} sketch {i}\n{s.trace}" for i, s in enumerate(spaces)]
    return "\n\n".join(text) + "\n"


def test_design_space_matches_golden():
    text = _traces()
    if os.environ.get("QCOMPILE_UPDATE_GOLDEN"):
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text()


def test_cuda_compute_is_chosen_for_cuda_only():
    spec = UniformSpec(k=256, n=128)
    assert COMPUTE_ATTR in compute_for(spec, "cuda").attrs
    assert COMPUTE_ATTR not in compute_for(spec, "cpu").attrs
    names = {"scale_x", "group_dot", "combine"}
    sch = _tvm.Schedule(_mod(spec))
    assert {sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))} == names


@pytest.mark.parametrize("shape,bits,group_size,m", [
    ((8192, 28672), 4, 128, 1), ((28672, 8192), 4, 128, 16), ((4096, 4096), 4, -1, 4),
    # N = 16 * 17 (was 250, which qzeros' 2-bit packing cannot hold: refused since the spec
    # checks it, tests/unit/test_spec.py).
    ((4096, 11008), 3, 128, 8), ((256, 272), 2, 32, 3),
])
def test_candidates_divide_their_loops(shape, bits, group_size, m):
    spec = UniformSpec(k=shape[0], n=shape[1], bits=bits, group_size=group_size, m=m)
    cands = uniform.knob_candidates(spec)
    vec = uniform.vector_width(spec)
    assert spec.n % vec == 0 and vec == (4 if spec.n % 4 == 0 else 2)
    units = uniform.packed_units_per_group(spec)
    for k_lanes in cands["k_lanes"]:
        if uniform.layout_for(spec) == "group_lanes":
            assert spec.groups % k_lanes == 0
        else:
            assert all(units % (k_lanes * v) == 0 for v in cands["load_words"])
    for n_lanes in cands["n_lanes"]:
        for n_vecs in cands["n_vecs"]:
            assert spec.n % (n_lanes * n_vecs * vec) == 0
    assert all(m % v == 0 for v in cands["m_lanes"])
    assert all(uniform.packed_units_per_group(spec) % v == 0 for v in cands["load_words"])


@pytest.mark.parametrize("m", [1, 4, 16])
@pytest.mark.parametrize("shape", [(4096, 4096), (8192, 8192), (8192, 28672), (28672, 8192)])
def test_heuristic_knobs_fit_the_gpu(shape, m):
    spec = UniformSpec(k=shape[0], n=shape[1], m=m)
    sketch, chosen = uniform.heuristic_knobs(spec, HW)
    cands = uniform.knob_candidates(spec)
    assert all(chosen[name] in cands[name] for name in cands)
    threads = chosen["k_lanes"] * chosen["n_lanes"] * chosen["m_lanes"]
    assert 32 <= threads <= HW.max_threads_per_block
    staged = {"x_block": spec.m * spec.k * 4,
              "x_chunk": spec.m * chosen["k_lanes"] * spec.effective_group_size * 4,
              "x_registers": 0}[sketch.removesuffix(uniform.K_WARPS)]
    assert staged <= HW.shared_memory_per_block_bytes


def test_x_block_only_when_x_fits():
    small = UniformSpec(k=8192, n=4096, m=1)       # 32 KiB of x
    large = UniformSpec(k=8192, n=4096, m=2)       # 64 KiB of x
    assert uniform.sketches_for(small, HW) == [
        "x_block", "x_chunk", "x_registers",
        "x_block+k_warps", "x_chunk+k_warps", "x_registers+k_warps"]
    assert uniform.sketches_for(large, HW) == [
        "x_chunk", "x_registers", "x_chunk+k_warps", "x_registers+k_warps"]
    one_group = UniformSpec(k=8192, n=4096, m=2, group_size=-1)
    assert uniform.layout_for(one_group) == "word_lanes"
    assert uniform.sketches_for(one_group, HW) == ["x_registers"]


def test_fixed_knob_outside_candidates_is_refused():
    spec = UniformSpec(k=768, n=128, group_size=64)     # 12 groups: k_lanes 1, 2, 4
    with pytest.raises(SpecError, match=r"knob k_lanes=8 is not a candidate here; "
                                        r"candidates: \[1, 2, 4\]"):
        uniform.sketch(_tvm.Schedule(_mod(spec)), spec, HW, "x_chunk", {"k_lanes": 8})


def test_mutator_moves_one_knob_to_another_candidate():
    spec = UniformSpec(k=1024, n=128, group_size=64, m=2)
    sch = uniform.sketch(_tvm.Schedule(_mod(spec), seed=3), spec, HW, "x_chunk")
    before = knobs.categorical_decisions(sch.trace)
    mutator = knobs.MutateCategorical(seed=5)
    for _ in range(10):
        after = knobs.categorical_decisions(mutator.apply(sch.trace))
        changed = [(b, a) for b, a in zip(before, after, strict=True) if b[1] != a[1]]
        assert len(changed) == 1
        (candidates, old), (_, new) = changed[0]
        assert new in candidates and new != old


@pytest.mark.parametrize("shape", [(4096, 4096), (8192, 28672), (28672, 8192)])
def test_heuristic_lays_k_lanes_across_warps_with_rows_per_warp(shape):
    # M = 1: a warp's threads share packed rows (64 contiguous bytes at least per row and load
    # instruction: whole 32-byte sectors), the grid has a block per SM at least, and each thread
    # keeps 8 128-bit loads in flight, 4 where its lane has several groups (fewer registers).
    spec = UniformSpec(k=shape[0], n=shape[1], m=1)
    sketch, chosen = uniform.heuristic_knobs(spec, HW)
    assert sketch.endswith(uniform.K_WARPS)
    assert chosen["n_lanes"] * uniform.VECTOR_BYTES >= 64
    blocks = spec.n // (uniform.vector_width(spec) * chosen["n_vecs"] * chosen["n_lanes"])
    assert blocks >= HW.sm_count
    several_groups = spec.groups > chosen["k_lanes"]
    assert chosen["load_words"] == uniform.HEURISTIC_LOAD_WORDS // (2 if several_groups else 1)


def test_k_warps_needs_group_lanes():
    spec = UniformSpec(k=1024, n=256, group_size=-1)
    with pytest.raises(ValueError, match=r"\+k_warps: K lanes across warps need group_lanes"):
        uniform.sketch(_tvm.Schedule(_mod(spec)), spec, HW, "x_registers+k_warps")


def test_last_space_favours_the_heuristic_knobs():
    spec = UniformSpec(k=8192, n=28672, m=1)
    spaces = uniform.design_space(_tvm.Schedule(_mod(spec), seed=1), spec, HW)
    assert len(spaces) == len(uniform.sketches_for(spec, HW)) + 1
    _, chosen = uniform.heuristic_knobs(spec, HW)
    cands = uniform.knob_candidates(spec)
    sampled = [inst for inst in spaces[-1].trace.insts if inst.kind.name == "SampleCategorical"]
    assert len(sampled) == len(chosen)
    for inst, (name, value) in zip(sampled, chosen.items(), strict=True):
        values = [int(v) for v in inst.attrs[0]]
        probs = [float(p) for p in inst.attrs[1]]
        assert values == cands[name]
        if len(values) > 1:
            assert probs[values.index(value)] == knobs.PRIOR_WEIGHT
            assert abs(sum(probs) - 1) < 1e-9
