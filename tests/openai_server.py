"""A small OpenAI-compatible chat-completions server on loopback, for the tests and
the benchmark: it records every request and answers what ``respond`` says."""

from __future__ import annotations

import json
import select
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Reply:
    status: int = 200
    body: Any = None  # JSON-encoded unless bytes
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    # Write the answer a byte every ``trickle_s`` (the head at once when not
    # ``trickle_head``), until done or the client hangs up.
    trickle_s: float = 0.0
    trickle_head: bool = True


@dataclass(frozen=True)
class Request:
    path: str
    headers: dict[str, str]  # lower-cased names
    body: Any


def chat(content: str | None, *, prompt_tokens: int = 12, completion_tokens: int = 7) -> Reply:
    """A chat completion whose message holds ``content``."""
    return Reply(
        body={
            "id": "chatcmpl-test",
            "object": "chat.completion",
            "model": "fake-model",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": content},
                    "finish_reason": "stop",
                }
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }
    )


Respond = Callable[[Request], Reply]


class OpenAIServer:
    """``with OpenAIServer(respond) as server:`` serves on ``server.url`` until the block ends."""

    def __init__(self, respond: Respond) -> None:
        self.respond = respond
        self.requests: list[Request] = []
        self.hung_up = threading.Event()  # a client closed a connection mid-trickle
        self._seen = threading.Condition()  # a request recorded
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as real endpoints
            # Headers and body go in two writes: with Nagle's algorithm the body would
            # wait for the client's delayed ACK of the headers (40 ms).
            disable_nagle_algorithm = True

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = raw
                request = Request(self.path, {k.lower(): v for k, v in self.headers.items()}, body)
                with server._seen:
                    server.requests.append(request)
                    server._seen.notify_all()
                reply = server.respond(request)
                if reply.delay_s:
                    time.sleep(reply.delay_s)
                payload = (
                    reply.body if isinstance(reply.body, bytes) else json.dumps(reply.body).encode()
                )
                if reply.trickle_s:
                    self._trickle(reply, payload)
                    return
                try:
                    self.send_response(reply.status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    for name, value in reply.headers.items():
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (a timeout): nothing to answer

            def _trickle(self, reply: Reply, payload: bytes) -> None:
                self.close_connection = True
                head = (
                    f"HTTP/1.1 {reply.status} OK\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(payload)}\r\n\r\n"
                ).encode()
                conn: socket.socket = self.connection
                if not reply.trickle_head:
                    conn.sendall(head)
                    head = b""
                for byte in head + payload:
                    # Wait a byte's interval, or until the client hangs up (readable at EOF).
                    readable, _, _ = select.select([conn], [], [], reply.trickle_s)
                    try:
                        if readable and not conn.recv(1, socket.MSG_PEEK):
                            break
                        conn.sendall(bytes([byte]))
                    except OSError:
                        break
                else:
                    return
                server.hung_up.set()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def received(self, count: int, timeout_s: float = 10.0) -> list[Request]:
        """The requests recorded, once there are ``count`` (or ``timeout_s`` has passed).
        A client that gave up on an attempt may have done so before this server read
        it: its request is recorded a little later, and counting at once would miss it."""
        with self._seen:
            self._seen.wait_for(lambda: len(self.requests) >= count, timeout_s)
            return list(self.requests)

    def start(self) -> OpenAIServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def __enter__(self) -> OpenAIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def scripted(*replies: Reply) -> Respond:
    """Answer with ``replies`` in turn, then with the last one again."""
    queue = list(replies)

    def respond(request: Request) -> Reply:
        return queue.pop(0) if len(queue) > 1 else queue[0]

    return respond
