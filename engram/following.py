"""Following a re-embedding from the command line: its progress bar, printed in place
on a terminal (else a line every 5 s), until it is active, failed, cancelled or
superseded; the exit code says which (``engram reembed``, ``engram demo-reembed``)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

from engram.jobs.progress import Progress, bar, trouble
from engram.store import Store


def follow(
    store: Store,
    generation_id: int,
    poll_s: float = 0.5,
    why_waiting: Callable[[], str | None] = lambda: None,
) -> int:
    """Print the progress bar until the re-embedding is over; 0 once it is active, else 1
    with how it ended on stderr (``engram: reembed failed: <root cause>``, cancelled by
    whom, superseded by which generation). While it is under way, ``why_waiting`` says
    what holds it back, if anything (the jobs paused): the bar's line ends with it."""
    tty = sys.stdout.isatty()
    shown = said = ""
    printed_at = 0.0
    while True:
        generation = store.embeddings.get(generation_id)
        progress = Progress.from_dict(generation.progress) if generation else None
        if generation is None or (progress is None and generation.status != "pending"):
            status = generation.status if generation else "gone"
            print(f"engram: reembed {status}: generation {generation_id}", file=sys.stderr)
            return 0 if status == "active" else 1
        if progress is not None:
            line, news = bar(progress), trouble(progress)
            why = None if progress.finished else why_waiting()
            if why:
                line = f"{line} · {why}"
            if tty:
                sys.stdout.write(f"\r{line}\033[K")
                sys.stdout.flush()
            elif line != shown and (
                # A failure or a retry is said at once; progress every 5 s at most.
                progress.finished or news != said or time.monotonic() - printed_at >= 5
            ):
                print(line, flush=True)
                printed_at = time.monotonic()
            shown, said = line, news
            if progress.finished:
                if tty:
                    print()
                if progress.state == "activated":
                    if progress.message:
                        print(progress.outcome)
                    return 0
                print(f"engram: reembed {progress.outcome}", file=sys.stderr)
                return 1
        time.sleep(poll_s)
