"""What changed between two revisions of a record: a word diff of the text and the
fields that differ (kind, importance, status, origin, expiry, metadata by key,
links, sources). Pure: no I/O, tested on its own.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from difflib import SequenceMatcher
from itertools import pairwise
from typing import Any, Literal

from store.model import Record

SegmentKind = Literal["same", "added", "removed"]
_TOKENS = re.compile(r"\s+|[^\s]+")
# Past this many differing tokens (after the common beginning and end are set
# aside), the two middles are shown whole instead of word by word: a word diff
# is quadratic in the worst case and unreadable long before.
MAX_DIFF_TOKENS = 4000


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
    text: tuple[Segment, ...] | None  # None when the text did not change
    changes: tuple[FieldChange, ...]

    @property
    def unchanged(self) -> bool:
        return self.text is None and not self.changes


def word_diff(before: str, after: str) -> tuple[Segment, ...]:
    """``after`` against ``before`` as runs of kept, removed and added words (spaces kept)."""
    a, b = _TOKENS.findall(before), _TOKENS.findall(after)
    head = _common_prefix(a, b)
    tail = _common_prefix(a[head:][::-1], b[head:][::-1])
    a_mid, b_mid = a[head : len(a) - tail], b[head : len(b) - tail]
    out: list[Segment] = []
    _append(out, "same", a[:head])
    if len(a_mid) + len(b_mid) > MAX_DIFF_TOKENS:
        _append(out, "removed", a_mid)
        _append(out, "added", b_mid)
    else:
        matcher = SequenceMatcher(None, a_mid, b_mid, autojunk=False)
        for op, i1, i2, j1, j2 in matcher.get_opcodes():
            if op == "equal":
                _append(out, "same", a_mid[i1:i2])
                continue
            _append(out, "removed", a_mid[i1:i2])
            _append(out, "added", b_mid[j1:j2])
    _append(out, "same", a[len(a) - tail :])
    return tuple(out)


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
    text = word_diff(before.text, after.text) if before.text != after.text else None
    return RevisionDiff(before.revision, after.revision, text, tuple(changes))


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
