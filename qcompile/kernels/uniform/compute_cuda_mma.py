"""TensorIR of the uniform family with int8 activations on tensor cores (``mma.sync``
m16n8k32, int8 x int8 -> int32; sm_80 and later), for batches of up to 16 rows.

The dp4a kernel (compute_cuda_int8.py) issues one instruction per 4 codes and row: at M = 16
on an H200 it is bound by instruction issue (8192x28672: 137 us, 0.9x fp16 ``linear``). One
``mma.sync`` multiplies a 16 x 32 tile of x by 32 x 8 codes: 4096 products per warp instruction
where dp4a gives 128. The arithmetic is the dp4a kernel's, x rounded to int8 per row and group
by the same blocks (:func:`~qcompile.kernels.uniform.compute_cuda_int8.uniform_quantize_x_blocks`),
codes the same words, grouped for the fragments (layout ``mma_words``, below):

    y[m, n] = sum_g s[g, n] * amax[m, g] / 127 * (dot[m, g, n] - z[g, n] * xqsum[m, g])
    dot[m, g, n] = sum over the group's k-steps of mma(x tile, code tile)      (int32, exact)

Rows of x past M are zeros in the x fragments (M < 16 wastes the rest of the tile, not memory).

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
``mma``, and one of :func:`k_split`'s slices of the groups, requesting the next group's words
while this one multiplies (two register buffers). Per group it applies the zero-points and
scales to its sums in float32; at the end it writes its 16 float sums into ``partial``, which
block ``k_sum`` adds up over the slices.

Operands: x float32 [M, K]; qweight int32 [G, N, U_g], the dp4a kernel's words with each group's
U_g words of a column together, in :func:`unit_position`'s order (layout ``mma_words``,
uniform/layout.py), so a lane's words for a group are one run of 128-bit loads; scales float16
[G, N], zeros uint8 [G, N], y float32 [M, N].
"""

from __future__ import annotations

from qcompile._tvm import T
from qcompile.errors import SpecError
from qcompile.kernels.uniform.compute_cuda import COMPUTE_ATTR
from qcompile.kernels.uniform.compute_cuda_int8 import steps_per_unit, uniform_quantize_x_blocks
from qcompile.kernels.uniform.compute_int8 import STEP, unit_rows
from qcompile.kernels.uniform.spec import UniformSpec

COMPUTE_NAME = "uniform.cuda_mma.v1"
#: The mma shape: rows of x, columns of W, rows of K per instruction.
TILE_M, TILE_N, TILE_K = 16, 8, 32
#: Tiles of 8 columns per warp: each x fragment feeds this many mma.
TILES_PER_WARP = 4
#: Columns per warp.
WARP_COLUMNS = TILE_N * TILES_PER_WARP
#: Warps over K per 32 columns (their float sums meet in ``k_sum``).
K_SPLITS = (1, 2, 4, 8)
#: Fewest groups a warp walks.
MIN_GROUPS_PER_WARP = 4
#: Warps the grid should hold: 12 per SM of an H200 (132 SMs).
TARGET_WARPS = 12 * 132
#: Group sizes the kernel takes.
GROUP_SIZES = (32, 64, 128)
#: Fewest rows of x for which the int8 CUDA kernel is this one (:func:`uses_tensor_cores`).
MIN_ROWS = 8
_WORDS = TILE_K // STEP                     # int32 words of x (and code steps) per k-step


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
    """Whether an int8-activation spec's CUDA kernel is this one rather than the dp4a one: from
    :data:`MIN_ROWS` rows of x on (H200, 8192x28672: M = 8 47.6 us against 83.2 for dp4a,
    M = 16 58.0 against 136.9; M = 4 54.8 against 44.1) where the layout fits."""
    return spec.int8_activations and spec.m >= MIN_ROWS and not problems_with(spec)


def k_split(spec: UniformSpec) -> int:
    """Warps that share one 32-column slice of the GEMM, each over a slice of the groups: the
    fewest of :data:`K_SPLITS` that give the grid :data:`TARGET_WARPS` warps, within those that
    divide the group count and leave each warp :data:`MIN_GROUPS_PER_WARP` groups or more
    (H200, M = 16: 8192x28672 2 warps 58.0 us, 4 60.3, 8 65.7; 28672x8192 8 warps 58.3, 4 80.0,
    2 142.3; 4096x4096 8 warps 10.4, 4 13.9, 2 22.8)."""
    fits = [v for v in K_SPLITS if spec.groups % v == 0
            and spec.groups // v >= MIN_GROUPS_PER_WARP] or [1]
    slices = spec.n // WARP_COLUMNS
    return next((v for v in fits if slices * v >= TARGET_WARPS), max(fits))


def units_per_group(spec: UniformSpec) -> int:
    """Packed words (units of K) per group and column."""
    return spec.effective_group_size // unit_rows(spec.bits)


def unit_position(unit: int, bits: int, group_units: int) -> int:
    """Where the ``mma_words`` layout stores unit ``unit`` of a group (of ``group_units``) for
    one column. A lane reads code steps t and t + 4 of every k-step: at 2 bits units 2 ks and
    2 ks + 1 for every lane (natural order), at 4 bits the units of parity t // 2 (even units
    first, then odd ones), so each lane's words are one contiguous run."""
    if bits == 4:
        return unit % 2 * (group_units // 2) + unit // 2
    return unit


def uniform_compute_cuda_mma(spec: UniformSpec, tiles: int = TILES_PER_WARP,
                             split: int | None = None):
    """The tensor-core PrimFunc for ``spec`` (symbol ``spec.name()``; :func:`check_spec`):
    ``tiles`` tiles of 8 columns per warp, ``split`` warps over K (default :func:`k_split`)."""
    check_spec(spec)
    M, K, N, G = spec.m, spec.k, spec.n, spec.groups
    bits, gsize = spec.bits, spec.effective_group_size
    S = steps_per_unit(bits)
    group_words = gsize // STEP
    k_steps = gsize // TILE_K
    columns = TILE_N * tiles                # per warp
    W, KS = N // columns, split or k_split(spec)
    GS = G // KS                            # groups per K slice
    mask = {2: 0x03030303, 4: 0x0F0F0F0F}[bits]
    UG = units_per_group(spec)              # packed words per group and column
    lane_words = 2 * k_steps                # of them, a lane reads
    vec = min(4, lane_words)                # words per vector load

    def lane_base(lane):
        """First word of a lane's run (4-bit: the lanes t = 0, 1 take the even units, t = 2, 3
        the odd ones, each a contiguous half: :func:`unit_position`)."""
        return (lane % 4) // 2 * (UG // 2) if bits == 4 else 0
    attrs = {**spec.func_attrs(), COMPUTE_ATTR: COMPUTE_NAME}
    quantize = uniform_quantize_x_blocks(M, G, gsize, bits)

    @T.macro
    def load_words(qweight, raw, slot, group, vw, vl):
        # the lane's words of its column (tile t): contiguous in the mma_words layout
        for t in T.unroll(tiles):
            for v in T.unroll(lane_words // vec):
                raw[slot, t, T.ramp(v * vec, 1, vec)] = qweight[
                    group, vw * columns + t * TILE_N + vl // 4,
                    T.ramp(lane_base(vl) + v * vec, 1, vec)]

    @T.macro
    def group_gemm(xq_words, xq_sum, x_step, scales, zeros, raw, slot, group, vw, vl, a, b, c,
                   acc):
        for t in T.unroll(tiles):
            for i in T.unroll(4):
                c[t, i] = 0
        for ks in T.unroll(k_steps):
            for i in T.unroll(4):  # x rows l/4 (+8 for odd i), words t (+4 for i >= 2)
                a[i] = T.if_then_else(
                    vl // 4 + 8 * (i % 2) < M,
                    xq_words[T.min(vl // 4 + 8 * (i % 2), M - 1),
                             group * group_words + ks * _WORDS + vl % 4 + 4 * (i // 2)],
                    0)
            for t in T.unroll(tiles):
                for i in T.unroll(2):  # codes of column l/4, steps t (+4): one shift, one AND
                    b[t, i] = T.bitwise_and(
                        T.shift_right(raw[slot, t, 2 * ks + i], T.Cast("int32", (vl % S) * bits)),
                        T.int32(mask))
                T.evaluate(T.ptx_legacy.mma(
                    "m16n8k32", "row", "col", "int8", "int8", "int32",
                    a.data, 0, b.data, t * 2, c.data, t * 4, False, dtype="int32"))
        for t in T.unroll(tiles):
            for i in T.unroll(4):  # rows l/4 (+8 for i >= 2), columns 2t (+1)
                acc[t, i] = acc[t, i] + T.if_then_else(
                    vl // 4 + 8 * (i // 2) < M,
                    T.Cast("float32", scales[group, vw * columns + t * TILE_N
                                             + (vl % 4) * 2 + i % 2])
                    * x_step[T.min(vl // 4 + 8 * (i // 2), M - 1), group]
                    * T.Cast("float32", c[t, i] - T.Cast("int32", zeros[
                        group, vw * columns + t * TILE_N + (vl % 4) * 2 + i % 2])
                        * xq_sum[T.min(vl // 4 + 8 * (i // 2), M - 1), group]),
                    T.float32(0))

    @T.prim_func(s_tir=True)
    def uniform_gemm_cuda_mma(
        x: T.Buffer((M, K), "float32"),
        qweight: T.Buffer((G, N, UG), "int32"),
        scales: T.Buffer((G, N), "float16"),
        zeros: T.Buffer((G, N), "uint8"),
        y: T.Buffer((M, N), "float32"),
    ):
        T.func_attr(attrs)
        x_amax = T.sblock_alloc_buffer((M, G), "float32")
        x_inverse = T.sblock_alloc_buffer((M, G), "float32")
        xq_words = T.sblock_alloc_buffer((M, K // STEP), "int32")
        xq_sum = T.sblock_alloc_buffer((M, G), "int32")
        x_step = T.sblock_alloc_buffer((M, G), "float32")
        partial = T.sblock_alloc_buffer((W, KS, M, columns), "float32")
        quantize(x, x, x_amax, x_inverse, xq_words, xq_sum, x_step)
        for warp, part, lane in T.grid(W, KS, 32):
            with T.sblock("warp_gemm"):
                vw, vs, vl = T.axis.remap("SSS", [warp, part, lane])
                T.reads(xq_words[0:M, 0:K // STEP], xq_sum[0:M, 0:G], x_step[0:M, 0:G],
                        qweight[0:G, vw * columns:vw * columns + columns, 0:UG],
                        scales[0:G, vw * columns:vw * columns + columns],
                        zeros[0:G, vw * columns:vw * columns + columns])
                T.writes(partial[vw, vs, 0:M, 0:columns])
                a = T.sblock_alloc_buffer((4,), "int32", scope="local")
                b = T.sblock_alloc_buffer((tiles, 2), "int32", scope="local")
                c = T.sblock_alloc_buffer((tiles, 4), "int32", scope="local")
                acc = T.sblock_alloc_buffer((tiles, 4), "float32", scope="local")
                raw = T.sblock_alloc_buffer((2, tiles, lane_words), "int32", scope="local")
                for t, i in T.grid(tiles, 4):
                    acc[t, i] = T.float32(0)
                # two register buffers of packed words: group g + 1's loads are in flight
                # while group g is multiplied
                load_words(qweight, raw, 0, vs * GS, vw, vl)
                for pair in T.serial(GS // 2):
                    load_words(qweight, raw, 1, vs * GS + 2 * pair + 1, vw, vl)
                    group_gemm(xq_words, xq_sum, x_step, scales, zeros, raw, 0,
                               vs * GS + 2 * pair, vw, vl, a, b, c, acc)
                    if 2 * pair + 2 < GS:
                        load_words(qweight, raw, 0, vs * GS + 2 * pair + 2, vw, vl)
                    group_gemm(xq_words, xq_sum, x_step, scales, zeros, raw, 1,
                               vs * GS + 2 * pair + 1, vw, vl, a, b, c, acc)
                if GS % 2 == 1:
                    group_gemm(xq_words, xq_sum, x_step, scales, zeros, raw, 0,
                               vs * GS + GS - 1, vw, vl, a, b, c, acc)
                for t, i in T.grid(tiles, 4):
                    if vl // 4 + 8 * (i // 2) < M:
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
