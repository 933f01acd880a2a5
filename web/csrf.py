"""Cross-site request forgery: every form that changes something carries a token.

The token is an HMAC of a nonce: a signed-in person's session nonce, or else a
random nonce in the ``engram_csrf`` cookie (SameSite=Strict, HttpOnly), set
the first time a page is shown. A cross-site page can neither read the token
nor set the cookie, so it cannot forge a form post. On top of that, any
request that changes something and says it comes from another site (the
``Origin`` or ``Sec-Fetch-Site`` headers browsers send) is refused outright;
the JSON API also needs ``Content-Type: application/json``, which a cross-site
form cannot send without a preflight this server never grants.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from starlette.requests import HTTPConnection, Request
from starlette.responses import Response

from .auth import Operator
from .errors import ForbiddenError
from .origins import foreign_origin

CSRF_COOKIE = "engram_csrf"
CSRF_FIELD = "csrf"
UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


class Csrf:
    def __init__(self, key: bytes) -> None:
        self.key = key

    def token(self, request: Request) -> str:
        """The token forms on this page carry (a new cookie nonce is set by ``finish``)."""
        return self._sign(self._nonce(request))

    def check(self, request: Request, given: str | None) -> None:
        operator: Operator | None = getattr(request.state, "operator", None)
        nonce = operator.nonce if operator and operator.nonce else request.cookies.get(CSRF_COOKIE)
        if not given or not nonce or not hmac.compare_digest(given, self._sign(nonce)):
            raise ForbiddenError(
                "this form's CSRF token is missing or wrong: reload the page and try again"
            )

    def finish(self, request: Request, response: Response) -> None:
        """Set the cookie nonce a token on this response was made from, if it is new."""
        nonce = getattr(request.state, "csrf_new_nonce", None)
        if nonce:
            response.set_cookie(
                CSRF_COOKIE,
                nonce,
                httponly=True,
                samesite="strict",
                secure=request.url.scheme == "https",
                path="/",
            )

    def _nonce(self, request: Request) -> str:
        operator: Operator | None = getattr(request.state, "operator", None)
        if operator is not None and operator.nonce:
            return operator.nonce
        nonce = request.cookies.get(CSRF_COOKIE) or getattr(request.state, "csrf_new_nonce", None)
        if not nonce or len(nonce) > 64:
            nonce = secrets.token_urlsafe(24)
            request.state.csrf_new_nonce = nonce
        return nonce

    def _sign(self, nonce: str) -> str:
        return hmac.new(self.key, nonce.encode(), hashlib.sha256).hexdigest()[:40]


def check_same_origin(conn: HTTPConnection) -> None:
    """Refuse a request that changes something and comes from another site."""
    if conn.scope.get("method") not in UNSAFE_METHODS:
        return
    if conn.headers.get("sec-fetch-site") in ("cross-site", "same-site"):
        raise ForbiddenError("cross-site requests may not change anything")
    if foreign_origin(conn):
        raise ForbiddenError("cross-site requests may not change anything")
