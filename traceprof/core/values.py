"""Values from outside: integers and real numbers from trace files, booleans from option strings.
One rule each.

Every parser reads an integer from JSON, pickles and YAML through one of two rules, by what the
field is, so that a value means the same in every source:

- **A record's number** (a time, a duration, a sequence number, a count, a size, a record id) is
  a JSON integer: :func:`record_int` (:func:`json_int`). A string (``"7"``), a float (``7.0``,
  ``1e18``: no float64 holds an epoch ns exactly) or a bool is no integer there, and the record
  is bad, as any other value that cannot be stored: an error naming the file, the record and the
  value, or with ``--skip-bad-events`` the record skipped and counted (a source that keeps the
  rest of the record reads the value as absent, said and counted). The Flight Recorder, NCCL
  profiler-plugin and NCCL Inspector readers and Kineto's collective metadata follow it.
- **An identity** (a rank, a world size, a device or stream id, a correlation id) written as a
  string or float that is an integer (``"7"``, ``7.0``) is read as it, and said and counted where
  it is read (:func:`identity_int`, :func:`spelled_int` names how it was written:
  ``distributedInfo.world_size is '7', a string: read as its integer``); one that is no integer is
  ignored, said and counted.

Under both, what is an integer at all is :func:`integer`'s rule:

- an ``int`` is itself; a ``bool`` is *not* an integer (``true`` is no rank and no id);
- a float is an integer only without a fraction (``2.0`` is 2; ``1.5`` is none: truncated to 1
  it would link a kernel to another's launch, or a rank to another rank); not when infinite/NaN;
- a string is an integer when Python reads it as one in any base (``"12"``, ``" 7 "``, ``"0x1f"``);
- anything else (None, lists, objects) is none.

A time written as a number's text (Kineto's and the NCCL plugin's decimal microseconds) is read
from that text exactly (``traceprof.core.timeconv``), never through a float.

A real number (a bandwidth, a rate a source reports) is read through :func:`number`: a JSON
number, ``int`` or ``float``, that is finite; not a ``bool``, not a string.

Which callers bound the value (int64, int32) and what they do with a bad one (an error naming the
record, a warning, NULL) stays theirs; :func:`checked_int` and :func:`record_int` also say *why*
there is no value.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = [
    "integer",
    "checked_int",
    "json_int",
    "record_int",
    "spelled_int",
    "identity_int",
    "world_size_int",
    "number",
    "parse_bool",
    "BOOL_WORDS",
]

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


def json_int(v: Any) -> int | None:
    """``v`` when it is a JSON integer (an ``int``, not a ``bool``), else None: a record's number
    (module doc) written as a string, a float or a boolean is none (``"7"`` and ``1.796e18`` were
    read, the float rounded by up to 256 ns)."""
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def record_int(v: Any, bits: int = 64) -> tuple[int | None, str | None]:
    """A record's number (module doc), or why there is none: (value, None); (None, None) for an
    absent value (None); (None, ``"not an integer"``) for anything but a JSON integer (``"7"``,
    ``7.0``, ``true``, ``"x"``); (None, ``"beyond int<bits>"``) for one that does not fit ``bits``
    signed bits."""
    if v is None:
        return None, None
    if json_int(v) is None:
        return None, "not an integer"
    return checked_int(v, bits)


def spelled_int(v: Any) -> str | None:
    """How a value :func:`integer` reads as an integer is written when it is no JSON integer:
    ``"a string"`` (``"7"``, ``"0x1f"``), ``"a float"`` (``7.0``); None for an ``int`` and for a
    value that is no integer (``"4.0"``, ``7.9``, ``true``: :func:`checked_int` says why)."""
    if isinstance(v, bool) or isinstance(v, int) or integer(v) is None:
        return None
    return "a string" if isinstance(v, str) else "a float"


def identity_int(v: Any) -> tuple[int | None, str | None]:
    """A rank or world size from a trace, and what to say about it: (value, None) for a JSON
    integer or an absent value (None, None); (None, ``"not an integer: ignored"`` or ``"beyond
    int64: ignored"``) for one :func:`checked_int` refuses; (value, ``"a string: read as its
    integer"`` / ``"a float: ..."``) for a string or float that writes one (:func:`spelled_int`).
    The caller warns ``<file>: <field> is <value>, <what>`` and counts ``<field> <what>`` in
    ``traces.meta.repaired``."""
    n, problem = checked_int(v)  # one beyond int32 is refused by the store, naming it
    if problem is not None:
        return None, f"{problem}: ignored"
    spelled = spelled_int(v)
    return n, None if spelled is None else f"{spelled}: read as its integer"


def world_size_int(v: Any) -> tuple[int | None, str | None]:
    """A world size from a trace, and what to say about it: :func:`identity_int`'s rule, and one
    below 1 (``-3``, ``0``: no job has it) is ignored as well, (None, ``"not a positive integer:
    ignored"``), as a rank that is not an integer is; it was stored as given."""
    n, said = identity_int(v)
    if n is not None and n < 1:
        return None, "not a positive integer: ignored"
    return n, said


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
