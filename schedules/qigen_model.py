"""QIGen's performance model (Pegolotti et al. 2023, section 3): register and L1 budgets that
constrain and seed the CPU design spaces.

Micro-GEMV (eq. 4). A micro-kernel keeps ``t_u`` vector accumulators of y in registers, loads an
``m_u x t_u`` block of weight vectors and ``m_u`` broadcasts of x::

    m_u + m_u * t_u + t_u <= eta          (eta: vector registers, 16 for AVX2, 32 for AVX-512)

:func:`micro_kernels` finds the pairs by exhaustive search and keeps the maximal ones (neither
can grow without spilling); which of them is fastest is left to measurement (the paper's
"empirical search"), which is what MetaSchedule does with them.

Mini-GEMV (eq. 5). A block of ``m_b`` rows of x (float32), ``m_b x t_b`` b-bit weights and
``t_b`` columns of y (float32) should fill, not overflow, the L1 data cache::

    32 * m_b + b * m_b * t_b + 32 * t_b <= gamma,   t_b mod t_u' = 0,   m_b mod m_u' = 0

where ``gamma`` is L1d in bits and ``t_u'``, ``m_u'`` are the micro-kernel's extents in columns
and rows (``t_u * lanes`` and ``m_u * rows per packed unit``; rows also stay whole groups). The
left-hand side is maximised as an integer program (:func:`mini_gemv`, ``scipy.optimize.milp``):
the product ``m_b * t_b`` is linearised over the candidate values (one binary per candidate of
each and one per pair, tied by the usual AND constraints), so the solver works on the exact
divisors of K and N that a perfect loop split can use.

Both are pure functions of numbers: any family's design space may use them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from qcompile.errors import SpecError


@dataclass(frozen=True)
class MicroKernel:
    """A micro-GEMV: ``t_u`` accumulator vectors, ``m_u`` packed rows per step (eq. 4)."""

    m_u: int
    t_u: int

    @property
    def registers(self) -> int:
        """Vector registers it needs: m_u + m_u*t_u + t_u."""
        return self.m_u + self.m_u * self.t_u + self.t_u


@dataclass(frozen=True)
class MiniGemv:
    """A mini-GEMV block: ``m_b`` rows of K by ``t_b`` columns of N (eq. 5).

    ``bits_used`` is the left-hand side of eq. 5; ``gamma`` its bound.
    """

    m_b: int
    t_b: int
    bits_used: int
    gamma: int

    @property
    def fill(self) -> float:
        """Fraction of the L1 data cache the block uses."""
        return self.bits_used / self.gamma


def micro_kernels(eta: int) -> list[MicroKernel]:
    """Every maximal (m_u, t_u) with m_u + m_u*t_u + t_u <= eta, widest t_u first.

    Maximal: increasing m_u or t_u by one breaks eq. 4. For eta=16:
    (1, 7), (2, 4), (3, 3), (4, 2), (7, 1).
    """
    if eta < 3:
        raise SpecError(f"eta (vector registers) must be at least 3 for a 1x1 micro-kernel "
                        f"(m_u + m_u*t_u + t_u = 3); got {eta}")
    fits = {(m, t) for m in range(1, eta) for t in range(1, eta)
            if MicroKernel(m, t).registers <= eta}
    maximal = [MicroKernel(m, t) for m, t in fits
               if (m + 1, t) not in fits and (m, t + 1) not in fits]
    return sorted(maximal, key=lambda mk: (-mk.t_u, mk.m_u))


def eq5_bits(m_b: int, t_b: int, bits: int) -> int:
    """Left-hand side of eq. 5: 32*m_b + bits*m_b*t_b + 32*t_b."""
    return 32 * m_b + bits * m_b * t_b + 32 * t_b


def mini_gemv(gamma: int, bits: int, m_values, t_values) -> MiniGemv:
    """Maximise eq. 5's left-hand side over ``m_b`` in ``m_values`` and ``t_b`` in ``t_values``.

    Parameters
    ----------
    gamma : int
        L1 data cache in bits.
    bits : int
        Weight bits b.
    m_values, t_values : iterable of int
        The admissible block extents (multiples of the micro-kernel's rows/columns that divide
        K/N); the solver picks one of each.

    Returns
    -------
    MiniGemv
        The block that fills most of L1 without overflowing it; ties go to the wider ``t_b``
        (fewer passes over x). If not even the smallest pair fits, the smallest pair, with
        ``fill > 1``.

    Raises
    ------
    SpecError
        When a candidate list is empty or holds a non-positive value.
    """
    from scipy.optimize import Bounds, LinearConstraint, milp

    ms = sorted({int(v) for v in m_values})
    ts = sorted({int(v) for v in t_values})
    if not ms or not ts or ms[0] <= 0 or ts[0] <= 0:
        raise SpecError(f"mini-GEMV candidates must be non-empty and positive; got m_b {ms}, "
                        f"t_b {ts}")
    if eq5_bits(ms[0], ts[0], bits) > gamma:
        return MiniGemv(ms[0], ts[0], eq5_bits(ms[0], ts[0], bits), gamma)
    nm, nt = len(ms), len(ts)
    # Variables: a_i (m_b = ms[i]), c_j (t_b = ts[j]), p_ij = a_i AND c_j; all binary.
    size = nm + nt + nm * nt

    def pair(i, j):
        return nm + nt + i * nt + j

    lhs = np.zeros(size)
    for i, m in enumerate(ms):
        lhs[i] = 32 * m
    for j, t in enumerate(ts):
        lhs[nm + j] = 32 * t
    for i, m in enumerate(ms):
        for j, t in enumerate(ts):
            lhs[pair(i, j)] = bits * m * t
    rows, lower, upper = [lhs], [0], [gamma]
    one_m = np.zeros(size)
    one_m[:nm] = 1
    one_t = np.zeros(size)
    one_t[nm:nm + nt] = 1
    rows += [one_m, one_t]
    lower += [1, 1]
    upper += [1, 1]
    for i in range(nm):
        for j in range(nt):
            for var in (i, nm + j):  # p_ij <= a_i, p_ij <= c_j
                row = np.zeros(size)
                row[pair(i, j)] = 1
                row[var] = -1
                rows.append(row)
                lower.append(-np.inf)
                upper.append(0)
            row = np.zeros(size)  # p_ij >= a_i + c_j - 1
            row[pair(i, j)] = 1
            row[i] = -1
            row[nm + j] = -1
            rows.append(row)
            lower.append(-1)
            upper.append(np.inf)
    # Maximise lhs; a tie-break worth less than one bit prefers wider t_b.
    tie = np.zeros(size)
    tie[nm:nm + nt] = np.arange(1, nt + 1) / (nt + 1) * 0.5
    result = milp(c=-(lhs + tie), constraints=LinearConstraint(np.array(rows), lower, upper),
                  integrality=np.ones(size), bounds=Bounds(0, 1))
    if not result.success:  # cannot happen once the smallest pair fits; say so if it does
        raise SpecError(f"eq. 5 integer program failed: {result.message}")
    chosen = np.round(result.x).astype(int)
    m_b = ms[int(np.argmax(chosen[:nm]))]
    t_b = ts[int(np.argmax(chosen[nm:nm + nt]))]
    return MiniGemv(m_b, t_b, eq5_bits(m_b, t_b, bits), gamma)


def divisors(n: int) -> list[int]:
    """Positive divisors of ``n``, ascending."""
    small = [d for d in range(1, int(n ** 0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def seeded_prior(values: list[int], seed_value: int, weight: float = 0.5) -> list[float]:
    """Sampling probabilities over ``values``: ``weight`` on the model's ``seed_value``, the rest
    spread evenly (the whole mass on it when it is the only value)."""
    if seed_value not in values:
        raise SpecError(f"model value {seed_value} is not among the candidates {values}")
    if len(values) == 1:
        return [1.0]
    rest = (1.0 - weight) / (len(values) - 1)
    return [weight if v == seed_value else rest for v in values]
