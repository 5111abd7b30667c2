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
     third of the differences; of all the overlapping shortest windows where several tie, as a
     steady drift ties them all), a modal estimate. Ranks sharing no instance with the reference use
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
            of the modal window), threshold_ns, offset_ns (applied; 0 when not robustly non-zero);
            empty when nothing was estimated (a property over ``estimated``).
        estimated: That frame, or None when nothing was estimated (then polars is not imported: an
            ingest of one rank file imports none).
        notes: Human-readable remarks (why nothing was estimated, which ranks moved).
        warnings: The notes ingest shows as warnings (sets of ranks that cannot be aligned to each
            other), a subset of ``notes``.
    """

    aligned: bool
    estimated: pl.DataFrame | None
    notes: tuple[str, ...] = field(default=())
    warnings: tuple[str, ...] = field(default=())

    @property
    def estimates(self) -> pl.DataFrame:
        """The estimates frame (empty when nothing was estimated)."""
        return pl.DataFrame() if self.estimated is None else self.estimated


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
    (NaN ignored); (nan, nan) when there are none. Shift-equivariant, and integral on integral input.

    Several windows can be the shortest: evenly spread values (a clock drifting steadily over the
    instances: differences 0, 1, 2, 3, 4 us) tie every window, and the first of them would take the
    offset of the first instances only. Tied windows that overlap form one mode, and the centre is the
    integer median of the values of the largest such mode (the first among equals): all of a steady
    drift (its median, also its midrange), one of two separate clusters."""
    x = np.sort(x[~np.isnan(x)])
    n = len(x)
    if n == 0:
        return math.nan, math.nan
    h = max(min(n, 2), math.ceil(n * _MODAL_SHARE))
    width = x[h - 1 :] - x[: n - h + 1]
    i = int(np.argmin(width))
    tied = np.flatnonzero(width == width[i])
    first = np.flatnonzero(np.r_[True, np.diff(tied) >= h])  # each run of overlapping tied windows
    last = np.r_[first[1:], len(tied)] - 1
    j = int(np.argmax(tied[last] - tied[first]))
    lo, hi = int(tied[first[j]]), int(tied[last[j]]) + h
    return _int_median(x[lo:hi]), float(x[i + h - 1] - x[i]) / 2


def _components(a: np.ndarray, b: np.ndarray, n: int) -> np.ndarray:
    """Connected components of ``n`` ranks (codes 0 to n-1) linked by the edges ``a[k]``-``b[k]``:
    the lowest code of each rank's component (a union keeps the lower root, so a set's root is its
    lowest member whatever the order of the edges)."""
    parent = list(range(n))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for u, v in zip(a.tolist(), b.tolist(), strict=True):
        ru, rv = find(u), find(v)
        if ru != rv:
            parent[max(ru, rv)] = min(ru, rv)
    return np.array([find(j) for j in range(n)], dtype=np.int64)


def _starts(key: np.ndarray) -> np.ndarray:
    """Index of the first element of each run of equal values in ``key`` (sorted)."""
    return np.flatnonzero(np.r_[True, key[1:] != key[:-1]]) if len(key) else np.zeros(0, dtype=np.int64)


def _group_int_median(key: np.ndarray, x: np.ndarray, n: int) -> np.ndarray:
    """:func:`_int_median` of the values ``x`` of each key 0..n-1 (NaN for a key without values), by
    one sort: the middle value of an odd run; of an even one the floor of the mean of its two middle
    values, summed as int64 halves (floor(lo/2) + floor(hi/2) + carry, so no sum can overflow)."""
    out = np.full(n, np.nan)
    order = np.lexsort((x, key))
    k, s = key[order], x[order]
    start = _starts(k)
    cnt = np.diff(np.r_[start, len(k)])
    hi = s[start + cnt // 2].astype(np.int64)
    lo = s[start + (cnt - 1) // 2].astype(np.int64)
    out[k[start]] = (lo // 2 + hi // 2 + (lo % 2 + hi % 2) // 2).astype(np.float64)
    return out


def _modal_by(key: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The keys present in ``key`` (sorted) and :func:`_modal` of the values ``x`` of each."""
    order = np.argsort(key, kind="stable")
    keys, first = np.unique(key[order], return_index=True)
    bounds = [*first.tolist(), len(key)]
    xs = x[order]
    centre, half = np.empty(len(keys)), np.empty(len(keys))
    for g in range(len(keys)):
        centre[g], half[g] = _modal(xs[bounds[g] : bounds[g + 1]])
    return keys, centre, half


def _rows_of(order: np.ndarray, ptr: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """The rows of the groups ``ids``, concatenated, from an index by group: group g's rows are
    ``order[ptr[g]:ptr[g + 1]]``."""
    lens = ptr[ids + 1] - ptr[ids]
    total = int(lens.sum())
    first = np.repeat(ptr[ids] - np.cumsum(lens) + lens, lens)
    return order[first + np.arange(total)]


def _fit(inst: np.ndarray, rk: np.ndarray, v: np.ndarray, root: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Offsets and modal half widths of every rank relative to its component's root (module doc,
    step 2), from the rows (instance code ``inst``, rank code ``rk``, end ``v`` in ns from the rank's
    earliest) of the instances with two or more ranks, in long form. Against the root where a rank
    shares instances with it, else, round by round, against the integer median of the already
    estimated ranks' corrected ends on each instance. Every unestimated rank of an instance that
    has an estimated one is estimated in that round, so a round need only read the instances of the
    ranks estimated in the round before: each row is read a bounded number of times, whatever the
    number of rounds (a chain of sub-groups takes as many rounds as links)."""
    n = len(root)
    off = np.full(n, np.nan)
    half = np.full(n, np.inf)
    ref = np.full(int(inst.max()) + 1, np.nan)  # the root's end on each instance (one component each)
    at_root = rk == root[rk]
    ref[inst[at_root]] = v[at_root]
    d = v - ref[inst]
    sel = ~at_root & ~np.isnan(d)
    est, c, w = _modal_by(rk[sel], d[sel])
    off[est], half[est] = -c, w
    off[root], half[root] = 0.0, 0.0
    by_rank = np.argsort(rk, kind="stable")
    rank_ptr = np.searchsorted(rk[by_rank], np.arange(n + 1))
    by_inst = np.argsort(inst, kind="stable")
    inst_ptr = np.searchsorted(inst[by_inst], np.arange(len(ref) + 1))
    new = np.flatnonzero(~np.isnan(off))
    while np.isnan(off).any():
        known = ~np.isnan(off)
        rows = _rows_of(by_inst, inst_ptr, np.unique(inst[_rows_of(by_rank, rank_ptr, new)]))
        open_ = np.zeros(len(ref), dtype=bool)
        open_[inst[rows[~known[rk[rows]]]]] = True
        rows = rows[open_[inst[rows]]]  # instances with both estimated and unestimated ranks
        k, u = rows[known[rk[rows]]], rows[~known[rk[rows]]]
        consensus = _group_int_median(inst[k], v[k] + off[rk[k]], len(ref))
        new, c, w = _modal_by(rk[u], v[u] - consensus[inst[u]])
        if not len(new):  # cannot happen within a component; keep the clock rather than loop
            off[np.isnan(off)] = 0.0
        off[new], half[new] = -c, w
    return off, half


def estimate_offsets(ends: pl.DataFrame, min_offset_ns: int = MIN_OFFSET_NS) -> pl.DataFrame:
    """Estimate per-rank offsets from matched end times (module doc, steps 2 to 4).

    Integer nanoseconds throughout: each rank's ends are taken relative to its own earliest end (an
    int64 subtraction), so every value the estimate handles is an integer below 2**53 and exact in
    float64 even when two ranks' clocks are decades apart (an export on its capture-relative clock
    beside epoch ones), every median is an integer (:func:`_int_median`), and the ranks' bases are
    added back to the offsets in Python integers (an offset is shift-equivariant: adding d to one
    rank's ends changes its offset by exactly -d).

    The ends stay in long form, one row per instance and rank, and are never spread into an
    instances x ranks matrix: with sub-group collectives (tensor- or pipeline-parallel groups, whose
    number grows with ranks) such a matrix grows with ranks squared and is almost all empty. Time is
    n log n and memory linear in the rows.

    Args:
        ends: Columns instance_id, rank, end_ns (int64 ns; one row per rank and instance, raw clocks;
            repeated rows of one rank on one instance count as their earliest).
        min_offset_ns: Smallest offset ever applied (ns).

    Returns:
        Frame rank, component (lowest rank of the ranks linked to it by shared instances: offsets are
        relative to that rank), instances, estimate_ns, residual_ns, spread_ns, threshold_ns (-1 for
        a component's reference), offset_ns (all int64 ns); empty when no instance has two or more ranks.
    """
    multi = ends.filter(pl.len().over("instance_id") >= 2)
    if multi.is_empty():
        return pl.DataFrame()
    rows = (
        multi.group_by("instance_id", "rank")
        .agg(pl.col("end_ns").cast(pl.Int64).min())
        .with_columns(_base=pl.col("end_ns").min().over("rank"))
        .with_columns(
            (pl.col("end_ns") - pl.col("_base")).cast(pl.Float64), _inst=pl.col("instance_id").rank("dense")
        )
        .sort("_inst", "rank")
    )
    ranks, rk = np.unique(rows["rank"].to_numpy().astype(np.int64), return_inverse=True)
    inst = rows["_inst"].to_numpy().astype(np.int64) - 1
    v = rows["end_ns"].to_numpy()
    nr = len(ranks)
    base = np.zeros(nr, dtype=np.int64)
    base[rk] = rows["_base"].to_numpy()
    n = np.bincount(rk, minlength=nr)
    # the instances with two or more ranks: all, unless one rank's rows repeat on an instance
    first = _starts(inst)
    size = np.diff(np.r_[first, len(inst)])
    lead = np.repeat(rk[first], size)  # the lowest rank of each row's instance
    keep = np.repeat(size >= 2, size)
    inst, rk, v, lead = inst[keep], rk[keep], v[keep], lead[keep]
    edges = np.unique(lead[lead != rk] * nr + rk[lead != rk])
    comp = _components(edges // nr, edges % nr, nr)
    off_f, half = (np.zeros(nr), np.zeros(nr)) if not len(inst) else _fit(inst, rk, v, comp)
    corr = v + off_f[rk]
    first = _starts(inst)
    low = np.repeat(np.minimum.reduceat(corr, first), np.diff(np.r_[first, len(inst)])) if len(inst) else corr
    res = _group_int_median(rk, corr - low, nr)
    res[np.isnan(res)] = 0.0  # a rank alone on each of its instances (repeated rows only)
    thr = np.maximum.reduce([np.full(nr, float(min_offset_ns)), 2.0 * half, 2.0 * np.maximum(res, res[comp])])
    thr[comp == np.arange(nr)] = math.inf
    off = [  # back from each rank's own base to the raw clocks, in Python ints: exact at any magnitude
        int(o) - b + base_ref
        for o, b, base_ref in zip(off_f.tolist(), base.tolist(), base[comp].tolist(), strict=True)
    ]
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
    transaction when there is one), and refreshes ``collective_instances`` arrivals when some
    trace's offset changed (else they are as the last :func:`~traceprof.ingest.matching.match_run`
    left them: its instances depend on the collectives' times and the step numbers alone).

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
    est: pl.DataFrame | None = None
    con = store.con
    if enabled:
        # polars only when some instance has end times on two ranks (not for one rank file)
        multi = con.execute(
            f"SELECT 1 FROM ({_ENDS}) GROUP BY instance_id HAVING count(*) >= 2 LIMIT 1", [run_id]
        ).fetchall()
        est = estimate_offsets(store.sql(_ENDS, [run_id]), min_offset_ns) if multi else None
        if est is None or est.is_empty():
            est = None
            notes.append("clocks not aligned: no matched collective has end times on two or more ranks")
    linked = est is not None and est["component"].n_unique() == 1
    offsets = (
        dict(zip(est["rank"].to_list(), est["offset_ns"].to_list(), strict=True)) if est is not None else {}
    )
    residuals = (
        dict(zip(est["rank"].to_list(), est["residual_ns"].to_list(), strict=True)) if est is not None else {}
    )
    traces = con.execute(
        f"SELECT trace_id, rank, clock_offset_ns, {_SYNCED} AS synced FROM traces t WHERE run_id = ?",
        [run_id],
    ).fetchall()
    if all(synced for *_, synced in traces):
        notes.append(
            "clocks already aligned by the source (traces.meta.clock_synced_by_source); nothing estimated"
        )
    # every trace's shift in one statement per table (one per trace scanned the events once each)
    new = {int(t): int(offsets.get(r, 0)) for t, r, _, _ in traces}
    deltas = {int(t): new[int(t)] - int(old or 0) for t, _, old, _ in traces}
    store.shift_traces(
        deltas,
        (
            "steps: cpu_start_ns, cpu_end_ns, device_start_ns, device_end_ns",
            "collectives: enter_ns, start_ns, end_ns",
        ),
    )
    if traces:
        con.execute(
            """UPDATE traces SET clock_offset_ns = s.o, clock_residual_ns = s.r
               FROM (SELECT unnest($t) AS trace_id, unnest($o) AS o, unnest($r) AS r) s
               WHERE traces.trace_id = s.trace_id""",
            {
                "t": list(new),
                "o": list(new.values()),
                "r": [residuals.get(r) for _, r, _, _ in traces],
            },
        )
    con.execute("UPDATE runs SET clock_aligned = ? WHERE run_id = ?", [linked, run_id])
    warn: list[str] = []
    if est is not None and not linked:
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
    if any(deltas.values()):  # the arrivals moved; unmoved, they are as matching left them
        refresh_instances(store, run_id)
    return ClockResult(aligned=linked, estimated=est, notes=tuple(notes), warnings=tuple(warn))
