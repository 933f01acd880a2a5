"""``engram tokens create|list|revoke``: scoped access tokens for agents (store.tokens).

A token is bound to one exact scope and the capabilities given; its secret is
printed once, by ``create``, and only its hash is kept. ``create`` and
``revoke`` write their audit rows under ``--by`` (``cli:<login>`` by default);
``revoke`` appends to the forget ledger too, so that a restore keeps it."""

from __future__ import annotations

import argparse
import getpass
import sys
from datetime import UTC, datetime
from typing import Any

from engram.jobs.settings import parse_duration
from engram.store.errors import NotFoundError
from engram.store.tokens import CAPABILITIES
from engram.worker.admin.deadletters import check_why
from engram.worker.settings import Settings

from . import exits
from .args import json_flag, json_value, scope_arg
from .database import open_store
from .output import fields, print_json, table


def _who(args: argparse.Namespace) -> str:
    return str(args.by or f"cli:{getpass.getuser()}")


def _capabilities(text: str | None) -> list[str]:
    if text is None:
        return list(CAPABILITIES)
    return [c.strip() for c in text.split(",") if c.strip()]


def cmd_create(settings: Settings, args: argparse.Namespace) -> int:
    scope = json_value(args.scope, "--scope")
    can = _capabilities(args.can)
    expires_in_s = parse_duration(args.expires, "--expires") if args.expires else None
    with open_store(settings, "engram tokens create") as store:
        secret, grant = store.tokens.create(
            args.name, scope, can, expires_in_s, by=_who(args), why=check_why(args.reason)
        )
    expires = grant.expires_at.isoformat() if grant.expires_at else None
    if args.json:
        print_json(
            {
                "name": grant.name,
                "token": secret,
                "scope": grant.scope,
                "can": [c for c in CAPABILITIES if c in grant.can],
                "expires_at": expires,
            }
        )
        return exits.OK
    sys.stdout.write(
        fields(
            [
                ("name", grant.name),
                ("token", secret),
                ("scope", grant.scope),
                ("can", ", ".join(c for c in CAPABILITIES if c in grant.can)),
                ("expires at", expires or "never"),
            ]
        )
    )
    print(
        "the token is shown this once (engram keeps only its hash): "
        "send it as Authorization: Bearer <token>",
        file=sys.stderr,
    )
    return exits.OK


def cmd_list(settings: Settings, args: argparse.Namespace) -> int:
    with open_store(settings, "engram tokens list") as store:
        found = store.tokens.list()
    if args.json:
        print_json([t.as_dict() for t in found])
        return exits.OK
    rows = [
        [
            t.name,
            "revoked" if t.revoked_at else ("live" if t.live(_now()) else "expired"),
            ",".join(t.can),
            t.created_at,
            t.expires_at,
            t.last_used_at,
            t.scope.key,
        ]
        for t in found
    ]
    sys.stdout.write(
        table(["name", "state", "can", "created", "expires", "last used", "scope"], rows)
    )
    return exits.OK


def cmd_revoke(settings: Settings, args: argparse.Namespace) -> int:
    # The revocation goes to the ledger too: a restore of an older backup revokes it again.
    ledger = settings.ledger()
    with open_store(settings, "engram tokens revoke", ledger=ledger) as store:
        known = store.tokens.get(args.name)
        if known is None:
            raise NotFoundError(f"no token {args.name}")
        revoked = store.tokens.revoke(args.name, by=_who(args), why=check_why(args.reason))
    print(f"token {args.name} revoked" if revoked else f"token {args.name} was revoked already")
    return exits.OK


def _now() -> datetime:
    return datetime.now(UTC)


def register(sub: Any) -> None:
    tokens = sub.add_parser("tokens", help="scoped access tokens for agents: create, list, revoke")
    what = tokens.add_subparsers(dest="what", required=True)
    create = what.add_parser("create", help="a new token for one exact scope (printed once)")
    scope_arg(create)
    create.add_argument("--name", required=True, help="its name: the actor on what it does")
    create.add_argument(
        "--can",
        default=None,
        help=f"what it may do, comma-separated (default: all of {','.join(CAPABILITIES)})",
    )
    create.add_argument("--expires", default=None, help="e.g. 30d, 12h (default: never)")
    json_flag(create)
    create.set_defaults(run=cmd_create)
    listing = what.add_parser("list", help="every token, live or not (never a secret)")
    json_flag(listing)
    listing.set_defaults(run=cmd_list)
    revoke = what.add_parser("revoke", help="refuse a token from its next request on")
    revoke.add_argument("name")
    revoke.set_defaults(run=cmd_revoke)
    for p in (create, revoke):
        p.add_argument("--by", default=None, help="who, in the audit trail (cli:<login>)")
        p.add_argument("--reason", default=None, help="why (kept in the audit trail)")
