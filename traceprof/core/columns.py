"""Columns of analysis result frames, declared as the store's are (:class:`traceprof.core.schema.Column`).

Each analysis declares its frames (``traceprof.engine.analysis.Analysis.frames``) with the helpers here:
one line per column with its type, unit and doc, so that ``traceprof analyze NAME --help``,
``docs/analyses.md`` and the column comments of ``--save`` tables come from one declaration. A test
checks that every frame an analysis returns has exactly its declared columns and types.

Types are DuckDB's names for the polars types the analyses produce: ``BIGINT`` (Int64),
``INTEGER`` (Int32: ranks, steps, devices, as stored), ``UINTEGER`` (UInt32: polars' row counts),
``DOUBLE``, ``VARCHAR``, ``BOOLEAN``, ``BIGINT[]`` (a list of ranks).
"""

from __future__ import annotations

from traceprof.core.schema import Column, Table

__all__ = [
    "Column",
    "frame",
    "ns",
    "pct",
    "count",
    "rows",
    "text",
    "flag",
    "ratio",
    "number",
    "ranks_list",
    "typed",
    "RANK",
    "STEP",
    "DEVICE",
    "STREAM",
    "WINDOW_NS",
    "summary_columns",
    "POLARS_TYPES",
]

#: DuckDB type of each polars type a result frame holds (``str(dtype)``), for the declarations' test.
POLARS_TYPES = {
    "Int64": "BIGINT",
    "Int32": "INTEGER",
    "UInt32": "UINTEGER",
    "Float64": "DOUBLE",
    "String": "VARCHAR",
    "Boolean": "BOOLEAN",
    "List(Int64)": "BIGINT[]",
}


def frame(name: str, doc: str, *columns: Column, worst: str = "") -> Table:
    """A result frame: its name (``--table NAME``), one line of doc and its columns in order;
    ``worst``: of per-step rows, the column whose largest values are the worst rows (a table too
    long to show whole shows those, :func:`traceprof.core.display.shown_rows`)."""
    return Table(name, doc, tuple(columns), worst=worst)


def ns(name: str, doc: str, type_: str = "BIGINT") -> Column:
    """A duration or a time (epoch ns, names ending in ``_ns``)."""
    return Column(name, type_, doc, "ns")


def pct(name: str, doc: str) -> Column:
    """A share, 0..100 (names ending in ``_pct``)."""
    return Column(name, "DOUBLE", doc, "%")


def count(name: str, doc: str, type_: str = "BIGINT") -> Column:
    """A count of things (rows, calls, ranks)."""
    return Column(name, type_, doc)


def rows(name: str, doc: str) -> Column:
    """A count of rows as polars counts them (``UINTEGER``)."""
    return Column(name, "UINTEGER", doc)


def text(name: str, doc: str) -> Column:
    """A name or a label."""
    return Column(name, "VARCHAR", doc)


def flag(name: str, doc: str) -> Column:
    """A true/false column."""
    return Column(name, "BOOLEAN", doc)


def ratio(name: str, doc: str) -> Column:
    """A ratio without unit (a slowdown, a p-value, a z-score)."""
    return Column(name, "DOUBLE", doc)


def number(name: str, doc: str, unit: str = "", type_: str = "DOUBLE") -> Column:
    """Any other number, with its unit (``bytes``, ``FLOP``, ``GB/s``, ``ms``, ``TFLOP/s``)."""
    return Column(name, type_, doc, unit)


def ranks_list(name: str, doc: str) -> Column:
    """A list of ranks."""
    return Column(name, "BIGINT[]", doc)


RANK = Column("rank", "INTEGER", "Global rank")
STEP = Column("step", "INTEGER", "ProfilerStep number (the step the row's activity was launched in)")
DEVICE = Column("device", "INTEGER", "GPU (device index) of the lane")
STREAM = Column("stream", "BIGINT", "GPU stream of the lane")
WINDOW_NS = ns("window_ns", "Window: first activity start to last activity end of the row's activity")


def summary_columns(what: str, per_rank: bool) -> tuple[Column, ...]:
    """The duration statistics per name of the ``*_sum`` analyses (``traceprof.analyses._summary``), ``what``
    naming the thing timed (``kernel``, ``range``, ``collective``); ``per_rank``: the per-(rank,
    name) table (no ``ranks`` column, shares of the rank's time)."""
    of = "the rank's" if per_rank else "all"
    cols = (
        *((RANK,) if per_rank else ()),
        pct("time_pct", f"Share of {of} summed {what} time"),
        ns("total_ns", f"Summed {what} time"),
        count("instances", f"{what.capitalize()}s of this name"),
        ns("avg_ns", "Mean duration, rounded to whole ns"),
        ns("med_ns", "Median duration, rounded (an even count: the mean of the two middle values)"),
        ns("min_ns", "Shortest"),
        ns("max_ns", "Longest"),
        ns("stddev_ns", "Sample standard deviation, rounded; 0 for one instance"),
        *(() if per_rank else (count("ranks", "Ranks the name occurs on"),)),
        text("name", f"{what.capitalize()} name (full)"),
    )
    return cols


def typed(docs: dict[str, str], types: dict[str, str]) -> tuple[Column, ...]:
    """Columns from ``docs`` (name -> doc, in order) and their types: ``types[name]``, else by the
    name's suffix (``_ns`` and ``_bytes``: BIGINT, ``_pct``: DOUBLE); the unit from the suffix too
    (``_ns``: ns, ``_pct``: %, ``_bytes``: bytes).

    Raises:
        KeyError: A column with neither a type given nor a suffix that says it.
    """
    out = []
    for name, doc in docs.items():
        unit = (
            "ns"
            if name.endswith("_ns")
            else "%"
            if name.endswith("_pct")
            else "bytes"
            if name.endswith("_bytes")
            else ""
        )
        t = types.get(name) or {"ns": "BIGINT", "%": "DOUBLE", "bytes": "BIGINT"}.get(unit)
        if t is None:
            raise KeyError(f"{name}: no type")
        out.append(Column(name, t, doc, unit))
    return tuple(out)
