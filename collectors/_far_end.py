"""A trace's reference range, and its records that end far past it: one rule for the collectors.

A profiler sometimes records a CPU-side record (an op, an NVTX range, a CUDA API call) with an end
years past the rest of its trace (Kineto ``"dur": 3e15`` us; an nsys ``end`` beyond the capture).
Kept as recorded it stretches every window that reads it to years. Both collectors that record such
spans, Kineto (``traceprof.collectors.kineto.checks``, step 3a) and Nsight Systems
(``traceprof.collectors.nsys.parse``), measure "far" the same way:

  1. The reference range: the rank's ProfilerSteps, else the 1st..99th percentile of its records'
     starts (:func:`reference_range`).
  2. The margin: the range's own length, at least :data:`FAR_MARGIN_MIN_NS` (1 s).
  3. A record ends far past the range when its end lies more than the margin past the range's end
     (:func:`far_ends`); the collector clips it to the trace's end, the latest end of its other
     sound records, flags it ``overrun`` and keeps its recorded duration in ``raw_dur_ns``, with a
     warning naming it.
  4. GPU rows on a stream (:func:`lane_overruns`, used by the nsys collector; Kineto's checks apply
     the same rule in their own lane loop): a row that runs past the next one on its (device,
     stream) ends at its start; the last of a stream that ends far past the range ends with the
     other GPU rows.
  Each clip is counted in ``traces.meta.repaired`` (the ``issues`` column of ``traceprof runs``)
  under one reason per kind of repair (:data:`FAR_END_REPAIR`, :data:`GPU_OVERRUN_REPAIR`,
  :data:`STEP_PAST_END_REPAIR`), the same for both collectors (:func:`count_repair`).
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "FAR_MARGIN_MIN_NS",
    "OVERLAP_TOLERANCE_NS",
    "FAR_END_REPAIR",
    "GPU_OVERRUN_REPAIR",
    "STEP_PAST_END_REPAIR",
    "count_repair",
    "reference_range",
    "far_ends",
    "lane_overruns",
]

#: The smallest margin around the reference range before a record is "far outside": 1 s.
FAR_MARGIN_MIN_NS = 1_000_000_000

#: How far a GPU row may run into the next one on its stream before it is an overrun: 5 us
#: (programmatic dependent launch overlaps that much); both collectors' GPU lanes and Kineto's steps.
OVERLAP_TOLERANCE_NS = 5_000


#: Reasons a clipped record is counted under in ``traces.meta.repaired`` (module doc).
FAR_END_REPAIR = "record ended far past the trace: clipped to its end"
GPU_OVERRUN_REPAIR = "GPU record ran past the next on its stream: clipped"
STEP_PAST_END_REPAIR = "step ran past the end of the trace: clipped to it"


def count_repair(repaired: dict[str, int] | None, reason: str, n: int) -> None:
    """Add ``n`` records repaired for ``reason`` to ``repaired`` (reason -> records, for
    ``traces.meta.repaired``); nothing when it is None or ``n`` is 0."""
    if repaired is not None and n:
        repaired[reason] = repaired.get(reason, 0) + n


def reference_range(
    step: np.ndarray, ts: np.ndarray, dur: np.ndarray, skip: np.ndarray
) -> tuple[int, int, bool]:
    """The rank's reference range (ns): its ProfilerSteps (``step`` rows, not ``skip``), else the
    1st..99th percentile of the other records' starts; and whether steps defined it."""
    steps = step & ~skip
    if steps.any():
        return int(ts[steps].min()), int((ts[steps] + dur[steps]).max()), True
    pool = ts[~skip] if (~skip).any() else ts
    lo, hi = (int(v) for v in np.percentile(pool, [1, 99], method="nearest"))
    return lo, hi, False


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


def lane_overruns(
    ts: np.ndarray, dur: np.ndarray, lane: np.ndarray, hi: int, margin: int
) -> tuple[np.ndarray, np.ndarray]:
    """The GPU rows that overrun their stream, and the end each is clipped to (ns).

    On one lane (a (device, stream) code), sorted by start, a row that runs past the start of the
    next row by more than :data:`OVERLAP_TOLERANCE_NS` ends at that start; the last row of a lane
    that ends more than ``margin`` past ``hi`` ends at the latest end of the rows not clipped (at
    least ``hi``). O(n log n) in the rows.

    Args:
        ts: Start of each GPU row, ns (int64, shape (n,)).
        dur: Duration of each, ns (int64, shape (n,), non-negative).
        lane: Each row's lane code (int64, shape (n,)).
        hi: The end of the reference range, ns (:func:`reference_range`).
        margin: How far past ``hi`` is far, ns.

    Returns:
        (the clipped rows, ascending indices into the arrays; the end each is clipped to, ns).
    """
    if not len(ts):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    order = np.lexsort((dur, ts, lane))
    start, end, ln = ts[order], ts[order] + dur[order], lane[order]
    same = np.append(ln[1:] == ln[:-1], False)  # the next row is on the same lane
    nxt = np.append(start[1:], 0)
    over = same & (end > nxt + OVERLAP_TOLERANCE_NS) & (nxt > start)
    last_far = ~same & (end > hi + margin)
    tail = max(hi, int(end.max(where=~(over | last_far), initial=hi)))
    new_end = np.where(over, nxt, tail)
    hit = np.flatnonzero(over | last_far)
    rows = order[hit]
    keep = np.argsort(rows)
    return rows[keep], new_end[hit][keep]
