"""Bidirectional controls in memory text: U+202E (RIGHT-TO-LEFT OVERRIDE) would show a
record's text, and what follows it, reversed (a spoofing trick). Every page that shows
memory text shows each control as a visible marker, inside an isolating ``<bdi>``; so
does every page for what a person or an agent supplied (scope values, who asked, token
names, reasons)."""

from __future__ import annotations

import json
from html.parser import HTMLParser

from engram.store import Operation, Store
from engram.web.render import BIDI_CONTROLS, bidi_visible
from engram.worker import keys
from engram.worker.embedded.runtime import connect_redis
from engram.worker.protocol import encode_entry
from tests.web_fixtures import EMBEDDER, Web

RLO = "\u202e"
TEXT = f"Pay the invoice to account {RLO}4321-gnp.exe zanzibarq"


class Isolation(HTMLParser):
    """Each bidi marker found, and whether an isolating element holds it."""

    def __init__(self) -> None:
        super().__init__()
        self.open: list[tuple[str, str]] = []
        self.markers: list[bool] = []  # one per marker: inside an isolating <bdi>?

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.open.append((tag, dict(attrs).get("class") or ""))

    def handle_endtag(self, tag: str) -> None:
        while self.open and self.open.pop()[0] != tag:
            pass

    def handle_data(self, data: str) -> None:
        # A <title> holds text only: there the marker is shown as text, nothing to isolate.
        if "\u27e8RLO\u27e9" in data and not any(t == "title" for t, _ in self.open):
            self.markers.append(any(t == "bdi" and c in ISOLATING for t, c in self.open))


ISOLATING = ("memory", "supplied")


def isolated_markers(html: str) -> list[bool]:
    parser = Isolation()
    parser.feed(html)
    return parser.markers


def test_every_control_is_shown_as_a_marker() -> None:
    for char, name in BIDI_CONTROLS.items():
        shown = str(bidi_visible(f"a{char}b<i>"))
        assert char not in shown and f"\u27e8{name}\u27e9" in shown and "&lt;i&gt;" in shown


def test_a_right_to_left_override_is_shown_and_isolated_on_every_page(web: Web) -> None:
    scope = {"user_id": "mallory"}
    record = web.remember(scope, TEXT, metadata={"note": f"see {RLO}fdp.txt"})
    web.store.session(scope, embedder=None).revise(record, text=TEXT + " paid")
    sid = web.scope_id(scope)
    recalled = web.client.post(
        f"/scopes/{sid}/recall", data={"csrf": web.csrf(), "text": "invoice zanzibarq"}
    )
    pages = {
        "record, its history and diff": web.client.get(f"/records/{record}").text,
        "scope": web.client.get(f"/scopes/{sid}").text,
        "forget": web.client.get(f"/forget/{record}").text,
        "find": web.client.get("/find?q=zanzibarq").text,
        "recall": recalled.text,
    }
    for name, html in pages.items():
        assert RLO not in html, f"{name}: the control itself is on the page"
        markers = isolated_markers(html)
        assert markers, f"{name}: no visible marker"
        assert all(markers), f"{name}: a marker outside <bdi class=memory>: {markers}"
    # The record page: the current text, the history's diff, the metadata (twice).
    assert len(isolated_markers(pages["record, its history and diff"])) >= 4


def test_what_a_person_or_an_agent_supplied_is_shown_isolated_with_its_controls_visible(
    web: Web,
) -> None:
    """Issue 42, item 2: a scope with ``chat_id="\u202eevil"`` showed as "chat_id=live",
    ``requested_by "\u202eroot"`` as "(claimed) toor", a bulk why reversed the rest of its
    sentence. Each is shown as memory text is: isolated, its controls visible."""
    scope = {"user_id": "mallory", "chat_id": f"{RLO}evil"}
    [result] = web.store.execute(
        [Operation.build("remember", scope, {"text": "plain"}, requested_by=f"{RLO}root")],
        EMBEDDER,
    )
    record, op_id = result.records[0].id, result.receipt.operation_id  # type: ignore[union-attr]
    sid = web.scope_id(scope)
    token = f"{RLO}agent-lave"
    csrf = web.csrf("/tokens")
    created = web.client.post("/tokens", data={
        "csrf": csrf, "name": token, "scope": json.dumps(scope), "can_get": "on",
        "why": f"{RLO}for the nightly sync",
    })  # fmt: skip
    assert created.status_code == 201, created.text
    paused = web.client.post(
        "/pause/partition", data={"csrf": csrf, "partition": "1", "reason": f"{RLO}stuck"}
    )
    assert paused.status_code == 303
    web.redis.delete(keys.DEAD_LETTERS)
    op = Operation.build("remember", scope, {"text": "x"})
    web.redis.xadd(keys.DEAD_LETTERS, {
        "partition": 0, "entry": "1-0", "operation_id": op.operation_id, "reason": "failed",
        "error": json.dumps({"code": "dead_lettered", "message": "no"}), "deliveries": 1,
        "at_ms": 1, "op": encode_entry(op)["op"],
    })  # fmt: skip
    dry = web.client.get("/dead-letters/bulk?action=discard&chat_id=%E2%80%AEevil").text
    assert '<strong class="bulk-count">1</strong>' in dry  # the filter's value kept whole
    form = {"csrf": csrf, "action": "discard", "chat_id": f"{RLO}evil", "count": "1"}
    form["digest"] = dry.split('name="digest" value="', 1)[1].split('"', 1)[0]
    done = web.client.post("/dead-letters/bulk", data={**form, "why": f"{RLO}cleanup done"})
    assert done.status_code == 200 and "Discarded 1 dead letter" in done.text
    try:
        pages = {
            "scopes": web.client.get("/scopes?user_id=mallory").text,
            "scope": web.client.get(f"/scopes/{sid}").text,
            "receipts": web.client.get("/receipts?user_id=mallory").text,
            "receipt": web.client.get(f"/receipts/{op_id}").text,
            "record": web.client.get(f"/records/{record}").text,
            "audit": web.client.get("/audit").text,
            "overview": web.client.get("/").text,
            "tokens": web.client.get("/tokens").text,
            "token": web.client.get("/tokens/%E2%80%AEagent-lave").text,
            "bulk done": done.text,
            "bulk dry run": dry,
        }
    finally:
        web.client.post("/resume/partition/1", data={"csrf": csrf})
    for name, html in pages.items():
        visible = html.split("<form", 1)[0] if name == "bulk dry run" else html
        assert RLO not in visible, f"{name}: the control itself is on the page"
        if name == "overview":
            continue  # a pause's reason is kept printable: nothing of it to mark
        markers = isolated_markers(html)
        assert markers, f"{name}: no visible marker"
        assert all(markers), f"{name}: a marker outside an isolating <bdi>: {markers}"
    # What was spoofed reads as it is: the override named, the text in its order.
    assert '<bdi class="supplied"><span class="bidi-control"' in pages["receipt"]
    assert "(claimed) <bdi" in pages["receipt"]
    # The dry run's form carries the value exactly, so that confirming takes the same.
    assert f'name="chat_id" value="{RLO}evil"' in dry


def test_the_signed_in_name_is_shown_isolated_with_its_controls_visible(
    store: Store, redis_url: str
) -> None:
    """Issue 42, item 2: the signed-in name (a person types it at /login)."""
    from tests.web.test_auth import guarded, sign_in

    client = connect_redis(redis_url)
    with guarded(store, client) as http:
        assert sign_in(http, name=f"{RLO}toor").status_code == 303
        html = http.get("/").text
    client.close()
    assert RLO not in html
    who = html.split('class="who">', 1)[1].split("</div>", 1)[0]
    assert '<b><bdi class="supplied"><span class="bidi-control"' in who
    assert all(isolated_markers(html))
