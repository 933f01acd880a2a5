"""A client for any OpenAI-compatible chat-completions endpoint: an ``LLM``.

One call is ``POST {url}/chat/completions`` with the model, a system and a user
message, temperature 0 and, where the endpoint offers it, structured output
(``response_format``: the answer's JSON schema, else ``json_object``). An
endpoint that refuses the format with a 400 is asked again with the next
(``json_schema`` -> ``json_object`` -> none), and the client keeps to that one.

A timeout per attempt and the prompt's deadline bound the whole exchange (connect,
request, every read of the answer), not each read: an endpoint trickling a byte
a second is cut off when the time is up, its connection closed. Retries with
exponential back-off and jitter on 429, 5xx, timeouts and connection errors,
waiting what ``Retry-After`` (or ``retry-after-ms``) says when the endpoint says
it; never past the prompt's deadline. Other answers, and retries run out, raise
``ModelUnavailableError`` with the reason. Neither logs nor errors quote a
prompt or an answer.
"""

from __future__ import annotations

import email.utils
import logging
import os
import random
import time
import urllib.parse
from collections.abc import Iterable, Mapping
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

import httpcore
import httpx

from ..errors import ModelUnavailableError
from ..limits import LLM_MAX_RETRY_AFTER_S
from .llm import Completion, Prompt, Usage
from .llm_config import RESPONSE_FORMATS, LLMConfig  # LLMConfig still importable from here

log = logging.getLogger(__name__)

# When the calling thread's exchange must be over (``time.monotonic()``), read by
# every connect, read and write of the connections the client's transport opens.
_ENDS: ContextVar[float | None] = ContextVar("engram_llm_call_ends", default=None)


def _time_left(timeout: float | None, expired: type[httpcore.TimeoutException]) -> float | None:
    ends = _ENDS.get()
    if ends is None:
        return timeout
    left = ends - time.monotonic()
    if left <= 0:
        raise expired("the model call's time is up")
    return left if timeout is None else min(timeout, left)


class _BoundedStream(httpcore.NetworkStream):
    """A connection whose every read and write ends by the calling thread's end time."""

    def __init__(self, stream: httpcore.NetworkStream) -> None:
        self._stream = stream

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._stream.read(max_bytes, _time_left(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._stream.write(buffer, _time_left(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._stream.close()

    def start_tls(
        self, ssl_context: Any, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.NetworkStream:
        left = _time_left(timeout, httpcore.ConnectTimeout)
        return _BoundedStream(self._stream.start_tls(ssl_context, server_hostname, left))

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


class _BoundedBackend(httpcore.NetworkBackend):
    def __init__(self) -> None:
        self._backend = httpcore.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        left = _time_left(timeout, httpcore.ConnectTimeout)
        return _BoundedStream(
            self._backend.connect_tcp(host, port, left, local_address, socket_options)
        )

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.NetworkStream:
        left = _time_left(timeout, httpcore.ConnectTimeout)
        return _BoundedStream(self._backend.connect_unix_socket(path, left, socket_options))

    def sleep(self, seconds: float) -> None:
        self._backend.sleep(seconds)


class _BoundedTransport(httpx.HTTPTransport):
    """httpx's transport, its connections bounded by the calling thread's end time.

    httpx's timeouts hold for each read, so an endpoint sending a byte a second
    never times out; httpcore takes a network backend, httpx offers no way to
    give it one: the pool httpx built is replaced by the same on ours, through
    ``proxy`` when one is given (a transport given to httpx reads no proxy from
    the environment: ``proxy_for`` does).
    """

    def __init__(self, limits: httpx.Limits, proxy: str | None = None) -> None:
        super().__init__(limits=limits)
        ssl_context = httpx.create_ssl_context()
        if proxy is None:
            self._pool = httpcore.ConnectionPool(
                ssl_context=ssl_context,
                max_connections=limits.max_connections,
                max_keepalive_connections=limits.max_keepalive_connections,
                keepalive_expiry=limits.keepalive_expiry,
                network_backend=_BoundedBackend(),
            )
            return
        url = httpx.URL(proxy)
        self._pool = httpcore.HTTPProxy(
            proxy_url=httpcore.URL(
                scheme=url.raw_scheme, host=url.raw_host, port=url.port, target=url.raw_path
            ),
            proxy_auth=(url.username, url.password) if url.username else None,
            ssl_context=ssl_context,
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=_BoundedBackend(),
        )


def proxy_for(url: str, env: Mapping[str, str] | None = None) -> str | None:
    """The proxy the environment names for ``url``, as httpx reads it by default:
    ``HTTPS_PROXY`` / ``HTTP_PROXY`` by scheme, else ``ALL_PROXY``, none for a host
    that ``NO_PROXY`` names."""
    env = os.environ if env is None else env
    named = {k.lower(): v for k, v in env.items() if k.lower().endswith("_proxy") and v}
    parts = urllib.parse.urlsplit(url)
    for pattern in named.get("no_proxy", "").split(","):
        pattern = pattern.strip().lstrip(".").lower()
        host = (parts.hostname or "").lower()
        if pattern == "*" or (pattern and (host == pattern or host.endswith("." + pattern))):
            return None
    return named.get(f"{parts.scheme}_proxy") or named.get("all_proxy")


class _Retry(Exception):
    """An attempt that may be tried again: why, and how long the endpoint asked to wait."""

    def __init__(self, reason: str, wait_s: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.wait_s = wait_s


class _Downgrade(Exception):
    """The endpoint refused the response format: ask again with the next one."""


class OpenAICompatibleLLM:
    """Thread-safe: the stream worker calls it from several threads at once.

    A ``client`` given is used as it is: its timeouts are httpx's, per read.
    """

    def __init__(self, config: LLMConfig, *, client: httpx.Client | None = None) -> None:
        self.config = config
        self._format = config.response_format
        headers = {"Content-Type": "application/json"}
        if config.api_key:
            headers["Authorization"] = f"Bearer {config.api_key}"
        limits = httpx.Limits(
            max_connections=config.max_connections,
            max_keepalive_connections=config.max_connections,
        )
        self._client = client or httpx.Client(
            headers=headers, transport=_BoundedTransport(limits, proxy_for(config.endpoint))
        )

    @property
    def model_id(self) -> str:
        return self.config.model

    @property
    def response_format(self) -> str:
        """The format in use (lower than configured once the endpoint refused it)."""
        return self._format

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> OpenAICompatibleLLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __call__(self, prompt: Prompt) -> Completion:
        attempt = 0
        while True:
            try:
                return self._attempt(prompt)
            except _Downgrade:
                continue  # not an attempt: the endpoint never looked at the prompt
            except _Retry as retry:
                if attempt >= self.config.max_retries:
                    raise ModelUnavailableError(
                        f"the model endpoint failed {attempt + 1} times ({retry.reason})",
                        reason=retry.reason,
                    ) from None
                self._back_off(prompt, retry, attempt)
                attempt += 1

    def _attempt(self, prompt: Prompt) -> Completion:
        started = time.monotonic()
        ends = started + self.config.timeout_s
        if prompt.deadline is not None:
            if prompt.deadline <= started:
                raise ModelUnavailableError("the model's deadline passed", reason="deadline")
            ends = min(ends, prompt.deadline)
        timeout_s = ends - started
        token = _ENDS.set(ends)
        try:
            response = self._client.post(
                self.config.endpoint,
                json=self._body(prompt),
                timeout=httpx.Timeout(timeout_s, connect=min(timeout_s, 10.0)),
            )
        except httpx.TimeoutException:
            if prompt.deadline is not None and time.monotonic() >= prompt.deadline:
                raise ModelUnavailableError(
                    "the model's deadline passed", reason="deadline"
                ) from None
            raise _Retry("timeout") from None
        except httpx.TransportError:
            raise _Retry("connection") from None
        finally:
            _ENDS.reset(token)
        status = response.status_code
        if status == 200:
            return _completion(response)
        if status in (400, 422) and self._refused_format(response):
            raise _Downgrade
        if status == 429 or status >= 500:
            raise _Retry(f"http_{status}", _retry_after(response.headers))
        raise ModelUnavailableError(
            f"the model endpoint answered {status}", reason=f"http_{status}"
        )

    def _body(self, prompt: Prompt) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.config.model,
            "messages": [
                {"role": "system", "content": prompt.system},
                {"role": "user", "content": prompt.user},
            ],
            "temperature": 0,
        }
        fmt = self._format
        if fmt == "json_schema":
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {
                    "name": f"engram_{prompt.kind}",
                    "schema": prompt.schema,
                    "strict": True,
                },
            }
        elif fmt == "json_object":
            body["response_format"] = {"type": "json_object"}
        return body

    def _refused_format(self, response: httpx.Response) -> bool:
        """Whether a 400 is about the response format, which then goes one step down."""
        if self._format == "none" or "response_format" not in response.text:
            return False
        lower = RESPONSE_FORMATS[RESPONSE_FORMATS.index(self._format) + 1]
        log.warning(
            "model endpoint refused the response format",
            extra={"response_format": self._format, "now": lower},
        )
        self._format = lower
        return True

    def _back_off(self, prompt: Prompt, retry: _Retry, attempt: int) -> None:
        if retry.wait_s is not None:
            delay = retry.wait_s
        else:
            ceiling = min(self.config.max_backoff_s, self.config.backoff_s * 2**attempt)
            delay = ceiling * random.uniform(0.5, 1.0)
        too_long = delay > LLM_MAX_RETRY_AFTER_S or (
            prompt.deadline is not None and time.monotonic() + delay >= prompt.deadline
        )
        if too_long:
            raise ModelUnavailableError(
                f"the model endpoint failed ({retry.reason}) and no retry fits in the time left",
                reason=retry.reason,
            )
        log.info(
            "model call retried",
            extra={"reason": retry.reason, "attempt": attempt + 1, "retry_in_s": round(delay, 3)},
        )
        time.sleep(delay)


def _completion(response: httpx.Response) -> Completion:
    try:
        data = response.json()
        message = data["choices"][0]["message"]
    except (ValueError, KeyError, IndexError, TypeError):
        raise ModelUnavailableError(
            "the model endpoint's answer is not a chat completion", reason="protocol"
        ) from None
    content = message.get("content") if isinstance(message, dict) else None
    if not isinstance(content, str):
        reason = "refused" if isinstance(message, dict) and message.get("refusal") else "protocol"
        raise ModelUnavailableError("the model answered no text", reason=reason)
    return Completion(content, _usage(data.get("usage")), data.get("model"))


def _usage(value: Any) -> Usage | None:
    if not isinstance(value, dict):
        return None
    prompt, completion = value.get("prompt_tokens"), value.get("completion_tokens")
    if not isinstance(prompt, int) or not isinstance(completion, int):
        return None
    return Usage(prompt, completion)


def _retry_after(headers: httpx.Headers) -> float | None:
    """What the endpoint asked to wait: ``retry-after-ms``, or ``Retry-After`` in
    seconds or as an HTTP date."""
    millis = headers.get("retry-after-ms")
    if millis is not None:
        try:
            return max(float(millis) / 1000, 0.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max((when - datetime.now(UTC)).total_seconds(), 0.0)
