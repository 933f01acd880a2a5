"""The OpenAI-compatible client against a real HTTP server on loopback, started by
the test: the request it sends, the auth header, timeouts, retries, formats."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

import pytest

from engram.store import Completion, LLMConfig, ModelUnavailableError, OpenAICompatibleLLM, Prompt
from engram.store.models.llm_client import proxy_for
from engram.store.models.prompts import EVENTS_SCHEMA, reconcile_prompt
from tests.openai_server import OpenAIServer, Reply, Request, Respond, chat, scripted

PROMPT = reconcile_prompt(["Ada lives in London."], ["Ada moved to Paris."])
ANSWER = '{"memory": [{"event": "NOOP", "id": "0", "text": null}]}'


@contextmanager
def serving(
    respond: Respond, **config: object
) -> Iterator[tuple[OpenAIServer, OpenAICompatibleLLM]]:
    """A server on loopback and a client of it (short back-offs), both closed after."""
    options: dict[str, object] = {"backoff_s": 0.01, "max_backoff_s": 0.05, **config}
    with OpenAIServer(respond) as server:
        llm = OpenAICompatibleLLM(LLMConfig(url=server.url, model="fake-model", **options))  # type: ignore[arg-type]
        with llm:
            yield server, llm


def test_it_speaks_the_chat_completions_protocol() -> None:
    with serving(scripted(chat(ANSWER)), api_key="sk-test") as (server, llm):
        completion = llm(PROMPT)
    assert isinstance(completion, Completion)
    assert completion.text == ANSWER and completion.model_id == "fake-model"
    assert completion.usage is not None
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (12, 7)
    [request] = server.requests
    assert request.path == "/v1/chat/completions"
    assert request.headers["authorization"] == "Bearer sk-test"
    assert request.headers["content-type"] == "application/json"
    assert request.body == {
        "model": "fake-model",
        "messages": [
            {"role": "system", "content": PROMPT.system},
            {"role": "user", "content": PROMPT.user},
        ],
        "temperature": 0,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "engram_reconcile", "schema": EVENTS_SCHEMA, "strict": True},
        },
    }


def test_without_a_key_no_authorization_is_sent_and_a_full_endpoint_url_is_kept() -> None:
    with OpenAIServer(scripted(chat(ANSWER))) as server:
        config = LLMConfig(url=server.url + "/chat/completions", model="m")
        with OpenAICompatibleLLM(config) as llm:
            llm(PROMPT)
    [request] = server.requests
    assert "authorization" not in request.headers
    assert request.path == "/v1/chat/completions"


def test_a_429_is_retried_after_what_retry_after_says() -> None:
    busy = Reply(status=429, body={"error": {"message": "slow down"}}, headers={"Retry-After": "1"})
    with serving(scripted(busy, chat(ANSWER))) as (server, llm):
        started = time.monotonic()
        assert llm(PROMPT).text == ANSWER  # type: ignore[union-attr]
        waited = time.monotonic() - started
    assert len(server.requests) == 2
    assert waited >= 0.95  # the second request waited for Retry-After, not the back-off


def test_retry_after_ms_is_honoured_too() -> None:
    busy = Reply(status=503, body={}, headers={"retry-after-ms": "300"})
    with serving(scripted(busy, chat(ANSWER))) as (_server, llm):
        started = time.monotonic()
        llm(PROMPT)
        assert time.monotonic() - started >= 0.28


def test_a_500_every_time_fails_after_the_retries() -> None:
    with (
        serving(scripted(Reply(status=500, body={"error": "boom"})), max_retries=2) as (
            server,
            llm,
        ),
        pytest.raises(ModelUnavailableError) as info,
    ):
        llm(PROMPT)
    assert info.value.reason == "http_500" and info.value.code == "model_unavailable"
    assert len(server.requests) == 3
    assert "Ada" not in info.value.message


def test_a_500_then_success_succeeds() -> None:
    with serving(scripted(Reply(status=502, body={}), chat(ANSWER))) as (server, llm):
        assert llm(PROMPT).text == ANSWER  # type: ignore[union-attr]
    assert len(server.requests) == 2


def test_a_slow_endpoint_times_out_and_is_retried() -> None:
    slow = chat(ANSWER)
    slow.delay_s = 1.5
    with serving(scripted(slow), timeout_s=0.2, max_retries=1) as (server, llm):
        with pytest.raises(ModelUnavailableError) as info:
            llm(PROMPT)
        assert len(server.received(2)) == 2
    assert info.value.reason == "timeout"


def test_nothing_is_waited_for_past_the_prompts_deadline() -> None:
    slow = chat(ANSWER)
    slow.delay_s = 5.0
    with serving(scripted(slow), timeout_s=30, max_retries=5) as (server, llm):
        prompt = Prompt(
            PROMPT.kind, PROMPT.system, PROMPT.user, PROMPT.schema, time.monotonic() + 0.3
        )
        started = time.monotonic()
        with pytest.raises(ModelUnavailableError):
            llm(prompt)
        assert time.monotonic() - started < 2.5  # the deadline (0.3 s), not the server (5 s)
        assert len(server.received(1)) == 1


def test_a_retry_after_longer_than_the_deadline_fails_at_once() -> None:
    busy = Reply(status=429, body={}, headers={"Retry-After": "30"})
    with serving(scripted(busy)) as (server, llm):
        prompt = Prompt(
            PROMPT.kind, PROMPT.system, PROMPT.user, PROMPT.schema, time.monotonic() + 5
        )
        started = time.monotonic()
        with pytest.raises(ModelUnavailableError) as info:
            llm(prompt)
        assert time.monotonic() - started < 5.0  # not the 30 s asked for
    assert info.value.reason == "http_429" and len(server.requests) == 1


def test_a_client_error_is_not_retried() -> None:
    with (
        serving(scripted(Reply(status=401, body={"error": "bad key"}))) as (server, llm),
        pytest.raises(ModelUnavailableError) as info,
    ):
        llm(PROMPT)
    assert info.value.reason == "http_401" and len(server.requests) == 1


def test_an_endpoint_without_json_schema_is_asked_for_json_objects_then_plain_text() -> None:
    def respond(request: Request) -> Reply:
        fmt = request.body.get("response_format", {}).get("type")
        if fmt == "json_schema":
            return Reply(status=400, body={"error": {"message": "response_format not supported"}})
        if fmt == "json_object":
            return Reply(status=400, body={"error": {"message": "unknown response_format"}})
        return chat(ANSWER)

    with serving(respond, max_retries=0) as (server, llm):
        assert llm(PROMPT).text == ANSWER  # type: ignore[union-attr]
        assert llm.response_format == "none"
        llm(PROMPT)  # the client keeps to what the endpoint takes
    formats = [r.body.get("response_format", {}).get("type") for r in server.requests]
    assert formats == ["json_schema", "json_object", None, None]


def test_an_answer_that_is_not_a_chat_completion_is_a_protocol_failure() -> None:
    with (
        serving(scripted(Reply(body=b"<html>gateway</html>"))) as (_server, llm),
        pytest.raises(ModelUnavailableError) as info,
    ):
        llm(PROMPT)
    assert info.value.reason == "protocol"


def test_a_refusal_is_no_answer() -> None:
    refusal = chat(None)
    refusal.body["choices"][0]["message"]["refusal"] = "I cannot help with that."
    with serving(scripted(refusal)) as (_server, llm), pytest.raises(ModelUnavailableError) as info:
        llm(PROMPT)
    assert info.value.reason == "refused"


def test_the_configuration_is_read_from_the_environment() -> None:
    assert LLMConfig.from_env({}) is None
    with pytest.raises(ValueError, match="ENGRAM_LLM_MODEL"):
        LLMConfig.from_env({"ENGRAM_LLM_URL": "http://127.0.0.1:1/v1"})
    config = LLMConfig.from_env(
        {
            "ENGRAM_LLM_URL": "http://127.0.0.1:1/v1/",
            "ENGRAM_LLM_MODEL": "m",
            "ENGRAM_LLM_API_KEY": "k",
            "ENGRAM_LLM_TIMEOUT_S": "2.5",
            "ENGRAM_LLM_RESPONSE_FORMAT": "json_object",
        }
    )
    assert config is not None
    assert (config.endpoint, config.api_key, config.timeout_s, config.response_format) == (
        "http://127.0.0.1:1/v1/chat/completions",
        "k",
        2.5,
        "json_object",
    )
    with pytest.raises(ValueError, match="response_format"):
        LLMConfig(url="u", model="m", response_format="xml")
    assert EVENTS_SCHEMA["required"] == ["memory"]


@pytest.mark.parametrize("trickle_head", [True, False], ids=["head", "body"])
def test_an_endpoint_trickling_its_answer_is_cut_off_at_the_deadline(trickle_head: bool) -> None:
    # A byte every 0.3 s: each read is well within any timeout, the whole answer
    # (over 300 bytes) would take minutes.
    trickling = chat(ANSWER)
    trickling.trickle_s, trickling.trickle_head = 0.3, trickle_head
    with serving(scripted(trickling), timeout_s=30, max_retries=5) as (server, llm):
        prompt = Prompt(
            PROMPT.kind, PROMPT.system, PROMPT.user, PROMPT.schema, time.monotonic() + 1.0
        )
        started = time.monotonic()
        with pytest.raises(ModelUnavailableError) as info:
            llm(prompt)
        took = time.monotonic() - started
        assert server.hung_up.wait(5)  # the connection was closed, not left to trickle
    assert info.value.reason == "deadline"
    assert 0.9 <= took < 1.5
    assert len(server.requests) == 1


def test_the_timeout_per_attempt_bounds_a_trickling_answer_too() -> None:
    trickling = chat(ANSWER)
    trickling.trickle_s = 0.2
    with serving(scripted(trickling), timeout_s=0.5, max_retries=1) as (server, llm):
        started = time.monotonic()
        with pytest.raises(ModelUnavailableError) as info:
            llm(PROMPT)
        assert time.monotonic() - started < 2.5  # two attempts of 0.5 s and a back-off
        assert server.hung_up.wait(5)
        assert len(server.received(2)) == 2
    assert info.value.reason == "timeout"


def test_the_environments_proxy_is_used_as_httpx_would() -> None:
    assert proxy_for("https://api.example.com/v1", {"HTTPS_PROXY": "http://p:3128"}) == (
        "http://p:3128"
    )
    assert proxy_for("http://m.test/v1", {"HTTPS_PROXY": "http://p:3128"}) is None
    assert proxy_for("http://m.test/v1", {"all_proxy": "http://p:1"}) == "http://p:1"
    no_proxy = {"HTTP_PROXY": "http://p:1", "NO_PROXY": "localhost, .internal"}
    assert proxy_for("http://model.internal:8000/v1", no_proxy) is None
    assert proxy_for("http://localhost:8000/v1", no_proxy) is None
    assert proxy_for("http://model.test/v1", no_proxy) == "http://p:1"


def test_a_proxy_in_the_environment_carries_the_calls_and_the_deadline_holds_through_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The test server plays the proxy: a proxied request names its whole URL.
    answers = iter([chat(ANSWER), Reply(body=b"{}", trickle_s=0.3)])
    with OpenAIServer(lambda _request: next(answers)) as proxy:
        monkeypatch.setenv("HTTP_PROXY", proxy.url.rsplit("/v1", 1)[0])
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        config = LLMConfig(url="http://model.test/v1", model="m", max_retries=0)
        with OpenAICompatibleLLM(config) as llm:
            assert llm(PROMPT).text == ANSWER
            started = time.monotonic()
            with pytest.raises(ModelUnavailableError) as failed:
                llm(replace(PROMPT, deadline=time.monotonic() + 1.0))
            assert failed.value.reason == "deadline" and time.monotonic() - started < 3
        paths = [r.path for r in proxy.received(2)]
    assert paths == ["http://model.test/v1/chat/completions"] * 2
