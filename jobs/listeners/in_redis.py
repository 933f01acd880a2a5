"""The Redis listener: a forgotten record's text leaves every key engram owns, then
valkey's files.

Where Redis can hold the text of a record, and what this listener does there:

- dead letters (``engram:dead``) keep the operation as sent: every letter of an
  operation that wrote the record, names it or would create it
  (``matching.Forgotten``) is deleted. First: a retry moves a letter onto its stream
  in one step that refuses a letter gone (``worker.deadletters``), so once they are
  deleted no retry can put one back, and what a retry moved before is in a stream
  the next step reads;
- the scope's partition stream, in each epoch workers read (``worker.layout``): an
  entry still there for the record (a redelivery of an operation that wrote it, or
  one sent after the forget) is committed on the worker's behalf (it can only be
  replayed or refused, and both answers hold no text), answered, acknowledged and
  deleted; so is one in any other stream of engram's key pattern that no worker
  reads (a replaced epoch's, or a partition past the count, added with a raw
  ``XADD``), found by a scan of the key space;
- then the dead-letter stream and every partition stream are rebuilt from
  their live entries (``streams.compact``), whether or not this batch deleted
  anything from them: ``XDEL`` leaves a deleted entry's bytes in its node, and in
  every file valkey writes of it, and entries are deleted by more than this
  listener (a dead letter retried or discarded, an entry a worker committed).
  Compacting here, every time, catches every such history at once;
- replies, job data and every other key engram writes hold ids and counts
  only, by construction: nothing to erase there;
- finally the append-only file is rewritten, and the RDB file saved again if
  the server keeps one (``persistence.purge``): until then the file still
  holds every ``XADD`` ever sent.

All of it on the streams' Redis (``REDIS_URL``), whether or not the jobs live
there. On a Redis Cluster every command names one key (each stream is rebuilt
by a script on its own slot's master), the streams are found by a scan of each
master, and once the replicas have the rebuilt streams (``WAIT``) every node,
master and replica, rewrites its own files.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any, cast

import redis

from engram.store import ForgetEvent, WriteOptions
from engram.store.write import forgets
from engram.worker import cluster, layout
from engram.worker import keys as stream_keys
from engram.worker.consuming.replies import send_reply
from engram.worker.protocol import Entry, decode_entry, encode_reply, partition_of

from .. import persistence, streams
from ..context import JobContext
from .matching import Forgotten

log = logging.getLogger(__name__)

_PAGE = 1000
# Every partition stream's key (``worker.keys.stream``), whatever the partition and the
# epoch (``{N}``, ``{eE.N}``).
_STREAMS = stream_keys.stream(0).replace("{0}", "{*}")


class RedisListener:
    name = "redis"

    def __init__(self, ctx: JobContext) -> None:
        self.ctx = ctx
        self.client: redis.Redis = ctx.streams_client

    def __call__(self, events: Sequence[ForgetEvent]) -> None:
        # A record id is its scope's: each forgotten record is named with its scope.
        record_ids = {(e.scope.key, e.record_id) for e in events}
        writers = forgets.writers(self.ctx.store.pool, sorted(record_ids))
        forgotten = Forgotten.of(record_ids, (op for ops in writers.values() for op in ops))
        letters = self._letters(forgotten)
        # During a repartition the scopes' entries may wait in either epoch's streams.
        epochs = layout.live_epochs(self.client, self.ctx.partitions)
        for epoch in epochs:
            for partition in sorted({partition_of(e.scope, epoch.partitions) for e in events}):
                self._partition(epoch.stream(partition), partition, epoch.partitions, forgotten)
        found = self._streams()
        read = {e.stream(n) for e in epochs for n in range(e.partitions)}
        for stream in sorted(found - read - {stream_keys.DEAD_LETTERS}):
            # No worker reads it: any partition's entry is settled there (one of one).
            self._partition(stream, 0, 1, forgotten)
        for key in sorted(found):
            streams.compact(self.client, key)
        if self.ctx.settings.redaction.purge_redis_files:
            wait_s = self.ctx.settings.redaction.wait_s
            for node in _replicated(self.client, wait_s):
                persistence.purge(node, wait_s=wait_s)
        log.info(
            "forgotten records erased from redis",
            extra={"records": len(record_ids), "dead_letters": len(letters)},
        )

    def _letters(self, forgotten: Forgotten) -> list[str]:
        """Delete the dead letters that may hold the forgotten text; their ids."""
        letters = [
            entry_id
            for entry_id, fields in _entries(self.client, stream_keys.DEAD_LETTERS)
            if forgotten.holds(fields.get(b"op"))
            or forgotten.wrote(_text(fields.get(b"operation_id")), fields.get(b"op"))
        ]
        if letters:
            self.client.xdel(stream_keys.DEAD_LETTERS, *letters)
        return letters

    def _partition(self, stream: str, partition: int, partitions: int, f: Forgotten) -> None:
        found = [
            (entry_id, fields)
            for entry_id, fields in _entries(self.client, stream)
            if f.holds(fields.get(b"op"))
        ]
        for entry_id, fields in found:
            self._settle(stream, partition, partitions, entry_id, fields)

    def _streams(self) -> set[str]:
        """Every stream engram writes operations into, to be rebuilt from its live entries.

        Not only those this batch deleted from: a letter retried (moved back to its
        partition, then dead-lettered again under a new id) or discarded, or an entry
        a worker committed and deleted, left its bytes in a node shared with live
        entries, where no id points at them any more. No history is assumed: every
        stream of engram's key pattern is found by a scan of each master (a replaced
        epoch's, those of partitions past ``ENGRAM_PARTITIONS`` too; a retired one is
        a string, no longer a stream)."""
        found = {stream_keys.DEAD_LETTERS}
        found.update(layout.live_streams(self.client, self.ctx.partitions))
        for node in _masters(self.client):
            found.update(
                _text(key) for key in node.scan_iter(match=_STREAMS, count=_PAGE, _type="STREAM")
            )
        return found

    def _settle(
        self, stream: str, partition: int, partitions: int, entry_id: str, fields: dict[Any, Any]
    ) -> None:
        """Commit, answer, acknowledge and delete one entry of a forgotten record."""
        item = decode_entry(entry_id, fields, partition=partition, partitions=partitions)
        pipe = self.client.pipeline(transaction=False)
        if isinstance(item, Entry):
            op = item.operation
            entries = WriteOptions(stream_entries={op.key: entry_id})
            [outcome] = self.ctx.store.execute([op], None, options=entries)
            send_reply(pipe, op.key, encode_reply(outcome, entry_id), self.ctx.reply_ttl_s)
        elif item.operation_id is not None and item.scope_key is not None:
            # Never appliable: what the worker would answer.
            send_reply(
                pipe,
                (item.scope_key, item.operation_id),
                encode_reply(item.error, entry_id),
                self.ctx.reply_ttl_s,
            )
        pipe.xack(stream, stream_keys.GROUP, entry_id)
        pipe.xdel(stream, entry_id)
        pipe.execute()


def _entries(client: redis.Redis, key: str) -> Iterator[tuple[str, dict[Any, Any]]]:
    """Every entry of a stream, oldest first, a page at a time."""
    start = "-"
    while True:
        page = client.xrange(key, min=start, max="+", count=_PAGE) or []
        for raw_id, fields in page:
            yield _text(raw_id), fields or {}
        if len(page) < _PAGE:
            return
        start = f"({_text(page[-1][0])}"


def _masters(client: redis.Redis) -> list[redis.Redis]:
    """A client of each node that holds keys: the one server, or each cluster master."""
    if not cluster.is_cluster(client):
        return [client]
    nodes: Any = client
    return [cast(redis.Redis, nodes.get_redis_connection(n)) for n in nodes.get_primaries()]


def _replicated(client: redis.Redis, wait_s: float) -> list[redis.Redis]:
    """Every node whose files may hold a stream's history: the one server, or each
    cluster master then each replica, once every master's replicas have caught up with
    it (``WAIT``: a replica rewriting its file before it applied the rebuilt streams
    would keep the text)."""
    if not cluster.is_cluster(client):
        return [client]
    nodes: Any = client
    masters = _masters(client)
    for master in masters:
        replicas = int(master.info("replication").get("connected_slaves", 0))
        if replicas and int(master.wait(replicas, int(wait_s * 1000))) < replicas:
            raise persistence.PurgeError("a replica did not catch up in time")
    return masters + [
        cast(redis.Redis, nodes.get_redis_connection(n)) for n in nodes.get_replicas()
    ]


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value or "")
