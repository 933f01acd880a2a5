"""``engram backup [list|prune]`` and ``engram restore --from DIR [--to TIME]``
(docs/backups.md).

``engram backup`` takes a base backup of the database engram uses (the home's
embedded server, started for the command if ``engram up`` is not running; or
``DATABASE_URL``'s, given replication rights) into ``ENGRAM_BACKUP_DIR`` (or
``--dir``), then prunes per ``ENGRAM_BACKUP_KEEP``. The WAL archive is filled by
the server itself once ``engram up`` runs with ``ENGRAM_BACKUP_DIR`` set."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from engram.store import backup as backups
from engram.store.errors import ConfigError, InvalidRequestError
from engram.store.ledger import ForgetLedger
from engram.worker.settings import Settings

from . import exits
from .args import json_flag
from .database import command_database
from .output import fields, print_json, table
from .restore import WITHOUT_LEDGER, run_restore


def _dir(settings: Settings, args: argparse.Namespace) -> Path:
    chosen = args.dir or settings.backup_dir
    if chosen is None:
        raise ConfigError("no backup folder: set ENGRAM_BACKUP_DIR, or pass --dir")
    return Path(chosen)


def cmd_backup(settings: Settings, args: argparse.Namespace) -> int:
    folder = _dir(settings, args)
    backups.parse_keep(settings.backup_keep)  # a bad setting stops us before the backup
    with command_database(settings, "engram backup", create=False) as dsn:
        info = backups.base_backup(
            dsn, folder, keep=settings.backup_keep, ledger=ForgetLedger(settings.ledger_dir)
        )
    if args.json:
        print_json(info.as_dict())
        return exits.OK
    sys.stdout.write(
        fields(
            [
                ("backup", info.label),
                ("path", info.path),
                ("size", f"{info.size_bytes / 1e6:.1f} MB"),
                ("seconds", info.seconds),
            ]
        )
    )
    return exits.OK


def cmd_list(settings: Settings, args: argparse.Namespace) -> int:
    found = backups.list_backups(_dir(settings, args))
    if args.json:
        print_json([b.as_dict() for b in found])
        return exits.OK
    sys.stdout.write(
        table(
            ("BACKUP", "FINISHED", "SIZE", "FIRST WAL", "PATH"),
            (
                (b.label, b.finished_at, f"{b.size_bytes / 1e6:.1f} MB", b.start_wal, b.path)
                for b in found
            ),
        )
    )
    return exits.OK


def cmd_prune(settings: Settings, args: argparse.Namespace) -> int:
    removed = backups.prune(_dir(settings, args), settings.backup_keep)
    if args.json:
        print_json({"removed": removed})
    else:
        names = f": {', '.join(removed)}" if removed else ""
        print(f"removed {len(removed)} base backup(s){names}")
    return exits.OK


DISCARD = "engram restore --discard-previous"


def cmd_restore(settings: Settings, args: argparse.Namespace) -> int:
    if args.source is None:
        if not args.discard_previous:
            raise InvalidRequestError(
                "engram restore needs --from BACKUP; or --discard-previous alone, to remove"
                " the databases earlier restores set aside"
            )
        return _discard(settings, args)
    archive = Path(args.archive) if args.archive else None
    report = run_restore(
        settings, Path(args.source), args.to, archive, without_ledger=args.without_ledger
    )
    out = report.as_dict()
    if report.ledger == WITHOUT_LEDGER:
        print(
            f"engram: WARNING: restored without a forget ledger covering {report.backup}:"
            " a record forgotten since that backup may be back (the audit row"
            " database.restore says so). If the ledger turns up, run `engram forgets"
            " replay --ledger DIR` before anything serves",
            file=sys.stderr,
        )
    if not report.archiving.startswith(("on", "off")):
        print(f"engram: WARNING: WAL archiving: {report.archiving}", file=sys.stderr)
    if args.discard_previous:
        out["previous_databases_removed"] = [
            s.path for s in backups.discard_set_aside(settings.home)
        ]
    kept = backups.set_aside_databases(settings.home)
    if args.json:
        print_json({**out, "set_aside_databases": [s.as_dict() for s in kept]})
        return exits.OK
    sys.stdout.write(fields(list(out.items())))
    if kept:
        total = sum(s.size_bytes for s in kept)
        print(
            f"engram: {len(kept)} database(s) set aside by restores in ENGRAM_HOME"
            f" ({total / 1e6:.1f} MB; {', '.join(s.path for s in kept)}). Each still holds"
            " what it held, forgotten texts too: once you have checked the restored one,"
            f" remove them with `{DISCARD}`",
            file=sys.stderr,
        )
    return exits.OK


def _discard(settings: Settings, args: argparse.Namespace) -> int:
    removed = backups.discard_set_aside(settings.home)
    if args.json:
        print_json({"removed": [s.as_dict() for s in removed]})
    else:
        total = sum(s.size_bytes for s in removed)
        names = f": {', '.join(s.path for s in removed)}" if removed else ""
        print(f"removed {len(removed)} set-aside database(s), {total / 1e6:.1f} MB{names}")
    return exits.OK


def _also_here(parser: argparse.ArgumentParser) -> None:
    """``--dir`` and ``--json`` after the subcommand too (before it, they are backup's)."""
    parser.add_argument("--dir", default=argparse.SUPPRESS, help="default: ENGRAM_BACKUP_DIR")
    parser.add_argument("--json", action="store_true", default=argparse.SUPPRESS)


def register(sub: Any) -> None:
    backup = sub.add_parser(
        "backup", help="take a base backup into ENGRAM_BACKUP_DIR; list: the backups there"
    )
    backup.add_argument("--dir", default=None, help="default: ENGRAM_BACKUP_DIR")
    json_flag(backup)
    backup.set_defaults(run=cmd_backup)
    what = backup.add_subparsers(dest="what")
    listing = what.add_parser("list", help="the base backups, oldest first")
    _also_here(listing)
    listing.set_defaults(run=cmd_list)
    prune = what.add_parser("prune", help="apply ENGRAM_BACKUP_KEEP now (backup does it too)")
    _also_here(prune)
    prune.set_defaults(run=cmd_prune)
    restore = sub.add_parser(
        "restore",
        help="the home's database back to a backup or a time, the forget ledger re-applied",
    )
    restore.add_argument(
        "--from",
        dest="source",
        default=None,
        help="a backup folder (ENGRAM_BACKUP_DIR: its newest fitting backup) or one backup",
    )
    restore.add_argument(
        "--discard-previous",
        action="store_true",
        help="remove the databases restores set aside in ENGRAM_HOME (after this restore,"
        " or alone, without --from)",
    )
    restore.add_argument(
        "--to",
        default=None,
        help="an ISO 8601 time (UTC unless it says), or latest; default: the backup itself",
    )
    restore.add_argument(
        "--archive",
        default=None,
        help="the WAL archive to replay (default: the backup folder's wal, or the one"
        " the backup's backup.json names)",
    )
    restore.add_argument(
        "--without-ledger",
        action="store_true",
        help="restore even when no forget ledger covers the backup (a forgotten record may"
        " come back: said in the output and the audit)",
    )
    json_flag(restore)
    restore.set_defaults(run=cmd_restore)
