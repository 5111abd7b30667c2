"""The GPU lane check both collectors share (``traceprof.collectors._far_end.lane_overruns``): the
same clips whatever order the rows come in, and rows already in order of start (as a profiler writes
a stream's) are checked without a sort (on 2 M rows of one lane the sort was most of the check's
CPU and memory)."""

from __future__ import annotations

import numpy as np
import pytest

from traceprof.collectors._far_end import OVERLAP_TOLERANCE_NS, lane_overruns

#: Four kernels on one stream, in order of start (ns): the first runs 10 us into the second (past
#: the 5 us tolerance: clipped to 10,000); the third runs 4 us into the fourth (within it: kept).
TS = [0, 10_000, 20_000, 30_000]
DUR = [20_000, 5_000, 14_000, 1_000]


def _run(ts, dur, lane, hi=40_000, margin=10**9, rows=None):
    hit, end = lane_overruns(
        np.array(ts, np.int64), np.array(dur, np.int64), np.array(lane, np.int64), hi, margin, rows
    )
    return hit.tolist(), end.tolist()


def test_rows_in_order_are_clipped_without_a_sort(monkeypatch):
    assert OVERLAP_TOLERANCE_NS == 5_000  # the numbers below are worked out with it
    monkeypatch.setattr(np, "lexsort", lambda *a, **k: pytest.fail("rows in order were sorted"))
    assert _run(TS, DUR, [0, 0, 0, 0]) == ([0], [10_000])
    # two lanes, each in order: lane 1's rows (4, 5) are the first two kernels again, 50 us later
    assert _run([*TS, 50_000, 60_000], [*DUR, 20_000, 5_000], [0, 0, 0, 0, 1, 1]) == (
        [0, 4],
        [10_000, 60_000],
    )


def test_rows_out_of_order_give_the_same_clips():
    # the same kernels written in another order (starts 30, 0, 20, 10 us): the one clipped is the
    # kernel that starts at 0, index 1 now
    order = [3, 0, 2, 1]
    ts, dur = [TS[i] for i in order], [DUR[i] for i in order]
    assert _run(ts, dur, [0, 0, 0, 0]) == ([1], [10_000])
    # only some rows are GPU rows (rows: indices into ts/dur; lane per GPU row)
    assert _run([7, *ts], [7, *dur], [0, 0, 0, 0], rows=np.array([1, 2, 3, 4])) == ([2], [10_000])


def test_equal_starts_are_ordered_by_duration():
    # Two kernels start at 0 (30 us and 10 us), written longest first: in order of (start, duration)
    # the 10 us one comes first, and the 30 us one is the lane's last row. Equal starts never clip
    # each other; the last row ends 30 us > hi 0 + margin 10 us, far past: clipped to the latest end
    # of the rows kept, 10 us. Taking the rows as written (no sort) would make the 10 us row last
    # and clip nothing.
    assert _run([0, 0], [30_000, 10_000], [0, 0], hi=0, margin=10_000) == ([0], [10_000])
    assert _run([0, 0], [10_000, 30_000], [0, 0], hi=0, margin=10_000) == ([1], [10_000])


@pytest.mark.parametrize("block", [1, 2, 3])
def test_blocks_of_rows_give_the_same_clips(monkeypatch, block):
    # the overlaps are found a block of rows at a time: one across a block's edge is found too
    from traceprof.collectors import _far_end

    monkeypatch.setattr(_far_end, "_BLOCK", block)
    assert _run(TS, DUR, [0, 0, 0, 0]) == ([0], [10_000])
    assert _run([*TS, 50_000, 60_000], [*DUR, 20_000, 5_000], [0, 0, 0, 0, 0, 0]) == (
        [0, 4],
        [10_000, 60_000],
    )
