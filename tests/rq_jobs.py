"""Functions the jobs tests run on a real RQ worker (it imports them by name)."""

from __future__ import annotations


def fails(record_id: str) -> None:
    raise RuntimeError(f"the listener could not reach its webhook for {record_id}")


def succeeds(record_id: str) -> str:
    return record_id
