"""engram's versioned-memory core on PostgreSQL + pgvector."""

from .embedders import (
    Embedder,
    HashingEmbedder,
    KeywordEmbedder,
    WordLlamaEmbedder,
    default_embedder,
)
from .errors import (
    AssertedRecordError,
    EmbeddingMismatchError,
    EngramError,
    FencedError,
    InvalidRequestError,
    ModelOutputError,
    ModelUnavailableError,
    NotFoundError,
    OperationConflictError,
    RevisionConflictError,
    SchemaVersionError,
)
from .llm import LLM, Completion, Prompt, Usage
from .llm_client import LLMConfig, OpenAICompatibleLLM
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
from .tools import MemoryTools, memory_tools, tool_definitions
from .writer import Fence

__all__ = [
    "LLM",
    "AssertedRecordError",
    "Completion",
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
    "LLMConfig",
    "Link",
    "MemoryTools",
    "ModelOutputError",
    "ModelUnavailableError",
    "NotFoundError",
    "OpenAICompatibleLLM",
    "Operation",
    "OperationConflictError",
    "Prompt",
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
    "Usage",
    "WordLlamaEmbedder",
    "WriteResult",
    "default_embedder",
    "memory_tools",
    "tool_definitions",
]
