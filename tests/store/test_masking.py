"""Settings keep their secrets out of repr: a repr ends in logs and tracebacks."""

from __future__ import annotations

import pytest

from engram.jobs.listeners.webhook import WebhookListener
from engram.jobs.settings import JobsSettings
from engram.store import LLMConfig
from engram.store.masking import mask_url
from engram.web.config import WebConfig
from engram.worker.settings import Settings

SECRET = "s3cret-Pa55word-0123456789"


def test_the_workers_settings_mask_the_passwords_in_their_urls() -> None:
    settings = Settings.from_env(
        {
            "DATABASE_URL": f"postgresql://ada:{SECRET}@db.internal:5432/engram",
            "REDIS_URL": f"redis://:{SECRET}@cache.internal:6379/0",
            "ENGRAM_LLM_URL": f"https://bot:{SECRET}@llm.internal/v1",
            "ENGRAM_LLM_MODEL": "m",
            "ENGRAM_LLM_API_KEY": SECRET,
        }
    )
    text = repr(settings)
    assert SECRET not in text
    # still useful: who, where
    assert "postgresql://ada:***@db.internal:5432/engram" in text
    assert "redis://:***@cache.internal:6379/0" in text
    assert "https://bot:***@llm.internal/v1" in text
    assert "api_key" not in text and "model='m'" in text
    assert settings.database_url == f"postgresql://ada:{SECRET}@db.internal:5432/engram"


def test_an_llm_config_hides_its_api_key() -> None:
    config = LLMConfig(url="https://api.example/v1", model="m", api_key=SECRET)
    assert SECRET not in repr(config) and SECRET not in str(config)
    assert config.api_key == SECRET


def test_the_jobs_settings_hide_the_webhook_secret() -> None:
    settings = JobsSettings.from_env(
        {
            "ENGRAM_FORGET_WEBHOOK_URL": f"https://hooks.example/forget?token={SECRET}&v=1",
            "ENGRAM_FORGET_WEBHOOK_SECRET": SECRET,
        }
    )
    text = repr(settings)
    assert SECRET not in text
    assert "https://hooks.example/forget?token=***&v=1" in text
    listener = WebhookListener.configured(settings.redaction)
    assert SECRET not in repr(listener)


def test_the_dashboards_config_hides_its_token() -> None:
    config = WebConfig(host="0.0.0.0", token=SECRET)
    assert SECRET not in repr(config) and "0.0.0.0" in repr(config)


@pytest.mark.parametrize(
    "url, shown",
    [
        (f"postgresql://ada:{SECRET}@h/db", "postgresql://ada:***@h/db"),
        (f"redis://:{SECRET}@h:6379", "redis://:***@h:6379"),
        (f"https://{SECRET}@h/x", "https://***@h/x"),  # a lone user may be a token
        (f"postgresql://h/db?sslmode=require&password={SECRET}", None),
        (
            f"host=h dbname=engram password={SECRET} user=ada",
            "host=h dbname=engram password=*** user=ada",
        ),
        (f"host=h password='{SECRET} x' user=ada", "host=h password=*** user=ada"),
        (f"http://[::1:{SECRET}@h", "***"),  # unreadable: nothing shown
        ("postgresql://ada@h/db", "***@h/db"),
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
    ],
)
def test_a_url_is_shown_without_its_password(url: str, shown: str | None) -> None:
    masked = mask_url(url)
    assert SECRET not in masked
    if shown is not None:
        assert masked.endswith(shown)


def test_a_url_with_nothing_secret_is_printed_as_it_is() -> None:
    for url in (
        "redis://127.0.0.1:6390/0",
        "postgresql://postgres:@/postgres?host=/home/postgres",  # the embedded one's
        "host=db user=ada",
    ):
        assert mask_url(url) == url
