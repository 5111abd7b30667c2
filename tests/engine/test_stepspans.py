"""The step spans' measures (``traceprof.engine.stepspans``): all of a group's activity within each
span in one sweep, without cutting it, on hand-made rows."""

from __future__ import annotations

import numpy as np
import polars as pl

from traceprof.engine.intervals import cut, union_ns
from traceprof.engine.stepspans import step_span_measures, window_measures

# Rank 0 (ns; class, [start, end), step of launch):
#   compute [0, 50) s1; comm [40, 130) s1; compute [60, 70) s1 (nested in the comm);
#   compute [110, 150) s2; comm [160, 170) s2; compute [200, 230) none (after the last step).
# Rank 1: compute [1000, 1010) s1 only.
# Spans (each step ends where its launched activity ends, the next starts there):
#   rank 0: s1 [0, 130), s2 [130, 170); rank 1: s1 [1000, 1010).
# rank 0 s1: busy [0, 130) = 130; compute [0, 50) + [60, 70) + [110, 130) = 50 + 10 + 20 = 80.
# rank 0 s2: busy [130, 150) + [160, 170) = 30; compute [130, 150) = 20. [200, 230) lies in no span.
# rank 1 s1: busy = compute = 10.
ROWS = [
    (0, "compute", 0, 50, 1),
    (0, "comm", 40, 130, 1),
    (0, "compute", 60, 70, 1),
    (0, "compute", 110, 150, 2),
    (0, "comm", 160, 170, 2),
    (0, "compute", 200, 230, None),
    (1, "compute", 1000, 1010, 1),
]
ACT = pl.DataFrame(
    ROWS,
    schema={"rank": pl.Int32, "class": pl.Utf8, "start_ns": pl.Int64, "end_ns": pl.Int64, "step": pl.Int64},
    orient="row",
)
WANT = [(0, 1, 130, 130, 80), (0, 2, 40, 30, 20), (1, 1, 10, 10, 10)]


#: Rank 0's rows on two devices (ns; step of launch): device 0 compute [0, 50) s1, [60, 70) s2;
#: device 1 comm [40, 130) s1, compute [110, 150) s2.
DEVICES = pl.DataFrame(
    {
        "rank": [0, 0, 0, 0],
        "device": [0, 1, 0, 1],
        "class": ["compute", "comm", "compute", "compute"],
        "start_ns": [0, 40, 60, 110],
        "end_ns": [50, 130, 70, 150],
        "step": [1, 1, 2, 2],
    }
)


def test_step_span_measures_hand_values():
    got = step_span_measures(ACT).select("rank", "step", "window_ns", "busy_ns", "compute_ns")
    assert got.rows() == WANT


def test_step_span_measures_rows_out_of_order():
    # the same rows reversed: sorted by the sweep, the same figures
    got = step_span_measures(ACT.reverse()).select("rank", "step", "window_ns", "busy_ns", "compute_ns")
    assert got.rows() == WANT


def test_window_measures_per_device_over_the_rank_windows():
    # rank 0's rows on two devices: device 0 the computes [0, 50), [60, 70); device 1 the comm
    # [40, 130) and compute [110, 150). Window [30, 120): device 0 busy [30, 50) + [60, 70) = 30, all
    # compute; device 1 busy [40, 120) = 80, compute [110, 120) = 10. Window [120, 120): 0.
    win = pl.DataFrame({"rank": [0, 0], "w": ["a", "b"], "start_ns": [30, 120], "end_ns": [120, 120]})
    got = window_measures(DEVICES, win, ["rank", "device"]).sort("device", "w")
    assert got.select("device", "w", "busy_ns", "compute_ns").rows() == [
        (0, "a", 30, 30),
        (0, "b", 0, 0),
        (1, "a", 80, 10),
        (1, "b", 0, 0),
    ]


def test_window_measures_equal_a_cut_on_random_rows():
    # the sweep against cutting the rows to the windows and measuring the pieces' union
    rng = np.random.default_rng(7)
    n = 400
    start = rng.integers(0, 10_000, n)
    act = pl.DataFrame(
        {
            "rank": rng.integers(0, 3, n).astype(np.int32),
            "class": rng.choice(["compute", "comm", "memory"], n),
            "start_ns": start,
            "end_ns": start + rng.integers(1, 800, n),
        }
    ).sort("rank", "start_ns")
    edges = np.sort(rng.integers(0, 11_000, 24))
    win = pl.DataFrame(
        {
            "rank": np.repeat(np.arange(3, dtype=np.int32), 8),
            "k": np.tile(np.arange(8), 3),
            "start_ns": np.concatenate([edges[i * 8 : i * 8 + 8] for i in range(3)]),
        }
    ).with_columns(pl.col("start_ns").shift(-1).over("rank").fill_null(11_000).alias("end_ns"))
    got = window_measures(act, win).select("rank", "k", "busy_ns", "compute_ns").sort("rank", "k")
    pieces = cut(act, win, "rank", ["k"])
    busy = union_ns(pieces, ["rank", "k"], "busy_ns")
    comp = union_ns(pieces.filter(pl.col("class") == "compute"), ["rank", "k"], "compute_ns")
    want = (
        win.select("rank", "k")
        .join(busy, on=["rank", "k"], how="left")
        .join(comp, on=["rank", "k"], how="left")
        .fill_null(0)
        .sort("rank", "k")
    )
    assert got.rows() == want.rows()


def test_step_span_measures_per_device_spans():
    # keys rank, device: each device tiles its own steps. Device 0: compute [0, 50) s1, [60, 70) s2;
    # device 1: comm [40, 130) s1, compute [110, 150) s2. Device 0 spans s1 [0, 50) (busy = compute
    # = 50), s2 [50, 70) (window 20, busy = compute = 10); device 1 s1 [40, 130) (window = busy 90,
    # compute [110, 130) = 20), s2 [130, 150) (window = busy = compute = 20).
    got = step_span_measures(DEVICES, keys=["rank", "device"])
    assert got.rows() == [
        (0, 0, 1, 50, 50, 50),
        (0, 0, 2, 20, 10, 10),
        (0, 1, 1, 90, 90, 20),
        (0, 1, 2, 20, 20, 20),
    ]
