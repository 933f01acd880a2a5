"""In a reconciling write, an asserted revision holds the host's own words: a text the
model wrote is inferred, citing the request, whatever the request's origin."""

from __future__ import annotations

import psycopg

from engram.store import HashingEmbedder, Store
from engram.store.write.operations import text_digest
from tests.fake_llm import ScriptedLLM, events

EMBEDDER = HashingEmbedder(64)


def asserted_texts(dsn: str) -> set[str]:
    with psycopg.connect(dsn) as conn:
        return {
            r[0]
            for r in conn.execute("SELECT text FROM engram_revisions WHERE origin = 'asserted'")
        }


def host_texts(dsn: str) -> set[str]:
    with psycopg.connect(dsn) as conn:
        return {
            r[0]
            for r in conn.execute(
                "SELECT request->>'text' FROM engram_receipts WHERE kind IN ('remember', 'revise')"
                " AND request ? 'text'"
            )
        }


def test_a_text_the_model_wrote_is_inferred_and_cites_the_request(
    fresh_store: Store, fresh_dsn: str
) -> None:
    llm = ScriptedLLM(
        reconcile=[
            events({"event": "UPDATE", "id": "0", "text": "Ada lives in Paris."}),
            events({"event": "ADD", "text": "Ada is an administrator."}),
        ]
    )
    mem = fresh_store.session({"user_id": "ada"}, embedder=EMBEDDER, llm=llm)
    london = mem.remember("Ada lives in London.").records[0]
    request = "Ada moved to Paris."
    [moved] = mem.remember(request).records
    # The host's record is not rewritten in the model's words: said about instead.
    assert (moved.origin, moved.text) == ("inferred", "Ada lives in Paris.")
    assert [(link.relation, link.id) for link in moved.links] == [("about", london.id)]
    assert [(s.kind, s.digest) for s in moved.sources] == [("host", text_digest(request))]
    unchanged = mem.get(london.id)
    assert unchanged is not None and (unchanged.revision, unchanged.origin) == (1, "asserted")
    # A text the candidates steered the model to write is no assertion of the host's.
    [added] = mem.remember("Ada is in the London team.").records
    assert (added.origin, added.text) == ("inferred", "Ada is an administrator.")
    assert [s.digest for s in added.sources] == [text_digest("Ada is in the London team.")]
    assert asserted_texts(fresh_dsn) <= host_texts(fresh_dsn)


def test_the_hosts_words_stay_asserted(fresh_store: Store, fresh_dsn: str) -> None:
    llm = ScriptedLLM(
        reconcile=[
            events({"event": "UPDATE", "id": "0", "text": "  ada LIVES in paris. "}),
            events({"event": "ADD", "text": "ada likes TEA."}),
        ]
    )
    mem = fresh_store.session({"user_id": "ada"}, embedder=EMBEDDER, llm=llm)
    london = mem.remember("Ada lives in London.").records[0]
    [revised] = mem.remember("Ada lives in Paris.").records
    # Case and spaces aside, the model kept the host's words: stored as the host wrote them.
    assert (revised.id, revised.revision) == (london.id, 2)
    assert (revised.origin, revised.text) == ("asserted", "Ada lives in Paris.")
    [tea] = mem.remember("Ada likes tea.").records
    assert (tea.origin, tea.text) == ("asserted", "Ada likes tea.")
    assert asserted_texts(fresh_dsn) <= host_texts(fresh_dsn)


def test_over_an_inferred_record(fresh_store: Store, fresh_dsn: str) -> None:
    """The host's words retract it and supersede it; the model's words revise it, and
    the revision stays inferred."""
    mem = fresh_store.session({"user_id": "bob"}, embedder=EMBEDDER)
    guess = mem.remember("Bob likes green tea, maybe.", origin="inferred").records[0]
    mem.llm = ScriptedLLM(
        reconcile=[
            events({"event": "UPDATE", "id": "0", "text": "Bob likes green tea, surely."}),
            events({"event": "UPDATE", "id": "0", "text": "Bob likes green tea."}),
        ]
    )
    [revised] = mem.remember("Bob said he likes green tea.").records
    assert (revised.id, revised.revision, revised.origin) == (guess.id, 2, "inferred")
    retracted, green = mem.remember("Bob likes green tea.").records
    assert (retracted.id, retracted.status) == (guess.id, "retracted")
    assert (green.origin, green.text) == ("asserted", "Bob likes green tea.")
    assert [(link.relation, link.id) for link in green.links] == [("supersedes", guess.id)]
    assert asserted_texts(fresh_dsn) <= host_texts(fresh_dsn)
