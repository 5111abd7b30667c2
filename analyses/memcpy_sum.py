"""memcpy_sum: GPU memory-copy and memset time and bytes per operation, as ``nsys stats``' memory reports.

The time table is ``nsys stats --report cuda_gpu_mem_time_sum``'s, the size table its
``cuda_gpu_mem_size_sum``.

Algorithm:
  1. Take every memcpy and memset of the run (``events`` kind ``memcpy`` / ``memset``; any GPU
     source: Kineto, nsys). A row flagged at ingest for its start (``events.flag`` ``before_launch``,
     ``far_outside``: another clock domain) counts with its recorded duration and bytes; one whose
     duration is unknown (``traceprof.core.classify.NO_DURATION_FLAGS``) is left out; a note counts
     either.
  2. The operation of a row: the copy direction of a memcpy, the head of its name (``Memcpy HtoD``,
     ``Memcpy DtoH``, ``Memcpy DtoD``, ``Memcpy PtoP`` ...; the memory kinds in parentheses left out,
     as nsys groups them), or ``Memset``.
  3. Per operation, over the run (``frame``) and per rank (``ranks``): total time, count, average,
     median, minimum, maximum and sample standard deviation of the durations, and the share of
     the summed copy time (``traceprof.analyses._summary``, as the other ``*_sum`` analyses).
  4. Per operation (``sizes``): the bytes moved, from each row's ``bytes`` arg (Kineto
     ``args.bytes``, nsys ``bytes``): total, count of the rows that record it, average, median,
     minimum, maximum and sample standard deviation (rounded to whole bytes), as nsys does.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

from traceprof.analyses._summary import flagged_notes, summarize
from traceprof.core import columns as rc
from traceprof.core.classify import DURATION_SQL
from traceprof.core.errors import AnalysisError
from traceprof.core.schema import Column
from traceprof.engine.analysis import Analysis, Chart, FrameResult, Report, RunParams, register
from traceprof.storage.runs import run_label
from traceprof.storage.store import Store

#: The operation of a memcpy / memset row (module doc, step 2).
_OPERATION = (
    r"CASE WHEN e.kind = 'memset' THEN 'Memset' "
    r"ELSE coalesce(nullif(regexp_extract(e.name, '^(Memcpy \S+)', 1), ''), e.name) END"
)
#: The copies and memsets of the run, before the duration rule (module doc, step 1).
_SELECT = "FROM events e WHERE e.run_id = $run AND e.kind IN ('memcpy', 'memset')"
_ROWS = f"SELECT e.rank, {_OPERATION} AS name, e.dur_ns {_SELECT} AND {DURATION_SQL}"
_SIZES = f"""
SELECT name,
       sum(bytes)::BIGINT AS total_bytes, count(bytes)::BIGINT AS count,
       round(avg(bytes))::BIGINT AS avg_bytes, round(median(bytes))::BIGINT AS med_bytes,
       min(bytes)::BIGINT AS min_bytes, max(bytes)::BIGINT AS max_bytes,
       round(coalesce(stddev_samp(bytes), 0))::BIGINT AS stddev_bytes
FROM (SELECT {_OPERATION} AS name, TRY_CAST(json_extract_string(e.args, '$.bytes') AS BIGINT) AS bytes
      {_SELECT.replace("$run", "?")} AND {DURATION_SQL})
GROUP BY name HAVING count(bytes) > 0 ORDER BY total_bytes DESC, name
"""


@dataclass(frozen=True)
class Params(RunParams):
    """No parameters besides the run."""


@dataclass(frozen=True)
class Result(FrameResult):
    """Time per operation over the run (``frame``), per (rank, operation) (``ranks``) and bytes per
    operation (``sizes``); their columns are declared in :data:`SPEC`."""

    ranks: pl.DataFrame = field(default_factory=pl.DataFrame)
    sizes: pl.DataFrame = field(default_factory=pl.DataFrame)
    title = "GPU memory copy summary"

    def charts(self) -> list[Chart]:
        return [Chart("Copy and memset time by operation (run)", "name", ("total_ns",), ylabel="ns")]


def _bytes(name: str, doc: str) -> Column:
    return rc.number(name, doc, "bytes", "BIGINT")


SPEC = Analysis(
    name="memcpy_sum",
    reads_activity=False,  # queries the store's views only
    params=Params,
    result=Result,
    frames=(
        rc.frame(
            "frame",
            "Time per operation over the run (nsys stats cuda_gpu_mem_time_sum)",
            *rc.summary_columns("copy", per_rank=False),
        ),
        rc.frame("ranks", "Time per (rank, operation)", *rc.summary_columns("copy", per_rank=True)),
        rc.frame(
            "sizes",
            "Bytes per operation (nsys stats cuda_gpu_mem_size_sum), the rows that record them",
            rc.text("name", "Operation: Memcpy HtoD, Memcpy DtoH, Memcpy DtoD, ..., Memset"),
            _bytes("total_bytes", "Bytes copied (or set), summed"),
            rc.count("count", "Rows that record their bytes"),
            _bytes("avg_bytes", "Mean, rounded"),
            _bytes("med_bytes", "Median, rounded"),
            _bytes("min_bytes", "Smallest"),
            _bytes("max_bytes", "Largest"),
            _bytes("stddev_bytes", "Sample standard deviation, rounded; 0 for one row"),
        ),
    ),
    report=Report(95, "GPU copies or memsets (Kineto with CUDA activity, or Nsight Systems)"),
)


@register(SPEC)
def run(store: Store, params: Params) -> Result:
    """Copy and memset time and bytes per operation (module doc).

    Source: events of kind memcpy and memset, their ``args.bytes``.

    Raises:
        StoreError: No such run.
        AnalysisError: The run has no memory copies or memsets (e.g. a CPU-only run).
    """
    run_id = store.resolve_run(params.run)
    frame, ranks = summarize(store, run_id, _ROWS)
    if frame.is_empty():
        raise AnalysisError(
            f"{run_label(store, run_id)}: no GPU memory copies or memsets; memcpy_sum needs a GPU "
            "trace (Kineto or nsys)"
        )
    sizes = store.sql(_SIZES, [run_id])
    notes = flagged_notes(store, run_id, _SELECT, "copies/memsets")
    notes += [] if sizes.height else ["no row records its bytes (args.bytes): no sizes table"]
    return Result(frame=frame, ranks=ranks, sizes=sizes, notes=tuple(notes))
