"""Embedders that cannot load, registered by name for the reembed tests."""

from __future__ import annotations

from store import HashingEmbedder
from tests.jobs_fixtures import PLUGINS

# The jobs fixtures' plugins and these.
FAULTY_PLUGINS = (
    f"{PLUGINS},unloadable=tests.embedder_faults:Unloadable,"
    "nofactory=tests.embedder_faults:factory_fails"
)


class Unloadable(HashingEmbedder):
    """Its model file is missing: loading it raises (as a real model's load would)."""

    def __init__(self) -> None:
        super().__init__(24, model_id="unloadable-24")

    def load(self) -> None:
        raise FileNotFoundError("model file /models/unloadable.onnx is missing")


def factory_fails() -> HashingEmbedder:
    raise RuntimeError("no GPU here")
