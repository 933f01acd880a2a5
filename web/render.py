"""Rendering pages and their partials with Jinja2, autoescaping everything.

A view names the page template and the partial of the region htmx swaps: the
same view answers with the whole page, or with the partial alone when the
request comes from htmx (``HX-Request``), so the page works without
JavaScript and updates in place with it.
"""

from __future__ import annotations

import json
import re
import unicodedata
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, urlencode

import jinja2
from markupsafe import Markup, escape
from starlette.requests import Request
from starlette.responses import HTMLResponse

from engram.jobs.progress import generation_status
from engram.store.values import Scope

from .csrf import Csrf


def is_htmx(request: Request) -> bool:
    return request.headers.get("hx-request") == "true"


class Renderer:
    def __init__(self, csrf: Csrf, *, needs_token: bool) -> None:
        self.csrf = csrf
        self.needs_token = needs_token
        self.env = jinja2.Environment(
            loader=jinja2.PackageLoader("engram.web", "templates"),
            autoescape=True,  # every template, whatever its name
            undefined=jinja2.StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
            # No bidirectional control anywhere a page shows a value, text or attribute
            # (a name, a reason, a scope's value, an id: a person or an agent chose
            # them): each is a visible marker. A form's value keeps them (``as_typed``).
            finalize=controls_shown,
        )
        self.env.filters.update(
            path=path_quote,
            time=format_time,
            ms_time=lambda ms: format_time(datetime.fromtimestamp(ms / 1000, UTC)),
            ago=ago,
            scope_label=scope_label,
            scope_text=scope_text,
            pretty=pretty_json,
            clip=clip,
            qs=query_string,
            number=number,
            bidi=bidi_visible,
            memory=memory_text,
            supplied=supplied_text,
            as_typed=as_typed,
            detail_value=detail_value,
        )
        # A generation's status as its re-embedding's outcome allows (``jobs.progress``).
        self.env.globals["generation_status"] = generation_status

    def page(
        self,
        request: Request,
        template: str,
        partial: str | None = None,
        *,
        status_code: int = 200,
        **context: Any,
    ) -> HTMLResponse:
        name = partial if partial is not None and is_htmx(request) else template
        html = self.env.get_template(name).render(
            request=request,
            operator=getattr(request.state, "operator", None),
            csrf_token=self.csrf.token(request),
            needs_token=self.needs_token,
            now=datetime.now(UTC),
            **context,
        )
        response = HTMLResponse(html, status_code=status_code)
        response.headers["vary"] = "HX-Request"
        self.csrf.finish(request, response)
        return response


def path_quote(value: object) -> str:
    """A value as one URL path segment (ids may hold ``/``, ``?``, ``#``); ``:`` and ``@``
    may stay as they are in a path."""
    return quote(str(value), safe=":@")


def query_string(params: dict[str, Any]) -> str:
    """``?a=1&b=2`` of the values that are set, or an empty string."""
    kept = {k: v for k, v in params.items() if v not in (None, "")}
    return "?" + urlencode(kept) if kept else ""


def format_time(value: datetime | None) -> str:
    if value is None:
        return ""
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def ago(value: datetime | None, now: datetime | None = None) -> str:
    if value is None:
        return "never"
    seconds = ((now or datetime.now(UTC)) - value).total_seconds()
    if seconds < 0:
        return "just now"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{int(seconds // size)} {unit} ago"
    return f"{int(seconds)} s ago"


def scope_text(scope: Scope) -> str:
    """A scope's pairs as plain text, for a page's title (its controls shown as markers
    when printed: ``controls_shown``)."""
    return ", ".join(f"{k}={v}" for k, v in scope.as_dict().items())


def scope_label(scope: Scope) -> Markup:
    """A scope's ``field=value`` pairs, each value as a person or an agent supplied it
    (``supplied_text``): a ``chat_id`` of ``"\u202eevil"`` cannot show as ``live``."""
    return Markup(", ").join(
        Markup("{}=").format(k) + supplied_text(v) for k, v in scope.as_dict().items()
    )


def pretty_json(value: object) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


def detail_value(value: object) -> str:
    """An audit row's detail value as JSON writes it (``null``, ``true``, ``3``), a word
    as it is, and text that could be read as one of those (or holds spaces) quoted."""
    if value is None or isinstance(value, bool | int | float):
        return json.dumps(value)
    text = str(value)
    if text in ("", "null", "true", "false") or any(c.isspace() or c == '"' for c in text):
        return json.dumps(text, ensure_ascii=False)
    try:
        float(text)
    except ValueError:
        return text
    return json.dumps(text)


def clip(value: str, limit: int = 160) -> str:
    return value if len(value) <= limit else value[: limit - 1] + "…"


def number(value: int | float | None) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and not value.is_integer():
        return f"{value:,.1f}"
    return f"{int(value):,}"


# The bidirectional controls (embeddings, overrides, isolates, marks): invisible, and
# U+202E (RIGHT-TO-LEFT OVERRIDE) in memory text would show it, and what follows it on
# the line, reversed (a known spoofing trick). They are shown as what they are.
BIDI_CONTROLS = {
    "\u061c": "ALM",
    "\u200e": "LRM",
    "\u200f": "RLM",
    "\u202a": "LRE",
    "\u202b": "RLE",
    "\u202c": "PDF",
    "\u202d": "LRO",
    "\u202e": "RLO",
    "\u2066": "LRI",
    "\u2067": "RLI",
    "\u2068": "FSI",
    "\u2069": "PDI",
}
_BIDI = re.compile("[" + "".join(BIDI_CONTROLS) + "]")


def bidi_visible(value: object) -> Markup:
    """``value`` escaped, each bidirectional control in it replaced by a visible marker
    (``⟨RLO⟩``), so no character of the data can reorder what the page shows."""

    def marker(found: re.Match[str]) -> str:
        char = found[0]
        return (
            f'<span class="bidi-control" title="U+{ord(char):04X}, a bidirectional control">'
            f"\u27e8{BIDI_CONTROLS[char]}\u27e9</span>"
        )

    return Markup(_BIDI.sub(marker, str(escape(value))))


def memory_text(value: object) -> Markup:
    """Memory text as a page shows it: its bidi controls visible, and isolated
    (``<bdi>``) so a right-to-left text cannot reorder the page around it."""
    return Markup('<bdi class="memory">') + bidi_visible(value) + Markup("</bdi>")


def supplied_text(value: object) -> Markup:
    """A string a person or an agent supplied (a name, a reason, a scope's value, an id)
    as memory text is shown: isolated, its bidi controls visible markers. Text that
    cannot change the direction of what is around it (no right-to-left letter, no
    control: every ASCII string) needs no isolating element, and gets none."""
    text = str(value)
    if text.isascii() or not (
        _BIDI.search(text) or any(unicodedata.bidirectional(c) in _REORDERING for c in text)
    ):
        return escape(text)
    return Markup('<bdi class="supplied">') + bidi_visible(text) + Markup("</bdi>")


# The bidirectional classes of characters that reorder a line: right-to-left letters,
# Arabic digits, and the controls (embeddings, overrides, isolates; ``BIDI_CONTROLS``).
_REORDERING = frozenset(
    ("R", "AL", "AN", "LRE", "LRO", "RLE", "RLO", "PDF", "LRI", "RLI", "FSI", "PDI")
)


def controls_shown(value: object) -> object:
    """Every value a template prints (``finalize``): text that is not yet markup has each
    bidi control replaced by its marker as plain text, safe in an attribute too."""
    if isinstance(value, str) and not isinstance(value, Markup):
        return _BIDI.sub(lambda found: f"\u27e8{BIDI_CONTROLS[found[0]]}\u27e9", value)
    return value


def as_typed(value: object) -> Markup:
    """A form field's value exactly as it was typed or read, controls included (escaped
    but not marked), so that sending the form again sends the same value."""
    return escape("" if value is None else value)
