"""The report's timeline: lanes of one step, exact at a few ranks, binned at 1,024."""

from __future__ import annotations

import json

import numpy as np
import polars as pl

from tests.conftest import SAMPLES
from traceprof.engine.timeline import STATES, _coverage, lanes, step_timeline
from traceprof.ingest.ingest import ingest
from traceprof.render import plots


def _act(rows: list[tuple[int, str, int, int]]) -> pl.DataFrame:
    return pl.DataFrame(
        rows,
        schema={"rank": pl.Int32, "class": pl.Utf8, "start_ns": pl.Int64, "end_ns": pl.Int64},
        orient="row",
    )


def test_lanes_mark_the_exposed_communication():
    # Rank 0: compute [0, 100) and [150, 200), communication [80, 180): hidden 80-100 and 150-180,
    # exposed 100-150. Rank 1: communication only [0, 50): all exposed. Times in ns -> ms / 1e6.
    act = _act([(0, "compute", 0, 100), (0, "compute", 150, 200), (0, "comm", 80, 180), (1, "comm", 0, 50)])
    ranks, span_ms, rows, grid, _ = lanes(act)
    assert ranks == (0, 1) and span_ms == 200 / 1e6 and grid is None
    exposed = rows.filter(pl.col("state") == STATES[3]).sort("rank")
    assert exposed.select(
        "rank", (pl.col("start_ms") * 1e6).round(), (pl.col("end_ms") * 1e6).round()
    ).rows() == [(0, 100.0, 150.0), (1, 0.0, 50.0)]


def test_coverage_per_bin_by_hand():
    # Intervals [0, 10) and [15, 30) over bins [0, 10), [10, 20), [20, 30): 10, 5, 10 ns covered.
    got = _coverage(np.array([15, 0]), np.array([30, 10]), np.array([0.0, 10.0, 20.0, 30.0]))
    assert got.tolist() == [10.0, 5.0, 10.0]


def test_1024_ranks_are_binned_into_one_small_image():
    # Every rank: compute [0, 6 ms), communication [5, 10 ms) -> exposed [6, 10 ms). 1,024 ranks x
    # 100 kernels each would be 100k glyphs; binned it is a 1,024 x 400 image of states.
    rows = []
    for r in range(1024):
        for k in range(50):
            rows.append((r, "compute", k * 120_000, k * 120_000 + 100_000))
        rows.append((r, "comm", 5_000_000, 10_000_000))
    ranks, span_ms, iv, grid, bin_ms = lanes(_act(rows), bins=400)
    assert iv is None and grid.shape == (1024, 400) and len(ranks) == 1024
    assert span_ms == 10.0 and bin_ms == 10.0 / 400
    assert (grid[:, 390] == 3).all()  # 9.75 ms: exposed communication on every rank
    assert (grid[:, 10] == 1).all()  # 0.25 ms: inside a compute kernel
    from traceprof.engine.timeline import Timeline

    fig = plots.render(plots.timeline(Timeline(1, ranks, span_ms, None, grid, bin_ms, "step 1")))
    from bokeh.embed import json_item

    assert len(json.dumps(json_item(fig))) < 700_000  # one image, not a glyph per kernel


def test_median_step_of_a_sample(store):
    ingest(store, [SAMPLES / "normal"])
    tl = step_timeline(store, store.resolve_run("normal"))
    steps = store.sql(
        "SELECT step, median(cpu_end_ns - cpu_start_ns) AS ns FROM steps GROUP BY step ORDER BY ns"
    )
    assert tl.step == steps["step"][(steps.height - 1) // 2]  # the middle (lower middle) step
    assert tl.ranks == (0, 1, 2, 3) and tl.grid is None and "median" in tl.note
    assert set(tl.intervals["state"]) == set(STATES[1:])


def test_axis_says_what_the_window_is():
    # An nsys capture without steps shows the whole trace (step -1): its axis is not "the step's start".
    from traceprof.engine.timeline import Timeline

    act = _act([(0, "compute", 0, 100)])
    ranks, span, rows, grid, bin_ms = lanes(act)
    whole = Timeline(-1, ranks, span, rows, grid, bin_ms, "the whole trace (no ProfilerSteps)")
    step = Timeline(3, ranks, span, rows, grid, bin_ms, "step 3")
    assert (
        plots.render(plots.timeline(whole)).xaxis[0].axis_label
        == "ms from the first compute or communication"
    )
    assert plots.render(plots.timeline(step)).xaxis[0].axis_label == "ms from the step's start"


def test_a_step_of_many_kernels_on_few_ranks_is_binned():
    # 4 ranks x 600 compute kernels of 100 ns, 20 ns apart: 2,400 merged intervals, above the 2,000
    # drawn one by one (MAX_INTERVALS): a 4 x 400 grid instead (a 520 k-event run's step drew 2,599
    # rectangles, 0.1 MB of the report). Span 599 * 120 + 100 = 71,980 ns; bin 179.95 ns.
    rows = [(r, "compute", k * 120, k * 120 + 100) for r in range(4) for k in range(600)]
    ranks, span_ms, iv, grid, bin_ms = lanes(_act(rows), bins=400)
    assert iv is None and grid.shape == (4, 400) and ranks == (0, 1, 2, 3)
    assert span_ms == 71_980 / 1e6 and bin_ms == 71_980 / 400 / 1e6
    assert (grid == 1).all()  # a bin of 179.95 ns meets at most 2 gaps of 20 ns: >= 139.95 ns compute
    _, _, iv, grid, _ = lanes(_act(rows), bins=400, max_intervals=2400)  # at the bound: drawn
    assert grid is None and iv.height == 2400


def test_a_long_critical_path_is_drawn_in_bounded_pieces():
    # 10 pieces (ms): [0,1) [1,2) [2,4) [4,6) [6,7) [7,8) [8,9) on rank 0, [9,10) [10,13) [13,14) on
    # rank 1; kinds alternate compute (even) / host_bound (odd). max_pieces 4 -> ceil(10 / 4) = 3
    # consecutive pieces per drawn one within a rank's run: rank 0 pieces 0-2 (longest 2, compute,
    # 2 ms), 3-5 (longest 3, host_bound, 2 ms), 6 alone (kept as it is); rank 1 pieces 7-9 (longest
    # 8, compute, 3 ms). A 520 k-event run's step had 21,018 pieces: 0.48 MB of the report.
    from traceprof.engine.timeline import Timeline, with_path

    starts = [0, 1, 2, 4, 6, 7, 8, 9, 10, 13]
    ends = [1, 2, 4, 6, 7, 8, 9, 10, 13, 14]
    path = pl.DataFrame(
        {
            "step": [1] * 10,
            "rank": [0] * 7 + [1] * 3,
            "kind": ["compute", "host_bound"] * 5,
            "name": [f"k{i}" for i in range(10)],
            "start_ns": [s * 1_000_000 for s in starts],
            "duration_ns": [(e - s) * 1_000_000 for s, e in zip(starts, ends, strict=True)],
        }
    )
    tl = Timeline(1, (0, 1), 14.0, None, None, 0.0, "step 1", t0_ns=0)
    assert with_path(tl, path, max_pieces=4).path.rows() == [
        (0, "3 pieces; longest: compute", "k2", 0.0, 4.0),
        (0, "3 pieces; longest: host_bound", "k3", 4.0, 8.0),
        (0, "compute", "k6", 8.0, 9.0),
        (1, "3 pieces; longest: compute", "k8", 9.0, 14.0),
    ]
    assert with_path(tl, path, max_pieces=10).path.height == 10  # at the bound: every piece
