"""The Producer against a real valkey-server, with replies written by hand
(the worker's side is in test_worker_*)."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis

from engram.store import Scope
from engram.store.errors import InvalidRequestError, NotFoundError, RevisionConflictError
from engram.worker import (
    Operation,
    Producer,
    QueueFullError,
    QueueUnavailableError,
    StreamReceipt,
    WaitTimeout,
    keys,
)
from engram.worker import producer as producer_module
from engram.worker.protocol import encode_reply, partition_of
from tests.redis_fixtures import wait_until

SCOPE = {"user_id": "ada"}


@pytest.fixture
def producer(redis_url: str) -> Producer:
    return Producer.from_url(redis_url, partitions=16)


def _entries(client: redis.Redis, scope: dict[str, str] = SCOPE) -> list[dict[str, object]]:
    stream = keys.stream(partition_of(scope, 16))
    return [json.loads(fields[b"op"]) for _, fields in client.xrange(stream)]


def _receipt_reply(op_id: str, revision: int = 1, entry: str | None = None) -> str:
    return json.dumps(
        {
            "entry": entry,
            "receipt": {
                "operation_id": op_id,
                "kind": "remember",
                "scope": SCOPE,
                "scope_revision": revision,
                "committed_at": "2025-01-01T00:00:00+00:00",
                "records": [{"id": "mem_1", "revision": 1, "status": "active"}],
                "replayed": False,
                "redacted": False,
            },
        }
    )


def _reply(client: redis.Redis, op_id: str, body: str, scope: dict[str, str] = SCOPE) -> None:
    """As a worker replies: the one reply replaces any earlier one."""
    key = keys.reply(Scope.of(scope).key, op_id)
    client.delete(key)
    client.rpush(key, body)
    client.expire(key, 60)


def test_enqueue_writes_one_entry_on_the_scope_partition(
    producer: Producer, redis_client: redis.Redis
) -> None:
    pending = producer.remember(
        SCOPE, "Ada lives in London.", operation_id="signup:ada:1", metadata={"source": "form"}
    )
    assert pending.operation_id == "signup:ada:1"
    assert pending.partition == partition_of(SCOPE, 16)
    [entry] = _entries(redis_client)
    assert entry == {
        "operation_id": "signup:ada:1",
        "kind": "remember",
        "scope": SCOPE,
        "request": {
            "text": "Ada lives in London.",
            "kind": "semantic",
            "metadata": {"source": "form"},
            "origin": "asserted",
        },
    }
    [(entry_id, _)] = redis_client.xrange(keys.stream(pending.partition))
    assert entry_id.decode() == pending.entry_id


def test_every_kind_is_enqueued_with_its_request(
    producer: Producer, redis_client: redis.Redis
) -> None:
    producer.revise(SCOPE, "mem_1", text="new", expected_revision=2)
    producer.retract(SCOPE, "mem_1", expected_revision=3)
    producer.forget(SCOPE, "mem_1")
    producer.extract(
        SCOPE, [{"id": "m1", "message": {"role": "user", "content": "hi"}}], infer=False
    )
    kinds = [(e["kind"], e["request"]) for e in _entries(redis_client)]
    assert kinds == [
        ("revise", {"id": "mem_1", "text": "new", "expected_revision": 2}),
        ("retract", {"id": "mem_1", "expected_revision": 3}),
        ("forget", {"id": "mem_1"}),
        (
            "extract",
            {
                "messages": [{"id": "m1", "message": {"role": "user", "content": "hi"}}],
                "infer": False,
            },
        ),
    ]
    assert all(e["operation_id"].startswith("op_") for e in _entries(redis_client))


@pytest.mark.parametrize(
    "call",
    [
        lambda p: p.remember(SCOPE, ""),
        lambda p: p.remember({}, "text"),
        lambda p: p.remember({"tenant": "x"}, "text"),
        lambda p: p.revise(SCOPE, "mem_1", expected_revision=-1),
        lambda p: p.retract(SCOPE, ""),
        lambda p: p.submit("fly", SCOPE, {}),
        lambda p: p.remember(SCOPE, "x", importance=3),
        lambda p: p.remember(SCOPE, "lone \ud800 surrogate"),
        lambda p: p.remember(SCOPE, "x", operation_id="op:\udc00"),
    ],
)
def test_invalid_requests_are_refused_before_anything_is_enqueued(
    producer: Producer, redis_client: redis.Redis, call: object
) -> None:
    with pytest.raises(InvalidRequestError):
        call(producer)  # type: ignore[operator]
    assert redis_client.keys("engram:ops:*") == []


@pytest.mark.parametrize(
    "call",
    [
        lambda p: p.remember(SCOPE, "x", knd="fact"),
        lambda p: p.extract(SCOPE, [], trusted=["search"]),
        lambda p: p.revise(SCOPE, "mem_1", expected=1),
        lambda p: p.retract(SCOPE, "mem_1", text="x"),
        lambda p: p.forget(SCOPE, "mem_1", kind="fact"),
    ],
)
def test_a_field_the_verb_does_not_have_is_a_type_error_and_enqueues_nothing(
    producer: Producer, redis_client: redis.Redis, call: object
) -> None:
    with pytest.raises(TypeError, match="unexpected keyword argument"):
        call(producer)  # type: ignore[operator]
    assert redis_client.keys("engram:ops:*") == []


def test_wait_returns_the_receipt(producer: Producer, redis_client: redis.Redis) -> None:
    pending = producer.remember(SCOPE, "x", operation_id="w1")
    timer = threading.Timer(
        0.2, _reply, (redis_client, "w1", _receipt_reply("w1", entry=pending.entry_id))
    )
    timer.start()
    receipt = pending.wait(timeout=5)
    timer.join()
    assert isinstance(receipt, StreamReceipt)
    assert receipt.operation_id == "w1" and receipt.scope_revision == 1
    # The reply stays: a second wait, by id, returns it at once.
    start = time.monotonic()
    assert producer.wait(SCOPE, "w1", timeout=5) == receipt
    assert time.monotonic() - start < 0.5


def test_a_pending_wait_passes_over_the_reply_to_an_earlier_enqueue(
    producer: Producer, redis_client: redis.Redis
) -> None:
    first = producer.remember(SCOPE, "x", operation_id="again")
    _reply(redis_client, "again", _receipt_reply("again", 1, entry=first.entry_id))
    second = producer.remember(SCOPE, "y", operation_id="again")
    with pytest.raises(WaitTimeout):
        second.wait(timeout=0.3)
    _reply(redis_client, "again", encode_reply(InvalidRequestError("used"), second.entry_id))
    with pytest.raises(InvalidRequestError):
        second.wait(timeout=2)
    with pytest.raises(InvalidRequestError):  # by id: the latest reply
        producer.wait(SCOPE, "again", timeout=1)


def test_many_waiters_on_one_operation_are_all_woken(
    producer: Producer, redis_client: redis.Redis
) -> None:
    got: list[StreamReceipt] = []
    waiters = [
        threading.Thread(target=lambda: got.append(producer.wait(SCOPE, "w2", timeout=30)))
        for _ in range(4)
    ]
    for w in waiters:
        w.start()
    time.sleep(0.3)
    start = time.monotonic()
    _reply(redis_client, "w2", _receipt_reply("w2"))
    for w in waiters:
        w.join()
    # Woken by the reply, long before their own time runs out.
    assert len(got) == 4 and time.monotonic() - start < 10
    assert redis_client.llen(keys.reply(Scope.of(SCOPE).key, "w2")) == 1


def test_wait_raises_the_typed_error(producer: Producer, redis_client: redis.Redis) -> None:
    _reply(redis_client, "e1", encode_reply(RevisionConflictError("stale", expected=1, actual=3)))
    _reply(redis_client, "e2", encode_reply(NotFoundError("no record mem_9")))
    with pytest.raises(RevisionConflictError) as info:
        producer.wait(SCOPE, "e1", timeout=1)
    assert (info.value.expected, info.value.actual, info.value.attempts) == (1, 3, 1)
    with pytest.raises(NotFoundError):
        producer.wait(SCOPE, "e2", timeout=1)


def test_wait_times_out(producer: Producer) -> None:
    start = time.monotonic()
    with pytest.raises(WaitTimeout) as info:
        producer.wait(SCOPE, "never", timeout=0.3)
    assert 0.25 < time.monotonic() - start < 1.5
    assert isinstance(info.value, TimeoutError)
    assert info.value.code == "timeout"


def test_results_reads_replies_without_waiting(
    producer: Producer, redis_client: redis.Redis
) -> None:
    _reply(redis_client, "r1", _receipt_reply("r1"))
    _reply(redis_client, "r2", encode_reply(InvalidRequestError("bad")))
    got = producer.results(SCOPE, ["r1", "r2", "r3"])
    assert set(got) == {"r1", "r2"}
    assert isinstance(got["r1"], StreamReceipt)
    assert isinstance(got["r2"], InvalidRequestError)
    # An operation id is its scope's: another scope's replies under the same ids are not
    # these (issue 36).
    assert producer.results({"user_id": "bob"}, ["r1", "r2"]) == {}
    with pytest.raises(WaitTimeout):
        producer.wait({"user_id": "bob"}, "r1", timeout=0.2)


def test_a_full_stream_refuses_with_a_typed_error(
    redis_url: str, redis_client: redis.Redis
) -> None:
    small = Producer.from_url(redis_url, partitions=1, stream_max_len=2)
    small.remember(SCOPE, "one")
    small.remember(SCOPE, "two")
    with pytest.raises(QueueFullError):
        small.remember(SCOPE, "three")
    assert redis_client.xlen(keys.stream(0)) == 2


def test_enqueue_loads_its_script_again_when_the_server_lost_it(
    producer: Producer, redis_client: redis.Redis
) -> None:
    producer.remember(SCOPE, "before")
    redis_client.script_flush()  # as after a restart without the script
    producer.remember(SCOPE, "after")
    assert [e["request"]["text"] for e in _entries(redis_client)] == ["before", "after"]


def test_threads_share_a_producer(redis_url: str, redis_client: redis.Redis) -> None:
    producer = Producer.from_url(redis_url, partitions=16, client_name="shared-producer")
    enqueued = threading.Barrier(5)
    closed = threading.Event()

    def enqueue(t: int) -> None:
        for i in range(50):
            producer.remember({"user_id": f"thread-{t}"}, f"fact {i}")
        enqueued.wait(timeout=30)
        closed.wait(timeout=30)

    threads = [threading.Thread(target=enqueue, args=(t,)) for t in range(4)]
    for thread in threads:
        thread.start()
    enqueued.wait(timeout=30)

    def connections() -> int:
        return sum(c["name"] == "shared-producer" for c in redis_client.client_list())

    try:
        for t in range(4):  # each thread's operations, all there and in its order
            scope = {"user_id": f"thread-{t}"}
            texts = [e["request"]["text"] for e in _entries(redis_client, scope)]
            assert texts == [f"fact {i}" for i in range(50)]
        assert connections() == 4  # one per thread
        producer.close()
        assert connections() == 0
    finally:
        closed.set()
        for thread in threads:
            thread.join()


def test_a_threads_connection_closes_when_the_thread_ends(
    redis_url: str, redis_client: redis.Redis
) -> None:
    producer = Producer.from_url(redis_url, partitions=16, client_name="short-lived")
    thread = threading.Thread(target=producer.remember, args=(SCOPE, "from a short thread"))
    thread.start()
    thread.join()
    assert not any(c["name"] == "short-lived" for c in redis_client.client_list())
    producer.remember(SCOPE, "from this thread")  # the producer itself goes on
    assert len(_entries(redis_client)) == 2


def test_short_threads_do_not_use_up_the_pool(redis_url: str, redis_client: redis.Redis) -> None:
    producer = Producer.from_url(redis_url, partitions=16, max_connections=2)
    for i in range(5):  # one thread after another, as a server's request threads come and go
        thread = threading.Thread(target=producer.remember, args=(SCOPE, f"thread {i}"))
        thread.start()
        thread.join()
    assert len(_entries(redis_client)) == 5


@pytest.mark.filterwarnings("ignore:.*multi-threaded.*fork:DeprecationWarning")
def test_a_forked_process_enqueues_on_a_connection_of_its_own(
    redis_url: str, redis_client: redis.Redis
) -> None:
    """A producer made before a fork (a preforking server, say) is usable in the child,
    on a connection of the child's: one socket used by two processes mixes replies."""
    producer = Producer.from_url(redis_url, partitions=16, client_name="forked-producer")
    producer.remember(SCOPE, "parent, before")
    enqueued_r, enqueued_w = os.pipe()
    leave_r, leave_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: enqueue, say so, stay until told to leave
        try:
            os.close(leave_w)
            producer.remember(SCOPE, "child")
            os.write(enqueued_w, b"1")
            os.read(leave_r, 1)
        finally:
            os._exit(0)
    os.close(enqueued_w)
    os.close(leave_r)
    try:
        assert os.read(enqueued_r, 1) == b"1"
        names = [c["name"] for c in redis_client.client_list()]
        assert names.count("forked-producer") == 2  # the parent's and the child's
    finally:
        os.close(leave_w)
        os.waitpid(pid, 0)
        os.close(enqueued_r)
    producer.remember(SCOPE, "parent, after")
    texts = [e["request"]["text"] for e in _entries(redis_client)]
    assert texts == ["parent, before", "child", "parent, after"]


def test_enqueue_many_sends_a_bulk_in_one_round_trip(
    producer: Producer, redis_client: redis.Redis
) -> None:
    ops = [
        Operation.build("remember", {"user_id": f"bulk-{i % 3}"}, {"text": f"fact {i}"})
        for i in range(30)
    ]
    pendings = producer.enqueue_many(ops)
    assert [p.operation_id for p in pendings] == [op.operation_id for op in ops]
    for scope in ({"user_id": f"bulk-{i}"} for i in range(3)):
        # Each scope's stream holds its operations in the order given.
        assert [e["request"]["text"] for e in _entries(redis_client, scope)] == [
            op.request.to_dict()["text"] for op in ops if op.scope.as_dict() == scope
        ]
    assert producer.enqueue_many([]) == []


def test_enqueue_many_says_when_a_stream_was_full(
    redis_url: str, redis_client: redis.Redis
) -> None:
    small = Producer.from_url(redis_url, partitions=1, stream_max_len=2)
    ops = [Operation.build("remember", SCOPE, {"text": f"fact {i}"}) for i in range(3)]
    with pytest.raises(QueueFullError, match="2 of 3 operations enqueued"):
        small.enqueue_many(ops)


def test_an_unreachable_redis_is_a_clear_error_not_a_silent_drop() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    producer = Producer.from_url(f"redis://127.0.0.1:{port}/0", socket_connect_timeout=0.5)
    op = Operation.build("remember", SCOPE, {"text": "x"}, "lost:1")
    with pytest.raises(QueueUnavailableError) as info:
        producer.enqueue(op)
    assert (
        "lost:1" in info.value.message and "retry with the same operation id" in info.value.message
    )
    with pytest.raises(QueueUnavailableError, match="retry them with the same operation ids"):
        producer.enqueue_many([op])
    with pytest.raises(WaitTimeout, match="redis unreachable"):
        producer.wait(SCOPE, "lost:1", timeout=0.3)


def _blocked(client: redis.Redis) -> int:
    return int(client.info("clients")["blocked_clients"])


def test_a_wait_on_an_event_loop_blocks_on_its_reply_then_is_woken_by_it(
    producer: Producer, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``Pending.replied`` (MCP's writes, the HTTP API's ``?wait=``) first blocks on its
    reply key, so the reply wakes it (no poll interval added to every receipt); at most
    ``FAST_WAITERS`` waits block at once, the others poll, and every one gets its own
    receipt."""
    monkeypatch.setattr(producer_module, "FAST_WAIT_S", 60.0)  # blocked until replied
    waits = producer_module.FAST_WAITERS + 2
    pendings = [
        producer.remember(SCOPE, f"fact {i}", operation_id=f"fast{i}") for i in range(waits)
    ]
    before = _blocked(redis_client)

    async def wait_all() -> list[StreamReceipt | None]:
        return list(await asyncio.gather(*(p.replied(60) for p in pendings)))

    with ThreadPoolExecutor(1) as pool:
        receipts = pool.submit(asyncio.run, wait_all())
        wait_until(
            lambda: _blocked(redis_client) - before == producer_module.FAST_WAITERS,
            what="the waits blocked on their reply keys",
        )
        assert not receipts.done()
        for p in pendings:
            _reply(redis_client, p.operation_id, _receipt_reply(p.operation_id, entry=p.entry_id))
        answered = receipts.result(timeout=30)
    assert [r.operation_id if r else None for r in answered] == [p.operation_id for p in pendings]
    assert _blocked(redis_client) == before  # none left blocked
