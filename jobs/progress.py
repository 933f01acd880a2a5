"""A re-embedding's progress, as kept in its generation's ``progress`` (jsonb).

The job writes it (``Progress``); the dashboard, the HTTP API and ``engram
reembed`` read it. These keys are a contract with them (more may be added, none
renamed):

``state``         running | waiting | activated | failed | cancelled | superseded
                  (``retired``, written by earlier versions, is read as superseded)
``pass``          the pass over the store under way (1 to 3, then it waits and resumes)
``done``          current revisions with a vector in the new generation
``total``         current revisions in the store
``skipped``       vectors not stored because their record moved on meanwhile
``errors``        batches or slices that failed (and were tried again)
``retrying``      a slice failed and is tried again later (``message`` says why, and
                  when): the re-embedding is not stalled, it is failing
``rate_per_s``    records handled per second in the last slice
``eta_s``         seconds left at that rate (null when unknown)
``started_at``, ``updated_at``   ISO 8601, UTC
``requested_by``  who started it (an operator name, ``cli``, ...)
``job_id``        the RQ job carrying it now (a re-embedding is a chain of slices)

and engram's own: ``cursor`` (the last record done in this pass, ``SCOPE_ID:RECORD_ID``),
``message`` (why it waits, failed or was cancelled, or how long the switch held
writes off: ids, counts, times, an error's type and content-free message
(``jobs.causes``), an operator's why; never memory text),
``superseded_by`` (the generation started for another model meanwhile: the
store writes it when it retires this one, whatever the state said), and
``embed_s`` / ``store_s`` (time spent in the embedder / listing records and
storing vectors, all slices together).

Two readings of it: ``Progress.from_dict`` is the job's own, all or nothing;
``progress_of`` is a page's, total (``ProgressView``): a field missing or of the
wrong type is unknown rather than breaking the page. Pure logic, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from typing import Any, Literal, get_args

State = Literal["running", "waiting", "activated", "failed", "cancelled", "superseded"]
STATES: tuple[State, ...] = get_args(State)
LIVE_STATES: tuple[State, ...] = ("running", "waiting")
FINISHED: tuple[State, ...] = ("activated", "failed", "cancelled", "superseded")
MAX_MESSAGE_CHARS = 300  # of a message a page shows


def now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True, slots=True)
class Progress:
    state: State
    pass_: int
    done: int
    total: int
    skipped: int
    errors: int
    rate_per_s: float
    eta_s: float | None
    started_at: str
    updated_at: str
    requested_by: str
    job_id: str
    cursor: str | None = None
    message: str | None = None
    embed_s: float = 0.0  # time spent in the embedder, all slices together
    store_s: float = 0.0  # time spent listing records and storing vectors
    superseded_by: int | None = None
    retrying: bool = False  # a slice failed; RQ runs it again after a pause

    @classmethod
    def queued(
        cls, *, job_id: str, requested_by: str, done: int, total: int, at: datetime
    ) -> Progress:
        stamp = at.isoformat()
        return cls("waiting", 1, done, total, 0, 0, 0.0, None, stamp, stamp, requested_by, job_id)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Progress | None:
        """The progress a generation holds, or None if it holds none of ours."""
        try:
            superseded_by = data.get("superseded_by")
            return cls(
                state=_state(data["state"], superseded_by),
                pass_=int(data["pass"]),
                done=int(data["done"]),
                total=int(data["total"]),
                skipped=int(data["skipped"]),
                errors=int(data["errors"]),
                rate_per_s=float(data["rate_per_s"]),
                eta_s=None if data["eta_s"] is None else float(data["eta_s"]),
                started_at=str(data["started_at"]),
                updated_at=str(data["updated_at"]),
                requested_by=str(data["requested_by"]),
                job_id=str(data["job_id"]),
                cursor=data.get("cursor"),
                message=data.get("message"),
                embed_s=float(data.get("embed_s", 0.0)),
                store_s=float(data.get("store_s", 0.0)),
                superseded_by=None if superseded_by is None else int(superseded_by),
                retrying=data.get("retrying") is True,
            )
        except (KeyError, TypeError, ValueError):
            return None

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["pass"] = out.pop("pass_")
        return out

    @property
    def finished(self) -> bool:
        return self.state in FINISHED

    @property
    def outcome(self) -> str:
        """One line for a re-embedding that is over: ``failed: RuntimeError: ...``."""
        if self.state == "superseded" and self.superseded_by is not None:
            return f"superseded by generation {self.superseded_by}"
        if self.state == "cancelled" and self.message:
            return f"cancelled {self.message}"  # by <who>[: <why>]
        return f"{self.state}: {self.message}" if self.message else self.state

    def advanced(
        self,
        *,
        stored: int,
        skipped: int,
        handled_per_s: float | None,
        at: datetime,
        embed_s: float = 0.0,
        store_s: float = 0.0,
    ) -> Progress:
        """After a batch: ``stored`` vectors more, ``skipped`` records that moved on."""
        done = self.done + stored
        rate = self.rate_per_s if handled_per_s is None else handled_per_s
        return replace(
            self,
            done=done,
            skipped=self.skipped + skipped,
            rate_per_s=round(rate, 2),
            eta_s=eta(self.total - done, rate),
            updated_at=at.isoformat(),
            embed_s=round(self.embed_s + embed_s, 3),
            store_s=round(self.store_s + store_s, 3),
        )

    def at(self, state: State, at: datetime, **changes: Any) -> Progress:
        return replace(self, state=state, updated_at=at.isoformat(), **changes)


def _state(state: Any, superseded_by: object) -> Any:
    """A generation retired for another model's is superseded, whatever its state said."""
    if state == "retired" or (superseded_by is not None and state not in FINISHED):
        return "superseded"
    return state


def eta(left: int, rate_per_s: float) -> float | None:
    if left <= 0:
        return 0.0
    if rate_per_s <= 0:
        return None
    return round(left / rate_per_s, 1)


def bar(progress: Progress, width: int = 30) -> str:
    """One line for a terminal: ``[#####.....] 1,234/5,000 25% 250.0/s ETA 15s``, then
    what went wrong while it runs (``· 3 errors · RuntimeError: ...; retrying in 30 s``)."""
    total = max(progress.total, 1)
    share = min(max(progress.done / total, 0.0), 1.0)
    filled = round(share * width)
    eta_text = "-" if progress.eta_s is None else _clock(progress.eta_s)
    state = "retrying" if progress.retrying and not progress.finished else progress.state
    return (
        f"[{'#' * filled}{'.' * (width - filled)}] {progress.done:,}/{progress.total:,}"
        f" {share:4.0%} {progress.rate_per_s:,.1f}/s ETA {eta_text}"
        f" pass {progress.pass_} {state}{trouble(progress)}"
    )


def trouble(progress: Progress) -> str:
    """`` · 3 errors · <why>`` while a live re-embedding fails or retries; else empty
    (a finished one's outcome is said on its own)."""
    if progress.finished or not (progress.errors or progress.retrying):
        return ""
    errors = f" · {progress.errors} error{'s' if progress.errors != 1 else ''}"
    return errors + (f" · {progress.message}" if progress.message else "")


def _clock(seconds: float) -> str:
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


@dataclass(frozen=True, slots=True)
class ProgressView:
    """A progress as a page shows it: ``None`` is a field unknown, ``state`` may be
    ``unknown``. ``as_dict`` is the HTTP API's ``Progress``."""

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
    retrying: bool = False

    @property
    def live(self) -> bool:
        return self.state in LIVE_STATES

    @property
    def shown_state(self) -> str:
        """The state a page names: ``retrying`` for a live one whose slice failed."""
        return "retrying" if self.retrying and self.live else self.state

    @property
    def percent(self) -> float | None:
        if self.done is None or not self.total:
            return None
        return min(100.0, 100.0 * self.done / self.total)

    @property
    def eta(self) -> str:
        if self.retrying and self.live:
            return "unknown (retrying)"  # the rate measured before it failed means nothing
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
            "retrying": self.retrying,
        }


def generation_status(status: str, progress: ProgressView | None) -> str:
    """The status a page shows for a generation: a pending one whose re-embedding
    failed is ``failed`` (still pending in the store: it waits for a new ``reembed``
    or a cancel), never ``pending`` beside a "reembed failed" badge."""
    if status == "pending" and progress is not None and progress.state == "failed":
        return "failed"
    return status


def progress_of(raw: Mapping[str, Any] | None) -> ProgressView | None:
    """The progress a generation holds as a page shows it, or None when it holds none."""
    if not raw or not isinstance(raw, Mapping):
        return None
    superseded_by = _count(raw.get("superseded_by"))
    state = _state(raw.get("state"), superseded_by)
    return ProgressView(
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
        retrying=raw.get("retrying") is True,
    )


def duration(seconds: float) -> str:
    """A duration as a page says it: ``1 min 15 s``."""
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
