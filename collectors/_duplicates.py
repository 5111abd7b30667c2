"""Exact duplicate records: found at ingest, kept once, said and counted.

A trace that holds a record twice (the same kind, lane, name, start, duration and ids: an exporter
that wrote a buffer twice) doubles every total read from it. A collector passes the columns that
identify one of its records (:func:`duplicate_rows`); the later copies are dropped, with a warning
naming the file and the first copy (:func:`duplicate_warning`), and counted in
``traces.meta.repaired`` under :data:`DUPLICATE_REPAIR` (``traceprof.collectors._far_end.count_repair``).
Two records that differ in any one of those columns (a start 1 ns apart: a real overlap) are not
duplicates; the lane rules (``traceprof.collectors._far_end``) handle them.

Cost: one hash of the key columns per row and one sort of the hashes; only rows whose hash repeats
are compared value by value.

Sources read record by record (Flight Recorder entries, NCCL profiler-plugin events, NCCL Inspector
records) pass each record's identity instead (:func:`duplicate_records`: what tells two records
apart in that format, e.g. a Flight Recorder entry's every field, ``record_id`` included); the copies
are skipped, said and counted the same way. Columnar sources (NDTimeline) pass a table of the
columns that identify a row (:func:`duplicate_table_rows`). torch's memory timeline
(``export_memory_timeline``) is not checked: its entries ``[t, action, bytes, category]`` name no
tensor, so two tensors of one size and category created at one time are two equal entries, both real.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from traceprof.collectors._arrow import values_at
from traceprof.collectors._far_end import count_repair
from traceprof.core.limits import drop_rows

__all__ = [
    "DUPLICATE_REPAIR",
    "KEYS",
    "drop_duplicates",
    "duplicate_records",
    "duplicate_rows",
    "duplicate_table_rows",
    "duplicate_warning",
    "key_arrays",
]

#: The columns that identify a parser row: its kind (and category), lane (pid/tid; device/stream on
#: the GPU), name, start, duration, ids and args (two allocations of a ``[memory]`` instant at one
#: ``ts`` differ in their args only). The rank is the file's.
KEYS = (
    "kind",
    "cat",
    "name",
    "pid",
    "tid",
    "device",
    "stream",
    "ts_ns",
    "dur_ns",
    "correlation",
    "external_id",
    "args",
)
#: The columns hashed for every row (the rest are compared on the rows whose hashes repeat).
_HASHED = ("ts_ns", "dur_ns", "name", "tid")

#: The reason dropped exact duplicates are counted under in ``traces.meta.repaired``.
DUPLICATE_REPAIR = "exact duplicate record dropped"

_MIX = np.uint64(0x9E3779B97F4A7C15)  # an odd 64-bit constant (the golden ratio's): spreads each key


def duplicate_rows(hashed: list[np.ndarray], compared: list[Any]) -> np.ndarray:
    """Rows that repeat an earlier row on every column, in row order: the copies to drop (the first
    of each group is kept). ``hashed``: integer arrays hashed for every row; ``compared``: the
    columns (lists, numpy, Arrow) compared value by value on the rows whose hashes repeat, which
    include ``hashed``'s columns; all of one length."""
    n = len(hashed[0]) if hashed else 0
    if n < 2:
        return np.empty(0, np.int64)
    h = np.zeros(n, np.uint64)
    with np.errstate(over="ignore"):
        for k in hashed:
            h ^= k.astype(np.uint64, copy=False)
            h *= _MIX
            h ^= h >> np.uint64(29)
    order = np.argsort(h)
    ordered = h[order]
    same = ordered[1:] == ordered[:-1]
    if not same.any():  # the usual case: no hash repeats
        return np.empty(0, np.int64)
    in_run = np.zeros(n, bool)  # sorted positions in a run of equal hashes
    in_run[1:] |= same
    in_run[:-1] |= same
    rows = np.sort(order[in_run])  # in row order
    values = [_at_rows(c, rows) for c in compared]
    seen: set[tuple[Any, ...]] = set()
    dup: list[int] = []
    for r, key in zip(rows.tolist(), zip(*values, strict=True), strict=True):
        if key in seen:
            dup.append(r)
        else:
            seen.add(key)
    return np.asarray(dup, np.int64)


def _at_rows(col: Any, rows: np.ndarray) -> list[Any]:
    """The values of ``col`` at ``rows`` as Python values."""
    if isinstance(col, list):
        return [col[r] for r in rows.tolist()]
    if isinstance(col, pa.Array | pa.ChunkedArray):
        return values_at(col, rows)
    return list(col[rows].tolist())


def key_arrays(cols: dict[str, Any], names: tuple[str, ...]) -> list[np.ndarray]:
    """The integer arrays that stand for columns ``names`` of ``cols``: a coded string column's
    codes (``codes``), an integer column with missing values' values and validity (``values``,
    ``ok``), a numpy column itself; a list of strings as codes, of ints (or None) as values and
    validity."""
    out: list[np.ndarray] = []
    for name in names:
        col = cols[name]
        if isinstance(col, list):
            a = pa.array(col)
            if pa.types.is_null(a.type):  # all None: one value
                out.append(np.zeros(len(a), np.int8))
            elif pa.types.is_string(a.type) or pa.types.is_large_string(a.type):
                out.append(a.dictionary_encode().indices.fill_null(-1).to_numpy())
            else:
                out += [a.fill_null(0).to_numpy(), a.is_valid().to_numpy(zero_copy_only=False)]
        elif hasattr(col, "codes"):
            out.append(col.codes)
        elif hasattr(col, "ok"):
            out += [col.values, col.ok]
        else:
            out.append(np.asarray(col))
    return out


def duplicate_warning(file: str, n: int, first: str) -> str:
    """``rank0.json: 4 duplicate records dropped (first: event #12 (ph='X', ...))``."""
    return f"{file}: {n} duplicate record{'s' if n != 1 else ''} dropped (first: {first})"


def drop_duplicates(
    path: str | Path,
    cols: dict[str, Any],
    src_index: list[int] | None,
    describe: Callable[[int], str],
    repaired: dict[str, int],
) -> str | None:
    """Drop the rows of ``cols`` (a parser's columns: lists, numpy, ``Strs``/``Ints``) that repeat
    an earlier row on every column of :data:`KEYS`, in place (``src_index`` too); count them in
    ``repaired`` under :data:`DUPLICATE_REPAIR`.

    Args:
        describe: The record of a row (its index in ``cols`` before the drop) in a message
            (Kineto: ``event #12 (ph='X', name='aten::mm', ts=1020.0)``).

    Returns:
        The warning naming the file, the count and the first copy dropped; None when there is none.
    """
    compared = [*key_arrays(cols, tuple(k for k in KEYS if k != "args")), cols["args"]]
    dup = duplicate_rows(key_arrays(cols, _HASHED), compared)
    if not len(dup):
        return None
    said = _said(path, dup.tolist(), describe, repaired)  # names the first copy before the drop
    drop_rows(cols, src_index, dup.tolist(), len(cols["ts_ns"]))
    return said


def _said(
    path: str | Path, dup: list[int], describe: Callable[[int], str], repaired: dict[str, int]
) -> str | None:
    """Count the copies ``dup`` (record indices, ascending) in ``repaired`` and return the warning
    naming the first (None when there is none)."""
    if not dup:
        return None
    count_repair(repaired, DUPLICATE_REPAIR, len(dup))
    return duplicate_warning(Path(path).name, len(dup), describe(dup[0]))


def duplicate_records(
    path: str | Path,
    records: Sequence[Any],
    identity: Callable[[Any], Hashable | None],
    describe: Callable[[int], str],
    repaired: dict[str, int],
) -> tuple[set[int], str | None]:
    """The records of a source read record by record that repeat an earlier one (the first of each
    kept), counted in ``repaired`` under :data:`DUPLICATE_REPAIR`.

    Args:
        records: The file's records, in order.
        identity: What identifies a record in its format (hashable), or None for a record that is
            never a copy (an empty object, a time the writer never set: such repeats are legitimate).
        describe: The record at an index in a message (``entry #12 ('nccl:all_reduce')``).

    Returns:
        The indices of the copies (the caller skips them, keeping the others' indices for its
        messages) and the warning naming the file, the count and the first copy (None: none).
    """
    seen: set[Hashable] = set()
    dup: list[int] = []
    for i, rec in enumerate(records):
        key = identity(rec)
        if key is None:
            continue
        if key in seen:
            dup.append(i)
        else:
            seen.add(key)
    return set(dup), _said(path, dup, describe, repaired)


def duplicate_table_rows(
    path: str | Path,
    table: pa.Table,
    hashed: Sequence[str],
    describe: Callable[[int], str],
    repaired: dict[str, int],
) -> tuple[list[int], str | None]:
    """The rows of ``table`` (the columns that identify a record of its format) equal to an earlier
    row in every column (:func:`duplicate_rows`; ``hashed``: integer columns hashed for every row),
    counted in ``repaired`` under :data:`DUPLICATE_REPAIR`; and the warning naming the first."""
    if table.num_rows < 2:
        return [], None
    ints = [table.column(c).fill_null(0).to_numpy() for c in hashed]
    dup = duplicate_rows(ints, [table.column(c) for c in table.column_names]).tolist()
    return dup, _said(path, dup, describe, repaired)
