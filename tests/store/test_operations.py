"""Operations as values: validation, canonical scope keys, digests. No server."""

from __future__ import annotations

import pytest

from engram.store import InvalidRequestError, Operation, Scope
from engram.store.limits import MAX_TEXT_CHARS
from engram.store.write.operations import derived_record_id


def _nested(depth: int) -> dict:
    value: dict = {}
    for _ in range(depth):
        value = {"k": [value]}
    return value


def build(kind: str, request: dict, scope: object = None, op_id: str | None = "op-1") -> Operation:
    return Operation.build(kind, scope if scope is not None else {"user_id": "ada"}, request, op_id)


def test_scope_key_is_canonical_whatever_the_field_order() -> None:
    a = Scope.of({"user_id": "ada", "chat_id": "c1"})
    b = Scope.of({"chat_id": "c1", "user_id": "ada"})
    assert a == b
    assert a.key == '{"chat_id":"c1","user_id":"ada"}'
    assert Scope.of({"user_id": "ada"}).key != a.key


@pytest.mark.parametrize(
    "scope, message",
    [
        ({}, "at least one"),
        ({"user_id": None}, "at least one"),
        ({"team_id": "x"}, "unknown scope field"),
        ({"user_id": ""}, "must not be empty"),
        ({"user_id": 7}, "must be a string"),
        ({"user_id": "a\x00b"}, "NUL"),
        ({"user_id": "ada\ud800"}, "not valid Unicode"),
        ("ada", "must be an object"),
    ],
)
def test_bad_scopes_are_refused(scope: object, message: str) -> None:
    with pytest.raises(InvalidRequestError, match=message):
        build("remember", {"text": "x"}, scope=scope)


@pytest.mark.parametrize(
    "request_, message",
    [
        ({}, "must be a string"),
        ({"text": 42}, "must be a string"),
        ({"text": ""}, "must not be empty"),
        ({"text": "   "}, "must not be empty"),
        ({"text": "x" * (MAX_TEXT_CHARS + 1)}, "longer than"),
        ({"text": "nul\x00byte"}, "NUL"),
        ({"text": "x", "colour": "red"}, "unknown field"),
        ({"text": "x", "origin": "guessed"}, "origin"),
        ({"text": "x", "origin": []}, "origin"),
        ({"text": "x", "origin": ""}, "origin"),
        ({"text": "x", "importance": 2}, "between 0 and 1"),
        ({"text": "x", "importance": float("nan")}, "must be a number"),
        ({"text": "x", "metadata": []}, "must be an object"),
        ({"text": "x", "metadata": {"k": "a\x00"}}, "NUL"),
        ({"text": "lone \ud800 surrogate"}, "remember.text is not valid Unicode"),
        ({"text": "x", "metadata": {"k": "\udfff"}}, "metadata is not valid Unicode"),
        ({"text": "x", "metadata": {"\ud800": 1}}, "metadata is not valid Unicode"),
        ({"text": "x", "metadata": {"k": float("inf")}}, "finite numbers"),
        ({"text": "x", "metadata": {"k": {1, 2}}}, "plain JSON"),
        ({"text": "x", "metadata": _nested(40)}, "nests deeper than 32"),
        ({"text": "x", "id": "mem_\ud800"}, "remember.id is not valid Unicode"),
        ({"text": "x", "sources": [{"kind": "oracle"}]}, "kind must be one of"),
        ({"text": "x", "sources": []}, "must not be empty"),
        ({"text": "x", "links": [{"relation": "likes", "id": "m"}]}, "relation"),
        ({"text": "x", "ttl_ms": 0}, "between"),
        ({"text": "x", "ttl_ms": True}, "integer"),
    ],
)
def test_bad_remember_requests_are_refused(request_: dict, message: str) -> None:
    with pytest.raises(InvalidRequestError, match=message):
        build("remember", request_)


def test_error_messages_never_echo_memory_text() -> None:
    secret = "my-secret-diagnosis " * 2000
    with pytest.raises(InvalidRequestError) as info:
        build("remember", {"text": secret})
    assert "secret" not in str(info.value)


@pytest.mark.parametrize(
    "kind, request_, message",
    [
        ("revise", {"text": "x"}, "must be a string"),
        ("revise", {"id": "m", "expected_revision": -1}, "between"),
        ("retract", {"id": "m", "expected_revision": 0}, "between"),
        ("forget", {}, "must be a string"),
        ("extract", {"messages": "hi"}, "must be a list"),
        (
            "extract",
            {"messages": [{"id": "m1", "message": {"role": "bot", "content": "x"}}]},
            "role",
        ),
        (
            "extract",
            {
                "messages": [
                    {"id": "m", "message": {"role": "user", "content": "a"}},
                    {"id": "m", "message": {"role": "user", "content": "b"}},
                ]
            },
            "unique",
        ),
        ("dance", {}, "operation.kind"),
        ({}, {}, "operation.kind"),  # not a name at all: refused, not a TypeError
        (["remember"], {}, "operation.kind"),
    ],
)
def test_bad_requests_of_other_kinds_are_refused(kind: str, request_: dict, message: str) -> None:
    with pytest.raises(InvalidRequestError, match=message):
        build(kind, request_)


def test_an_operation_round_trips_through_its_json_form() -> None:
    op = build(
        "remember",
        {
            "text": "Ada prefers tea.",
            "kind": "preference",
            "metadata": {"b": 1, "a": [1, 2]},
            "ttl_ms": 1000,
            "links": [{"relation": "about", "id": "m-1"}],
        },
    )
    again = Operation.from_dict(op.to_dict())
    assert again == op
    assert again.digest == op.digest


def test_the_digest_names_the_request_not_the_id() -> None:
    a = build("remember", {"text": "Ada prefers tea."}, op_id="a")
    b = build("remember", {"text": "Ada prefers tea."}, op_id="b")
    c = build("remember", {"text": "Ada prefers coffee."}, op_id="a")
    d = build("remember", {"text": "Ada prefers tea."}, scope={"user_id": "bob"}, op_id="a")
    assert a.digest == b.digest
    assert len({a.digest, c.digest, d.digest}) == 3


def test_an_operation_without_id_gets_a_fresh_one() -> None:
    a = Operation.build("forget", {"user_id": "ada"}, {"id": "m"})
    b = Operation.build("forget", {"user_id": "ada"}, {"id": "m"})
    assert a.operation_id != b.operation_id


def test_created_record_ids_derive_from_the_operation_and_its_scope() -> None:
    ada, bob = '{"user_id":"ada"}', '{"user_id":"bob"}'
    assert derived_record_id(ada, "op-1", 0) == derived_record_id(ada, "op-1", 0)
    assert derived_record_id(ada, "op-1", 0) != derived_record_id(ada, "op-1", 1)
    assert derived_record_id(ada, "op-1", 0) != derived_record_id(ada, "op-2", 0)
    # An operation id is its scope's: the same id elsewhere creates other ids.
    assert derived_record_id(ada, "op-1", 0) != derived_record_id(bob, "op-1", 0)


def test_text_without_a_utf8_form_is_refused_in_every_field() -> None:
    with pytest.raises(InvalidRequestError, match=r"operation\.operation_id is not valid Unicode"):
        build("remember", {"text": "x"}, op_id="op-\ud800")
    message = {"id": "m1", "message": {"role": "user", "content": "tea \ud83d"}}
    with pytest.raises(InvalidRequestError, match="content is not valid Unicode"):
        build("extract", {"messages": [message]})
    with pytest.raises(InvalidRequestError, match="nests deeper"):
        build(
            "extract",
            {"messages": [{"id": "m1", "message": {"role": "user", "content": [_nested(33)]}}]},
        )
    # A valid pair of surrogates is one character, with a UTF-8 form.
    assert build("remember", {"text": "tea \U0001f375"}).request.text == "tea \U0001f375"


@pytest.mark.parametrize(
    "kind, request_, message",
    [
        ("remember", {"text": "x", "supersede": "merge"}, "supersede must be one of add"),
        ("remember", {"text": "x", "supersede": "reconcile", "id": "m1"}, "cannot be combined"),
        ("remember", {"text": "x", "top_k": 0}, "between 1 and 100"),
        ("remember", {"text": "x", "top_k": "5"}, "must be an integer"),
        ("extract", {"messages": [], "supersede": True}, "supersede must be one of"),
        ("extract", {"messages": [], "instructions": ""}, "must not be empty"),
        ("extract", {"messages": [], "instructions": "x" * 4001}, "longer than 4000"),
        ("extract", {"messages": [], "instructions": ["be brief"]}, "must be a string"),
        ("revise", {"id": "m1", "only_inferred": "yes"}, "must be true or false"),
        ("revise", {"id": "m1", "only_inferred": True, "expected_revision": 0}, "existing"),
        ("revise", {"id": "m1", "sources": [{"kind": "robot"}]}, "kind must be one of"),
        ("retract", {"id": "m1", "only_inferred": 1}, "must be true or false"),
    ],
)
def test_bad_model_fields_are_refused(kind: str, request_: dict, message: str) -> None:
    with pytest.raises(InvalidRequestError, match=message):
        build(kind, request_)


def test_model_fields_round_trip_and_false_is_the_default() -> None:
    remember = build("remember", {"text": "x", "supersede": "reconcile", "top_k": 3})
    assert Operation.from_dict(remember.to_dict()) == remember
    assert remember.request.to_dict() == {  # type: ignore[union-attr]
        "text": "x",
        "kind": "semantic",
        "origin": "asserted",
        "supersede": "reconcile",
        "top_k": 3,
    }
    extract = build(
        "extract", {"messages": [], "infer": True, "supersede": "add", "instructions": "brief"}
    )
    assert Operation.from_dict(extract.to_dict()).digest == extract.digest
    # only_inferred: false is the same request as none at all (the same digest).
    assert (
        build("retract", {"id": "m1", "only_inferred": False}).digest
        == build("retract", {"id": "m1"}).digest
        != build("retract", {"id": "m1", "only_inferred": True}).digest
    )
    revise = build("revise", {"id": "m1", "sources": [{"kind": "assistant", "tool_call_id": "c"}]})
    assert revise.request.to_dict()["sources"] == [{"kind": "assistant", "tool_call_id": "c"}]  # type: ignore[union-attr]


def test_a_whole_number_sent_as_a_float_is_that_integer() -> None:
    """JSON has one number type: 5.0 from a producer in another language is 5."""
    as_float = build("revise", {"id": "r", "text": "x", "expected_revision": 3.0, "ttl_ms": 5.0})
    as_int = build("revise", {"id": "r", "text": "x", "expected_revision": 3, "ttl_ms": 5})
    assert as_float == as_int and as_float.digest == as_int.digest
    with pytest.raises(InvalidRequestError, match="integer"):
        build("revise", {"id": "r", "text": "x", "expected_revision": 3.5})
