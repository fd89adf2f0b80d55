"""Options of the fitting methods (private): parsing ``KEY=VALUE`` and checking values.

Each check returns the option as a plain Python number or raises
:class:`~lead.errors.InvalidInputError` whose ``param`` names the option.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import unicodedata
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from lead.errors import InvalidInputError

__all__ = [
    "API_KEY",
    "ECHO_LIMIT",
    "FIT_METHODS_HELP",
    "check_float_option",
    "check_int_option",
    "cut",
    "echo",
    "fraction_argument",
    "name_problem",
    "open_fraction_argument",
    "parse_option_items",
    "seconds_argument",
    "seed_argument",
    "text_argument",
]

#: The fitting methods as the command lines list them, then the aliases
#: (:data:`lead.fitting.METHODS`; a test keeps the two in step).
FIT_METHODS_HELP = (
    "ridge | procrustes | mlp | invertible | anchors | unsupervised | local | gated "
    "(aliases: affine = ridge, orthogonal = procrustes)"
)


def parse_option_items(items: Sequence[str]) -> dict[str, Any]:
    """``--option KEY=VALUE`` items of the CLI as a dict, each value parsed as JSON when it
    is JSON (``alpha=0.01``, ``scaling=true``) and kept as a string otherwise.

    Raises
    ------
    InvalidInputError
        For an item without ``=`` or without a key.
    """
    options: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise InvalidInputError(f"--option must look like key=value, got {item!r}", param=item)
        try:
            options[key.strip()] = json.loads(raw)
        except (ValueError, RecursionError):  # not JSON: the text itself
            options[key.strip()] = raw
    return options


#: The largest seed accepted: torch and NumPy generators take 64-bit seeds.
MAX_SEED = 2**63 - 1


#: What an API key may hold (the service's LEAD_API_KEYS and the client's key): printable
#: ASCII without spaces, what an HTTP client can send as a bearer token (RFC 6750).
API_KEY = re.compile(r"[\x21-\x7e]+")

#: Unicode categories a name may not hold: controls (C0, DEL, C1), format characters (bidi
#: overrides, zero-width ones), line and paragraph separators, surrogates.
_UNPRINTABLE = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})


def name_problem(text: str) -> str | None:
    """Why ``text`` cannot be a name (a model id, a path): empty or blank, starting or
    ending with whitespace (``"m "`` and ``"m"`` would be two models, shown alike), or
    holding a character that is not shown as itself (a control, a bidi override, a line
    separator); None when it can. A name is shown in listings, logs, ids and metric
    labels."""
    if not text.strip():
        return "must not be empty"
    if text != text.strip():
        return "must not start or end with whitespace"
    for c in text:
        if unicodedata.category(c) in _UNPRINTABLE:
            return f"must not hold the control or format character U+{ord(c):04X}"
    return None


def text_argument(text: str) -> str:
    """The ``type`` of a command line's names and paths (``--out``, ``--source-model``): not
    empty, no control characters (``--out ""`` wrote into the current folder, and an empty
    model id was recorded in the stitch).

    Raises
    ------
    argparse.ArgumentTypeError
        Shown by argparse as a usage error.
    """
    problem = name_problem(text)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return text


def seed_argument(text: str) -> int:
    """The ``type`` of a command line's ``--seed``: an integer in [0, :data:`MAX_SEED`]
    (NumPy refuses a negative seed with a traceback, deep in a fit).

    Raises
    ------
    argparse.ArgumentTypeError
        Shown by argparse as a usage error.
    """
    try:
        seed = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
    if not 0 <= seed <= MAX_SEED:
        raise argparse.ArgumentTypeError(f"must be in [0, 2**63 - 1], got {seed}")
    return seed


def _float_argument(text: str, what: str, within: Callable[[float], bool], rule: str) -> float:
    """``text`` as a finite float that ``within`` accepts, for an argparse ``type``."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None
    if not (math.isfinite(value) and within(value)):
        raise argparse.ArgumentTypeError(f"must be {rule}, got {text!r}")
    return value


def seconds_argument(text: str) -> float:
    """The ``type`` of a command line's durations (``--interval``, ``--timeout``): a finite
    number of seconds >= 0 (``-1`` reached ``time.sleep`` with a traceback after the job
    was submitted; ``nan`` waited for ever).

    Raises
    ------
    argparse.ArgumentTypeError
        Shown by argparse as a usage error.
    """
    return _float_argument(text, "a number of seconds", lambda v: v >= 0, "a finite number >= 0")


def fraction_argument(text: str) -> float:
    """The ``type`` of a command line's ``--holdout``: a finite number in [0, 1).

    Raises
    ------
    argparse.ArgumentTypeError
        Shown by argparse as a usage error.
    """
    return _float_argument(text, "a number", lambda v: 0 <= v < 1, "in [0, 1)")


def open_fraction_argument(text: str) -> float:
    """The ``type`` of ``lead jobs submit --holdout``: a finite number in (0, 1), as the
    service takes it.

    Raises
    ------
    argparse.ArgumentTypeError
        Shown by argparse as a usage error.
    """
    return _float_argument(text, "a number", lambda v: 0 < v < 1, "in (0, 1)")


#: Most characters of a client's value that a message quotes (:func:`echo`).
ECHO_LIMIT = 200


def echo(value: str, limit: int = ECHO_LIMIT) -> str:
    """``repr(value)`` for an error message, cut to ``limit`` characters with an ellipsis.

    Client-supplied names and ids can be megabytes long; a message quotes only their start.
    """
    if len(value) <= limit:
        return repr(value)
    return f"{value[:limit]!r}… ({len(value)} characters)"


def cut(text: str, limit: int = ECHO_LIMIT) -> str:
    """``text`` cut to ``limit`` characters with an ellipsis (an error's ``param``)."""
    return text if len(text) <= limit else f"{text[:limit]}…"


def _shown(value: Any) -> Any:
    """``value`` for an error message: an integer of hundreds of digits is not echoed."""
    if isinstance(value, int) and value.bit_length() > 128:
        return "a huge integer"
    return value


def check_int_option(value: Any, name: str, *, minimum: int, maximum: int | None = None) -> int:
    """``value`` as an ``int`` in ``[minimum, maximum]``; bools, floats and None are refused.

    Raises
    ------
    InvalidInputError
        If ``value`` is not an integer or is out of range (``param`` is ``name``).
    """
    if isinstance(value, np.integer):  # NumPy's integers are integers
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInputError(f"{name} must be an integer, got {value!r:.80}", param=name)
    if value < minimum or (maximum is not None and value > maximum):
        upper = "" if maximum is None else f" and <= {maximum}"
        raise InvalidInputError(
            f"{name} must be >= {minimum}{upper}, got {_shown(value)}", param=name
        )
    return int(value)


def check_float_option(
    value: Any, name: str, *, minimum: float, inclusive: bool = True, maximum: float | None = None
) -> float:
    """``value`` as a finite ``float`` above ``minimum`` (``>=`` when ``inclusive``).

    Raises
    ------
    InvalidInputError
        If ``value`` is not a real number (bools and None included), is not finite, or is
        out of range (``param`` is ``name``).
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidInputError(f"{name} must be a number, got {value!r:.80}", param=name)
    try:
        number = float(value)
    except OverflowError:  # an int beyond the float range
        number = math.inf
    low_ok = number >= minimum if inclusive else number > minimum
    if not math.isfinite(number) or not low_ok or (maximum is not None and number > maximum):
        bound = f"{'>=' if inclusive else '>'} {minimum:g}"
        if maximum is not None:
            bound += f" and <= {maximum:g}"
        raise InvalidInputError(
            f"{name} must be finite and {bound}, got {_shown(value)!r}", param=name
        )
    return number
