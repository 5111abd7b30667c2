"""GPU rows that start before the CPU call that launched them: one rule for the collectors.

A GPU activity (kernel, copy, memset) cannot start before the runtime call that launched it (same
correlation id, within one process). Kineto (``traceprof.collectors.kineto.checks``, step 1) and
Nsight Systems (``traceprof.collectors.nsys.late``) both apply :func:`before_launch`:

  1. Each correlation id's launch time is the earliest of its (sound) launch calls.
  2. ``ahead`` = that launch time - the GPU row's start (ns; negative: the row starts after it).
  3. ``ahead`` > :data:`LAUNCH_SKEW_MAX_NS` (1 ms): the row's time comes from another clock domain
     (a profiler bug stamps the first records of a session ~1e14 ns early): ``before_launch``, left
     out of windows, idle, latency and collectives. :data:`LAUNCH_TOLERANCE_NS` (5 us) < ``ahead``
     <= 1 ms: CPU/GPU clock conversion jitter: ``launch_skew``, kept with its work, no latency.

O(n log n) in the rows (a sort of the launch ids).
"""

from __future__ import annotations

import numpy as np

__all__ = ["LAUNCH_TOLERANCE_NS", "LAUNCH_SKEW_MAX_NS", "before_launch"]

#: A GPU row may start this much before its launch call unremarked (CPU/GPU clock conversion
#: jitter): 5 us.
LAUNCH_TOLERANCE_NS = 5_000
#: ... and up to this much it is still jitter, kept and noted (``launch_skew``); beyond it the
#: record's time cannot be right (another clock domain: ``before_launch``, left out): 1 ms, 200x
#: the jitter tolerance and far below the seconds to days a clock-domain error shifts a record.
LAUNCH_SKEW_MAX_NS = 1_000_000


def before_launch(
    ts: np.ndarray, corr: np.ndarray, corr_ok: np.ndarray, launch: np.ndarray, gpu: np.ndarray
) -> tuple[np.ndarray, int, np.ndarray, int]:
    """The GPU rows that start before their launch call (module doc).

    Args:
        ts: Start of every row (int64 ns, one clock for the rows of one process).
        corr: Correlation id of every row (int64; any value where ``corr_ok`` is False).
        corr_ok: Whether the row has a correlation id (bool).
        launch: The sound launch calls (bool mask).
        gpu: The GPU rows to check (bool mask).

    Returns:
        (indices of the ``gpu`` rows more than :data:`LAUNCH_SKEW_MAX_NS` before the earliest launch
        call of their id, the largest such gap in ns (0 when none); indices of those before it by
        more than :data:`LAUNCH_TOLERANCE_NS` but at most :data:`LAUNCH_SKEW_MAX_NS`, their largest
        gap in ns). A row whose id no launch call has is neither.
    """
    lr = np.flatnonzero(launch & corr_ok)
    ids, inv = np.unique(corr[lr], return_inverse=True)
    launch_ts = np.full(len(ids), np.iinfo(np.int64).max)
    np.minimum.at(launch_ts, inv, ts[lr])
    del lr, inv
    g = np.flatnonzero(gpu & corr_ok)
    keys = corr[g]
    pos = np.minimum(np.searchsorted(ids, keys), max(len(ids) - 1, 0))
    found = (ids[pos] == keys) if len(ids) else np.zeros(len(g), bool)
    del ids, keys
    lt = launch_ts[pos] if len(launch_ts) else np.zeros(len(g), np.int64)
    del pos, launch_ts
    ahead = lt - ts[g]  # how long before its launch call the row starts (ns; negative: after)
    is_early = found & (ahead > LAUNCH_SKEW_MAX_NS)
    is_skew = found & (ahead > LAUNCH_TOLERANCE_NS) & ~is_early
    early, skew = g[is_early], g[is_skew]
    return (
        early,
        int(ahead[is_early].max()) if len(early) else 0,
        skew,
        int(ahead[is_skew].max()) if len(skew) else 0,
    )
