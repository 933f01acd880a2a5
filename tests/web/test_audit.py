"""The audit trail's page and ``/api/v1/audit``: details read as values, not Python
reprs, and the rows are filtered by action, who asked, target and a span of time."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from engram.store.audit import AuditFilter
from engram.store.errors import InvalidRequestError
from engram.web.render import detail_value
from tests.web_fixtures import Web


def test_a_detail_value_reads_as_json_or_a_word() -> None:
    assert [detail_value(v) for v in (None, True, False, 3, 0.5)] == [
        "null", "true", "false", "3", "0.5",
    ]  # fmt: skip
    assert detail_value("minilm") == "minilm"
    assert detail_value("disk full") == '"disk full"'  # text with spaces stays one value
    assert [detail_value(v) for v in ("None", "null", "true", "7", "")] == [
        "None", '"null"', '"true"', '"7"', '""',
    ]  # fmt: skip


def test_the_page_shows_details_as_values_not_python_reprs(web: Web) -> None:
    mark = f"t-{uuid.uuid4().hex[:8]}"
    web.store.audit.record(
        "ops", "jobs.resume", mark, {"was_paused": True, "reason": None, "n": 2, "why": "it broke"}
    )
    page = web.client.get(f"/audit?target={mark}").text
    row = page[page.index(f">{mark}</a>") :]
    row = row[: row.index("</tr>")]
    assert "True" not in row and "None" not in row
    for shown in ("was_paused: true", "reason: null", "n: 2", "why: &#34;it broke&#34;"):
        assert shown in row
    # Each field a line of its own, and nothing between them (issue 42, item 11: each
    # was followed by a line holding only ",").
    cell = row.split('<td class="mono small">', 1)[1].split("</td>", 1)[0]
    assert "," not in cell and cell.count('<span class="detail">') == 4


def test_the_page_and_the_api_filter_by_action_who_target_and_time(web: Web) -> None:
    mark = uuid.uuid4().hex[:8]
    rows = [
        web.store.audit.record(f"ada-{mark}", "jobs.pause", f"jobs-{mark}"),
        web.store.audit.record(f"ada-{mark}", "jobs.resume", f"jobs-{mark}"),
        web.store.audit.record(f"bob-{mark}", "jobs.pause", f"other-{mark}"),
    ]
    api = web.client

    def targets(**query: str) -> list[tuple[str, str]]:
        answer = api.get("/api/v1/audit", params={"limit": "50", **query})
        assert answer.status_code == 200, answer.text
        return [(e["requested_by"], e["action"]) for e in answer.json()["items"]]

    assert targets(by=f"ada-{mark}") == [
        (f"ada-{mark}", "jobs.resume"),
        (f"ada-{mark}", "jobs.pause"),
    ]
    assert targets(by=f"ada-{mark}", action="jobs.pause") == [(f"ada-{mark}", "jobs.pause")]
    assert targets(target=f"other-{mark}") == [(f"bob-{mark}", "jobs.pause")]
    # Time: since is at or after, until before.
    second = rows[1].at.isoformat()
    assert targets(by=f"ada-{mark}", since=second) == [(f"ada-{mark}", "jobs.resume")]
    assert targets(by=f"ada-{mark}", until=second) == [(f"ada-{mark}", "jobs.pause")]
    later = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    assert targets(by=f"ada-{mark}", since=later) == []
    # A page of one goes on with the same filter.
    first = api.get("/api/v1/audit", params={"by": f"ada-{mark}", "limit": "1"}).json()
    rest = api.get(
        "/api/v1/audit", params={"by": f"ada-{mark}", "limit": "1", "cursor": first["next"]}
    ).json()
    assert [e["action"] for e in first["items"] + rest["items"]] == ["jobs.resume", "jobs.pause"]

    page = web.client.get(f"/audit?by=ada-{mark}&action=jobs.pause")
    assert page.status_code == 200
    assert f"jobs-{mark}" in page.text and f"other-{mark}" not in page.text
    assert "Actions matching the filter" in page.text and "Forgets, latest first" not in page.text
    assert "<option selected>jobs.pause</option>" in page.text  # the form shows it back
    empty = web.client.get(f"/audit?by=nobody-{mark}").text
    assert "No action matches the filter." in empty

    for bad in ({"action": "jobs.explode"}, {"since": "yesterday"}, {"who": "ada"}):
        assert api.get("/api/v1/audit", params=bad).status_code == 400
        assert web.client.get("/audit", params=bad).status_code == 400


@pytest.mark.parametrize("bad", [{"action": "nope"}, {"requested_by": "x" * 201}, {"target": " "}])
def test_the_filter_is_checked_in_the_store(bad: dict[str, str]) -> None:
    with pytest.raises(InvalidRequestError):
        AuditFilter(**bad)  # type: ignore[arg-type]
