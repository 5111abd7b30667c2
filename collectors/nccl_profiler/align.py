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
     (repetitive steps, a short partner window) leave the trace unmoved, with a note. Each kind
     of note is said once per run: how many files and ranks, the first files named.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from traceprof.core.text import COUNTED, first_few
from traceprof.storage.store import Store

__all__ = ["settle"]

_PLUGIN = """
SELECT t.trace_id, t.rank, t.path FROM traces t
WHERE t.run_id = ? AND t.source = 'nccl_profiler' AND json_extract_string(t.meta, '$.clock') = 'plugin'
ORDER BY t.rank, t.path
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
    unmoved: dict[str, list[tuple[int, str]]] = {}  # why -> (rank, file) of each trace left unmoved
    con = store.con
    for trace_id, rank, path in store.con.execute(
        _PLUGIN, [run_id]
    ).fetchall():  # no polars: every ingest runs this
        p = [tuple(r) for r in store.sql(_P, [trace_id]).iter_rows()]
        krows = store.sql(_K, [run_id, rank])
        k = [tuple(r[:3]) for r in krows.iter_rows()]
        if not k or not p:
            unmoved.setdefault(_NO_PARTNER, []).append((rank, path))
            continue
        import statistics  # here, not at the top: every ingest imports this module (13 ms of import)

        cands = sorted((max(d) - min(d), statistics.median_low(d)) for d in _placements(p, k))
        if not cands:
            unmoved.setdefault(_NO_FIT, []).append((rank, path))
            continue
        if len(cands) > 1 and cands[1][0] <= 2 * cands[0][0] + 1_000:
            unmoved.setdefault(_AMBIGUOUS, []).append((rank, path))
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
    return [_said(why, held) for why, held in unmoved.items()]


_NO_PARTNER = (
    "stay on the plugin's clock (no Kineto or nsys trace of their rank with collectives to align to)"
)
_NO_FIT = "not moved: their collectives do not line up with their rank's GPU trace (different ops or sizes)"
_AMBIGUOUS = "not moved: their rank's GPU trace fits them at several places (repetitive steps)"


def _said(why: str, held: list[tuple[int, str]]) -> str:
    """One note for the traces left unmoved for one reason: counts and the first 3 files."""
    names = [Path(p).name for _, p in held]
    ranks = sorted({r for r, _ in held if r is not None})
    return f"NCCL profiler-plugin times of {len(held)} file(s) of {len(ranks)} rank(s) {why}: {first_few(names, more=COUNTED)}"
