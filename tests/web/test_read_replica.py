"""The JSON API's reads on a store with a real streaming replica: a write waited for
answers its commit position, and a read passing it as ``after`` sees the write even
while the replica stands still (tests/replica_fixtures.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from psycopg.conninfo import make_conninfo

from engram.store import Store
from tests.replica_fixtures import Replica, replica  # noqa: F401 (the fixture)
from tests.web_fixtures import Web


@pytest.fixture(scope="module")
def store(dsn: str, replica: Replica) -> Iterator[Store]:  # noqa: F811
    """Overrides the suite's: this module's app and worker read through the replica."""
    Store.connect(dsn).close()  # migrated on the primary
    replica.wait_caught_up(dsn)
    with Store.connect(dsn, read_dsn=replica.dsn_like(dsn)) as replicated:
        yield replicated


def test_a_read_after_the_receipts_position_sees_the_write(
    web: Web,
    replica: Replica,  # noqa: F811
    start_worker: Any,
    scope: dict[str, str],
) -> None:
    body = {"kind": "remember", "scope": scope, "request": {"text": "the tide tables"}}
    with replica.paused(), start_worker(web.store):
        answered = web.client.post("/api/v1/operations?wait=10", json=body)
        assert answered.status_code == 200, answered.text
        receipt = answered.json()
        position, record_id = receipt["position"], receipt["records"][0]["id"]
        # Without a position: the replica as it is (replay paused: not there yet).
        assert web.client.get(f"/api/v1/records/{record_id}").status_code == 404
        found = web.client.get(f"/api/v1/records/{record_id}", params={"after": position})
        assert found.status_code == 200 and found.json()["text"] == "the tide tables"
        history = web.client.get(f"/api/v1/history/{record_id}", params={"after": position})
        assert [r["revision"] for r in history.json()["revisions"]] == [1]
        recall = {"scope": scope, "text": "tide tables", "after": position}
        hits = web.client.post("/api/v1/recall", json=recall).json()["hits"]
        assert [h["record"]["id"] for h in hits] == [record_id]


@pytest.mark.parametrize("bad", ["nonsense", "1/2/3", "G/0"])
def test_a_bad_position_is_a_bad_request(web: Web, scope: dict[str, str], bad: str) -> None:
    read = web.client.get("/api/v1/records/r1", params={"after": bad})
    assert read.status_code == 400 and "after" in read.json()["error"]["message"]
    recall = web.client.post("/api/v1/recall", json={"scope": scope, "after": bad})
    assert recall.status_code == 422  # a body that does not hold: as for every field


def test_the_replicas_connections_are_bounded_as_the_primarys(
    dsn: str,
    replica: Replica,  # noqa: F811
) -> None:
    """ENGRAM_WEB_STATEMENT_TIMEOUT holds on the read replica's pool too (the pages read
    there), after whatever options the replica's DSN gives."""
    read_dsn = make_conninfo(replica.dsn_like(dsn), options="-c application_name=replica-reader")
    with Store.connect(dsn, read_dsn=read_dsn, statement_timeout_s=0.2) as bounded:
        assert bounded.reads.replica is not None
        with bounded.reads.replica.connection() as conn:
            shown = conn.execute(
                "SELECT current_setting('statement_timeout'), current_setting('application_name'),"
                " pg_is_in_recovery()"
            ).fetchone()
        assert shown == ("200ms", "replica-reader", True)
        with bounded.pool.connection() as conn:
            assert conn.execute("SHOW statement_timeout").fetchone() == ("200ms",)
