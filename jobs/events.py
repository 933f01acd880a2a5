"""A forget event as JSON: what the redaction jobs carry and the webhook posts.

``{"scope": {...}, "record_id", "revisions": [...], "operation_id",
"already_forgotten"}``: ids and revision numbers, never memory text.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engram.store import ForgetEvent, Scope


def to_dict(event: ForgetEvent) -> dict[str, Any]:
    return {
        "scope": event.scope.as_dict(),
        "record_id": event.record_id,
        "revisions": list(event.revisions),
        "operation_id": event.operation_id,
        "already_forgotten": event.already_forgotten,
    }


def from_dict(data: Mapping[str, Any]) -> ForgetEvent:
    return ForgetEvent(
        scope=Scope.of(data["scope"]),
        record_id=str(data["record_id"]),
        revisions=tuple(int(r) for r in data["revisions"]),
        operation_id=str(data["operation_id"]),
        already_forgotten=bool(data["already_forgotten"]),
    )
