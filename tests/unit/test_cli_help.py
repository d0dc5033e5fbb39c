"""What a newcomer reads first: ``--help`` is plain text and names the real default database,
and ``db ls``/``db best`` name targets as the presets typed on the command line. No TVM: the
database rows are written as a tuning run would write them, targets as TVM prints them."""

from __future__ import annotations

import argparse
import json
import re

import pytest

from qcompile.cli import build_parser, main
from tuning_db import Provenance, Storage

#: Targets as ``qcompile._tvm.target_dict`` prints the presets' (avx2 with 2 cores, cuda).
AVX2 = {"kind": "llvm", "tag": "", "keys": ["cpu"], "num-cores": 2, "mcpu": "core-avx2"}
AVX512 = {**AVX2, "num-cores": 16, "mcpu": "skylake-avx512"}
CUDA = {"kind": "cuda", "tag": "", "keys": ["cuda", "gpu"],
        "host": {"kind": "llvm", "tag": "", "keys": ["cpu"], "mcpu": "core-avx2"},
        "max_num_threads": 1024, "registers_per_block": 65536, "thread_warp_size": 32,
        "max_shared_memory_per_block": 49152, "l2_cache_size_bytes": 62914560,
        "max_threads_per_block": 1024, "arch": "sm_90"}
SM90 = {**CUDA, "l2_cache_size_bytes": 52428800}


def _parsers(parser: argparse.ArgumentParser):
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                yield from _parsers(sub)


def test_help_is_plain_text():
    """No reStructuredText in any help: argparse prints it as it is."""
    for parser in _parsers(build_parser()):
        text = parser.format_help()
        assert "``" not in text and not re.search(r":(class|func|mod|meth):", text), \
            (parser.prog, text)
    assert "Tune, build and load quantized LLM kernels" in build_parser().format_help()


def test_db_help_names_the_default_that_follows_xdg_cache_home():
    for parser in _parsers(build_parser()):
        text = " ".join(parser.format_help().split())
        if "--db URL" not in text:
            continue
        assert "$XDG_CACHE_HOME/qcompile/tuning.sqlite" in text, parser.prog
        assert "defaults to ~/.cache" in text, parser.prog


def _fill(url: str) -> None:
    storage = Storage(url)
    for index, (target, mean_s) in enumerate([(AVX2, 2e-5), (AVX512, 1e-5), (CUDA, 3e-6),
                                              (SM90, 4e-6)]):
        text = json.dumps(target, sort_keys=True, separators=(",", ":"))
        info = storage.get_or_create_workload(
            digest=f"{index:064x}", name=f"uniform_b4_g128_k256_n{128 * (index + 1)}_m1_f32",
            family="uniform", spec_digest=f"{index:064x}", spec_json="{}",
            target_key=f"{index + 10:064x}", target_json=text, mod_hash="0", mod_json="{}")
        storage.add_record(workload_id=info.id, digest=f"{index + 20:064x}", status="ok",
                           run_secs=[mean_s], trace_json="[[],[]]", args_info_json="[]",
                           target_json=text, provenance=Provenance(host="h", user="u"))
    storage.close()


@pytest.mark.parametrize("command", ["ls", "best"])
def test_db_ls_and_best_name_the_preset_as_typed(command, tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    _fill(url)
    assert main(["db", command, "--db", url]) == 0
    out = capsys.readouterr().out
    assert "avx2 (2 cores)" in out and "avx512 (16 cores)" in out
    lines = out.splitlines()
    assert any(re.search(r"\bcuda\b", line) and "n384" in line for line in lines), out
    assert any(re.search(r"\bsm90\b", line) and "n512" in line for line in lines), out
    assert "core-avx2" not in out and "llvm" not in out and "sm_90" not in out

    # --target matches the preset as typed, and TVM's name as before
    for wanted, names in (("avx2", ["n128"]), ("core-avx2", ["n128"]), ("avx512", ["n256"]),
                          ("sm_90", ["n384", "n512"]), ("cuda", ["n384", "n512"])):
        assert main(["db", command, "--db", url, "--target", wanted]) == 0
        out = capsys.readouterr().out
        shown = sorted({f"n{n}" for n in re.findall(r"_n(128|256|384|512)_", out)})
        assert shown == names, (wanted, out)
