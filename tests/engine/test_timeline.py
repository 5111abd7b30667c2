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
