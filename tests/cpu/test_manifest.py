"""A manifest is validated whole before anything loads: every malformed one is refused with one
line (LoadError), never a KeyError, TypeError, UnicodeDecodeError or AttributeError; and a
library runs only on a host that has the CPU features its manifest records."""

import copy
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import qcompile
import targets
from qcompile.build import build_untuned
from qcompile.errors import LoadError
from qcompile.kernels import UniformSpec
from qcompile.manifest import MANIFEST_FORMAT, manifest_path
from targets import host, isa

SPEC = UniformSpec(k=128, n=64, bits=4, group_size=64)


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    """An avx2 library as qcompile build exports it (untuned: seconds)."""
    preset = targets.get("avx2")
    if not preset.host_support()[0]:
        pytest.skip(f"host cannot run avx2 code: {preset.host_support()[1]}")
    result = build_untuned(SPEC, preset, tmp_path_factory.mktemp("avx2"))
    return result.so_path


@pytest.fixture(scope="module")
def original(library):
    return json.loads(manifest_path(library).read_text())


@pytest.fixture
def lib(library, tmp_path):
    """A copy of the library and its manifest, free to damage."""
    for name in (library.name, manifest_path(library).name):
        shutil.copy(library.parent / name, tmp_path / name)
    return tmp_path / library.name


def refusal(so_path) -> str:
    """The LoadError message of loading ``so_path``; fails unless it is one line."""
    with pytest.raises(LoadError) as info:
        qcompile.load(str(so_path))
    message = str(info.value)
    assert message and "\n" not in message and "\r" not in message, message
    return message


def write(so_path, data) -> None:
    manifest_path(so_path).write_text(json.dumps(data))


def test_the_manifest_records_what_the_library_needs(original, lib):
    assert original["format"] == MANIFEST_FORMAT == 2
    assert original["requires"] == {"cpu_flags": list(isa.MCPU_FLAGS["core-avx2"]),
                                    "cuda_arch": None}
    assert qcompile.load(str(lib)).spec == SPEC


def _set(path, value):
    def mutate(data):
        *parents, last = path
        for key in parents:
            data = data[key]
        data[last] = value
    return mutate


def _drop(path):
    def mutate(data):
        *parents, last = path
        for key in parents:
            data = data[key]
        del data[last]
    return mutate


# (mutation of the parsed manifest, what the one-line refusal says)
CASES = {
    "missing sha256": (_drop(["sha256"]), "lacks sha256: rebuild with qcompile build"),
    "missing requires": (_drop(["requires"]), "lacks requires: rebuild with qcompile build"),
    "missing spec": (_drop(["spec"]), "lacks spec"),
    "missing target": (_drop(["target"]), "lacks target"),
    "missing format": (_drop(["format"]), "lacks format: rebuild with qcompile build"),
    "old format": (_set(["format"], 1), "has format 1, from an older qcompile; this one reads "
                   "format 2 .*: rebuild with qcompile build"),
    "newer format": (_set(["format"], 3), "has format 3, from a newer qcompile"),
    "format string": (_set(["format"], "2"), "format must be an integer; got a string '2'"),
    "format bool": (_set(["format"], True), "format must be an integer; got a boolean"),
    "name number": (_set(["name"], 5), "name must be a kernel name .*; got a number 5"),
    "name path": (_set(["name"], "../../tmp/x"), r"name must be a kernel name .*'\.\./\.\./"),
    "name of another spec": (_set(["name"], "uniform_b4_g64_k256_n64_m1_f32"),
                             "name 'uniform_b4_g64_k256_n64_m1_f32' is not its spec's name"),
    "function null": (_set(["function"], None), "function must be a symbol .*; got null"),
    "function injection": (_set(["function"], "f; rm -rf"), "function must be a symbol"),
    "function other": (_set(["function"], "main"), "function 'main' is not the kernel's name"),
    "sha256 short": (_set(["sha256"], "abc"), "sha256 must be 64 lower-case hex digits"),
    "sha256 list": (_set(["sha256"], ["a"]), "sha256 must be 64 .*; got an array"),
    "spec string": (_set(["spec"], "uniform"), "spec must be a JSON object; got a string"),
    "spec no family": (_drop(["spec", "family"]), "spec.family must be a family name; got null"),
    "spec family unknown": (_set(["spec", "family"], "dense"), "spec.family 'dense' is not a "
                            "kernel family; known: uniform"),
    "spec k string": (_set(["spec", "k"], "128"), "spec.k must be an integer; got a string"),
    "spec k float": (_set(["spec", "k"], 128.0), "spec.k must be an integer; got a number"),
    "spec bits bool": (_set(["spec", "bits"], True), "spec.bits must be an integer; got a bool"),
    "spec group list": (_set(["spec", "group_size"], [64]), "spec.group_size must be an "
                        "integer; got an array"),
    "spec dtype number": (_set(["spec", "dtype"], 32), "spec.dtype must be a string"),
    "spec extra field": (_set(["spec", "evil"], 1), "spec has field 'evil', which a uniform spec "
                         "does not have"),
    "spec rule": (_set(["spec", "bits"], 5), "spec is invalid: bits=5 is not supported"),
    "spec k huge": (_set(["spec", "k"], 10 ** 30), r"spec.k is a number beyond 64 bits"),
    "spec digest": (_set(["spec_digest"], "0" * 64), "spec_digest does not match its spec"),
    "target list": (_set(["target"], []), "target must be a JSON object; got an array"),
    "preset unknown": (_set(["target", "preset"], "avx1024"), "Unknown target 'avx1024'"),
    "preset number": (_set(["target", "preset"], 2), "target.preset must be a target preset"),
    "preset of another kind": (_set(["target", "preset"], "cuda"), "target.kind is 'cpu', but "
                               "preset 'cuda' is a cuda target"),
    "preset claims avx512": (_set(["target", "preset"], "avx512"), "target.tvm.mcpu is "
                             "'core-avx2', but the preset builds for mcpu 'skylake-avx512'"),
    "tvm string": (_set(["target", "tvm"], "llvm"), "target.tvm must be a JSON object"),
    "tvm mattr": (_set(["target", "tvm", "mattr"], ["+avx512f"]), "target.tvm has 'mattr', "
                  "which no target of qcompile's presets has"),
    "tvm cores": (_set(["target", "tvm", "num-cores"], -1), "target.tvm.num-cores must be "
                  "between 1 and"),
    "requires list": (_set(["requires"], ["avx2"]), "requires must be a JSON object"),
    "flags string": (_set(["requires", "cpu_flags"], "avx2 fma"), "requires.cpu_flags must be "
                     "an array"),
    "flag odd": (_set(["requires", "cpu_flags"], ["avx2", "../x"]), "requires.cpu_flags.. must "
                 "be a /proc/cpuinfo flag name"),
    "flags fewer than the mcpu": (_set(["requires", "cpu_flags"], ["avx", "sse2"]),
                                  "is inconsistent: mcpu core-avx2 implies CPU flags abm, avx2, "
                                  "bmi1.*which requires.cpu_flags leaves out"),
    "cuda arch on a cpu": (_set(["requires", "cuda_arch"], "sm_90"), "requires.cuda_arch is "
                           "'sm_90', but 'avx2' is a CPU target"),
    "record string": (_set(["record"], "best"), "record must be a JSON object"),
    "record id": (_set(["record", "id"], "7"), "record.id must be an integer"),
    "versions": (_set(["versions"], {"tvm": 27}), "versions.tvm must be a string"),
    "file path": (_set(["files", "so"], "../../etc/passwd"), "files.so must be a file name "
                  "without a directory"),
    "layout string": (_set(["layout"], "n_tiled"), "layout must be a JSON object"),
    "layout missing tile": (_set(["layout"], {"kind": "n_tiled"}), "layout .* is not a layout "
                            "of the uniform family"),
    "layout tile negative": (_set(["layout", "tile_n"], -32), "layout.tile_n must be between"),
    "nested garbage": (_set(["record", "extra"], json.loads("[" * 40 + "]" * 40)),
                       "nested more than 12 levels deep"),
    "long string": (_set(["built_at"], "x" * 5000), "built_at is a string of 5000 characters"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_malformed_manifest_is_one_line(case, original, lib):
    mutate, expected = CASES[case]
    data = copy.deepcopy(original)
    mutate(data)
    write(lib, data)
    message = refusal(lib)
    assert message.startswith(f"manifest {manifest_path(lib)}"), message
    assert re.search(expected, message), message


RAW_CASES = {
    "array": (b"[1, 2, 3]", "must hold a JSON object; got an array"),
    "number": (b"42", "must hold a JSON object; got a number"),
    "null": (b"null", "must hold a JSON object; got null"),
    "not json": (b"{not json", "unreadable or corrupt: Expecting property name"),
    "empty": (b"", "unreadable or corrupt: Expecting value"),
    "latin-1": ('{"name": "caf\xe9"}'.encode("latin-1"), r"not UTF-8 text \(byte 0xe9 at "
                "offset 13\\)"),
    "random bytes": (bytes(range(256)), "not UTF-8 text"),
    "NaN": (b'{"format": NaN}', "unreadable or corrupt: NaN is not a JSON number"),
    "huge float": (b'{"format": 1e400}', "format is a number too large to represent"),
    "huge integer": (b'{"format": ' + b"9" * 5000 + b"}", "unreadable or corrupt: Exceeds the "
                     "limit"),
    "deep nesting": (b"[" * 100_000 + b"]" * 100_000, "unreadable or corrupt: nested too "
                     "deeply"),
}


@pytest.mark.parametrize("case", sorted(RAW_CASES))
def test_malformed_bytes_are_one_line(case, lib):
    raw, expected = RAW_CASES[case]
    manifest_path(lib).write_bytes(raw)
    message = refusal(lib)
    assert re.search(expected, message), message


def test_a_manifest_that_is_no_file_or_too_big(lib):
    path = manifest_path(lib)
    path.write_bytes(b" " * ((1 << 20) + 1))
    assert "bytes; a manifest has at most 1048576" in refusal(lib)
    path.unlink()
    path.mkdir()
    assert "is not a regular file" in refusal(lib)
    path.rmdir()
    assert "no manifest" in refusal(lib)


# ---- the fuzz test ---------------------------------------------------------------------------

_scalars = (st.none() | st.booleans() | st.integers() | st.integers(-10 ** 40, 10 ** 40)
            | st.floats() | st.text(max_size=20)
            | st.sampled_from(["avx2", "avx512", "cuda", "llvm", "core-avx2", "skylake-avx512",
                               "sm_90", "uniform", "n_tiled", "a" * 64, "../x", ""]))
_json = st.recursive(_scalars, lambda children: st.lists(children, max_size=4)
                     | st.dictionaries(st.text(max_size=8), children, max_size=4),
                     max_leaves=12)


def _paths(value, prefix=()):
    """Every path (tuple of keys/indices) into a JSON value, the root included."""
    yield prefix
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _paths(item, (*prefix, index))


@st.composite
def _mutated(draw, original):
    """Bytes of a manifest: a real one with keys dropped or values swapped for random JSON,
    random JSON, random bytes, or the real text with bytes flipped."""
    how = draw(st.sampled_from(["drop", "swap", "swap", "json", "bytes", "flip"]))
    if how == "json":
        return json.dumps(draw(_json)).encode()
    if how == "bytes":
        return draw(st.binary(max_size=300))
    text = bytearray(json.dumps(original).encode())
    if how == "flip":
        for _ in range(draw(st.integers(1, 4))):
            text[draw(st.integers(0, len(text) - 1))] = draw(st.integers(0, 255))
        return bytes(text)
    data = copy.deepcopy(original)
    for _ in range(draw(st.integers(1, 3))):
        paths = [p for p in _paths(data) if p]
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent = data
        for key in path[:-1]:
            parent = parent[key]
        if how == "drop":
            del parent[path[-1]]
        else:
            parent[path[-1]] = draw(_json)
    return json.dumps(data).encode()


@pytest.fixture(scope="module")
def fuzz_lib(library, tmp_path_factory):
    out = tmp_path_factory.mktemp("fuzz")
    for name in (library.name, manifest_path(library).name):
        shutil.copy(library.parent / name, out / name)
    return out / library.name


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_fuzz_manifest_loads_or_refuses_in_one_line(data, fuzz_lib, original):
    raw = data.draw(_mutated(original))
    manifest_path(fuzz_lib).write_bytes(raw)
    try:
        kernel = qcompile.load(str(fuzz_lib))
    except LoadError as error:
        message = str(error)
        assert message and "\n" not in message and "\r" not in message, message
    else:
        assert kernel.spec == SPEC  # only a manifest that still describes this library loads


# ---- a library runs only where it can ----------------------------------------------------------

_LOAD_AND_RUN = """
import sys
import numpy as np
import torch
import qcompile
from qcompile.errors import LoadError
try:
    kernel = qcompile.load(sys.argv[1])
except LoadError as error:
    print("REFUSED", error)
    sys.exit(3)
family = kernel.family
tensors = family.example_tensors(kernel.spec, np.random.default_rng(0))
x = torch.randn(kernel.spec.k)
y = kernel(x, kernel.prepare(**tensors)).numpy()
ref = family.reference(kernel.spec, x.numpy(), **tensors)
print("RAN", float(np.abs(y - ref).max() / np.abs(ref).max()))
"""


def _load_in_subprocess(so_path, hide: str | None):
    env = dict(os.environ)
    env.pop(host.HIDE_FLAGS_ENV, None)
    if hide:
        env[host.HIDE_FLAGS_ENV] = hide
    return subprocess.run([sys.executable, "-c", _LOAD_AND_RUN, str(so_path)], env=env,
                          capture_output=True, text=True, timeout=300, check=False)


@pytest.fixture(scope="module")
def avx512_library(tmp_path_factory):
    """An AVX-512 library (built for another host if this one lacks AVX-512)."""
    result = build_untuned(SPEC, targets.get("avx512"), tmp_path_factory.mktemp("avx512"),
                           for_another_host=True)
    return result.so_path


def test_avx512_library_claiming_avx2_is_refused_on_an_avx2_host(avx512_library, tmp_path):
    so = tmp_path / avx512_library.name
    shutil.copy(avx512_library, so)
    honest = json.loads(manifest_path(avx512_library).read_text())
    assert {"avx512f", "avx512bw", "avx512dq", "avx512vl"} <= set(honest["requires"]["cpu_flags"])

    # As built: refused on a host that presents no AVX-512 flags.
    write(so, honest)
    out = _load_in_subprocess(so, "avx512*")
    assert out.returncode == 3, out
    assert out.stdout.count("\n") == 1
    assert (f"REFUSED {so} was built for target 'avx512' (mcpu skylake-avx512), which this host "
            "cannot run: it needs the CPU flags ") in out.stdout
    assert "flags hidden by $QCOMPILE_HIDE_CPU_FLAGS=avx512*) lacks avx512bw, avx512cd, " \
           "avx512dq, avx512f, avx512vl" in out.stdout

    # The attack: the manifest says preset avx2 (the library's sha256 still matches).
    claims = copy.deepcopy(honest)
    claims["target"]["preset"] = "avx2"
    write(so, claims)
    out = _load_in_subprocess(so, "avx512*")
    assert out.returncode == 3, out
    assert "target.tvm.mcpu is 'skylake-avx512', but the preset builds for mcpu " \
           "'core-avx2'" in out.stdout
    # ... and its target's mcpu too: the features it records still give it away.
    claims["target"]["tvm"]["mcpu"] = "core-avx2"
    write(so, claims)
    out = _load_in_subprocess(so, "avx512*")
    assert out.returncode == 3, out
    assert "lacks avx512bw, avx512cd, avx512dq, avx512f, avx512vl" in out.stdout
    # ... and its features too: inconsistent only if fewer than its mcpu implies.
    claims["requires"]["cpu_flags"] = list(isa.MCPU_FLAGS["core-avx2"][:-1])
    write(so, claims)
    out = _load_in_subprocess(so, "avx512*")
    assert out.returncode == 3 and "is inconsistent: mcpu core-avx2 implies" in out.stdout, out


def test_the_same_avx512_library_runs_where_the_flags_are(avx512_library):
    supported, reason = targets.get("avx512").host_support()
    if not supported:
        pytest.skip(f"needs an AVX-512 host: {reason}")
    out = _load_in_subprocess(avx512_library, None)
    assert out.returncode == 0, out
    assert out.stdout.startswith("RAN") and float(out.stdout.split()[1]) < 1e-5, out
