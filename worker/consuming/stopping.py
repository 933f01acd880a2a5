"""A stop request a signal handler may make: ``StopRequest``.

``threading.Event.set`` takes the lock of the Event's condition, which a thread
waiting in ``Event.wait`` holds for a moment each time it wakes (its timeout
ran out, or it was notified). A signal handler runs in the main thread between
two bytecodes, so when the main thread is itself in ``Event.wait``, in that
moment, the handler's ``set`` waits for a lock its own thread holds: forever.
(Seen: a worker given SIGTERM mid-tick that never stopped, and was killed 30 s
later by ``engram up``.)

``StopRequest`` takes no lock: ``set`` assigns a flag and writes a byte to a
pipe, ``wait`` sleeps in ``select`` on that pipe. Any thread, or a handler,
may set it; the waiter wakes at once.
"""

from __future__ import annotations

import contextlib
import os
import select
import weakref


class StopRequest:
    """A one-way flag (set once, set for good) that wakes its waiters; safe to ``set``
    from a signal handler or from any thread."""

    def __init__(self) -> None:
        self._flag = False
        read, write = os.pipe()
        os.set_blocking(write, False)
        self._read = read
        self._write = write
        # Closed with the object: a late ``set`` never writes to a descriptor reused.
        weakref.finalize(self, _close, read, write)

    def set(self) -> None:
        self._flag = True
        with contextlib.suppress(BlockingIOError):  # full: its waiters are woken already
            os.write(self._write, b"\0")

    def is_set(self) -> bool:
        return self._flag

    def wait(self, timeout_s: float) -> bool:
        """Sleep until set, at most ``timeout_s``; whether it is set. The byte stays in
        the pipe, so every later wait returns at once too."""
        if not self._flag:
            select.select([self._read], [], [], max(timeout_s, 0.0))
        return self._flag


def _close(*fds: int) -> None:
    for fd in fds:
        os.close(fd)
