"""The partition layout: how many partition streams there are, under which epoch's keys,
and the online switch from one count to another (``engram repartition``).

A layout is an epoch and its partition count. Epoch 0 is every deployment that never
switched: its keys are today's (``engram:ops:{N}``) and, while ``keys.LAYOUT`` is
absent, its count is the configured one (``ENGRAM_PARTITIONS``). Once the layout key
exists it wins over the setting (``read``).

A switch from epoch E (P partitions) to E+1 (P' partitions) goes:

1. ``begin`` writes the layout ``{E+1: P', previous: E: P}``: producers that load it
   send to E+1's streams from then on;
2. ``begin`` closes every partition of E (``keys.closed``, one key in each stream's
   slot). The producers' script (``ADD_SCRIPT``) refuses to add to a closed stream, so
   a producer that still holds E's layout reloads it and sends to E+1: after the last
   closure nothing more lands on E;
3. workers keep serving E only, until every partition of E is closed and drained (no
   entry left: every one committed, or dead-lettered, and acknowledged). That is the
   barrier (``finish``): whatever P and P' are, a scope's operations on E all commit
   before any of its operations on E+1 is read, so its order holds. The first worker
   (or command) that sees it writes the steady layout ``{E+1: P'}``, and workers let go
   of E's partitions and take E+1's;
4. once every live worker serves E+1, a worker retires E (``retire``): each of its
   streams that no one leases and that holds no entry is replaced by a string saying
   where to send instead (``RETIRED``), and its fencing counter deleted. A raw ``XADD``
   to it then fails (WRONGTYPE) instead of adding an entry no worker would ever read;
   the producers' script refuses it (``ENGRAMRETIRED``). A stream that still holds
   entries (added with a raw ``XADD`` once no worker read the epoch) is left as it is,
   and reported (``stranded``) until they are gone.

Every step is idempotent: ``begin`` again with the same target finishes a switch whose
command was killed. Each write touches one key, or one partition's slot, so each is
atomic on a Redis Cluster.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import redis

from engram.store.errors import ConfigError
from engram.worker import cluster, keys
from engram.worker.defaults import MAX_PARTITIONS
from engram.worker.errors import RepartitionError
from engram.worker.protocol import OP_FIELD

# The producers' XADD (KEYS: the stream, its closure; ARGV: the cap, the op field):
# refused when the partition's epoch was retired (its stream key holds a string: where
# to send instead), or closed by a switch (the producer reloads the layout), or when the
# stream holds its cap (trimming with MAXLEN instead would silently evict operations no
# worker has read yet).
ADD_SCRIPT = f"""
if redis.call('TYPE', KEYS[1])['ok'] == 'string' then
  return redis.error_reply('ENGRAMRETIRED ' .. redis.call('GET', KEYS[1]))
end
if redis.call('EXISTS', KEYS[2]) == 1 then
  return redis.error_reply('ENGRAMMOVED partition closed by a repartition')
end
if redis.call('XLEN', KEYS[1]) >= tonumber(ARGV[1]) then
  return redis.error_reply('ENGRAMFULL partition stream is full')
end
return redis.call('XADD', KEYS[1], '*', '{OP_FIELD}', ARGV[2])
"""
MOVED = "ENGRAMMOVED"
RETIRED = "ENGRAMRETIRED"

# Retire one partition of a replaced epoch (KEYS: its stream, lease, fencing counter;
# ARGV: what the stream key holds from then on): 'leased' while a worker may still read
# it, 'holds' while it holds entries (no worker reads them: ``stranded``), else the
# stream (its consumer group with it) becomes a string and the counter goes: 'retired'.
_RETIRE = """
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind ~= 'stream' and kind ~= 'none' then return 'retired' end
if redis.call('EXISTS', KEYS[2]) == 1 then return 'leased' end
if kind == 'stream' and redis.call('XLEN', KEYS[1]) > 0 then return 'holds' end
redis.call('DEL', KEYS[3])
redis.call('SET', KEYS[1], ARGV[1])
return 'retired'
"""

# Compare-and-set of the layout key (ARGV: what it held, '' for nothing; what it holds
# next): two commands, or a command and a worker, never overwrite each other's step.
_REPLACE = """
local now = redis.call('GET', KEYS[1])
if (now or '') ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2])
return 1
"""


@dataclass(frozen=True, slots=True)
class Epoch:
    """One epoch's partitions: ``partitions`` streams under the keys of ``number``."""

    number: int
    partitions: int

    def stream(self, partition: int) -> str:
        return keys.stream(partition, self.number)

    def as_dict(self) -> dict[str, int]:
        return {"epoch": self.number, "partitions": self.partitions}


@dataclass(frozen=True, slots=True)
class Layout:
    """The epoch producers send to (``current``) and, during a switch, the one workers
    still serve until it is drained (``previous``)."""

    current: Epoch
    previous: Epoch | None = None

    @classmethod
    def initial(cls, partitions: int) -> Layout:
        """Before any switch: epoch 0 with the configured count."""
        return cls(Epoch(0, partitions))

    @property
    def switching(self) -> bool:
        return self.previous is not None

    @property
    def serving(self) -> Epoch:
        """The epoch whose streams workers read now."""
        return self.previous if self.previous is not None else self.current

    def encode(self) -> str:
        data: dict[str, Any] = self.current.as_dict()
        data["previous"] = self.previous.as_dict() if self.previous else None
        return json.dumps(data, separators=(",", ":"))

    @classmethod
    def decode(cls, raw: bytes | str) -> Layout:
        """``ConfigError`` for what is not a layout: no guess at a partition count."""
        try:
            data = json.loads(raw)
            current = _epoch(data)
            previous = _epoch(data["previous"]) if data.get("previous") is not None else None
        except (ValueError, TypeError, KeyError, AttributeError):
            raise ConfigError(f"{keys.LAYOUT} does not hold a partition layout") from None
        if previous is not None and previous.number >= current.number:
            raise ConfigError(f"{keys.LAYOUT}: the previous epoch is not before the current")
        return cls(current, previous)

    def as_dict(self) -> dict[str, Any]:
        return {
            **self.current.as_dict(),
            "previous": self.previous.as_dict() if self.previous else None,
        }


def _epoch(data: Any) -> Epoch:
    number, partitions = data["epoch"], data["partitions"]
    if not isinstance(number, int) or not isinstance(partitions, int):
        raise TypeError("not integers")
    if number < 0 or not 1 <= partitions <= MAX_PARTITIONS:
        raise ValueError("out of range")
    return Epoch(number, partitions)


def plan(layout: Layout, target: int) -> Layout:
    """The layout a switch to ``target`` partitions writes, from ``layout``: a new epoch,
    or ``layout`` itself when that switch is already under way (finish it).
    ``RepartitionError`` for a target that is no change or collides with another switch."""
    if isinstance(target, bool) or not isinstance(target, int) or target < 1:
        raise RepartitionError(f"the number of partitions must be at least 1, not {target!r}")
    if target > MAX_PARTITIONS:
        raise RepartitionError(
            f"the number of partitions must be at most {MAX_PARTITIONS}, not {target}"
        )
    if layout.previous is not None:
        if target == layout.current.partitions:
            return layout
        raise RepartitionError(
            f"a switch from {layout.previous.partitions} to {layout.current.partitions} "
            f"partitions (epoch {layout.current.number}) is in progress: run "
            f"`engram repartition {layout.current.partitions}` to finish it first"
        )
    if target == layout.current.partitions:
        raise RepartitionError(
            f"engram already has {target} partitions (epoch {layout.current.number})"
        )
    return Layout(Epoch(layout.current.number + 1, target), previous=layout.current)


def finished(layout: Layout) -> Layout:
    """The steady layout a switch ends in."""
    return Layout(layout.current)


# -- in Redis ----------------------------------------------------------------------------


def stored(client: redis.Redis) -> Layout | None:
    """The layout in Redis, or None when no switch ever ran."""
    raw = client.get(keys.LAYOUT)
    return Layout.decode(raw) if raw is not None else None


def read(client: redis.Redis, configured: int) -> Layout:
    """The layout in Redis, else epoch 0 with the ``configured`` count."""
    return stored(client) or Layout.initial(configured)


def replace(client: redis.Redis, was: Layout | None, new: Layout) -> bool:
    """Write ``new`` if the key still holds ``was`` (None: nothing); whether it did."""
    expected = was.encode() if was is not None else ""
    return bool(client.eval(_REPLACE, 1, keys.LAYOUT, expected, new.encode()))


def close(client: redis.Redis, epoch: Epoch) -> None:
    """Close every partition of ``epoch``: producers add nothing more to its streams."""
    pipe = client.pipeline(transaction=False)
    for n in range(epoch.partitions):
        pipe.set(keys.closed(n, epoch.number), "1")
    pipe.execute()


def undrained(client: redis.Redis, epoch: Epoch) -> list[int]:
    """The partitions of ``epoch`` not yet closed, or still holding entries (unread,
    pending, or held for a model phase: an entry leaves its stream once acknowledged)."""
    pipe = client.pipeline(transaction=False)
    for n in range(epoch.partitions):
        pipe.exists(keys.closed(n, epoch.number))
        pipe.xlen(epoch.stream(n))
    answers = pipe.execute()
    return [n for n in range(epoch.partitions) if not answers[2 * n] or int(answers[2 * n + 1]) > 0]


def live_epochs(client: redis.Redis, configured: int) -> list[Epoch]:
    """The epochs whose streams may hold entries now: during a switch the previous one
    (being drained) then the current one (filling up), else the current one."""
    now = read(client, configured)
    return [now.previous, now.current] if now.previous is not None else [now.current]


def live_streams(client: redis.Redis, configured: int) -> list[str]:
    """The partition streams of ``live_epochs``, in order."""
    return [e.stream(n) for e in live_epochs(client, configured) for n in range(e.partitions)]


def finish(client: redis.Redis, layout: Layout) -> Layout:
    """The layout after one look at the barrier: steady if every partition of the
    previous epoch is closed and drained (written, unless someone else did), else
    ``layout`` as it was."""
    if layout.previous is None or undrained(client, layout.previous):
        return layout
    done = finished(layout)
    replace(client, layout, done)  # lost to another worker's write: the same layout
    return done


def begin(client: redis.Redis, target: int, configured: int) -> tuple[Layout, Layout]:
    """Start (or take up again) the switch to ``target`` partitions: write the switching
    layout, then close every partition of the old epoch. The layouts before and after."""
    while True:
        was = stored(client)
        layout = was or Layout.initial(configured)
        new = plan(layout, target)
        if new == was or replace(client, was, new):
            break  # else another command or a worker wrote in between: plan again
    assert new.previous is not None
    # Before the closures, so that the barrier (which needs them) implies it is there.
    client.hset(keys.RETIRING, str(new.previous.number), new.previous.partitions)
    close(client, new.previous)
    return layout, new


# -- retiring a replaced epoch ----------------------------------------------------------


def retiring(client: redis.Redis) -> list[Epoch]:
    """The epochs a switch replaced whose keys are not all retired yet, oldest first
    (what Redis holds there is checked: a field that is no epoch is skipped)."""
    found = []
    for number, partitions in (client.hgetall(keys.RETIRING) or {}).items():
        try:
            found.append(_epoch({"epoch": int(number), "partitions": int(partitions)}))
        except (ValueError, TypeError):
            continue
    return sorted(found, key=lambda e: e.number)


def notice(epoch: Epoch, into: Epoch) -> str:
    """What a retired stream key holds: where to send instead (no memory text)."""
    return (
        f"retired by engram repartition: epoch {epoch.number} was replaced by epoch "
        f"{into.number} ({into.partitions} partitions); {keys.LAYOUT} says where to send"
    )


def retire(
    client: redis.Redis, epoch: Epoch, into: Epoch, partitions: Iterable[int]
) -> dict[int, str]:
    """Retire ``partitions`` of ``epoch`` (replaced by ``into``): for each, ``retired``,
    ``leased`` (a worker may still read it: again later) or ``holds`` (entries no worker
    reads). Once all of ``partitions`` are retired, the epoch leaves ``keys.RETIRING``:
    pass every partition not known to be retired already."""
    numbers = list(partitions)
    script = client.register_script(_RETIRE)
    pipe = client.pipeline(transaction=False)
    for n in numbers:
        cluster.run_script(
            script,
            [
                keys.stream(n, epoch.number),
                keys.lease(n, epoch.number),
                keys.fence_counter(n, epoch.number),
            ],
            [notice(epoch, into)],
            pipe,
        )
    statuses = pipe.execute() if numbers else []
    done = {n: _s(status) for n, status in zip(numbers, statuses, strict=True)}
    if all(status == "retired" for status in done.values()):
        forget_retired(client, epoch)
    return done


def forget_retired(client: redis.Redis, epoch: Epoch) -> None:
    """Every partition of ``epoch`` is retired: nothing more to look at there."""
    client.hdel(keys.RETIRING, str(epoch.number))


def stranded(client: redis.Redis, configured: int) -> list[tuple[str, int]]:
    """Streams no worker reads that still hold entries, with how many: those of the
    replaced epochs not yet retired (added with a raw ``XADD`` once no worker read them).
    Names and counts only."""
    served = read(client, configured).serving.number
    streams = [
        e.stream(n) for e in retiring(client) if e.number != served for n in range(e.partitions)
    ]
    if not streams:
        return []
    pipe = client.pipeline(transaction=False)
    for stream in streams:
        pipe.xlen(stream)
    lengths = pipe.execute(raise_on_error=False)  # a retired key answers WRONGTYPE
    return [
        (stream, int(n))
        for stream, n in zip(streams, lengths, strict=True)
        if isinstance(n, int) and n > 0
    ]


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
