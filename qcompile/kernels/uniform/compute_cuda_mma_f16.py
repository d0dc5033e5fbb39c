"""TensorIR of the uniform family with fp16 or bf16 activations on tensor cores (``mma.sync``
m16n8k16, half x half -> float32; sm_80 and later), for batches of up to 16 rows: x as the
model hands it, output in x's dtype, no rounding of x.

The codes never meet an int->float conversion. A code c of b <= 8 bits OR-ed into the mantissa
of the "magic" half ``B0`` (1024 in fp16, 0x6400; 128 in bf16, 0x4300) is the half ``B0 + c``
exactly, and two codes 16 bits apart in a word become a half2 fragment register in one shift
and one LOP3 (``(word >> s) & mask | magic``). The tensor cores then multiply x by ``B0 + c``;
the offsets are removed per group in float32, where nothing rounds them away:

    S[m, n]  = sum over the group's k of x[m, k] * (B0 + c[k, n])        (mma, float32 sums)
    X[m]     = sum over the group's k of x[m, k] * B0                   (one more mma, B = B0)
    y[m, n] += s[g, n] * (S[m, n] - (B0 + z[g, n]) / B0 * X[m])

Products of a half x and ``B0 + c`` (11 significant bits each) are exact in float32, so what
the offset costs is the float32 rounding of sums about ``B0 / 8`` times larger than the
result: about 1e-5 relative at fp16's B0 = 1024 (measured: tests/cuda/test_uniform_mma_f16_cuda.py).
bf16 has 8 significant bits, so at 8 bits its magic cannot hold a code (128 + 255 needs 9):
8-bit codes take fp16 x only.

The GEMM is written per warp lane, as in the int8 tensor-core kernel (compute_cuda_mma.py):
block ``warp_gemm`` runs for one lane of one warp (loops ``warp`` over N / 32, ``part`` over
:func:`k_split`'s slices of K, ``lane`` over 32). A warp takes :data:`TILES_PER_WARP` tiles of 8
columns; it walks its slice of K in *units* of 128 rows (8 mma steps of 16): per unit and tile a
lane reads its ``b`` words (layout ``mma_f16``, :func:`word_position`), per group of the unit its
8 scales and 8 zeros (the int8 kernel's :func:`~compute_cuda_mma.scale_position` order), and
while it multiplies one unit the next unit's words are in flight. Lane l (group l // 4, thread
t = l % 4) holds

- x (A, 16 x 16, row-major): half pairs of rows l // 4 and l // 4 + 8, loaded from x itself in
  the rows of K :func:`x_row` assigns (rows past M are zeros, never loaded);
- codes (B, 16 x 8, column-major): the same rows as x (register b0 with a0/a1, b1 with a2/a3)
  of column l // 4: one word of the lane holds the registers of 8 / b steps, register r its
  codes at bits ``b r`` and ``16 + b r`` (3-bit codes as a 2-bit and a 1-bit plane, whose
  fields are OR-ed together: :func:`planes`);
- the float32 sums (C, 16 x 8): columns 2t and 2t + 1 of rows l // 4 and l // 4 + 8.

Operands: x float16/bfloat16 [M, K]; qweight int32 [N/8, K/128, 32 b] (:func:`word_position`);
scales float16 [G, N] and zeros uint8 [G, N], each warp's 32 columns in ``scale_position``'s
order; y [M, N] in x's dtype.
"""

from __future__ import annotations

from qcompile._tvm import T
from qcompile.errors import SpecError
from qcompile.kernels.tir.attrs import COMPUTE_ATTR
from qcompile.kernels.uniform.compute_cuda_mma import (
    K_SPLITS,
    TARGET_WARPS,
    TILE_M,
    TILE_N,
    TILES_PER_WARP,
    WARP_COLUMNS,
    scale_position,
)
from qcompile.kernels.uniform.spec import UniformSpec

COMPUTE_NAME = "uniform.cuda_mma_f16.v1"
#: Rows of K per mma step.
TILE_K = 16
#: Rows of K a lane walks per iteration (8 steps): whole words at every bit width.
UNIT_ROWS = 128
#: Bit widths whose codes split evenly into 16-bit halves of a word.
BITS = (2, 3, 4, 8)
#: Group sizes the kernel takes (-1: the whole column).
GROUP_SIZES = (32, 64, 128, -1)
#: The magic half of each activation dtype (its bits, its value): OR-ing a code below
#: 2 ** mantissa bits into it gives ``value + code``.
MAGIC = {"float16": (0x6400, 1024.0), "bfloat16": (0x4300, 128.0)}
#: mma operand type names of each activation dtype.
MMA_TYPE = {"float16": "fp16", "bfloat16": "bf16"}
#: Fewest units of K a warp walks.
MIN_UNITS_PER_WARP = 2
_STEPS = UNIT_ROWS // TILE_K


def problems_with(spec: UniformSpec) -> list[str]:
    """Why the fp16/bf16 tensor-core kernel cannot take ``spec`` (empty when it can)."""
    problems = []
    if spec.dtype not in MAGIC:
        problems.append(f"dtype={spec.dtype} must be float16 or bfloat16 (the tensor cores "
                        "take x as the model hands it)")
    if spec.int8_activations:
        problems.append("int8_activations must be False (int8 x takes the int8 kernels)")
    if spec.act_order:
        problems.append("act_order must be False (prepare gathers x before the kernel)")
    if spec.bits not in BITS:
        problems.append(f"bits={spec.bits} must be one of {BITS}")
    elif spec.bits == 8 and spec.dtype == "bfloat16":
        problems.append("8-bit codes need fp16 x: bf16's 8 significant bits cannot hold "
                        "128 + a code of 8 bits")
    if spec.m > TILE_M:
        problems.append(f"M={spec.m} must be at most {TILE_M} (one tile of rows)")
    if spec.n % WARP_COLUMNS:
        problems.append(f"N={spec.n} must be a multiple of {WARP_COLUMNS} (columns per warp)")
    if spec.k % UNIT_ROWS:
        problems.append(f"K={spec.k} must be a multiple of {UNIT_ROWS} (rows per unit)")
    if spec.group_size not in GROUP_SIZES:
        problems.append(f"group_size={spec.group_size} must be one of {GROUP_SIZES}")
    return problems


def check_spec(spec: UniformSpec) -> None:
    """Raise SpecError unless the kernel takes ``spec`` (:func:`problems_with`)."""
    problems = problems_with(spec)
    if problems:
        raise SpecError(f"{spec.name()}: the fp16/bf16 tensor-core kernel needs "
                        + "; ".join(problems))


def units(spec: UniformSpec) -> int:
    """Units of :data:`UNIT_ROWS` rows along K."""
    return spec.k // UNIT_ROWS


def k_split(spec: UniformSpec) -> int:
    """Warps that share one 32-column slice, each over a slice of the units: the fewest of
    :data:`K_SPLITS` that give the grid :data:`TARGET_WARPS` warps, within those that divide the
    units and leave each warp :data:`MIN_UNITS_PER_WARP` or more."""
    count = units(spec)
    fits = [v for v in K_SPLITS if count % v == 0 and count // v >= MIN_UNITS_PER_WARP] or [1]
    slices = spec.n // WARP_COLUMNS
    return next((v for v in fits if slices * v >= TARGET_WARPS), max(fits))


def planes(bits: int) -> tuple[int, ...]:
    """Field widths of the code planes, low bits first: one plane of b-bit fields, except 3-bit
    codes, which split into a 2-bit plane and a 1-bit plane (32 / 3 fields do not fill a word;
    fields 16 bits apart must)."""
    return (2, 1) if bits == 3 else (bits,)


def word_plane(word: int, bits: int) -> tuple[int, int, int]:
    """(field width, the word's index within its plane, the code bit its fields start at) of
    word ``word`` (0 .. b - 1) of a lane's unit: each plane of width w holds w words."""
    first = 0
    for width in planes(bits):
        if word < first + width:
            return width, word - first, first
        first += width
    raise ValueError(f"word {word} of a {bits}-bit lane (it has {bits})")


def _plane_starts(bits: int) -> list[tuple[int, int]]:
    """(first word, field width) of each plane; a plane's first word is also its first code
    bit (a plane of width w holds w words)."""
    starts, first = [], 0
    for width in planes(bits):
        starts.append((first, width))
        first += width
    return starts


def word_position(lane, word: int, bits: int):
    """Where word ``word`` (0 .. b - 1) of lane ``lane`` sits among a tile's ``32 b`` words of
    one unit: plane by plane, vector by vector (up to 4 words of a plane), the warp's lanes
    contiguous in each (one warp load is 32 vectors in a row). ``lane``: int when packing,
    a TIR expression in the kernel."""
    width, index, first = word_plane(word, bits)
    vec = min(width, 4)
    return 32 * first + index // vec * (32 * vec) + lane * vec + index % vec


def block_rows(spec: UniformSpec) -> int:
    """Rows of K within which the kernel orders x and the codes (:func:`x_row`): a group, or a
    unit when groups are longer."""
    return min(spec.effective_group_size, UNIT_ROWS)


def code_row(lane: int, word: int, field: int, bits: int, block: int) -> int:
    """The row of K, within a unit, of the code whose bits sit in field ``field`` of a lane's
    word ``word`` (fields of the word's plane width w, 0 .. 32/w - 1): register r = field %
    (16/w) of the word holds step ``index * 8/w + r // 2`` (index: the word's within its
    plane), fragment register h = ``r % 2``, its low half (fields below 16/w) the first of the
    pair; ``block``: :func:`block_rows`."""
    width, index, _ = word_plane(word, bits)
    per_half = 16 // width
    register, high = field % per_half, field // per_half
    step = index * (8 // width) + register // 2
    return x_row(lane % 4, step, register % 2, high, block)


def x_row(thread, step, register, half, block: int):
    """The row of K, within a unit, that lane thread ``thread`` (l % 4) multiplies at ``step``
    in fragment register ``register`` (a0/a1 and b0: 0; a2/a3 and b1: 1), half ``half``.

    Which rows an mma step multiplies is the kernel's choice, as long as x and the codes agree
    and each step stays within its group (``block`` rows: :func:`block_rows`). Within a block,
    lane thread t takes rows ``block / 4 * t + 4 s + 2 h + e`` (its step s in the block), so the
    x values a lane multiplies are runs of ``block / 4`` contiguous halves of each of its rows
    (128-bit loads) where the fragment's own order (rows 16 s + 8 h + 2 t + e) needs 32-bit
    loads.
    """
    steps = block // TILE_K
    return (step // steps * block + block // 4 * thread + 4 * (step % steps) + 2 * register
            + half)


def uniform_compute_cuda_mma_f16(spec: UniformSpec):
    """The fp16/bf16 tensor-core PrimFunc for ``spec`` (symbol ``spec.name()``;
    :func:`check_spec`)."""
    check_spec(spec)
    M, K, N, G = spec.m, spec.k, spec.n, spec.groups
    bits, dtype = spec.bits, spec.dtype
    gsize = spec.effective_group_size
    tiles, columns = TILES_PER_WARP, WARP_COLUMNS
    W, KS = N // columns, k_split(spec)
    US = units(spec) // KS                  # units per K slice
    groups_per_unit = max(1, UNIT_ROWS // gsize)
    steps_per_group = _STEPS // groups_per_unit
    block = block_rows(spec)
    magic_bits, magic = MAGIC[dtype]
    # (first word, field width, first code bit) of each plane, and the lane's vector loads:
    # every width has at most two (8 bits: 4 + 4 words; 3 bits: 2 + 1)
    plane_words = [(first, width, first) for first, width in _plane_starts(bits)]
    loads = [(word, min(word_plane(word, bits)[0], 4)) for word in range(bits)
             if word_plane(word, bits)[1] % min(word_plane(word, bits)[0], 4) == 0]
    first_load = loads[0][1]
    has_second = len(loads) > 1
    second_word, second_load = loads[1] if has_second else (0, 1)
    magic_pair = magic_bits * 0x10001
    mma_type = MMA_TYPE[dtype]
    attrs = {**spec.func_attrs(), COMPUTE_ATTR: COMPUTE_NAME}

    def group_of(unit, gi):
        """Scale row of group ``gi`` of unit ``unit``."""
        return (unit * UNIT_ROWS + gi * min(gsize, UNIT_ROWS)) // gsize

    def lane_scales(vw, vl):
        """The first of lane vl's 2 * tiles scales (and zeros) in warp vw's columns."""
        return vw * columns + scale_position(2 * (vl % 4))

    def decode(raw, t, step, h):
        """Fragment register b_h of tile t at ``step``: two codes 16 bits apart OR-ed into the
        magic half pair, each plane's fields in one shift and one LOP3 (3 bits: two planes)."""
        value = T.uint32(magic_pair)
        for first_word, width, first_bit in plane_words:
            per_word = 8 // width               # steps a word of this plane holds
            word = T.Cast("uint32", raw[t, first_word + step // per_word])
            field = T.bitwise_and(
                T.shift_right(word, T.Cast("uint32", width * ((step % per_word) * 2 + h))),
                T.uint32(((1 << width) - 1) * 0x10001))
            if first_bit:
                field = T.shift_left(field, T.uint32(first_bit))
            value = T.bitwise_or(value, field)
        return value

    def span(start, lanes):
        """``lanes`` consecutive elements from ``start``: a vector, or one element."""
        return T.ramp(start, 1, lanes) if lanes > 1 else start

    @T.macro
    def load_words(qweight, ahead, unit, vw, vl):
        # each plane's words in vectors of up to 4 (loads: first word, words)
        for t in T.unroll(tiles):
            ahead[t, span(0, first_load)] = qweight[
                vw * tiles + t, unit, span(word_position(vl, 0, bits), first_load)]
            if has_second:
                ahead[t, span(second_word, second_load)] = qweight[
                    vw * tiles + t, unit, span(word_position(vl, second_word, bits), second_load)]

    @T.macro
    def load_x(x, xv, unit, vl):
        # rows l/4 and l/4 + 8 (r), steps 2 pair and 2 pair + 1: 8 contiguous halves each
        # (x_row), one 128-bit load; rows past M are zeros and never loaded. The whole unit's
        # x at its start: loaded pair by pair, each load's latency stalled the mma after it
        for pair in T.unroll(_STEPS // 2):
            for r in T.unroll(2):
                for e in T.vectorized(8):
                    xv[pair, r, e] = T.if_then_else(
                        vl // 4 + 8 * r < M,
                        x[T.min(vl // 4 + 8 * r, M - 1),
                          unit * UNIT_ROWS + x_row(vl % 4, 2 * pair, 0, 0, block) + e],
                        T.Cast(dtype, 0))

    @T.macro
    def fragment_x(xv, a, step):
        # registers a0..a3: rows l/4 (+8 for odd i), register h = i // 2, two halves each
        for i in T.unroll(4):
            for e in T.vectorized(2):
                a[2 * i + e] = xv[step // 2, i % 2, x_row(0, step % 2, i // 2, e, block)]

    @T.macro
    def unit_gemm(x, scales, zeros, unit, vw, vl, xv, a, b, ones, c, cx, acc, raw, sc, zr):
        load_x(x, xv, unit, vl)
        for gi in T.unroll(groups_per_unit):
            sc[T.ramp(0, 1, 2 * tiles)] = scales[group_of(unit, gi),
                                                 T.ramp(lane_scales(vw, vl), 1, 2 * tiles)]
            zr[T.ramp(0, 1, 2 * tiles)] = zeros[group_of(unit, gi),
                                                T.ramp(lane_scales(vw, vl), 1, 2 * tiles)]
            for t in T.unroll(tiles):
                for i in T.unroll(4):
                    c[t, i] = T.float32(0)
            for i in T.unroll(4):
                cx[i] = T.float32(0)
            for sg in T.unroll(steps_per_group):
                fragment_x(xv, a, gi * steps_per_group + sg)
                T.evaluate(T.ptx_legacy.mma(
                    "m16n8k16", "row", "col", mma_type, mma_type, "fp32",
                    a.data, 0, ones.data, 0, cx.data, 0, False, dtype="float32"))
                for t in T.unroll(tiles):
                    for h in T.unroll(2):  # b0, b1 of the step
                        b[t, h] = decode(raw, t, gi * steps_per_group + sg, h)
                    T.evaluate(T.ptx_legacy.mma(
                        "m16n8k16", "row", "col", mma_type, mma_type, "fp32",
                        a.data, 0, b.data, t * 2, c.data, t * 4, False, dtype="float32"))
            for t in T.unroll(tiles):
                for i in T.unroll(4):  # rows l/4 (+8 for i >= 2), columns 2t (+1)
                    acc[t, i] = acc[t, i] + T.Cast("float32", sc[t * 2 + i % 2]) * (
                        c[t, i] - (T.float32(magic) + T.Cast("float32", zr[t * 2 + i % 2]))
                        * T.float32(1.0 / magic) * cx[i])

    @T.prim_func(s_tir=True)
    def uniform_gemm_cuda_mma_f16(
        x: T.Buffer((M, K), dtype),
        qweight: T.Buffer((N // TILE_N, K // UNIT_ROWS, 32 * bits), "int32"),
        scales: T.Buffer((G, N), "float16"),
        zeros: T.Buffer((G, N), "uint8"),
        y: T.Buffer((M, N), dtype),
    ):
        T.func_attr(attrs)
        partial = T.sblock_alloc_buffer((W, KS, TILE_M, columns), "float32")
        total = T.sblock_alloc_buffer((M, N), "float32")
        for warp, part, lane in T.grid(W, KS, 32):
            with T.sblock("warp_gemm"):
                vw, vs, vl = T.axis.remap("SSS", [warp, part, lane])
                T.reads(x[0:M, vs * US * UNIT_ROWS:(vs + 1) * US * UNIT_ROWS],
                        qweight[vw * tiles:vw * tiles + tiles, vs * US:vs * US + US,
                                0:32 * bits],
                        scales[0:G, vw * columns:vw * columns + columns],
                        zeros[0:G, vw * columns:vw * columns + columns])
                T.writes(partial[vw, vs, 0:TILE_M, 0:columns])
                xv = T.sblock_alloc_buffer((_STEPS // 2, 2, 8), dtype, scope="local")
                a = T.sblock_alloc_buffer((8,), dtype, scope="local")
                b = T.sblock_alloc_buffer((tiles, 2), "uint32", scope="local")
                ones = T.sblock_alloc_buffer((2,), "uint32", scope="local")
                c = T.sblock_alloc_buffer((tiles, 4), "float32", scope="local")
                cx = T.sblock_alloc_buffer((4,), "float32", scope="local")
                acc = T.sblock_alloc_buffer((tiles, 4), "float32", scope="local")
                raw = T.sblock_alloc_buffer((tiles, bits), "int32", scope="local")
                ahead = T.sblock_alloc_buffer((tiles, bits), "int32", scope="local")
                sc = T.sblock_alloc_buffer((2 * tiles,), "float16", scope="local")
                zr = T.sblock_alloc_buffer((2 * tiles,), "uint8", scope="local")
                for h in T.unroll(2):
                    ones[h] = T.uint32(magic_pair)
                for t, i in T.grid(tiles, 4):
                    acc[t, i] = T.float32(0)
                load_words(qweight, ahead, vs * US, vw, vl)
                for u in T.serial(US):
                    # this unit's words from the buffer, the next unit's requested before the
                    # mma read this one: a whole unit's loads in flight while it multiplies (two
                    # units took 150 registers a thread, and large grids two waves)
                    for t in T.unroll(tiles):
                        for w in T.unroll(bits):
                            raw[t, w] = ahead[t, w]
                    if u + 1 < US:
                        load_words(qweight, ahead, vs * US + u + 1, vw, vl)
                    unit_gemm(x, scales, zeros, vs * US + u, vw, vl, xv, a, b, ones, c, cx, acc,
                              raw, sc, zr)
                for t, i in T.grid(tiles, 4):
                    partial[vw, vs, vl // 4 + 8 * (i // 2),
                            t * TILE_N + (vl % 4) * 2 + i % 2] = acc[t, i]
        for warp, m, j, part in T.grid(W, M, columns, KS):
            with T.sblock("k_sum"):
                vw, vm, vj, vs = T.axis.remap("SSSR", [warp, m, j, part])
                with T.init():
                    total[vm, vw * columns + vj] = T.float32(0)
                total[vm, vw * columns + vj] = total[vm, vw * columns + vj] + partial[
                    vw, vs, vm, vj]
        for m, n in T.grid(M, N):
            with T.sblock("y_out"):
                vm, vn = T.axis.remap("SS", [m, n])
                y[vm, vn] = T.Cast(dtype, total[vm, vn])

    return uniform_gemm_cuda_mma_f16
