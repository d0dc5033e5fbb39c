"""The layer Hessian H = 2 XᵀX / S of calibration activations, and its damped inverse."""

from __future__ import annotations

import numpy as np

from qcompile.errors import FormatError

#: Default damping: lambda = DAMP * mean(diag H), added to the diagonal (as GPTQ does).
DAMP = 0.01


def hessian(x) -> np.ndarray:
    """H = 2 XᵀX / S, float64 [K, K], from calibration activations.

    Parameters
    ----------
    x : array-like, float, shape [S, K] (or [..., K], flattened to rows)
        S calibration rows of the layer's input.
    """
    x = np.asarray(x, dtype=np.float64)
    if x.ndim < 2 or x.shape[0] == 0:
        raise FormatError(f"calibration activations must be [S, K] with S >= 1; got shape "
                          f"{list(x.shape)}")
    x = x.reshape(-1, x.shape[-1])
    return 2.0 * (x.T @ x) / x.shape[0]


def damped_inverse(h, damp: float = DAMP) -> np.ndarray:
    """H⁻¹ [K, K] float64 via a Cholesky factorisation of ``H + damp * mean(diag H) * I``.

    Channels that calibration never activated (H[k, k] == 0) get H[k, k] = 1 first, so they
    neither break the factorisation nor look sensitive.

    Raises
    ------
    FormatError
        H is not square, or not positive definite even after damping (the message names the
        damping used: raise it).
    """
    import scipy.linalg

    h = np.array(h, dtype=np.float64)
    if h.ndim != 2 or h.shape[0] != h.shape[1]:
        raise FormatError(f"the Hessian must be square [K, K]; got shape {list(h.shape)}")
    if damp < 0:
        raise FormatError(f"damp must be >= 0; got {damp}")
    diag = np.diag(h).copy()
    dead = diag == 0
    diag[dead] = 1.0
    np.fill_diagonal(h, diag + damp * float(np.mean(diag)))
    try:
        factor = scipy.linalg.cho_factor(h, lower=True, check_finite=True)
    except (np.linalg.LinAlgError, ValueError) as error:
        raise FormatError(f"the damped Hessian is not positive definite (damp={damp} of "
                          f"mean(diag H)={np.mean(diag):.3g}): {error}; raise damp") from None
    return scipy.linalg.cho_solve(factor, np.eye(h.shape[0]))
