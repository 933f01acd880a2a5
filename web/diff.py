"""What changed between two revisions of a record: a word diff of the text and the
fields that differ (kind, importance, status, origin, expiry, metadata by key,
links, sources). Pure: no I/O, tested on its own.

The word diff sets the common beginning and end aside (linear), then runs
Myers' O((N+M)·D) algorithm on what is left, on a budget of steps: past
``MAX_DIFF_TOKENS`` differing tokens, or once it has taken ``MAX_DIFF_STEPS``
steps, it stops and the page says "diff too large to show". So a pair of
revisions costs at most that many steps past the linear part, whatever their
texts (and a record page shows a bounded number of pairs).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any, Literal

from engram.store.values import Record

SegmentKind = Literal["same", "added", "removed"]
_TOKENS = re.compile(r"\s+|[^\s]+")
# Past this many differing tokens (after the common beginning and end are set
# aside), or this many steps of the diff, no word diff is shown: it would be
# unreadable long before, and its cost grows with the product of both sizes.
MAX_DIFF_TOKENS = 4000
MAX_DIFF_STEPS = 100_000


class Budget:
    """Steps a diff may still take; ``spent`` counts what it took."""

    def __init__(self, steps: int = MAX_DIFF_STEPS) -> None:
        self.limit = steps
        self.spent = 0

    def spend(self, steps: int) -> bool:
        """False once the budget is spent (the diff then gives up)."""
        self.spent += steps
        return self.spent <= self.limit


@dataclass(frozen=True, slots=True)
class Segment:
    kind: SegmentKind
    text: str


@dataclass(frozen=True, slots=True)
class FieldChange:
    name: str
    before: str | None  # None: the field (or metadata key, link, source) was absent
    after: str | None


@dataclass(frozen=True, slots=True)
class RevisionDiff:
    before: int
    after: int
    text: tuple[Segment, ...] | None  # None when the text did not change, or too_large
    changes: tuple[FieldChange, ...]
    text_too_large: bool = False  # the text changed, but its diff would cost too much

    @property
    def unchanged(self) -> bool:
        return self.text is None and not self.text_too_large and not self.changes


def word_diff(before: str, after: str, budget: Budget | None = None) -> tuple[Segment, ...] | None:
    """``after`` against ``before`` as runs of kept, removed and added words (spaces
    kept); None when the diff would take more than the budget."""
    budget = budget or Budget()
    a, b = _TOKENS.findall(before), _TOKENS.findall(after)
    head = _common_prefix(a, b)
    tail = _common_prefix(a[head:][::-1], b[head:][::-1])
    a_mid, b_mid = a[head : len(a) - tail], b[head : len(b) - tail]
    if len(a_mid) + len(b_mid) > MAX_DIFF_TOKENS:
        return None
    script = _myers(a_mid, b_mid, budget)
    if script is None:
        return None
    out: list[Segment] = []
    _append(out, "same", a[:head])
    for kind, tokens in script:
        _append(out, kind, tokens)
    _append(out, "same", a[len(a) - tail :])
    return tuple(out)


def _myers(
    a: Sequence[str], b: Sequence[str], budget: Budget
) -> list[tuple[SegmentKind, list[str]]] | None:
    """The shortest edit script from ``a`` to ``b`` (Myers 1986), or None once it has
    spent its budget: every step (a diagonal tried, a token compared, a value kept for
    the way back) is counted."""
    n, m = len(a), len(b)
    offset = n + m + 1
    v = [0] * (2 * offset + 1)
    trace: list[list[int]] = []  # v around the diagonals in play, before each round
    for d in range(n + m + 1):
        trace.append(v[offset - d - 1 : offset + d + 2])
        if not budget.spend(2 * d + 3):
            return None
        for k in range(-d, d + 1, 2):
            if k == -d or (k != d and v[offset + k - 1] < v[offset + k + 1]):
                x = v[offset + k + 1]
            else:
                x = v[offset + k - 1] + 1
            y = x - k
            start = x
            while x < n and y < m and a[x] == b[y]:
                x += 1
                y += 1
            v[offset + k] = x
            if not budget.spend(1 + x - start):
                return None
            if x >= n and y >= m:
                return _script(a, b, trace, x, y)
    return None  # not reached: d = n + m always ends it


def _script(
    a: Sequence[str], b: Sequence[str], trace: list[list[int]], x: int, y: int
) -> list[tuple[SegmentKind, list[str]]]:
    """Walk the rounds back from (x, y) = (len(a), len(b)) to (0, 0)."""
    steps: list[tuple[SegmentKind, str]] = []
    for d in range(len(trace) - 1, 0, -1):
        saved, k = trace[d], x - y

        def at(diagonal: int, saved: list[int] = saved, d: int = d) -> int:
            return saved[diagonal + d + 1]

        prev_k = k + 1 if k == -d or (k != d and at(k - 1) < at(k + 1)) else k - 1
        prev_x = at(prev_k)
        prev_y = prev_x - prev_k
        while x > prev_x and y > prev_y:
            x, y = x - 1, y - 1
            steps.append(("same", a[x]))
        if x == prev_x:
            steps.append(("added", b[prev_y]))
        else:
            steps.append(("removed", a[prev_x]))
        x, y = prev_x, prev_y
    while x > 0 and y > 0:
        x, y = x - 1, y - 1
        steps.append(("same", a[x]))
    runs: list[tuple[SegmentKind, list[str]]] = []
    for kind, token in reversed(steps):
        if runs and runs[-1][0] == kind:
            runs[-1][1].append(token)
        else:
            runs.append((kind, [token]))
    return _removed_first(runs)


def _removed_first(
    runs: list[tuple[SegmentKind, list[str]]],
) -> list[tuple[SegmentKind, list[str]]]:
    """An added run just before a removed one swapped, so a replacement reads
    old-then-new, as people write it."""
    for i in range(len(runs) - 1):
        if runs[i][0] == "added" and runs[i + 1][0] == "removed":
            runs[i], runs[i + 1] = runs[i + 1], runs[i]
    return runs


def revision_diff(before: Record, after: Record) -> RevisionDiff:
    changes: list[FieldChange] = []
    for name in ("kind", "importance", "status", "origin", "expires_at"):
        old, new = getattr(before, name), getattr(after, name)
        if old != new:
            changes.append(FieldChange(name, _show(old), _show(new)))
    changes += _mapping_changes("metadata", before.metadata, after.metadata)
    changes += _set_changes(
        "link",
        [f"{x.relation} {x.id}" for x in before.links],
        [f"{x.relation} {x.id}" for x in after.links],
    )
    changes += _set_changes(
        "source",
        [_show(s.as_dict()) or "" for s in before.sources],
        [_show(s.as_dict()) or "" for s in after.sources],
    )
    if before.text == after.text:
        return RevisionDiff(before.revision, after.revision, None, tuple(changes))
    text = word_diff(before.text, after.text)
    return RevisionDiff(before.revision, after.revision, text, tuple(changes), text is None)


def history_diffs(history: Sequence[Record]) -> list[RevisionDiff]:
    """Each stored revision against the one stored before it (pruned ones are skipped)."""
    ordered = sorted(history, key=lambda r: r.revision)
    return [revision_diff(a, b) for a, b in pairwise(ordered)]


def _common_prefix(a: Sequence[str], b: Sequence[str]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _append(out: list[Segment], kind: SegmentKind, tokens: Sequence[str]) -> None:
    if not tokens:
        return
    text = "".join(tokens)
    if out and out[-1].kind == kind:
        out[-1] = Segment(kind, out[-1].text + text)
    else:
        out.append(Segment(kind, text))


def _mapping_changes(name: str, before: dict[str, Any], after: dict[str, Any]) -> list[FieldChange]:
    return [
        FieldChange(
            f"{name}.{key}",
            _show(before.get(key)) if key in before else None,
            _show(after.get(key)) if key in after else None,
        )
        for key in sorted(set(before) | set(after))
        if key not in before or key not in after or before[key] != after[key]
    ]


def _set_changes(name: str, before: list[str], after: list[str]) -> list[FieldChange]:
    removed = [FieldChange(name, x, None) for x in sorted(set(before) - set(after))]
    added = [FieldChange(name, None, x) for x in sorted(set(after) - set(before))]
    return removed + added


def _show(value: object) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if hasattr(value, "isoformat"):
        return str(value.isoformat())
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(", ", ": "))
