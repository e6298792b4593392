"""Docstrings as ``--help`` text, and usage errors in two lines (:class:`CommandParser`).
Torch- and pandas-free."""

from __future__ import annotations

import argparse
import difflib
import re
import sys

from dg_plugins.runtime import swapped

EVERY_FLAG = "[FLAGS] (every flag: --help)"


def plain_text(doc: str) -> str:
    """``doc`` without reStructuredText markup (roles and literals), for --help."""
    doc = re.sub(r":[a-z]+:`~[^`]*?\.?([^.`]+)`", r"\1", doc)
    return re.sub(r":[a-z]+:`([^`]+)`", r"\1", doc).replace("``", "")


class CommandParser(argparse.ArgumentParser):
    """argparse for dg_plugins' commands: argparse's ``--help``, but a usage error in two lines,
    exit status 2: a short usage line and the error, with "did you mean" (:func:`did_you_mean`)."""

    def __init__(self, *args, short_usage: str | None = None, **kwargs):
        self.short_usage = short_usage
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args=None, namespace=None):
        args = None if args is None else list(args)  # an iterator is read once, here
        self.given_argv = None if args is None else [str(word) for word in args]
        return super().parse_known_args(args, namespace)

    def error(self, message: str):
        report_usage_error(self, message)


def short_usage(parser: argparse.ArgumentParser) -> str:
    """``parser.short_usage``, else the command with its positional arguments and required flags."""
    if given := getattr(parser, "short_usage", None):
        return given
    kept = [action for action in parser._actions if not action.option_strings or action.required]
    formatter = parser._get_formatter()
    formatter.add_usage(None, kept, [], prefix="")
    return f"{' '.join(formatter.format_help().split())} {EVERY_FLAG}"


def did_you_mean(parser: argparse.ArgumentParser, message: str, argv: list[str] = ()) -> str:
    """``"; did you mean ...?"`` for argparse's ``message`` about an unknown flag, a missing
    required flag mistyped in ``argv``, or an invalid choice; "" when nothing is close."""
    options = [option for action in parser._actions for option in action.option_strings]
    flags = [option for option in options if option.startswith("--")]
    unknown = re.match(r"unrecognized arguments: (.*)", message)
    required = re.match(r"the following arguments are required: (.*)", message)
    if unknown or required:
        # required: the words of argv that look like flags parser lacks (nor abbreviates)
        words = unknown.group(1).split() if unknown else [
            word for word in argv if word.startswith("--") and len(word) > 2
            and not any(flag.startswith(word.split("=", 1)[0]) for flag in options)]
        among = {flag.lstrip("-"): flag for flag in (flags if unknown else [
            w for w in required.group(1).split(", ") if w in flags])}
        hints = [(word, among[close[0]]) for word in words if word.startswith("-") and (
            close := difflib.get_close_matches(word.split("=", 1)[0].lstrip("-"), list(among),
                                               n=1, cutoff=0.75))]
        if len([w for w in words if w.startswith("-")]) == 1 and hints:
            return f"; did you mean {hints[0][1]}?"
        return ("; did you mean " + ", ".join(f"{flag} (for {word})" for word, flag in hints)
                + "?") if hints else ""
    if choice := re.search(r"invalid choice: (.*?) \(choose from (.*)\)$", message):
        choices = [c.strip().strip("'\"") for c in choice.group(2).split(",")]
        close = difflib.get_close_matches(choice.group(1).strip("'\""), choices, n=1)
        return f"; did you mean {close[0]!r}?" if close else ""
    return ""


def report_usage_error(parser: argparse.ArgumentParser, message: str):
    """Exit 2 after :class:`CommandParser`'s two lines."""
    argv = getattr(parser, "given_argv", None)
    argv = sys.argv[1:] if argv is None else argv
    parser.exit(2, f"usage: {short_usage(parser)}\n{parser.prog}: error: {message}"
                   f"{did_you_mean(parser, message, argv)}\n")


def short_usage_errors():
    """Within the block every argparse parser reports usage errors as :class:`CommandParser`."""
    return swapped(argparse.ArgumentParser, "error", report_usage_error)
