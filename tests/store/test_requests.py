"""The verbs' fields, written once in ``store.write.requests``: every field a verb takes
reaches its request, a field left out is absent as before, and one it does not have is
a ``TypeError`` (pure: no server)."""

from __future__ import annotations

from typing import Any

import pytest

from engram.store import Link, Source
from engram.store.write.requests import (
    ExtractFields,
    RememberFields,
    RetractFields,
    ReviseFields,
    extract_request,
    remember_request,
    retract_request,
    revise_request,
)

BUILDERS: list[tuple[Any, Any, Any]] = [
    (remember_request, RememberFields, "Ada likes tea."),
    (extract_request, ExtractFields, [{"id": "m1", "message": {"role": "user"}}]),
    (revise_request, ReviseFields, "mem_1"),
    (retract_request, RetractFields, "mem_1"),
]


@pytest.mark.parametrize(("build", "fields", "subject"), BUILDERS)
def test_every_field_a_verb_takes_reaches_its_request(
    build: Any, fields: Any, subject: Any
) -> None:
    for name in fields.__annotations__:
        assert name in build(subject), f"{build.__name__} drops {name}"


@pytest.mark.parametrize(("build", "fields", "subject"), BUILDERS)
def test_a_field_the_verb_does_not_have_is_a_type_error(
    build: Any, fields: Any, subject: Any
) -> None:
    verb = build.__name__.removesuffix("_request")
    with pytest.raises(TypeError, match=f"{verb}\\(\\) got an unexpected keyword argument 'knd'"):
        build(subject, knd="fact")


def test_fields_left_out_are_absent_as_the_old_defaults_were() -> None:
    assert remember_request("t") == {
        "text": "t",
        **dict.fromkeys(
            ("kind", "importance", "metadata", "origin", "sources", "links", "ttl_ms"), None
        ),
        **dict.fromkeys(("id", "supersede", "top_k"), None),
    }
    # No links and no trusted tools are none, whether left out or given empty.
    assert extract_request([], links=(), trusted_tools=()) == extract_request([])
    assert extract_request([])["links"] is None and extract_request([])["trusted_tools"] is None
    # A revise with no links keeps the record's; an empty list clears them.
    assert revise_request("r")["links"] is None and revise_request("r", links=[])["links"] == []
    assert revise_request("r")["only_inferred"] is None
    assert retract_request("r", only_inferred=False) == {
        "id": "r",
        "expected_revision": None,
        "only_inferred": None,
    }


def test_sources_and_links_may_be_values_or_mappings() -> None:
    link = Link(relation="about", id="mem_2")
    request = remember_request(
        "t", links=[link, {"relation": "about", "id": "mem_3"}], sources=[Source(kind="user")]
    )
    assert request["links"] == [link.as_dict(), {"relation": "about", "id": "mem_3"}]
    assert request["sources"] == [Source(kind="user").as_dict()]
