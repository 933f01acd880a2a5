"""Strict reading of request objects: types, limits, unknown fields refused.

Every check raises ``InvalidRequestError`` with a message that names the
field and never quotes memory text.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import InvalidRequestError
from ..limits import (
    MAX_ID_CHARS,
    MAX_JSON_DEPTH,
    MAX_KIND_CHARS,
    MAX_LINKS,
    MAX_METADATA_BYTES,
    MAX_SOURCES,
    MAX_TEXT_CHARS,
)
from ..values import LINK_RELATIONS, SOURCE_KINDS, Link, Source, check_encodable, check_string


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def plain_json(value: object, what: str, *, max_bytes: int) -> Any:
    """A copy of ``value`` as plain JSON (objects with string keys, lists, strings, finite
    numbers, booleans, null), or ``InvalidRequestError``: too deep, too large, NUL
    characters, text with no UTF-8 form, or anything JSON cannot hold."""
    _check_depth(value, what)
    try:
        encoded = json.dumps(
            value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        )
    except (TypeError, ValueError) as exc:
        raise InvalidRequestError(f"{what} must be plain JSON (finite numbers only)") from exc
    if "\\u0000" in encoded or "\x00" in encoded:
        raise InvalidRequestError(f"{what} must not contain NUL characters")
    check_encodable(encoded, what)
    if len(encoded.encode()) > max_bytes:
        raise InvalidRequestError(f"{what} is larger than {max_bytes} bytes")
    return json.loads(encoded)


def _check_depth(value: object, what: str) -> None:
    """Nesting deeper than ``MAX_JSON_DEPTH`` is refused before anything recurses into it."""
    level: list[object] = [value]
    for _ in range(MAX_JSON_DEPTH + 1):
        deeper: list[object] = []
        for item in level:
            if isinstance(item, Mapping):
                deeper.extend(item.values())
            elif isinstance(item, list | tuple):
                deeper.extend(item)
        if not deeper:
            return
        level = deeper
    raise InvalidRequestError(f"{what} nests deeper than {MAX_JSON_DEPTH} levels")


class Fields:
    """Strict reading of one request object: unknown fields are refused."""

    def __init__(self, data: object, what: str, allowed: Sequence[str]) -> None:
        if not isinstance(data, Mapping):
            raise InvalidRequestError(f"{what} must be an object")
        unknown = sorted(set(data) - set(allowed))
        if unknown:
            raise InvalidRequestError(f"unknown field(s) in {what}: {', '.join(map(str, unknown))}")
        self.data = data
        self.what = what

    def get(self, name: str) -> Any:
        return self.data.get(name)

    def text(self, name: str, *, required: bool = True) -> str | None:
        value = self.data.get(name)
        if value is None and not required:
            return None
        return check_string(value, f"{self.what}.{name}", max_chars=MAX_TEXT_CHARS)

    def ident(self, name: str, *, required: bool = True) -> str | None:
        value = self.data.get(name)
        if value is None and not required:
            return None
        return check_string(value, f"{self.what}.{name}", max_chars=MAX_ID_CHARS)

    def kind(self) -> str | None:
        value = self.data.get("kind")
        if value is None:
            return None
        return check_string(value, f"{self.what}.kind", max_chars=MAX_KIND_CHARS)

    def importance(self) -> float | None:
        return check_importance(self.data.get("importance"), f"{self.what}.importance")

    def integer(self, name: str, *, minimum: int, maximum: int) -> int | None:
        value = self.data.get(name)
        if value is None:
            return None
        if isinstance(value, float) and value.is_integer():
            value = int(value)  # JSON has one number type: 5.0 is the integer 5
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidRequestError(f"{self.what}.{name} must be an integer")
        if not minimum <= value <= maximum:
            raise InvalidRequestError(f"{self.what}.{name} must be between {minimum} and {maximum}")
        return value

    def metadata(self, *, max_bytes: int = MAX_METADATA_BYTES) -> dict[str, Any] | None:
        value = self.data.get("metadata")
        if value is None:
            return None
        if not isinstance(value, Mapping):
            raise InvalidRequestError(f"{self.what}.metadata must be an object")
        parsed: dict[str, Any] = plain_json(value, f"{self.what}.metadata", max_bytes=max_bytes)
        return parsed

    def links(self) -> tuple[Link, ...] | None:
        value = self.data.get("links")
        if value is None:
            return None
        items = as_list(value, f"{self.what}.links", MAX_LINKS)
        links = []
        for i, item in enumerate(items):
            f = Fields(item, f"{self.what}.links[{i}]", ("relation", "id"))
            relation = f.ident("relation")
            if relation not in LINK_RELATIONS:
                raise InvalidRequestError(
                    f"{f.what}.relation must be one of {', '.join(LINK_RELATIONS)}"
                )
            links.append(Link(relation=relation, id=str(f.ident("id"))))
        return tuple(links)

    def sources(self) -> tuple[Source, ...] | None:
        value = self.data.get("sources")
        if value is None:
            return None
        items = as_list(value, f"{self.what}.sources", MAX_SOURCES)
        if not items:
            raise InvalidRequestError(f"{self.what}.sources must not be empty")
        return tuple(
            parse_source(item, f"{self.what}.sources[{i}]") for i, item in enumerate(items)
        )


def check_importance(value: object, what: str) -> float | None:
    """None, or a finite number from 0 to 1."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidRequestError(f"{what} must be a number")
    if not 0 <= value <= 1:
        raise InvalidRequestError(f"{what} must be between 0 and 1")
    return float(value)


def as_list(value: object, what: str, max_items: int) -> list[Any]:
    if not isinstance(value, list | tuple):
        raise InvalidRequestError(f"{what} must be a list")
    if len(value) > max_items:
        raise InvalidRequestError(f"{what} has more than {max_items} items")
    return list(value)


def parse_source(item: object, what: str) -> Source:
    f = Fields(item, what, Source.__slots__)
    kind = f.ident("kind")
    if kind not in SOURCE_KINDS:
        raise InvalidRequestError(f"{what}.kind must be one of {', '.join(SOURCE_KINDS)}")
    optional = {name: f.ident(name, required=False) for name in Source.__slots__ if name != "kind"}
    return Source(kind=kind, **optional)
