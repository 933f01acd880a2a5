"""The 32,000-character limit on a memory's text (``store.limits.MAX_TEXT_CHARS``) is
said where a user meets it: the README, the OpenAPI document (``maxLength`` on every
text a request carries) and the MCP tools' input schemas, all from the one constant."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from engram.mcp.contract import BY_NAME, input_schema
from engram.store.limits import MAX_TEXT_CHARS
from engram.web.api.openapi import DOCUMENT
from tests.redis_fixtures import REPO


def test_the_readme_says_the_limit() -> None:
    readme = (REPO / "README.md").read_text()
    assert f"{MAX_TEXT_CHARS:,} characters" in readme


def _texts(node: Any) -> Iterator[Any]:
    """Every schema of a property named ``text``, anywhere in ``node``."""
    if isinstance(node, dict):
        properties = node.get("properties")
        if isinstance(properties, dict) and "text" in properties:
            yield properties["text"]
        for value in node.values():
            yield from _texts(value)
    elif isinstance(node, list):
        for value in node:
            yield from _texts(value)


def _max_lengths(schema: Any) -> set[int]:
    if not isinstance(schema, dict):
        return set()
    found = {schema["maxLength"]} if "maxLength" in schema else set()
    for option in schema.get("anyOf", []):
        found |= _max_lengths(option)
    return found


def test_every_text_a_request_carries_has_the_limit_in_the_openapi_document() -> None:
    # A request's text is a bounded string (``string()``: minLength 1); an answer's is not.
    requested = [s for s in _texts(DOCUMENT) if "minLength" in str(s)]
    assert len(requested) >= 3  # remember, revise, recall
    for schema in requested:
        assert _max_lengths(schema) == {MAX_TEXT_CHARS}, schema
        assert f"{MAX_TEXT_CHARS:,} characters" in str(schema)


def test_the_mcp_tools_take_text_up_to_the_limit() -> None:
    for tool, field in (("remember", "text"), ("revise", "text"), ("recall", "query")):
        schema = input_schema(BY_NAME[tool])["properties"][field]
        assert _max_lengths(schema) == {MAX_TEXT_CHARS}, (tool, schema)
