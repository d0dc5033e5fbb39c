"""``qcompile db``: look after a tuning database (a team's shared one, or your local one).

    qcompile db info    [--db URL]                     backend, schema revision, counts, who tuned
    qcompile db ls      [--db URL] [filters]           a line per workload
    qcompile db best    [--db URL] [filters] [--top K] the fastest records, with provenance
    qcompile db export  [--db URL] --out PATH [--format jsonl|metaschedule] [--name S]
    qcompile db export  [--db URL] --out PATH --pack NAME [--target T] [--name S]   a record pack
    qcompile db packs   [--dir DIR] [--verbose]        the record packs qcompile ships
    qcompile db import  [--db URL] PATH [--format auto|jsonl|metaschedule]
    qcompile db prune   [--db URL] --keep K [--dry-run]
    qcompile db merge   [--db URL] --from URL [--name S]
    qcompile db verify  [--db URL] [filters] [--top K] measure the fastest records here, seal
    qcompile db upgrade [--db URL]                     run the schema migrations
    qcompile db check   [--db URL]                     schema revision and integrity

URLs are printed with their password and secret parameters masked, always
(:func:`tuning_db.url.redact`).

Light: ``tuning_db`` and ``qcompile.trust`` (SQLAlchemy, most of a second) are imported by the
commands that use them, so that ``qcompile --help`` and argument errors answer at once.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import targets
from qcompile._version import __version__
from qcompile.cli_args import check_output_dir, check_output_file, positive_int
from qcompile.errors import DatabaseError, UsageError

#: ``--db``'s help: the URL forms, the drivers they get, the default.
DB_HELP = ("SQLAlchemy URL of the tuning database: sqlite:////path/tuning.sqlite (its directory "
           "must exist), postgresql://user@host/db, mysql://user@host/db or "
           "mariadb://user@host/db (written without a driver they use the psycopg2 and pymysql "
           "drivers that ship with qcompile). Default: $QCOMPILE_DB, else "
           "$XDG_CACHE_HOME/qcompile/tuning.sqlite ($XDG_CACHE_HOME defaults to ~/.cache; the "
           "directory is created)")


def add_db_argument(parser: argparse.ArgumentParser) -> None:
    """Add ``--db URL`` (:data:`DB_HELP`) to a command's parser."""
    parser.add_argument("--db", metavar="URL", default=None, help=DB_HELP)


def add_layer_arguments(parser: argparse.ArgumentParser) -> None:
    """``--db-readonly`` (and ``--force`` for tune) beside a command's ``--db``."""
    parser.add_argument("--db-readonly", action="store_true",
                        help="open --db read-only: read records from it, write new ones to the "
                             "local database ($XDG_CACHE_HOME/qcompile/tuning.sqlite, "
                             "$XDG_CACHE_HOME defaulting to ~/.cache)")


def open_layers(args: argparse.Namespace, *, packs: bool = False, names=None):
    """The shared database of ``--db`` (or $QCOMPILE_DB) layered over the local one; with
    ``packs``, the shipped record packs below both (read-only; ``$QCOMPILE_PACKS=0``: none),
    those holding one of the workloads ``names`` where given."""
    from tuning_db.layers import open_layers as _open

    layers = _open(args.db, readonly=getattr(args, "db_readonly", False))
    if packs:
        from qcompile.trust.packs import pack_layer

        # this target's packs only, and of those the ones holding a workload the command needs
        shipped = pack_layer(preset=targets.get(args.target), names=names)
        if shipped is not None:
            layers.readers.append(shipped)
            layers.packs = shipped
    return layers


def _storage(args, *, readonly: bool = False, check_schema: bool = True):
    from tuning_db import Storage

    return Storage(args.db, readonly=readonly, check_schema=check_schema)


def _target_label(target_json: str) -> str:
    """The target as the user typed it: the preset, with a CPU target's cores
    (``avx2 (2 cores)``)."""
    return targets.preset_label(json.loads(target_json))


def _tvm_label(target_json: str) -> str:
    """The target as TVM names it (``llvm core-avx2 2c``, ``cuda sm_90``)."""
    target = json.loads(target_json)
    detail = target.get("mcpu") or target.get("arch") or ""
    cores = target.get("num-cores")
    return " ".join(str(p) for p in (target.get("kind"), detail, f"{cores}c" if cores else "") if p)


def _matches(summary, args) -> bool:
    if args.name and args.name not in summary.name:
        return False
    if args.family and summary.family != args.family:
        return False
    return not (args.target and args.target not in _target_label(summary.target_json)
                and args.target not in _tvm_label(summary.target_json))


def cmd_info(args: argparse.Namespace) -> int:
    from tuning_db import schema
    from tuning_db.models import STATUS_OK

    storage = _storage(args, check_schema=False)
    revision = storage.schema_revision()
    print(f"database   {storage.display_url}")
    print(f"backend    {storage.dialect}")
    state = "current" if revision == schema.HEAD else f"needs {schema.HEAD}: " + \
        schema.upgrade_command(storage.display_url)
    print(f"schema     {revision or 'empty'} ({state})")
    if revision != schema.HEAD:
        return 1
    print(f"workloads  {storage.count_workloads()}")
    ok = storage.count_records(status=STATUS_OK)
    print(f"records    {storage.count_records()} ({ok} ok)")

    for user, host, device, count, newest in storage.contributors():
        print(f"  {count:6d} by {user or '?'}@{host or '?'} ({device or '?'}), newest {newest}")
    return 0


def cmd_ls(args: argparse.Namespace) -> int:
    storage = _storage(args)
    summaries = [s for s in storage.summaries() if _matches(s, args)]
    if not summaries:
        print(f"no workloads in {storage.display_url}")
        return 0
    print(f"{'workload':44s} {'target':18s} {'records':>8s} {'ok':>5s} {'best us':>10s}")
    for s in summaries:
        best = f"{s.best_us:10.1f}" if s.best_us is not None else f"{'-':>10s}"
        print(f"{s.name:44s} {_target_label(s.target_json):18s} {s.records:8d} "
              f"{s.ok_records:5d} {best}")
    return 0


def cmd_best(args: argparse.Namespace) -> int:
    storage = _storage(args)
    summaries = {s.digest: s for s in storage.summaries() if _matches(s, args)}
    shown = 0
    for workload in storage.workloads():
        if workload.digest not in summaries:
            continue
        records = storage.top_records(workload.id, args.top)
        if not records:
            continue
        print(f"{workload.name}  [{_target_label(workload.target_json)}]  "
              f"workload {workload.digest[:12]}")
        for r in records:
            print(f"  record {r.id:<7d} {r.mean_us:10.2f} us   {r.user or '?'}@{r.host or '?'} "
                  f"({r.device_model or '?'}), TVM {r.tvm_version or '?'}, qcompile "
                  f"{r.qcompile_version or '?'}, {r.created_at}, {r.origin or 'tune'}")
        shown += 1
    if not shown:
        print(f"no successful records match in {storage.display_url}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from tuning_db import transfer

    (check_output_file if args.format == "jsonl" else check_output_dir)(args.out)
    storage = _storage(args)
    if args.pack:
        return _export_pack(args, storage)
    if args.target:
        raise UsageError("--target selects a pack's records: give --pack NAME with it")
    if args.format == "metaschedule":
        count = transfer.export_metaschedule(storage, args.out, name=args.name)
    else:
        count = transfer.export_jsonl(storage, args.out, name=args.name)
    print(f"exported {count.line()} from {storage.display_url} to {args.out} ({args.format})")
    return 0


def _export_pack(args: argparse.Namespace, storage) -> int:
    from tuning_db.record_packs import write_pack

    if args.format != "jsonl":
        raise UsageError("a pack is JSON lines: --pack takes --format jsonl")

    def target_ok(target_json: str) -> bool:
        return not args.target or args.target in _target_label(target_json) \
            or args.target in _tvm_label(target_json)

    count = write_pack(storage, args.out, name=args.pack, target_label=_target_label,
                       name_filter=args.name, target_filter=target_ok,
                       qcompile_version=__version__)
    print(f"packed {count.line()} from {storage.display_url} into {args.out} (pack "
          f"{args.pack!r}: the fastest record of each workload)")
    return 0


def cmd_packs(args: argparse.Namespace) -> int:
    from qcompile.trust.packs import PACKS_ENV, packs_dir, packs_enabled
    from tuning_db.record_packs import shipped_packs

    where = Path(args.dir) if args.dir else packs_dir()
    packs = shipped_packs(where)
    if not packs:
        print(f"no record packs in {where}")
        return 0
    print(f"record packs in {where} (qcompile build reads them below your databases"
          + ("" if packs_enabled() else f"; off: ${PACKS_ENV}=0") + "):")
    print(f"  {'name':32s} {'target':18s} {'device model':34s} {'workloads':>9s} "
          f"{'sealed':>6s}  made")
    for pack in packs:
        print(f"  {pack.name:32s} {pack.target:18s} {pack.device_model[:34]:34s} "
              f"{pack.workloads:9d} {pack.sealed:3d}/{pack.records:<2d}  "
              f"{pack.created_at[:10]} (qcompile {pack.qcompile_version})")
        if args.verbose:
            from tuning_db import transfer

            for _, line in transfer.read_jsonl(pack.path):
                if isinstance(line, dict) and line.get("type") == "workload":
                    print(f"      {line.get('name')}")
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    from qcompile.trust import records

    path = Path(args.path)
    if not path.exists():
        raise DatabaseError(f"nothing to import: {path} does not exist")
    storage = _storage(args)
    count = _report_refusals(lambda: records.import_file(storage, path, args.format))
    print(f"imported {count.line()} from {path} into {storage.display_url} (provenance "
          "claimed: build re-measures these records before it believes their latency)")
    return 0


def _report_refusals(work):
    """Run an import or merge; when it is refused, list every problem on stderr before the
    error line."""
    import sys

    from qcompile.trust.records import ImportRefused

    try:
        return work()
    except ImportRefused as error:
        for problem in error.problems:
            print(f"  refused: {problem}", file=sys.stderr)
        raise


def cmd_prune(args: argparse.Namespace) -> int:
    storage = _storage(args, readonly=args.dry_run)
    before = storage.count_records()
    removed = storage.prune(args.keep, dry_run=args.dry_run)
    verb = "would delete" if args.dry_run else "deleted"
    print(f"{verb} {removed} of {before} records in {storage.display_url} "
          f"(kept the {args.keep} fastest per workload and target)")
    return 0


def cmd_merge(args: argparse.Namespace) -> int:
    from qcompile.trust import records
    from tuning_db import Storage

    source = Storage(args.source, readonly=True)
    dest = _storage(args)
    count = _report_refusals(lambda: records.merge(source, dest, name=args.name))
    print(f"merged {count.line()} from {source.display_url} into {dest.display_url} "
          "(provenance claimed: build re-measures these records before it believes them)")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from qcompile.trust.seals import Sealer
    from qcompile.trust.verify import verify

    storage = _storage(args)
    key = Sealer.load()
    signer = key.names[key.signing_id]
    results = verify(storage, name=args.name, family=args.family, target=args.target,
                     top=args.top)
    if not results:
        print(f"nothing to verify in {storage.display_url}: no workload for a target this host "
              "runs matches")
        return 0
    for r in results:
        if r.skipped:
            print(f"{r.name:44s} {r.target:8s} skipped: {r.skipped}")
            continue
        best = f"{r.best_us:.1f} us" if r.best_us is not None else "-"
        failed = f", {r.failed} failed here" if r.failed else ""
        print(f"{r.name:44s} {r.target:8s} measured {r.measured} records{failed}, best {best}")
    print(f"sealed with the {signer}; stored in {storage.display_url}")
    return 0


def cmd_upgrade(args: argparse.Namespace) -> int:
    storage = _storage(args, check_schema=False)
    before, after = storage.upgrade_schema()
    if before == after:
        print(f"{storage.display_url}: schema already at revision {after}")
    else:
        print(f"{storage.display_url}: schema upgraded from {before or 'empty'} to {after}")
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    from tuning_db import schema

    storage = _storage(args, check_schema=False)
    revision = storage.schema_revision()
    if revision != schema.HEAD:
        print(f"{storage.display_url}: schema revision {revision or 'empty'}, needs "
              f"{schema.HEAD}; run: {schema.upgrade_command(storage.display_url)}")
        return 1
    problems = storage.integrity_problems()
    for problem in problems:
        print(f"{storage.display_url}: {problem}")
    if problems:
        return 1
    print(f"{storage.display_url}: ok (schema {revision}, {storage.count_workloads()} workloads, "
          f"{storage.count_records()} records)")
    return 0


def add_db_commands(db_sub) -> None:
    """The ``qcompile db`` subcommands, on the ``db`` parser's subparsers."""

    def filters(parser):
        parser.add_argument("--name", default=None, help="workload names containing this")
        parser.add_argument("--family", default=None, help="this kernel family only")
        parser.add_argument("--target", default=None,
                            help="targets whose preset or TVM name contains this (e.g. avx2, "
                                 "core-avx2, sm_90)")

    p = db_sub.add_parser("info", help="backend, schema revision, counts, who tuned")
    add_db_argument(p)
    p.set_defaults(func=cmd_info)

    p = db_sub.add_parser("ls", help="a line per workload: name, target, records, best us")
    add_db_argument(p)
    filters(p)
    p.set_defaults(func=cmd_ls)

    p = db_sub.add_parser("best", help="the fastest records per workload, with provenance")
    add_db_argument(p)
    filters(p)
    p.add_argument("--top", type=positive_int, default=1, metavar="K",
                   help="records per workload")
    p.set_defaults(func=cmd_best)

    p = db_sub.add_parser("export", help="write records to JSON lines or a MetaSchedule "
                                         "JSONDatabase directory")
    add_db_argument(p)
    p.add_argument("--out", required=True, metavar="PATH",
                   help="a .jsonl file, or a directory for --format metaschedule")
    p.add_argument("--format", choices=("jsonl", "metaschedule"), default="jsonl")
    p.add_argument("--name", default=None, help="workload names containing this")
    p.add_argument("--pack", default=None, metavar="NAME",
                   help="write a record pack: the fastest record of each workload, one target "
                        "and device model, with a header naming them (qcompile db packs)")
    p.add_argument("--target", default=None,
                   help="with --pack: targets whose preset or TVM name contains this")
    p.set_defaults(func=cmd_export)

    p = db_sub.add_parser("packs", help="the record packs qcompile ships (build reads them "
                                        "when your databases have no record)")
    p.add_argument("--dir", default=None,
                   help="list the packs of this directory (default $QCOMPILE_PACKS_DIR, else "
                        "the shipped ones)")
    p.add_argument("--verbose", action="store_true", help="each pack's workloads too")
    p.set_defaults(func=cmd_packs)

    p = db_sub.add_parser("import", help="add records from JSON lines or a MetaSchedule "
                                         "JSONDatabase (idempotent)")
    add_db_argument(p)
    p.add_argument("path", metavar="PATH",
                   help="a .jsonl export, or a JSONDatabase directory (or either of its files)")
    p.add_argument("--format", choices=("auto", "jsonl", "metaschedule"), default="auto")
    p.set_defaults(func=cmd_import)

    p = db_sub.add_parser("prune", help="keep the K fastest records per workload and target")
    add_db_argument(p)
    p.add_argument("--keep", type=positive_int, required=True, metavar="K",
                   help="records to keep per workload and target (at least 1)")
    p.add_argument("--dry-run", action="store_true", help="count, delete nothing")
    p.set_defaults(func=cmd_prune)

    p = db_sub.add_parser("merge", help="copy every record of another database into this one")
    add_db_argument(p)
    p.add_argument("--from", dest="source", required=True, metavar="URL",
                   help="the database to copy from (opened read-only)")
    p.add_argument("--name", default=None, help="workload names containing this")
    p.set_defaults(func=cmd_merge)

    p = db_sub.add_parser("verify", help="measure the fastest records here and seal them, so "
                                         "builds on this machine type believe them")
    add_db_argument(p)
    p.add_argument("--name", default=None, help="workload names containing this")
    p.add_argument("--family", default=None, help="this kernel family only")
    p.add_argument("--target", default=None, help="this target preset only (e.g. avx2)")
    p.add_argument("--top", type=positive_int, default=3, metavar="K",
                   help="records per workload to measure (default 3)")
    p.set_defaults(func=cmd_verify)

    p = db_sub.add_parser("upgrade", help="migrate the schema to this qcompile's revision")
    add_db_argument(p)
    p.set_defaults(func=cmd_upgrade)

    p = db_sub.add_parser("check", help="schema revision and integrity (exit 1 on a problem)")
    add_db_argument(p)
    p.set_defaults(func=cmd_check)
