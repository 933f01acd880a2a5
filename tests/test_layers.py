"""Imports go one way: store <- worker <- (jobs, web) <- engram, the composition root.

``engram.store`` knows nothing of the streams, ``engram.worker`` nothing of the jobs or
the web, and nothing but the command line reaches up to ``engram``'s own modules (the
composition root: the folder ``engram/``) to be started. Every import names the one
namespace: ``engram.store``, never a top-level ``store``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("store", "worker", "jobs", "web", "engram")
# The folders installed as engram's subpackages (``engram/store`` links to ``store/``).
SUBPACKAGES = ("store", "worker", "jobs", "web")

# What each package may not import.
FORBIDDEN = {
    "store": {"worker", "jobs", "web", "engram"},
    "worker": {"jobs", "web", "engram"},
    "jobs": {"web", "engram"},
    "web": {"engram"},
    "engram": set(),
}


def layer_of(module: str) -> str | None:
    """``engram.worker.admin.pause`` -> ``worker``; ``engram.up`` -> ``engram``."""
    parts = module.split(".")
    if parts[0] != "engram":
        return None
    if len(parts) > 1 and parts[1] in SUBPACKAGES:
        return parts[1]
    return "engram"


def sources(package: str) -> list[Path]:
    """The package's own files (``engram/`` without the links to the other four)."""
    found = sorted((REPO / package).rglob("*.py"))
    if package == "engram":
        found = [p for p in found if p.relative_to(REPO / "engram").parts[0] not in SUBPACKAGES]
    return found


def absolute_imports(path: Path) -> set[str]:
    """The modules ``path`` names in its absolute imports (``from x import y``: ``x``)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
    return found


def imported_packages(path: Path) -> set[str]:
    return {layer for name in absolute_imports(path) if (layer := layer_of(name))}


@pytest.mark.parametrize("package", [p for p in PACKAGES if (REPO / p).is_dir()])
def test_imports_go_one_way(package: str) -> None:
    wrong = {
        f"{path.relative_to(REPO)} imports {name}"
        for path in sources(package)
        for name in imported_packages(path) & FORBIDDEN[package]
    }
    assert not wrong, sorted(wrong)


def test_every_import_names_the_engram_namespace() -> None:
    """engram claims no top-level ``store``, ``worker``, ``jobs`` or ``web``: a user's
    own ``worker.py`` would shadow it, or be shadowed."""
    files = [
        p
        for top in ("store", "worker", "jobs", "web", "engram", "tests", "bench")
        for p in sources(top)
    ]
    wrong = {
        f"{path.relative_to(REPO)} imports {name}"
        for path in files
        for name in absolute_imports(path)
        if name.split(".")[0] in SUBPACKAGES
    }
    assert not wrong, sorted(wrong)


def test_the_namespace_links_are_the_folders() -> None:
    for top in SUBPACKAGES:
        link = REPO / "engram" / top
        assert link.is_symlink() and link.resolve() == (REPO / top).resolve(), top


def module_name(path: Path) -> str:
    """``store/write/apply.py`` -> ``engram.store.write.apply``."""
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    if parts[0] != "engram":
        parts.insert(0, "engram")
    return ".".join(parts)


def imported_modules(path: Path, modules: set[str]) -> set[str]:
    """The modules of ``modules`` that ``path`` imports, at any depth (an import inside
    a function counts: it is a cycle deferred, not avoided; one for the type checker
    only does not)."""
    here = module_name(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    found: set[str] = set()
    tree = ast.parse(path.read_text(), filename=str(path))
    typing_only = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If)
        and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")
        for inner in ast.walk(node)
    }
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue  # for the type checker only: no import at run time
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            root = ".".join([*base, *([node.module] if node.module else [])])
            names = [root, *(f"{root}.{alias.name}" for alias in node.names)]
        else:
            continue
        found |= {name for name in names if name in modules}
    return found


def cycle_in(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle of ``graph``, or ``[]``."""
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return []

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return []


@pytest.mark.parametrize("package", [p for p in PACKAGES if (REPO / p).is_dir()])
def test_no_import_circle_inside_a_package(package: str) -> None:
    """A package's modules import one another one way too; its ``__init__`` (which
    re-exports them) is left out, since every module may use the package's names."""
    paths = {module_name(p): p for p in sources(package) if p.name != "__init__.py"}
    graph = {name: imported_modules(path, set(paths)) - {name} for name, path in paths.items()}
    assert cycle_in(graph) == []


def test_a_circle_is_found() -> None:
    assert cycle_in({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert cycle_in({"a": {"b"}, "b": set()}) == []
