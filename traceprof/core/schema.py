"""The store's schema, declared once.

Every table and view of the DuckDB store is declared here with its columns, SQL types, units and a
one-line doc. The DDL, ``COMMENT ON`` statements (visible through ``duckdb_columns()``) and the
schema reference in ``docs/schema.md`` are generated from these declarations
(``python -m traceprof.core.schema > docs/schema.md``); a test checks the file is current.

Conventions: every time and duration is ``BIGINT`` nanoseconds and ends in ``_ns``; timestamps are
epoch nanoseconds on the clock of the rank that recorded them, plus that trace's
``traces.clock_offset_ns`` (0 until clocks are aligned). Ratios end in ``_pct`` (0..100).
"""

from __future__ import annotations

import builtins
import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

from traceprof.core.ops import bus_factor_sql, size_bytes_sql
from traceprof.core.vocab import CollectiveSource, EventClass, EventKind, Flag, TraceSource, Vocab

__all__ = [
    "is_kernel_launch",
    "one_clock_sql",
    "SCHEMA_VERSION",
    "ARRIVAL_CLOCK_SQL",
    "ARRIVAL_FIRST_SQL",
    "ARRIVAL_NEXT_SQL",
    "ARRIVAL_SQL",
    "COLLECTIVE_COPIES_SQL",
    "COPY_BURST_GAP_NS",
    "INSTANCE_ARRIVAL_SQL",
    "EVENT_KINDS",
    "LAUNCH_KINDS",
    "GPU_ACTIVITY_KINDS",
    "PARQUET_TABLES",
    "Column",
    "Table",
    "TABLES",
    "ddl",
    "sql_text",
    "sql_texts",
    "table",
]

#: Bumped whenever a table or column changes; the store refuses files of another version.
SCHEMA_VERSION = 9

#: Tables that a store in the Parquet layout (``traceprof.storage.layout``) keeps as Parquet files, one per trace,
#: beside the DuckDB file; the store shows each as a view of the same name and columns.
PARQUET_TABLES = ("events",)

#: The normalized event kinds (README.md "What traceprof handles"; ``traceprof.core.vocab.EventKind``).
#: ``other`` keeps unknown categories.
EVENT_KINDS = EventKind.values()

_GPU_SOURCES = CollectiveSource.sql(CollectiveSource.nccl_kernel, CollectiveSource.nccl_inspector)
#: SQL expression (over a ``collectives`` row), ns: the row's preferred arrival clock: the start of the
#: communication kernel on GPU traces and NCCL Inspector records (the GPU reaches the collective),
#: otherwise the CPU enqueue (``enter_ns``: gloo's c10d op, Flight Recorder ``time_created_ns``).
ARRIVAL_FIRST_SQL = f"CASE WHEN source IN {_GPU_SOURCES} THEN start_ns ELSE enter_ns END"
#: SQL expression, ns: the row's other arrival clock (GPU sources: the CPU enqueue; others: the start
#: of the work).
ARRIVAL_NEXT_SQL = f"CASE WHEN source IN {_GPU_SOURCES} THEN enter_ns ELSE start_ns END"
#: SQL expression, ns: a row's own arrival, the preferred clock, else the other one: the one rule
#: (:func:`one_clock_sql`) over a window of one row. For one rank's rows alone (their order on the
#: rank: matching orders them before any instance exists; a transfer's rows before they are paired)
#: and rows outside any instance; across ranks of an instance read :data:`INSTANCE_ARRIVAL_SQL`.
ARRIVAL_SQL = f"coalesce({ARRIVAL_FIRST_SQL}, {ARRIVAL_NEXT_SQL})"


def one_clock_sql(first: str, other: str, over: str | None = None, agg: str | None = None) -> str:
    """SQL expression, ns: a collective instance's arrivals on one clock, the one rule
    (:data:`INSTANCE_ARRIVAL_SQL`): ``first`` where every row with a time has it, else ``other``
    where every such row has that, else NULL. ``first`` / ``other``: SQL expressions of a row's
    preferred and other arrival (ns, NULL when unknown). Two forms of the one rule:

    - a window (``over``, e.g. ``PARTITION BY run_id, instance_id``; ``agg`` None): each row's
      arrival (``collective_perf``, ``comm_items``, ``parallelism``, the pairs of a transfer);
    - an aggregate over a group (``over`` None, ``agg`` e.g. ``"min"``): ``agg`` of the group's
      arrivals on that clock (``collective_instances``' first and last arrival, the instances'
      numbering), without a window over every row.

    A row outside any instance is a window of one row: :data:`ARRIVAL_SQL`.

    Raises:
        ValueError: ``over`` and ``agg`` both given or both None.
    """
    if (over is None) == (agg is None):
        raise ValueError("one_clock_sql: give over (a window) or agg (an aggregate), not both")
    a, b = (first, other) if agg is None else (f"{agg}({first})", f"{agg}({other})")
    return f"CASE WHEN {_all_have(first, other, over)} THEN {a} WHEN {_all_have(other, first, over)} THEN {b} END"


def _all_have(a: str, b: str, over: str | None) -> str:
    """SQL: whether every row of the window (``over``; None: the group) that has ``a`` or ``b`` has ``a``."""
    return f"bool_and(({a}) IS NOT NULL OR ({b}) IS NULL)" + (f" OVER ({over})" if over is not None else "")


#: SQL expression, ns (over ``collectives`` rows holding every row of their instance, ``run_id`` and
#: ``instance_id`` columns): the time a rank arrives at the collective, one clock per instance. Every
#: row of the instance that has a time has the preferred one (:data:`ARRIVAL_FIRST_SQL`): that one;
#: else, where every such row has the other (:data:`ARRIVAL_NEXT_SQL`, on GPU sources the CPU
#: enqueue: an NCCL Inspector record without kernel times): that one on every rank, since a kernel
#: start against another rank's enqueue would put the enqueue-to-kernel gap into the skew; else
#: (one rank only the one, another only the other) NULL: the instance's skew is unknown. A row
#: outside any instance: :data:`ARRIVAL_SQL`. The one rule: matching, stragglers, what-if,
#: parallelism and the ``collective_perf`` view read it (:data:`ARRIVAL_CLOCK_SQL` tells which).
_INSTANCE = "PARTITION BY run_id, instance_id"
INSTANCE_ARRIVAL_SQL = (
    f"CASE WHEN instance_id IS NULL THEN {ARRIVAL_SQL} "
    f"ELSE {one_clock_sql(ARRIVAL_FIRST_SQL, ARRIVAL_NEXT_SQL, _INSTANCE)} END"
)
#: SQL expression (as :data:`INSTANCE_ARRIVAL_SQL`'s rows): how the instance's arrivals differ from
#: each row's own (:data:`ARRIVAL_SQL`): 'first' (they do not: the preferred clock, or no row has it),
#: 'next' (the other clock, where some rows have the preferred one), 'none' (mixed: arrival NULL);
#: NULL outside any instance.
ARRIVAL_CLOCK_SQL = (
    f"CASE WHEN instance_id IS NULL THEN NULL WHEN {_all_have(ARRIVAL_FIRST_SQL, ARRIVAL_NEXT_SQL, _INSTANCE)} "
    f"OR NOT bool_or(({ARRIVAL_FIRST_SQL}) IS NOT NULL) OVER ({_INSTANCE}) THEN 'first' "
    f"WHEN {_all_have(ARRIVAL_NEXT_SQL, ARRIVAL_FIRST_SQL, _INSTANCE)} THEN 'next' ELSE 'none' END"
)

#: Order in which sources are kept when two record the same collective on one rank (first kept):
#: the GPU kernel, the NCCL plugins, gloo work, the CPU enqueue, NDTimeline, then Flight Recorder
#: (its gloo entries hold only the enqueue; the traces' rows hold the work's times).
_KEEP_ORDER = (
    CollectiveSource.nccl_kernel,
    CollectiveSource.nccl_inspector,
    CollectiveSource.nccl_profiler,
    CollectiveSource.gloo,
    CollectiveSource.record_param_comms,
    CollectiveSource.ndtimeline,
    CollectiveSource.fr,
)
_KEEP_RANK = "CASE source " + " ".join(f"WHEN '{s}' THEN {i}" for i, s in enumerate(_KEEP_ORDER)) + " END"
_SAME_CALL = "PARTITION BY run_id, rank, pg, coalesce(p2p, false), seq, op"
_SAME_KIND = "PARTITION BY run_id, rank, op, coalesce(p2p, false), coalesce(bytes_in, nelems_in)"
#: A gap (ns) between two calls' CPU enqueues of one kind on one rank that splits them into two
#: bursts for :data:`COLLECTIVE_COPIES_SQL`'s rule (2): a Flight Recorder gloo entry is created 15
#: to 70 us after its c10d enqueue, so 1 ms is over 14 x the lag seen. On a heavily loaded host the
#: lag grows to ms: a rank's gap is this plus twice the median lag of its Flight Recorder rows
#: (the rule's step (2)), which covers lags spread evenly up to twice their median.
COPY_BURST_GAP_NS = 1_000_000
_SAME_BURST = f"{_SAME_KIND}, burst"
#: SQL query: every ``collectives`` row with ``copy_of``, the source of the row kept in its place
#: when another source recorded the same collective on the same rank (a Kineto / gloo trace and a
#: Flight Recorder dump of one run), NULL for a row counted. Two rows of two sources are one call
#: when (1) both know their process group and sequence number and these, the op and the p2p flag
#: are equal; or (2) one lacks a sequence number (gloo annotations, old Kineto): the rank's rows of
#: one op, p2p flag and size (``bytes_in``, else ``nelems_in``) are split into bursts where two
#: neighbours' CPU enqueues (``enter_ns``, else ``start_ns``) lie more than
#: the rank's gap apart, and within a burst the k-th row of one source and the k-th of another are one
#: call (calls enqueued closer together than Flight Recorder's creation lag pair in order; a call one
#: source alone holds, far from the other's, stays apart). The rank's gap is :data:`COPY_BURST_GAP_NS`
#: plus twice the median lag of its Flight Recorder rows (created in the call, after its enqueue)
#: behind the latest enqueue of another source of their kind, counting only rows that such an enqueue
#: also follows (inside the other source's calls): entries created 2-5 ms after their enqueue on a
#: loaded host were split from their call and counted twice, while a call recorded by one source alone
#: next to one of the other stays apart where the lag is short. The row of the source
#: first in :data:`_KEEP_ORDER` is kept, so a row kept stands for at most one copy per source. A
#: few sorts per rank: n log n, and only on ranks holding two sources (others pass through with
#: ``copy_of`` NULL). ``nccl_sum``'s counts and the ``collective_perf`` view read it.
COLLECTIVE_COPIES_SQL = f"""
WITH two AS (SELECT run_id, rank FROM collectives GROUP BY run_id, rank HAVING count(DISTINCT source) > 1),
own AS (SELECT c.*, {_KEEP_RANK} AS keep_rank, coalesce(enter_ns, start_ns) AS at_ns,
               source = '{CollectiveSource.fr}' AS lagging
        FROM collectives c SEMI JOIN two USING (run_id, rank)),
seen AS (SELECT *, max(CASE WHEN NOT lagging THEN at_ns END) OVER ({_SAME_KIND} ORDER BY at_ns ROWS UNBOUNDED PRECEDING)
                     AS ref_before,
                   min(CASE WHEN NOT lagging THEN at_ns END) OVER ({_SAME_KIND} ORDER BY at_ns
                                                                  ROWS BETWEEN CURRENT ROW AND UNBOUNDED FOLLOWING)
                     AS ref_after FROM own),
gap AS (SELECT *, {COPY_BURST_GAP_NS} + 2 * coalesce(median(CASE WHEN lagging AND ref_after IS NOT NULL
                                                            THEN at_ns - ref_before END) OVER (PARTITION BY run_id, rank), 0)
                  AS gap_ns FROM seen),
cut AS (SELECT *, coalesce(at_ns - lag(at_ns) OVER w > gap_ns, true)::INT AS new_burst
        FROM gap WINDOW w AS ({_SAME_KIND} ORDER BY at_ns NULLS LAST, keep_rank, trace_id, ordinal)),
burst AS (SELECT *, sum(new_burst) OVER ({_SAME_KIND} ORDER BY at_ns NULLS LAST, keep_rank, trace_id, ordinal
                                          ROWS UNBOUNDED PRECEDING) AS burst FROM cut),
nth AS (SELECT *, row_number() OVER ({_SAME_BURST}, source ORDER BY at_ns, trace_id, ordinal) AS nth FROM burst)
SELECT c.*, nullif(c.source, c.source) AS copy_of FROM collectives c ANTI JOIN two USING (run_id, rank)
UNION ALL BY NAME
SELECT * EXCLUDE (keep_rank, at_ns, lagging, ref_before, ref_after, gap_ns, new_burst, burst, nth, first_rank, first_src, b_rank, b_src, b_seq),
       CASE WHEN seq IS NOT NULL AND pg IS NOT NULL AND first_rank < keep_rank THEN first_src
            WHEN NOT b_seq AND b_rank < keep_rank THEN b_src END AS copy_of
FROM (SELECT *, min(keep_rank) OVER ({_SAME_CALL}) AS first_rank,
             arg_min(source, keep_rank) OVER ({_SAME_CALL}) AS first_src,
             min(keep_rank) OVER b AS b_rank, arg_min(source, keep_rank) OVER b AS b_src,
             bool_and(seq IS NOT NULL) OVER b AS b_seq
      FROM nth WINDOW b AS ({_SAME_BURST}, nth))
"""

#: Kinds of the CPU calls that launch GPU work (any device runtime / driver: CUDA, HIP, XPU, MTIA,
#: PrivateUse1); their ``correlation`` links them to the GPU rows they started.
LAUNCH_KINDS = EventKind.values()[4:6]  # cuda_runtime, cuda_driver
#: Kinds of GPU activity that occupy a (device, stream) lane.
GPU_ACTIVITY_KINDS = EventKind.values()[6:9]  # kernel, memcpy, memset


def is_kernel_launch(name: str) -> bool:
    """Whether a launch call (:data:`LAUNCH_KINDS`) named ``name`` launches a kernel: ``*Launch*Kernel*``,
    any case (``cudaLaunchKernel``, ``cuLaunchKernelEx``, ``cudaLaunchCooperativeKernel``,
    ``hipLaunchKernel``); not a graph launch (``cudaGraphLaunch``) nor ``cudaLaunchHostFunc``."""
    low = name.lower()
    at = low.find("launch")
    return at >= 0 and "kernel" in low[at:]


@dataclass(frozen=True)
class Column:
    """One column: name, DuckDB type, unit (``""`` when unitless), a one-line doc, the storage
    compression DuckDB is told to use (``""``: its own choice) and, for a vocabulary column, the
    value set it holds (``traceprof.core.vocab``; a test checks every value written is declared)."""

    name: str
    type: str
    doc: str
    unit: str = ""
    compression: str = ""
    values: builtins.type[Vocab] | None = None

    def comment(self) -> str:
        return f"{self.doc} [{self.unit}]" if self.unit else self.doc


@dataclass(frozen=True)
class Table:
    """A table (``view_sql`` empty) or a view over other tables. ``worst``: of a result frame whose
    rows are steps, the column whose largest values are its worst rows (``step_ns``): a table too
    long to show whole shows those (:func:`traceprof.core.display.shown_rows`)."""

    name: str
    doc: str
    columns: tuple[Column, ...]
    view_sql: str = ""
    worst: str = ""

    @property
    def column_names(self) -> list[str]:
        return [c.name for c in self.columns]


def _c(name: str, type_: str, doc: str, unit: str = "") -> Column:
    return Column(name, type_, doc, unit)


def _v(name: str, vocab: type[Vocab], doc: str) -> Column:
    """A vocabulary column; ``{values}`` in ``doc`` stands for its values, listed."""
    return Column(name, "VARCHAR", doc.replace("{values}", ", ".join(vocab.values())), values=vocab)


#: The args the ``memory_events`` view reads, in the order of its ``j`` list (one JSON parse per row).
_MEMORY_ARGS = (
    '"Ev Idx"',
    '"Device Type"',
    '"Device Id"',
    "Addr",
    "Bytes",
    '"Total Allocated"',
    '"Total Reserved"',
    "Action",
)


def _int_arg(key: str, type_: str = "BIGINT") -> str:
    """SQL of memory arg ``key`` (one of :data:`_MEMORY_ARGS`) as ``type_`` when it is a JSON integer
    that fits, else NULL (``12.5``, ``"5"``, ``true`` are not integers: never rounded or parsed)."""
    j = f"j[{_MEMORY_ARGS.index(key) + 1}]"
    return f"CASE WHEN json_type({j}) IN ('BIGINT', 'UBIGINT') THEN TRY_CAST({j} AS {type_}) END"


_RUN = _c("run_id", "INTEGER", "Run (one training job) this row belongs to; see runs")
_RANK = _c("rank", "INTEGER", "Global rank of the process that recorded the row")
_TRACE = _c("trace_id", "INTEGER", "Source file this row came from; see traces")

#: Columns of ``collectives`` (the view ``collective_perf`` repeats some of them).
_COLLECTIVE_COLUMNS: tuple[Column, ...] = (
    _RUN,
    _RANK,
    _TRACE,
    _v("source", CollectiveSource, "Where the row came from: {values}"),
    _c("pg", "VARCHAR", "Process group name (args.'Process Group Name'), NULL if unknown"),
    _c(
        "pg_ranks",
        "VARCHAR",
        "Member ranks of the process group as a JSON list ('[0, 1]': args.'Process Group "
        "Ranks', FR pg_config), NULL if unknown; with pg it identifies the group",
    ),
    _c(
        "seq",
        "BIGINT",
        "Sequence number in the process group (args.Seq), NULL if unknown; point-to-point ops "
        "and collectives count separately",
    ),
    _c("p2p", "BOOLEAN", "Point-to-point op (send/recv: c10d's separate p2p sequence counter)"),
    _c(
        "comms_id",
        "VARCHAR",
        "args.'Comms Id' (hash of pg, seq, p2p flag, ranks); NCCL profiler plugin "
        "and Inspector: communicator:op:sequence number (NCCL counts per op type); NULL if absent",
    ),
    _c("op", "VARCHAR", "Collective op, normalized (all_reduce, all_gather, broadcast, ...)"),
    _c("dtype", "VARCHAR", "Element type"),
    _c("nelems_in", "BIGINT", "Input elements", "elements"),
    _c("nelems_out", "BIGINT", "Output elements", "elements"),
    _c("bytes_in", "BIGINT", "Input size", "bytes"),
    _c("bytes_out", "BIGINT", "Output size", "bytes"),
    _c("group_size", "INTEGER", "Ranks in the process group"),
    _c("enter_ns", "BIGINT", "CPU enqueue of the collective (record_param_comms / c10d op)", "ns"),
    _c("start_ns", "BIGINT", "Start of the communication (NCCL kernel / gloo work)", "ns"),
    _c("end_ns", "BIGINT", "End of the communication", "ns"),
    _c("stream", "BIGINT", "GPU stream of the NCCL kernel, NULL on CPU"),
    _c("tid", "VARCHAR", "CPU thread of the gloo work, NULL on GPU"),
    _c("step", "INTEGER", "ProfilerStep the collective belongs to"),
    _c("ordinal", "INTEGER", "k-th collective of this (pg, op) on the rank, from 0"),
    _c(
        "instance_id",
        "BIGINT",
        "Matched instance across ranks (collective_instances); NULL if unmatched, e.g. send/recv without pg and seq",
    ),
    _c(
        "match_method",
        "VARCHAR",
        "How the instance was matched: comms_id, pg_seq, ordinal, or step_order "
        "(sequence numbers that cannot be per group, matched by order in the step instead), or pair_order "
        "(send / recv of such a group: the k-th transfer between its two ranks)",
    ),
    _c(
        "split_in",
        "VARCHAR",
        "All-to-all: what this rank sends to each peer, as a JSON list of first-dimension "
        "sizes in group-rank order (Kineto 'In split size', gloo input_split_sizes); '[]' an even split; "
        "NULL unknown or not an all-to-all",
    ),
    _c(
        "split_out",
        "VARCHAR",
        "All-to-all: what this rank receives from each peer, as split_in "
        "(Kineto 'Out split size', gloo output_split_sizes)",
    ),
    _c(
        "reported_algbw_gbps",
        "DOUBLE",
        "Algorithm bandwidth the source reports itself (NCCL Inspector "
        "coll_perf.coll_algobw_gbs: its message size / its own execution time, which may include waiting for "
        "peers), GB/s; NULL for other sources",
        "GB/s",
    ),
    _c(
        "reported_busbw_gbps",
        "DOUBLE",
        "Bus bandwidth the source reports itself (NCCL Inspector "
        "coll_perf.coll_busbw_gbs), GB/s; NULL for other sources",
        "GB/s",
    ),
    _c(
        "peer",
        "INTEGER",
        "Point-to-point: global rank of the other end (a send's destination, a recv's source), as the "
        "source states it: Kineto args.'Dst Rank' / 'Src Rank' (record_param_comms or the kernel), Flight "
        "Recorder profiling_name 'send a->b' / 'recv b<-a' through pg_config's ranks (the NCCL profiler plugin "
        "and Inspector name only the communicator rank: peer_group_rank); NULL if unknown or not point-to-point",
    ),
    _c(
        "peer_group_rank",
        "INTEGER",
        "Point-to-point: rank of the other end within the op's process group (gloo: the c10d::send / "
        "c10d::recv_ enqueue's args.'Concrete Inputs'[2], dstRank / srcRank; Kineto args.'Rank' of a send / "
        "recv; Flight Recorder profiling_name; NCCL profiler plugin P2P args.Peer; NCCL Inspector "
        "p2p_perf.p2p_peer); the global rank is pg_ranks[peer_group_rank], or itself in the default group; "
        "NULL if unknown",
    ),
)


def _pick(columns: tuple[Column, ...], *names: str) -> tuple[Column, ...]:
    """The columns called ``names``, in that order."""
    by = {c.name: c for c in columns}
    return tuple(by[n] for n in names)


TABLES: tuple[Table, ...] = (
    Table(
        "meta",
        "Key/value facts about the store itself, e.g. schema_version",
        (_c("key", "VARCHAR PRIMARY KEY", "Name of the fact"), _c("value", "VARCHAR", "Its value")),
    ),
    Table(
        "runs",
        "One training job: ranks 0..world_size-1 and the trace files recorded from it",
        (
            _c("run_id", "INTEGER PRIMARY KEY", "Run id, unique in the store"),
            _c("name", "VARCHAR UNIQUE NOT NULL", "Run name (default: the directory name)"),
            _c("world_size", "INTEGER", "Number of ranks of the job, from the traces"),
            _c("ingested_at", "TIMESTAMP", "When the run was first ingested (UTC)"),
            _c("sources", "VARCHAR[]", "Trace sources present, e.g. [kineto]"),
            _c("clock_aligned", "BOOLEAN", "Whether clock offsets were estimated and applied"),
        ),
    ),
    Table(
        "traces",
        "One source file of one rank, with what was read from it",
        (
            _c("trace_id", "INTEGER PRIMARY KEY", "Trace id, unique in the store"),
            _RUN,
            _RANK,
            _c("world_size", "INTEGER", "World size written in the trace (distributedInfo.world_size)"),
            _v("source", TraceSource, "Trace source: {values}"),
            _c("format", "VARCHAR", "Source dialect, e.g. kineto-new (baseTimeNanoseconds) or kineto-old"),
            _c("path", "VARCHAR", "Absolute path of the file at ingest time"),
            _c("sha256", "VARCHAR", "SHA-256 of the file bytes; re-ingesting the same file is a no-op"),
            _c("bytes", "BIGINT", "File size", "bytes"),
            _c("host", "VARCHAR", "Host name (sidecar) or NULL"),
            _c("pid", "VARCHAR", "Main process id of the rank"),
            _c("backend", "VARCHAR", "Distributed backend (nccl, gloo, ...) or NULL"),
            _c("device_name", "VARCHAR", "Accelerator name of the rank, 'cpu' for CPU-only runs"),
            _c("torch_version", "VARCHAR", "torch version from the sidecar, or NULL"),
            _c("base_time_ns", "BIGINT", "Kineto baseTimeNanoseconds (0 for old-style traces)", "ns"),
            _c("clock_offset_ns", "BIGINT", "Added to every timestamp of this trace to align clocks", "ns"),
            _c("clock_residual_ns", "BIGINT", "Spread of collective end times after alignment (MAD)", "ns"),
            _c("events_read", "BIGINT", "Records read from the file", "events"),
            _c("events_kept", "BIGINT", "Records stored in events", "events"),
            _c(
                "events_rejected",
                "BIGINT",
                "Malformed or unknown records not stored (see rejected)",
                "events",
            ),
            _c("rejected", "JSON", "Rejected record counts by reason"),
            _c(
                "events_skipped",
                "BIGINT",
                "Records not stored by design: flows (links kept as ids), metadata",
                "events",
            ),
            _c("skipped", "JSON", "Skipped record counts by kind"),
            _c(
                "events_flagged",
                "BIGINT",
                "Records stored with a flag (events.flag), e.g. clipped overruns",
                "events",
            ),
            _c("flagged", "JSON", "Flagged record counts by flag"),
            _c("flops_per_step", "JSON", "Model FLOPs per profiled step from the collector sidecar"),
            _c("flops_method", "VARCHAR", "How the sidecar FLOPs were counted"),
            _c("meta", "JSON", "Other top-level facts of the file (distributedInfo, sidecar, ...)"),
        ),
    ),
    Table(
        "devices",
        "One accelerator of a rank, from Kineto deviceProperties",
        (
            _RUN,
            _RANK,
            _TRACE,
            _c("device", "INTEGER", "Device index (deviceProperties[].id)"),
            _c("name", "VARCHAR", "Device name, e.g. NVIDIA H100 80GB HBM3"),
            _c("sm_count", "INTEGER", "Streaming multiprocessors (numSms)"),
            _c("memory_bytes", "BIGINT", "Global memory (totalGlobalMem)", "bytes"),
            _c("compute_capability", "VARCHAR", "computeMajor.computeMinor"),
        ),
    ),
    Table(
        "events",
        "One interval or instant of one rank, normalized across sources",
        (
            _RUN,
            _RANK,
            _TRACE,
            _v("kind", EventKind, "Normalized event kind (cpu_op, kernel, memcpy, step, ...)"),
            _c("cat", "VARCHAR", "Source category (Kineto 'cat')"),
            _c("name", "VARCHAR", "Event name"),
            _c("ts_ns", "BIGINT", "Start, epoch ns plus the trace's clock_offset_ns", "ns"),
            _c("dur_ns", "BIGINT", "Duration (0 for instants)", "ns"),
            _c("pid", "VARCHAR", "Process id, or the GPU device for GPU events (Kineto pid)"),
            _c("tid", "VARCHAR", "Thread id, or the stream for GPU events (Kineto tid)"),
            _c("device", "INTEGER", "GPU device index (GPU events), else NULL"),
            _c("stream", "BIGINT", "GPU stream (GPU events), else NULL"),
            _c("correlation", "BIGINT", "Launch/activity correlation id (Kineto args.correlation)"),
            _c("external_id", "BIGINT", "Operator correlation id (Kineto args.'External id')"),
            _c("step", "INTEGER", "ProfilerStep number the event belongs to, NULL outside steps"),
            # zstd: one distinct text per row, which DuckDB's default (dictionary + FSST) spends
            # ~2x the CPU on at ingest and stores 2-3x larger (8x1M: 0.64 s less per rank file)
            Column("args", "JSON", "All source args, unchanged", compression="zstd"),
            _v(
                "class",
                EventClass,
                "GPU rows: comm, memory or compute (traceprof.core.classify); NULL for CPU rows",
            ),
            _v(
                "flag",
                Flag,
                "NULL for a normal record, else why it is suspect: before_launch, far_outside, "
                "zero_ts, unmatched_begin (its time cannot be right: left out of windows, idle and latency); "
                "overrun (dur clipped: past the next record on its GPU stream, ending far past the steps, or a ProfilerStep past the trace's end), launch_skew (starts a few us before its launch: kept, no latency) or "
                "unclosed (CPU op still open at profiler stop, dur -1: clipped to the trace end), all kept",
            ),
            _c(
                "raw_dur_ns",
                "BIGINT",
                "Duration as recorded when dur_ns was clipped (flag overrun or unclosed), else NULL",
                "ns",
            ),
        ),
    ),
    Table(
        "steps",
        "One iteration (ProfilerStep#N) of one rank",
        (
            _RUN,
            _RANK,
            _TRACE,
            _c("step", "INTEGER", "Step number N of ProfilerStep#N"),
            _c("cpu_start_ns", "BIGINT", "Start of the ProfilerStep annotation", "ns"),
            _c("cpu_end_ns", "BIGINT", "End of the ProfilerStep annotation", "ns"),
            _c("device_start_ns", "BIGINT", "First GPU activity launched in the step, NULL if none", "ns"),
            _c("device_end_ns", "BIGINT", "Last GPU activity end launched in the step, NULL if none", "ns"),
            _c("is_last", "BOOLEAN", "Last step of the trace (HTA drops it; often cut short)"),
        ),
    ),
    Table(
        "collectives",
        "One collective call on one rank (Kineto and nsys NCCL kernels, gloo annotations, FR entries, NCCL plugin and Inspector records)",
        _COLLECTIVE_COLUMNS,
    ),
    Table(
        "kernels",
        "One GPU activity (kernel, memcpy, memset) with its class and CPU launch",
        (
            _RUN,
            _RANK,
            _TRACE,
            _c("kind", "VARCHAR", "kernel, memcpy or memset"),
            _c("name", "VARCHAR", "Kernel name"),
            _c("class", "VARCHAR", "comm, memory or compute (events.class; rule in traceprof.core.classify)"),
            _c("device", "INTEGER", "GPU device index"),
            _c("stream", "BIGINT", "GPU stream (a lane is (device, stream))"),
            _c("ts_ns", "BIGINT", "Kernel start", "ns"),
            _c("dur_ns", "BIGINT", "Kernel duration", "ns"),
            _c("end_ns", "BIGINT", "Kernel end", "ns"),
            _c("correlation", "BIGINT", "Correlation id with the launching runtime call"),
            _c("step", "INTEGER", "ProfilerStep of the launch"),
            _c(
                "launch_ts_ns",
                "BIGINT",
                "Start of the (first) CPU runtime call with its correlation id, NULL if unknown",
                "ns",
            ),
            _c("launch_name", "VARCHAR", "Runtime call that launched it (cudaLaunchKernel, ...)"),
            _c("grid", "VARCHAR", "Grid dimensions (args.grid) as JSON"),
            _c("block", "VARCHAR", "Block dimensions (args.block) as JSON"),
            _c(
                "first_of_launch",
                "BOOLEAN",
                "First GPU row of its launch call (one launch can start many "
                "kernels, e.g. a CUDA graph replay); launch latency is measured to these only (and not when "
                "that first row is flagged)",
            ),
            _c("flag", "VARCHAR", "events.flag (NULL for a normal record)"),
        ),
        view_sql="""
SELECT k.run_id, k.rank, k.trace_id, k.kind, k.name, coalesce(k.class, 'compute') AS class,
       k.device, k.stream, k.ts_ns, k.dur_ns, k.ts_ns + k.dur_ns AS end_ns, k.correlation, k.step,
       r.ts_ns AS launch_ts_ns, r.name AS launch_name,
       json_extract_string(k.args, '$.grid') AS grid, json_extract_string(k.args, '$.block') AS block,
       r.ts_ns IS NOT NULL AND row_number() OVER (
         PARTITION BY k.run_id, k.trace_id, k.correlation ORDER BY k.ts_ns, k.dur_ns) = 1 AS first_of_launch,
       k.flag
FROM events k
LEFT JOIN (
  -- the first runtime call of each correlation id, so a kernel appears once
  SELECT run_id, trace_id, correlation, min(ts_ns) AS ts_ns, arg_min(name, ts_ns) AS name FROM events
  WHERE kind IN ('cuda_runtime', 'cuda_driver') AND correlation IS NOT NULL
    AND (flag IS NULL OR flag = 'overrun')  -- a flagged call (unset or far time) vouches for nothing
  GROUP BY ALL
) r ON r.run_id = k.run_id AND r.trace_id = k.trace_id AND r.correlation = k.correlation
WHERE k.kind IN ('kernel', 'memcpy', 'memset')
""",
    ),
    Table(
        "memory_events",
        "One accelerator or host memory record: a Kineto allocation or free ('[memory]', "
        "profile_memory=True) or out-of-memory ('[OutOfMemory]'), an Nsight Systems CUDA allocation or "
        "free (CUDA_GPU_MEMORY_USAGE_EVENTS), or a torch export_memory_timeline entry; the events rows "
        "(kind instant) with their args read as typed columns (NULL where missing or not an integer)",
        (
            _RUN,
            _RANK,
            _TRACE,
            _c("source", "VARCHAR", "kineto, nsys or memory_timeline"),
            _c("ts_ns", "BIGINT", "When it happened (events.ts_ns)", "ns"),
            _c("seq", "BIGINT", "Order in its file (args.'Ev Idx'): orders records of one ts_ns"),
            _c("step", "INTEGER", "ProfilerStep of the record (events.step), NULL outside steps"),
            _c("pid", "VARCHAR", "CPU process that allocated (events.pid)"),
            _c("tid", "VARCHAR", "CPU thread that allocated (events.tid)"),
            _c(
                "device_type",
                "INTEGER",
                "c10 DeviceType (args.'Device Type'): 0 CPU, 1 CUDA (and ROCm), 12 XPU, ...",
            ),
            _c("device", "INTEGER", "Device index (args.'Device Id'); -1 for host memory"),
            _c("addr", "BIGINT", "Address of the block (args.Addr)"),
            _c(
                "bytes",
                "BIGINT",
                "Size: positive for an allocation, negative for a free (args.Bytes)",
                "bytes",
            ),
            _c(
                "total_allocated",
                "BIGINT",
                "Bytes allocated on the device after it (Kineto args.'Total Allocated')",
                "bytes",
            ),
            _c(
                "total_reserved",
                "BIGINT",
                "Bytes the caching allocator holds on the device after it (Kineto args.'Total Reserved')",
                "bytes",
            ),
            _c(
                "category",
                "VARCHAR",
                "memory_timeline: parameter, optimizer_state, input, temporary, activation, "
                "gradient, autograd_detail or unknown; else NULL",
            ),
            _c(
                "action",
                "VARCHAR",
                "alloc or free (sign of bytes), oom ('[OutOfMemory]'); memory_timeline: "
                "preexisting, create, increment_version or destroy",
            ),
        ),
        view_sql=f"""
SELECT run_id, rank, trace_id, source, ts_ns, seq, step, pid, tid, device_type, device, addr, bytes, total_allocated,
       total_reserved, category,
       CASE WHEN source = 'memory_timeline' THEN action WHEN oom THEN 'oom' WHEN bytes < 0 THEN 'free'
            WHEN bytes >= 0 THEN 'alloc' END AS action
FROM (SELECT run_id, rank, trace_id,
             CASE cat WHEN 'memory_timeline' THEN 'memory_timeline' WHEN 'cuda_memory' THEN 'nsys' ELSE 'kineto' END
               AS source,
             ts_ns, {_int_arg('"Ev Idx"')} AS seq, step, pid, tid, {_int_arg('"Device Type"', "INTEGER")} AS device_type,
             {_int_arg('"Device Id"', "INTEGER")} AS device, {_int_arg("Addr")} AS addr, {_int_arg("Bytes")} AS bytes,
             {_int_arg('"Total Allocated"')} AS total_allocated, {_int_arg('"Total Reserved"')} AS total_reserved,
             CASE WHEN cat = 'memory_timeline' THEN name END AS category, name = '[OutOfMemory]' AS oom,
             json_extract_string(j[{len(_MEMORY_ARGS)}], '$') AS action
      FROM (SELECT run_id, rank, trace_id, cat, name, ts_ns, step, pid, tid,
                   json_extract(args, [{", ".join(f"'$.{k}'" for k in _MEMORY_ARGS)}]) AS j
            FROM events WHERE kind = 'instant' AND (name IN ('[memory]', '[OutOfMemory]') OR cat = 'memory_timeline')))
""",
    ),
    Table(
        "collective_instances",
        "One collective across ranks: the rows of collectives that share an instance_id",
        (
            _RUN,
            _c("instance_id", "BIGINT", "Instance id, unique within the run; collectives.instance_id"),
            _c("source", "VARCHAR", "collectives.source of the matched rows (matching never mixes sources)"),
            _c("pg", "VARCHAR", "Process group name, NULL if unknown"),
            _c("pg_ranks", "VARCHAR", "Member ranks of the process group (JSON list), NULL if unknown"),
            _c("p2p", "BOOLEAN", "Point-to-point transfer (send/recv) rather than a collective"),
            _c(
                "seq",
                "BIGINT",
                "Sequence number in the process group (comms_id / pg_seq matching), else NULL",
            ),
            _c(
                "op",
                "VARCHAR",
                "Collective op, normalized: the most common of its rows' (the smallest on a tie); a send "
                "matched with its recv: send/recv",
            ),
            _c(
                "step",
                "INTEGER",
                "Step of the instance (the most common step of its rows, the smallest on a tie)",
            ),
            _c("bytes", "BIGINT", "Message size (bytes_in, or nelems_in when bytes are unknown)", "bytes"),
            _c("ordinal", "INTEGER", "k-th instance of this (pg, op, size) in its step (ordinal matching)"),
            _c("ranks_present", "INTEGER[]", "Ranks holding a row of the instance"),
            _c(
                "ranks_missing",
                "INTEGER[]",
                "Ranks of the group (pg_ranks, else the ranks seen in this pg) without a row",
            ),
            _c("n_ranks", "INTEGER", "Number of ranks present"),
            _c(
                "first_arrival_ns",
                "BIGINT",
                "Earliest arrival (enter_ns, or start_ns of NCCL kernels and NCCL Inspector records)",
                "ns",
            ),
            _c("last_arrival_ns", "BIGINT", "Latest arrival", "ns"),
            _c(
                "last_rank",
                "INTEGER",
                "Rank that arrived last; NULL when several arrived at the same last instant (a tie)",
            ),
            _c("arrival_skew_ns", "BIGINT", "last_arrival_ns - first_arrival_ns", "ns"),
            _c("first_end_ns", "BIGINT", "Earliest end among the ranks, NULL if no end is known", "ns"),
            _c("last_end_ns", "BIGINT", "Latest end among the ranks", "ns"),
            _c(
                "match_method",
                "VARCHAR",
                "comms_id, pg_seq (process group + sequence number), ordinal, step_order, or pair_order",
            ),
        ),
    ),
    Table(
        "baselines",
        "Named baseline sets for the regression gate (`traceprof baseline add NAME RUN...`): one row per "
        "member run; `traceprof diff NAME CAND` compares a run with all of them",
        (
            _c("name", "VARCHAR NOT NULL", "Name of the baseline set"),
            _RUN,
            _c("added_at", "TIMESTAMP", "When the run was added to the set (UTC)"),
        ),
    ),
    Table(
        "collective_perf",
        "One collective call on one rank (a collectives row; a call two sources recorded, once: the row kept by "
        "COLLECTIVE_COPIES_SQL, e.g. gloo's over Flight Recorder's) with its time split into wait, launch and transfer "
        "and its bandwidth as nccl-tests defines it; a source that reports its own figures (NCCL Inspector) keeps "
        "them in columns of their own, beside these, which are always computed from the times",
        (
            _RUN,
            _RANK,
            _TRACE,
            *_pick(
                _COLLECTIVE_COLUMNS, "source", "pg", "pg_ranks", "seq", "op", "dtype", "step", "instance_id"
            ),
            _c(
                "arrival_ns",
                "BIGINT",
                "When this rank arrived: its NCCL kernel start on GPU sources, else its CPU "
                "enqueue (enter_ns), else its start",
                "ns",
            ),
            *_pick(_COLLECTIVE_COLUMNS, "start_ns", "end_ns"),
            _c(
                "last_arrival_ns",
                "BIGINT",
                "Latest arrival of the instance's traced ranks (this row's own arrival when unmatched)",
                "ns",
            ),
            _c(
                "transfer_start_ns",
                "BIGINT",
                "When data could move: the last arrival, or the last traced rank's start "
                "of its communication work when later (CPU sources, where arrival is the enqueue); equal to "
                "last_arrival_ns on GPU sources",
                "ns",
            ),
            _c(
                "span_ns",
                "BIGINT",
                "Communication time of the row, end_ns - arrival_ns = wait_ns + launch_ns + "
                "transfer_ns; NULL when a time is unknown or the end precedes the arrival",
                "ns",
            ),
            _c("wait_ns", "BIGINT", "Waiting for peers: arrival to the last arrival (up to the end)", "ns"),
            _c(
                "launch_ns",
                "BIGINT",
                "Everyone arrived but some rank's communication work had not started yet: "
                "last arrival to transfer_start_ns (backend queue and launch latency; 0 on GPU sources)",
                "ns",
            ),
            _c(
                "transfer_ns",
                "BIGINT",
                "Moving data: transfer_start_ns to the end, never the wait for peers (0 when "
                "the row ends before it: a wrong match or clock)",
                "ns",
            ),
            _c(
                "group_size",
                "INTEGER",
                "Ranks n in the process group: collectives.group_size, else the length of "
                "pg_ranks, else the instance's ranks present plus missing (not when some ranks of the job were not "
                "traced); NULL if unknown",
            ),
            _c("traced_ranks", "INTEGER", "Ranks of the group traced at this instance (1 when unmatched)"),
            _c(
                "all_ranks_traced",
                "BOOLEAN",
                "Every rank of the group was traced at this instance, so transfer_ns "
                "holds no wait; false: an untraced peer's lateness may be inside transfer_ns (bandwidth a lower "
                "bound)",
            ),
            _c(
                "size_bytes",
                "BIGINT",
                "Message size S as nccl-tests counts it: all-reduce, all-to-all, broadcast, "
                "reduce, send/recv the buffer (bytes_in); all-gather and gather the output of all ranks (bytes_out, "
                "else n x bytes_in); reduce-scatter and scatter the input of all ranks (bytes_in, else n x "
                "bytes_out); NULL when unknown or the op moves no data (barrier)",
                "bytes",
            ),
            _c(
                "bus_factor",
                "DOUBLE",
                "busbw / algbw (nccl-tests): all-reduce 2(n-1)/n; all-gather, "
                "reduce-scatter, all-to-all, gather, scatter (n-1)/n; broadcast, reduce, send/recv 1",
            ),
            _c(
                "algbw_gbps",
                "DOUBLE",
                "Algorithm bandwidth size_bytes / transfer_ns, in GB/s (10^9 bytes/s, not "
                "gigabits); NULL when the size is unknown or the transfer is 0 or unknown, never infinite",
                "GB/s",
            ),
            _c(
                "busbw_gbps",
                "DOUBLE",
                "Bus bandwidth algbw_gbps x bus_factor, comparable to a link's per-direction "
                "bandwidth (GB/s); NULL when algbw_gbps or the factor is",
                "GB/s",
            ),
            *_pick(_COLLECTIVE_COLUMNS, "reported_algbw_gbps", "reported_busbw_gbps"),
        ),
        view_sql=f"""
WITH a AS (
  SELECT c.*, {INSTANCE_ARRIVAL_SQL} AS arrival_ns,
         CASE WHEN instance_id IS NOT NULL THEN max(start_ns) OVER (PARTITION BY run_id, instance_id)
              ELSE start_ns END AS last_start_ns
  FROM ({COLLECTIVE_COPIES_SQL}) c
),
-- runs that lack traces of some ranks of the job: there, the ranks seen in a group are not its size
partial AS (
  SELECT run_id FROM traces GROUP BY run_id HAVING count(DISTINCT rank) < max(world_size)
),
j AS (
  SELECT a.*, coalesce(i.last_arrival_ns, a.arrival_ns) AS last_arr, coalesce(i.n_ranks, 1) AS traced,
         coalesce(a.group_size, len(try_cast(a.pg_ranks AS INTEGER[])),
                  CASE WHEN p.run_id IS NULL THEN i.n_ranks + len(i.ranks_missing) END) AS g
  FROM a LEFT JOIN collective_instances i ON i.run_id = a.run_id AND i.instance_id = a.instance_id
  LEFT JOIN partial p ON p.run_id = a.run_id
),
t AS (
  SELECT *, CASE WHEN g >= 1 THEN g::INTEGER END AS group_n, greatest(last_arr, last_start_ns) AS t0,
         CASE WHEN end_ns >= arrival_ns THEN end_ns - arrival_ns END AS span
  FROM j
),
s AS (
  SELECT *, {size_bytes_sql("group_n")} AS size_b, {bus_factor_sql("group_n")} AS factor,
         CASE WHEN span IS NOT NULL THEN greatest(end_ns - t0, 0) END AS transfer
  FROM t
)
SELECT run_id, rank, trace_id, source, pg, pg_ranks, seq, op, dtype, step, instance_id, arrival_ns, start_ns, end_ns,
       last_arr AS last_arrival_ns, t0 AS transfer_start_ns, span AS span_ns,
       CASE WHEN span IS NOT NULL THEN least(last_arr, end_ns) - arrival_ns END AS wait_ns,
       CASE WHEN span IS NOT NULL THEN greatest(least(t0, end_ns) - last_arr, 0) END AS launch_ns,
       transfer AS transfer_ns, group_n AS group_size, traced AS traced_ranks,
       coalesce(traced >= group_n, false) AS all_ranks_traced, size_b AS size_bytes, factor AS bus_factor,
       CASE WHEN transfer > 0 THEN size_b / transfer END AS algbw_gbps,
       CASE WHEN transfer > 0 THEN size_b / transfer * factor END AS busbw_gbps,
       reported_algbw_gbps, reported_busbw_gbps
FROM s WHERE copy_of IS NULL
""",
    ),
    Table(
        "parts",
        "One Parquet file of a store in the Parquet layout: the rows of one trace in one table (empty in the "
        "DuckDB layout)",
        (
            _RUN,
            _RANK,
            _TRACE,
            _c("table_name", "VARCHAR", "Store table whose rows the file holds (events)"),
            _c(
                "path",
                "VARCHAR",
                "File path relative to the dataset folder <store>.parquet/, "
                "<table>/run_id=R/rank=K/trace_id=T/part-0.parquet",
            ),
            _c("rows", "BIGINT", "Rows in the file", "rows"),
            _c("bytes", "BIGINT", "File size", "bytes"),
            _c(
                "ts_shift_ns",
                "BIGINT",
                "Added to the file's ts_ns by the view (clock alignment after the file was written)",
                "ns",
            ),
        ),
    ),
)


def table(name: str) -> Table:
    """Return the declaration of table or view ``name``; raises ``KeyError`` when unknown."""
    for t in TABLES:
        if t.name == name:
            return t
    raise KeyError(name)


def sql_text(s: str) -> str:
    """``s`` as a SQL string literal (single quotes, a quote inside doubled): for text that cannot
    be a bound parameter (DDL, an ``IN`` list built into a query, a COPY path)."""
    return "'" + s.replace("'", "''") + "'"


def sql_texts(values: Iterable[str]) -> str:
    """``values`` as SQL string literals separated by commas (:func:`sql_text`), for ``IN (...)``."""
    return ", ".join(sql_text(v) for v in values)


def ddl(layout: str = "duckdb") -> list[str]:
    """SQL statements that create every table and view, with table and column comments.

    Base tables come first, then views in declared order. With ``layout="parquet"`` each table of
    :data:`PARQUET_TABLES` is instead a view over the temporary view ``_<name>_files`` (its Parquet
    files, created by ``traceprof.storage.layout`` on every open) joined with ``parts`` for ``ts_shift_ns``.
    """
    out: list[str] = []
    parquet = PARQUET_TABLES if layout == "parquet" else ()
    for t in sorted(TABLES, key=lambda t: bool(t.view_sql or t.name in parquet)):
        if t.view_sql:
            out.append(_view(t))
        elif t.name in parquet:
            out.append(f"CREATE VIEW {t.name} AS {parquet_view_sql(t)}")
        else:
            cols = ",\n  ".join(
                f'"{c.name}" {c.type}' + (f" USING COMPRESSION {c.compression}" if c.compression else "")
                for c in t.columns
            )
            out.append(f"CREATE TABLE {t.name} (\n  {cols}\n)")
        out += _comments(t, "VIEW" if t.view_sql or t.name in parquet else "TABLE")
    return out


def _view(t: Table) -> str:
    """The statement that makes derived view ``t`` (``CREATE OR REPLACE``: on a new store it creates
    it, on an older one :func:`view_ddl` replaces it with the same statement)."""
    return f"CREATE OR REPLACE VIEW {t.name} AS {t.view_sql.strip()}"


def _comments(t: Table, kind: str) -> list[str]:
    """The table's and its columns' COMMENT statements (``kind``: TABLE or VIEW)."""
    return [
        f"COMMENT ON {kind} {t.name} IS {sql_text(t.doc)}",
        *(f'COMMENT ON COLUMN {t.name}."{c.name}" IS {sql_text(c.comment())}' for c in t.columns),
    ]


def views_digest() -> str:
    """SHA-256 (hex) of every derived view's SQL (``Table.view_sql``): a store records the digest
    of the views it was created with (``meta`` key ``views``), and a writable open of a store with
    another digest replaces them with :func:`view_ddl` (the views hold no data: same rows, e.g. a
    definition DuckDB can filter by run before its window functions)."""
    return hashlib.sha256("\0".join(t.view_sql.strip() for t in TABLES if t.view_sql).encode()).hexdigest()


def view_ddl() -> list[str]:
    """``CREATE OR REPLACE VIEW`` and the comments of every derived view (:func:`views_digest`)."""
    out: list[str] = []
    for t in TABLES:
        if t.view_sql:
            out += [_view(t), *_comments(t, "VIEW")]
    return out


def sql_type(c: Column) -> str:
    """The column's bare SQL type (``INTEGER PRIMARY KEY`` -> ``INTEGER``)."""
    return c.type.split()[0]


def parquet_view_sql(t: Table) -> str:
    """The view that shows table ``t``'s Parquet files (temporary view ``_<name>_files``) as the
    table: same columns in the same order, ``ts_ns`` plus the file's ``parts.ts_shift_ns``."""
    cols = ", ".join(
        "f.ts_ns + p.ts_shift_ns AS ts_ns" if c.name == "ts_ns" else f'f."{c.name}"' for c in t.columns
    )
    return (
        f"SELECT {cols} FROM _{t.name}_files f "
        f"JOIN parts p ON p.trace_id = f.trace_id AND p.table_name = {sql_text(t.name)}"
    )


def markdown() -> str:
    """The schema reference as Markdown (the content of ``docs/schema.md``)."""
    lines = [
        "# traceprof store schema",
        "",
        f"Schema version {SCHEMA_VERSION}. Generated from `traceprof/core/schema.py` by "
        "`python -m traceprof.core.schema > docs/schema.md`; do not edit by hand.",
        "",
        "All times are integer nanoseconds (`_ns`), epoch-based, plus the trace's `clock_offset_ns`. "
        "In SQL, `SELECT * FROM duckdb_columns() WHERE table_name = 'events'` shows the same docs.",
        "",
    ]
    for t in TABLES:
        lines += [f"## `{t.name}`{' (view)' if t.view_sql else ''}", "", t.doc, ""]
        lines += ["| column | type | unit | doc |", "|---|---|---|---|"]
        for c in t.columns:
            typ = sql_type(c)
            lines.append(f"| `{c.name}` | {typ} | {c.unit} | {c.doc} |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown(), end="")
