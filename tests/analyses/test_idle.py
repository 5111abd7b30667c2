"""idle: hand-made streams with answers worked out below, and agreement with HTA run in-process."""

from __future__ import annotations

import logging
import re

import polars as pl
import pytest

from tests.builders import kernel, kineto, launch
from tests.conftest import HTA_CASES, analyze, corpus, hta_case
from traceprof.core.errors import AnalysisError, UsageError
from traceprof.engine.findings import summarize
from traceprof.ingest.ingest import ingest

# Stream 7, times in us (kernel [start, end), launch at L):
#   A [0, 10)  L=-5     first of its stream: no gap
#   B [12, 20) L=1      gap 2, launched before A ended      -> kernel wait 2 (< 30)
#   C [60, 70) L=55     gap 40, launched at 55 > 20         -> host wait 40
#   D [75, 80) L=50     gap 5, launched before C ended      -> kernel wait 5
#   E [130, 140) L=60   gap 50 >= 30, launched before D end -> other 50
#   F [132, 135) L=61   nested in E: E runs 8 us past F's start on the same stream (> 5 us), an
#                       overrun: by default E is clipped to [130, 132) at ingest -> F's gap 0.
#                       HTA (recorded durations): prev row E ends 140 -> gap -8 (kernel wait -8)
#   G [150, 151) L=62   default: prev end max(132, 135) = 135 -> gap 15, kernel wait 15
#                       HTA: prev row F ends 135 -> gap 15, kernel wait 15
# Stream 9 (a memset, then a kernel without a launch event in the trace):
#   M [0, 4)   L=-2     first: nothing
#   N [100, 110) no launch -> not host wait; gap 96 >= 30 -> other 96
# Default: stream 7 host 40, kernel 2+5+0+15 = 22, other 50, idle 112; check: window [0, 151) = 151,
#   busy = 10+8+10+5+2+3+1 = 39 (E clipped), 151 - 39 = 112. Stream 9: idle 96 in window [0, 110).
# HTA rule: stream 7 kernel wait 2+5-8+15 = 14, host 40, other 50 -> idle 104.
STREAMS = [
    kernel("A", 7, 0, 10, 1),
    launch(-5, 1),
    kernel("B", 7, 12, 8, 2),
    launch(1, 2),
    kernel("C", 7, 60, 10, 3),
    launch(55, 3),
    kernel("D", 7, 75, 5, 4),
    launch(50, 4),
    kernel("E", 7, 130, 10, 5),
    launch(60, 5),
    kernel("F", 7, 132, 3, 6),
    launch(61, 6),
    kernel("G", 7, 150, 1, 7),
    launch(62, 7),
    kernel("Memset (Device)", 9, 0, 4, 8, cat="gpu_memset"),
    launch(-2, 8, name="cudaMemsetAsync"),
    kernel("N", 9, 100, 10, 9),
]


def _row(df, **keys):
    for k, v in keys.items():
        df = df.filter(df[k] == v)
    assert df.height == 1, df
    return df.row(0, named=True)


def test_hand_made_streams(store, tmp_path):
    ingest(store, [kineto(tmp_path / "r0.json.gz", STREAMS)], run="r")
    res = analyze(store, "idle", "r")
    s7 = _row(res.frame, stream=7)
    assert (s7["host_wait_ns"], s7["kernel_wait_ns"], s7["other_ns"]) == (40_000, 22_000, 50_000)
    assert (s7["idle_ns"], s7["window_ns"], s7["kernels"]) == (112_000, 151_000, 7)
    assert (s7["host_wait_gaps"], s7["kernel_wait_gaps"], s7["other_gaps"]) == (1, 4, 1)
    assert s7["host_wait_pct"] == pytest.approx(100 * 40 / 112)
    assert s7["idle_pct"] == pytest.approx(100 * 112 / 151)
    s9 = _row(res.frame, stream=9)
    assert (s9["host_wait_ns"], s9["kernel_wait_ns"], s9["other_ns"], s9["idle_ns"]) == (0, 0, 96_000, 96_000)
    # The rank: streams 7 [0, 151) and 9 [0, 110) us. Its window is [0, 151) (temporal's window,
    # computed there independently); the stream sums are 151 + 110 = 261 and 112 + 96 = 208 us,
    # and stream_idle_pct is of the stream sum: 208 / 261. (window_ns used to hold the 261 us sum.)
    r0 = _row(res.ranks, rank=0)
    assert (r0["streams"], r0["window_ns"], r0["stream_window_sum_ns"]) == (2, 151_000, 261_000)
    assert (r0["stream_idle_sum_ns"], r0["other_ns"]) == (208_000, 146_000)
    assert r0["stream_idle_pct"] == pytest.approx(100 * 208 / 261) and "idle_pct" not in r0
    assert r0["window_ns"] == _row(analyze(store, "temporal", "r").frame, rank=0)["window_ns"]
    assert [c.ys for c in res.charts()] == [
        ("stream_idle_pct",),
        ("host_wait_pct", "kernel_wait_pct", "other_pct"),
    ]


def test_device_level_idle_merges_the_streams(store, tmp_path):
    # STREAMS on one device, both streams as one timeline (E clipped to [130, 132) at ingest):
    #   M [0, 4) first; A [0, 10) gap 0 (kernel wait 0); B gap 12 - 10 = 2 kernel; C gap 40, L=55 > 20:
    #   host 40; D gap 5 kernel; N [100, 110) gap 20 < 30, no launch: kernel; E gap 130 - 110 = 20
    #   kernel; F gap 0 kernel; G gap 150 - 135 = 15 kernel. Host 40, kernel 2+5+20+20+15 = 62,
    #   other 0: idle 102 = window 151 - busy (10+8+10+5+10+5+1 = 49). All host wait ends at stream 7.
    ingest(store, [kineto(tmp_path / "r0.json.gz", STREAMS)], run="r")
    d = _row(analyze(store, "idle", "r").devices, rank=0)
    assert (d["host_wait_ns"], d["kernel_wait_ns"], d["other_ns"], d["idle_ns"]) == (
        40_000,
        62_000,
        0,
        102_000,
    )
    assert (d["window_ns"], d["kernels"], d["host_wait_gaps"], d["kernel_wait_gaps"]) == (151_000, 9, 1, 7)
    assert (d["host_wait_stream"], d["host_wait_stream_pct"]) == (7, 100.0)
    assert d["idle_pct"] == pytest.approx(100 * 102 / 151)


# Stream 7 does the work: K1 [0, 100) L=-5, K2 [200, 300) L=-4, K3 [400, 500) L=-3: gaps of 100 us
# launched early -> other 200. Stream 9 holds two kernels: X [0, 10) L=-1, Y [490, 500) L=450 > 10:
# one host-wait gap of 480 us. Stream sums: host 480 of 680 (71%). The device is idle only when
# stream 7 is: [100, 200) and [300, 400), other 200 of 200; Y starts inside K3 (gap 0).
SIDE_STREAM = [
    kernel("K1", 7, 0, 100, 1),
    launch(-5, 1),
    kernel("K2", 7, 200, 100, 2),
    launch(-4, 2),
    kernel("K3", 7, 400, 100, 3),
    launch(-3, 3),
    kernel("X", 9, 0, 10, 4),
    launch(-1, 4),
    kernel("Y", 9, 490, 10, 5),
    launch(450, 5),
]


def test_idle_verdict_cause_is_the_devices_not_a_near_empty_streams(store, tmp_path):
    ingest(store, [kineto(tmp_path / "r0.json.gz", SIDE_STREAM)], run="r")
    res = analyze(store, "idle", "r")
    assert _row(res.ranks, rank=0)["host_wait_pct"] == pytest.approx(100 * 480 / 680)
    d = _row(res.devices, rank=0)
    assert (d["host_wait_ns"], d["other_ns"], d["idle_ns"], d["host_wait_stream"]) == (
        0,
        200_000,
        200_000,
        None,
    )
    f = summarize(store, "r")
    idle = next(x for x in f.findings if x.topic == "idle")
    assert idle.cause == ""
    assert (
        "of the GPU's idle time (no stream busy) host wait (kernels launched late) 0%, kernel wait 0%, "
        in idle.text
    )
    assert "other 100%" in idle.text and "stream idle time" not in idle.text


def test_rank_window_is_temporals_on_a_corpus_trace(store):
    # trace_filter rank 0 has 5 streams over a 1.22 s trace: the summed stream windows are ~4.8 s.
    ingest(store, [corpus("hta/trace_filter")], run="r")
    ranks = analyze(store, "idle", "r").ranks.sort("rank")
    temporal = analyze(store, "temporal", "r").frame.sort("rank")
    assert ranks["window_ns"].to_list() == temporal["window_ns"].to_list()
    assert (ranks["stream_window_sum_ns"] > 3 * ranks["window_ns"]).all()
    assert (ranks["stream_idle_pct"] <= 100).all()


@pytest.mark.parametrize("value", [-5, float("inf")])
def test_bad_kernel_wait(value):
    from traceprof.analyses.idle import Params

    with pytest.raises(UsageError, match="kernel_wait_ns="):
        Params(kernel_wait_ns=value)


def test_hand_made_streams_hta_rule_and_threshold(store, tmp_path):
    ingest(store, [kineto(tmp_path / "r0.json.gz", STREAMS)], run="r")
    s7 = _row(analyze(store, "idle", "r", hta=True).frame, stream=7)
    assert (s7["host_wait_ns"], s7["kernel_wait_ns"], s7["other_ns"]) == (40_000, 14_000, 50_000)
    # Threshold 5 us: D's gap 5 is no longer < 5 -> other; B (2), F (0) and G (15 -> other) change too:
    # kernel wait = 2 + 0 = 2, other = 50 + 5 + 15 = 70.
    s7 = _row(analyze(store, "idle", "r", kernel_wait_ns=5_000).frame, stream=7)
    assert (s7["host_wait_ns"], s7["kernel_wait_ns"], s7["other_ns"]) == (40_000, 2_000, 70_000)


# Stream 7, times in us (kernel [start, end), launch at L): a kernel nested inside a longer earlier one.
#   A [0, 100)    L=-5    first of its stream: no gap
#   B [97, 99)    L=1     nested in A: A runs 3 us past B's start (<= 5 us, programmatic dependent
#                         launch), so ingest leaves A whole. prev_end = 100 -> gap -3 -> 0, launched
#                         before A ended -> kernel wait 0
#   C [110, 111)  L=99.5  prev_end = max(100, 99) = 100 (A, not the previous row B): the launch
#                         (99.5) came before the stream was free -> not a host wait; gap 10 < 30 ->
#                         kernel wait 10
# Default: host 0, kernel 0 + 10 = 10, other 0, idle 10; check: window [0, 111) = 111, busy
#   [0, 100) + [110, 111) = 101, 111 - 101 = 10. (With prev_end = the previous row's end, B's 99,
#   C would be a host wait of 11 and idle 11 > window - busy.)
# HTA rule (previous row's end, negative gaps kept): B -3 (kernel wait), C host wait 11.
NESTED = [
    kernel("A", 7, 0, 100, 1),
    launch(-5, 1),
    kernel("B", 7, 97, 2, 2),
    launch(1, 2),
    kernel("C", 7, 110, 1, 3),
    launch(99.5, 3),
]


def test_gap_after_a_nested_kernel_is_measured_from_the_running_max_end(store, tmp_path):
    ingest(store, [kineto(tmp_path / "r0.json.gz", NESTED)], run="r")
    assert store.sql("SELECT count(*) FROM events WHERE flag IS NOT NULL").item() == 0  # A is not clipped
    s7 = _row(analyze(store, "idle", "r").frame, stream=7)
    assert (s7["host_wait_ns"], s7["kernel_wait_ns"], s7["other_ns"]) == (0, 10_000, 0)
    assert (s7["host_wait_gaps"], s7["kernel_wait_gaps"], s7["other_gaps"]) == (0, 2, 0)
    assert (s7["idle_ns"], s7["window_ns"]) == (10_000, 111_000)
    t = _row(analyze(store, "temporal", "r").frame, rank=0)
    assert s7["idle_ns"] == t["idle_ns"] == t["window_ns"] - 101_000  # one stream: idle = window - busy
    hta = _row(analyze(store, "idle", "r", hta=True).frame, stream=7)
    assert (hta["host_wait_ns"], hta["kernel_wait_ns"], hta["other_ns"]) == (11_000, -3_000, 0)


# ProfilerStep#1 [0, 100) and #2 [100, 200) us on the training thread; stream 7 (launch at L):
#   W [-30, -10)  L=-35   warm-up before the first step
#   K [10, 60)    L=5     inside step 1
#   T [150, 250)  L=140   launched in step 2, runs 50 us past the end of the last step
# Step window [0, 200) = 200 us; busy = |(W ∪ K ∪ T) ∩ [0, 200)| = 0 + 50 + 50 = 100 us, so step
# idle = 100 us (50 %). Unclipped activity would count W's 20 and T's 100: busy 170 > the part
# inside the window, idle 30. (The activity window [-30, 250) = 280 us, busy 170, idle 110.)
STEPPED = [
    {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 100},
    {
        "ph": "X",
        "cat": "user_annotation",
        "name": "ProfilerStep#2",
        "pid": 1,
        "tid": 1,
        "ts": 100,
        "dur": 100,
    },
    kernel("W", 7, -30, 20, 1),
    launch(-35, 1),
    kernel("K", 7, 10, 50, 2),
    launch(5, 2),
    kernel("T", 7, 150, 100, 3),
    launch(140, 3),
]


def test_step_window_counts_only_activity_inside_the_steps(store, tmp_path):
    ingest(store, [kineto(tmp_path / "r0.json.gz", STEPPED)], run="r")
    want = {
        "step_window_ns": 200_000,
        "step_busy_ns": 100_000,
        "step_idle_ns": 100_000,
        "step_idle_pct": 50.0,
    }
    for row in (
        _row(analyze(store, "idle", "r").ranks, rank=0),
        _row(analyze(store, "temporal", "r").frame, rank=0),
    ):
        assert {k: row[k] for k in want} == want
    t = _row(analyze(store, "temporal", "r").frame, rank=0)
    assert (t["window_ns"], t["idle_ns"]) == (280_000, 110_000)


def test_cpu_only_run_is_an_error(store, tmp_path):
    cpu = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0, "dur": 5}]
    ingest(store, [kineto(tmp_path / "cpu.json.gz", cpu)], run="cpu")
    with pytest.raises(AnalysisError, match="no GPU kernels"):
        analyze(store, "idle", "cpu")


def test_launches_without_kernel_records_are_no_idle_verdict(store, tmp_path):
    # Three kernel launches (two cudaLaunchKernel, one cuLaunchKernel) and a cudaMemcpyAsync, but the
    # trace holds only the copy's GPU row (no "kernel" category: the kernel activity was not
    # captured). The copy's gaps are not the GPU's idle time: no idle breakdown, and the verdict is
    # inconclusive with the counts (3 launches, 1 copy), not "idle 90%, host wait".
    rows = [
        launch(0, 1),
        launch(10, 2),
        launch(20, 3, name="cuLaunchKernel"),
        launch(30, 4, name="cudaMemcpyAsync"),
        kernel("Memcpy HtoD (Pageable -> Device)", 7, 90, 10, 4, cat="gpu_memcpy"),
        kernel("Memcpy HtoD (Pageable -> Device)", 7, 190, 10, 4, cat="gpu_memcpy"),
    ]
    ingest(store, [kineto(tmp_path / "r0.json.gz", rows)], run="r")
    why = (
        "3 kernel launch call(s) were recorded (2 cudaLaunchKernel, 1 cuLaunchKernel) but no GPU kernel "
        "activity was captured (the trace holds 2 copies/memsets and no kernel records)"
    )
    with pytest.raises(AnalysisError, match=re.escape(f"run 'r': {why}")):
        analyze(store, "idle", "r")
    f = summarize(store, "r")
    v = {v.topic: v for v in f.verdicts}["idle"]
    assert v.status == "inconclusive" and v.text.startswith(why)
    assert not [x for x in f.findings if x.topic == "idle"]
    # no GPU row at all (an Nsight export with every activity table empty): the same verdict, where
    # there was none (temporal has nothing to measure)
    ingest(store, [kineto(tmp_path / "r1.json.gz", rows[:4])], run="bare")
    v = {v.topic: v for v in summarize(store, "bare").verdicts}["idle"]
    assert v.status == "inconclusive" and v.text.startswith(
        "3 kernel launch call(s) were recorded (2 cudaLaunchKernel, 1 cuLaunchKernel) but no GPU kernel "
        "activity was captured (the trace holds 0 copies/memsets and no kernel records)"
    )


# Ten kernels on stream 7, kernel i [100 i, 100 i + 10) us launched at 100 i - 5: each gap (90 us)
# is a host wait; idle 9 x 90 = 810 of the window [0, 910): 89 %, a problem on these records.
TEN = [r for i in range(10) for r in (kernel(f"K{i}", 7, 100 * i, 10, i + 1), launch(100 * i - 5, i + 1))]


def _idle_verdict(store, run):
    f = summarize(store, run)
    return {v.topic: v for v in f.verdicts}["idle"], next(x for x in f.findings if x.topic == "idle")


#: 10 CUDA graph replays (corr 1-10, launched 5 us before), each one kernel [100 i, 100 i + 10) us,
#: the last one's kernel not traced: 1 of 10 graph launches (10.0 %) without a GPU record.
LAST_GRAPH_LOST = [
    *(kernel(f"K{i}", 7, 100 * i, 10, i + 1) for i in range(9)),
    *(launch(100 * i - 5, i + 1, name="cudaGraphLaunch") for i in range(10)),
]


@pytest.mark.parametrize(
    ("rows", "note", "window_busy_us"),
    [
        # one more cudaLaunchKernel (corr 99, at 950 us) whose kernel the trace does not hold (still
        # running when the profiler stopped): 1 of 11 calls, 9.1 % <= 10 %
        pytest.param(
            [*TEN, launch(950, 99)],
            "kernel launches with no GPU record (rank 0: 1 of 11 (9.1%)), at most 10% of a rank's kernel launch "
            "calls (e.g. kernels still running when the profiler stopped): idle time is overstated by their GPU time",
            (910, 100),
            id="kernel",
        ),
        # as kernel launches: 1 of 10 graph launches (10.0 % <= 10 %; the window [0, 810) us, 9 kernels
        # of 10 us busy). Before, any graph launch without a GPU record made idle inconclusive
        # ("incomplete: ... 1 on rank(s) 0").
        pytest.param(
            LAST_GRAPH_LOST,
            "CUDA graph launches with no GPU record (rank 0: 1 of 10 (10.0%)), at most 10% of a rank's CUDA graph "
            "launches (no kernel rows and no graph-level rows): idle time is overstated by their GPU time",
            (810, 90),
            id="graph",
        ),
    ],
)
def test_a_few_launches_without_gpu_records_are_a_note(store, tmp_path, rows, note, window_busy_us):
    # a note, and the verdict stands: idle (window - busy) / window
    ingest(store, [kineto(tmp_path / "r0.json.gz", rows)], run="r")
    assert note in analyze(store, "idle", "r").notes
    v, found = _idle_verdict(store, "r")
    window, busy = window_busy_us
    assert (
        v.status == "problem"
        and found.problem
        and found.value == pytest.approx(100 * (window - busy) / window)
    )
    assert "incomplete" not in v.text


def test_many_launches_without_kernel_records_make_idle_inconclusive(store, tmp_path):
    # two more calls with no kernel record (a cudaLaunchKernel and a cuLaunchKernel; the
    # cudaMemcpyAsync and the cudaGraphLaunch are no kernel launch calls): 2 of 12, 16.7 % > 10 %.
    # The 89 % idle share is measured on records known to be incomplete: inconclusive, not a problem.
    rows = [
        *TEN,
        launch(250, 98),
        launch(650, 99, name="cuLaunchKernel"),
        launch(660, 100, name="cudaMemcpyAsync"),
    ]
    ingest(store, [kineto(tmp_path / "r0.json.gz", rows)], run="r")
    note = (
        "incomplete: kernel launches with no GPU record (rank 0: 2 of 12 (16.7%)), more than 10% of a rank's "
        "kernel launch calls: their kernels' GPU time is missing"
    )
    assert any(n.startswith(note) for n in analyze(store, "idle", "r").notes)
    v, found = _idle_verdict(store, "r")
    assert v.status == "inconclusive" and not found.problem
    assert v.text.startswith("the GPU is idle 89% of the window") and note in v.text


def test_graph_launches_without_gpu_records_make_idle_inconclusive(store, tmp_path):
    # a cudaGraphLaunch (corr 99) with no GPU record, the rank's only one: 1 of 1 (100 %) > 10 %:
    # ingest's "incomplete" note (its graph's GPU time is missing, idle overstated); the idle verdict
    # says so and is no problem
    ingest(store, [kineto(tmp_path / "r0.json.gz", [*TEN, launch(250, 99, name="cudaGraphLaunch")])], run="r")
    v, found = _idle_verdict(store, "r")
    assert v.status == "inconclusive" and not found.problem
    assert (
        "incomplete: CUDA graph launches with no GPU record (rank 0: 1 of 1 (100.0%)), more than 10%"
        in v.text
    )
    assert not any("kernel launches with no GPU record" in n for n in analyze(store, "idle", "r").notes)


def test_graph_launches_lost_in_a_store_without_their_count_keep_idle_inconclusive(store, tmp_path):
    # a store ingested before the graph launches were counted (no traces.meta.graph_launches): no
    # share to weigh, so any of them lost still makes the figures incomplete, as before
    ingest(store, [kineto(tmp_path / "r0.json.gz", LAST_GRAPH_LOST)], run="r")
    store.con.execute("UPDATE traces SET meta = json_merge_patch(meta, '{\"graph_launches\": null}')")
    assert "incomplete: CUDA graph launches with no GPU record: 1 on rank(s) 0" in "".join(
        analyze(store, "idle", "r").notes
    )


# --- agreement with HTA 0.5.0 ------------------------------------------------------------------


#: Corpus traces compared with HTA: old style (2 ranks), new style with fractional us (HTA rounds),
#: kernels without launch events, a V100 trace, and ROCm.
@pytest.mark.slow
@pytest.mark.parametrize("rel", HTA_CASES)
def test_idle_matches_hta(store, rel):
    t = hta_case(store, rel)
    from hta.analyzers.breakdown_analysis import BreakdownAnalysis

    mine = analyze(store, "idle", "r", hta=True).frame
    logging.disable(logging.WARNING)
    try:
        theirs = {
            r: BreakdownAnalysis.get_idle_time_breakdown(
                t, consecutive_kernel_delay=30, rank=r, visualize=False
            )[0]
            for r in t.get_ranks()
        }
    finally:
        logging.disable(logging.NOTSET)
    n_streams = 0
    for rank, df in theirs.items():
        for stream, part in df.groupby("stream"):
            m = _row(mine, rank=int(rank), stream=int(stream))
            hta_us = dict(zip(part["idle_category"], part["idle_time"], strict=True))
            total = sum(hta_us.values())
            for cat in ("host_wait", "kernel_wait", "other"):
                # HTA's times are whole us, ours ns of the same gaps: equal within 1 us.
                assert m[f"{cat}_ns"] == pytest.approx(hta_us.get(cat, 0.0) * 1000, abs=1000), (stream, cat)
                if total:
                    assert m[f"{cat}_pct"] == pytest.approx(100 * hta_us.get(cat, 0.0) / total, abs=0.1)
            n_streams += 1
    assert n_streams == mine.height  # the same streams, no more


def test_hta_mode_on_a_cpu_run_says_it_reads_kernels_only(store):
    # sample_traces/normal: a gloo CPU run, no GPU kernels. Without hta the training-thread ops are
    # its activity; hta=true reads kernels only, as HTA does, and the error says so (it said "no
    # GPU kernels and no CPU training-thread ops", untrue of this run).
    from tests.conftest import SAMPLES

    ingest(store, [SAMPLES / "normal"])
    assert analyze(store, "temporal", "normal").frame.height > 0
    with pytest.raises(AnalysisError, match=r"run 'normal': no GPU kernels; hta=true reads GPU kernels only"):
        analyze(store, "temporal", "normal", hta=True)


def test_hta_mode_step_window_spans_the_steps_it_keeps(store):
    # trace_filter (HTA's test data, ranks 0 and 1, ProfilerStep#551 and #552): hta=true keeps the GPU
    # events launched before the last step's start, as HTA 0.5.0 does (window 600,058,000 ns on rank 0,
    # idle 53.56 %); the step window spanned both steps (1,230,289,000 ns: step idle 77.35 %, the
    # dropped step's time counted as idle). It now spans the step kept, ProfilerStep#551 of rank 0:
    # ts 1682725898079292 us, dur 607312 us in rank 0's file (steps: cpu_end - cpu_start = 607,312,000 ns);
    # all the kept activity lies inside it, so step_busy = window - idle = 600,058,000 - 321,378,000 =
    # 278,680,000; step_idle = 607,312,000 - 278,680,000 = 328,632,000 = 54.11 % of the step window.
    ingest(store, [corpus("hta/trace_filter")], run="tf")
    for name, table in (("temporal", "frame"), ("idle", "ranks")):
        r = analyze(store, name, "tf", hta=True)
        row = r.frames()[table].filter(r.frames()[table]["rank"] == 0).row(0, named=True)
        assert (row["step_window_ns"], row["step_busy_ns"], row["step_idle_ns"]) == (
            607_312_000,
            278_680_000,
            328_632_000,
        ), name
        assert row["step_idle_pct"] == pytest.approx(100 * 328_632_000 / 607_312_000)  # 54.11
    # without hta both steps are the window (ProfilerStep#552 ends at 1682725899309581 us)
    full = analyze(store, "temporal", "tf").frame.filter(pl.col("rank") == 0)
    assert full["step_window_ns"][0] == 1_682_725_899_309_581_000 - 1_682_725_898_079_292_000


def test_a_stepless_run_has_no_step_account(store, tmp_path):
    # SIDE_STREAM has no ProfilerStep: critical_path's one window per rank is its first to last
    # activity (a GPU rank's activity is its GPU rows, engine.activity), K1's start at 0 to Y's end at
    # 500 us. The idle finding's account is of that window, not of a step time the run does not have.
    ingest(store, [kineto(tmp_path / "r0.json.gz", SIDE_STREAM)], run="r")
    f = summarize(store, "r")
    cp = f.results["critical_path"].frame
    assert cp["step"].to_list() == [None] and cp["step_ns"].to_list() == [500_000]
    idle = next(x for x in f.findings if x.topic == "idle")
    pct = 100 * (cp["host_bound_ns"] + cp["idle_ns"]).sum() / 500_000
    assert idle.recoverable_pct == pytest.approx(pct) and pct > 0
    assert idle.text.endswith(
        f"; time account (no steps): host-bound and idle time {pct:.1f}% of all ranks' windows (first to last activity)"
    )
    assert "step time" not in idle.text and "step time" not in f.ranking
    assert "the run has no steps" in f.ranking
