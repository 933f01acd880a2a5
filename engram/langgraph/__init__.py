"""engram as LangGraph's long-term memory: ``EngramStore``, a ``BaseStore`` (the extra
``engram[langgraph]``). How items map to records and what each promise becomes:
docs/langgraph.md."""

from .scopes import ScopeSpanError
from .store import EngramStore

__all__ = ["EngramStore", "ScopeSpanError"]
