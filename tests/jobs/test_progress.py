"""A re-embedding's progress: the contract with the dashboard, the API and the CLI."""

from __future__ import annotations

from datetime import UTC, datetime

from jobs.progress import Progress, bar, eta

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
