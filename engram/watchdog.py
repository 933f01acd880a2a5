"""The watchdog of a home's owner: ``python -m engram.watchdog HOME``.

Started by the owner with the write end of a pipe as its stdin and the home
lock's descriptor, in a session of its own. It waits for EOF: the owner exited.
An owner that closed cleanly wrote ``CLOSED`` first, and there is nothing to
do. Otherwise the owner died (SIGKILL, a crash), and the watchdog stops what
it left running, then exits, which frees the home: only then can the next
owner start. Until EOF it imports nothing heavy and does nothing.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

CLOSED = b"closed\n"


def main(argv: list[str]) -> int:
    home = Path(argv[1])
    # Ctrl-C or a closed terminal is the owner's to handle: it then stops everything
    # itself and closes our pipe. We must outlive it.
    for signum in (signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    said = sys.stdin.buffer.read()
    if said == CLOSED:
        return 0
    from engram.worker.embedded import logs

    from .cleanup import clean_home

    logs.configure("INFO")
    clean_home(home)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
