"""Signing in with a name and the dashboard's token; signing out."""

from __future__ import annotations

import logging

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from ..auth import SESSION_COOKIE, operator_name
from ..errors import BadRequestError
from ..params import Query
from ..state import web_of

log = logging.getLogger("engram.web")


def login_page(request: Request) -> Response:
    web = web_of(request)
    target = safe_next(Query.of(request, "next").text("next", max_chars=2000))
    if not web.config.needs_token:
        return RedirectResponse(target, status_code=303)
    return web.render.page(request, "login.html", next=target, failed=False, name="")


def login(request: Request, form: dict[str, str]) -> Response:
    web = web_of(request)
    target = safe_next(form.get("next"))
    name = operator_name(form.get("name", ""))
    if not web.auth.check_token(form.get("token", "")):
        log.warning("sign-in refused", extra={"operator": name})
        return web.render.page(
            request, "login.html", status_code=401, next=target, failed=True, name=name
        )
    log.info("signed in", extra={"operator": name})
    response = RedirectResponse(target, status_code=303)
    response.set_cookie(
        SESSION_COOKIE,
        web.auth.new_session(name),
        max_age=web.config.session_ttl_s,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        path="/",
    )
    return response


def logout(request: Request, form: dict[str, str]) -> Response:
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(SESSION_COOKIE, path="/")
    return response


def safe_next(value: str | None) -> str:
    """Where to go after signing in: a path of this site only (no open redirect)."""
    if not value:
        return "/"
    if not value.startswith("/") or value.startswith("//") or "\\" in value:
        raise BadRequestError("next must be a path on this site")
    return value
