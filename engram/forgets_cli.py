"""``engram forgets replay|check``: the forget ledger against a database (store.ledger).

``replay`` forgets again what the ledger lists and the database does not know as
forgotten, and revokes again the tokens it lists as revoked (after restoring a
backup with tools of your own: docs/backups.md); ``--dry-run`` only counts, and
finds the lines the real run would refuse. A refused line is named and skipped,
the rest applied; either run then exits 1. ``check`` compares the ledger with the
tombstones and revoked tokens and, with ``--repair``, appends those it lacks; it
exits 1 while some are missing or lines are damaged, so that a schedule can alert
on it."""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from engram.store.env import parse_duration
from engram.store.errors import InvalidRequestError
from engram.store.ledger import REVOCATIONS, ForgetLedger
from engram.store.ledger_replay import check, replay
from engram.worker.settings import Settings

from . import exits
from .args import json_flag
from .database import open_store
from .output import fields, print_json


def since_arg(text: str | None, now: datetime | None = None) -> datetime | None:
    """``--since``: an ISO 8601 time (UTC unless it says), or a duration back from now
    (``36h``, ``7d``)."""
    if text is None:
        return None
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        try:
            back_s = parse_duration(text)
        except ValueError:
            raise InvalidRequestError(
                f"--since: {text!r} is neither an ISO 8601 time nor a duration such as 36h"
            ) from None
        return (now or datetime.now(UTC)) - timedelta(seconds=back_s)
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


def _ledger(settings: Settings, args: argparse.Namespace) -> ForgetLedger:
    return ForgetLedger(Path(args.ledger)) if args.ledger else settings.ledger()


def cmd_replay(settings: Settings, args: argparse.Namespace) -> int:
    since = since_arg(args.since)
    ledger = _ledger(settings, args)
    if not ledger.files(since) and not ledger.files(since, REVOCATIONS):
        print(f"engram: no forget ledger files in {ledger.directory}", file=sys.stderr)
    with open_store(settings, "engram forgets replay") as store:
        result = replay(store, ledger, since=since, dry_run=args.dry_run)
    if args.json:
        print_json(result.as_dict())
    else:
        would = "would be " if result.dry_run else ""
        sys.stdout.write(
            fields(
                [
                    ("in the ledger", result.in_ledger),
                    ("already forgotten", result.already_forgotten),
                    (f"{would}forgotten again", result.reapplied),
                    (f"{would}tombstoned (never in this database)", result.tombstoned),
                    (f"tokens {would}revoked again", result.tokens_revoked),
                    (f"refused lines ({would}skipped)", result.failed),
                    ("erased from the files (VACUUM)", result.erased),
                    ("damaged ledger lines", result.damaged_lines),
                    ("another database's lines (left alone)", result.other_databases),
                    ("this database", result.database),
                ]
            )
        )
    for why in result.refused_at:
        print(f"engram: ledger line refused, skipped: {why}", file=sys.stderr)
    if result.failed > len(result.refused_at):
        more = result.failed - len(result.refused_at)
        print(f"engram: ... and {more} more refused (each in the log)", file=sys.stderr)
    return exits.REFUSED if result.failed else exits.OK


def cmd_check(settings: Settings, args: argparse.Namespace) -> int:
    ledger = _ledger(settings, args)
    with open_store(settings, "engram forgets check") as store:
        result = check(store, ledger, repair=args.repair)
    if args.json:
        print_json(result.as_dict())
    else:
        sys.stdout.write(
            fields(
                [
                    ("tombstones", result.tombstones),
                    ("in the ledger", result.in_ledger),
                    ("missing from the ledger", result.missing_from_ledger),
                    ("appended (repair)", result.repaired),
                    ("in the ledger, unknown here", result.unknown_to_store),
                    ("revoked tokens", result.revoked_tokens),
                    ("revocations missing from the ledger", result.revocations_missing),
                    ("damaged ledger lines", result.damaged_lines),
                    ("another database's lines", result.other_databases),
                    ("this database", result.database),
                ]
            )
        )
    return exits.OK if result.ok else exits.REFUSED


def register(sub: Any) -> None:
    forgets = sub.add_parser(
        "forgets", help="the forget ledger: replay it into a restored database, check it"
    )
    what = forgets.add_subparsers(dest="what", required=True)
    play = what.add_parser(
        "replay",
        help="forget again what the ledger lists and this database does not; revoke again"
        " the tokens it lists as revoked",
    )
    play.add_argument(
        "--since", default=None, help="only forgets from then: ISO 8601 time, or e.g. 7d back"
    )
    play.add_argument("--dry-run", action="store_true", help="count only; change nothing")
    play.set_defaults(run=cmd_replay)
    audit = what.add_parser(
        "check", help="the ledger against the database's tombstones and revoked tokens"
    )
    audit.add_argument(
        "--repair", action="store_true", help="append the tombstones and revocations it lacks"
    )
    audit.set_defaults(run=cmd_check)
    for p in (play, audit):
        p.add_argument(
            "--ledger",
            default=None,
            help="its directory (default: ENGRAM_FORGET_LEDGER_DIR, else ENGRAM_HOME/ledger)",
        )
        json_flag(p)
