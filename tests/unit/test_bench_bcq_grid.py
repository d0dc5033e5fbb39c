"""The H200 sweep's built-in grid (tools/bench_bcq_cuda.py --variants grid): small enough for one
call of under 3 minutes, the heuristic first per mu (at mu = 8 the rotated kernel's), every point
a candidate of its space, the previous sweep's best two and its heuristic kept for comparison."""

import targets
from qcompile.kernels import BcqSpec
from schedules.cuda import bcq as cuda_bcq
from schedules.cuda import bcq_rotated
from tools.bench_bcq_cuda import grid_variants, label, slug


def test_grid_is_the_heuristic_and_valid_neighbours():
    hw = targets.get("cuda").hardware()
    variants = grid_variants(7168, 28672, 3, 128, [4, 8])
    assert len(variants) <= 30
    for mu in (4, 8):
        spec = BcqSpec(k=7168, n=28672, q=3, group_size=128, mu=mu)
        mine = [v for v in variants if v["mu"] == mu]
        first = mine[0]
        assert first["heuristic"] and bool(first.get("rotated")) == (mu == 8)
        space = bcq_rotated if mu == 8 else cuda_bcq
        assert first["knobs"] == space.heuristic_knobs(spec, hw)
        assert sum(bool(v.get("heuristic")) for v in mine) == 1
        for v in mine:
            if v.get("rotated"):
                cands = bcq_rotated.knob_candidates(spec, hw)
                assert all(value in cands[name] for name, value in v["knobs"].items()), v
                continue
            cands = cuda_bcq.knob_candidates(spec, hw, stage_words=v["stage_words"])
            assert all(value in cands[name] for name, value in v["knobs"].items()), v
            assert not v["unroll_groups"] or v["stage_words"]
            assert not v.get("words_inner") or v["stage_words"]
    keys = [(v["mu"], v.get("rotated", False), tuple(v["knobs"].items()),
             v.get("stage_words"), v.get("unroll_groups"), v.get("words_inner", False),
             v.get("sums_first", False))
            for v in variants]
    assert len(keys) == len(set(keys))
    labels = {label(v) for v in variants}
    assert {"mu=4 threads=128 cols=4 groups_per_block=2 staged",            # 44.4 us
            "mu=4 threads=256 cols=4 groups_per_block=1 staged+unrolled",   # 46.0 us
            "mu=4 threads=128 cols=4 groups_per_block=2 staged+unrolled",   # 51.6 us
            "mu=4 threads=128 cols=4 groups_per_block=2 staged+unrolled+inner (heuristic)",
            } <= labels
    assert len({slug(v) for v in variants}) == len(variants)
