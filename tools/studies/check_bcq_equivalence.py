"""Uniform GPTQ weights through the LUT kernel against the uniform kernel (the issue's 1e-4 bound).

Random 2/3/4-bit g=128 GPTQ layers (round-to-nearest), converted exactly into BCQ (eq. 5), run
through both CPU kernels (fixed design points) on the same activations; prints the maximum
difference relative to the uniform kernel's largest output, per bit width and mu.

    python tools/studies/check_bcq_equivalence.py
"""

from __future__ import annotations

import sys as _sys
from pathlib import Path as _Path

_sys.path.insert(0, str(_Path(__file__).resolve().parents[2]))  # the repository: tools.harness

import numpy as np
import torch

import targets
from qcompile import _tvm
from qcompile.kernels import BcqSpec, UniformSpec, get_family
from qcompile.quantize.rtn import quantize_rtn
from schedules.cpu import bcq as cpu_bcq
from schedules.cpu import uniform as cpu_uniform
from schedules.variants import compute_for

K, N, GROUP = 4096, 1024, 128


def compile_fixed(family, spec, sketch, tiles, preset):
    hw = preset.hardware()
    sch = sketch(_tvm.Schedule(compute_for(spec, "cpu")), spec, hw, tiles)
    return _tvm.tvm.compile(sch.mod, target=_tvm.Target(preset.tvm_target(hw)))[spec.name()]


def main() -> None:
    uniform, bcq = get_family("uniform"), get_family("bcq")
    preset = targets.get("avx2")
    for bits in (2, 3, 4):
        rng = np.random.default_rng(bits)
        layer = quantize_rtn(rng.standard_normal((K, N)).astype(np.float32) * 0.02, bits, GROUP)
        gptq = {"qweight": layer.qweight, "scales": layer.scales, "qzeros": layer.qzeros}
        uspec = UniformSpec(k=K, n=N, bits=bits, group_size=GROUP)
        ufunc = compile_fixed(uniform, uspec, cpu_uniform.register_tile,
                              {"n_blk": 1, "n_reg": 4}, preset)
        x = torch.from_numpy(rng.standard_normal(K).astype(np.float32))
        y_uniform = uniform.run(uspec, ufunc, x, uniform.prepare(uspec, **gptq)).double()
        for mu in (8, 4):
            bspec = BcqSpec(k=K, n=N, q=bits, group_size=GROUP, mu=mu)
            bfunc = compile_fixed(bcq, bspec, cpu_bcq.vector_lookup, {"n_blk": 2, "n_reg": 2},
                                  preset)
            y_lut = bcq.run(bspec, bfunc, x, bcq.prepare(bspec, **gptq)).double()
            rel = ((y_lut - y_uniform).abs().max() / y_uniform.abs().max()).item()
            print(f"{K}x{N} {bits}-bit g{GROUP} mu {mu}: max |y_lut - y_uniform| / "
                  f"max |y_uniform| = {rel:.2e} ({'PASS' if rel < 1e-4 else 'FAIL'} < 1e-4)")


if __name__ == "__main__":
    main()
