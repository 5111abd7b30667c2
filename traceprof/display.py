"""How the CLI shows a frame as a terminal table: durations in human units, long names shortened.

Typer-free so that it can be tested alone; ``traceprof.cli`` prints what this returns. JSON and
CSV output never go through here: they keep exact ns and full names.

- ``units="human"`` (default): an int ``*_ns`` column is shown as ``12.3 ms`` / ``4.56 s`` /
  ``789 us`` / ``12 ns`` (three significant digits) under the column name without ``_ns``
  (``step_ns`` -> ``step``, unless that name is taken); ``units="ns"``: exact ns with thousands separators.
- String cells longer than ``width`` are shortened to their family (``traceprof.names.shorten``);
  the full text is in ``-f json``/``csv``.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from collections.abc import Iterator, Sequence
from typing import Any

import polars as pl

from traceprof.names import shorten

__all__ = ["UNITS", "duration", "table_columns", "table_rows", "cell", "describe"]

UNITS = ("human", "ns")


def duration(ns: float) -> str:
    """``ns`` nanoseconds in the largest unit that keeps it at or above 1: ``812 ms``, ``1.23 s``."""
    a = abs(ns)
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("us", 1e3)):
        if a >= scale:
            v = ns / scale
            text = f"{v:.3g}"
            return f"{text} {unit}" if "e" not in text else f"{v:,.0f} {unit}"  # 999.9 -> 1,000, not 1e+03
    return f"{ns:,.0f} ns"


def cell(v: object, ns: bool = False, width: int = 48) -> str:
    """One table cell: a duration when ``ns`` (human units), numbers with separators, strings shortened."""
    if v is None:
        return ""
    if ns and isinstance(v, int | float) and not isinstance(v, bool):
        return duration(float(v))
    if isinstance(v, float):
        return f"{v:,.0f}" if v.is_integer() and abs(v) >= 1000 else f"{v:,.2f}"
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}"
    if isinstance(v, str):
        return shorten(v, width)
    return str(v)


def _human_cols(df: pl.DataFrame, units: str) -> list[bool]:
    return [units == "human" and c.endswith("_ns") and df[c].dtype.is_numeric() for c in df.columns]


def table_columns(df: pl.DataFrame, units: str = "human") -> list[str]:
    """Column headers: ``_ns`` dropped where the cells are human durations (and the name is free)."""
    taken = set(df.columns)
    out = []
    for c, human in zip(df.columns, _human_cols(df, units), strict=True):
        short = c[:-3] if human else c
        out.append(short if short == c or short not in taken else c)
    return out


def table_rows(df: pl.DataFrame, units: str = "human", width: int = 48) -> Iterator[Sequence[str]]:
    """The cells of ``df`` as strings (see :func:`cell`)."""
    human = _human_cols(df, units)
    for row in df.iter_rows():
        yield [cell(v, h, width) for v, h in zip(row, human, strict=True)]


def describe(an: Any) -> str:
    """Help text of a registered analysis (``traceprof analyze NAME --help``): its summary, its
    parameters (``-p KEY=VALUE``, with type and default) and documentation, and its tables
    (``--table NAME``) with their columns as the result documents them."""
    lines = [f"traceprof analyze {an.name} [--run RUN] [-p KEY=VALUE ...] [--table NAME] [-f table|json|csv]", ""]
    lines += [inspect.cleandoc(an.doc), "", "Parameters (-p KEY=VALUE):"]
    for f in dataclasses.fields(an.params):
        if f.name == "run":
            continue
        default = f.default if f.default is not dataclasses.MISSING else "required"
        lines.append(f"  {f.name:22} {str(f.type):14} default {default!r}")
    if len(lines) and lines[-1] == "Parameters (-p KEY=VALUE):":
        lines.append("  none")
    if an.params.__doc__ and not an.params.__doc__.startswith(an.params.__name__ + "("):
        lines += ["", inspect.cleandoc(an.params.__doc__)]
    result = typing.get_type_hints(an.run).get("return")
    if result is not None and dataclasses.is_dataclass(result):
        tables = [f.name for f in dataclasses.fields(result) if "DataFrame" in str(f.type)]
        lines += ["", f"Tables (--table NAME): {', '.join(tables)}"]
        if result.__doc__:
            lines += [inspect.cleandoc(result.__doc__)]
    return "\n".join(lines)
