"""The consumer group of a partition's stream: created, found missing, created again.

A stream's group holds how far the workers got (the last entry delivered) and what
they were given and have not acknowledged. A failover to a replica that had not
received the group, or a server restarted without its data, loses it; every read
then answers ``NOGROUP``. The group is created again at the start of the stream
(``0``): acknowledged entries are deleted with their acknowledgement
(``outcomes``), so the stream holds only what is still to do, and a group created
at ``$`` would skip it. An entry whose deletion the failover lost is delivered
again and answered from its receipt.
"""

from __future__ import annotations

from typing import Any

import redis

from engram.worker import keys

# How redis-py words an error of one command of a pipeline, before the server's own.
_PIPELINE_ERROR = "of pipeline caused error: "


def create(client: Any, stream: str) -> bool:
    """Create the group of ``stream`` (and the stream, if missing), delivering every
    entry the stream holds; ``False`` if the group was there."""
    try:
        client.xgroup_create(stream, keys.GROUP, id="0", mkstream=True)
    except redis.ResponseError as exc:
        if "BUSYGROUP" in str(exc):
            return False
        raise
    return True


def is_missing(exc: BaseException) -> bool:
    """``exc`` is the server saying a stream, or its group, is gone."""
    if not isinstance(exc, redis.ResponseError):
        return False
    message = str(exc)
    if _PIPELINE_ERROR in message:
        message = message.split(_PIPELINE_ERROR, 1)[1]
    return message.startswith("NOGROUP")
