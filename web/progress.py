"""A reembed's progress, read from its generation's ``progress`` (jsonb).

The agreed shape (the jobs write it, ``jobs.progress``): ``{"state": "running" |
"waiting" | "activated" | "failed" | "cancelled" | "superseded", "pass", "done",
"total", "skipped", "errors", "rate_per_s", "eta_s", "started_at",
"updated_at", "requested_by", "job_id", "message", "superseded_by"}``;
``message`` says why it failed (its root cause, content-free) or who cancelled
it and why. A generation retired for another model's is superseded (its
``superseded_by``, or ``retired``, as earlier versions wrote), whatever its
state said. Read leniently: a field missing or of the wrong type is shown as
unknown rather than breaking the page. Pure.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

STATES = ("running", "waiting", "activated", "failed", "cancelled", "superseded")
LIVE_STATES = ("running", "waiting")
MAX_MESSAGE_CHARS = 300


@dataclass(frozen=True, slots=True)
class Progress:
    state: str
    pass_number: int | None
    done: int | None
    total: int | None
    skipped: int | None
    errors: int | None
    rate_per_s: float | None
    eta_s: float | None
    started_at: datetime | None
    updated_at: datetime | None
    requested_by: str | None
    job_id: str | None
    message: str | None = None
    superseded_by: int | None = None

    @property
    def live(self) -> bool:
        return self.state in LIVE_STATES

    @property
    def percent(self) -> float | None:
        if self.done is None or not self.total:
            return None
        return min(100.0, 100.0 * self.done / self.total)

    @property
    def eta(self) -> str:
        return duration(self.eta_s) if self.eta_s is not None else "unknown"

    def as_dict(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "pass": self.pass_number,
            "done": self.done,
            "total": self.total,
            "skipped": self.skipped,
            "errors": self.errors,
            "rate_per_s": self.rate_per_s,
            "eta_s": self.eta_s,
            "started_at": self.started_at.isoformat() if self.started_at else None,
            "updated_at": self.updated_at.isoformat() if self.updated_at else None,
            "requested_by": self.requested_by,
            "job_id": self.job_id,
            "message": self.message,
            "superseded_by": self.superseded_by,
        }


def progress_of(raw: Mapping[str, Any] | None) -> Progress | None:
    """The progress a generation holds, or None when it holds none."""
    if not raw or not isinstance(raw, Mapping):
        return None
    state = raw.get("state")
    superseded_by = _count(raw.get("superseded_by"))
    if state == "retired" or (superseded_by is not None and state in (*LIVE_STATES, None)):
        state = "superseded"
    return Progress(
        state=state if state in STATES else "unknown",
        pass_number=_count(raw.get("pass")),
        # ``embedded``: what store.embeddings.reembed writes when run without the jobs.
        done=_count(raw.get("done", raw.get("embedded"))),
        total=_count(raw.get("total")),
        skipped=_count(raw.get("skipped")),
        errors=_count(raw.get("errors")),
        rate_per_s=_number(raw.get("rate_per_s")),
        eta_s=_number(raw.get("eta_s")),
        started_at=_time(raw.get("started_at")),
        updated_at=_time(raw.get("updated_at")),
        requested_by=_text(raw.get("requested_by")),
        job_id=_text(raw.get("job_id")),
        message=_text(raw.get("message"), MAX_MESSAGE_CHARS),
        superseded_by=superseded_by,
    )


def duration(seconds: float) -> str:
    whole = max(0, round(seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours} h {minutes:02d} min"
    if minutes:
        return f"{minutes} min {secs:02d} s"
    return f"{secs} s"


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) and value >= 0 else None


def _time(value: object) -> datetime | None:
    if not isinstance(value, str) or len(value) > 64:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def _text(value: object, max_chars: int = 200) -> str | None:
    return value[:max_chars] if isinstance(value, str) and value else None
