"""The llama.cpp peer of the kernel benchmark (tools/harness/llama_cpp.py): ggml really built,
its ``mul_mat`` really run, checked against the float64 product of its own dequantized weight.

The build (the llama-cpp-python sdist, ~75 MB, then ggml: ~3.5 min on 2 cores, once per
machine) does not fit CI's 25 minutes, so the tests that need it run only when ggml is built
already in the cache the harness uses ($QCOMPILE_LLAMA_CPP_DIR, else
``~/.cache/qcompile/llama.cpp/<version>``) or when ``QCOMPILE_LLAMA_CPP=1`` asks for the build;
CI's clean clone has neither, and skips them. Once they run, a build that cannot happen (no
network, no compiler) fails them, unless ``QCOMPILE_LLAMA_CPP_OPTIONAL=1`` turns that into a
skip with the reason. The shape rules need no build and always run.

tools/ is not a package the tests import, except here: this is the test of a tool.
"""

import importlib
import os
import sys
from pathlib import Path

import numpy as np
import pytest

import targets

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
llama_cpp = importlib.import_module("tools.harness.llama_cpp")
peers = importlib.import_module("tools.harness.peers")
reference = importlib.import_module("tools.harness.reference")

#: The build cache as the user has it, read before conftest points XDG_CACHE_HOME at tmp_path:
#: the build is a machine's, not a test's.
CACHE = llama_cpp.cache_dir()
K, N = 256, 64


@pytest.fixture(scope="module")
def built():
    """Where the build is: reused when cached, made when QCOMPILE_LLAMA_CPP=1, else a skip."""
    before = os.environ.get("QCOMPILE_LLAMA_CPP_DIR")
    os.environ["QCOMPILE_LLAMA_CPP_DIR"] = str(CACHE)
    try:
        if not llama_cpp.is_cached() and os.environ.get("QCOMPILE_LLAMA_CPP") != "1":
            pytest.skip(f"ggml is not built in {CACHE}; QCOMPILE_LLAMA_CPP=1 builds it "
                        "(minutes, once)")
        try:
            yield llama_cpp.build()
        except llama_cpp.BuildError as why:
            if os.environ.get("QCOMPILE_LLAMA_CPP_OPTIONAL") == "1":
                pytest.skip(str(why))
            raise
    finally:
        if before is None:
            del os.environ["QCOMPILE_LLAMA_CPP_DIR"]
        else:
            os.environ["QCOMPILE_LLAMA_CPP_DIR"] = before


def _repacked_here() -> bool:
    """ggml repacks q4_0 and q4_K where the CPU has AVX2 (x86)."""
    return targets.get("avx2").host_support()[0]


@pytest.mark.parametrize("m", [1, 4])
@pytest.mark.parametrize("ggml_type", ["q4_0", "q4_K"])
def test_product_matches_float64_of_its_dequantized_weight(built, ggml_type, m):
    rng = np.random.default_rng(7)
    weight = (rng.standard_normal((N, K)) * 0.02).astype(np.float32)
    x = rng.standard_normal((m, K)).astype(np.float32)
    product = llama_cpp.MulMat(weight, m, ggml_type, threads=2)
    product.set_x(x)
    product.compute()
    y = product.output()
    dequantized = product.dequantized()
    assert y.shape == (m, N) and y.dtype == np.float32
    assert dequantized.shape == (N, K)
    assert 0 < np.abs(dequantized - weight).max() < 0.2 * np.abs(weight).max()  # quantized
    error = reference.rel_error(y, x.astype(np.float64) @ dequantized.astype(np.float64).T)
    assert error <= reference.TOLERANCE["int8_x"], error
    # 18 bytes per 32 weights (q4_0), 144 per 256 (q4_K): 4.5 bits a weight either way
    assert product.nbytes == N * K * 9 // 16
    if _repacked_here():
        assert product.buffer == "CPU_REPACK"
        plain = llama_cpp.MulMat(weight, m, ggml_type, threads=1, buffer="")
        plain.set_x(x)
        plain.compute()
        assert plain.buffer == "CPU"
        np.testing.assert_allclose(y, plain.output(), rtol=1e-4, atol=1e-5 * np.abs(y).max())


def test_peer_is_checked_and_threaded(built):
    import torch

    rng = np.random.default_rng(8)
    weight = torch.from_numpy(rng.standard_normal((K, N)).astype(np.float32))
    x = torch.from_numpy(rng.standard_normal((4, K)).astype(np.float32))
    made, unavailable = peers.make(["llama.cpp"], "cpu", weight, x, llama_types=["q4_0", "q4_K"])
    assert not unavailable
    assert [p.name for p in made] == ["llama.cpp q4_0", "llama.cpp q4_K"]
    for peer in made:
        peer.set_threads(1)
        assert reference.check(peer.name, peer.output(), peer.expected, peer.precision) > 0
        assert peer.bytes_read == N * K * 9 // 16 + x.numpy().nbytes


@pytest.mark.parametrize("ggml_type, k, message", [
    ("q4_K", 100, "K=100 must be a multiple of 256 for q4_K"),
    ("q3_K", 4000, "K=4000 must be a multiple of 256 for q3_K"),
    ("q4_0", 48, "K=48 must be a multiple of 32 for q4_0"),
    ("q5_1", 256, "ggml type 'q5_1' is not one of q4_0, q4_K, q3_K, q2_K, q8_0"),
])
def test_shape_rules_say_the_numbers(ggml_type, k, message):
    import torch

    with pytest.raises(ValueError) as raised:
        llama_cpp.check_shape(ggml_type, k, 64, 1)
    assert str(raised.value) == message
    made, unavailable = peers.make(["llama.cpp"], "cpu", torch.zeros(k, 64), torch.zeros(1, k),
                                   llama_types=[ggml_type])
    assert not made and unavailable == {f"llama.cpp {ggml_type}": message}


def test_default_types_follow_the_bits():
    assert llama_cpp.default_types([4]) == ["q4_0", "q4_K"]
    assert llama_cpp.default_types([2, 3, 4]) == ["q2_K", "q3_K", "q4_0", "q4_K"]
    assert llama_cpp.default_types([8, 4, 4]) == ["q8_0", "q4_0", "q4_K"]
    assert llama_cpp.default_types([5]) == []
