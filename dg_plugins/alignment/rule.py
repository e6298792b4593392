"""The IP/OOP split rule (Teterwak et al., ICLR 2025): per image, ``drop`` outside the cleaning
cuts, else ``ip`` iff ``score >= threshold``, else ``oop``; the presets and their sources:
docs/methods/alignment.md."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

DEFAULT_THRESHOLD = 0.4
SUBSETS = ("ip", "oop", "drop")
#: A split with less than this fraction of its kept images in IP (or in OOP) gets a warning.
LOPSIDED_FRACTION = 0.05


@dataclass(frozen=True)
class SplitRule:
    """IP iff ``score >= threshold``; ``drop`` below ``drop_below`` / above ``drop_above``."""

    threshold: float = DEFAULT_THRESHOLD
    drop_below: float | None = None
    drop_above: float | None = None

    def __post_init__(self):
        for name in ("threshold", "drop_below", "drop_above"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value)):
                raise ValueError(f"split rule: {name} must be a finite number, got {value!r}")
        if (self.drop_below is not None and self.drop_above is not None
                and self.drop_below > self.drop_above):
            raise ValueError(f"split rule: drop_below ({self.drop_below}) is above drop_above "
                             f"({self.drop_above}); every image would be dropped")

    def assign(self, scores) -> np.ndarray:
        """The subset name (``"ip"``, ``"oop"`` or ``"drop"``) of every score, as an array."""
        scores = np.asarray(scores, dtype=np.float64)
        if np.isnan(scores).any():
            raise ValueError(f"{int(np.isnan(scores).sum())} alignment scores are NaN; rescore "
                             "those images (a NaN cosine means a zero embedding)")
        out = np.where(scores >= self.threshold, "ip", "oop").astype(object)
        low, high = (-np.inf if self.drop_below is None else self.drop_below,
                     np.inf if self.drop_above is None else self.drop_above)
        out[(scores < low) | (scores > high)] = "drop"
        return out

    def describe(self) -> str:
        text = f"IP if score >= {self.threshold:g}, else OOP"
        cuts = [f"score {op} {cut:g}" for op, cut in (("<", self.drop_below),
                                                     (">", self.drop_above)) if cut is not None]
        return text + ("; dropped: " + " or ".join(cuts) if cuts else "; nothing dropped")


#: Named split rules (docs/methods/alignment.md).
PRESETS: dict[str, SplitRule] = {
    "default": SplitRule(),
    "teterwak2025": SplitRule(threshold=0.21, drop_below=0.15, drop_above=0.40),
}


def resolve_rule(threshold: float | None = None, preset: str | None = None,
                 drop_below: float | None = None, drop_above: float | None = None) -> SplitRule:
    """The rule of a threshold and cuts or a preset (neither: the default); raises on both."""
    if preset is None:
        return SplitRule(DEFAULT_THRESHOLD if threshold is None else float(threshold),
                         drop_below, drop_above)
    if "=" in preset:  # inline: threshold=T,drop_below=L,drop_above=H
        values: dict[str, float | None] = {}
        for part in preset.split(","):
            name, sep, raw = (text.strip() for text in part.partition("="))
            if not sep or name not in ("threshold", "drop_below", "drop_above"):
                raise ValueError(f"inline split rule {preset!r}: expected comma-separated "
                                 "threshold=T, drop_below=L, drop_above=H")
            try:
                values[name] = None if raw.lower() in ("", "none") else float(raw)
            except ValueError:
                raise ValueError(f"inline split rule {preset!r}: {name}={raw!r} is not a number"
                                 ) from None
        if values.get("threshold") is None:
            values["threshold"] = DEFAULT_THRESHOLD
        rule = SplitRule(**values)
    elif preset in PRESETS:
        rule = PRESETS[preset]
    else:
        raise ValueError(f"unknown alignment preset {preset!r}; choose from "
                         f"{', '.join(sorted(PRESETS))}, or write one inline as "
                         "'threshold=T,drop_below=L,drop_above=H'")
    if given := [name for name, value in (("threshold", threshold), ("drop_below", drop_below),
                                          ("drop_above", drop_above)) if value is not None]:
        raise ValueError(f"alignment preset {preset!r} sets its own threshold and cleaning cuts "
                         f"({rule.describe()}); do not also give {', '.join(given)} (use the "
                         "preset alone, or the threshold and cuts alone)")
    return rule


def subset_counts(assigned) -> dict[str, int]:
    assigned = np.asarray(assigned, dtype=object)
    return {name: int((assigned == name).sum()) for name in SUBSETS}


def lopsided_warnings(label: str, counts: dict[str, int], rule: SplitRule) -> list[str]:
    """Warnings for a split with (almost) everything in IP or in OOP, or everything dropped."""
    kept = counts["ip"] + counts["oop"]
    if kept == 0:
        total = sum(counts.values())
        return [f"{label}: all {total} images are dropped by the cleaning cuts ({rule.describe()})"]
    for name, other in (("oop", "IP"), ("ip", "OOP")):
        if counts[name] / kept >= 1 - LOPSIDED_FRACTION:
            hint = (" Typical OpenCLIP ViT-B/16 cosines lie around 0.15-0.35, so a threshold "
                    f"of {rule.threshold:g} puts almost everything in OOP; the paper's split "
                    "is --alignment_preset teterwak2025 (IP at 0.21, drop < 0.15 and > 0.40)."
                    if name == "oop" and rule.threshold >= 0.3 else "")
            return [f"{label}: {100 * counts[name] / kept:.1f}% of the {kept} kept images are "
                    f"{name.upper()} ({counts['ip'] if name == 'oop' else counts['oop']} {other}) "
                    f"under the rule {rule.describe()}.{hint}"]
    return []
