"""How a value is shown in a table cell, for the terminal and the HTML report alike: numbers with
separators (:func:`plain`), durations in human units, long names shortened.

Typer-free so that it can be tested alone; ``traceprof.cli`` prints what this returns and
``traceprof.render.report`` renders its cells with :func:`plain`. JSON and CSV output never go through
here: they keep exact ns and full names.

- ``units="human"`` (default): an int ``*_ns`` duration column is shown in one unit, s, ms, us or
  ns, chosen by the column's median (three significant digits there; a value below one unit whose
  rounding would keep fewer than two significant digits, three: ``0.545``, not ``1``), the header saying it
  (``step_ns`` -> ``step (ms)``); FLOP counts and byte sizes likewise (``flops (GFLOP)``,
  ``peak_bytes (GiB)``); a diff's metrics table each row in its metric's unit. A timestamp column (``ts_ns``, ``start_ns``,
  ``end_ns``, ``enter_ns``, ``*_start_ns``, ``*_arrival_ns`` ...: epoch ns, not a duration) is shown
  as the UTC time of day with microseconds, ``23:40:41.030643`` (with the date when the column
  spans two days), under the name ``<name>_utc`` (``first_arrival_ns`` -> ``first_arrival_utc``); a
  column of that name whose values are below 1973 in epoch ns holds offsets, shown as durations.
  ``units="ns"``: exact ns with thousands separators.
- String cells longer than ``width`` are shortened to their family (``traceprof.core.names.shorten``),
  or to the shortest form that tells them apart where families collide
  (``traceprof.core.names.distinct_short``); the full text is in ``-f json``/``csv``.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import typing
from collections.abc import Iterator, Sequence
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from traceprof.core.lazy import lazy
from traceprof.core.names import distinct_short, shorten

if TYPE_CHECKING:
    import polars as pl
else:
    pl = lazy("polars")

__all__ = [
    "UNITS",
    "PROSE_COLUMNS",
    "PROSE_WIDTH",
    "duration",
    "size",
    "timestamp",
    "plain",
    "shown_rows",
    "value_cell",
    "table_columns",
    "table_rows",
    "row_cells",
    "cell",
    "ColumnFormat",
    "column_formats",
    "format_cell",
    "metric_text",
    "describe",
]

UNITS = ("human", "ns")

#: Columns that hold traceprof's own sentences (a diff's ``reason``, a verdict's ``evidence`` or
#: ``text``, a waterfall's ``detail``, the runs' ``issues``): a terminal table shows them whole,
#: wrapped at :data:`PROSE_WIDTH` characters, where other text is shortened (cut in the middle, a
#: sentence read as "the baseline runs di…est, normal: 16").
PROSE_COLUMNS = frozenset({"reason", "evidence", "text", "detail", "issues"})
PROSE_WIDTH = 60
#: Most characters of one terminal table cell: a longer value (a 300 MB string from ``sql``) is
#: cut in the middle, saying its length (:func:`long_cell`); CSV and JSON print values whole.
TABLE_CELL_CHARS = 10_000

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


def long_cell(text: str) -> str:
    """``text`` itself when it has at most :data:`TABLE_CELL_CHARS` characters, else its first and
    last characters around ``… [N characters; -f csv or -f json prints the value whole] …``."""
    if len(text) <= TABLE_CELL_CHARS:
        return text
    half = TABLE_CELL_CHARS // 2
    return f"{text[:half]} … [{len(text):,} characters; -f csv or -f json prints the value whole] … {text[-half:]}"


def value_cell(column: str, v: object, decimals: int = 2) -> str:
    """One value of column ``column`` in any table (terminal, report, ``sql``, the runs'): the one
    rule for p-values, a float in a column named ``p_value`` or ``*p_value`` with two significant
    digits (``6e-08``, ``0.0028``, ``0.34``: two decimals read 6e-08 as 0.00, as they did 0.0028);
    any other value as :func:`plain` with ``decimals``, a float below 1 that these would show with
    fewer than two significant digits with three (a percent of 0.0617: ``0.0617``, not ``0.06``)."""
    if isinstance(v, float) and column.endswith("p_value"):
        return f"{v:.2g}"
    return _small_kept(v, plain(v, decimals)) if isinstance(v, float) else plain(v, decimals)


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


@dataclasses.dataclass(frozen=True)
class ColumnFormat:
    """How one column of a table is shown (:func:`column_formats`).

    Attributes:
        header: The column's heading: the name with its unit (``step (ms)``, ``flops (GFLOP)``,
            ``first_arrival_utc``), or the name as it is.
        kind: ``duration`` (ns shown in ``unit``), ``time``/``date`` (epoch ns as a UTC time of day,
            with the date), ``scaled`` (a count or size divided by ``scale``), ``metric`` (each row
            in the unit its ``metric`` cell names: a diff's metrics table), ``ns`` (exact ints) or
            ``plain`` (:func:`value_cell`: p-values with two significant digits).
        scale: What a value is divided by (ns per ``unit`` for a duration).
        unit: The unit the cells are in (``ms``), "" for none.
        decimals: Decimal places of the cells (chosen so the column's median has three
            significant digits, at most 3).
    """

    header: str
    kind: str = "plain"
    scale: float = 1.0
    unit: str = ""
    decimals: int = 2


#: Duration units, largest first: (name, ns per unit).
_TIME_UNITS = (("s", 1e9), ("ms", 1e6), ("us", 1e3), ("ns", 1.0))
#: Decimal prefixes of FLOP counts, largest first.
_FLOP_UNITS = (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6), ("FLOP", 1.0))
#: Binary size units, largest first.
_BYTE_UNITS = (("TiB", 2.0**40), ("GiB", 2.0**30), ("MiB", 2.0**20), ("KiB", 2.0**10), ("B", 1.0))
#: A column of FLOP counts: ``flops``, ``delta_flops``, ``flops_per_step`` (not ``tflops``, a rate).
_FLOPS = re.compile(r"(?:^|_)flops(?:_per_step)?$")
#: A column of byte counts: ``*_bytes``, ``bytes_in``.
_BYTES = re.compile(r"(?:^|_)bytes(?:_in|_out)?$")


def _typical(col: pl.Series) -> float:
    """The median of the column's non-zero magnitudes (0.0 when none): what its unit is chosen by."""
    a = col.drop_nulls().cast(pl.Float64).abs()
    a = a.filter(a > 0)
    return float(a.median()) if len(a) else 0.0  # type: ignore[arg-type]


def _pick(typical: float, units: tuple[tuple[str, float], ...]) -> tuple[str, float, int]:
    """(unit, scale, decimals) for a column whose typical magnitude is ``typical``."""
    unit, scale = next(((u, s) for u, s in units if typical >= s), units[-1])
    v = typical / scale
    decimals = 0 if scale == 1.0 and units is _TIME_UNITS else 0 if v >= 100 else 1 if v >= 10 else 2
    return unit, scale, decimals


def column_formats(df: pl.DataFrame, units: str = "human") -> list[ColumnFormat]:
    """How each column of ``df`` is shown: the one units rule of every table (terminal, report).

    With ``units="human"``: an int ``*_ns`` duration column in s, ms, us or ns, chosen by the
    column's median magnitude, the header saying it (``step_ns`` -> ``step (ms)``); an epoch-ns
    timestamp column as a time of day (``*_utc``); FLOP counts (``flops``, ``*_flops``) in
    TFLOP/GFLOP..., sizes (``*_bytes``) in GiB/MiB...; a diff's ``base``/``cand``/``delta`` columns
    beside a ``metric`` column each in the unit of its row's metric (``step_time_ns``: a duration per
    cell). Rates (``tflops``, ``*_gbps``) and ``_pct`` columns keep names that say their unit.
    With ``units="ns"``: ``_ns`` columns exact (ints with separators) under their own names.

    Raises:
        ValueError: ``units`` is not one of :data:`UNITS`.
    """
    if units not in UNITS:
        raise ValueError(f"units {units!r}: expected one of {', '.join(UNITS)}")
    taken = set(df.columns)
    metric = "metric" in df.columns and df["metric"].dtype == pl.String
    out = []
    for c in df.columns:
        dtype = df[c].dtype
        if not dtype.is_numeric():
            out.append(ColumnFormat(c))
            continue
        if units == "ns":
            out.append(ColumnFormat(c, "ns" if c.endswith("_ns") or c == "ns" else "plain"))
            continue
        if metric and c in _METRIC_VALUES:
            out.append(ColumnFormat(c, "metric"))
        elif c.endswith("_ns") or c == "ns":  # ``ns`` alone: a duration column (mfu's waterfall)
            out.append(_ns_format(c, df[c], taken))
        elif _FLOPS.search(c) or _BYTES.search(c):
            unit, scale, dec = _pick(_typical(df[c]), _FLOP_UNITS if _FLOPS.search(c) else _BYTE_UNITS)
            out.append(ColumnFormat(f"{c} ({unit})", "scaled", scale, unit, dec))
        elif dtype.is_float() and _whole(df[c]):  # a count held as a float (a median of calls): no ".00"
            out.append(ColumnFormat(c, decimals=0))
        else:
            out.append(ColumnFormat(c))
    return _same_unit(df, out)


#: Columns a table compares side by side (a diff's ``base_ns``, ``cand_ns``, ``delta_ns``): one unit.
_COMPARED = re.compile(r"^(base|cand|delta)_(.*)$")


def _same_unit(df: pl.DataFrame, formats: list[ColumnFormat]) -> list[ColumnFormat]:
    """Durations that a table compares (``base_X``, ``cand_X``, ``delta_X``) in one unit, that of the
    largest typical magnitude among them: ``28,763 us`` beside ``35.67 ms`` reads as no comparison."""
    groups: dict[str, list[int]] = {}
    for i, (c, f) in enumerate(zip(df.columns, formats, strict=True)):
        if f.kind == "duration" and (m := _COMPARED.match(c)):
            groups.setdefault(m.group(2), []).append(i)
    for idx in groups.values():
        if len(idx) < 2:
            continue
        typical = max(_typical(df[df.columns[i]]) for i in idx)
        for i in idx:
            formats[i] = _duration_format(df.columns[i], typical)
    return formats


def _whole(col: pl.Series) -> bool:
    """Whether every non-null value of a float column is a whole number (and there is one)."""
    a = col.drop_nulls()
    return len(a) > 0 and bool((a == a.round(0)).all()) and bool(a.is_finite().all())


#: The value columns of a diff's metrics table, shown in the unit of their row's ``metric``.
_METRIC_VALUES = ("base", "cand", "delta")


def _ns_format(c: str, col: pl.Series, taken: set[str]) -> ColumnFormat:
    """A ``*_ns`` column in human units: a timestamp as a time of day, a duration in one unit."""
    values = col.drop_nulls()
    if _TIMESTAMP.search(c) and not values.is_empty() and values.min() >= EPOCH_MIN_NS:  # type: ignore[operator]
        days = {int(v) // (86_400 * _NS_PER_S) for v in (values.min(), values.max())}  # type: ignore[arg-type]
        short = c[:-3] + "_utc"
        return ColumnFormat(short if short not in taken else c, "time" if len(days) == 1 else "date")
    return _duration_format(c, _typical(col))


def _duration_format(c: str, typical: float) -> ColumnFormat:
    """Duration column ``c`` (``*_ns``, or ``ns`` alone) in the unit its typical magnitude picks,
    named in the header (``step_ns`` -> ``step (ms)``, ``ns`` -> ``time (ms)``)."""
    unit, scale, dec = _pick(typical, _TIME_UNITS)
    return ColumnFormat(f"{c[:-3] if c != 'ns' else 'time'} ({unit})", "duration", scale, unit, dec)


#: Diff metrics that are rates (a small float: ``0.0241`` TFLOP/s would read ``0.02`` with two places).
_RATE_METRICS = ("tflops",)


def _metric_cell(v: float, metric: str) -> str:
    """A diff metric's value in its unit: ``_ns`` as a duration, FLOPs and bytes scaled, a rate
    (``tflops``) with three significant digits as the summary gives it (``0.0241``), else plain."""
    if metric.endswith("_ns"):
        return duration(v)
    if metric in _RATE_METRICS:
        return f"{v:,.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    if _FLOPS.search(metric):
        unit, scale, dec = _pick(abs(v), _FLOP_UNITS)
        return f"{v / scale:,.{dec}f} {unit}"
    if _BYTES.search(metric):
        return size(v)
    return f"{int(v):,}" if float(v).is_integer() else plain(v)  # a count (launches): no ".00"


def metric_text(v: float, metric: str) -> str:
    """A diff metric's value in its unit (``7.11 GFLOP``, ``6.09 MiB``, ``2,886``, ``61.8 ms``)."""
    return _metric_cell(v, metric)


def format_cell(v: object, f: ColumnFormat, row_metric: str | None = None) -> str:
    """The text of one numeric (or any) value under format ``f`` (see :func:`column_formats`)."""
    if v is None:
        return ""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return plain(v)
    if f.kind in ("time", "date"):
        return timestamp(int(v), f.kind == "date")
    if f.kind in ("duration", "scaled"):
        x = v / f.scale
        return _small_kept(x, f"{x:,.{f.decimals}f}")  # 545,282 ns in a ms column: 0.545, not 1
    if f.kind == "metric" and row_metric is not None:
        return _metric_cell(v, row_metric)
    return value_cell(f.header, v, f.decimals)


def _small_kept(x: float, text: str) -> str:
    """``text`` (``x`` formatted with the column's decimals), or ``x`` with three significant
    digits where it lies below one unit and ``text`` keeps fewer than two (``0.04`` -> ``0.045``),
    unless that needs an exponent (``6e-08`` stays ``0.00``: a column's value next to nothing)."""
    if not x or abs(x) >= 1 or _significant(text) >= 2:
        return text
    kept = f"{x:.3g}"
    return text if "e" in kept else kept


def _significant(text: str) -> int:
    """Significant digits of a formatted number (``1`` -> 1, ``0.04`` -> 1, ``0.50`` -> 2)."""
    return len(text.lstrip("-").replace(",", "").replace(".", "").lstrip("0"))


def shown_rows(df: pl.DataFrame, most: int, worst: str = "") -> tuple[pl.DataFrame, str]:
    """The rows a table of ``df`` shows when it may show ``most``, and the line saying which ("" when
    every row is shown): the first ``most``; of per-step rows with a ``worst`` column
    (:class:`traceprof.core.schema.Table`), the ``most`` with its largest values, largest first
    (nulls last, ties in the frame's order), so that a slow step of 100,000 is in sight."""
    if df.height <= most:
        return df, ""
    if worst in df.columns:
        shown = df.sort(worst, descending=True, nulls_last=True, maintain_order=True).head(most)
        return shown, f"{most:,} of {df.height:,} rows shown: those of largest {worst}, largest first"
    return df.head(most), f"{df.height - most:,} more row(s) of {df.height:,} not shown"


def table_columns(df: pl.DataFrame, units: str = "human") -> list[str]:
    """Column headers (:func:`column_formats`): each with its unit where the cells are scaled,
    ``_ns`` -> ``_utc`` where they are times of day."""
    return [f.header for f in column_formats(df, units)]


def table_rows(df: pl.DataFrame, units: str = "human", width: int = 48) -> Iterator[Sequence[str]]:
    """The cells of ``df`` as strings (:func:`column_formats`, :func:`format_cell`; strings
    shortened to ``width``, but :data:`PROSE_COLUMNS`, whole). Distinct strings of a column whose
    shortened forms would read the same (template instances of one kernel) get their shortest forms
    that differ (:func:`traceprof.core.names.distinct_short`), so that two rows never look alike."""
    formats = column_formats(df, units)
    names = [
        distinct_short(df[c], width) if df[c].dtype == pl.String and c not in PROSE_COLUMNS else None
        for c in df.columns
    ]
    mi = df.columns.index("metric") if "metric" in df.columns else None
    for row in df.iter_rows():
        metric = row[mi] if mi is not None else None
        yield [
            names[i].get(v, "") if names[i] is not None and v is not None else format_cell(v, f, metric)  # type: ignore[union-attr]
            for i, (v, f) in enumerate(zip(row, formats, strict=True))
        ]


def row_cells(
    columns: Sequence[str], rows: Sequence[Sequence[object]], width: int = 48
) -> tuple[list[bool], list[list[str]]]:
    """:func:`table_rows` for rows of Python values (DuckDB's ``fetchall()``) under ``columns``,
    without polars, with ``units="ns"``'s cells: which columns are numeric (every value an int or
    float, not a bool), and each row's cells (strings shortened and told apart as :func:`table_rows`
    does, other values as :func:`value_cell`)."""
    cols = list(zip(*rows, strict=True)) if rows else []
    numeric = [
        all(isinstance(v, int | float) and not isinstance(v, bool) for v in c if v is not None) for c in cols
    ]
    names: list[dict[str, str] | None] = [
        distinct_short((v for v in c if isinstance(v, str)), width)
        if all(isinstance(v, str) for v in c if v is not None)
        else None
        for c in cols
    ]

    def one(i: int, v: object) -> str:
        short = names[i]
        if isinstance(v, str):
            return short[v] if short is not None else shorten(v, width)
        return value_cell(columns[i], v)

    cells = [[one(i, v) for i, v in enumerate(row)] for row in rows]
    return numeric, cells


def describe(an: Any) -> str:
    """Help text of a registered analysis (``traceprof analyze NAME --help``), from its spec
    (``traceprof.engine.analysis.Analysis``): its summary and algorithm, its parameters (``-p KEY=VALUE``,
    with type and default) and their documentation, and its tables (``--table NAME``) with their
    declared columns (type, unit, doc)."""
    lines = [
        f"traceprof analyze {an.name} [--db PATH] [--run RUN] [-p KEY=VALUE ...] [--table NAME] [-f table|json|csv]",
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
