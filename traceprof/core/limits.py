"""Values that do not fit their store columns: rejected per record, never a crash.

A trace may hold any JSON number; the store's columns are BIGINT (times, sizes, ids) or INTEGER
(device, step, rank). Parsers call :func:`drop_out_of_range` once on their row columns (with the
index of each row's record in the file) and build the other tables with :func:`to_table`; a value
that does not fit is an error naming the record, or with ``on_bad_event="skip"`` the record is
dropped and counted in ``rejected`` under a reason such as ``"'ts_ns' beyond int64"``. Which
value is an integer at all is ``traceprof.core.values``' one rule.

Text has one limit too, :data:`MAX_FIELD_BYTES`: a record whose name, category, args JSON or any
other free-form text field is longer is a bad record in the same way (``"'args' longer than 1
MiB"``). Every collector applies it through these same functions (:func:`drop_out_of_range`,
:func:`drop_long_text`, :func:`record_fits`, :func:`to_table`, :func:`polars_out_of_range`). The
long text of a trace's rows together has a limit as well, :data:`MAX_LONG_TEXT_BYTES` of values of
:data:`LONG_TEXT_BYTES` or more (:func:`drop_long_text`): past it a record is bad in the same way.
So does the long text of the files of one run that one ingest inserts together, in one transaction
(:func:`long_text_rows`, :func:`drop_run_long_text`): DuckDB holds it until the commit whatever
the files it comes from.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from traceprof.core.errors import TraceFormatError
from traceprof.core.lazy import lazy

if TYPE_CHECKING:
    from collections.abc import Callable

    import numpy as np
    import polars as pl
    import pyarrow as pa
    import pyarrow.compute as pc

    from traceprof.core.parsed import ParsedTrace
else:
    np = lazy("numpy")
    pl = lazy("polars")
    pa = lazy("pyarrow")
    pc = lazy("pyarrow.compute")

__all__ = [
    "shown",
    "drop_out_of_range",
    "drop_rows",
    "to_table",
    "columns_to_table",
    "record_fits",
    "polars_out_of_range",
    "fits",
    "INT64",
    "INT32",
    "MAX_FIELD_BYTES",
    "text_problem",
    "drop_long_text",
    "drop_long_items",
    "skip_hint",
    "long_text_rows",
    "drop_run_long_text",
]

INT64 = (-(2**63), 2**63 - 1)
INT32 = (-(2**31), 2**31 - 1)

#: The longest text one field of a trace record may hold in the store, in UTF-8 bytes: an event's
#: name, category, lanes and args JSON, a Flight Recorder or NCCL plugin entry's names and JSON, an
#: NDTimeline span's text. Longer is a bad record (an error naming it; skipped and counted with
#: ``--skip-bad-events``). The real traces of the corpus hold args of at most 6 KB and names of at
#: most 6 KB; DuckDB's ingest (its memory limit is 96 MB) failed the whole run on one value of
#: 12 MB, with a message that named no record.
MAX_FIELD_BYTES = 2**20
#: :data:`MAX_FIELD_BYTES` in words, for messages and reasons.
_MAX_FIELD_TEXT = "1 MiB"
#: Text values at least this long (UTF-8 bytes) are *long*: DuckDB keeps each apart from its column
#: pages (an overflow block) and, unlike the pages, held every one in memory until the ingest's commit.
#: Measured with one trace of N Kineto args of one size (100 MB in all) under the store's 96 MB ingest
#: memory limit: values of 42,000 bytes went in, of 45,000 bytes and more failed ("failed to pin block").
LONG_TEXT_BYTES = 40 * 2**10
#: The most long text (:data:`LONG_TEXT_BYTES` or more per value, all its fields together) one trace
#: may hold: 64 KiB args went in at 65 MB in all and failed at 72 MB, with a message that named no
#: record. A record whose long text takes a trace past this is a bad record like one over
#: :data:`MAX_FIELD_BYTES`; a real trace of the corpus holds none (its args are at most 6 KB).
#: The limit is DuckDB's, on one transaction, so it holds for the files of a run that one ingest
#: inserts together as well (:func:`drop_run_long_text`): 4 ranks of 700 args of 64 KiB (44 MiB each,
#: 175 MiB together) failed at the commit ("failed to pin block of size 256 KiB"), as do 2 of 35 MiB.
#: Raising DuckDB's memory limit instead costs about three times the text: 200 MiB of such args went
#: in under a limit of 224 MB, at a peak of 660 MB.
MAX_LONG_TEXT_BYTES = 48 * 2**20


@functools.cache
def _bounds() -> dict[pa.DataType, tuple[int, int]]:
    """The range of each Arrow integer type checked here (a function: pyarrow loads on first use)."""
    return {pa.int64(): INT64, pa.int32(): INT32, pa.int16(): (-(2**15), 2**15 - 1), pa.int8(): (-128, 127)}


def fits(v: Any, bounds: tuple[int, int]) -> bool:
    """True for None, non-integers, and integers within ``bounds`` (inclusive)."""
    return not isinstance(v, int) or bounds[0] <= v <= bounds[1]


def shown(v: Any, width: int = 60) -> str:
    """``repr(v)`` for a message, cut to ``width`` characters; an integer too long to print (Python
    refuses over 4300 digits, a ValueError) is shown by its size."""
    if isinstance(v, int) and v.bit_length() > 256:
        return f"<an integer of {v.bit_length():,} bits>"
    text = repr(v)
    return text if len(text) <= width else text[: width - 3] + "..."


def _nbytes(v: str | bytes, floor: int = MAX_FIELD_BYTES) -> int:
    """UTF-8 length of ``v`` (a str is encoded only when it could be longer than ``floor``)."""
    if isinstance(v, bytes):
        return len(v)
    return len(v) if len(v) * 4 <= floor else len(v.encode("utf-8", "surrogatepass"))


def text_problem(name: str, v: Any) -> str | None:
    """The problem of a text value longer than :data:`MAX_FIELD_BYTES` (``"'args' longer than 1
    MiB (20,971,530 bytes)"``), else None (short text, and values that are not text)."""
    if isinstance(v, str | bytes) and len(v) > MAX_FIELD_BYTES // 4:
        n = _nbytes(v)
        if n > MAX_FIELD_BYTES:
            return f"{name!r} longer than {_MAX_FIELD_TEXT} ({n:,} bytes)"
    return None


def _text_problem(row: dict[str, Any]) -> str | None:
    """:func:`text_problem` of the first text value of a row dict that is too long."""
    for k, v in row.items():
        if isinstance(v, str | bytes) and len(v) > MAX_FIELD_BYTES // 4:
            problem = text_problem(k, v)
            if problem:
                return problem
    return None


def _long_rows(col: Any, floor: int) -> tuple[np.ndarray, np.ndarray] | None:
    """The rows of a column whose text is at least ``floor`` bytes long (indices, ascending) and
    their UTF-8 lengths, or None when none is (or it holds no text). Arrow text columns are
    measured from their offsets (the text is not read),
    :class:`~traceprof.collectors.kineto._values.Strs` by its distinct values, lists of Python
    values one by one."""

    def rows_of(lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        rows = np.flatnonzero(lengths >= floor)
        return (rows, lengths[rows]) if rows.size else None

    if isinstance(col, pa.Array | pa.ChunkedArray):
        t = col.type
        if pa.types.is_dictionary(t):
            t = t.value_type
        if not (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)):
            return None
        if pa.types.is_dictionary(col.type):
            col = col.cast(t)
        lengths = pc.binary_length(col)
        top = pc.max(lengths).as_py()
        if top is None or top < floor:
            return None
        return rows_of(pc.fill_null(lengths, 0).to_numpy())
    if hasattr(col, "codes") and isinstance(getattr(col, "values", None), list):  # Strs
        sizes = [_nbytes(v, floor) if isinstance(v, str | bytes) else 0 for v in col.values]
        if max(sizes, default=0) < floor:
            return None
        return rows_of(np.asarray(sizes, np.int64)[np.asarray(col.codes)])
    if isinstance(col, list):
        first = next((v for v in col if v is not None), None)
        if not isinstance(first, str | bytes):  # integers (or nothing): not text
            return None
        try:  # in C: the longest value, in characters
            if max(map(len, filter(None, col)), default=0) < floor // 4:
                return None
        except TypeError:  # text and numbers mixed: one by one
            pass
        return rows_of(
            np.array([_nbytes(v, floor) if isinstance(v, str | bytes) else 0 for v in col], np.int64)
        )
    return None


def _record(what: str, index: int | None, cols: dict[str, Any], r: int) -> str:
    """``event #12 (name='aten::mm', ts_ns=1000)``: the record of row ``r`` in a message."""
    head = what if index is None else f"{what} #{index}"
    shown_ = [
        f"{k}={shown(_at(cols[k], r))}"
        for k in ("cat", "name", "ts_ns", "op", "seq")  # op, seq: a collective's
        if k in cols and len(cols[k]) > r
    ]
    return f"{head} ({', '.join(shown_)})" if shown_ else head


def _at(col: Any, r: int) -> Any:
    """Row ``r`` of a column (a list, numpy, Arrow, or a column reading like a list)."""
    v = col[r]
    return v.as_py() if hasattr(v, "as_py") else v.item() if hasattr(v, "item") else v


def drop_long_text(
    path: str | Path,
    cols: dict[str, Any],
    src_index: list[int] | None,
    on_bad_event: str,
    rejected: dict[str, int],
    what: str = "event",
    first: dict[str, str] | None = None,
) -> None:
    """Drop (or raise on) the rows of parser columns with a text field longer than
    :data:`MAX_FIELD_BYTES`: every text column of ``cols`` is checked. Then, in record order, the
    rows whose long text (values of :data:`LONG_TEXT_BYTES` or more) takes the trace's total past
    :data:`MAX_LONG_TEXT_BYTES`: the store could not take them in, so they are bad records too,
    refused here before the store is touched (reason ``"'args' past the 48 MiB of values of 40 KiB
    or more a trace may hold"``).

    Args:
        path: The trace file, for messages.
        cols: Column name -> values, all of one length (lists, numpy, Arrow, or columns with
            ``take()``); changed in place: every column loses the dropped rows.
        src_index: Per row, the index of its record in the file (``event #i``; changed in place),
            or None where records have no index (then ``name`` and ``ts_ns`` name them).
        on_bad_event: ``"raise"`` or ``"skip"`` (count in ``rejected``, under
            ``"'<column>' longer than 1 MiB"``).
        rejected: Counts by reason, updated.
        what: The record's name in messages (``event``, ``row``).
        first: With ``on_bad_event="skip"``, filled with reason -> its first record where it holds
            none yet (as :func:`drop_out_of_range`'s).

    Raises:
        TraceFormatError: With ``on_bad_event="raise"``, the first such row, naming ``what #index``,
            its name (shortened) and ``ts_ns``, the column and its length (and for the total, the
            bytes of long text up to that row).
    """
    long: dict[int, dict[str, int]] = {}  # row -> its long columns' byte lengths
    for name, col in cols.items():
        got = _long_rows(col, LONG_TEXT_BYTES)
        for r, n in () if got is None else zip(got[0].tolist(), got[1].tolist(), strict=True):
            long.setdefault(r, {})[name] = n
    if not long:
        return
    total, bad = 0, []
    for r in sorted(long):
        over = next((c for c, n in long[r].items() if n > MAX_FIELD_BYTES), None)
        row = sum(long[r].values())
        if over is not None:
            problem = text_problem(over, _at(cols[over], r)) or f"{over!r} longer than {_MAX_FIELD_TEXT}"
        elif total + row <= MAX_LONG_TEXT_BYTES:
            total += row
            continue
        else:  # left out, it adds nothing to the store: the next rows may still fit
            field, n = max(long[r].items(), key=lambda kv: kv[1])
            problem = (
                f"{field!r} past the {MAX_LONG_TEXT_BYTES / 2**20:g} MiB of values of "
                f"{LONG_TEXT_BYTES / 2**10:g} KiB or more a trace may hold ({n:,} bytes; "
                f"{total + row:,} bytes of such text with it): the store could not take it in"
            )
        bad.append(r)
        where = _record(what, None if src_index is None else src_index[r], cols, r)
        if first is not None and on_bad_event != "raise":
            first.setdefault(problem.split(" (", 1)[0], where)
        _bad(path, where, problem, on_bad_event, rejected)
    if bad:
        _drop(cols, src_index, bad, len(next(iter(cols.values()))))


def long_text_rows(events: pa.Table | None, what: str = "event") -> list[tuple[int, int, str, str]]:
    """The rows of ``events`` (or another row table, its records named ``what``) whose text counts against :data:`MAX_LONG_TEXT_BYTES` (values of
    :data:`LONG_TEXT_BYTES` or more, all their fields together), measured from the Arrow offsets:
    (row, bytes, its longest such field, the record as messages name it: ``event (cat='cpu_op',
    name='op3', ts_ns=30000)``)."""
    if events is None or not events.num_rows:
        return []
    cols = {name: events.column(name) for name in events.column_names}
    long: dict[int, dict[str, int]] = {}  # row -> its long columns' byte lengths
    for name, col in cols.items():
        got = _long_rows(col, LONG_TEXT_BYTES)
        for r, n in () if got is None else zip(got[0].tolist(), got[1].tolist(), strict=True):
            long.setdefault(r, {})[name] = n
    return [
        (r, sum(ns.values()), max(ns, key=lambda c: ns[c]), _record(what, None, cols, r))
        for r, ns in sorted(long.items())
    ]


#: The row tables of a trace other than ``events`` whose long text counts against the run's budget,
#: and their records' name in messages. A trace's own columns (``meta``, ``flops_per_step``: one
#: value per file, built by its parser) hold no record to leave out and are not counted.
_OTHER_TABLES = (("collectives", "collective"), ("steps", "step"), ("devices", "device"))


def drop_run_long_text(traces: list[ParsedTrace], on_bad_event: str) -> None:
    """Leave out (or raise on) the rows of a run's files, in their order, whose long text takes the
    files together past :data:`MAX_LONG_TEXT_BYTES`: one ingest inserts them in one transaction,
    which DuckDB could not commit (each file may be within the limit alone). Every stored row counts:
    the events' (:attr:`ParsedTrace.long_text <traceprof.core.parsed.ParsedTrace.long_text>`), then
    the collectives', steps' and devices' (a collective's ``pg_ranks`` of 10,000 ranks is 59 KB).
    A run of one file, whose events its parser held to the budget, has its events counted only when
    another table holds long text. Call before the store is touched; a record left out is counted in
    its trace's ``rejected``.

    Raises:
        TraceFormatError: With ``on_bad_event="raise"``, the first such record, naming its file,
            the record, its long text and the run's total with it.
    """
    others = [[(t, long_text_rows(getattr(pt, t), what)) for t, what in _OTHER_TABLES] for pt in traces]
    if len(traces) == 1 and not traces[0].long_text and any(rows for _, rows in others[0]):
        traces[0].long_text = long_text_rows(traces[0].events)
    total = 0
    for pt, more in zip(traces, others, strict=True):
        for table, rows in [("events", pt.long_text), *more]:
            bad: list[int] = []
            for r, n, field, where in rows:
                if total + n <= MAX_LONG_TEXT_BYTES:
                    total += n
                    continue
                problem = (
                    f"{field!r} past the {MAX_LONG_TEXT_BYTES / 2**20:g} MiB of values of {LONG_TEXT_BYTES / 2**10:g} "
                    f"KiB or more that the files of a run ingested together may hold ({n:,} bytes; "
                    f"{total + n:,} bytes of such text with it, {len(traces)} files): the store could not take "
                    "it in; ingest the files a few at a time with the same --run"
                )
                _bad(pt.path, where, problem, on_bad_event, pt.rejected)
                bad.append(r)
            pt.drop_rows(table, bad)


def drop_long_items(
    path: str | Path,
    items: dict[str, Any],
    what: str,
    field_name: str,
    on_bad_event: str,
    rejected: dict[str, int],
) -> dict[str, Any]:
    """``items`` without the values longer than :data:`MAX_FIELD_BYTES` (for text a trace keeps
    by key rather than by row, e.g. Kineto's thread names from its ``M`` records).

    Args:
        path: The trace file, for messages.
        items: Key -> text value (not changed).
        what: The records in messages, followed by the key (``"thread_name record of"``).
        field_name: The field in messages and reasons (``"args.name"``).
        on_bad_event: ``"raise"`` or ``"skip"`` (count in ``rejected``).
        rejected: Counts by reason, updated.

    Raises:
        TraceFormatError: With ``on_bad_event="raise"``, the first value too long, naming the key.
    """
    out = {}
    for k, v in items.items():
        problem = text_problem(field_name, v)
        if problem is None:
            out[k] = v
            continue
        _bad(path, f"{what} {shown(k)}", problem, on_bad_event, rejected)
    return out


#: The record a bad-record message names, as its ``where`` spells it, and the words for several.
_UNITS = {"event": "events", "row": "rows", "entry": "entries"}
_UNIT = re.compile(r"\b(event|row|entry)\b")


def skip_hint(where: str) -> str:
    """The end of a bad-record error: ``"; pass --skip-bad-events to skip such events"``, naming
    the records as ``where`` (the message's record, ``event #12 (...)``, ``CUPTI_ACTIVITY_KIND_KERNEL
    row id 5``, ``entry #3``) names them: its first word ``event``, ``row`` or ``entry``, in the
    plural; ``records`` when it names none of them (``line 2``). One rule, so a source's messages
    never call one kind of record "events" in one place and "records" in another."""
    m = _UNIT.search(where)
    return f"; pass --skip-bad-events to skip such {_UNITS[m.group(1)] if m else 'records'}"


def _bad(path: str | Path, where: str, problem: str, on_bad_event: str, rejected: dict[str, int]) -> None:
    """A bad record: raise naming ``where`` (``on_bad_event="raise"``), else count the reason (the
    problem up to its `` (value)``) in ``rejected``.

    Raises:
        TraceFormatError: With ``on_bad_event="raise"``.
    """
    if on_bad_event == "raise":
        raise TraceFormatError(path, where, problem + skip_hint(where))
    reason = problem[: problem.index(" (")]
    rejected[reason] = rejected.get(reason, 0) + 1


def _drop(cols: dict[str, Any], src_index: list[int] | None, bad: list[int], n_rows: int) -> None:
    """Take rows ``bad`` out of every column of ``cols`` (and ``src_index``), in place."""
    drop = set(bad)
    mask = np.ones(n_rows, bool)
    mask[bad] = False
    keep = np.flatnonzero(mask)
    for k, v in cols.items():
        if isinstance(v, list) and len(v) == n_rows:
            cols[k] = [x for i, x in enumerate(v) if i not in drop]
        elif isinstance(v, pa.ChunkedArray) and len(v) == n_rows:
            # filter keeps its chunks (take joins them into one): DuckDB reads an Arrow column a chunk
            # at a time, and failed on one of 33 MB of args under its ingest memory limit
            cols[k] = v.filter(pa.array(mask))
        elif hasattr(v, "take") and len(v) == n_rows:  # numpy, Arrow, or any column with take()
            cols[k] = v.take(keep)
    if src_index is not None:
        src_index[:] = [x for i, x in enumerate(src_index) if i not in drop]


def drop_rows(cols: dict[str, Any], src_index: list[int] | None, rows: list[int], n_rows: int) -> None:
    """Take rows ``rows`` out of every column of ``cols`` (and ``src_index``), in place: the
    columns :func:`drop_out_of_range` takes (lists, numpy, Arrow, any column with ``take()``)."""
    _drop(cols, src_index, rows, n_rows)


def _problem(row: dict[str, Any] | list[Any], names: list[str], bounds: list[tuple[int, int]]) -> str | None:
    values = row if isinstance(row, list) else [row.get(n) for n in names]
    for name, v, b in zip(names, values, bounds, strict=True):
        if not fits(v, b):
            if b[0] == 0 and INT64[0] <= v < 0:  # an epoch-ns column (drop_out_of_range's ``epoch``)
                return f"{name!r} before the epoch ({shown(v)})"
            return f"{name!r} beyond int{64 if b[1] == INT64[1] else 32} ({shown(v)})"
    return None


def _not_below(col: Any, floor: int) -> bool:
    """Whether no value of an integer column (numpy, :class:`Ints`-like with ``values`` and ``ok``,
    Arrow, a list; None ignored) is below ``floor``."""
    values, ok = (col.values, col.ok) if hasattr(col, "values") and hasattr(col, "ok") else (col, None)
    if isinstance(values, np.ndarray) and values.dtype.kind in "iu":
        if not len(values):
            return True
        return int(values.min(where=ok, initial=floor) if ok is not None else values.min()) >= floor
    listed = values if isinstance(values, list) else _pylist(values)
    low = min((v for v in listed if isinstance(v, int)), default=floor)
    return low >= floor


def drop_out_of_range(
    path: str | Path,
    cols: dict[str, Any],
    src_index: list[int],
    on_bad_event: str,
    rejected: dict[str, int],
    what: str = "event",
    types: dict[str, pa.DataType] | None = None,
    extra: dict[str, list[Any]] | None = None,
    fields: dict[str, str] | None = None,
    describe: Callable[[int, str], tuple[str, str]] | None = None,
    first: dict[str, str] | None = None,
    epoch: tuple[str, ...] = (),
) -> None:
    """Check the integer columns of parser rows; drop (or raise on) rows that do not fit.

    Checked: ``ts_ns``, ``dur_ns`` and their sum, ``stream``, ``correlation``, ``external_id``
    (int64), ``device`` and ``step`` (int32), and any column given in ``types``; and every text
    column's length (:func:`drop_long_text`, first). ``cols`` is changed in place (every list
    loses the dropped rows, as does ``src_index``).

    Args:
        path: The trace file, for messages.
        cols: Column name -> values, all of one length: lists, or columns with ``take()`` and
            ``tolist()`` / ``to_pylist()`` (numpy, Arrow, anything ``pa.array()`` converts), which
            are checked as well when named; dropped rows are taken out of every column.
        src_index: Per row, the index of its record in the file (``event #i`` in messages).
        on_bad_event: ``"raise"`` or ``"skip"`` (count in ``rejected``).
        rejected: Counts by reason, updated.
        what: The record's name in messages (``event``, ``entry``, ``row``).
        types: Extra columns to check, name -> pyarrow integer type.
        extra: Values checked as the column of that name but not in ``cols`` (e.g. the step
            number a Kineto ``ProfilerStep#N`` name gives), one per row.
        fields: Column -> the source field it was read from (Kineto ``ts_ns`` -> ``ts``): the
            message and the reason name that field.
        describe: Called with (record index, problem) for the row refused (with
            ``on_bad_event="raise"``) or the first row of each reason skipped (with ``first``);
            returns (the record, the problem) in the source's words (Kineto: ``event #18 (ph='X',
            name='aten::mm')``, ``'ts' beyond int64 (1e+30 us)``).
        first: With ``on_bad_event="skip"``, filled with reason -> its first record (``describe``'s,
            else ``what #index``) where it holds none yet, for the warning that counts them.
        epoch: Time columns of epoch ns (Kineto's ``ts_ns``): a value below 0, a time before
            1970 that no trace records, is a bad record too (``"'ts_ns' before the epoch"``), as a
            negative time is in every other source.

    Raises:
        TraceFormatError: With ``on_bad_event="raise"``, the first row that does not fit, naming
            ``what #index``, the column and the value.
    """
    drop_long_text(path, cols, src_index, on_bad_event, rejected, what, first)
    checks = {
        "ts_ns": pa.int64(),
        "dur_ns": pa.int64(),
        "device": pa.int32(),
        "step": pa.int32(),
        "stream": pa.int64(),
        "correlation": pa.int64(),
        "external_id": pa.int64(),
        **(types or {}),
    }
    values = {**cols, **(extra or {})}
    names = [n for n in checks if n in values]
    if _all_fit(values, names, checks) and all(_not_below(values[n], 0) for n in epoch if n in values):
        return
    bounds = [(0, hi) if n in epoch else (lo, hi) for n in names for lo, hi in [_bounds()[checks[n]]]]
    n_rows = len(src_index)
    values = {
        k: v if isinstance(v, list) else _pylist(v)
        for k, v in values.items()
        if k in names or k in ("ts_ns", "dur_ns")
    }
    bad: list[int] = []
    for r in range(n_rows):
        row = [values[n][r] for n in names]
        problem = _problem(row, names, bounds)
        if problem is None and "ts_ns" in cols and "dur_ns" in cols:
            ts, dur = values["ts_ns"][r], values["dur_ns"][r]
            if isinstance(ts, int) and isinstance(dur, int) and not fits(ts + dur, INT64):
                problem = f"'ts_ns' + 'dur_ns' beyond int64 ({shown(ts)} + {shown(dur)})"
        if problem is None:
            continue
        where, problem = f"{what} #{src_index[r]}", _spelled(problem, fields or {})
        reason = problem.split(" (", 1)[0]
        named = on_bad_event == "raise" or (first is not None and reason not in first)
        if describe is not None and named:
            where, problem = describe(src_index[r], problem)
        if first is not None and on_bad_event != "raise":
            first.setdefault(reason, where)
        _bad(path, where, problem, on_bad_event, rejected)
        bad.append(r)
    if bad:
        _drop(cols, src_index, bad, n_rows)


def _pylist(column: Any) -> list[Any]:
    """A column (numpy, Arrow, or anything with ``tolist()`` / ``to_pylist()``) as Python values."""
    return list(column.to_pylist() if hasattr(column, "to_pylist") else column.tolist())


def _all_fit(cols: dict[str, list[Any]], names: list[str], types: dict[str, pa.DataType]) -> bool:
    """Fast path (in C): every checked column fits its type, and ts + dur does not overflow.

    A numpy column, or one with ``values`` and ``ok`` arrays (``traceprof.collectors.kineto._values.Ints``),
    is checked by its minimum and maximum; others are converted one at a time. Arrow's memory pool
    keeps what it freed, so it is given back at the end (it was 0.5 GB on 18 M events)."""
    try:
        for n in names:
            if not _column_fits(cols[n], _bounds()[types[n]] if types[n] in _bounds() else None, types[n]):
                return False
        if "ts_ns" in names and "dur_ns" in names:
            ts, dur = cols["ts_ns"], cols["dur_ns"]
            if isinstance(ts, np.ndarray) and isinstance(dur, np.ndarray) and len(dur) and dur.min() >= 0:
                return not bool((ts > INT64[1] - dur).any())  # dur >= 0: only the top can overflow
            pc.add_checked(pa.array(ts, type=pa.int64()), pa.array(dur, type=pa.int64()))
    except (pa.ArrowInvalid, OverflowError, TypeError):
        return False
    finally:
        pa.default_memory_pool().release_unused()
    return True


def _column_fits(col: Any, bounds: tuple[int, int] | None, type_: pa.DataType) -> bool:
    values, ok = (col.values, col.ok) if hasattr(col, "values") and hasattr(col, "ok") else (col, None)
    if bounds is not None and isinstance(values, np.ndarray) and values.dtype.kind in "iu":
        if not len(values):
            return True
        lo = int(values.min(where=ok, initial=0) if ok is not None else values.min())
        hi = int(values.max(where=ok, initial=0) if ok is not None else values.max())
        return bounds[0] <= lo and hi <= bounds[1]
    pa.array(col, type=type_)  # raises when a value does not fit
    return True


def to_table(rows: list[dict[str, Any]], schema: pa.Schema, rejected: dict[str, int], what: str) -> pa.Table:
    """``pa.Table.from_pylist(rows, schema)``, leaving out rows whose integers do not fit or whose
    text is longer than :data:`MAX_FIELD_BYTES` (counted in ``rejected`` as ``"<what>: '<column>'
    beyond int64"``, ``"<what>: '<column>' longer than 1 MiB"``)."""
    if not any(_text_problem(row) for row in rows):
        try:  # every integer fits: Arrow checks them in C (an overflow raises)
            return pa.Table.from_pylist(rows, schema=schema)
        except (pa.ArrowInvalid, OverflowError):
            pass
    names = [f.name for f in schema if f.type in _bounds()]
    bounds = [_bounds()[schema.field(n).type] for n in names]
    kept = []
    for row in rows:
        problem = _text_problem(row) or _problem(row, names, bounds)
        if problem is None:
            kept.append(row)
        else:
            reason = f"{what}: {problem[: problem.index(' (')]}"
            rejected[reason] = rejected.get(reason, 0) + 1
    return pa.Table.from_pylist(kept, schema=schema)


def columns_to_table(
    columns: dict[str, list[Any]], schema: pa.Schema, rejected: dict[str, int], what: str
) -> pa.Table:
    """:func:`to_table` of rows given as columns (name -> values, one per row; a schema column not
    given is null), without a dict per row unless some value does not fit."""
    n = len(next(iter(columns.values()), []))
    try:
        table = pa.Table.from_pydict({f.name: columns.get(f.name, [None] * n) for f in schema}, schema=schema)
        if not any(_long_rows(c, MAX_FIELD_BYTES + 1) is not None for c in table.columns):
            return table
        raise OverflowError  # some text is too long: row by row
    except (pa.ArrowInvalid, OverflowError):
        names = list(columns)
        return to_table(
            [dict(zip(names, row, strict=True)) for row in zip(*columns.values(), strict=True)],
            schema,
            rejected,
            what,
        )


def record_fits(
    path: str | Path,
    where: str,
    on_bad_event: str,
    rejected: dict[str, int],
    *rows: tuple[dict[str, Any], pa.Schema],
    fields: dict[str, str] | None = None,
) -> bool:
    """Whether the rows one source record produced fit their schemas' integer columns.

    Args:
        path: The trace file, for messages.
        where: The record, e.g. ``"entry #7 ('nccl:all_reduce')"``.
        on_bad_event: ``"raise"``, or ``"skip"``: count the reason in ``rejected`` and return False.
        rejected: Counts by reason, updated.
        rows: (row dict, its table's schema) pairs; ``ts_ns + dur_ns`` is checked too, and the
            length of every text value (:data:`MAX_FIELD_BYTES`).
        fields: Column -> the source field it was read from, as the file spells it (Flight
            Recorder's ``op`` -> ``profiling_name``): the message and the reason name that field.

    Raises:
        TraceFormatError: With ``on_bad_event="raise"``, naming ``where``, the field (else the column)
            and the value (a text value by its length).
    """
    for row, schema in rows:
        names = [f.name for f in schema if f.type in _bounds() and f.name in row]
        problem = _text_problem(row) or _problem(row, names, [_bounds()[schema.field(n).type] for n in names])
        ts, dur = row.get("ts_ns"), row.get("dur_ns")
        if problem is None and isinstance(ts, int) and isinstance(dur, int) and not fits(ts + dur, INT64):
            problem = f"'ts_ns' + 'dur_ns' beyond int64 ({shown(ts)} + {shown(dur)})"
        if problem is not None:
            _bad(path, where, _spelled(problem, fields or {}), on_bad_event, rejected)
            return False
    return True


def _spelled(problem: str, fields: dict[str, str]) -> str:
    """``problem`` with each quoted column (``'op' longer than ...``) named by the source field in
    ``fields`` it was read from (``'profiling_name' longer than ...``)."""
    return re.sub(r"'([a-z_]+)'", lambda m: repr(fields.get(m[1], m[1])), problem)


def polars_out_of_range(
    int32: tuple[str, ...] = (),
    seconds: tuple[str, ...] = (),
    below: dict[str, int] | None = None,
    text: tuple[str, ...] = (),
) -> pl.Expr:
    """A polars predicate, true for rows whose values would not fit the store (for table sources).

    Args:
        int32: Integer columns stored as INTEGER.
        seconds: Time columns in seconds, stored as int64 ns (their sums too): bounded by 2**62 ns.
        below: Column -> exclusive bound of its absolute value (e.g. a sequence id that is packed
            with a stride into an int64).
        text: String columns stored as text: at most :data:`MAX_FIELD_BYTES` UTF-8 bytes.
    """
    limit_s = float(2**62) / 1e9
    out = pl.lit(False)
    for c in text:
        out = out | (pl.col(c).str.len_bytes() > MAX_FIELD_BYTES).fill_null(False)
    for c in int32:
        out = out | ~pl.col(c).is_between(INT32[0], INT32[1]).fill_null(True)
    for c in seconds:
        out = out | (pl.col(c).cast(pl.Float64).abs() > limit_s).fill_null(False)
    for c, bound in (below or {}).items():
        out = out | (pl.col(c).abs() >= bound).fill_null(False)
    return out
