"""Signing in with a name and the dashboard's token, or with a one-time sign-in link
(``web.signin``); signing out."""

from __future__ import annotations

import logging
import time

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from .. import auth_refusals, signin
from ..auth import SESSION_COOKIE, operator_name
from ..errors import BadRequestError
from ..params import Query
from ..state import WebState, web_of

log = logging.getLogger("engram.web")

# Who a sign-in link signs in: the owner of the home it was printed for.
LINK_OPERATOR = "local"


def login_page(request: Request) -> Response:
    web = web_of(request)
    query = Query.of(request, "next", "code")
    target = safe_next(query.text("next", max_chars=2000))
    if not web.config.needs_token:
        return RedirectResponse(target, status_code=303)
    code = query.text("code", max_chars=200)
    if code is not None:
        return _follow_link(request, web, code, target)
    return web.render.page(request, "login.html", next=target, failed=None, name="")


def _follow_link(request: Request, web: WebState, code: str, target: str) -> Response:
    """A sign-in link: a session for ``LINK_OPERATOR`` and a redirect (the code leaves
    the address bar), once; a used, expired or forged one is the sign-in page, 401."""
    now_s = time.time()
    found = signin.read(web.auth.keys.signin, code, now_s=now_s)
    if found is None or not signin.spend(web.services.redis, found, now_s=now_s):
        auth_refusals.note(
            web.services.redis, door="dashboard", reason="link", path=request.url.path
        )
        return web.render.page(
            request, "login.html", status_code=401, next=target, failed="link", name=""
        )
    log.info("signed in by a sign-in link", extra={"operator": LINK_OPERATOR})
    return _signed_in(request, web, LINK_OPERATOR, target)


def login(request: Request, form: dict[str, str]) -> Response:
    web = web_of(request)
    target = safe_next(form.get("next"))
    name = operator_name(form.get("name", ""))
    if not web.auth.check_token(form.get("token", "")):
        auth_refusals.note(
            web.services.redis, door="dashboard", reason="wrong_token", path=request.url.path
        )
        return web.render.page(
            request, "login.html", status_code=401, next=target, failed="token", name=name
        )
    log.info("signed in", extra={"operator": name})
    return _signed_in(request, web, name, target)


def _signed_in(request: Request, web: WebState, name: str, target: str) -> Response:
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
