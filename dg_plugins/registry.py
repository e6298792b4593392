"""Name -> object registries for algorithms, datasets and launchers (timm-style).

A plugin registers by importing its module, with ``@register_algorithm("Name")``
(:mod:`dg_plugins.algorithms.base`: it also attaches the hparam space and the table order) or
``@register_dataset`` (:mod:`dg_plugins.datasets.base`: it also declares the environments); the
decorators store into these registries. Names are unique per registry; registering a taken name raises. ``get`` of an unknown name raises
:class:`UnknownNameError` listing the registered choices and the closest names ("did you mean",
case-insensitive: :func:`close_names`).
"""

from __future__ import annotations

import difflib
import fnmatch
from typing import Any


def close_names(name: str, choices) -> list[str]:
    """Names of ``choices`` close to ``name`` ("did you mean"): the one that differs only in
    case (``dmg`` finds ``DMG``), else difflib's closest, compared without case."""
    choices = list(choices)
    same = [c for c in choices if c.lower() == name.lower()]
    if same:
        return same
    folded = {c.lower(): c for c in choices}
    close = difflib.get_close_matches(name.lower(), list(folded), n=3, cutoff=0.6)
    return [folded[c] for c in close]


def did_you_mean(name: str, choices) -> str:
    """`` (did you mean 'X', 'Y'?)`` for the :func:`close_names` of ``name``, or ``""``."""
    close = close_names(str(name), choices)
    return f" (did you mean {', '.join(map(repr, close))}?)" if close else ""


class UnknownNameError(KeyError):
    """An unknown registry name; the message lists the valid choices."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


class Registry:
    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, Any] = {}

    def register(self, name: str | None = None, obj: Any = None) -> Any:
        """``register("X", obj)`` or, as a decorator, ``@register("X")`` / ``@register()``
        (the object's ``__name__``)."""

        def add(target: Any) -> Any:
            key = name or target.__name__
            if key in self._entries and self._entries[key] is not target:
                raise ValueError(
                    f"{self.kind} name {key!r} is already registered to "
                    f"{self._entries[key]!r}; choose another name or unregister it first"
                )
            self._entries[key] = target
            return target

        return add if obj is None else add(obj)

    def unregister(self, name: str) -> None:
        self._entries.pop(name, None)

    def get(self, name: str) -> Any:
        try:
            return self._entries[name]
        except KeyError:
            choices = ", ".join(self._entries) or "(none registered)"
            raise UnknownNameError(f"unknown {self.kind} {name!r}{did_you_mean(name, self._entries)}"
                                   f"; registered {self.kind}s: {choices}") from None

    def list(self, pattern: str = "*") -> list[str]:
        """Registered names matching a shell-style pattern, in registration order."""
        return [n for n in self._entries if fnmatch.fnmatchcase(n, pattern)]

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self):
        return iter(list(self._entries))

    def __len__(self) -> int:
        return len(self._entries)

    def items(self):
        return list(self._entries.items())


ALGORITHMS = Registry("algorithm")
DATASETS = Registry("dataset")
LAUNCHERS = Registry("launcher")
