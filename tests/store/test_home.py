"""ENGRAM_HOME on disk: its owner's only, and too deep a home refused, on real folders."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import pytest

from engram.store.errors import ConfigError
from engram.store.home import make_private, server_gid, share_with_server
from engram.store.server import EmbeddedPostgres


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_new_home_is_its_owners_only_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o000)
    try:
        home = make_private(tmp_path / "a" / "home")
    finally:
        os.umask(old)
    assert _mode(home) == 0o700


def test_a_home_open_to_others_is_narrowed_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    home.chmod(0o755)
    (home / "kept").write_text("its files are left as they are")
    with caplog.at_level(logging.WARNING, logger="engram.store.home"):
        make_private(home)
    # Its owner's only; as root, our own group (the server's) may still pass through.
    assert _mode(home) == (0o700 if server_gid() is None else 0o710)
    assert (home / "kept").read_text() == "its files are left as they are"
    assert [r.getMessage() for r in caplog.records] == [
        "ENGRAM_HOME was open to other users: made its owner's only"
    ]
    caplog.clear()
    make_private(home)  # already private: nothing to say
    assert caplog.records == []


def test_the_embedded_postgres_user_may_pass_through_and_no_one_else(tmp_path: Path) -> None:
    home = make_private(tmp_path / "home")
    share_with_server(home)
    gid = server_gid()
    if gid is None:  # not root: PostgreSQL runs as us, the home stays ours alone
        assert _mode(home) == 0o700
        return
    assert (_mode(home), home.stat().st_gid) == (0o710, gid)
    make_private(home)  # the server's group passing through is not "open to others"
    assert _mode(home) == 0o710
    os.chown(home, -1, 65534)  # nogroup
    make_private(home)  # any other group is
    assert _mode(home) == 0o700


def test_a_home_too_deep_for_postgres_socket_is_refused_before_anything_is_made(
    tmp_path: Path,
) -> None:
    home = tmp_path / ("deep" * 25) / "home"
    with pytest.raises(ConfigError, match="too deep for the embedded PostgreSQL's socket"):
        EmbeddedPostgres(home)
    assert not home.parent.exists()
