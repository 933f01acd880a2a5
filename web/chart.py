"""The overview's operations/s charts, as geometry for a server-rendered SVG, and its
per-partition lag over the last day.

Pure: the workers' per-interval (or per-minute) counts in, bars out (one stacked
bar per interval: committed, replayed, failed), scaled to the busiest interval. The
template draws them with classes only (the CSP allows no inline style).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from engram.worker.admin.metrics import Interval, LagSample
from engram.worker.defaults import RATE_INTERVAL_S

WIDTH = 720
HEIGHT = 140
GAP = 1.0
DAY_COLUMN_S = 600  # the last day's chart: one column per 10 minutes
HOUR_S = 3_600


@dataclass(frozen=True, slots=True)
class Bar:
    kind: str  # committed | replayed | failed: the CSS class
    x: float
    y: float
    width: float
    height: float


@dataclass(frozen=True, slots=True)
class Column:
    bars: tuple[Bar, ...]
    x: float
    width: float
    title: str  # the tooltip: when, and how many of each


@dataclass(frozen=True, slots=True)
class Chart:
    width: int
    height: int
    columns: tuple[Column, ...]
    peak_per_s: float
    last_minute_per_s: float  # the current interval counts with the five before it
    total: int
    start: str
    end: str


def ops_chart(
    intervals: Sequence[Interval],
    width: int = WIDTH,
    height: int = HEIGHT,
    *,
    interval_s: int = RATE_INTERVAL_S,
) -> Chart:
    """``intervals`` of ``interval_s`` seconds each, oldest first."""
    # A day's chart spans two dates: its times say which.
    clock = _clock if interval_s < 60 else _day_clock
    peak = max((i.operations for i in intervals), default=0)
    step = width / max(len(intervals), 1)
    scale = (height - 2) / peak if peak else 0.0
    columns = []
    for n, interval in enumerate(intervals):
        x = n * step
        bars, top = [], float(height)
        for kind, count in (
            ("committed", interval.committed),
            ("replayed", interval.replayed),
            ("failed", interval.failed),
        ):
            if count:
                h = max(count * scale, 1.0)
                top -= h
                bars.append(
                    Bar(kind, round(x, 2), round(top, 2), round(step - GAP, 2), round(h, 2))
                )
        columns.append(
            Column(
                tuple(bars),
                round(x, 2),
                round(step, 2),
                f"{clock(interval.start_s)}: {interval.committed} committed, "
                f"{interval.replayed} replayed, {interval.failed} failed "
                f"({interval.operations / interval_s:.1f}/s)",
            )
        )
    minute = max(60 // interval_s, 1)  # intervals
    last_minute = intervals[-minute:]
    return Chart(
        width=width,
        height=height,
        columns=tuple(columns),
        peak_per_s=peak / interval_s,
        last_minute_per_s=sum(i.operations for i in last_minute) / (minute * interval_s),
        total=sum(i.operations for i in intervals),
        start=clock(intervals[0].start_s) if intervals else "",
        end=clock(intervals[-1].start_s + interval_s) if intervals else "",
    )


def bucketed(minutes: Sequence[Interval], column_s: int = DAY_COLUMN_S) -> list[Interval]:
    """Minutes summed into columns of ``column_s`` seconds (aligned on the clock), oldest
    first: a day of minutes is 1,440 bars, too thin to see or to send every 2 s."""
    columns: dict[int, Interval] = {}
    for m in minutes:
        start = m.start_s - m.start_s % column_s
        c = columns.get(start, Interval(start))
        columns[start] = Interval(
            start,
            c.committed + m.committed,
            c.replayed + m.replayed,
            c.failed + m.failed,
            c.dead + m.dead,
        )
    return [columns[k] for k in sorted(columns)]


@dataclass(frozen=True, slots=True)
class LagRow:
    """One partition's lag over the last day, from the dashboard's samples."""

    partition: int
    now: int
    max_hour: int
    max_day: int
    max_day_at: str  # when the day's highest was sampled ("" if never above 0)


def lag_rows(samples: Sequence[LagSample], lag_now: dict[int, int], now_s: float) -> list[LagRow]:
    """A row per partition (those live now and those sampled): its lag now, and its
    highest in the last hour and the last day, now included: the samples are read at
    most every 30 s (``state.Costly``), and a highest below the lag now is no highest."""
    partitions = sorted(set(lag_now) | {p for s in samples for p in s.lags})
    rows = []
    for p in partitions:
        day = [(s.lags[p], s.start_s) for s in samples if p in s.lags]
        day.append((lag_now.get(p, 0), int(now_s)))
        hour = [lag for lag, start in day if start > now_s - HOUR_S]
        peak, at = max(day, default=(0, 0))
        rows.append(
            LagRow(p, lag_now.get(p, 0), max(hour, default=0), peak, _day_clock(at) if peak else "")
        )
    return rows


def _clock(epoch_s: int) -> str:
    return datetime.fromtimestamp(epoch_s, UTC).strftime("%H:%M:%S")


def _day_clock(epoch_s: int) -> str:
    return datetime.fromtimestamp(epoch_s, UTC).strftime("%b %d %H:%M")
