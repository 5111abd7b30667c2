"""Collectives whose dtype traceprof does not know the size of (a ``settle`` ingest hook's note).

A record's bytes are its element count times the dtype's size (``traceprof.core.ops.dtype_bytes``);
for a dtype the table lacks they are NULL, and every bandwidth figure leaves the collective out.
:func:`unknown_dtypes` says so once per run and source, naming the dtypes and counting the records.
"""

from __future__ import annotations

from traceprof.core.ops import dtype_bytes
from traceprof.core.text import first_few
from traceprof.storage.store import Store

__all__ = ["unknown_dtypes"]

_UNSIZED = """
SELECT dtype, count(*) AS n FROM collectives
WHERE run_id = ? AND source = ? AND dtype IS NOT NULL AND bytes_in IS NULL AND bytes_out IS NULL
  AND coalesce(nelems_in, nelems_out) IS NOT NULL
GROUP BY dtype ORDER BY n DESC, dtype
"""


def unknown_dtypes(store: Store, run_id: int, source: str, what: str) -> list[str]:
    """A note for the run's collectives of ``source`` (``collectives.source``; ``what`` names it in
    the note) whose dtype has no known size, or none: ``"Flight Recorder: 12 collective(s) of a dtype
    traceprof does not know the size of ('Foo' x 12): their bytes are unknown (NULL; no bandwidth)"``."""
    rows = [
        (d, n) for d, n in store.con.execute(_UNSIZED, [run_id, source]).fetchall() if dtype_bytes(d) is None
    ]
    if not rows:
        return []
    shown = first_few(rows, 5, shown=lambda r: f"{r[0]!r} x {r[1]}")
    return [
        f"{what}: {sum(n for _, n in rows)} collective(s) of a dtype traceprof does not know the size of "
        f"({shown}): their bytes are unknown (NULL; no bandwidth for them)"
    ]
