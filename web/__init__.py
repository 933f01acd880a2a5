"""The dashboard (Jinja2 + vendored htmx) and the JSON API under /api/v1.

>>> app = create_app(WebConfig(), Services(store=..., redis=..., producer=...))

Reads go to the store (``Store.browse``) and Redis; every write goes through
the ``Producer`` onto the streams. Nothing connects at import time.
"""

from .app import create_app
from .config import WebConfig
from .services import ReembedStarter, Services

__all__ = ["ReembedStarter", "Services", "WebConfig", "create_app"]
