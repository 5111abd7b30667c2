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
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from traceprof.collectors._far_end import count_repair
from traceprof.core.limits import drop_rows

__all__ = ["DUPLICATE_REPAIR", "KEYS", "drop_duplicates", "duplicate_rows", "duplicate_warning", "key_arrays"]

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
        return col.take(pa.array(rows)).to_pylist()
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
    first = describe(int(dup[0]))
    drop_rows(cols, src_index, dup.tolist(), len(cols["ts_ns"]))
    count_repair(repaired, DUPLICATE_REPAIR, len(dup))
    return duplicate_warning(Path(path).name, len(dup), first)
