"""engram's versioned-memory core on PostgreSQL + pgvector."""

from .audit import AuditEntry
from .cursors import InvalidCursorError
from .embedders import (
    Embedder,
    HashingEmbedder,
    KeywordEmbedder,
    WordLlamaEmbedder,
    default_embedder,
)
from .errors import (
    EmbeddingMismatchError,
    EngramError,
    FencedError,
    InvalidRequestError,
    NotFoundError,
    OperationConflictError,
    RevisionConflictError,
    SchemaVersionError,
)
from .listed import (
    GenerationItem,
    ReceiptItem,
    RecordItem,
    ScopeRow,
    Tombstone,
)
from .model import (
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
from .operations import Operation
from .paging import Page
from .receipt_filter import ReceiptFilter
from .session import ForgetEvent, ForgetListener, Session
from .store import ScopeSummary, Store
from .writer import Fence

__all__ = [
    "AuditEntry",
    "Embedder",
    "EmbeddingMismatchError",
    "EngramError",
    "Fence",
    "FencedError",
    "ForgetEvent",
    "ForgetListener",
    "Generation",
    "GenerationItem",
    "HashingEmbedder",
    "Hit",
    "InvalidCursorError",
    "InvalidRequestError",
    "KeywordEmbedder",
    "Link",
    "NotFoundError",
    "Operation",
    "OperationConflictError",
    "Page",
    "Receipt",
    "ReceiptFilter",
    "ReceiptItem",
    "Record",
    "RecordItem",
    "RecordRef",
    "ReembedResult",
    "RevisionConflictError",
    "SchemaVersionError",
    "Scope",
    "ScopeRow",
    "ScopeSummary",
    "Session",
    "Source",
    "Store",
    "Tombstone",
    "WordLlamaEmbedder",
    "WriteResult",
    "default_embedder",
]
