"""llama.cpp's CPU matrix product (ggml), built on demand, for the kernel benchmark's peer.

No package on PyPI ships ggml's CPU kernels as a library to call one ``mul_mat`` with, so
:func:`build` makes one, once per machine: it takes the source distribution of
``llama-cpp-python`` (pinned: :data:`LLAMA_CPP_PYTHON`; it vendors llama.cpp under
``vendor/llama.cpp``), builds only ggml's CPU backend from it with CMake, as llama.cpp's own
build configures it on a Linux CPU (Release, ``-march=native``, OpenMP, llamafile's sgemm, and
the repack buffer type that lays q4_0 and q4_K out in 8x8 interleaved blocks on AVX2), and
compiles our harness ``llama_cpp.c`` against it. Everything goes under :func:`cache_dir`
(``$QCOMPILE_LLAMA_CPP_DIR``, else ``$XDG_CACHE_HOME/qcompile/llama.cpp/<version>``), never
into the repository::

    <cache>/llama_cpp_python-<version>.tar.gz   the sdist (put it here by hand to build offline)
    <cache>/ggml-src/     ggml's sources from the sdist (ggml/), and a CMakeLists.txt that
                          adds them as a subproject, as llama.cpp's does
    <cache>/build/        CMake's build tree; build.log beside it
    <cache>/ggml/         the installed ggml (include/, lib/)
    <cache>/harness-<sha>.so   our harness, keyed by its source and ggml's build
    <cache>/manifest.json      versions, CMake options, build seconds and the CPU it was
                               built for (-march=native: another CPU is refused); written last

A file lock makes concurrent first builds wait for one another. :class:`MulMat` runs one
``ggml_mul_mat`` on the CPU backend: the weight quantized by ggml's own quantizer, placed in
the ``CPU_REPACK`` buffer type when that supports the product (q4_0 and q4_K on AVX2, q2_K on
AVX-512), as llama.cpp's loader places model weights, else in a plain CPU buffer. ggml rounds x
to q8_0 (q4_0, q8_0) or q8_K (the K-quants) inside the product; the dot products are integer.
Its threads are OpenMP's (torch's libgomp, when torch is loaded first): on a machine busy with
other work, their spinning barriers can make 2 threads on 2 cores 20x slower than 1 (seen:
20 ms for a 4096x4096 GEMV); ``OMP_WAIT_POLICY=PASSIVE`` shows whether that is happening.
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import numpy as np

#: The llama-cpp-python release whose vendored llama.cpp we build (bump to move on; a new
#: version builds into a directory of its own).
LLAMA_CPP_PYTHON = "0.3.36"

#: The ggml types the peer offers, and the number of weights per block of each: K must be a
#: multiple of it.
BLOCK = {"q4_0": 32, "q4_K": 256, "q3_K": 256, "q2_K": 256, "q8_0": 32}
GGML_TYPES = tuple(BLOCK)

#: What ggml rounds x to inside the product of each type (its ``vec_dot_type``): int8 with one
#: scale per 32 (q8_0) or per 256 (q8_K) values of a row.
ACTIVATION_TYPE = {"q4_0": "q8_0", "q8_0": "q8_0", "q4_K": "q8_K", "q3_K": "q8_K", "q2_K": "q8_K"}

#: The ggml types that stand beside our kernels of each bit width, by default.
TYPES_FOR_BITS = {2: ("q2_K",), 3: ("q3_K",), 4: ("q4_0", "q4_K"), 8: ("q8_0",)}

#: CMake options: llama.cpp's own defaults for a Linux CPU build, ggml only, shared libraries.
CMAKE_OPTIONS = (
    "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=ON", "-DCMAKE_INSTALL_LIBDIR=lib",
    "-DGGML_NATIVE=ON", "-DGGML_CPU=ON", "-DGGML_CPU_REPACK=ON", "-DGGML_OPENMP=ON",
    "-DGGML_LLAMAFILE=ON", "-DGGML_BACKEND_DL=OFF", "-DGGML_BLAS=OFF", "-DGGML_CUDA=OFF",
    "-DGGML_METAL=OFF", "-DGGML_VULKAN=OFF", "-DGGML_OPENCL=OFF", "-DGGML_RPC=OFF",
    "-DGGML_BUILD_TESTS=OFF", "-DGGML_BUILD_EXAMPLES=OFF",
)
BUILD_JOBS = 2
HARNESS_SOURCE = Path(__file__).with_name("llama_cpp.c")
_SDIST = f"llama_cpp_python-{LLAMA_CPP_PYTHON}"
#: ggml built as a subproject, as llama.cpp's own CMakeLists.txt includes it (standalone, ggml
#: wants a ggml.pc.in that the sdist leaves out)
_WRAPPER = """cmake_minimum_required(VERSION 3.14)
project(qcompile_ggml C CXX)
add_subdirectory(ggml)
"""
_LIBRARIES = ("ggml", "ggml-base", "ggml-cpu")


class BuildError(RuntimeError):
    """ggml or the harness cannot be built here: the message is one line, with the fix."""


def cache_dir() -> Path:
    """Where this version's build lives: ``$QCOMPILE_LLAMA_CPP_DIR``, else
    ``$XDG_CACHE_HOME/qcompile/llama.cpp/<version>`` (``$XDG_CACHE_HOME`` defaults to
    ``~/.cache``)."""
    if os.environ.get("QCOMPILE_LLAMA_CPP_DIR"):
        return Path(os.environ["QCOMPILE_LLAMA_CPP_DIR"]).expanduser()
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return root / "qcompile" / "llama.cpp" / LLAMA_CPP_PYTHON


def default_types(bits) -> list[str]:
    """The ggml types that stand beside kernels of ``bits`` (an iterable of widths), in order,
    once each: 4 -> q4_0, q4_K; 3 -> q3_K; 2 -> q2_K; 8 -> q8_0."""
    return list(dict.fromkeys(t for b in bits for t in TYPES_FOR_BITS.get(b, ())))


def check_shape(ggml_type: str, k: int, n: int, m: int) -> None:
    """Raise ValueError, with the rule and the numbers, when ggml cannot multiply this shape."""
    if ggml_type not in BLOCK:
        raise ValueError(f"ggml type {ggml_type!r} is not one of {', '.join(GGML_TYPES)}")
    if min(k, n, m) < 1:
        raise ValueError(f"K={k}, N={n}, M={m} must all be positive")
    if k % BLOCK[ggml_type]:
        raise ValueError(f"K={k} must be a multiple of {BLOCK[ggml_type]} for {ggml_type}")


# ------------------------------------------------------------------------------------ building

def _harness_path(directory: Path) -> Path:
    manifest = (directory / "manifest.json").read_text()
    digest = hashlib.sha256(HARNESS_SOURCE.read_bytes() + manifest.encode()).hexdigest()[:12]
    return directory / f"harness-{digest}.so"


def is_cached() -> bool:
    """Whether ggml is built in :func:`cache_dir` (then :func:`build` takes a second at most:
    the harness may need compiling)."""
    return (cache_dir() / "manifest.json").is_file()


def build(log=sys.stderr) -> Path:
    """The harness library, built first when it is not (ggml takes minutes on 2 cores, once).

    Raises
    ------
    BuildError
        One line: what is missing or what failed, and the command that fixes it.
    """
    directory = cache_dir()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        return _build_locked(directory, log)
    except OSError as error:
        raise BuildError(f"llama.cpp peer: cannot write {directory} ({error.strerror}): set "
                         f"QCOMPILE_LLAMA_CPP_DIR to a writable directory") from None


def _build_locked(directory: Path, log) -> Path:
    with open(directory / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a concurrent first build finishes first
        if not (directory / "manifest.json").is_file():
            _build_ggml(directory, log)
        built_for = json.loads((directory / "manifest.json").read_text()).get("cpu")
        if built_for != host_cpu():
            raise BuildError(f"llama.cpp peer: the ggml in {directory} was built with "
                             f"-march=native for another CPU ({built_for}; this one: "
                             f"{host_cpu()}): rm -r {directory}, or set QCOMPILE_LLAMA_CPP_DIR "
                             f"to a directory of this machine's own")
        harness = _harness_path(directory)
        if not harness.is_file():
            _compile_harness(directory, harness)
    return harness


def host_cpu() -> str:
    """This CPU as a native build depends on it: its model and a digest of its feature flags."""
    model, flags = os.uname().machine, ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model == os.uname().machine:
                model = " ".join(value.split())
            elif key.strip() in ("flags", "Features") and not flags:
                flags = " ".join(sorted(value.split()))
    except OSError:
        pass
    return f"{model}, flags {hashlib.sha256(flags.encode()).hexdigest()[:12]}"


def _tool(name: str, fix: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise BuildError(f"llama.cpp peer: {name} is not installed, it builds ggml: {fix}")
    return path


def _run(command: list[str], log_path: Path, what: str) -> None:
    with open(log_path, "a") as log:
        log.write(f"\n$ {' '.join(command)}\n")
        log.flush()
        done = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, check=False)
    if done.returncode:
        lines = [line.strip() for line in log_path.read_text().splitlines() if line.strip()]
        errors = [line for line in lines if "error" in line.lower()] or lines[-1:]
        raise BuildError(f"llama.cpp peer: {what} failed (exit {done.returncode}): "
                         f"{errors[0][:200] if errors else '(no output)'}; log: {log_path}")


def _fetch_sdist(directory: Path, log_path: Path) -> Path:
    sdist = directory / f"{_SDIST}.tar.gz"
    if sdist.is_file():
        return sdist
    command = [sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
               "--dest", str(directory), f"llama-cpp-python=={LLAMA_CPP_PYTHON}"]
    try:
        _run(command, log_path, "downloading the llama-cpp-python sdist")
    except BuildError as why:
        raise BuildError(f"{why}; with no network, put the sdist there by hand: "
                         f"pip download --no-binary :all: --no-deps "
                         f"llama-cpp-python=={LLAMA_CPP_PYTHON} -d {directory}") from None
    if not sdist.is_file():
        raise BuildError(f"llama.cpp peer: pip left no {sdist.name} in {directory}; log: "
                         f"{log_path}")
    return sdist


def _extract_ggml(sdist: Path, into: Path) -> None:
    """``vendor/llama.cpp/ggml/`` of the sdist into ``into/ggml`` (nothing else of it), and
    beside it the CMakeLists.txt that adds it as a subdirectory."""
    shutil.rmtree(into, ignore_errors=True)
    extract_tree(sdist, f"{_SDIST}/vendor/llama.cpp/ggml/", into / "ggml", "llama.cpp peer")
    (into / "CMakeLists.txt").write_text(_WRAPPER)


def extract_tree(sdist: Path, prefix: str, into: Path, who: str) -> None:
    """The sdist's files and folders under ``prefix`` into ``into`` (``prefix`` dropped);
    ``who`` names the caller in the one-line BuildError of a damaged or unexpected sdist."""
    try:
        with tarfile.open(sdist) as archive:
            members = []
            for member in archive.getmembers():
                if member.name.startswith(prefix) and (member.isfile() or member.isdir()):
                    member.name = member.name[len(prefix):]
                    members.append(member)
            if not members:
                raise BuildError(f"{who}: {sdist} has no {prefix}")
            archive.extractall(into, members=members, filter="data")
    except (tarfile.TarError, EOFError) as error:
        raise BuildError(f"{who}: {sdist} is damaged ({error}): rm {sdist} and run again to "
                         f"download it anew") from None


def _build_ggml(directory: Path, log) -> None:
    cmake = _tool("cmake", "apt-get install cmake (or pip install cmake)")
    _tool("cc", "apt-get install build-essential")
    _tool("c++", "apt-get install build-essential")
    log_path = directory / "build.log"
    log_path.write_text("")
    sdist = _fetch_sdist(directory, log_path)
    print(f"llama.cpp peer: building ggml of llama-cpp-python {LLAMA_CPP_PYTHON} into "
          f"{directory} (once; minutes on 2 cores; log {log_path})", file=log, flush=True)
    started = time.monotonic()
    source, tree, prefix = directory / "ggml-src", directory / "build", directory / "ggml"
    _extract_ggml(sdist, source)
    shutil.rmtree(tree, ignore_errors=True)
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    _run([cmake, "-S", str(source), "-B", str(tree), *generator, *CMAKE_OPTIONS,
          f"-DCMAKE_INSTALL_PREFIX={prefix}"], log_path, "configuring ggml (cmake)")
    _run([cmake, "--build", str(tree), "--parallel", str(BUILD_JOBS)], log_path,
         "building ggml (cmake --build)")
    _run([cmake, "--install", str(tree)], log_path, "installing ggml (cmake --install)")
    manifest = {
        "llama_cpp_python": LLAMA_CPP_PYTHON, "ggml_version": _ggml_version(source),
        "sdist_sha256": hashlib.sha256(sdist.read_bytes()).hexdigest(),
        "cmake_options": list(CMAKE_OPTIONS), "build_seconds": round(time.monotonic() - started),
        "built": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "cpu": host_cpu(),
    }
    (directory / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    print(f"llama.cpp peer: ggml built in {manifest['build_seconds']} s", file=log, flush=True)


def _ggml_version(source: Path) -> str:
    parts = {}
    for line in (source / "ggml" / "CMakeLists.txt").read_text().splitlines():
        for key in ("MAJOR", "MINOR", "PATCH"):
            if line.startswith(f"set(GGML_VERSION_{key} "):
                parts[key] = line.split()[-1].rstrip(")")
    return ".".join(parts.get(key, "?") for key in ("MAJOR", "MINOR", "PATCH"))


def _compile_harness(directory: Path, harness: Path) -> None:
    cc = _tool("cc", "apt-get install build-essential")
    prefix = directory / "ggml"
    partial = harness.with_suffix(f".{os.getpid()}.tmp")
    _run([cc, "-O2", "-std=c11", "-Wall", "-Wextra", "-Werror", "-fPIC", "-shared",
          f"-I{prefix / 'include'}", str(HARNESS_SOURCE), "-o", str(partial),
          f"-L{prefix / 'lib'}", *(f"-l{lib}" for lib in _LIBRARIES),
          f"-Wl,-rpath,{prefix / 'lib'}"], directory / "build.log",
         f"compiling {HARNESS_SOURCE.name} against ggml")
    partial.replace(harness)


def manifest() -> dict:
    """The build's manifest (versions, CMake options, build seconds); {} when not built."""
    path = cache_dir() / "manifest.json"
    return json.loads(path.read_text()) if path.is_file() else {}


# ------------------------------------------------------------------------------------ running

_LIB: ctypes.CDLL | None = None
_FAILED: BuildError | None = None  # a build that failed once is not tried again in this process
_F32 = ctypes.POINTER(ctypes.c_float)


def _library() -> ctypes.CDLL:
    global _LIB, _FAILED
    if _FAILED is not None:
        raise _FAILED
    if _LIB is None:
        try:
            path = build()
            try:
                lib = ctypes.CDLL(str(path))
            except OSError as error:
                raise BuildError(f"llama.cpp peer: cannot load {path} ({error}): rm -r "
                                 f"{path.parent} to build it anew") from None
        except BuildError as why:
            _FAILED = why
            raise
        lib.qc_mm_new.restype = ctypes.c_void_p
        lib.qc_mm_new.argtypes = [ctypes.c_char_p, ctypes.c_int64, ctypes.c_int64,
                                  ctypes.c_int64, _F32, ctypes.c_char_p, ctypes.c_int,
                                  ctypes.c_char_p, ctypes.c_size_t]
        for name in ("qc_mm_set_x", "qc_mm_output", "qc_mm_dequantized"):
            getattr(lib, name).restype = ctypes.c_int
            getattr(lib, name).argtypes = [ctypes.c_void_p, _F32]
        lib.qc_mm_compute.restype = ctypes.c_int
        lib.qc_mm_compute.argtypes = [ctypes.c_void_p]
        lib.qc_mm_set_threads.restype = None
        lib.qc_mm_set_threads.argtypes = [ctypes.c_void_p, ctypes.c_int]
        lib.qc_mm_weight_bytes.restype = ctypes.c_size_t
        lib.qc_mm_weight_bytes.argtypes = [ctypes.c_void_p]
        lib.qc_mm_buffer_name.restype = ctypes.c_char_p
        lib.qc_mm_buffer_name.argtypes = [ctypes.c_void_p]
        lib.qc_mm_free.restype = None
        lib.qc_mm_free.argtypes = [ctypes.c_void_p]
        _LIB = lib
    return _LIB


def _pointer(array: np.ndarray):
    return array.ctypes.data_as(_F32)


class MulMat:
    """One ``ggml_mul_mat(W, x)`` on ggml's CPU backend, as llama.cpp runs a linear layer.

    Parameters
    ----------
    weight : numpy.ndarray
        float32 [N, K], row-major: row n holds output n's K weights (ggml's ``ne0 = K,
        ne1 = N``; torch's ``Linear.weight`` layout). Quantized to ``ggml_type`` by ggml.
    m : int
        Rows of x.
    ggml_type : str
        One of :data:`GGML_TYPES`; K must be a multiple of its block (:data:`BLOCK`).
    threads : int
        ggml's thread count (changed later with :meth:`set_threads`).
    buffer : str
        The extra buffer type of ggml's CPU device to place the weight in when it supports the
        product, as llama.cpp's model loader does (``CPU_REPACK``: q4_0 and q4_K on AVX2, and
        q2_K on AVX-512, repacked into interleaved 8x8 blocks); else, or with ``""``, a plain
        CPU buffer. Not ``AMX`` by default, which llama.cpp tries first where the CPU reports
        AMX: in a VM that reports AMX without enabling it (seen on a 2-core Xeon under KVM) its
        tile instructions kill the process (SIGILL at M > 1).

    Raises
    ------
    ValueError
        A shape ggml's type cannot hold (the rule and the numbers).
    BuildError
        The harness could not be built (one line, with the fix).
    """

    def __init__(self, weight: np.ndarray, m: int, ggml_type: str, threads: int = 1,
                 buffer: str = "CPU_REPACK"):
        weight = np.ascontiguousarray(weight, dtype=np.float32)
        if weight.ndim != 2:
            raise ValueError(f"weight must be [N, K], got shape {weight.shape}")
        self.n, self.k = weight.shape
        self.m, self.ggml_type = m, ggml_type
        check_shape(ggml_type, self.k, self.n, m)
        self._lib = _library()
        error = ctypes.create_string_buffer(256)
        handle = self._lib.qc_mm_new(ggml_type.encode(), self.k, self.n, m, _pointer(weight),
                                     buffer.encode(), threads, error, len(error))
        if not handle:
            raise ValueError(f"llama.cpp peer: {error.value.decode()}")
        self._handle = handle
        self._y = np.empty((m, self.n), dtype=np.float32)
        self.buffer = self._lib.qc_mm_buffer_name(handle).decode()
        self.nbytes = int(self._lib.qc_mm_weight_bytes(handle))

    def set_x(self, x: np.ndarray) -> None:
        """Copy x, float32 [M, K] row-major, into the product's input tensor."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        if x.shape != (self.m, self.k):
            raise ValueError(f"x has shape {x.shape}; this product takes [M, K] = "
                             f"[{self.m}, {self.k}]")
        self._check(self._lib.qc_mm_set_x(self._handle, _pointer(x)), "setting x")

    def set_threads(self, threads: int) -> None:
        """ggml's thread count for the next :meth:`compute`."""
        self._lib.qc_mm_set_threads(self._handle, threads)

    def compute(self) -> None:
        """Run the product once (x as last set; y stays in ggml's buffer)."""
        self._check(self._lib.qc_mm_compute(self._handle), "ggml_backend_graph_compute")

    def output(self) -> np.ndarray:
        """y = x @ W^T of the last :meth:`compute`: float32 [M, N], row-major (a new array)."""
        self._check(self._lib.qc_mm_output(self._handle, _pointer(self._y)), "reading y")
        return self._y.copy()

    def dequantized(self) -> np.ndarray:
        """The quantized weight as ggml's ``to_float`` reads it back: float32 [N, K]."""
        w = np.empty((self.n, self.k), dtype=np.float32)
        self._check(self._lib.qc_mm_dequantized(self._handle, _pointer(w)), "dequantizing")
        return w

    def _check(self, status: int, what: str) -> None:
        if status:
            raise RuntimeError(f"llama.cpp peer: {what} failed (ggml status {status})")

    def __del__(self):
        handle, self._handle = getattr(self, "_handle", None), None
        if handle:
            self._lib.qc_mm_free(handle)
