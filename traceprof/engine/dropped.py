"""Dropped collectives: a traced rank that misses a matched collective inside its own traced window.

A collective instance (``collective_instances``) lists the ranks of its group that hold no row of
it (``ranks_missing``). At the edges of a rank's trace that is expected (its profiler started later
or stopped earlier than a peer's); inside its window it is not: every member of a group enters
every collective of the group, so a rank that skipped one while it was being traced is out of step
with its peers (a desync: in a real job the others wait for it, or it pairs its next collective
with their previous one). That is hard evidence, not timing noise.

Algorithm (linear in the run's instances and steps):
  1. Each rank's traced window: from the first start to the last end of its ProfilerSteps
     (``steps``: CPU or device times, whichever reach further), on the store's aligned clock.
  2. Instances of the run's preferred collectives source
     (:func:`traceprof.ingest.matching.preferred_source`) that come from a continuous trace
     (:data:`TRACED_SOURCES`: Kineto / Nsight Systems rows; not Flight Recorder ring buffers, dumped
     at different moments, nor the sampled NCCL Inspector records, which the ``desync`` analysis
     reads by sequence number), not point-to-point (its two ends are checked by ``pair_check``).
  3. A rank in an instance's ``ranks_missing`` that holds rows of that source in the run, and whose
     window holds the instance's arrivals (first to last), dropped it.
"""

from __future__ import annotations

import polars as pl

from traceprof.core.vocab import CollectiveSource
from traceprof.ingest.matching import preferred_source
from traceprof.storage.store import Store

__all__ = ["METRIC", "TRACED_SOURCES", "dropped", "dropped_text"]

#: The gate's desync metric (``traceprof diff``): the (rank, instance) pairs of :func:`dropped`.
METRIC = "dropped_collectives"

#: Collective sources recorded continuously over a rank's profiled window (module doc, step 2).
TRACED_SOURCES = (CollectiveSource.nccl_kernel, CollectiveSource.gloo, CollectiveSource.record_param_comms)

_SQL = """
WITH win AS (
  SELECT rank, min(least(cpu_start_ns, coalesce(device_start_ns, cpu_start_ns))) AS lo,
         max(greatest(cpu_end_ns, coalesce(device_end_ns, cpu_end_ns))) AS hi
  FROM steps WHERE run_id = $1 GROUP BY rank
),
held AS (SELECT DISTINCT rank FROM collectives WHERE run_id = $1 AND source = $2),
miss AS (
  SELECT instance_id, source, op, pg, step, bytes, first_arrival_ns, last_arrival_ns, unnest(ranks_missing) AS rank
  FROM collective_instances
  WHERE run_id = $1 AND source = $2 AND NOT coalesce(p2p, false)
)
SELECT m.rank, m.instance_id, m.source, m.op, m.pg, m.step, m.bytes, m.first_arrival_ns
FROM miss m JOIN win w USING (rank) JOIN held h USING (rank)
WHERE m.first_arrival_ns >= w.lo AND m.last_arrival_ns <= w.hi
ORDER BY m.rank, m.instance_id
"""


def dropped(store: Store, run_id: int) -> pl.DataFrame:
    """The collectives a traced rank dropped inside its traced window (module doc).

    Returns:
        Frame with one row per (rank, instance): rank, instance_id (``collective_instances``),
        source, op, pg (process group, null when the source names none), step (the instance's
        ProfilerStep), bytes (the instance's size, null when unknown), first_arrival_ns (the first
        rank's arrival, ns on the aligned clock). Empty when the run has no matched instance.

    Reads ``steps`` (cpu/device start and end ns), ``collectives`` (rank, source) and
    ``collective_instances`` (ranks_missing, arrivals, op, pg, step, bytes, p2p, source).
    """
    source = preferred_source(store, run_id)
    if source not in TRACED_SOURCES:
        source = None
    return store.sql(_SQL, [run_id, source])


def dropped_text(frame: pl.DataFrame) -> str:
    """The finding in words, per rank (e.g. ``rank 2 dropped 3 collectives inside its traced window
    (instances 4, 8, 12: all_reduce 557,056 B in steps 4, 5, 6)``); "" for an empty frame."""
    parts = []
    for (rank,), g in frame.group_by("rank", maintain_order=True):
        what = ", ".join(
            f"{op} {'? B' if b is None else f'{b:,} B'}"
            for op, b in dict.fromkeys(zip(g["op"].to_list(), g["bytes"].to_list(), strict=True))
        )
        steps = sorted({s for s in g["step"].to_list() if s is not None})
        n = g.height
        parts.append(
            f"rank {rank} dropped {n} collective{'s' if n > 1 else ''} its peers ran inside its traced window "
            f"(instance{'s' if n > 1 else ''} {', '.join(map(str, g['instance_id'].to_list()))}: {what}"
            + (f"; step{'s' if len(steps) > 1 else ''} {', '.join(map(str, steps))}" if steps else "")
            + ")"
        )
    return "; ".join(parts)
