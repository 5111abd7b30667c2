"""Helpers shared by the analyses (not an analysis).

Range checks for parameters, called from each ``Params.__post_init__``: every check raises
:class:`traceprof.errors.UsageError` naming the parameter, the value given and the allowed range,
so that the CLI (``-p key=value``) and Python API users get the same message. And
:func:`whole_ns`, the one rounding of ns statistics to int64.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import polars as pl

from traceprof.errors import UsageError

__all__ = ["at_least", "fraction", "choice", "positive_or_none", "whole_ns"]


def whole_ns(x: pl.Expr) -> pl.Expr:
    """A statistic of ns values (mean, median, percentile) as int64 ns, halves rounded away from
    zero as DuckDB's ``round`` does (``round(x)::BIGINT``)."""
    return x.round(0, mode="half_away_from_zero").cast(pl.Int64)


def _finite(name: str, value: float) -> float:
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise UsageError(f"{name}={value!r}: expected a number") from None
    if not math.isfinite(x):
        raise UsageError(f"{name}={value!r}: expected a finite number")
    return x


def at_least(name: str, value: float, low: float = 0, meaning: str = "") -> None:
    """``value`` must be a finite number >= ``low``; ``meaning`` explains the boundary value."""
    if _finite(name, value) < low:
        extra = f" ({meaning})" if meaning else ""
        raise UsageError(f"{name}={value!r}: must be >= {low:g}{extra}")


def fraction(name: str, value: float) -> None:
    """``value`` must be a finite number in [0, 1]."""
    if not 0.0 <= _finite(name, value) <= 1.0:
        raise UsageError(f"{name}={value!r}: must be between 0 and 1")


def choice(name: str, value: str, allowed: Iterable[str]) -> None:
    """``value`` must be one of ``allowed``."""
    allowed = list(allowed)
    if value not in allowed:
        raise UsageError(f"{name}={value!r}: choose one of {', '.join(allowed)}")


def positive_or_none(name: str, value: float | str | None) -> float | None:
    """None (not given), or a finite number > 0 (a string is converted: the CLI passes one for
    parameters whose default is None). Returns the number."""
    if value is None:
        return None
    x = _finite(name, value)  # type: ignore[arg-type]
    if x <= 0:
        raise UsageError(f"{name}={value!r}: must be a finite number > 0")
    return x
