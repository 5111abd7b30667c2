"""nccl_sum: communication time per collective op and per communication kernel, like nsys's NCCL summary,
with where that time went (waiting for peers, launch, transfer) and the bandwidth achieved against the link.

Algorithm:
  1. Collectives (any source: NCCL kernels of Kineto and nsys traces, gloo work, Flight Recorder
     entries, NCCL profiler-plugin events, NCCL Inspector records): per op (``collectives.op``), over the run and per rank,
     the statistics of end - start (``traceprof.analyses._summary``) and the bytes moved (``bytes_in``).
     Rows without both times (gloo Flight Recorder entries record only their enqueue) count in
     ``instances_total`` but not in the time statistics. A call that two sources recorded on one rank
     (a Kineto trace and a Flight Recorder dump) counts once, as the row of the source kept
     (``traceprof.core.schema.COLLECTIVE_COPIES_SQL``: the kernel or gloo work over Flight Recorder), with
     a note.
  2. Communication kernels (``events.class = 'comm'``, GPU sources only): the same statistics per
     kernel name (table ``kernels``); flagged kernels as ``kernel_sum`` counts them (their recorded
     durations, unless unknown), with a note.
  3. Time split, from the ``collective_perf`` view (one row per collective call; the rules are its
     column docs): each call's communication time, arrival to end (``span_ns``; on GPU sources the
     kernel, on CPU sources from the enqueue), is wait for peers (arrival to the last arrival),
     launch (last arrival to the last rank's start of its work: 0 on GPU sources, where arrival is
     the kernel start) and transfer (to the end). Summed per op and per (rank, op) where a peer of
     the call was traced (``traced_ranks`` >= 2); calls with no traced peer cannot tell waiting
     from moving data and count as ``unsplit_ns``; ``split_pct`` = the split share of ``span_ns``.
  4. Bandwidth (table ``bandwidth``), as nccl-tests defines it: per call algbw = S / transfer and
     busbw = algbw x the op's bus factor (``traceprof.core.ops.BUS_RULES``: S and the factor per op);
     NULL, never infinite, where the transfer is 0 or unknown or S is unknown. Per (source, op,
     group size, message-size bucket, ceiling): the median and largest busbw, against the ceiling
     of the calls' process group (``traceprof.core.links.choose_ceiling``): ``link_gbps`` when given,
     else the link table by the ranks' device (``devices`` table, Kineto ``deviceProperties``,
     else ``traces.device_name``): the network when the group's ranks run on several hosts
     (``traces.host``; hosts unknown: when the group has more ranks than one node), else the
     intra-node link; no ceiling for CPU and unknown devices, with the reason. Buckets are powers of
     two, [2^k, 2^(k+1)) bytes. ``all_ranks_traced`` is false when a rank of a group was not
     traced: its lateness may then hide in the transfer, so the bandwidth is a lower bound.

A source that reports its own bandwidth (NCCL Inspector's algbw / busbw) keeps it in columns of its
own beside the computed ones (``collective_perf.reported_algbw_gbps`` / ``reported_busbw_gbps``, their
medians in ``bandwidth``), which always come from the times, so that the two can be compared: the
Inspector divides by its own execution time, which may include waiting for peers. Calls with only a
reported figure (records without kernel times) are in ``bandwidth`` with the computed columns null.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from traceprof.analyses import _common
from traceprof.analyses._summary import flagged_notes, summarize, summarize_run
from traceprof.core import columns as rc
from traceprof.core.classify import DURATION_SQL
from traceprof.core.errors import AnalysisError
from traceprof.core.links import NETWORKS, choose_ceiling
from traceprof.core.schema import COLLECTIVE_COPIES_SQL, Column
from traceprof.engine.analysis import Analysis, Chart, FrameResult, Report, RunParams, register
from traceprof.engine.peaks import rank_devices
from traceprof.storage.runs import run_label
from traceprof.storage.store import Store

#: The run's collectives, each with ``copy_of`` (``COLLECTIVE_COPIES_SQL``): computed once per call
#: into a temporary table of the store's connection (each thread's connection has its own), which
#: :data:`_TIMED`, :data:`_COUNTS` and :data:`_COPIES` read; dropped when the call ends.
_CALLS = "_nccl_sum_calls"
_CALLS_SQL = f"""
CREATE OR REPLACE TEMP TABLE {_CALLS} AS
SELECT rank, op, source, bytes_in, start_ns, end_ns, copy_of FROM ({COLLECTIVE_COPIES_SQL}) WHERE run_id = ?
"""
_TIMED = (
    f"SELECT rank, op AS name, end_ns - start_ns AS dur_ns FROM {_CALLS} "
    "WHERE start_ns IS NOT NULL AND end_ns IS NOT NULL AND copy_of IS NULL"
)
#: NCCL Inspector records written without kernel times (not verbose: no ``event_trace_ts``) still
#: report their duration, ``coll_exec_time_us``, kept in their event's args: rows of :data:`_TIMED`.
_EXEC_TIMED = """
UNION ALL
SELECT c.rank, c.op AS name,
       any_value(round(TRY_CAST(json_extract(e.args, '$.coll_perf.coll_exec_time_us') AS DOUBLE) * 1000)::BIGINT)
FROM collectives c JOIN events e ON e.run_id = c.run_id AND e.trace_id = c.trace_id AND e.kind = 'instant'
     AND json_extract_string(e.args, '$.header.id') = c.pg
     AND TRY_CAST(json_extract(e.args, '$.coll_perf.coll_sn') AS BIGINT) = c.seq
     AND replace(lower(e.name), '_', '') = replace(c.op, '_', '')
WHERE c.run_id = $run AND c.source = 'nccl_inspector' AND NOT coalesce(c.p2p, false)
  AND (c.start_ns IS NULL OR c.end_ns IS NULL)
GROUP BY c.trace_id, c.rank, c.op, c.pg, c.seq
HAVING any_value(TRY_CAST(json_extract(e.args, '$.coll_perf.coll_exec_time_us') AS DOUBLE)) >= 0
"""
_UNTIMED_INSPECTOR = (
    "SELECT count(*) FROM collectives WHERE run_id = ? AND source = 'nccl_inspector' "
    "AND NOT coalesce(p2p, false) AND (start_ns IS NULL OR end_ns IS NULL)"
)
#: The communication kernels of the run, before the duration rule (module doc, step 2).
_KERNEL_SELECT = "FROM events e WHERE e.run_id = $run AND e.kind = 'kernel' AND e.class = 'comm'"
_KERNELS = f"SELECT e.rank, e.name, e.dur_ns {_KERNEL_SELECT} AND {DURATION_SQL}"
#: Calls per op, each once where two sources recorded it (``COLLECTIVE_COPIES_SQL``); ``sources``
#: names every source that recorded one.
_COUNTS = f"""
SELECT op AS name, count(*) FILTER (copy_of IS NULL)::BIGINT AS instances_total,
       sum(bytes_in) FILTER (copy_of IS NULL)::BIGINT AS bytes_in,
       string_agg(DISTINCT source, ',' ORDER BY source) AS sources
FROM {_CALLS} GROUP BY op
"""
#: The rows left out as another source's record of the same call, per (copy's source, source kept).
_COPIES = f"""
SELECT source, copy_of, count(*) AS n FROM {_CALLS}
WHERE copy_of IS NOT NULL GROUP BY ALL ORDER BY ALL
"""
_SPLIT = """
SELECT {keys}op AS name, sum(span_ns)::BIGINT AS span_ns,
       coalesce(sum(wait_ns) FILTER (traced_ranks >= 2), 0)::BIGINT AS wait_ns,
       coalesce(sum(launch_ns) FILTER (traced_ranks >= 2), 0)::BIGINT AS launch_ns,
       coalesce(sum(transfer_ns) FILTER (traced_ranks >= 2), 0)::BIGINT AS transfer_ns,
       coalesce(sum(span_ns) FILTER (traced_ranks < 2), 0)::BIGINT AS unsplit_ns
FROM collective_perf WHERE run_id = ? AND span_ns IS NOT NULL GROUP BY ALL
"""
_BW = """
SELECT source, pg, pg_ranks, rank, op, group_size, size_bytes, transfer_ns, algbw_gbps, busbw_gbps, all_ranks_traced,
       reported_algbw_gbps, reported_busbw_gbps
FROM collective_perf WHERE run_id = ? AND (busbw_gbps IS NOT NULL OR reported_busbw_gbps IS NOT NULL)
"""
_SPLIT_COLS = ["span_ns", "wait_ns", "launch_ns", "transfer_ns", "unsplit_ns", "split_pct"]


@dataclass(frozen=True)
class Params(RunParams):
    """``link_gbps``: the ceiling busbw is compared with, GB/s per direction per GPU (10^9 bytes/s,
    as busbw; beats the link table); ``network``: the network of groups that span hosts
    (``traceprof.core.links.NETWORKS``: edr, hdr, ndr, xdr, roce100..roce800), when it is not the
    device's reference system's."""

    link_gbps: float | None = None
    network: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "link_gbps", _common.positive_or_none("link_gbps", self.link_gbps))
        if self.network:
            _common.choice("network", self.network, NETWORKS)


@dataclass(frozen=True)
class Result(FrameResult):
    """Per op (``frame``), per (rank, op) (``ranks``), per communication kernel (``kernels``) and
    bandwidth against the link (``bandwidth``); their columns are declared in :data:`SPEC`."""

    ranks: pl.DataFrame = field(default_factory=pl.DataFrame)
    kernels: pl.DataFrame = field(default_factory=pl.DataFrame)
    bandwidth: pl.DataFrame = field(default_factory=pl.DataFrame)
    title = "Collective (NCCL) summary"

    def charts(self) -> list[Chart]:
        return [
            Chart(
                "Time in collectives: waiting for peers, launch, transfer (ns)",
                "name",
                ("wait_ns", "launch_ns", "transfer_ns", "unsplit_ns"),
                stacked=True,
                ylabel="ns",
            )
        ]


_SPLIT_COLUMNS = (
    rc.ns(
        "span_ns",
        "Arrival to end, summed over calls (overlapping calls each count: not wall clock): wait_ns + "
        "launch_ns + transfer_ns + unsplit_ns",
    ),
    rc.ns(
        "wait_ns", "Waiting for peers: arrival to the last rank's arrival, summed over calls (not wall clock)"
    ),
    rc.ns(
        "launch_ns", "Everyone had arrived, the last rank's communication had not started (0 on GPU sources)"
    ),
    rc.ns("transfer_ns", "Moving data: transfer start to end"),
    rc.ns("unsplit_ns", "Calls with no traced peer (waiting cannot be told from moving data)"),
    rc.pct("split_pct", "Share of span_ns that is split"),
)

SPEC = Analysis(
    name="nccl_sum",
    reads_activity=False,  # queries the store's views only
    params=Params,
    result=Result,
    frames=(
        rc.frame(
            "frame",
            "Per collective op over the run (durations: end - start of the timed rows; null when none "
            "is timed)",
            *rc.summary_columns("collective", per_rank=False),
            rc.count(
                "instances_total",
                "Calls of the op, timed or not; a call that two sources recorded on one rank once",
            ),
            rc.number("bytes_in", "Input size, summed", "bytes", "BIGINT"),
            rc.text("sources", "Collectives sources of the rows"),
            *_SPLIT_COLUMNS,
        ),
        rc.frame(
            "ranks",
            "The same per (rank, op)",
            *rc.summary_columns("collective", per_rank=True),
            *_SPLIT_COLUMNS,
        ),
        rc.frame(
            "kernels",
            "Per communication kernel name (GPU sources)",
            *rc.summary_columns("kernel", per_rank=False),
        ),
        rc.frame(
            "bandwidth",
            "Bandwidth per (source, op, group size, message size bucket) against the link's ceiling",
            rc.text("source", "Collectives source"),
            rc.text("op", "Collective op"),
            Column("group_size", "INTEGER", "Ranks in the process group"),
            rc.text("size_bucket", "Message size bucket [2^k, 2^(k+1)) bytes, as a label"),
            rc.number("bucket_bytes", "The bucket's lower bound", "bytes", "BIGINT"),
            rc.rows("calls", "Calls in the bucket"),
            rc.number("size_bytes", "Median S (the bytes moved, per op: README)", "bytes", "BIGINT"),
            rc.ns("transfer_ns", "Median transfer time"),
            rc.number("algbw_gbps", "Median algorithm bandwidth S / transfer", "GB/s"),
            rc.number("busbw_gbps", "Median bus bandwidth: algbw x the op's bus factor", "GB/s"),
            rc.number("busbw_max_gbps", "Largest bus bandwidth", "GB/s"),
            rc.number(
                "reported_algbw_gbps",
                "Median algorithm bandwidth the source reports itself (NCCL "
                "Inspector; its own time, which may include waiting for peers); null for other sources",
                "GB/s",
            ),
            rc.number(
                "reported_busbw_gbps",
                "Median bus bandwidth the source reports itself; null for other sources",
                "GB/s",
            ),
            rc.number("ceiling_gbps", "The group's link ceiling, per direction per GPU; null: none", "GB/s"),
            rc.pct("of_ceiling_pct", "busbw_gbps, % of ceiling_gbps"),
            rc.text("ceiling", "Which link and why"),
            rc.flag(
                "all_ranks_traced",
                "Every rank of the group was traced (false: the bandwidth is a lower bound)",
            ),
        ),
    ),
    report=Report(90, "collectives or communication kernels (any source)"),
)


@register(SPEC)
def run(store: Store, params: Params) -> Result:
    """Communication time per op and per kernel, its split, and bandwidth against the link (module doc).

    Raises:
        StoreError: No such run.
        AnalysisError: The run has no collectives and no communication kernels.
        UsageError: A bad ``link_gbps`` or ``network``.
    """
    run_id = store.resolve_run(params.run)
    store.sql(_CALLS_SQL, [run_id])
    try:
        counts = store.sql(_COUNTS)
        untimed = int(store.sql(_UNTIMED_INSPECTOR, [run_id]).item())
        timed, ranks = summarize(store, run_id, _TIMED + (_EXEC_TIMED if untimed else ""))
        copies = store.sql(_COPIES)
    finally:
        store.sql(f"DROP TABLE IF EXISTS {_CALLS}")
    kernels = summarize_run(store, run_id, _KERNELS)  # its per-rank frame is not shown
    if counts.is_empty() and kernels.is_empty():
        raise AnalysisError(f"{run_label(store, run_id)}: no collectives and no communication kernels")
    notes = [
        f"{n} {src} rows record the same calls as {kept} rows (same rank, op and process group sequence "
        f"number, or size and time): counted once, as {kept}'s"
        for src, kept, n in copies.iter_rows()
    ]
    notes += (
        [
            f"{untimed} NCCL Inspector records have no kernel times (written without "
            "NCCL_INSPECTOR_DUMP_VERBOSE=1, or kernel times never recorded): their durations are the "
            "reported coll_exec_time_us"
        ]
        if untimed
        else []
    )
    if timed.is_empty():
        frame = counts
        notes.append(
            "no collective has both a start and an end time (e.g. gloo Flight Recorder dumps record "
            "only the enqueue); counts only"
        )
    else:
        frame = timed.join(counts, on="name", how="full", coalesce=True).sort(
            ["total_ns", "name"], descending=[True, False], nulls_last=True
        )
    split, split_ranks = (_split(store.sql(_SPLIT.format(keys=k), [run_id])) for k in ("", "rank, "))
    frame = _with(frame, split, ["name"])
    ranks = _with(ranks, split_ranks, ["rank", "name"])
    bandwidth, bw_notes = _bandwidth(store, run_id, params)
    partial = store.sql(
        "SELECT coalesce(sum(span_ns), 0) FROM collective_perf WHERE run_id = ? AND traced_ranks >= 2 "
        "AND NOT all_ranks_traced",
        [run_id],
    ).item()
    notes += [n for n in (_split_note(split, int(partial)),) if n] + bw_notes
    notes += [
        f"kernels table: {n}" for n in flagged_notes(store, run_id, _KERNEL_SELECT, "communication kernels")
    ]
    return Result(frame=frame, ranks=ranks, kernels=kernels, bandwidth=bandwidth, notes=tuple(notes))


def _split(df: pl.DataFrame) -> pl.DataFrame:
    return df.with_columns(
        pl.when(pl.col("span_ns") > 0)
        .then(100.0 * (pl.col("span_ns") - pl.col("unsplit_ns")) / pl.col("span_ns"))
        .otherwise(None)
        .alias("split_pct")
    )


def _with(frame: pl.DataFrame, split: pl.DataFrame, on: list[str]) -> pl.DataFrame:
    """``frame`` with the split columns (null where the op has no timed call)."""
    if frame.is_empty() or not set(on) <= set(frame.columns):
        return frame
    split = split.select(*on, *_SPLIT_COLS).with_columns(*(pl.col(c).cast(frame.schema[c]) for c in on))
    return frame.join(split, on=on, how="left")


def _split_note(split: pl.DataFrame, partial_ns: int) -> str | None:
    """How much of the communication time is split into wait, launch and transfer; ``partial_ns``:
    the split time of calls whose group was not traced on every rank."""
    if split.is_empty():
        return None
    span = int(split["span_ns"].sum())
    parts = {k: int(split[k].sum()) for k in ("wait_ns", "launch_ns", "transfer_ns", "unsplit_ns")}
    if span <= 0:
        return None
    share = 100.0 * (span - parts["unsplit_ns"]) / span
    pct = {k: 100.0 * v / span for k, v in parts.items()}
    text = (
        f"communication time (arrival to end, summed over all calls: calls that overlap in time each count, so "
        f"it may exceed the ranks' windows) {span / 1e6:,.3f} ms: {share:.1f}% split into wait for "
        f"peers {pct['wait_ns']:.1f}%, launch {pct['launch_ns']:.1f}%, transfer {pct['transfer_ns']:.1f}%"
    )
    if partial_ns:
        text += (
            f"; {100.0 * partial_ns / span:.1f}% among the traced ranks of groups not traced on every rank "
            "(an untraced rank may have arrived later: waits lower bounds, transfers upper bounds)"
        )
    if parts["unsplit_ns"]:
        text += (
            f"; {pct['unsplit_ns']:.1f}% unsplit (calls with no traced peer: waiting cannot be told from "
            "moving data; trace every rank)"
        )
    return text + f"; {SUMMED_NOTE}"


#: How nccl_sum's waits differ from the other analyses' (each figure's definition, one place).
SUMMED_NOTE = (
    "span and wait are per call, summed (stream-time: overlapping calls add up); stragglers' wait is "
    "wall clock (the union of a rank's waits), critical_path's the wall-clock time that is waiting and "
    "nothing else (compute, transfer and memory take precedence)"
)


def bucket_label(lo: int) -> str:
    """``[lo, 2 lo)`` in binary units: ``512 KiB-1 MiB``; ``0 B`` for 0."""

    def fmt(x: int) -> str:
        units = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
        k = 0
        while x >= 1024 and k < len(units) - 1:
            x, k = x // 1024, k + 1
        return f"{x} {units[k]}"

    return "0 B" if lo <= 0 else f"{fmt(lo)}-{fmt(2 * lo)}"


def _buckets(size: pl.Series) -> pl.Series:
    """Lower bound 2^floor(log2 S) of each size (bytes; 0 for 0): ``frexp`` gives the exponent
    exactly for sizes below 2^53."""
    arr = size.to_numpy().astype(np.float64)
    _, e = np.frexp(arr)
    lo = np.where(arr > 0, np.ldexp(1.0, e - 1), 0.0).astype(np.int64)
    return pl.Series("bucket_bytes", lo, dtype=pl.Int64)


def _ceilings(store: Store, run_id: int, rows: pl.DataFrame, params: Params) -> pl.DataFrame:
    """Ceiling (gbps, text) per process group (source, pg, pg_ranks) of ``rows`` (module doc, step 4)."""
    devices = {r: d for r, d in rank_devices(store, run_id).select("rank", "device_name").iter_rows()}
    hosts = {
        r: h
        for r, h in store.sql(
            "SELECT rank, any_value(host) AS host FROM traces WHERE run_id = ? GROUP BY rank", [run_id]
        ).iter_rows()
    }
    out = []
    groups = rows.group_by("source", "pg", "pg_ranks").agg(
        pl.col("rank").unique(), pl.col("group_size").max()
    )
    for src, pg, pg_ranks, seen, n in groups.iter_rows():
        members = sorted(set(seen) | set(_ranks(pg_ranks)))
        names = [devices.get(r) for r in seen if devices.get(r)]
        device = max(set(names), key=lambda x: (names.count(x), x)) if names else None
        member_hosts = [hosts.get(r) for r in members]
        spans = None if any(h is None for h in member_hosts) else len(set(member_hosts)) > 1
        c = choose_ceiling(device, spans, n, params.link_gbps, params.network)
        out.append((src, pg, pg_ranks, c.gbps, c.text))
    return pl.DataFrame(
        out,
        schema={
            "source": pl.Utf8,
            "pg": pl.Utf8,
            "pg_ranks": pl.Utf8,
            "ceiling_gbps": pl.Float64,
            "ceiling": pl.Utf8,
        },
        orient="row",
    )


def _ranks(pg_ranks: str | None) -> list[int]:
    """Member ranks of a canonical ``pg_ranks`` list (``"[0, 1]"``), [] when unknown."""
    if not pg_ranks:
        return []
    try:
        return [int(x) for x in pg_ranks.strip("[]").split(",") if x.strip()]
    except ValueError:
        return []


def _bandwidth(store: Store, run_id: int, params: Params) -> tuple[pl.DataFrame, list[str]]:
    """The ``bandwidth`` table and its notes (module doc, step 4)."""
    rows = store.sql(_BW, [run_id])
    if rows.is_empty():
        sized, alg = store.sql(
            "SELECT count(size_bytes), count(algbw_gbps) FROM collective_perf WHERE run_id = ?", [run_id]
        ).row(0)
        why = (
            "no call records its message size"
            if not sized
            else "no call with a known size has a transfer time above 0 (it is 0 or unknown)"
            if not alg
            else "the process groups' sizes are unknown, so no bus factor (algbw_gbps in collective_perf)"
        )
        return pl.DataFrame(), [f"bandwidth: none ({why})"]
    ceilings = _ceilings(store, run_id, rows, params)
    rows = rows.join(ceilings, on=["source", "pg", "pg_ranks"], how="left", nulls_equal=True).with_columns(
        _buckets(rows["size_bytes"])
    )
    keys = ["source", "op", "group_size", "bucket_bytes", "ceiling"]
    bw = (
        rows.group_by(keys)
        .agg(
            pl.len().alias("calls"),
            _common.whole_ns(pl.col("size_bytes").median()).alias("size_bytes"),
            _common.whole_ns(pl.col("transfer_ns").median()),
            pl.col("transfer_ns").sum().alias("_total"),
            pl.col("algbw_gbps").median(),
            pl.col("busbw_gbps").median(),
            pl.col("busbw_gbps").max().alias("busbw_max_gbps"),
            pl.col("reported_algbw_gbps").median(),
            pl.col("reported_busbw_gbps").median(),
            pl.col("ceiling_gbps").first(),
            pl.col("all_ranks_traced").all(),
        )
        .with_columns(
            pl.col("bucket_bytes").map_elements(bucket_label, return_dtype=pl.Utf8).alias("size_bucket"),
            (100.0 * pl.col("busbw_gbps") / pl.col("ceiling_gbps")).alias("of_ceiling_pct"),
        )
        .sort("source", "op", "group_size", "bucket_bytes", "ceiling")
    )
    notes = [
        _headline(r)
        for r in bw.sort("_total", descending=True)
        .unique("op", keep="first", maintain_order=True)
        .iter_rows(named=True)
    ]
    if not bw["all_ranks_traced"].all():
        notes.append(
            "bandwidth: some groups were not traced on every rank (all_ranks_traced false): an untraced "
            "rank's lateness may be inside the transfer, so those figures are lower bounds"
        )
    cols = [
        "source",
        "op",
        "group_size",
        "size_bucket",
        "bucket_bytes",
        "calls",
        "size_bytes",
        "transfer_ns",
        "algbw_gbps",
        "busbw_gbps",
        "busbw_max_gbps",
        "reported_algbw_gbps",
        "reported_busbw_gbps",
        "ceiling_gbps",
        "of_ceiling_pct",
        "ceiling",
        "all_ranks_traced",
    ]
    return bw.select(cols), notes


def _headline(r: dict[str, object]) -> str:
    """``all_reduce, 16 MiB-32 MiB messages, 8 ranks: busbw 180 GB/s of 450 GB/s (40%; NVLink 4, ...)``;
    with the source's own figure where it reports one (``; the source reports busbw 170 GB/s ...``)."""
    head = (
        f"{r['op']}, {bucket_label(int(r['bucket_bytes']))} messages"  # type: ignore[call-overload]
        + (f", {r['group_size']} ranks" if r["group_size"] is not None else "")
        + f" (most transfer time, {r['calls']} calls): "
    )
    reported = r.get("reported_busbw_gbps")
    own = (
        f"the source reports busbw {_gbps(float(reported))} GB/s (median; its own time, which may include "  # type: ignore[arg-type]
        "waiting for peers)"
        if reported is not None
        else ""
    )
    if r["busbw_gbps"] is None:  # no transfer time to compute one from: the source's figure alone
        return head + own
    busbw = float(r["busbw_gbps"])  # type: ignore[arg-type]
    head += f"busbw {_gbps(busbw)} GB/s (median)"
    own = f"; {own}" if own else ""
    gbps = r["ceiling_gbps"]
    if gbps is None or not math.isfinite(float(gbps)):  # type: ignore[arg-type]
        return f"{head}; {r['ceiling']}{own}"
    return f"{head} of {_gbps(float(gbps))} GB/s ({100.0 * busbw / float(gbps):.0f}%; {r['ceiling']}){own}"  # type: ignore[arg-type]


def _gbps(x: float) -> str:
    return f"{x:,.3g}" if x < 100 else f"{x:,.0f}"
