"""A refused revise touched no record, but it was about one: the receipts list names
that record in its record column, and the record's page (and the receipts filtered
by record, page and API) list the refusal with the receipts that changed it."""

from __future__ import annotations

from urllib.parse import urlencode

from engram.store import Operation, WriteResult
from tests.web_fixtures import EMBEDDER, Web


def test_a_refused_revise_shows_with_the_record_it_named(web: Web) -> None:
    scope = {"user_id": "refused-revise"}
    first = Operation.build("remember", scope, {"text": "Ada likes tea."})
    [made] = web.store.execute([first], EMBEDDER)
    assert isinstance(made, WriteResult)
    rid = made.records[0].id
    stale = Operation.build(
        "revise", scope, {"id": rid, "text": "Ada likes coffee.", "expected_revision": 7},
        "refused-revise:1",
    )  # fmt: skip
    web.store.execute([stale], EMBEDDER)
    receipt = web.store.browse.receipt(stale.operation_id)
    assert receipt is not None and receipt.receipt.error is not None
    assert not receipt.receipt.records  # it touched none
    listed = web.client.get(f"/receipts?scope={web.scope_id(scope)}").text
    row = listed[listed.index("refused-revise:1") :]
    row = row[: row.index("</tr>")]
    link = f'href="/records/{rid}?{urlencode(scope)}">{rid}</a>'
    assert f'{link} <span class="muted">(refused)</span>' in row
    by_record = web.client.get(f"/receipts?record={rid}").text
    assert "refused-revise:1" in by_record and first.operation_id in by_record
    api = web.client.get("/api/v1/receipts", params={"record": rid}).json()
    assert {i["operation_id"] for i in api["items"]} == {stale.operation_id, first.operation_id}
    page = web.client.get(f"/records/{rid}").text
    assert "refused-revise:1" in page
    # Refusals about another record stay off this one's page.
    other = Operation.build(
        "revise", scope, {"id": "mem_someone_else", "text": "x", "expected_revision": 1}
    )
    web.store.execute([other], EMBEDDER)
    assert other.operation_id not in web.client.get(f"/records/{rid}").text
