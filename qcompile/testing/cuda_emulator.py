"""Run TVM-generated CUDA C on the CPU, to check a GPU schedule's numbers without a GPU.

The kernel source TVM generates (``lib.mod.imports[0].inspect_source()``) is compiled with the
host C++ compiler against a small prelude that implements what such kernels use: the vector
and 16-bit float types, ``threadIdx``/``blockIdx``, ``__syncthreads`` (a barrier per block) and
the warp shuffles (a barrier per warp of 32 threads, or of the threads their mask names, as on
the GPU). Every CUDA thread of a block is an OS thread, so barriers, shared memory and shuffles
behave as they do on a GPU;
blocks run one after another (shared memory is one static array per kernel).

What it checks: the generated index arithmetic, vector loads, shared-memory staging and its
barriers, the cross-thread reduction TVM lowers to shuffles, the decode arithmetic, in float32
as the GPU computes it (x86 SSE float32 with FMA contraction off differs from the GPU's fused
multiply-adds only in rounding). What it cannot: speed, memory coalescing, register pressure
(ptxas reports those: see :func:`ptxas_report`), and GPU-only intrinsics beyond the ones the
prelude provides (an unknown one is a compile error here, not a silent difference). Of the
tensor-core instructions it runs ``mma.sync`` m16n8k16 with fp16/bf16 operands and float32
sums (:func:`emulate_mma`), the warp's lanes exchanging their fragments as the hardware does,
and of the bit operations ``lop3.b32`` (:func:`emulate_lop3`), and ``fma.rn`` on pairs of
fp16/bf16 halves (:func:`emulate_half_fma`); ``cp.async`` copies happen at once
(:func:`emulate_cp_async`), and dynamic shared memory is a static array of the most a block may
take.

Only small launches are practical (each block starts its threads): tests use shapes of a few
hundred rows and columns.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

_PRELUDE = r"""
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>
#include <algorithm>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) alignas(n)
using std::max;
using std::min;

struct dim3 { unsigned x, y, z; };
thread_local dim3 threadIdx;
thread_local dim3 blockIdx;

struct half {
  _Float16 v;
  half() = default;
  half(float f) : v((_Float16)f) {}
  operator float() const { return (float)v; }
};
struct nv_bfloat16 {
  uint16_t bits;
  nv_bfloat16() = default;
  nv_bfloat16(float f) {
    uint32_t u; std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) { bits = 0x7fc0; return; }
    u += 0x7fffu + ((u >> 16) & 1u);
    bits = (uint16_t)(u >> 16);
  }
  operator float() const {
    uint32_t u = (uint32_t)bits << 16; float f; std::memcpy(&f, &u, 4); return f;
  }
};
inline int __dp4a(int a, int b, int c) {  // sum of the signed byte products, plus c
  for (int j = 0; j < 4; ++j)
    c += (int)(signed char)(a >> (8 * j)) * (int)(signed char)(b >> (8 * j));
  return c;
}
inline float __fdiv_rn(float a, float b) { return a / b; }  // IEEE division, as on the GPU
inline float __half2float(half h) { return (float)h; }
inline half __float2half(float f) { return half(f); }
inline half __float2half_rn(float f) { return half(f); }
inline float __bfloat162float(nv_bfloat16 h) { return (float)h; }
inline nv_bfloat16 __float2bfloat16(float f) { return nv_bfloat16(f); }
inline nv_bfloat16 __float2bfloat16_rn(float f) { return nv_bfloat16(f); }
inline unsigned __pack_half2(half x, half y) {  // TVM's CUDA prelude: two halves in one word
  uint16_t lo, hi; std::memcpy(&lo, &x, 2); std::memcpy(&hi, &y, 2);
  return ((unsigned)hi << 16) | lo;
}
inline unsigned __pack_nv_bfloat162(nv_bfloat16 x, nv_bfloat16 y) {
  return ((unsigned)y.bits << 16) | x.bits;
}

#define QC_VEC2(T, N) struct alignas(sizeof(T) * 2) N##2 { T x, y; }; \
  inline N##2 make_##N##2(T x, T y) { return N##2{x, y}; }
#define QC_VEC4(T, N) struct alignas(sizeof(T) * 4) N##4 { T x, y, z, w; }; \
  inline N##4 make_##N##4(T x, T y, T z, T w) { return N##4{x, y, z, w}; }
#define QC_VEC(T, N) QC_VEC2(T, N) QC_VEC4(T, N)
QC_VEC(float, float) QC_VEC(int, int) QC_VEC(unsigned int, uint) QC_VEC(signed char, char)
QC_VEC(unsigned char, uchar) QC_VEC(short, short) QC_VEC(unsigned short, ushort)
QC_VEC(half, half) QC_VEC(nv_bfloat16, nv_bfloat16)
using bfloat164 = nv_bfloat164;
#define uint unsigned int
#define uchar unsigned char
#define ushort unsigned short

namespace qc_emu {
struct Fragments {  // one warp's mma operands, each lane's registers (see mma_m16n8k16)
  uint32_t a[32][4], b[32][2];
};
struct Warp {
  std::unique_ptr<std::barrier<>> bar;
  // shuffles whose mask names part of the warp meet at a barrier of that part only (the other
  // threads may be elsewhere, as on the GPU): one per mask, made on first use
  std::map<unsigned, std::unique_ptr<std::barrier<>>> part_bars;
  std::unique_ptr<std::mutex> part_lock = std::make_unique<std::mutex>();
  uint64_t slots[32];
  Fragments fragments;
  int size = 0;
};
struct Block {
  std::unique_ptr<std::barrier<>> bar;
  std::vector<Warp> warps;
};
thread_local Block* block = nullptr;
thread_local Warp* warp = nullptr;
thread_local int lane = 0;

inline std::barrier<>* barrier_of(unsigned mask) {
  const unsigned whole = warp->size == 32 ? 0xffffffffu : ((1u << warp->size) - 1u);
  mask &= whole;
  if (mask == whole) return warp->bar.get();
  std::lock_guard<std::mutex> hold(*warp->part_lock);
  auto& bar = warp->part_bars[mask];
  if (!bar) bar = std::make_unique<std::barrier<>>(__builtin_popcount(mask));
  return bar.get();
}

template <class T> T exchange(T var, int src, unsigned mask) {
  static_assert(sizeof(T) <= 8, "shuffle of a type wider than 8 bytes");
  std::barrier<>* bar = barrier_of(mask);
  uint64_t mine = 0;
  std::memcpy(&mine, &var, sizeof(T));
  warp->slots[lane] = mine;
  bar->arrive_and_wait();
  T out = var;
  if (src >= 0 && src < warp->size) std::memcpy(&out, &warp->slots[src], sizeof(T));
  bar->arrive_and_wait();
  return out;
}

inline float half_bits(uint32_t bits, bool bf16) {
  if (bf16) { uint32_t u = bits << 16; float f; std::memcpy(&f, &u, 4); return f; }
  uint16_t h = (uint16_t)bits; _Float16 v; std::memcpy(&v, &h, 2); return (float)v;
}

// mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}: D = A (16 x 16) B (16 x 8) + C, each
// lane holding its registers of the PTX fragment layouts (lane l: g = l / 4, t = l % 4; A
// registers (row g, cols 2t, 2t+1), (g+8, same), (g, 2t+8, 2t+9), (g+8, same); B registers
// (rows 2t, 2t+1 of col g), (rows 2t+8, 2t+9); C and D (g, 2t), (g, 2t+1), (g+8, 2t),
// (g+8, 2t+1)). The lanes meet to exchange A and B; products are exact in float, summed in
// double and rounded once.
inline void mma_m16n8k16(bool bf16, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                         uint32_t b0, uint32_t b1, float c0, float c1, float c2, float c3,
                         float* d0, float* d1, float* d2, float* d3) {
  Fragments& f = warp->fragments;
  f.a[lane][0] = a0; f.a[lane][1] = a1; f.a[lane][2] = a2; f.a[lane][3] = a3;
  f.b[lane][0] = b0; f.b[lane][1] = b1;
  warp->bar->arrive_and_wait();
  auto a_at = [&](int r, int k) {
    uint32_t reg = f.a[4 * (r % 8) + (k % 8) / 2][(r >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0)];
    return half_bits(k % 2 ? reg >> 16 : reg & 0xffffu, bf16);
  };
  auto b_at = [&](int k, int c) {
    uint32_t reg = f.b[4 * c + (k % 8) / 2][k >= 8 ? 1 : 0];
    return half_bits(k % 2 ? reg >> 16 : reg & 0xffffu, bf16);
  };
  const int g = lane / 4, t = lane % 4;
  const float c[4] = {c0, c1, c2, c3};
  float out[4];
  for (int i = 0; i < 4; ++i) {
    const int row = g + 8 * (i / 2), col = 2 * t + i % 2;
    double sum = c[i];
    for (int k = 0; k < 16; ++k) sum += (double)a_at(row, k) * (double)b_at(k, col);
    out[i] = (float)sum;
  }
  warp->bar->arrive_and_wait();
  *d0 = out[0]; *d1 = out[1]; *d2 = out[2]; *d3 = out[3];
}

template <class F> void run_grid(int gx, int gy, int gz, int bx, int by, int bz, F kernel) {
  const int threads = bx * by * bz;
  for (int z = 0; z < gz; ++z)
    for (int y = 0; y < gy; ++y)
      for (int x = 0; x < gx; ++x) {
        Block blk;
        blk.bar = std::make_unique<std::barrier<>>(threads);
        blk.warps.resize((threads + 31) / 32);
        for (size_t w = 0; w < blk.warps.size(); ++w) {
          blk.warps[w].size = std::min(32, threads - (int)w * 32);
          blk.warps[w].bar = std::make_unique<std::barrier<>>(blk.warps[w].size);
        }
        std::vector<std::thread> pool;
        pool.reserve(threads);
        for (int t = 0; t < threads; ++t) {
          pool.emplace_back([&, t] {
            threadIdx = dim3{(unsigned)(t % bx), (unsigned)((t / bx) % by),
                             (unsigned)(t / (bx * by))};
            blockIdx = dim3{(unsigned)x, (unsigned)y, (unsigned)z};
            block = &blk;
            warp = &blk.warps[t / 32];
            lane = t % 32;
            kernel();
          });
        }
        for (auto& th : pool) th.join();
      }
}
}  // namespace qc_emu

inline void __syncthreads() { qc_emu::block->bar->arrive_and_wait(); }
inline unsigned __activemask() {
  return qc_emu::warp->size == 32 ? 0xffffffffu : ((1u << qc_emu::warp->size) - 1u);
}
template <class T> T __shfl_sync(unsigned mask, T var, int src, int width = 32) {
  return qc_emu::exchange(var, (qc_emu::lane & ~(width - 1)) + (src % width), mask);
}
template <class T> T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = 32) {
  int base = qc_emu::lane & ~(width - 1), src = qc_emu::lane + (int)delta;
  return qc_emu::exchange(var, src < base + width ? src : -1, mask);
}
template <class T> T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = 32) {
  int base = qc_emu::lane & ~(width - 1), src = qc_emu::lane - (int)delta;
  return qc_emu::exchange(var, src >= base ? src : -1, mask);
}
template <class T> T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = 32) {
  int base = qc_emu::lane & ~(width - 1), src = qc_emu::lane ^ lane_mask;
  return qc_emu::exchange(var, src >= base && src < base + width ? src : -1, mask);
}
"""

_KERNEL = re.compile(
    r'extern "C" __global__ void (?:__launch_bounds__\(\d+(?:,\s*\d+)?\) )?(\w+)\(([^)]*)\)\s*\{')

_BINDING = re.compile(r'T\.thread_binding\((\d+), thread="([\w.]+)"\)')
_INDENTED_BINDING = re.compile(
    r'^( *)for \w+ in T\.thread_binding\((\d+), thread="([\w.]+)"\)', re.M)

_CTYPES = {"float": np.float32, "half": np.float16, "int": np.int32, "uint": np.uint32,
           "uchar": np.uint8, "char": np.int8, "signed char": np.int8, "short": np.int16,
           "ushort": np.uint16, "nv_bfloat16": np.uint16}


@dataclass(frozen=True)
class Param:
    ctype: str
    name: str

    @property
    def buffer(self) -> str:
        """The TIR buffer name (TVM names kernel pointers ``<buffer>_ptr``)."""
        return self.name.removesuffix("_ptr")


class EmulatedKernel:
    """A CUDA kernel compiled for the CPU; call it with numpy arrays by buffer name."""

    def __init__(self, lib_path: Path, name: str, params: list[Param], grid: tuple[int, int, int],
                 block: tuple[int, int, int]) -> None:
        self.name = name
        self.params = params
        self.grid = grid
        self.block = block
        self._lib = ctypes.CDLL(str(lib_path))
        self._launch = self._lib.qc_launch
        self._launch.restype = None
        self._launch.argtypes = [ctypes.c_int] * 6 + [ctypes.POINTER(ctypes.c_void_p)]

    def __call__(self, **arrays: np.ndarray) -> None:
        """Launch once; ``arrays`` maps each buffer name to a C-contiguous array (written in
        place for outputs). bfloat16 buffers are passed as uint16 bit patterns."""
        missing = [p.buffer for p in self.params if p.buffer not in arrays]
        if missing:
            raise ValueError(f"kernel {self.name} needs buffers {missing}")
        pointers = (ctypes.c_void_p * len(self.params))()
        for i, param in enumerate(self.params):
            array = arrays[param.buffer]
            want = _CTYPES.get(param.ctype)
            if want is not None and array.dtype != want:
                raise ValueError(f"buffer {param.buffer} is {param.ctype} in the kernel; "
                                 f"got a numpy array of {array.dtype}")
            if not array.flags.c_contiguous or array.ctypes.data % 16:
                raise ValueError(f"buffer {param.buffer} must be C-contiguous and 16-byte aligned")
            pointers[i] = array.ctypes.data
        self._launch(*self.grid, *self.block, pointers)


def aligned(array: np.ndarray, alignment: int = 64) -> np.ndarray:
    """A C-contiguous copy of ``array`` whose data starts on an ``alignment``-byte boundary."""
    array = np.asarray(array)
    raw = np.empty(array.nbytes + alignment, dtype=np.uint8)
    offset = -raw.ctypes.data % alignment
    out = raw[offset : offset + array.nbytes].view(array.dtype).reshape(array.shape)
    out[...] = array
    return out


def launch_extents(mod) -> dict[str, int]:
    """Thread-binding extents of a scheduled module's single kernel: ``{"blockIdx.x": 448, ...}``.

    Read from the module's TVMScript (TVM 0.27 has no Python statement visitor for TIR).
    Raises ``ValueError`` if one tag is bound with two different extents (two kernels).
    """
    extents: dict[str, int] = {}
    for extent, tag in _BINDING.findall(mod.script()):
        if extents.setdefault(tag, int(extent)) != int(extent):
            raise ValueError(f"{tag} is bound with extents {extents[tag]} and {extent}: "
                             "the emulator runs one kernel")
    return extents


def kernel_source(cuda_source: str) -> tuple[str, str, list[Param]]:
    """Strip TVM's CUDA prelude; return (kernel code, kernel name, parameters)."""
    definitions = list(_KERNEL.finditer(cuda_source))
    if len(definitions) != 1:
        raise ValueError(f"expected one __global__ kernel definition; found {len(definitions)}")
    match = definitions[0]
    start = cuda_source.find('extern "C" __global__')
    params = []
    for text in match.group(2).split(","):
        words = text.replace("__restrict__", " ").replace("*", " * ").split()
        params.append(Param(ctype=" ".join(w for w in words[:-1] if w != "*"), name=words[-1]))
        if "*" not in words:
            raise ValueError(f"kernel parameter {text.strip()!r} is not a pointer")
    return cuda_source[start:], match.group(1), params


_MMA = re.compile(
    r'__asm__ __volatile__\(\s*"mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.(f16|bf16)\.\1'
    r'\.f32"\s*"[^"]*"\s*:')
_OPERAND = re.compile(r'"=?[rf]"\(')


def _balanced(text: str, start: int) -> int:
    """Index just past the parenthesis that closes the one opened before ``start``."""
    depth = 1
    for i in range(start, len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            return i + 1
    raise ValueError("unbalanced parentheses in an mma statement")


def emulate_mma(code: str) -> str:
    """Replace each ``mma.sync`` m16n8k16 (fp16/bf16 in, float32 out) inline-PTX statement
    TVM writes with a call of the prelude's warp-collective ``mma_m16n8k16``."""
    while (match := _MMA.search(code)) is not None:
        operands, position = [], match.end()
        while len(operands) < 14:
            found = _OPERAND.search(code, position)
            if found is None:
                raise ValueError("an mma statement with fewer than 14 operands")
            end = _balanced(code, found.end())
            operands.append(code[found.end():end - 1])
            position = end
        close = code.index(";", position)
        d, a, b, c = operands[:4], operands[4:8], operands[8:10], operands[10:]
        call = (f"qc_emu::mma_m16n8k16({'true' if match.group(1) == 'bf16' else 'false'}, "
                + ", ".join(a + b + c + [f"&({x})" for x in d]) + ")")
        code = code[:match.start()] + call + code[close:]
    return code


_LOP3 = re.compile(r"\btvm_builtin_ptx_lop3_b32_(\d+)\b")


def emulate_lop3(code: str) -> str:
    """Define each ``lop3.b32`` helper TVM's ``T.ptx.lop3`` calls (its PTX is inline assembly,
    left behind with TVM's prelude) as the look-up table it names: bit i of the table is the
    result for inputs (a, b, c) = bits 2, 1, 0 of i."""
    tables = sorted({int(t) for t in _LOP3.findall(code)})
    helpers = "".join(
        f"inline void tvm_builtin_ptx_lop3_b32_{t}(uint32_t& d, uint32_t a, uint32_t b, "
        f"uint32_t c) {{\n  d = 0;\n  for (int i = 0; i < 8; ++i)\n    if ({t} >> i & 1) "
        "d |= (i & 4 ? a : ~a) & (i & 2 ? b : ~b) & (i & 1 ? c : ~c);\n}\n"
        for t in tables)
    return helpers + code


_HALF_FMA = re.compile(r"\btvm_builtin_ptx_fma_half_rn_(f16x2|bf16x2)\b")


def emulate_half_fma(code: str) -> str:
    """Define the ``fma.rn.f16x2`` / ``fma.rn.bf16x2`` helpers TVM's ``T.ptx.fma`` calls: on
    each half of the words, ``a * b + c`` rounded once to the half type (in double first,
    exact for the operands the kernels give it)."""
    helpers = ""
    for kind in sorted(set(_HALF_FMA.findall(code))):
        bf16 = "true" if kind == "bf16x2" else "false"
        helpers += (
            f"inline void tvm_builtin_ptx_fma_half_rn_{kind}(uint32_t& d, uint32_t a, "
            "uint32_t b, uint32_t c) {\n  uint32_t out = 0;\n  for (int h = 0; h < 2; ++h) {\n"
            f"    double r = (double)qc_emu::half_bits(a >> (16 * h), {bf16}) * "
            f"qc_emu::half_bits(b >> (16 * h), {bf16}) + qc_emu::half_bits(c >> (16 * h), "
            f"{bf16});\n    uint16_t bits;\n"
            + ("    bits = nv_bfloat16((float)r).bits;\n" if kind == "bf16x2" else
               "    _Float16 v = (_Float16)r; std::memcpy(&bits, &v, 2);\n")
            + "    out |= (uint32_t)bits << (16 * h);\n  }\n  d = out;\n}\n")
    return helpers + code


_CP_ASYNC = re.compile(r"\btvm_builtin_ptx_cp_async_(cg|ca)_async_\1_shared_global_(\d+)\b")
_CP_ASYNC_SYNC = re.compile(
    r"\btvm_builtin_ptx_cp_async_(commit_group_async_commit_group|wait_group_async_wait_group_\d+)"
    r"\b")


def emulate_cp_async(code: str) -> str:
    """Define the ``cp.async`` helpers TVM's ``T.ptx["cp.async..."]`` calls: the copy happens at
    once (so ``commit_group`` and ``wait_group`` have nothing to do), and a shared-memory
    address is the pointer itself (``cvta`` to the shared window is the identity here). What
    the emulator cannot check: that a kernel waits for a copy before it reads the bytes."""
    helpers = ""
    if "tvm_builtin_cuda_cvta_generic_to_shared" in code:
        helpers += ("inline uintptr_t tvm_builtin_cuda_cvta_generic_to_shared(void* p) {\n"
                    "  return (uintptr_t)p;\n}\n")
    for cop, size in sorted(set(_CP_ASYNC.findall(code))):
        helpers += (f"inline void tvm_builtin_ptx_cp_async_{cop}_async_{cop}_shared_global_{size}"
                    f"(uintptr_t dst, const void* src) {{\n  std::memcpy((void*)dst, src, "
                    f"{size});\n}}\n")
    for name in sorted(set(_CP_ASYNC_SYNC.findall(code))):
        helpers += f"inline void tvm_builtin_ptx_cp_async_{name}() {{}}\n"
    return helpers + code


#: Dynamic shared memory, as the emulator declares it: the most a block may take (227 KB).
_DYNAMIC_SHARED = re.compile(r"extern __shared__ __align__\((\d+)\) (\w+) (\w+)\[\];")
_DYNAMIC_SHARED_BYTES = 227 * 1024


#: g++'s flags for an emulated kernel, and for the precompiled prelude it includes (a
#: precompiled header is used only where the flags match).
_CXXFLAGS = ("-std=c++20", "-O1", "-fPIC", "-pthread", "-fno-strict-aliasing",
             "-ffp-contract=off", "-w")


def _precompiled_prelude(compiler: str, cache: Path) -> str:
    """The text that starts a kernel's C++: an ``#include`` of the prelude as a header whose
    precompiled form (``.h.gch``) sits next to it, built once per prelude, compiler and cache
    directory; the prelude itself where g++ cannot precompile it. Parsing the prelude's standard
    headers was about a second of every kernel's compile."""
    digest = hashlib.sha256("\0".join([_PRELUDE, compiler, *_CXXFLAGS]).encode()).hexdigest()
    header = cache / f"qc_prelude-{digest[:16]}.h"
    compiled = header.with_name(header.name + ".gch")
    if not compiled.exists():
        pid = os.getpid()
        text = header.with_name(f"{header.name}.{pid}")
        text.write_text(_PRELUDE)
        text.replace(header)  # whole, even with another process at the same step
        tmp = header.with_name(f"{header.name}.{pid}.gch")
        result = subprocess.run([compiler, *_CXXFLAGS, "-x", "c++-header", "-o", str(tmp),
                                 str(header)], capture_output=True, text=True)
        if result.returncode:
            tmp.unlink(missing_ok=True)
            return _PRELUDE
        tmp.replace(compiled)
    return f'#include "{header}"\n'


def compile_emulated(cuda_source: str, extents: dict[str, int],
                     cache_dir: str | Path | None = None) -> EmulatedKernel:
    """Compile generated CUDA C into an :class:`EmulatedKernel` (cached by source hash)."""
    code, name, params = kernel_source(cuda_source)
    casts = ", ".join(f"({p.ctype}*)args[{i}]" for i, p in enumerate(params))
    wrapper = (f'\nextern "C" void qc_launch(int gx, int gy, int gz, int bx, int by, int bz, '
               f'void** args) {{\n  qc_emu::run_grid(gx, gy, gz, bx, by, bz, [args] {{ '
               f'{name}({casts}); }});\n}}\n')
    # `static alignas(n)` is how C++ spells CUDA's `__shared__ alignas(n)`.
    code = re.sub(r"__shared__\s+(alignas\(\d+\))", r"\1 static", code)
    code = _DYNAMIC_SHARED.sub(
        lambda m: f"alignas({m.group(1)}) static {m.group(2)} {m.group(3)}"
                  f"[{_DYNAMIC_SHARED_BYTES} / sizeof({m.group(2)})];", code)
    code = emulate_cp_async(emulate_half_fma(emulate_lop3(emulate_mma(code))))
    text = _PRELUDE + code + wrapper
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    cache = Path(cache_dir or Path(tempfile.gettempdir()) / f"qcompile-cuda-emu-{os.getuid()}")
    cache.mkdir(parents=True, exist_ok=True)
    lib = cache / f"{name}-{digest}.so"
    if not lib.exists():
        compiler = shutil.which("g++") or shutil.which("c++")
        if compiler is None:
            raise RuntimeError("the CUDA emulator needs a C++20 compiler (g++) on PATH")
        src = cache / f"{name}-{digest}.cpp"
        src.write_text(_precompiled_prelude(compiler, cache) + code + wrapper)
        tmp = lib.with_suffix(f".{os.getpid()}.so")
        result = subprocess.run([compiler, *_CXXFLAGS, "-shared", "-o", str(tmp), str(src)],
                                capture_output=True, text=True)
        if result.returncode:
            raise RuntimeError(f"emulator build of {name} failed:\n{result.stderr[-4000:]}")
        tmp.replace(lib)
    grid = tuple(extents.get(f"blockIdx.{a}", 1) for a in "xyz")
    block = tuple(extents.get(f"threadIdx.{a}", 1) for a in "xyz")
    return EmulatedKernel(lib, name, params, grid, block)


def emulate(scheduled_mod, target) -> EmulatedKernel:
    """Build ``scheduled_mod`` for the CUDA ``target`` with TVM and compile its kernel here."""
    from qcompile import _tvm

    lib = _tvm.tvm.compile(scheduled_mod, target=target)
    devices = [m for m in lib.mod.imports if m.kind == "cuda"]
    if not devices:
        raise ValueError("the module produced no CUDA kernel (is it scheduled and bound?)")
    return compile_emulated(devices[0].inspect_source(), launch_extents(scheduled_mod))


_DEFINITION = 'extern "C" __global__'
_DEFINITION_BODY = re.compile(r'extern "C" __global__ [^;{]*\{')


def kernel_extents(mod) -> list[dict[str, int]]:
    """Launch extents of each kernel of a scheduled module, in order: a kernel starts at a
    root-level thread binding (read from the module's TVMScript)."""
    kernels: list[dict[str, int]] = []
    root_indent = None
    for indent, extent, tag in _INDENTED_BINDING.findall(mod.script()):
        if root_indent is None or len(indent) <= root_indent:
            root_indent = len(indent)
            kernels.append({})
        kernels[-1].setdefault(tag, int(extent))
    return kernels


def emulate_all(scheduled_mod, target, buffers: dict[str, np.ndarray]) -> None:
    """Build ``scheduled_mod`` for the CUDA ``target`` and run every kernel of it in order on
    the emulator, with ``buffers`` by name (the function's parameters and the global buffers
    its kernels pass between them, such as a quantized x or partial sums)."""
    from qcompile import _tvm

    lib = _tvm.tvm.compile(scheduled_mod, target=target)
    (device,) = [m for m in lib.mod.imports if m.kind == "cuda"]
    source = device.inspect_source()
    starts = [m.start() for m in _DEFINITION_BODY.finditer(source)]  # not declarations
    header = source[:source.index(_DEFINITION)]
    bodies = [source[a + len(_DEFINITION):b] for a, b in zip(starts, starts[1:] + [None],
                                                               strict=True)]
    extents = kernel_extents(scheduled_mod)
    if len(bodies) != len(extents):
        raise ValueError(f"{len(bodies)} kernel definitions but {len(extents)} launches")
    for body, extent in zip(bodies, extents, strict=True):
        kernel = compile_emulated(header + _DEFINITION + body, extent)
        kernel(**{p.buffer: buffers[p.buffer] for p in kernel.params if p.buffer in buffers})


def _nvcc(cuda_source: str, arch: str, output: str, *extra: str) -> tuple[str, str] | None:
    """Run nvcc on the source; (what it wrote, its messages), or None without nvcc."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return None
    with tempfile.TemporaryDirectory(prefix="qcompile-nvcc-") as tmp:
        src = Path(tmp) / "kernel.cu"
        src.write_text(cuda_source)
        out = Path(tmp) / f"kernel.{output}"
        result = subprocess.run(
            [nvcc, f"-arch={arch}", f"-{output}", *extra, "-diag-suppress", "177,550",
             "-o", str(out), str(src)], capture_output=True, text=True)
        if result.returncode:
            raise RuntimeError(f"nvcc rejected the generated CUDA:\n{result.stderr[-4000:]}")
        text = out.read_text(errors="replace") if output == "ptx" else ""
    return text, result.stdout + result.stderr


def ptx(cuda_source: str, arch: str = "sm_90") -> str | None:
    """The PTX nvcc generates for the kernel, or None when no ``nvcc`` is installed."""
    result = _nvcc(cuda_source, arch, "ptx")
    return None if result is None else result[0]


def ptxas_report(cuda_source: str, arch: str = "sm_90") -> dict | None:
    """Registers, spill bytes and shared memory ptxas reports, or None when no ``nvcc`` is
    installed. Raises ``RuntimeError`` when nvcc rejects the source.

    A source may hold several kernels (the BCQ family's lookups, then its sum over K slices):
    ``kernels`` maps each entry function to its own figures, and the top-level figures are the
    largest over them (the kernel that limits occupancy), not the last one ptxas printed.
    """
    result = _nvcc(cuda_source, arch, "cubin", "-Xptxas", "-v")
    if result is None:
        return None
    report = result[1]

    def number(text: str, pattern: str) -> int:
        found = re.search(pattern, text)
        return int(found.group(1)) if found else 0

    def figures(text: str) -> dict[str, int]:
        return {
            "registers": number(text, r"Used (\d+) registers"),
            "spill_stores": number(text, r"(\d+) bytes spill stores"),
            "spill_loads": number(text, r"(\d+) bytes spill loads"),
            "stack_bytes": number(text, r"(\d+) bytes stack frame"),
            "shared_bytes": number(text, r"(\d+) bytes smem"),
        }

    parts = re.split(r"Compiling entry function '([^']+)'", report)
    kernels = {name: figures(text) for name, text in zip(parts[1::2], parts[2::2], strict=True)}
    if not kernels:
        kernels = {"": figures(report)}
    summary: dict = {key: max(k[key] for k in kernels.values())
                     for key in next(iter(kernels.values()))}
    summary["kernels"] = kernels
    return summary
