"""engram's versioned-memory core on PostgreSQL + pgvector."""

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
from .session import ForgetEvent, ForgetListener, Session
from .store import ScopeSummary, Store
from .writer import Fence

__all__ = [
    "Embedder",
    "EmbeddingMismatchError",
    "EngramError",
    "Fence",
    "FencedError",
    "ForgetEvent",
    "ForgetListener",
    "Generation",
    "HashingEmbedder",
    "Hit",
    "InvalidRequestError",
    "KeywordEmbedder",
    "Link",
    "NotFoundError",
    "Operation",
    "OperationConflictError",
    "Receipt",
    "Record",
    "RecordRef",
    "ReembedResult",
    "RevisionConflictError",
    "SchemaVersionError",
    "Scope",
    "ScopeSummary",
    "Session",
    "Source",
    "Store",
    "WordLlamaEmbedder",
    "WriteResult",
    "default_embedder",
]
