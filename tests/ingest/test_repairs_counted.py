"""Records an ingest clips are counted where the runs' issues are (``traces.meta.repaired``), not
only flagged in ``events.flag``: a trial saw the warnings for hta's ``trace_diff/test`` (9 GPU
records clipped) and ``triton_example`` (a ProfilerStep cut from 13.3 s to 1.84 ms) and then an
empty ``issues`` column in ``traceprof runs`` (``traceprof.collectors._far_end``)."""

from __future__ import annotations

import pytest

from tests.collectors.test_nsys_far_end import FAR, _export
from tests.conftest import corpus
from traceprof.ingest.ingest import ingest


@pytest.mark.parametrize(
    ("folder", "issues", "kind"),
    [
        ("hta/trace_diff/test", "9 repaired: GPU record ran past the next on its stream: clipped", "kernel"),
        ("hta/triton_example", "1 repaired: step ran past the end of the trace: clipped to it", "step"),
    ],
)
def test_clipped_kineto_records_are_counted_in_issues(store, folder, issues, kind):
    ingest(store, [corpus(folder)], run="r")
    assert store.runs()["issues"].to_list() == [issues]
    # the count is that of the rows the store flags as clipped (an independent SQL count)
    flagged = store.sql(
        "SELECT kind, count(*) FROM events WHERE flag = 'overrun' AND raw_dur_ns IS NOT NULL GROUP BY kind"
    ).rows()
    assert flagged == [(kind, int(issues.split()[0]))]


@pytest.mark.parametrize(
    ("extra", "long", "issues"),
    [
        ("nvtx", None, "1 repaired: record ended far past the trace: clipped to its end"),
        (None, {(0, 0): FAR}, "1 repaired: GPU record ran past the next on its stream: clipped"),
    ],
)
def test_clipped_nsys_records_are_counted_in_issues(store, tmp_path, extra, long, issues):
    # tests/collectors/test_nsys_far_end.py's export: an NVTX range 95 years long, or a kernel that
    # runs into the next on its stream; one row clipped each
    ingest(store, [_export(tmp_path / "rank0.sqlite", extra, long=long)], run="far")
    assert store.runs()["issues"].to_list() == [issues]
