"""Reading the command line's values: JSON from an argument, a file or stdin; counts and
durations that must be positive, refused before anything is sent or started."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from engram.store.errors import InvalidRequestError


def json_value(value: str, what: str) -> Any:
    """``value`` as JSON; ``@path`` reads the file, ``-`` reads stdin (a request too large
    for the argument list comes this way)."""
    if value == "-":
        text = sys.stdin.read()
    elif value.startswith("@"):
        try:
            text = Path(value[1:]).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise InvalidRequestError(f"{what}: cannot read {value[1:]} ({exc})") from None
    else:
        text = value
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidRequestError(f"{what} must be JSON ({exc.msg})") from None


def one_stdin(*values: str | None) -> None:
    if sum(v == "-" for v in values) > 1:
        raise InvalidRequestError("only one of the values can come from stdin (-)")


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds, not {text}")
    return value


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {text}")
    return value


def scope_arg(parser: argparse.ArgumentParser, *, required: bool = True) -> None:
    parser.add_argument(
        "--scope",
        required=required,
        help='JSON, e.g. \'{"user_id": "ada"}\'; @file.json reads a file, - reads stdin',
    )


def json_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
