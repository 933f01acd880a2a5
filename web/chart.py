"""The overview's operations/s chart, as geometry for a server-rendered SVG.

Pure: the workers' per-interval counts in, bars out (one stacked bar per
interval: committed, replayed, failed), scaled to the busiest interval. The
template draws them with classes only (the CSP allows no inline style).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from worker.defaults import RATE_INTERVAL_S
from worker.metrics import Interval

WIDTH = 720
HEIGHT = 140
GAP = 1.0
MINUTE = 60 // RATE_INTERVAL_S  # intervals


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


def ops_chart(intervals: Sequence[Interval], width: int = WIDTH, height: int = HEIGHT) -> Chart:
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
                f"{_clock(interval.start_s)}: {interval.committed} committed, "
                f"{interval.replayed} replayed, {interval.failed} failed "
                f"({interval.operations / RATE_INTERVAL_S:.1f}/s)",
            )
        )
    last_minute = intervals[-MINUTE:]
    return Chart(
        width=width,
        height=height,
        columns=tuple(columns),
        peak_per_s=peak / RATE_INTERVAL_S,
        last_minute_per_s=sum(i.operations for i in last_minute) / (MINUTE * RATE_INTERVAL_S),
        total=sum(i.operations for i in intervals),
        start=_clock(intervals[0].start_s) if intervals else "",
        end=_clock(intervals[-1].start_s + RATE_INTERVAL_S) if intervals else "",
    )


def _clock(epoch_s: int) -> str:
    return datetime.fromtimestamp(epoch_s, UTC).strftime("%H:%M:%S")
