"""Issue 27, item 4: one definition of excluded time, the same in every analysis.

Hand-worked micro traces: a GPU record a few us before its launch call is jitter (kept), one far
before it is another clock domain (left out); a CPU op with ``dur: -1`` is still open at profiler
stop (kept, clipped to the trace's end); the profiler-start transient is left out of overlap,
temporal, gaps and the summary as it is of stragglers and what-if.
"""

from __future__ import annotations

import json

import polars as pl
import pytest

from tests.builders import BASE, pid1_op, stream_kernel, transient_rank, write_rank
from tests.conftest import analyze
from traceprof.core.display import duration
from traceprof.core.errors import TraceFormatError
from traceprof.engine.findings import summarize
from traceprof.ingest.ingest import ingest
from traceprof.render.export import export_perfetto

US = 1000
MS = 1_000_000


def _row(df: pl.DataFrame, **eq: object) -> dict:
    return df.filter(*(pl.col(k) == v for k, v in eq.items())).row(0, named=True)


# --- launch skew: jitter is kept, another clock domain is not ------------------------------------


def _gpu_trace(gemm_ahead_ns: int) -> list[dict]:
    """ProfilerStep#1 over [0, 4000] us. A 500 us GEMM launched at 2000 us (cudaLaunchKernel, 5 us,
    correlation 1) but stamped ``gemm_ahead_ns`` before its launch call; a 50 us fill launched at
    3000 us that starts 20 us later, at 3020 (correlation 2)."""
    gemm_ts = (2000 * US - gemm_ahead_ns) / 1000  # us, exact to the ns with 3 decimals
    return [
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "ProfilerStep#1",
            "pid": 1,
            "tid": 1,
            "ts": 0,
            "dur": 4000,
        },
        {
            "ph": "X",
            "cat": "cuda_runtime",
            "name": "cudaLaunchKernel",
            "pid": 1,
            "tid": 1,
            "ts": 2000,
            "dur": 5,
            "args": {"correlation": 1},
        },
        {
            "ph": "X",
            "cat": "kernel",
            "name": "gemm",
            "pid": 0,
            "tid": 7,
            "ts": gemm_ts,
            "dur": 500,
            "args": {"correlation": 1, "device": 0, "stream": 7},
        },
        {
            "ph": "X",
            "cat": "cuda_runtime",
            "name": "cudaLaunchKernel",
            "pid": 1,
            "tid": 1,
            "ts": 3000,
            "dur": 5,
            "args": {"correlation": 2},
        },
        {
            "ph": "X",
            "cat": "kernel",
            "name": "fill",
            "pid": 0,
            "tid": 7,
            "ts": 3020,
            "dur": 50,
            "args": {"correlation": 2, "device": 0, "stream": 7},
        },
    ]


@pytest.mark.parametrize(
    "ahead_ns, flag",
    [
        (5_000, None),  # within the 5 us tolerance: nothing to say
        (10_000, "launch_skew"),  # the 10 us: jitter, kept
        (1_000_000, "launch_skew"),  # 1 ms: the largest jitter
        (1_000_001, "before_launch"),  # 1 ms + 1 ns: another clock domain, left out
    ],
)
def test_launch_skew_flip_point(store, tmp_path, ahead_ns, flag):
    write_rank(tmp_path / "run" / "rank0.json", _gpu_trace(ahead_ns), 0, world=1, backend="nccl")
    res = ingest(store, [tmp_path / "run"], run="g")
    assert store.sql("SELECT flag FROM events WHERE name = 'gemm'").item() == flag
    t = _row(analyze(store, "temporal", "g").frame, rank=0)
    lat = _row(analyze(store, "launch", "g").frame, rank=0)
    skew = [w for w in res.warnings if "clock jitter" in w]
    out = tmp_path / "all.json"
    export_perfetto(store, "g", out)
    exported = {e["name"] for e in json.loads(out.read_text())["traceEvents"] if e.get("ph") == "X"}
    if flag == "before_launch":
        # the GEMM is left out: busy = the fill, 50 us; window [3020, 3070] us; the export lacks it
        assert (t["window_ns"], t["compute_ns"]) == (50 * US, 50 * US)
        assert "gemm" not in exported and not skew
        assert lat["kernels"] == 1
    else:
        # the GEMM's 500 us count: window from its start (2000 us - ahead) to the fill's end at
        # 3070 us; busy 500 + 50 = 550 us; idle = window - 550 us
        window = 3070 * US - (2000 * US - ahead_ns)
        assert (t["window_ns"], t["compute_ns"], t["idle_ns"]) == (window, 550 * US, window - 550 * US)
        assert "gemm" in exported
        assert lat["kernels"] == 2  # counted as work ...
        if flag == "launch_skew":
            (w,) = skew
            assert f"by up to {duration(ahead_ns)}" in w and "kept with their work" in w
            # ... but its latency (negative) is not measured: only the fill's 20 us
            assert (lat["launches"], lat["latency_p50_ns"], lat["latency_max_ns"]) == (1, 20 * US, 20 * US)
            assert any("left out of the latency figures" in n for n in analyze(store, "launch", "g").notes)
        else:
            assert not skew
            # within the tolerance: a -5 us latency is measured as it is recorded
            assert (lat["launches"], lat["latency_max_ns"]) == (2, 20 * US)


# --- dur: -1 on a CPU op: still open at profiler stop ---------------------------------------------


def _open_trace(general_path: bool, open_kind: str = "cpu_op", dur: float = -1) -> dict:
    """ProfilerStep#1 [0, 100] us; aten::mm [10, 60]; aten::open at 70 with ``dur``; aten::last
    [80, 120]: the trace ends at 120 us. ``general_path`` adds a B/E pair (the per-event parser; on another thread)."""
    ev = [
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "ProfilerStep#1",
            "pid": 1,
            "tid": 1,
            "ts": 0,
            "dur": 100,
        },
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10, "dur": 50},
        {"ph": "X", "cat": open_kind, "name": "aten::open", "pid": 1, "tid": 1, "ts": 70, "dur": dur},
        {"ph": "X", "cat": "cpu_op", "name": "aten::last", "pid": 1, "tid": 1, "ts": 80, "dur": 40},
    ]
    if general_path:
        ev += [
            {"ph": "B", "cat": "cpu_op", "name": "b", "pid": 1, "tid": 9, "ts": 1},
            {"ph": "E", "cat": "cpu_op", "name": "b", "pid": 1, "tid": 9, "ts": 2},
        ]
    return ev


@pytest.mark.parametrize("general_path", [False, True])
def test_cpu_op_still_open_at_stop_is_clipped_with_a_warning(store, tmp_path, general_path):
    f = write_rank(tmp_path / "run" / "rank0.json", _open_trace(general_path), 0, world=1)
    res = ingest(store, [f], run="o")  # default ingest: no --skip-bad-events needed
    (w,) = [w for w in res.warnings if "still open" in w]
    assert "rank0.json: 1 CPU op(s)" in w and "#2 'aten::open'" in w  # the event index and its name
    # clipped to the trace's end, 120 us: 120 - 70 = 50 us; the recorded -1 us kept
    row = store.sql(
        f"SELECT ts_ns - {BASE} AS t, dur_ns, raw_dur_ns, flag FROM events WHERE name = 'aten::open'"
    ).row(0)
    assert row == (70 * US, 50 * US, -1 * US, "unclosed")
    assert store.sql("SELECT rejected FROM traces").item() in (None, "{}")
    # it counts as the training thread's work: busy = [10, 60] + [70, 120] = 100 us of [10, 120]
    t = _row(analyze(store, "temporal", "o").frame, rank=0)
    assert (t["window_ns"], t["compute_ns"], t["idle_ns"]) == (110 * US, 100 * US, 10 * US)


# --- a CPU op whose end lies far past the steps: clipped like a GPU lane's far end ---------------
#
# _open_trace's step is [0, 100] us, so the margin is max(100 us, 1 s) = 1 s: an end later than
# 100 us + 1 s = 1_000_100 us is far past. The trace's end is then aten::last's, 120 us.


@pytest.mark.parametrize("general_path", [False, True])
@pytest.mark.parametrize(
    "start_us, dur_us, clipped_us",
    [
        (70, 3e15, 50),  # starts inside ProfilerStep#1, 95 years long: 120 - 70 = 50 us
        (110, 3e15, 10),  # starts after the step, among the others: 120 - 110 = 10 us
        (70, 1_000_031, 50),  # ends at 1_000_101 us: 1 us past the margin
    ],
)
def test_cpu_op_ending_far_past_the_steps_is_clipped(
    store, tmp_path, general_path, start_us, dur_us, clipped_us
):
    ev = _open_trace(general_path, dur=dur_us)
    ev[2]["ts"] = start_us
    f = write_rank(tmp_path / "run" / "rank0.json", ev, 0, world=1)
    res = ingest(store, [f], run="o")
    (w,) = [w for w in res.warnings if "end far past" in w]
    assert "rank0.json: 1 CPU record(s)" in w and "#2 'aten::open'" in w and "more than 1.000 s" in w
    row = store.sql(
        f"SELECT ts_ns - {BASE} AS t, dur_ns, raw_dur_ns, flag FROM events WHERE name = 'aten::open'"
    ).row(0)
    assert row == (start_us * US, clipped_us * US, int(dur_us) * US, "overrun")
    # kept in busy time, the window is the sound records' [10, 120] us: 110 us, not 95 years
    busy = 100 if start_us == 70 else 90  # [10, 60] + [70, 120], or [10, 60] + [80, 120]
    t = _row(analyze(store, "temporal", "o").frame, rank=0)
    assert (t["window_ns"], t["compute_ns"], t["idle_ns"]) == (110 * US, busy * US, (110 - busy) * US)


@pytest.mark.parametrize("dur_us", [1_000_000, 1_000_030])
def test_cpu_op_ending_within_the_margin_is_untouched(store, tmp_path, dur_us):
    # ends at 1_000_070 or 1_000_100 us: not more than 1 s past the step's end (100 us)
    f = write_rank(tmp_path / "run" / "rank0.json", _open_trace(False, dur=dur_us), 0, world=1)
    res = ingest(store, [f], run="o")
    assert not [w for w in res.warnings if "far past" in w]
    row = store.sql("SELECT dur_ns, raw_dur_ns, flag FROM events WHERE name = 'aten::open'").row(0)
    assert row == (dur_us * US, None, None)
    assert store.sql("SELECT count(*) FROM events WHERE flag IS NOT NULL").item() == 0
    assert store.runs()["issues"].to_list() == [""]
    # window [10, 70 + dur] us
    t = _row(analyze(store, "temporal", "o").frame, rank=0)
    assert t["window_ns"] == (60 + dur_us) * US


def test_session_span_past_the_steps_is_kept_as_recorded(store, tmp_path):
    # The profiler session's own span (cat "Trace", kind other) runs from start to stop, here 3 s
    # from 0 us: more than 1 s past the step, yet it enters no window and keeps its duration.
    ev = _open_trace(False, dur=5)
    ev.append(
        {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": 1, "tid": 1, "ts": 0, "dur": 3e6}
    )
    f = write_rank(tmp_path / "run" / "rank0.json", ev, 0, world=1)
    res = ingest(store, [f], run="o")
    assert not [w for w in res.warnings if "far past" in w]
    got = store.sql(
        "SELECT kind, dur_ns, raw_dur_ns, flag FROM events WHERE name = 'PyTorch Profiler (0)'"
    ).row(0)
    assert got == ("other", 3 * 10**9, None, None)
    # window [10, 120] us: the ops', not the session's
    assert _row(analyze(store, "temporal", "o").frame, rank=0)["window_ns"] == 110 * US


def test_op_still_open_ends_at_the_sound_records_not_a_far_end(store, tmp_path):
    # aten::open is still open (dur -1) and a second op at 90 us runs 3e15 us: both end at
    # aten::last's 120 us, not at 90 us + 95 years.
    ev = _open_trace(False)
    ev.append({"ph": "X", "cat": "cpu_op", "name": "aten::far", "pid": 1, "tid": 2, "ts": 90, "dur": 3e15})
    f = write_rank(tmp_path / "run" / "rank0.json", ev, 0, world=1)
    ingest(store, [f], run="o")
    got = store.sql(
        f"SELECT name, ts_ns - {BASE}, dur_ns, raw_dur_ns, flag FROM events WHERE flag IS NOT NULL ORDER BY name"
    ).rows()
    assert got == [
        ("aten::far", 90 * US, 30 * US, 3 * 10**18, "overrun"),
        ("aten::open", 70 * US, 50 * US, -US, "unclosed"),
    ]


@pytest.mark.parametrize("cat, dur", [("kernel", -1), ("cpu_op", -2), ("cpu_op", -0.5)])
def test_other_negative_durations_are_still_refused(store, tmp_path, cat, dur):
    # only -1 on a CPU-side op is the profiler's "still open" mark; a GPU record with -1, or any
    # other negative duration, is an error naming the event
    ev = _open_trace(False, cat, dur)
    if cat == "kernel":
        ev[2]["args"] = {"device": 0, "stream": 7}
    f = write_rank(tmp_path / "run" / "rank0.json", ev, 0, world=1)
    with pytest.raises(TraceFormatError, match=r"event #2 .*aten::open.*negative 'dur'"):
        ingest(store, [f], run="o")


# --- the profiler-start transient: left out everywhere ---------------------------------------------


def test_profiler_start_transient_is_left_out_of_every_analysis(store, tmp_path):
    for r in (0, 1):
        write_rank(tmp_path / "run" / f"rank{r}.json", transient_rank(r), r)
    ingest(store, [tmp_path / "run"], run="tr")
    # The transient: skews 3000, 0.1, 0.1, 0.1 ms; threshold max(20 x 0.1 ms, the 10 ms median
    # step) = 10 ms; the profiling starts differ by 3000 ms: step 1 is the transient.
    ov = analyze(store, "overlap", "tr")
    assert any(n.startswith("profiler-start transient: the first collective to arrive") for n in ov.notes)
    # Left out, rank 0's communication is 3 x 0.6 ms, none of it under compute (the gloo work
    # starts when aten::mm ends): exposed 1.8 ms of the window [3010, 3035.6] ms = 25.6 ms; rank 1:
    # 3 x 0.5 = 1.5 ms of 25.6 ms. With it, rank 0 would show 3000.5 ms more exposed communication.
    r0, r1 = _row(ov.frame, rank=0), _row(ov.frame, rank=1)
    assert (r0["comm_ns"], r0["exposed_comm_ns"], r0["window_ns"]) == (1_800_000, 1_800_000, 25_600_000)
    assert (r1["comm_ns"], r1["exposed_comm_ns"], r1["window_ns"]) == (1_500_000, 1_500_000, 25_600_000)
    assert ov.steps["step"].unique().sort().to_list() == [2, 3, 4]
    te = analyze(store, "temporal", "tr")
    # busy: aten::mm 3 x 5 ms + the gloo work 3 x 0.6 ms (rank 0): 16.8 ms of 25.6 ms
    assert (
        _row(te.frame, rank=0)["window_ns"] == 25_600_000 and _row(te.frame, rank=0)["idle_ns"] == 8_800_000
    )
    gaps = analyze(store, "gaps", "tr")
    assert int(gaps.gaps["dur_ns"].max()) == 600_000  # no 3 s gap
    # the summary's communication finding is the steady state's: median over ranks of 1.8/25.6
    # and 1.5/25.6 = (7.03 + 5.86) / 2 = 6.45 %, not a 3 s exposed all-reduce
    f = summarize(store, "tr")
    (comm,) = [x for x in f.findings if x.topic == "communication"]
    assert comm.cost_pct == pytest.approx(100 * (1.8 + 1.5) / 2 / 25.6)


def test_runs_without_a_transient_keep_every_step(store, tmp_path):
    # The same job with both profilers started together (step 1 from 3000 ms on both ranks): no
    # transient, step 1 stays in overlap.
    for r in (0, 1):
        write_rank(tmp_path / "run" / f"rank{r}.json", transient_rank(r, late=False), r)
    ingest(store, [tmp_path / "run"], run="ok")
    ov = analyze(store, "overlap", "ok")
    assert not any("transient" in n for n in ov.notes)
    assert ov.steps["step"].unique().sort().to_list() == [1, 2, 3, 4]
    assert _row(ov.frame, rank=0)["window_ns"] == 35_600_000  # [3000, 3035.6] ms


# --- a ProfilerStep that outlasts the trace (hta/triton_example: ProfilerStep#1 recorded 13.3 s,
# the profiler's Record Window End 1.84 ms after it starts) --------------------------------------


def _step_past_end(window_end_us: float | None, step_dur_us: float = 13_336_315.805) -> list[dict]:
    """ProfilerStep#1 from 0 us, ``step_dur_us`` long; a CPU op [5, 1500] us launching one 2 us
    kernel at [20, 22] us (correlation 1); the Record Window End instant at ``window_end_us``."""
    ev = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0,
         "dur": step_dur_us},
        {"ph": "X", "cat": "cpu_op", "name": "aten::triton", "pid": 1, "tid": 1, "ts": 5, "dur": 1495},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 10,
         "dur": 5, "args": {"correlation": 1}},
        {"ph": "X", "cat": "kernel", "name": "triton_", "pid": 0, "tid": 7, "ts": 20, "dur": 2,
         "args": {"correlation": 1, "device": 0, "stream": 7}},
    ]  # fmt: skip
    if window_end_us is not None:
        ev.append(
            {"ph": "i", "s": "g", "name": "Record Window End", "pid": "", "tid": "", "ts": window_end_us}
        )
    return ev


@pytest.mark.parametrize(
    "window_end_us, kept_us",
    [
        (1837.333, 1837.333),  # clipped to the profiler's stop, later than the records' end (1500 us)
        (None, 1500),  # no stop mark: to the records' end; 13.3 s past it > 1 s and the 1.5 ms before it
    ],
)
def test_step_past_the_end_of_the_trace_is_clipped_for_every_analysis(
    store, tmp_path, window_end_us, kept_us
):
    f = write_rank(tmp_path / "run" / "rank0.json", _step_past_end(window_end_us), 0, world=1)
    res = ingest(store, [f], run="t")
    (w,) = [w for w in res.warnings if "ProfilerStep(s) run past the end of the trace" in w]
    kept_ns = round(kept_us * 1000)
    assert f"ProfilerStep#1 (13.3 s recorded, {duration(kept_ns)} kept)" in w
    row = store.sql("SELECT dur_ns, raw_dur_ns, flag FROM events WHERE name = 'ProfilerStep#1'").row(0)
    assert row == (kept_ns, 13_336_315_805, "overrun")
    assert store.sql("SELECT step, cpu_end_ns - cpu_start_ns FROM steps").rows() == [(1, kept_ns)]
    # temporal's step window is the clipped step (was 13,336,315,805 ns); critical_path's step ends
    # where its work ends (the kernel, 22 us), as on every GPU rank: neither reads 13.3 s
    t = _row(analyze(store, "temporal", "t").frame, rank=0)
    assert (t["window_ns"], t["step_window_ns"], t["step_busy_ns"]) == (2 * US, kept_ns, 2 * US)
    assert analyze(store, "critical_path", "t").frame["step_ns"].to_list() == [22 * US]
    # idle: 0 % of the window (one kernel) but (kept - 2 us) / kept = 99.9 % of the step window:
    # not ok beside a step account of 99.9 % host-bound, and no problem on the window's measure
    found = summarize(store, "t")
    (v,) = [v for v in found.verdicts if v.topic == "idle"]
    assert (
        v.status == "inconclusive"
        and f"but idle {100 * (kept_ns - 2 * US) / kept_ns:.1f}% of the step window" in v.text
    )
    assert not [x for x in found.findings if x.status == "ok" and (x.recoverable_pct or 0) >= 10]


def test_idle_finding_names_both_windows_where_they_differ(store, tmp_path):
    # ProfilerStep#1 over [0, 1000] us; kernels at [100, 110] and [190, 200] us (launched at 20 and
    # 30 us). Activity window [100, 200] us: idle 80 / 100 = 80 %; step window [0, 1000] us: idle
    # 980 / 1000 = 98 %, the window of the step account that ranks the finding: both, each named
    # (the line read "idle 80% of the window" beside a ranking of 98 %)
    ev = _step_past_end(None, step_dur_us=1000)[:3] + [
        {"ph": "X", "cat": "kernel", "name": "triton_", "pid": 0, "tid": 7, "ts": 100, "dur": 10,
         "args": {"correlation": 1, "device": 0, "stream": 7}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 30,
         "dur": 5, "args": {"correlation": 2}},
        {"ph": "X", "cat": "kernel", "name": "triton_", "pid": 0, "tid": 7, "ts": 190, "dur": 10,
         "args": {"correlation": 2, "device": 0, "stream": 7}},
    ]  # fmt: skip
    ingest(store, [write_rank(tmp_path / "run" / "rank0.json", ev, 0, world=1)], run="t")
    (f,) = [f for f in summarize(store, "t").findings if f.topic == "idle"]
    assert f.text.startswith(
        "the GPU is idle 80% of the activity window (first to last activity; mean over ranks; rank 0 80%) "
        "and 98% of the step window (ProfilerStep start to end: the step account's)"
    )


def test_step_ending_before_the_profiler_stop_is_untouched(store, tmp_path):
    # A healthy last step: it ends 13 us after its last op (Python time, untraced) and 2 ms before
    # the Record Window End (normal/rank0: 13.4 us and 6.9 ms): nothing is clipped.
    f = write_rank(tmp_path / "run" / "rank0.json", _step_past_end(3513, step_dur_us=1513), 0, world=1)
    res = ingest(store, [f], run="t")
    assert not [w for w in res.warnings if "past the end of the trace" in w]
    assert store.sql("SELECT count(*) FROM events WHERE flag IS NOT NULL").item() == 0
    assert store.runs()["issues"].to_list() == [""]
    assert store.sql("SELECT cpu_end_ns - cpu_start_ns FROM steps").item() == 1513 * US


def test_step_a_little_past_its_records_without_a_stop_mark_is_untouched(store, tmp_path):
    # No Record Window End; the step ends 100 us after its last record (1500 us): not far past them
    # (1 s), so it is the step as recorded (hta/call_stack: 18 ms of 413 ms; tests/ingest/test_ingest's
    # micro step: 70.6 us past its kernel, 29.6 us before it)
    f = write_rank(tmp_path / "run" / "rank0.json", _step_past_end(None, step_dur_us=1600), 0, world=1)
    ingest(store, [f], run="t")
    assert store.sql("SELECT cpu_end_ns - cpu_start_ns, FROM steps").item() == 1600 * US


# --- ProfilerSteps that overlap (normal/rank0 with its first step recorded 50x too long: critical_path
# read 178 ms, 0, 0 and mfu 178, 59.9, 60.2 ms, 298 ms of steps in a 178 ms trace) ---------------


def _overlapping_steps(first_dur_us: float) -> list[dict]:
    """ProfilerStep#1..#3 every 100 us from 0 us, 100 us long but the first ``first_dur_us``; in
    each, a CPU op [5, 55] us in and a 30 us kernel [20, 50] us in (correlation = step)."""
    ev = []
    for k in range(3):
        t = 100 * k
        ev += [
            pid1_op(f"ProfilerStep#{k + 1}", t, first_dur_us if k == 0 else 100, cat="user_annotation"),
            pid1_op("aten::mm", t + 5, 50),
            pid1_op("cudaLaunchKernel", t + 10, 5, cat="cuda_runtime", correlation=k + 1),
            stream_kernel("gemm", t + 20, 30, k + 1),
        ]
    return ev


def test_overlapping_steps_end_where_the_next_starts(store, tmp_path):
    f = write_rank(tmp_path / "run" / "rank0.json", _overlapping_steps(5000), 0, world=1)
    res = ingest(store, [f], run="t")
    # ProfilerStep#1 [0, 5000 us] runs 4,900 us into ProfilerStep#2 (from 100 us): ends at 100 us
    (w,) = [w for w in res.warnings if "ProfilerStep(s) run past the start of the next one" in w]
    assert (
        f"ProfilerStep#1 ({duration(5000 * US)} recorded) runs {duration(4900 * US)} into ProfilerStep#2" in w
    )
    assert "ProfilerStep#3 (" not in w  # it runs into no step; ProfilerStep#2 neither
    row = store.sql("SELECT dur_ns, raw_dur_ns, flag FROM events WHERE name = 'ProfilerStep#1'").row(0)
    assert row == (100 * US, 5000 * US, "overrun")
    assert store.sql("SELECT step, cpu_end_ns - cpu_start_ns FROM steps ORDER BY step").rows() == [
        (1, 100 * US),
        (2, 100 * US),
        (3, 100 * US),
    ]
    # the step windows (critical_path's account, and mfu's step time): each step ends with its kernel
    # (50, 150, 250 us) and starts where the previous ended: 50, 100, 100 us; together the 250 us the
    # trace's steps and kernels span (they read 5 ms, 0, 0 before: 5 ms of steps in a 250 us trace)
    assert analyze(store, "critical_path", "t").frame["step_ns"].to_list() == [50 * US, 100 * US, 100 * US]
    mfu = analyze(store, "mfu", "t", model_flops_per_step=1e9, peak_tflops=100.0).frame
    assert mfu["step_ns"].to_list() == [50 * US, 100 * US, 100 * US]
    # one step repaired, counted in the runs' issues like the other repairs
    assert store.runs()["issues"].to_list() == [
        "1 repaired: step ran past the next step's start: clipped to it"
    ]


def test_steps_that_touch_are_untouched(store, tmp_path):
    # 100.004 us: 4 ns into the next step, within the 5 us tolerance: as recorded, no warning
    f = write_rank(tmp_path / "run" / "rank0.json", _overlapping_steps(100.004), 0, world=1)
    res = ingest(store, [f], run="t")
    assert not [w for w in res.warnings if "start of the next one" in w]
    assert store.sql("SELECT count(*) FROM events WHERE flag IS NOT NULL").item() == 0
    assert store.runs()["issues"].to_list() == [""]
