"""A failed reembed's root cause: short, its error's type and message, never a record's
text; shown on the generation's row, in the job's row and by ``engram reembed``, which
exits 1, for an embedder that breaks mid-way in a real ``engram jobs`` process."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import psycopg
import pytest
from starlette.testclient import TestClient

from engram.cli import main
from engram.jobs import causes, keys
from engram.jobs.errors import JobFailedError, content_free
from engram.jobs.progress import Progress
from engram.store import HashingEmbedder, Store
from engram.store.errors import EmbeddingMismatchError, InvalidRequestError
from engram.web import rqjobs
from engram.worker.embedded.runtime import connect_redis
from tests.embedder_faults import BREAKS_WITH, FAULTY_PLUGINS
from tests.jobs_fixtures import JobsProcess
from tests.redis_fixtures import FAST
from tests.web_fixtures import BASE_URL, make_app, sign_in

TEXTS = ["Ada's PIN is 4417, keep it safe", "ok"]


class Raises(HashingEmbedder):
    def __init__(self, error: Exception) -> None:
        super().__init__(8)
        self.error = error

    def embed(self, texts: Sequence[str]) -> Any:
        raise self.error


def cause_of(error: Exception, texts: Sequence[str] = TEXTS) -> str:
    with pytest.raises(causes.EmbedderFailedError) as failed:
        causes.Guarded(Raises(error)).embed(list(texts))
    return causes.of(failed.value)


def test_the_cause_is_the_type_and_message_of_what_the_embedder_raised() -> None:
    assert cause_of(RuntimeError("CUDA out of\n memory")) == "RuntimeError: CUDA out of memory"
    assert cause_of(MemoryError()) == "MemoryError"
    long = cause_of(RuntimeError("x" * 1000))
    assert len(long) == causes.MAX_CAUSE_CHARS and long.endswith("…")


@pytest.mark.parametrize(
    "message",
    [
        f"cannot embed {TEXTS[0]!r}",
        "token 9 of 'Ada's PIN is 44' is unknown",  # a piece of it
        "bad input: ADA'S PIN IS 4417",  # another case
        "cannot embed 'ok'",  # a short text, quoted
    ],
)
def test_a_message_that_quotes_a_text_is_left_out(message: str) -> None:
    assert cause_of(ValueError(message)) == (
        "ValueError (its message quoted a record's text and is not kept)"
    )


def test_other_errors_keep_their_type_and_engrams_their_message() -> None:
    assert causes.of(KeyError("Ada's PIN is 4417")) == "KeyError"
    mismatch = EmbeddingMismatchError("embedder m returned 3 vectors for 4 texts")
    assert causes.of(mismatch) == (
        "EmbeddingMismatchError: embedder m returned 3 vectors for 4 texts"
    )


def test_an_embedder_that_breaks_mid_way_shows_its_cause_everywhere(
    fresh_store: Store,
    fresh_dsn: str,
    redis_url: str,
    jobs_processes: Callable[..., JobsProcess],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    mem = fresh_store.session({"user_id": "ada"}, embedder=HashingEmbedder(64))
    for i in range(20):
        mem.remember(f"Ada's secret note number {i}.")
    settings = {
        "ENGRAM_EMBEDDERS": FAULTY_PLUGINS,
        "ENGRAM_REEMBED_BATCH_SIZE": "5",
        "ENGRAM_REEMBED_RETRY": "off",
    }
    for name, value in settings.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("DATABASE_URL", fresh_dsn)
    monkeypatch.setenv("REDIS_URL", redis_url)
    monkeypatch.setenv("ENGRAM_PARTITIONS", str(FAST.partitions))
    jobs_processes(
        database_url=fresh_dsn,
        redis_url=redis_url,
        env={**settings, "ENGRAM_TEST_EMBED_BREAK_AFTER": "10"},  # two batches, then down
    )

    assert main(["reembed", "--model", "breaks"]) == 1
    err = capsys.readouterr().err
    cause = f"RuntimeError: {BREAKS_WITH}"
    assert f"engram: reembed failed: {cause}" in err

    [failed] = [g for g in fresh_store.embeddings.all() if g.model_id == "breaks-24"]
    p = Progress.from_dict(failed.progress)
    assert p is not None and (p.state, p.message) == ("failed", cause)
    assert p.done == 10 and p.errors >= 3, "two batches stored before it broke"
    assert "secret note" not in json.dumps(failed.progress)

    client = connect_redis(redis_url)
    job = rqjobs.get(client, p.job_id)
    assert job is not None and job.state == "failed"
    with TestClient(make_app(fresh_store, client), base_url=BASE_URL) as http:
        sign_in(http, "local")
        row = http.get("/generations").text
        assert f'<b>root cause:</b> <span class="mono">{cause}</span>' in row
        jobs = http.get(f"/api/v1/jobs?queue={keys.REEMBED_QUEUE}&state=failed").json()
        [listed] = [j for j in jobs["items"] if j["id"] == p.job_id]
        assert listed["error"].endswith(f"re-embedding slice failed: {cause}")
        page = http.get(f"/jobs?queue={keys.REEMBED_QUEUE}&state=failed").text
        assert f"re-embedding slice failed: {cause}" in page
    client.close()


def test_a_failed_jobs_error_says_its_cause_and_quotes_no_text() -> None:
    """Issue 42, item 5: a failed job's error named the cause's type only ("prune failed
    (InvalidRequestError)"); it says engram's content-free message, and of any other
    error its type alone."""

    def failing(exc: Exception) -> Any:
        @content_free("prune")
        def job() -> None:
            raise exc

        with pytest.raises(JobFailedError) as raised:
            job()
        return raised.value.message

    assert failing(InvalidRequestError("prune one of records, not 'x'")) == (
        "prune failed: InvalidRequestError: prune one of records, not 'x'"
    )
    assert failing(ValueError("Ada's PIN is 4417")) == "prune failed: ValueError"
    assert failing(psycopg.errors.UniqueViolation("Key (text)=(Ada's PIN)")) == (
        "prune failed: UniqueViolation (SQLSTATE 23505)"
    )
