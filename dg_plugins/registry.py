"""Name -> object registries for algorithms, datasets and launchers (timm-style): a plugin
registers by importing its module; a taken name raises; a *source* adds another package's names
on first use (``PREFIX:NAME`` when shadowed); an unknown name raises with "did you mean"."""

from __future__ import annotations

import difflib
import fnmatch
import sys
from typing import Any


def close_names(name: str, choices) -> list[str]:
    """``choices`` close to ``name``: the one equal up to case, else difflib's, without case."""
    choices = list(choices)
    if same := [c for c in choices if c.lower() == name.lower()]:
        return same
    folded = {c.lower(): c for c in choices}
    close = difflib.get_close_matches(name.lower(), list(folded), n=3, cutoff=0.6)
    return [folded[c] for c in close]


def did_you_mean(name: str, choices) -> str:
    """`` (did you mean 'X', 'Y'?)`` for :func:`close_names`, or ``""``."""
    close = close_names(str(name), choices)
    return f" (did you mean {', '.join(map(repr, close))}?)" if close else ""


class UnknownNameError(KeyError):
    """An unknown registry name; the message lists the valid choices."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


class UnavailableError(ValueError):
    """A known name that cannot run here; the message says why and the fix."""


class Source:
    """Names another package defines, loaded on first use (``PREFIX:NAME`` when shadowed)."""

    prefix = ""

    def names(self) -> list[str]:
        """The package's names (may import it; must not raise)."""
        return []

    def load(self, name: str, canonical: str) -> Any:
        """The object of ``name`` (as ``canonical``); UnavailableError if it cannot run here."""
        raise NotImplementedError

    def describe(self, shadowed: list[str]) -> str:
        """A clause for the unknown-name message: what this source offers."""
        return ""


class Registry:
    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, Any] = {}
        self._sources: dict[str, Source] = {}
        self._loaded: dict[str, tuple[Source, Any]] = {}  # canonical -> (source, object)

    def register(self, name: str | None = None, obj: Any = None) -> Any:
        """``register("X", obj)``, or ``@register("X")`` / ``@register()`` (``__name__``)."""

        def add(target: Any) -> Any:
            key = name or target.__name__
            if key in self._entries and self._entries[key] is not target:
                raise ValueError(f"{self.kind} name {key!r} is already registered to "
                                 f"{self._entries[key]!r}; choose another name or unregister it "
                                 "first")
            self._entries[key] = target
            self._loaded.pop(key, None)  # a source's object of that name is now PREFIX:key
            return target

        return add if obj is None else add(obj)

    def unregister(self, name: str) -> None:
        self._entries.pop(name, None)

    def add_source(self, source: Source) -> None:
        """Consult ``source`` for unregistered names (replacing one of its prefix)."""
        self.remove_source(source.prefix)
        self._sources[source.prefix] = source

    def remove_source(self, prefix: str) -> None:
        if (old := self._sources.pop(prefix, None)) is not None:
            self._loaded = {n: (s, o) for n, (s, o) in self._loaded.items() if s is not old}

    def source(self, prefix: str) -> Source | None:
        return self._sources.get(prefix)

    def loaded(self) -> list[str]:
        return list(self._loaded)

    def _load(self, source: Source, name: str) -> str:
        canonical = f"{source.prefix}:{name}" if name in self._entries else name
        if canonical not in self._loaded:
            self._loaded[canonical] = (source, source.load(name, canonical))
        return canonical

    def resolve(self, name: str, say: str | None = None) -> str:
        """The canonical name of a user's ``name`` (up to case; ``PREFIX:NAME`` for a shadowed
        source's); ``say``: the flag, noted on stderr when the name changes."""
        canonical = self._resolve(str(name), fold_case=True)
        if say and canonical != name:
            print(f"note: {say} {name}: using {canonical!r}", file=sys.stderr)
        return canonical

    def _offered(self) -> dict[Source, list[str]]:  # each source's unshadowed names
        return {s: [n for n in dict.fromkeys(s.names()) if n not in self._entries]
                for s in self._sources.values()}

    def _resolve(self, name: str, fold_case: bool) -> str:
        if name in self._entries or name in self._loaded:
            return name

        def same(a: str, b: str) -> bool:
            return a == b or fold_case and a.lower() == b.lower()

        prefix, sep, rest = name.partition(":")
        source = next((s for p, s in self._sources.items() if sep and same(prefix, p)), None)
        if source is not None:
            names = list(dict.fromkeys(source.names()))
            match = [n for n in names if n == rest] or [n for n in names if same(n, rest)]
            if len(match) == 1:
                return self._load(source, match[0])
            raise UnknownNameError(
                f"{self.kind} name {name!r} matches "
                f"{', '.join(f'{source.prefix}:{n}' for n in match)} up to case; give the exact "
                "name" if match else
                f"unknown {self.kind} {name!r}: {source.prefix} defines no {rest!r}"
                f"{did_you_mean(rest, names)}")
        matches = [(None, n) for n in self._entries if same(n, name)]
        matches += [(s, n) for s, names in self._offered().items() for n in names if same(n, name)]
        matches = [m for m in matches if m[1] == name][:1] or matches  # a source's exact name
        if len(matches) == 1:
            source, match = matches[0]
            return match if source is None else self._load(source, match)
        if matches:
            raise UnknownNameError(
                f"{self.kind} name {name!r} matches {', '.join(repr(n) for _, n in matches)} up "
                "to case; give the exact name")
        raise UnknownNameError(self.unknown_message([name]))

    def unknown_message(self, names: list[str]) -> str:
        """``unknown KIND 'X' (did you mean ...); registered KINDs: ...`` plus the sources'."""
        choices = list(self._entries) + [n for names in self._offered().values() for n in names]
        named = ", ".join(f"{n!r}{did_you_mean(n, choices)}" for n in names)
        listed = ", ".join(self._entries) or "(none registered)"
        kind = self.kind if len(names) == 1 else f"{self.kind}(s)"
        extra = "".join(f"; {text}" for text in (
            s.describe([n for n in s.names() if n in self._entries])
            for s in self._sources.values()) if text)
        return f"unknown {kind} {named}; registered {self.kind}s: {listed}{extra}"

    def get(self, name: str) -> Any:
        """The object of ``name``, exactly (no case folding; :meth:`resolve` for users' names)."""
        if (canonical := self._resolve(str(name), fold_case=False)) in self._entries:
            return self._entries[canonical]
        return self._loaded[canonical][1]

    def list(self, pattern: str = "*") -> list[str]:
        """Registered names matching a shell-style pattern, in registration order."""
        return [n for n in self._entries if fnmatch.fnmatchcase(n, pattern)]

    def __contains__(self, name: object) -> bool:
        """Whether ``name`` is registered or loaded, exactly (no loading)."""
        return name in self._entries or name in self._loaded

    def __iter__(self):
        return iter(list(self._entries))

    def __len__(self) -> int:
        return len(self._entries)

    def items(self):  # registered (name, object) pairs, not those loaded from sources
        return list(self._entries.items())


ALGORITHMS = Registry("algorithm")
DATASETS = Registry("dataset")
LAUNCHERS = Registry("launcher")
