"""overlap: how much of each rank's communication is hidden behind computation.

Algorithm (DESIGN.md §4; HTA's "comm-comp overlap" and Nsight's recipes use the same definition):
  1. Merge the rank's comm intervals and its compute intervals separately, all streams together
     (``traceprof.activity``: NCCL/RCCL kernels vs compute kernels; gloo work vs training-thread
     ops on CPU-only ranks).
  2. overlap = |comm ∩ compute| = |comm| + |compute| - |comm ∪ compute|.
  3. overlap_pct = overlap / |comm|; exposed communication = |comm| - overlap.
  4. The same per step (activity launched in the step), exposed also as % of the step's window.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

from traceprof.activity import activity
from traceprof.analysis import Chart, FrameResult, RunParams, register
from traceprof.errors import AnalysisError
from traceprof.intervals import class_measures
from traceprof.store import Store


@dataclass(frozen=True)
class Params(RunParams):
    """``hta``: select events as HTA 0.5.0 does (drops the last step and unlaunched GPU events)."""

    hta: bool = False


@dataclass(frozen=True)
class Result(FrameResult):
    """Per-rank overlap (``frame``) and per step (``steps``).

    Columns: rank, [step,] comm_ns, compute_ns, overlap_ns, exposed_comm_ns, window_ns (ns),
    overlap_pct (% of comm_ns; null without communication), exposed_comm_pct (% of window_ns).
    """

    steps: pl.DataFrame = field(default_factory=pl.DataFrame)
    title = "Communication/computation overlap"

    def frames(self) -> dict[str, pl.DataFrame]:
        return {"frame": self.frame, "steps": self.steps}

    def charts(self) -> list[Chart]:
        return [
            Chart("Communication per rank: hidden vs exposed", "rank", ("overlap_ns", "exposed_comm_ns"),
                  stacked=True, ylabel="ns"),
        ]


def _overlap(act: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    m = class_measures(act, by)
    return m.select(
        *by,
        "comm_ns",
        "compute_ns",
        "overlap_ns",
        (pl.col("comm_ns") - pl.col("overlap_ns")).alias("exposed_comm_ns"),
        "window_ns",
    ).with_columns(
        pl.when(pl.col("comm_ns") > 0)
        .then(100.0 * pl.col("overlap_ns") / pl.col("comm_ns"))
        .otherwise(None)
        .alias("overlap_pct"),
        (100.0 * pl.col("exposed_comm_ns") / pl.col("window_ns")).alias("exposed_comm_pct"),
    )


@register("overlap", Params)
def run(store: Store, params: Params) -> Result:
    """Communication/computation overlap per rank and per step of one run.

    Raises:
        StoreError: No such run.
        AnalysisError: The run has no GPU or CPU activity.
    """
    run_id = store.resolve_run(params.run)
    act = activity(store, run_id, hta=params.hta)
    if act.is_empty():
        raise AnalysisError(f"run {params.run or run_id}: no GPU kernels and no CPU training-thread ops")
    per_rank = _overlap(act, ["rank"])
    per_step = _overlap(act.filter(pl.col("step").is_not_null()), ["rank", "step"])
    notes = []
    no_comm = per_rank.filter(pl.col("comm_ns") == 0)["rank"].to_list()
    if no_comm:
        notes.append(f"ranks without communication (overlap undefined): {no_comm}")
    if params.hta:
        notes.append("HTA-compatible selection (last step and unlaunched GPU events dropped)")
    return Result(frame=per_rank, steps=per_step, notes=tuple(notes))
