"""Secrets never leave: a database URL's password and secret query parameters appear in no
message, log line, manifest, stored origin or export (issue 22, Deliver 4).

The first part tests the one redaction (:mod:`tuning_db.url`) on every URL form; the second
every place a URL can appear, in process and through the command line, over SQLite, PostgreSQL
(trust auth: a password still connects, so manifests and origins can be checked) and MariaDB (a
user of its own with a real password; and wrong passwords, whose failures must not echo them).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from urllib.parse import quote, quote_plus

import pytest
import sqlalchemy as sa
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

import targets
from qcompile import _tvm
from qcompile.errors import DatabaseError, NoRecordError
from qcompile.kernels import UniformSpec
from qcompile.trust import records
from schedules.variants import compute_for
from tuning_db import Storage, transfer
from tuning_db.url import (
    MASK,
    UNPARSEABLE,
    db_option,
    is_secret_name,
    redact,
    redact_origin,
    scrub,
    scrub_arguments,
    secrets_of,
)

ROOT = Path(__file__).resolve().parents[2]

# Distinct secrets, so that a leak says which one leaked.
PW = "Hunter2-pw9x"  # a userinfo password
QPW = "qp-S3cret77"  # ?password=
TOKEN = "tok-Zq7w41K"  # ?token=
SSLPW = "sslpw-K8m2Vb"  # ?sslpassword=
ODD = "p@ss w/rd%#"  # needs percent-encoding everywhere
SECRETS = (PW, QPW, TOKEN, SSLPW, ODD)

SPEC = UniformSpec(k=256, n=128, bits=4, group_size=64)
SPEC_ARGS = ["--target", "avx2", "--shape", "256x128", "--group-size", "64"]
NAME = SPEC.name()


def assert_clean(text, *secrets):
    """None of ``secrets`` (default: all of them), in any spelling, is in ``text``."""
    for secret in secrets or SECRETS:
        for form in {secret, quote(secret, safe=""), quote_plus(secret), quote(secret)}:
            assert form not in text, f"secret {secret!r} ({form!r}) leaked in: {text}"


def with_secrets(url: str, *, userinfo: str | None = PW, **params: str) -> str:
    """``url`` with a userinfo password and extra (secret) query parameters, percent-encoded."""
    parsed = make_url(url)
    if userinfo is not None:
        parsed = parsed.set(password=userinfo)
    extra = "&".join(f"{quote_plus(k)}={quote(v, safe='')}" for k, v in params.items())
    shown = parsed.render_as_string(hide_password=False)
    return f"{shown}{'&' if '?' in shown else '?'}{extra}" if extra else shown


# ---- the rule, on every URL form ----------------------------------------------------------------

FORMS = {
    # id: (url, secrets that must go, text that must stay)
    "postgresql-userinfo": (f"postgresql://alice:{PW}@db.example:5432/tuning",
                            [PW], ["postgresql://alice:***@db.example:5432/tuning"]),
    "postgresql+psycopg2-query": (
        f"postgresql+psycopg2://alice@db.example/tuning?password={QPW}&sslmode=require"
        "&options=-csearch_path%3Dqc_team&application_name=qc",
        [QPW], ["password=***", "sslmode=require", "options=-csearch_path%3Dqc_team",
                "application_name=qc", "postgresql+psycopg2://alice@db.example/tuning?"]),
    "postgresql-sslpassword": (f"postgresql://alice:{PW}@h/db?sslpassword={SSLPW}&sslkey=/k.pem",
                               [PW, SSLPW], ["sslpassword=***", "sslkey=%2Fk.pem"]),
    "mysql+pymysql-passwd": (f"mysql+pymysql://root@h:3306/tuning?passwd={QPW}&charset=utf8mb4",
                             [QPW], ["passwd=***", "charset=utf8mb4", "root@h:3306/tuning"]),
    "mariadb-ssl_password": (f"mariadb://bob@h/tuning?ssl_password={SSLPW}&token={TOKEN}",
                             [SSLPW, TOKEN], ["ssl_password=***", "token=***", "mariadb://bob@h"]),
    "mariadb+pymysql-userinfo": (f"mariadb+pymysql://bob:{PW}@h/tuning",
                                 [PW], ["mariadb+pymysql://bob:***@h/tuning"]),
    "sqlite-query": (f"sqlite:////tmp/team/x.sqlite?password={QPW}",
                     [QPW], ["sqlite:////tmp/team/x.sqlite?password=***"]),
    "sqlite-relative": (f"sqlite:///rel.sqlite?api_key={TOKEN}&timeout=5",
                        [TOKEN], ["sqlite:///rel.sqlite?", "api_key=***", "timeout=5"]),
    "percent-encoded-value": (f"postgresql://u:{quote(ODD, safe='')}@h/db?passwd="
                              f"{quote(ODD, safe='')}", [ODD], ["postgresql://u:***@h/db"]),
    "percent-encoded-name": (f"postgresql://u@h/db?pass%77ord={QPW}", [QPW], ["password=***"]),
    "repeated": (f"postgresql://u@h/db?password={QPW}&password={TOKEN}&sslmode=disable",
                 [QPW, TOKEN], ["password=***&password=***", "sslmode=disable"]),
    "empty-password": ("mysql+pymysql://root:@h/db?password=", [], ["mysql+pymysql://root:***@h/db"]),
    "unencoded-at": (f"postgresql://u:{PW}@x@h:5432/db", [PW, f"{PW}@x"], ["u:***@h:5432/db"]),
    "secret-in-another-parameter": (
        f"mssql+pyodbc:///?odbc_connect=DRIVER%3Dx%3BPWD%3D{TOKEN}%3BUID%3Du",
        [TOKEN], ["PWD%3D***", "UID%3Du"]),
    "names": (f"postgresql://u@h/db?client_secret={TOKEN}&access-token={QPW}&PWD={SSLPW}"
              f"&auth_token={PW}&passfile=/home/u/.pgpass&connect_timeout=3",
              [TOKEN, QPW, SSLPW, PW, "/home/u/.pgpass"], ["connect_timeout=3"]),
    "no-secret": ("postgresql+psycopg2://postgres@127.0.0.1:5432/test?options=-csearch_path%3Dqc",
                  [], ["postgresql+psycopg2://postgres@127.0.0.1:5432/test?options="
                       "-csearch_path%3Dqc"]),
}


@pytest.mark.parametrize("form", FORMS, ids=list(FORMS))
def test_redact_masks_every_secret_of_each_url_form(form):
    url, secrets, kept = FORMS[form]
    shown = redact(url)
    assert_clean(shown, *secrets)
    for part in kept:
        assert part in shown, (shown, part)
    assert redact(shown) == shown, "redacting twice changes nothing"
    make_url(shown)  # still a URL
    assert (MASK in shown) == bool(secrets) or form == "empty-password"
    # The raw secret in every spelling is found for free-text scrubbing.
    for secret in secrets:
        assert secret in secrets_of(url) or quote(secret, safe="") in secrets_of(url)


@pytest.mark.parametrize("url", [
    "notaurl", f"notaurl:{PW}", f"postgresql://u:{PW}@h:port/db", f"postgresql://u:{PW}@[::1/db",
    f"postgresql://u:x@y{PW}@h:5432:9/db", "", None, 42, b"sqlite://", object()])
def test_redact_never_raises_and_hides_what_it_cannot_parse(url):
    assert redact(url) == UNPARSEABLE


@pytest.mark.parametrize("name", ["password", "passwd", "PWD", "pwd", "sslpassword",
                                  "ssl_password", "secret", "client_secret", "token",
                                  "access-token", "api_key", "ApiKey", "X-Auth-Token", "auth",
                                  "credentials", "key", "sig", "passfile", "private.key"])
def test_secret_parameter_names(name):
    assert is_secret_name(name)


@pytest.mark.parametrize("name", ["options", "sslmode", "charset", "application_name", "host",
                                  "port", "connect_timeout", "sslkey", "sslcert", "sslrootcert",
                                  "uri", "timeout", "target_session_attrs", "dbname", "user"])
def test_readable_parameter_names(name):
    assert not is_secret_name(name)


@pytest.mark.parametrize("message", [
    # a driver echoing the DSN, its password, percent-encoded or not
    f"invalid dsn: host=h user=u password={QPW} dbname=x",
    f"invalid dsn: password='{ODD}' host=h",
    f"could not connect to postgresql://u:{quote(ODD, safe='')}@h/db?token={TOKEN}",
    f"Connection.__init__() got {{'passwd': '{QPW}', \"token\": \"{TOKEN}\"}}",
    f"authentication failed for {PW} and {quote_plus(ODD)} and {SSLPW}",
])
def test_scrub_takes_a_urls_secrets_out_of_free_text(message):
    url = with_secrets(FORMS["postgresql+psycopg2-query"][0], userinfo=PW, token=TOKEN,
                       sslpassword=SSLPW, passwd=ODD)
    cleaned = scrub(message, url)
    assert_clean(cleaned)
    assert MASK in cleaned


def test_scrub_without_the_url_still_masks_urls_and_secret_pairs():
    cleaned = scrub(f"at mysql+pymysql://r:{PW}@h/d?passwd={QPW}&charset=utf8, password={TOKEN}: "
                    f"retry (using password: YES)")
    assert_clean(cleaned)
    assert "charset=utf8" in cleaned and "(using password: YES)" in cleaned
    assert "password=***: retry" in cleaned  # the text around a secret keeps its punctuation


def test_scrub_keeps_messages_readable_with_short_secrets():
    cleaned = scrub("port 5432 failed: could not parse p", "postgresql://u:p@h/db")
    assert cleaned == "port 5432 failed: could not parse ***"


def test_scrub_arguments_knows_every_url_of_the_command_line(monkeypatch):
    import argparse

    monkeypatch.setenv("QCOMPILE_DB", f"postgresql://u:{SSLPW}@h/db")
    args = argparse.Namespace(db=f"sqlite:////x.sqlite?password={QPW}", top=3, path="a.jsonl",
                              source=f"mysql+pymysql://r:{PW}@h/d?token={TOKEN}")
    cleaned = scrub_arguments(f"failed: {QPW} {PW} {TOKEN} {SSLPW} in a.jsonl", args)
    assert_clean(cleaned)
    assert cleaned.endswith("in a.jsonl")
    assert_clean(scrub_arguments(f"x {SSLPW}"))


def test_redact_origin_cleans_what_older_merges_stored():
    old = f"merge sqlite:////srv/team.sqlite?password={QPW}&token={TOKEN}"
    assert redact_origin(old) == "merge sqlite:////srv/team.sqlite?password=***&token=***"
    cut = f"merge postgresql://u:***@h/db?sslmode=require&password={QPW}"[:60]
    assert_clean(redact_origin(cut), QPW[:4])
    assert redact_origin(f"merge notaurl?passwd={QPW}") == "merge notaurl?passwd=***"
    for kept in ("tune", "import records.jsonl", "import ms/database_workload.json", "",
                 "merge postgresql://u:***@h/db"):
        assert redact_origin(kept) == kept
    assert redact_origin(redact_origin(old)) == redact_origin(old)


def test_db_option_is_runnable_only_when_nothing_is_hidden():
    assert db_option(redact("sqlite:////tmp/my db.sqlite")) == "--db 'sqlite:////tmp/my db.sqlite'"
    hidden = db_option(redact(f"postgresql://u:{PW}@h/db"))
    assert hidden.startswith("--db URL, where URL is postgresql://u:***@h/db")
    assert "'" not in hidden and PW not in hidden
    assert db_option(UNPARSEABLE).startswith("--db URL, ")


# ---- every place a URL can appear, in process ---------------------------------------------------


def _target():
    preset = targets.get("avx2")
    return _tvm.Target(preset.tvm_target(preset.hardware()))


def _fill(storage: Storage, latencies=(3e-5, 1e-5, 2e-5)) -> None:
    """Real records of our CPU design space (as tuning stores them, sealed by this host), for
    this host's avx2 target, with these latencies: what build, merge and export take."""
    from qcompile.measure import measuring_provenance
    from qcompile.trust.seals import Sealer
    from qcompile.trust.workloads import workload_database
    from schedules.cpu import uniform
    from tuning_db import STATUS_OK

    database = workload_database(storage, SPEC, _target(), provenance=measuring_provenance(
        targets.get("avx2")), sealer=Sealer.load())
    mod = _tvm.normalize_mod(compute_for(SPEC, "cpu"))
    workload = database.commit_workload(mod)
    args_info = _tvm.ms.arg_info.ArgInfo.from_prim_func(mod["main"])
    tiles = [(1, 1), (1, 2), (2, 2), (1, 4)]
    for (n_blk, n_reg), secs in zip(tiles, latencies, strict=False):
        sch = uniform.register_tile(_tvm.Schedule(mod), SPEC, targets.get("avx2").hardware(),
                                    {"n_blk": n_blk, "n_reg": n_reg})
        record = _tvm.TuningRecord(sch.trace, workload, [secs], database.target, args_info)
        database.commit_measurement(record, STATUS_OK, None)


def _stored_origins(storage: Storage) -> list[str]:
    """The origins as stored (not through RecordInfo, which redacts on the way out)."""
    with storage.engine.connect() as connection:
        return list(connection.execute(text("SELECT origin FROM tuning_records")).scalars())


def _secret_sqlite(path: Path) -> str:
    return with_secrets(f"sqlite:///{path}", userinfo=None, password=QPW, token=TOKEN,
                        sslpassword=SSLPW, passwd=ODD)


@pytest.fixture
def secret_source(tmp_path):
    """A SQLite database, named by a URL full of secrets, holding real records."""
    url = _secret_sqlite(tmp_path / "source.sqlite")
    with pytest.warns(Warning, match="not accepted by the pysqlite driver"):
        storage = Storage(url)
    _fill(storage)
    return storage


@pytest.mark.filterwarnings("ignore:Query string argument")
def test_storage_errors_repr_and_display_never_carry_a_secret(tmp_path):
    for url in (f"postgresql://u:{PW}@h:notaport/db", f"postgresql://u:x@y{PW}@h:5432:9/db",
                f"notaurl://u:{PW}@h", f"postgresql+psycopg2://u:{PW}@127.0.0.1:1/db?token={TOKEN}"):
        with pytest.raises(DatabaseError) as error:
            Storage(url)
        assert_clean(str(error.value))
    bare = Storage(_secret_sqlite(tmp_path / "x.sqlite"), check_schema=False, readonly=True)
    assert_clean(repr(bare) + bare.display_url)
    with pytest.raises(DatabaseError) as error:
        bare.add_record(workload_id=1, digest="d", status="ok", run_secs=[1.0], trace_json="[]",
                        args_info_json="[]", target_json="{}")
    assert_clean(str(error.value))
    assert "password=***" in str(error.value)


@pytest.mark.filterwarnings("ignore:Query string argument")
def test_merge_writes_no_secret_into_origins_on_any_backend(secret_source, db_url, tmp_path):
    dest = Storage(db_url)
    assert records.merge(secret_source, dest).records == 3
    origins = _stored_origins(dest)
    assert len(origins) == 3 and all(o.startswith("merge sqlite:///") for o in origins), origins
    assert_clean("\n".join(origins))
    assert "password=***" in origins[0] and "token=***" in origins[0]
    # And on the way out: db best's lines, the JSON lines export.
    assert_clean("\n".join(r.origin + r.database for r in dest.records()))
    path = tmp_path / "out.jsonl"
    transfer.export_jsonl(dest, path)
    assert_clean(path.read_text())


@pytest.mark.filterwarnings("ignore:Query string argument")
def test_secrets_already_stored_in_origins_never_leave(secret_source, tmp_path):
    """An older database whose merges stored the secret: reads, exports, copies mask it, and
    redact_origin (what the data migration calls) cleans the stored text."""
    with secret_source.engine.begin() as connection:
        connection.execute(text("UPDATE tuning_records SET origin = :o"),
                           {"o": f"merge sqlite:////srv/t.sqlite?password={QPW}&token={TOKEN}"})
    assert QPW in "".join(_stored_origins(secret_source))
    assert_clean("".join(r.origin for r in secret_source.records()))
    assert_clean("".join(r.origin for w in secret_source.workloads()
                         for r in secret_source.top_records(w.id, 5)))
    path = tmp_path / "old.jsonl"
    transfer.export_jsonl(secret_source, path)
    assert_clean(path.read_text())
    assert "password=***" in path.read_text()
    assert_clean("".join(redact_origin(o) for o in _stored_origins(secret_source)))
    # A records file that carries such an origin, imported: nothing secret is stored.
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    for line in lines:
        if line.get("type") == "record":
            line["origin"] = f"merge x://u:{PW}@h?token={TOKEN}"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    dest = Storage(f"sqlite:///{tmp_path / 'dest.sqlite'}")
    records.import_file(dest, path)
    assert_clean("".join(_stored_origins(dest)))


def test_the_upgrade_scrubs_origins_older_merges_stored(db_url):
    """Revision 0003 cleans the origins of a 0002 database with redact_origin."""
    from tuning_db import schema

    bare = Storage(db_url, check_schema=False)
    schema.upgrade(bare.engine, bare.display_url, "0002")
    dirty = [f"merge sqlite:////srv/t.sqlite?password={QPW}&token={TOKEN}",
             f"merge postgresql://u:***@h/db?sslmode=require&sslpassword={SSLPW}",
             "tune", "import records.jsonl"]
    meta = sa.MetaData()
    workloads = sa.Table("workloads", meta, autoload_with=bare.engine)
    record_table = sa.Table("tuning_records", meta, autoload_with=bare.engine)
    with bare.engine.begin() as connection:
        wid = connection.execute(workloads.insert().values(
            digest="w" * 64, name="demo", family="uniform", spec_digest="s" * 64, spec_json="{}",
            target_key="t" * 64, target_json="{}", mod_hash="1", mod_json="[]",
        )).inserted_primary_key[0]
        for number, origin in enumerate(dirty):
            connection.execute(record_table.insert().values(
                digest=f"{number}" * 64, workload_id=wid, status="ok", mean_us=1.0,
                run_secs_json="[1e-06]", trace_json="[]", args_info_json="[]", target_json="{}",
                host="h", device_model="cpu", tvm_version="0.27.0", tvm_ffi_version="0.1",
                qcompile_version="0.1", user="alice", origin=origin))
    schema.upgrade(bare.engine, bare.display_url)
    stored = _stored_origins(bare)
    assert_clean("".join(stored))
    assert sorted(stored) == sorted([redact_origin(o) for o in dirty])
    assert "tune" in stored and "merge sqlite:////srv/t.sqlite?password=***&token=***" in stored


@pytest.mark.filterwarnings("ignore:Query string argument")
def test_layers_describe_and_the_record_source(secret_source, tmp_path):
    from qcompile.trust.workloads import workload_database
    from tuning_db.layers import open_layers

    local = f"sqlite:///{tmp_path / 'local.sqlite'}"
    Storage(local).close()
    layers = open_layers(secret_source.url, readonly=True, local_url=local)
    assert len(layers.readers) == 2
    described = layers.describe()
    assert_clean(described)
    assert "password=***" in described and "(read-only)" in described
    mod = _tvm.normalize_mod(compute_for(SPEC, "cpu"))
    _, best = workload_database(layers.writer, SPEC, _target(), readers=layers.readers).best(mod)
    assert_clean(best.database)


@pytest.mark.filterwarnings("ignore:Query string argument")
def test_schema_upgrade_command_is_never_a_url_with_stars(tmp_path):
    from tuning_db import schema

    url = _secret_sqlite(tmp_path / "old.sqlite")
    bare = Storage(url, check_schema=False)
    schema.upgrade(bare.engine, bare.display_url, schema.REVISIONS[0])
    with pytest.raises(DatabaseError) as error:
        Storage(url)
    message = str(error.value)
    assert_clean(message)
    assert "Run: qcompile db upgrade --db URL, where URL is sqlite:///" in message, message
    assert "--db '" not in message
    plain = f"sqlite:///{tmp_path / 'plain.sqlite'}"
    bare = Storage(plain, check_schema=False)
    schema.upgrade(bare.engine, bare.display_url, schema.REVISIONS[0])
    with pytest.raises(DatabaseError, match=f"Run: qcompile db upgrade --db {plain}"):
        Storage(plain)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:Query string argument")
def test_kernel_cache_hint_says_which_url_to_pass(tmp_path, avx2):
    from qcompile.kernel_cache import KernelCache

    url = _secret_sqlite(tmp_path / "empty.sqlite")
    with pytest.raises(NoRecordError) as error:
        KernelCache("avx2", db=url).get(SPEC)
    message = str(error.value)
    assert_clean(message)
    assert f"--target avx2 --db URL, where URL is {redact(url)} with the secrets" in message
    with pytest.warns(UserWarning) as caught:
        KernelCache("avx2", db=url, on_missing="untuned").get(SPEC)
    assert_clean(" ".join(str(w.message) for w in caught))
    plain = f"sqlite:///{tmp_path / 'plain.sqlite'}"
    with pytest.raises(NoRecordError, match=f"--target avx2 --db {plain}"):
        KernelCache("avx2", db=plain).get(SPEC)


# ---- every place a URL can appear, through the command line ----------------------------------


def _env(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    env.pop("QCOMPILE_DB", None)
    return env


def qcompile(tmp_path, *args, check=True, env=None):
    """Run ``python -m qcompile.cli``; no secret may appear on stdout or stderr, ever."""
    result = subprocess.run([sys.executable, "-m", "qcompile.cli", *args], cwd=ROOT,
                            env=env or _env(tmp_path), capture_output=True, text=True,
                            timeout=900)
    assert_clean(result.stdout + result.stderr)
    if check:
        assert result.returncode == 0, f"{args}:\n{result.stdout}\n{result.stderr}"
    return result


def _files_clean(path: Path) -> None:
    for file in [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file()):
        assert_clean(file.read_text(errors="replace"))


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:Query string argument")
def test_every_db_command_over_a_secret_sqlite_url(secret_source, tmp_path):
    url = secret_source.url
    info = qcompile(tmp_path, "db", "info", "--db", url).stdout
    assert "password=***" in info and "records    3 (3 ok)" in info
    assert NAME in qcompile(tmp_path, "db", "ls", "--db", url).stdout
    assert "us" in qcompile(tmp_path, "db", "best", "--top", "3", "--db", url).stdout
    out = tmp_path / "export.jsonl"
    assert "password=***" in qcompile(tmp_path, "db", "export", "--db", url, "--out",
                                      str(out)).stdout
    _files_clean(out)
    qcompile(tmp_path, "db", "export", "--db", url, "--format", "metaschedule", "--out",
             str(tmp_path / "ms"))
    _files_clean(tmp_path / "ms")
    other = _secret_sqlite(tmp_path / "other.sqlite")
    assert "imported 1 workloads, 3 records" in qcompile(
        tmp_path, "db", "import", str(out), "--db", other).stdout
    merged = qcompile(tmp_path, "db", "merge", "--db", other, "--from", url).stdout
    assert "merged 1 workloads, 3 records (3 already there)" in merged, merged
    third = _secret_sqlite(tmp_path / "third.sqlite")
    qcompile(tmp_path, "db", "merge", "--db", third, "--from", url)
    with pytest.warns(Warning):
        assert_clean("".join(_stored_origins(Storage(third))))
    assert "merge sqlite:///" in qcompile(tmp_path, "db", "best", "--db", third).stdout
    qcompile(tmp_path, "db", "prune", "--db", other, "--keep", "2", "--dry-run")
    assert "deleted 1 of 3" in qcompile(tmp_path, "db", "prune", "--db", other,
                                        "--keep", "2").stdout
    qcompile(tmp_path, "db", "upgrade", "--db", other)
    assert ": ok (schema" in qcompile(tmp_path, "db", "check", "--db", other).stdout
    # tune with enough records: 0 trials, its summary names the database
    reused = qcompile(tmp_path, "tune", *SPEC_ARGS, "--trials", "3", "--quiet", "--db", url)
    assert "0 trials, reused 3 records" in reused.stdout and "password=***" in reused.stdout


@pytest.mark.filterwarnings("ignore:Query string argument")
def test_out_of_date_database_through_the_cli(tmp_path):
    from tuning_db import schema

    url = _secret_sqlite(tmp_path / "old.sqlite")
    bare = Storage(url, check_schema=False)
    schema.upgrade(bare.engine, bare.display_url, schema.REVISIONS[0])
    info = qcompile(tmp_path, "db", "info", "--db", url, check=False)
    assert "qcompile db upgrade --db URL, where URL is" in info.stdout, info.stdout
    check = qcompile(tmp_path, "db", "check", "--db", url, check=False)
    assert check.returncode == 1 and "--db URL, where URL is" in check.stdout
    for command in (["db", "ls"], ["db", "best"], ["db", "prune", "--keep", "1"]):
        failed = qcompile(tmp_path, *command, "--db", url, check=False)
        assert failed.returncode == 2 and "--db URL, where URL is" in failed.stderr


@pytest.mark.parametrize("url", [
    f"postgresql://u:{PW}@h:notaport/db", f"postgresql://u:x@y{PW}@h:5432:9/db",
    f"postgresql+psycopg2://u:{PW}@127.0.0.1:1/db?password={QPW}&token={TOKEN}",
])
def test_unparseable_or_unreachable_urls_fail_without_their_secrets(url, tmp_path):
    for args in (["db", "info"], ["db", "merge", "--from", f"sqlite:///{tmp_path / 'x.sqlite'}"]):
        failed = qcompile(tmp_path, *args, "--db", url, check=False)
        assert failed.returncode == 2, failed.stderr
    failed = qcompile(tmp_path, "db", "merge", "--db", "sqlite://", "--from", url, check=False)
    assert failed.returncode == 2, failed.stderr


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:Query string argument")
def test_tune_and_build_over_a_secret_sqlite_url(tmp_path, avx2):
    url = _secret_sqlite(tmp_path / "tuned.sqlite")
    # (its exit status is the tuner's business: here only what it prints counts)
    tuned = qcompile(tmp_path, "tune", "--target", "avx2", "--shape", "128x64", "--group-size",
                     "32", "--trials", "2", "--db", url, check=False)
    assert f"stored    2 records in {redact(url)}" in tuned.stdout, tuned.stdout
    with pytest.warns(Warning):
        _fill(Storage(url))
    out = tmp_path / "kernels"
    built = qcompile(tmp_path, "build", *SPEC_ARGS, "--db", url, "--out", str(out))
    assert "built" in built.stdout
    _files_clean(out)
    manifest = json.loads((out / f"{NAME}.json").read_text())
    assert manifest["record"]["database"] == redact(url)
    missing = qcompile(tmp_path, "build", *SPEC_ARGS[:-2], "--group-size", "32", "--db", url,
                       "--out", str(out), check=False)
    assert missing.returncode == 2 and "no tuned record" in missing.stderr


# ---- the real servers ---------------------------------------------------------------------------


@pytest.fixture
def secret_postgres(postgres_url):
    """The test schema's URL with a userinfo password and secret parameters (trust auth
    ignores them, so it connects)."""
    return with_secrets(postgres_url, userinfo=PW, password=QPW, sslpassword=SSLPW)


MARIADB_URL = os.environ.get("QCOMPILE_TEST_MARIADB", "mysql+pymysql://root@127.0.0.1:3306/test")


@pytest.fixture
def mariadb_user():
    """(user, database) on the test MariaDB server: a user of its own whose password is PW,
    with every right on a database of its own."""
    name = f"qc_sec_{uuid.uuid4().hex[:10]}"
    engine = create_engine(MARIADB_URL)
    try:
        with engine.begin() as connection:
            connection.execute(text(f"CREATE DATABASE `{name}`"))
            connection.execute(text(f"CREATE USER '{name}'@'%' IDENTIFIED BY :pw"), {"pw": PW})
            connection.execute(text(f"GRANT ALL ON `{name}`.* TO '{name}'@'%'"))
    except Exception as error:  # noqa: BLE001
        engine.dispose()
        if os.environ.get("QCOMPILE_REQUIRE_MARIADB"):
            raise
        pytest.skip(f"MariaDB at {MARIADB_URL} unavailable: {error}")
    host = make_url(MARIADB_URL)
    yield name, f"{host.host}:{host.port or 3306}/{name}"
    with engine.begin() as connection:
        connection.execute(text(f"DROP USER '{name}'@'%'"))
        connection.execute(text(f"DROP DATABASE `{name}`"))
    engine.dispose()


@pytest.mark.filterwarnings("ignore:Query string argument")
def test_postgres_with_secrets_connects_and_never_shows_them(secret_postgres, secret_source,
                                                            tmp_path):
    qcompile(tmp_path, "db", "merge", "--db", secret_postgres, "--from", secret_source.url)
    info = qcompile(tmp_path, "db", "info", "--db", secret_postgres).stdout
    assert "postgres:***@" in info and "password=***" in info and "sslpassword=***" in info
    assert "options=-csearch_path%3Dqc_test_" in info, "non-secret parameters stay readable"
    assert_clean("".join(_stored_origins(Storage(secret_postgres))))
    best = qcompile(tmp_path, "db", "best", "--top", "3", "--db", secret_postgres).stdout
    assert "merge sqlite:///" in best and "password=***" in best
    out = tmp_path / "pg.jsonl"
    qcompile(tmp_path, "db", "export", "--db", secret_postgres, "--out", str(out))
    _files_clean(out)
    back = f"sqlite:///{tmp_path / 'back.sqlite'}"
    qcompile(tmp_path, "db", "merge", "--db", back, "--from", secret_postgres)
    origins = _stored_origins(Storage(back))
    assert_clean("".join(origins))
    assert origins[0].startswith("merge postgresql+psycopg2://postgres:***@127.0.0.1")
    qcompile(tmp_path, "db", "check", "--db", secret_postgres)


@pytest.mark.parametrize("change", ["no such database", "unreachable", "bad option"])
def test_postgres_failures_never_echo_the_secret(postgres_url, change, tmp_path):
    url = with_secrets(postgres_url, userinfo=PW, password=QPW, sslpassword=SSLPW)
    url = {"no such database": url.replace("/test?", "/qc_no_such_db?"),
           "unreachable": url.replace("127.0.0.1:5432", "127.0.0.1:1"),
           "bad option": f"{url}&token={TOKEN}"}[change]
    build = ["build", *SPEC_ARGS, "--out", str(tmp_path)]  # TVM's import: one case only
    for args in (["db", "info"], ["db", "ls"], *([build] if change == "unreachable" else [])):
        failed = qcompile(tmp_path, *args, "--db", url, check=False)
        assert failed.returncode == 2, failed.stderr
        assert failed.stderr.startswith("qcompile: error: tuning database postgresql")


@pytest.mark.filterwarnings("ignore:Query string argument")
@pytest.mark.parametrize("form", ["userinfo", "passwd", "password"])
def test_mariadb_with_a_real_password_never_shows_it(mariadb_user, form, secret_source, tmp_path):
    user, where = mariadb_user
    url = {"userinfo": f"mysql+pymysql://{user}:{PW}@{where}",
           "passwd": f"mysql+pymysql://{user}@{where}?passwd={PW}&charset=utf8mb4",
           "password": f"mariadb+pymysql://{user}@{where}?password={PW}"}[form]
    qcompile(tmp_path, "db", "merge", "--db", url, "--from", secret_source.url)
    info = qcompile(tmp_path, "db", "info", "--db", url).stdout
    assert "records    3 (3 ok)" in info and "***" in info
    assert "merge sqlite:///" in qcompile(tmp_path, "db", "best", "--db", url).stdout
    out = tmp_path / "mdb.jsonl"
    qcompile(tmp_path, "db", "export", "--db", url, "--out", str(out))
    _files_clean(out)
    back = f"sqlite:///{tmp_path / 'back.sqlite'}"
    qcompile(tmp_path, "db", "merge", "--db", back, "--from", url)
    origins = _stored_origins(Storage(back))
    assert_clean("".join(origins))
    assert all(o.startswith(f"merge {redact(url)}") for o in origins)
    # The wrong password, in each form: "Access denied", never the password.
    wrong = url.replace(PW, SSLPW)
    failed = qcompile(tmp_path, "db", "info", "--db", wrong, check=False)
    assert failed.returncode == 2 and "Access denied" in failed.stderr, failed.stderr
    assert_clean(failed.stderr)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:Query string argument")
def test_build_from_secret_shared_databases_writes_no_secret(secret_postgres, mariadb_user,
                                                            secret_source, tmp_path, avx2):
    user, where = mariadb_user
    mariadb = f"mysql+pymysql://{user}@{where}?passwd={PW}"
    for url in (secret_postgres, mariadb):
        qcompile(tmp_path, "db", "merge", "--db", url, "--from", secret_source.url)
        out = tmp_path / make_url(url).get_backend_name()
        built = qcompile(tmp_path, "build", *SPEC_ARGS, "--db", url, "--db-readonly", "--out",
                         str(out))
        assert "0 trials: the record comes from" in built.stdout
        _files_clean(out)
        manifest = json.loads((out / f"{NAME}.json").read_text())
        assert manifest["record"]["database"] == redact(url) and MASK in redact(url)
