"""No stream entry can stall a worker: thousands of generated raw entries, valid ones
mixed with every kind of garbage a producer in any language could send, go through a
real ``engram worker`` process. Afterwards every valid operation has its receipt,
every other entry is dead-lettered or answered, and the partitions are empty."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
import redis

from engram.store import Scope, Store
from engram.store.limits import MAX_TEXT_CHARS
from engram.worker import keys
from engram.worker.admin.deadletters import read as read_dead_letters
from engram.worker.protocol import partition_of
from tests.redis_fixtures import FAST, WorkerProcess, wait_until

SEED = 20261203
VALID = 1000
GARBAGE = 2000


# For each field of an operation, values it can never take.
WRONG: dict[tuple[str, ...], list[Any]] = {
    ("operation_id",): [None, 7, 1.5, True, [], {}, ""],
    ("kind",): [None, 7, [], {}, "fly", "Remember"],
    ("scope",): [None, 7, "ada", [], {}, {"team_id": "x"}],
    ("scope", "user_id"): [7, True, [], {}, "", " "],
    ("request",): [7, "text", [], True],
    ("request", "text"): [None, 7, 1.5, True, [], {}, ""],
    ("request", "kind"): [7, [], {}, ""],
    ("request", "importance"): ["high", 2, -1, True, []],
    ("request", "metadata"): [7, "m", [], True],
    ("request", "sources"): [7, "s", [], [7], [{}], [{"kind": "oracle"}]],
    ("request", "links"): [7, "l", [7], [{"relation": "likes", "id": "y"}]],
    ("request", "ttl_ms"): ["1", 0, -5, 1.5, True],
    ("request", "id"): [7, "", [], {}],
    ("request", "origin"): [7, "guessed", []],
    ("request", "colour"): ["red"],
}


def _op(op_id: Any, scope: Any, request: Any, kind: Any = "remember") -> dict[str, Any]:
    return {"operation_id": op_id, "kind": kind, "scope": scope, "request": request}


def _dumps(value: Any) -> bytes:
    return json.dumps(value).encode()


class Generator:
    """Raw ``op`` fields, each a kind of garbage, or a valid operation."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.n = 0

    def scope(self) -> dict[str, str]:
        return {"user_id": f"fuzz-{self.rng.randrange(50)}"}

    def next_id(self) -> str:
        self.n += 1
        return f"fuzz:{self.n}"

    def valid(self) -> tuple[dict[str, Any], bytes]:
        op = _op(self.next_id(), self.scope(), {"text": f"fuzz fact {self.n} \u00e9\U0001f375"})
        return op, _dumps(op)

    def garbage(self) -> bytes:
        makers: list[Callable[[], bytes]] = [
            self.random_bytes,
            self.lone_surrogate,
            self.deep,
            self.huge_number,
            self.huge_string,
            self.wrong_type,
            self.duplicate_keys,
            self.truncated,
            self.not_an_object,
        ]
        return self.rng.choice(makers)()

    def raw_op(self, request: str) -> bytes:
        """A remember whose request is given as raw JSON text."""
        head = f'"operation_id":"{self.next_id()}","kind":"remember","scope":{{"user_id":"x"}}'
        return f'{{{head},"request":{request}}}'.encode()

    def random_bytes(self) -> bytes:
        return bytes(self.rng.randrange(256) for _ in range(self.rng.randrange(1, 200)))

    def lone_surrogate(self) -> bytes:
        bad = "\\u" + self.rng.choice(["d800", "dbff", "dc00", "dfff"])
        where = self.rng.choice(["text", "scope", "operation_id", "metadata", "kind"])
        fields = {
            "operation_id": f'"{self.next_id()}"',
            "kind": '"remember"',
            "scope": '{"user_id":"fuzz-s"}',
            "request": '{"text":"a fact"}',
        }
        if where == "text":
            fields["request"] = f'{{"text":"a {bad} fact"}}'
        elif where == "scope":
            fields["scope"] = f'{{"user_id":"fuzz{bad}"}}'
        elif where == "operation_id":
            fields["operation_id"] = f'"fuzz:{bad}"'
        elif where == "metadata":
            fields["request"] = f'{{"text":"a fact","metadata":{{"{bad}":1}}}}'
        else:
            fields["kind"] = f'"rem{bad}"'
        return ("{" + ",".join(f'"{k}":{v}' for k, v in fields.items()) + "}").encode()

    def deep(self) -> bytes:
        depth = self.rng.choice([40, 1000, 50_000])
        nested = "[" * depth + "]" * depth
        return self.raw_op(f'{{"text":"a","metadata":{{"k":{nested}}}}}')

    def huge_number(self) -> bytes:
        field = self.rng.choice(["importance", "ttl_ms", "metadata"])
        numbers = ["1e999", "-1e999", "9" * 5000]
        if field != "metadata":  # jsonb holds a 400-digit integer: metadata may too
            numbers.append("1" + "0" * 400)
        number = self.rng.choice(numbers)
        value = f'{{"k":{number}}}' if field == "metadata" else number
        return self.raw_op(f'{{"text":"a","{field}":{value}}}')

    def huge_string(self) -> bytes:
        where = self.rng.choice(["text", "operation_id", "scope"])
        big = "x" * (MAX_TEXT_CHARS + 1 if where == "text" else 201)
        op = _op(self.next_id(), {"user_id": "x"}, {"text": "a"})
        if where == "text":
            op["request"]["text"] = big
        elif where == "operation_id":
            op["operation_id"] = big
        else:
            op["scope"] = {"user_id": big}
        return _dumps(op)

    def wrong_type(self) -> bytes:
        path, values = self.rng.choice(list(WRONG.items()))
        op = _op(self.next_id(), {"user_id": "x"}, {"text": "a fact"})
        *parents, name = path
        target = op
        for parent in parents:
            target = target[parent]
        target[name] = self.rng.choice(values)
        return _dumps(op)

    def duplicate_keys(self) -> bytes:
        # JSON objects with a key twice: the last one wins, and it is wrong here.
        return self.raw_op('{"text":"a fact","text":{"nested":1}}')

    def truncated(self) -> bytes:
        full = _dumps(_op(self.next_id(), {"user_id": "x"}, {"text": "a fact"}))
        return full[: self.rng.randrange(1, len(full) - 1)]

    def not_an_object(self) -> bytes:
        return self.rng.choice([b"null", b"[]", b'"op"', b"42", b"", b"{}", b"\xff\xfe{}"])


@pytest.mark.slow
def test_no_entry_stalls_a_worker(
    store: Store,
    dsn: str,
    redis_url: str,
    redis_client: redis.Redis,
    worker_processes: Callable[..., WorkerProcess],
) -> None:
    rng = random.Random(SEED)
    gen = Generator(rng)
    valid: dict[str, dict[str, Any]] = {}
    entries: list[tuple[int, dict[bytes, bytes]]] = []
    for _ in range(VALID):
        op, raw = gen.valid()
        valid[op["operation_id"]] = op
        entries.append((partition_of(op["scope"], FAST.partitions), {b"op": raw}))
    for _ in range(GARBAGE):
        fields = {b"op": gen.garbage()}
        if rng.random() < 0.05:  # a field that is not "op", or none of it
            fields = rng.choice([{b"payload": b"{}"}, {b"op": b"{}", b"x": b"1"}, {b"\xff": b"1"}])
        entries.append((rng.randrange(FAST.partitions), fields))
    rng.shuffle(entries)
    worker = worker_processes(database_url=dsn, redis_url=redis_url)
    pipe = redis_client.pipeline(transaction=False)
    for partition, fields in entries:
        pipe.xadd(keys.stream(partition), fields)  # type: ignore[arg-type]
    pipe.execute()

    def drained() -> bool:
        assert worker.process.poll() is None, worker.log()[-3000:]
        pipe = redis_client.pipeline(transaction=False)
        for p in range(FAST.partitions):
            pipe.xlen(keys.stream(p))
        return sum(pipe.execute()) == 0

    wait_until(drained, timeout=180, interval=0.5, what="every entry to be handled")

    replies = _replies(
        redis_client, [(Scope.of(op["scope"]).key, op_id) for op_id, op in valid.items()]
    )
    assert all("receipt" in r for r in replies.values()), [
        (k, r) for k, r in replies.items() if "receipt" not in r
    ][:3]
    assert len(replies) == VALID
    with psycopg.connect(dsn) as conn:
        committed = conn.execute(
            "SELECT count(*) FROM engram_receipts WHERE operation_id LIKE 'fuzz:%%'"
            " AND error IS NULL"
        ).fetchone()
    assert committed == (VALID,)
    dead = read_dead_letters(redis_client, count=GARBAGE + 1)
    assert len(dead) == GARBAGE
    assert {d.reason for d in dead} == {"malformed"}
    log = worker.log()
    assert "consumer crashed" not in log and "Traceback" not in log


def _replies(client: redis.Redis, ops: list[tuple[str, str]]) -> dict[str, dict[str, Any]]:
    """The replies of these operations (scope key, operation id), by operation id."""
    pipe = client.pipeline(transaction=False)
    for scope_key, op_id in ops:
        pipe.lindex(keys.reply(scope_key, op_id), -1)
    return {
        op_id: json.loads(raw)
        for (_, op_id), raw in zip(ops, pipe.execute(), strict=True)
        if raw is not None
    }
