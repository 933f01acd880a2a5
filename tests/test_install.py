"""Reproducible installs: the lock (``constraints.txt``) pins everything
``pyproject.toml`` asks for, within its ranges; CI runs the README's test command
verbatim, which installs from the lock into a fresh virtual environment; and the
suite runs on exactly the locked versions."""

from __future__ import annotations

import re
import sys
import tomllib
from importlib import metadata

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.redis_fixtures import REPO
from tests.test_readme import blocks

LOCK = REPO / "constraints.txt"
_PIN = re.compile(r"^([A-Za-z0-9._-]+)==([^\s;]+)\s*(?:;\s*(.+))?$")


def locked() -> dict[str, str]:
    """The lock's pins that apply to this interpreter and platform, by name."""
    pins: dict[str, str] = {}
    for line in LOCK.read_text().splitlines():
        match = _PIN.match(line.strip())
        if match is None:
            continue
        name, version, marker = match.groups()
        if marker is None or Requirement(f"x; {marker}").marker.evaluate():  # type: ignore[union-attr]
            pins[canonicalize_name(name)] = version
    return pins


def asked_for() -> list[Requirement]:
    """What ``pyproject.toml`` asks for: the dependencies and every extra's."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    found = [Requirement(r) for r in project["dependencies"]]
    for extra in project["optional-dependencies"].values():
        found += [Requirement(r) for r in extra]
    return [r for r in found if canonicalize_name(r.name) != "engram"]


def test_the_lock_pins_everything_pyproject_asks_for_within_its_ranges() -> None:
    pins = locked()
    assert len(pins) > 50
    env = default_environment()
    for requirement in asked_for():
        if requirement.marker is not None and not requirement.marker.evaluate(env):  # type: ignore[arg-type]
            continue
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{name} is not in constraints.txt: run bash .ci/lock"
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"{name}=={pins[name]} is outside {requirement.specifier}: run bash .ci/lock"
        )


def test_the_suite_runs_on_the_locked_versions() -> None:
    """What this interpreter has installed is what the lock says: a drift (an install
    without ``-c constraints.txt``, a package the machine held before) fails here."""
    drifted = {}
    for name, version in locked().items():
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            drifted[name] = (version, None)
            continue
        if installed != version:
            drifted[name] = (version, installed)
    assert not drifted, f"locked != installed (in {sys.prefix}): {drifted}"


def test_ci_runs_the_readmes_test_command_verbatim_in_a_fresh_venv() -> None:
    [command] = [
        b.code.strip()
        for b in blocks((REPO / "README.md").read_text())
        if b.language == "sh" and "pytest" in b.code
    ]
    ci = (REPO / ".ci" / "run").read_text().strip().splitlines()
    assert ci[-1] == command
    assert command.startswith("python -m venv --clear .venv && ")
    assert "-c constraints.txt" in command
    lock = (REPO / ".ci" / "lock").read_text()
    assert 'uv" pip compile pyproject.toml' in lock and "-o constraints.txt" in lock
    assert lock.strip().splitlines()[-1] == "bash .ci/run"
