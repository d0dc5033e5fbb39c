"""The kernels we compare with, at the same K x N and M, checked like ours before timing.

CPU: ``fp32`` (torch's fp32 GEMV/GEMM on the dequantized weight: ``torch.mv`` at M = 1, else
``F.linear``), ``torch_int4`` (``torch.ops.aten._weight_int4pack_mm_for_cpu``: 4-bit g128,
bfloat16 activations) and ``llama.cpp`` (ggml's CPU ``mul_mat`` as llama.cpp runs a linear layer,
one peer per ggml type: ``llama.cpp q4_0``, ``llama.cpp q4_K``, ...; ggml is built on demand
from the llama-cpp-python sdist into a cache, :mod:`tools.harness.llama_cpp`). GPU:
``fp16_linear`` (``torch.nn.functional.linear``), ``torch_int4`` (``torch._weight_int4pack_mm``,
bfloat16 activations) and ``humming`` (vLLM's humming-kernels, GPTQ 4-bit g128, fp16;
tools/README.md says how to bring its wheels to the GPU machine).

Each peer is a function ``(weight, x, rng) -> Peer`` of the dense fp32 weight [K, N] (the family's
own weight, dequantized: torch tensor on the device) and x [M, K]. The int4 peers quantize that
weight to 4-bit g128 (round to nearest, the uniform family's quantizer), llama.cpp quantizes it
with ggml's quantizer to its type; each is checked against the float64 product of *its own*
dequantized weight (llama.cpp's against the float x, since it rounds x to int8 inside: the
``int8_x`` tolerance). A peer that cannot run here raises :class:`Unavailable` with the reason,
which the result records. A peer whose thread count is its own (llama.cpp) has ``set_threads``,
which the benchmark calls with each thread count it times our kernels with.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable

import numpy as np

INT4_GROUP = 128
CPU_PEERS = ("fp32", "torch_int4", "llama.cpp")
CUDA_PEERS = ("fp16_linear", "torch_int4", "humming")


class Unavailable(Exception):
    """This peer cannot run here (missing package, unsupported shape): the message says why."""


@dataclasses.dataclass
class Peer:
    name: str
    call: Callable[[], object]          # one call, output written or returned
    output: Callable[[], object]       # a call that returns the output [M, N] for the check
    expected: np.ndarray               # float64 [M, N] of this peer's operands
    precision: str                     # reference.TOLERANCE key
    bytes_read: int
    #: operands to rotate past the L2 (GPU): a list of zero-argument calls, one per copy
    rotating_calls: list | None = None
    #: sets the peer's own thread count (CPU peers not run by torch's threads), else None
    set_threads: Callable[[int], None] | None = None
    #: how the peer ran (build, buffer type), for the result
    detail: str = ""


def _int4_layer(weight_kn: np.ndarray, rng) -> tuple[dict, np.ndarray]:
    """(GPTQ tensors of ``weight_kn`` quantized to 4-bit g128, their dequantized weight)."""
    from qcompile.kernels import UniformSpec, get_family

    k, n = weight_kn.shape
    if k % INT4_GROUP:
        raise Unavailable(f"K={k} is not a multiple of the int4 group {INT4_GROUP}")
    spec = UniformSpec(k=k, n=n, bits=4, group_size=INT4_GROUP)
    family = get_family("uniform")
    tensors = family.example_tensors(spec, rng)
    return tensors, family.reference_weight(spec, **tensors).astype(np.float64)


def _int4_operands(tensors: dict, k: int, n: int):
    """(codes [N, K] uint8, scales [G, N] float32, zero offsets [G, N] float32): torch
    dequantizes ``(q - 8) * scale + zero``; GPTQ's ``(q - z) * s`` is that with
    ``zero = (8 - z) * s``."""
    from tools.harness.product import gptq_codes, gptq_zeros

    codes = gptq_codes(tensors["qweight"], 4, k).T.astype(np.uint8)
    zeros = gptq_zeros(tensors["qzeros"], 4, n)
    scales = tensors["scales"].astype(np.float32)
    return np.ascontiguousarray(codes), scales, (8 - zeros).astype(np.float32) * scales


# ---------------------------------------------------------------------------------------- CPU

def cpu_fp32(weight, x, rng) -> Peer:
    import torch

    w_nk = weight.T.contiguous()
    expected = x.double().numpy() @ weight.double().numpy()
    if x.shape[0] == 1:
        v = x[0].contiguous()
        return Peer("fp32", lambda: torch.mv(w_nk, v), lambda: torch.mv(w_nk, v)[None],
                    expected, "float32", w_nk.nbytes + v.nbytes)
    return Peer("fp32", lambda: torch.nn.functional.linear(x, w_nk),
                lambda: torch.nn.functional.linear(x, w_nk), expected, "float32",
                w_nk.nbytes + x.nbytes)


def cpu_torch_int4(weight, x, rng) -> Peer:
    import torch

    k, n = weight.shape
    tensors, w4 = _int4_layer(weight.numpy(), rng)
    codes, scales, zeros = _int4_operands(tensors, k, n)
    try:
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(
            torch.from_numpy(codes.astype(np.int32)), 1)
    except (RuntimeError, AttributeError) as error:
        raise Unavailable(f"torch int4 CPU kernel: {str(error).splitlines()[0][:160]}") from None
    pairs = torch.stack([torch.from_numpy(scales), torch.from_numpy(zeros)], dim=2).to(
        torch.bfloat16).contiguous()
    xb = x.to(torch.bfloat16)

    def call():
        return torch.ops.aten._weight_int4pack_mm_for_cpu(xb, packed, INT4_GROUP, pairs)

    return Peer("torch_int4", call, call, xb.double().numpy() @ w4, "bfloat16",
                packed.nbytes + pairs.nbytes + xb.nbytes)


def cpu_llama_cpp(weight, x, rng, ggml_type: str = "q4_K") -> Peer:
    """llama.cpp's ``ggml_mul_mat`` of ``weight`` quantized to ``ggml_type`` by ggml.

    Parameters
    ----------
    weight : torch.Tensor
        float32 [K, N] on the CPU (the family's dequantized weight); ggml takes its transpose,
        [N rows of K], and quantizes it (K must be a multiple of 32 for q4_0 and q8_0, of 256
        for the K-quants).
    x : torch.Tensor
        float32 [M, K] on the CPU, row-major.
    rng : numpy.random.Generator
        Unused (the weight is quantized as given).
    ggml_type : str
        q4_0, q4_K, q3_K, q2_K or q8_0 (``tools.harness.llama_cpp.GGML_TYPES``).

    Returns
    -------
    Peer
        ``llama.cpp <type>``: expected is x (float64) @ ggml's own dequantized weight, checked
        at the ``int8_x`` tolerance (ggml rounds x to q8_0 or q8_K inside); bytes_read is the
        quantized weight and x; ``set_threads`` sets ggml's thread count.

    Raises
    ------
    Unavailable
        The shape does not suit the type, or ggml cannot be built here (one line, with the fix).
    """
    import torch

    from tools.harness import llama_cpp

    k, n = weight.shape
    m = x.shape[0]
    x_np = np.ascontiguousarray(x.numpy(), dtype=np.float32)
    try:
        llama_cpp.check_shape(ggml_type, k, n, m)
        product = llama_cpp.MulMat(weight.numpy().T, m, ggml_type, torch.get_num_threads())
    except (ValueError, llama_cpp.BuildError) as why:
        raise Unavailable(str(why)) from None
    product.set_x(x_np)
    expected = x_np.astype(np.float64) @ product.dequantized().astype(np.float64).T

    def output():
        product.compute()
        return product.output()

    built = llama_cpp.manifest()
    wait = os.environ.get("OMP_WAIT_POLICY")
    detail = (f"ggml {built.get('ggml_version')} of llama-cpp-python "
              f"{built.get('llama_cpp_python')}, weight in {product.buffer}, x rounded to "
              f"{llama_cpp.ACTIVATION_TYPE[ggml_type]} by ggml, OpenMP threads"
              + (f" (OMP_WAIT_POLICY={wait})" if wait else ""))
    return Peer(f"llama.cpp {ggml_type}", product.compute, output, expected, "int8_x",
                product.nbytes + x_np.nbytes, set_threads=product.set_threads, detail=detail)


# ---------------------------------------------------------------------------------------- GPU

#: The GPU int4 peers' weights of the shape being benchmarked, by peer: their quantized layer,
#: its packed form and its float64 weight on the GPU. Only K x N decides them (the layer is
#: random, from a fresh generator of the same seed), and making them -- a float64
#: dequantization on the CPU, humming's transform and JIT -- was most of a row's time, so every
#: M of a shape reuses them.
_SHAPE_STATE: dict[str, tuple] = {}


def _per_shape(peer: str, k: int, n: int, make: Callable[[], object]):
    """``make()`` for ``peer`` at K x N, kept until the peer meets another shape."""
    held = _SHAPE_STATE.get(peer)
    if held is None or held[0] != (k, n):
        _SHAPE_STATE.pop(peer, None)  # free the last shape's tensors first
        _SHAPE_STATE[peer] = ((k, n), make())
    return _SHAPE_STATE[peer][1]


def _gpu_float64(x, w64) -> np.ndarray:
    """float64 numpy of ``x`` [M, K] (a torch tensor, any float dtype) times the float64 CUDA
    tensor ``w64`` [K, N], multiplied on the GPU."""
    return (x.double() @ w64).cpu().numpy()


def cuda_fp16_linear(weight, x, rng) -> Peer:
    import torch

    from tools.harness.cuda_timing import rotating

    w16 = weight.T.contiguous().half()
    x16 = x.half()
    copies = rotating((w16,), w16.nbytes)
    return Peer("fp16_linear", lambda: torch.nn.functional.linear(x16, w16),
                lambda: torch.nn.functional.linear(x16, w16),
                _gpu_float64(x16, w16.double().T), "float16", w16.nbytes + x16.nbytes,
                [lambda w=w[0]: torch.nn.functional.linear(x16, w) for w in copies])


def cuda_torch_int4(weight, x, rng, inner_k_tiles: int = 8) -> Peer:
    import torch

    from tools.harness.cuda_timing import rotating

    k, n = weight.shape
    if k % (16 * inner_k_tiles):
        raise Unavailable(f"K={k} is not a multiple of {16 * inner_k_tiles} (torch int4 layout)")

    def make():
        tensors, w4 = _int4_layer(weight.cpu().numpy(), rng)
        codes, scales, zeros = _int4_operands(tensors, k, n)
        codes = torch.from_numpy(codes).cuda()
        try:
            w = torch._convert_weight_to_int4pack(
                (codes[:, ::2] << 4 | codes[:, 1::2]).contiguous(), inner_k_tiles)
        except (RuntimeError, AttributeError) as error:
            raise Unavailable(f"torch int4 GPU kernel: {str(error).splitlines()[0][:160]}"
                              ) from None
        pairs = torch.stack([torch.from_numpy(scales), torch.from_numpy(zeros)], dim=2).to(
            torch.bfloat16).contiguous().cuda()
        return w, pairs, torch.from_numpy(w4).cuda()

    w, pairs, w64 = _per_shape("torch_int4", k, n, make)
    xb = x.bfloat16()
    copies = rotating((w,), w.nbytes + pairs.nbytes)

    def call(w=w):
        return torch._weight_int4pack_mm(xb, w, INT4_GROUP, pairs)

    return Peer("torch_int4", call, call, _gpu_float64(xb, w64), "bfloat16",
                w.nbytes + pairs.nbytes + xb.nbytes,
                [lambda w=c[0]: call(w) for c in copies])


def cuda_humming(weight, x, rng) -> Peer:
    """humming-kernels' GPTQ 4-bit g128 layer in fp16. Which zero-point convention it reads
    (GPTQ v1 stores z - 1) is settled by the float64 check: v1 as stored first, else v2."""
    import torch

    from tools.harness.product import gptq_zeros, pack_gptq_zeros
    from tools.harness.reference import rel_error

    try:
        from humming.layer import HummingLayer
    except ImportError:
        raise Unavailable("humming-kernels is not installed (tools/README.md: peers)") from None
    k, n = weight.shape
    x16 = x.half()

    def make():
        tensors, w4 = _int4_layer(weight.cpu().numpy(), rng)
        w64 = torch.from_numpy(w4).cuda()
        for convention in ("v1", "v2"):
            qzeros = tensors["qzeros"]
            if convention == "v2":  # the zero-points themselves, not z - 1
                qzeros = pack_gptq_zeros(gptq_zeros(qzeros, 4, n, "v1"), 4, "v2")
            layer = HummingLayer(shape_n=n, shape_k=k, torch_dtype=torch.float16,
                                 weight_config={"quant_method": "gptq", "bits": 4,
                                                "group_size": INT4_GROUP, "sym": False}).cuda()
            layer.load_from_tensors({
                "qweight": torch.from_numpy(tensors["qweight"]).cuda(),
                "qzeros": torch.from_numpy(np.ascontiguousarray(qzeros)).cuda(),
                "scales": torch.from_numpy(tensors["scales"]).cuda(),
                "g_idx": torch.from_numpy(tensors["g_idx"].astype(np.int32)).cuda()})
            layer.transform()
            if rel_error(layer(x16), _gpu_float64(x16, w64)) < 5e-3:
                break
        return layer, convention, w64

    layer, convention, w64 = _per_shape("humming", k, n, make)
    nbytes = sum(t.nbytes for t in layer.state_dict().values()) + x16.nbytes
    return Peer(f"humming ({convention} zeros)", lambda: layer(x16), lambda: layer(x16),
                _gpu_float64(x16, w64), "float16", nbytes)


CPU = {"fp32": cpu_fp32, "torch_int4": cpu_torch_int4, "llama.cpp": cpu_llama_cpp}
CUDA = {"fp16_linear": cuda_fp16_linear, "torch_int4": cuda_torch_int4, "humming": cuda_humming}


def make(names: list[str], device: str, weight, x, seed: int = 0,
         llama_types=("q4_0", "q4_K")) -> tuple[list[Peer], dict]:
    """The peers ``names`` that can run here, and {name: reason} for those that cannot.

    ``llama.cpp`` (CPU) stands for one peer per ggml type of ``llama_types``."""
    table = CUDA if device == "cuda" else CPU
    made, unavailable = [], {}
    for name in names:
        if name not in table:
            unavailable[name] = f"no such {device} peer (known: {', '.join(table)})"
            continue
        factories = {name: table[name]}
        if name == "llama.cpp" and device != "cuda":
            factories = {f"llama.cpp {t}": functools.partial(cpu_llama_cpp, ggml_type=t)
                         for t in llama_types}
            if not factories:
                unavailable[name] = "no ggml type chosen (--llama-types)"
        for label, factory in factories.items():
            try:
                made.append(factory(weight, x, np.random.default_rng(seed)))
            except Unavailable as why:
                unavailable[label] = str(why)
    return made, unavailable
