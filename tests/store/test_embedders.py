"""The built-in embedders."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from engram.store import EmbeddingMismatchError, HashingEmbedder, KeywordEmbedder, WordLlamaEmbedder
from engram.store.vectors.embedders import Embedder, embed_checked


def test_wordllama_loads_offline_from_its_wheel_and_is_semantic() -> None:
    embedder = WordLlamaEmbedder()
    assert isinstance(embedder, Embedder)
    vectors = embed_checked(
        embedder, ["Ada lives in London.", "Ada resides in London.", "Quarterly revenue grew."]
    )
    assert vectors.shape == (3, 256) and vectors.dtype == np.float32
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-4)
    sims = vectors @ vectors.T
    assert sims[0, 1] > sims[0, 2] + 0.2


def test_loading_the_default_embedder_leaves_the_callers_logging_alone() -> None:
    # In a fresh interpreter: wordllama calls logging.basicConfig(level=INFO) when
    # first imported, which would print every INFO line of the caller's program.
    program = (
        "import logging\n"
        "from store import WordLlamaEmbedder\n"
        "WordLlamaEmbedder().load()\n"
        "root = logging.getLogger()\n"
        "print(len(root.handlers), logging.getLevelName(root.level))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, check=True, timeout=120
    )
    assert done.stdout.split() == ["0", "WARNING"]


def test_hashing_embedder_is_deterministic_and_word_based() -> None:
    a = HashingEmbedder(64).embed(["Tea time", "tea", "coffee"])
    b = HashingEmbedder(64).embed(["Tea time", "tea", "coffee"])
    assert np.array_equal(a, b)
    assert a[0] @ a[1] > 0.5 and abs(a[1] @ a[2]) < 0.5
    assert HashingEmbedder(16).model_id == "hashing-16"


def test_embed_checked_refuses_wrong_shapes() -> None:
    class Short(KeywordEmbedder):
        def embed(self, texts):  # type: ignore[no-untyped-def]
            return [[1.0] for _ in texts]

    with pytest.raises(EmbeddingMismatchError, match="declares 2 dimensions"):
        embed_checked(Short("short", ["a", "b"]), ["x"])

    class Few(KeywordEmbedder):
        def embed(self, texts):  # type: ignore[no-untyped-def]
            return [[1.0, 0.0]]

    with pytest.raises(EmbeddingMismatchError, match="returned 1 vectors for 2 texts"):
        embed_checked(Few("few", ["a", "b"]), ["x", "y"])
