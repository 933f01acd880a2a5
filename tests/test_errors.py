"""The one registry of error codes (``engram.store.errors.ERRORS_BY_CODE``): every
class with a code of its own is in it, no two claim one code, and each code comes
back from a reply as its own class, in the process that decodes it."""

from __future__ import annotations

import importlib
import json
import pkgutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import engram
from engram.store.errors import (
    ERRORS_BY_CODE,
    MAX_HOLDERS_READ,
    ConfigError,
    EngramError,
    GenerationNotPendingError,
    InvalidRequestError,
    NotFoundError,
    RedactionHeldError,
    error_from_dict,
)
from engram.worker import errors as worker_errors
from engram.worker.errors import SelectionChangedError
from engram.worker.protocol import decode_reply, encode_reply

REPO = Path(__file__).resolve().parent.parent
# What a decoded error may carry besides its code and message (every class's details).
DETAILS: dict[str, Any] = {
    "expected": 3,
    "actual": 4,
    "attempts": 2,
    "reason": "timeout",
    "cause": "too_many_deliveries",
    "detail": "OperationalError: gone",
    "retry_after_s": 7,
    "holders": ["the standby replica_1's snapshot", "the replication slot s1"],
}


def every_error_class() -> list[type[EngramError]]:
    """Every class rooted in ``EngramError`` that engram defines, its modules imported."""
    for info in pkgutil.walk_packages(engram.__path__, "engram."):
        if not info.name.endswith("__main__"):
            importlib.import_module(info.name)

    def below(cls: type[EngramError]) -> Iterator[type[EngramError]]:
        for sub in cls.__subclasses__():
            yield sub
            yield from below(sub)

    return sorted(
        {c for c in below(EngramError) if c.__module__.startswith("engram.")},
        key=lambda c: (c.__module__, c.__qualname__),
    )


def owner_of_code(cls: type[EngramError]) -> type[EngramError]:
    """The nearest class, ``cls`` or an ancestor, that says the code ``cls`` has."""
    return next(c for c in cls.__mro__ if "code" in c.__dict__)


def sample(cls: type[EngramError]) -> EngramError:
    return cls.from_dict("a message", {"code": cls.code, "message": "a message", **DETAILS})


def test_every_class_with_a_code_of_its_own_is_the_registrys_class_for_it() -> None:
    classes = every_error_class()
    assert len(classes) > 40
    for cls in classes:
        assert ERRORS_BY_CODE[cls.code] is owner_of_code(cls), cls
    owners = [c for c in classes if "code" in c.__dict__]
    assert len({c.code for c in owners}) == len(owners)  # no two claim one code


def test_a_class_without_a_code_of_its_own_is_an_alias_of_its_codes_class() -> None:
    from engram.web.errors import BadRequestError
    from engram.worker.errors import MalformedEntryError
    from engram.worker.producer import NotReplicatedError

    aliases = [c for c in every_error_class() if "code" not in c.__dict__]
    assert {BadRequestError, MalformedEntryError, NotReplicatedError} <= set(aliases)
    for alias in aliases:
        assert issubclass(alias, ERRORS_BY_CODE[alias.code])
    assert issubclass(BadRequestError, InvalidRequestError)
    assert (BadRequestError.code, BadRequestError.status) == ("invalid_request", 400)


def test_a_second_class_claiming_a_code_is_refused_as_it_is_defined() -> None:
    with pytest.raises(TypeError, match="the code 'not_found' is NotFoundError's"):

        class Lost(EngramError):
            code = "not_found"

    assert ERRORS_BY_CODE["not_found"] is NotFoundError


@pytest.mark.parametrize(
    "cls",
    [c for c in every_error_class() if "code" in c.__dict__] + [EngramError],
    ids=lambda c: c.code,
)
def test_every_code_comes_back_from_a_reply_as_its_own_class(cls: type[EngramError]) -> None:
    sent = sample(cls)
    for back in (
        error_from_dict(sent.to_dict()),
        worker_errors.error_from_dict(sent.to_dict()),
        decode_reply(encode_reply(sent, "1-0")).outcome,
    ):
        assert type(back) is cls
        assert isinstance(back, EngramError) and back.to_dict() == sent.to_dict()


@pytest.mark.parametrize(
    "cls", [GenerationNotPendingError, SelectionChangedError, ConfigError], ids=lambda c: c.code
)
def test_the_codes_that_came_back_as_plain_errors_come_back_as_their_class(
    cls: type[EngramError],
) -> None:
    back = decode_reply(encode_reply(cls("m"), "1-0")).outcome
    assert type(back) is cls and back.to_dict() == {"code": cls.code, "message": "m"}


def test_a_producer_process_knows_every_code_of_the_store_and_the_queue() -> None:
    """A process that imports only the wire (a producer) decodes every code a worker
    can reply with or a receipt keeps: the store's and the queue's."""
    layers = ("engram.store.", "engram.worker.")
    expected = {
        cls.code: f"{cls.__module__}.{cls.__qualname__}"
        for cls in every_error_class()
        if "code" in cls.__dict__ and cls.__module__.startswith(layers)
    }
    script = (
        "import json, sys\n"
        "from engram.worker.protocol import decode_reply, encode_reply\n"
        "from engram.store.errors import EngramError\n"
        "out = {}\n"
        "for code in json.load(sys.stdin):\n"
        "    reply = json.dumps({'entry': None, 'error': {'code': code, 'message': 'm'}})\n"
        "    cls = type(decode_reply(reply).outcome)\n"
        "    out[code] = f'{cls.__module__}.{cls.__qualname__}'\n"
        "print(json.dumps(out))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        input=json.dumps(sorted(expected)),
        capture_output=True,
        text=True,
        cwd=REPO,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        timeout=60,
        check=True,
    )
    assert json.loads(done.stdout) == expected


@pytest.mark.parametrize(
    ("sent", "kept"),
    [
        (["a prepared transaction", 7, None, "an open transaction"], 2),
        ("a prepared transaction", 0),
        (["slot"] * 1_000, MAX_HOLDERS_READ),
    ],
    ids=["not-strings", "not-a-list", "too-many"],
)
def test_a_held_redactions_holders_read_back_are_strings_and_bounded(sent: Any, kept: int) -> None:
    back = error_from_dict({"code": "redaction_held", "message": "held by …", "holders": sent})
    assert isinstance(back, RedactionHeldError) and back.message == "held by …"
    assert len(back.holders) == kept and all(isinstance(h, str) for h in back.holders)
