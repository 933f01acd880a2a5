"""The stream protocol, keys, shares and metrics rendering: pure, no server
(fakeredis where a Redis-shaped object is needed)."""

from __future__ import annotations

import json
import zlib
from datetime import UTC, datetime

import fakeredis
import pytest
from redis.crc import key_slot

from engram.store import Operation, Receipt, RecordRef, Scope, WriteResult
from engram.store.errors import (
    ConfigError,
    EngramError,
    InvalidRequestError,
    OperationConflictError,
    RevisionConflictError,
)
from engram.store.limits import MAX_METADATA_BYTES, MAX_STORED_METADATA_BYTES
from engram.worker import keys
from engram.worker.admin import metrics
from engram.worker.consuming.committer import unique_segments
from engram.worker.consuming.membership import first_choice, share
from engram.worker.defaults import MAX_ENTRY_BYTES
from engram.worker.errors import (
    MALFORMED_CAUSES,
    DeadLetteredError,
    MalformedEntryError,
    QueueFullError,
    WaitTimeout,
    error_from_dict,
)
from engram.worker.protocol import (
    Entry,
    Malformed,
    StreamReceipt,
    decode_entry,
    decode_reply,
    encode_entry,
    encode_reply,
    partition_of,
)
from engram.worker.settings import Settings, WorkerConfig


def op(kind: str = "remember", scope: dict[str, str] | None = None, **request: object) -> Operation:
    return Operation.build(kind, scope or {"user_id": "ada"}, request or {"text": "Ada likes tea."})


def test_partition_is_crc32_of_the_canonical_scope_key() -> None:
    scope = {"user_id": "ada", "agent_id": "helper"}
    key = '{"agent_id":"helper","user_id":"ada"}'
    assert Scope.of(scope).key == key
    assert partition_of(scope, 16) == zlib.crc32(key.encode()) % 16
    assert partition_of({"agent_id": "helper", "user_id": "ada"}, 16) == partition_of(scope, 16)


def test_partitions_spread_scopes() -> None:
    seen = {partition_of({"user_id": f"u{i}"}, 16) for i in range(200)}
    assert seen == set(range(16))


def test_a_partition_keys_share_one_cluster_slot() -> None:
    for p in (0, 7, 15):
        slots = {
            key_slot(k.encode()) for k in (keys.stream(p), keys.lease(p), keys.fence_counter(p))
        }
        assert len(slots) == 1
    assert keys.stream(3) == "engram:ops:{3}"
    assert keys.fence_name(3) == "partition:3"


def test_entry_round_trip() -> None:
    original = op(metadata={"k": 1}, text="Ada likes tea.")
    fields = encode_entry(original)
    assert list(fields) == ["op"]
    assert json.loads(fields["op"]) == original.to_dict()
    raw = {b"op": fields["op"].encode()}
    decoded = decode_entry(b"1-0", raw, partition=partition_of(original.scope, 16), partitions=16)
    assert decoded == Entry("1-0", original)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({b"op": b"{not json"}, "not valid JSON"),
        ({b"op": b"\xff\xfe"}, "not UTF-8"),
        ({b"op": b"[]"}, "operation must be an object"),
        ({b"op": b"{}", b"extra": b"1"}, "exactly one field"),
        ({b"payload": b"{}"}, "exactly one field"),
        (
            {
                b"op": json.dumps(
                    {
                        "operation_id": "x1",
                        "kind": "remember",
                        "scope": {"user_id": "a"},
                        "request": {"text": ""},
                    }
                ).encode()
            },
            "must not be empty",
        ),
        (
            {
                b"op": json.dumps(
                    {"operation_id": "x2", "kind": "fly", "scope": {"user_id": "a"}, "request": {}}
                ).encode()
            },
            "operation.kind",
        ),
    ],
)
def test_malformed_entries(fields: dict[bytes, bytes], message: str) -> None:
    decoded = decode_entry("9-0", fields, partition=partition_of({"user_id": "a"}, 4), partitions=4)
    assert isinstance(decoded, Malformed)
    assert isinstance(decoded.error, InvalidRequestError)
    assert message in decoded.error.message


def _op_json(
    request: str, *, operation_id: str = '"odd:1"', scope: str = '{"user_id":"a"}'
) -> bytes:
    return (
        f'{{"operation_id":{operation_id},"kind":"remember","scope":{scope},"request":{request}}}'
    ).encode()


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({b"op": _op_json('{"text":"\\ud800"}')}, "not valid Unicode"),
        ({b"op": _op_json('{"text":"x","metadata":{"k":"\\udfff"}}')}, "not valid Unicode"),
        ({b"op": _op_json('{"text":"x"}', scope='{"user_id":"\\ud800"}')}, "not valid Unicode"),
        ({b"op": b"[" * 100_000 + b"]" * 100_000}, "cannot be read as JSON"),
        ({b"op": _op_json('{"text":"x","importance":' + "9" * 5000 + "}")}, "cannot be read"),
        ({b"op": _op_json('{"text":"x","metadata":{"k":1e999}}')}, "finite numbers"),
        ({b"\xff\xfe": b"{}"}, "exactly one field"),
        ({b"op": _op_json('{"text":"x","text":7}')}, "must be a string"),  # the last key wins
    ],
)
def test_no_entry_is_more_than_malformed(fields: dict[bytes, bytes], message: str) -> None:
    decoded = decode_entry("9-0", fields, partition=partition_of({"user_id": "a"}, 4), partitions=4)
    assert isinstance(decoded, Malformed)
    assert message in decoded.error.message


@pytest.mark.parametrize(
    ("fields", "cause"),
    [
        ({b"op": b"{this is not json"}, "invalid_json"),
        ({b"op": b"[" * 100_000 + b"]" * 100_000}, "invalid_json"),
        ({b"op": b"\xff\xfe"}, "not_utf8"),
        ({b"op": b"x" * (MAX_ENTRY_BYTES + 1)}, "too_large"),
        ({b"\xff\xfe": b"{}"}, "invalid_entry"),
        ({b"op": b"{}", b"extra": b"1"}, "invalid_entry"),
        ({b"op": b"[1, 2]"}, "invalid_request"),
        ({b"op": b'{"kind":"remember","scope":{"user_id":"a"},"request":{}}'}, "missing_field"),
        ({b"op": _op_json('{"text":"x"}', scope="null")}, "missing_field"),
        ({b"op": _op_json('{"text":"x"}', scope='{"colour":"red"}')}, "invalid_scope"),
        ({b"op": _op_json('{"text":"x"}', scope='{"user_id":"\\ud800"}')}, "invalid_scope"),
        ({b"op": _op_json('{"text":"x"}').replace(b'"remember"', b'"fly"')}, "unknown_kind"),
        ({b"op": _op_json('{"text":"x"}').replace(b'"kind"', b'"hue":1,"kind"')}, "unknown_field"),
        ({b"op": _op_json('{"text":3}')}, "invalid_request"),
        ({b"op": _op_json('{"text":"' + "x" * 40_000 + '"}')}, "invalid_request"),
        ({b"op": _op_json('{"text":"x"}', scope='{"user_id":"zed"}')}, "wrong_partition"),
    ],
)  # fmt: skip
def test_a_malformed_entry_says_what_was_wrong(fields: dict[bytes, bytes], cause: str) -> None:
    """Each fault has its own cause, kept in the refusal a waiting producer gets back
    (still an ``invalid_request``) and in the dead letter (issue 29, item 3: every
    malformed letter said ``invalid_request``)."""
    a = partition_of({"user_id": "a"}, 64)
    assert partition_of({"user_id": "zed"}, 64) != a
    decoded = decode_entry("9-0", fields, partition=a, partitions=64)
    assert isinstance(decoded, Malformed) and isinstance(decoded.error, InvalidRequestError)
    assert decoded.error.to_dict()["code"] == "invalid_request"
    assert decoded.error.to_dict()["cause"] == cause and cause in MALFORMED_CAUSES
    back = error_from_dict(decoded.error.to_dict())
    assert isinstance(back, MalformedEntryError) and back.cause == cause


def test_a_worker_takes_metadata_up_to_the_stored_bound_not_beyond() -> None:
    """The doors refuse metadata over MAX_METADATA_BYTES; a writer may ask for up to
    MAX_STORED_METADATA_BYTES (the LangGraph store's documents), so a worker reading the
    stream takes that much, and refuses more, as a malformed entry naming the bound."""
    a = partition_of({"user_id": "a"}, 4)

    def entry(blob: int) -> dict[bytes, bytes]:
        return {b"op": _op_json('{"text":"x","metadata":{"doc":"' + "x" * blob + '"}}')}

    with pytest.raises(InvalidRequestError, match=f"larger than {MAX_METADATA_BYTES} bytes"):
        Operation.build(
            "remember",
            {"user_id": "a"},
            {"text": "x", "metadata": {"doc": "x" * MAX_METADATA_BYTES}},
        )
    taken = decode_entry("9-0", entry(MAX_STORED_METADATA_BYTES - 20), partition=a, partitions=4)
    assert isinstance(taken, Entry)
    assert taken.operation.request.metadata == {"doc": "x" * (MAX_STORED_METADATA_BYTES - 20)}  # type: ignore[union-attr]
    refused = decode_entry("9-0", entry(MAX_STORED_METADATA_BYTES), partition=a, partitions=4)
    assert isinstance(refused, Malformed)
    assert f"larger than {MAX_STORED_METADATA_BYTES} bytes" in refused.error.message


def test_a_refusal_goes_to_a_reply_key_only_if_its_operation_id_is_valid_text() -> None:
    fields = {b"op": _op_json('{"text":3}', operation_id='"op:\\ud800"')}
    decoded = decode_entry("9-0", fields, partition=partition_of({"user_id": "a"}, 4), partitions=4)
    assert isinstance(decoded, Malformed) and decoded.operation_id is None


def test_an_unforeseen_failure_is_still_the_entrys_own() -> None:
    class Exploding(dict):  # type: ignore[type-arg]
        def __iter__(self):  # type: ignore[no-untyped-def]
            raise RuntimeError("boom")

    decoded = decode_entry("9-0", Exploding(), partition=0, partitions=1)
    assert isinstance(decoded, Malformed)
    assert decoded.error.message == "the entry could not be read (RuntimeError)"


def test_malformed_keeps_the_operation_id_so_the_producer_hears_of_it() -> None:
    body = {
        "operation_id": "bad:1",
        "kind": "remember",
        "scope": {"user_id": "a"},
        "request": {"text": 3},
    }
    decoded = decode_entry("1-0", {"op": json.dumps(body)}, partition=0, partitions=1)
    assert isinstance(decoded, Malformed) and decoded.operation_id == "bad:1"
    assert decoded.raw == json.dumps(body)


def test_an_entry_on_the_wrong_partition_is_refused() -> None:
    o = op(scope={"user_id": "zed"})
    right = partition_of(o.scope, 8)
    decoded = decode_entry("1-0", encode_entry(o), partition=(right + 1) % 8, partitions=8)
    assert isinstance(decoded, Malformed)
    assert f"belongs to partition {right}" in decoded.error.message


def test_error_messages_never_quote_memory_text() -> None:
    secret = "my secret diagnosis"
    body = {
        "operation_id": "x",
        "kind": "remember",
        "scope": {"user_id": "a"},
        "request": {"text": secret, "bogus": secret},
    }
    decoded = decode_entry("1-0", {"op": json.dumps(body)}, partition=0, partitions=1)
    assert isinstance(decoded, Malformed)
    assert secret not in decoded.error.message
    bad_json = decode_entry("1-0", {"op": secret + "{"}, partition=0, partitions=1)
    assert isinstance(bad_json, Malformed) and secret not in bad_json.error.message


def _write_result(kind: str = "remember", replayed: bool = False) -> WriteResult:
    receipt = Receipt(
        operation_id="op1",
        kind=kind,
        scope=Scope(user_id="ada"),
        scope_revision=3,
        committed_at=datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC),
        records=(RecordRef("mem_1", 2, "active"),),
        forgotten_revisions=(1, 2) if kind == "forget" else None,
        already_forgotten=False if kind == "forget" else None,
        redaction="none" if kind == "forget" else None,
        stream_entry="5-0",
    )
    return WriteResult(receipt=receipt, replayed=replayed, records=())


def test_receipt_reply_round_trip() -> None:
    envelope = decode_reply(encode_reply(_write_result(replayed=True), "7-1"))
    assert envelope.entry_id == "7-1"
    reply = envelope.outcome
    assert isinstance(reply, StreamReceipt)
    assert reply.operation_id == "op1" and reply.scope_revision == 3 and reply.replayed
    assert reply.records == (RecordRef("mem_1", 2, "active"),)
    assert reply.committed_at == datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert reply.stream_entry == "5-0" and reply.revisions is None
    assert reply.as_dict()["records"] == [{"id": "mem_1", "revision": 2, "status": "active"}]


def test_forget_reply_carries_revisions_and_redaction() -> None:
    reply = decode_reply(encode_reply(_write_result("forget"))).outcome
    assert isinstance(reply, StreamReceipt)
    assert reply.revisions == (1, 2) and reply.already_forgotten is False
    assert reply.as_dict()["redaction"] == "none"


@pytest.mark.parametrize(
    "error",
    [
        RevisionConflictError("stale", expected=1, actual=2, attempts=1),
        OperationConflictError("used"),
        InvalidRequestError("bad"),
        QueueFullError("full"),
        DeadLetteredError("gone"),
    ],
)
def test_error_replies_come_back_as_the_same_class(error: EngramError) -> None:
    back = decode_reply(encode_reply(error, "1-0")).outcome
    assert type(back) is type(error)
    assert back.to_dict() == error.to_dict()


def test_revision_conflict_keeps_its_fields() -> None:
    back = decode_reply(encode_reply(RevisionConflictError("x", expected=4, actual=None))).outcome
    assert isinstance(back, RevisionConflictError)
    assert (back.expected, back.actual, back.attempts) == (4, None, 1)


def test_unknown_codes_and_garbage_are_base_errors() -> None:
    assert type(error_from_dict({"code": "weird", "message": "m"})) is EngramError
    assert type(decode_reply("not json").outcome) is EngramError
    assert type(decode_reply("[]").outcome) is EngramError


def test_wait_timeout_is_both_an_engram_error_and_a_timeout() -> None:
    import engram.worker

    assert engram.worker.TimeoutError is WaitTimeout
    assert issubclass(WaitTimeout, EngramError) and issubclass(WaitTimeout, TimeoutError)


def test_unique_segments_cut_on_a_repeated_operation() -> None:
    a, b = op(text="a"), op(text="b")
    entries = [Entry("1", a), Entry("2", b), Entry("3", a), Entry("4", a)]
    segments = unique_segments(entries, lambda e: e.operation.key)
    assert [[e.entry_id for e in s] for s in segments] == [["1", "2"], ["3"], ["4"]]
    assert unique_segments([], lambda e: ("", "")) == []
    # The same id in another scope is another operation: no cut.
    elsewhere = Operation.from_dict({**a.to_dict(), "scope": {"user_id": "someone-else"}})
    both = [Entry("1", a), Entry("2", elsewhere)]
    assert [[e.entry_id for e in s] for s in unique_segments(both, lambda e: e.operation.key)] == [
        ["1", "2"]
    ]


@pytest.mark.parametrize(("workers", "partitions"), [(1, 16), (3, 16), (5, 16), (16, 4), (4, 4)])
def test_shares_cover_every_partition_once(workers: int, partitions: int) -> None:
    live = [f"w{i}" for i in range(workers)]
    shares = [share(w, live, partitions) for w in live]
    assert sum(shares) == partitions
    assert max(shares) - min(shares) <= 1
    starts = {first_choice(w, live, partitions) for w in live}
    assert len(starts) == min(workers, partitions)


def test_metrics_render_in_prometheus_text_format() -> None:
    client = fakeredis.FakeRedis()
    stats = metrics.BatchStats(entries=3, committed=2, replayed=1, seconds=0.5)
    stats.failed["revision_conflict"] += 1
    stats.dead["malformed"] += 1
    pipe = client.pipeline(transaction=False)
    metrics.record_batch(pipe, stats, "w1")
    pipe.execute()
    client.xgroup_create(keys.stream(0), keys.GROUP, id="0", mkstream=True)
    client.xadd(keys.stream(0), {"op": "{}"})
    text = metrics.render(client, partitions=2, lease_ttl_ms=1000)
    lines = text.splitlines()
    assert "# TYPE engram_ops_committed_total counter" in lines
    assert "engram_ops_committed_total 2" in lines
    assert 'engram_ops_failed_total{code="revision_conflict"} 1' in lines
    assert 'engram_dead_lettered_total{reason="malformed"} 1' in lines
    assert 'engram_stream_lag{partition="0"} 1' in lines
    assert 'engram_stream_length{partition="1"} 0' in lines
    buckets = [ln for ln in lines if ln.startswith("engram_batch_size_bucket")]
    assert buckets[0].startswith('engram_batch_size_bucket{le="1"}')
    assert buckets[-1] == 'engram_batch_size_bucket{le="+Inf"} 1'
    assert 'engram_batch_size_bucket{le="4"} 1' in lines
    assert 'engram_batch_size_bucket{le="1"} 0' in lines  # 3 entries: not in le=1
    for line in lines:
        assert line.startswith("# ") or line.startswith("engram_")


def test_a_tally_writes_many_batches_as_their_sums_once_due() -> None:
    client = fakeredis.FakeRedis()
    tally = metrics.Tally(flush_s=3600)
    for entries in (1, 3, 300):
        stats = metrics.BatchStats(entries=entries, committed=entries, seconds=0.25)
        stats.failed["not_found"] += 1
        tally.add(stats)
    assert tally and tally.take(due_only=True) == []  # not due: nothing to write yet
    twice = metrics.Tally(flush_s=3600)
    for entries in (1, 3, 300, 1, 3, 300):
        again = metrics.BatchStats(entries=entries, committed=entries, seconds=0.25)
        again.failed["not_found"] += 1
        twice.add(again)
    doubled = client.pipeline(transaction=False)
    metrics.record_batches(doubled, twice.take(due_only=False), "w1")
    pipe = client.pipeline(transaction=False)
    metrics.record_batches(pipe, tally.take(due_only=False), "w1")
    # One command per counter, not per batch: six batches cost what three do.
    assert len(pipe.command_stack) == len(doubled.command_stack)
    pipe.execute()
    assert not tally
    counters = metrics.read_counters(client)
    assert counters["ops_committed_total"] == 304
    assert counters['ops_failed_total{code="not_found"}'] == 3
    assert counters["batch_size_count"] == 3 and counters["batch_size_sum"] == 304
    assert counters['batch_size_bucket{le="1"}'] == 1
    assert counters['batch_size_bucket{le="4"}'] == 2
    assert counters['batch_size_bucket{le="+Inf"}'] == 3
    assert counters["batch_seconds_total"] == 0.75
    [interval] = metrics.intervals(client, window_s=10)
    assert (interval.committed, interval.failed) == (304, 3)


def test_batches_are_counted_per_interval_with_a_ttl() -> None:
    client = fakeredis.FakeRedis()
    stats = metrics.BatchStats(entries=4, committed=2, replayed=1)
    stats.failed["not_found"] += 1
    at = 1_700_000_005.0  # interval 170,000,000 (10 s each)
    for now_s in (at, at + 3, at + 10):
        pipe = client.pipeline(transaction=False)
        metrics.record_batch(pipe, stats, "w1", now_s=now_s)
        pipe.execute()
    pipe = client.pipeline(transaction=False)
    metrics.record_batch(pipe, metrics.BatchStats(entries=0), "w1", now_s=at + 20)
    pipe.execute()
    assert not client.exists(keys.rate(170_000_002)), "an empty batch writes no interval"
    assert 0 < client.ttl(keys.rate(170_000_000)) <= 3600
    series = metrics.intervals(client, window_s=40, now_s=at + 20)
    assert [(i.start_s, i.committed, i.replayed, i.failed, i.dead) for i in series] == [
        (1_699_999_990, 0, 0, 0, 0),
        (1_700_000_000, 4, 2, 2, 0),
        (1_700_000_010, 2, 1, 1, 0),
        (1_700_000_020, 0, 0, 0, 0),
    ]
    assert series[1].operations == 8


def test_settings_from_env() -> None:
    s = Settings.from_env(
        {
            "ENGRAM_PARTITIONS": "8",
            "ENGRAM_LEASE_TTL_MS": "2000",
            "REDIS_URL": "redis://x",
            "ENGRAM_EMBEDDER": "hashing:64",
            "ENGRAM_LINGER_MS": "20",
        }
    )
    assert s.worker.partitions == 8 and s.worker.lease_ttl_ms == 2000
    assert s.worker.linger_ms == 20 and WorkerConfig().linger_ms == 0
    assert s.worker.lease_margin_ms == 400  # a fifth of a short lease
    assert s.redis_url == "redis://x" and s.embedder == "hashing:64"
    assert Settings.from_env({}).worker == WorkerConfig()
    with pytest.raises(ConfigError, match="ENGRAM_PARTITIONS"):
        Settings.from_env({"ENGRAM_PARTITIONS": "many"})
    with pytest.raises(ValueError):
        WorkerConfig(lease_ttl_ms=1000, lease_margin_ms=600)
