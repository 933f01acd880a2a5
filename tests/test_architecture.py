"""docs/architecture.md names what exists, and says what the code does.

The page writes every code reference in full, between backticks: a dotted path
rooted at engram's one namespace (``engram.store.write.apply._delete_replaced``),
resolved by importing its longest module prefix and looking the rest up on it, or a
path in the repository (``store/write/apply.py``), which must exist. A short name of
something the code defines (``Store``, ``plan_batch``) or a dotted name rooted
elsewhere (``Store.execute``) is refused: it could not be checked, so it would rot.
Beside the names: the page's table of arrows says what ``tests/test_layers.py``
enforces, its list of errors names every error class outside the four error modules,
and ``worker/defaults.py`` says truly which constants a variable overrides (what the
page sends a reader to for the worker's settings).
"""

from __future__ import annotations

import ast
import functools
import importlib
import re
from collections.abc import Iterator
from types import ModuleType
from typing import Any

from tests.test_layers import FORBIDDEN, PACKAGES, REPO, module_name

PAGE = REPO / "docs" / "architecture.md"
ERROR_MODULES = {f"engram.{p}.errors" for p in ("store", "worker", "web", "jobs")}

DOTTED = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")
PATH = re.compile(r"[\w.-]+(?:/[\w.-]+)*/?")
IDENTIFIER = re.compile(r"[A-Za-z_]\w*")
VARIABLE = re.compile(r"ENGRAM_[A-Z0-9_]+")
FILE = re.compile(r"[\w-]+\.(?:py|md|sql|html|toml|json)")


def prose(text: str) -> str:
    """The page without its fenced blocks (whose backticks are literal)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def spans(text: str) -> list[str]:
    return re.findall(r"`([^`\n]+)`", prose(text))


def defined_names() -> set[str]:
    """Every function and class engram's packages define, at any depth."""
    names: set[str] = set()
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            tree = ast.parse(path.read_text(), filename=str(path))
            names |= {
                node.name
                for node in ast.walk(tree)
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
            }
    return names


def resolve(dotted: str) -> Any:
    """The object ``dotted`` names: its longest importable module prefix, then the
    rest looked up attribute by attribute. Raises if any part is missing."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        name = ".".join(parts[:cut])
        try:
            found: Any = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name is not None and name.startswith(exc.name):
                continue  # this prefix is no module: try a shorter one
            raise  # the module exists but an import inside it failed
        for attribute in parts[cut:]:
            found = getattr(found, attribute)
        return found
    raise ModuleNotFoundError(dotted)


def wrong_references(text: str, defined: set[str]) -> list[str]:
    """What on ``text`` names code that does not exist, or names it too briefly."""
    wrong = []
    for span in dict.fromkeys(spans(text)):
        if "/" in span and not span.startswith("/") and PATH.fullmatch(span):
            if not (REPO / span).exists():
                wrong.append(f"{span}: no such file or folder")
        elif FILE.fullmatch(span):
            wrong.append(f"{span}: write its path from the repository's root")
        elif DOTTED.fullmatch(span):
            if span.split(".")[0] != "engram":
                wrong.append(f"{span}: write it in full, from engram's namespace")
                continue
            try:
                resolve(span)
            except (ImportError, AttributeError) as exc:
                wrong.append(f"{span}: {type(exc).__name__}: {exc}")
        elif VARIABLE.fullmatch(span):
            if not any(span in source for source in sources()):
                wrong.append(f"{span}: no code reads it")
        elif IDENTIFIER.fullmatch(span) and span in defined and span not in PACKAGES:
            wrong.append(f"{span}: write it in full (module.{span})")
    return wrong


@functools.cache
def sources() -> tuple[str, ...]:
    """The text of every module of engram's packages."""
    return tuple(
        path.read_text() for package in PACKAGES for path in (REPO / package).rglob("*.py")
    )


def test_every_name_on_the_page_exists() -> None:
    assert wrong_references(PAGE.read_text(), defined_names()) == []


def test_a_name_that_does_not_exist_is_found() -> None:
    defined = defined_names()
    page = (
        "`engram.store.write.writer`, `engram.worker.consuming.partition.ForgetHook` and "
        "`store/write/apply.py` "
        "exist; `ENGRAM_PARTITIONS` is read.\n"
        "```text\n`not.checked` inside a fenced block\n```\n"
    )
    assert wrong_references(page, defined) == []
    bad = (
        "`engram.store.writer` `engram.store.write.apply._deleted_replaced` "
        "`engram.worker.nowhere` `store.write.writer` "
        "`store/write/aply.py` `Store.execute` `plan_batch` `ENGRAM_NOTHING` `apply.py`"
    )
    assert [line.split(":")[0] for line in wrong_references(bad, defined)] == [
        "engram.store.writer",
        "engram.store.write.apply._deleted_replaced",
        "engram.worker.nowhere",
        "store.write.writer",
        "store/write/aply.py",
        "Store.execute",
        "plan_batch",
        "ENGRAM_NOTHING",
        "apply.py",
    ]


def arrows(text: str) -> dict[str, set[str]]:
    """The page's table: each package and the packages it may import."""
    table = {}
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 2 and (first := re.fullmatch(r"`(\w+)`", cells[0])):
            table[first[1]] = set(re.findall(r"`(\w+)`", cells[1]))
    return table


def test_the_arrows_on_the_page_are_the_ones_test_layers_enforces() -> None:
    table = arrows(PAGE.read_text())
    assert set(table) == set(PACKAGES)
    forbidden_by_page = {
        package: set(PACKAGES) - {package} - allowed for package, allowed in table.items()
    }
    assert forbidden_by_page == FORBIDDEN


def error_classes() -> Iterator[str]:
    """Every public class rooted in ``EngramError`` defined outside the error modules."""
    from engram.store.errors import EngramError

    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            name = module_name(path)
            if name in ERROR_MODULES or name.endswith(".__main__"):
                continue
            tree = ast.parse(path.read_text(), filename=str(path))
            classes = [
                node.name
                for node in tree.body
                if isinstance(node, ast.ClassDef) and node.bases and not node.name.startswith("_")
            ]
            if not classes:
                continue
            module: ModuleType = importlib.import_module(name)
            for cls in classes:
                if issubclass(getattr(module, cls), EngramError):
                    yield f"{name}.{cls}"


def test_the_page_names_every_error_outside_the_error_modules() -> None:
    named = set(spans(PAGE.read_text()))
    assert sorted(set(error_classes()) - named) == []


def defaults_doc() -> tuple[dict[str, str], set[str]]:
    """``worker/defaults.py``'s docstring: the constants a variable overrides (with
    the variable), and the ones it says no variable reads."""
    from engram.worker import defaults

    doc = defaults.__doc__ or ""
    set_from, _, others = doc.partition("read by no variable")
    overridden = dict(re.findall(r"``([A-Z][A-Z0-9_]+)``: ``(ENGRAM_[A-Z0-9_]+)``", set_from))
    fixed = set(re.findall(r"``([A-Z][A-Z0-9_]+)``", others))
    return overridden, fixed


def test_defaults_says_which_constants_a_variable_overrides() -> None:
    from engram.worker import defaults
    from engram.worker.settings import Settings

    overridden, fixed = defaults_doc()
    constants = {name for name in vars(defaults) if re.fullmatch(r"[A-Z][A-Z0-9_]+", name)}
    assert not overridden.keys() & fixed
    assert overridden.keys() | fixed == constants
    plain = Settings.from_env({})
    for constant, variable in overridden.items():
        value = getattr(defaults, constant)
        other = value + 1 if isinstance(value, int | float) else str(int(value) + 1)
        changed = Settings.from_env({variable: str(other)})
        assert changed != plain, f"{variable} does not change the settings ({constant})"
        assert other in _values(changed), f"{variable} is not {constant}'s override"


def _values(settings: Any) -> list[Any]:
    """Every field of the settings and of their ``WorkerConfig``."""
    return [
        getattr(obj, name)
        for obj in (settings, settings.worker)
        for name in obj.__dataclass_fields__
    ]
