"""Arrow schemas of the row tables collectors hand to the store, derived from ``traceprof.core.schema``.

A collector builds ``pa.Table.from_pylist(rows, schema=row_schema("collectives"))``; the columns are
the store table's minus those the store fills (run_id, trace_id, rank) and those filled after ingest
(``instance_id``, ``match_method``). :func:`values_at` reads rows of a chunked column without
concatenating it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from traceprof.core import schema

__all__ = ["chunk_starts", "row_schema", "values_at"]

_STORE_FILLS = frozenset({"run_id", "trace_id", "rank", "instance_id", "match_method"})
_TYPES = {
    "INTEGER": pa.int32(),
    "BIGINT": pa.int64(),
    "VARCHAR": pa.string(),
    "JSON": pa.string(),
    "BOOLEAN": pa.bool_(),
    "DOUBLE": pa.float64(),
}


def row_schema(table: str) -> pa.Schema:
    """The Arrow schema of collector rows for store table ``table`` (events, steps, collectives).

    Raises:
        KeyError: Unknown table, or a column type without an Arrow mapping.
    """
    cols = [c for c in schema.table(table).columns if c.name not in _STORE_FILLS]
    return pa.schema([(c.name, _TYPES[c.type.split()[0]]) for c in cols])


def chunk_starts(col: pa.ChunkedArray) -> np.ndarray:
    """The row at which each chunk of ``col`` starts, and its length last (int64, chunks + 1 entries)."""
    return np.cumsum([0] + [len(c) for c in col.chunks], dtype=np.int64)


def values_at(
    col: pa.Array | pa.ChunkedArray, rows: np.ndarray, starts: np.ndarray | None = None
) -> list[Any]:
    """The values of ``col`` at ``rows`` (indices, any order) as Python values, taken a chunk at a
    time: ``take`` on a whole chunked column concatenates its chunks first, a transient copy of the
    whole column (the args text of a 54 MB trace: 0.05 s for 494 rows). ``starts``: the column's
    :func:`chunk_starts`, when the caller keeps them (None: computed here)."""
    if isinstance(col, pa.Array):
        return list(col.take(pa.array(rows, pa.int64())).to_pylist())
    if starts is None:
        starts = chunk_starts(col)
    which = np.searchsorted(starts, rows, side="right") - 1
    out: list[Any] = [None] * len(rows)
    for c in np.unique(which).tolist():
        at = np.flatnonzero(which == c)
        values = col.chunk(c).take(pa.array(rows[at] - starts[c], pa.int64())).to_pylist()
        for k, v in zip(at.tolist(), values, strict=True):
            out[k] = v
    return out
