"""Operation ids and record ids belong to their scope (issue 36, items 2, 3 and 9),
through /api/v1 with two scoped tokens, ada's and bob's, and the operator's pages: the
same operation id in two scopes is two operations, each applied once, and the same
record id two records; nothing about one is visible from the other (receipts, replays,
vouches, the conflict refusal, reads, histories, forgets); a forgotten record id is
refused again in its own scope only; the operator names the scope when an id is in
several; find and the tombstones name each scope's own; and a forget in a scope that
does not hold the record writes no audit row naming it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import pytest

from tests.helpers import rows_containing
from tests.web_fixtures import Web


@dataclass(frozen=True)
class Two:
    """Ada's and bob's scopes (no other test's) and their tokens' headers."""

    ada_scope: dict[str, str]
    bob_scope: dict[str, str]
    ada: dict[str, str]
    bob: dict[str, str]


@pytest.fixture
def two(web: Web, scope: dict[str, str]) -> Two:
    ada_scope = {"user_id": f"{scope['user_id']}-ada"}
    bob_scope = {"user_id": f"{scope['user_id']}-bob"}
    ada, _ = web.store.tokens.create(f"{scope['user_id'][:50]}-ada", ada_scope, by="grace")
    bob, _ = web.store.tokens.create(f"{scope['user_id'][:50]}-bob", bob_scope, by="grace")
    return Two(ada_scope, bob_scope, bearer(ada), bearer(bob))


SHARED = "shared-id"  # used by this module's one test of ambiguity only


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def write(web: Web, auth: dict[str, str], body: dict[str, Any]) -> Any:
    return web.client.post("/api/v1/operations?wait=10", headers=auth, json=body)


def remember(op_id: str, text: str) -> dict[str, Any]:
    return {"operation_id": op_id, "kind": "remember", "request": {"text": text}}


def test_a_vouch_in_one_scope_shows_nothing_of_the_same_id_in_another(
    web: Web, start_worker: Any, two: Two
) -> None:
    ada, bob, ADA, BOB = two.ada, two.bob, two.ada_scope, two.bob_scope
    with start_worker(web.store):
        bobs = write(web, bob, remember("import-bob-0001", "Bob's salary is 91k."))
        assert bobs.status_code == 200, bobs.text
        # Ada's write under bob's id is her own operation: applied, not a conflict.
        adas = write(web, ada, remember("import-bob-0001", "Ada likes tea."))
        assert adas.status_code == 200, adas.text
        assert adas.json()["replayed"] is False and adas.json()["scope"] == ADA
    for path in ("/api/v1/operations/import-bob-0001", "/api/v1/receipts/import-bob-0001"):
        seen = web.client.get(path, headers=ada)
        assert seen.status_code == 200 and "91k" not in seen.text
        assert BOB["user_id"] not in seen.text
    state = web.client.get("/api/v1/operations/import-bob-0001", headers=ada).json()
    assert state["receipt"]["scope"] == ADA and state["receipt"]["authenticated"] is True
    assert state["receipt"]["records"] != bobs.json()["records"]
    mine = web.client.get("/api/v1/operations/import-bob-0001", headers=bob).json()
    assert mine["receipt"]["scope"] == BOB and mine["receipt"]["records"] == bobs.json()["records"]
    assert mine["receipt"]["authenticated"] is True
    # A token asking for another scope's look-up is answered as for nothing there.
    other = web.client.get(f"/api/v1/operations/import-bob-0001?{urlencode(BOB)}", headers=ada)
    assert other.status_code == 404 and "91k" not in other.text


def test_a_redacted_receipt_of_another_scope_is_not_replayed(
    web: Web, start_worker: Any, two: Two
) -> None:
    ada, bob, ADA, BOB = two.ada, two.bob, two.ada_scope, two.bob_scope
    with start_worker(web.store):
        kept = write(web, bob, remember("bob-chat-7", "Bob's door code is 4412."))
        record = kept.json()["records"][0]["id"]
        forgot = write(web, bob, {"kind": "forget", "request": {"id": record}})
        assert forgot.status_code == 200, forgot.text
        adas = write(web, ada, remember("bob-chat-7", "Ada walks to work."))
        assert adas.status_code == 200, adas.text
        assert adas.json()["replayed"] is False and adas.json()["scope"] == ADA
    [written] = adas.json()["records"]
    got = web.client.get(f"/api/v1/records/{written['id']}", headers=ada).json()
    assert got["text"] == "Ada walks to work."  # applied, not silently dropped
    bobs = web.store.receipt("bob-chat-7", BOB)
    assert bobs is not None and bobs.redacted and bobs.replays == 0


def test_an_id_another_scope_used_first_does_not_block_or_reveal(
    web: Web, start_worker: Any, two: Two
) -> None:
    ada, bob, ADA, BOB = two.ada, two.bob, two.ada_scope, two.bob_scope
    with start_worker(web.store):
        squat = write(web, ada, remember("bob-next", "Ada's squat."))
        assert squat.status_code == 200 and squat.json()["replayed"] is False
        bobs = write(web, bob, remember("bob-next", "Bob's own write."))
        assert bobs.status_code == 200, bobs.text  # no operation_conflict
        assert bobs.json()["replayed"] is False and bobs.json()["scope"] == BOB
        # Ada's vouch for the id did not take bob's place: his write is his, verified.
        assert bobs.json()["authenticated"] is True
        # Each id repeated in its own scope with another request is still a conflict,
        # which says nothing of the other scope.
        conflict = write(web, bob, remember("bob-next", "Something else."))
        assert conflict.status_code == 409
        assert conflict.json()["error"]["code"] == "operation_conflict"
    assert web.store.scope_revision(BOB) == 1 and web.store.scope_revision(ADA) == 1


def test_the_operator_names_the_scope_of_an_id_in_several(
    web: Web, start_worker: Any, two: Two
) -> None:
    ada, bob, ADA, BOB = two.ada, two.bob, two.ada_scope, two.bob_scope
    with start_worker(web.store):
        write(web, ada, remember(SHARED, "Ada's."))
        write(web, bob, remember(SHARED, "Bob's."))
    for path in (f"/api/v1/operations/{SHARED}", f"/api/v1/receipts/{SHARED}"):
        ambiguous = web.client.get(path)
        assert ambiguous.status_code == 409, path
        error = ambiguous.json()["error"]
        assert error["code"] == "operation_ambiguous"
        assert sorted(s["user_id"] for s in error["scopes"]) == sorted(
            [ADA["user_id"], BOB["user_id"]]
        )
    named = web.client.get(f"/api/v1/operations/{SHARED}?{urlencode(BOB)}").json()
    assert named["receipt"]["scope"] == BOB
    choose = web.client.get(f"/operations/{SHARED}")
    assert choose.status_code == 409  # the dashboard lists the scopes to choose from
    for scope in (ADA, BOB):
        assert f'href="/operations/{SHARED}?{urlencode(scope)}"' in choose.text
    page = web.client.get(f"/receipts/{SHARED}?{urlencode(ADA)}")
    assert page.status_code == 200 and ADA["user_id"] in page.text


def test_a_forget_in_a_scope_without_the_record_names_it_nowhere(
    web: Web, start_worker: Any, two: Two
) -> None:
    """Item 9: ada's no-op forget of bob's record writes no audit row targeting it."""
    ada, ADA, BOB = two.ada, two.ada_scope, two.bob_scope
    bobs = web.remember(BOB, "Bob's record.")
    adas = web.remember(ADA, "Ada's record.")
    with start_worker(web.store):
        noop = write(web, ada, {"kind": "forget", "request": {"id": bobs}, "reason": "probe"})
        assert noop.status_code == 200, noop.text
        assert noop.json()["revisions"] == [] and noop.json()["already_forgotten"] is False
        real = write(web, ada, {"kind": "forget", "request": {"id": adas}, "reason": "asked"})
        assert real.status_code == 200, real.text
    assert web.store.audit.about(bobs) == []
    assert [a.action for a in web.store.audit.about(adas)] == ["record.forget"]
    assert web.client.get(f"/api/v1/records/{bobs}").status_code == 200  # untouched


RID = "diagnosis-7"  # chosen by both clients: used by this module only
# Markers end in a letter no English suffix rule strips: the stemmed index holds them whole.
ADAS = "Ada's diagnosis is zanzibarq."
BOBS = "Bob's diagnosis is quokkaz."


def remember_as(rid: str, text: str) -> dict[str, Any]:
    return {"kind": "remember", "request": {"text": text, "id": rid}}


def test_one_id_in_two_scopes_is_two_records_each_read_and_forgotten_in_its_own(
    web: Web, start_worker: Any, two: Two
) -> None:
    ada, bob, ADA, BOB = two.ada, two.bob, two.ada_scope, two.bob_scope
    with start_worker(web.store):
        bobs = write(web, bob, remember_as(RID, BOBS))
        assert bobs.status_code == 200, bobs.text
        # Ada's client chose the same id: her own record, not a refusal that says the
        # id is used.
        adas = write(web, ada, remember_as(RID, ADAS))
        assert adas.status_code == 200, adas.text
        assert adas.json()["scope"] == ADA and adas.json()["records"][0]["revision"] == 1
        for auth, text in ((ada, ADAS), (bob, BOBS)):
            got = web.client.get(f"/api/v1/records/{RID}", headers=auth)
            assert got.status_code == 200 and got.json()["text"] == text
            history = web.client.get(f"/api/v1/history/{RID}", headers=auth).json()
            assert [(r["revision"], r["text"]) for r in history["revisions"]] == [(1, text)]

        forgot = write(web, ada, {"kind": "forget", "request": {"id": RID}})
        assert forgot.status_code == 200, forgot.text
        assert forgot.json()["revisions"] == [1]
        # Bob's record of that id is untouched, and his writes to it go on.
        got = web.client.get(f"/api/v1/records/{RID}", headers=bob)
        assert got.status_code == 200 and got.json()["text"] == BOBS
        revised = write(
            web,
            bob,
            {"kind": "revise", "request": {"id": RID, "text": BOBS + " Better."}},
        )
        assert revised.status_code == 200, revised.text
        # Ada's forgotten id is refused again in her scope, and only there.
        again = write(web, ada, remember_as(RID, "Ada again."))
        assert again.status_code == 409 and again.json()["error"]["code"] == "revision_conflict"
    gone = web.client.get(f"/api/v1/records/{RID}", headers=ada)
    assert gone.status_code == 404 and "was forgotten" in gone.json()["error"]["message"]
    history = web.client.get(f"/api/v1/history/{RID}", headers=bob).json()
    assert [r["text"] for r in history["revisions"]] == [BOBS, BOBS + " Better."]
    with web.store.pool.connection() as conn:
        assert rows_containing(conn, "zanzibarq") == []  # ada's text is in no table
        assert "engram_revisions.text" in rows_containing(conn, "quokkaz")

    # The operator's bare id: two scopes hold it (ada's as a tombstone), so a choice.
    for path in (f"/api/v1/records/{RID}", f"/api/v1/history/{RID}"):
        ambiguous = web.client.get(path)
        assert ambiguous.status_code == 409, path
        error = ambiguous.json()["error"]
        assert error["code"] == "record_ambiguous"
        assert sorted(s["user_id"] for s in error["scopes"]) == sorted(
            [ADA["user_id"], BOB["user_id"]]
        )
    named = web.client.get(f"/api/v1/records/{RID}?{urlencode(BOB)}")
    assert named.status_code == 200 and named.json()["text"] == BOBS + " Better."
    choose = web.client.get(f"/records/{RID}")
    assert choose.status_code == 409 and "record_ambiguous" in choose.text
    for scope in (ADA, BOB):
        assert f'href="/records/{RID}?{urlencode(scope)}"' in choose.text
    page = web.client.get(f"/records/{RID}?{urlencode(BOB)}")
    assert page.status_code == 200 and "quokkaz" in page.text
    tomb = web.client.get(f"/records/{RID}?{urlencode(ADA)}")
    assert tomb.status_code == 200 and "forgotten" in tomb.text and "quokkaz" not in tomb.text
    # A token's look-up is in its own scope, whatever it names.
    other = web.client.get(f"/api/v1/records/{RID}?{urlencode(BOB)}", headers=ada)
    assert other.status_code == 404 and "quokkaz" not in other.text

    # Find names each scope's own; the tombstones are ada's only.
    found = web.client.get(f"/api/v1/find?q={RID}&by=id").json()["by_id"]["hits"]
    assert sorted((h["scope"]["user_id"], h["status"]) for h in found) == sorted(
        [(ADA["user_id"], "forgotten"), (BOB["user_id"], "active")]
    )
    for scope, held in ((ADA, [RID]), (BOB, [])):
        listed = web.client.get(f"/api/v1/scopes/{web.scope_id(scope)}/tombstones").json()
        assert [t["record_id"] for t in listed["items"]] == held


def test_a_revise_creating_an_id_another_scope_holds_creates_the_callers_own(
    web: Web, start_worker: Any, two: Two
) -> None:
    ada, bob, ADA = two.ada, two.bob, two.ada_scope
    with start_worker(web.store):
        write(web, bob, remember_as("runbook", "Bob's runbook."))
        created = write(
            web,
            ada,
            {
                "kind": "revise",
                "request": {"id": "runbook", "text": "Ada's runbook.", "expected_revision": 0},
            },
        )
        assert created.status_code == 200, created.text
        assert created.json()["scope"] == ADA
    assert web.client.get("/api/v1/records/runbook", headers=ada).json()["text"] == (
        "Ada's runbook."
    )
    bobs = web.client.get("/api/v1/history/runbook", headers=bob).json()["revisions"]
    assert [(r["revision"], r["text"]) for r in bobs] == [(1, "Bob's runbook.")]
