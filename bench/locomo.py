"""LoCoMo (Maharana et al., ACL 2024) as engram's users would meet it: each conversation
one scope, each session one ``extract(messages, infer=False)`` whose message ids are the
turns' ``dia_id``s, each question one recall through ``POST /api/v1/recall``, scored by
the evidence turns its hits cite (``sources[].message_id``).

What ``bench.bench_locomo`` and the suite's guard (``tests/web/test_locomo.py``) share:
reading the upstream file, the messages a session becomes, sending them, asking, and
the scores. A message carries a role and its content only, so a turn's speaker, its
session's date and time, and an image turn's caption are written into its text, one
line as a transcript shows it: ``[1:56 pm on 8 May, 2023] Caroline: I went to ...``.
Every system the bench compares reads those same texts.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg

from engram.store import Store
from engram.store.vectors.registry import EmbedderRegistry, parse_plugins
from engram.worker import Producer
from engram.worker.settings import Settings

CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}
ANSWERABLE = (1, 2, 3, 4)  # category 5's answers are not in the conversation: scored apart
TOP_K = 10
CUTS = (5, 10)
_SESSION = re.compile(r"session_(\d+)")


def registry() -> EmbedderRegistry:
    """The built-ins and the embedders ``ENGRAM_EMBEDDERS`` names, as engram's commands see them."""
    return EmbedderRegistry(parse_plugins(os.environ.get("ENGRAM_EMBEDDERS", "")))


def default_embedder() -> str:
    """What ``engram up`` embeds with when ``ENGRAM_EMBEDDER`` is unset."""
    default = next(f.default for f in dataclasses.fields(Settings) if f.name == "embedder")
    assert isinstance(default, str)
    return default


@dataclass(frozen=True, slots=True)
class Turn:
    dia_id: str
    speaker: str
    text: str  # as the store receives it: date, speaker, words, an image's caption


@dataclass(frozen=True, slots=True)
class Session:
    key: str  # session_N
    date_time: str
    turns: tuple[Turn, ...]


@dataclass(frozen=True, slots=True)
class Question:
    text: str
    evidence: tuple[str, ...]  # dia_ids, as upstream spells them (a typo stays unreachable)
    category: int


@dataclass(frozen=True, slots=True)
class Conversation:
    sample_id: str
    speaker_a: str
    sessions: tuple[Session, ...]
    questions: tuple[Question, ...]

    @property
    def scope(self) -> dict[str, str]:
        return {"user_id": f"locomo-{self.sample_id}"}

    def turns(self) -> list[Turn]:
        return [t for s in self.sessions for t in s.turns]


def turn_text(turn: Mapping[str, Any], date_time: str) -> str:
    caption = turn.get("blip_caption")
    shared = f" [shares {caption}]" if isinstance(caption, str) and caption.strip() else ""
    return f"[{date_time}] {turn['speaker']}: {turn['text']}{shared}"


def load(path: Path | str) -> list[Conversation]:
    """The conversations of an upstream LoCoMo file (``data/locomo10.json``'s format)."""
    conversations = []
    for item in json.loads(Path(path).read_text()):
        conv = item["conversation"]
        numbers = sorted(int(m[1]) for k in conv if (m := _SESSION.fullmatch(k)))
        sessions = tuple(
            Session(
                key=f"session_{n}",
                date_time=conv[f"session_{n}_date_time"],
                turns=tuple(
                    Turn(t["dia_id"], t["speaker"], turn_text(t, conv[f"session_{n}_date_time"]))
                    for t in conv[f"session_{n}"]
                ),
            )
            for n in numbers
        )
        questions = tuple(
            Question(q["question"], tuple(str(e) for e in q["evidence"]), int(q["category"]))
            for q in item["qa"]
        )
        conversations.append(
            Conversation(item["sample_id"], conv["speaker_a"], sessions, questions)
        )
    return conversations


def messages(conversation: Conversation, session: Session) -> list[dict[str, Any]]:
    """A session as ``extract``'s messages: the first speaker is the user, the other the
    assistant (both are read), each message's id its turn's ``dia_id``."""
    return [
        {
            "id": t.dia_id,
            "message": {
                "role": "user" if t.speaker == conversation.speaker_a else "assistant",
                "content": t.text,
            },
            "run_id": session.key,
        }
        for t in session.turns
    ]


@dataclass(frozen=True, slots=True)
class Ingest:
    turns: int
    seconds: float

    @property
    def turns_per_s(self) -> float:
        return self.turns / self.seconds


def ingest(producer: Producer, conversations: Sequence[Conversation], timeout_s: float) -> Ingest:
    """Every session sent as one ``extract(infer=False)``, all in flight at once, timed
    to the last receipt."""
    started = time.perf_counter()
    pending = [
        producer.extract(
            c.scope,
            messages(c, s),
            infer=False,
            operation_id=f"locomo:{c.sample_id}:{s.key}",
        )
        for c in conversations
        for s in c.sessions
    ]
    for p in pending:
        p.wait(timeout_s)
    seconds = time.perf_counter() - started
    return Ingest(sum(len(c.turns()) for c in conversations), seconds)


def steady(dsn: str) -> None:
    """The statistics autovacuum would gather within a minute of the writes (recall's
    lexical list weighs words by them): gathered now, so that every run, however soon
    it asks, measures the store as it serves once the writes have settled."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("ANALYZE")


# What a system answers for one question: the turns each of its hits cites, best first.
Ranked = list[list[str]]
Ask = Callable[[Conversation, str], Ranked]


def api_recall(client: httpx.Client, tokens: Mapping[str, str]) -> Ask:
    """Recall through ``POST /api/v1/recall`` with the conversation's scoped token."""

    def ask(conversation: Conversation, question: str) -> Ranked:
        response = client.post(
            "/api/v1/recall",
            json={"text": question, "top_k": TOP_K},
            headers={"Authorization": f"Bearer {tokens[conversation.sample_id]}"},
        )
        response.raise_for_status()
        return [
            [s["message_id"] for s in hit["record"].get("sources", []) if "message_id" in s]
            for hit in response.json()["hits"]
        ]

    return ask


def store_recall(store: Store) -> Ask:
    """The same recall called on the store in this process, given no embedder (it
    follows the active generation, as the API's does): what the door adds is the
    difference."""

    def ask(conversation: Conversation, question: str) -> Ranked:
        hits = store.recall(conversation.scope, question, top_k=TOP_K)
        return [[s.message_id for s in h.record.sources if s.message_id] for h in hits]

    return ask


@dataclass(slots=True)
class Scores:
    """One system's answers, question by question, and the time each took."""

    recall_at: dict[int, list[float]] = field(default_factory=lambda: {k: [] for k in CUTS})
    reciprocal_ranks: list[float] = field(default_factory=list)
    categories: list[int] = field(default_factory=list)
    latencies_ms: list[float] = field(default_factory=list)

    def add(self, question: Question, ranked: Ranked, latency_ms: float) -> None:
        evidence = set(question.evidence)
        for k in CUTS:
            found = {turn for hit in ranked[:k] for turn in hit}
            self.recall_at[k].append(len(evidence & found) / len(evidence))
        first = next((i for i, hit in enumerate(ranked[:TOP_K], 1) if evidence & set(hit)), None)
        self.reciprocal_ranks.append(1 / first if first else 0.0)
        self.categories.append(question.category)
        self.latencies_ms.append(latency_ms)

    def summary(self, categories: Iterable[int]) -> dict[str, float]:
        wanted = set(categories)
        picked = [i for i, c in enumerate(self.categories) if c in wanted]
        if not picked:
            return {"questions": 0}
        out: dict[str, float] = {"questions": len(picked)}
        for k in CUTS:
            out[f"recall@{k}"] = statistics.fmean(self.recall_at[k][i] for i in picked)
        out["mrr"] = statistics.fmean(self.reciprocal_ranks[i] for i in picked)
        return out


def scored(questions: Iterable[Question]) -> list[Question]:
    """The questions evidence recall is defined for (upstream, 2 name no evidence)."""
    return [q for q in questions if q.evidence]


def run(conversations: Sequence[Conversation], ask: Ask, limit: int | None = None) -> Scores:
    """Each conversation's questions (its first ``limit``), asked one at a time."""
    scores = Scores()
    for c in conversations:
        for q in scored(c.questions)[:limit]:
            started = time.perf_counter()
            ranked = ask(c, q.text)
            scores.add(q, ranked, (time.perf_counter() - started) * 1000)
    return scores
