"""Files only their owner may read, from the moment they exist: the run file and the
embedded valkey's password file hold a password; an export holds memory text."""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path
from typing import IO


def open_private(path: Path | str) -> IO[str]:
    """``path`` opened to be written over, readable by its owner only from the moment it
    exists (created 0600, not narrowed after). An existing regular file is narrowed to
    0600 before anything is written to it; a pipe or a device is left as it is."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            # Someone else's file we may write to: it keeps the mode its owner gave it.
            with contextlib.suppress(PermissionError):
                os.fchmod(fd, 0o600)
        return os.fdopen(fd, "w", encoding="utf-8")
    except BaseException:
        os.close(fd)
        raise
