"""What the reading commands print: a plain table for people, or JSON (``--json``)."""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from engram.store.values import Receipt, Record

# A column of free text (memory text) is cut to what is left of the terminal's width,
# but never below this.
_MIN_TEXT = 20


def print_json(value: Any) -> None:
    sys.stdout.write(json.dumps(value, indent=2, ensure_ascii=False, default=str) + "\n")


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """Left-aligned columns; the last one (free text) is cut to fit the terminal."""
    cells = [[_cell(v) for v in row] for row in rows]
    if not cells:
        return "(none)\n"
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    room = shutil.get_terminal_size((120, 24)).columns - sum(widths[:-1]) - 2 * len(widths[:-1])
    widths[-1] = min(widths[-1], max(room, _MIN_TEXT))
    lines = [_line(headers, widths)]
    lines += [_line(r, widths) for r in cells]
    return "\n".join(lines) + "\n"


def _line(values: Sequence[str], widths: Sequence[int]) -> str:
    out = []
    for value, width in zip(values, widths, strict=True):
        if len(value) > width:
            value = value[: width - 1] + "…"
        out.append(value.ljust(width))
    return "  ".join(out).rstrip()


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, datetime):
        return value.isoformat(sep=" ", timespec="seconds")
    if isinstance(value, float):
        return f"{value:.4f}"
    return " ".join(str(value).split())  # one line per row, whatever the text holds


def fields(pairs: Sequence[tuple[str, Any]]) -> str:
    """``name  value`` lines, for one object."""
    width = max(len(k) for k, _ in pairs)
    return "".join(f"{k.ljust(width)}  {_cell(v)}".rstrip() + "\n" for k, v in pairs)


def record_fields(r: Record) -> str:
    return fields(
        [
            ("id", r.id),
            ("scope", r.scope.key),
            ("revision", r.revision),
            ("status", r.status),
            ("kind", r.kind),
            ("importance", r.importance),
            ("origin", r.origin),
            ("sources", ", ".join(_source(s.as_dict()) for s in r.sources)),
            ("links", ", ".join(f"{x.relation} {x.id}" for x in r.links)),
            ("superseded by", ", ".join(r.superseded_by)),
            ("metadata", json.dumps(r.metadata, ensure_ascii=False) if r.metadata else ""),
            ("recorded at", r.recorded_at),
            ("expires at", r.expires_at),
            ("operation", r.operation_id),
            ("text", r.text),
        ]
    )


def _source(source: dict[str, str]) -> str:
    detail = source.get("message_id") or source.get("tool_name") or source.get("digest", "")
    return f"{source['kind']} {detail}".strip()


def receipt_row(r: Receipt) -> list[Any]:
    records = " ".join(f"{ref.id}@{ref.revision}:{ref.status}" for ref in r.records)
    notes = []
    if r.error:
        notes.append(f"refused: {r.error.get('code')}")
    if r.redacted:
        notes.append("redacted")
    if r.kind == "forget":
        notes.append(f"redaction {r.redaction}")
    return [r.committed_at, r.operation_id, r.kind, r.scope_revision, "; ".join(notes), records]


RECEIPT_HEADERS = ("committed at", "operation", "kind", "scope rev", "notes", "records")
