"""TensorIR of the BCQ family: LUT-GEMM's table-lookup GEMV/GEMM (sections 3.3 and 3.4).

    table[m, c, e]  = sum_{j < mu} (+x[m, c*mu + j] if bit j of e else -x[m, c*mu + j])
    dot[m, g, i, n] = sum_{c in group g} table[m, c, key_i(c, n)]
    xsum[m, g]      = sum_{k in group g} x[m, k]
    y[m, n]         = sum_g (sum_i alpha[g, i, n] * dot[m, g, i, n] + z[g, n] * xsum[m, g])

On GPUs (:func:`bcq_compute` with ``gpu=True``) two blocks take another form with the same
values: ``lut`` is spatial, each entry the sum of its mu signed terms written once (a thread
builds an entry in registers and stores it once, no read-modify-write of shared memory), and
``x_sum`` adds up the tables' last entries (bits all set: ``table[m, c, 2**mu - 1] = sum_j
x[m, c*mu + j]``), so a thread block forms its groups' sums from its own tables and needs no
kernel before it:

    table[m, c, e]  = sum_{j < mu} (+-x[m, c*mu + j])          (one expression, mu terms)
    xsum[m, g]      = sum_{c in group g} table[m, c, 2**mu - 1]

``key_i(c, n)`` is the mu sign bits of plane i, rows c*mu .. c*mu+mu-1, column n: mu
consecutive bits of one packed word (or of two, when mu does not divide 32). The tables are
built once per call (block ``lut``, 2**mu entries for every mu activations) and then every
weight bit costs one mu-th of a lookup and add; alpha and z are applied once per group.

Blocks (the design spaces in schedules/ schedule them by these names):

=============  ====================================================  ==========================
block          computes                                              kind
=============  ====================================================  ==========================
``lut``        table[m, c, e] += +-x[m, c*mu + j]                    reduce [M, K/mu, 2**mu | mu]
``x_sum``      xsum[m, g] += x[m, k]                                 reduce [M, G | gsize]
``group_dot``  dot[m, g, i, n] += table[m, c, key_i(c, n)]           reduce [M, G, q, N | gs/mu]
``combine``    y[m, n] += sum_i alpha * dot + z * xsum               reduce [M, N | G]
=============  ====================================================  ==========================

Operands (compact, row-major):

=========  ========  ==================  ============================================
name       dtype     shape               content
=========  ========  ==================  ============================================
x          float32   [M, K]              activations
planes     int32     [q, K / 32, N]      sign bits along K, LSB first (bit set: +1)
alpha      float16   [G, q, N]           alpha[g, i, n]
z          float32   [G, N]              the bias z[g, n]
y          float32   [M, N]              output
=========  ========  ==================  ============================================
"""

from __future__ import annotations

from qcompile._tvm import T
from qcompile.formats.bcq import WORD_BITS
from qcompile.kernels.bcq.spec import BcqSpec


def key_expr(planes, i, c, n, mu: int):
    """int32 expression: the mu sign bits of plane ``i``, chunk ``c``, column ``n``.

    When mu divides 32 a chunk lies in one word; otherwise the next word (clamped to the last)
    is OR-ed in shifted left by 32 - offset, in two steps (a shift by 32 is undefined), and its
    bits land above the mask unless the chunk straddles.
    """
    mask = T.uint32((1 << mu) - 1)
    offset = c * mu
    word = offset // WORD_BITS
    shift = T.Cast("uint32", offset % WORD_BITS)
    low = T.shift_right(T.Cast("uint32", planes[i, word, n]), shift)
    if WORD_BITS % mu == 0:
        return T.Cast("int32", T.bitwise_and(low, mask))
    last = planes.shape[1] - 1
    nxt = T.Cast("uint32", planes[i, T.min(word + 1, last), n])
    high = T.shift_left(T.shift_left(nxt, T.uint32(1)), T.uint32(WORD_BITS - 1) - shift)
    return T.Cast("int32", T.bitwise_and(T.bitwise_or(low, high), mask))


def signed_term(x, m, c, e, j, mu: int):
    """float32 expression: +x[m, c*mu + j] if bit j of table entry e is set, else -x."""
    value = x[m, c * mu + j]
    return T.Select(T.bitwise_and(T.shift_right(e, j), 1) == 1, value, -value)


def planes_sum(alpha, dot, m, g, n, q: int):
    """float32 expression: sum_i alpha[g, i, n] * dot[m, g, i, n] (q terms, unrolled)."""
    total = T.Cast("float32", alpha[g, 0, n]) * dot[m, g, 0, n]
    for i in range(1, q):
        total = total + T.Cast("float32", alpha[g, i, n]) * dot[m, g, i, n]
    return total


def signed_sum(x, m, c, e, mu: int, high_first: bool = False):
    """float32 expression: the table entry, ``sum_j signed_term(j)`` (mu terms, unrolled),
    j = 0 up, or with ``high_first`` j = mu - 1 down (then the entries that share e's high bits
    share their first partial sums once unrolled)."""
    order = range(mu - 1, -1, -1) if high_first else range(mu)
    first, *rest = order
    total = signed_term(x, m, c, e, first, mu)
    for j in rest:
        total = total + signed_term(x, m, c, e, j, mu)
    return total


def lookups_block():
    """A TIR macro ``(dot, table, planes, M, N, G, Q, cpg, mu)``: block ``group_dot`` (per group,
    plane and output, the sum of the table entries its keys select), the same on CPUs and GPUs
    (a new macro per function: TVM suffixes the block names of a macro's later expansions)."""

    @T.macro
    def lookups(dot, table, planes, M, N, G, Q, cpg, mu):
            for m, g, i, n, r in T.grid(M, G, Q, N, cpg):
                with T.sblock("group_dot"):
                    vm, vg, vi, vn, vr = T.axis.remap("SSSSR", [m, g, i, n, r])
                    with T.init():
                        dot[vm, vg, vi, vn] = T.float32(0)
                    dot[vm, vg, vi, vn] = dot[vm, vg, vi, vn] + table[
                        vm, vg * cpg + vr, key_expr(planes, vi, vg * cpg + vr, vn, mu)]

    return lookups


def combine_block():
    """A TIR macro ``(y, dot, x_sum, alpha, z, M, N, G, Q)``: block ``combine``, the
    alpha-weighted plane sums plus z times the group sum of x, summed over the groups."""

    @T.macro
    def combine(y, dot, x_sum, alpha, z, M, N, G, Q):
            for m, n, g in T.grid(M, N, G):
                with T.sblock("combine"):
                    vm, vn, vg = T.axis.remap("SSR", [m, n, g])
                    with T.init():
                        y[vm, vn] = T.float32(0)
                    y[vm, vn] = y[vm, vn] + (planes_sum(alpha, dot, vm, vg, vn, Q)
                                             + z[vg, vn] * x_sum[vm, vg])

    return combine


def table_blocks(gpu: bool):
    """A TIR macro ``(x, table, x_sum, M, G, C, E, mu, gsize, cpg)``: blocks ``lut`` and
    ``x_sum`` in the CPU form (reductions over x) or, ``gpu``, the GPU form (each table entry
    one expression; group sums from the tables' last entries): see the module docstring."""

    @T.macro
    def cpu_tables(x, table, x_sum, M, G, C, E, mu, gsize, cpg):
        for m, c, e, j in T.grid(M, C, E, mu):
            with T.sblock("lut"):
                vm, vc, ve, vj = T.axis.remap("SSSR", [m, c, e, j])
                with T.init():
                    table[vm, vc, ve] = T.float32(0)
                table[vm, vc, ve] = table[vm, vc, ve] + signed_term(x, vm, vc, ve, vj, mu)
        for m, g, r in T.grid(M, G, gsize):
            with T.sblock("x_sum"):
                vm, vg, vr = T.axis.remap("SSR", [m, g, r])
                with T.init():
                    x_sum[vm, vg] = T.float32(0)
                x_sum[vm, vg] = x_sum[vm, vg] + x[vm, vg * gsize + vr]

    @T.macro
    def gpu_tables(x, table, x_sum, M, G, C, E, mu, gsize, cpg):
        for m, c, e in T.grid(M, C, E):
            with T.sblock("lut"):
                vm, vc, ve = T.axis.remap("SSS", [m, c, e])
                table[vm, vc, ve] = signed_sum(x, vm, vc, ve, mu)
        for m, g, r in T.grid(M, G, cpg):
            with T.sblock("x_sum"):
                vm, vg, vr = T.axis.remap("SSR", [m, g, r])
                with T.init():
                    x_sum[vm, vg] = T.float32(0)
                x_sum[vm, vg] = x_sum[vm, vg] + table[vm, vg * cpg + vr, E - 1]

    return gpu_tables if gpu else cpu_tables


def bcq_compute(spec: BcqSpec, gpu: bool = False):
    """The PrimFunc for ``spec`` (symbol ``spec.name()``, spec JSON in its attributes);
    ``gpu`` selects the GPU form of ``lut`` and ``x_sum`` (see the module docstring)."""
    M, K, N, G, Q = spec.m, spec.k, spec.n, spec.groups, spec.q
    mu, gsize, cpg = spec.mu, spec.effective_group_size, spec.chunks_per_group
    C, E, W = spec.chunks, 1 << spec.mu, spec.words
    attrs = spec.func_attrs()
    tables, lookups, combine = table_blocks(gpu), lookups_block(), combine_block()

    @T.prim_func(s_tir=True)
    def bcq_gemm(
        x: T.Buffer((M, K), "float32"),
        planes: T.Buffer((Q, W, N), "int32"),
        alpha: T.Buffer((G, Q, N), "float16"),
        z: T.Buffer((G, N), "float32"),
        y: T.Buffer((M, N), "float32"),
    ):
        T.func_attr(attrs)
        table = T.sblock_alloc_buffer((M, C, E), "float32")
        x_sum = T.sblock_alloc_buffer((M, G), "float32")
        dot = T.sblock_alloc_buffer((M, G, Q, N), "float32")
        tables(x, table, x_sum, M, G, C, E, mu, gsize, cpg)
        lookups(dot, table, planes, M, N, G, Q, cpg, mu)
        combine(y, dot, x_sum, alpha, z, M, N, G, Q)

    return bcq_gemm
