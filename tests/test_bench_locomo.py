"""How the LoCoMo bench reads the upstream file and scores an answer (``bench.locomo``):
pure, no servers."""

from __future__ import annotations

import json
from pathlib import Path

from bench import locomo

UPSTREAM = [
    {
        "sample_id": "conv-x",
        "conversation": {
            "speaker_a": "Ada",
            "speaker_b": "Bo",
            "session_2_date_time": "9:00 am on 2 May, 2023",
            "session_2": [{"speaker": "Bo", "dia_id": "D2:1", "text": "Back again."}],
            "session_1_date_time": "1:56 pm on 8 May, 2023",
            "session_1": [
                {"speaker": "Ada", "dia_id": "D1:1", "text": "I adopted a cat."},
                {
                    "speaker": "Bo",
                    "dia_id": "D1:2",
                    "text": "Look!",
                    "img_url": ["https://example.invalid/x.jpg"],
                    "blip_caption": "a photo of a kitten",
                },
            ],
        },
        "qa": [
            {"question": "Q1", "answer": "a", "evidence": ["D1:1", "D1:2"], "category": 4},
            {"question": "Q2", "answer": "b", "evidence": ["D1:1; D2:1"], "category": 1},
            {"question": "Q3", "answer": "c", "evidence": [], "category": 3},
        ],
    }
]


def test_a_session_becomes_messages_carrying_date_speaker_and_caption(tmp_path: Path) -> None:
    path = tmp_path / "locomo.json"
    path.write_text(json.dumps(UPSTREAM))
    [conv] = locomo.load(path)
    assert [s.key for s in conv.sessions] == ["session_1", "session_2"]  # by number
    assert locomo.messages(conv, conv.sessions[0]) == [
        {
            "id": "D1:1",
            "message": {
                "role": "user",
                "content": "[1:56 pm on 8 May, 2023] Ada: I adopted a cat.",
            },
            "run_id": "session_1",
        },
        {
            "id": "D1:2",
            "message": {
                "role": "assistant",
                "content": "[1:56 pm on 8 May, 2023] Bo: Look! [shares a photo of a kitten]",
            },
            "run_id": "session_1",
        },
    ]
    # A question naming no evidence is not scored; a typo stays, unreachable.
    assert [q.text for q in locomo.scored(conv.questions)] == ["Q1", "Q2"]
    assert conv.questions[1].evidence == ("D1:1; D2:1",)


def test_evidence_recall_counts_each_turn_cited_and_mrr_the_first() -> None:
    [q1, q2] = [
        locomo.Question("Q1", ("D1:1", "D1:2"), 4),
        locomo.Question("Q2", ("D9:9",), 1),
    ]
    scores = locomo.Scores()
    # Rank 1 cites nothing asked for; rank 3 one of the two; rank 7 the other.
    ranked = [["D5:1"], ["D5:2"], ["D1:2"], [], [], [], ["D1:1", "D5:3"], [], [], []]
    scores.add(q1, ranked, 2.0)
    scores.add(q2, [["D1:1"]], 4.0)
    assert scores.summary([4]) == {"questions": 1, "recall@5": 0.5, "recall@10": 1.0, "mrr": 1 / 3}
    assert scores.summary([1]) == {"questions": 1, "recall@5": 0.0, "recall@10": 0.0, "mrr": 0.0}
    assert scores.summary([1, 4])["recall@10"] == 0.5
    assert scores.summary([5]) == {"questions": 0}
    assert scores.latencies_ms == [2.0, 4.0]
