"""TensorIR of the BCQ family's one-row GEMV on CUDA GPUs at mu = 8, with rotated chunks: the
32 lanes of a warp read 32 different banks at every lookup, whatever the keys.

At mu = 8 a table has 256 entries, so the 32 lanes of a warp that look up one chunk's table with
their columns' random keys meet 3-4 way bank conflicts, and mu = 8 lost to mu = 4. But mu = 4
spends a lookup (4 SASS instructions, one LDS) per 4 bits, and a one-row GEMV at mu = 4 is bound
by the lookups themselves: a probe of its lookups alone, without the weight reads, is already
slower than the issue goal (3x fp16 ``linear``) allows (docs/design/bcq.md, "CUDA"; the
numbers: docs/results/from-docstrings.md). Here every lane reads its own bank:

- the tables are entry-major, with a *slot* per lane: entry e of the table in slot p lies at
  word ``e * 32 + p``, hence in bank p. A group's ``cpg = g / 8`` chunk tables fill ``cpg``
  slots, and ``32 / cpg`` copies of them fill the 32 (two copies at g = 128);
- lane l (column block ``n // 4``, l = that mod 32) owns copy ``l // cpg`` and, at step s of
  the group's ``cpg`` steps, reads chunk ``(s + r) % cpg`` with ``r = l % cpg``: slot
  ``copy * cpg + (s + r) % cpg``. The 32 lanes of a warp hold 32 different slots at every step;
- so that step s's key lies at the same place for every lane (byte s of the group's words, a
  constant shift once the steps are unrolled), the weights are stored rotated: byte s of column
  n's bytes in a group (of each plane) holds chunk ``(s + r(n)) % cpg``,
  ``r(n) = (n // 4) % cpg`` (layout ``rotated_chunks``, :func:`rotate_planes`).

A lookup is then a byte extract OR-ed with the slot, an LDS of one wavefront and an add, for 8 bits;
the tables cost 256 entries x 32 slots (32 KiB) per group, built by the block that reads them.

    table[m, g, e*32 + p*cpg + r]
                         = sum_{j < 8} (+x[m, (g*cpg + r)*8 + j] if bit j of e else -x[...])
                           (the same for every copy p; terms taken from j = 7 down, so the 16
                           entries a thread builds share their first four)
    xsum[m, g]           = sum_{r < cpg} table[m, g, 255*32 + r]
    dot[m, g, i, n]      = sum_{s < cpg} table[m, g, key_i(g, s, n)*32 | slot(s, n)]
    slot(s, n)           = copy(n)*cpg + (s + r(n)) % cpg
    y[m, n]              = sum_g (sum_i alpha[g, i, n] * dot[m, g, i, n] + z[g, n] * xsum[m, g])

``key_i(g, s, n)`` is byte s of column n's rotated words of plane i in group g. The blocks are
the GPU BCQ compute's (compute.py): ``lut``, ``x_sum``, ``group_dot``, ``combine``.

Operands:

=========  ========  ==================  ===============================================
name       dtype     shape               content
=========  ========  ==================  ===============================================
x          float32   [1, K]              activations
planes     int32     [q, K / 32, N]      sign bits, chunks rotated per column (above)
alpha      float16   [G, q, N]           alpha[g, i, n]
z          float32   [G, N]              the bias z[g, n]
y          float32   [1, N]              output
=========  ========  ==================  ===============================================
"""

from __future__ import annotations

from qcompile._tvm import T
from qcompile.errors import SpecError
from qcompile.formats.bcq import WORD_BITS
from qcompile.kernels.bcq.compute import combine_block, signed_sum
from qcompile.kernels.bcq.spec import BcqSpec
from qcompile.kernels.layouts.bcq import COLS, MU, rotation
from qcompile.kernels.tir.attrs import COMPUTE_ATTR

COMPUTE_NAME = "bcq.cuda_rotated.v1"
#: Lanes of a warp, and the slots of a table row (one per bank).
SLOTS = 32
#: Bits per key byte.
BYTE = 8
#: log2(SLOTS): a table row's offset is its entry shifted up by this.
SLOT_BITS = 5
#: Entries a thread builds in a row (e's low four bits): they share the sum of the first four
#: terms.
RUN = 16


def unfit_reason(spec: BcqSpec) -> str | None:
    """Why ``spec`` cannot run on this compute, or None when it can."""
    if spec.mu != MU:
        return f"the rotated kernel looks up bytes: mu must be {MU}, got {spec.mu}"
    cpg = spec.effective_group_size // MU
    if spec.m != 1:
        return f"the rotated kernel is a one-row GEMV (32 KiB of tables per row); M={spec.m}"
    if SLOTS % cpg:
        return (f"a group's {cpg} chunks (group size {spec.effective_group_size} / mu) must "
                f"divide the {SLOTS} slots of a table row: group size 32, 64, 128 or 256")
    if spec.n % (SLOTS * COLS):
        return f"N={spec.n} must be a multiple of {SLOTS * COLS} (a warp's columns)"
    return None


def check_spec(spec: BcqSpec) -> None:
    reason = unfit_reason(spec)
    if reason is not None:
        raise SpecError(f"{spec.name()}: {reason}")


def copy_of(n, cpg: int):
    """The table copy column ``n``'s lane reads: ``(n // (COLS * cpg)) % (SLOTS // cpg)``."""
    return n // (COLS * cpg) % (SLOTS // cpg)


def slot_of(n, s, cpg: int):
    """The slot column ``n``'s lane reads at step ``s``: its copy's, chunk ``(s + r(n)) %
    cpg``."""
    return copy_of(n, cpg) * cpg + (s + rotation(n, cpg)) % cpg


def lookup_index(planes, i, g, s, n, slot, words_per_group: int):
    """int32 expression: the table word that byte ``s`` of column n's rotated words of plane i
    in group g selects in ``slot``: ``byte << 5 | slot`` (the row's offset OR the slot, which
    is below 32). nvcc makes it SHF + LOP3 (shift, AND and OR) and a LEA (words to bytes, plus
    the table's base): 5 SASS instructions a lookup with the LDS and the add (sm_90 build)."""
    word = T.Cast("uint32", planes[i, g * words_per_group + s // 4, n])
    byte = T.bitwise_and(T.shift_right(word, T.Cast("uint32", s % 4 * BYTE)), T.uint32(255))
    row = T.shift_left(byte, T.uint32(SLOT_BITS))
    return T.Cast("int32", T.bitwise_or(row, T.Cast("uint32", slot)))


def rotated_compute(spec: BcqSpec):
    """The PrimFunc for ``spec`` (symbol ``spec.name()``; :func:`check_spec`)."""
    check_spec(spec)
    K, N, G, Q = spec.k, spec.n, spec.groups, spec.q
    gsize = spec.effective_group_size
    cpg = gsize // MU                       # chunks per group: steps, and slots per copy
    copies = SLOTS // cpg
    wpg = gsize // WORD_BITS                # packed words per group and plane
    E = 1 << MU
    attrs = {**spec.func_attrs(), COMPUTE_ATTR: COMPUTE_NAME}
    combine = combine_block()

    @T.prim_func(s_tir=True)
    def bcq_rotated(
        x: T.Buffer((1, K), "float32"),
        planes: T.Buffer((Q, K // WORD_BITS, N), "int32"),
        alpha: T.Buffer((G, Q, N), "float16"),
        z: T.Buffer((G, N), "float32"),
        y: T.Buffer((1, N), "float32"),
    ):
        T.func_attr(attrs)
        # entry e of the table in slot p at e * SLOTS + p (p = copy * cpg + chunk)
        table = T.sblock_alloc_buffer((1, G, E * SLOTS), "float32")
        x_sum = T.sblock_alloc_buffer((1, G), "float32")
        dot = T.sblock_alloc_buffer((1, G, Q, N), "float32")
        for m, g, e, p, r in T.grid(1, G, E, copies, cpg):
            with T.sblock("lut"):
                vm, vg, ve, vp, vr = T.axis.remap("SSSSS", [m, g, e, p, r])
                table[vm, vg, ve * SLOTS + vp * cpg + vr] = signed_sum(
                    x, vm, vg * cpg + vr, ve, MU, high_first=True)
        for m, g, r in T.grid(1, G, cpg):
            with T.sblock("x_sum"):
                vm, vg, vr = T.axis.remap("SSR", [m, g, r])
                with T.init():
                    x_sum[vm, vg] = T.float32(0)
                x_sum[vm, vg] = x_sum[vm, vg] + table[vm, vg, (E - 1) * SLOTS + vr]
        for m, g, i, n, s in T.grid(1, G, Q, N, cpg):
            with T.sblock("group_dot"):
                vm, vg, vi, vn, vs = T.axis.remap("SSSSR", [m, g, i, n, s])
                with T.init():
                    dot[vm, vg, vi, vn] = T.float32(0)
                dot[vm, vg, vi, vn] = dot[vm, vg, vi, vn] + table[
                    vm, vg, lookup_index(planes, vi, vg, vs, vn, slot_of(vn, vs, cpg), wpg)]
        combine(y, dot, x_sum, alpha, z, 1, N, G, Q)

    return bcq_rotated
