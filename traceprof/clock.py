"""Clock alignment: per-rank offsets estimated from matched collectives (DESIGN.md §2).

A collective cannot complete on any rank before the last rank entered it, and a synchronous
collective completes at nearly the same moment on every rank; the end a rank records is that
moment, on its clock, plus a delay that is never negative (the process was descheduled, the
profiler recorded late). So, as NTP's minimum-delay filter does, the estimate trusts the
instances where a rank recorded its end promptly: a low quantile of its end minus the instance's
earliest end, rather than a mean or median that the delays bias. Offsets are relative to the
lowest rank and applied only when robustly non-zero, so that ranks sharing one clock (all ranks of
one host, e.g. the CPU samples) are never shifted by noise.

Algorithm (on the timestamps as recorded, i.e. with any earlier offset removed):
  1. Take every matched instance (all sources) with an end time on two or more ranks, except
     point-to-point send/recv (a send may complete before its receive does).
  2. Fixed point: offset_r starts at 0; repeat until no offset moves by more than 1 ns (at most
     100 rounds): corrected end = end + offset_r; first_k = earliest corrected end of instance k;
     offset_r -= the 10th percentile (nearest rank) over r's instances of (corrected end -
     first_k). The 10th percentile ignores one early outlier in ten. The fixed point is
     shift-equivariant: adding d to every timestamp of one rank changes its offset by exactly -d.
  3. Reference: offsets are made relative to the lowest rank with an estimate.
  4. Residual of rank r (``traces.clock_residual_ns``): median over its instances of (corrected
     end - first_k), the typical end-time spread left after alignment. Standard error of its
     offset, taken conservatively as that of a median: se_r = 1.2533 * 1.4826 * residual_r /
     sqrt(n_r).
  5. Apply offset_r only when |offset_r| >= max(``min_offset_ns``, 4 * sqrt(se_r^2 + se_ref^2),
     2 * max(residual_r, residual_ref)); otherwise the rank keeps its clock (offset 0). The last
     term keeps ranks that systematically finish collectives a little later (ring position,
     topology), which end times alone cannot tell from a clock offset, from being shifted. Every trace of the rank (all its sources) gets
     the offset, added to events, steps and collectives; ``traces.clock_offset_ns`` records it.

``runs.clock_aligned`` is true when offsets could be estimated (two or more ranks share an
instance with end times), even if none was large enough to apply; false when alignment is
disabled or impossible (e.g. gloo Flight Recorder dumps, which record no end times).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from traceprof.matching import refresh_instances
from traceprof.store import Store

__all__ = ["ClockResult", "align_run", "estimate_offsets", "MIN_OFFSET_NS"]

#: Offsets smaller than this are never applied (ns).
MIN_OFFSET_NS = 50_000
_MAD_TO_SE = 1.2533 * 1.4826
_CONFIDENCE = 4.0
_LOW_QUANTILE = 0.1


@dataclass(frozen=True)
class ClockResult:
    """Per-rank clock estimates of one run.

    Attributes:
        aligned: Whether offsets could be estimated (see the module doc).
        estimates: Frame rank, instances (count), estimate_ns, residual_ns, se_ns, threshold_ns,
            offset_ns (applied; 0 when not robustly non-zero), all ns.
        notes: Human-readable remarks (why nothing was estimated, which ranks moved).
    """

    aligned: bool
    estimates: pl.DataFrame
    notes: tuple[str, ...] = field(default=())


_ENDS = """
SELECT c.instance_id, c.rank, median(c.end_ns - t.clock_offset_ns) AS end_ns
FROM collectives c JOIN traces t USING (trace_id)
WHERE c.run_id = ? AND c.instance_id IS NOT NULL AND c.end_ns IS NOT NULL
  AND c.op NOT IN ('send', 'recv', 'send_recv')
GROUP BY ALL
"""


def _deviations(frame: pl.DataFrame, corr: np.ndarray) -> np.ndarray:
    """Corrected end minus the earliest corrected end of the same instance (frame column ``i``)."""
    first = frame.with_columns(pl.Series("c", corr)).select(pl.col("c").min().over("i"))["c"].to_numpy()
    return corr - first


def estimate_offsets(ends: pl.DataFrame, min_offset_ns: int = MIN_OFFSET_NS) -> pl.DataFrame:
    """Estimate per-rank offsets from matched end times (module doc, steps 2 to 5).

    Args:
        ends: Columns instance_id, rank, end_ns (one row per rank and instance, raw clocks).
        min_offset_ns: Smallest offset ever applied.

    Returns:
        Frame rank, instances, estimate_ns, residual_ns, se_ns, threshold_ns, offset_ns (int ns);
        empty when no instance has two or more ranks.
    """
    multi = ends.filter(pl.len().over("instance_id") >= 2)
    if multi.is_empty():
        return pl.DataFrame()
    ranks = np.sort(multi["rank"].unique().to_numpy())
    r_idx = np.searchsorted(ranks, multi["rank"].to_numpy())
    inst = multi["instance_id"].to_numpy()
    raw = multi["end_ns"].to_numpy().astype(np.int64)
    end = (raw - int(np.median(raw))).astype(np.float64)  # subtract in int64: float64 is exact below 2**53 ns
    off = np.zeros(len(ranks))
    frame = pl.DataFrame({"i": inst, "r": r_idx})
    for _ in range(100):
        dev = _deviations(frame, end + off[r_idx])
        step = pl.DataFrame({"r": r_idx, "d": dev}).group_by("r").agg(
            pl.col("d").quantile(_LOW_QUANTILE, interpolation="nearest")).sort("r")
        delta = np.zeros(len(ranks))
        delta[step["r"].to_numpy()] = step["d"].to_numpy()
        off -= delta
        if np.abs(delta).max() < 1.0:
            break
    dev = _deviations(frame, end + off[r_idx])
    stats = (
        pl.DataFrame({"r": r_idx, "d": np.abs(dev)})
        .group_by("r").agg(pl.len().alias("n"), pl.col("d").median().alias("res")).sort("r")
    )
    n = stats["n"].to_numpy()
    res = stats["res"].to_numpy()
    se = _MAD_TO_SE * res / np.sqrt(n)
    est = off - off[0]
    thr = np.maximum.reduce([np.full(len(ranks), float(min_offset_ns)), _CONFIDENCE * np.sqrt(se**2 + se[0] ** 2),
                             2.0 * np.maximum(res, res[0])])
    thr[0] = math.inf
    applied = np.where(np.abs(est) >= thr, est, 0.0)
    return pl.DataFrame(
        {
            "rank": ranks.astype(np.int32),
            "instances": n.astype(np.int64),
            "estimate_ns": np.round(est).astype(np.int64),
            "residual_ns": np.round(res).astype(np.int64),
            "se_ns": np.round(se).astype(np.int64),
            "threshold_ns": np.where(np.isinf(thr), -1, np.round(np.minimum(thr, 2**62))).astype(np.int64),
            "offset_ns": np.round(applied).astype(np.int64),
        }
    )


def align_run(store: Store, run_id: int, *, enabled: bool = True, min_offset_ns: int = MIN_OFFSET_NS) -> ClockResult:
    """Estimate and apply clock offsets for every rank of a run (module doc).

    Idempotent: timestamps are re-derived from the recorded ones, so re-running (when the run gains
    ranks) replaces earlier offsets. With ``enabled=False`` earlier offsets are undone and
    ``runs.clock_aligned`` is set false. Runs on the store's connection (inside the caller's
    transaction when there is one), and refreshes ``collective_instances`` arrivals.

    Args:
        store: A writable store whose run is already matched (``traceprof.matching``).
        run_id: The run.
        enabled: Estimate and apply offsets; False restores the recorded timestamps.
        min_offset_ns: Smallest offset ever applied.

    Returns:
        A :class:`ClockResult`.

    Raises:
        StoreError: DuckDB rejects a statement.
    """
    notes: list[str] = []
    est = pl.DataFrame()
    if enabled:
        est = estimate_offsets(store.sql(_ENDS, [run_id]), min_offset_ns)
        if est.is_empty():
            notes.append("clocks not aligned: no matched collective has end times on two or more ranks")
    aligned = not est.is_empty()
    offsets = dict(zip(est["rank"].to_list(), est["offset_ns"].to_list(), strict=True)) if aligned else {}
    residuals = dict(zip(est["rank"].to_list(), est["residual_ns"].to_list(), strict=True)) if aligned else {}
    traces = store.sql("SELECT trace_id, rank, clock_offset_ns FROM traces WHERE run_id = ?", [run_id])
    con = store.con
    for trace_id, rank, old in traces.iter_rows():
        new = int(offsets.get(rank, 0))
        delta = new - int(old or 0)
        if delta:
            con.execute("UPDATE events SET ts_ns = ts_ns + ? WHERE trace_id = ?", [delta, trace_id])
            con.execute(
                """UPDATE steps SET cpu_start_ns = cpu_start_ns + $d, cpu_end_ns = cpu_end_ns + $d,
                     device_start_ns = device_start_ns + $d, device_end_ns = device_end_ns + $d
                   WHERE trace_id = $t""",
                {"d": delta, "t": trace_id},
            )
            con.execute(
                """UPDATE collectives SET enter_ns = enter_ns + $d, start_ns = start_ns + $d,
                     end_ns = end_ns + $d WHERE trace_id = $t""",
                {"d": delta, "t": trace_id},
            )
        con.execute(
            "UPDATE traces SET clock_offset_ns = ?, clock_residual_ns = ? WHERE trace_id = ?",
            [new, residuals.get(rank), trace_id],
        )
    con.execute("UPDATE runs SET clock_aligned = ? WHERE run_id = ?", [aligned, run_id])
    moved = {r: o for r, o in offsets.items() if o}
    if moved:
        notes.append("clock offsets applied (ns): " + ", ".join(f"rank {r}: {o:+,}" for r, o in sorted(moved.items())))
    refresh_instances(store, run_id)
    return ClockResult(aligned=aligned, estimates=est, notes=tuple(notes))
