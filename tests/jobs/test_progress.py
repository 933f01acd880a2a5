"""A re-embedding's progress: the contract with the dashboard, the API and the CLI."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

from engram.jobs.progress import Progress, bar, eta, generation_status, progress_of, trouble

AT = datetime(2026, 12, 3, 9, 0, tzinfo=UTC)
CONTRACT = {
    "state", "pass", "done", "total", "skipped", "errors", "rate_per_s", "eta_s",
    "started_at", "updated_at", "requested_by", "job_id",
}  # fmt: skip


def test_the_stored_form_has_every_agreed_key() -> None:
    p = Progress.queued(job_id="reembed-1", requested_by="ada", done=10, total=100, at=AT)
    stored = p.as_dict()
    assert set(stored) >= CONTRACT
    assert stored["state"] == "waiting" and stored["pass"] == 1
    assert stored["started_at"] == stored["updated_at"] == AT.isoformat()
    assert Progress.from_dict(stored) == p


def test_a_progress_that_is_not_ours_reads_as_none() -> None:
    assert Progress.from_dict({}) is None
    assert Progress.from_dict({"pass": 1, "embedded": 3, "skipped": 0}) is None  # Store.reembed's


def test_advancing_counts_and_estimates_the_time_left() -> None:
    p = Progress.queued(job_id="j", requested_by="cli", done=0, total=1000, at=AT)
    p = p.advanced(stored=60, skipped=4, handled_per_s=128.0, at=AT)
    assert (p.done, p.skipped, p.rate_per_s, p.eta_s) == (60, 4, 128.0, round(940 / 128, 1))
    assert p.advanced(stored=940, skipped=0, handled_per_s=None, at=AT).eta_s == 0.0
    assert eta(10, 0.0) is None


def test_the_terminal_bar_shows_done_total_rate_and_eta() -> None:
    p = Progress.queued(job_id="j", requested_by="cli", done=250, total=1000, at=AT)
    line = bar(p.advanced(stored=0, skipped=0, handled_per_s=50.0, at=AT).at("running", AT))
    assert "250/1,000" in line and "25%" in line and "50.0/s" in line and "ETA 15s" in line
    assert line.startswith("[" + "#" * 8 + "." * 22 + "]")


def test_the_bar_says_errors_and_a_retry_and_a_page_never_says_pending_for_failed() -> None:
    """Issue 29, item 5: ``0/54 0% … pass 1 waiting`` for as long as a failing slice
    waited for its retry, and "pending" beside a "reembed failed" badge."""
    p = Progress.queued(job_id="j", requested_by="cli", done=0, total=54, at=AT)
    assert trouble(p) == "" and bar(p).endswith("pass 1 waiting")
    why = "RuntimeError: went away; retrying in 30 s (1 more retry after that)"
    failing = p.at("waiting", AT, errors=3, message=why, retrying=True)
    assert bar(failing).endswith(f"pass 1 retrying · 3 errors · {why}")
    stored = failing.as_dict()
    assert stored["retrying"] is True and Progress.from_dict(stored) == failing
    view = progress_of(stored)
    assert view is not None and view.shown_state == "retrying" and view.as_dict()["retrying"]
    # A progress written before ``retrying``: read as not retrying.
    older = {k: v for k, v in stored.items() if k != "retrying"}
    assert Progress.from_dict(older) == replace(failing, retrying=False)
    failed = p.at("failed", AT, errors=4, message="RuntimeError: went away", retrying=False)
    assert trouble(failed) == ""  # a finished one's outcome is said on its own
    assert generation_status("pending", progress_of(failed.as_dict())) == "failed"
    assert generation_status("pending", view) == "pending"
    assert generation_status("active", None) == "active"
