"""``worker/defaults.py`` says truly which of its constants a variable overrides.

Its docstring lists the constants ``Settings.from_env`` reads, each with its
variable, and the ones no variable reads; every constant is in one list, and each
variable of the first changes its constant's setting.
"""

from __future__ import annotations

import re
from typing import Any


def defaults_doc() -> tuple[dict[str, str], set[str]]:
    """``worker/defaults.py``'s docstring: the constants a variable overrides (with
    the variable), and the ones it says no variable reads."""
    from worker import defaults

    doc = defaults.__doc__ or ""
    set_from, _, others = doc.partition("read by no variable")
    overridden = dict(re.findall(r"``([A-Z][A-Z0-9_]+)``: ``(ENGRAM_[A-Z0-9_]+)``", set_from))
    fixed = set(re.findall(r"``([A-Z][A-Z0-9_]+)``", others))
    return overridden, fixed


def test_defaults_says_which_constants_a_variable_overrides() -> None:
    from worker import defaults
    from worker.settings import Settings

    overridden, fixed = defaults_doc()
    constants = {name for name in vars(defaults) if re.fullmatch(r"[A-Z][A-Z0-9_]+", name)}
    assert not overridden.keys() & fixed
    assert overridden.keys() | fixed == constants
    plain = Settings.from_env({})
    for constant, variable in overridden.items():
        value = getattr(defaults, constant)
        changed = Settings.from_env({variable: str(value + 1)})
        assert changed != plain, f"{variable} does not change the settings ({constant})"
        assert value + 1 in _values(changed), f"{variable} is not {constant}'s override"


def _values(settings: Any) -> list[Any]:
    """Every field of the settings and of their ``WorkerConfig``."""
    return [
        getattr(obj, name)
        for obj in (settings, settings.worker)
        for name in obj.__dataclass_fields__
    ]
