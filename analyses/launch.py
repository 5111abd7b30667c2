"""launch: how long kernels wait between their CPU launch and their GPU start, and launch-bound work.

Algorithm (the run's kernels as the ``kernels`` view has them, the rest in polars: one sort by lane, then
hash passes; the same figures DuckDB window functions gave, in about 65% of their time on 8 x 1 M):
  1. For every launch call (any device runtime: ``cudaLaunchKernel``, ``cudaGraphLaunch``,
     ``hipLaunchKernel``, ...), latency = start of its first GPU row - start of the call (same
     correlation id; ``kernels.first_of_launch``), carried by its first kernel. One call can start
     many kernels (a CUDA graph replay gives every node the launch's correlation, and its first
     node may be a memset or memcpy, then the launch's latency is to that node): the later ones were
     not launched by the CPU at that moment, so they are counted (``graph_kernels``) but not measured. Kernels whose
     launch is not in the trace, and records flagged at ingest as impossible (``events.flag``
     before_launch, far_outside, ...), are left out; a kernel stamped a few us before its launch
     call (``launch_skew``, clock jitter) is counted with its work but has no latency.
  2. The latency includes queueing behind earlier work on the lane. A kernel is launched onto an
     idle lane (device, stream) when every earlier kernel, copy and memset of it had ended by its
     launch (a kernel launched behind a running copy queues as it does behind a kernel); the latency of
     those is the launch overhead (``idle_latency_p50_ns``), plus any wait on another stream (an
     NCCL kernel waiting for the compute stream's event shows up here).
  3. Per rank, per (rank, device, stream) and per (rank, step): p50/p90/p99 (linear interpolation), max and
     mean latency, rounded to whole ns; and the kernels shorter than ``short_ns`` (launch-bound: the GPU finishes them
     faster than the CPU can issue them) as a share of the kernels and of kernel time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import polars as pl

from traceprof.analyses import _common
from traceprof.core import columns as rc
from traceprof.core.classify import valid_sql
from traceprof.core.errors import AnalysisError
from traceprof.core.schema import Column
from traceprof.engine import intervals
from traceprof.engine.activity import flagged_note, graph_level_notes, rank_list
from traceprof.engine.analysis import Analysis, Chart, FrameResult, Note, PerRank, Report, RunParams, register
from traceprof.storage.runs import run_label
from traceprof.storage.store import Store

#: The run's GPU rows as the ``kernels`` view has them, less its ``first_of_launch``: that
#: column's window (a sort of every row by launch) is most of the view's time, and :func:`_kernels`
#: computes the same from these rows. ``kept``: the rows launch reads, its kernels (memcpy and
#: memset aside) less the records flagged at ingest as impossible (another clock domain, far
#: outside the steps); a kernel a few us before its launch call (``launch_skew``: clock jitter) is
#: counted but has no latency. ``$traces``: the trace filter (one trace or none).
_GPU_ROWS = f"""
SELECT trace_id, rank, device, stream, step, ts_ns, dur_ns, ts_ns + dur_ns AS end_ns, correlation,
       flag = 'launch_skew' AS skewed, kind = 'kernel' AND {valid_sql("")} AS kept, {valid_sql("")} AS valid
FROM events
WHERE run_id = $1$traces AND kind IN ('kernel', 'memcpy', 'memset')
"""

#: The launch calls the GPU rows are joined to, as the ``kernels`` view joins them (a correlation
#: id's first runtime call, unflagged or clipped: :func:`_with_launch`), with the call's
#: ``name ILIKE '%GraphLaunch%'`` (``graph_call``), not its name. Read apart from the GPU rows
#: and joined in polars by a sorted merge: a DuckDB join of the calls grouped by correlation id
#: (``arg_min`` of the graph test by start) was most of launch's CPU on 8 x 1 M (about 0.2 s of
#: 0.3 s per rank in its hash aggregate), and one scan of both kinds cost more than two.
_CALLS = """
SELECT trace_id, correlation, ts_ns AS launch_ts_ns, name ILIKE '%GraphLaunch%' AS graph_call
FROM events
WHERE run_id = $1$traces AND kind IN ('cuda_runtime', 'cuda_driver') AND correlation IS NOT NULL
  AND (flag IS NULL OR flag = 'overrun')
"""


def _gpu_rows(store: Store, run_id: int, trace_id: int | None = None) -> pl.DataFrame:
    """The GPU rows of run ``run_id`` (:data:`_GPU_ROWS`; of trace ``trace_id`` alone unless
    None), each with the start of its launch call (``launch_ts_ns``: the first of :data:`_CALLS`
    of its trace and correlation id by start, None when there is none) and that call's
    ``graph_call``."""
    where = "" if trace_id is None else " AND trace_id = $2"
    args = [int(run_id)] if trace_id is None else [int(run_id), int(trace_id)]
    rows = store.sql(_GPU_ROWS.replace("$traces", where), args)
    calls = store.sql(_CALLS.replace("$traces", where), args)
    if trace_id is not None or rows.is_empty():
        return _with_launch(rows, calls)
    by_trace = calls.partition_by("trace_id", as_dict=True)
    return pl.concat(
        [
            _with_launch(t, by_trace.get(key, calls.clear()))
            for key, t in rows.partition_by("trace_id", as_dict=True).items()
        ],
        rechunk=True,
    )


def _with_launch(rows: pl.DataFrame, calls: pl.DataFrame) -> pl.DataFrame:
    """GPU rows ``rows`` of one trace with their launch call's start and graph test (``calls``:
    :data:`_CALLS` of the trace), by a sorted merge: the calls sorted by correlation id and start
    (a stable sort: of tied calls, the first read), each id's first kept, and each row's id looked
    up in them by binary search (a third of a polars hash join's CPU on 8 x 1 M)."""
    corr = pl.col("correlation")
    calls = calls.sort("correlation", "launch_ts_ns", maintain_order=True).filter(
        corr.ne_missing(corr.shift(1))
    )
    cols = ["trace_id", "rank", "device", "stream", "step", "ts_ns", "dur_ns", "end_ns", "correlation"]
    out = [*cols, "launch_ts_ns", "graph_call", "skewed", "kept", "valid"]
    if calls.is_empty():
        return rows.with_columns(
            pl.lit(None, pl.Int64).alias("launch_ts_ns"), pl.lit(None, pl.Boolean).alias("graph_call")
        ).select(out)
    ids, want = calls["correlation"], rows["correlation"]
    at = ids.search_sorted(want.fill_null(0), side="left").clip(0, calls.height - 1)
    hit = ids.gather(at).eq_missing(want) & want.is_not_null()
    return rows.with_columns(
        pl.when(hit).then(calls[c].gather(at)).alias(c) for c in ("launch_ts_ns", "graph_call")
    ).select(out)


#: The columns of the kernels launch reads, in order (``kernels`` view columns, ``graph_call``,
#: ``skewed``).
_KERNEL_COLUMNS = (
    "trace_id",
    "rank",
    "device",
    "stream",
    "step",
    "ts_ns",
    "dur_ns",
    "end_ns",
    "correlation",
    "launch_ts_ns",
    "graph_call",
    "first_of_launch",
    "skewed",
    "measured",
    "first_gpu_ns",
)


def _kernels(rows: pl.DataFrame) -> pl.DataFrame:
    """The kernels launch reads (``kept``) of ``rows`` (rows of :data:`_GPU_ROWS` of whole traces),
    with the ``kernels`` view's ``first_of_launch``: a launch call's first GPU row (of any kind,
    flagged or not) by start and duration, among the rows of its trace and correlation id (one of
    them where several tie), when the call is in the trace (``launch_ts_ns`` not null); and
    ``launch_rows``, how many of the rows returned share the row's trace and correlation id."""
    group = ("trace_id", "correlation")
    # one trace whose rows each have an id of their own (as most do): every group is of one row,
    # told without a hash of the rows by group (most of this function's time on 8 x 1 M)
    alone_all = rows["trace_id"].n_unique() == 1 and rows["correlation"].n_unique() == rows.height
    rows = rows.with_columns((pl.lit(1, pl.UInt32) if alone_all else pl.len().over(group)).alias("_n"))
    launched = pl.col("launch_ts_ns").is_not_null()
    # a row alone in its group is its first (and its launch's first GPU start); the groups of
    # several (graph replays) are sorted
    alone = (
        rows.filter(pl.col("_n") == 1)
        .with_columns(launched.alias("first_of_launch"), pl.col("ts_ns").alias("first_gpu_ns"))
        .with_columns(pl.col("first_of_launch").alias("measured"))
    )
    several = (
        rows.filter(pl.col("_n") > 1)
        .sort(*group, "ts_ns", "dur_ns", nulls_last=True, maintain_order=True)
        .with_columns(
            (launched & pl.struct(*group).is_first_distinct()).alias("first_of_launch"),
            # the launch's first GPU row: a valid memcpy or memset (a graph's memset node) stands for
            # the launch's start, and its first kernel carries the launch's latency
            (pl.col("valid") & ~pl.col("kept")).first().over(group).alias("_head_other"),
            # the launch's first GPU start, none when that row is stamped before the call (clock jitter)
            pl.when(~pl.col("skewed").fill_null(False))
            .then(pl.col("ts_ns"))
            .first()
            .over(group)
            .alias("first_gpu_ns"),
        )
        .filter(pl.col("kept"))
        .with_columns(
            (
                pl.col("first_of_launch")
                | (launched & pl.col("_head_other") & pl.struct(*group).is_first_distinct())
            ).alias("measured")
        )
    )
    first = pl.concat([alone.filter(pl.col("kept")), several.select(alone.columns)])
    # the launch's rows launch reads (its graph test, :func:`_figures`): all of its rows when no
    # row of the traces was left out, else counted again
    kept = pl.col("_n") if first.height == rows.height else pl.len().over(group)
    return first.select(*_KERNEL_COLUMNS, kept.alias("launch_rows"))


def _lane_rows(rows: pl.DataFrame) -> pl.DataFrame:
    """:func:`_kernels` of ``rows`` (``copy`` false), and the valid copies and memsets of ``rows``
    (``copy`` true; their lane, start and end, the rest null) but those of a launch with kernels in
    ``rows`` (a graph's own copy nodes): these keep their lane busy as kernels do (a kernel launched
    while a copy still runs on its stream queues behind it), and :func:`_figures` reads them for
    that alone."""
    kernels = _kernels(rows).with_columns(pl.lit(False).alias("copy"))
    # a launch's own copies (a graph's memcpy / memset nodes) are its work, not earlier work: the
    # launch's first kernel follows them
    own = kernels.filter(pl.col("launch_ts_ns").is_not_null()).select("trace_id", "correlation").unique()
    copies = (
        rows.filter(pl.col("valid") & ~pl.col("kept"))
        .join(own, on=["trace_id", "correlation"], how="anti")
        .select("rank", "device", "stream", "ts_ns", "end_ns", pl.lit(True).alias("copy"))
    )
    return pl.concat([kernels, copies], how="diagonal_relaxed") if copies.height else kernels


@dataclass(frozen=True)
class Params(RunParams):
    """``short_ns``: kernels shorter than this count as short, launch-bound work (10 us)."""

    short_ns: int = 10_000

    def __post_init__(self) -> None:
        _common.at_least("short_ns", self.short_ns, 0, "0: no kernel counts as short")


@dataclass(frozen=True)
class Result(FrameResult):
    """Launch latency per rank (``frame``), per lane (rank, device, stream) (``streams``) and per
    (rank, step) (``steps``); their columns are declared in :data:`SPEC`."""

    streams: pl.DataFrame = field(default_factory=pl.DataFrame)
    steps: pl.DataFrame = field(default_factory=pl.DataFrame)
    title = "Kernel launch latency"

    def charts(self) -> list[Chart]:
        return [
            Chart(
                "Launch-to-start latency per rank",
                "rank",
                ("latency_p50_ns", "latency_p90_ns", "latency_p99_ns"),
                ylabel="ns",
            )
        ]


def _launch_columns(*keys: Column) -> tuple[Column, ...]:
    return (
        rc.RANK,
        *keys,
        rc.count("kernels", "Kernels"),
        rc.count("launched", "Kernels whose launch call is in the trace"),
        rc.count("launches", "Launch calls measured (one latency each: to their first GPU activity)"),
        rc.count("graph_launches", "Calls that started several kernels, or *GraphLaunch calls"),
        rc.count("graph_kernels", "The kernels they started"),
        *(
            rc.ns(
                f"latency_p{q}_ns",
                f"{q}th percentile of the launch-to-start latency (linear interpolation), rounded",
            )
            for q in (50, 90, 99)
        ),
        rc.ns("latency_max_ns", "Largest latency"),
        rc.ns("latency_mean_ns", "Mean latency, rounded"),
        rc.count(
            "idle_launches",
            "Kernels launched onto an idle lane (every earlier kernel, copy and memset of it had ended)",
        ),
        rc.ns("idle_latency_p50_ns", "Their median latency (the launch overhead), rounded"),
        rc.count("short_kernels", "Kernels shorter than short_ns (launch-bound)"),
        rc.ns("short_ns", "Their time"),
        rc.ns("kernel_ns", "All kernels' time"),
        rc.pct("short_kernels_pct", "short_kernels, % of kernels"),
        rc.pct("short_pct", "short_ns, % of kernel_ns"),
    )


SPEC = Analysis(
    name="launch",
    reads_activity=False,  # queries the store's views only
    params=Params,
    result=Result,
    frames=(
        rc.frame("frame", "Per rank", *_launch_columns()),
        rc.frame("streams", "Per lane (rank, device, stream)", *_launch_columns(rc.DEVICE, rc.STREAM)),
        rc.frame("steps", "Per (rank, step)", *_launch_columns(rc.STEP), worst="latency_p90_ns"),
    ),
    report=Report(60, "GPU kernels and their CPU launches (a Kineto trace with CUDA activity)"),
    per_rank=PerRank(),
)


class _Figures(NamedTuple):
    """The frames of some ranks' kernels, and their kernels stamped before their launch call."""

    per_rank: pl.DataFrame
    streams: pl.DataFrame
    steps: pl.DataFrame
    skewed: int
    lead_ns: Any  # the largest such lead (ns), None without any


def _figures(k: pl.DataFrame, params: Params) -> _Figures | None:
    """The per-rank, per-lane and per-step frames of kernels ``k`` (:func:`_lane_rows` of whole
    ranks: the copies and memsets in it only make their lane busy), each sorted by its keys; the count of kernels stamped before their launch call and the
    largest such lead (ns); None without kernels."""
    if not k.get_column("copy").not_().any():
        return None
    lane = ["rank", "device", "stream"]
    # sorted by lane and start (end on a tie; nulls last; ties kept in the order read): the rows
    # come nearly so (a rank's lanes interleaved in time), a stable sort of them costs less than
    # polars' full sort (which left rows of one lane, start and end in either order)
    at = intervals.sorting([k.get_column(c) for c in (*lane, "ts_ns", "end_ns")])
    k = (
        (k if at is None else k[at])
        .with_columns(
            # one latency per launch call, on its first kernel: to its first GPU activity (a CUDA graph
            # launch starts many kernels, and may start with a memset or memcpy node)
            # (a row stamped before its own launch call, by clock jitter, has no measurable latency)
            pl.when(pl.col("measured") & ~(pl.col("first_of_launch") & pl.col("skewed").fill_null(False)))
            .then(pl.col("first_gpu_ns") - pl.col("launch_ts_ns"))
            .alias("latency_ns"),
            (
                pl.col("launch_ts_ns").is_not_null()
                & ((pl.col("launch_rows") > 1) | pl.col("graph_call").fill_null(False))
            ).alias("graph_kernel"),
            # the lane's latest end before this kernel (of its kernels, copies and memsets): idle at
            # launch when it ended before the launch
            pl.col("end_ns").cum_max().shift(1).over(lane).alias("prev_end_ns"),
        )
        .with_columns(
            (pl.col("measured") & (pl.col("launch_ts_ns") >= pl.coalesce("prev_end_ns", "launch_ts_ns")))
            .fill_null(False)
            .alias("idle_at_launch")
        )
        .filter(~pl.col("copy"))
    )
    lat, dur = pl.col("latency_ns"), pl.col("dur_ns")
    short = dur < params.short_ns
    stats = [
        pl.len().cast(pl.Int64).alias("kernels"),
        pl.col("launch_ts_ns").count().cast(pl.Int64).alias("launched"),
        lat.count().cast(pl.Int64).alias("launches"),
        (pl.col("graph_kernel") & pl.col("measured")).sum().cast(pl.Int64).alias("graph_launches"),
        pl.col("graph_kernel").sum().cast(pl.Int64).alias("graph_kernels"),
        # statistics rounded to whole ns (interpolated percentiles and means are fractional)
        *(
            _common.whole_ns(lat.quantile(q, "linear")).alias(f"latency_p{n}_ns")
            for q, n in ((0.5, 50), (0.9, 90), (0.99, 99))
        ),
        lat.max().alias("latency_max_ns"),
        _common.whole_ns(lat.mean()).alias("latency_mean_ns"),
        pl.col("idle_at_launch").sum().cast(pl.Int64).alias("idle_launches"),
        _common.whole_ns(lat.filter(pl.col("idle_at_launch")).quantile(0.5, "linear")).alias(
            "idle_latency_p50_ns"
        ),
        short.sum().cast(pl.Int64).alias("short_kernels"),
        dur.filter(short).sum().cast(pl.Int64).alias("short_ns"),
        dur.sum().cast(pl.Int64).alias("kernel_ns"),
    ]
    shares = (
        (100.0 * pl.col("short_kernels") / pl.col("kernels")).alias("short_kernels_pct"),
        (100.0 * pl.col("short_ns") / pl.col("kernel_ns")).alias("short_pct"),
    )

    def per(*by: str) -> pl.DataFrame:
        return k.group_by(*by).agg(stats).with_columns(shares).sort(*by, nulls_last=False)

    skewed = k.filter(pl.col("skewed").fill_null(False))
    most = (skewed["launch_ts_ns"] - skewed["ts_ns"]).max()
    return _Figures(per("rank"), per(*lane), per("rank", "step"), skewed.height, most)


@register(SPEC)
def run(store: Store, params: Params) -> Result:
    """Kernel launch latency and short-kernel share of one run.

    Source: the ``kernels`` view (events of kind kernel joined to their runtime call).

    Raises:
        StoreError: No such run.
        AnalysisError: The run has no GPU kernels (e.g. a CPU-only gloo run).
    """
    run_id = store.resolve_run(params.run)
    # every figure is one rank's (lanes, launch calls and steps are within a rank): a run of several
    # ranks is read and worked one rank at a time, so that only one rank's kernels are held; each
    # rank is read trace by trace (``trace_id = N`` reaches below the view's window of launches,
    # ``rank = N`` does not: every rank would read the whole run)
    if rank_list(store, run_id) is None:
        parts = [_figures(_lane_rows(_gpu_rows(store, run_id)), params)]
    else:
        traces = store.sql(
            "SELECT rank, list(trace_id ORDER BY trace_id) AS ids FROM traces WHERE run_id = ? "
            "GROUP BY rank ORDER BY rank",
            [run_id],
        )["ids"].to_list()
        parts = [
            _figures(
                pl.concat(
                    [_lane_rows(_gpu_rows(store, run_id, t)) for t in ids],
                    rechunk=True,
                ),
                params,
            )
            for ids in traces
        ]
    got = [p for p in parts if p is not None]
    if not got:
        raise AnalysisError(f"{run_label(store, run_id)}: no GPU kernels; launch latency needs a GPU trace")
    per_rank = pl.concat([p.per_rank for p in got], rechunk=True)
    streams = pl.concat([p.streams for p in got], rechunk=True)
    steps = pl.concat([p.steps for p in got], rechunk=True)
    no_launch = per_rank.filter(pl.col("launched") < pl.col("kernels"))
    notes: list[str | Note] = [f"short kernels: under {params.short_ns / 1000:g} us"]
    graph = int(per_rank["graph_kernels"].sum()) - int(per_rank["graph_launches"].sum())
    if graph:
        notes.append(
            Note(
                "{number} kernels started by a graph launch after its first kernel are not measured (latency "
                "is once per launch call, to its first GPU activity; the rest is graph execution time)",
                number=graph,
            )
        )
    if not no_launch.is_empty():
        missing = int((no_launch["kernels"] - no_launch["launched"]).sum())
        notes.append(
            Note(
                "{number} kernels have no launch call in the trace (left out of the latency figures)",
                number=missing,
            )
        )
    notes += graph_level_notes(store, run_id)
    skewed = sum(p.skewed for p in got)
    if skewed:
        most = int(max(p.lead_ns for p in got if p.skewed) or 0)
        notes.append(
            f"{skewed} kernels start up to {most / 1000:,.3f} us before their launch call (clock "
            "jitter, events.flag = 'launch_skew'): counted, left out of the latency figures"
        )
    notes += [n for n in (flagged_note(store, run_id),) if n]
    return Result(frame=per_rank, streams=streams, steps=steps, notes=tuple(notes))
