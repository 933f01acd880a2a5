"""A stop request made by a signal handler wakes the main thread, whatever that thread
was doing in its wait: ``engram worker`` and ``engram up`` stop on SIGTERM."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

from engram.worker.consuming.stopping import StopRequest
from tests.redis_fixtures import REPO

# A timer signal, a few hundred microseconds apart, lands anywhere in the main thread's
# short waits, among them the moment ``threading.Event.wait`` holds its lock (with an
# Event in its place, this deadlocks within a few hundred rounds).
_SIGNALLED_WAITS = """
import random, signal, sys
from engram.worker.consuming.stopping import StopRequest

current = None

def on_alarm(signum, frame):
    current.set()

signal.signal(signal.SIGALRM, on_alarm)
for _ in range(int(sys.argv[1])):
    current = StopRequest()
    signal.setitimer(signal.ITIMER_REAL, random.uniform(0.0001, 0.002))
    while not current.wait(0.0001):
        pass
print("all stopped")
"""


def test_a_request_set_by_a_signal_handler_never_hangs_the_thread_it_interrupts() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _SIGNALLED_WAITS, "2000"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "all stopped"


def test_a_request_from_another_thread_wakes_the_waiter_at_once() -> None:
    request = StopRequest()
    assert not request.is_set() and not request.wait(0.01)
    woke: list[float] = []

    def waiter() -> None:
        request.wait(60)
        woke.append(time.monotonic())

    thread = threading.Thread(target=waiter)
    thread.start()
    time.sleep(0.1)
    set_at = time.monotonic()
    request.set()
    thread.join(10)
    assert woke and woke[0] - set_at < 5  # woken by the set, not by its minute running out
    assert request.is_set() and request.wait(60)  # once set, set for good: no wait
    request.set()  # again: harmless
