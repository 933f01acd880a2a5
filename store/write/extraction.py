"""The untrusted-source policy of extraction: which message texts may be read.

Read: user text, assistant text, and results of tools named in
``trusted_tools``. Never read: a failed tool result, a result whose tool
cannot be named (no ``tool_name`` and no matching assistant ``tool_use``),
a result of a tool that is not trusted, system messages.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..limits import MAX_TEXT_CHARS
from ..values import Source, check_string
from .operations import Message, text_digest


@dataclass(frozen=True, slots=True)
class Readable:
    message_id: str
    role: str
    text: str
    source: Source


def _parts(content: Any) -> list[Any]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return content if isinstance(content, list) else []


def _tool_names(messages: Sequence[Message]) -> dict[str, str]:
    names = {}
    for m in messages:
        if m.role != "assistant":
            continue
        for part in _parts(m.content):
            if (
                isinstance(part, dict)
                and part.get("type") == "tool_use"
                and isinstance(part.get("id"), str)
                and isinstance(part.get("name"), str)
            ):
                names[part["id"]] = part["name"]
    return names


def readable_sources(
    messages: Sequence[Message], trusted_tools: Sequence[str], chat_id: str | None
) -> list[Readable]:
    trusted = set(trusted_tools)
    tool_names = _tool_names(messages)
    out: list[Readable] = []
    for m in messages:
        for part in _parts(m.content):
            if not isinstance(part, dict):
                continue
            if m.role in ("user", "assistant") and part.get("type") == "text":
                text = part.get("text")
                if isinstance(text, str) and text.strip():
                    out.append(_readable(m, m.role, text, chat_id))
            elif m.role == "tool" and part.get("type") == "tool_result":
                if part.get("isError"):
                    continue
                call_id = part.get("toolUseId") or part.get("tool_use_id")
                name = m.tool_name or (
                    tool_names.get(call_id) if isinstance(call_id, str) else None
                )
                if name is None or name not in trusted:
                    continue
                result = part.get("result")
                text = result if isinstance(result, str) else _as_json(result)
                if text.strip():
                    out.append(
                        _readable(
                            m,
                            "tool",
                            text,
                            chat_id,
                            tool_name=name,
                            tool_call_id=call_id if isinstance(call_id, str) else None,
                        )
                    )
    return out


def _readable(
    m: Message,
    kind: str,
    text: str,
    chat_id: str | None,
    *,
    tool_name: str | None = None,
    tool_call_id: str | None = None,
) -> Readable:
    check_string(text, f"message {m.id} text", max_chars=MAX_TEXT_CHARS)
    source = Source(
        kind=kind,
        digest=text_digest(text),
        message_id=m.id,
        tool_name=tool_name,
        tool_call_id=tool_call_id,
        run_id=m.run_id,
        chat_id=chat_id,
    )
    return Readable(message_id=m.id, role=kind, text=text, source=source)


def _as_json(value: Any) -> str:
    """A non-string tool result, read as compact JSON (what seed 000 shows the model)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
