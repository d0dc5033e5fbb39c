"""Ablation like Table 4 of mixed-2-4-16-async-dequant.md, on synthetic layers.

Each synthetic layer W [K, N] has uneven group ranges (every input channel its own log-normal
scale, and a few g1-groups several times wider, placed differently in every layer) and
heavy-tailed entries (Student t, 3 degrees of freedom); its activations have log-normal channel
magnitudes with a few hot channels and a shared component. Calibration rows give H; the errors
are measured on other, held-out rows of the same distribution.

Methods, on the same layers and calibration data:

* ``mixed 2/4/16``: ours (25% of g1-groups 4-bit by eq. 9, 2-bit with second-order scales,
  0.2% outliers from 2-bit groups only).
* ``mixed 2/4`` : the same without outliers.
* ``per-layer mixing``: whole layers 4-bit (the 25% of layers with the largest mean eq. 9
  sensitivity per weight), the others 2-bit with second-order scales and the same outlier
  budget: the same formats, the same bits, precision chosen per layer (inter-layer mixing).
* ``plain 2-bit + outliers``: every group 2-bit with second-order scales; the bits the 4-bit
  groups cost spent on more fp16 outliers instead (SpQR-like, equal average bits).
* ``plain 2-bit g1=8``: every group 2-bit with second-order scales, g1 = 8 (about equal bits).
* ``plain 2-bit g16 fp16``: first-order 2-bit, g = 16, fp16 scales (more bits than the others).

Errors are pooled over layers: weight error ||W - Ŵ||_F / ||W||_F and held-out output error
||X(W - Ŵ)||² / ||XW||².

    python tools/studies/ablation_mixed.py [--layers 8] [--shape 1024x1024] [--json PATH]
"""

from __future__ import annotations

import sys as _sys
from pathlib import Path as _Path

_sys.path.insert(0, str(_Path(__file__).resolve().parents[2]))  # the repository: tools.harness

import argparse
import sys

import numpy as np

from qcompile.formats.mixed import (
    OUTLIER_BITS,
    ROW_PTR_BITS,
    SCALE_BITS,
    MixedLayout,
    average_bits,
)
from qcompile.quantize.hessian import damped_inverse, hessian
from qcompile.quantize.mixed import quantize, quantize_2bit, quantize_first_order, sensitivity
from tools.harness import results


def synthetic_layer(rng: np.random.Generator, k: int, n: int, g1: int, rows: int):
    """(W [K, N] float32, calibration X [rows, K], held-out X [rows, K])."""
    channel = np.exp(rng.normal(0.0, 0.4, size=k))
    groups = k // g1
    wide = rng.choice(groups, size=max(1, groups // 10), replace=False)
    for group in wide:
        channel[group * g1:(group + 1) * g1] *= rng.uniform(3.0, 6.0)
    weight = (rng.standard_t(3, size=(k, n)) * 0.02 * channel[:, None]).astype(np.float32)
    magnitude = np.exp(rng.normal(0.0, 0.5, size=k))
    magnitude[rng.choice(k, size=max(1, k // 64), replace=False)] *= 5.0

    def activations():
        shared = rng.standard_normal((rows, 8)) @ rng.standard_normal((8, k)) * 0.3
        return (rng.standard_normal((rows, k)) + shared) * magnitude

    return weight, activations(), activations()


def second_order_2bit_bits(g1: int, g2: int) -> float:
    """Bits per weight of 2-bit codes with second-order scales (eq. 6, 2-order)."""
    return 2 + (2 + SCALE_BITS) / g1 + (SCALE_BITS + 16) / (g1 * g2)


def run(layers: int, k: int, n: int, *, g1=16, g2=16, g4=64, share4=0.25, outliers=0.002,
        rows=512, seed=0) -> dict:
    rng = np.random.default_rng(seed)
    data = [synthetic_layer(rng, k, n, g1, rows) for _ in range(layers)]
    layout = MixedLayout.from_shares(k, n, g1=g1, g2=g2, g4=g4, four_bit_share=share4,
                                     outlier_share=outliers)
    no_outliers = MixedLayout.from_shares(k, n, g1=g1, g2=g2, g4=g4, four_bit_share=share4,
                                          outlier_share=0.0)
    bits = average_bits(layout).total
    hinv = [np.diag(damped_inverse(hessian(x_cal))) for _, x_cal, _ in data]

    results: dict[str, list] = {}

    def record(name, index, approx, method_bits):
        weight, _, x_test = data[index]
        error = (weight - approx).astype(np.float64)
        results.setdefault(name, []).append((
            float(np.sum(np.square(error))), float(np.sum(np.square(weight, dtype=np.float64))),
            float(np.sum(np.square(x_test @ error))),
            float(np.sum(np.square(x_test @ weight.astype(np.float64)))), method_bits))

    # per-layer mixing: whole layers 4-bit by mean sensitivity per weight
    layer_score = [sensitivity(w, d, g1).sum() / w.size for (w, _, _), d in zip(data, hinv,
                                                                             strict=True)]
    four_layers = set(np.argsort(layer_score)[::-1][: round(share4 * layers)].tolist())
    two_layers = layers - len(four_layers)
    per_layer_nnz = round(outliers * layers * k * n / max(two_layers, 1))
    four_bits = 4 + 20 / g4
    # plain 2-bit at equal bits: the 4-bit groups' bits go to outliers instead
    csr_bits = ROW_PTR_BITS * (n + 1) / (k * n)
    plain_nnz = max(0, int((bits - second_order_2bit_bits(g1, g2) - csr_bits)
                           * k * n / OUTLIER_BITS))

    for index, (weight, x_cal, _) in enumerate(data):
        ours = quantize(weight, layout, x=x_cal)
        record("mixed 2/4/16", index, ours.tensors.dequantize(), ours.bits.total)
        bare = quantize(weight, no_outliers, x=x_cal)
        record("mixed 2/4", index, bare.tensors.dequantize(), bare.bits.total)
        if index in four_layers:
            *_, approx = quantize_first_order(weight, g4, 4)
            record("per-layer mixing", index, approx, four_bits)
        else:
            *_, approx, _ = quantize_2bit(weight, g1, g2, per_layer_nnz, hinv[index])
            record("per-layer mixing", index, approx, second_order_2bit_bits(g1, g2)
                   + (OUTLIER_BITS * per_layer_nnz + ROW_PTR_BITS * (n + 1)) / (k * n))
        *_, approx, _ = quantize_2bit(weight, g1, g2, plain_nnz, hinv[index])
        record("plain 2-bit + outliers", index, approx, second_order_2bit_bits(g1, g2)
               + (OUTLIER_BITS * plain_nnz + ROW_PTR_BITS * (n + 1)) / (k * n))
        *_, approx, _ = quantize_2bit(weight, 8, g2, 0, hinv[index])
        record("plain 2-bit g1=8", index, approx, second_order_2bit_bits(8, g2))
        *_, approx = quantize_first_order(weight, 16, 2)
        record("plain 2-bit g16 fp16", index, approx, 2 + (16 + 2) / 16)

    rows_out = []
    for name, entries in results.items():
        e = np.array(entries)
        rows_out.append({
            "method": name,
            "average_bits": float(e[:, 4].mean()),
            "weight_error": float(np.sqrt(e[:, 0].sum() / e[:, 1].sum())),
            "output_error": float(e[:, 2].sum() / e[:, 3].sum()),
        })
    return {"layers": layers, "shape": [k, n], "g1": g1, "g2": g2, "g4": g4,
            "four_bit_share": share4, "outlier_share": outliers, "calibration_rows": rows,
            "held_out_rows": rows, "seed": seed, "four_bit_layers": sorted(four_layers),
            "plain_outliers_per_layer": plain_nnz, "results": rows_out}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--shape", default="1024x1024", help="KxN of every layer")
    parser.add_argument("--g1", type=int, default=16)
    parser.add_argument("--g2", type=int, default=16)
    parser.add_argument("--g4", type=int, default=64)
    parser.add_argument("--four-bit-share", type=float, default=0.25)
    parser.add_argument("--outlier-share", type=float, default=0.002)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args(argv)
    k, n = (int(v) for v in args.shape.lower().split("x"))
    report = run(args.layers, k, n, g1=args.g1, g2=args.g2, g4=args.g4,
                 share4=args.four_bit_share, outliers=args.outlier_share, seed=args.seed)
    print(f"{args.layers} synthetic {k}x{n} layers, g1={args.g1} g2={args.g2} g4={args.g4}, "
          f"{args.four_bit_share:.0%} 4-bit, {args.outlier_share:.2%} outliers "
          f"(4-bit layers for per-layer mixing: {report['four_bit_layers']})")
    print(f"  {'method':24s} {'avg bits':>9s} {'weight err':>11s} {'held-out out err':>17s}")
    for row in report["results"]:
        print(f"  {row['method']:24s} {row['average_bits']:9.3f} {row['weight_error']:11.4f} "
              f"{row['output_error']:17.3e}")
    if args.json:
        results.write(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
