"""Imports go one way: store <- worker <- (jobs, web) <- engram, the composition root.

``store`` knows nothing of the streams, ``worker`` nothing of the jobs or the web,
and nothing but the command line reaches up to ``engram`` to be started.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("store", "worker", "jobs", "web", "engram")

# What each package may not import.
FORBIDDEN = {
    "store": {"worker", "jobs", "web", "engram"},
    "worker": {"jobs", "web", "engram"},
    "jobs": {"web", "engram"},
    "web": {"engram"},
    "engram": set(),
}


def imported_packages(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found & set(PACKAGES)


@pytest.mark.parametrize("package", [p for p in PACKAGES if (REPO / p).is_dir()])
def test_imports_go_one_way(package: str) -> None:
    wrong = {
        f"{path.relative_to(REPO)} imports {name}"
        for path in sorted((REPO / package).rglob("*.py"))
        for name in imported_packages(path) & FORBIDDEN[package]
    }
    assert not wrong, sorted(wrong)
