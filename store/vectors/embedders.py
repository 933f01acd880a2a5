"""Embedders: a model id, a size, and a function from texts to vectors.

Built in here: ``WordLlamaEmbedder`` (the default, a real semantic model whose
weights ship inside its wheel and run offline) and ``HashingEmbedder``
(deterministic and dependency-free, for tests of exact behaviour); the
optional ``minilm`` module has a better model, and ``registry`` finds any of
them by name or by the model id a generation stores.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
from numpy.typing import NDArray

from ..errors import EmbeddingMismatchError

Vectors = NDArray[np.float32]


@runtime_checkable
class Embedder(Protocol):
    @property
    def model_id(self) -> str: ...

    @property
    def dims(self) -> int: ...

    def embed(self, texts: Sequence[str]) -> Sequence[Sequence[float]] | Vectors:
        """One vector of ``dims`` floats per text, in order."""
        ...


@runtime_checkable
class EmbedderResolver(Protocol):
    """Chooses what a write embeds with, from the store's active generation."""

    def for_generation(self, model_id: str | None, dims: int | None) -> Embedder | None:
        """The embedder for the active generation's model (``None, None``: the store has
        no generation yet); raises ``EmbedderUnavailableError`` when none is known here."""
        ...


def embedder_for(
    embedder: Embedder | EmbedderResolver | None, model_id: str | None, dims: int | None
) -> Embedder | None:
    """What embeds for the active generation (``model_id``, ``dims``): the resolver's
    choice, or the one embedder given (a mismatch is for the caller to refuse)."""
    if isinstance(embedder, EmbedderResolver):
        return embedder.for_generation(model_id, dims)
    return embedder


def check_matches(embedder: Embedder, model_id: str, dims: int) -> None:
    """Refuse a query embedder other than the active generation's (``model_id``, ``dims``):
    its vectors would be compared with another model's."""
    if (embedder.model_id, embedder.dims) != (model_id, dims):
        raise EmbeddingMismatchError(
            f"query embedder {embedder.model_id} ({embedder.dims} dimensions) does not "
            f"match the active generation {model_id} ({dims})"
        )


def embed_checked(embedder: Embedder, texts: Sequence[str]) -> Vectors:
    """Call an embedder and refuse an answer of the wrong shape."""
    if not texts:
        return np.zeros((0, embedder.dims), dtype=np.float32)
    vectors = np.asarray(embedder.embed(list(texts)), dtype=np.float32)
    if vectors.ndim != 2 or vectors.shape[0] != len(texts):
        raise EmbeddingMismatchError(
            f"embedder {embedder.model_id} returned {vectors.shape[0] if vectors.ndim else 0} "
            f"vectors for {len(texts)} texts"
        )
    if vectors.shape[1] != embedder.dims:
        raise EmbeddingMismatchError(
            f"embedder {embedder.model_id} declares {embedder.dims} dimensions "
            f"but returned {vectors.shape[1]}"
        )
    if not np.isfinite(vectors).all():
        raise EmbeddingMismatchError(f"embedder {embedder.model_id} returned non-finite values")
    return vectors


class HashingEmbedder:
    """Feature hashing of lower-cased words into ``dims`` buckets, L2-normalised.

    Deterministic across processes and machines; similar only in shared words.
    """

    def __init__(self, dims: int = 64, model_id: str | None = None) -> None:
        self._dims = dims
        self._model_id = model_id or f"hashing-{dims}"

    @property
    def model_id(self) -> str:
        return self._model_id

    @property
    def dims(self) -> int:
        return self._dims

    def embed(self, texts: Sequence[str]) -> Vectors:
        out = np.zeros((len(texts), self._dims), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in re.findall(r"[^\W_]+", text.lower()):
                h = int.from_bytes(hashlib.blake2b(word.encode(), digest_size=8).digest(), "big")
                out[row, h % self._dims] += 1.0 if (h >> 63) & 1 else -1.0
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        np.divide(out, norms, out=out, where=norms > 0)
        return out


class KeywordEmbedder:
    """One dimension per keyword, 1 when the text contains it (seed 000's toy)."""

    def __init__(self, model_id: str, words: Sequence[str]) -> None:
        self._model_id = model_id
        self.words = [w.lower() for w in words]

    @property
    def model_id(self) -> str:
        return self._model_id

    @property
    def dims(self) -> int:
        return len(self.words)

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        return [[1.0 if w in t.lower() else 0.0 for w in self.words] for t in texts]


class WordLlamaEmbedder:
    """The default embedder: WordLlama (256 dimensions), loaded offline from its wheel."""

    _lock = threading.Lock()
    _model: Any = None

    def __init__(self, dims: int = 256) -> None:
        self._dims = dims

    @property
    def model_id(self) -> str:
        return f"wordllama-l2-supercat-{self._dims}"

    @property
    def dims(self) -> int:
        return self._dims

    @classmethod
    def _load(cls) -> Any:
        with cls._lock:
            if cls._model is None:
                # Tokenizing a batch on a thread pool costs more CPU than it saves
                # (measured: 4 texts 0.51 ms of CPU in parallel, 0.11 ms in one
                # thread; 128 texts 4.1 against 2.7 ms).
                os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
                wordllama = _import_wordllama()

                # load() looks for its tokenizer in the wrong folder and then tries
                # the network; the weights and tokenizer are inside the package.
                cls._model = wordllama.WordLlama.load(
                    cache_dir=Path(wordllama.__file__).parent, disable_download=True
                )
            return cls._model

    def load(self) -> None:
        """Load the model now rather than on the first ``embed`` (a long-running
        process calls this at startup)."""
        self._load()

    def embed(self, texts: Sequence[str]) -> Vectors:
        model = self._load()
        vectors = model.embed(list(texts), norm=True)
        return np.asarray(vectors, dtype=np.float32)[:, : self._dims]


def _import_wordllama() -> Any:
    """``import wordllama``, which calls ``logging.basicConfig(level=INFO)`` at
    import: that would configure the root logger of whoever embeds (a
    producer's own program included). A handler of ours on the root logger for
    the import makes that call a no-op."""
    root = logging.getLogger()
    guard = logging.NullHandler()
    root.addHandler(guard)
    try:
        import wordllama
    finally:
        root.removeHandler(guard)
    return wordllama


def default_embedder() -> Embedder:
    return WordLlamaEmbedder()
