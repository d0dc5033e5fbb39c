"""Integer dot products of int8 activations and codes: 16-bit pair sums widened to int32 (the
CPU's vpmaddubsw/vpmaddwd) and CUDA's dp4a over code words."""

from __future__ import annotations

from qcompile._tvm import T
from qcompile.kernels.tir.activations import X_LEVELS
from qcompile.kernels.tir.planes import STEP, unit_rows

_INT16_MAX = 32767


def chunk_limit(bits: int) -> int:
    """Most rows of K whose pair sums fit in 16 bits (see the module docstring)."""
    pair_max = 2 * X_LEVELS * ((1 << bits) - 1)
    return STEP * (_INT16_MAX // pair_max)


def chunk_rows_for(group_rows: int, bits: int) -> int:
    """Rows of K per 16-bit chunk: the largest divisor of ``group_rows`` that is a whole number
    of K units (so the unpacking's shift counts repeat within it) and fits :func:`chunk_limit`."""
    block = unit_rows(bits)
    fits = [d for d in range(block, min(group_rows, chunk_limit(bits)) + 1, block)
            if group_rows % d == 0]
    return max(fits)


def integer_group_dot():
    """A TIR macro ``(dot_name, widen_name, xq, codes, dot16, dot, M, G, C, N, rows, CH)``:
    blocks ``dot_name`` and ``widen_name`` computing ``dot[m, g, n]``, the int32 sum over the
    ``rows`` rows of group g (C chunks of CH) of ``xq[m, k] * codes[n, k]``, as 16-bit pair sums
    per chunk (``dot16`` [M, G, C, N, 2]: the tensorized vpmaddubsw) widened to int32
    (vpmaddwd). A new macro per call site: TVM suffixes the block names of a macro's second
    and later expansions ("_1", ...), and the schedules find blocks by name."""

    @T.macro
    def group_dot(dot_name, widen_name, xq, codes, dot16, dot, M, G, C, N, rows, CH):
        for m, g, c, n, h, r, e in T.grid(M, G, C, N, 2, CH // STEP, 2):
            with T.sblock(dot_name):
                vm, vg, vc, vn, vh, vr, ve = T.axis.remap("SSSSSRR", [m, g, c, n, h, r, e])
                with T.init():
                    dot16[vm, vg, vc, vn, vh] = T.int16(0)
                dot16[vm, vg, vc, vn, vh] = dot16[vm, vg, vc, vn, vh] + T.Cast(
                    "int16", xq[vm, vg * rows + vc * CH + vr * STEP + vh * 2 + ve]) * T.Cast(
                    "int16", codes[vn, vg * rows + vc * CH + vr * STEP + vh * 2 + ve])
        for m, g, n, c, h in T.grid(M, G, N, C, 2):
            with T.sblock(widen_name):
                vm, vg, vn, vc, vh = T.axis.remap("SSSRR", [m, g, n, c, h])
                with T.init():
                    dot[vm, vg, vn] = 0
                dot[vm, vg, vn] = dot[vm, vg, vn] + T.Cast("int32", dot16[vm, vg, vc, vn, vh])

    return group_dot


def steps_per_unit(bits: int) -> int:
    """dp4a steps (4 codes each) per unit of K: 2 at 4 bits, 4 at 2 bits, 8 at 3 bits."""
    return unit_rows(bits) // STEP


def code_word(qweight, unit, step, n, bits: int):
    """int32 with the 4 codes of ``step`` of ``unit`` (column n), one per byte."""
    if bits == 3:
        plane, field = step // 4, step % 4
        low = T.bitwise_and(T.shift_right(qweight[unit, plane, n], T.Cast("int32", field * 2)),
                            T.int32(0x03030303))
        # The high bit of the same 4 codes sits at bit 4*plane + field of each byte of plane 2.
        high = T.bitwise_and(T.shift_right(qweight[unit, 2, n], T.Cast("int32", plane * 4 + field)),
                             T.int32(0x01010101))
        return T.bitwise_or(low, T.shift_left(high, T.int32(2)))
    return step_codes(qweight[unit, 0, n], step, bits)


def step_codes(word, step, bits: int):
    """int32 with the 4 codes of dp4a step ``step`` of a packed 2- or 4-bit ``word``, one per
    byte: ``(word >> step * bits) & 0x0F0F0F0F`` at 4 bits (codes 2j + step in byte j),
    ``& 0x03030303`` at 2 bits."""
    mask = {2: 0x03030303, 4: 0x0F0F0F0F}[bits]
    return T.bitwise_and(T.shift_right(word, T.Cast("int32", step * bits)), T.int32(mask))


def dp4a(a, b, portable: bool = False):
    """``sum_j int8(a, byte j) * int8(b, byte j)`` as int32 (CUDA ``__dp4a``, signed bytes).

    Codes (at most 15) are non-negative as signed bytes too. The accumulator input is zero and
    the sum is added outside, so the block stays a ``+`` reduction TVM can split across threads.
    ``portable``: the same sum in plain TIR arithmetic (any target; for checking the compute on
    a CPU, where ``__dp4a`` does not exist).
    """
    if not portable:
        return T.call_pure_extern("int32", "__dp4a", a, b, T.int32(0))

    def byte(word, j):  # sign-extended byte j: shift it to the top, then arithmetic shift down
        return T.shift_right(T.shift_left(word, T.int32(24 - 8 * j)), T.int32(24))

    total = byte(a, 0) * byte(b, 0)
    for j in range(1, STEP):
        total = total + byte(a, j) * byte(b, j)
    return total
