"""A trace's reference range, and its records that end far past it: one rule for the collectors.

A profiler sometimes records a CPU-side record (an op, an NVTX range, a CUDA API call) with an end
years past the rest of its trace (Kineto ``"dur": 3e15`` us; an nsys ``end`` beyond the capture).
Kept as recorded it stretches every window that reads it to years. Both collectors that record such
spans, Kineto (``traceprof.collectors.kineto.checks``, step 3a) and Nsight Systems
(``traceprof.collectors.nsys.parse``), measure "far" the same way:

  1. The reference range: the rank's ProfilerSteps, else the 1st..99th percentile of its records'
     starts (:func:`reference_range`); for the records flagged apart from the bulk (Kineto's
     ``far_outside``, :func:`far_records`), of the starts of the bulk (:func:`_bulk`).
  2. The margin: the range's own length, at least :data:`FAR_MARGIN_MIN_NS` (1 s).
  3. A record ends far past the range when its end lies more than the margin past the range's end
     (:func:`far_ends`); the collector clips it to the trace's end, the latest end of its other
     sound records, flags it ``overrun`` and keeps its recorded duration in ``raw_dur_ns``, with a
     warning naming it.
  4. GPU rows on a stream (:func:`lane_overruns`, used by both collectors): a row that runs past
     the next one on its (device, stream) ends at its start; the last of a stream that ends far
     past the range ends with the other GPU rows.
  5. Step ranges (:func:`step_overlaps`, both collectors): sorted by start, a step that runs past
     the start of the next one by more than :data:`OVERLAP_TOLERANCE_NS` ends where that one
     starts (overlapping steps claim the same time twice), flagged ``overrun``, with a warning
     (:func:`step_overlap_warning`) naming both.
  Each clip is counted in ``traces.meta.repaired`` (the ``issues`` column of ``traceprof runs``)
  under one reason per kind of repair (:data:`FAR_END_REPAIR`, :data:`GPU_OVERRUN_REPAIR`,
  :data:`STEP_PAST_END_REPAIR`, :data:`STEP_OVERLAP_REPAIR`), the same for both collectors
  (:func:`count_repair`).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from traceprof.core.display import duration
from traceprof.core.text import first_few

__all__ = [
    "FAR_MARGIN_MIN_NS",
    "OVERLAP_TOLERANCE_NS",
    "FAR_END_REPAIR",
    "GPU_OVERRUN_REPAIR",
    "STEP_OVERLAP_REPAIR",
    "STEP_PAST_END_REPAIR",
    "count_repair",
    "Reference",
    "reference_range",
    "far_ends",
    "far_records",
    "far_rule",
    "lane_overruns",
    "step_overlaps",
    "step_overlap_warning",
]

#: The smallest margin around the reference range before a record is "far outside": 1 s.
FAR_MARGIN_MIN_NS = 1_000_000_000

#: Without steps, a gap between bursts of records leaves the smaller side out of the trace's bulk
#: only when it is this many times longer than all the rest of the trace together (and > 1 s).
BULK_GAP_RATIO = 100

#: How far a GPU row may run into the next one on its stream before it is an overrun: 5 us
#: (programmatic dependent launch overlaps that much); both collectors' GPU lanes and Kineto's steps.
OVERLAP_TOLERANCE_NS = 5_000

#: The reason a clipped overlapping step is counted under in ``traces.meta.repaired``.
STEP_OVERLAP_REPAIR = "step ran past the next step's start: clipped to it"


#: Reasons a clipped record is counted under in ``traces.meta.repaired`` (module doc).
FAR_END_REPAIR = "record ended far past the trace: clipped to its end"
GPU_OVERRUN_REPAIR = "GPU record ran past the next on its stream: clipped"
STEP_PAST_END_REPAIR = "step ran past the end of the trace: clipped to it"


def count_repair(repaired: dict[str, int] | None, reason: str, n: int) -> None:
    """Add ``n`` records repaired for ``reason`` to ``repaired`` (reason -> records, for
    ``traces.meta.repaired``); nothing when it is None or ``n`` is 0."""
    if repaired is not None and n:
        repaired[reason] = repaired.get(reason, 0) + n


class Reference(NamedTuple):
    """A rank's reference range (:func:`reference_range`).

    Attributes:
        lo: Its start, ns.
        hi: Its end, ns.
        by_steps: Whether the rank's ProfilerSteps defined it.
        bulk: Without steps, with a bulk pool: the first and the last start of the bulk, ns
            (:func:`_bulk`), for :func:`far_records`; None otherwise (then nothing lies apart from it).
    """

    lo: int
    hi: int
    by_steps: bool
    bulk: tuple[int, int] | None = None


def reference_range(
    step: np.ndarray, ts: np.ndarray, dur: np.ndarray, skip: np.ndarray, bulk: np.ndarray | None = None
) -> Reference:
    """The rank's reference range (ns): its ProfilerSteps (``step`` rows, not ``skip``), else the
    1st..99th percentile of the other records' starts, with ``bulk`` (bool, the records whose
    starts make the bulk) of the starts of their bulk (:func:`_bulk`: for the rules that flag what
    lies apart from it, which then leave out every record the range does not reach; a rule that
    clips what ends past the range keeps the plain percentiles, or it would clip the records of the
    side left out); and whether steps defined it. The bulk's first and last start come back with it
    (:attr:`Reference.bulk`), so that :func:`far_records` does not sort and split the starts again.

    O(n log n) in the records (a sort of the starts)."""
    steps = step & ~skip
    if steps.any():
        return Reference(int(ts[steps].min()), int((ts[steps] + dur[steps]).max()), True)
    pool = ts[~skip] if (~skip).any() else ts
    span = None
    if bulk is not None:
        # the bulk pool's own bulk; none to flag against when that pool is empty (the range is then
        # of the bulk of the other records, as when the two pools were split apart separately)
        pool = _bulk(np.sort(ts[bulk] if bulk.any() else pool))
        span = (int(pool[0]), int(pool[-1])) if bulk.any() else None
    lo, hi = (int(v) for v in np.percentile(pool, [1, 99], method="nearest"))
    return Reference(lo, hi, False, span)


def _bulk(st: np.ndarray) -> np.ndarray:
    """The bulk of sorted starts ``st`` (int64 ns), for a trace without steps: split where two
    neighbours lie more than :data:`FAR_MARGIN_MIN_NS` (1 s) apart, start from the cluster with the
    most starts and take in, nearest first, each neighbouring cluster whose gap is at most
    :data:`BULK_GAP_RATIO` times the two sides' spans together, or that holds more than half as many
    starts as the bulk so far (two sides of about one size: nothing tells which of them is on the
    wrong clock, and a window over both shows the gap rather than dropping half the work); what is
    left outside is not bulk. A head and a tail far off at once are each measured against the bulk,
    not against one another. A pause of a real run is not a hundred times longer than the work
    around it (20 ms of kernels, a 1.5 s pause, 10 ms more: ratio 50, one bulk); another clock
    domain's stamps are hours or days off (ratios of 1e3 and more): a trace whose first kernels a
    profiler stamped ~1e14 ns early would otherwise stretch a percentile range over small traces
    (n < 100: min..max) to 27.8 h, and its margin with it, so that nothing was "far". O(n)."""
    if len(st) < 2:
        return st
    cut = np.flatnonzero(np.diff(st) > FAR_MARGIN_MIN_NS)
    first = np.concatenate(([0], cut + 1))
    last = np.concatenate((cut, [len(st) - 1]))
    count = last - first + 1
    lo = hi = int(np.argmax(count))
    n = int(count[lo])

    def joins(side: int, gap: int) -> bool:
        spans = int(st[last[hi]] - st[first[lo]]) + int(st[last[side]] - st[first[side]])
        return gap <= BULK_GAP_RATIO * spans or 2 * int(count[side]) > n

    while True:
        can_left = lo > 0 and joins(lo - 1, int(st[first[lo]] - st[last[lo - 1]]))
        can_right = hi + 1 < len(first) and joins(hi + 1, int(st[first[hi + 1]] - st[last[hi]]))
        if can_left and can_right:  # the nearer side first
            can_left = st[first[lo]] - st[last[lo - 1]] <= st[first[hi + 1]] - st[last[hi]]
        if can_left:
            lo -= 1
            n += int(count[lo])
        elif can_right:
            hi += 1
            n += int(count[hi])
        else:
            return st[first[lo] : last[hi] + 1]


def far_rule(by_steps: bool, margin: int) -> str:
    """How far "far" was for :func:`far_records`, for warnings: the margin (s) with steps, the
    bulk rule without."""
    if by_steps:
        return f"more than {margin / 1e9:,.3f} s"
    return f"past a gap over 1 s and {BULK_GAP_RATIO} times the spans on either side of it"


def far_ends(
    ts: np.ndarray,
    dur: np.ndarray,
    sound: np.ndarray,
    checked: np.ndarray,
    cand: np.ndarray,
    hi: int,
    margin: int,
) -> tuple[np.ndarray, int]:
    """The records that end far past the reference range (module doc, step 3), and the trace's end.

    Args:
        ts: Start of each record, ns (int64).
        dur: Duration of each record, ns (int64; negative: none recorded, never far).
        sound: Which records have times to trust (bool).
        checked: Which sound records may end far (bool; a session span that rightly runs past
            the steps is not checked, and its end counts for the trace's end).
        cand: Which of those are returned to be clipped (bool; e.g. the CPU-side ones).
        hi: The end of the reference range, ns (:func:`reference_range`, or later).
        margin: How far past ``hi`` is far, ns (the range's length, at least :data:`FAR_MARGIN_MIN_NS`).

    Returns:
        (the far-ending records of ``cand``, ascending indices; the trace's end: the latest end of
        the sound records with a duration that do not end far past, ns (without any: the latest
        start)).
    """
    late = sound & checked & (dur >= 0) & (ts + dur > hi + margin)
    closed = sound & (dur >= 0) & ~late
    end = int((ts[closed] + dur[closed]).max()) if closed.any() else int(ts.max())
    return np.flatnonzero(late & cand), end


def far_records(
    ts: np.ndarray,
    pool: np.ndarray,
    ref: Reference,
    margin: int,
    cand: np.ndarray | None = None,
) -> tuple[np.ndarray, int]:
    """Records far from the bulk of a trace (Kineto's ``far_outside``; Nsight Systems' GPU rows
    without a launch call): with steps, split the sorted starts of ``pool`` where two neighbours lie
    more than ``margin`` apart; the clusters that overlap the step range are the bulk; without
    steps the bulk is :func:`_bulk`'s (the largest cluster and the neighbours it takes in), found
    once by :func:`reference_range` (``ref.bulk``); every other record of ``cand`` is far.
    O(n log n) with steps, O(n) without.

    Args:
        ts: Start of each record, ns (int64).
        pool: The records whose starts make the clusters (bool; without steps, the ``bulk`` pool
            :func:`reference_range` was given).
        ref: The reference range (:func:`reference_range`, with the bulk pool).
        margin: The gap that splits two clusters, ns (the range's length, at least
            :data:`FAR_MARGIN_MIN_NS`).
        cand: The records that may be far (bool, a subset of ``pool``); None: ``pool``.

    Returns:
        (mask of the far records of ``cand``, end of the bulk: its last start, at least ``ref.hi``).
    """
    lo, hi = ref.lo, ref.hi
    cand = pool if cand is None else cand
    far = np.zeros(len(ts), dtype=bool)
    if not ref.by_steps:  # without steps the bulk alone decides (a tail after a pause is the run's own)
        if ref.bulk is None:  # no starts in the pool
            return far, hi
        head, tail = ref.bulk
        return cand & ((ts < head) | (ts > tail)), max(hi, tail)
    st = ts[pool]  # the starts, sorted in place (no index array: a cluster is a range of values)
    if not len(st):
        return far, hi
    st.sort()
    cut = np.concatenate(
        [np.flatnonzero(np.diff(st[at : at + _BLOCK + 1]) > margin) + at for at in range(0, len(st), _BLOCK)]
    )  # a block at a time: no array of every gap
    first = np.concatenate(([0], cut + 1))
    last = np.concatenate((cut, [len(st) - 1]))
    keep = (st[last] >= lo) & (st[first] <= hi)
    if not keep.any():  # the steps fall in a gap: keep the nearest cluster
        keep[int(np.argmin(np.minimum(np.abs(st[first] - hi), np.abs(st[last] - lo))))] = True
    if not keep.all():  # equal starts never split, so each cluster is the records with starts in its range
        cluster = np.searchsorted(st[first], ts, side="right") - 1
        far = cand & ~keep[np.clip(cluster, 0, None)]
    return far, max(hi, int(st[last[keep]].max()))


def lane_overruns(
    ts: np.ndarray,
    dur: np.ndarray,
    lane: np.ndarray,
    hi: int,
    margin: int,
    rows: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The GPU rows that overrun their stream, and the end each is clipped to (ns).

    On one lane (a (device, stream) code), sorted by start, a row that runs past the start of the
    next row by more than :data:`OVERLAP_TOLERANCE_NS` ends at that start; the last row of a lane
    that ends more than ``margin`` past ``hi`` ends at the latest end of the rows not clipped (at
    least ``hi``). O(n log n) in the rows; one lane is sorted at a time, so beyond the rows' order
    by lane (an index per row, not needed when every row is on one lane) the memory is that of the
    largest lane (a sort of every row by lane, start and duration at once, 75 bytes a row, was
    Kineto's parse peak on 18 M events). A lane whose rows are in order of start already, as a
    profiler writes a stream's, is not sorted, the order by lane is int32, and the overlaps are
    found a block at a time: on 1,999,000 GPU rows on two streams the check's peak went from 40
    to 28 bytes a row (76 -> 54 MiB) and its CPU from 0.46 to 0.07-0.17 s.

    Args:
        ts: Start of each record, ns (int64).
        dur: Duration of each, ns (int64; non-negative on the GPU rows).
        lane: Each GPU row's lane code (integers from 0, shape (n,); aligned with ``rows``).
        hi: The end of the reference range, ns (:func:`reference_range`).
        margin: How far past ``hi`` is far, ns.
        rows: Which records of ``ts``/``dur`` are the GPU rows (indices, shape (n,)); None: all
            of them (then n is their length).

    Returns:
        (the clipped rows, ascending indices into ``ts``/``dur``; the end each is clipped to, ns).
    """
    idx = np.arange(len(ts)) if rows is None else rows
    if not len(idx):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    segments: list[np.ndarray | None] = [None]  # one lane: its rows are idx as they are
    if lane.min() != lane.max():
        by_lane = np.argsort(lane, kind="stable")
        if len(by_lane) <= np.iinfo(np.int32).max:  # held through the loop: 4 bytes a row, not 8
            by_lane = by_lane.astype(np.int32)
        segments = list(np.split(by_lane, np.cumsum(np.bincount(lane))[:-1]))  # each lane's rows in by_lane
    hits: list[np.ndarray] = []
    ends: list[np.ndarray] = []
    lasts: list[int] = []
    tail = hi  # the latest end of the rows not clipped, at least hi
    for seg in segments:
        if seg is not None and not len(seg):  # a code no row has
            continue
        r = idx if seg is None else idx[seg]
        start, end = ts[r], dur[r]
        if not _in_order(start, end):  # rows as a profiler writes a stream's are in order: no sort
            order = np.lexsort((end, start))
            r, start, end = r[order], start[order], end[order]
            del order
        end += start  # the duration's copy becomes the end, in place
        over = _runs_into_next(start, end)
        sound = np.ones(len(r), bool)
        sound[over] = False
        if end[-1] > hi + margin:  # the lane's last row ends far past the range
            sound[-1] = False
            lasts.append(int(r[-1]))
        tail = max(tail, int(end.max(where=sound, initial=hi)))
        hits.append(r[over])
        ends.append(start[over + 1])
    hit = np.concatenate([*hits, np.array(lasts, np.int64)]).astype(np.int64, copy=False)
    new_end = np.concatenate([*ends, np.full(len(lasts), tail, np.int64)])
    keep = np.argsort(hit)
    return hit[keep], new_end[keep]


#: Rows per block of :func:`_runs_into_next` and of :func:`far_records`' gap search.
_BLOCK = 1 << 18


def _runs_into_next(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Of rows in order of start: those that end more than :data:`OVERLAP_TOLERANCE_NS` past the
    start of the next row, which starts later (indices, ascending). A block at a time: no array of
    every row's next start plus the tolerance."""
    n = len(start) - 1
    parts = [np.zeros(0, np.int64)]
    for at in range(0, n, _BLOCK):
        nxt = start[at + 1 : at + _BLOCK + 1]
        this = start[at : at + len(nxt)]
        parts.append(
            np.flatnonzero((end[at : at + len(nxt)] > nxt + OVERLAP_TOLERANCE_NS) & (nxt > this)) + at
        )
    return np.concatenate(parts)


def _in_order(start: np.ndarray, dur: np.ndarray) -> bool:
    """Whether rows are in order of (start, duration) already, so that ``np.lexsort((dur, start))``
    (stable) would leave them as they are. Checks with two boolean arrays where the sort held an
    index and two copies (int64 each)."""
    if not bool((start[1:] >= start[:-1]).all()):
        return False
    tie = start[1:] == start[:-1]
    return not tie.any() or bool((dur[1:][tie] >= dur[:-1][tie]).all())


def step_overlaps(ts: np.ndarray, dur: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The step ranges that run into the next one (module doc, step 5). O(n log n) in the steps.

    Sorted by start (then duration), a range that ends more than :data:`OVERLAP_TOLERANCE_NS`
    past the start of the next range, which starts later than it, is to end at that start.

    Args:
        ts: Start of each step range, ns (int64, shape (n,)).
        dur: Duration of each, ns (int64, shape (n,), non-negative).

    Returns:
        (the ranges that run into the next one, indices into the arrays in order of start; the
        range each runs into, index into the arrays: its start is the clipped end).
    """
    order = np.lexsort((dur, ts))
    start, end = ts[order], ts[order] + dur[order]
    over = np.flatnonzero((end[:-1] > start[1:] + OVERLAP_TOLERANCE_NS) & (start[1:] > start[:-1]))
    return order[over], order[over + 1]


def step_overlap_warning(label: str, noun: str, pairs: list[tuple[str, str, int, int]]) -> str:
    """The warning for overlapping steps clipped (module doc, step 5), one text for both collectors.

    Args:
        label: The trace in messages (``rank0.json``, ``run.sqlite (pid 12)``).
        noun: What a step is called in the source (``ProfilerStep``, ``step range``).
        pairs: Each clipped step as (its name, the name of the step it runs into, its recorded
            duration in ns, how far it ran into that step in ns); the first three are named.
    """
    said = first_few(
        pairs, shown=lambda p: f"{p[0]} ({duration(p[2])} recorded) runs {duration(p[3])} into {p[1]}"
    )
    return (
        f"{label}: {len(pairs)} {noun}(s) run past the start of the next one: {said}; clipped to the next "
        "step's start (events.flag = 'overrun', raw_dur_ns keeps the recorded duration)"
    )
