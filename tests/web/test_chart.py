"""The overview's chart (web/chart.py) and a reembed's progress as a page reads it
(jobs/progress.py): pure."""

from __future__ import annotations

from datetime import UTC, datetime

from engram.jobs.progress import duration, progress_of
from engram.web.chart import bucketed, lag_rows, ops_chart
from engram.worker.admin.metrics import Interval, LagSample


def test_bars_stack_by_outcome_scaled_to_the_busiest_interval() -> None:
    intervals = [
        Interval(1_700_000_000, committed=30, replayed=10, failed=0),
        Interval(1_700_000_010),
        Interval(1_700_000_020, committed=80, replayed=0, failed=20),
        Interval(1_700_000_030, committed=5),
    ]
    chart = ops_chart(intervals, width=400, height=102)
    assert len(chart.columns) == 4
    busiest = chart.columns[2]
    assert [b.kind for b in busiest.bars] == ["committed", "failed"]
    assert sum(b.height for b in busiest.bars) == 100.0  # the busiest fills the height
    assert busiest.bars[0].y + busiest.bars[0].height == 102  # bars stand on the bottom
    assert busiest.bars[1].y + busiest.bars[1].height == busiest.bars[0].y  # stacked
    assert chart.columns[1].bars == () and chart.columns[1].x == 100.0
    assert chart.peak_per_s == 10.0 and chart.total == 145
    assert chart.last_minute_per_s == 145 / 60
    assert "80 committed, 0 replayed, 20 failed (10.0/s)" in busiest.title
    assert (chart.start, chart.end) == ("22:13:20", "22:14:00")


def test_a_quiet_pipeline_draws_nothing_and_divides_by_nothing() -> None:
    chart = ops_chart([Interval(1_700_000_000), Interval(1_700_000_010)])
    assert all(c.bars == () for c in chart.columns) and chart.peak_per_s == 0.0
    assert ops_chart([]).columns == ()


def test_a_tiny_count_next_to_a_huge_one_still_shows() -> None:
    chart = ops_chart([Interval(0, committed=100_000), Interval(10, committed=1)], height=100)
    assert chart.columns[1].bars[0].height == 1.0


def test_a_day_of_minutes_is_summed_into_ten_minute_columns() -> None:
    day = 1_700_000_400  # on a 10-minute boundary
    minutes = [Interval(day + 60 * n, committed=n, failed=1) for n in range(25)]
    columns = bucketed(minutes)
    assert [c.start_s for c in columns] == [day, day + 600, day + 1200]
    assert [c.committed for c in columns] == [sum(range(10)), sum(range(10, 20)), 110]
    assert [c.failed for c in columns] == [10, 10, 5]
    chart = ops_chart(columns, interval_s=600)
    assert chart.peak_per_s == (145 + 10) / 600
    assert "(0.1/s)" in chart.columns[0].title
    assert (chart.start, chart.end) == ("Nov 14 22:20", "Nov 14 22:50")
    # A column is longer than a minute: the last minute's rate is the last column's.
    assert chart.last_minute_per_s == 115 / 600


def test_lag_rows_give_each_partition_now_the_last_hour_and_the_day() -> None:
    now = 1_700_086_400.0
    samples = [
        LagSample(int(now) - 20 * 3600, {0: 900, 1: 3}),  # 20 hours ago
        LagSample(int(now) - 600, {0: 40, 1: 0}),
        LagSample(int(now) - 60, {0: 5}),
    ]
    rows = lag_rows(samples, {0: 2, 1: 0, 2: 7}, now)
    assert [(r.partition, r.now, r.max_hour, r.max_day) for r in rows] == [
        (0, 2, 40, 900),
        (1, 0, 0, 3),
        (2, 7, 7, 7),  # live now, never sampled before: now is its highest
    ]
    assert rows[0].max_day_at == "Nov 15 02:13" and rows[2].max_day_at == "Nov 15 22:13"
    assert lag_rows([], {3: 0}, now)[0].max_day_at == ""  # never above 0
    assert lag_rows([], {}, now) == []


def test_progress_reads_the_agreed_shape() -> None:
    raw = {
        "state": "running", "pass": 2, "done": 300, "total": 1200, "skipped": 3, "errors": 1,
        "rate_per_s": 150.0, "eta_s": 6.0, "started_at": "2026-12-01T10:00:00+00:00",
        "updated_at": "2026-12-01T10:00:02Z", "requested_by": "grace", "job_id": "job-1",
    }  # fmt: skip
    p = progress_of(raw)
    assert p is not None and p.live and p.percent == 25.0 and p.eta == "6 s"
    assert p.updated_at == datetime(2026, 12, 1, 10, 0, 2, tzinfo=UTC)
    assert p.as_dict() == {
        **raw,
        "updated_at": "2026-12-01T10:00:02+00:00",
        "message": None,  # a failed reembed's root cause
        "superseded_by": None,
        "retrying": False,  # a failed slice waiting for its retry
    }


def test_progress_of_the_wrong_shape_is_shown_as_unknown_not_a_crash() -> None:
    p = progress_of(
        {"state": "exploded", "done": "many", "total": -1, "rate_per_s": float("nan"),
         "eta_s": True, "started_at": "yesterday", "requested_by": 7}
    )  # fmt: skip
    assert p is not None and p.state == "unknown" and not p.live
    assert (p.done, p.total, p.rate_per_s, p.eta_s, p.started_at, p.requested_by) == (
        None, None, None, None, None, None,
    )  # fmt: skip
    assert p.percent is None and p.eta == "unknown"
    assert progress_of({}) is None and progress_of(None) is None
    # What store.embeddings.reembed writes without the jobs.
    legacy = progress_of({"pass": 1, "embedded": 64, "skipped": 0})
    assert legacy is not None and legacy.done == 64 and legacy.state == "unknown"


def test_durations_read_like_a_person_would_say_them() -> None:
    assert [duration(s) for s in (0, 9.6, 75, 3600 * 2 + 61)] == [
        "0 s",
        "10 s",
        "1 min 15 s",
        "2 h 01 min",
    ]
