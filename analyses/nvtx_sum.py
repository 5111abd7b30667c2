"""nvtx_sum: time per annotated range name, as ``nsys stats --report nvtx_sum``.

Algorithm:
  1. Take the run's CPU annotation ranges: nsys NVTX push/pop and start/end ranges, Kineto
     ``record_function`` annotations (``user_annotation``), and step ranges (``ProfilerStep#N``,
     step-named NVTX ranges). Instants (marks, NVTX ranges never closed) have no duration and are
     left out, as is a Kineto ``B`` never closed (``events.flag`` ``unmatched_begin``: duration
     unknown, stored as 0), with a note; a range flagged for its start (another clock domain) counts
     with its recorded duration, also with a note. With ``gpu=true`` the GPU-side annotations (Kineto ``gpu_user_annotation``) are
     summarized instead.
  2. Per range name, over the run and per rank: total time, instances, average, median, minimum,
     maximum, sample standard deviation, share of the summed range time (``traceprof.analyses._summary``).
     Nested ranges each count in full, so shares add up to more than wall time when ranges nest.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

from traceprof.analyses._summary import flagged_notes, summarize
from traceprof.core import columns as rc
from traceprof.core.classify import DURATION_SQL
from traceprof.core.errors import AnalysisError
from traceprof.engine.analysis import Analysis, FrameResult, Report, RunParams, register
from traceprof.storage.runs import run_label
from traceprof.storage.store import Store


@dataclass(frozen=True)
class Params(RunParams):
    """``gpu``: summarize the GPU-side annotations (Kineto ``gpu_user_annotation``) instead."""

    gpu: bool = False


@dataclass(frozen=True)
class Result(FrameResult):
    """Per range name over the run (``frame``) and per (rank, name) (``ranks``); their columns
    are declared in :data:`SPEC`."""

    ranks: pl.DataFrame = field(default_factory=pl.DataFrame)
    title = "Annotated range (NVTX) summary"


SPEC = Analysis(
    name="nvtx_sum",
    reads_activity=False,  # queries the store's views only
    params=Params,
    result=Result,
    frames=(
        rc.frame("frame", "Per range name over the run", *rc.summary_columns("range", per_rank=False)),
        rc.frame("ranks", "Per (rank, range name)", *rc.summary_columns("range", per_rank=True)),
    ),
    report=Report(93, "annotation ranges (NVTX in Nsight Systems, record_function in Kineto)"),
)


@register(SPEC)
def run(store: Store, params: Params) -> Result:
    """Range time per name (module doc).

    Raises:
        StoreError: No such run.
        AnalysisError: The run has no annotation ranges.
    """
    run_id = store.resolve_run(params.run)
    kinds = "('gpu_user_annotation')" if params.gpu else "('user_annotation', 'step')"
    select = f"FROM events e WHERE e.run_id = $run AND e.kind IN {kinds}"
    frame, ranks = summarize(store, run_id, f"SELECT e.rank, e.name, e.dur_ns {select} AND {DURATION_SQL}")
    if frame.is_empty():
        raise AnalysisError(
            f"{run_label(store, run_id)}: no {'GPU ' if params.gpu else ''}annotation ranges "
            "(NVTX / record_function) in the trace"
        )
    return Result(frame=frame, ranks=ranks, notes=tuple(flagged_notes(store, run_id, select, "ranges")))
