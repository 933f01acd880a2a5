"""Which engram scope a LangGraph namespace lives in: pure, no I/O.

By default every namespace of an ``EngramStore`` lives in its one scope. Patterns
map namespaces to scopes of their own: ``(("memories", "{user_id}"), {"user_id":
"{user_id}"})`` puts ``("memories", "ada", ...)`` in the scope ``{"user_id": "ada"}``,
so that one user's memory is forgotten, exported and audited as one scope. The
first pattern a namespace starts with wins; a namespace no pattern matches stays
in the default scope.

A read over a namespace *prefix* (search, list_namespaces) is served by one scope:
a prefix that could reach namespaces of more than one scope is refused with
``ScopeSpanError``, saying how to narrow it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from engram.store import InvalidRequestError, Scope

_VARIABLE = re.compile(r"^\{([A-Za-z_][A-Za-z0-9_]*)\}$")
_ANY = "*"

ScopePattern = tuple[Sequence[str], Mapping[str, str]]


class ScopeSpanError(InvalidRequestError):
    """A search or listing whose namespace prefix reaches more than one scope."""

    code = "scope_span"


@dataclass(frozen=True, slots=True)
class Pattern:
    labels: tuple[str, ...]  # literal labels and "{name}" variables
    scope: Mapping[str, str]  # scope fields: templates over the variables

    @classmethod
    def of(cls, labels: Sequence[str], scope: Mapping[str, str]) -> Pattern:
        labels = tuple(labels)
        if not labels or not all(isinstance(label, str) and label for label in labels):
            raise InvalidRequestError("a scope pattern is a non-empty tuple of labels")
        names = [m.group(1) for label in labels if (m := _VARIABLE.match(label))]
        if len(set(names)) != len(names):
            raise InvalidRequestError(f"a scope pattern names a variable twice: {labels}")
        for field, template in scope.items():
            try:
                template.format_map({n: "x" for n in names})
            except (KeyError, ValueError, IndexError, AttributeError) as exc:
                raise InvalidRequestError(
                    f"scope field {field!r} uses what the pattern {labels} does not name"
                ) from exc
        pattern = cls(labels, dict(scope))
        # a valid scope (or InvalidRequestError): the fields known, a value for each
        pattern.scope_for(tuple("x" if _VARIABLE.match(label) else label for label in labels))
        return pattern

    def captures(self, namespace: Sequence[str]) -> dict[str, str] | None:
        """The variables' labels when ``namespace`` starts with this pattern, else None."""
        if len(namespace) < len(self.labels):
            return None
        found: dict[str, str] = {}
        for label, wanted in zip(namespace, self.labels, strict=False):
            variable = _VARIABLE.match(wanted)
            if variable:
                found[variable.group(1)] = label
            elif label != wanted:
                return None
        return found

    def could_reach(self, prefix: Sequence[str]) -> bool:
        """Whether a namespace starting with ``prefix`` (shorter than this pattern; ``*``
        for any label) may start with this pattern."""
        return all(
            label in (_ANY, wanted) or _VARIABLE.match(wanted)
            for label, wanted in zip(prefix, self.labels, strict=False)
        )

    def scope_for(self, namespace: Sequence[str]) -> Scope:
        captured = self.captures(namespace)
        assert captured is not None
        return Scope.of({f: t.format_map(captured) for f, t in self.scope.items()})


class ScopeMap:
    """Namespaces to scopes: the patterns in order, then the default scope."""

    def __init__(self, default: Scope, patterns: Sequence[ScopePattern] = ()) -> None:
        self.default = default
        self.patterns = tuple(Pattern.of(labels, scope) for labels, scope in patterns)

    def scope_of(self, namespace: Sequence[str]) -> Scope:
        for pattern in self.patterns:
            if pattern.captures(namespace) is not None:
                return pattern.scope_for(namespace)
        return self.default

    def scope_of_prefix(self, prefix: Sequence[str]) -> Scope:
        """The one scope every namespace starting with ``prefix`` lives in (``*``: any
        label), or ``ScopeSpanError``."""
        for pattern in self.patterns:
            if len(prefix) >= len(pattern.labels) and _ANY not in prefix[: len(pattern.labels)]:
                if pattern.captures(prefix) is not None:
                    return pattern.scope_for(prefix)  # every namespace here matches it
            elif pattern.could_reach(prefix):
                raise ScopeSpanError(
                    f"the namespace prefix {tuple(prefix)} reaches several scopes (the "
                    f"pattern {pattern.labels} gives each its own): name the pattern's "
                    "labels in the prefix, e.g. search one user's namespace"
                )
        return self.default
