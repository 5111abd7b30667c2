"""temporal: where each rank's accelerator time goes (idle / compute / non-compute).

Algorithm (README.md "Analyses", the same definition as HTA's temporal breakdown):
  1. Take the rank's activity intervals (``traceprof.activity``): GPU kernels, memcpy and memset,
     or on CPU-only ranks the training thread's ops and the gloo work.
  2. Window = first activity start to last activity end, for the whole trace and per step (the
     activity launched in that step).
  3. idle = window - |∪ all activity|; compute = |∪ compute|; non-compute = |∪ all| - compute.
  4. Percentages are of the window.
  5. Beside it, the step window (first ProfilerStep start to last step end, wall clock) and the idle
     time in it (``step_window_ns``, ``step_idle_ns``, ``step_idle_pct``): idle before the first
     kernel of a step (data loading, host stalls) shows there, not in the activity window.
  6. Per device (``devices``): the same breakdown per (rank, device), for processes that drive
     several GPUs (the per-rank figures then merge the devices, as a note says).
With ``hta=true`` the events are selected as HTA loads them (see ``traceprof.activity``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

from traceprof.activity import excluded_note, graph_level_notes, multi_device_ranks, run_activity, step_window
from traceprof.analysis import Chart, FrameResult, RunParams, register
from traceprof.intervals import class_measures
from traceprof.store import Store


@dataclass(frozen=True)
class Params(RunParams):
    """``hta``: select events as HTA 0.5.0 does (drops the last step and unlaunched GPU events)."""

    hta: bool = False


@dataclass(frozen=True)
class Result(FrameResult):
    """Per-rank breakdown (``frame``) and per-step breakdown (``steps``).

    Columns of both: rank, [step,] window_ns, idle_ns, compute_ns, non_compute_ns (ns) and
    idle_pct, compute_pct, non_compute_pct (% of window_ns). ``frame`` also has step_window_ns,
    step_busy_ns, step_idle_ns (ns) and step_idle_pct (% of step_window_ns; null without steps).
    ``devices``: rank, device and the columns of ``steps`` (GPU ranks).
    """

    steps: pl.DataFrame = field(default_factory=pl.DataFrame)
    devices: pl.DataFrame = field(default_factory=pl.DataFrame)
    title = "Temporal breakdown"

    def charts(self) -> list[Chart]:
        return [Chart("Share of the window per rank", "rank", ("compute_pct", "non_compute_pct", "idle_pct"),
                      stacked=True, ylabel="% of window")]


def _breakdown(act: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    m = class_measures(act, by)
    pct = 100.0 / pl.col("window_ns")
    return m.select(
        *by,
        "window_ns",
        (pl.col("window_ns") - pl.col("busy_ns")).alias("idle_ns"),
        "compute_ns",
        (pl.col("busy_ns") - pl.col("compute_ns")).alias("non_compute_ns"),
    ).with_columns(
        (pl.col("idle_ns") * pct).alias("idle_pct"),
        (pl.col("compute_ns") * pct).alias("compute_pct"),
        (pl.col("non_compute_ns") * pct).alias("non_compute_pct"),
    )


@register("temporal", Params)
def run(store: Store, params: Params) -> Result:
    """Temporal breakdown per rank and per step of one run.

    Raises:
        StoreError: No such run.
        AnalysisError: The run has no GPU or CPU activity.
    """
    run_id, act = run_activity(store, params.run, hta=params.hta)
    per_rank = _breakdown(act, ["rank"]).join(step_window(store, run_id, act), on="rank", how="left")
    per_step = _breakdown(act.filter(pl.col("step").is_not_null()), ["rank", "step"])
    gpu = act.filter(pl.col("device_kind") == "gpu")
    per_device = _breakdown(gpu, ["rank", "device"]) if not gpu.is_empty() else pl.DataFrame()
    notes = ["HTA-compatible selection (last step and unlaunched GPU events dropped)"] if params.hta else []
    multi = multi_device_ranks(act)
    if multi:
        notes.append(f"rank(s) {', '.join(map(str, multi))} drive several GPUs: the per-rank figures merge "
                     "their devices (one window over all); see the devices table")
    notes += graph_level_notes(store, run_id)
    notes += [n for n in (excluded_note(store, run_id, params.hta),) if n]
    return Result(frame=per_rank, steps=per_step, devices=per_device, notes=tuple(notes))
