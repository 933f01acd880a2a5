"""A dead letter's cause: a code that tells the causes apart and one content-free line,
for a database's error (its class and SQLSTATE, never its detail, which may quote a
row), an embedder's that quotes its text, and a letter written before causes."""

from __future__ import annotations

import json

import psycopg
import pytest

from engram.store.errors import EmbedderUnavailableError
from engram.worker.admin import deadletters
from engram.worker.admin.deadletter_selection import Match
from engram.worker.causes import DATABASE, UNEXPECTED, Cause, cause_of, strings_in

SECRET = "Ada's PIN is 4417, keep it safe"


def test_a_database_error_keeps_its_class_and_sqlstate_never_its_message(dsn: str) -> None:
    with psycopg.connect(dsn) as conn, pytest.raises(psycopg.Error) as raised:
        conn.execute("SELECT %s::int", (SECRET,))
    assert SECRET in str(raised.value)  # the database quoted the value
    cause = cause_of(raised.value, [SECRET])
    assert cause == Cause(DATABASE, "InvalidTextRepresentation (SQLSTATE 22P02)")


def test_an_engram_error_keeps_its_code_and_message() -> None:
    error = EmbedderUnavailableError(
        "the all-MiniLM-L6-v2 embedder needs `pip install 'engram[minilm]'` "
        "(onnxruntime is missing)"
    )
    cause = cause_of(error, [SECRET])
    assert cause.code == "embedder_unavailable"
    assert cause.detail.startswith("EmbedderUnavailableError: the all-MiniLM-L6-v2")
    assert cause.detail.endswith("(onnxruntime is missing)")


def test_another_error_keeps_its_message_unless_it_quotes_the_operation() -> None:
    texts = strings_in({"request": {"text": SECRET, "metadata": {"k": ["v"]}}})
    assert SECRET in texts
    quoting = cause_of(ValueError(f"cannot embed {SECRET!r}"), texts)
    assert quoting.code == UNEXPECTED and SECRET[:12] not in quoting.detail
    assert quoting.detail == "ValueError (its message quoted a record's text and is not kept)"
    plain = cause_of(RuntimeError("the model server went away (HTTP 503)"), texts)
    assert plain == Cause(UNEXPECTED, "RuntimeError: the model server went away (HTTP 503)")
    long = cause_of(RuntimeError("x " * 500), texts)
    assert len(long.detail) <= 200


def _old(reason: str, error: dict[str, str]) -> deadletters.DeadLetter:
    return deadletters.DeadLetter("1-0", 0, "1-0", "op:1", reason, error, 3, 1, None)


@pytest.mark.parametrize(
    ("reason", "error", "code"),
    [
        (
            "failed",
            {"code": "dead_lettered", "message": "operation op:1 could not be applied "
             "(EmbedderUnavailableError)"},
            "embedder_unavailable",
        ),
        ("failed", {"code": "dead_lettered", "message": "could not be applied (DataError)"},
         "dead_lettered"),
        ("deliveries", {"code": "dead_lettered", "message": "delivered 4 times"},
         "too_many_deliveries"),
        ("malformed", {"code": "invalid_request", "message": "not valid JSON"}, "invalid_request"),
        ("failed", {"code": "dead_lettered", "message": "m", "cause": "database_error",
                    "detail": "UniqueViolation (SQLSTATE 23505)"}, "database_error"),
    ],
)  # fmt: skip
def test_a_letter_written_before_causes_reads_as_well_as_it_can(
    reason: str, error: dict[str, str], code: str
) -> None:
    letter = _old(reason, error)
    assert letter.code == code
    assert letter.as_dict()["code"] == code
    assert letter.detail == error.get("detail")
    assert Match(code=code).admits(letter)
    # A code filter takes the letter's code exactly (issue 42): the error's class code
    # (dead_lettered) is not the letter's, and does not match it.
    assert Match(code=error["code"]).admits(letter) == (error["code"] == code)
    assert deadletters.attempt(letter)["error_code"] == code
    json.dumps(letter.as_dict())
