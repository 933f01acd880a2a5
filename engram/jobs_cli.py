"""The jobs' commands: ``engram jobs``, ``jobs-health``, ``reembed``, ``prune``,
``demo-reembed``; and what the stream workers get from the jobs (their embedders;
their forget hook is ``jobs_redis.forget_hook``, with where the jobs live)."""

from __future__ import annotations

import argparse
import getpass
import json
import logging
import sys
from typing import Any

from engram.jobs import prune, reembed, runner
from engram.jobs.context import JobContext
from engram.jobs.settings import JobsSettings, parse_duration
from engram.store import Embedder, Store
from engram.store.vectors.embedders import EmbedderResolver
from engram.worker.admin import pause
from engram.worker.admin.deadletters import check_why
from engram.worker.embedded import runtime
from engram.worker.settings import Settings

from . import jobs_redis, wiring
from .args import positive_int
from .database import open_store, wait_for_store
from .following import follow

log = logging.getLogger(__name__)


# -- what the stream workers get from the jobs ---------------------------------------


def worker_embedders(
    settings: Settings, spec: str, store: Store
) -> tuple[EmbedderResolver, Embedder]:
    """The worker's embedders: ``spec`` until the store has a generation, then whichever
    model is active (followed across a switch); and the one to load at start."""
    registry = wiring.registry(settings)
    default = wiring.load_embedder(spec, registry)
    resolver = registry.resolver(default)
    active = store.embeddings.active()
    if active is None:
        return resolver, default
    return resolver, registry.for_model(active.model_id, active.dims)


# -- commands -------------------------------------------------------------------------


def cmd_jobs(settings: Settings, args: argparse.Namespace) -> int:
    ctx = _context(settings)
    try:
        rq_client = runner.rq_connection(jobs_redis.jobs_url(settings))
        return runner.run(ctx, rq_client, burst=args.burst)
    finally:
        ctx.store.close()
        ctx.client.close()
        if ctx.streams_redis is not None:
            ctx.streams_redis.close()


def cmd_jobs_health(settings: Settings, args: argparse.Namespace) -> int:
    """Exit 0 when a jobs worker on this host is alive (a container's health check)."""
    client = jobs_redis.connect(settings)
    try:
        here = runner.live_workers(client, here_only=True)
    finally:
        client.close()
    print(json.dumps({"live_jobs_workers_on_this_host": len(here)}))
    return 0 if here else 1


def cmd_reembed(settings: Settings, args: argparse.Namespace) -> int:
    if args.cancel is not None:
        return _cancel(settings, args)
    why = check_why(args.reason)  # refused before anything starts
    client = jobs_redis.connect(settings)
    store = wait_for_store(runtime.database_url(settings), 2)
    try:
        who = _who(args)
        started = reembed.start(
            store,
            client,
            wiring.registry(settings),
            args.model,
            requested_by=who,
            settings=JobsSettings.from_env().reembed,
        )
        # The audit row the dashboard's and the API's start write too.
        detail: dict[str, str | int | bool] = {"model": args.model}
        detail["generation"] = started.generation_id
        if started.already_running:
            detail["joined"] = True
        if why is not None:
            detail["reason"] = why
        store.audit.record(who, "reembed.start", started.job_id, detail)
        joined = " (joined the one under way)" if started.already_running else ""
        print(f"re-embedding generation {started.generation_id}: job {started.job_id}{joined}")
        if not runner.live_workers(client):
            print("no `engram jobs` worker is running: it starts when one does", file=sys.stderr)
        held = jobs_waiting(client)
        if held:
            print(f"engram: reembed {held}", file=sys.stderr)
        if args.detach:
            return 0
        return follow(store, started.generation_id, why_waiting=lambda: jobs_waiting(client))
    finally:
        store.close()
        client.close()


def jobs_waiting(client: Any) -> str | None:
    """``waiting: jobs are paused by ada since ... (why)`` while the jobs are paused (no
    slice of a re-embedding runs), else None."""
    held = pause.jobs_paused(client)
    if held is None:
        return None
    return f"waiting: jobs are paused {held.describe()}; `engram resume jobs` resumes them"


def _cancel(settings: Settings, args: argparse.Namespace) -> int:
    """``engram reembed --cancel GENERATION``: exit 1 (generation_not_pending) for one
    that is not pending, nothing changed."""
    store = wait_for_store(runtime.database_url(settings), 2)
    try:
        ended = reembed.cancel(store, args.cancel, requested_by=_who(args), why=args.reason)
    finally:
        store.close()
    print(json.dumps({"cancelled": ended.id, "model": ended.model_id, "status": ended.status}))
    return 0


_NAME_IT = " (name it to prune it anyway)"


def _who(args: argparse.Namespace) -> str:
    return str(args.requested_by or f"cli:{getpass.getuser()}")


def cmd_prune(settings: Settings, args: argparse.Namespace) -> int:
    """Prune by hand (or hand it to a jobs worker): an audit row for each of what is
    pruned, with who (``--by``) and why (``--reason``)."""
    named = [prune.check(name) for name in args.what]
    older_than_s = parse_duration(args.older_than, "--older-than") if args.older_than else None
    why = check_why(args.reason)
    who = _who(args)
    if args.enqueue:
        with jobs_redis.opened(settings) as jobs_client, open_store(settings, "engram prune") as s:
            targets = named or prune.enabled(JobsSettings.from_env().retention)
            for name in targets:
                job_id = prune.enqueue(jobs_client, name, older_than_s=older_than_s)
                s.audit.record(who, "prune.run", name, _reasoned({"job_id": job_id}, why))
                print(f"prune {name}: job {job_id}")
        return 0
    client = runtime.connect_redis(runtime.redis_url(settings))  # the dead letters'
    try:
        store = wait_for_store(runtime.database_url(settings), 2)
        try:
            report = prune.run(
                store, client, JobsSettings.from_env().retention, named, older_than_s=older_than_s
            )
            for item in report:
                detail = {"removed": item.removed, "older_than": item.as_dict()["older_than"]}
                store.audit.record(who, "prune.run", item.what, _reasoned(detail, why))
        finally:
            store.close()
    finally:
        client.close()
    for item in report:
        if item.older_than is None:
            print(f"{item.what}: retention off, nothing pruned" + ("" if named else _NAME_IT))
        else:
            print(f"{item.what}: {item.removed} removed (older than {item.older_than.isoformat()})")
    return 0


def _reasoned(detail: dict[str, str | int | None], why: str | None) -> dict[str, str | int | None]:
    return {**detail, "reason": why} if why is not None else detail


def cmd_demo_reembed(settings: Settings, args: argparse.Namespace) -> int:
    from .demo_reembed import run_demo

    return run_demo(settings, model=args.model, rate_per_s=args.rate, seed_records=args.records)


def register(sub: Any) -> None:
    jobs = sub.add_parser("jobs", help="run the background jobs (RQ): reembed, prune, redaction")
    jobs.add_argument("--burst", action="store_true", help="stop once the queues are empty")
    jobs.set_defaults(run=cmd_jobs)
    sub.add_parser(
        "jobs-health", help="exit 0 if a jobs worker on this host is alive"
    ).set_defaults(run=cmd_jobs_health)
    re = sub.add_parser(
        "reembed", help="move the whole store to another embedding model, or cancel a move"
    )
    which = re.add_mutually_exclusive_group(required=True)
    which.add_argument("--model", help="wordllama, minilm, hashing[:DIMS], ...")
    which.add_argument(
        "--cancel",
        type=positive_int,
        metavar="GENERATION",
        help="cancel this pending generation: its vectors are deleted, its job stops",
    )
    re.add_argument("--reason", default=None, help="why (kept in the audit trail)")
    re.add_argument(
        "--by",
        "--requested-by",
        dest="requested_by",
        default=None,
        help="who, in the audit trail and on the job (cli:<login>)",
    )
    re.add_argument("--detach", action="store_true", help="print the job id, do not follow it")
    re.set_defaults(run=cmd_reembed)
    pr = sub.add_parser("prune", help="remove history, receipts or dead letters past retention")
    pr.add_argument(
        "what", nargs="*", help=f"{', '.join(prune.WHAT)} (default: each whose retention is on)"
    )
    pr.add_argument(
        "--older-than", default=None, help="e.g. 30d, 12h (default: the configured windows)"
    )
    pr.add_argument("--enqueue", action="store_true", help="hand it to a jobs worker instead")
    pr.add_argument("--reason", default=None, help="why (kept in the audit trail)")
    pr.add_argument(
        "--by", dest="requested_by", default=None, help="who, in the audit trail (cli:<login>)"
    )
    pr.set_defaults(run=cmd_prune)
    demo = sub.add_parser(
        "demo-reembed", help="re-embed with writes going on (needs `engram up` running)"
    )
    demo.add_argument("--model", default="minilm")
    demo.add_argument("--rate", type=float, default=20.0, help="writes per second meanwhile")
    demo.add_argument("--records", type=int, default=2000, help="records to write first")
    demo.set_defaults(run=cmd_demo_reembed)


# -- helpers --------------------------------------------------------------------------


def _context(settings: Settings) -> JobContext:
    """The jobs worker's context: refused (``ConfigError``) before anything connects
    but the jobs' Redis, if that is a cluster."""
    client = jobs_redis.connect(settings)
    streams_url = runtime.redis_url(settings)
    shared = jobs_redis.jobs_url(settings) == streams_url
    return JobContext(
        store=wait_for_store(
            runtime.database_url(settings),
            settings.db_pool_size,
            read_dsn=settings.database_read_url,
            ledger=settings.ledger(),
        ),
        client=client,
        registry=wiring.registry(settings),
        settings=JobsSettings.from_env(),
        streams=settings.worker,
        streams_redis=None if shared else runtime.connect_redis(streams_url),
    )
