"""Clock alignment: per-rank offsets estimated from matched collectives (README.md "What traceprof handles").

A collective cannot complete on any rank before the last rank entered it, and a synchronous
collective completes at nearly the same moment on every rank; the end a rank records is that
moment, on its clock, plus a delay that is never negative (the process was descheduled, the
profiler recorded late). So the end times of one instance differ by the ranks' clock offsets plus
delays, and the instances whose ends lie closest together are those nobody was delayed in: as NTP
trusts its minimum-delay samples, the estimate uses those. Offsets are relative to the lowest rank
and applied only when robustly non-zero, so that ranks sharing one clock (all ranks of one host,
e.g. the CPU samples) are never shifted by noise.

Algorithm (on the timestamps as recorded, i.e. with any earlier offset removed):
  1. Take every matched instance (all sources) with an end time on two or more ranks, except
     point-to-point send/recv (a send may complete before its receive does).
  2. Ranks linked by shared instances form components (two replica groups that never
     communicate are two components, and nothing can align one to the other: a note says so).
     In each component, for each rank r, the differences end_r - end_ref over the instances it
     shares with the reference (the component's lowest rank) equal the offset exactly where neither
     was delayed and scatter elsewhere; offset_r = -(median of the shortest window holding a
     third of the differences), a modal estimate. Ranks sharing no instance with the reference use
     the median of the estimated ranks' corrected ends instead of end_ref. Differences only:
     adding d to every timestamp of one rank changes its offset by exactly -d. Integer ns end to
     end: end times are taken per (instance, rank) with ``min`` (a DuckDB ``median`` of BIGINT is a
     DOUBLE, which rounds epoch ns to 256 ns), made relative to the earliest end before any float
     arithmetic, and every median is an integer (the floor of the mean of the two middle values
     for an even count), so a 3 ms offset comes out as exactly -3,000,000 ns.
  3. Residual of rank r (``traces.clock_residual_ns``): integer median over its instances of (corrected
     end - the instance's earliest corrected end), the end-time spread left after alignment.
  4. Apply offset_r only when |offset_r| >= max(``min_offset_ns``, the width of its modal
     window, 2 * max(residual_r, residual_ref)); otherwise the rank keeps its clock (offset 0).
     The last term keeps ranks that systematically finish collectives later (ring position,
     topology), which end times alone cannot tell from a clock offset, from being shifted. Every
     trace of the rank (all its sources) gets the offset, added to events, steps and collectives;
     ``traces.clock_offset_ns`` records it.

Traces whose collector declares ``"clock_synced_by_source": true`` in ``traces.meta`` (NDTimeline
aligns its workers itself, and its compound ops such as optimizer-clip-main-grad do not end
together) are left out of the estimate and never shifted.

``runs.clock_aligned`` is true when offsets could be estimated for every rank against one reference
(the ranks with end times form one linked component), even if none was large enough to apply; false
when alignment is disabled or impossible (e.g. gloo Flight Recorder dumps, which record no end
times), and false when the ranks form several unlinked sets: each set is aligned within itself only,
and the ingest warning says which ranks are aligned to which.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from traceprof.core.lazy import lazy
from traceprof.ingest.matching import refresh_instances
from traceprof.storage.store import Store

if TYPE_CHECKING:
    import numpy as np
    import polars as pl
else:
    np = lazy("numpy")
    pl = lazy("polars")

__all__ = ["ClockResult", "align_run", "estimate_offsets", "MIN_OFFSET_NS"]

#: Offsets smaller than this are never applied (ns).
MIN_OFFSET_NS = 50_000
_MODAL_SHARE = 1 / 3


@dataclass(frozen=True)
class ClockResult:
    """Per-rank clock estimates of one run.

    Attributes:
        aligned: Whether offsets could be estimated for all ranks against one reference (module doc).
        estimates: Frame rank, instances (count), estimate_ns, residual_ns, spread_ns (half width
            of the modal window), threshold_ns, offset_ns (applied; 0 when not robustly non-zero).
        notes: Human-readable remarks (why nothing was estimated, which ranks moved).
        warnings: The notes ingest shows as warnings (sets of ranks that cannot be aligned to each
            other), a subset of ``notes``.
    """

    aligned: bool
    estimates: pl.DataFrame
    notes: tuple[str, ...] = field(default=())
    warnings: tuple[str, ...] = field(default=())


_SYNCED = "coalesce(try_cast(json_extract(t.meta, '$.clock_synced_by_source') AS BOOLEAN), false)"
# Each trace's meta is read once (MATERIALIZED), not on every collective's row (ranks x collectives
# parses of a meta that lists every rank's process groups).
_ENDS = f"""
WITH t AS MATERIALIZED (
    SELECT trace_id, clock_offset_ns, {_SYNCED} AS synced FROM traces t WHERE run_id = $1)
SELECT c.instance_id, c.rank, min(c.end_ns - t.clock_offset_ns) AS end_ns
FROM collectives c JOIN t USING (trace_id)
WHERE c.run_id = $1 AND c.instance_id IS NOT NULL AND c.end_ns IS NOT NULL
  AND NOT coalesce(c.p2p, c.op IN ('send', 'recv', 'send_recv'), false) AND NOT t.synced
GROUP BY ALL
"""


def _int_median(x: np.ndarray) -> float:
    """Median of integral values, still an integer: an even count takes the floor of the mean of
    the two middle values, computed in Python ints (exact at any magnitude)."""
    x = np.sort(x)
    m = len(x) // 2
    return float(int(x[m])) if len(x) % 2 else float((int(x[m - 1]) + int(x[m])) // 2)


def _modal(x: np.ndarray) -> tuple[float, float]:
    """Centre (integer median) and half width of the shortest window holding a third of the values
    (NaN ignored); (nan, nan) when there are none. Shift-equivariant, and integral on integral input."""
    x = np.sort(x[~np.isnan(x)])
    n = len(x)
    if n == 0:
        return math.nan, math.nan
    h = max(min(n, 2), math.ceil(n * _MODAL_SHARE))
    i = int(np.argmin(x[h - 1 :] - x[: n - h + 1]))
    return _int_median(x[i : i + h]), float(x[i + h - 1] - x[i]) / 2


def _components(e: np.ndarray) -> np.ndarray:
    """Connected components of ranks (columns of ``e``) that share an instance (a row where both
    have a value): the lowest column index of each column's component."""
    n = e.shape[1]
    parent = list(range(n))

    def find(a: int) -> int:
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    for row in ~np.isnan(e):
        cols = np.nonzero(row)[0]
        for c in cols[1:]:
            a, b = find(int(cols[0])), find(int(c))
            if a != b:
                parent[max(a, b)] = min(a, b)
    return np.array([find(j) for j in range(n)])


def _row_int_median(x: np.ndarray) -> np.ndarray:
    """Integer median of each row, NaN ignored (NaN for empty rows)."""
    out = np.full(x.shape[0], np.nan)
    for i, row in enumerate(x):
        v = row[~np.isnan(row)]
        if len(v):
            out[i] = _int_median(v)
    return out


def _fit_component(e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Offsets and modal half widths of the columns of one component, relative to its first
    column (module doc, step 2): against the reference where a rank shares instances with it,
    else against the median of the already estimated ranks' corrected ends."""
    n = e.shape[1]
    off = np.full(n, np.nan)
    half = np.full(n, np.inf)
    off[0], half[0] = 0.0, 0.0
    for j in range(1, n):
        c, w = _modal(e[:, j] - e[:, 0])
        if not math.isnan(c):
            off[j], half[j] = -c, w
    while np.isnan(off).any():
        known = ~np.isnan(off)
        consensus = _row_int_median(e[:, known] + off[known])
        progressed = False
        for u in np.nonzero(~known)[0]:
            c, w = _modal(e[:, u] - consensus)
            if not math.isnan(c):
                off[u], half[u], progressed = -c, w, True
        if not progressed:  # cannot happen within a component; keep the clock rather than loop
            off[np.isnan(off)] = 0.0
    return off, half


def estimate_offsets(ends: pl.DataFrame, min_offset_ns: int = MIN_OFFSET_NS) -> pl.DataFrame:
    """Estimate per-rank offsets from matched end times (module doc, steps 2 to 4).

    Integer nanoseconds throughout: each rank's ends are taken relative to its own earliest end (an
    int64 subtraction), so every value the estimate handles is an integer below 2**53 and exact in
    float64 even when two ranks' clocks are decades apart (an export on its capture-relative clock
    beside epoch ones), every median is an integer (:func:`_int_median`), and the ranks' bases are
    added back to the offsets in Python integers (an offset is shift-equivariant: adding d to one
    rank's ends changes its offset by exactly -d).

    Args:
        ends: Columns instance_id, rank, end_ns (int64 ns; one row per rank and instance, raw clocks).
        min_offset_ns: Smallest offset ever applied (ns).

    Returns:
        Frame rank, component (lowest rank of the ranks linked to it by shared instances: offsets are
        relative to that rank), instances, estimate_ns, residual_ns, spread_ns, threshold_ns (-1 for
        a component's reference), offset_ns (all int64 ns); empty when no instance has two or more ranks.
    """
    multi = ends.filter(pl.len().over("instance_id") >= 2)
    if multi.is_empty():
        return pl.DataFrame()
    bases = multi.group_by("rank").agg(pl.col("end_ns").cast(pl.Int64).min().alias("_base"))
    base_of = {int(r): int(b) for r, b in bases.iter_rows()}
    wide = (
        multi.join(bases, on="rank")
        .with_columns((pl.col("end_ns").cast(pl.Int64) - pl.col("_base")).cast(pl.Float64))
        .pivot(on="rank", index="instance_id", values="end_ns", aggregate_function="min", sort_columns=True)
    )
    ranks = np.array(sorted(int(c) for c in wide.columns if c != "instance_id"))
    e = wide.select([str(r) for r in ranks]).to_numpy().astype(np.float64)
    comp = _components(e)
    off: list[int] = [0] * len(ranks)  # Python ints: exact at any magnitude
    half = np.zeros(len(ranks))
    res = np.zeros(len(ranks))
    thr = np.full(len(ranks), math.inf)
    for root in np.unique(comp):
        cols = np.nonzero(comp == root)[0]
        sub = e[:, cols]
        sub = sub[(~np.isnan(sub)).sum(axis=1) >= 2]
        o, h = _fit_component(sub)
        corr = sub + o
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            spread = corr - np.nanmin(corr, axis=1)[:, None]
        r = np.array([_int_median(c[~np.isnan(c)]) for c in spread.T])
        t = np.maximum.reduce([np.full(len(cols), float(min_offset_ns)), 2.0 * h, 2.0 * np.maximum(r, r[0])])
        t[0] = math.inf
        half[cols], res[cols], thr[cols] = h, r, t
        ref = base_of[int(ranks[cols[0]])]
        for k, j in enumerate(cols):  # back from each rank's own base to the raw clocks
            off[j] = int(o[k]) - base_of[int(ranks[j])] + ref
    n = np.sum(~np.isnan(e), axis=0)
    applied = [o if abs(o) >= t else 0 for o, t in zip(off, thr, strict=True)]
    return pl.DataFrame(
        {
            "rank": ranks.astype(np.int32),
            "component": ranks[comp].astype(np.int32),
            "instances": n.astype(np.int64),
            "estimate_ns": pl.Series(off, dtype=pl.Int64),
            "residual_ns": res.astype(np.int64),
            "spread_ns": np.round(np.minimum(half, 2**62)).astype(np.int64),
            "threshold_ns": np.where(np.isinf(thr), -1, np.round(np.minimum(thr, 2**62))).astype(np.int64),
            "offset_ns": pl.Series(applied, dtype=pl.Int64),
        }
    )


def align_run(
    store: Store, run_id: int, *, enabled: bool = True, min_offset_ns: int = MIN_OFFSET_NS
) -> ClockResult:
    """Estimate and apply clock offsets for every rank of a run (module doc).

    Idempotent: timestamps are re-derived from the recorded ones, so re-running (when the run gains
    ranks) replaces earlier offsets. With ``enabled=False`` earlier offsets are undone and
    ``runs.clock_aligned`` is set false. Runs on the store's connection (inside the caller's
    transaction when there is one), and refreshes ``collective_instances`` arrivals.

    Args:
        store: A writable store whose run is already matched (``traceprof.ingest.matching``).
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
    estimated = not est.is_empty()
    linked = estimated and est["component"].n_unique() == 1
    offsets = dict(zip(est["rank"].to_list(), est["offset_ns"].to_list(), strict=True)) if estimated else {}
    residuals = (
        dict(zip(est["rank"].to_list(), est["residual_ns"].to_list(), strict=True)) if estimated else {}
    )
    traces = store.sql(
        f"SELECT trace_id, rank, clock_offset_ns, {_SYNCED} AS synced FROM traces t WHERE run_id = ?",
        [run_id],
    )
    if traces["synced"].all():
        notes.append(
            "clocks already aligned by the source (traces.meta.clock_synced_by_source); nothing estimated"
        )
    con = store.con
    # every trace's shift in one statement per table (one per trace scanned the events once each)
    new = {int(t): int(offsets.get(r, 0)) for t, r, _, _ in traces.iter_rows()}
    store.shift_traces(
        {int(t): new[int(t)] - int(old or 0) for t, _, old, _ in traces.iter_rows()},
        (
            "steps: cpu_start_ns, cpu_end_ns, device_start_ns, device_end_ns",
            "collectives: enter_ns, start_ns, end_ns",
        ),
    )
    if traces.height:
        con.execute(
            """UPDATE traces SET clock_offset_ns = s.o, clock_residual_ns = s.r
               FROM (SELECT unnest($t) AS trace_id, unnest($o) AS o, unnest($r) AS r) s
               WHERE traces.trace_id = s.trace_id""",
            {
                "t": list(new),
                "o": list(new.values()),
                "r": [residuals.get(r) for r in traces["rank"].to_list()],
            },
        )
    con.execute("UPDATE runs SET clock_aligned = ? WHERE run_id = ?", [linked, run_id])
    warn: list[str] = []
    if estimated and not linked:
        parts = est.group_by("component").agg(pl.col("rank").sort()).sort("component")
        groups = "; ".join(
            f"ranks {', '.join(map(str, rs))} (relative to rank {c})" for c, rs in parts.iter_rows()
        )
        warn.append(
            "no collective links these sets of ranks, so their clocks cannot be aligned to each other "
            f"(each set is aligned within itself only; runs.clock_aligned is false): {groups}"
        )
        notes += warn
    moved = {r: o for r, o in offsets.items() if o}
    if moved:
        notes.append(
            "clock offsets applied (ns): " + ", ".join(f"rank {r}: {o:+,}" for r, o in sorted(moved.items()))
        )
    refresh_instances(store, run_id)
    return ClockResult(aligned=linked, estimates=est, notes=tuple(notes), warnings=tuple(warn))
