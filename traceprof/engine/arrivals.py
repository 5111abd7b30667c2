"""Collective arrivals per rank and instance, and the time every analysis leaves out.

One definition of excluded time, used by every analysis alike (``traceprof.engine.activity``'s intervals,
so ``temporal``, ``overlap``, ``gaps``, ``idle``, ``kernels``; ``stragglers`` and ``whatif``
through ``traceprof.analyses._replay``; the summary through them):
  1. Records whose time cannot be right are flagged at ingest (``events.flag``:
     ``traceprof.core.classify.EXCLUDED_FLAGS``: another clock domain, an unset or far-off time, a
     ``B`` never closed) and left out; records kept with a note (``KEPT_FLAGS``: clipped overruns,
     a few us of launch skew, ops still open at profiler stop) count.
  2. The profiler-start transient (:func:`transient`): ranks that start profiling seconds apart
     make the first collectives wait for the last rank; its steps are left out on every rank
     (:func:`excluded_steps`), with a note. HTA-compatible mode (``hta=true``) keeps them, as HTA.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from traceprof.core.errors import UsageError
from traceprof.core.schema import ARRIVAL_FIRST_SQL, ARRIVAL_NEXT_SQL, one_clock_sql
from traceprof.engine.analysis import lasting, shared
from traceprof.ingest.matching import ARRIVAL_SQL, INSTANCE_ARRIVAL_SQL, P2P_OPS, preferred_source, run_steps
from traceprof.storage.runs import run_label
from traceprof.storage.store import Store

__all__ = [
    "comm_items",
    "components",
    "unaligned_instances",
    "unaligned_note",
    "p2p_items",
    "Transient",
    "transient",
    "run_transient",
    "excluded_steps",
    "TRANSIENT_SKEW_FACTOR",
]

#: A leading collective whose arrival skew exceeds this many times the run's median skew (and the
#: median step time) belongs to the profiler-start transient (:func:`transient`).
TRANSIENT_SKEW_FACTOR = 20


@lasting
@shared
def comm_items(store: Store, run_id: int, source: str | None = None) -> tuple[pl.DataFrame, str | None]:
    """One row per rank and matched instance of ``source`` (default: ``matching.preferred_source``).

    Returns:
        (frame, source). Frame columns: instance_id, rank, step, op, pg, bytes, ordinal (the
        instance's ordinal in its step), n_ranks, arrival_ns, end_ns (ns; end may be null),
        start_ns (start of the work, may be null).
    """
    source = source or preferred_source(store, run_id)
    if source is None:
        return pl.DataFrame(), None
    known = store.sql("SELECT DISTINCT source FROM collectives WHERE run_id = ? ORDER BY source", [run_id])[
        "source"
    ]
    if source not in known.to_list():
        raise UsageError(
            f"unknown source {source!r}: {run_label(store, run_id)} has collectives from "
            f"{', '.join(known.to_list()) or 'no source'} (-p source=NAME)"
        )
    # The step holding each row's arrival on its rank's clock: an as-of join on the steps sorted by
    # start (linear after one sort, never collectives x steps), exact when a rank's steps do not
    # overlap; ranks whose steps overlap keep the range join (the lowest step holding the arrival).
    overlapping = bool(
        store.sql(
            """SELECT count(*) FROM (SELECT cpu_start_ns < max(cpu_end_ns) OVER (PARTITION BY rank ORDER BY
               cpu_start_ns, cpu_end_ns ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS o
           FROM steps WHERE run_id = ?) WHERE o""",
            [run_id],
        ).item()
    )
    join = (
        "LEFT JOIN steps s ON s.run_id = c.run_id AND s.rank = c.rank AND c._arr >= s.cpu_start_ns "
        "AND c._arr < s.cpu_end_ns"
        if overlapping
        else "ASOF LEFT JOIN (SELECT rank, step, cpu_start_ns, cpu_end_ns FROM steps WHERE run_id = $1) s "
        "ON s.rank = c.rank AND c._arr >= s.cpu_start_ns"
    )
    df = store.sql(
        f"""WITH c AS (SELECT c.run_id, c.instance_id, c.rank, c.end_ns, c.start_ns, {INSTANCE_ARRIVAL_SQL} AS _arr
                       FROM collectives c WHERE c.run_id = $1 AND c.source = $2)
            SELECT c.instance_id, c.rank, any_value(i.step) AS step, any_value(i.op) AS op,
                   any_value(i.pg) AS pg, any_value(i.bytes) AS bytes, any_value(i.ordinal) AS ordinal,
                   any_value(i.n_ranks) AS n_ranks, min(c._arr) AS arrival_ns,
                   max(c.end_ns) AS end_ns, min(c.start_ns) AS start_ns,
                   min(CASE WHEN c._arr < s.cpu_end_ns THEN s.step END) AS _own_step
            FROM c JOIN collective_instances i ON i.run_id = c.run_id AND i.instance_id = c.instance_id
            {join}
            GROUP BY c.instance_id, c.rank""",
        [run_id, source],
    )
    # Instances of a source without steps (Flight Recorder) lie in the step whose window holds
    # their arrival on each rank's clock (the most common over the instance's ranks).
    own = run_steps(store, run_id, df.select("rank", pl.col("_own_step").alias("step")))["step"]
    df = df.with_columns(own.alias("_own_step")).with_columns(
        pl.coalesce("step", pl.col("_own_step").drop_nulls().mode().min().over("instance_id")).alias("step")
    )
    # instances across clock sets that could not be aligned to each other have no measurable
    # arrivals (:func:`unaligned_instances`)
    cut = unaligned_instances(store, run_id)
    if cut:
        df = df.filter(~pl.col("instance_id").is_in(list(cut)))
    # SQL's GROUP BY returns rows in any order: sorted, every later tie and float sum is reproducible
    return df.drop("_own_step").sort("instance_id", "rank"), source


#: Per rank: its host and offset, and the collectives (not point-to-point) it ended on with at
#: least one other rank, as the clock estimate reads them (``traceprof.ingest.clock``).
_CLOCK_LINKS = """
WITH e AS (SELECT c.instance_id, c.rank FROM collectives c JOIN traces t USING (trace_id)
           WHERE c.run_id = $1 AND c.instance_id IS NOT NULL AND c.end_ns IS NOT NULL
             AND NOT coalesce(c.p2p, c.op IN ('send', 'recv', 'send_recv'), false)
           GROUP BY ALL),
     k AS (SELECT instance_id FROM e GROUP BY instance_id HAVING count(*) >= 2)
SELECT instance_id, rank FROM e SEMI JOIN k USING (instance_id) ORDER BY instance_id, rank
"""


def _clock_sets(store: Store, run_id: int) -> dict[int, int] | None:
    """Each rank's clock set (a representative rank) when the run's clocks were estimated but its
    ranks form several sets not linked to each other (``runs.clock_aligned`` false, some
    ``traces.clock_residual_ns`` set; ``traceprof.ingest.clock``); None otherwise (aligned, or
    alignment off: the clocks are taken as they are). Sets are linked by a collective (not a
    point-to-point op: send and recv need not end together) ended on two or more of their ranks,
    and by a host: ranks on one host with the same offset share a clock."""
    row = store.sql(
        "SELECT r.clock_aligned, bool_or(t.clock_residual_ns IS NOT NULL) FROM runs r "
        "JOIN traces t USING (run_id) WHERE r.run_id = ? GROUP BY ALL",
        [run_id],
    ).rows()
    if not row or row[0][0] or not row[0][1]:
        return None
    ranks = store.sql(
        "SELECT DISTINCT rank, host, clock_offset_ns FROM traces WHERE run_id = ? AND rank IS NOT NULL",
        [run_id],
    ).rows()
    groups: dict[object, list[int]] = {}
    for rank, host, offset in ranks:
        groups.setdefault(
            ("host", host, int(offset or 0)) if host is not None else ("rank", rank), []
        ).append(int(rank))
    for inst, rank in store.sql(_CLOCK_LINKS, [run_id]).rows():
        groups.setdefault(("instance", inst), []).append(int(rank))
    return {r: c[0] for c in components([tuple(g) for g in groups.values()]) for r in c}


def components(groups: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
    """Groups of ranks merged where they share ranks (union-find), each sorted; sorted by first
    rank (the clock sets here, the mesh's linked groups in ``analyses._mesh``)."""
    parent: dict[int, int] = {}

    def find(x: int) -> int:
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for g in groups:
        for r in g[1:]:
            a, b = find(g[0]), find(r)
            if a != b:
                parent[max(a, b)] = min(a, b)
        find(g[0])
    comps: dict[int, list[int]] = {}
    for r in parent:
        comps.setdefault(find(r), []).append(r)
    return sorted(tuple(sorted(c)) for c in comps.values())


def clock_sets(store: Store, run_id: int) -> dict[int, int] | None:
    """Each rank's clock set (a representative rank) when the run's ranks form two or more sets
    whose clocks could not be aligned to each other (:func:`_clock_sets`); None when they are one
    (aligned, alignment off, or a single set). Reads what :func:`_clock_sets` reads."""
    sets = _clock_sets(store, run_id)
    return sets if sets is not None and len(set(sets.values())) > 1 else None


def _across_sets(rows: pl.DataFrame, sets: dict[int, int]) -> pl.Series:
    """The ``instance_id`` values of ``rows`` (instance_id, rank) whose ranks lie in two or more
    clock sets (``sets``: rank -> set)."""
    keyed = rows.select(
        "instance_id", pl.col("rank").replace_strict(sets, default=None, return_dtype=pl.Int64).alias("_set")
    )
    split = keyed.group_by("instance_id").agg(pl.col("_set").n_unique().alias("n")).filter(pl.col("n") > 1)
    return split["instance_id"]


@lasting
@shared
def unaligned_instances(store: Store, run_id: int) -> tuple[int, ...]:
    """Matched instances whose ranks lie in clock sets that could not be aligned to each other
    (:func:`_clock_sets`; e.g. pipeline stages on two hosts linked by send / recv only): their
    arrivals are on different clocks, so skew, waits and lateness between them are not measured.
    :func:`comm_items` leaves them out; empty when the run's clocks are one set. Reads
    ``runs.clock_aligned``, ``traces.{rank, host, clock_offset_ns, clock_residual_ns}``,
    ``collectives.{instance_id, rank, end_ns, p2p, op}``."""
    sets = clock_sets(store, run_id)
    if sets is None:
        return ()
    rows = store.sql(
        "SELECT DISTINCT instance_id, rank FROM collectives WHERE run_id = ? AND instance_id IS NOT NULL",
        [run_id],
    )
    if rows.is_empty():
        return ()
    return tuple(sorted(int(i) for i in _across_sets(rows, sets).to_list()))


def unaligned_note(store: Store, run_id: int) -> str | None:
    """The note on :func:`unaligned_instances` and the point-to-point pairs :func:`p2p_items`
    leaves out for the same reason (None when there are none)."""
    n = len(unaligned_instances(store, run_id)) + _p2p_across_sets(store, run_id)
    if not n:
        return None
    return (
        f"{n} matched collective(s) or transfer(s) join ranks whose clocks could not be aligned to "
        "each other (no collective with end times links their sets: runs.clock_aligned is false; e.g. "
        "pipeline stages on different hosts linked by send / recv only): their arrival skews and waits "
        "are on different clocks, so they are left out"
    )


def p2p_items(
    store: Store, run_id: int, source: str | None = None, *, _all_sets: bool = False
) -> pl.DataFrame:
    """The point-to-point ops that matching left unmatched (no process group and sequence number,
    e.g. gloo's send / recv), paired across ranks, as :func:`comm_items` rows: the one definition of
    a point-to-point wait (``critical_path``'s account, the communication verdict and
    ``parallelism``'s p2p wait read these pairs through ``traceprof.analyses._waits``).

    Algorithm:
      1. Each op's peer (the other end's global rank): ``collectives.peer`` where the source states
         it, else ``pg_ranks[peer_group_rank]``, else, in a group of unknown members (gloo names
         none), ``peer_group_rank`` itself: read as a global rank (the default group) only when
         that holds together over the run (every (src, dst, step) then has as many sends as
         recvs, and no op is its own peer), since a subgroup's ranks would name other ranks.
      2. An op with a peer has (src, dst): a send (own rank, peer), a recv (peer, own rank).
      3. Ops without one: a send's peer is the other rank of its group when the group (source,
         process group, its ranks; the rows without one: the run) has such rows on exactly two
         ranks; groups with more ranks are left unpaired.
      4. Within a step, the k-th send of a (group, src, dst) in arrival order is the k-th recv of
         it (as the transport delivers them): an instance seen by the two ranks, its wait the
         earlier arrival's until the later one's. Ops paired by peer (1) and by the two-rank rule
         (3) are never paired with each other. The pair's two arrivals read one clock
         (``schema.one_clock_sql``: both enqueues, else both starts, else unknown). Where a step's sends of a (group, src, dst) are
         not as many as its recvs (a record lost, or cut at the profiler's stop), order cannot
         tell which goes with which: none of them is paired (their time stays transfer).

    Args:
        source: The collectives source (default: the one with the most unmatched point-to-point
            rows).

      5. A pair whose two ranks lie in clock sets that could not be aligned to each other
         (:func:`clock_sets`) is left out: its arrivals are on different clocks.

    Returns:
        Frame as :func:`comm_items` (n_ranks 2, instance_id negative so that it meets no stored
        instance; ordinal: k), only the pairs found on both ranks; empty when there is none.
    """
    ops = "(" + ", ".join(f"'{op}'" for op in P2P_OPS if op in ("send", "recv")) + ")"
    df = store.sql(
        f"""WITH r AS (
              SELECT source, rank, op, step, coalesce(bytes_in, bytes_out) AS bytes, start_ns, end_ns,
                     {ARRIVAL_SQL} AS arrival_ns, {ARRIVAL_FIRST_SQL} AS arr1, {ARRIVAL_NEXT_SQL} AS arr2,
                     coalesce(regexp_replace(pg, ':p2p$', ''), '') AS g_pg,
                     coalesce(pg_ranks, '') AS g_ranks,
                     coalesce(peer, try_cast(pg_ranks AS INTEGER[])[peer_group_rank + 1]) AS known,
                     peer_group_rank
              FROM collectives
              WHERE run_id = $1 AND instance_id IS NULL AND op IN {ops} AND ($2 IS NULL OR source = $2)),
            src AS (SELECT source FROM r GROUP BY source ORDER BY count(*) DESC, source LIMIT 1),
            r1 AS (SELECT * FROM r WHERE source = (SELECT source FROM src) AND arrival_ns IS NOT NULL),
            gr AS (SELECT step, CASE WHEN op = 'send' THEN rank ELSE peer_group_rank END AS s,
                          CASE WHEN op = 'send' THEN peer_group_rank ELSE rank END AS d,
                          count(*) FILTER (WHERE op = 'send') AS n_send, count(*) FILTER (WHERE op = 'recv') AS n_recv
                   FROM r1 WHERE known IS NULL AND peer_group_rank IS NOT NULL AND g_ranks = '' GROUP BY ALL),
            global_ok AS (SELECT NOT EXISTS (SELECT 1 FROM gr WHERE n_send <> n_recv OR s = d) AS ok),
            r2 AS (SELECT r1.*, coalesce(known, CASE WHEN g_ranks = '' AND (SELECT ok FROM global_ok)
                                                    THEN peer_group_rank END) AS peer_rank
                   FROM r1),
            g AS (SELECT g_pg, g_ranks, min(rank) AS lo, max(rank) AS hi FROM r2 WHERE peer_rank IS NULL
                  GROUP BY ALL HAVING count(DISTINCT rank) = 2),
            o AS (SELECT r2.*, peer_rank IS NOT NULL AS by_peer, coalesce(peer_rank, lo + hi - rank) AS other
                  FROM r2 LEFT JOIN g USING (g_pg, g_ranks) WHERE peer_rank IS NOT NULL OR g.lo IS NOT NULL),
            d AS (SELECT o.*, CASE WHEN op = 'send' THEN rank ELSE other END AS src_rank,
                         CASE WHEN op = 'send' THEN other ELSE rank END AS dst_rank,
                         row_number() OVER (PARTITION BY g_pg, g_ranks, by_peer, rank, op, other, step
                                            ORDER BY arrival_ns, start_ns) AS k
                  FROM o),
            m AS (SELECT d.*, dense_rank() OVER (ORDER BY g_pg, g_ranks, src_rank, dst_rank, by_peer, step, k) AS pair,
                         count(*) OVER (PARTITION BY g_pg, g_ranks, src_rank, dst_rank, by_peer, step, k) AS n,
                         count(*) FILTER (WHERE op = 'send')
                             OVER (PARTITION BY g_pg, g_ranks, src_rank, dst_rank, by_peer, step) AS n_send,
                         count(*) FILTER (WHERE op = 'recv')
                             OVER (PARTITION BY g_pg, g_ranks, src_rank, dst_rank, by_peer, step) AS n_recv
                  FROM d)
            SELECT -pair AS instance_id, rank, step, op, nullif(g_pg, '') AS pg, bytes,
                   CAST(k AS INTEGER) AS ordinal, 2 AS n_ranks,
                   {one_clock_sql("arr1", "arr2", "PARTITION BY pair")} AS arrival_ns, end_ns, start_ns
            FROM m WHERE n = 2 AND n_send = n_recv ORDER BY instance_id, rank""",
        [run_id, source],
    )
    if df.is_empty():
        return df
    # the pair's ranks hold a send and a recv, never two of one kind
    both = pl.col("op").n_unique().over("instance_id") == 2
    df = df.filter(both)
    # a pair across clock sets that could not be aligned to each other has no measurable wait
    # (as :func:`unaligned_instances` for the stored instances)
    sets = None if _all_sets else clock_sets(store, run_id)
    if sets is not None and not df.is_empty():
        df = df.filter(~pl.col("instance_id").is_in(_across_sets(df, sets).to_list()))
    return df


def _p2p_across_sets(store: Store, run_id: int) -> int:
    """How many of the run's point-to-point pairs (:func:`p2p_items`, its default source) join
    clock sets that could not be aligned to each other (0 when the clocks are one set)."""
    sets = clock_sets(store, run_id)
    if sets is None:
        return 0
    pairs = p2p_items(store, run_id, _all_sets=True)
    return len(_across_sets(pairs, sets)) if not pairs.is_empty() else 0


@dataclass(frozen=True)
class Transient:
    """The profiler-start transient of a run (:func:`transient`).

    Attributes:
        instances: Instance ids it holds (the leading instances with an outlying skew).
        steps: Steps those instances belong to (left out of the what-if replay).
        note: What was found and left out, or None when there is no transient.
    """

    instances: tuple[int, ...] = ()
    steps: tuple[int, ...] = ()
    note: str | None = None


def transient(items: pl.DataFrame, store: Store, run_id: int) -> Transient:
    """Detect the profiler-start transient: ranks whose profilers (or processes) start seconds
    apart make the first collectives wait seconds for the last rank, which says nothing about the
    steady state.

    Algorithm: instances seen by two or more ranks, in order of first arrival; skew = last - first
    arrival (ns). Threshold = max(:data:`TRANSIENT_SKEW_FACTOR` x the median skew, the median step
    time of the run's ``steps``; without steps, the median spacing between a rank's consecutive
    arrivals (:func:`_pace_ns`)). The leading run of instances whose skew exceeds it is the
    transient (an outlier later in the run is a real event and stays), but only when the ranks'
    profiling starts (each rank's first step start; its first event when the run has no steps)
    differ by at least half its largest skew: ranks that started profiling together and still
    waited are a real stall (a rank computing 50 ms longer before the first collective), not a
    transient. The factor 20 leaves
    ordinary jitter alone (on the CPU samples the largest skew is under 10x the median), while a
    start transient is seconds against skews of microseconds to milliseconds.

    Args:
        items: :func:`comm_items` frame (instance_id, rank, step, arrival_ns, n_ranks).
        store: The store (for step times).
        run_id: The run.

    Returns:
        A :class:`Transient` (empty when there is none).
    """
    if items.is_empty():
        return Transient()
    inst = (
        items.filter(pl.col("n_ranks") >= 2, pl.col("arrival_ns").is_not_null())
        .group_by("instance_id")
        .agg(
            pl.col("arrival_ns").min().alias("first"),
            (pl.col("arrival_ns").max() - pl.col("arrival_ns").min()).alias("skew"),
            pl.col("step").drop_nulls().mode().min().alias("step"),
        )
        .sort("first", "instance_id")
    )
    if inst.height < 3:
        return Transient()
    med_skew = int(inst["skew"].sort()[(inst.height - 1) // 2])
    step_ns = store.sql(
        "SELECT quantile_disc(cpu_end_ns - cpu_start_ns, 0.5) AS s FROM steps WHERE run_id = ?", [run_id]
    ).item()
    thr = max(TRANSIENT_SKEW_FACTOR * med_skew, int(step_ns or _pace_ns(items)), 1)
    over = (inst["skew"] > thr).to_list()
    k = over.index(False) if False in over else len(over)
    if k == 0 or k == inst.height:
        return Transient()
    lead = inst.head(k)
    worst = int(lead["skew"].max())  # type: ignore[arg-type]
    spread = _start_spread_ns(store, run_id)
    if 2 * spread < worst:
        return Transient()
    steps = tuple(sorted({int(s) for s in lead["step"].drop_nulls().to_list()}))
    where = f"; step{'s' if len(steps) > 1 else ''} {', '.join(map(str, steps))}" if steps else ""
    named = _instance_names(store, run_id, [int(i) for i in lead["instance_id"].head(3).to_list()])
    first = "the first collective to arrive" if k == 1 else f"the first {k} collectives to arrive"
    basis = "step" if step_ns else "spacing of a rank's collectives"
    note = (
        f"profiler-start transient: {first} ({named}{', ...' if k > 3 else ''}{where}) waited up to "
        f"{worst / 1e6:,.1f} ms for the last rank (skew above {thr / 1e6:,.3f} ms = max("
        f"{TRANSIENT_SKEW_FACTOR} x the median skew {med_skew / 1e6:,.3f} ms, the median "
        f"{basis})): ranks started "
        f"profiling {spread / 1e6:,.1f} ms apart; left out of every analysis (not with hta=true)"
    )
    return Transient(tuple(int(i) for i in lead["instance_id"].to_list()), steps, note)


def _pace_ns(items: pl.DataFrame) -> int:
    """The run's pace without steps (ns): the median spacing between a rank's consecutive arrivals
    (the lower median over all ranks' gaps; 0 without two arrivals on a rank). It stands for the
    median step in :func:`transient`'s threshold: with the median skew 0 (half the collectives
    synchronous) and no steps, the threshold would otherwise be 1 ns and any skew at the start a
    "transient"."""
    gaps = (
        items.filter(pl.col("arrival_ns").is_not_null())
        .select("rank", "arrival_ns")
        .unique()
        .sort("rank", "arrival_ns")
        .select(pl.col("arrival_ns").diff().over("rank").alias("gap"))
        .drop_nulls()
        .get_column("gap")
        .sort()
    )
    return int(gaps[(gaps.len() - 1) // 2]) if gaps.len() else 0


def _instance_names(store: Store, run_id: int, ids: list[int]) -> str:
    """The instances ``ids`` by op, process group and sequence number, in the order given
    (``all_reduce pg 0 seq 9``; ``#k`` (its ordinal + 1) when it has no sequence number, no
    ``pg`` when the group is unknown).
    Reads ``collective_instances.{op, pg, seq, ordinal}``."""
    rows = {
        int(r[0]): r[1:]
        for r in store.sql(
            "SELECT instance_id, op, pg, seq, ordinal FROM collective_instances "
            "WHERE run_id = ? AND list_contains(?, instance_id)",
            [run_id, ids],
        ).rows()
    }
    out = []
    for i in ids:
        op, pg, seq, ordinal = rows.get(i, (None, None, None, None))
        group = "" if pg is None else f" pg {pg}"
        out.append(
            f"{op or 'unknown'}{group} {f'seq {seq}' if seq is not None else f'#{(ordinal or 0) + 1}'}"
        )
    return ", ".join(out)


def _start_spread_ns(store: Store, run_id: int) -> int:
    """Latest minus earliest profiling start over the run's ranks (ns): each rank's first step
    start, or its first event when the run has no steps."""
    row = store.sql(
        """WITH s AS (SELECT rank, min(cpu_start_ns) AS t FROM steps WHERE run_id = $1 GROUP BY rank),
                e AS (SELECT rank, min(ts_ns) AS t FROM events WHERE run_id = $1 GROUP BY rank)
           SELECT coalesce(max(t) - min(t), 0) AS spread
           FROM (SELECT * FROM s UNION ALL SELECT * FROM e WHERE NOT EXISTS (SELECT 1 FROM s))""",
        [run_id],
    ).item()
    return int(row or 0)


@lasting
@shared
def run_transient(store: Store, run_id: int) -> Transient:
    """:func:`transient` of the run's collectives of the preferred source (``comm_items``'s default);
    empty when the run has none. Once per run in a session (``traceprof.engine.analysis.shared``)."""
    # A transient needs three instances seen by two or more ranks (:func:`transient`): a run without
    # them (one rank: most single-GPU traces) skips matching arrivals to steps (15 ms on 150 k events)
    many = store.sql(
        "SELECT count(*) FROM collective_instances WHERE run_id = ? AND n_ranks >= 2", [int(run_id)]
    ).item()
    if many < 3:
        return Transient()
    items, _ = comm_items(store, run_id)
    return transient(items, store, run_id)


@lasting
@shared
def excluded_steps(store: Store, run_id: int) -> pl.DataFrame:
    """Each rank's own steps that the profiler-start transient covers, and the end of the last
    (module doc, step 2).

    Returns:
        Frame rank, step (the rank's ProfilerStep number, as ``events.step``), cut_ns (the end of
        the rank's last transient step, ns: rows of the rank that start before it and belong to no
        step are left out too); empty when the run has no transient.
    """
    tr = run_transient(store, run_id)
    empty = pl.DataFrame(schema={"rank": pl.Int32, "step": pl.Int32, "cut_ns": pl.Int64})
    if not tr.steps:
        return empty
    own = store.sql("SELECT rank, step, cpu_end_ns FROM steps WHERE run_id = ?", [run_id])
    if own.is_empty():
        return empty
    mapped = run_steps(store, run_id, own.with_columns(pl.col("step").alias("_own")))
    hit = mapped.filter(pl.col("step").is_in(list(tr.steps)))
    return hit.select(
        pl.col("rank").cast(pl.Int32),
        pl.col("_own").cast(pl.Int32).alias("step"),
        pl.col("cpu_end_ns").max().over("rank").cast(pl.Int64).alias("cut_ns"),
    )
