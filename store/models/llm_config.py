"""The configuration of ``OpenAICompatibleLLM`` (``store.models.llm_client``), apart
from the client: the settings of every engram process read it, and only a process
that calls a model loads the HTTP client (httpx) with it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ..env import Env
from ..limits import LLM_BACKOFF_S, LLM_MAX_BACKOFF_S, LLM_MAX_RETRIES, LLM_TIMEOUT_S
from ..masking import MASKED_URL, masked_repr

# The first is the default (ENGRAM_LLM_RESPONSE_FORMAT); each refusal moves to the next.
RESPONSE_FORMATS = ("json_schema", "json_object", "none")


@dataclass(frozen=True, slots=True)
class LLMConfig:
    # the API's base (``https://api.openai.com/v1``) or the full endpoint
    url: str = field(metadata=MASKED_URL)
    model: str
    api_key: str | None = field(default=None, repr=False)
    timeout_s: float = LLM_TIMEOUT_S  # per attempt, the whole exchange
    max_retries: int = LLM_MAX_RETRIES
    response_format: str = RESPONSE_FORMATS[0]
    backoff_s: float = LLM_BACKOFF_S
    max_backoff_s: float = LLM_MAX_BACKOFF_S
    max_connections: int = 64

    __repr__ = masked_repr

    def __post_init__(self) -> None:
        if self.response_format not in RESPONSE_FORMATS:
            raise ValueError(f"response_format must be one of {', '.join(RESPONSE_FORMATS)}")
        if self.timeout_s <= 0 or self.max_retries < 0:
            raise ValueError("timeout_s must be positive and max_retries at least 0")

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> LLMConfig | None:
        """``ENGRAM_LLM_URL``, ``ENGRAM_LLM_MODEL``, ``ENGRAM_LLM_API_KEY`` and the
        optional ``ENGRAM_LLM_TIMEOUT_S``, ``ENGRAM_LLM_MAX_RETRIES``,
        ``ENGRAM_LLM_RESPONSE_FORMAT``; None when no URL is set."""
        read = Env(env)
        url = read.optional("ENGRAM_LLM_URL")
        if not url:
            return None
        model = read.optional("ENGRAM_LLM_MODEL")
        if not model:
            raise ValueError("ENGRAM_LLM_URL is set: set ENGRAM_LLM_MODEL too")
        return cls(
            url=url,
            model=model,
            api_key=read.optional("ENGRAM_LLM_API_KEY"),
            timeout_s=read.duration("ENGRAM_LLM_TIMEOUT_S", LLM_TIMEOUT_S, plain="s"),
            max_retries=read.integer("ENGRAM_LLM_MAX_RETRIES", LLM_MAX_RETRIES),
            response_format=read.text("ENGRAM_LLM_RESPONSE_FORMAT", RESPONSE_FORMATS[0]),
        )

    @property
    def endpoint(self) -> str:
        url = self.url.rstrip("/")
        return url if url.endswith("/chat/completions") else f"{url}/chat/completions"
