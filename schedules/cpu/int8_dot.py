"""AVX2 integer dot-product intrinsics for ``tensorize`` (qcompile/kernels/uniform/compute_int8.py).

``DOT_U8S8_I16`` (8 columns x 4 codes into 8 x 2 int16 lanes)::

    C[i, h] += int16(A[2h]) * int16(B[i, 2h]) + int16(A[2h + 1]) * int16(B[i, 2h + 1])

is one ``vpmaddubsw`` (B: 32 uint8 codes, 8 columns of 4; A: 4 int8 activations broadcast) and
one ``vpaddw``. vpmaddubsw saturates its pair sums, so the description is exact only while no
sum leaves int16; compute_int8.chunk_rows bounds the chunk so that none can.

``WIDEN_I16_I32`` (8 x 2 int16 lanes into 8 int32)::

    C[i] += int32(D[i, 0]) + int32(D[i, 1])

is one ``vpmaddwd`` by ones and one ``vpaddd``.

Both also run on AVX-512 CPUs (AVX2 is a subset); the ``llvm`` target must enable AVX2.
"""

from __future__ import annotations

from qcompile._tvm import T, TensorIntrin

DOT_U8S8_I16 = "qcompile_avx2_dot_8x4_u8s8_i16"
WIDEN_I16_I32 = "qcompile_avx2_widen_8x2_i16_i32"


@T.prim_func(s_tir=True)
def _dot_desc(A: T.Buffer((4,), "int8", offset_factor=1),
              B: T.Buffer((8, 4), "uint8", offset_factor=1, scope="local"),
              C: T.Buffer((8, 2), "int16", offset_factor=1, scope="local")):
    with T.sblock("root"):
        T.reads(C[0:8, 0:2], A[0:4], B[0:8, 0:4])
        T.writes(C[0:8, 0:2])
        for i, h, e in T.grid(8, 2, 2):
            with T.sblock("update"):
                vi, vh, ve = T.axis.remap("SSR", [i, h, e])
                C[vi, vh] = C[vi, vh] + T.Cast("int16", A[vh * 2 + ve]) * T.Cast(
                    "int16", B[vi, vh * 2 + ve])


@T.prim_func(s_tir=True)
def _dot_impl(A: T.Buffer((4,), "int8", offset_factor=1),
              B: T.Buffer((8, 4), "uint8", offset_factor=1, scope="local"),
              C: T.Buffer((8, 2), "int16", offset_factor=1, scope="local")):
    with T.sblock("root"):
        T.reads(C[0:8, 0:2], A[0:4], B[0:8, 0:4])
        T.writes(C[0:8, 0:2])
        x4 = T.reinterpret("int32", A.vload([0], "int8x4"))
        x_broadcast = T.reinterpret("int8x32", T.broadcast(x4, 8))
        C.vstore([0, 0], C.vload([0, 0], "int16x16") + T.call_llvm_pure_intrin(
            "int16x16", "llvm.x86.avx2.pmadd.ub.sw", B.vload([0, 0], "uint8x32"), x_broadcast))


@T.prim_func(s_tir=True)
def _widen_desc(D: T.Buffer((8, 2), "int16", offset_factor=1, scope="local"),
                C: T.Buffer((8,), "int32", offset_factor=1, scope="local")):
    with T.sblock("root"):
        T.reads(C[0:8], D[0:8, 0:2])
        T.writes(C[0:8])
        for i, h in T.grid(8, 2):
            with T.sblock("update"):
                vi, vh = T.axis.remap("SR", [i, h])
                C[vi] = C[vi] + T.Cast("int32", D[vi, vh])


@T.prim_func(s_tir=True)
def _widen_impl(D: T.Buffer((8, 2), "int16", offset_factor=1, scope="local"),
                C: T.Buffer((8,), "int32", offset_factor=1, scope="local")):
    with T.sblock("root"):
        T.reads(C[0:8], D[0:8, 0:2])
        T.writes(C[0:8])
        C[T.ramp(0, 1, 8)] = C[T.ramp(0, 1, 8)] + T.call_llvm_pure_intrin(
            "int32x8", "llvm.x86.avx2.pmadd.wd", D.vload([0, 0], "int16x16"),
            T.broadcast(T.int16(1), 16))


def register() -> None:
    """Register both intrinsics with TVM (once per process)."""
    for name, desc, impl in ((DOT_U8S8_I16, _dot_desc, _dot_impl),
                             (WIDEN_I16_I32, _widen_desc, _widen_impl)):
        if TensorIntrin.get(name, allow_missing=True) is None:
            TensorIntrin.register(name, desc, impl)


register()
