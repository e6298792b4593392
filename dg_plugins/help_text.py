"""Docstrings as ``--help`` text: the scripts' and benchmarks' parsers take their descriptions
from module docstrings written in reStructuredText. Torch- and pandas-free."""

from __future__ import annotations

import re


def plain_text(doc: str) -> str:
    """``doc`` without reStructuredText markup (roles and literals), for --help."""
    doc = re.sub(r":[a-z]+:`~[^`]*?\.?([^.`]+)`", r"\1", doc)
    return re.sub(r":[a-z]+:`([^`]+)`", r"\1", doc).replace("``", "")
