"""Reading settings from the environment: the one reader every package's settings use.

``Env(os.environ).integer("ENGRAM_WORKERS", defaults.UP_WORKERS)``: an unset or empty
variable is its default, written once where the settings keep their defaults; a
value that cannot be read is a ``ConfigError`` naming the variable and what it
accepts, raised while the settings are read, before anything starts.

Durations have one form everywhere: a number and a unit, ``500ms``, ``30s``, ``5m``,
``1h``, ``30d`` (``1.5m`` too). A variable that took a plain number before durations
had units (``ENGRAM_LEASE_TTL_MS=5000``, ``ENGRAM_LLM_DEADLINE_S=30``) still takes one,
in its old unit (``plain``). Where a duration may be turned off, ``off`` (or ``0``)
turns it off.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from typing import Literal

from engram.store.errors import ConfigError

Unit = Literal["ms", "s", "m", "h", "d"]
UNIT_S: dict[str, float] = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
DURATION_FORM = "a number and a unit (500ms, 30s, 5m, 1h, 30d)"
OFF = ("off", "0", "none")
SWITCHES = dict.fromkeys(("on", "true", "yes", "1"), True) | dict.fromkeys(
    ("off", "false", "no", "0"), False
)

_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)")
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_UNIT_NAMES = {"ms": "milliseconds", "s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def duration_form(plain: Unit | None = None, *, off: bool = False) -> str:
    """What a duration variable accepts, as its error says it."""
    form = DURATION_FORM
    if plain is not None:
        form += f" or a number of {_UNIT_NAMES[plain]}"
    return form + (", or off" if off else "")


def parse_duration(text: str, *, plain: Unit | None = None) -> float:
    """``"30s"`` -> 30.0, ``"500ms"`` -> 0.5 seconds; with ``plain="ms"``, ``"5000"`` ->
    5.0. Anything else is a ``ValueError`` saying what is accepted."""
    value = text.strip().lower()
    match = _DURATION.fullmatch(value)
    if match:
        seconds = float(match[1]) * UNIT_S[match[2]]
    elif plain is not None and _NUMBER.fullmatch(value):
        seconds = float(value) * UNIT_S[plain]
    else:
        seconds = math.nan
    if not math.isfinite(seconds):  # unreadable, or too many digits to be a number
        raise ValueError(f"a duration is {duration_form(plain)}, not {text!r}")
    return seconds


def is_off(text: str) -> bool:
    return text.strip().lower() in OFF


class Env:
    """Typed reads of one environment (``os.environ`` unless given a mapping)."""

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        self.env: Mapping[str, str] = os.environ if env is None else env

    def text(self, name: str, default: str) -> str:
        return self.env.get(name) or default

    def optional(self, name: str) -> str | None:
        return self.env.get(name) or None

    def integer(self, name: str, default: int, *, minimum: int | None = None) -> int:
        value = self._value(name)
        if value is None:
            return default
        try:
            number = int(value)
        except ValueError:
            raise ConfigError(f"{name} must be a whole number, not {value!r}") from None
        if minimum is not None and number < minimum:
            raise ConfigError(f"{name} must be a whole number of at least {minimum}, not {number}")
        return number

    def duration(self, name: str, default_s: float, *, plain: Unit | None = None) -> float:
        """Seconds."""
        value = self._value(name)
        return default_s if value is None else self._duration(name, value, plain)

    def duration_ms(self, name: str, default_ms: int, *, plain: Unit | None = "ms") -> int:
        """Whole milliseconds."""
        value = self._value(name)
        return default_ms if value is None else round(self._duration(name, value, plain) * 1000)

    def duration_or_off(
        self, name: str, default_s: float | None, *, plain: Unit | None = None
    ) -> float | None:
        """Seconds, or None for ``off`` (or ``0``)."""
        value = self._value(name)
        if value is None:
            return default_s
        return None if is_off(value) else self._duration(name, value, plain, off=True)

    def durations(self, name: str, default_s: tuple[float, ...]) -> tuple[float, ...]:
        """A comma-separated list of durations, in seconds; ``off`` ones are left out."""
        if self._value(name) is None:
            return default_s
        return tuple(
            self._duration(name, item, None, off=True)
            for item in self.items(name, ())
            if not is_off(item)
        )

    def items(self, name: str, default: tuple[str, ...]) -> tuple[str, ...]:
        """A comma-separated list; unset is ``default``, set and empty is empty."""
        value = self.env.get(name)
        if value is None:
            return default
        return tuple(item.strip() for item in value.split(",") if item.strip())

    def switch(self, name: str, default: bool) -> bool:
        value = self._value(name)
        if value is None:
            return default
        try:
            return SWITCHES[value.lower()]
        except KeyError:
            raise ConfigError(f"{name} must be on or off, not {value!r}") from None

    def _value(self, name: str) -> str | None:
        """The variable's value, stripped; None when it is unset, empty or blank."""
        return (self.env.get(name) or "").strip() or None

    def _duration(self, name: str, value: str, plain: Unit | None, *, off: bool = False) -> float:
        try:
            return parse_duration(value, plain=plain)
        except ValueError:
            raise ConfigError(
                f"{name} must be {duration_form(plain, off=off)}, not {value!r}"
            ) from None
