"""Array parameters in PostgreSQL's binary format, each encoded in one call.

The write path sends its rows as one array per column, unnested in SQL. Given a
plain list, psycopg inspects its elements to choose their dumper: about 25 µs
per list before the first element is written, and a batch's write statement
sends some 70 lists. A ``Column`` says what its elements are, so its dumper
writes the array at once.

``column(kind, values)`` wraps values of one PostgreSQL type (``None`` is NULL);
``register(conn)`` teaches a connection to send columns, and is called for every
connection of the store's pool. The parameters are sent without a type of their
own: the statement's cast (``$1::text[]``) gives them theirs."""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import psycopg
from psycopg.adapt import Dumper
from psycopg.pq import Format
from psycopg.types import TypeInfo

_LENGTH = struct.Struct("!i")
_HEADER = struct.Struct("!iiiii")  # dimensions, has nulls, element type, length, lower bound
_EMPTY = struct.Struct("!iii")  # no dimensions, no nulls, element type
_NULL = _LENGTH.pack(-1)
_INT4 = struct.Struct("!ii")
_INT8 = struct.Struct("!iq")
_FLOAT4 = struct.Struct("!if")
_VECTOR = struct.Struct("!iHH")  # length, dimensions, unused
_TRUE, _FALSE = b"\x00\x00\x00\x01\x01", b"\x00\x00\x00\x01\x00"
_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)  # PostgreSQL's, in microseconds
_MICROSECOND = timedelta(microseconds=1)


def _text(value: str) -> bytes:
    data = value.encode()
    return _LENGTH.pack(len(data)) + data


def _timestamptz(value: datetime) -> bytes:
    # An aware datetime only: a naive one raises TypeError here.
    return _INT8.pack(8, (value - _EPOCH) // _MICROSECOND)


def _vector(value: Any) -> bytes:
    floats = np.asarray(value, dtype=">f4")
    return _VECTOR.pack(4 + 4 * len(floats), len(floats), 0) + floats.tobytes()


# kind -> (element type oid, element encoder: value -> length-prefixed bytes)
_ENCODERS: dict[str, tuple[int, Callable[[Any], bytes]]] = {
    "text": (25, _text),
    "int4": (23, lambda v: _INT4.pack(4, v)),
    "int8": (20, lambda v: _INT8.pack(8, v)),
    "float4": (700, lambda v: _FLOAT4.pack(4, v)),
    "bool": (16, lambda v: _TRUE if v else _FALSE),
    "timestamptz": (1184, _timestamptz),
    "vector": (0, _vector),  # the extension's type: its oid is read per connection
}


class Column:
    """Values of one PostgreSQL type, sent as a one-dimensional binary array."""

    __slots__ = ("values",)
    kind = ""

    def __init__(self, values: Sequence[Any]) -> None:
        self.values = values

    def __repr__(self) -> str:
        return f"Column({self.kind}, {len(self.values)} values)"


_COLUMNS: dict[str, type[Column]] = {
    kind: type(f"{kind.capitalize()}Column", (Column,), {"__slots__": (), "kind": kind})
    for kind in _ENCODERS
}


def column(kind: str, values: Sequence[Any]) -> Column:
    return _COLUMNS[kind](values)


def encode(values: Sequence[Any], element_oid: int, element: Callable[[Any], bytes]) -> bytes:
    """PostgreSQL's binary array format (what ``array_recv`` reads)."""
    if not values:
        return _EMPTY.pack(0, 0, element_oid)
    parts = [_NULL if v is None else element(v) for v in values]
    nulls = int(any(v is None for v in values))
    return _HEADER.pack(1, nulls, element_oid, len(values), 1) + b"".join(parts)


def _dumper(kind: str, element_oid: int) -> type[Dumper]:
    element = _ENCODERS[kind][1]

    class ColumnDumper(Dumper):
        format = Format.BINARY

        def dump(self, obj: Column) -> bytes:
            return encode(obj.values, element_oid, element)

    ColumnDumper.__name__ = f"{kind.capitalize()}ColumnDumper"
    return ColumnDumper


_FIXED = {kind: _dumper(kind, oid) for kind, (oid, _) in _ENCODERS.items() if oid}


def register(conn: psycopg.Connection[Any]) -> None:
    """Let ``conn`` send every kind of ``Column`` (pgvector's must be installed)."""
    for kind, dumper in _FIXED.items():
        conn.adapters.register_dumper(_COLUMNS[kind], dumper)
    info = conn.adapters.types.get("vector") or TypeInfo.fetch(conn, "vector")
    if info is not None:
        conn.adapters.register_dumper(_COLUMNS["vector"], _dumper("vector", info.oid))
