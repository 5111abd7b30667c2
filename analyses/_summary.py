"""Duration statistics per name, as ``nsys stats`` prints them (shared by the ``*_sum`` analyses).

Given SQL that yields rows ``rank, name, dur_ns`` for one run, :func:`summarize` returns the
statistics per name over the run (``frame``) and per (rank, name) (``ranks``): time_pct (share of
the summed time, 0..100), total_ns, instances, avg_ns, med_ns, min_ns, max_ns, stddev_ns (sample
standard deviation, 0 for one instance), ranks (ranks the name occurs on; run table only). Mean,
median and standard deviation are rounded to whole ns (halves away from zero); median of an even
count is the mean of the two middle values, as in ``nsys stats``. Sorted by total time, largest
first (ties by name).
"""

from __future__ import annotations

import polars as pl

from traceprof.core.classify import KEPT_FLAGS, NO_DURATION_FLAGS, flagged_text
from traceprof.core.schema import sql_texts
from traceprof.storage.store import Store

__all__ = ["summarize", "summarize_run", "flagged_notes"]

_STATS = """
SELECT {keys},
       sum(dur_ns)::BIGINT AS total_ns, count(*)::BIGINT AS instances,
       round(avg(dur_ns))::BIGINT AS avg_ns, round(median(dur_ns))::BIGINT AS med_ns,
       min(dur_ns)::BIGINT AS min_ns, max(dur_ns)::BIGINT AS max_ns,
       round(coalesce(stddev_samp(dur_ns), 0))::BIGINT AS stddev_ns{extra}
FROM ({rows}) GROUP BY ALL
"""


def summarize(store: Store, run_id: int, rows_sql: str) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Statistics of ``rows_sql`` (columns rank, name, dur_ns; ``$run`` is the run id).

    Returns:
        (per-name frame, per-(rank, name) frame); see the module doc for the columns.
    """
    run = summarize_run(store, run_id, rows_sql)
    per = store.sql(
        _STATS.format(keys="rank, name", rows=rows_sql.replace("$run", str(int(run_id))), extra="")
    )
    return run, _order(per, ["rank"])


def summarize_run(store: Store, run_id: int, rows_sql: str) -> pl.DataFrame:
    """The per-name frame of :func:`summarize` alone (no query per (rank, name))."""
    q = rows_sql.replace("$run", str(int(run_id)))
    return _order(
        store.sql(_STATS.format(keys="name", rows=q, extra=", count(DISTINCT rank)::BIGINT AS ranks")), []
    )


def _order(df: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    if df.is_empty():
        return df
    total = pl.col("total_ns").sum().over(by) if by else pl.col("total_ns").sum()
    df = df.with_columns((100.0 * pl.col("total_ns") / total).alias("time_pct"))
    cols = [*by, "time_pct", "total_ns", "instances", "avg_ns", "med_ns", "min_ns", "max_ns", "stddev_ns"]
    cols += ["ranks"] if "ranks" in df.columns else []
    return df.sort([*by, "total_ns", "name"], descending=[False] * len(by) + [True, False]).select(
        *cols, "name"
    )


def flagged_notes(store: Store, run_id: int, select_sql: str, what: str) -> list[str]:
    """Notes on the records of a ``*_sum`` selection that ingest flagged (``events.flag``, not one of
    the kept flags): those with a known duration (another clock's start: ``before_launch``,
    ``far_outside``) are counted, those without (``traceprof.core.classify.NO_DURATION_FLAGS``) are
    left out; each note gives the count per flag. ``[]`` when none is flagged.

    Args:
        store: An open store.
        run_id: The run.
        select_sql: ``FROM events e WHERE ...`` of the summary's rows before the duration rule
            (``$run`` is the run id).
        what: The records' plural noun ("kernels", "copies/memsets", "ranges").
    """
    rows = store.sql(
        f"SELECT e.flag, count(*)::BIGINT AS n {select_sql.replace('$run', str(int(run_id)))} "
        f"AND e.flag IS NOT NULL AND e.flag NOT IN ({sql_texts(sorted(KEPT_FLAGS))}) GROUP BY e.flag ORDER BY e.flag"
    )
    counted = [(f, n) for f, n in rows.iter_rows() if f not in NO_DURATION_FLAGS]
    dropped = [(f, n) for f, n in rows.iter_rows() if f in NO_DURATION_FLAGS]

    notes = []
    if counted:
        notes.append(
            flagged_text(counted, what) + " counted with their recorded durations: their start is another "
            "clock's, so windows, idle and latency leave them out"
        )
    if dropped:
        notes.append(flagged_text(dropped, what) + " left out: their duration is unknown")
    return notes
