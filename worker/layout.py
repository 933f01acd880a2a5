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
   of E's partitions and take E+1's.

Every step is idempotent: ``begin`` again with the same target finishes a switch whose
command was killed. Each write touches one key, so each is atomic on a Redis Cluster.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import redis

from store.errors import ConfigError, InvalidRequestError

from . import keys
from .protocol import OP_FIELD

# The producers' XADD (KEYS: the stream, its closure; ARGV: the cap, the op field):
# refused when the partition was closed by a switch (the producer reloads the layout),
# or when the stream holds its cap (trimming with MAXLEN instead would silently evict
# operations no worker has read yet).
ADD_SCRIPT = f"""
if redis.call('EXISTS', KEYS[2]) == 1 then
  return redis.error_reply('ENGRAMMOVED partition closed by a repartition')
end
if redis.call('XLEN', KEYS[1]) >= tonumber(ARGV[1]) then
  return redis.error_reply('ENGRAMFULL partition stream is full')
end
return redis.call('XADD', KEYS[1], '*', '{OP_FIELD}', ARGV[2])
"""
MOVED = "ENGRAMMOVED"

# Compare-and-set of the layout key (ARGV: what it held, '' for nothing; what it holds
# next): two commands, or a command and a worker, never overwrite each other's step.
_REPLACE = """
local now = redis.call('GET', KEYS[1])
if (now or '') ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2])
return 1
"""


class RepartitionError(InvalidRequestError):
    """``engram repartition`` was asked for something it cannot do; nothing changed."""

    code = "repartition_refused"


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
    if number < 0 or partitions < 1:
        raise ValueError("out of range")
    return Epoch(number, partitions)


def plan(layout: Layout, target: int) -> Layout:
    """The layout a switch to ``target`` partitions writes, from ``layout``: a new epoch,
    or ``layout`` itself when that switch is already under way (finish it).
    ``RepartitionError`` for a target that is no change or collides with another switch."""
    if isinstance(target, bool) or not isinstance(target, int) or target < 1:
        raise RepartitionError(f"the number of partitions must be at least 1, not {target!r}")
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
    close(client, new.previous)
    return layout, new
