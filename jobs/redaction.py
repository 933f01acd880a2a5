"""Running the forget listeners as RQ jobs, after the stream workers commit forgets.

1. A stream worker that commits (or replays) a forget answers it with
   ``redaction: "pending"`` and, in the pipeline that carries that reply, hands
   the event to the jobs (``hand_over``: the ids, JSON, on ``engram:jobs:forgets``).
2. A jobs worker moves what waits there into one redaction job (``feed``),
   once the previous redaction job has left the queue, so forgets that arrive
   together are redacted together (one file rewrite, one VACUUM for all).
3. The job (``redact``, its argument the events) runs the listeners in order; a
   failed listener does not stop the later ones. If one failed, the job is
   retried after ``ENGRAM_REDACTION_RETRY`` pauses, running only the listeners
   that have not succeeded yet. Then every forget's receipt, and the reply a
   producer may read again, say ``complete`` or, after the last retry, ``failed``.
4. A forget still ``pending`` long after its commit with no redaction job in
   sight (its worker died before handing it over, or its job was lost with
   Redis) is handed over again by the sweeper (``sweep``).

A repeated forget (a new operation, or the same one redelivered) runs the
listeners again: each is idempotent.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import redis
from rq import get_current_job
from rq.job import JobStatus
from rq.registry import ScheduledJobRegistry, StartedJobRegistry

from store import ForgetEvent, forgets
from store.model import Redaction
from worker import keys as stream_keys

from . import events as event_json
from . import keys, queues
from .context import JobContext, current
from .errors import JobFailedError, content_free
from .listeners import build

log = logging.getLogger(__name__)

# Forget events one redaction job takes at most.
MAX_EVENTS = 1000

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


def feed(ctx: JobContext, *, block_s: float = 1.0) -> str | None:
    """Move the waiting forget events into one redaction job; its id, if one was made."""
    client = ctx.client
    running = client.get(keys.REDACTION_CURRENT)
    if running is not None and queues.status(client, _text(running)) in (
        JobStatus.QUEUED,
        JobStatus.STARTED,
    ):
        return None  # the events gather meanwhile, for the next job
    raw = client.lpop(keys.FORGET_INBOX, MAX_EVENTS)
    if not raw:
        first = client.blpop([keys.FORGET_INBOX], timeout=block_s)
        if first is None:
            return None
        raw = [first[1], *(client.lpop(keys.FORGET_INBOX, MAX_EVENTS - 1) or [])]
    batch = _unique([json.loads(r) for r in raw])  # type: ignore[arg-type]
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
    failed = []
    for listener in build(ctx):
        if listener.name in done:
            continue
        try:
            listener(batch)
            done.add(listener.name)
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
    if failed and not queues.is_final_attempt(job):
        raise JobFailedError(f"forget listeners failed: {', '.join(failed)}; will retry")
    status: Redaction = "failed" if failed else "complete"
    finish(ctx, batch, status)
    if failed:
        raise JobFailedError(f"forget listeners failed for good: {', '.join(failed)}")
    return {"events": len(batch), "redaction": status}


def finish(ctx: JobContext, batch: Sequence[ForgetEvent], status: Redaction) -> None:
    """Record the redaction status on the forgets' receipts and in their replies."""
    op_ids = [e.operation_id for e in batch]
    forgets.set_redaction(ctx.store.pool, op_ids, status)
    for op_id in op_ids:
        _update_reply(ctx.client, op_id, status)
    log.info("redaction finished", extra={"events": len(batch), "redaction": status})


def sweep(ctx: JobContext) -> int:
    """Hand over again the forgets left pending with no redaction job to finish them."""
    client = ctx.client
    if client.llen(keys.FORGET_INBOX) or _redaction_jobs(client):
        return 0
    cutoff = datetime.now(UTC) - timedelta(seconds=ctx.settings.redaction.sweep_after_s)
    stalled = forgets.pending(ctx.store.pool, cutoff, limit=MAX_EVENTS)
    if stalled:
        pipe = client.pipeline(transaction=False)
        hand_over(stalled, pipe)
        pipe.execute()
        log.warning("stalled redactions handed over again", extra={"events": len(stalled)})
    return len(stalled)


def _redaction_jobs(client: redis.Redis) -> int:
    """Redaction jobs that will still run: queued, running, or waiting to be retried."""
    queue = queues.queue(client, keys.REDACTION_QUEUE)
    return (
        queue.count
        + StartedJobRegistry(queue=queue).count
        + ScheduledJobRegistry(queue=queue).count
    )


def _update_reply(client: redis.Redis, operation_id: str, status: Redaction) -> None:
    key = stream_keys.reply(operation_id)
    for _ in range(3):
        raw = client.lindex(key, 0)
        if raw is None:
            return  # expired, or never sent: the receipt in the store says it
        reply = json.loads(raw)
        receipt = reply.get("receipt")
        if not isinstance(receipt, dict) or receipt.get("kind") != "forget":
            return
        receipt["redaction"] = status
        if client.eval(_SWAP_REPLY, 1, key, raw, json.dumps(reply, separators=(",", ":"))):
            return


def _unique(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One event per forget operation (a redelivered forget may have been handed twice)."""
    return list({e["operation_id"]: e for e in events}.values())


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
