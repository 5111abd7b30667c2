"""Put NCCL profiler-plugin times on the clock of their rank's other trace (ingest settle hook).

The plugin's timestamps count from the plugin's start in its process, so before collectives are
matched and clocks aligned across ranks (``traceprof.ingest.clock``, one offset per rank for all its
traces), each plugin trace is moved onto the clock of a Kineto or nsys trace of the same rank.

Algorithm, per plugin trace of rank r (not yet moved: ``traces.meta.clock`` = ``plugin``):
  1. P: its collectives (not point-to-point) in enqueue order; K: rank r's collectives from GPU
     traces (NCCL kernels, ``record_param_comms``) in arrival order (enter, else start).
  2. The shorter list must appear in the longer one as a contiguous run with the same ops (and the
     same element count where both know it): every such placement is a candidate. For each,
     the differences K.arrival - P.enter; the candidate with the smallest spread (max - min) wins,
     offset = the lower median of its differences (integer ns).
  3. Add the offset to the trace's events and collectives; ``traces.meta`` records it
     (``plugin_clock_offset_ns``) and ``clock`` becomes ``aligned_to:<source>``. Without a partner
     trace (a plugin-only run) nothing moves: matched collectives align ranks to each other, the
     lowest rank keeps its plugin clock (a note says so). Two placements fitting about equally well
     (repetitive steps, a short partner window) leave the trace unmoved, with a note.
"""

from __future__ import annotations

from typing import Any

from traceprof.storage.store import Store

__all__ = ["settle"]

_PLUGIN = """
SELECT t.trace_id, t.rank FROM traces t
WHERE t.run_id = ? AND t.source = 'nccl_profiler' AND json_extract_string(t.meta, '$.clock') = 'plugin'
"""
_P = """SELECT op, nelems_in, enter_ns FROM collectives WHERE trace_id = ? AND pg NOT LIKE '%:p2p'
        AND enter_ns IS NOT NULL ORDER BY enter_ns"""
_K = """SELECT op, nelems_in, coalesce(enter_ns, start_ns) AS t, source FROM collectives
        WHERE run_id = ? AND rank = ? AND source IN ('nccl_kernel', 'record_param_comms')
        AND coalesce(enter_ns, start_ns) IS NOT NULL ORDER BY t"""


def _fits(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    return a[0] == b[0] and (a[1] is None or b[1] is None or a[1] == b[1])


def _placements(p: list[tuple[Any, ...]], k: list[tuple[Any, ...]]) -> list[list[int]]:
    """Differences K - P for each placement of the shorter list in the longer (module doc, step 2)."""
    out = []
    short, long_, p_short = (p, k, True) if len(p) <= len(k) else (k, p, False)
    for j in range(len(long_) - len(short) + 1):
        pairs = list(zip(short, long_[j : j + len(short)], strict=True))
        if all(_fits(a, b) for a, b in pairs):
            out.append([(b[2] - a[2]) if p_short else (a[2] - b[2]) for a, b in pairs])
    return out


def settle(store: Store, run_id: int) -> list[str]:
    """Align the run's unaligned plugin traces (module doc). Returns notes for the user."""
    notes: list[str] = []
    con = store.con
    for trace_id, rank in store.con.execute(
        _PLUGIN, [run_id]
    ).fetchall():  # no polars: every ingest runs this
        p = [tuple(r) for r in store.sql(_P, [trace_id]).iter_rows()]
        krows = store.sql(_K, [run_id, rank])
        k = [tuple(r[:3]) for r in krows.iter_rows()]
        if not k or not p:
            notes.append(
                f"rank {rank}: NCCL profiler-plugin times stay on the plugin's clock (no Kineto or nsys "
                "trace of the rank with collectives to align to)"
            )
            continue
        import statistics  # here, not at the top: every ingest imports this module (13 ms of import)

        cands = sorted((max(d) - min(d), statistics.median_low(d)) for d in _placements(p, k))
        if not cands:
            notes.append(
                f"rank {rank}: NCCL profiler-plugin collectives do not line up with the rank's GPU trace "
                "(different ops or sizes); plugin times not moved"
            )
            continue
        if len(cands) > 1 and cands[1][0] <= 2 * cands[0][0] + 1_000:
            notes.append(
                f"rank {rank}: the GPU trace fits the plugin trace at several places (repetitive steps); "
                "plugin times not moved"
            )
            continue
        d = int(cands[0][1])
        store.shift_events(trace_id, d)
        con.execute(
            """UPDATE collectives SET enter_ns = enter_ns + $d, start_ns = start_ns + $d,
                       end_ns = end_ns + $d WHERE trace_id = $t""",
            {"d": d, "t": trace_id},
        )
        src = krows["source"][0]
        con.execute(
            "UPDATE traces SET meta = json_merge_patch(meta, ?) WHERE trace_id = ?",
            [f'{{"clock": "aligned_to:{src}", "plugin_clock_offset_ns": {d}}}', trace_id],
        )
    return notes
