"""Collective matching across ranks: which rows of ``collectives`` are the same collective.

DESIGN.md §2 "Collective matching". Matching never mixes sources (a Kineto row is never matched
with a Flight Recorder row of another rank), and it is recomputed for the whole run whenever the
run gains traces.

Algorithm:
  1. Rows that know their process group and sequence number (Kineto ``Process Group Name`` +
     ``Seq``, Flight Recorder ``collective_seq_id``, NDTimeline groups) match on
     (source, pg, seq): method ``pg_seq``.
  2. Other rows (old Kineto traces, gloo annotations) match by ordinal: on every rank, the k-th
     collective of the same op and size on the same group within the same step (or within the
     trace when steps are unknown) is the same instance: method ``ordinal``. Ordinals follow each
     rank's arrival order. Point-to-point ops (send, recv, send_recv; :data:`P2P_OPS`) without a
     process group and sequence number are left unmatched (``instance_id`` null): each involves
     one unknown peer, so the k-th one on two ranks is in general not the same transfer (on
     ``hta/trace_filter``, ranks 0 and 1 of a 128-rank job, the ordinal pairs ended up to 116 ms
     before the "other side" started).
  3. Instance ids are numbered 1.. in order of first arrival; ``collective_instances`` gets one row
     per instance with the ranks present and missing (the ranks seen in that source and group
     anywhere in the run) and arrival / end statistics (recomputed by :func:`refresh_instances`
     after clock alignment).

Arrival of a rank at a collective (:data:`ARRIVAL_SQL`): the start of the NCCL kernel on GPU
traces (the GPU reaches the collective), otherwise the CPU enqueue (``enter_ns``: gloo's c10d op,
Flight Recorder ``time_created_ns``), falling back to the start of the work.
"""

from __future__ import annotations

from dataclasses import dataclass

from traceprof.store import Store

__all__ = ["ARRIVAL_SQL", "P2P_OPS", "MatchSummary", "match_run", "refresh_instances", "preferred_source",
           "unmatched_p2p"]

#: SQL expression (over a collectives row) for the time a rank arrives at the collective.
ARRIVAL_SQL = "CASE WHEN source = 'nccl_kernel' THEN start_ns ELSE coalesce(enter_ns, start_ns) END"

#: Point-to-point ops (``traceprof.ops`` names): one peer each, never matched by ordinal.
P2P_OPS = ("send", "recv", "send_recv", "send_coalesced", "recv_coalesced", "send_recv_coalesced")
_P2P_SQL = "(" + ", ".join(f"'{op}'" for op in P2P_OPS) + ")"


@dataclass(frozen=True)
class MatchSummary:
    """What matching found in a run.

    Attributes:
        rows: Collectives rows of the run.
        instances: Instances (one per matched collective across ranks).
        by_method: Instances per method (``pg_seq``, ``ordinal``).
        incomplete: Instances that miss at least one rank of their group.
        unmatched_p2p: Point-to-point rows left unmatched (no process group and sequence number).
    """

    rows: int
    instances: int
    by_method: dict[str, int]
    incomplete: int
    unmatched_p2p: int = 0


_ASSIGN = f"""
WITH c AS (
  SELECT rowid AS rid, rank, source, pg, seq, op, step,
         coalesce(bytes_in, nelems_in) AS size, {ARRIVAL_SQL} AS arrival_ns, start_ns
  FROM collectives WHERE run_id = $run
    AND NOT (coalesce(op, '') IN {_P2P_SQL} AND (pg IS NULL OR seq IS NULL))
),
k AS (
  SELECT rid, arrival_ns,
         CASE WHEN pg IS NOT NULL AND seq IS NOT NULL THEN 'pg_seq' ELSE 'ordinal' END AS method,
         CASE WHEN pg IS NOT NULL AND seq IS NOT NULL
              THEN concat_ws('|', source, pg, seq)
              ELSE concat_ws('|', source, coalesce(pg, ''), op, coalesce(size::VARCHAR, '?'),
                             coalesce(step::VARCHAR, '-'),
                             row_number() OVER (PARTITION BY rank, source, pg, op, size, step
                                                ORDER BY arrival_ns, start_ns) - 1)
         END AS key
  FROM c
),
firsts AS (
  SELECT key, min(arrival_ns) AS first_arrival FROM k GROUP BY key
),
ids AS (
  SELECT key, row_number() OVER (ORDER BY first_arrival NULLS LAST, key) AS instance_id FROM firsts
)
SELECT k.rid, ids.instance_id, k.method FROM k JOIN ids USING (key)
"""

_INSTANCES = f"""
WITH c AS (
  SELECT rank, source, pg, seq, op, step, ordinal, instance_id, match_method,
         coalesce(bytes_in, nelems_in) AS size, {ARRIVAL_SQL} AS arrival_ns, end_ns
  FROM collectives WHERE run_id = $run AND instance_id IS NOT NULL
),
members AS (
  SELECT source, coalesce(pg, '') AS g, list(DISTINCT rank ORDER BY rank) AS ranks
  FROM c GROUP BY ALL
),
inst AS (
  SELECT instance_id, any_value(source) AS source, any_value(pg) AS pg,
         CASE WHEN any_value(match_method) = 'pg_seq' THEN any_value(seq) END AS seq,
         any_value(op) AS op, mode(step) AS step, max(size) AS bytes,
         list(DISTINCT rank ORDER BY rank) AS ranks_present,
         count(DISTINCT rank)::INTEGER AS n_ranks,
         min(arrival_ns) AS first_arrival_ns, max(arrival_ns) AS last_arrival_ns,
         first(rank ORDER BY arrival_ns DESC NULLS LAST, rank) AS last_rank,
         min(end_ns) AS first_end_ns, max(end_ns) AS last_end_ns,
         any_value(match_method) AS match_method
  FROM c GROUP BY instance_id
)
SELECT $run AS run_id, i.instance_id, i.source, i.pg, i.seq, i.op, i.step, i.bytes,
       (row_number() OVER (PARTITION BY i.source, i.pg, i.op, i.bytes, i.step ORDER BY i.instance_id) - 1)::INTEGER
         AS ordinal,
       i.ranks_present,
       list_filter(m.ranks, lambda x: NOT list_contains(i.ranks_present, x)) AS ranks_missing,
       i.n_ranks, i.first_arrival_ns, i.last_arrival_ns, i.last_rank,
       i.last_arrival_ns - i.first_arrival_ns AS arrival_skew_ns,
       i.first_end_ns, i.last_end_ns, i.match_method
FROM inst i JOIN members m ON m.source = i.source AND m.g = coalesce(i.pg, '')
"""


def match_run(store: Store, run_id: int) -> MatchSummary:
    """Match every collective of a run across ranks (module doc) and fill ``collective_instances``.

    Overwrites ``collectives.instance_id`` / ``match_method`` and the run's instances. Runs on the
    store's connection, so inside the caller's transaction when there is one.

    Args:
        store: A writable store.
        run_id: The run.

    Returns:
        A :class:`MatchSummary`.

    Raises:
        StoreError: DuckDB rejects a statement.
    """
    run = str(int(run_id))
    con = store.con
    con.execute("UPDATE collectives SET instance_id = NULL, match_method = NULL WHERE run_id = ?", [run_id])
    assigned = store.sql(_ASSIGN.replace("$run", run)).to_arrow()
    con.register("_match", assigned)
    con.execute(
        """UPDATE collectives SET instance_id = m.instance_id, match_method = m.method
           FROM _match m WHERE collectives.rowid = m.rid"""
    )
    con.unregister("_match")
    refresh_instances(store, run_id)
    stats = store.sql(
        f"""SELECT match_method, count(*) AS n, count(*) FILTER (WHERE len(ranks_missing) > 0) AS inc
            FROM collective_instances WHERE run_id = {run} GROUP BY ALL"""
    )
    by_method = {r["match_method"]: int(r["n"]) for r in stats.iter_rows(named=True)}
    return MatchSummary(
        rows=assigned.num_rows,
        instances=sum(by_method.values()),
        by_method=by_method,
        incomplete=int(stats["inc"].sum()) if stats.height else 0,
        unmatched_p2p=unmatched_p2p(store, run_id),
    )


def unmatched_p2p(store: Store, run_id: int) -> int:
    """Point-to-point rows of a run that matching left unmatched (module doc, step 2)."""
    return int(store.sql(
        f"""SELECT count(*) AS n FROM collectives
            WHERE run_id = ? AND instance_id IS NULL AND op IN {_P2P_SQL}""", [run_id]).item())


def refresh_instances(store: Store, run_id: int) -> None:
    """Recompute the run's ``collective_instances`` rows from its matched collectives (after
    matching, and again after clock alignment moved the arrivals)."""
    run = str(int(run_id))
    store.con.execute("DELETE FROM collective_instances WHERE run_id = ?", [run_id])
    store.con.execute(f"INSERT INTO collective_instances BY NAME {_INSTANCES.replace('$run', run)}")


def preferred_source(store: Store, run_id: int) -> str | None:
    """The collectives source to analyse when a run has several (e.g. Kineto and Flight Recorder
    rows of the same all-reduces): the one with the most instances seen by two or more ranks,
    preferring sources that know end times. None when the run has no matched instance."""
    df = store.sql(
        """SELECT source, count(*) FILTER (WHERE n_ranks >= 2) AS multi,
                  count(*) FILTER (WHERE n_ranks >= 2 AND last_end_ns IS NOT NULL) AS with_end
           FROM collective_instances WHERE run_id = ? GROUP BY source
           ORDER BY with_end DESC, multi DESC, source""",
        [run_id],
    )
    return None if df.is_empty() else str(df["source"][0])
