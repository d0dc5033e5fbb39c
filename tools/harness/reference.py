"""The float64 check every benchmark makes before it times anything.

Each output -- our kernels' and every peer's -- is compared with a float64 product of the same
operands; a wrong output is reported and not timed (a fast wrong kernel is no result). For an
int8-activation kernel, the reference is the product of the int8-rounded x it multiplies (its
error against the float x is reported too, as the price of the rounding).
"""

from __future__ import annotations

import numpy as np

#: Largest relative error (max |y - ref| / max |ref|) accepted, by the precision of the sums.
#: ``int8_x``: a kernel that rounds x to int8 inside (one scale per 32 or 256 values of a row,
#: as llama.cpp's q8_0 and q8_K), checked against the product of the float x it was given:
#: that rounding alone costs 5e-3 to 1.2e-2 on normal x (measured: q4_0, q4_K, q3_K, q2_K,
#: q8_0 at K = 256 and 4096, M = 1 and 4); 3e-2 leaves a margin of 2.5x and still fails a kernel
#: that reads its operands wrong (errors of order 1).
TOLERANCE = {"float32": 1e-4, "float16": 5e-3, "bfloat16": 3e-2, "int8_x": 3e-2}


class ReferenceMismatch(AssertionError):
    pass


def as_numpy(y) -> np.ndarray:
    """float64 numpy of a torch tensor (any device) or array."""
    if hasattr(y, "detach"):
        y = y.detach().float().cpu().numpy()
    return np.asarray(y, dtype=np.float64)


def rel_error(got, expected) -> float:
    """max |got - expected| / max |expected| (inf when ``got`` is not finite)."""
    got, expected = as_numpy(got), as_numpy(expected)
    if got.shape != expected.shape:
        raise ReferenceMismatch(f"output shape {got.shape}, reference {expected.shape}")
    if not np.isfinite(got).all():
        return float("inf")
    return float(np.abs(got - expected).max() / max(np.abs(expected).max(), 1e-30))


def check(name: str, got, expected, precision: str = "float32") -> float:
    """The relative error of ``got``; raises :class:`ReferenceMismatch` above the tolerance."""
    error = rel_error(got, expected)
    if not error <= TOLERANCE[precision]:
        raise ReferenceMismatch(f"{name}: max relative error {error:.2e} against the float64 "
                                f"reference (tolerance {TOLERANCE[precision]:.0e})")
    return error


def expected(spec, x: np.ndarray, tensors: dict, weights=None) -> np.ndarray:
    """float64 output of what ``spec``'s kernel computes on ``x`` [M, K] and the family's
    ``tensors``: x @ W, with x rounded to int8 per row and group for int8-activation kernels
    (the outliers of mixed ones take the float x). ``weights``: the tensors' cached
    :class:`tools.harness.weights.Weights`, whose float64 weight is then not made again."""
    from qcompile.kernels import family_of

    family = family_of(spec)
    x = np.asarray(x, dtype=np.float64)
    int8 = getattr(spec, "int8_activations", False)
    if int8 and hasattr(family, "kernel_reference"):
        return family.kernel_reference(spec, x, **tensors)
    if int8:
        from tools.harness.product import quantized_activations

        x = quantized_activations(x, spec.group_size)
    if weights is not None:
        return weights.product(x)
    return x @ family.reference_weight(spec, **tensors).astype(np.float64)


def dense_weight(spec, tensors: dict) -> np.ndarray:
    """The family's weight dequantized, float32 [K, N]: what the dense peers multiply."""
    from qcompile.kernels import family_of

    return np.ascontiguousarray(family_of(spec).reference_weight(spec, **tensors),
                                dtype=np.float32)
