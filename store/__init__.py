"""engram's versioned-memory core on PostgreSQL + pgvector."""

from typing import TYPE_CHECKING, Any

from .audit import AuditEntry
from .errors import (
    AssertedRecordError,
    EmbeddingMismatchError,
    EngramError,
    FencedError,
    InvalidRequestError,
    ModelOutputError,
    ModelUnavailableError,
    NotFoundError,
    OperationAmbiguousError,
    OperationConflictError,
    RecordAmbiguousError,
    RevisionConflictError,
    SchemaVersionError,
)
from .models.llm import LLM, Completion, Prompt, Usage
from .models.llm_config import LLMConfig
from .models.tools import MemoryTools, memory_tools, tool_definitions
from .read.cursors import InvalidCursorError
from .read.listed import GenerationItem, ReceiptItem, RecordItem, ScopeRow, Tombstone
from .read.metadata_filter import MetadataFilter
from .read.paging import Page
from .read.receipt_filter import ReceiptFilter
from .session import ForgetEvent, ForgetListener, Session
from .store import RevisionPage, ScopeSummary, Store
from .tokens import Grant, Tokens
from .values import (
    Fence,
    Generation,
    Hit,
    Link,
    Receipt,
    Record,
    RecordRef,
    ReembedResult,
    Scope,
    Source,
    WriteResult,
)
from .vectors.embedders import (
    Embedder,
    HashingEmbedder,
    KeywordEmbedder,
    WordLlamaEmbedder,
    default_embedder,
)
from .write.operations import Operation
from .write.options import WriteOptions

__all__ = [
    "LLM",
    "AssertedRecordError",
    "AuditEntry",
    "Completion",
    "Embedder",
    "EmbeddingMismatchError",
    "EngramError",
    "Fence",
    "FencedError",
    "ForgetEvent",
    "ForgetListener",
    "Generation",
    "GenerationItem",
    "Grant",
    "HashingEmbedder",
    "Hit",
    "InvalidCursorError",
    "InvalidRequestError",
    "KeywordEmbedder",
    "LLMConfig",
    "Link",
    "MemoryTools",
    "MetadataFilter",
    "ModelOutputError",
    "ModelUnavailableError",
    "NotFoundError",
    "OpenAICompatibleLLM",
    "Operation",
    "OperationAmbiguousError",
    "OperationConflictError",
    "Page",
    "Prompt",
    "Receipt",
    "ReceiptFilter",
    "ReceiptItem",
    "Record",
    "RecordAmbiguousError",
    "RecordItem",
    "RecordRef",
    "ReembedResult",
    "RevisionConflictError",
    "RevisionPage",
    "SchemaVersionError",
    "Scope",
    "ScopeRow",
    "ScopeSummary",
    "Session",
    "Source",
    "Store",
    "Tokens",
    "Tombstone",
    "Usage",
    "WordLlamaEmbedder",
    "WriteOptions",
    "WriteResult",
    "default_embedder",
    "memory_tools",
    "tool_definitions",
]

if TYPE_CHECKING:
    from .models.llm_client import OpenAICompatibleLLM


def __getattr__(name: str) -> Any:
    """``OpenAICompatibleLLM`` on first use: its HTTP client (httpx) is no cost to the
    processes that call no model (every ``engram`` command reads the settings)."""
    if name == "OpenAICompatibleLLM":
        from .models.llm_client import OpenAICompatibleLLM

        return OpenAICompatibleLLM
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
