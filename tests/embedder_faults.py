"""Embedders that cannot load, or break mid-way, registered by name for the reembed
tests."""

from __future__ import annotations

import os
from typing import Any

from engram.store import HashingEmbedder
from tests.jobs_fixtures import PLUGINS

# The jobs fixtures' plugins and these.
FAULTY_PLUGINS = (
    f"{PLUGINS},unloadable=tests.embedder_faults:Unloadable,"
    "nofactory=tests.embedder_faults:factory_fails,"
    "breaks=tests.embedder_faults:BreaksMidway"
)

# What BreaksMidway raises once it has embedded its share.
BREAKS_WITH = "the model server at 10.0.0.7:8080 went away (HTTP 503)"


class Unloadable(HashingEmbedder):
    """Its model file is missing: loading it raises (as a real model's load would)."""

    def __init__(self) -> None:
        super().__init__(24, model_id="unloadable-24")

    def load(self) -> None:
        raise FileNotFoundError("model file /models/unloadable.onnx is missing")


def factory_fails() -> HashingEmbedder:
    raise RuntimeError("no GPU here")


class BreaksMidway(HashingEmbedder):
    """Embeds ``ENGRAM_TEST_EMBED_BREAK_AFTER`` texts (1 unless set: the one a start
    tries) in this process, then its model server goes away: every later call raises."""

    def __init__(self) -> None:
        super().__init__(24, model_id="breaks-24")
        self.left = int(os.environ.get("ENGRAM_TEST_EMBED_BREAK_AFTER", "1"))

    def embed(self, texts: Any) -> Any:
        if len(texts) > self.left:
            self.left = 0
            raise RuntimeError(BREAKS_WITH)
        self.left -= len(texts)
        return super().embed(texts)
