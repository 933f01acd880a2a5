"""Embedders by name, and by the model id a generation stores.

A spec names an embedder:

- ``wordllama[:DIMS]``: WordLlama, the default (256 dimensions, or its first DIMS);
- ``minilm``: all-MiniLM-L6-v2 as int8 ONNX (``pip install 'engram[minilm]'``);
- ``hashing[:DIMS]``: feature hashing, for tests (64 dimensions by default);
- ``package.module:factory``: any callable that returns an embedder;
- a name the configuration registers: ``ENGRAM_EMBEDDERS="mine=package.module:factory"``
  (comma-separated ``name=package.module:factory`` pairs).

A generation records only a model id and a size. ``for_model`` finds the
embedder that produces them, so a process can follow the store to a model
another process switched it to: the built-ins are recognised by their model
ids, a configured name by asking its factory (once) what it produces.
Creating an embedder loads no model; that happens on its first use. ``load``
loads one now and tries it on a short text: what a reembed does before it
creates a generation, so that a model that cannot load here is refused at once.

Only the command line and the configuration may name a ``package.module:factory``:
a model asked for from outside (the dashboard, the API) must be a registered name
(``check_registered``), or anyone who can reach a form could import any module
and call any function in it.
"""

from __future__ import annotations

import importlib
import logging
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ..errors import (
    EmbedderLoadError,
    EmbedderUnavailableError,
    EngramError,
    InvalidRequestError,
    UnregisteredModelError,
)
from .embedders import Embedder, HashingEmbedder, WordLlamaEmbedder, embed_checked
from .minilm import MODEL_ID as MINILM_MODEL_ID
from .minilm import MiniLMEmbedder

log = logging.getLogger(__name__)

BUILTIN_NAMES = ("wordllama", "minilm", "hashing")
# A registered name, with the DIMS the sized built-ins take: never a dotted path.
_REGISTERED_SPEC = re.compile(r"([a-z][a-z0-9_-]{0,63})(?::([0-9]{1,6}))?")
_SIZED = ("wordllama", "hashing")


# What ``load`` embeds to see that a model works: no one's data.
PROBE_TEXT = "engram checks that this model loads."
# What a model that loaded may raise for a text it will not take: a fault of the
# text, not of the model, so not a reason to refuse it (a reembed counts each batch
# that fails so, and ends failed, its cause on its progress, if every batch does).
_TEXT_FAULTS = (ValueError, TypeError)

# The model ids the built-ins produce, and the spec that makes each again.
_BUILTIN_MODELS: tuple[tuple[re.Pattern[str], Callable[[re.Match[str]], str]], ...] = (
    (re.compile(r"wordllama-l2-supercat-(\d+)"), lambda m: f"wordllama:{m[1]}"),
    (re.compile(r"hashing-(\d+)"), lambda m: f"hashing:{m[1]}"),
    (re.compile(re.escape(MINILM_MODEL_ID)), lambda m: "minilm"),
)


def parse_plugins(value: str) -> dict[str, str]:
    """``"a=pkg.mod:fn, b=pkg.other:make"`` as ``{"a": "pkg.mod:fn", ...}``."""
    plugins: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in value.split(","))):
        name, sep, target = (s.strip() for s in item.partition("="))
        if not sep or not re.fullmatch(r"[a-z][a-z0-9_-]*", name) or not _is_dotted(target):
            raise InvalidRequestError(
                f"ENGRAM_EMBEDDERS entries look like name=package.module:factory, not {item!r}"
            )
        if name in BUILTIN_NAMES:
            raise InvalidRequestError(f"{name!r} is a built-in embedder name")
        plugins[name] = target
    return plugins


class EmbedderRegistry:
    def __init__(self, plugins: Mapping[str, str] | None = None) -> None:
        self.plugins = dict(plugins or {})
        self._lock = threading.Lock()
        self._by_model: dict[tuple[str, int], Embedder] = {}
        self._plugin_instances: dict[str, Embedder] = {}

    def names(self) -> list[str]:
        return [*BUILTIN_NAMES, *self.plugins]

    def check_registered(self, spec: str) -> str:
        """``spec`` as a registered name (``wordllama[:DIMS]``, ``minilm``,
        ``hashing[:DIMS]``, a configured name; in any case, ``MiniLM`` is ``minilm``),
        else ``UnregisteredModelError`` naming the names there are. Pure: imports
        nothing, calls nothing."""
        given = spec.strip() if isinstance(spec, str) else ""
        match = _REGISTERED_SPEC.fullmatch(given.lower())
        name, dims = (match[1], match[2]) if match else ("", None)
        if not match or name not in self.names() or (dims is not None and name not in _SIZED):
            raise UnregisteredModelError(
                f"{self._refusal(given)}: use one of the registered embedders, "
                f"{self.described_names()}"
            )
        return given.lower()

    def described_names(self) -> str:
        """The names a request may ask for, as a person reads them."""
        return ", ".join(f"{n}[:DIMS]" if n in _SIZED else n for n in self.names())

    def _refusal(self, given: str) -> str:
        name, sep, _ = given.lower().partition(":")
        if sep and name in self.names():
            sized = name in _SIZED
            return f"{name!r} takes :DIMS, a number" if sized else f"{name!r} takes no :DIMS"
        if _is_dotted(given):
            return f"{given!r} is a module path, which only the command line may name"
        return f"no embedder is registered as {given!r}" if given else "no model named"

    def create(self, spec: str) -> Embedder:
        """A new embedder for ``spec`` (see the module's docstring); no model is loaded yet."""
        name, _, arg = spec.strip().partition(":")
        if name in self.plugins and not arg:
            return _call_factory(self.plugins[name])
        if name == "wordllama":
            return WordLlamaEmbedder(_dims(spec, arg, 256)) if arg else WordLlamaEmbedder()
        if name == "hashing":
            return HashingEmbedder(_dims(spec, arg, 16000)) if arg else HashingEmbedder()
        if name == "minilm" and not arg:
            return MiniLMEmbedder()
        if _is_dotted(spec.strip()):
            return _call_factory(spec.strip())
        raise InvalidRequestError(
            f"unknown embedder {spec!r}: use one of {', '.join(self.names())}"
            " or package.module:factory"
        )

    def load(self, spec: str) -> Embedder:
        """A new embedder for ``spec``, its model loaded and tried on one short text.

        ``EmbedderLoadError`` (its message says why, with the install hint for a
        built-in whose extra is missing) when it cannot load; ``InvalidRequestError``
        for a spec that names no embedder."""
        try:
            embedder = self.create(spec)
        except InvalidRequestError:
            raise  # not an embedder this can make: the spec is wrong, not the machine
        except Exception as exc:  # not importable here, or its factory failed
            raise _unavailable(spec, exc) from None
        try:
            loader = getattr(embedder, "load", None)
            if callable(loader):
                loader()
        except Exception as exc:
            raise _unavailable(spec, exc) from None
        try:
            embed_checked(embedder, [PROBE_TEXT])
        except _TEXT_FAULTS:
            pass  # it loaded and ran; its batches that fail are counted as they go
        except Exception as exc:
            raise _unavailable(spec, exc) from None
        return embedder

    def add(self, embedder: Embedder) -> Embedder:
        """Use this instance for its model from now on (a process's configured embedder)."""
        with self._lock:
            self._by_model[embedder.model_id, embedder.dims] = embedder
        return embedder

    def for_model(self, model_id: str, dims: int) -> Embedder:
        """The embedder that produces ``model_id`` vectors of ``dims``, made once and kept."""
        with self._lock:
            found = self._by_model.get((model_id, dims))
            if found is None:
                found = self._find(model_id, dims)
                self._by_model[model_id, dims] = found
            return found

    def _find(self, model_id: str, dims: int) -> Embedder:
        for pattern, spec in _BUILTIN_MODELS:
            match = pattern.fullmatch(model_id)
            if match:
                embedder = self.create(spec(match))
                if embedder.dims == dims:
                    return embedder
        failed: list[str] = []
        for name, target in self.plugins.items():
            plugin = self._plugin_instances.get(name)
            if plugin is None:
                try:
                    plugin = self._plugin_instances[name] = _call_factory(target)
                except Exception:  # another plugin's fault must not hide the one asked for
                    failed.append(name)
                    continue
            if (plugin.model_id, plugin.dims) == (model_id, dims):
                return plugin
        if failed:
            log.warning("embedder plugins that could not be made", extra={"plugins": failed})
        raise EmbedderUnavailableError(
            f"no embedder here produces {model_id} ({dims} dimensions): "
            "install its package, or register it with ENGRAM_EMBEDDERS"
        )

    def resolver(self, default: Embedder | None) -> GenerationEmbedders:
        """What a writer embeds with: ``default`` before the store has a generation,
        then the active generation's model, whichever process switched it."""
        if default is not None:
            self.add(default)
        return GenerationEmbedders(self, default)


@dataclass(frozen=True, slots=True)
class GenerationEmbedders:
    """An ``EmbedderResolver`` backed by a registry."""

    registry: EmbedderRegistry
    default: Embedder | None

    def for_generation(self, model_id: str | None, dims: int | None) -> Embedder | None:
        if model_id is None or dims is None:
            return self.default
        return self.registry.for_model(model_id, dims)


def _unavailable(spec: str, exc: BaseException) -> EmbedderLoadError:
    # An EngramError's message is written for people; another's may be anything.
    why = exc.message if isinstance(exc, EngramError) else f"{type(exc).__name__}: {exc}"[:300]
    return EmbedderLoadError(f"model {spec.strip()!r} cannot be loaded here: {why}")


def _dims(spec: str, arg: str, largest: int) -> int:
    if not arg.isdigit() or not 1 <= int(arg) <= largest:
        raise InvalidRequestError(f"embedder {spec!r}: DIMS must be a number from 1 to {largest}")
    return int(arg)


def _is_dotted(target: str) -> bool:
    return re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", target) is not None


def _call_factory(target: str) -> Embedder:
    module, _, attr = target.partition(":")
    try:
        factory = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise EmbedderUnavailableError(
            f"embedder factory {target} cannot be loaded ({exc})"
        ) from None
    embedder: Embedder = factory()
    if not isinstance(embedder, Embedder):
        raise InvalidRequestError(f"{target} did not return an embedder (model_id, dims, embed)")
    return embedder
