"""Bidirectional controls in memory text: U+202E (RIGHT-TO-LEFT OVERRIDE) would show a
record's text, and what follows it, reversed (a spoofing trick). Every page that shows
memory text shows each control as a visible marker, inside an isolating ``<bdi>``."""

from __future__ import annotations

from html.parser import HTMLParser

from engram.web.render import BIDI_CONTROLS, bidi_visible
from tests.web_fixtures import Web

RLO = "\u202e"
TEXT = f"Pay the invoice to account {RLO}4321-gnp.exe zanzibarq"


class Isolation(HTMLParser):
    """Each bidi marker found, and whether an isolating element holds it."""

    def __init__(self) -> None:
        super().__init__()
        self.open: list[tuple[str, str]] = []
        self.markers: list[bool] = []  # one per marker: inside a <bdi class="memory">?

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.open.append((tag, dict(attrs).get("class") or ""))

    def handle_endtag(self, tag: str) -> None:
        while self.open and self.open.pop()[0] != tag:
            pass

    def handle_data(self, data: str) -> None:
        if "\u27e8RLO\u27e9" in data:
            self.markers.append(("bdi", "memory") in self.open)


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
