"""TensorIR of the uniform family with int8 activations on tensor cores (``mma.sync``
m16n8k32, int8 x int8 -> int32; sm_80 and later), for batches of up to 16 rows.

The dp4a kernel (compute_cuda_int8.py) issues one instruction per 4 codes and row: at M = 16
it is bound by instruction issue and falls behind fp16 ``linear``. One
``mma.sync`` multiplies a 16 x 32 tile of x by 32 x 8 codes: 4096 products per warp instruction
where dp4a gives 128. The arithmetic is the dp4a kernel's, x rounded to int8 per row and group
by the same blocks (:func:`~qcompile.kernels.uniform.compute_cuda_int8.uniform_quantize_x_blocks`),
codes the same words, grouped for the fragments (layout ``mma_tiles``, below):

    y[m, n] = sum_g s[g, n] * amax[m, g] / 127 * (dot[m, g, n] - z[g, n] * xqsum[m, g])
    dot[m, g, n] = sum over the group's k-steps of mma(x tile, code tile)      (int32, exact)

Rows of x past M are zeros (block ``x_rows``, inlined by the schedule): x is rounded and laid
out as 16 rows whatever M, so the GEMM is the same for M = 1..16 (its rows past M multiply
zeros: compute, not memory).

Unlike the dp4a compute, the GEMM here is written per warp lane, because a tensor-core
instruction is collective: block ``warp_gemm`` runs for one lane of one warp (loops ``warp``
over N / 32, ``part`` over the K slices and ``lane`` over 32, which the schedule binds to
threads), and its body holds
the lane's part of the PTX fragment layouts. Lane l (group l // 4, thread t = l % 4 of it) holds

- x (A, 16 x 32 int8, row-major): words ``t`` and ``t + 4`` of rows ``l // 4`` and
  ``l // 4 + 8`` of the k-step (registers a0 = (row, t), a1 = (row + 8, t), a2 = (row, t + 4),
  a3 = (row + 8, t + 4));
- codes (B, 32 x 8, column-major): words ``t`` and ``t + 4`` of column ``l // 4``, each the dp4a
  kernel's code word (one shift and one AND);
- the int32 sums (C, 16 x 8): columns ``2t`` and ``2t + 1`` of rows ``l // 4`` and ``l // 4 + 8``.

A warp takes :data:`TILES_PER_WARP` tiles of 8 columns, so each x fragment it loads feeds 4
``mma``, and one of :func:`k_split`'s slices of the groups. Its words and factors for a group
sit in one register buffer that refills as it is used: each vector of the next group's words is
requested as soon as this group's mma have read it, so a whole group's loads are in flight
while it multiplies, at 121 registers a thread (two buffers took 128-136, and at 136 only 12
warps fit an SM, so large grids no longer ran in one wave). Per group it applies the
zero-points and scales to its sums in float32; at the end it writes its 16 float sums into
``partial``, which block ``k_sum`` adds up over the slices.

Every operand is laid out so that a lane's values for a group are few wide loads: 18 load
instructions per lane and group where scalar loads took 44 (which relieved L1 and let the
kernel reach more of the DRAM bandwidth; profiles: docs/results/from-docstrings.md):
the codes (:func:`word_position`) and the x fragments (the schedule's layout) in 128-bit loads
that are contiguous across the warp, the lane's scales and zeros (:func:`scale_position`) in
one 128-bit and one 64-bit load, x's steps and sums of its two rows in one 64-bit load each.

Operands: x float32 [M, K]; qweight int32 [G, N/8, 8 U_g], the dp4a kernel's words (U_g per
group and column), each group's words of an 8-column tile together in :func:`word_position`'s
order; scales float16 [G, N] and zeros uint8 [G, N], each warp's 32 columns in
:func:`scale_position`'s order (layout ``mma_tiles``, layouts/uniform.py); y float32 [M, N].
"""

from __future__ import annotations

from qcompile._tvm import T
from qcompile.errors import SpecError
from qcompile.kernels.tir.attrs import COMPUTE_ATTR
from qcompile.kernels.tir.int8_dot import step_codes, steps_per_unit
from qcompile.kernels.tir.planes import STEP, unit_rows
from qcompile.kernels.uniform.compute_cuda_int8 import uniform_quantize_x_blocks
from qcompile.kernels.uniform.spec import UniformSpec

COMPUTE_NAME = "uniform.cuda_mma.v2"
#: The mma shape: rows of x, columns of W, rows of K per instruction.
TILE_M, TILE_N, TILE_K = 16, 8, 32
#: Tiles of 8 columns per warp: each x fragment feeds this many mma.
TILES_PER_WARP = 4
#: Columns per warp.
WARP_COLUMNS = TILE_N * TILES_PER_WARP
#: Warps over K per 32 columns (their float sums meet in ``k_sum``).
K_SPLITS = (1, 2, 4, 8, 16)
#: Fewest groups a warp walks.
MIN_GROUPS_PER_WARP = 2
#: Warps the grid should hold: 12 per SM of an H200 (132 SMs). The GEMM takes about 121
#: registers a thread (4 warps of each SM quarter), so up to 16 warps per SM run at once: grids
#: of up to 2112 warps are one wave (8192x28672: 1792; 28672x8192 and 8192x8192: 2048). At 136
#: registers (3 warps a quarter) a large grid spills into a second wave and runs much slower
#: (docs/design/uniform-cuda.md, "int8 activations on tensor cores").
TARGET_WARPS = 12 * 132
#: Group sizes the kernel takes.
GROUP_SIZES = (32, 64, 128)
_WORDS = TILE_K // STEP                     # int32 words of x (and code steps) per k-step
_VEC = 4                                    # int32 words per 128-bit load


def problems_with(spec: UniformSpec) -> list[str]:
    """Why the tensor-core kernel cannot take ``spec`` (empty when it can)."""
    problems = []
    if spec.bits not in (2, 4):
        problems.append(f"bits={spec.bits} must be 2 or 4 (one packed word per code step)")
    if not spec.int8_activations:
        problems.append("int8_activations must be True (the tensor cores take int8 x)")
    if spec.m > TILE_M:
        problems.append(f"M={spec.m} must be at most {TILE_M} (one tile of rows)")
    if spec.n % WARP_COLUMNS:
        problems.append(f"N={spec.n} must be a multiple of {WARP_COLUMNS} (columns per warp)")
    if spec.effective_group_size not in GROUP_SIZES:
        problems.append(f"the group size {spec.effective_group_size} must be one of "
                        f"{GROUP_SIZES} (whole mma steps; a group's words stay in registers)")
    return problems


def check_spec(spec: UniformSpec) -> None:
    """Raise SpecError unless the tensor-core layout fits ``spec`` (:func:`problems_with`)."""
    problems = problems_with(spec)
    if problems:
        raise SpecError(f"{spec.name()}: the tensor-core kernel needs " + "; ".join(problems))


def uses_tensor_cores(spec: UniformSpec) -> bool:
    """Whether an int8-activation spec's CUDA kernel is this one: where the layout fits, from
    2 rows of x on (else the dp4a kernel). One row takes the one-row GEMV
    (compute_cuda_gemv_int8.py), which rounds x in its one kernel and is faster there; from
    2 rows on tensor cores beat dp4a (measurements: docs/results/from-docstrings.md)."""
    return spec.int8_activations and spec.m > 1 and not problems_with(spec)


def k_split(spec: UniformSpec) -> int:
    """Warps that share one 32-column slice of the GEMM, each over a slice of the groups: the
    fewest of :data:`K_SPLITS` that give the grid :data:`TARGET_WARPS` warps, within those that
    divide the group count and leave each warp :data:`MIN_GROUPS_PER_WARP` groups or more. A warp
    walks its groups one after the other, so short layers want many slices, and long ones few
    (each slice adds a partial sum to ``k_sum``; measurements: docs/results/from-docstrings.md)."""
    fits = [v for v in K_SPLITS if spec.groups % v == 0
            and spec.groups // v >= MIN_GROUPS_PER_WARP] or [1]
    slices = spec.n // WARP_COLUMNS
    return next((v for v in fits if slices * v >= TARGET_WARPS), max(fits))


def units_per_group(spec: UniformSpec) -> int:
    """Packed words (units of K) per group and column."""
    return spec.effective_group_size // unit_rows(spec.bits)


def runs_per_column(bits: int) -> int:
    """Runs of words a column's group splits into, one per lane that shifts them differently:
    at 4 bits lanes t = 0, 1 read the even units and t = 2, 3 the odd ones (2 runs); at 2 bits
    all four lanes read all units (1 run)."""
    return 2 if bits == 4 else 1


def word_position(column, unit, bits: int, group_units: int):
    """Where the ``mma_tiles`` layout stores unit ``unit`` of a group for column ``column`` of
    its 8-column tile, among the tile's ``8 * group_units`` words of that group (ints when
    packing; TIR expressions in the kernel, which reads its words where this says).

    A lane reads one run of its column (the even or odd units at 4 bits, all at 2), in vectors
    of up to 4 words; vector ``v`` of every run of the tile's 8 columns is stored together
    (column-major, runs inside), so the warp's load of vector ``v`` is one contiguous stretch
    of 8 x runs x 16 bytes (256 at 4 bits) where a column-major layout spreads it over 8 rows.
    """
    runs = runs_per_column(bits)
    run_words = group_units // runs
    vec = min(_VEC, run_words)
    run, index = (unit % 2, unit // 2) if runs == 2 else (0, unit)
    return (index // vec) * (TILE_N * runs * vec) + column * (runs * vec) + run * vec + index % vec


def scale_position(column):
    """Where the ``mma_tiles`` layout stores the scale and zero of ``column`` (0 .. 8 *
    :data:`TILES_PER_WARP` - 1) among its warp's columns: lane thread t needs columns 2t and
    2t + 1 of every tile, so those ``2 * tiles`` values are stored together (one 128-bit load of
    scales, 64-bit of zeros). Ints when packing, TIR expressions in the kernel."""
    tile, inside = column // TILE_N, column % TILE_N
    return inside // 2 * 2 * TILES_PER_WARP + tile * 2 + inside % 2


def uniform_compute_cuda_mma(spec: UniformSpec):
    """The tensor-core PrimFunc for ``spec`` (symbol ``spec.name()``; :func:`check_spec`):
    :data:`TILES_PER_WARP` tiles of 8 columns per warp, :func:`k_split` warps over K."""
    check_spec(spec)
    M, K, N, G = spec.m, spec.k, spec.n, spec.groups
    bits, gsize = spec.bits, spec.effective_group_size
    S = steps_per_unit(bits)
    group_words = gsize // STEP
    k_steps = gsize // TILE_K
    tiles, columns = TILES_PER_WARP, WARP_COLUMNS
    W, KS = N // columns, k_split(spec)
    GS = G // KS                            # groups per K slice
    UG = units_per_group(spec)              # packed words per group and column
    runs = runs_per_column(bits)
    lane_words = UG // runs                 # words of a column and group a lane reads
    vec = min(_VEC, lane_words)             # words per vector load
    attrs = {**spec.func_attrs(), COMPUTE_ATTR: COMPUTE_NAME}

    def lane_vector(v, vl):
        """Where vector v of lane vl's run starts in a tile's words: the run's unit v * vec (at 4
        bits, the even units for t = 0, 1 and the odd ones for t = 2, 3)."""
        unit = 2 * v * vec + (vl % 4) // 2 if runs == 2 else v * vec
        return word_position(vl // 4, unit, bits, UG)

    def lane_scales(vw, vl):
        """The first of lane vl's 2 * tiles scales (and zeros) in warp vw's columns."""
        return vw * columns + scale_position(2 * (vl % 4))

    # x is rounded as 16 rows (``x_rows``: zeros past M, inlined by the schedule), so every
    # fragment load is one vector whatever M, and rows past M multiply zeros
    quantize = uniform_quantize_x_blocks(TILE_M, G, gsize, bits)

    @T.macro
    def load_x(xq_words, a, group, ks, vl):
        # x rows l/4 (+8 for odd i), words t (+4 for i >= 2): the fragment layout of the schedule
        # stores the four together, one 128-bit load
        for i in T.vectorized(4):
            a[i] = xq_words[vl // 4 + 8 * (i % 2),
                            group * group_words + ks * _WORDS + vl % 4 + 4 * (i // 2)]

    @T.macro
    def load_factors(xq_sum, x_step, scales, zeros, group, vw, vl, sc, zr, xs, xn):
        # the lane's 2 * tiles scales and zeros, together in the mma_tiles layout
        sc[T.ramp(0, 1, 2 * tiles)] = scales[group, T.ramp(lane_scales(vw, vl), 1, 2 * tiles)]
        zr[T.ramp(0, 1, 2 * tiles)] = zeros[group, T.ramp(lane_scales(vw, vl), 1, 2 * tiles)]
        # x's step and sum of rows l/4 and l/4 + 8 (together in the schedule's layout)
        for r in T.vectorized(2):
            xs[r] = x_step[vl // 4 + 8 * r, group]
        for r in T.vectorized(2):
            xn[r] = xq_sum[vl // 4 + 8 * r, group]

    @T.macro
    def load_vector(qweight, raw, v, group, vw, vl):
        # vector v of the lane's run of every tile (column l/4, run t // 2 at 4 bits)
        for t in T.unroll(tiles):
            raw[t, T.ramp(v * vec, 1, vec)] = qweight[group, vw * tiles + t,
                                                      T.ramp(lane_vector(v, vl), 1, vec)]

    @T.macro
    def group_gemm(xq_words, xq_sum, x_step, qweight, scales, zeros, group, more, vw, vl, a, b,
                   c, acc, raw, sc, zr, xs, xn):
        # multiplies group ``group`` (its words in raw, factors in sc, zr, xs, xn); when ``more``,
        # refills each register with group + 1's as soon as it is used, so a whole group's
        # loads are in flight while this one multiplies, in one buffer
        for t in T.unroll(tiles):
            for i in T.unroll(4):
                c[t, i] = 0
        for ks in T.unroll(k_steps):
            load_x(xq_words, a, group, ks, vl)
            for t in T.unroll(tiles):
                for i in T.unroll(2):  # codes of column l/4, steps t (+4): one shift, one AND
                    b[t, i] = step_codes(raw[t, 2 * ks + i], vl % S, bits)
                T.evaluate(T.ptx_legacy.mma(
                    "m16n8k32", "row", "col", "int8", "int8", "int32",
                    a.data, 0, b.data, t * 2, c.data, t * 4, False, dtype="int32"))
            if (2 * ks + 2) % vec == 0 and more:  # vector (2 ks + 1) // vec is used up
                load_vector(qweight, raw, (2 * ks + 1) // vec, group + 1, vw, vl)
        for t in T.unroll(tiles):
            for i in T.unroll(4):  # rows l/4 (+8 for i >= 2), columns 2t (+1)
                acc[t, i] = acc[t, i] + T.Cast("float32", sc[t * 2 + i % 2]) * xs[i // 2] * T.Cast(
                    "float32", c[t, i] - T.Cast("int32", zr[t * 2 + i % 2]) * xn[i // 2])
        if more:
            load_factors(xq_sum, x_step, scales, zeros, group + 1, vw, vl, sc, zr, xs, xn)

    @T.prim_func(s_tir=True)
    def uniform_gemm_cuda_mma(
        x: T.Buffer((M, K), "float32"),
        qweight: T.Buffer((G, N // TILE_N, TILE_N * UG), "int32"),
        scales: T.Buffer((G, N), "float16"),
        zeros: T.Buffer((G, N), "uint8"),
        y: T.Buffer((M, N), "float32"),
    ):
        T.func_attr(attrs)
        x_rows = T.sblock_alloc_buffer((TILE_M, K), "float32")
        x_amax = T.sblock_alloc_buffer((TILE_M, G), "float32")
        x_inverse = T.sblock_alloc_buffer((TILE_M, G), "float32")
        xq_words = T.sblock_alloc_buffer((TILE_M, K // STEP), "int32")
        xq_sum = T.sblock_alloc_buffer((TILE_M, G), "int32")
        x_step = T.sblock_alloc_buffer((TILE_M, G), "float32")
        # all 16 rows' sums, k_sum reads M: the GEMM's code is then the same for every M (with
        # the rows past M dead, ptxas took 96 registers at M = 8 and scheduled it slower;
        # measurements: docs/results/from-docstrings.md)
        partial = T.sblock_alloc_buffer((W, KS, TILE_M, columns), "float32")
        for m, k in T.grid(TILE_M, K):
            with T.sblock("x_rows"):
                vm, vk = T.axis.remap("SS", [m, k])
                x_rows[vm, vk] = T.if_then_else(vm < M, x[T.min(vm, M - 1), vk], T.float32(0))
        quantize(x_rows, x_rows, x_amax, x_inverse, xq_words, xq_sum, x_step)
        for warp, part, lane in T.grid(W, KS, 32):
            with T.sblock("warp_gemm"):
                vw, vs, vl = T.axis.remap("SSS", [warp, part, lane])
                T.reads(xq_words[0:TILE_M, 0:K // STEP], xq_sum[0:TILE_M, 0:G],
                        x_step[0:TILE_M, 0:G],
                        qweight[0:G, vw * tiles:vw * tiles + tiles, 0:TILE_N * UG],
                        scales[0:G, vw * columns:vw * columns + columns],
                        zeros[0:G, vw * columns:vw * columns + columns])
                T.writes(partial[vw, vs, 0:TILE_M, 0:columns])
                a = T.sblock_alloc_buffer((4,), "int32", scope="local")
                b = T.sblock_alloc_buffer((tiles, 2), "int32", scope="local")
                c = T.sblock_alloc_buffer((tiles, 4), "int32", scope="local")
                acc = T.sblock_alloc_buffer((tiles, 4), "float32", scope="local")
                raw = T.sblock_alloc_buffer((tiles, lane_words), "int32", scope="local")
                sc = T.sblock_alloc_buffer((2 * tiles,), "float16", scope="local")
                zr = T.sblock_alloc_buffer((2 * tiles,), "uint8", scope="local")
                xs = T.sblock_alloc_buffer((2,), "float32", scope="local")
                xn = T.sblock_alloc_buffer((2,), "int32", scope="local")
                for t, i in T.grid(tiles, 4):
                    acc[t, i] = T.float32(0)
                for v in T.unroll(lane_words // vec):
                    load_vector(qweight, raw, v, vs * GS, vw, vl)
                load_factors(xq_sum, x_step, scales, zeros, vs * GS, vw, vl, sc, zr, xs, xn)
                for step in T.serial(GS):
                    group_gemm(xq_words, xq_sum, x_step, qweight, scales, zeros, vs * GS + step,
                               step + 1 < GS, vw, vl, a, b, c, acc, raw, sc, zr, xs, xn)
                for t, i in T.grid(tiles, 4):
                    partial[vw, vs, vl // 4 + 8 * (i // 2),
                            t * TILE_N + (vl % 4) * 2 + i % 2] = acc[t, i]
        for warp, m, j, part in T.grid(W, M, columns, KS):
            with T.sblock("k_sum"):
                vw, vm, vj, vs = T.axis.remap("SSSR", [warp, m, j, part])
                with T.init():
                    y[vm, vw * columns + vj] = T.float32(0)
                y[vm, vw * columns + vj] = y[vm, vw * columns + vj] + partial[
                    vw, vs, vm, vj]

    return uniform_gemm_cuda_mma
