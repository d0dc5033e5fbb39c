"""Seals: an HMAC over what was measured, on what, how fast; only the keys' holders make them."""

import os
import stat

import pytest

from qcompile.errors import SealKeyError
from qcompile.trust import seals
from qcompile.trust.seals import Sealer

DIGEST = "ab" * 32


def test_the_host_key_is_made_once_and_private(tmp_path):
    key = seals.host_key()
    path = seals.host_key_path()
    assert path.is_relative_to(tmp_path) and len(key) == 32
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert seals.host_key() == key


def test_a_seal_verifies_only_over_exactly_what_it_sealed():
    sealer = Sealer.load()
    seal = sealer.seal(DIGEST, "AMD EPYC", [1e-5, 2e-5], "tune")
    assert sealer.verify(seal, DIGEST, "AMD EPYC", [1e-5, 2e-5], "tune") == "host key"
    for changed in ((DIGEST[::-1], "AMD EPYC", [1e-5, 2e-5], "tune"),
                    (DIGEST, "Intel Xeon", [1e-5, 2e-5], "tune"),
                    (DIGEST, "AMD EPYC", [1e-9, 2e-5], "tune"),
                    (DIGEST, "AMD EPYC", [1e-5, 2e-5], "verify")):
        assert sealer.verify(seal, *changed) is None
    assert sealer.verify("", DIGEST, "AMD EPYC", [1e-5, 2e-5], "tune") is None
    assert sealer.verify("v1:" + "0" * 16 + ":" + "0" * 64, DIGEST, "AMD EPYC",
                         [1e-5, 2e-5], "tune") is None


def test_another_hosts_seal_is_not_believed(tmp_path, monkeypatch):
    mine = Sealer.load()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "elsewhere"))
    theirs = Sealer.load()
    seal = theirs.seal(DIGEST, "AMD EPYC", [1e-5], "tune")
    assert theirs.verify(seal, DIGEST, "AMD EPYC", [1e-5], "tune") == "host key"
    assert mine.verify(seal, DIGEST, "AMD EPYC", [1e-5], "tune") is None


def test_a_team_key_seals_for_every_holder(tmp_path, monkeypatch):
    team = tmp_path / "team.key"
    team.write_bytes(os.urandom(32))
    monkeypatch.setenv(seals.TEAM_KEY_ENV, str(team))
    alice = Sealer.load()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "bob"))
    bob = Sealer.load()
    seal = alice.seal(DIGEST, "NVIDIA H100", [3e-5], "verify")
    assert bob.verify(seal, DIGEST, "NVIDIA H100", [3e-5], "verify") == "team key"
    monkeypatch.delenv(seals.TEAM_KEY_ENV)
    assert Sealer.load().verify(seal, DIGEST, "NVIDIA H100", [3e-5], "verify") is None


def test_unusable_team_keys_are_refused_in_one_line(tmp_path, monkeypatch):
    short = tmp_path / "short.key"
    short.write_bytes(b"123")
    monkeypatch.setenv(seals.TEAM_KEY_ENV, str(short))
    with pytest.raises(SealKeyError, match="holds 3 bytes; a key needs at least 16"):
        Sealer.load()
    monkeypatch.setenv(seals.TEAM_KEY_ENV, str(tmp_path / "missing.key"))
    with pytest.raises(SealKeyError, match="cannot be read"):
        Sealer.load()


def test_seal_shapes():
    assert seals.well_formed("") and not seals.well_formed("v1:zz:00")
    assert seals.well_formed(Sealer.load().seal(DIGEST, "x", [1.0], "tune"))
