"""The dashboard's pages against the real PostgreSQL and valkey (Starlette's TestClient)."""

from __future__ import annotations

import json
import logging
import re
import time
from datetime import UTC, datetime, timedelta
from html.parser import HTMLParser
from typing import Any
from urllib.parse import quote

import pytest

from engram.store import Operation, WriteResult
from engram.web.middleware import CONTENT_SECURITY_POLICY
from engram.worker import keys
from tests.redis_fixtures import wait_until
from tests.web_fixtures import EMBEDDER, Web

XSS = ("<script>alert(1)</script>", '"><img src=x onerror=alert(2)>')


class Inline(HTMLParser):
    """What a CSP without 'unsafe-inline' would block: inline scripts, styles, handlers."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []
        self.elements: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        self.elements.append((tag, found))
        if tag == "script" and "src" not in found:
            self.found.append("inline <script>")
        if tag == "style":
            self.found.append("<style>")
        for name in found:
            if name == "style" or name.startswith("on") or name.startswith("hx-on"):
                self.found.append(f"{tag} {name}=")


def parsed(html: str) -> Inline:
    parser = Inline()
    parser.feed(html)
    return parser


def seed(web: Web) -> dict[str, Any]:
    ada = {"user_id": "ada"}
    london = web.remember(ada, "Ada lives in London.", metadata={"source": "form"})
    web.store.session(ada, embedder=None).revise(
        london, text="Ada lives in Paris.", importance=0.8, metadata={"source": "chat"}
    )
    cat = web.remember(ada, "Ada has a cat.", links=[{"relation": "about", "id": london}])
    newer = web.remember(
        ada, "Ada moved to Lyon.", links=[{"relation": "supersedes", "id": london}]
    )
    return {"scope": ada, "london": london, "cat": cat, "newer": newer, "sid": web.scope_id(ada)}


def pages(data: dict[str, Any]) -> list[str]:
    sid, rid = data["sid"], data["london"]
    return [
        "/",
        "/scopes",
        f"/scopes/{sid}",
        f"/scopes/{sid}?status=forgotten",
        f"/scopes/{sid}?status=all",
        f"/scopes/{sid}?as_of={quote(datetime.now(UTC).isoformat())}",
        f"/records/{rid}",
        f"/forget/{rid}",
        "/receipts",
        "/generations",
        "/dead-letters",
        "/jobs",
        "/audit",
    ]


def test_every_page_renders_with_the_security_headers_and_nothing_inline(web: Web) -> None:
    data = seed(web)
    for path in pages(data):
        response = web.client.get(path)
        assert response.status_code == 200, path
        headers = response.headers
        assert headers["content-security-policy"] == CONTENT_SECURITY_POLICY
        assert "script-src 'self'" in CONTENT_SECURITY_POLICY
        assert "unsafe-inline" not in CONTENT_SECURITY_POLICY
        assert headers["x-content-type-options"] == "nosniff"
        assert headers["x-frame-options"] == "DENY"
        assert headers["referrer-policy"] == "same-origin"
        assert headers["cache-control"] == "no-store", "pages hold memory text: never cached"
        assert parsed(response.text).found == [], path
    static = web.client.get("/static/htmx.min.js")
    assert static.status_code == 200 and "public" in static.headers["cache-control"]
    # htmx is told not to inject its indicator <style> (which the CSP would block).
    html = web.client.get("/").text
    assert '"includeIndicatorStyles": false' in html and '"allowEval": false' in html


def test_memory_text_renders_as_text_everywhere(web: Web) -> None:
    scope = {"user_id": XSS[1]}
    first = web.remember(scope, XSS[0], metadata={XSS[1]: XSS[0]}, kind="x<b>k</b>")
    web.store.session(scope, embedder=None).revise(first, text=f"{XSS[0]} {XSS[1]}")
    odd_id = web.remember(scope, "An id with markup.", id='"><svg onload=alert(3)>')
    sid = web.scope_id(scope)
    csrf = web.csrf()
    recalled = web.client.post(
        f"/scopes/{sid}/recall", data={"csrf": csrf, "text": "script alert img"}
    )
    seen = [
        web.client.get(p).text
        for p in (
            "/scopes",
            f"/scopes/{sid}",
            f"/scopes/{sid}?status=all",
            f"/records/{first}",
            f"/forget/{first}",
            "/receipts",
        )
    ] + [recalled.text, web.client.get(f"/records/{odd_id.replace('/', '%2F')}").text]
    for html in seen:
        assert "<script>alert" not in html
        assert "<img src=x" not in html and "<svg onload" not in html and "<b>k</b>" not in html
        elements = parsed(html).elements
        assert not any(tag in ("img", "svg") and "onerror" in a for tag, a in elements)
        assert not [t for t, a in elements if t == "script" and "src" not in a]
    record_page = web.client.get(f"/records/{first}").text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in record_page
    assert "&#34;&gt;&lt;img src=x onerror=alert(2)&gt;" in record_page


@pytest.mark.parametrize(
    ("path", "region"),
    [
        ("/", '<div id="overview"'),
        ("/scopes", '<div id="scope-list"'),
        ("/receipts", '<div id="receipt-list"'),
        ("/generations", '<div id="generations"'),
        ("/dead-letters", '<div id="dead-letter-list"'),
        ("/jobs", '<div id="jobs"'),
        ("/audit", '<div id="audit"'),
    ],
)
def test_htmx_gets_the_region_and_a_browser_the_page(web: Web, path: str, region: str) -> None:
    page = web.client.get(path)
    part = web.client.get(path, headers={"HX-Request": "true"})
    assert page.status_code == part.status_code == 200
    assert page.text.startswith("<!doctype html>") and region in page.text
    assert part.text.lstrip().startswith(region) and "<html" not in part.text
    assert "HX-Request" in part.headers["vary"]


def test_a_scope_page_has_its_region_swapped_too(web: Web) -> None:
    data = seed(web)
    part = web.client.get(f"/scopes/{data['sid']}", headers={"HX-Request": "true"})
    assert part.text.lstrip().startswith('<div id="records"')


def test_scopes_are_found_by_any_field_and_paged_by_keyset(web: Web) -> None:
    for i in range(7):
        web.remember({"user_id": f"user-{i}", "agent_id": "helper"}, f"note {i}")
    web.remember({"user_id": "other", "agent_id": "helper"}, "note")
    seen, url = [], "/scopes?agent_id=help&limit=3"
    while url:
        html = web.client.get(url).text
        seen += re.findall(r"user_id=(user-\d|other), agent_id=helper", html)
        found = re.search(r'class="next" rel="next" href="([^"]+)"', html)
        url = found.group(1).replace("&amp;", "&") if found else ""
    assert seen == sorted(seen) and len(seen) == 8 == len(set(seen))
    filtered = web.client.get("/scopes?user_id=user-&agent_id=helper").text
    assert "user_id=other" not in filtered and filtered.count("user_id=user-") == 7
    exact = web.client.get("/scopes?user_id=user-1&exact=true").text
    assert exact.count("user_id=user-") == 1


def test_a_scope_by_status_tombstones_and_as_of(web: Web) -> None:
    scope = {"user_id": "bea"}
    kept = web.remember(scope, "Bea likes tea.")
    dropped = web.remember(scope, "Bea likes coffee.")
    gone = web.remember(scope, "Bea's passport number.")
    brief = web.remember(scope, "Bea is in a meeting.", ttl_ms=1)
    before = datetime.now(UTC)
    time.sleep(0.01)
    session = web.store.session(scope, embedder=None)
    session.retract(dropped)
    session.forget(gone)
    sid = web.scope_id(scope)

    def ids(query: str) -> set[str]:
        html = web.client.get(f"/scopes/{sid}{query}").text
        return {x for x in (kept, dropped, gone, brief) if f">{x}</a>" in html}

    assert ids("") == {kept}
    assert ids("?status=retracted") == {dropped}
    assert ids("?status=expired") == {brief}
    assert ids("?status=forgotten") == {gone}
    forgotten = web.client.get(f"/scopes/{sid}?status=forgotten").text
    assert "passport" not in forgotten and "badge forgotten" in forgotten
    # As of before the retract: coffee still active; the forgotten record has no past.
    as_of = web.client.get(f"/scopes/{sid}?as_of={before.strftime('%Y-%m-%dT%H:%M:%S.%f')}").text
    assert "Bea likes coffee." in as_of and "passport" not in as_of
    assert re.search(
        r"Bea likes coffee\.</bdi></td><td data-label=\"kind\">semantic</td>"
        r"<td data-label=\"status\"><span class=\"badge active",
        as_of,
    )


def test_a_record_shows_what_changed_why_and_its_links_both_ways(web: Web) -> None:
    data = seed(web)
    html = web.client.get(f"/records/{data['london']}").text
    html = re.sub(r"</?bdi[^>]*>", "", html)  # memory text is isolated (test_bidi)
    # The word diff of revision 2 against 1, and the fields that changed.
    assert "Ada lives in <del>London.</del><ins>Paris.</ins>" in html
    assert re.search(
        r"<td>importance</td><td class=\"before\">\(none\)</td><td>→</td><td class=\"after\">0.8",
        html,
    )
    assert re.search(r"metadata.source</td><td class=\"before\">form</td>.*after\">chat", html)
    assert "Revision 2" in html and "Revision 1" in html and "Created" in html
    # Why: origin and sources; links both ways.
    assert "asserted" in html and '<span class="badge">host</span>' in html
    # A record id is its scope's: each link names the scope.
    assert f'superseded by ← <a class="mono" href="/records/{data["newer"]}?user_id=' in html
    assert f'about this ← <a class="mono" href="/records/{data["cat"]}?user_id=' in html
    # The receipts that wrote it, and the way to forget it.
    assert html.count("/receipts/op_") >= 2
    assert f'href="/forget/{data["london"]}?user_id=' in html
    newer = web.client.get(f"/records/{data['newer']}").text
    assert f'supersedes → <a class="mono" href="/records/{data["london"]}?user_id=' in newer


def test_each_revision_says_who_asked_for_it(web: Web) -> None:
    scope = {"user_id": "asked-by"}
    first = Operation.build(
        "remember", scope, {"text": "Ada likes tea."}, requested_by="support-bot"
    )
    [made] = web.store.execute([first], EMBEDDER)
    assert isinstance(made, WriteResult)
    rid = made.records[0].id
    second = Operation.build(
        "revise", scope, {"id": rid, "text": "Ada likes green tea.", "expected_revision": 1},
        requested_by="grace",
    )  # fmt: skip
    web.store.execute([second], EMBEDDER)
    html = web.client.get(f"/records/{rid}").text
    revisions = {n: html[html.index(f'id="revision-{n}"') :] for n in (1, 2)}
    assert re.search(
        r'class="asked-by"><span class="claimed"[^>]*>\(claimed\) grace<', revisions[2]
    )
    assert re.search(
        r'class="asked-by"><span class="claimed"[^>]*>\(claimed\) support-bot<', revisions[1]
    )


def test_recall_shows_hits_with_score_and_match_kind(
    web: Web, caplog: pytest.LogCaptureFixture
) -> None:
    data = seed(web)
    csrf = web.csrf()
    caplog.set_level(logging.INFO, logger="engram.web.access")
    part = web.client.post(
        f"/scopes/{data['sid']}/recall",
        data={"csrf": csrf, "text": "Where does Ada live? Lyon", "top_k": "5"},
        headers={"HX-Request": "true"},
    )
    assert part.status_code == 200 and part.text.lstrip().startswith('<div id="recall"')
    assert "Ada moved to Lyon." in part.text
    assert re.search(
        r'<td class="num" data-label="relevance">0\.\d{4}</td>'
        r'<td data-label="match"><span class="badge (hybrid|lexical|vector)"',
        part.text,
    )
    assert "hybrid" in part.text, "the vector and lexical lists both found the best hit"
    full = web.client.post(f"/scopes/{data['sid']}/recall", data={"csrf": csrf, "text": "cat"})
    assert full.text.startswith("<!doctype html>") and "Ada has a cat." in full.text
    assert not any("Lyon" in str(r.__dict__) for r in caplog.records), "search text logged"
    refused = web.client.post(f"/scopes/{data['sid']}/recall", data={"text": "cat"})
    assert refused.status_code == 403


def test_the_access_log_names_ids_never_query_strings(
    web: Web, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="engram.web.access")
    web.client.get("/scopes?user_id=someone%40example.com")
    web.client.get("/api/v1/records/mem_x?secret=text")
    lines = [r for r in caplog.records if r.name == "engram.web.access"]
    assert [(r.method, r.path, r.status) for r in lines] == [  # type: ignore[attr-defined]
        ("GET", "/scopes", 200),
        ("GET", "/api/v1/records/mem_x", 400),
    ]
    assert lines[0].operator == "local"  # type: ignore[attr-defined]
    assert not any("example.com" in str(r.__dict__) or "secret" in str(r.__dict__) for r in lines)


def test_the_overview_shows_streams_workers_rate_and_dead_letters(
    web: Web, start_worker: Any, scope: dict[str, str]
) -> None:
    with start_worker(web.store) as worker:
        for i in range(5):
            web.producer.remember(scope, f"note {i}").wait(10)
        wait_until(lambda: worker.partitions, what="partitions held")
        web.redis.xadd(
            keys.DEAD_LETTERS,
            {
                "partition": 1,
                "entry": "1-1",
                "operation_id": "broken-op",
                "reason": "malformed",
                "error": '{"code": "invalid_request", "message": "bad"}',
                "deliveries": 1,
                "at_ms": 1,
                "op": "{}",
            },
        )
        # A worker row: host, pid, the partitions it holds (once it has beaten with them).
        row = (
            r'<td class="num" data-label="pid">\d+</td>'
            r'<td class="mono" data-label="partitions">[\d, ]+</td>'
        )

        bar = r'<rect class="committed" x="[\d.]+" y="[\d.]+" width="[\d.]+" height="[\d.]+">'

        def committed(html: str) -> int:
            """The 10-second chart's commits (its bars are titled with a time of day to
            the second), summed over its bars: five sends may fall in two."""
            titles = re.findall(r"<title>\d\d:\d\d:\d\d: (\d+) committed, ", html)
            return sum(int(n) for n in titles)

        def overview_with_workers() -> str | None:
            # Workers write their counts about once a second, or as soon as they idle.
            html = web.client.get("/").text
            ready = re.search(row, html) and re.search(bar, html) and committed(html) == 5
            return html if ready else None

        html = wait_until(overview_with_workers, what="a worker, its partitions, 5 commits")
    assert len(re.findall(r'class="partition( busy)?"', html)) == 4
    assert committed(html) == 5
    assert 'href="/dead-letters/' in html and "malformed" in html


def test_the_overview_names_entries_no_worker_reads(web: Web) -> None:
    """Sent with a raw XADD to a partition a repartition replaced, once no worker read
    it: names and counts, never the text."""
    from engram.worker import layout

    assert 'id="stranded"' not in web.client.get("/").text
    _, new = layout.begin(web.redis, 2, 4)
    layout.finish(web.redis, new)
    web.redis.xadd(keys.stream(3), {"op": '{"request": {"text": "stranded text"}}'})
    html = web.client.get("/").text
    assert 'id="stranded"' in html
    assert "1 entry waits in streams no worker reads" in html
    assert f"<code>{keys.stream(3)}</code> (1)" in html
    assert "stranded text" not in html


def test_generations_show_counts_and_a_reembed_in_progress(web: Web) -> None:
    web.remember({"user_id": "gen"}, "Some text.")
    pending = web.store.embeddings.begin("next-model", 16)
    progress = {
        "state": "running", "pass": 1, "done": 25, "total": 100, "skipped": 0, "errors": 0,
        "rate_per_s": 12.5, "eta_s": 6.0, "started_at": datetime.now(UTC).isoformat(),
        "updated_at": datetime.now(UTC).isoformat(), "requested_by": "grace", "job_id": "job-1",
    }  # fmt: skip
    web.store.embeddings.set_progress(pending.id, progress)
    part = web.client.get("/generations", headers={"HX-Request": "true"}).text
    assert 'hx-trigger="every 2s"' in part, "polled while a reembed runs"
    assert '<progress max="100" value="25">' in part
    assert "12.5/s" in part and "ETA 6 s" in part and "started by grace" in part
    assert re.search(
        r"<td class=\"mono\" data-label=\"model\">hashing-64</td>"
        r"<td class=\"num\" data-label=\"dims\">64</td>"
        r"<td class=\"num\" data-label=\"vectors\">\d+</td>",
        part,
    )
    web.store.embeddings.set_progress(pending.id, {**progress, "state": "failed"})
    assert "hx-trigger" not in web.client.get("/generations", headers={"HX-Request": "true"}).text


def test_polls_never_overlap(web: Web) -> None:
    """Every element that polls drops a poll while its last one is still out, so a slow
    answer never piles requests up behind it."""
    pending = web.store.embeddings.begin("polled-model", 16)
    web.store.embeddings.set_progress(pending.id, {"state": "running", "done": 1, "total": 2})
    body = {"kind": "remember", "scope": {"user_id": "poll"}, "request": {"text": "t"}}
    waiting = web.client.post("/api/v1/operations", json=body).json()["operation_id"]
    operation = f"/operations/{waiting}"  # no worker runs: it polls until committed
    polling = []
    for path in ("/", "/jobs", "/generations", operation):
        for tag, attrs in parsed(web.client.get(path).text).elements:
            if "every" in (attrs.get("hx-trigger") or ""):
                polling.append((path, tag, attrs.get("hx-sync")))
    web.store.embeddings.set_progress(pending.id, {"state": "failed"})
    assert [p for p, _, _ in polling] == ["/", "/jobs", "/generations", operation]
    assert all(sync == "this:drop" for _, _, sync in polling), polling


def test_starting_a_reembed_from_the_dashboard_is_audited(web: Web) -> None:
    csrf = web.csrf("/generations")
    response = web.client.post(
        "/generations/reembed", data={"csrf": csrf, "model": "minilm", "confirm": "yes"}
    )
    assert response.status_code == 303 and web.starts == [("minilm", "local")]
    # The module's store is shared: only this test starts a reembed.
    [entry] = [e for e in web.store.audit.page().items if e.action == "reembed.start"]
    assert (entry.requested_by, entry.action, entry.target, entry.detail) == (
        "local",
        "reembed.start",
        "reembed-1",
        {"model": "minilm"},
    )
    assert web.client.post("/generations/reembed", data={"model": "minilm"}).status_code == 403
    assert len(web.starts) == 1


def test_dead_letters_retry_and_discard_are_csrf_posts_and_audited(web: Web) -> None:
    for n, op_id in enumerate(("op-a", "op-b")):
        web.redis.xadd(keys.DEAD_LETTERS, {
            "partition": 2, "entry": f"1-{n}", "operation_id": op_id, "reason": "deliveries",
            "error": '{"code": "dead_lettered", "message": "delivered 6 times"}',
            "deliveries": 6, "at_ms": 1_700_000_000_000,
            "op": json.dumps({"operation_id": op_id, "kind": "remember",
                              "scope": {"user_id": "x"}, "request": {"text": "t"}}),
        })  # fmt: skip
    letters = [i.decode() for i, _ in web.redis.xrange(keys.DEAD_LETTERS)]
    listing = web.client.get("/dead-letters").text
    assert all(f'href="/dead-letters/{i}"' in listing for i in letters)
    shown = web.client.get(f"/dead-letters/{letters[0]}").text
    assert "delivered 6 times" in shown and "&#34;operation_id&#34;: &#34;op-a&#34;" in shown
    # Without the token nothing happens.
    assert web.client.post(f"/dead-letters/{letters[0]}/retry").status_code == 403
    assert (
        web.client.post(f"/dead-letters/{letters[0]}/retry", data={"csrf": "forged"}).status_code
        == 403
    )
    assert web.redis.xlen(keys.DEAD_LETTERS) == 2 and web.redis.xlen(keys.stream(2)) == 0
    csrf = web.csrf("/dead-letters")
    retried = web.client.post(f"/dead-letters/{letters[0]}/retry", data={"csrf": csrf})
    assert retried.status_code == 303
    assert retried.headers["location"] == "/operations/op-a?user_id=x"  # the id's scope
    assert web.redis.xlen(keys.stream(2)) == 1
    discarded = web.client.post(f"/dead-letters/{letters[1]}/discard", data={"csrf": csrf})
    assert discarded.status_code == 303 and web.redis.xlen(keys.DEAD_LETTERS) == 0
    actions = [
        (e.requested_by, e.action, e.target)
        for e in web.store.audit.page().items
        if e.action.startswith("dead_letter")
    ]
    assert actions[:2] == [
        ("local", "dead_letter.discard", letters[1]),
        ("local", "dead_letter.retry", letters[0]),
    ]
    assert "dead_letter.retry" in web.client.get("/audit").text


def test_an_operation_page_follows_it_to_its_receipt(
    web: Web, start_worker: Any, scope: dict[str, str]
) -> None:
    pending = web.producer.remember(scope, "Followed.", operation_id="followed:1")
    waiting = web.client.get("/operations/followed:1", headers={"HX-Request": "true"}).text
    assert "badge waiting" in waiting and 'hx-trigger="every 1s"' in waiting
    page = web.client.get("/operations/followed:1")
    assert page.status_code == 200 and '<div id="operation"' in page.text
    typo = web.client.get("/operations/followed:2")
    assert typo.status_code == 404 and "no operation followed:2" in typo.text
    assert 'id="operation"' not in typo.text
    with start_worker(web.store):
        pending.wait(10)
    done = web.client.get("/operations/followed:1", headers={"HX-Request": "true"}).text
    assert "badge committed" in done and "hx-trigger" not in done
    refused = Operation.build("retract", scope, {"id": "nope"}, "refused:1")
    web.store.execute([refused])
    assert "badge refused" in web.client.get("/operations/refused:1").text
    assert "not_found" in web.client.get("/receipts/refused:1").text


def test_receipts_filter_by_kind_flags_who_and_time(web: Web) -> None:
    data = seed(web)
    again = Operation.build("remember", data["scope"], {"text": "Twice."}, "twice:1")
    web.store.execute([again])
    web.store.execute([again])
    start = (datetime.now(UTC) - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%S")
    assert "twice:1" in web.client.get("/receipts?replayed=true").text
    assert "twice:1" not in web.client.get("/receipts?replayed=false").text
    assert "twice:1" in web.client.get(f"/receipts?since={start}").text
    assert "twice:1" not in web.client.get(f"/receipts?until={start}").text
    assert "twice:1" not in web.client.get("/receipts?kind=revise").text
    only_scope = web.client.get(f"/receipts?scope={data['sid'] + 1000}").text
    assert "No receipt." in only_scope
