"""The jobs' queue names, job ids and Redis keys, in one place.

Everything RQ keeps lives under its own ``rq:`` prefix (job hashes, queues,
registries, results); the keys below are engram's own. Job payloads and these
keys hold ids, counts and times, never memory text.
"""

from __future__ import annotations

import uuid

PREFIX = "engram:jobs"

# RQ queues, in the order a jobs worker takes from them: erasure first, then the
# short maintenance jobs, then the slices of a re-embedding.
REDACTION_QUEUE = "engram-redaction"
MAINTENANCE_QUEUE = "engram-maintenance"
REEMBED_QUEUE = "engram-reembed"
QUEUES = (REDACTION_QUEUE, MAINTENANCE_QUEUE, REEMBED_QUEUE)

# LIST of forget events (JSON, ids only) the stream workers hand over, in the pipeline
# that carries their replies; a jobs worker moves them into redaction jobs.
FORGET_INBOX = f"{PREFIX}:forgets"
# STRING: the id of the newest redaction job (events wait in the inbox while it runs).
REDACTION_CURRENT = f"{PREFIX}:redaction:current"
# LIST of forget events (JSON, ids only) whose redaction job was lost: each is
# redacted alone, before the inbox, so one that kills its worker takes no other down.
FORGET_AGAIN = f"{PREFIX}:forgets:again"


def redaction_lost(job_id: str) -> str:
    """STRING, SET NX with a TTL: the one jobs worker that hands a lost job's forgets over."""
    return f"{PREFIX}:redaction:lost:{job_id}"


# STRING ``<holder> <token>`` with a TTL: who may run a re-embedding slice now.
REEMBED_LEASE = f"{PREFIX}:reembed:lease"
# STRING counter: the re-embedding lease's fencing tokens (see ``lease``).
REEMBED_FENCE_COUNTER = f"{PREFIX}:reembed:fence"
# The fence's name in PostgreSQL (``engram_fences``): a slice that lost the lease
# can store no vector.
REEMBED_FENCE = "reembed"


def slot(schedule: str, number: int) -> str:
    """STRING, SET NX with a TTL: the one jobs worker that enqueues this run of a schedule."""
    return f"{PREFIX}:slot:{schedule}:{number}"


def new_job_id(kind: str) -> str:
    """RQ job ids name their kind: ``reembed-…``, ``redact-…``, ``prune-history-…``."""
    return f"{kind}-{uuid.uuid4().hex[:16]}"
