"""TensorIR of the uniform family with fp16 or bf16 activations on tensor cores (``mma.sync``
m16n8k16, half x half -> float32; sm_80 and later), for batches of up to 16 rows: x as the
model hands it, output in x's dtype, no rounding of x.

**The weights are the A operand.** mma's A is 16 x 16 and its B 16 x 8; a batch of a few rows
fills 8 columns better than 16 rows, so the kernel computes y^T = W^T x^T: A holds 16 columns
of W (its rows) by 16 rows of K, B holds 16 rows of K by 8 rows of x, and every register of A
is a decoded weight (none are padding). Lane l (group g = l // 4, thread t = l % 4) holds

- A (codes): registers a0..a3 = columns g, g + 8, g, g + 8 of the 16-column tile, rows of K
  (2t, 2t + 1) for a0/a1 and (2t + 8, 2t + 9) for a2/a3 (two halves each);
- B (x): b0 = rows (2t, 2t + 1) and b1 = rows (2t + 8, 2t + 9) of x's row g (of the 8-row tile);
- C (float32 sums): c0, c1 = column g, x rows 2t, 2t + 1; c2, c3 = column g + 8, same rows.

**Codes become halves in place, one LOP3 each.** A code c OR-ed at bit o of the mantissa of the
"magic" half ``B0`` (1024 in fp16, 0x6400; 128 in bf16, 0x4300) gives the half ``B0 + 2^o c``
exactly, as long as o + bits fits the mantissa (10 bits in fp16, 7 in bf16). A 32-bit word
holds codes 16 bits apart, so ``lop3(word >> shift, mask, magic)`` makes a register from the
fields at bit ``shift + o`` and ``shift + o + 16``; codes packed at the bit offsets their
register uses need no shift (4-bit fp16: one shift and four LOP3 per word of 8 codes;
:func:`register_plan`). Then one ``fma.rn`` on the pair, ``a * 1 + off``, with ``off`` the
pair ``-(B0 + 2^o z)`` (z: the column's zero-point, built like a code register from the zeros
once per group) leaves ``2^o (c - z)``, exact in half precision. The 2^o is taken out of x
instead: the B register that meets a register of offset o holds x / 2^o (exact: a power of
two). So the float32 sums are exactly ``sum_k x_k (c_k - z)``, rounded as float32 sums are:

    C[n, m] = sum over the group's k of x[m, k] 2^-o_k (2^o_k (c[k, n] - z[n]))
    y[m, n] += s[g, n] * C[n, m]

(Subtracting the zero-point with a second mma per step of ``-(B0 + 2^o z)`` times the same x
also gives exact products, but doubles the tensor-core work and leaves float32 sums about B0
times larger than the result.) bf16's 7-bit mantissa cannot hold 128 + an 8-bit code: 8-bit
codes take fp16 x only.

The GEMM is written per warp lane (block ``warp_gemm``: one lane of one warp; loops ``warp``
over N / 32, ``part`` over :func:`k_split`'s slices of K, ``lane`` over 32). A warp takes
:data:`COLUMN_TILES` tiles of 16 columns and walks its slice of K in units of 128 rows (8 mma
steps of 16): per unit and tile a lane reads its ``2 b`` words (layout ``mma_f16_a``,
:func:`word_position`), per group its 4 scales and 4 zeros (:func:`scale_position`), and per
unit its 32 halves of x for each tile of 8 rows: lane thread t multiplies rows
``block / 4 * t .. + block / 4`` of each block of K (:func:`x_row`), so its x is contiguous
(128-bit loads). The next units' words are in flight while this unit's are multiplied, in
one of two ways (:func:`stages`): register buffers that take turns (:data:`WORD_BUFFERS`, two
by default), or a ring of :data:`WORD_STAGES` units per warp in shared memory that
``cp.async`` fills ``stages - 1`` units ahead, each lane copying and reading back only its own
words (so a ``cp.async.wait_group`` and no barrier), with one unit's words in registers. The
ring costs shared memory instead of registers, so more units are in flight per SM; it is the
default for one tile of rows where each warp has at least :data:`MIN_STAGED_UNITS` units.

**act_order** specs read x in the checkpoint's order through ``perm`` (x[:, perm[k]] for the
reordered row k), 8 indices at a time, instead of a gather before the call.

Operands: x float16/bfloat16 [M, K]; qweight int32 [N/16, K/128, 64 b] (:func:`word_position`);
scales float16 [G, N] and zeros uint8 [G, N], each warp's 32 columns in :func:`scale_position`'s
order; for act_order specs perm int32 [K]; y [M, N] in x's dtype.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from qcompile._tvm import T
from qcompile.errors import SpecError
from qcompile.kernels.tir.attrs import COMPUTE_ATTR
from qcompile.kernels.uniform.spec import UniformSpec

COMPUTE_NAME = "uniform.cuda_mma_f16.v4"
#: Rows of K per mma step.
TILE_K = 16
#: Columns of W per mma (A's 16 rows) and rows of x per mma (B's 8 columns).
TILE_COLUMNS, TILE_ROWS = 16, 8
#: Rows of x the kernel takes: two tiles of 8.
MAX_ROWS = 2 * TILE_ROWS
#: Tiles of 16 columns per warp: each x fragment feeds this many mma.
COLUMN_TILES = 2
#: Columns per warp.
WARP_COLUMNS = TILE_COLUMNS * COLUMN_TILES
#: Rows of K a lane walks per iteration (8 steps): whole words at every bit width.
UNIT_ROWS = 128
_STEPS = UNIT_ROWS // TILE_K
#: Bit widths the kernel takes.
BITS = (2, 3, 4, 8)
#: Group sizes the kernel takes (-1: the whole column).
GROUP_SIZES = (32, 64, 128, -1)
#: The magic half of each activation dtype (its bits, its value, its mantissa bits): OR-ing a
#: code below 2 ** mantissa bits into it gives ``value + code``.
MAGIC = {"float16": (0x6400, 1024.0, 10), "bfloat16": (0x4300, 128.0, 7)}
#: The half 1.0 of each activation dtype (its bits).
ONE = {"float16": 0x3C00, "bfloat16": 0x3F80}
#: ``fma.rn`` on pairs of halves of each activation dtype: (d, a, b, c), d = a * b + c.
FMA = {"float16": T.ptx.fma.rn.f16x2, "bfloat16": T.ptx.fma.rn.bf16x2}
#: mma operand type names of each activation dtype.
MMA_TYPE = {"float16": "fp16", "bfloat16": "bf16"}
#: SMs of the GPUs the split rule plans for (H100 SXM and H200: 132), their registers and
#: warps per SM, and the most warps a block takes (1024 threads).
SMS, SM_REGISTERS, SM_WARPS, BLOCK_WARPS = 132, 65536, 64, 32
#: Registers a thread takes at two word buffers, by (tiles of 8 rows of x, bits): the most
#: ptxas (sm_90) gave over 8192x28672 and 28672x8192, group sizes 32 and 128, act_order or
#: not, rounded up to its allocation unit of 8. Each further word buffer adds its words
#: (:func:`registers`). (Small shapes, whose few units a warp are unrolled whole, take up to
#: 30 more; their few slices leave one block an SM, which holds the split either way.)
REGISTERS = {(1, 2): 96, (1, 3): 112, (1, 4): 88, (1, 8): 112,
             (2, 2): 112, (2, 3): 144, (2, 4): 112, (2, 8): 136}
#: Fewest units of K a warp walks.
MIN_UNITS_PER_WARP = 2
#: Share of the most warps an even split of the units must reach to be taken (k_split).
EVEN_SHARE = 0.7
#: Word buffers a lane cycles through, by bit width: the words of ``buffers - 1`` units are in
#: flight while one unit multiplies. 2 alternates even and odd units. (8-bit codes, 4 KB a warp
#: and unit, read at 87% of the copy bandwidth where 4-bit, 2 KB, read at 70% and 2-bit at 50%
#: on an H200: a warp's bytes in flight look like the limit; more buffers cost registers.)
WORD_BUFFERS = {2: 2, 3: 2, 4: 2, 8: 2}
#: Units of words a warp stages in shared memory instead, by bit width (0: none, the register
#: buffers above): ``cp.async`` copies unit u + stages - 1 while unit u multiplies, so
#: ``stages - 1`` units are in flight at the cost of shared memory, not registers, and a lane
#: keeps one unit's words in registers (the ring of ``staged_gemm``; each lane reads back only
#: the bytes it copied, so no barrier). Where :func:`stages` takes them (one tile of rows,
#: slices of 4 units or more) 3 stages read 4-bit codes at 81-84% of the copy bandwidth and
#: 8-bit at 94% on an H200, against 72-75% and 91% in registers; 2- and 3-bit codes, whose
#: decode is the limit, lost 10% to the extra shared-memory loads, so they keep registers.
WORD_STAGES = {2: 0, 3: 0, 4: 3, 8: 3}
#: Fewest units a warp's slice must have for the words to be staged (:func:`stages`).
MIN_STAGED_UNITS = 4
#: Shared memory of an SM (H100/H200: 228 KB, 1 KB of it reserved per resident block).
SM_SHARED, BLOCK_RESERVED_SHARED = 228 * 1024, 1024
#: lop3's look-up table for ``(a & b) | c``.
AND_OR = 0xEA


def problems_with(spec: UniformSpec) -> list[str]:
    """Why the fp16/bf16 tensor-core kernel cannot take ``spec`` (empty when it can)."""
    problems = []
    if spec.dtype not in MAGIC:
        problems.append(f"dtype={spec.dtype} must be float16 or bfloat16 (the tensor cores "
                        "take x as the model hands it)")
    if spec.int8_activations:
        problems.append("int8_activations must be False (int8 x takes the int8 kernels)")
    if spec.bits not in BITS:
        problems.append(f"bits={spec.bits} must be one of {BITS}")
    elif spec.bits == 8 and spec.dtype == "bfloat16":
        problems.append("8-bit codes need fp16 x: bf16's 7 mantissa bits cannot hold "
                        "128 + a code of 8 bits")
    if spec.m > MAX_ROWS:
        problems.append(f"M={spec.m} must be at most {MAX_ROWS} (two tiles of rows)")
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


def registers(spec: UniformSpec, staged: int = 0) -> int:
    """Registers a thread of ``spec``'s kernel is planned to take with ``staged`` units of words
    in shared memory (:data:`REGISTERS`; staged words keep one unit's in registers, one buffer
    fewer)."""
    buffers = 1 if staged else WORD_BUFFERS[spec.bits]
    extra = (buffers - 2) * COLUMN_TILES * words_per_lane(spec.bits)
    return -(-(REGISTERS[row_tiles(spec), spec.bits] + extra) // 8) * 8


def shared_bytes_per_warp(spec: UniformSpec, staged: int = 0) -> int:
    """Shared memory a warp of ``spec``'s kernel takes: ``staged`` units of its words and its
    partial sums."""
    return staged * stage_bytes(spec) + partial_bytes(spec)


def stage_bytes(spec: UniformSpec) -> int:
    """Bytes of one unit of a warp's words (one stage of its ring)."""
    return 32 * COLUMN_TILES * words_per_lane(spec.bits) * 4


def partial_bytes(spec: UniformSpec) -> int:
    """Bytes of a warp's partial sums (float32, its rows of x by its 32 columns)."""
    return row_tiles(spec) * TILE_ROWS * WARP_COLUMNS * 4


def resident_warps(spec: UniformSpec, staged: int | None = None) -> int:
    """Warps of ``spec``'s kernel one SM holds at once (by registers and shared memory), with
    ``staged`` units of words in shared memory (default: :func:`stages`)."""
    staged = stages(spec) if staged is None else staged
    blocks = -(-(spec.n // WARP_COLUMNS) // SMS)
    by_shared = ((SM_SHARED - blocks * BLOCK_RESERVED_SHARED)
                 // shared_bytes_per_warp(spec, staged))
    return min(SM_WARPS, SM_REGISTERS // (32 * registers(spec, staged)), by_shared)


def stages(spec: UniformSpec) -> int:
    """Units of words a warp of ``spec``'s kernel stages in shared memory (0: register
    buffers): :data:`WORD_STAGES` for one tile of rows of x where the split leaves each warp at
    least :data:`MIN_STAGED_UNITS` units, else 0 (a warp of 2 units has nothing to keep in
    flight; at two tiles the staged kernel measured slower, see the docstring)."""
    count = WORD_STAGES[spec.bits]
    if not count or row_tiles(spec) > 1:
        return 0
    return count if units(spec) // _split(spec, count) >= MIN_STAGED_UNITS else 0


def ring_words(spec: UniformSpec) -> int:
    """int32 words of the kernel's shared ring (every warp's stages), declared 128 bytes past
    48 KB where the block's shared memory passes 48 KB. TVM compacts the ring to the words the
    warps touch, so that padding never reaches a launch (:func:`partial_scope` is what keeps
    such blocks launchable); it stays because the shipped record packs' workloads hash this
    TensorIR."""
    ring = ring_bytes(spec)
    if ring and block_shared_bytes(spec) > 48 * 1024:
        ring = max(ring, 48 * 1024 + 128)
    return ring // 4


def ring_bytes(spec: UniformSpec) -> int:
    """Bytes of the ring the warps use: :func:`stages` units of words for each."""
    return k_split(spec) * stages(spec) * stage_bytes(spec)


def block_shared_bytes(spec: UniformSpec) -> int:
    """Shared memory a block uses: its ring and every warp's partial sums, side by side."""
    return ring_bytes(spec) + k_split(spec) * partial_bytes(spec)


def partial_scope(spec: UniformSpec) -> str:
    """Where the block's partial sums live: static ``"shared"``, or ``"shared.dyn"`` where a
    static array beside a dynamic ring under 48 KB would take the block past 48 KB. TVM raises
    a kernel's limit of shared memory only for a dynamic allocation that large, so CUDA refused
    to launch such a block (8192x14336 at M = 1: a 43008-byte ring and 7168 bytes of sums).
    Dynamic, the sums merge into the ring's allocation and reuse it after a barrier."""
    ring = ring_bytes(spec)
    if ring and ring < 48 * 1024 < block_shared_bytes(spec):
        return "shared.dyn"
    return "shared"


def k_split(spec: UniformSpec) -> int:
    """Warps that share one 32-column slice (one block), each over a slice of the units.

    The kernel reads W once, so its speed is the bytes in flight: many warps an SM, and every
    block in the first wave (a second, partial wave leaves most SMs idle while it runs: at
    8192x28672 M = 1, blocks of 8 warps made 2.26 waves). ``most`` is the largest split that
    keeps one wave (``ceil(slices / SMS)`` blocks an SM, :func:`resident_warps`) within
    :data:`MIN_UNITS_PER_WARP` units a warp. The rule takes the largest split that divides the
    units if it is at least :data:`EVEN_SHARE` of ``most``, else ``most`` itself, the units
    then split unevenly (:func:`unit_slice`: a longer slice's last unit is not overlapped,
    which measured slower than an even split of somewhat fewer warps; on an H200, e.g.
    28672x8192 M = 16: 9 warps 86 us, 8 warps 58 us; 8192x28672 M = 1: 3 warps 39.9 us, 2
    warps 41.3 us, 8 warps in 2.26 waves 41.4 us). When no split fits one wave (N past what
    the SMs hold), one warp.
    """
    return _split(spec, stages(spec))


def _split(spec: UniformSpec, staged: int) -> int:
    """:func:`k_split` with ``staged`` units of words in shared memory."""
    count = units(spec)
    blocks_per_sm = -(-(spec.n // WARP_COLUMNS) // SMS)
    most = max(1, min(BLOCK_WARPS, resident_warps(spec, staged) // blocks_per_sm,
                      count // MIN_UNITS_PER_WARP))
    even = max(v for v in range(1, most + 1) if count % v == 0)
    return even if even >= EVEN_SHARE * most else most


def unit_slice(spec: UniformSpec, part):
    """(first unit, units) of K slice ``part`` (0 .. :func:`k_split` - 1): the units split as
    evenly as they go, the first ``units % split`` slices one longer. ``part``: int, or a TIR
    expression in the kernel (then the count is too)."""
    split = k_split(spec)
    base, longer = divmod(units(spec), split)
    if isinstance(part, int):
        return part * base + min(part, longer), base + (part < longer)
    if not longer:
        return part * base, base
    return part * base + T.min(part, longer), base + T.Cast("int32", part < longer)


def row_tiles(spec: UniformSpec) -> int:
    """Tiles of 8 rows of x: 1 for M <= 8, 2 up to 16."""
    return -(-spec.m // TILE_ROWS)


def block_rows(spec: UniformSpec) -> int:
    """Rows of K within which the kernel orders x and the codes (:func:`x_row`): a group, or a
    unit when groups are longer."""
    return min(spec.effective_group_size, UNIT_ROWS)


def x_row(thread, step, register, half, block: int):
    """The row of K, within a unit, that lane thread ``thread`` (l % 4) multiplies at ``step``
    in B register ``register`` (b0: 0, b1: 1), half ``half``.

    Which rows an mma step multiplies is the kernel's choice, as long as x and the codes agree
    and each step stays within its group (``block`` rows: :func:`block_rows`). Within a block,
    lane thread t takes rows ``block / 4 * t + 4 s + 2 h + e`` (its step s in the block), so the
    x a lane multiplies is a run of ``block / 4`` contiguous halves per block (128-bit loads)
    where the fragment's own order (rows 16 s + 8 h + 2 t + e) needs 32-bit loads; in a unit,
    the lane's halves in that order are ``4 s + 2 h + e``.
    """
    steps = block // TILE_K
    return (step // steps * block + block // 4 * thread + 4 * (step % steps) + 2 * register
            + half)


@dataclass(frozen=True)
class Field:
    """Where some bits of the two codes of an A register sit in the lane's words.

    The codes' bits ``code_bit .. code_bit + width - 1`` sit at bits ``bit ..`` (first code)
    and ``bit + 16 ..`` (second code) of word ``word`` (0 .. 2 b - 1) of the lane's unit.
    """

    word: int
    bit: int
    width: int
    code_bit: int


@dataclass(frozen=True)
class Register:
    """How A register ``register`` (0..3) of a step is made: its codes' bits at mantissa bit
    ``offset`` of the magic half (the register holds ``B0 + 2^offset c``), from ``fields``."""

    offset: int
    fields: tuple[Field, ...]

    def shift(self, field: Field) -> int:
        """Right shift (negative: left) that brings ``field`` to its bits in the register."""
        return field.bit - self.offset - field.code_bit


def _offset(position: int, bits: int, dtype: str) -> int:
    """Mantissa bit for a code stored at ``position`` of its half: the same bit, needing no
    shift, when the code fits there, else the highest that fits."""
    return min(position, MAGIC[dtype][2] - bits)


@cache
def register_plan(bits: int, dtype: str) -> tuple[tuple[Register, ...], ...]:
    """For each step of a unit (8) the four A registers: their mantissa offsets and the fields
    of the lane's words they read.

    - 4 bits: word s per step; a0 and a2 from bits 0 and 4 (+16), a1 and a3 from 8 and 12: in
      fp16 at offsets 0, 4, 0, 4 (one shift by 8 per word); bf16's 7 mantissa bits take them at
      offset 0 (three shifts).
    - 2 bits: word s // 2 (16 codes, two steps); step parity q: a0/a1 at bits 4q, a2/a3 at
      4q + 2 (+8 for a1/a3), each at its own offset where it fits.
    - 3 bits: a 2-bit plane (words 0..3, as 2 bits) and a 1-bit plane (words 4, 5: 4 steps each)
      whose bit joins at offset + 2; its positions are chosen so that four registers share each
      shift of the word (:func:`_one_bit_positions`).
    - 8 bits (fp16): words 2s and 2s + 1, bytes 0 and 1 (+16): a0, a1 from the first.
    """
    steps = []
    for step in range(_STEPS):
        registers = []
        for register in range(4):
            row, pair = register % 2, register // 2     # column g (+8), rows 2t (+8)
            if bits == 4:
                bit = 8 * row + 4 * pair
                offset = _offset(4 * pair, bits, dtype)
                fields = (Field(step, bit, 4, 0),)
            elif bits == 8:
                offset = 0
                fields = (Field(2 * step + pair, 8 * row, 8, 0),)
            else:                                        # 2 bits, or 3 bits' 2-bit plane
                position = 4 * (step % 2) + 2 * pair
                offset = _offset(position, bits, dtype)
                fields = (Field(step // 2, 8 * row + position, 2, 0),)
            registers.append(Register(offset, fields))
        steps.append(registers)
    if bits == 3:
        # the 1-bit plane sits where fp16's offsets want it, so the packing is the same for
        # both dtypes (bf16's registers then shift more of its fields)
        fp16 = steps if dtype == "float16" else register_plan(2, "float16")
        for step, register, position in _one_bit_positions(fp16):
            old = steps[step][register]
            steps[step][register] = Register(
                old.offset, old.fields + (Field(4 + step // 4, position, 1, 2),))
    return tuple(tuple(registers) for registers in steps)


def _one_bit_positions(steps) -> list[tuple[int, int, int]]:
    """(step, register, bit) of each 3-bit register's high bit in the 1-bit plane: four steps
    per word, 16 positions per half. A position ``offset + 2 + d`` needs the word shifted by d;
    the shifts -2, -1, 6, 7 come first, so in fp16 four registers share each."""
    placed = []
    for word in range(2):
        free = set(range(16))
        for step in range(4 * word, 4 * word + 4):
            for register in range(4):
                target = steps[step][register].offset + 2
                position = next((target + d for d in (-2, -1, 6, 7) if target + d in free),
                                None)
                if position is None:
                    position = min(free)
                free.remove(position)
                placed.append((step, register, position))
    return placed


def offset_patterns(bits: int, dtype: str) -> list[tuple[int, int]]:
    """The distinct (offset of a0/a1, offset of a2/a3) of the steps, in order of first use."""
    patterns = []
    for registers in register_plan(bits, dtype):
        pair = (registers[0].offset, registers[2].offset)
        if pair not in patterns:
            patterns.append(pair)
    return patterns


def words_per_lane(bits: int) -> int:
    """int32 words a lane reads per unit and column tile: 64 codes."""
    return 2 * bits


def word_vectors(bits: int) -> list[tuple[int, int]]:
    """(first word, words) of each vector load of a lane's words: up to 4 words (128 bits), and
    3 bits' two planes apart (4 + 2)."""
    if bits == 3:
        return [(0, 4), (4, 2)]
    return [(first, 4) for first in range(0, words_per_lane(bits), 4)]


def word_position(lane, word: int, bits: int):
    """Where word ``word`` of lane ``lane`` sits among a tile's ``64 b`` words of one unit:
    vector by vector (:func:`word_vectors`), the warp's lanes contiguous in each (one warp load
    is 32 vectors in a row). ``lane``: int when packing, a TIR expression in the kernel."""
    for first, count in word_vectors(bits):
        if first <= word < first + count:
            return 32 * first + lane * count + word - first
    raise ValueError(f"word {word} of a {bits}-bit lane (it has {words_per_lane(bits)})")


def code_position(bits: int, dtype: str, block: int, lane: int):
    """Yield (word, bit, width, code_bit, row, column) for every field of lane ``lane``'s words:
    bits ``code_bit ..`` of the code at the unit's row ``row`` of K and the tile's column
    ``column`` sit at bit ``bit ..`` of word ``word``."""
    group, thread = lane // 4, lane % 4
    for step, registers in enumerate(register_plan(bits, dtype)):
        for register, plan in enumerate(registers):
            column = group + 8 * (register % 2)
            for field in plan.fields:
                for half in range(2):
                    row = x_row(thread, step, register // 2, half, block)
                    yield (field.word, field.bit + 16 * half, field.width, field.code_bit,
                           row, column)


def scale_position(column):
    """Where the layout stores the scale and zero of ``column`` (0 .. 31) among its warp's
    columns: lane group g needs columns g and g + 8 of each tile of 16, so those 4 values are
    stored together (one 64-bit load of scales, 32-bit of zeros). Ints when packing, TIR
    expressions in the kernel."""
    return column % 8 * (2 * COLUMN_TILES) + column // 8


def uniform_compute_cuda_mma_f16(spec: UniformSpec):
    """The fp16/bf16 tensor-core PrimFunc for ``spec`` (symbol ``spec.name()``;
    :func:`check_spec`)."""
    check_spec(spec)
    M, K, N, G = spec.m, spec.k, spec.n, spec.groups
    bits, dtype = spec.bits, spec.dtype
    gsize = spec.effective_group_size
    CT, MT = COLUMN_TILES, row_tiles(spec)
    W, KS = N // WARP_COLUMNS, k_split(spec)
    US, LONGER = divmod(units(spec), KS)    # units of every K slice; the first LONGER: +1
    groups_per_unit = max(1, UNIT_ROWS // gsize)
    steps_per_group = _STEPS // groups_per_unit
    block = block_rows(spec)
    magic_bits = MAGIC[dtype][0]
    magic_pair = magic_bits * 0x10001
    negative_pair = (magic_bits | 0x8000) * 0x10001
    one_pair = ONE[dtype] * 0x10001
    plan = register_plan(bits, dtype)
    patterns = offset_patterns(bits, dtype)
    P = len(patterns)
    pattern_of = [patterns.index((r[0].offset, r[2].offset)) for r in plan]
    unscaled = all(r.offset == 0 for registers in plan for r in registers)
    NW = words_per_lane(bits)
    vectors = word_vectors(bits)
    mma_type = MMA_TYPE[dtype]
    attrs = {**spec.func_attrs(), COMPUTE_ATTR: COMPUTE_NAME}

    def group_of(unit, gi):
        """Scale row of group ``gi`` of unit ``unit``."""
        return (unit * UNIT_ROWS + gi * min(gsize, UNIT_ROWS)) // gsize

    def shifted(word, shift: int):
        if shift > 0:
            return T.shift_right(word, T.uint32(shift))
        if shift < 0:
            return T.shift_left(word, T.uint32(-shift))
        return word

    # The per-unit work is written by Python functions that emit TIR through the IR builder
    # (T.buffer_store, T.evaluate): every step, register and field is a Python int, so the
    # plan's shifts, masks and offsets are constants in the code.

    def load_words(qweight, words, unit, vw, vl):
        for ct in range(CT):
            for first, count in vectors:
                T.buffer_store(words, qweight[vw * CT + ct, unit, T.ramp(
                    word_position(vl, first, bits), 1, count)], [ct, T.ramp(first, 1, count)])

    def x_start(unit, v, vl):
        # the first of the lane's v-th run of 8 halves within a unit (x_row)
        run = block // 4
        return unit * UNIT_ROWS + 8 * v // run * block + run * (vl % 4) + 8 * v % run

    def gather_x(x, perm, xv, pv, unit, vl):
        # act_order: the same 32 positions, each read at x[:, perm[k]] (8 indices a vector)
        for v in range(4):
            start = x_start(unit, v, vl)
            for half in range(2):
                with T.vectorized(4) as e:
                    T.buffer_store(pv, perm[start + 4 * half + e], [4 * half + e])
            for mt in range(MT):
                row = mt * TILE_ROWS + vl // 4
                for e in range(8):
                    T.buffer_store(xv, T.if_then_else(
                        row < M, x[T.min(row, M - 1), pv[e]], T.Cast(dtype, 0)),
                        [mt, 8 * v + e])

    def scale_x(xv, mt):
        # each B register divided by 2^offset of the A registers it meets (exact)
        for step in range(_STEPS):
            for h in range(2):
                offset = plan[step][2 * h].offset
                if offset:
                    with T.vectorized(2) as e:
                        at = 4 * step + 2 * h + e
                        T.buffer_store(xv, xv[mt, at] * T.Cast(
                            dtype, T.float32(1.0 / (1 << offset))), [mt, at])

    def load_x(x, perm, xv, unit, vl):
        # the lane's 32 halves of each 8-row tile, 4 x 8 contiguous (x_row); rows past M are
        # zeros, never loaded; then scaled (scale_x). (Vector loops, not vector expressions:
        # MetaSchedule's feature extraction takes no Broadcast node.)
        if perm is not None:
            gather_x(x, perm, xv, local["pv"], unit, vl)
            for mt in range(MT):
                scale_x(xv, mt)
            return
        for mt in range(MT):
            row = mt * TILE_ROWS + vl // 4
            for v in range(4):
                start = x_start(unit, v, vl)
                # (where no register is scaled, the first 8 halves load in pairs: with only
                # 8-wide accesses, TVM retypes xv as uint4 and misplaces the mma's operand
                # offsets, which count halves)
                for pair, width in ([(p, 2) for p in range(4)] if unscaled and v == 0
                                    else [(0, 8)]):
                    with T.vectorized(width) as e:
                        at = width * pair + e
                        T.buffer_store(xv, T.if_then_else(
                            row < M, x[T.min(row, M - 1), start + at], T.Cast(dtype, 0)),
                            [mt, 8 * v + at])
            scale_x(xv, mt)

    def group_offsets(zeros, zr, off, group, vw, vl):
        # A registers of -(B0 + 2^o z) per tile and offset pattern, z of columns g and g + 8
        T.buffer_store(zr, zeros[group, T.ramp(vw * WARP_COLUMNS + scale_position(vl // 4), 1,
                                               2 * CT)], [T.ramp(0, 1, 2 * CT)])
        for ct in range(CT):
            for row in range(2):
                z = T.Cast("uint32", zr[2 * ct + row]) * T.uint32(0x10001)
                for p, pair in enumerate(patterns):
                    for h in range(2):
                        T.buffer_store(off, T.bitwise_or(
                            shifted(z, -pair[h]), T.uint32(negative_pair)),
                            [ct, p, 2 * h + row])

    def decode_register(a, words, ct, step: int, register: int):
        # the register's fields OR-ed into the magic pair, one lop3 each
        plan_register = plan[step][register]
        previous = T.uint32(magic_pair)
        for field in plan_register.fields:
            mask = ((1 << field.width) - 1) << (plan_register.offset + field.code_bit)
            T.evaluate(T.ptx.lop3.b32(
                a[ct, register],
                shifted(T.Cast("uint32", words[ct, field.word]), plan_register.shift(field)),
                T.uint32(mask * 0x10001), previous, AND_OR))
            previous = a[ct, register]

    def subtract_zero(a, off, ct, pattern: int, register: int):
        # a = (B0 + 2^o c) - (B0 + 2^o z) = 2^o (c - z), exact in half precision: one fma
        # a * 1 + off with off = -(B0 + 2^o z) (fma: bf16x2 has no sub before sm_90)
        T.evaluate(FMA[dtype](a[ct, register], a[ct, register], T.uint32(one_pair),
                              off[ct, pattern, register]))

    def mma(a_buffer, a_offset, xv, x_offset, c, c_offset):
        T.evaluate(T.ptx_legacy.mma(
            "m16n8k16", "row", "col", mma_type, mma_type, "fp32", a_buffer.data, a_offset,
            xv.data, x_offset, c.data, c_offset, False, dtype="float32"))

    def unit_gemm(x, perm, scales, zeros, words, unit, vw, vl, xv, a, off, c, acc, sc,
                  zr):
        load_x(x, perm, xv, unit, vl)
        for gi in range(groups_per_unit):
            group = group_of(unit, gi)
            T.buffer_store(sc, scales[group, T.ramp(
                vw * WARP_COLUMNS + scale_position(vl // 4), 1, 2 * CT)],
                [T.ramp(0, 1, 2 * CT)])
            group_offsets(zeros, zr, off, group, vw, vl)
            for step in range(gi * steps_per_group, (gi + 1) * steps_per_group):
                for ct in range(CT):
                    for register in range(4):
                        decode_register(a, words, ct, step, register)
                        subtract_zero(a, off, ct, pattern_of[step], register)
                    for mt in range(MT):
                        mma(a, ct * 4, xv, mt * 32 + 4 * step, c, (ct * MT + mt) * 4)
            for ct in range(CT):
                for mt in range(MT):
                    for i in range(4):  # column g (+8 for i >= 2), x rows 2t (+1)
                        T.buffer_store(acc, acc[ct, mt, i] + T.Cast(
                            "float32", sc[2 * ct + i // 2]) * c[ct, mt, i], [ct, mt, i])
                        T.buffer_store(c, T.float32(0), [ct, mt, i])

    def warp_reads(x, perm, qweight, scales, zeros, vw, vs):
        # a K slice of x, or all of x's columns when they are gathered (act_order)
        # (slices of unequal length declare all of K)
        first, count = (vs * US, US) if not LONGER else (0, units(spec))
        rows = slice(first * UNIT_ROWS, (first + count) * UNIT_ROWS)
        regions = [x[0:M, rows] if perm is None else x[0:M, 0:K],
                   qweight[vw * CT:vw * CT + CT, first:first + count, 0:32 * NW],
                   scales[0:G, vw * WARP_COLUMNS:vw * WARP_COLUMNS + WARP_COLUMNS],
                   zeros[0:G, vw * WARP_COLUMNS:vw * WARP_COLUMNS + WARP_COLUMNS]]
        return regions if perm is None else [*regions, perm[rows]]

    local = {}  # buffers only some kernels have (TVMScript binds no name to None)
    D = WORD_BUFFERS[bits]

    def allocate_word_buffers():
        if D > 2:
            local["words"] = [T.sblock_alloc_buffer((CT, NW), "int32", scope="local")
                              for _ in range(D)]

    def when(condition, emit):
        # emit under a TIR condition; a Python bool decides at generation time
        if isinstance(condition, bool):
            if condition:
                emit()
            return
        with T.If(condition):
            with T.Then():
                emit()

    def has_unit(u, vs):
        # whether the lane's K slice has its unit u (0-based; a TIR expression or an int):
        # every slice has US units, the first LONGER one more
        if isinstance(u, int) and u < US:
            return True
        if isinstance(u, int) and (u > US or not LONGER):
            return False
        return u < US if not LONGER else u < US + T.Cast("int32", vs < LONGER)

    def ring_gemm(x, perm, qweight, scales, zeros, first, vs, vw, vl, xv, a, off, c, acc, sc,
                  zr):
        # D > 2 word buffers: unit u multiplies from buffer u % D while units u + 1 ..
        # u + D - 1 are in flight (buffer indices are Python ints: registers, not memory)
        words = local["words"]

        def step(u, i):  # u: the unit (a TIR expression), i = u % D
            ahead = u + D - 1
            when(has_unit(ahead, vs), lambda: load_words(
                qweight, words[(i + D - 1) % D], first + ahead, vw, vl))
            unit_gemm(x, perm, scales, zeros, words[i], first + u, vw, vl, xv, a, off, c, acc,
                      sc, zr)

        for i in range(D - 1):
            when(has_unit(i, vs), lambda i=i: load_words(qweight, words[i], first + i, vw, vl))
        if US // D:
            with T.serial(US // D) as chunk:
                for i in range(D):
                    step(chunk * D + i, i)
        for i in range(US % D):
            step(US // D * D + i, i)
        when(has_unit(US, vs), lambda: unit_gemm(
            x, perm, scales, zeros, words[US % D], first + US, vw, vl, xv, a, off, c, acc, sc,
            zr))

    def pair_gemm(x, perm, qweight, scales, zeros, even, odd, first, vs, vw, vl, xv, a, off, c,
                  acc, sc, zr):
        # two buffers alternate: a unit's words arrive while the previous one's multiply
        load_words(qweight, even, first, vw, vl)
        if US // 2:
            with T.serial(US // 2) as u2:
                load_words(qweight, odd, first + 2 * u2 + 1, vw, vl)
                unit_gemm(x, perm, scales, zeros, even, first + 2 * u2, vw, vl, xv, a, off, c,
                          acc, sc, zr)
                when(2 * u2 + 2 < US, lambda: load_words(
                    qweight, even, first + 2 * u2 + 2, vw, vl))
                unit_gemm(x, perm, scales, zeros, odd, first + 2 * u2 + 1, vw, vl, xv, a, off,
                          c, acc, sc, zr)
        if US % 2:
            unit_gemm(x, perm, scales, zeros, even, first + US - 1, vw, vl, xv, a, off, c, acc,
                      sc, zr)

        def extra_unit():
            # a longer slice's last unit, after the others: not overlapped, but the loop
            # keeps the conditions it had without one (a condition on the slice in the loop,
            # or loading it during the last unit, made the kernel up to 25% slower on an
            # H200, or cost 20-30 registers at M = 16)
            load_words(qweight, even, first + US, vw, vl)
            unit_gemm(x, perm, scales, zeros, even, first + US, vw, vl, xv, a, off, c, acc, sc,
                      zr)

        when(has_unit(US, vs), extra_unit)

    S = stages(spec)

    def allocate_ring():
        if S:
            local["ring"] = T.sblock_alloc_buffer((ring_words(spec),), "int32",
                                                  scope="shared.dyn")

    def ring_at(vs, stage, ct, word):
        # the ring's word ``word`` (word_position) of tile ct, stage ``stage``, warp vs
        return ((vs * S + stage) * CT + ct) * 32 * NW + word

    def stage_copy(qweight, unit, stage, vs, vw, vl):
        # cp.async of a unit's words into a stage of the warp's ring, vector by vector, each
        # to the place the lane's load from the ring reads (word_position)
        ring = local["ring"]
        for ct in range(CT):
            for first_word, count in vectors:
                at = word_position(vl, first_word, bits)
                T.evaluate(T.ptx[f"cp.async.{'cg' if count == 4 else 'ca'}.shared.global"](
                    T.address_of(ring[ring_at(vs, stage, ct, at)]),
                    T.address_of(qweight[vw * CT + ct, unit, at]), 4 * count))

    def commit():
        # one group per unit, empty where the slice has no such unit: every wait then
        # leaves the same count in flight
        T.evaluate(T.ptx["cp.async.commit_group"]())

    def staged_gemm(x, perm, qweight, scales, zeros, words, first, vs, vw, vl, xv, a, off, c,
                    acc, sc, zr):
        # unit u: wait for its group (S - 2 younger ones stay in flight), read its words
        # from stage u % S, start the copy of unit u + S - 1 into the stage unit u - 1 left,
        # multiply
        ring = local["ring"]
        count = unit_slice(spec, vs)[1]
        for i in range(S - 1):
            when(has_unit(i, vs), lambda i=i: stage_copy(qweight, first + i, i, vs, vw, vl))
            commit()
        with T.serial(count) as u:
            T.evaluate(T.ptx["cp.async.wait_group"](S - 2))
            for ct in range(CT):
                for first_word, n_words in vectors:
                    at = word_position(vl, first_word, bits)
                    T.buffer_store(words, ring[T.ramp(ring_at(vs, u % S, ct, at), 1, n_words)],
                                   [ct, T.ramp(first_word, 1, n_words)])
            ahead = u + S - 1
            when(ahead < count, lambda: stage_copy(qweight, first + ahead, ahead % S, vs, vw,
                                                    vl))
            commit()
            unit_gemm(x, perm, scales, zeros, words, first + u, vw, vl, xv, a, off, c, acc, sc,
                      zr)

    def allocate_index_buffer(perm):
        # act_order: 8 indices of perm at a time
        if perm is not None:
            local["pv"] = T.sblock_alloc_buffer((8,), "int32", scope="local")

    @T.macro
    def gemm(x, qweight, scales, zeros, y, perm):
        T.func_attr(attrs)
        partial = T.sblock_alloc_buffer((W, KS, MT * TILE_ROWS, WARP_COLUMNS), "float32")
        total = T.sblock_alloc_buffer((M, N), "float32")
        for warp, part, lane in T.grid(W, KS, 32):
            with T.sblock("warp_gemm"):
                vw, vs, vl = T.axis.remap("SSS", [warp, part, lane])
                T.reads(warp_reads(x, perm, qweight, scales, zeros, vw, vs))
                T.writes(partial[vw, vs, 0:MT * TILE_ROWS, 0:WARP_COLUMNS])
                xv = T.sblock_alloc_buffer((MT, 32), dtype, scope="local")
                allocate_index_buffer(perm)
                a = T.sblock_alloc_buffer((CT, 4), "uint32", scope="local")
                off = T.sblock_alloc_buffer((CT, P, 4), "uint32", scope="local")
                c = T.sblock_alloc_buffer((CT, MT, 4), "float32", scope="local")
                acc = T.sblock_alloc_buffer((CT, MT, 4), "float32", scope="local")
                even = T.sblock_alloc_buffer((CT, NW), "int32", scope="local")
                odd = T.sblock_alloc_buffer((CT, NW), "int32", scope="local")
                allocate_word_buffers()
                allocate_ring()
                sc = T.sblock_alloc_buffer((2 * CT,), "float16", scope="local")
                zr = T.sblock_alloc_buffer((2 * CT,), "uint8", scope="local")
                for ct, mt, i in T.grid(CT, MT, 4):
                    acc[ct, mt, i] = T.float32(0)
                    c[ct, mt, i] = T.float32(0)
                first = unit_slice(spec, vs)[0]
                if S > 0:
                    staged_gemm(x, perm, qweight, scales, zeros, even, first, vs, vw, vl, xv, a,
                                off, c, acc, sc, zr)
                elif D == 2:
                    pair_gemm(x, perm, qweight, scales, zeros, even, odd, first, vs, vw, vl, xv,
                              a, off, c, acc, sc, zr)
                else:
                    ring_gemm(x, perm, qweight, scales, zeros, first, vs, vw, vl, xv, a, off, c,
                              acc, sc, zr)
                for ct, mt, i in T.grid(CT, MT, 4):
                    partial[vw, vs, mt * TILE_ROWS + 2 * (vl % 4) + i % 2,
                            ct * TILE_COLUMNS + vl // 4 + 8 * (i // 2)] = acc[ct, mt, i]
        for warp, m, j, part in T.grid(W, M, WARP_COLUMNS, KS):
            with T.sblock("k_sum"):
                vw, vm, vj, vs = T.axis.remap("SSSR", [warp, m, j, part])
                with T.init():
                    total[vm, vw * WARP_COLUMNS + vj] = T.float32(0)
                total[vm, vw * WARP_COLUMNS + vj] = total[vm, vw * WARP_COLUMNS + vj] + partial[
                    vw, vs, vm, vj]
        for m, n in T.grid(M, N):
            with T.sblock("y_out"):
                vm, vn = T.axis.remap("SS", [m, n])
                y[vm, vn] = T.Cast(dtype, total[vm, vn])

    if spec.act_order:
        @T.prim_func(s_tir=True)
        def uniform_gemm_cuda_mma_f16_gather(
            x: T.Buffer((M, K), dtype),
            qweight: T.Buffer((N // TILE_COLUMNS, K // UNIT_ROWS, 32 * NW), "int32"),
            scales: T.Buffer((G, N), "float16"),
            zeros: T.Buffer((G, N), "uint8"),
            perm: T.Buffer((K,), "int32"),
            y: T.Buffer((M, N), dtype),
        ):
            gemm(x, qweight, scales, zeros, y, perm)

        return uniform_gemm_cuda_mma_f16_gather

    @T.prim_func(s_tir=True)
    def uniform_gemm_cuda_mma_f16(
        x: T.Buffer((M, K), dtype),
        qweight: T.Buffer((N // TILE_COLUMNS, K // UNIT_ROWS, 32 * NW), "int32"),
        scales: T.Buffer((G, N), "float16"),
        zeros: T.Buffer((G, N), "uint8"),
        y: T.Buffer((M, N), dtype),
    ):
        gemm(x, qweight, scales, zeros, y, None)

    return uniform_gemm_cuda_mma_f16
