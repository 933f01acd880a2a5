"""Deleting stream entries so that their bytes are gone too.

``XDEL`` only marks an entry deleted: its bytes stay in the stream's node (a
listpack of up to 100 entries) until every entry of that node is deleted, and
``DUMP``, an RDB save and an append-only-file rewrite all write the node as it
is, deleted entries included. ``compact`` rebuilds a stream from its live
entries, in one script (so atomically): the same entry ids, the stream's
counters (last id, entries added, largest deleted id), its consumer groups
with their last delivered id and entries read, their consumers and their
pending entries with owner, delivery time and delivery count. Pending
entries that were deleted are dropped, as ``XAUTOCLAIM`` reports them anyway.
A stream with no live entry is left as it is: it holds no node (the deletion of
a node's last live entry frees it), so no deleted entry's bytes.

The Redis redaction listener (``jobs.listeners.in_redis``) rebuilds every stream with
it; a dead-letter retry (``deadletters``) takes back an entry it should not have added.
"""

from __future__ import annotations

from typing import Any

import redis

_COMPACT = """
local key = KEYS[1]
if redis.call('EXISTS', key) == 0 then return -1 end
-- No live entry, no node: the deletion of a node's last live entry frees it. And a
-- stream that never had an entry (0-0) could not be made to exist again for its
-- groups: an error after the DEL below would leave the key deleted, groups and all.
if redis.call('XLEN', key) == 0 then return 0 end
local function map(flat)
  local t = {}
  for i = 1, #flat, 2 do t[flat[i]] = flat[i + 1] end
  return t
end
local info = map(redis.call('XINFO', 'STREAM', key, 'FULL', 'COUNT', 0))
redis.call('DEL', key)
local entries = info['entries']
for _, entry in ipairs(entries) do
  redis.call('XADD', key, entry[1], unpack(entry[2]))
end
local groups = info['groups']
redis.call('XSETID', key, info['last-generated-id'],
           'ENTRIESADDED', info['entries-added'],
           'MAXDELETEDID', info['max-deleted-entry-id'])
for _, raw in ipairs(groups) do
  local group = map(raw)
  local create = {'XGROUP', 'CREATE', key, group['name'], group['last-delivered-id']}
  if group['entries-read'] then
    table.insert(create, 'ENTRIESREAD')
    table.insert(create, group['entries-read'])
  end
  redis.call(unpack(create))
  for _, consumer in ipairs(group['consumers']) do
    redis.call('XGROUP', 'CREATECONSUMER', key, group['name'], map(consumer)['name'])
  end
  for _, p in ipairs(group['pending']) do
    -- p = {id, consumer, delivery time (ms), delivery count}; a deleted entry is skipped.
    redis.call('XCLAIM', key, group['name'], p[2], 0, p[1],
               'TIME', p[3], 'RETRYCOUNT', p[4], 'FORCE', 'JUSTID')
  end
end
return #entries
"""


def compact(client: redis.Redis, key: str) -> int:
    """Rebuild ``key`` from its live entries; how many it holds (-1: no such key)."""
    kept: Any = client.eval(_COMPACT, 1, key)
    return int(kept)


def delete(client: redis.Redis, key: str, entry_ids: list[str]) -> int:
    """Delete entries for good (``XDEL``, then ``compact``); how many were deleted."""
    if not entry_ids:
        return 0
    deleted = int(client.xdel(key, *entry_ids))
    compact(client, key)
    return deleted
