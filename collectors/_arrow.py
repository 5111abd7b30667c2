"""Arrow schemas of the row tables collectors hand to the store, derived from ``traceprof.core.schema``.

A collector builds ``pa.Table.from_pylist(rows, schema=row_schema("collectives"))``; the columns are
the store table's minus those the store fills (run_id, trace_id, rank) and those filled after ingest
(``instance_id``, ``match_method``).
"""

from __future__ import annotations

import pyarrow as pa

from traceprof.core import schema

__all__ = ["row_schema"]

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
