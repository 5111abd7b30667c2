"""launch: how long kernels wait between their CPU launch and their GPU start, and launch-bound work.

Algorithm (SQL in ``launch.sql``):
  1. For every launch call (any device runtime: ``cudaLaunchKernel``, ``cudaGraphLaunch``,
     ``hipLaunchKernel``, ...), latency = start of its first GPU kernel - start of the call (same
     correlation id; ``kernels.first_of_launch``). One call can start many kernels (a CUDA graph
     replay gives every node the launch's correlation): the later ones were not launched by the
     CPU at that moment, so they are counted (``graph_kernels``) but not measured. Kernels whose
     launch is not in the trace, and records flagged at ingest (``events.flag``), are left out.
  2. The latency includes queueing behind earlier work on the lane. A kernel is launched onto an
     idle lane (device, stream) when every earlier kernel of it had ended by its launch; the latency of
     those is the launch overhead (``idle_latency_p50_ns``), plus any wait on another stream (an
     NCCL kernel waiting for the compute stream's event shows up here).
  3. Per rank, per (rank, device, stream) and per (rank, step): p50/p90/p99 (linear interpolation), max and
     mean latency, rounded to whole ns; and the kernels shorter than ``short_ns`` (launch-bound: the GPU finishes them
     faster than the CPU can issue them) as a share of the kernels and of kernel time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from analyses import _common
from traceprof.analysis import Chart, FrameResult, RunParams, register
from traceprof.errors import AnalysisError
from traceprof.store import Store

_SQL = (Path(__file__).with_name("launch.sql")).read_text()


@dataclass(frozen=True)
class Params(RunParams):
    """``short_ns``: kernels shorter than this count as short, launch-bound work (10 us)."""

    short_ns: int = 10_000

    def __post_init__(self) -> None:
        _common.at_least("short_ns", self.short_ns, 0, "0: no kernel counts as short")


@dataclass(frozen=True)
class Result(FrameResult):
    """Launch latency per rank (``frame``), per (rank, device, stream) (``streams``), per (rank, step) (``steps``).

    Columns: rank, [device, stream | step,] kernels, launched (kernels whose launch is in the trace),
    launches (launch calls measured: one latency each), graph_launches (calls that started several
    kernels, or ``*GraphLaunch``), graph_kernels (the kernels they started),
    latency_p50_ns, latency_p90_ns, latency_p99_ns, latency_max_ns, latency_mean_ns (int64 ns),
    idle_launches (kernels launched onto an idle stream), idle_latency_p50_ns (int64 ns, their median),
    short_kernels, short_ns (their time), kernel_ns (all kernels' time), short_kernels_pct (% of
    kernels), short_pct (% of kernel_ns).
    """

    streams: pl.DataFrame = field(default_factory=pl.DataFrame)
    steps: pl.DataFrame = field(default_factory=pl.DataFrame)
    title = "Kernel launch latency"

    def charts(self) -> list[Chart]:
        return [Chart("Launch-to-start latency per rank", "rank",
                      ("latency_p50_ns", "latency_p90_ns", "latency_p99_ns"), ylabel="ns")]


@register("launch", Params)
def run(store: Store, params: Params) -> Result:
    """Kernel launch latency and short-kernel share of one run.

    Source: the ``kernels`` view (events of kind kernel joined to their runtime call).

    Raises:
        StoreError: No such run.
        AnalysisError: The run has no GPU kernels (e.g. a CPU-only gloo run).
    """
    run_id = store.resolve_run(params.run)
    sql = _SQL.replace("$run", str(int(run_id))).replace("$short_ns", str(int(params.short_ns)))
    df = store.sql(sql)
    if df.is_empty():
        raise AnalysisError(f"run {params.run or run_id}: no GPU kernels; launch latency needs a GPU trace")
    df = df.with_columns(
        (100.0 * pl.col("short_kernels") / pl.col("kernels")).alias("short_kernels_pct"),
        (100.0 * pl.col("short_ns") / pl.col("kernel_ns")).alias("short_pct"),
    )
    both = (pl.col("g_stream") == 1) & (pl.col("g_step") == 1)
    per_rank = df.filter(both).drop("g_stream", "g_step", "device", "stream", "step").sort("rank")
    streams = df.filter(pl.col("g_stream") == 0).drop("g_stream", "g_step", "step").sort("rank", "device", "stream")
    steps = df.filter(pl.col("g_step") == 0).drop("g_stream", "g_step", "device", "stream").sort("rank", "step")
    no_launch = per_rank.filter(pl.col("launched") < pl.col("kernels"))
    notes = [f"short kernels: under {params.short_ns / 1000:g} us"]
    graph = int(per_rank["graph_kernels"].sum() - per_rank["graph_launches"].sum())
    if graph:
        notes.append(f"{graph} kernels started by a graph launch after its first kernel are not measured (latency "
                     "is once per launch call, to its first kernel; the rest is graph execution time)")
    if not no_launch.is_empty():
        missing = int((no_launch["kernels"] - no_launch["launched"]).sum())
        notes.append(f"{missing} kernels have no launch call in the trace (left out of the latency figures)")
    return Result(frame=per_rank, streams=streams, steps=steps, notes=tuple(notes))
