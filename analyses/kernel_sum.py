"""kernel_sum: GPU kernel time per kernel name, as ``nsys stats --report cuda_gpu_kern_sum``.

Algorithm:
  1. Take every GPU kernel of the run (``events`` kind ``kernel``; any source: Kineto, nsys); memcpy
     and memset are left out, as in nsys. A kernel flagged at ingest for its start (``events.flag``
     ``before_launch``, ``far_outside``: another clock domain) counts with its recorded duration; one
     whose duration is unknown (``traceprof.core.classify.NO_DURATION_FLAGS``) is left out; a note
     counts either.
  2. Per kernel name (the full, demangled name), over the run and per rank: total time, instances,
     average, median, minimum, maximum and sample standard deviation of the durations, and the
     share of the summed kernel time (``traceprof.analyses._summary``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

from traceprof.analyses._summary import flagged_notes, summarize
from traceprof.core import columns as rc
from traceprof.core.classify import DURATION_SQL
from traceprof.core.errors import AnalysisError
from traceprof.engine.activity import graph_level_notes
from traceprof.engine.analysis import Analysis, Chart, FrameResult, Report, RunParams, register
from traceprof.storage.runs import run_label
from traceprof.storage.store import Store

#: The kernels of the run, before the duration rule (module doc, step 1).
_SELECT = "FROM events e WHERE e.run_id = $run AND e.kind = 'kernel'"
_ROWS = f"SELECT e.rank, e.name, e.dur_ns {_SELECT} AND {DURATION_SQL}"


@dataclass(frozen=True)
class Params(RunParams):
    """No parameters besides the run."""


@dataclass(frozen=True)
class Result(FrameResult):
    """Per kernel name over the run (``frame``) and per (rank, name) (``ranks``); their columns
    are declared in :data:`SPEC`."""

    ranks: pl.DataFrame = field(default_factory=pl.DataFrame)
    title = "GPU kernel summary"

    def charts(self) -> list[Chart]:
        return [Chart("Kernel time by name (run)", "name", ("total_ns",), ylabel="ns")]


SPEC = Analysis(
    name="kernel_sum",
    reads_activity=False,  # queries the store's views only
    params=Params,
    result=Result,
    frames=(
        rc.frame("frame", "Per kernel name over the run", *rc.summary_columns("kernel", per_rank=False)),
        rc.frame("ranks", "Per (rank, kernel name)", *rc.summary_columns("kernel", per_rank=True)),
    ),
    report=Report(91, "GPU kernels (a Kineto trace with CUDA activity, or Nsight Systems)"),
)


@register(SPEC)
def run(store: Store, params: Params) -> Result:
    """Kernel time per name (module doc).

    Raises:
        StoreError: No such run.
        AnalysisError: The run has no GPU kernels (e.g. Flight Recorder or gloo CPU traces only).
    """
    run_id = store.resolve_run(params.run)
    frame, ranks = summarize(store, run_id, _ROWS)
    if frame.is_empty():
        raise AnalysisError(
            f"{run_label(store, run_id)}: no GPU kernels; kernel_sum needs a GPU trace (Kineto or nsys)"
        )
    notes = [*flagged_notes(store, run_id, _SELECT, "kernels"), *graph_level_notes(store, run_id)]
    return Result(frame=frame, ranks=ranks, notes=tuple(notes))
