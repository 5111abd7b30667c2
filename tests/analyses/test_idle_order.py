"""idle's gaps without the sort by stream: equal to the sorted sweep.

``idle.classify_gaps`` sorted every row (all columns, the lane's text among them) by rank, device,
stream, start and end before its per-stream sweep: 0.6 of idle's 1.0 s CPU on 8 x 1 M events.
The activity frame is sorted by rank, start and end, so each stream's rows already lie in start
order; ``in_start_order=True`` sweeps them as they are. The sorted sweep (the default, unchanged)
is the reference: the same rows, gaps and categories, on generated frames and a real trace, in
both gap rules.
"""

from __future__ import annotations

import random

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from tests.conftest import corpus
from traceprof.analyses import idle
from traceprof.engine import session
from traceprof.engine.activity import activity
from traceprof.ingest.ingest import ingest

_LANE_ORDER = ["rank", "device", "stream", "start_ns", "end_ns"]


def _rows(seed: int) -> pl.DataFrame:
    """Random GPU rows of 3 ranks x 2 devices x 3 streams, overlapping within a stream, some
    launches unknown, sorted as the activity frame is (rank, start, end); no two rows of a stream
    share start and end (the order of such a tie is not defined)."""
    rnd = random.Random(seed)
    rows, seen = [], set()
    for _ in range(600):
        rank, device, stream = rnd.randrange(3), rnd.randrange(2), rnd.choice([7, 9, 13])
        start = rnd.randint(0, 50_000)
        end = start + rnd.randint(0, 3_000)
        if (rank, device, stream, start, end) in seen:
            continue
        seen.add((rank, device, stream, start, end))
        launch = None if rnd.random() < 0.1 else start - rnd.randint(-500, 20_000)
        rows.append(
            {
                "rank": rank,
                "device": device,
                "stream": stream,
                "start_ns": start,
                "end_ns": end,
                "launch_ts_ns": launch,
                "lane": f"dev {device} stream {stream}",
            }
        )
    schema = {"rank": pl.Int32, "device": pl.Int32}
    return pl.DataFrame(rows, schema_overrides=schema).sort("rank", "start_ns", "end_ns")


def _same(rows: pl.DataFrame, hta: bool) -> None:
    ref = idle.classify_gaps(rows, 1_000, hta=hta)
    got = idle.classify_gaps(rows, 1_000, hta=hta, in_start_order=True)
    assert got.height == ref.height and got.columns == ref.columns
    assert_frame_equal(got.sort(_LANE_ORDER, maintain_order=True), ref, check_exact=True)


@pytest.mark.parametrize("hta", [False, True])
@pytest.mark.parametrize("seed", range(6))
def test_gaps_in_start_order_equal_the_sorted_sweep(seed, hta):
    rows = _rows(seed)
    ref = idle.classify_gaps(rows, 1_000, hta=hta)
    # the draw covers every category and negative gaps under HTA's rule
    assert set(ref["category"].drop_nulls()) == {"host_wait", "kernel_wait", "other"}
    _same(rows, hta)


def test_rows_out_of_start_order_are_sorted_as_before():
    rows = _rows(0).reverse()  # not in (rank, start, end) order: the sweep sorts them
    got = idle.classify_gaps(rows, 1_000, hta=False, in_start_order=True)
    assert_frame_equal(got, idle.classify_gaps(rows, 1_000, hta=False), check_exact=True)


def test_gaps_in_start_order_equal_the_sorted_sweep_on_a_real_trace(store):
    ingest(store, [corpus("hta/nccl_parser_config")], run="r")
    with session.Session(store, many=False):
        act = activity(store, 1, detail=True, columns=idle._ACTIVITY)
    assert act.height > 1_000 and act["stream"].n_unique() > 1
    for hta in (False, True):
        _same(act, hta)
