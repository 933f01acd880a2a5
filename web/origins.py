"""Where a request says it comes from: the Host it was sent to and the Origin of the
page that sent it, checked against DNS rebinding and cross-site requests. One home
for both checks, used by the dashboard's gate and by ``/mcp`` (routed before it).

A DNS-rebinding page reaches a loopback server under its own name: its requests say
``Host: evil.example``, refused unless that name is one this server answers to
(``ENGRAM_DASHBOARD_HOSTS``; by default the loopback names when bound to loopback).
A page of another site sending straight to ``127.0.0.1`` says ``Origin:
http://evil.example``, refused because it is not the Host's own.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from starlette.requests import HTTPConnection

from .errors import BadRequestError, ForbiddenError


class Hosts:
    """The Host names this server answers to (``*``: any)."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = None if "*" in names else {n.lower() for n in names}

    def check(self, conn: HTTPConnection) -> None:
        """``BadRequestError`` (400) for a Host this server does not answer to."""
        if self.names is None:
            return
        host = conn.headers.get("host", "").lower()
        name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
        if name not in self.names:
            raise BadRequestError(
                "this server does not answer to that Host: see ENGRAM_DASHBOARD_HOSTS"
            )


def foreign_origin(conn: HTTPConnection) -> bool:
    """Whether the request carries an Origin other than its own Host's (``null``, as
    a sandboxed or file page sends, included). No Origin: not a browser's cross-site
    request."""
    origin = conn.headers.get("origin")
    if origin is None:
        return False
    host = conn.headers.get("host", "")
    return origin == "null" or urlsplit(origin).netloc.lower() != host.lower()


def check_origin(conn: HTTPConnection) -> None:
    """``ForbiddenError`` (403) for a request from another site's page, whatever its
    method (the MCP transport's rule: every request, reads included)."""
    if foreign_origin(conn):
        raise ForbiddenError("this server does not answer pages of another origin")
