"""A producer names whoever it likes in ``requested_by``: every page showing that
name says it is claimed, not verified; the dashboard's own actions, done by the
operator signed in, say so without the claim."""

from __future__ import annotations

import re

from engram.store import Operation
from tests.web_fixtures import EMBEDDER, Web

CLAIMED = re.compile(
    r'<span class="claimed" title="[^"]*not verified[^"]*">\(claimed\) (\S+)</span>'
)


def claimed_names(html: str) -> list[str]:
    return CLAIMED.findall(html)


def test_a_producers_requested_by_is_shown_as_claimed_everywhere(web: Web) -> None:
    scope = {"user_id": "claimed-ada"}
    record = web.remember(scope, "Ada's passport number.")
    forget = Operation.build("forget", scope, {"id": record}, "claimed:forget", requested_by="ada")
    remember = Operation.build(
        "remember", scope, {"text": "Ada likes tea."}, "claimed:remember", requested_by="mallory"
    )
    web.store.execute([forget, remember], EMBEDDER)
    sid = web.scope_id(scope)

    pages = {
        "/receipts": {"ada", "mallory"},
        "/receipts/claimed:forget": {"ada"},
        "/receipts/claimed:remember": {"mallory"},
        "/operations/claimed:forget": {"ada"},
        f"/records/{record}": {"ada"},  # the tombstone
        f"/scopes/{sid}?status=forgotten": {"ada"},
        "/audit": {"ada"},
    }
    for path, names in pages.items():
        html = web.client.get(path).text
        assert set(claimed_names(html)) >= names, path
        assert ">ada<" not in html and ">mallory<" not in html, path  # never shown bare


def test_the_dashboards_signed_in_names_are_not_marked_claimed(web: Web) -> None:
    web.store.audit.record("grace", "reembed.start", "reembed-7", {"model": "minilm"})
    html = web.client.get("/audit").text
    actions = html[html.index("<h2>Other actions</h2>") :]
    assert ">grace</a></td>" in actions and claimed_names(actions) == []  # a link to its rows
    # Who asked an action: an operator signed in, a token's operator or the CLI's --by.
    assert 'title="the operator signed in to the dashboard' in actions
