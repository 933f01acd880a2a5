"""The embedder registry: names, model ids, and a user's own embedders."""

from __future__ import annotations

import pytest

from engram.store import HashingEmbedder, WordLlamaEmbedder
from engram.store.errors import EmbedderUnavailableError, InvalidRequestError
from engram.store.vectors.minilm import MiniLMEmbedder
from engram.store.vectors.registry import EmbedderRegistry, parse_plugins
from tests.embedder_faults import FAULTY_PLUGINS
from tests.jobs_fixtures import PLUGINS, SlowHashing


def test_built_ins_by_name_load_no_model() -> None:
    registry = EmbedderRegistry()
    assert isinstance(registry.create("wordllama"), WordLlamaEmbedder)
    assert registry.create("wordllama:64").model_id == "wordllama-l2-supercat-64"
    assert isinstance(registry.create("minilm"), MiniLMEmbedder)
    assert registry.create("hashing").model_id == "hashing-64"
    assert registry.create("hashing:16").dims == 16


@pytest.mark.parametrize(
    "spec", ["nope", "hashing:0", "hashing:x", "wordllama:999", "minilm:2", "pkg:", ":factory"]
)
def test_an_unknown_or_malformed_spec_is_refused(spec: str) -> None:
    with pytest.raises(InvalidRequestError):
        EmbedderRegistry().create(spec)


def test_a_missing_factory_is_unavailable_not_a_crash() -> None:
    with pytest.raises(EmbedderUnavailableError, match="cannot be loaded"):
        EmbedderRegistry().create("no_such_package.module:factory")


def test_a_generation_s_model_id_finds_its_embedder_again() -> None:
    registry = EmbedderRegistry()
    assert registry.for_model("hashing-32", 32).dims == 32
    assert (
        registry.for_model("wordllama-l2-supercat-256", 256).model_id == "wordllama-l2-supercat-256"
    )
    assert isinstance(registry.for_model("all-MiniLM-L6-v2-onnx-int8", 384), MiniLMEmbedder)
    assert registry.for_model("hashing-32", 32) is registry.for_model("hashing-32", 32), "made once"
    with pytest.raises(EmbedderUnavailableError, match="ENGRAM_EMBEDDERS"):
        registry.for_model("someone-elses-model", 12)
    with pytest.raises(EmbedderUnavailableError):
        registry.for_model("hashing-32", 31)  # the right name, another size


def test_configured_embedders_are_found_by_name_and_by_model_id() -> None:
    registry = EmbedderRegistry(parse_plugins(PLUGINS))
    assert isinstance(registry.create("slow"), SlowHashing)
    assert "slow" in registry.names() and "leaky" in registry.names()
    assert isinstance(registry.for_model("slow-hashing-32", 32), SlowHashing)


@pytest.mark.parametrize(
    "value", ["slow", "slow=", "=pkg.mod:fn", "Bad=pkg.mod:fn", "minilm=pkg.mod:fn", "a=pkg.mod"]
)
def test_malformed_embedders_configuration_is_refused(value: str) -> None:
    with pytest.raises(InvalidRequestError):
        parse_plugins(value)


def test_an_added_instance_is_used_for_its_model() -> None:
    """A worker's configured embedder wins over a fresh one of the same model id."""
    registry = EmbedderRegistry()
    mine = HashingEmbedder(64)
    registry.add(mine)
    assert registry.for_model("hashing-64", 64) is mine


def test_the_resolver_uses_the_default_before_any_generation_then_the_active_model() -> None:
    default = HashingEmbedder(64)
    resolver = EmbedderRegistry().resolver(default)
    assert resolver.for_generation(None, None) is default
    assert resolver.for_generation("hashing-64", 64) is default
    assert resolver.for_generation("hashing-16", 16).dims == 16


def test_a_plugin_whose_factory_fails_does_not_hide_another_model() -> None:
    registry = EmbedderRegistry(parse_plugins(FAULTY_PLUGINS))  # nofactory comes first
    assert registry.for_model("breaks-24", 24).model_id == "breaks-24"
