"""BCQ quantizer from float weights: greedy initialisation, then alternating least squares.

For each (group, output) the weights w (group_size values) are approximated by
``sum_i alpha_i * b_i + z`` (LUT-GEMM eq. 2) minimising ``||w - sum_i alpha_i b_i - z||^2``
(eq. 1 with the z):

1. greedy: ``z = mean(w)``; then plane by plane ``b_i = sign(r)``, ``alpha_i = mean(|r|)``,
   ``r -= alpha_i b_i`` (the residual's best one-bit fit each time);
2. alternating refinement, ``iterations`` rounds of
   (a) alpha and z given the planes: the least-squares solution of the (q + 1)-column system
       ``[b_1 .. b_q, 1] [alpha; z] = w`` (normal equations, solved per group and output);
   (b) the planes given alpha and z: each weight takes the nearest of the 2**q values
       ``sum_i alpha_i s_i + z`` (exhaustive over the sign patterns).
   Each step minimises the error over its own variables, so the error never rises; a group
   whose normal equations are singular (two identical planes) keeps its previous values.

Alphas are rounded to float16 (the stored dtype) before the last plane and z update, so the
reported error is that of the stored tensors.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from qcompile.errors import FormatError
from qcompile.formats.bcq import BcqTensors, check_planes, pack_planes
from qcompile.formats.gptq import check_group_size, num_groups


@dataclass(frozen=True)
class QuantizationReport:
    """How well a BCQ quantization reconstructs its weight.

    Attributes
    ----------
    relative_error : float
        ``||W - W_bcq||_F / ||W||_F`` of the stored (float16 alpha) tensors.
    greedy_error : float
        The same after the greedy initialisation alone.
    history : tuple of float
        Relative error after each refinement round.
    """

    relative_error: float
    greedy_error: float
    history: tuple[float, ...]


def _sign(values: np.ndarray) -> np.ndarray:
    return np.where(values >= 0, 1.0, -1.0)


def _error(w: np.ndarray, signs: np.ndarray, alpha: np.ndarray, z: np.ndarray) -> np.ndarray:
    """Squared error per (group, output): w [G, g, N], signs [q, G, g, N], alpha [q, G, N]."""
    approx = np.einsum("qgrn,qgn->grn", signs, alpha) + z[:, None, :]
    return ((w - approx) ** 2).sum(axis=1)


def _fit_alpha_bias(w, signs, alpha, z):
    """Least-squares alpha [q, G, N] and z [G, N] for fixed signs; keeps the old values
    where the system is singular or the new ones are not better."""
    q, groups, rows, n = signs.shape
    design = np.concatenate([signs, np.ones((1, groups, rows, n))], axis=0)   # [q+1, G, g, N]
    gram = np.einsum("agrn,bgrn->gnab", design, design)                     # [G, N, q+1, q+1]
    rhs = np.einsum("agrn,grn->gna", design, w)                              # [G, N, q+1]
    solution = np.zeros_like(rhs)
    det_ok = np.abs(np.linalg.det(gram)) > 1e-9 * rows ** (q + 1)
    if det_ok.any():
        solution[det_ok] = np.linalg.solve(gram[det_ok], rhs[det_ok][..., None])[..., 0]
    new_alpha = np.moveaxis(solution[..., :q], -1, 0)                       # [q, G, N]
    new_z = solution[..., q]
    before = _error(w, signs, alpha, z)
    after = _error(w, signs, new_alpha, new_z)
    better = det_ok & (after <= before)
    return np.where(better[None], new_alpha, alpha), np.where(better, new_z, z)


def _fit_signs(w, signs, alpha, z):
    """Each weight's nearest pattern ``sum_i alpha_i s_i + z`` over all 2**q sign patterns;
    keeps the old planes of a (group, output) where the new ones are not better."""
    q = alpha.shape[0]
    patterns = np.array(list(itertools.product((-1.0, 1.0), repeat=q)))     # [P, q]
    best = np.zeros(w.shape, dtype=np.int64)
    best_err = np.full(w.shape, np.inf)
    for index, pattern in enumerate(patterns):
        value = np.einsum("q,qgn->gn", pattern, alpha) + z                # [G, N]
        err = (w - value[:, None, :]) ** 2
        closer = err < best_err
        best = np.where(closer, index, best)
        best_err = np.where(closer, err, best_err)
    new_signs = np.moveaxis(patterns[best], -1, 0)                           # [q, G, g, N]
    keep = _error(w, new_signs, alpha, z) <= _error(w, signs, alpha, z)
    return np.where(keep[None, :, None, :], new_signs, signs)


def quantize_bcq(weight: np.ndarray, q: int, group_size: int, iterations: int = 15
                 ) -> tuple[BcqTensors, QuantizationReport]:
    """Quantize a float weight into BCQ with ``q`` sign planes.

    Parameters
    ----------
    weight : numpy.ndarray of float, shape [K, N]
        Checkpoint orientation (``nn.Linear.weight.T``); K a multiple of 32.
    q : int
        Sign planes (bits per weight), 1..8.
    group_size : int
        Rows of K sharing alpha and z; -1 for the whole column.
    iterations : int
        Alternating refinement rounds after the greedy start (0: greedy only).

    Returns
    -------
    (BcqTensors, QuantizationReport)
    """
    check_planes(q)
    weight = np.asarray(weight, dtype=np.float64)
    if weight.ndim != 2:
        raise FormatError(f"weight must be 2-D [K, N]; got shape {tuple(weight.shape)}")
    if iterations < 0:
        raise FormatError(f"iterations must be >= 0; got {iterations}")
    k, n = weight.shape
    check_group_size(k, group_size)
    groups = num_groups(k, group_size)
    w = weight.reshape(groups, k // groups, n)
    norm = float(np.sqrt((w ** 2).sum())) or 1.0

    z = w.mean(axis=1)
    residual = w - z[:, None, :]
    signs, alpha = [], []
    for _ in range(q):
        sign = _sign(residual)
        scale = np.abs(residual).mean(axis=1)
        residual = residual - sign * scale[:, None, :]
        signs.append(sign)
        alpha.append(scale)
    signs, alpha = np.stack(signs), np.stack(alpha)
    greedy = float(np.sqrt(_error(w, signs, alpha, z).sum())) / norm

    history = []
    for _ in range(iterations):
        alpha, z = _fit_alpha_bias(w, signs, alpha, z)
        signs = _fit_signs(w, signs, alpha, z)
        history.append(float(np.sqrt(_error(w, signs, alpha, z).sum())) / norm)

    # Store: alpha in float16, then the planes and the z that fit the rounded alphas.
    alpha16 = alpha.astype(np.float16)
    alpha = alpha16.astype(np.float64)
    signs = _fit_signs(w, signs, alpha, z)
    z = (w - np.einsum("qgrn,qgn->grn", signs, alpha)).mean(axis=1)
    z32 = z.astype(np.float32)
    final = float(np.sqrt(_error(w, signs, alpha, z32.astype(np.float64)).sum())) / norm
    tensors = BcqTensors(
        planes=pack_planes(signs.reshape(q, k, n).astype(np.int8)),
        alpha=np.ascontiguousarray(np.moveaxis(alpha16, 0, 1)),   # [G, q, N]
        z=z32, group_size=group_size)
    report = QuantizationReport(relative_error=final, greedy_error=greedy,
                                history=tuple(history))
    return tensors, report
