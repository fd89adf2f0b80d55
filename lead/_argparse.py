"""The ``lead`` command line's parser (private): argparse's, with a command's own mistakes
reported by the command.

argparse leaves an unknown option of a subcommand to the top-level parser, which prints
``usage: lead [-h] COMMAND ...`` and ``unrecognized arguments: --batch-szie 10``; and where
a mistyped option is also a required one (``--inptu`` for ``--input``), it reports only the
required option as missing. :class:`CommandParser` makes the command that received them
say so, with its own usage, the closest option it has, and before any other complaint.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

__all__ = ["CommandParser"]

#: What argparse takes for a negative number rather than an option (``--interval -1``).
_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")


class CommandParser(argparse.ArgumentParser):
    """:class:`argparse.ArgumentParser` whose leaf commands (those without subcommands of
    their own) report their unknown options themselves: ``lead translate: error:
    unrecognized arguments: --batch-szie (did you mean --batch-size?)``, under
    ``lead translate``'s usage. Subcommands made with ``add_subparsers`` are of this class
    too (argparse's default ``parser_class`` is the parent's)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._arguments: list[str] = []

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        self._arguments = list(sys.argv[1:] if args is None else args)
        parsed, extras = super().parse_known_args(args, namespace)
        if extras and self._is_leaf():
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed, extras

    def error(self, message: str) -> NoReturn:
        if self._is_leaf():
            unknown = self._unknown_options()
            if unknown:
                message = f"unrecognized arguments: {', '.join(unknown)}"
        super().error(message)

    def _is_leaf(self) -> bool:
        return not any(isinstance(a, argparse._SubParsersAction) for a in self._actions)

    def _unknown_options(self) -> list[str]:
        """The options given to this command that it has none of (nor, with
        ``allow_abbrev``, as a unique prefix), each with the closest one it has."""
        known = [name for action in self._actions for name in action.option_strings]
        unknown = []
        for token in self._arguments:
            if token == "--":
                break
            if not token.startswith("-") or token == "-" or _NEGATIVE_NUMBER.match(token):
                continue
            name = token.split("=", 1)[0]
            prefix_of = [k for k in known if k.startswith(name)] if self.allow_abbrev else []
            if name in known or (name.startswith("--") and len(prefix_of) == 1):
                continue
            close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
            unknown.append(f"{name} (did you mean {close[0]}?)" if close else name)
        return unknown
