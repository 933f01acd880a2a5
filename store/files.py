"""Files that must survive a crash: a folder's entries made durable."""

from __future__ import annotations

import os
from pathlib import Path


def fsync_dir(folder: Path) -> None:
    """Make ``folder``'s entries durable (a file created or renamed in it survives a
    crash once this returns, its own contents fsynced before)."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
