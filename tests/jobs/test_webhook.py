"""The webhook listener against a real local HTTP server: 2xx is delivered; a redirect
is a failed delivery (not followed: urllib would re-send it as a GET, events dropped,
and count the GET's answer as delivered); so is any other answer."""

from __future__ import annotations

import threading
import urllib.error
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import ClassVar

import pytest

from engram.jobs.listeners.webhook import WebhookListener
from engram.store import ForgetEvent, Scope

EVENT = ForgetEvent(Scope(user_id="ada"), "mem_1", (1, 2), "op-1", False)


class _Receiver(BaseHTTPRequestHandler):
    seen: ClassVar[list[tuple[str, str]]] = []

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self._answer("POST")

    def do_GET(self) -> None:
        self._answer("GET")

    def _answer(self, method: str) -> None:
        self.seen.append((method, self.path))
        if self.path == "/moved":
            self.send_response(302)
            self.send_header("Location", "/landing")
        elif self.path == "/teapot":
            self.send_response(418)
        else:
            self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    _Receiver.seen = []
    httpd = HTTPServer(("127.0.0.1", 0), _Receiver)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()
    thread.join()


def test_a_2xx_is_delivered(server: str) -> None:
    WebhookListener(server + "/hook", "secret")([EVENT])
    assert _Receiver.seen == [("POST", "/hook")]


def test_a_redirect_is_a_failed_delivery_and_is_not_followed(server: str) -> None:
    with pytest.raises(urllib.error.HTTPError) as failed:
        WebhookListener(server + "/moved", "secret")([EVENT])
    failed.value.close()
    assert failed.value.code == 302
    assert _Receiver.seen == [("POST", "/moved")]  # no GET of /landing


def test_any_other_answer_is_a_failed_delivery(server: str) -> None:
    with pytest.raises(urllib.error.HTTPError) as failed:
        WebhookListener(server + "/teapot", "secret")([EVENT])
    failed.value.close()
    assert failed.value.code == 418
