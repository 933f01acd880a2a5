"""What the processes engram starts are built from, in the composition root: the
embedders this process knows, the one it starts with, the model the workers call,
and a long-running process made ready (``settle``)."""

from __future__ import annotations

import gc
from dataclasses import replace
from typing import TYPE_CHECKING

from engram.store import Embedder
from engram.store.errors import ConfigError, EngramError
from engram.store.vectors.registry import EmbedderRegistry, parse_plugins
from engram.worker.settings import Settings

if TYPE_CHECKING:
    from engram.store import OpenAICompatibleLLM


def registry(settings: Settings) -> EmbedderRegistry:
    """The embedders this process knows: the built-ins and ``ENGRAM_EMBEDDERS``."""
    try:
        return EmbedderRegistry(parse_plugins(settings.embedders))
    except EngramError as exc:
        raise ConfigError(exc.message) from None


def load_embedder(spec: str, known: EmbedderRegistry | None = None) -> Embedder:
    """``wordllama`` (the default), ``minilm``, ``hashing[:DIMS]``, a name registered in
    ``ENGRAM_EMBEDDERS``, or ``package.module:factory`` (see ``store.vectors.registry``)."""
    try:
        return (known or EmbedderRegistry()).create(spec)
    except EngramError as exc:
        raise ConfigError(exc.message) from None


def load_llm(settings: Settings) -> OpenAICompatibleLLM | None:
    """The model the workers call (``ENGRAM_LLM_URL``...), or None without one: then
    ``supersede`` defaults to add and ``infer`` to false."""
    if settings.llm is None:
        return None
    from engram.store.models.llm_client import OpenAICompatibleLLM  # httpx: only when used

    # One connection per concurrent call, no more.
    config = replace(settings.llm, max_connections=settings.worker.llm_concurrency)
    return OpenAICompatibleLLM(config)


def settle(embedder: Embedder | None) -> None:
    """Ready a long-running process: load the embedder's model now if it can (not on
    the first batch), then keep everything loaded so far (modules, the model's vocabulary,
    the pools) out of the cyclic garbage collector's full passes.

    Measured in a worker under load: each full pass scanned all of it and paused
    the process for 70-80 ms, which every operation in flight waited through.
    """
    # Only an embedder that offers ``load``: a warm-up call to another could cost
    # (a remote API) or be observed.
    load = getattr(embedder, "load", None)
    if callable(load):
        load()
    gc.collect()
    gc.freeze()
