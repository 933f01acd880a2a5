"""Filtering records by their metadata: which current revisions a listing or a recall
keeps, as SQL on the revision's ``metadata`` (jsonb).

A filter is a conjunction of conditions, each on the value at a path of the
metadata: equal, not equal (a missing value is not equal), greater, at least,
less, at most. Comparisons are typed: a number is compared with numbers as a
number (``10 > 9``, which text comparison gets wrong), a string with strings by
code point; a value of another type never matches an ordering. ``parse`` reads
the filters of the document stores (``{"color": "red", "score": {"$gt": 3}}``,
nested objects without operators compare field by field).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ..errors import InvalidRequestError
from ..limits import MAX_JSON_DEPTH
from ..write.validation import plain_json

Comparison = Literal["eq", "ne", "gt", "gte", "lt", "lte"]
OPERATORS: dict[str, Comparison] = {
    "$eq": "eq",
    "$ne": "ne",
    "$gt": "gt",
    "$gte": "gte",
    "$lt": "lt",
    "$lte": "lte",
}
_SQL = {"gt": ">", "gte": ">=", "lt": "<", "lte": "<="}
# A filter is a query, not memory: generous, but bounded.
MAX_CONDITIONS = 64
MAX_FILTER_BYTES = 16_000


@dataclass(frozen=True, slots=True)
class Condition:
    path: tuple[str, ...]
    op: Comparison
    value: Any

    def __post_init__(self) -> None:
        if not self.path or not all(isinstance(p, str) for p in self.path):
            raise InvalidRequestError("a metadata filter's path is a non-empty list of strings")
        if len(self.path) > MAX_JSON_DEPTH:
            raise InvalidRequestError(f"a metadata filter's path is deeper than {MAX_JSON_DEPTH}")
        if self.op in _SQL and not _orderable(self.value):
            raise InvalidRequestError(
                f"${self.op} compares with a number or a string, not {type(self.value).__name__}"
            )


def _orderable(value: object) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int | float):
        return math.isfinite(value)
    return isinstance(value, str)


@dataclass(frozen=True, slots=True)
class MetadataFilter:
    """Conditions every kept revision's metadata meets (all of them)."""

    conditions: tuple[Condition, ...] = ()

    def __post_init__(self) -> None:
        if len(self.conditions) > MAX_CONDITIONS:
            raise InvalidRequestError(
                f"a metadata filter has more than {MAX_CONDITIONS} conditions"
            )

    def __and__(self, other: MetadataFilter) -> MetadataFilter:
        return MetadataFilter(self.conditions + other.conditions)

    @classmethod
    def equal(cls, path: tuple[str, ...], value: Any) -> MetadataFilter:
        return cls((Condition(path, "eq", value),))

    @classmethod
    def parse(cls, value: object, *, under: tuple[str, ...] = ()) -> MetadataFilter:
        """A document store's filter on the object at ``under``: ``{field: value}``
        (equal; an object without operators compares its fields, a list compares whole),
        ``{field: {"$gt": 3, "$lte": 9}}`` (``$eq $ne $gt $gte $lt $lte``)."""
        if value is None:
            return cls()
        if not isinstance(value, Mapping):
            raise InvalidRequestError("a filter must be an object")
        plain_json(value, "filter", max_bytes=MAX_FILTER_BYTES)
        conditions: list[Condition] = []
        _collect(value, under, conditions)
        return cls(tuple(conditions))

    def sql(self, column: str, prefix: str = "mf") -> tuple[str, dict[str, Any]]:
        """The filter as one SQL predicate on the jsonb ``column``, with its parameters
        (named ``prefix`` and a number: give each filter of a statement its own)."""
        clauses: list[str] = ["true"]
        params: dict[str, Any] = {}
        for i, c in enumerate(self.conditions):
            path, value = f"%({prefix}{i}p)s::text[]", f"%({prefix}{i}v)s::jsonb"
            params[f"{prefix}{i}p"] = list(c.path)
            params[f"{prefix}{i}v"] = json.dumps(c.value, ensure_ascii=False)
            found = f"({column} #> {path})"
            if c.op == "eq":
                clauses.append(f"{found} = {value}")
            elif c.op == "ne":
                clauses.append(f"{found} IS DISTINCT FROM {value}")
            else:
                # CASE, not AND: the comparison must never see a value of another type.
                kind = "string" if isinstance(c.value, str) else "number"
                compared = (
                    f"({found} #>> '{{}}') COLLATE \"C\" {_SQL[c.op]} ({value} #>> '{{}}')"
                    if kind == "string"
                    else f"{found} {_SQL[c.op]} {value}"  # jsonb numbers compare as numbers
                )
                clauses.append(
                    f"(CASE WHEN jsonb_typeof({found}) = '{kind}' THEN {compared} ELSE false END)"
                )
        return " AND ".join(clauses), params


def _collect(value: Mapping[str, Any], at: tuple[str, ...], out: list[Condition]) -> None:
    for key, wanted in value.items():
        path = (*at, key)
        if isinstance(wanted, Mapping) and any(str(k).startswith("$") for k in wanted):
            for name, operand in wanted.items():
                op = OPERATORS.get(name)
                if op is None:
                    raise InvalidRequestError(
                        f"unknown filter operator {name!r}: one of {', '.join(OPERATORS)}"
                    )
                out.append(Condition(path, op, operand))
        elif isinstance(wanted, Mapping) and wanted:
            _collect(wanted, path, out)
        else:
            out.append(Condition(path, "eq", wanted))
