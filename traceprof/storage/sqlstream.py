"""User SQL as a stream of printable rows: every DuckDB type, a row cap, bounded memory.

Rows are fetched in Arrow batches, never all at once. Numbers and booleans stay numbers; every
other value (INTERVAL, UNION, infinite TIMESTAMP, BLOB, HUGEINT, nested types, ...) is turned into
DuckDB's own text for it (``CAST(x AS VARCHAR)``), so any result prints and JSON can hold it;
HUGEINT and UHUGEINT (``sum()`` of a BIGINT column) come back as integers in a table or CSV (shown
with thousands separators, as every other integer column).

For JSON (``as_json=True``) lists, arrays, structs, maps and unions come as Python lists and dicts
(DuckDB's ``to_json``; a map's keys as text), and HUGEINT / UHUGEINT as integers where they fit in
64 bits (the range BIGINT and UBIGINT columns are written in already), as their exact text beyond
(no JSON reader keeps such a number exact). Integers nested in lists or structs follow the same
rule; DECIMAL stays its exact text, NaN and infinities become null.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import duckdb

from traceprof.core.errors import StoreError
from traceprof.storage import sandbox
from traceprof.storage.layout import error_line
from traceprof.storage.store import Store, damaged

__all__ = ["stream", "SqlStream"]

T = TypeVar("T")
#: DuckDB type ids whose values stay as they are (numbers and booleans); every other value is text.
_KEEP = frozenset(
    {
        "boolean",
        "tinyint",
        "smallint",
        "integer",
        "bigint",
        "utinyint",
        "usmallint",
        "uinteger",
        "ubigint",
        "float",
        "double",
    }
)

#: DuckDB type ids whose text (``CAST(x AS VARCHAR)``) is a number, a date, a time, an interval or a
#: UUID, never text a user wrote: a leading ``-`` (``-1.5``, ``-01:00:00``) is no formula to guard.
_NOT_TEXT = frozenset(
    {
        "decimal",
        "bignum",
        "varint",
        "interval",
        "date",
        "time",
        "time_ns",
        "time with time zone",
        "timestamp",
        "timestamp_s",
        "timestamp_ms",
        "timestamp_ns",
        "timestamp with time zone",
        "uuid",
    }
)


@dataclass
class SqlStream:
    """A query's result, to iterate once.

    Attributes:
        columns: Column names (duplicates allowed).
        numeric: Per column, whether its values are numbers (else strings or None).
        rows: Iterator over row tuples, at most ``max_rows``.
        capped: Set once ``rows`` is exhausted: there were more than ``max_rows`` rows.
        statements: Statements in the query (DuckDB runs them all; ``rows`` are the last one's).
        text: Per column, whether its values are text a user wrote (VARCHAR, BLOB, ENUM, nested
            values, unions: a CSV guards their leading ``= + - @``), not numbers, decimals, dates,
            times, intervals or UUIDs (:data:`_NOT_TEXT`).
    """

    columns: list[str]
    numeric: list[bool]
    rows: Iterator[tuple[Any, ...]] = field(default_factory=lambda: iter(()))
    capped: bool = False
    statements: int = 1
    text: list[bool] = field(default_factory=list)


#: DuckDB type ids whose values JSON writes as lists or objects (``as_json``).
_NESTED = frozenset({"list", "array", "struct", "map", "union"})
#: DuckDB type ids of integers wider than 64 bits.
_WIDE = frozenset({"hugeint", "uhugeint"})
#: The integers written as JSON numbers: those BIGINT or UBIGINT hold.
_INT_RANGE = (-(2**63), 2**64 - 1)


def _json_int(text: str) -> int | str:
    """An integer of DuckDB's text: a Python int within :data:`_INT_RANGE`, else the text itself."""
    n = int(text)
    return n if _INT_RANGE[0] <= n <= _INT_RANGE[1] else text


def _nested(text: str | None) -> Any:
    """DuckDB's ``to_json`` text of a nested value as Python lists and dicts (integers as
    :func:`_json_int`, NaN and infinities as None)."""
    if text is None:
        return None
    return json.loads(text, parse_int=_json_int, parse_constant=lambda _: None)


def _wide(text: str | None) -> int | str | None:
    """A HUGEINT or UHUGEINT value's text as :func:`_json_int` gives it."""
    return None if text is None else _json_int(text)


def _whole(text: str | None) -> int | None:
    """A HUGEINT or UHUGEINT value's text as a Python int (exact at any size), for a table or CSV."""
    return None if text is None else int(text)


def stream(
    store: Store,
    query: str,
    max_rows: int | None,
    batch_rows: int = 10_000,
    timeout_s: float | None = None,
    as_json: bool = False,
) -> SqlStream:
    """Run ``query`` and stream its rows (see the module doc).

    Args:
        store: A store opened for user SQL (``Store(path, user_sql=True)``, :mod:`traceprof.storage.sandbox`).
        query: SQL text: queries only (:func:`traceprof.storage.sandbox.check`).
        max_rows: Stop after this many rows (``capped`` then tells whether more were left); None: all.
        batch_rows: Rows fetched per batch.
        timeout_s: Stop the query once DuckDB has worked on it this long, in seconds, summed over
            the start and every batch (time spent printing rows does not count); None: no limit.
        as_json: Nested values as lists and dicts, HUGEINT as integers where they fit in 64 bits
            (see the module doc), for a JSON writer; else DuckDB's text of them.

    Raises:
        StoreError: The query is refused (not a query, not UTF-8), fails (DuckDB's first line) or
            runs past ``timeout_s``. Errors while fetching are raised the same way from the iterator.
        KeyboardInterrupt: DuckDB was interrupted by Ctrl-C.
    """
    statements = sandbox.check(store.con, query)
    deadline = _Budget(timeout_s)

    convert: list[Callable[[Any], Any] | None] = []  # per column: its value for JSON, or for a table

    def start() -> tuple[list[str], list[str], Any]:
        rel = store.con.sql(query)
        if rel is None:  # a statement without a result
            return [], [], iter(())
        columns = list(rel.columns)
        ids: list[str] = [t.id for t in rel.types]
        names = [f"c{i}" for i in range(len(columns))]
        sel = ", ".join(
            n
            if i in _KEEP
            else f"to_json({n})::VARCHAR"
            if as_json and i in _NESTED
            else f"CAST({n} AS VARCHAR)"
            for n, i in zip(names, ids, strict=True)
        )
        if as_json:
            convert[:] = [_nested if i in _NESTED else _wide if i in _WIDE else None for i in ids]
        else:  # a table or CSV: a HUGEINT (``sum()`` of a BIGINT column) is a number like any other
            convert[:] = [_whole if i in _WIDE else None for i in ids]
        limit = "" if max_rows is None or max_rows >= 2**62 else f" LIMIT {int(max_rows) + 1}"  # beyond: all
        sql = f"SELECT {sel} FROM _q AS _q({', '.join(names)}){limit}"
        projected = rel.query("_q", sql)
        assert projected is not None  # a SELECT always has a result
        return columns, ids, iter(projected.to_arrow_reader(batch_rows))

    try:
        columns, ids, reader = deadline.run(store, start)
    except duckdb.Error as e:
        raise _error(e) from None
    out = SqlStream(
        columns,
        [i in _KEEP or i in _WIDE for i in ids],
        statements=statements,
        text=[not (i in _KEEP or i in _WIDE or i in _NOT_TEXT) for i in ids],
    )

    def rows() -> Iterator[tuple[Any, ...]]:
        n = 0
        try:
            while (batch := deadline.run(store, lambda: next(reader, None))) is not None:
                cols = [col.to_pylist() for col in batch.columns]
                for k, f in enumerate(convert):
                    if f is not None:
                        cols[k] = [f(v) for v in cols[k]]
                for row in zip(*cols, strict=True):
                    if max_rows is not None and n >= max_rows:
                        out.capped = True
                        return
                    n += 1
                    yield row
        except (duckdb.Error, OSError) as e:  # DuckDB's errors while streaming come through Arrow as OSError
            raise _error(e) from None

    out.rows = rows()
    return out


def _error(e: Exception) -> BaseException:
    return damaged(e) or StoreError(f"SQL error: {error_line(e)}")


class _Budget:
    """The time DuckDB may still spend on one query (``timeout_s`` of :func:`stream`)."""

    def __init__(self, timeout_s: float | None) -> None:
        self.timeout_s = timeout_s
        self.left = timeout_s

    def run(self, store: Store, fn: Callable[[], T]) -> T:
        """``store.interruptible(fn)`` within the time left; the time it took is spent.

        Raises:
            StoreError: The time ran out (the query was interrupted).
        """
        start = time.monotonic()
        try:
            return store.interruptible(fn, None if self.left is None else max(self.left, 0.0))
        except TimeoutError:
            raise StoreError(
                f"SQL error: the query ran for over {self.timeout_s:g} s and was stopped (--timeout); "
                "give it more time with --timeout SECONDS"
            ) from None
        finally:
            if self.left is not None:
                self.left -= time.monotonic() - start
