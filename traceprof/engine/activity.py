"""Per-rank activity intervals, the common input of the time-based analyses.

GPU ranks: every kernel, memcpy and memset, classed ``comm``, ``memory`` or ``compute`` by the one
classifier (``events.class``, ``traceprof.core.classify``: metadata, then NCCL/RCCL/DeepEP/NVSHMEM/
symmetric-memory/custom all-reduce name families and user patterns), on lanes keyed by (device,
stream) (``"dev D stream S"``: a process driving two GPUs reuses stream numbers per device).
Excluded time is one definition for every analysis (``traceprof.engine.arrivals``): records flagged at
ingest because their time cannot be right (``events.flag``: another clock domain, far outside the
rank's steps, unmatched ``B``) are left out; clipped overruns, a few us of launch skew and ops still
open at profiler stop count with their (clipped) times; the steps of the profiler-start transient
are left out on every rank (HTA-compatible mode keeps them). CPU-only ranks (gloo runs, no GPU lanes): ``gloo:*``
annotations are ``comm``; the ``cpu_op`` events of the training thread (the thread that holds the
ProfilerStep annotations; without steps, the thread with the most cpu_op time), except the c10d
enqueue ops, are ``compute``.

HTA-compatible selection (``hta=True``), as Holistic Trace Analysis 0.5.0 loads a trace:
  1. When the run has two or more ProfilerSteps, keep only GPU events launched (same
     ``correlation``) by a CPU runtime call that starts before the rank's last ProfilerStep; GPU
     events with no launch in the trace are dropped.
  2. cuda_sync events with a stream count as GPU activity (class ``other``).
  3. Traces with fractional-microsecond timestamps are rounded inward to whole microseconds
     (start up, end down) as HTA rounds them: from its float64 reading of the file's microseconds
     (``traceprof.engine.htatime``; 0.25 us apart at epoch microseconds), not the exact decimals.
  4. Classes follow HTA's name rules: ``comm`` = name starts with ``nccl`` and contains
     ``Kernel``; ``memory`` = starts with Memcpy, Memset or dma; ``other`` = contains Memcpy or
     Sync, or starts with Memset; ``compute`` = the rest.

With ``detail=True`` each row also says where it came from (``DETAIL_COLUMNS``): the event kind,
trace, stream and correlation, and the CPU side that issued it (for GPU rows the runtime call with
the same correlation, rounded up to whole microseconds like the GPU times when HTA rounds them;
for CPU rows the op itself).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING

import polars as pl

from traceprof.core.classify import VALID_SQL, flagged_text, valid_sql
from traceprof.core.errors import AnalysisError
from traceprof.core.schema import sql_texts
from traceprof.core.text import first_few
from traceprof.engine import intervals
from traceprof.engine.analysis import drop_shared, lasting, release_shared, reusing, shared, shared_done
from traceprof.engine.arrivals import excluded_steps, run_transient
from traceprof.engine.htatime import end_ns_sql, start_ns_sql
from traceprof.engine.resultcache import kept_frame
from traceprof.storage.runs import run_label
from traceprof.storage.store import Store

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "activity",
    "release_activity",
    "run_activity",
    "excluded_note",
    "flagged_note",
    "ACTIVITY_COLUMNS",
    "DETAIL_COLUMNS",
    "LANE_SQL",
    "step_window",
    "multi_device_ranks",
    "run_measures",
    "graph_level_notes",
    "launches_without_kernels",
    "unmatched_launch_notes",
    "GRAPH_LEVEL_NOTE",
    "GRAPH_LOST_NOTE",
    "LAUNCH_LOST_NOTE",
    "UNMATCHED_LAUNCH_PCT",
    "op_activity",
    "exposed_comm",
    "compute_rows",
    "compute_merged",
    "rank_list",
    "step_activity",
]

#: Columns of :func:`activity`.
ACTIVITY_COLUMNS = ("rank", "class", "start_ns", "end_ns", "lane", "step", "name", "device_kind", "device")
#: Extra columns of :func:`activity` with ``detail=True``.
DETAIL_COLUMNS = ("kind", "trace_id", "stream", "correlation", "launch_tid", "launch_ts_ns")

#: The GPU rows of :func:`activity` (a run of GPU ranks alone: all of it).
_GPU_SQL = """
SELECT e.rank, coalesce(e.class, 'compute') AS class,
       e.ts_ns AS start_ns, e.ts_ns + e.dur_ns AS end_ns,
       $lane AS lane, e.step, e.name, 'gpu' AS device_kind, e.device$gpu_detail$gpu_keys
FROM events e$gpu_join
WHERE e.run_id = $run AND e.kind IN ('kernel', 'memcpy', 'memset') AND $valid
"""

#: The GPU rows and, for ranks without any, their CPU training-thread ops (columns of the same
#: types: the GPU rows' are the events table's, the CPU rows' the same or NULL).
_SQL = (
    """
WITH gpu_ranks AS (
  SELECT DISTINCT rank FROM events
  WHERE run_id = $run AND kind IN ('kernel', 'memcpy', 'memset')
),
step_threads AS (
  SELECT DISTINCT rank, pid, tid FROM events WHERE run_id = $run AND kind = 'step'
),
train_threads AS (
  SELECT * FROM step_threads
  UNION ALL  -- ranks without ProfilerSteps: the thread with the most cpu_op time
  SELECT rank, pid, tid FROM (
    SELECT rank, pid, tid, sum(dur_ns) AS busy FROM events
    WHERE run_id = $run AND kind = 'cpu_op' AND rank NOT IN (SELECT rank FROM step_threads)
    GROUP BY ALL
  ) QUALIFY row_number() OVER (PARTITION BY rank ORDER BY busy DESC, tid) = 1
)"""
    + _GPU_SQL
    + """UNION ALL
SELECT e.rank,
       CASE WHEN e.kind = 'user_annotation' THEN 'comm' ELSE 'compute' END AS class,
       e.ts_ns, e.ts_ns + e.dur_ns, 'tid ' || e.tid, e.step, e.name, 'cpu', NULL$cpu_detail$cpu_keys
FROM events e
WHERE e.run_id = $run
  AND e.rank NOT IN (SELECT rank FROM gpu_ranks)
  AND $valid
  AND ((e.kind = 'user_annotation' AND e.name LIKE 'gloo:%')
    OR (e.kind = 'cpu_op' AND NOT starts_with(e.name, 'c10d::') AND e.name <> 'record_param_comms'
        AND EXISTS (SELECT 1 FROM train_threads t
                    WHERE t.rank = e.rank AND t.pid = e.pid AND t.tid = e.tid)))
"""
)


def _hta_time(start: str, dur: str | None = None) -> str:
    """SQL of HTA's whole-microsecond start (end, with ``dur``) of an events row, ns
    (``traceprof.engine.htatime``), where its trace has a fractional timestamp (``f``: the trace's
    row of ``float_ts``); else the row's own."""
    shift = "f.shift_ns"
    rounded = start_ns_sql(start, shift) if dur is None else end_ns_sql(start, dur, shift)
    return f"CASE WHEN f.fractional THEN {rounded} ELSE {start}{'' if dur is None else ' + ' + dur} END"


_HTA_SQL = (
    """
WITH step_count AS (
  SELECT count(DISTINCT name) AS n FROM events WHERE run_id = $run AND kind = 'step'
),
float_ts AS (
  SELECT e.trace_id, coalesce(t.base_time_ns, 0) + coalesce(t.clock_offset_ns, 0) AS shift_ns,
         bool_or((e.ts_ns - coalesce(t.base_time_ns, 0) - coalesce(t.clock_offset_ns, 0)) % 1000 <> 0) AS fractional
  FROM events e JOIN traces t USING (trace_id) WHERE e.run_id = $run GROUP BY ALL
),
last_step AS (
  SELECT trace_id, max("""
    + _hta_time("e.ts_ns")
    + """) AS last_start FROM events e JOIN float_ts f USING (trace_id)
  WHERE run_id = $run AND kind = 'step' GROUP BY trace_id
),
launches AS (
  SELECT e.trace_id, e.correlation, count(*) AS n FROM events e
  LEFT JOIN last_step l USING (trace_id) JOIN float_ts f USING (trace_id)
  WHERE e.run_id = $run AND e.correlation IS NOT NULL
    AND e.kind NOT IN ('kernel', 'memcpy', 'memset', 'sync')
    AND ((SELECT n FROM step_count) < 2 OR """
    + _hta_time("e.ts_ns")
    + """ < l.last_start)
  GROUP BY ALL
),
gpu AS (
  SELECT e.* REPLACE (coalesce(e.raw_dur_ns, e.dur_ns) AS dur_ns) FROM events e
  JOIN launches l ON l.trace_id = e.trace_id AND l.correlation = e.correlation
  CROSS JOIN range(l.n) AS dup(i)
  WHERE e.run_id = $run AND e.stream >= 0 AND e.kind IN ('kernel', 'memcpy', 'memset', 'sync')
    AND (SELECT n FROM step_count) >= 2
  UNION ALL
  SELECT e.* REPLACE (coalesce(e.raw_dur_ns, e.dur_ns) AS dur_ns) FROM events e
  WHERE e.run_id = $run AND e.stream >= 0 AND e.kind IN ('kernel', 'memcpy', 'memset', 'sync')
    AND e.correlation IS NOT NULL AND (SELECT n FROM step_count) < 2
)
SELECT g.rank,
       CASE WHEN regexp_matches(g.name, '^nccl.*Kernel') THEN 'comm'
            WHEN regexp_matches(g.name, '^(Memcpy|Memset|dma)') THEN 'memory'
            WHEN regexp_matches(g.name, '^(.*Memcpy|Memset|.*Sync)') THEN 'other'
            ELSE 'compute' END AS class,
       """
    + _hta_time("g.ts_ns")
    + """ AS start_ns,
       """
    + _hta_time("g.ts_ns", "g.dur_ns")
    + """ AS end_ns,
       $glane AS lane, g.step, g.name, 'gpu' AS device_kind, g.device$hta_detail
FROM gpu g JOIN float_ts f USING (trace_id)$hta_join
"""
)

# The first CPU call with the correlation (one per GPU event in practice).
_LAUNCH_CTE = """(SELECT trace_id, correlation, min(ts_ns) AS ts_ns, arg_min(tid, ts_ns) AS tid FROM events
   WHERE run_id = $run AND $kinds AND correlation IS NOT NULL $launch_valid GROUP BY trace_id, correlation)"""
_DETAIL = {
    # a GPU row's launch call is looked up after the query (:func:`_with_launches`: a SQL join with
    # the calls grouped took about as much CPU as the rest of the query); the row carries its
    # (trace, correlation) key
    "$gpu_detail": ", e.kind, e.trace_id, e.stream, e.correlation, NULL::VARCHAR AS launch_tid, "
    "NULL::BIGINT AS launch_ts_ns",
    "$gpu_join": "",
    "$cpu_detail": ", e.kind, e.trace_id, NULL, NULL, e.tid, e.ts_ns",
    "$hta_detail": ", g.kind, g.trace_id, g.stream, g.correlation, l.tid AS launch_tid, "
    + _hta_time("l.ts_ns")
    + " AS launch_ts_ns",
    # HTA's CPU partner of a GPU event is any CPU-class event with its correlation.
    "$hta_join": "\nLEFT JOIN "
    + _LAUNCH_CTE.replace("$kinds", "kind NOT IN ('kernel', 'memcpy', 'memset', 'sync')").replace(
        "$launch_valid", ""
    )
    + " l ON l.trace_id = g.trace_id AND l.correlation = g.correlation",
}


#: SQL of a GPU lane name over an events row ``e``: ``dev D stream S``.
LANE_SQL = "'dev ' || coalesce(e.device::VARCHAR, '?') || ' stream ' || e.stream"


def activity(
    store: Store,
    run_id: int,
    *,
    hta: bool = False,
    detail: bool = False,
    columns: tuple[str, ...] | None = None,
    alone: bool = False,
    classes: tuple[str, ...] | None = None,
    keep: bool = True,
) -> pl.DataFrame:
    """Activity intervals of every rank of a run.

    Args:
        store: An open store.
        run_id: The run.
        hta: Select and classify GPU events as HTA 0.5.0 does (module doc); GPU ranks only.
        detail: Also return ``DETAIL_COLUMNS`` (module doc).
        columns: Only these of the columns below, and the query reads no store column that they
            do not need (``idle``: no names, no launch threads; a third less time on a fresh
            store); they must include rank, start_ns, end_ns and step. None: all of them.
        alone: In a session that runs many analyses, read ``columns`` alone while the session
            does not hold the whole frame yet (idle called first in a library session); without
            it such a session takes them from its one frame. Other sessions always read only
            ``columns`` (``traceprof analyze``: a third to half of the frame's memory).
        classes: Only the rows of these classes (those of the frame, sorted the same way; rows
            tied on rank, start and end may come in another order), read alone as ``columns``
            are (the replay's compute items: no comm or memory rows). None: every class.
        keep: False: what is read alone (not taken from the session's whole frame) is not kept
            in the session either: its one reader after the analyses (the report's findings:
            ``overlap``'s exposed communication beyond the stragglers' waits, read once the
            analyses let go of the frame) holds it alone, and lets go of it when done.

    Returns:
        Frame with columns rank, class (comm/compute/memory, and other with ``hta``), start_ns,
        end_ns (ns, epoch, aligned), lane ("dev D stream S" or "tid T"), step (launch step, may be null),
        name, device_kind (gpu/cpu), device (GPU rows; null on CPU rows); with ``detail`` also kind
        (event kind), trace_id, stream (GPU rows), correlation (GPU rows), launch_tid and launch_ts_ns (ns; GPU rows: the thread and
        start of the runtime call that launched the row, null when the trace lacks it; CPU rows:
        the op's own thread and start). Sorted by rank, start_ns and end_ns.

    In a session that runs many analyses (``traceprof.engine.session``: the report) the query runs once
    per run and selection: every analysis reads the same frame.

    Raises:
        ValueError: ``columns`` lacks rank, start_ns, end_ns or step.
    """
    if columns is not None and not {"rank", "start_ns", "end_ns", "step"} <= set(columns):
        raise ValueError(f"activity columns {columns}: rank, start_ns, end_ns and step are needed")
    held = shared_done(_activity, store, run_id, hta=hta, detail=True)
    if held or (reusing(store) and (columns is None or not alone)):
        # one query per run inside a report: what is asked for taken from the detail frame (a few
        # columns asked for first ``alone`` are read alone: idle's, in a third less time); the
        # report's first heavy analysis takes its columns from the frame its light ones shared
        # (no second read) and lets go of the rest (:func:`release_activity`)
        full = _activity(store, run_id, hta=hta, detail=True)
        cols = full.columns if columns is None and detail else columns or ACTIVITY_COLUMNS
        if classes is not None:  # only the selected columns of those rows copied
            return full.lazy().filter(pl.col("class").is_in(list(classes))).select(cols).collect()
        return full if columns is None and detail else full.select(cols)
    df = _activity(store, run_id, hta=hta, detail=detail, columns=columns, classes=classes)
    if not keep:
        drop_shared(_activity, store, run_id, hta=hta, detail=detail, columns=columns, classes=classes)
    return df


def release_activity(
    store: Store,
    run_id: int,
    *,
    hta: bool = False,
    detail: bool = False,
    columns: tuple[str, ...] | None = None,
    classes: tuple[str, ...] | None = None,
) -> None:
    """Let go of the frame :func:`activity` kept for these arguments in a ``traceprof analyze``
    session (``traceprof.engine.analysis.release_shared``; a report keeps its one frame for its
    light analyses), and of the run's whole detail frame where the session still holds it (a
    report's heavy analyses run one at a time: the first takes its columns from the light ones'
    frame): its caller was its last reader in the command, and a later call reads it again.
    Nothing is released elsewhere."""
    release_shared(_activity, store, run_id, hta=hta, detail=detail, columns=columns, classes=classes)
    release_shared(_activity, store, run_id, hta=hta, detail=True)


@shared
@kept_frame
def _activity(
    store: Store,
    run_id: int,
    *,
    hta: bool,
    detail: bool,
    columns: tuple[str, ...] | None = None,
    classes: tuple[str, ...] | None = None,
) -> pl.DataFrame:
    sql = _query(store, run_id, hta=hta, detail=detail, columns=columns, classes=classes)
    # sorted once by rank and start (end on a tie): the interval sweeps (``intervals.class_measures``,
    # ``union_ns``) then skip their sorts
    if hta:
        return store.sql(sql).sort("rank", "start_ns", "end_ns")
    cut = excluded_steps(store, run_id)
    if not _looks_up_launches(hta=hta, detail=detail, columns=columns):
        return _by_rank(store, run_id, sql, lambda part: _drop_transient(part, cut))
    return _by_rank(
        store, run_id, sql, lambda part: _with_launches(store, run_id, _drop_transient(part, cut), columns)
    )


def _query(
    store: Store,
    run_id: int,
    *,
    hta: bool,
    detail: bool,
    columns: tuple[str, ...] | None = None,
    classes: tuple[str, ...] | None = None,
) -> str:
    """The SQL of :func:`activity` for run ``run_id`` (``columns``, ``classes``: its own)."""
    # the CPU branch reads every cpu_op (a third of the query's time): only when a rank has no GPU rows
    sql = _HTA_SQL if hta else _SQL if _cpu_ranks(store, run_id) else _GPU_SQL
    # a GPU row's lane text is made from its (device, stream) once per distinct pair, not per row
    # in SQL (about a fifth of the query's CPU): the rows carry the pair (``_LANE_KEYS``) and
    # :func:`_with_lanes` writes the text
    sql = (
        sql.replace("$lane", "NULL::VARCHAR")
        .replace("$gpu_keys", ", e.device AS _lane_device, e.stream AS _lane_stream")
        .replace("$cpu_keys", ", NULL, NULL")
        .replace("$glane", LANE_SQL.replace("e.", "g."))
        .replace("$valid", VALID_SQL)
    )
    for key, value in _DETAIL.items():
        sql = sql.replace(key, value if detail else "")
    if columns is not None or classes is not None:  # DuckDB then reads (and aggregates) only what these need
        wanted = columns if columns is None or "lane" not in columns or hta else (*columns, *_LANE_KEYS)
        if wanted is not None and _looks_up_launches(hta=hta, detail=detail, columns=columns):
            wanted = (*wanted, *(c for c in _LAUNCH_KEYS if c not in wanted))
        cols = "*" if wanted is None else ", ".join(f'"{c}"' for c in wanted)
        where = "" if classes is None else f" WHERE class IN ({sql_texts(classes)})"
        sql = f"SELECT {cols} FROM ({sql}){where}"
    return sql.replace("$run", str(int(run_id)))


#: The launch call's columns of a GPU row with ``detail`` (:func:`_with_launches`), and the row's
#: columns they are looked up by.
_LAUNCH_COLUMNS = ("launch_tid", "launch_ts_ns")
_LAUNCH_KEYS = ("trace_id", "correlation")

#: The launch calls of a run's GPU rows: the runtime and driver calls with a correlation id.
_CALLS_SQL = (
    "SELECT trace_id, correlation, ts_ns, tid FROM events WHERE run_id = $run "
    "AND kind IN ('cuda_runtime', 'cuda_driver') AND correlation IS NOT NULL AND ts_ns IS NOT NULL AND "
    + valid_sql("")
)


#: The most (traces x span of correlation ids) :func:`_with_launches` packs into one integer key.
_KEY_SPAN = 2**62


def _looks_up_launches(*, hta: bool, detail: bool, columns: tuple[str, ...] | None) -> bool:
    """Whether the activity query's rows get their launch call from :func:`_with_launches` (``detail``
    rows, not ``hta``'s, where a launch column is wanted)."""
    return detail and not hta and (columns is None or any(c in columns for c in _LAUNCH_COLUMNS))


def _with_launches(
    store: Store, run_id: int, df: pl.DataFrame, columns: tuple[str, ...] | None
) -> pl.DataFrame:
    """``df`` (rows of the detail activity query of one group of ranks, in their order) with each GPU
    row's launch call: of the runtime and driver calls of its trace and correlation id
    (:data:`_CALLS_SQL`), the start of the first (``launch_ts_ns``) and the thread of the first of
    those with a thread (``launch_tid``), as ``min(ts_ns)`` and ``arg_min(tid, ts_ns)`` of a SQL
    join would give them; a CPU row keeps its own. The calls are sorted by (trace, id, start) and
    each row's key looked up by binary search: on 8 x 1M about 1 s of CPU for the frame where the
    SQL join's aggregate and hash join took about 2 s (a join here where the ids span too much for
    one integer key). The key columns ``columns`` does not ask for are dropped."""
    extra = [c for c in _LAUNCH_KEYS if columns is not None and c not in columns]
    if df.is_empty():
        return df.drop(extra)
    ranks = df.get_column("rank")
    where = (
        "" if ranks.null_count() else f" AND rank BETWEEN {int(ranks.min())} AND {int(ranks.max())}"  # type: ignore[arg-type]
    )
    calls = store.sql(_CALLS_SQL.replace("$run", str(int(run_id))) + where)
    if calls.is_empty():
        return df.drop(extra)
    # (trace, id) as one integer: the trace's number among the calls' traces times the span of ids
    traces = calls.get_column("trace_id").unique().sort()
    lo, hi = int(calls["correlation"].min()), int(calls["correlation"].max())  # type: ignore[arg-type]
    span = hi - lo + 1
    if len(traces) * span >= _KEY_SPAN:  # ids too far apart for one integer key: a join
        firsts = (
            calls.sort("ts_ns", maintain_order=True)
            .group_by(*_LAUNCH_KEYS, maintain_order=True)
            .agg(pl.col("ts_ns").first().alias("_ts"), pl.col("tid").drop_nulls().first().alias("_tid"))
        )
        got = df.select(_LAUNCH_KEYS).join(firsts, on=list(_LAUNCH_KEYS), how="left", maintain_order="left")
        firsts_of = {"launch_ts_ns": got["_ts"], "launch_tid": got["_tid"]}
        return df.with_columns(
            pl.coalesce(pl.lit(firsts_of[c]), c).alias(c) for c in _LAUNCH_COLUMNS if c in df.columns
        ).drop(extra)
    corr = pl.col("correlation")
    key = (
        pl.when(corr.is_between(lo, hi))
        .then(
            pl.col("trace_id").replace_strict(traces, range(len(traces)), default=None, return_dtype=pl.Int64)
            * span
            + (corr - lo)
        )
        .alias("_key")
    )
    calls = calls.select(key, "ts_ns", "tid").sort("_key", "ts_ns", maintain_order=True)
    want = df.select(key)["_key"]
    looked = []
    if "launch_ts_ns" in df.columns:
        looked.append(_first_of(calls, "ts_ns", want, "launch_ts_ns"))
    if "launch_tid" in df.columns:
        looked.append(_first_of(calls.filter(pl.col("tid").is_not_null()), "tid", want, "launch_tid"))
    return df.with_columns(looked).drop(extra)


def _first_of(calls: pl.DataFrame, col: str, want: pl.Series, name: str) -> pl.Expr:
    """``calls[col]`` of the first of ``calls`` (sorted by ``_key``) whose key is each of ``want``,
    else the row's own ``name`` (an expression over the rows ``want`` is of)."""
    firsts = calls.filter(calls["_key"].ne_missing(calls["_key"].shift(1)))
    if firsts.is_empty():
        return pl.col(name)
    at = firsts["_key"].search_sorted(want.fill_null(0), side="left").clip(0, firsts.height - 1)
    hit = firsts["_key"].gather(at).eq_missing(want) & want.is_not_null()
    return pl.when(pl.lit(hit)).then(pl.lit(firsts[col].gather(at))).otherwise(pl.col(name)).alias(name)


def step_activity(store: Store, run_id: int, step: int) -> pl.DataFrame:
    """The rows of :func:`activity` (``hta`` and ``detail`` off) whose step is ``step``, in its order,
    read from the store for that step alone (the report's timeline of one step reads a few
    thousand rows, not the run's millions).

    The step filter applies to the rows selected, not to the choice of GPU ranks and training
    threads (over the whole run, as :func:`activity`), and the profiler-start transient is left
    out as there: the rows are those of ``activity(store, run_id).filter(step == step)``.
    """
    sql = _STEP_ROWS.sub(rf"\g<0> AND e.step = {int(step)}", _query(store, run_id, hta=False, detail=False))
    rows = _drop_transient(store.sql(sql).sort("rank", "start_ns", "end_ns"), excluded_steps(store, run_id))
    return _with_lanes(rows)


#: ``e.run_id = N`` in the activity query: the selects of its rows (its CTEs read ``run_id`` bare).
_STEP_ROWS = re.compile(r"\be\.run_id = \d+")


#: ``run_id = N`` (of any table alias) in the activity query, where a rank filter is added.
_RUN_FILTER = re.compile(r"\b((?:\w+\.)?)run_id = (\d+)")


def _by_rank(
    store: Store, run_id: int, sql: str, keep: Callable[[pl.DataFrame], pl.DataFrame] = lambda df: df
) -> pl.DataFrame:
    """``keep`` of the rows of ``sql`` (the activity query of run ``run_id``, every part of which
    reads one rank's events), fetched a group of consecutive ranks at a time (:func:`rank_groups`),
    each group ordered by rank, start_ns and end_ns as it is copied (:func:`_compact`; ties in the
    order read) and kept as it comes: the frame
    ``keep(store.sql(sql).sort("rank", "start_ns", "end_ns"))`` returns, in less memory.

    ``keep`` is a row filter applied to each group's rows (the profiler-start transient's).
    DuckDB's Arrow batches of one group at a time are held (not the run's), and each text column
    is built from its distinct values (a rank's kernels repeat a few hundred names): the rows of
    a polars string column then share those values' bytes rather than holding a copy each. The
    frame is the groups' frames put end to end, one chunk per group and column, never copied
    into one: a copy of the run's rows freed at once stays with the allocator for seconds (on 8
    ranks x 1 M events the frame's peak fell from about 0.8 to about 0.6 GiB without it). A run
    with events of no rank is fetched whole."""
    groups = rank_groups(store, run_id)
    if groups is None:
        return _with_lanes(keep(store.sql(sql).sort("rank", "start_ns", "end_ns")))
    parts = [
        _with_lanes(
            keep(
                _compact(
                    store.arrow(_RUN_FILTER.sub(rf"\g<0> AND \g<1>rank BETWEEN {lo} AND {hi}", sql)), _ORDER
                )
            )
        )
        for lo, hi in groups
    ]
    return pl.concat(parts, how="vertical", rechunk=False)


#: Ranks are fetched in groups of consecutive ranks holding at least this many events in all (a
#: rank of more is a group of its own; :func:`_by_rank`): each group is one query, one chunk of
#: the activity frame, and what DuckDB holds at a time. Ranks of 1 M events: one at a time; 1,024
#: ranks of a few thousand: a few queries, not 1,024.
GROUP_EVENTS = 1 << 19


def rank_groups(store: Store, run_id: int) -> list[tuple[int, int]] | None:
    """Consecutive ranks of run ``run_id`` as (first, last) rank pairs, ascending, each group
    holding at least :data:`GROUP_EVENTS` events (the last may hold fewer), for work done a group at a
    time; None where :func:`rank_list` is (fewer than two ranks, or a trace of no rank)."""
    if rank_list(store, run_id) is None:
        return None
    counts = store.sql(
        "SELECT rank, count(*) AS n FROM events WHERE run_id = ? GROUP BY rank ORDER BY rank", [int(run_id)]
    )
    groups: list[tuple[int, int]] = []
    first, size = None, 0
    for rank, n in counts.iter_rows():
        first = rank if first is None else first
        size += n
        if size >= GROUP_EVENTS:
            groups.append((int(first), int(rank)))
            first, size = None, 0
    if first is not None:
        groups.append((int(first), int(counts["rank"][-1])))
    return groups


def rank_list(store: Store, run_id: int) -> list[int] | None:
    """The ranks of run ``run_id``, ascending, for work done one rank at a time; None when there
    are fewer than two or a trace of the run has no rank (work on the whole run then)."""
    ranks = store.sql(
        "SELECT DISTINCT rank FROM traces WHERE run_id = ? ORDER BY rank NULLS FIRST", [int(run_id)]
    )["rank"].to_list()
    return None if len(ranks) < 2 or None in ranks else [int(r) for r in ranks]


#: The order of a group's activity rows (:func:`_compact` puts them in it as it copies them).
_ORDER = ("rank", "start_ns", "end_ns")


def _compact(table: pa.Table | None, order: tuple[str, ...] = ()) -> pl.DataFrame:
    """``table`` as a polars frame of its own memory, one chunk per column, each text column gathered
    from its distinct values (module doc of :func:`_by_rank`), its rows sorted by the columns
    ``order`` (``intervals.sorting``) as they are copied: the copy each column gets anyway, no other.

    A group's rows come from DuckDB nearly in order (stored order: on 8 ranks x 1 M events about
    1,000 of a rank's 332,000 activity rows out of place), where DuckDB's ORDER BY sorted them all:
    there the frame's read (query, sort and copy) took 2.4-2.7 s of CPU, now 1.7-2.1 s, at the same
    peak memory."""
    import pyarrow as pa
    import pyarrow.compute as pc

    assert table is not None  # a query
    at = intervals.sorting([pl.Series(k, table.column(k)) for k in order])
    columns = []
    for name, col in zip(table.column_names, table.columns, strict=True):
        if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
            codes = pc.dictionary_encode(col).combine_chunks()
            index = pl.Series(codes.indices)
            series = pl.Series(name, codes.dictionary).gather(index if at is None else index.gather(at))
        else:
            whole = pl.Series(name, col)  # its own copy below: DuckDB's batch is freed
            series = whole.rechunk() if at is None else whole.gather(at)
        columns.append(series)
    return pl.DataFrame(columns)


#: The columns a GPU row's lane is made of (device, stream) in the activity query, dropped once
#: :func:`_with_lanes` has written the lane text.
_LANE_KEYS = ("_lane_device", "_lane_stream")


def _with_lanes(df: pl.DataFrame) -> pl.DataFrame:
    """``df`` (rows of the activity query) with each GPU row's lane text ``dev D stream S``
    (:data:`LANE_SQL`'s text: ``?`` for a null device, null for a null stream) made once per
    distinct (device, stream) pair and gathered, the pair's columns dropped; a CPU row's lane is
    the query's. The rows share the few lane texts' bytes (as :func:`_compact`'s text columns).

    Each row's pair is numbered from its device's and its stream's numbers among the distinct
    values (one text per combination: a few devices times a few streams), or, past
    :data:`LANE_TEXTS` combinations, by a join on the distinct pairs (3x the CPU)."""
    import pyarrow.compute as pc

    if _LANE_KEYS[1] not in df.columns:
        return df
    device, stream = (
        pc.dictionary_encode(df.get_column(c).to_arrow(), null_encoding="encode") for c in _LANE_KEYS
    )
    devices, streams = device.dictionary.to_pylist(), stream.dictionary.to_pylist()
    if len(devices) * len(streams) <= LANE_TEXTS:
        texts = [_lane_text(d, s) for d in devices for s in streams]
        index = pl.Series(device.indices).cast(pl.Int64) * len(streams) + pl.Series(stream.indices)
    else:
        keys = df.select(_LANE_KEYS)
        pairs = keys.unique(maintain_order=True).with_row_index("_lane_index")
        texts = [_lane_text(d, s) for d, s in pairs.select(_LANE_KEYS).iter_rows()]
        joined = keys.join(pairs, on=list(_LANE_KEYS), how="left", nulls_equal=True, maintain_order="left")
        index = joined.get_column("_lane_index")
    gpu = pl.Series("lane", texts, dtype=pl.String).gather(index)
    lane = gpu if df["lane"].null_count() == df.height else df["lane"].fill_null(gpu)
    return df.drop(_LANE_KEYS).with_columns(lane)


#: :func:`_with_lanes` writes a text per (device, stream) combination of a piece of the frame
#: up to this many combinations (distinct devices x distinct streams), else per pair present.
LANE_TEXTS = 1 << 12


def _lane_text(device: int | None, stream: int | None) -> str | None:
    """:data:`LANE_SQL`'s text of a GPU row's (device, stream)."""
    return None if stream is None else f"dev {'?' if device is None else device} stream {stream}"


@lasting
@shared
def _cpu_ranks(store: Store, run_id: int) -> bool:
    """Whether a rank of the run has no GPU rows (kernel, memcpy, memset): only such ranks' CPU ops
    are activity (``_SQL``'s second branch). Asked once per run in a session (a scan of the run's
    events: 0.1 s CPU on 8 ranks x 1 M events): the report's activity frame and its timeline's step
    rows both ask."""
    return bool(
        store.sql(
            "SELECT count(*) FROM (SELECT rank FROM events WHERE run_id = ? GROUP BY rank "
            "HAVING NOT bool_or(kind IN ('kernel', 'memcpy', 'memset')))",
            [int(run_id)],
        ).item()
    )


def _drop_transient(df: pl.DataFrame, cut: pl.DataFrame) -> pl.DataFrame:
    """``df`` without the profiler-start transient ``cut`` (``traceprof.engine.arrivals.excluded_steps``):
    on each rank, the rows of its transient steps, and the rows of no step that start before the
    end of the last of them."""
    if cut.is_empty() or df.is_empty():
        return df
    ends = cut.group_by("rank").agg(pl.col("cut_ns").first())
    key = pl.col("rank").cast(pl.Int64) * 2**32 + pl.col("step").cast(pl.Int64)  # (rank, step) as one integer
    keys = cut.select(key)["rank"]
    cut_ns = (
        pl.col("rank")
        .cast(pl.Int64)
        .replace_strict(ends["rank"].cast(pl.Int64), ends["cut_ns"], default=None)
    )
    gone = key.is_in(keys.implode()).fill_null(False) | (
        pl.col("step").is_null() & (pl.col("start_ns") < cut_ns)
    )
    return df.filter(~gone.fill_null(False))  # a filter keeps the rows' order


def excluded_note(store: Store, run_id: int, hta: bool = False) -> str | None:
    """The note on excluded time: the profiler-start transient (``traceprof.engine.arrivals.transient``;
    not with ``hta``: HTA-compatible mode keeps it) and the GPU records flagged at ingest for their
    start (``events.flag`` of ``traceprof.core.classify.EXCLUDED_FLAGS``, counted per flag: left out,
    or with ``hta`` kept as HTA keeps them: :func:`flagged_note`), joined by "; "; None when there is
    neither."""
    notes = [] if hta else [n for n in (run_transient(store, run_id).note,) if n]
    notes += [n for n in (flagged_note(store, run_id, hta),) if n]
    return "; ".join(notes) or None


def flagged_note(store: Store, run_id: int, hta: bool = False) -> str | None:
    """The note on the run's GPU records (kernels, copies, memsets) flagged at ingest for their start
    (``events.flag`` of ``traceprof.core.classify.EXCLUDED_FLAGS``: another clock domain, far outside
    the steps), with the count per flag: left out of windows, idle and latency; with ``hta`` not left
    out (HTA flags nothing). None when there is none."""
    flagged = store.sql(
        "SELECT flag, count(*)::BIGINT AS n FROM events e WHERE run_id = ? AND kind IN ('kernel', 'memcpy', "
        f"'memset') AND NOT {VALID_SQL} GROUP BY flag ORDER BY flag",
        [int(run_id)],
    )
    if not flagged.height:
        return None
    what = flagged_text(flagged.iter_rows(), "GPU record(s)")
    if hta:
        return f"{what} not left out (HTA flags nothing): their times count as recorded where HTA's selection keeps them"
    return (
        f"{what} left out of windows, idle and latency: their start is another clock's (kernel_sum and "
        "memcpy_sum count their durations)"
    )


def op_activity(store: Store, run_id: int, step: int | None = None) -> pl.DataFrame:
    """Activity of a run traced per op rather than per kernel (NDTimeline): ``gpu_user_annotation``
    events (forward/backward compute ranges) as compute, ``collective`` events as communication.

    Args:
        store: An open store.
        run_id: The run.
        step: Only the events of this step (events.step); None for all.

    Returns:
        Frame rank, class (compute/comm), start_ns, end_ns (ns, aligned), name, step; intervals of
        positive length only, sorted by rank, start_ns and end_ns.
    """
    return store.sql(
        """SELECT rank, CASE WHEN kind = 'collective' THEN 'comm' ELSE 'compute' END AS class,
                  ts_ns AS start_ns, ts_ns + dur_ns AS end_ns, name, step
           FROM events WHERE run_id = ? AND kind IN ('collective', 'gpu_user_annotation') AND dur_ns > 0
             AND (? IS NULL OR step = ?)""",
        [run_id, step, step],
    ).sort("rank", "start_ns", "end_ns")


def run_activity(
    store: Store,
    run: str | None,
    *,
    hta: bool = False,
    detail: bool = False,
    columns: tuple[str, ...] | None = None,
) -> tuple[int, pl.DataFrame]:
    """Resolve ``run`` (name, id or None for the latest) and return (run_id, :func:`activity`)
    (``hta``, ``detail`` and ``columns`` as there).

    Raises:
        ValueError: ``columns`` lacks rank, start_ns, end_ns or step.
        StoreError: No such run.
        AnalysisError: The run has neither GPU activity nor CPU training-thread ops (with ``hta``:
            no GPU kernels, said so when the run has CPU ops that ``hta`` leaves out).
    """
    run_id = store.resolve_run(run)
    act = activity(store, run_id, hta=hta, detail=detail, columns=columns)
    if act.is_empty():
        if (
            hta and not activity(store, run_id, detail=detail, columns=columns).is_empty()
        ):  # a CPU run: HTA reads kernels only
            raise AnalysisError(
                f"{run_label(store, run_id)}: no GPU kernels; hta=true reads GPU kernels only, as HTA does "
                "(without it, a CPU run's training-thread ops are analysed)"
            )
        raise AnalysisError(f"{run_label(store, run_id)}: no GPU kernels and no CPU training-thread ops")
    return run_id, act


#: The steps HTA-compatible selection keeps (module doc, step 1), over a ``steps`` row ``s`` of run
#: ``$run``: every step but the rank's last when the run has two or more steps, else all.
HTA_STEPS_SQL = """((SELECT count(DISTINCT step) FROM steps WHERE run_id = $run) < 2
    OR s.cpu_start_ns < (SELECT max(l.cpu_start_ns) FROM steps l WHERE l.run_id = $run AND l.rank = s.rank))"""


def step_window(store: Store, run_id: int, act: pl.DataFrame, *, hta: bool = False) -> pl.DataFrame:
    """Idle over the profiled steps of each rank (wall clock), beside the activity window.

    The activity window (first to last GPU activity, as HTA) hides idle time before a step's first
    kernel (data loading, host stalls). The step window runs from the start of the rank's first
    ProfilerStep to the end of its last (``steps.cpu_start_ns`` / ``cpu_end_ns``, ns).

    Args:
        store: An open store.
        run_id: The run.
        act: :func:`activity` rows of the run (rank, start_ns, end_ns).
        hta: ``act`` was selected as HTA does (``hta=True``): the window spans the steps that
            selection keeps (:data:`HTA_STEPS_SQL`: the rank's last step left out when the run has
            two or more), as the activity does.

    Returns:
        Frame rank, step_window_ns, step_busy_ns (|∪ activity ∩ step window|), step_idle_ns
        (window - busy), step_idle_pct (% of step_window_ns); ranks without steps are absent.
    """
    kept = f" AND {HTA_STEPS_SQL}" if hta else ""
    win = store.sql(
        (
            "SELECT rank, min(cpu_start_ns) AS _lo, max(cpu_end_ns) AS _hi FROM steps s "
            f"WHERE run_id = $run{kept} GROUP BY rank"
        ).replace("$run", str(int(run_id)))
    )
    if win.is_empty():
        return pl.DataFrame(
            schema={
                "rank": pl.Int32,
                "step_window_ns": pl.Int64,
                "step_busy_ns": pl.Int64,
                "step_idle_ns": pl.Int64,
                "step_idle_pct": pl.Float64,
            }
        )

    def busy_ns(rows: pl.DataFrame) -> pl.DataFrame:
        # in act's order (rank, start), which clipping keeps: the sweep needs no sort
        inside = intervals.clip(rows.join(win, on="rank", maintain_order="left"), "_lo", "_hi")
        return intervals.union_ns(inside, ["rank"], "step_busy_ns")

    # a few ranks at a time: the clipped copies hold one piece of a large run at a time
    busy = intervals.by_rank_chunks(act.select("rank", "start_ns", "end_ns"), ["rank"], busy_ns)
    out = win.join(busy, on="rank", how="left").with_columns(
        (pl.col("_hi") - pl.col("_lo")).alias("step_window_ns"), pl.col("step_busy_ns").fill_null(0)
    )
    return out.select(
        "rank",
        "step_window_ns",
        "step_busy_ns",
        (pl.col("step_window_ns") - pl.col("step_busy_ns")).alias("step_idle_ns"),
        (100.0 * (pl.col("step_window_ns") - pl.col("step_busy_ns")) / pl.col("step_window_ns")).alias(
            "step_idle_pct"
        ),
    ).sort("rank")


#: What an analysis says of a run whose GPU records include whole CUDA graph executions (a trace's
#: ``traces.meta.graph_level``: nsys ``CUPTI_ACTIVITY_KIND_GRAPH_TRACE`` rows, graphs traced per graph).
GRAPH_LEVEL_NOTE = (
    "CUDA graphs traced per graph (nsys --cuda-graph-trace=graph, the default): each graph execution "
    "is one GPU record 'CUDA graph <id>', counted as busy compute time; the kernels inside and their "
    "classes (communication included) are unknown: record them with nsys profile "
    "--cuda-graph-trace=node"
)

#: The start of the note on CUDA graph launches that have no GPU record (``traces.meta.graph_launches_without_gpu``).
GRAPH_LOST_NOTE = "incomplete: CUDA graph launches with no GPU record"


def _lost_shares(rows: pl.DataFrame) -> tuple[pl.Series, str]:
    """Per rank (rows: rank, n calls, lost of them), the share lost (%) and "rank 0: 1 of 10 (10.0%)"
    for the first five ranks (and how many more)."""
    pct = 100.0 * rows["lost"] / rows["n"]
    each = first_few(
        list(zip(rows.iter_rows(), pct, strict=True)),
        5,
        "; ",
        "; and {} more rank(s)",
        lambda x: f"rank {x[0][0]}: {x[0][2]:,} of {x[0][1]:,} ({x[1]:.1f}%)",
    )
    return pct, each


def _lost_by_rank(store: Store, run_id: int, key: str) -> pl.DataFrame:
    """Per rank of the run's traces that lost some launch calls' GPU records (``traces.meta.<key>`` of
    them, ``<key>_without_gpu`` lost, as ingest counted them per trace): rank, n (calls), uncounted
    (traces written before ingest counted ``key``) and lost; sorted by rank, empty when none lost."""
    return store.sql(
        f"SELECT rank, sum(CAST(json_extract(meta, '$.{key}') AS BIGINT)) AS n, "
        f"count(*) - count(json_extract(meta, '$.{key}')) AS uncounted, "
        f"sum(CAST(json_extract(meta, '$.{key}_without_gpu') AS BIGINT)) AS lost FROM traces "
        f"WHERE run_id = ? AND json_extract(meta, '$.{key}_without_gpu') IS NOT NULL "
        "GROUP BY rank ORDER BY rank",
        [int(run_id)],
    )


def graph_level_notes(store: Store, run_id: int) -> list[str]:
    """``[GRAPH_LEVEL_NOTE]`` when a trace of the run holds graph-level GPU records, and a note when
    some hold CUDA graph launches with no GPU record at all (``traces.meta.graph_launches_without_gpu``
    of ``graph_launches``: their GPU time is missing, so busy time is short and idle time overstated);
    else ``[]``. The note starts with :data:`GRAPH_LOST_NOTE` where a rank's share of such launches
    exceeds :data:`UNMATCHED_LAUNCH_PCT` % (as kernel launches: :func:`unmatched_launch_notes`), or
    where the store was written before ingest counted the launches (no ``graph_launches``)."""
    n = store.sql(
        "SELECT count(json_extract(meta, '$.graph_level')) FROM traces WHERE run_id = ?", [int(run_id)]
    ).item()
    out = [GRAPH_LEVEL_NOTE] if n else []
    rows = _lost_by_rank(store, run_id, "graph_launches")
    if rows.is_empty():
        return out
    lost, ranks = int(rows["lost"].sum()), ", ".join(map(str, rows["rank"]))
    missing = "their GPU time is missing, so busy and kernel time are short and idle time is overstated"
    if rows["uncounted"].sum():  # ingested before the launches were counted: no share to weigh
        return [
            *out,
            f"{GRAPH_LOST_NOTE}: {lost} on rank(s) {ranks} (no kernel rows and no graph-level rows): {missing}",
        ]
    pct, each = _lost_shares(rows.select("rank", "n", "lost"))
    if (pct > UNMATCHED_LAUNCH_PCT).any():
        return [
            *out,
            f"{GRAPH_LOST_NOTE} ({each}), more than {UNMATCHED_LAUNCH_PCT:g}% of a rank's CUDA graph launches "
            f"(no kernel rows and no graph-level rows): {missing}",
        ]
    return [
        *out,
        f"CUDA graph launches with no GPU record ({each}), at most {UNMATCHED_LAUNCH_PCT:g}% of a rank's "
        "CUDA graph launches (no kernel rows and no graph-level rows): idle time is overstated by their GPU time",
    ]


#: The share of a run's kernel launch calls (% of them) with no GPU record above which its GPU
#: figures are incomplete (``idle``'s module doc): at most this share, the few records a trace loses
#: at its edges (kernels still running when the profiler stopped), the idle share stands with a note.
UNMATCHED_LAUNCH_PCT = 10.0

#: The start of the note on a run whose kernel launch calls lack GPU records beyond
#: :data:`UNMATCHED_LAUNCH_PCT`; as :data:`GRAPH_LOST_NOTE`, it starts with "incomplete:".
LAUNCH_LOST_NOTE = "incomplete: kernel launches with no GPU record"


def unmatched_launch_notes(store: Store, run_id: int) -> list[str]:
    """A note when some of the run's kernel launch calls (``cudaLaunchKernel`` & co. with a correlation
    id: ``traceprof.core.schema.is_kernel_launch``; graph launches have :func:`graph_level_notes`) have
    no GPU row (kernel, copy, memset) of the same trace and correlation, as ingest counted them per
    trace (``traces.meta.kernel_launches_without_gpu`` of ``kernel_launches``): their GPU time is
    missing. Where a rank's share of such calls exceeds :data:`UNMATCHED_LAUNCH_PCT` % the note
    starts with :data:`LAUNCH_LOST_NOTE`; ``[]`` when every call has its GPU row (or the store was
    written before ingest counted them). Per rank: "rank 0: 19 of 20 (95.0%)"."""
    rows = _lost_by_rank(store, run_id, "kernel_launches")
    if rows.is_empty():
        return []
    pct, each = _lost_shares(rows.select("rank", "n", "lost"))
    if (pct > UNMATCHED_LAUNCH_PCT).any():
        return [
            f"{LAUNCH_LOST_NOTE} ({each}), more than {UNMATCHED_LAUNCH_PCT:g}% of a rank's kernel launch "
            "calls: their kernels' GPU time is missing, so busy time is short, idle time is overstated and "
            "the window may be cut short (record the GPU's kernel activity of the whole run)"
        ]
    return [
        f"kernel launches with no GPU record ({each}), at most {UNMATCHED_LAUNCH_PCT:g}% of a rank's kernel "
        "launch calls (e.g. kernels still running when the profiler stopped): idle time is overstated by "
        "their GPU time"
    ]


def launches_without_kernels(store: Store, run_id: int) -> str | None:
    """Why the run's GPU rows cannot tell GPU idle time, or None: kernel launch calls (a device
    runtime's ``*Launch*`` call: ``cudaLaunchKernel``, ``cuLaunchKernel``, ``cudaGraphLaunch``,
    ``hipLaunchKernel``) were recorded but no kernel activity was captured (an Nsight export without
    CUPTI_ACTIVITY_KIND_KERNEL, a Kineto trace without its ``kernel`` category): the GPU ran work
    the trace does not hold, and its copies and memsets alone are not its kernels. None when the
    run has a kernel or no launch call."""
    counts = store.sql(
        "SELECT count(*) FILTER (WHERE kind = 'kernel') AS kernels, count(*) FILTER (WHERE kind IN "
        "('memcpy', 'memset')) AS copies FROM events WHERE run_id = ? AND kind IN ('kernel', 'memcpy', "
        "'memset')",
        [int(run_id)],
    ).row(0)
    if counts[0]:
        return None
    calls = store.sql(
        "SELECT name, count(*) AS n FROM events WHERE run_id = ? AND kind IN ('cuda_runtime', "
        "'cuda_driver') AND name ILIKE '%launch%' GROUP BY name ORDER BY n DESC, name",
        [int(run_id)],
    )
    if calls.is_empty():
        return None
    names = first_few(
        list(calls.iter_rows()), more=" and {} other name(s)", shown=lambda x: f"{x[1]:,} {x[0]}"
    )
    return (
        f"{int(calls['n'].sum()):,} kernel launch call(s) were recorded ({names}) but no GPU kernel "
        f"activity was captured (the trace holds {counts[1]:,} copies/memsets and no kernel records): "
        "GPU idle time cannot be told (record the GPU's kernel activity: CUPTI_ACTIVITY_KIND_KERNEL in "
        "Nsight Systems, ProfilerActivity.CUDA in the torch profiler)"
    )


def exposed_comm(act: pl.DataFrame, by: list[str], compute: pl.DataFrame | None = None) -> pl.DataFrame:
    """Maximal intervals of communication not hidden behind any compute of the same rank (the one
    rule: ``overlap``, ``gaps``, ``parallelism`` and the report's timeline read it).

    Args:
        act: Activity frame (:func:`activity`).
        by: ``["rank"]`` or ``["rank", "step"]`` (one step's communication minus all the rank's
            compute); rows with a null step form their own group. With ``"device"`` after rank
            (``["rank", "device", ...]``, a process that drives several GPUs) a device's communication
            is hidden only behind that device's compute.
        compute: ``act``'s compute intervals (rank, start_ns, end_ns; and device with a ``by`` of
            devices), merged or not, when the caller has them (it subtracts them again:
            :func:`compute_merged`); None: taken from ``act``.

    Returns:
        Frame with ``by`` + start_ns, end_ns (ns), disjoint and sorted within each group.
    """
    keys = ["rank", "device"] if "device" in by else ["rank"]
    # each filter copies the columns the subtraction reads only
    comm = act.lazy().filter(pl.col("class") == "comm").select(*dict.fromkeys([*by, "start_ns", "end_ns"]))
    comp = compute if compute is not None else compute_rows(act, keys)
    return intervals.subtract(comm.collect(), comp, by, keys)


def compute_rows(act: pl.DataFrame, keys: list[str] | None = None) -> pl.DataFrame:
    """The compute intervals of activity frame ``act``: its compute rows' ``keys`` (default rank;
    rank and device), start_ns and end_ns (a copy of those columns only)."""
    keys = keys or ["rank"]
    return act.lazy().filter(pl.col("class") == "compute").select(*keys, "start_ns", "end_ns").collect()


def compute_merged(act: pl.DataFrame, keys: list[str] | None = None) -> pl.DataFrame:
    """:func:`compute_rows` of ``act`` merged per rank (``traceprof.engine.intervals.merge``; per
    ``keys``: rank and device): they hide communication as every compute row does, and a
    subtraction of them merges far fewer rows (a caller that subtracts the compute several times
    merges it once)."""
    keys = keys or ["rank"]
    return intervals.merge(compute_rows(act, keys), keys)


def run_measures(
    store: Store, run_id: int, act: pl.DataFrame, by: list[str], *, hta: bool = False
) -> pl.DataFrame:
    """:func:`traceprof.engine.intervals.class_measures` of ``act`` grouped by ``by``, where ``act``
    is the run's whole :func:`activity` frame (``hta`` as asked for; any columns that hold ``by``,
    class, start_ns and end_ns; no row filtered out).

    In a session that runs many analyses (the report) the measures are computed once per (run,
    ``hta``, ``by``) from the session's one activity frame, whose rows ``act`` selects columns of:
    temporal and overlap ask for the same two groupings (per rank, per rank and step). Elsewhere
    they are ``act``'s, computed for the caller.

    Args:
        store: An open store.
        run_id: The run ``act`` is the activity of.
        act: ``activity(store, run_id, hta=hta, columns=...)`` as the caller read it.
        by: Group columns, starting with ``"rank"``.
        hta: Whether ``act`` was selected as HTA 0.5.0 does.

    Returns:
        The frame of :func:`traceprof.engine.intervals.class_measures` (``by``, first_ns, last_ns,
        window_ns, busy_ns, compute_ns, comm_ns, overlap_ns; ns), sorted by ``by``.

    Raises:
        ValueError: ``by`` does not start with ``"rank"``.
    """
    if reusing(store):
        return _measures(store, run_id, tuple(by), hta=hta)
    return intervals.class_measures(act, by)


@shared
def _measures(store: Store, run_id: int, by: tuple[str, ...], *, hta: bool) -> pl.DataFrame:
    """:func:`run_measures` in a session that runs many analyses: its activity frame's columns (no copy)."""
    cols = tuple(dict.fromkeys(("rank", "class", "start_ns", "end_ns", "step", *by)))
    return intervals.class_measures(activity(store, run_id, hta=hta, columns=cols), list(by))


def multi_device_ranks(act: pl.DataFrame) -> list[int]:
    """Ranks whose GPU activity spans several devices (``act`` from :func:`activity`)."""
    gpu = pl.col("device_kind") == "gpu"
    n = intervals.by_rank_chunks(  # no copy of the rows: each rank's GPU devices counted in place
        act.select("rank", "device_kind", "device"),
        ["rank"],
        lambda p: p.group_by("rank").agg(pl.col("device").filter(gpu).n_unique().alias("n")),
    )
    return sorted(n.filter(pl.col("n") > 1)["rank"].to_list())
