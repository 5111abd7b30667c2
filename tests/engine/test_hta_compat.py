"""temporal and overlap agree with Holistic Trace Analysis (run here, in-process) on real traces.

HTA 0.5.0 drops the last ProfilerStep and unlaunched GPU events; ``hta=true`` selects the same
events (README "Windows and HTA") and rounds times as its float64 microseconds do. Agreement:
temporal to the microsecond, overlap within 0.1 percentage points.
"""

from __future__ import annotations

import logging
import math

import pytest

from tests.conftest import analyze, corpus
from traceprof.ingest.ingest import ingest

hta_trace = pytest.importorskip("hta.common.trace", reason="holistictraceanalysis not installed")
from hta.analyzers.breakdown_analysis import BreakdownAnalysis  # noqa: E402
from hta.analyzers.communication_analysis import CommunicationAnalysis  # noqa: E402

pytestmark = pytest.mark.slow

# (corpus folder, style): an old-style multi-rank pair, a new-style NCCL trace, and two more.
CASES = [
    "hta/trace_filter",  # old style (integer epoch us), ranks 0 and 1 of a 128-rank job
    "hta/nccl_parser_config",  # new style (baseTimeNanoseconds + fractional us), NCCL 2.17
    "hta/negative_queue_length_values_check",  # old style, 6 streams, kernels without launches
    "hta/trace_diff/test",  # old style, V100, rank 1 of 2
    # old style with 3 decimals (epoch us): HTA's float64 times, 0.25 us apart, rounded inward. Before
    # hta=true rounded them so: idle 11,307 / compute 371,264 / non-compute 2,063 us, HTA's 10,113 /
    # 372,150 / 2,371 (window 384,634 us both)
    "hta/ns_resolution_trace",
]


def _hta(folder):
    logging.disable(logging.WARNING)
    try:
        t = hta_trace.Trace(trace_dir=str(folder))
        t.load_traces(include_last_profiler_step=False, use_multiprocessing=False)
        tb = BreakdownAnalysis.get_temporal_breakdown(t, visualize=False)
        ov = CommunicationAnalysis.get_comm_comp_overlap(t, visualize=False)
    finally:
        logging.disable(logging.NOTSET)
    return tb, ov


@pytest.mark.parametrize("rel", CASES)
def test_temporal_and_overlap_match_hta(store, rel):
    folder = corpus(rel)
    ingest(store, [folder], run="r")
    tb, ov = _hta(folder)
    mine_t = analyze(store, "temporal", "r", hta=True).frame
    mine_o = analyze(store, "overlap", "r", hta=True).frame
    assert sorted(mine_t["rank"].to_list()) == sorted(int(r) for r in tb["rank"])
    for row in tb.to_dict("records"):
        m = mine_t.filter(mine_t["rank"] == int(row["rank"])).row(0, named=True)
        # HTA's times are whole microseconds; ours are ns of the same intervals: equal.
        assert m["window_ns"] == row["kernel_time(us)"] * 1000
        assert m["idle_ns"] == row["idle_time(us)"] * 1000
        assert m["compute_ns"] == row["compute_time(us)"] * 1000
        assert m["non_compute_ns"] == row["non_compute_time(us)"] * 1000
        assert m["idle_pct"] == pytest.approx(row["idle_time_pctg"], abs=0.1)
        assert m["compute_pct"] == pytest.approx(row["compute_time_pctg"], abs=0.1)
        assert m["non_compute_pct"] == pytest.approx(row["non_compute_time_pctg"], abs=0.1)
    for row in ov.to_dict("records"):
        m = mine_o.filter(mine_o["rank"] == int(row["rank"])).row(0, named=True)
        if math.isnan(row["comp_comm_overlap_pctg"]):  # no communication: HTA's 0/0, our null
            assert m["overlap_pct"] is None
        else:
            assert m["overlap_pct"] == pytest.approx(row["comp_comm_overlap_pctg"], abs=0.1)
