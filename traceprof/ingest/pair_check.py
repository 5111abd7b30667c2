"""Point-to-point transfers paired by order (``pair_order``), checked against their times and sizes.

``traceprof.ingest.matching`` pairs a group's sends and recvs whose sequence numbers cannot be per
transfer as the k-th transfer from one rank to the other, where both ends hold as many transfers of
that direction. Equal counts do not prove the pairs right: a transfer lost from each end (the
sender's first send and the receiver's fourth recv) leaves the counts equal and shifts every pair
between them. After clock alignment (``traceprof.ingest.clock``, whose estimate reads no
point-to-point row, so this check cannot change it), each pair is checked:

  1. Time: a recv cannot end before its send started. A pair fails when the recv's end precedes the
     send's start by more than the clocks' uncertainty, the rule by which alignment leaves an offset
     unapplied: max(:data:`~traceprof.ingest.clock.MIN_OFFSET_NS`, 2 x the larger of the two ranks'
     ``traces.clock_residual_ns``). Checked only where the two ends' clocks are comparable: the same
     host (``traces.host``), or both ranks aligned in one linked set (``runs.clock_aligned`` and a
     residual on each); elsewhere the clocks may differ by milliseconds and only sizes are checked.
  2. Size: both ends move one message: the send's and the recv's ``bytes_in`` must agree where both
     are known, else their ``nelems_in``.

A direction (source, group, sender, receiver) with any failing pair is left unmatched
(``instance_id`` and ``match_method`` NULL on all its rows), with a note naming the direction, its
counts, the first failing pair and the check it fails (a failing pair shows that the k-th transfer of
each end is not one transfer, not why: a transfer missing from each end, or for time clocks further
apart than measured); the run's instances are renumbered 1.. in their order and
``collective_instances`` recomputed. One join on instance id and one sort of the ``pair_order`` rows.
"""

from __future__ import annotations

from traceprof.ingest.clock import MIN_OFFSET_NS
from traceprof.ingest.matching import refresh_instances
from traceprof.storage.store import Store

__all__ = ["check_pair_order"]

#: Each ``pair_order`` pair of the run ($1) with its direction, its place k in the direction (by the
#: send's sequence number, as matching numbers them), both ends' times and sizes, the tolerance and
#: why it fails (``why``: time, bytes, elements; NULL when it fits).
_PAIRS = f"""
WITH t AS (SELECT trace_id, host, clock_residual_ns AS res FROM traces WHERE run_id = $1),
p AS (
  SELECT c.instance_id, c.source, c.pg, c.pg_ranks, c.rank, c.op, c.seq, c.start_ns, c.end_ns, c.bytes_in,
         c.nelems_in, t.host, t.res
  FROM collectives c JOIN t USING (trace_id)
  WHERE c.run_id = $1 AND c.match_method = 'pair_order' AND c.op IN ('send', 'recv')
),
pairs AS (
  SELECT s.source, s.pg, s.pg_ranks, s.rank AS src, r.rank AS dst, s.seq AS s_seq, r.seq AS r_seq,
         s.start_ns - r.end_ns AS early_ns, s.bytes_in AS s_bytes, r.bytes_in AS r_bytes,
         s.nelems_in AS s_n, r.nelems_in AS r_n,
         coalesce(s.host = r.host, false)
           OR ((SELECT clock_aligned FROM runs WHERE run_id = $1) AND s.res IS NOT NULL AND r.res IS NOT NULL)
           AS comparable,
         greatest({MIN_OFFSET_NS}, 2 * greatest(coalesce(s.res, 0), coalesce(r.res, 0))) AS tol_ns,
         row_number() OVER (PARTITION BY s.source, s.pg, s.pg_ranks, s.rank, r.rank
                            ORDER BY s.seq, s.start_ns, s.instance_id) AS k,
         count(*) OVER (PARTITION BY s.source, s.pg, s.pg_ranks, s.rank, r.rank) AS n
  FROM p s JOIN p r ON r.instance_id = s.instance_id AND s.op = 'send' AND r.op = 'recv'
)
SELECT *, CASE WHEN comparable AND early_ns > tol_ns THEN 'time'
               WHEN s_bytes IS NOT NULL AND r_bytes IS NOT NULL AND s_bytes <> r_bytes THEN 'bytes'
               WHEN (s_bytes IS NULL OR r_bytes IS NULL) AND s_n IS NOT NULL AND r_n IS NOT NULL AND s_n <> r_n
                 THEN 'elements' END AS why
FROM pairs
"""

#: The first failing pair of each direction with one (columns of :data:`_PAIRS`).
_FIRST_BAD = f"""
SELECT * FROM ({_PAIRS}) WHERE why IS NOT NULL
QUALIFY k = min(k) OVER (PARTITION BY source, pg, pg_ranks, src, dst)
ORDER BY source, pg, pg_ranks, src, dst
"""

#: Unmatch the rows of the failing directions ($2: a list of (source, pg, pg_ranks, src, dst) as text).
_UNMATCH = """
UPDATE collectives SET instance_id = NULL, match_method = NULL
WHERE run_id = $1 AND match_method = 'pair_order' AND list_contains($2, concat_ws('|', source, coalesce(pg, ''),
  coalesce(pg_ranks, ''), CAST(CASE WHEN op = 'send' THEN rank ELSE peer END AS VARCHAR),
  CAST(CASE WHEN op = 'send' THEN peer ELSE rank END AS VARCHAR)))
"""

#: Instance ids 1.. again, in their order (matching numbers them by first arrival).
_RENUMBER = """
UPDATE collectives SET instance_id = m.new
FROM (SELECT instance_id AS old, row_number() OVER (ORDER BY instance_id) AS new
      FROM (SELECT DISTINCT instance_id FROM collectives WHERE run_id = $1 AND instance_id IS NOT NULL)) m
WHERE collectives.run_id = $1 AND collectives.instance_id = m.old AND m.old <> m.new
"""


def _us(ns: int) -> str:
    return f"{ns / 1000:,.3f} us"


def check_pair_order(store: Store, run_id: int) -> list[str]:
    """Leave unmatched each ``pair_order`` direction of the run with a pair whose times or sizes
    cannot be one transfer's (module doc). Call after clock alignment.

    Reads ``collectives`` (match_method, instance_id, rank, peer, op, seq, start_ns, end_ns,
    bytes_in, nelems_in), ``traces`` (host, clock_residual_ns) and ``runs.clock_aligned``.

    Args:
        store: A writable store whose run is matched and aligned.
        run_id: The run.

    Returns:
        One note per direction left unmatched (empty when every pair fits).

    Raises:
        StoreError: DuckDB rejects a statement.
    """
    con = store.con
    bad = con.execute(_FIRST_BAD, [run_id]).fetchall()
    cols = [d[0] for d in con.description or ()]
    if not bad:
        return []
    notes, keys = [], []
    for row in bad:
        b = dict(zip(cols, row, strict=True))
        keys.append(
            "|".join(
                str(b[c] if b[c] is not None else "") for c in ("source", "pg", "pg_ranks", "src", "dst")
            )
        )
        a, r, k, n = b["src"], b["dst"], b["k"], b["n"]
        send, recv = (
            f"rank {a}'s send #{k} (p2p Seq {b['s_seq']})",
            f"rank {r}'s recv #{k} (p2p Seq {b['r_seq']})",
        )
        if b["why"] == "time":
            check = (
                f"the time check fails: {recv} ended {_us(b['early_ns'])} before {send} started (more than "
                f"the clocks' uncertainty, {_us(b['tol_ns'])}), and a recv cannot end before its send starts"
            )
            causes = "a transfer missing from each end's trace, or clocks further apart than measured"
        else:
            what = "bytes" if b["why"] == "bytes" else "elements"
            s_v, r_v = (b["s_bytes"], b["r_bytes"]) if what == "bytes" else (b["s_n"], b["r_n"])
            check = (
                f"the size check fails: {send} moves {s_v:,} {what}, {recv} {r_v:,}, and both ends of one "
                "transfer move one message"
            )
            causes = "a transfer missing from each end's trace"
        group = f"process group {b['pg'] or ''!r}{' ' + b['pg_ranks'] if b['pg_ranks'] else ''}"
        notes.append(
            f"source {b['source']}, {group} (point-to-point): rank {a} sent {n} transfer{'s' if n > 1 else ''} "
            f"to rank {r}, which received {n}, but paired by order {check}: the k-th of each end is not one "
            f"transfer (pairs shift by {causes}); this direction was left unmatched"
        )
    con.execute(_UNMATCH, [run_id, keys])
    con.execute(_RENUMBER, [run_id])
    refresh_instances(store, run_id)
    return notes
