"""nccl_sum: communication time per collective op and per communication kernel, like nsys's NCCL summary.

Algorithm:
  1. Collectives (any source: NCCL kernels of Kineto and nsys traces, gloo work, Flight Recorder
     entries, NCCL profiler-plugin events, NCCL Inspector records): per op (``collectives.op``), over the run and per rank,
     the statistics of end - start (``analyses._summary``) and the bytes moved (``bytes_in``).
     Rows without both times (gloo Flight Recorder entries record only their enqueue) count in
     ``instances_total`` but not in the time statistics.
  2. Communication kernels (``events.class = 'comm'``, GPU sources only): the same statistics per
     kernel name (table ``kernels``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

from analyses._summary import summarize
from traceprof.analysis import FrameResult, RunParams, register
from traceprof.classify import VALID_SQL
from traceprof.errors import AnalysisError
from traceprof.store import Store

_TIMED = ("SELECT rank, op AS name, end_ns - start_ns AS dur_ns FROM collectives "
          "WHERE run_id = $run AND start_ns IS NOT NULL AND end_ns IS NOT NULL")
_KERNELS = (f"SELECT e.rank, e.name, e.dur_ns FROM events e WHERE e.run_id = $run AND e.kind = 'kernel' "
            f"AND e.class = 'comm' AND {VALID_SQL}")
_COUNTS = """
SELECT op AS name, count(*)::BIGINT AS instances_total, sum(bytes_in)::BIGINT AS bytes_in,
       string_agg(DISTINCT source, ',' ORDER BY source) AS sources
FROM collectives WHERE run_id = ? GROUP BY op
"""


@dataclass(frozen=True)
class Params(RunParams):
    """No parameters besides the run."""


@dataclass(frozen=True)
class Result(FrameResult):
    """``frame``: per op over the run: time_pct, total_ns, instances (timed), avg_ns, med_ns,
    min_ns, max_ns, stddev_ns (int64 ns, null when no row is timed), ranks, name (the op),
    instances_total (all rows), bytes_in (bytes, summed), sources. ``ranks``: timed statistics per
    (rank, op). ``kernels``: per communication kernel name (GPU sources)."""

    ranks: pl.DataFrame = field(default_factory=pl.DataFrame)
    kernels: pl.DataFrame = field(default_factory=pl.DataFrame)
    title = "Collective (NCCL) summary"


@register("nccl_sum", Params)
def run(store: Store, params: Params) -> Result:
    """Communication time per op and per kernel (module doc).

    Raises:
        StoreError: No such run.
        AnalysisError: The run has no collectives and no communication kernels.
    """
    run_id = store.resolve_run(params.run)
    counts = store.sql(_COUNTS, [run_id])
    timed, ranks = summarize(store, run_id, _TIMED)
    kernels, _ = summarize(store, run_id, _KERNELS)
    if counts.is_empty() and kernels.is_empty():
        raise AnalysisError(f"run {params.run or run_id}: no collectives and no communication kernels")
    notes = []
    if timed.is_empty():
        frame = counts
        notes.append("no collective has both a start and an end time (e.g. gloo Flight Recorder dumps record "
                     "only the enqueue); counts only")
    else:
        frame = timed.join(counts, on="name", how="full", coalesce=True).sort(
            ["total_ns", "name"], descending=[True, False], nulls_last=True)
    return Result(frame=frame, ranks=ranks, kernels=kernels, notes=tuple(notes))
