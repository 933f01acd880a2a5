"""Running the forget listeners as RQ jobs, after the stream workers commit forgets.

1. A stream worker that commits (or replays) a forget answers it with
   ``redaction: "pending"`` and, in the pipeline that carries that reply, hands
   the event to the jobs (``hand_over``: the ids, JSON, on ``engram:jobs:forgets``);
   with the jobs on a Redis of their own (the streams on a cluster), it pushes
   the event there just before that pipeline (``hand_over_to``).
2. A jobs worker moves what waits there into one redaction job (``feed``),
   once the previous redaction job has left the queue, so forgets that arrive
   together are redacted together (one file rewrite, one VACUUM for all).
3. The job (``redact``, its argument the events) runs the listeners in order; a
   failed listener does not stop the later ones. If one failed, the job is
   retried after ``ENGRAM_REDACTION_RETRY`` pauses, running only the listeners
   that have not succeeded yet. Then every forget's receipt, and the reply a
   producer may read again, say ``complete`` or, after the last retry, ``failed``.
   A listener that is held (``RedactionHeldError``: the postgres listener while a
   standby's snapshot, a replication slot or a prepared transaction keeps the
   deleted row versions) has not failed: the forget stays ``pending``, its reason
   naming the holders, through the retries and after them, until a hand-over by
   the sweeper (4, not counted) finds them gone.
4. A forget still ``pending`` long after its commit with no redaction job in
   sight (its worker died before handing it over, or its job was lost with
   Redis) is handed over again by the sweeper (``sweep``).
5. A redaction job whose jobs worker died while running it (SIGKILL, a listener
   that brings its process down) is failed in RQ by the feeder, and each of its
   forgets is handed over again alone (``FORGET_AGAIN``), so one that kills its
   worker takes no other down. Every hand-over again is counted on the forget's
   receipt; one counted ``ENGRAM_REDACTION_MAX_HANDOVERS`` times is not handed
   over again but ends ``failed``, with its reason, and later forgets go on.

A repeated forget (a new operation, or the same one redelivered) runs the
listeners again: each is idempotent.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import redis
from rq import Worker, get_current_job
from rq.job import Job, JobStatus
from rq.job_lifecycle import record_job_failure
from rq.registry import ScheduledJobRegistry, StartedJobRegistry

from engram.store import ForgetEvent, ledger_replay
from engram.store.errors import RedactionHeldError, held_by
from engram.store.ledger import LedgerEntry
from engram.store.values import Redaction
from engram.store.write import forgets
from engram.worker import keys as stream_keys

from . import events as event_json
from . import keys, queues
from .context import JobContext, current
from .errors import JobFailedError, content_free
from .listeners import build

log = logging.getLogger(__name__)

# The redaction's first step, before the listeners (in the job's ``done`` like theirs).
LEDGER = "ledger"
_KILL_BEFORE_LEDGER = "ENGRAM_TEST_KILL_BEFORE_LEDGER"
# How often the forget ledger is checked against the tombstones and repaired.
LEDGER_REPAIR_EVERY_S = 3600.0
# Forget events one redaction job takes at most.
MAX_EVENTS = 1000
# How long a redaction waits, once, for forgets' replies not there yet (see ``finish``).
_REPLY_GRACE_S = 1.0

# Replace a reply only if it is still the one read (a redelivery may have replaced it).
_SWAP_REPLY = """
if redis.call('LINDEX', KEYS[1], 0) == ARGV[1] then
  redis.call('LSET', KEYS[1], 0, ARGV[2])
  return 1
end
return 0
"""


def hand_over(events: Sequence[ForgetEvent], pipe: Any) -> None:
    """The stream workers' forget hook: queue the events for the jobs, in ``pipe``."""
    for event in events:
        pipe.rpush(keys.FORGET_INBOX, json.dumps(event_json.to_dict(event)))


def hand_over_to(client: redis.Redis) -> Callable[[Sequence[ForgetEvent], Any], None]:
    """The forget hook of stream workers whose jobs live on another Redis (``client``;
    the streams on a cluster): the events go there at once, not in the workers'
    pipeline. A jobs Redis that does not answer stops no stream worker: the hand-over
    is logged and dropped, and the sweeper (``sweep``) hands those forgets over later."""

    def hook(events: Sequence[ForgetEvent], pipe: Any) -> None:
        own = client.pipeline(transaction=False)
        hand_over(events, own)
        try:
            own.execute()
        except redis.RedisError as exc:
            log.warning(
                "forgets not handed to the jobs; the sweeper will",
                extra={"events": len(events), "error": type(exc).__name__},
            )

    return hook


def feed(ctx: JobContext, *, block_s: float = 1.0) -> str | None:
    """Move the waiting forget events into one redaction job; its id, if one was made.

    A forget whose job was lost goes first, alone; then whatever waits in the inbox."""
    client = ctx.client
    running = client.get(keys.REDACTION_CURRENT)
    if running is not None:
        state = queues.status(client, _text(running))
        if state == JobStatus.QUEUED or (
            state == JobStatus.STARTED and not _lost(ctx, _text(running))
        ):
            return None  # the events gather meanwhile, for the next job
    again = client.lpop(keys.FORGET_AGAIN)
    if again is not None:
        return _enqueue(ctx, [json.loads(again)])  # type: ignore[arg-type]
    raw = client.lpop(keys.FORGET_INBOX, MAX_EVENTS)
    if not raw:
        first = client.blpop([keys.FORGET_INBOX], timeout=block_s)
        if first is None:
            return None
        raw = [first[1], *(client.lpop(keys.FORGET_INBOX, MAX_EVENTS - 1) or [])]
    return _enqueue(ctx, _unique([json.loads(r) for r in raw]))  # type: ignore[arg-type]


def _enqueue(ctx: JobContext, batch: list[dict[str, Any]]) -> str:
    client = ctx.client
    job_id = keys.new_job_id("redact")
    client.set(keys.REDACTION_CURRENT, job_id)
    queues.enqueue(
        client,
        keys.REDACTION_QUEUE,
        redact,
        (batch,),
        job_id=job_id,
        timeout_s=ctx.settings.redaction.wait_s * 4 + 600,
        retry_s=ctx.settings.redaction.retry_s,
        description=f"redact {len(batch)} forgotten records",
    )
    log.info("redaction job enqueued", extra={"job_id": job_id, "events": len(batch)})
    return job_id


@content_free("redaction")
def redact(events: list[dict[str, Any]]) -> dict[str, Any]:
    """The RQ job: run the forget listeners over ``events``, then record how they did."""
    ctx = current()
    job = get_current_job()
    batch = [event_json.from_dict(e) for e in events]
    done = set(job.meta.get("done", ())) if job is not None else set()
    failed: list[str] = []
    held: list[str] = []
    if LEDGER not in done:
        try:
            to_ledger(ctx, batch)
            done.add(LEDGER)
        except Exception as exc:  # not complete without it: retried like a listener
            failed.append(LEDGER)
            log.error("forget ledger append failed", extra={"error": type(exc).__name__})
    for listener in build(ctx):
        if listener.name in done:
            continue
        try:
            listener(batch)
            done.add(listener.name)
        except RedactionHeldError as exc:  # not a failure: it finishes once they are gone
            held.extend(h for h in exc.holders if h not in held)
            log.warning(
                "forget listener held",
                extra={"listener": listener.name, "held_by": exc.message, "events": len(batch)},
            )
        except Exception as exc:  # later listeners still run; the forget stands
            failed.append(listener.name)
            log.error(
                "forget listener failed",
                extra={
                    "listener": listener.name,
                    "error": type(exc).__name__,
                    "events": len(batch),
                },
            )
    if job is not None:
        job.meta["done"] = sorted(done)
        job.save_meta()
    held_reason = held_by(held) if held else None
    if held_reason is not None:
        _record(ctx, batch, "pending", held_reason)  # says what it waits for meanwhile
    if (failed or held) and not queues.is_final_attempt(job):
        raise JobFailedError(
            f"forget listeners failed or held: {', '.join(failed) or 'none failed'}; will retry"
        )
    if failed:
        reason = "; ".join(filter(None, [f"listeners failed: {', '.join(failed)}", held_reason]))
        finish(ctx, batch, "failed", reason)
        raise JobFailedError(f"forget listeners failed for good: {', '.join(failed)}")
    if held_reason is not None:
        # Its retries spent: the sweeper hands it over again, uncounted, until the
        # holders are gone (``sweep``).
        log.warning("redaction held", extra={"events": len(batch), "held_by": held_reason})
        return {"events": len(batch), "redaction": "pending", "held_by": held_reason}
    finish(ctx, batch, "complete")
    return {"events": len(batch), "redaction": "complete"}


def to_ledger(ctx: JobContext, batch: Sequence[ForgetEvent]) -> None:
    """Append the batch's forgets to the forget ledger (store.ledger), durably, before any
    of them may be ``complete``: a crash before this leaves them pending, and their
    redaction (this job, or the hand-over after it) runs again."""
    ledger = ctx.store.ledger
    if ledger is None:
        return
    _crash_point_for_tests()
    at = forgets.committed_at(ctx.store.pool, [e.key for e in batch])
    now = datetime.now(UTC)
    database = ctx.store.database_key
    ledger.append(
        LedgerEntry(
            record_id=e.record_id,
            scope=e.scope.as_dict(),
            operation_id=e.operation_id,
            at=at.get(e.key, now),
            database=database,
        )
        for e in batch
    )


@content_free("repair-forget-ledger")
def repair_ledger_job() -> dict[str, Any]:
    """The schedule's job: append to the forget ledger the tombstones it lacks (forgets
    that never reached a redaction job: no listener configured, a ``Store`` without a
    ledger, or appended on another host's ledger); what the check found."""
    ctx = current()
    if ctx.store.ledger is None:
        return {}
    found = ledger_replay.check(ctx.store, ctx.store.ledger, repair=True)
    if found.damaged_lines:
        log.error("forget ledger lines damaged", extra={"lines": found.damaged_lines})
    return found.as_dict()


def _crash_point_for_tests() -> None:
    """Tests only: with ``ENGRAM_TEST_KILL_BEFORE_LEDGER`` naming a file that exists,
    remove it and die at once (SIGKILL), between a forget's commit and its ledger
    append; once, so that the forget's next hand-over goes through."""
    marker = os.environ.get(_KILL_BEFORE_LEDGER)
    if marker and os.path.exists(marker):
        os.unlink(marker)
        os.kill(os.getpid(), signal.SIGKILL)


def finish(
    ctx: JobContext, batch: Sequence[ForgetEvent], status: Redaction, reason: str | None = None
) -> None:
    """Record the redaction status (and why it failed: content-free) on the forgets'
    receipts and in their replies."""
    _record(ctx, batch, status, reason)
    log.info("redaction finished", extra={"events": len(batch), "redaction": status})


def _record(
    ctx: JobContext, batch: Sequence[ForgetEvent], status: Redaction, reason: str | None
) -> None:
    op_keys = [e.key for e in batch]
    forgets.set_redaction(ctx.store.pool, op_keys, status, reason)
    missing = [k for k in op_keys if not _update_reply(ctx.streams_client, k, status, reason)]
    if missing and ctx.streams_redis is not None:
        # On a Redis of their own the jobs may hear of a forget just before its worker's
        # reply lands on the streams' Redis: a moment later, it is there.
        time.sleep(_REPLY_GRACE_S)
        for op_key in missing:
            _update_reply(ctx.streams_client, op_key, status, reason)


def sweep(ctx: JobContext) -> int:
    """Hand over again the forgets left pending with no redaction job to finish them."""
    client = ctx.client
    if client.llen(keys.FORGET_INBOX) or client.llen(keys.FORGET_AGAIN) or _redaction_jobs(client):
        return 0
    cutoff = datetime.now(UTC) - timedelta(seconds=ctx.settings.redaction.sweep_after_s)
    stalled = forgets.pending(ctx.store.pool, cutoff, limit=MAX_EVENTS)
    if not stalled:
        return 0
    again = _count_handover(ctx, [event_json.to_dict(e) for e in stalled], count_held=False)
    if again:
        pipe = client.pipeline(transaction=False)
        for event in again:
            pipe.rpush(keys.FORGET_INBOX, json.dumps(event))
        pipe.execute()
        log.warning("stalled redactions handed over again", extra={"events": len(again)})
    return len(again)


def _lost(ctx: JobContext, job_id: str) -> bool:
    """Whether this started redaction job's worker died; if so (and no other jobs
    worker got there first), fail it in RQ and hand its forgets over again, alone."""
    client = ctx.client
    worker_name = client.hget(Job.key_for(job_id), "worker_name")
    if not _worker_dead(client, _text(worker_name) if worker_name else None):
        return False
    job = queues.fetch(client, job_id)
    if job is None:
        return False
    # One jobs worker hands it over; should it die before failing the job, the claim
    # runs out and another one does.
    if not client.set(keys.redaction_lost(job_id), "1", nx=True, ex=60):
        return False
    _fail_abandoned(client, job)
    events: list[dict[str, Any]] = list(job.args[0]) if job.args else []
    again = _count_handover(ctx, events)
    if again:
        client.rpush(keys.FORGET_AGAIN, *[json.dumps(e) for e in again])
    log.warning(
        "redaction job lost with its worker; its forgets handed over again",
        extra={"job_id": job_id, "events": len(events), "again": len(again)},
    )
    return True


def _count_handover(
    ctx: JobContext, events: list[dict[str, Any]], *, count_held: bool = True
) -> list[dict[str, Any]]:
    """Count one more hand-over of each pending forget; the events to hand over
    again. A forget handed over ``max_handovers`` times already ends ``failed``.
    Without ``count_held``, a held forget's hand-over is not counted (its job was not
    lost: it ended held)."""
    by_op = {_event_key(e): e for e in events}
    limit = ctx.settings.redaction.max_handovers
    reason = (
        f"handed over {limit} times, its redaction never finished: its jobs worker "
        "died or its job was lost each time"
    )
    again, failed = forgets.hand_over_again(
        ctx.store.pool, list(by_op), max_handovers=limit, reason=reason, count_held=count_held
    )
    for op_key in failed:
        _update_reply(ctx.streams_client, op_key, "failed", reason)
    if failed:
        log.error(
            "redactions failed: handed over too many times",
            extra={"events": len(failed), "max_handovers": limit},
        )
    return [by_op[op_key] for op_key in again]


def _worker_dead(client: redis.Redis, name: str | None) -> bool:
    """The RQ worker of this name is gone: its registration ran out (no heartbeat for
    its TTL), or it was on this host and its process is no more."""
    if not name:
        return False
    hostname, pid = client.hmget(Worker.redis_worker_namespace_prefix + name, "hostname", "pid")
    if hostname is None:
        return True
    if _text(hostname) != socket.gethostname() or not pid:
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _fail_abandoned(client: redis.Redis, job: Job) -> None:
    """Out of the started registry and failed, as RQ's own clean-up would do much later
    (after the job's timeout), and without its retries: its forgets go on without it."""
    started = StartedJobRegistry(queue=queues.queue(client, keys.REDACTION_QUEUE))
    entries = [
        entry
        for entry in (_text(e) for e in client.zrange(started.key, 0, -1))
        if started.parse_job_id(entry) == job.id
    ]
    pipe = client.pipeline()
    if entries:
        pipe.zrem(started.key, *entries)
    record_job_failure(job, "abandoned: its jobs worker died while running it", pipe)
    pipe.execute()


def _redaction_jobs(client: redis.Redis) -> int:
    """Redaction jobs that will still run: queued, running, or waiting to be retried."""
    queue = queues.queue(client, keys.REDACTION_QUEUE)
    return (
        queue.count
        + StartedJobRegistry(queue=queue).count
        + ScheduledJobRegistry(queue=queue).count
    )


def _update_reply(
    client: redis.Redis, op_key: tuple[str, str], status: Redaction, reason: str | None = None
) -> bool:
    """Whether there was a reply (updated, or not a forget's) to update."""
    key = stream_keys.reply(*op_key)
    for _ in range(3):
        raw = client.lindex(key, 0)
        if raw is None:
            return False  # expired, or not sent yet: the receipt in the store says it
        reply = json.loads(raw)
        receipt = reply.get("receipt")
        if not isinstance(receipt, dict) or receipt.get("kind") != "forget":
            return True
        receipt["redaction"] = status
        if reason is not None:
            receipt["redaction_reason"] = reason
        else:
            receipt.pop("redaction_reason", None)
        if client.eval(_SWAP_REPLY, 1, key, raw, json.dumps(reply, separators=(",", ":"))):
            return True
    return True


def _unique(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One event per forget operation (a redelivered forget may have been handed twice)."""
    return list({_event_key(e): e for e in events}.values())


def _event_key(event: dict[str, Any]) -> tuple[str, str]:
    """A forget event's operation (scope key, operation id), as JSON (``events``)."""
    return event_json.from_dict(event).key


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
