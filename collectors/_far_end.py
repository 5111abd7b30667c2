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
"""

from __future__ import annotations

import numpy as np

__all__ = ["FAR_MARGIN_MIN_NS", "reference_range", "far_ends"]

#: The smallest margin around the reference range before a record is "far outside": 1 s.
FAR_MARGIN_MIN_NS = 1_000_000_000


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
