"""Value coercions shared by the Kineto parser modules."""

from __future__ import annotations

import math
from typing import Any

import msgspec

__all__ = ["args_dict", "int_or_none"]


def args_dict(text: str | bytes) -> dict[str, Any]:
    """An event's args as a dict (non-object args become ``{"value": ...}``; invalid JSON ``{}``)."""
    try:
        d = msgspec.json.decode(text)
    except msgspec.DecodeError:
        return {}
    return d if isinstance(d, dict) else {"value": d}


def int_or_none(v: Any, *, keep_large: bool = False) -> int | None:
    """An int64 from a JSON value (int, bool, numeric string in any base, finite float), else None.

    With ``keep_large`` an integer beyond int64 is returned as is, for the parser's per-event range
    check (``traceprof.limits``) to reject with the event index instead of storing NULL.
    """
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, int):
        return v if keep_large or -(2**63) <= v < 2**63 else None
    if isinstance(v, str):
        try:
            return int(v, 0)
        except ValueError:
            return None
    if isinstance(v, float) and math.isfinite(v):
        return int(v)
    return None
