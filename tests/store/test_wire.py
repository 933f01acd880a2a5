"""The write path's binary array parameters, read back by PostgreSQL itself."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import numpy as np
import pytest

from engram.store import Store
from engram.store.write import wire


def _round_trip(store: Store, sql_type: str, kind: str, values: list[object]) -> list[object]:
    with store.pool.connection() as conn:
        row = conn.execute(
            f"SELECT array(SELECT x FROM unnest(%s::{sql_type}[]) AS x)",
            (wire.column(kind, values),),
        ).fetchone()
    assert row is not None
    return list(row[0])


@pytest.mark.parametrize(
    ("sql_type", "kind", "values"),
    [
        ("text", "text", ["plain", "", "naïve café ☕", None, "line\nbreak 'quote' \"double\""]),
        ("int4", "int4", [0, -1, 2**31 - 1, None, -(2**31)]),
        ("int8", "int8", [0, 2**62, None, -(2**40)]),
        ("bool", "bool", [True, False, None]),
        ("float4", "float4", [0.5, -2.25, None, 0.125]),  # exact in 32 bits
    ],
)
def test_values_arrive_as_sent(
    store: Store, sql_type: str, kind: str, values: list[object]
) -> None:
    assert _round_trip(store, sql_type, kind, values) == values


def test_timestamps_keep_their_instant_whatever_the_offset(store: Store) -> None:
    values = [
        datetime(2026, 12, 2, 21, 31, 48, 123456, tzinfo=UTC),
        datetime(1999, 12, 31, 23, 59, 59, 999999, tzinfo=timezone(timedelta(hours=-5))),
        None,
        datetime(2000, 1, 1, tzinfo=UTC),
    ]
    assert _round_trip(store, "timestamptz", "timestamptz", values) == values


def test_a_naive_timestamp_is_refused_not_guessed(store: Store) -> None:
    with pytest.raises(TypeError):
        _round_trip(store, "timestamptz", "timestamptz", [datetime(2026, 1, 1)])


def test_vectors_arrive_as_sent(store: Store) -> None:
    vectors = [np.array([0.25, -1.5, 3.0], dtype=np.float32), None, np.zeros(3, np.float32)]
    got = _round_trip(store, "vector", "vector", vectors)
    assert got[1] is None
    for sent, back in zip(vectors[::2], got[::2], strict=True):
        assert np.array_equal(np.asarray(back.to_list(), np.float32), sent)


def test_an_empty_column_is_an_empty_array(store: Store) -> None:
    for sql_type, kind in (("text", "text"), ("int8", "int8"), ("vector", "vector")):
        assert _round_trip(store, sql_type, kind, []) == []
