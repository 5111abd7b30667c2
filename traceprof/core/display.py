"""How a value is shown in a table cell, for the terminal and the HTML report alike: numbers with
separators (:func:`plain`), durations in human units, long names shortened.

Typer-free so that it can be tested alone; ``traceprof.cli`` prints what this returns and
``traceprof.render.report`` renders its cells with :func:`plain`. JSON and CSV output never go through
here: they keep exact ns and full names.

- ``units="human"`` (default): an int ``*_ns`` column is shown as ``12.3 ms`` / ``4.56 s`` /
  ``789 us`` / ``12 ns`` (three significant digits) under the column name without ``_ns``
  (``step_ns`` -> ``step``, unless that name is taken). A timestamp column (``ts_ns``, ``start_ns``,
  ``end_ns``, ``enter_ns``, ``*_start_ns``, ``*_arrival_ns`` ...: epoch ns, not a duration) is shown
  as the UTC time of day with microseconds, ``23:40:41.030643`` (with the date when the column
  spans two days), under the name ``<name>_utc`` (``first_arrival_ns`` -> ``first_arrival_utc``); a
  column of that name whose values are below 1973 in epoch ns holds offsets, shown as durations.
  ``units="ns"``: exact ns with thousands separators.
- String cells longer than ``width`` are shortened to their family (``traceprof.core.names.shorten``);
  the full text is in ``-f json``/``csv``.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import typing
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from traceprof.core.lazy import lazy
from traceprof.core.names import shorten

if TYPE_CHECKING:
    import polars as pl
else:
    pl = lazy("polars")

__all__ = [
    "UNITS",
    "duration",
    "size",
    "timestamp",
    "plain",
    "table_columns",
    "table_rows",
    "row_cells",
    "cell",
    "describe",
]

UNITS = ("human", "ns")

#: Names of epoch-ns timestamp columns (points in time); other ``_ns`` columns are durations
#: (``dur_ns``, ``wait_ns``, ``arrival_skew_ns``, ``window_ns``).
_TIMESTAMP = re.compile(r"(?:^|_)(?:ts|start|end|enter|exit|begin|arrival)_ns$")
#: Epoch ns below this (1973-03-03) are offsets from some origin, not times of day.
EPOCH_MIN_NS = 10**17
_NS_PER_S = 10**9


def duration(ns: float) -> str:
    """``ns`` nanoseconds in the largest unit that keeps it at or above 1: ``812 ms``, ``1.23 s``."""
    a = abs(ns)
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("us", 1e3)):
        if a >= scale:
            v = ns / scale
            text = f"{v:.3g}"
            return f"{text} {unit}" if "e" not in text else f"{v:,.0f} {unit}"  # 999.9 -> 1,000, not 1e+03
    return f"{ns:,.0f} ns"


def size(nbytes: float) -> str:
    """``nbytes`` in the largest binary unit that keeps it at or above 1: ``6.17 GiB``, ``512 MiB``, ``300 B``."""
    a = abs(nbytes)
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if a >= scale:
            return f"{nbytes / scale:.3g} {unit}" if a < 1000 * scale else f"{nbytes / scale:,.0f} {unit}"
    return f"{nbytes:,.0f} B"


def timestamp(ns: int, date: bool = False) -> str:
    """Epoch ``ns`` as the UTC time of day with microseconds, ``23:40:41.030643`` (truncated, not
    rounded); with ``date``, ``2026-11-30 23:40:41.030643``."""
    sec, rest = divmod(int(ns), _NS_PER_S)
    t = datetime.fromtimestamp(sec, timezone.utc)
    return f"{t:%Y-%m-%d %H:%M:%S}.{rest // 1000:06d}" if date else f"{t:%H:%M:%S}.{rest // 1000:06d}"


def plain(v: object, decimals: int = 2) -> str:
    """The text of one value in a table, the one rule for every table (terminal, report, ``sql``):
    None is empty; an integer with thousands separators (``1,234``); a float with ``decimals``
    places (``0.25``), a whole one of 1,000 or more without (``12,345``); bytes with each
    non-printable byte and the backslash as ``\\xNN``; anything else as ``str()``."""
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:,.0f}" if v.is_integer() and abs(v) >= 1000 else f"{v:,.{decimals}f}"
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}"
    if isinstance(v, bytes):
        return "".join(chr(b) if 0x20 <= b < 0x7F and b != 0x5C else f"\\x{b:02x}" for b in v)
    return str(v)


def cell(v: object, ns: bool | str = False, width: int = 48) -> str:
    """One terminal table cell: a duration when ``ns`` is True (human units), a time of day when
    it is ``"time"`` (``"date"``: with the date), strings shortened to ``width``, else :func:`plain`."""
    if v is None:
        return ""
    if ns in ("time", "date") and isinstance(v, int | float) and not isinstance(v, bool):
        return timestamp(int(v), ns == "date")
    if ns and isinstance(v, int | float) and not isinstance(v, bool):
        return duration(float(v))
    if isinstance(v, str):
        return shorten(v, width)
    return plain(v)


def _kinds(df: pl.DataFrame, units: str) -> list[bool | str]:
    """Per column: False (as it is), True (a human duration), "time" or "date" (a timestamp)."""
    out: list[bool | str] = []
    for c in df.columns:
        if units != "human" or not c.endswith("_ns") or not df[c].dtype.is_numeric():
            out.append(False)
            continue
        col = df[c].drop_nulls()
        if not _TIMESTAMP.search(c) or col.is_empty() or col.min() < EPOCH_MIN_NS:  # type: ignore[operator]
            out.append(True)
            continue
        days = {int(v) // (86_400 * _NS_PER_S) for v in (col.min(), col.max())}  # type: ignore[arg-type]
        out.append("time" if len(days) == 1 else "date")
    return out


def table_columns(df: pl.DataFrame, units: str = "human") -> list[str]:
    """Column headers: ``_ns`` dropped where the cells are human durations (and the name is free),
    ``_ns`` -> ``_utc`` where they are times of day."""
    taken = set(df.columns)
    out = []
    for c, kind in zip(df.columns, _kinds(df, units), strict=True):
        short = c if not kind else c[:-3] + "_utc" if kind in ("time", "date") else c[:-3]
        out.append(short if short == c or short not in taken else c)
    return out


def table_rows(df: pl.DataFrame, units: str = "human", width: int = 48) -> Iterator[Sequence[str]]:
    """The cells of ``df`` as strings (see :func:`cell`). Distinct strings of a column whose
    shortened forms would read the same (two template instances of one kernel) are numbered in
    order of appearance, ``name… #1``, ``name… #2``, so that two rows never look alike."""
    kinds = _kinds(df, units)
    names = [
        _distinct_short(df[c].drop_nulls().unique(maintain_order=True).to_list(), width)
        if df[c].dtype == pl.String
        else None
        for c in df.columns
    ]
    for row in df.iter_rows():
        yield [
            names[i].get(v, "") if names[i] is not None and v is not None else cell(v, k, width)  # type: ignore[union-attr]
            for i, (v, k) in enumerate(zip(row, kinds, strict=True))
        ]


def row_cells(rows: Sequence[Sequence[object]], width: int = 48) -> tuple[list[bool], list[list[str]]]:
    """:func:`table_rows` for rows of Python values (DuckDB's ``fetchall()``), without polars, with
    ``units="ns"``'s cells: which columns are numeric (every value an int or float, not a bool),
    and each row's cells (strings shortened and numbered as :func:`table_rows` does)."""
    cols = list(zip(*rows, strict=True)) if rows else []
    numeric = [
        all(isinstance(v, int | float) and not isinstance(v, bool) for v in c if v is not None) for c in cols
    ]
    names: list[dict[str, str] | None] = [
        _distinct_short(dict.fromkeys(v for v in c if isinstance(v, str)), width)
        if all(isinstance(v, str) for v in c if v is not None)
        else None
        for c in cols
    ]

    def one(i: int, v: object) -> str:
        short = names[i]
        return short[v] if short is not None and isinstance(v, str) else cell(v, False, width)

    cells = [[one(i, v) for i, v in enumerate(row)] for row in rows]
    return numeric, cells


def _distinct_short(values: Iterable[str], width: int) -> dict[str, str]:
    """Each of the distinct strings ``values`` (in order) -> its cell: :func:`traceprof.core.names.shorten`,
    numbered where two strings shorten alike (see :func:`table_rows`)."""
    short = {v: shorten(v, width) for v in values}
    seen: dict[str, list[str]] = {}
    for v, s in short.items():
        seen.setdefault(s, []).append(v)
    for vs in seen.values():
        if len(vs) > 1:
            for k, v in enumerate(vs, 1):
                tag = f" #{k}"
                short[v] = shorten(v, max(width - len(tag), 1)) + tag
    return short


def describe(an: Any) -> str:
    """Help text of a registered analysis (``traceprof analyze NAME --help``), from its spec
    (``traceprof.engine.analysis.Analysis``): its summary and algorithm, its parameters (``-p KEY=VALUE``,
    with type and default) and their documentation, and its tables (``--table NAME``) with their
    declared columns (type, unit, doc)."""
    lines = [
        f"traceprof analyze {an.name} [--run RUN] [-p KEY=VALUE ...] [--table NAME] [-f table|json|csv]",
        "",
    ]
    lines += [inspect.cleandoc(an.doc), "", "Parameters (-p KEY=VALUE):"]
    lines += [f"  {name:22} {kind:14} default {default!r}" for name, kind, default in param_rows(an.params)]
    if lines[-1] == "Parameters (-p KEY=VALUE):":
        lines.append("  none")
    if an.params.__doc__ and not an.params.__doc__.startswith(an.params.__name__ + "("):
        lines += ["", inspect.cleandoc(an.params.__doc__)]
    lines += ["", f"Tables (--table NAME): {', '.join(t.name for t in an.frames)}"]
    for t in an.frames:
        lines += ["", f"{t.name}: {t.doc}"]
        lines += [f"  {c.name:26} {c.type:9} {c.comment()}" for c in t.columns]
    return "\n".join(lines)


def param_rows(params: type) -> list[tuple[str, str, object]]:
    """(name, type as written, default) of each parameter of a ``Params`` dataclass but ``run``."""
    hints = typing.get_type_hints(params)
    out = []
    for f in dataclasses.fields(params):
        if f.name == "run":
            continue
        default = f.default if f.default is not dataclasses.MISSING else "required"
        kind = hints.get(f.name, f.type)
        out.append((f.name, getattr(kind, "__name__", None) or str(kind).replace("typing.", ""), default))
    return out
