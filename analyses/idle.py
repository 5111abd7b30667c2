"""idle: why each GPU stream sits idle between kernels (host wait / kernel wait / other).

Algorithm (README.md "Analyses"; the definitions of Holistic Trace Analysis' idle time breakdown):
  1. Take each rank's GPU kernels, memcpys and memsets with the start of the CPU runtime call that
     launched them (same correlation id; ``traceprof.engine.activity`` with ``detail``); sort each
     lane (rank, device, stream) by start: a process driving two GPUs reuses stream numbers.
  2. For each row but the first of its stream: prev_end = end of the rows before it, gap = start -
     prev_end. The first row of a stream has no gap and adds nothing.
  3. host wait if the launch started after prev_end (the GPU waited for the CPU to issue the
     kernel); else kernel wait if gap < ``kernel_wait_ns`` (the ordinary gap between back-to-back
     kernels); else other (e.g. waiting on another stream or a synchronization).
  4. Sum the gaps per category per stream, and per rank over its streams; shares are of the
     stream's (rank's) total idle time, as HTA's ``idle_time_ratio``. A rank's figures are sums
     over its streams (stream-ns: four streams idle for 1 s each make 4 s), named
     ``stream_*_sum_ns``; its ``window_ns`` is the rank's window (first start to last end on any
     stream), the same window as ``temporal``'s.
  5. Per device (``devices``): steps 2-4 on the device's rows of all its streams as one timeline
     (latest end, negative gaps as 0, also with ``hta``): its gaps are the time no stream of the
     device is busy (wall clock, temporal's idle time), each of the cause of the row that ends it.
     The idle verdict's cause is this device-level share: a stream with two kernels cannot add a
     whole window of "host wait" to it, as it does to the stream sums.
Launches without a GPU record (``traceprof.engine.activity.unmatched_launch_notes``, counted per trace
at ingest): a kernel launch call (``cudaLaunchKernel`` & co., with a correlation id) whose kernel the
trace does not hold leaves its GPU time out, so idle time is overstated (and the window may be cut
short). A few such calls (at most 10 % of a rank's: ``UNMATCHED_LAUNCH_PCT``; a profiler that stops
while kernels still run loses a few) add a note with their count and share; more than 10 % on any rank
make the note start "incomplete:", and the idle verdict is then inconclusive with the figures, never
``problem`` (nor ``ok``: the measured share may be too high or, with the window cut short, too low).
CUDA graph launches that have no GPU record (``graph_level_notes``) are weighed alike, per rank of its
graph launches (a store ingested before they were counted: any of them is "incomplete:"). A run with no kernel record at all has no breakdown
(an error; the verdict says why).
Default: prev_end is the latest end of all earlier rows and negative gaps count as 0, so a stream's
idle time equals its window minus its busy time. ``hta=true`` copies HTA 0.5.0 exactly: its event
selection (``traceprof.engine.activity``), prev_end = end of the previous row only, negative gaps included.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

from traceprof.analyses import _common
from traceprof.core import columns as rc
from traceprof.core.errors import AnalysisError
from traceprof.core.schema import Column
from traceprof.engine.activity import (
    activity,
    excluded_note,
    graph_level_notes,
    launches_without_kernels,
    step_window,
    unmatched_launch_notes,
)
from traceprof.engine.analysis import Analysis, Chart, FrameResult, PerRank, Report, RunParams, register
from traceprof.engine.intervals import rank_chunks, sorted_by
from traceprof.storage.runs import run_label
from traceprof.storage.store import Store

CATEGORIES = ("host_wait", "kernel_wait", "other")
#: The activity columns idle reads (``traceprof.engine.activity``): not names nor launch threads.
_ACTIVITY = ("rank", "kind", "start_ns", "end_ns", "lane", "step", "device", "stream", "launch_ts_ns")


@dataclass(frozen=True)
class Params(RunParams):
    """``kernel_wait_ns``: a gap shorter than this (and not a host wait) is a kernel wait (HTA's
    ``consecutive_kernel_delay``, 30 us). ``hta``: select events and measure gaps exactly as HTA."""

    kernel_wait_ns: int = 30_000
    hta: bool = False

    def __post_init__(self) -> None:
        _common.at_least("kernel_wait_ns", self.kernel_wait_ns, 0, "0: no gap counts as a kernel wait")


@dataclass(frozen=True)
class Result(FrameResult):
    """Idle time per lane (rank, device, stream) (``frame``) and per rank (``ranks``), int64 ns;
    their columns are declared in :data:`SPEC`. As everywhere, ``window_ns`` is the first start to the
    last end of the row's activity: of the stream (``frame``) or of the rank on all its streams
    (``ranks``, the same window as ``temporal``'s)."""

    ranks: pl.DataFrame = field(default_factory=pl.DataFrame)
    devices: pl.DataFrame = field(default_factory=pl.DataFrame)
    title = "Idle time breakdown (per stream)"

    def charts(self) -> list[Chart]:
        charts = [
            Chart(
                "Idle share of stream time per rank (all streams)",
                "rank",
                ("stream_idle_pct",),
                ylabel="% of stream time",
                frame="ranks",
            )
        ]
        if self.ranks["host_wait_pct"].is_not_null().any():  # null where nothing was idle
            charts.append(
                Chart(
                    "Idle time per rank by cause (% of idle time, all streams)",
                    "rank",
                    ("host_wait_pct", "kernel_wait_pct", "other_pct"),
                    stacked=True,
                    ylabel="% of idle",
                    frame="ranks",
                )
            )
        return charts


def host_wait(launch: pl.Expr, prev_end: pl.Expr) -> pl.Expr:
    """The host-wait rule (module doc, step 3), one place for every analysis that uses it: a gap
    that ends with a GPU row is the device waiting for the host when the row's launch (CPU runtime
    call start, ns) started after the gap began (``prev_end``, ns); a row without a known launch
    never is. ``critical_path`` applies it to each rank's gaps between all its activity."""
    return launch.is_not_null() & (launch > prev_end)


def classify_gaps(
    rows: pl.DataFrame,
    kernel_wait_ns: int,
    *,
    hta: bool,
    in_start_order: bool = False,
    lane: tuple[str, ...] = ("rank", "device", "stream"),
) -> pl.DataFrame:
    """Gap before each GPU row and its category (module doc, steps 1-3).

    Args:
        rows: Frame with rank, device, stream, start_ns, end_ns, launch_ts_ns (ns; launch may be null).
        kernel_wait_ns: Kernel-wait threshold (ns, strict ``<``).
        hta: HTA's rule (previous row's end, negative gaps kept) instead of the latest end.
        in_start_order: Keep ``rows``' order when they are sorted by rank, start_ns and end_ns
            (``traceprof.engine.activity``'s order; checked in one pass): each stream's rows then
            lie in start order already, and the gaps are those of the sorted rows without a copy
            of every column.
        lane: The columns of one timeline: a stream by default; ``("rank", "device")`` merges a
            device's streams (a gap is then time with no stream of the device busy).

    Returns:
        ``rows`` sorted by rank, device, stream, start_ns, end_ns (with ``in_start_order``: by rank,
        start_ns and end_ns when they were), plus gap_ns (null for the first row of a stream) and
        category (host_wait / kernel_wait / other; null for the first row).
    """
    by = list(lane)
    if in_start_order and sorted_by(rows, ["rank", "start_ns", "end_ns"]):
        s = rows  # a stream's rows are a subsequence of rows in (start, end) order
    else:
        s = rows.sort([*by, "start_ns", "end_ns"])
    prev = pl.col("end_ns").shift(1) if hta else pl.col("end_ns").cum_max().shift(1)
    s = s.with_columns(prev.over(by).alias("_prev_end"))
    gap = pl.col("start_ns") - pl.col("_prev_end")
    s = s.with_columns((gap if hta else pl.max_horizontal(gap, 0)).alias("gap_ns"))
    host = host_wait(pl.col("launch_ts_ns"), pl.col("_prev_end"))
    cat = (
        pl.when(pl.col("_prev_end").is_null())
        .then(None)
        .when(host)
        .then(pl.lit("host_wait"))
        .when(pl.col("gap_ns") < kernel_wait_ns)
        .then(pl.lit("kernel_wait"))
        .otherwise(pl.lit("other"))
    )
    return s.with_columns(cat.alias("category")).drop("_prev_end")


def _summary(
    g: pl.DataFrame, by: list[str], windows: pl.DataFrame, window: str, idle: str, idle_pct: str = "idle_pct"
) -> pl.DataFrame:
    """Category sums, counts and shares per ``by`` group. ``windows``: ``by`` plus the columns
    shown before the idle one, among them ``window`` (the denominator of ``idle_pct``); ``idle``
    and ``idle_pct``: the names of the idle column and of its share."""
    aggs = [pl.len().cast(pl.Int64).alias("kernels")]
    for c in CATEGORIES:
        hit = pl.col("category") == c
        aggs.append(pl.col("gap_ns").filter(hit).sum().alias(f"{c}_ns"))
        aggs.append(hit.sum().cast(pl.Int64).alias(f"{c}_gaps"))
    out = g.group_by(by).agg(aggs).join(windows, on=by, how="left")
    out = out.with_columns(pl.sum_horizontal(*(pl.col(f"{c}_ns") for c in CATEGORIES)).alias(idle))
    pct = [
        pl.when(pl.col(idle) != 0).then(100.0 * pl.col(f"{c}_ns") / pl.col(idle)).alias(f"{c}_pct")
        for c in CATEGORIES
    ]
    out = out.with_columns(*pct, (100.0 * pl.col(idle) / pl.col(window)).alias(idle_pct))
    extra = [c for c in windows.columns if c not in by]
    cols = [
        *by,
        "kernels",
        *extra,
        idle,
        *(f"{c}_ns" for c in CATEGORIES),
        *(f"{c}_gaps" for c in CATEGORIES),
        *(f"{c}_pct" for c in CATEGORIES),
        idle_pct,
    ]
    return out.select(cols).sort(by)


def _category_columns() -> tuple[Column, ...]:
    what = {
        "host_wait": "host wait (the launch came after the stream went idle)",
        "kernel_wait": "kernel wait (a gap under kernel_wait_ns)",
        "other": "other idle",
    }
    return (
        *(rc.ns(f"{c}_ns", f"Gaps of {what[c]}, summed") for c in CATEGORIES),
        *(rc.count(f"{c}_gaps", f"Rows whose preceding gap is {what[c].split(' (')[0]}") for c in CATEGORIES),
    )


def _category_pcts(of: str) -> tuple[Column, ...]:
    return tuple(rc.pct(f"{c}_pct", f"{c}_ns, % of {of}; null when that is 0") for c in CATEGORIES)


def _device_breakdown(act: pl.DataFrame, params: Params) -> pl.DataFrame:
    """The per-device frame of ``act`` (module doc, step 5), sorted by rank and device."""
    by = ["rank", "device"]
    g = classify_gaps(act, params.kernel_wait_ns, hta=False, in_start_order=True, lane=tuple(by))
    span = pl.col("end_ns").max() - pl.col("start_ns").min()
    out = _summary(g, by, g.group_by(by).agg(span.alias("window_ns")), "window_ns", "idle_ns")
    # the stream whose rows end the most host-wait time of the device (ties: the lowest stream)
    per = (
        g.filter(pl.col("category") == "host_wait")
        .group_by([*by, "stream"])
        .agg(pl.col("gap_ns").sum().alias("_ns"))
        .sort([*by, "_ns", "stream"], descending=[False, False, True, False])
        .group_by(by)
        .agg(pl.col("stream").first().alias("host_wait_stream"), pl.col("_ns").first().alias("_ns"))
    )
    out = out.join(per, on=by, how="left").with_columns(
        pl.when(pl.col("host_wait_ns") != 0)
        .then(100.0 * pl.col("_ns") / pl.col("host_wait_ns"))
        .alias("host_wait_stream_pct")
    )
    return out.drop("_ns").sort(by)


def _breakdowns(act: pl.DataFrame, params: Params) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """The per-lane, per-rank and per-device frames of ``act`` (GPU rows of whole ranks), each
    sorted by its keys."""
    g = classify_gaps(act, params.kernel_wait_ns, hta=params.hta, in_start_order=True)
    span = pl.col("end_ns").max() - pl.col("start_ns").min()
    win = g.group_by("rank", "device", "stream").agg(span.alias("window_ns"))
    per_stream = _summary(g, ["rank", "device", "stream"], win, "window_ns", "idle_ns")
    rank_win = (
        g.group_by("rank")
        .agg(pl.col("lane").n_unique().cast(pl.Int64).alias("streams"), span.alias("window_ns"))
        .join(win.group_by("rank").agg(pl.col("window_ns").sum().alias("stream_window_sum_ns")), on="rank")
    )
    per_rank = _summary(
        g, ["rank"], rank_win, "stream_window_sum_ns", "stream_idle_sum_ns", "stream_idle_pct"
    )
    return per_stream, per_rank, _device_breakdown(act, params)


SPEC = Analysis(
    name="idle",
    params=Params,
    result=Result,
    frames=(
        rc.frame(
            "frame",
            "Per lane (rank, device, stream)",
            rc.RANK,
            rc.DEVICE,
            rc.STREAM,
            rc.count("kernels", "GPU rows (kernels, memcpy, memset) on the lane"),
            rc.ns("window_ns", "Window of the lane: its first start to its last end"),
            rc.ns("idle_ns", "The lane's idle time: its gaps summed"),
            *_category_columns(),
            *_category_pcts("idle_ns"),
            rc.pct("idle_pct", "idle_ns, % of window_ns"),
        ),
        rc.frame(
            "ranks",
            "Per rank, summed over its streams (stream-ns)",
            rc.RANK,
            rc.count("kernels", "GPU rows of the rank"),
            rc.count("streams", "Lanes (device, stream) of the rank"),
            rc.WINDOW_NS,
            rc.ns(
                "stream_window_sum_ns",
                "The lanes' windows, summed (exceeds window_ns when streams run side by side)",
            ),
            rc.ns("stream_idle_sum_ns", "The lanes' idle time, summed"),
            *_category_columns(),
            *_category_pcts("stream_idle_sum_ns"),
            rc.pct(
                "stream_idle_pct",
                "stream_idle_sum_ns, % of stream_window_sum_ns: the streams' average idle "
                "share (not temporal's idle_pct, the share of the window with no GPU activity at all)",
            ),
            rc.ns("step_window_ns", "Step window: first ProfilerStep start to last step end (wall clock)"),
            rc.ns("step_busy_ns", "Union of the rank's activity inside its step window"),
            rc.ns("step_idle_ns", "step_window_ns minus step_busy_ns"),
            rc.pct("step_idle_pct", "step_idle_ns, % of step_window_ns"),
        ),
        rc.frame(
            "devices",
            "Per (rank, device): the device's idle time (no stream of it busy; wall clock, not summed "
            "over streams), by the cause of the row that ends each gap",
            rc.RANK,
            rc.DEVICE,
            rc.count("kernels", "GPU rows (kernels, memcpy, memset) on the device"),
            rc.ns("window_ns", "Window of the device: its first start to its last end"),
            rc.ns("idle_ns", "The device's idle time: gaps with none of its streams busy, summed"),
            *_category_columns(),
            *_category_pcts("idle_ns"),
            rc.pct("idle_pct", "idle_ns, % of window_ns"),
            rc.count(
                "host_wait_stream", "The stream whose rows end the most host-wait time; null without any"
            ),
            rc.pct("host_wait_stream_pct", "That stream's share of host_wait_ns"),
        ),
    ),
    report=Report(
        40,
        "GPU kernels (a Kineto trace with CUDA activity) to say why each GPU stream is idle (an idle "
        "verdict without them is temporal's)",
    ),
    per_rank=PerRank(),
)


@register(SPEC)
def run(store: Store, params: Params) -> Result:
    """Idle-time breakdown per GPU stream and per rank of one run.

    Source: events of kind kernel, memcpy, memset and the runtime calls with their correlation.

    Raises:
        StoreError: No such run.
        AnalysisError: The run has no GPU kernels (e.g. a CPU-only gloo run), or launched kernels
            whose activity the trace does not hold (copies only).
    """
    run_id = store.resolve_run(params.run)
    # only the columns read below: the filter and the sweep's sort copy these, not the whole frame
    act = activity(store, run_id, hta=params.hta, detail=True, columns=_ACTIVITY, alone=True)
    gpu = act.get_column("kind").is_in(["kernel", "memcpy", "memset"])
    if gpu.sum() != act.height:  # (a run of GPU ranks keeps every row: no copy)
        act = act.filter(gpu)
    if act.is_empty():
        raise AnalysisError(
            f"{run_label(store, run_id)}: no GPU kernels; the idle breakdown needs GPU streams"
        )
    if not act.get_column("kind").eq("kernel").any() and (why := launches_without_kernels(store, run_id)):
        raise AnalysisError(f"{run_label(store, run_id)}: {why}")  # copies alone are not the GPU's work
    # every row of both frames is one rank's: a large run is worked a few ranks at a time
    parts = [_breakdowns(p, params) for p in rank_chunks(act, ["rank"]) or [act]]
    per_stream = pl.concat([p[0] for p in parts], rechunk=True)
    per_rank = pl.concat([p[1] for p in parts], rechunk=True)
    per_device = pl.concat([p[2] for p in parts], rechunk=True)
    per_rank = per_rank.join(step_window(store, run_id, act, hta=params.hta), on="rank", how="left")
    notes = [f"kernel wait: gaps under {params.kernel_wait_ns / 1000:g} us after the previous kernel"]
    if params.hta:
        notes.append("HTA-compatible: HTA's event selection, previous-row gaps, negative gaps kept")
    notes += graph_level_notes(store, run_id)
    notes += unmatched_launch_notes(store, run_id)
    notes += [n for n in (excluded_note(store, run_id, params.hta),) if n]
    return Result(frame=per_stream, ranks=per_rank, devices=per_device, notes=tuple(notes))
