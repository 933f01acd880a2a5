"""Secrets kept out of what gets printed: settings' reprs end in logs, tracebacks
and bug reports.

A settings dataclass marks a secret field ``field(repr=False)`` (an API key, a
token) or, for a URL that may carry a password, ``field(metadata=MASKED_URL)``,
and takes ``__repr__ = masked_repr``: the URL is shown with its password masked.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any
from urllib.parse import urlsplit, urlunsplit

MASK = "***"
MASKED_URL = {"masked": "url"}

# Query parameters that carry a credential (libpq's ``?password=``, a ``?token=``).
_SECRET_PARAM = re.compile(r"pass|secret|token|key|sig|auth|credential", re.IGNORECASE)
# A libpq keyword DSN: ``host=db password=s3cret`` or ``password='s 3'``.
_KEYWORD_PASSWORD = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S*)", re.IGNORECASE)


def mask_url(url: str) -> str:
    """``redis://:s3cret@host:6379/0`` -> ``redis://:***@host:6379/0``; a user
    without a password may be a token (``https://TOKEN@host``): masked whole."""
    if "://" not in url:
        return _KEYWORD_PASSWORD.sub(lambda m: m.group(1) + MASK, url)
    try:
        parts = urlsplit(url)
    except ValueError:
        return MASK  # not a URL we can read: nothing of it is shown
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, host = netloc.rpartition("@")
        user, colon, password = userinfo.partition(":")
        if not colon:
            netloc = f"{MASK}@{host}"
        elif password:  # an empty one (the embedded PostgreSQL's) hides nothing
            netloc = f"{user}:{MASK}@{host}"
    query = "&".join(_masked_param(p) for p in parts.query.split("&")) if parts.query else ""
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def _masked_param(param: str) -> str:
    name, equals, _value = param.partition("=")
    return f"{name}={MASK}" if equals and _SECRET_PARAM.search(name) else param


def masked_repr(self: Any) -> str:
    """A dataclass's repr as ``dataclasses`` writes it, with ``repr=False`` fields left
    out and ``MASKED_URL`` fields masked."""
    shown = []
    for f in dataclasses.fields(self):
        if not f.repr:
            continue
        value = getattr(self, f.name)
        if f.metadata.get("masked") == "url" and isinstance(value, str):
            value = mask_url(value)
        shown.append(f"{f.name}={value!r}")
    return f"{type(self).__qualname__}({', '.join(shown)})"
