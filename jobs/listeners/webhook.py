"""The webhook listener: forget events POSTed to your URL, signed.

Body: ``{"events": [{"scope", "record_id", "revisions", "operation_id",
"already_forgotten"}, ...]}`` (ids only). Headers: ``X-Engram-Timestamp`` (unix
seconds) and ``X-Engram-Signature: sha256=<hex>``, the HMAC-SHA256 of
``<timestamp>.<body>`` with ``ENGRAM_FORGET_WEBHOOK_SECRET``. A receiver
recomputes it over the raw body (``verify``) and refuses old timestamps. Any
answer but 2xx (a redirect too: it is not followed), or none within 10 s, is a
failure: the redaction job is retried (``ENGRAM_REDACTION_RETRY``), so a
receiver must accept an event twice.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field

from engram.store import ForgetEvent
from engram.store.errors import InvalidRequestError
from engram.store.masking import MASKED_URL, masked_repr

from .. import events as event_json
from ..settings import Redaction

TIMESTAMP_HEADER = "X-Engram-Timestamp"
SIGNATURE_HEADER = "X-Engram-Signature"


def sign(secret: str, timestamp: int, body: bytes) -> str:
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"sha256={mac.hexdigest()}"


def verify(
    secret: str,
    timestamp: str,
    body: bytes,
    signature: str,
    *,
    tolerance_s: float = 300,
    now: float | None = None,
) -> bool:
    """What a receiver checks: the signature, and a timestamp within ``tolerance_s``."""
    try:
        stamp = int(timestamp)
    except ValueError:
        return False
    if abs((time.time() if now is None else now) - stamp) > tolerance_s:
        return False
    return hmac.compare_digest(sign(secret, stamp, body), signature)


@dataclass(frozen=True, slots=True)
class WebhookListener:
    url: str = field(metadata=MASKED_URL)
    secret: str = field(repr=False)
    timeout_s: float = 10.0
    name: str = "webhook"

    __repr__ = masked_repr

    @classmethod
    def configured(cls, config: Redaction) -> WebhookListener:
        if not config.webhook_url or not config.webhook_secret:
            raise InvalidRequestError(
                "the webhook listener needs ENGRAM_FORGET_WEBHOOK_URL and "
                "ENGRAM_FORGET_WEBHOOK_SECRET"
            )
        if not config.webhook_url.startswith(("http://", "https://")):
            raise InvalidRequestError("ENGRAM_FORGET_WEBHOOK_URL must be an http(s) URL")
        return cls(config.webhook_url, config.webhook_secret)

    def __call__(self, events: Sequence[ForgetEvent]) -> None:
        body = json.dumps(
            {"events": [event_json.to_dict(e) for e in events]}, separators=(",", ":")
        ).encode()
        timestamp = int(time.time())
        request = urllib.request.Request(
            self.url,
            data=body,
            method="POST",
            headers={
                "Content-Type": "application/json",
                "User-Agent": "engram-forget-webhook",
                TIMESTAMP_HEADER: str(timestamp),
                SIGNATURE_HEADER: sign(self.secret, timestamp, body),
            },
        )
        # The opener raises for an answer that is not 2xx (HTTPError; a redirect too, as
        # it is not followed), or none (URLError).
        with _OPENER.open(request, timeout=self.timeout_s) as answer:
            answer.read()
            if not 200 <= answer.status < 300:
                raise urllib.error.HTTPError(
                    "webhook", answer.status, "not 2xx", answer.headers, None
                )


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A redirect is a failed delivery, not a place to go: urllib would follow a 302
    with a GET (the events dropped) and count the GET's 200 as delivered."""

    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirects)
