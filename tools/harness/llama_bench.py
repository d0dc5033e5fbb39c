"""llama.cpp's own model benchmark, ``llama-bench``, on a GGUF of the model benchmark's model:
the CPU peer of issue 25's whole-model figures.

Built on demand from the same ``llama-cpp-python`` sdist as the GEMV peer
(:mod:`tools.harness.llama_cpp`; never committed): its vendored llama.cpp is extracted under
``<cache>/tools/src`` and configured as llama.cpp configures a Linux CPU build (Release,
``-march=native``, OpenMP, llamafile's sgemm, the repacked CPU kernels), and only
``llama-bench`` and ``llama-quantize`` are built (minutes on 2 cores, once per CPU).

The GGUF is written here from the transformers model whose weights our engine runs (the
GPTQ checkpoint dequantized to float32: the same numbers), with llama.cpp's own Python writer
(``gguf-py`` of the same source) at f16, then quantized by ``llama-quantize`` to the types
people run (Q4_K_M, Q4_0, ...). Only its speed is compared; llama.cpp re-rounds the weights to
its own blocks.

    bin_dir = build()
    write_gguf(dense_model, vocabulary_size, path / "model-f16.gguf")
    quantize(bin_dir, path / "model-f16.gguf", path / "model-q4_k_m.gguf", "Q4_K_M")
    run_bench(bin_dir, path / "model-q4_k_m.gguf", threads=2, prompt=512, tokens=64)
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

from tools.harness import llama_cpp

#: The programs this peer builds.
PROGRAMS = ("llama-bench", "llama-quantize")
#: llama.cpp's CPU build (llama_cpp.CMAKE_OPTIONS' ggml choices), static, tools only.
CMAKE_OPTIONS = (
    "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF", "-DGGML_NATIVE=ON",
    "-DGGML_CPU=ON", "-DGGML_CPU_REPACK=ON", "-DGGML_OPENMP=ON", "-DGGML_LLAMAFILE=ON",
    "-DGGML_BLAS=OFF", "-DGGML_CUDA=OFF", "-DGGML_METAL=OFF", "-DGGML_VULKAN=OFF",
    "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_BUILD_TOOLS=ON",
)
#: llama-quantize's names of the types the benchmark offers.
TYPES = ("Q4_K_M", "Q4_0", "Q3_K_M", "Q2_K", "Q8_0")
_PREFIX = f"llama_cpp_python-{llama_cpp.LLAMA_CPP_PYTHON}/vendor/llama.cpp/"


def tools_dir() -> Path:
    """Where this version's llama.cpp tools are built: ``<llama_cpp.cache_dir()>/tools``."""
    return llama_cpp.cache_dir() / "tools"


def build(log=sys.stderr) -> Path:
    """The directory holding ``llama-bench`` and ``llama-quantize``, built first when they are
    not.

    Raises
    ------
    llama_cpp.BuildError
        One line: what is missing or failed, and the fix.
    """
    directory = tools_dir()
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise llama_cpp.BuildError(f"llama.cpp tools: cannot write {directory} "
                                   f"({error.strerror}): set QCOMPILE_LLAMA_CPP_DIR to a "
                                   "writable directory") from None
    with open(directory / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        manifest = directory / "manifest.json"
        if not manifest.is_file():
            _build(directory, log)
            manifest.write_text(json.dumps({"cpu": llama_cpp.host_cpu(),
                                            "version": llama_cpp.LLAMA_CPP_PYTHON}))
        built_for = json.loads(manifest.read_text()).get("cpu")
        if built_for != llama_cpp.host_cpu():
            raise llama_cpp.BuildError(
                f"llama.cpp tools: {directory} was built with -march=native for another CPU "
                f"({built_for}; this one: {llama_cpp.host_cpu()}): rm -r {directory}")
    return directory / "build" / "bin"


def _build(directory: Path, log) -> None:
    cmake = shutil.which("cmake")
    if cmake is None or shutil.which("c++") is None:
        raise llama_cpp.BuildError("llama.cpp tools: cmake and a C++ compiler are needed: "
                                   "apt-get install cmake build-essential")
    log_path = directory / "build.log"
    log_path.write_text("")
    sdist = llama_cpp._fetch_sdist(llama_cpp.cache_dir(), log_path)
    source = directory / "src"
    shutil.rmtree(source, ignore_errors=True)
    llama_cpp.extract_tree(sdist, _PREFIX, source, "llama.cpp tools")
    print(f"building llama.cpp's {', '.join(PROGRAMS)} in {directory} (minutes, once; log: "
          f"{log_path})", file=log, flush=True)
    llama_cpp._run([cmake, "-S", str(source), "-B", str(directory / "build"), *CMAKE_OPTIONS],
                   log_path, "configuring llama.cpp")
    llama_cpp._run([cmake, "--build", str(directory / "build"), "-j",
                    str(llama_cpp.BUILD_JOBS), "--target", *PROGRAMS],
                   log_path, "building llama.cpp's tools")


def _gguf():
    """llama.cpp's ``gguf`` Python package, from the extracted source (needs numpy, pyyaml)."""
    path = str(tools_dir() / "src" / "gguf-py")
    if path not in sys.path:
        sys.path.insert(0, path)
    import gguf

    return gguf


def rotary_rows(weight: np.ndarray, heads: int) -> np.ndarray:
    """q/k projection rows [heads * head_dim, K] from transformers' rotary layout (each head's
    first half of dimensions paired with its second half) to llama.cpp's (pairs adjacent), so
    that the GGUF computes the same attention."""
    rows = weight.shape[0]
    half = rows // heads // 2
    return weight.reshape(heads, 2, half, -1).swapaxes(1, 2).reshape(rows, -1)


def write_gguf(model, path: Path) -> Path:
    """An f16 GGUF of a transformers Llama ``model`` (float weights; Llama architecture), with a
    placeholder vocabulary of the model's size (llama-bench feeds token ids, never text).

    Raises
    ------
    ValueError
        The model is not a Llama (the message names its type).
    """
    import torch

    config = model.config
    if config.model_type != "llama":
        raise ValueError(f"write_gguf takes a Llama model; got model_type={config.model_type!r}")
    gguf = _gguf()
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = config.hidden_size // heads
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(getattr(config, "rope_theta", 10000.0))
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    vocabulary = config.vocab_size
    writer.add_tokenizer_model("llama")
    writer.add_token_list([f"<t{i}>".encode() for i in range(vocabulary)])
    writer.add_token_scores([0.0] * vocabulary)
    writer.add_token_types([gguf.TokenType.NORMAL] * vocabulary)
    writer.add_bos_token_id(min(1, vocabulary - 1))
    writer.add_eos_token_id(min(2, vocabulary - 1))
    names = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
             "gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down",
             "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}
    state = {key: value.detach().to(torch.float32).cpu().numpy()
             for key, value in model.state_dict().items()}
    tensors = {"token_embd.weight": state["model.embed_tokens.weight"],
               "output_norm.weight": state["model.norm.weight"],
               "output.weight": state.get("lm_head.weight", state["model.embed_tokens.weight"])}
    for layer in range(config.num_hidden_layers):
        for key, value in state.items():
            prefix = f"model.layers.{layer}."
            if not key.startswith(prefix):
                continue
            module = key[len(prefix):].split(".")[-2]
            if module == "q_proj":
                value = rotary_rows(value, heads)
            elif module == "k_proj":
                value = rotary_rows(value, kv_heads)
            tensors[f"blk.{layer}.{names[module]}.weight"] = value
    for name, value in tensors.items():
        # norms stay float32, as llama.cpp's converter keeps one-dimensional tensors
        writer.add_tensor(name, value if value.ndim == 1 else value.astype(np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def quantize(bin_dir: Path, source: Path, target: Path, kind: str, threads: int = 2) -> Path:
    """``llama-quantize source target kind`` (kind: one of :data:`TYPES`), unless ``target``
    exists."""
    if kind not in TYPES:
        raise ValueError(f"kind must be one of {TYPES}; got {kind!r}")
    if not target.is_file():
        log_path = target.with_suffix(".log")
        log_path.write_text("")
        partial = target.with_suffix(".part")
        llama_cpp._run([str(bin_dir / "llama-quantize"), str(source), str(partial), kind,
                        str(threads)], log_path, f"llama-quantize to {kind}")
        partial.rename(target)
    return target


def run_bench(bin_dir: Path, model_path: Path, *, threads: int, prompt: int, tokens: int,
              repetitions: int = 3) -> dict:
    """llama-bench's prefill (``-p prompt``) and decode (``-n tokens``, batch 1) of one GGUF.

    Returns
    -------
    dict
        ``prefill_tokens_per_s``, ``decode_tokens_per_s`` (llama-bench's averages over
        ``repetitions``), their standard deviations, and the command.
    """
    command = [str(bin_dir / "llama-bench"), "-m", str(model_path), "-t", str(threads),
               "-p", str(prompt), "-n", str(tokens), "-r", str(repetitions), "-o", "json"]
    # llama.cpp as its users run it: OpenMP's default wait policy (our benchmark process sets
    # OMP_WAIT_POLICY=PASSIVE for torch's threads; llama.cpp's own syncs want the spinning)
    env = {key: value for key, value in os.environ.items() if key != "OMP_WAIT_POLICY"}
    done = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
    if done.returncode:
        lines = (done.stderr or done.stdout).strip().splitlines()
        raise RuntimeError(f"llama-bench failed (exit {done.returncode}): "
                           f"{lines[-1] if lines else '(no output)'}")
    out = {"command": " ".join(command)}
    for test in json.loads(done.stdout):
        phase = "prefill" if test["n_prompt"] and not test["n_gen"] else "decode"
        out[f"{phase}_tokens_per_s"] = test["avg_ts"]
        out[f"{phase}_tokens_per_s_std"] = test["stddev_ts"]
    return out
