"""overlap: how much of each rank's communication is hidden behind computation.

Algorithm (README.md "Analyses"; HTA's "comm-comp overlap" and Nsight's recipes use the same definition):
  1. Merge the rank's comm intervals and its compute intervals separately, all streams together
     (``traceprof.activity``: NCCL/RCCL kernels vs compute kernels; gloo work vs training-thread
     ops on CPU-only ranks).
  2. overlap = |comm ∩ compute| = |comm| + |compute| - |comm ∪ compute|.
  3. overlap_pct = overlap / |comm|; exposed communication = |comm| - overlap.
  4. The same per step: the step's communication and compute are the activity launched in it (on
     CPU ranks: started in it), window = first start to last end of that activity. Communication
     counts as hidden when any compute of the rank runs at the same time, also compute of another
     step (e.g. the next step's forward under this step's last all-reduce), so a step's exposed
     communication is |comm of the step - all compute of the rank| and overlap = comm - exposed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

from traceprof.activity import excluded_note, graph_level_notes, multi_device_ranks, run_activity
from traceprof.analysis import Chart, FrameResult, RunParams, register
from traceprof.intervals import class_measures, subtract
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
    ``devices`` (only when a rank drives several GPUs): rank, device and the same columns, each
    device's communication measured against that device's compute.
    """

    steps: pl.DataFrame = field(default_factory=pl.DataFrame)
    devices: pl.DataFrame = field(default_factory=pl.DataFrame)
    title = "Communication/computation overlap"

    def charts(self) -> list[Chart]:
        return [
            Chart("Communication per rank: hidden vs exposed", "rank", ("overlap_ns", "exposed_comm_ns"),
                  stacked=True, ylabel="ns"),
        ]


def exposed_comm(act: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """Maximal intervals of communication not hidden behind any compute of the same rank.

    Args:
        act: Activity frame (``traceprof.activity``).
        by: ``["rank"]`` or ``["rank", "step"]`` (one step's communication minus all the rank's
            compute, module doc step 4); rows with a null step form their own group.

    Returns:
        Frame with ``by`` + start_ns, end_ns (ns), disjoint and sorted within each group.
    """
    comm = act.filter(pl.col("class") == "comm")
    return subtract(comm, act.filter(pl.col("class") == "compute"), by, ["rank"])


def _overlap(act: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    m = class_measures(act, by)
    if "step" in by:  # hidden behind any compute of the rank (module doc, step 4)
        exp = exposed_comm(act, by).group_by(by).agg((pl.col("end_ns") - pl.col("start_ns")).sum().alias("_exp"))
        m = m.join(exp, on=by, how="left").with_columns(
            (pl.col("comm_ns") - pl.col("_exp").fill_null(0)).alias("overlap_ns")
        ).drop("_exp")
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
    run_id, act = run_activity(store, params.run, hta=params.hta)
    per_rank = _overlap(act, ["rank"])
    per_step = _overlap(act, ["rank", "step"]).filter(pl.col("step").is_not_null())
    notes = []
    multi = multi_device_ranks(act)
    per_device = pl.DataFrame()
    if multi:
        per_device = _overlap(act.filter(pl.col("device_kind") == "gpu"), ["rank", "device"])
        notes.append(f"rank(s) {', '.join(map(str, multi))} drive several GPUs: per rank, communication on one "
                     "device counts as hidden behind compute on any of them; the devices table keeps them apart")
    no_comm = per_rank.filter(pl.col("comm_ns") == 0)["rank"].to_list()
    if no_comm:
        notes.append(f"ranks without communication (overlap undefined): {no_comm}")
    if params.hta:
        notes.append("HTA-compatible selection (last step and unlaunched GPU events dropped)")
    notes += graph_level_notes(store, run_id)
    notes += [n for n in (excluded_note(store, run_id, params.hta),) if n]
    return Result(frame=per_rank, steps=per_step, devices=per_device, notes=tuple(notes))
