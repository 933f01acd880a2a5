"""Model tools: ``memory_remember``, ``memory_recall``, ``memory_revise`` and
``memory_retract`` (no forget: forgetting is the host's decision), as JSON-schema
definitions for any function-calling model (OpenAI and Anthropic shapes) and an
executor bound to one scope.

- Every write is ``inferred`` and cites the tool call as an assistant source
  (``tool_call_id``, ``tool_name``, the scope's ``chat_id``, the run).
- Its operation id is derived from the scope, the run, the model step and the
  tool call id: a call replayed after a crash is applied once.
- ``memory_recall`` answers ``{id, revision, text, kind, origin, source_kinds,
  status}`` per record, so the model can hand the revision back.
- ``memory_revise`` / ``memory_retract`` refuse asserted records, and every
  problem is answered as data the model can act on: ``{"error":
  "asserted_record"}``, ``{"error": "revision_conflict", "actual_revision": N}``,
  ``{"error": "not_found"}``, ``{"error": "invalid_request", "message": ...}``.

The executor writes through a callable (a session's, or a Producer's through
the streams: ``worker.model_tools``) and reads through another.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import EngramError, InvalidRequestError, NotFoundError, RevisionConflictError
from ..limits import DEFAULT_TOP_K, MAX_KIND_CHARS, MAX_TEXT_CHARS
from ..values import Hit, Receipt, Scope, Source
from ..write.operations import Operation, text_digest
from ..write.requests import remember_request, retract_request, revise_request
from ..write.validation import Fields

if TYPE_CHECKING:
    from ..session import Session

TOOLS = ("remember", "recall", "revise", "retract")
MAX_RECALL_TOP_K = 20

Write = Callable[[Operation], Receipt]  # commits one operation or raises its EngramError


class Recall(Protocol):
    """What ``memory_recall`` reads with: a session's ``recall`` is one."""

    def __call__(self, text: str, /, *, top_k: int, kind: str | None) -> list[Hit]: ...


_KIND = {
    "type": "string",
    "maxLength": MAX_KIND_CHARS,
    "description": "semantic (a lasting fact), episodic (an event) or procedural (how to do"
    " something)",
}
_IMPORTANCE = {"type": "number", "minimum": 0, "maximum": 1, "description": "from 0 to 1"}
_ID = {"type": "string", "description": "the record's id, as memory_recall gave it"}
_EXPECTED = {
    "type": "integer",
    "minimum": 1,
    "description": "the record's revision as memory_recall gave it",
}

_SPECS: dict[str, tuple[str, dict[str, Any], list[str]]] = {
    "remember": (
        "Remember a fact for later: one short, self-contained sentence. It is stored as"
        " inferred by you, citing this call.",
        {
            "text": {"type": "string", "maxLength": MAX_TEXT_CHARS},
            "kind": _KIND,
            "importance": _IMPORTANCE,
        },
        ["text"],
    ),
    "recall": (
        "Search the memory for the records most relevant to a query. Each comes with its"
        " id and revision (to revise or retract it), its text, kind, origin (asserted by"
        " the host, or inferred by a model), the kinds of its sources and its status.",
        {
            "query": {"type": "string"},
            "kind": _KIND,
            "top_k": {"type": "integer", "minimum": 1, "maximum": MAX_RECALL_TOP_K},
        },
        ["query"],
    ),
    "revise": (
        "Change the text, kind or importance of a record, giving the revision you saw."
        " Records the host asserted cannot be changed (error asserted_record). If the"
        " record changed meanwhile the answer is revision_conflict with its"
        " actual_revision: recall it again first.",
        {
            "id": _ID,
            "expected_revision": _EXPECTED,
            "text": {"type": "string", "maxLength": MAX_TEXT_CHARS},
            "kind": _KIND,
            "importance": _IMPORTANCE,
        },
        ["id", "expected_revision"],
    ),
    "retract": (
        "Withdraw a record that is no longer true, giving the revision you saw. Records"
        " the host asserted cannot be withdrawn (error asserted_record).",
        {"id": _ID, "expected_revision": _EXPECTED},
        ["id", "expected_revision"],
    ),
}


def _included(include: Sequence[str] | None) -> tuple[str, ...]:
    if include is None:
        return TOOLS
    unknown = sorted(set(include) - set(TOOLS))
    if unknown:
        raise InvalidRequestError(
            f"unknown memory tool(s): {', '.join(unknown)} (known: {', '.join(TOOLS)})"
        )
    return tuple(t for t in TOOLS if t in include)


def tool_definitions(
    *, include: Sequence[str] | None = None, prefix: str = "memory", shape: str = "openai"
) -> list[dict[str, Any]]:
    """The tools' definitions: ``shape`` ``openai`` (``{"type": "function", "function":
    {...}}``) or ``anthropic`` (``{"name", "description", "input_schema"}``)."""
    if shape not in ("openai", "anthropic"):
        raise InvalidRequestError("shape must be openai or anthropic")
    out = []
    for tool in _included(include):
        description, properties, required = _SPECS[tool]
        schema = {
            "type": "object",
            "properties": properties,
            "required": required,
            "additionalProperties": False,
        }
        name = f"{prefix}_{tool}"
        if shape == "openai":
            out.append(
                {
                    "type": "function",
                    "function": {"name": name, "description": description, "parameters": schema},
                }
            )
        else:
            out.append({"name": name, "description": description, "input_schema": schema})
    return out


def tool_operation_id(scope: Scope, run_id: str, step: int | str, call_id: str) -> str:
    """The operation id of a tool call: the same call, replayed, is the same operation;
    the same ids in another scope or run are another."""
    key = json.dumps([scope.key, run_id, str(step), call_id])
    return f"tool_{hashlib.sha256(key.encode()).hexdigest()[:40]}"


class MemoryTools:
    """The memory tools of one scope and one run, for any function-calling model."""

    def __init__(
        self,
        scope: Scope | Mapping[str, Any],
        write: Write,
        recall: Recall | None = None,
        *,
        run_id: str | None = None,
        include: Sequence[str] | None = None,
        prefix: str = "memory",
    ) -> None:
        self.scope = Scope.of(scope)
        self.run_id = run_id or self.scope.run_id
        if not self.run_id:
            raise InvalidRequestError("model tools need a run_id (or a scope with one)")
        self.tools = _included(include)
        if "recall" in self.tools and recall is None:
            raise InvalidRequestError("the recall tool needs something to recall with")
        self.prefix = prefix
        self._write = write
        self._recall = recall

    @property
    def names(self) -> list[str]:
        return [f"{self.prefix}_{t}" for t in self.tools]

    def definitions(self, shape: str = "openai") -> list[dict[str, Any]]:
        return tool_definitions(include=self.tools, prefix=self.prefix, shape=shape)

    def handles(self, name: str) -> bool:
        return name in self.names

    def execute(
        self, name: str, arguments: Mapping[str, Any] | str, *, step: int | str, call_id: str
    ) -> dict[str, Any]:
        """Run one tool call; the answer (JSON) goes back to the model as the tool result."""
        if not self.handles(name):
            return {"error": "unknown_tool", "message": f"no tool {name} here"}
        tool = name.removeprefix(f"{self.prefix}_")
        try:
            args = json.loads(arguments) if isinstance(arguments, str) else arguments
        except ValueError:
            return _problem(InvalidRequestError(f"the arguments of {name} are not JSON"))
        try:
            if tool == "recall":
                return self._recall_tool(args)
            op = Operation.build(
                tool,
                self.scope,
                self._request(tool, name, args, call_id),
                tool_operation_id(self.scope, str(self.run_id), step, call_id),
            )
            receipt = self._write(op)
        except EngramError as error:
            return _problem(error)
        return {
            "records": [r.as_dict() for r in receipt.records],
            "operation_id": receipt.operation_id,
        }

    def _request(self, tool: str, name: str, args: object, call_id: str) -> dict[str, Any]:
        if tool == "remember":
            f = Fields(args, name, ("text", "kind", "importance"))
            text = str(f.text("text"))
            return remember_request(
                text,
                kind=f.kind(),
                importance=f.importance(),
                origin="inferred",
                sources=[self._source(name, call_id, text)],
            )
        if tool == "revise":
            f = Fields(args, name, ("id", "expected_revision", "text", "kind", "importance"))
            revised = f.text("text", required=False)
            return revise_request(
                str(f.ident("id")),
                expected_revision=_expected(f),
                text=revised,
                kind=f.kind(),
                importance=f.importance(),
                sources=[self._source(name, call_id, revised)],
                only_inferred=True,
            )
        f = Fields(args, name, ("id", "expected_revision"))
        return retract_request(
            str(f.ident("id")), expected_revision=_expected(f), only_inferred=True
        )

    def _source(self, name: str, call_id: str, text: str | None) -> dict[str, str]:
        return Source(
            kind="assistant",
            digest=text_digest(text) if text is not None else None,
            tool_call_id=call_id,
            tool_name=name,
            run_id=self.run_id,
            chat_id=self.scope.chat_id,
        ).as_dict()

    def _recall_tool(self, args: object) -> dict[str, Any]:
        assert self._recall is not None
        f = Fields(args, f"{self.prefix}_recall", ("query", "kind", "top_k"))
        query = f.text("query")
        assert query is not None
        top_k = f.integer("top_k", minimum=1, maximum=MAX_RECALL_TOP_K) or DEFAULT_TOP_K
        hits = self._recall(query, top_k=top_k, kind=f.kind())
        return {
            "records": [
                {
                    "id": h.record.id,
                    "revision": h.record.revision,
                    "text": h.record.text,
                    "kind": h.record.kind,
                    "origin": h.record.origin,
                    "source_kinds": sorted({s.kind for s in h.record.sources}),
                    "status": h.record.status,
                }
                for h in hits
            ]
        }


def memory_tools(
    session: Session,
    *,
    run_id: str | None = None,
    include: Sequence[str] | None = None,
    prefix: str = "memory",
) -> MemoryTools:
    """The memory tools of a session's scope: they write with its embedder and model."""

    def write(op: Operation) -> Receipt:
        result = session.write(op)
        if isinstance(result, EngramError):
            raise result
        return result.receipt

    return MemoryTools(
        session.scope, write, session.recall, run_id=run_id, include=include, prefix=prefix
    )


def _expected(f: Fields) -> int:
    value = f.integer("expected_revision", minimum=1, maximum=2**31 - 1)
    if value is None:
        raise InvalidRequestError(f"{f.what}.expected_revision is required")
    return value


def _problem(error: EngramError) -> dict[str, Any]:
    """A refusal as data the model can act on; messages carry ids, never memory text."""
    if isinstance(error, NotFoundError) or (
        isinstance(error, RevisionConflictError) and error.actual is None
    ):
        return {"error": "not_found"}
    if isinstance(error, RevisionConflictError):
        return {"error": "revision_conflict", "actual_revision": error.actual}
    if error.code == "asserted_record":
        return {"error": "asserted_record"}
    return {"error": error.code, "message": error.message}
