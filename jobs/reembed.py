"""Moving the whole store to another embedding model while writes go on.

``start`` loads the model (one that cannot load is refused, nothing created),
prepares the pending generation (``store.embeddings.begin``: a
generation of another model pending meanwhile is retired and its vectors
deleted), records a ``waiting`` progress and enqueues the first slice. A slice
(``run_slice``, an RQ job whose only argument is the generation id) holds the
re-embedding lease, fills the pending generation in batches from where the last
slice stopped, and after each pass over the store tries ``switch``: the last
gaps are filled with writes held off, then the generation is activated
atomically, if the gaps are few enough to fill within ``switch_hold_s`` at the
rate seen so far. After three passes without a switch (records kept changing
faster than that) it waits ``resume_after_s`` and goes on.

A slice checks before each batch that its generation is still pending: one
cancelled (``cancel``: status ``cancelled``, vectors deleted, an audit row with
who and why) or superseded by another model's stops there, and activation
refuses either under the generation row's lock. A slice that fails records its
root cause (``jobs.causes``: the error's type and a message that quotes no
record) in the progress and in the error RQ keeps.

A slice works for ``slice_s`` at most, then enqueues the next one, so the other
queues are served in between. A slice that dies (its worker was killed) leaves
its lease to run out; the watchdog of any jobs worker (``resume_stalled``) then
enqueues the next one, which starts at the first record still without a vector:
no finished batch is done again. Two slices never run at once: a slice runs
only while it holds the lease, and the store refuses the vectors of a slice that
lost it (a fence, whose token every acquisition raises).
"""

from __future__ import annotations

import logging
import os
import socket
import time
import traceback
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

import redis
from rq import get_current_job
from rq.job import JobStatus

from engram.store import Generation, Store
from engram.store.errors import EngramError, FencedError, InvalidRequestError
from engram.store.limits import REEMBED_MAX_PASSES
from engram.store.vectors.embedders import Embedder, embed_checked
from engram.store.vectors.embeddings import PendingItem, VectorItem
from engram.store.vectors.registry import EmbedderRegistry
from engram.worker.admin.deadletters import check_why

from . import causes, keys, queues
from .context import JobContext, current
from .errors import JobFailedError, content_free
from .lease import JobLease
from .progress import Progress, now
from .settings import Reembed

log = logging.getLogger(__name__)

# A slice marked started this long ago that does not hold the lease has died.
_STARTED_GRACE_S = 10.0


@dataclass(frozen=True, slots=True)
class Started:
    generation_id: int
    job_id: str
    already_running: bool  # a re-embedding to this model was under way: nothing enqueued


@dataclass(frozen=True, slots=True)
class ReembedStatus:
    generation_id: int
    model_id: str
    dims: int
    status: str  # the generation's: pending | active | retired | cancelled
    progress: Progress


def start(
    store: Store,
    client: redis.Redis,
    registry: EmbedderRegistry,
    model: str,
    *,
    requested_by: str,
    settings: Reembed | None = None,
) -> Started:
    """Start (or join) a re-embedding of the whole store with ``model`` (a registry name
    such as ``minilm``); returns at once with the RQ job that carries it.

    ``InvalidRequestError`` for an unknown model or the model already active;
    ``EmbedderLoadError`` for one that cannot load here. The model is loaded and
    tried first, so neither leaves a generation behind."""
    settings = settings or Reembed()
    embedder = registry.load(model)
    active = store.embeddings.active()
    if active is not None and (active.model_id, active.dims) == (embedder.model_id, embedder.dims):
        raise InvalidRequestError(f"{embedder.model_id} is already the active embedding model")
    generation = store.embeddings.begin(embedder.model_id, embedder.dims)
    known = Progress.from_dict(generation.progress)
    if known is not None and not known.finished and _is_live(client, known.job_id):
        return Started(generation.id, known.job_id, already_running=True)
    done, total = store.embeddings.counts(generation.id)
    job_id = keys.new_job_id("reembed")
    store.embeddings.set_progress(
        generation.id,
        Progress.queued(
            job_id=job_id, requested_by=requested_by, done=done, total=total, at=now()
        ).as_dict(),
        if_pending=True,
    )
    _enqueue(client, generation.id, job_id, settings)
    log.info(
        "re-embedding started",
        extra={"generation": generation.id, "job_id": job_id, "requested_by": requested_by},
    )
    return Started(generation.id, job_id, already_running=False)


def cancel(
    store: Store, generation_id: int, *, requested_by: str, why: str | None = None
) -> Generation:
    """Cancel a pending re-embedding: its generation ends ``cancelled``, its vectors are
    deleted, and the audit trail says who and why. Its slice stops before its next batch.

    ``GenerationNotPendingError`` (409, nothing changed) for an active, retired or
    cancelled generation; ``NotFoundError`` for none; ``InvalidRequestError`` for a why
    past 200 characters."""
    why = check_why(why)
    found = store.embeddings.get(generation_id)
    known = Progress.from_dict(found.progress) if found is not None else None
    ended = store.embeddings.cancel(
        generation_id,
        {
            "state": "cancelled",
            "eta_s": None,
            "updated_at": now().isoformat(),
            "message": f"by {requested_by}" + (f": {why}" if why else ""),
        },
    )
    detail: dict[str, str | None] = {"model": ended.model_id}
    if known is not None:
        detail["job_id"] = known.job_id
    if why is not None:
        detail["reason"] = why
    store.audit.record(requested_by, "reembed.cancel", str(generation_id), detail)
    log.info(
        "re-embedding cancelled",
        extra={"generation": generation_id, "requested_by": requested_by},
    )
    return ended


def progress(store: Store) -> ReembedStatus | None:
    """The re-embedding under way (the pending generation's), else the latest one."""
    for generation in store.embeddings.all():  # newest first
        found = Progress.from_dict(generation.progress)
        if found is not None and (generation.status == "pending" or found.finished):
            return ReembedStatus(
                generation.id, generation.model_id, generation.dims, generation.status, found
            )
    return None


@content_free("re-embedding slice")
def run_slice(generation_id: int) -> dict[str, Any]:
    """The RQ job: one slice of the re-embedding of ``generation_id``."""
    job = get_current_job()
    return _Slice(current(), generation_id, job.id if job else keys.new_job_id("reembed")).run()


def resume_stalled(ctx: JobContext) -> str | None:
    """Enqueue the next slice of a re-embedding whose slice died; the new job id, if any."""
    generation = _pending(ctx.store)
    if generation is None:
        return None
    known = Progress.from_dict(generation.progress)
    if known is None or known.finished:
        return None
    lease = _lease(ctx)
    if lease.holder() is not None or _is_live(ctx.client, known.job_id):
        return None
    job_id = keys.new_job_id("reembed")
    resumed = replace(known, job_id=job_id, updated_at=now().isoformat()).as_dict()
    if not ctx.store.embeddings.set_progress(generation.id, resumed, if_pending=True):
        return None  # switched (or retired) since it was read: nothing to resume
    _enqueue(ctx.client, generation.id, job_id, ctx.settings.reembed)
    log.warning(
        "re-embedding resumed after its slice stopped",
        extra={"generation": generation.id, "stalled_job": known.job_id, "job_id": job_id},
    )
    return job_id


@dataclass(slots=True)
class _Pace:
    """A slice's clock: when it began, when it hands over (once it has done some work),
    how many records it handled, when it last saved its progress."""

    started: float
    deadline: float
    handled: int = 0
    saved_at: float = 0.0


class _Slice:
    def __init__(self, ctx: JobContext, generation_id: int, job_id: str) -> None:
        self.ctx = ctx
        self.settings = ctx.settings.reembed
        self.generation_id = generation_id
        self.job_id = job_id
        self.embeddings = ctx.store.embeddings
        self.latest: Progress | None = None

    def run(self) -> dict[str, Any]:
        generation = self.embeddings.get(self.generation_id)
        known = Progress.from_dict(generation.progress) if generation else None
        if generation is None or known is None or generation.status != "pending":
            return self._over(generation, known)
        if known.job_id != self.job_id:
            return {"state": "duplicate"}  # another slice carries this re-embedding
        lease = _lease(self.ctx)
        if not lease.acquire(f"{self.job_id}@{socket.gethostname()}:{os.getpid()}"):
            # The previous holder has not let go yet (or died and its lease runs out).
            return self._again(known, delay_s=min(self.settings.lease_ttl_ms / 2000, 5.0))
        try:
            embedder = self.ctx.registry.for_model(generation.model_id, generation.dims)
            return self._work(known, causes.Guarded(embedder), lease)
        except FencedError:
            log.warning("re-embedding slice fenced", extra={"job_id": self.job_id})
            return {"state": "fenced"}
        except Exception as exc:
            cause = causes.of(exc)
            self._failed(cause)
            _log_failure(self.generation_id, self.job_id, exc, cause)
            # RQ keeps this error: the cause only, never the original message.
            raise JobFailedError(f"re-embedding slice failed: {cause}") from None
        finally:
            lease.release()

    def _work(self, known: Progress, embedder: Embedder, lease: JobLease) -> dict[str, Any]:
        deadline = time.monotonic() + self.settings.slice_s
        done, total = self.embeddings.counts(self.generation_id)
        p = known.at(
            "running",
            now(),
            done=done,
            total=total,
            job_id=self.job_id,
            message=None,
            retrying=False,
        )
        self._save(p)
        pace = _Pace(started=time.monotonic(), deadline=deadline)
        while True:
            self.latest = p  # what a failure records
            stop = self._stop_reason(p, pace, lease)
            if stop is not None:
                return stop
            listed = time.monotonic()
            batch = self.embeddings.pending(
                self.generation_id, self.settings.batch_size, after=p.cursor
            )
            if batch:
                p = self._embed_batch(p, batch, embedder, lease, pace, listed)
                continue
            outcome = self._end_of_pass(p, embedder, lease)
            if outcome is not None:
                return outcome
            done, total = self.embeddings.counts(self.generation_id)
            p = replace(p, pass_=p.pass_ + 1, cursor=None, done=done, total=total)

    def _stop_reason(self, p: Progress, pace: _Pace, lease: JobLease) -> dict[str, Any] | None:
        """Why the slice stops before its next batch (its lease lost, its time up, its
        worker stopping, its generation no longer pending), as the slice's result; None
        to go on."""
        if lease.lost.is_set():
            return {"state": "lease_lost"}
        # A slice always does some work: one that spent its time counting (a busy
        # database) would otherwise hand over to the next for ever.
        if (pace.handled and time.monotonic() > pace.deadline) or self.ctx.stopping.is_set():
            return self._again(p, delay_s=0)
        generation = self.embeddings.get(self.generation_id)
        if generation is None or generation.status != "pending":
            return self._over(generation, p)  # cancelled or superseded meanwhile
        return None

    def _embed_batch(
        self,
        p: Progress,
        batch: list[PendingItem],
        embedder: Embedder,
        lease: JobLease,
        pace: _Pace,
        listed: float,
    ) -> Progress:
        """Embed and store one batch (listed at ``listed``); the progress past it."""
        embedding = time.monotonic()
        try:
            vectors = embed_checked(embedder, [item.text for item in batch])
        except EngramError:
            raise
        except Exception as exc:  # this batch only: counted, and tried in the next pass
            return self._batch_failed(p, batch, exc)
        storing = time.monotonic()
        stored = self.embeddings.put(
            self.generation_id,
            [
                VectorItem(i.scope_id, i.record_id, i.revision, i.digest, v)
                for i, v in zip(batch, vectors, strict=True)
            ],
            fence=lease.fence,
        )
        pace.handled += len(batch)
        finished = time.monotonic()
        return self._advance(
            p,
            batch,
            stored,
            pace,
            handled_per_s=pace.handled / max(finished - pace.started, 1e-6),
            embed_s=storing - embedding,
            store_s=(embedding - listed) + (finished - storing),
        )

    def _batch_failed(self, p: Progress, batch: list[PendingItem], exc: Exception) -> Progress:
        cause = causes.of(exc)
        log.warning(
            "re-embedding batch failed",
            extra={"generation": self.generation_id, "error": type(exc).__name__},
        )
        return replace(
            p,
            errors=p.errors + 1,
            cursor=batch[-1].cursor,
            message=f"a batch failed ({cause}); it is tried again in the next pass",
        )

    def _advance(
        self,
        p: Progress,
        batch: list[PendingItem],
        stored: int,
        pace: _Pace,
        *,
        handled_per_s: float,
        embed_s: float,
        store_s: float,
    ) -> Progress:
        """The progress past a stored batch, saved at most once a second."""
        p = replace(
            p.advanced(
                stored=stored,
                skipped=len(batch) - stored,
                handled_per_s=handled_per_s,
                at=now(),
                embed_s=embed_s,
                store_s=store_s,
            ),
            cursor=batch[-1].cursor,
        )
        if time.monotonic() - pace.saved_at >= 1.0:
            self._save(p)
            pace.saved_at = time.monotonic()
        return p

    def _end_of_pass(
        self, p: Progress, embedder: Embedder, lease: JobLease
    ) -> dict[str, Any] | None:
        """Switch if the gaps left are few; None to make another pass."""
        # Hold writes off for about ``switch_hold_s`` at most, at the rate seen so far.
        hold = max(self.settings.batch_size, int(p.rate_per_s * self.settings.switch_hold_s))
        switched = self.embeddings.switch(
            self.generation_id, embedder, max_missing=hold, fence=lease.fence
        )
        if switched.activated:
            self.embeddings.index_large_scopes()
            done, total = self.embeddings.counts(self.generation_id)
            final = p.at(
                "activated",
                now(),
                done=done,
                total=total,
                eta_s=0.0,
                cursor=None,
                message=f"writes held off {switched.held_s * 1000:.0f} ms for the switch",
            )
            self._save(final, if_pending=False)
            log.info("re-embedding activated", extra={"generation": self.generation_id})
            return {"state": "activated", "done": done}
        generation = self.embeddings.get(self.generation_id)
        if generation is None or generation.status != "pending":
            return self._over(generation, p)
        if p.pass_ >= REEMBED_MAX_PASSES:
            waiting = replace(
                p,
                pass_=1,
                cursor=None,
                message=f"{switched.missing} records changed during the last pass; resuming",
            )
            return self._again(waiting, delay_s=self.settings.resume_after_s, state="waiting")
        return None

    def _again(self, p: Progress, *, delay_s: float, state: str = "running") -> dict[str, Any]:
        """Hand the re-embedding to the next slice, unless it is over meanwhile."""
        job_id = keys.new_job_id("reembed")
        if not self._save(p.at(state, now(), job_id=job_id)):  # type: ignore[arg-type]
            return self._over(self.embeddings.get(self.generation_id), p)
        _enqueue(self.ctx.client, self.generation_id, job_id, self.settings, delay_s=delay_s)
        return {"state": state, "next_job": job_id, "done": p.done, "total": p.total}

    def _over(self, generation: Generation | None, known: Progress | None) -> dict[str, Any]:
        """The generation is no longer pending: activated already, cancelled, or
        superseded by another model's (the store marked its progress so)."""
        if generation is None:
            return {"state": "missing"}
        if generation.status != "retired":
            return {"state": generation.status}
        ended = Progress.from_dict(generation.progress)
        return {"state": "superseded", "by": ended.superseded_by if ended else None}

    def _failed(self, cause: str) -> None:
        known = self.latest
        if known is None:
            generation = self.embeddings.get(self.generation_id)
            known = Progress.from_dict(generation.progress) if generation else None
        if known is None:
            return
        job = get_current_job()
        final = queues.is_final_attempt(job)
        self._save(
            known.at(
                "failed" if final else known.state,
                now(),
                errors=known.errors + 1,
                message=cause if final else f"{cause}; {queues.retry_note(job)}",
                retrying=not final,
            )
        )

    def _save(self, p: Progress, *, if_pending: bool = True) -> bool:
        """Store the progress; never over the last word of a generation that is over."""
        return self.embeddings.set_progress(self.generation_id, p.as_dict(), if_pending=if_pending)


def _log_failure(generation_id: int, job_id: str, exc: BaseException, cause: str) -> None:
    """The failure's type and frames (code, not data), and the cause shown."""
    frames = "".join(traceback.format_tb(exc.__traceback__))
    if exc.__cause__ is not None:  # the embedder's own frames, under causes.Guarded
        frames += "".join(traceback.format_tb(exc.__cause__.__traceback__))
    log.error(
        "re-embedding slice failed",
        extra={
            "generation": generation_id,
            "job_id": job_id,
            "error": type(exc).__name__,
            "cause": cause,
            "where": frames[-2000:],
        },
    )


def _enqueue(
    client: redis.Redis, generation_id: int, job_id: str, settings: Reembed, delay_s: float = 0.0
) -> None:
    queues.enqueue(
        client,
        keys.REEMBED_QUEUE,
        run_slice,
        (generation_id,),
        job_id=job_id,
        timeout_s=settings.slice_s * 4 + 600,
        retry_s=settings.retry_s,
        delay_s=delay_s,
        description=f"re-embed generation {generation_id}",
    )


def _lease(ctx: JobContext) -> JobLease:
    return JobLease(
        ctx.client,
        key=keys.REEMBED_LEASE,
        counter_key=keys.REEMBED_FENCE_COUNTER,
        fence_name=keys.REEMBED_FENCE,
        ttl_ms=ctx.settings.reembed.lease_ttl_ms,
    )


def _pending(store: Store) -> Generation | None:
    return next((g for g in store.embeddings.all() if g.status == "pending"), None)


def _is_live(client: redis.Redis, job_id: str) -> bool:
    """Will this job still run? A started one only while it shows signs of life."""
    job = queues.fetch(client, job_id)
    if job is None:
        return False
    state = job.get_status(refresh=False)
    if state != JobStatus.STARTED:
        return state in queues.LIVE
    started_at: datetime | None = job.started_at
    if started_at is None:
        return True
    age = now() - (started_at if started_at.tzinfo else started_at.replace(tzinfo=now().tzinfo))
    # A running slice holds the lease (checked by the caller) within moments of starting.
    return age < timedelta(seconds=_STARTED_GRACE_S)
