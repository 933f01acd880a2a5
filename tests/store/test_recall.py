"""Hybrid recall: vector + full text, fused; filters; exact and approximate paths."""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np
import psycopg
import pytest

from engram.store import (
    HashingEmbedder,
    InvalidRequestError,
    KeywordEmbedder,
    Store,
    WordLlamaEmbedder,
)
from engram.store.errors import EmbedderUnavailableError
from engram.store.read.recall import RecallQuery, recall


def test_the_default_embedder_finds_meaning_not_just_words(fresh_store: Store) -> None:
    mem = fresh_store.session({"user_id": "ada"}, embedder=WordLlamaEmbedder())
    mem.remember("Ada's favourite drink is green tea.")
    mem.remember("Ada's car is a red bicycle.")
    mem.remember("The quarterly report is due on Friday.")
    hits = mem.recall("What beverage does she like?", top_k=1)
    assert hits[0].record.text == "Ada's favourite drink is green tea."
    assert hits[0].match == "vector"


def test_kind_and_retracted_filters(store: Store, scope: dict) -> None:
    mem = store.session(scope, embedder=HashingEmbedder(64))
    pref = mem.remember("Ada likes tea.", kind="preference").records[0]
    fact = mem.remember("Ada has tea at noon.", kind="fact").records[0]
    assert [h.record.id for h in mem.recall("tea", kind="preference")] == [pref.id]
    mem.retract(fact.id)
    assert [h.record.id for h in mem.recall("tea")] == [pref.id]
    assert {h.record.id for h in mem.recall("tea", include_retracted=True)} == {pref.id, fact.id}


def test_top_k_and_fusion_order(store: Store, scope: dict) -> None:
    mem = store.session(scope, embedder=HashingEmbedder(64))
    for i in range(8):
        mem.remember(f"note {i} about tea" if i % 2 else f"note {i} about nothing")
    hits = mem.recall("tea", top_k=3)
    assert len(hits) == 3
    assert all("tea" in h.record.text for h in hits)
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    assert all(h.match == "hybrid" for h in hits)


def test_recall_without_text_lists_the_latest(store: Store, scope: dict) -> None:
    mem = store.session(scope)
    ids = [mem.remember(f"note {i}").records[0].id for i in range(3)]
    assert [h.record.id for h in mem.recall(top_k=2)] == ids[::-1][:2]


def test_recall_in_an_unknown_scope_is_empty(store: Store) -> None:
    assert store.session({"user_id": "nobody-at-all"}).recall("tea") == []


def test_a_large_scope_gets_an_approximate_index_with_the_same_answers(
    fresh_store: Store, fresh_dsn: str
) -> None:
    from engram.store import Operation

    scope = {"user_id": "big"}
    embedder = HashingEmbedder(64)
    words = [
        "tea",
        "coffee",
        "paris",
        "london",
        "jazz",
        "code",
        "river",
        "stone",
        "lamp",
        "cloud",
        "violin",
        "maple",
    ]
    rng = np.random.default_rng(7)
    # Large enough that the planner prefers the index to reading every row.
    texts = [" ".join(rng.choice(words, size=4, replace=False)) + f" item{i}" for i in range(5000)]
    fresh_store.execute([Operation.build("remember", scope, {"text": t}) for t in texts], embedder)
    mem = fresh_store.session(scope, embedder=embedder)
    small = fresh_store.session({"user_id": "small"}, embedder=embedder)
    small.remember("tea in a small scope")

    query = texts[42]
    exact = [h.record.text for h in mem.recall(query, top_k=10)]
    created = fresh_store.embeddings.index_large_scopes(threshold=4000)
    assert len(created) == 1, "only the large scope gets an approximate index"
    with psycopg.connect(fresh_dsn) as conn:
        plan = "\n".join(
            r[0]
            for r in conn.execute(
                "EXPLAIN SELECT record_id FROM engram_vectors x WHERE x.generation_id = 1"
                " AND x.scope_id = 1 AND x.settled"
                " ORDER BY (engram_centred_g1(x.embedding))::halfvec(64)"
                " <=> (engram_centred_g1(%s::vector))::halfvec(64) LIMIT 5",
                (str(embedder.embed(["tea"])[0].tolist()),),
            )
        )
    assert created[0] in plan

    def index_scans() -> int:
        with psycopg.connect(fresh_dsn) as conn:
            conn.execute("SELECT pg_stat_clear_snapshot()")
            row = conn.execute(
                "SELECT idx_scan FROM pg_stat_user_indexes WHERE indexrelname = %s", (created[0],)
            ).fetchone()
        return int(row[0]) if row else 0

    before = index_scans()
    # A store of its own: its backends report their statistics when they exit.
    with Store.connect(fresh_dsn) as own:
        own_mem = own.session(scope, embedder=embedder)
        approximate = [h.record.text for h in own_mem.recall(query, top_k=10)]
    deadline = time.monotonic() + 5
    while index_scans() == before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert index_scans() > before, "recall in the large scope used its HNSW index"
    assert exact[0] == approximate[0] == query

    # HNSW is approximate: its nearest ten are (nearly) as near as the exact ten.
    vectors = dict(zip(texts, embedder.embed(texts), strict=True))
    q = RecallQuery(
        scope_id=1,
        text=None,
        vector=vectors[query],
        generation_id=1,
        dims=64,
        top_k=10,
        kind=None,
        include_retracted=False,
        recorded_as_of=None,
    )
    with fresh_store.pool.connection() as conn:
        found = {
            hnsw: [h.record.text for h in recall(conn, replace(q, hnsw=hnsw))]
            for hnsw in (False, True)
        }
    distances = {
        k: sorted(1 - float(vectors[t] @ vectors[query]) for t in v) for k, v in found.items()
    }
    assert np.allclose(distances[True], distances[False], atol=0.02)
    assert [h.record.text for h in small.recall("tea")] == ["tea in a small scope"]


def texts(hits: list) -> list[str]:
    return [h.record.text for h in hits]


def test_stop_words_match_nothing(fresh_store: Store) -> None:
    mem = fresh_store.session({"user_id": "ada"})  # no embedder: the lexical list alone
    mem.remember("What is it that they do all day?")
    mem.remember("Ada rides a bicycle to work.")
    mem.remember("To be, or not to be, that is the question.")
    assert texts(mem.recall("What does Ada do?")) == ["Ada rides a bicycle to work."]
    # Stop words are not indexed (migration 018): a query of nothing else has no
    # lexical list, and an embedder's vector list alone answers it.
    assert texts(mem.recall("to be or not to be")) == []


def test_words_are_found_in_any_of_their_english_forms(fresh_store: Store) -> None:
    mem = fresh_store.session({"user_id": "ada"})
    mem.remember("Caroline has been researching adoption agencies.")
    mem.remember("Ada takes the train on Mondays.")
    mem.remember("Ada painted a sunrise last year.")
    assert texts(mem.recall("Who will take the train?")) == ["Ada takes the train on Mondays."]
    assert texts(mem.recall("What did Caroline research?")) == [
        "Caroline has been researching adoption agencies."
    ]
    assert texts(mem.recall("paintings of sunrises")) == ["Ada painted a sunrise last year."]


def test_words_of_other_languages_are_found_as_written(fresh_store: Store) -> None:
    mem = fresh_store.session({"user_id": "ada"})
    mem.remember("Ada a déménagé à Zürich pour les écoles.")
    mem.remember("Ada's schools are in Paris.")
    # Words with a letter outside ASCII are kept whole, not cut by English rules.
    assert texts(mem.recall("écoles")) == ["Ada a déménagé à Zürich pour les écoles."]
    assert texts(mem.recall("école")) == []
    assert texts(mem.recall("Zürich"))[0] == "Ada a déménagé à Zürich pour les écoles."


def test_codes_and_numbers_are_found_as_written(fresh_store: Store) -> None:
    mem = fresh_store.session({"user_id": "ada"})
    mem.remember("The mortgage rate is fixed at 3.1% until 2029.")
    mem.remember("The car's plate is KX-4471.")
    mem.remember("Version 3 of the plan has 1 change.")
    assert texts(mem.recall("3.1%")) == ["The mortgage rate is fixed at 3.1% until 2029."]
    assert texts(mem.recall("KX-4471"))[0] == "The car's plate is KX-4471."


def test_a_rare_word_outranks_many_common_ones(fresh_store: Store, fresh_dsn: str) -> None:
    from engram.store import Operation

    scope = {"user_id": "ada"}
    common = [f"green tea with milk and honey, cup {i}" for i in range(300)]
    fresh_store.execute([Operation.build("remember", scope, {"text": t}) for t in common])
    mem = fresh_store.session(scope)
    mem.remember("A trip to Lisbon in May.")
    query = "green tea with milk and honey in Lisbon"
    with psycopg.connect(fresh_dsn, autocommit=True) as conn:
        conn.execute("ANALYZE engram_revisions")
    # Words held by most revisions say nothing (ANALYZE's statistics tell which);
    # the rare one decides.
    assert texts(mem.recall(query, top_k=1)) == ["A trip to Lisbon in May."]


def test_a_text_holding_little_of_the_query_is_no_lexical_match(fresh_store: Store) -> None:
    mem = fresh_store.session({"user_id": "ada"})  # no embedder: the lexical list alone
    mem.remember("Maria moved to Lisbon in spring.")
    mem.remember("The tram timetable of Lisbon.")
    # Two of the query's four words: a match; one of four: too little to say.
    assert texts(mem.recall("Maria Lisbon relocation plans")) == [
        "Maria moved to Lisbon in spring."
    ]


def test_every_text_holding_enough_of_the_query_is_found_whichever_words_it_holds(
    fresh_store: Store,
) -> None:
    # The lexical list looks for candidates through the rarest words only, as many as a
    # text must hold one of to reach the cover (here two of four words of equal
    # weight): a text holding any two of them is found, whichever two.
    mem = fresh_store.session({"user_id": "ada"})  # no embedder: the lexical list alone
    words = ["walrus", "saxophone", "glacier", "lantern"]
    pairs = [f"{a} {b}" for i, a in enumerate(words) for b in words[i + 1 :]]
    for text in [*pairs, "walrus alone"]:
        mem.remember(f"A note on a {text}.")
    found = texts(mem.recall("walrus saxophone glacier lantern", top_k=10))
    assert sorted(found) == sorted(f"A note on a {pair}." for pair in pairs)


def test_each_hit_says_where_each_list_ranked_it_and_its_relevance(
    store: Store, scope: dict
) -> None:
    from engram.store.limits import LEXICAL_WEIGHT
    from engram.store.read.recall import above

    embedder = HashingEmbedder(64)
    mem = store.session(scope, embedder=embedder)
    for i in range(6):
        mem.remember(f"note {i} about tea" if i % 2 else f"note {i} about nothing")
    mem.remember("green tea")  # the query itself: first in both lists
    hits = mem.recall("green tea", top_k=7, min_relevance=None)
    kinds = {(True, True): "hybrid", (True, False): "vector", (False, True): "lexical"}
    query = np.asarray(embedder.embed(["green tea"])[0])
    for hit in hits:
        assert hit.match == kinds[(hit.vector_rank is not None, hit.lexical_rank is not None)]
        # The score is the cosine similarity (0 when negative) plus LEXICAL_WEIGHT
        # times the square of the share of the query's telling weight the text holds:
        # here "tea" of "green tea" (about half of it), both, or neither.
        vector = np.asarray(embedder.embed([hit.record.text])[0])
        cosine = max(float(query @ vector / np.linalg.norm(query) / np.linalg.norm(vector)), 0)
        if hit.record.text == "green tea":
            assert abs(hit.score - cosine - LEXICAL_WEIGHT) < 1e-6
        elif "tea" in hit.record.text:
            held = hit.score - cosine
            assert 0.1 * LEXICAL_WEIGHT < held < 0.9 * LEXICAL_WEIGHT
        else:
            assert abs(hit.score - cosine) < 1e-6
        assert abs(hit.relevance - min(hit.score, 1.0)) < 1e-12
        assert 0 <= hit.relevance <= 1
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    best = hits[0]
    assert (best.match, best.vector_rank, best.lexical_rank) == ("hybrid", 1, 1)
    assert best.relevance == 1.0
    assert above(hits, None) == hits and above(hits, 1.0) == [best]
    assert all(h.relevance >= 0.6 for h in above(hits, 0.6))
    assert len(above(hits, 0.6)) < len(hits)


FACTS = [
    "Ada moved to Paris in 2019 and works at a bakery.",
    "Ada has two cats called Miso and Tofu.",
    "Ada writes firmware in Rust for a drone company.",
    "The quarterly report is due on Friday.",
    "Bob prefers green tea in the afternoon.",
]


def test_a_query_matching_no_fact_finds_none_above_the_default_cut(fresh_store: Store) -> None:
    from engram.store.limits import DEFAULT_MIN_RELEVANCE

    mem = fresh_store.session({"user_id": "ada"}, embedder=WordLlamaEmbedder())
    for fact in FACTS:
        mem.remember(fact)
    for question in ("What is the capital of Australia?", "quantum chromodynamics lectures"):
        # top_k is not padded with unrelated records: none is relevant, none comes back.
        assert mem.recall(question, top_k=5) == []
        # They were there to be found, each far below the cut whatever its rank.
        everything = mem.recall(question, top_k=5, min_relevance=None)
        assert len(everything) == 5
        assert all(h.relevance < DEFAULT_MIN_RELEVANCE for h in everything)


def test_a_query_matching_one_fact_finds_it_first_and_well_above_the_cut(
    fresh_store: Store,
) -> None:
    from engram.store.limits import DEFAULT_MIN_RELEVANCE

    mem = fresh_store.session({"user_id": "ada"}, embedder=WordLlamaEmbedder())
    for fact in FACTS:
        mem.remember(fact)
    asked = {
        "What does Ada write firmware in?": FACTS[2],
        "Does Ada have any cats?": FACTS[1],
        "when is the report due": FACTS[3],
        "What hot drinks does Bob like?": FACTS[4],
    }
    for question, answer in asked.items():
        hits = mem.recall(question, top_k=5)
        assert hits[0].record.text == answer, question
        assert hits[0].relevance >= 2 * DEFAULT_MIN_RELEVANCE, (question, hits[0].relevance)
        # What else comes back shares a word or a meaning, and says so by a lower score.
        assert all(h.relevance < hits[0].relevance for h in hits[1:])
    # Meaning alone, no word in common: WordLlama knows a drink is a beverage...
    assert texts(mem.recall("Which beverage does Bob enjoy?"))[:1] == [FACTS[4]]
    # ...but not that cats are pets (a word-association embedder, no model at query
    # time): nothing passes the cut, rather than Paris first.
    assert mem.recall("pets") == []


def test_a_recall_given_no_embedder_follows_the_active_generation(
    fresh_store: Store, fresh_dsn: str
) -> None:
    """A Python user who opened ``Store.connect(dsn)`` and calls ``recall`` with no
    embedder gets the same hybrid search as the API: the query embedded with the model
    the store's vectors were made with, found by its id."""
    scope = {"user_id": "ada"}
    mem = fresh_store.session(scope, embedder=WordLlamaEmbedder())
    tea = mem.remember("Ada's favourite drink is green tea.").records[0]
    mem.remember("The quarterly report is due on Friday.")
    question = "What beverage does she like?"  # no word in common with the answer
    with Store.connect(fresh_dsn) as opened:
        hits = opened.recall(scope, question, top_k=1)
        by_words = opened.recall(scope, question, top_k=1, text_only=True)
    assert [(h.record.id, h.match) for h in hits] == [(tea.id, "vector")]
    assert hits[0].vector_rank == 1
    assert by_words == []  # what it silently returned before
    assert [(h.record.id, h.score) for h in mem.recall(question, top_k=1)] == [
        (h.record.id, h.score) for h in hits
    ]


def test_a_recall_with_no_model_here_for_the_active_generation_is_refused(
    fresh_store: Store,
) -> None:
    scope = {"user_id": "ada"}
    mine = KeywordEmbedder("keywords-of-my-own", ["tea", "coffee"])  # no registry knows it
    kept = fresh_store.session(scope, embedder=mine).remember("Ada prefers tea.").records[0]
    with pytest.raises(EmbedderUnavailableError) as refused:
        fresh_store.recall(scope, "tea")
    assert refused.value.code == "embedder_unavailable"
    assert "keywords-of-my-own" in refused.value.message
    assert fresh_store.session(scope).recall(top_k=5)[0].record.id == kept.id  # no text: no model
    words = fresh_store.recall(scope, "tea", text_only=True)
    assert [(h.record.id, h.match, h.vector_rank) for h in words] == [(kept.id, "lexical", None)]
    with pytest.raises(InvalidRequestError, match="text only takes no embedder"):
        fresh_store.recall(scope, "tea", embedder=mine, text_only=True)


def turn(message_id: str, role: str, text: str) -> dict:
    return {"id": message_id, "message": {"role": role, "content": text}}


def test_a_turn_is_found_by_the_words_of_the_message_it_answers(
    fresh_store: Store, fresh_dsn: str
) -> None:
    mem = fresh_store.session({"user_id": "ada"})  # no embedder: the lexical list alone
    question = "Do you have any pets at home?"
    answer = "Yes, two cats called Miso and Tofu."
    mem.extract([turn("t1", "user", question), turn("t2", "assistant", answer)], infer=False)
    mem.extract([turn("t3", "user", "I adopted a dog last week.")], infer=False)
    # The answer holds no word of the query: it is found by the turn before it, and
    # shows its own text only.
    found = mem.recall("which pets live there", top_k=10)
    assert sorted(texts(found)) == sorted([question, answer])
    # Only the message before, in the same extract: the next extract's first turn
    # is indexed alone.
    assert texts(mem.recall("Miso Tofu cats")) == [answer]

    # A forget of the turn before takes its words out of the answer's index entry.
    [asked] = [h.record for h in found if h.record.text == question]
    mem.forget(asked.id)
    assert texts(mem.recall("which pets live there", top_k=10)) == []
    with psycopg.connect(fresh_dsn) as conn:
        rows = conn.execute(
            "SELECT context, context_of, tsv::text FROM engram_revisions"
        ).fetchall()
    assert all(context is None and of is None for context, of, _ in rows)
    assert not any("pet" in tsv for *_, tsv in rows)


def test_a_turn_next_to_a_matching_turn_ranks_above_its_twin_alone(fresh_store: Store) -> None:
    from engram.store.limits import NEIGHBOUR_WEIGHT

    mem = fresh_store.session({"user_id": "ada"}, embedder=WordLlamaEmbedder())
    said = "I finally booked it."
    mem.extract(
        [turn("t1", "user", said), turn("t2", "assistant", "The Lisbon flight? When?")],
        infer=False,
    )
    mem.extract([turn("t3", "user", said)], infer=False)  # the same words, alone
    hits = {
        h.record.sources[0].message_id: h
        for h in mem.recall("Lisbon flight", top_k=10, min_relevance=None)
    }
    assert hits["t2"] == next(iter(hits.values()))
    # The twins score the same by their own text and vector; the one the matching turn
    # answers gains a share of that turn's score.
    gained = hits["t1"].score - hits["t3"].score
    assert gained > NEIGHBOUR_WEIGHT * 0.5 * hits["t2"].score
    assert list(hits).index("t1") < list(hits).index("t3")

    # A retracted turn lends nothing: the twins are equal again.
    mem.retract(hits["t2"].record.id)
    again = {
        h.record.sources[0].message_id: h
        for h in mem.recall("Lisbon flight", top_k=10, min_relevance=None)
    }
    assert "t2" not in again
    assert abs(again["t1"].score - again["t3"].score) < 1e-9


@pytest.mark.parametrize("bad", [1.5, -0.1, float("nan"), True, "0.5"])
def test_a_bad_min_relevance_is_refused_before_any_search(fresh_store: Store, bad: object) -> None:
    mem = fresh_store.session({"user_id": "ada"})
    mem.remember("green tea")
    with pytest.raises(InvalidRequestError, match="min_relevance must be a number from 0 to 1"):
        mem.recall("tea", min_relevance=bad)  # type: ignore[arg-type]
    assert texts(mem.recall("tea", min_relevance=0)) == ["green tea"]


def test_a_smaller_top_k_is_the_first_hits_of_a_larger_one(fresh_store: Store) -> None:
    """The neighbouring-turn bonus goes to the NEIGHBOUR_CANDIDATES best candidates by
    the rest of their score, whatever top_k, so the order never depends on top_k."""
    from engram.store.limits import NEIGHBOUR_CANDIDATES

    mem = fresh_store.session({"user_id": "ada"})  # the lexical list alone
    for i in range(NEIGHBOUR_CANDIDATES + 10):
        mem.extract([turn(f"f{i}", "user", f"tickets {i}")], infer=False)
    # Holds half the query, as each filler does, but ranks after all of them (more
    # words); the turn after it holds all of the query.
    mem.extract(
        [turn("a", "user", "I finally booked the tickets"), turn("b", "assistant", "Lisbon?")],
        infer=False,
    )

    def ids(top_k: int) -> list[str]:
        hits = mem.recall("Lisbon tickets", top_k=top_k, min_relevance=None)
        return [h.record.sources[0].message_id for h in hits]

    small, large = ids(10), ids(NEIGHBOUR_CANDIDATES + 20)
    assert small == large[:10]
    assert small[0] == "b" and "a" not in small
    assert len(large) == NEIGHBOUR_CANDIDATES + 12
