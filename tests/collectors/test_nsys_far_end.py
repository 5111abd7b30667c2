"""A CPU-side row of an nsys export that ends far past the rest of its trace is clipped, as Kineto's
are (``traceprof.collectors.nsys.late``; r9 fixed the Kineto kind): an NVTX range or CUDA API call
whose ``end`` lies years past the capture no longer stretches the windows that read it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.builders import EPOCH, Export
from tests.conftest import analyze
from traceprof.collectors.nsys.parse import parse
from traceprof.ingest.ingest import ingest
from traceprof.storage.store import Store

#: 95 years in ns (the Kineto trial's "dur": 3e15 us).
FAR = 3 * 10**18


def _export(
    path: Path, extra: str | None, steps: bool = True, past_ns: int = FAR, long: dict | None = None
) -> Path:
    """Four 9 ms step ranges every 10 ms from 1 ms (relative ns), three 1 ms kernels in each with
    their launch calls; ``extra``: one more CPU-side row from 2 ms that ends ``past_ns`` later;
    ``long``: {(step, kernel): duration in ns} for kernels that run longer than 1 ms."""
    e = Export()
    e.gpu(0)
    e.process(100)
    for i in range(4):
        t0 = 1_000_000 + i * 10_000_000
        if steps:
            e.nvtx(100, t0, t0 + 9_000_000, f"ProfilerStep#{i}")
        for k in range(3):
            s = t0 + 100_000 + k * 2_000_000
            e.launch(100, i * 10 + k + 1, s, s + 5_000)
            e.kernel(100, 0, i * 10 + k + 1, s + 20_000, s + 20_000 + (long or {}).get((i, k), 1_000_000))
    if extra == "nvtx":
        e.nvtx(100, 2_000_000, 2_000_000 + past_ns, "far range")
    elif extra == "runtime":
        e.launch(100, 999, 2_000_000, 2_000_000 + past_ns, name="cudaStreamSynchronize_v3020")
    return e.write(path)


def _row(trace, name: str) -> dict:
    (row,) = [r for r in trace.events.to_pylist() if r["name"] == name]
    return row


@pytest.mark.parametrize(
    ("extra", "name", "kind"),
    [("nvtx", "far range", "user_annotation"), ("runtime", "cudaStreamSynchronize", "cuda_runtime")],
)
def test_cpu_row_ending_far_past_the_steps_is_clipped(tmp_path, extra, name, kind):
    t = parse(_export(tmp_path / "rank0.sqlite", extra))
    # the trace ends where its last step range ends: 1 ms + 3 x 10 ms + 9 ms = 40 ms (relative); the
    # row starts at 2 ms, so it keeps 38 ms; the step range is 39 ms long, so the margin is 1 s
    row = _row(t, name)
    assert (row["kind"], row["ts_ns"], row["dur_ns"]) == (kind, EPOCH + 2_000_000, 38_000_000)
    assert (row["raw_dur_ns"], row["flag"]) == (FAR, "overrun")
    assert t.flagged == {"overrun": 1}
    # past the range's end (40 ms): 2 ms + 3e18 - 40 ms = 2,999,999,999.962 s
    assert [w for w in t.warnings if "far past" in w] == [
        f"rank0.sqlite: 1 CPU record(s) end far past the trace's step range (up to 2,999,999,999.962 s past "
        f"it, more than 1.000 s; {kind} {name!r}): clipped to the end of the trace (events.flag = 'overrun', "
        "raw_dur_ns keeps the recorded duration)"
    ]
    # every other row as recorded: the kernels, launches and steps have no raw duration
    assert [r["name"] for r in t.events.to_pylist() if r["raw_dur_ns"] is not None] == [name]


def test_nvtx_sum_and_the_window_after_the_clip(store, tmp_path):
    ingest(store, [_export(tmp_path / "rank0.sqlite", "nvtx")], run="far")
    # nvtx_sum: 38 ms of 4 x 9 + 38 = 74 ms of ranges (it was 3e18 ns, 99.99999 % of the time)
    frame = analyze(store, "nvtx_sum", "far").frames()["frame"]
    got = {r["name"]: (r["total_ns"], round(r["time_pct"], 4)) for r in frame.to_dicts()}
    assert got["far range"] == (38_000_000, round(100 * 38 / 74, 4))
    # temporal reads GPU activity: 12 kernels of 1 ms from 1.12 ms to 36.12 ms: window 35 ms
    t = analyze(store, "temporal", "far").frames()["frame"].to_dicts()[0]
    assert (t["window_ns"], t["compute_ns"]) == (35_000_000, 12_000_000)
    # all the trace's rows: from the first step's start (1 ms) to the last one's end (40 ms)
    assert store.sql("SELECT max(ts_ns + dur_ns) - min(ts_ns) FROM events").rows() == [(39_000_000,)]


def test_cpu_row_ending_within_the_margin_is_untouched(tmp_path):
    # 0.9 s past the range's end (40 ms) is within the 1 s margin: kept as recorded
    t = parse(_export(tmp_path / "rank0.sqlite", "nvtx", past_ns=938_000_000))
    row = _row(t, "far range")
    assert (row["dur_ns"], row.get("raw_dur_ns"), row["flag"]) == (938_000_000, None, None)
    assert t.flagged == {} and not [w for w in t.warnings if "far past" in w]
    assert "raw_dur_ns" not in t.events.column_names  # no clip: the columns as before


def test_without_steps_the_range_is_the_starts_percentiles(tmp_path):
    # no step ranges: the range is the 1st..99th percentile of the 25 rows' starts (the 12 launches,
    # 12 kernels and the far call: 1.1 ms .. 35.12 ms); the far call is clipped to the latest end of
    # the others: the last kernel's, 36.12 ms, so it keeps 34.12 ms
    t = parse(_export(tmp_path / "rank0.sqlite", "runtime", steps=False))
    row = _row(t, "cudaStreamSynchronize")
    assert (row["dur_ns"], row["raw_dur_ns"], row["flag"]) == (34_120_000, FAR, "overrun")
    assert any("end far past the trace's time range" in w for w in t.warnings)


@pytest.mark.parametrize(
    ("step", "dur", "clipped"),
    [
        # the first kernel (1.12 ms) runs into the next on its stream (3.12 ms): ends at its start
        (0, FAR, 2_000_000),
        # the stream's last kernel (35.12 ms) has no next: clipped to the end of the other GPU rows
        # (34.12 ms) or of the step range (40 ms), whichever is later: 40 - 35.12 = 4.88 ms
        (3, FAR, 4_880_000),
        # 1.5 ms: 0.5 ms into the next kernel, far past nothing; an overrun all the same
        (0, 2_500_000, 2_000_000),
    ],
)
def test_gpu_kernel_past_its_stream_or_far_past_is_clipped(tmp_path, step, dur, clipped):
    k = 0 if step == 0 else 2
    t = parse(_export(tmp_path / "rank0.sqlite", None, long={(step, k): dur}))
    (row,) = [r for r in t.events.to_pylist() if r["raw_dur_ns"] is not None]
    start = EPOCH + 1_000_000 + step * 10_000_000 + 120_000 + k * 2_000_000
    assert (row["kind"], row["ts_ns"], row["dur_ns"]) == ("kernel", start, clipped)
    assert (row["raw_dur_ns"], row["flag"]) == (dur, "overrun")
    assert t.flagged == {"overrun": 1}
    assert [w for w in t.warnings if "GPU record" in w] == [
        f"rank0.sqlite: 1 GPU record(s) run past the next record on their stream (or far past the trace's "
        f"step range) by up to {(dur - clipped) / 1e9:,.6f} s (kernel 'void gemm_kernel<float>()'): clipped "
        "(events.flag = 'overrun', raw_dur_ns keeps the recorded duration)"
    ]


def test_kernel_sum_and_idle_after_the_gpu_clip(store, tmp_path):
    ingest(store, [_export(tmp_path / "rank0.sqlite", None, long={(0, 0): FAR})], run="far")
    # kernel_sum: 11 kernels of 1 ms and the clipped one of 2 ms = 13 ms (it was 3e18 + 11 ms)
    frame = analyze(store, "kernel_sum", "far").frames()["frame"]
    assert frame["total_ns"].to_list() == [13_000_000]
    # temporal: the kernels from 1.12 ms to 36.12 ms: window 35 ms, busy 13 ms (it was all of it)
    t = analyze(store, "temporal", "far").frames()["frame"].to_dicts()[0]
    assert (t["window_ns"], t["compute_ns"]) == (35_000_000, 13_000_000)


def test_kernels_within_the_tolerance_are_untouched(tmp_path):
    # 1.9 ms + 5 us ends 5 us into the next kernel (2 ms later): programmatic dependent launch, kept
    t = parse(_export(tmp_path / "rank0.sqlite", None, long={(0, 0): 2_005_000}))
    assert t.flagged == {} and "raw_dur_ns" not in t.events.column_names


# --- step ranges that overlap (Kineto's overlapping ProfilerSteps are clipped; nsys ranges were kept
# as recorded: steps claimed the same time twice, with no warning) -----------------------------------


def _overlapping_steps(path: Path, first_end: int, nested: bool = True) -> Path:
    """ProfilerStep#0 [1 ms, ``first_end``], #1 [11, 20.004] ms and #2 [20, 29] ms (relative ns), with a
    1 ms kernel in each (launched 0.1 ms in); ``nested``: also a range 'step 1' [11.1, 19.9] ms inside
    ProfilerStep#1 (one number: a nested annotation, no overlap)."""
    e = Export()
    e.gpu(0)
    e.process(100)
    for i, (t0, t1) in enumerate(
        [(1_000_000, first_end), (11_000_000, 20_004_000), (20_000_000, 29_000_000)]
    ):
        e.nvtx(100, t0, t1, f"ProfilerStep#{i}")
        e.launch(100, i + 1, t0 + 100_000, t0 + 105_000)
        e.kernel(100, 0, i + 1, t0 + 120_000, t0 + 1_120_000)
    if nested:
        e.nvtx(100, 11_100_000, 19_900_000, "step 1")
    return e.write(path)


def test_overlapping_step_ranges_end_where_the_next_starts(store, tmp_path):
    t = parse(_overlapping_steps(tmp_path / "rank0.sqlite", 12_000_000))
    # ProfilerStep#0 [1, 12] ms runs 1 ms into ProfilerStep#1 (from 11 ms): it ends at 11 ms, 10 ms
    # long, 11 ms recorded. ProfilerStep#1 runs 4 us into #2: within the 5 us tolerance, kept; and
    # 'step 1' nests in ProfilerStep#1 (same number): kept
    row = _row(t, "ProfilerStep#0")
    assert (row["dur_ns"], row["raw_dur_ns"], row["flag"]) == (10_000_000, 11_000_000, "overrun")
    assert [r["name"] for r in t.events.to_pylist() if r["flag"] is not None] == ["ProfilerStep#0"]
    assert t.flagged == {"overrun": 1}
    assert [w for w in t.warnings if "start of the next one" in w] == [
        "rank0.sqlite: 1 step range(s) run past the start of the next one: 'ProfilerStep#0' (11 ms recorded) "
        "runs 1 ms into 'ProfilerStep#1'; clipped to the next step's start (events.flag = 'overrun', "
        "raw_dur_ns keeps the recorded duration)"
    ]
    # the steps table reads the clipped range: step 0 [1, 11] ms, then 1 [11, 20.004], 2 [20, 29]
    assert [(s["step"], s["cpu_start_ns"] - EPOCH, s["cpu_end_ns"] - EPOCH) for s in t.steps.to_pylist()] == [
        (0, 1_000_000, 11_000_000),
        (1, 11_000_000, 20_004_000),
        (2, 20_000_000, 29_000_000),
    ]
    # counted in the run's issues, as Kineto's clipped ProfilerSteps are
    ingest(store, [tmp_path / "rank0.sqlite"], run="o")
    assert store.runs()["issues"].to_list() == [
        "1 repaired: step ran past the next step's start: clipped to it"
    ]


def test_a_number_spread_over_ranges_is_clipped_as_one(tmp_path):
    # ProfilerStep#0 [1, 12] ms with a nested 'step 0' [2, 11.5] ms: number 0 spans [1, 12] ms and runs
    # into number 1 (from 11 ms); both its ranges end at 11 ms (10 ms and 9 ms kept)
    e = Export()
    e.gpu(0)
    e.process(100)
    e.nvtx(100, 1_000_000, 12_000_000, "ProfilerStep#0")
    e.nvtx(100, 2_000_000, 11_500_000, "step 0")
    e.nvtx(100, 11_000_000, 20_000_000, "ProfilerStep#1")
    e.launch(100, 1, 1_100_000, 1_105_000)
    e.kernel(100, 0, 1, 1_120_000, 2_120_000)
    t = parse(e.write(tmp_path / "rank0.sqlite"))
    got = {r["name"]: (r["dur_ns"], r["raw_dur_ns"]) for r in t.events.to_pylist() if r["flag"] == "overrun"}
    assert got == {"ProfilerStep#0": (10_000_000, 11_000_000), "step 0": (9_000_000, 9_500_000)}
    (w,) = [w for w in t.warnings if "start of the next one" in w]
    assert "1 step range(s)" in w and "'ProfilerStep#0' (11 ms recorded) runs 1 ms into 'ProfilerStep#1'" in w


def test_step_ranges_that_do_not_overlap_are_untouched(tmp_path):
    t = parse(_overlapping_steps(tmp_path / "rank0.sqlite", 11_000_000, nested=False))
    assert t.flagged == {} and not [w for w in t.warnings if "next one" in w]
    assert "raw_dur_ns" not in t.events.column_names


def test_a_burst_seconds_after_the_rest_without_steps_is_not_clipped(tmp_path):
    """No steps: twenty 1 ms kernels (with their launch calls) every 2 ms from 1 ms, then three more
    5 s later. The 5 s gap is longer than the rest of the trace together, yet the far-end rule keeps
    the plain percentile range of every start ([1 ms, 5.045 s], margin 5.044 s): no row ends far past
    it, so none is clipped or flagged, and the window spans both bursts: from 1.02 ms (first kernel
    start) to 5,000 ms + 4 ms + 0.02 ms + 1 ms = 5,005.02 ms (last kernel end), i.e. 5,004,000,000 ns.
    (With the range of the bulk only, the three late launches would end far past it and be clipped.)"""
    e = Export()
    e.gpu(0)
    e.process(100)
    starts = [1_000_000 + 2_000_000 * k for k in range(20)] + [
        5_000_000_000 + 2_000_000 * k for k in range(3)
    ]
    for i, s in enumerate(starts):
        e.launch(100, i + 1, s, s + 5_000)
        e.kernel(100, 0, i + 1, s + 20_000, s + 1_020_000)
    s = Store(tmp_path / "t.duckdb")
    res = ingest(s, [e.write(tmp_path / "rank0.sqlite")])
    assert not [w for w in res.warnings if "far" in w or "clipped" in w], res.warnings
    assert s.sql("SELECT count(*) FROM events WHERE flag IS NOT NULL").item() == 0
    assert analyze(s, "temporal").frame.row(0, named=True)["window_ns"] == 5_004_000_000
