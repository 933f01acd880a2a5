"""``engram pause|resume partition N|jobs`` and ``engram paused``: hold a partition's
operations in its stream, or the jobs in their queues, until resumed (``worker.pause``)."""

from __future__ import annotations

import argparse
import getpass
import sys
from contextlib import AbstractContextManager
from typing import Any

import redis

from engram.store.errors import InvalidRequestError
from engram.worker import layout
from engram.worker.admin import pause
from engram.worker.settings import Settings

from . import exits, jobs_redis
from .args import json_flag
from .database import open_redis, open_store
from .output import print_json, table


def _who(args: argparse.Namespace) -> str:
    return str(args.by or f"cli:{getpass.getuser()}")


def _partition(settings: Settings, args: argparse.Namespace) -> int | None:
    """The partition named, or ``None`` for the jobs."""
    if args.what != "partition":
        return None
    with open_redis(settings) as client:
        # A pause names a partition of the epoch the workers serve (``worker.layout``).
        served = layout.read(client, settings.worker.partitions).serving.partitions
    try:
        pause.check_partition(args.number, served)
    except ValueError as exc:
        raise InvalidRequestError(str(exc)) from None
    return int(args.number)


def _redis(settings: Settings, partition: int | None) -> AbstractContextManager[redis.Redis]:
    """A partition's pause is on the streams' Redis; the jobs' (RQ's suspension), on theirs."""
    return open_redis(settings) if partition is not None else jobs_redis.opened(settings)


def cmd_pause(settings: Settings, args: argparse.Namespace) -> int:
    number = _partition(settings, args)
    held = pause.Pause.now(_who(args), args.reason or "")
    with _redis(settings, number) as client, open_store(settings, "engram pause") as store:
        pause.hold(client, store.audit, number, held)
    if number is not None:
        print(f"partition {number} paused: its operations wait in its stream")
    else:
        print("jobs paused: no jobs worker takes a job until they are resumed")
    return exits.OK


def cmd_resume(settings: Settings, args: argparse.Namespace) -> int:
    number = _partition(settings, args)
    with _redis(settings, number) as client, open_store(settings, "engram resume") as store:
        was = pause.release(client, store.audit, _who(args), number, args.reason or "")
    what = "jobs" if number is None else f"partition {number}"
    print(f"{what} resumed" if was else f"{what} {'were' if number is None else 'was'} not paused")
    return exits.OK


def cmd_paused(settings: Settings, args: argparse.Namespace) -> int:
    with open_redis(settings) as client, jobs_redis.opened(settings) as jobs_client:
        state = pause.paused(client, jobs_client)
    if args.json:
        print_json(state.as_dict())
        return exits.OK
    rows = [
        [f"partition {n}", p.by, p.as_dict()["at"] or "", p.reason]
        for n, p in sorted(state.partitions.items())
    ]
    if state.jobs is not None:
        rows.append(["jobs", state.jobs.by, state.jobs.as_dict()["at"] or "", state.jobs.reason])
    if rows:
        sys.stdout.write(table(["paused", "by", "since", "reason"], rows))
    else:
        print("nothing is paused")
    return exits.OK


def register(sub: Any) -> None:
    for name, run, verb in (("pause", cmd_pause, "hold"), ("resume", cmd_resume, "release")):
        cmd = sub.add_parser(
            name, help=f"{verb} a partition's operations, or the jobs (`{name} partition N`)"
        )
        what = cmd.add_subparsers(dest="what", required=True)
        part = what.add_parser("partition", help=f"{name} one partition stream's consumption")
        part.add_argument("number", type=int, help="the partition, from 0")
        jobs = what.add_parser("jobs", help=f"{name} the jobs queues")
        for p in (part, jobs):
            p.add_argument("--reason", default="", help="why (kept in the audit trail)")
            p.add_argument("--by", default=None, help="who, in the audit trail (cli:<login>)")
            p.set_defaults(run=run)
    listing = sub.add_parser("paused", help="what is paused: partitions and the jobs")
    json_flag(listing)
    listing.set_defaults(run=cmd_paused)
