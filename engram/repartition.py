"""``engram repartition [P]``: change the number of partition streams online, or (without
``P``) print the layout in use (``worker.layout``). Each switch begun or taken up is
written to the audit trail (``layout.repartition``), with who (``cli:<os user>``)."""

from __future__ import annotations

import argparse
import getpass
import time
from typing import Any

import redis

from engram.store.audit import Audit
from engram.worker import layout
from engram.worker.admin.deadletters import check_why
from engram.worker.consuming.membership import live_workers
from engram.worker.embedded import runtime
from engram.worker.errors import RepartitionError
from engram.worker.layout import Layout
from engram.worker.settings import Settings

from . import exits
from .args import positive_float
from .database import open_store

# How often the command looks at the barrier while it waits.
_POLL_S = 0.2


def cmd_repartition(settings: Settings, args: argparse.Namespace) -> int:
    client = runtime.connect_redis(runtime.redis_url(settings))
    try:
        if args.partitions is None:
            return _show(client, settings)
        return _switch(client, settings, args)
    finally:
        client.close()


def _show(client: redis.Redis, settings: Settings) -> int:
    found = layout.stored(client)
    now = found or Layout.initial(settings.worker.partitions)
    where = "in Redis" if found else "configured: ENGRAM_PARTITIONS, no switch ever ran"
    print(f"{now.current.partitions} partitions, epoch {now.current.number} ({where})")
    if now.previous is not None:
        left = layout.undrained(client, now.previous)
        print(
            f"switching from {now.previous.partitions} partitions (epoch "
            f"{now.previous.number}): {len(left)} of them not yet closed and drained"
        )
    _tell_stranded(client, settings)
    return exits.OK


def _tell_stranded(client: redis.Redis, settings: Settings) -> None:
    """Entries in the streams of a replaced epoch, which no worker reads (names, counts)."""
    for stream, count in layout.stranded(client, settings.worker.partitions):
        print(f"{stream}: {count} entries no worker reads (sent there with a raw XADD)")


def _switch(client: redis.Redis, settings: Settings, args: argparse.Namespace) -> int:
    target = args.partitions
    found = layout.stored(client)
    if found is None:
        _check_workers_agree(client, settings)
    # Refused before the store is opened, and before anything is written.
    why = check_why(args.reason)
    layout.plan(found or Layout.initial(settings.worker.partitions), target)
    with open_store(settings, "engram repartition") as store:
        before, switching = layout.begin(client, target, settings.worker.partitions)
        _audit(store.audit, args, before, switching, why)
    old, new = switching.previous, switching.current
    assert old is not None
    if before == switching:
        print(f"taking up the switch to {new.partitions} partitions (epoch {new.number})")
    print(
        f"layout written: producers send to {new.partitions} partitions (epoch {new.number}); "
        f"the {old.partitions} partitions of epoch {old.number} are closed"
    )
    if args.no_wait:
        print(f"workers read epoch {new.number} once epoch {old.number} is drained")
        return exits.OK
    started = time.monotonic()
    deadline = started + args.timeout
    print(f"waiting for the workers to drain epoch {old.number}", flush=True)
    while True:
        now = layout.finish(client, layout.stored(client) or switching)
        if not now.switching:
            print(
                f"done: {now.current.partitions} partitions (epoch {now.current.number}), "
                f"drained in {time.monotonic() - started:.1f} s"
            )
            return exits.OK
        if time.monotonic() >= deadline:
            left = layout.undrained(client, old)
            print(
                f"epoch {old.number} still holds entries on {len(left)} partitions after "
                f"{args.timeout:g} s (are workers running? is a partition paused?); the "
                "switch goes on: workers finish it once they are drained. Run the command "
                "again to wait for it."
            )
            return exits.PENDING
        time.sleep(_POLL_S)


def _audit(
    audit: Audit, args: argparse.Namespace, before: Layout, switching: Layout, why: str | None
) -> None:
    old, new = switching.previous, switching.current
    assert old is not None
    detail: dict[str, int | bool | str] = {
        "from_epoch": old.number,
        "from_partitions": old.partitions,
        "to_epoch": new.number,
        "to_partitions": new.partitions,
        "taken_up": before == switching,  # a switch already under way, run again
    }
    if why is not None:
        detail["reason"] = why
    who = args.by or f"cli:{getpass.getuser()}"
    audit.record(who, "layout.repartition", f"epoch {new.number}", detail)


def _check_workers_agree(client: redis.Redis, settings: Settings) -> None:
    """Before the first switch the count is the configured one: refuse a command whose
    ENGRAM_PARTITIONS is not the running workers' (the old streams would be misread)."""
    counts = {
        int(w["partition_count"])
        for w in live_workers(client, settings.worker.lease_ttl_ms)
        if str(w.get("partition_count", "")).isdigit()
    }
    if counts - {settings.worker.partitions}:
        raise RepartitionError(
            f"ENGRAM_PARTITIONS is {settings.worker.partitions} here but live workers use "
            f"{', '.join(map(str, sorted(counts)))}: run the command with their setting"
        )


def register(sub: Any) -> None:
    cmd = sub.add_parser(
        "repartition",
        help="change the number of partition streams online (no number: print the layout)",
    )
    cmd.add_argument(
        "partitions", type=int, nargs="?", default=None, help="the new number of partitions"
    )
    cmd.add_argument(
        "--timeout",
        type=positive_float,
        default=600.0,
        help="seconds to wait for the workers to drain the old partitions (default 600)",
    )
    cmd.add_argument(
        "--no-wait",
        action="store_true",
        help="return once the switch has begun; the workers finish it",
    )
    cmd.add_argument("--by", default=None, help="who, in the audit trail (cli:<login>)")
    cmd.add_argument("--reason", default=None, help="why (kept in the audit trail)")
    cmd.set_defaults(run=cmd_repartition)
