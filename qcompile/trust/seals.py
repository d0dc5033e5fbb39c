"""Seals: which measurements a host may believe without measuring them again.

Anyone who can write to a shared database can write any row, provenance included, so a row's
own fields cannot say that a latency was really measured. A seal can: an HMAC-SHA256, over
what was measured (the record's digest, which fixes its trace, spec and target), on what (the
device model) and how fast (the run times), made with a key the writer of the row does not
have unless it is trusted:

- **the host key**, 32 random bytes created on first use in ``$XDG_CACHE_HOME/qcompile/
  seal.key`` (mode 0600). It seals what this user measures on this machine, so a build here
  believes its own earlier measurements, wherever they are stored;
- **a team key**, a file the team hands to the machines it trusts (``$QCOMPILE_TEAM_KEY_FILE``).
  With one, measurements are sealed with it instead, and every holder believes measurements
  made by any other holder on the same device model: each machine type is measured once.

A seal reads ``v1:<key id>:<hex>``; the key id (16 hex of a hash of the key) only says which
key to try. A seal that does not verify is treated as no seal.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from qcompile.errors import SealKeyError
from tuning_db.url import cache_dir

#: Environment variable naming the team key file.
TEAM_KEY_ENV = "QCOMPILE_TEAM_KEY_FILE"
#: The shortest key accepted (bytes).
MIN_KEY_BYTES = 16
_SEAL = re.compile(r"v1:([0-9a-f]{16}):([0-9a-f]{64})")


def host_key_path() -> Path:
    return cache_dir() / "seal.key"


def _read_key(path: Path, what: str) -> bytes:
    try:
        key = path.read_bytes()
    except OSError as error:
        raise SealKeyError(f"{what} {path} cannot be read: {error.strerror or error}") from None
    if len(key) < MIN_KEY_BYTES:
        raise SealKeyError(f"{what} {path} holds {len(key)} bytes; a key needs at least "
                        f"{MIN_KEY_BYTES} (make one with: head -c 32 /dev/urandom > FILE)")
    return key


def host_key() -> bytes:
    """This user's key on this machine, created (0600) on first use."""
    path = host_key_path()
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # another process made it first: use theirs
            pass
        else:
            with os.fdopen(fd, "wb") as handle:
                handle.write(os.urandom(32))
    return _read_key(path, "the host seal key")


def team_key() -> bytes | None:
    """The team key named by ``$QCOMPILE_TEAM_KEY_FILE``, or None when it names none."""
    name = os.environ.get(TEAM_KEY_ENV)
    return _read_key(Path(name).expanduser(), "the team key (" + TEAM_KEY_ENV + ")") \
        if name else None


def key_id(key: bytes) -> str:
    return hashlib.sha256(b"qcompile-seal-key:" + key).hexdigest()[:16]


def _payload(record_digest: str, device_model: str, run_secs: list[float], purpose: str) -> bytes:
    return json.dumps([record_digest, device_model, [repr(float(s)) for s in run_secs], purpose],
                      separators=(",", ":")).encode()


@dataclass(frozen=True)
class Sealer:
    """The keys this process holds: it seals with the team key if there is one, else the host
    key, and believes seals made with either.

    Attributes
    ----------
    keys : dict of str to bytes
        Key id -> key.
    signing_id : str
        The id of the key new seals are made with.
    names : dict of str to str
        Key id -> "team key" or "host key", for messages.
    """

    keys: dict[str, bytes]
    signing_id: str
    names: dict[str, str]

    @classmethod
    def load(cls) -> Sealer:
        """The host key, and the team key when ``$QCOMPILE_TEAM_KEY_FILE`` names one."""
        host = host_key()
        keys, names = {key_id(host): host}, {key_id(host): "host key"}
        team = team_key()
        signing = key_id(host)
        if team is not None:
            keys[key_id(team)] = team
            names[key_id(team)] = "team key"
            signing = key_id(team)
        return cls(keys=keys, signing_id=signing, names=names)

    def seal(self, record_digest: str, device_model: str, run_secs: list[float],
             purpose: str) -> str:
        """The seal of one measurement (``purpose``: "tune", "verify" or "remeasure")."""
        key = self.keys[self.signing_id]
        mac = hmac.new(key, _payload(record_digest, device_model, run_secs, purpose),
                       hashlib.sha256).hexdigest()
        return f"v1:{self.signing_id}:{mac}"

    def verify(self, seal: str, record_digest: str, device_model: str, run_secs: list[float],
               purpose: str) -> str | None:
        """The name of the key that made ``seal`` over exactly these values, or None."""
        match = _SEAL.fullmatch(seal or "")
        if match is None or match.group(1) not in self.keys:
            return None
        key = self.keys[match.group(1)]
        expected = hmac.new(key, _payload(record_digest, device_model, run_secs, purpose),
                            hashlib.sha256).hexdigest()
        if not hmac.compare_digest(expected, match.group(2)):
            return None
        return self.names[match.group(1)]


def well_formed(seal: str) -> bool:
    """Whether ``seal`` has a seal's shape ("" or ``v1:<16 hex>:<64 hex>``)."""
    return seal == "" or _SEAL.fullmatch(seal) is not None
