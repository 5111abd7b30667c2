"""Values from outside: integers and real numbers from trace files, booleans from option strings.
One rule each.

Every parser reads integers (ids, ranks, sizes, times) from JSON, pickles and YAML through
:func:`integer` or :func:`checked_int`, so a value means the same in every source:

- an ``int`` is itself; a ``bool`` is *not* an integer (``true`` is no rank and no id);
- a float is an integer only without a fraction (``2.0`` is 2; ``1.5`` is none: truncated to 1
  it would link a kernel to another's launch, or a rank to another rank); not when infinite/NaN;
- a string is an integer when Python reads it as one in any base (``"12"``, ``" 7 "``, ``"0x1f"``);
- anything else (None, lists, objects) is none.

A real number (a bandwidth, a rate a source reports) is read through :func:`number`: a JSON
number, ``int`` or ``float``, that is finite; not a ``bool``, not a string.

Which callers bound the value (int64, int32) and what they do with a bad one (an error naming the
record, a warning, NULL) stays theirs; :func:`checked_int` also says *why* there is no value.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["integer", "checked_int", "number", "parse_bool", "BOOL_WORDS"]

#: Option words read as booleans (``-p hta=true``, ``TRACEPROF_NO_CACHE=1``), lower case.
BOOL_WORDS = {
    "1": True,
    "true": True,
    "yes": True,
    "on": True,
    "0": False,
    "false": False,
    "no": False,
    "off": False,
}


def integer(v: Any) -> int | None:
    """The integer a value from a trace file stands for (module doc), unbounded; None when it is
    not one."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float):
        return int(v) if math.isfinite(v) and v.is_integer() else None
    if isinstance(v, str):
        try:
            return int(v, 0)
        except ValueError:
            return None
    return None


def checked_int(v: Any, bits: int = 64) -> tuple[int | None, str | None]:
    """An integer from a trace value, or why there is none: (value, None); (None, None) for an
    absent value (None); (None, ``"beyond int<bits>"``) for an integer (or integral float, or
    numeric string) that does not fit ``bits`` signed bits; (None, ``"not an integer"``) for
    anything else :func:`integer` refuses (a bool, ``1.5``, ``"abc"``, a list)."""
    if v is None:
        return None, None
    n = integer(v)
    if n is None:
        return None, "not an integer"
    if not -(2 ** (bits - 1)) <= n < 2 ** (bits - 1):
        return None, f"beyond int{bits}"
    return n, None


def number(v: Any) -> float | None:
    """The real number a value from a trace file stands for (module doc) as a float; None when it is
    not one (a bool, a string, None, infinite or NaN)."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    try:
        x = float(v)
    except OverflowError:  # an int beyond any float
        return None
    return x if math.isfinite(x) else None


def parse_bool(raw: str) -> bool:
    """An option string as a boolean (:data:`BOOL_WORDS`, any case, surrounding blanks ignored).

    Raises:
        ValueError: Not one of those words.
    """
    word = str(raw).strip().lower()
    if word not in BOOL_WORDS:
        raise ValueError(raw)
    return BOOL_WORDS[word]
