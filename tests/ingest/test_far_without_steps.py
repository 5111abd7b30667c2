"""Records from another clock domain in a trace with neither steps nor launch calls.

The kernel_before_its_launch kind (``../shared/cases/kernel_before_its_launch``) without the launch
calls that expose it: a ``ProfilerActivity.CUDA``-only trace (no CPU rows, no ProfilerStep) whose
first kernels are stamped ~1e14 ns early. Without steps, the reference range was the 1st..99th
percentile of the starts, which on a small trace is min..max: the early records stretched it to
27.8 h, the margin with it, and nothing was "far" (window 1e14 ns, idle 100 %). The range is now
that of the bulk (``traceprof.collectors._far_end.reference_range``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.builders import kernel, kineto
from tests.conftest import analyze
from traceprof.ingest.ingest import ingest
from traceprof.storage.store import Store

US = 1000
EW = "void at::native::vectorized_elementwise_kernel<4>()"


def _kernels(starts: list[float], dur: float = 50.0) -> list[dict]:
    return [kernel(EW, 7, ts, dur, corr=700 + i) for i, ts in enumerate(starts)]


def _one_trace(tmp_path: Path, starts: list[float], dur: float = 50.0) -> tuple[int, int]:
    """Ingest one rank of ``starts`` (us); assert nothing was flagged far; (window, busy) ns."""
    s = Store(tmp_path / "t.duckdb")
    res = ingest(s, [kineto(tmp_path / "rank0.json.gz", _kernels(starts, dur))])
    assert not [w for w in res.warnings if "far outside" in w], res.warnings
    t = analyze(s, "temporal").frame.row(0, named=True)
    return t["window_ns"], t["compute_ns"]


def test_early_kernels_without_steps_or_launches_are_left_out(tmp_path: Path) -> None:
    # Six 50 us kernels on stream 7 at 1030, 1130, ..., 1530 us; the first two written 1e11 us
    # (1e14 ns, ~27.8 h) early, no launch call and no step to compare them with. The four valid
    # ones [1230,1280] [1330,1380] [1430,1480] [1530,1580]: window 1580 - 1230 = 350 us, busy
    # 4 x 50 = 200 us, idle 150 us (42.86 %); the two early ones flagged far_outside.
    starts = [1030.0 + 100 * i - (1e11 if i < 2 else 0) for i in range(6)]
    f = kineto(tmp_path / "rank0.json.gz", _kernels(starts))
    s = Store(tmp_path / "t.duckdb")
    res = ingest(s, [f])
    far = [w for w in res.warnings if "far outside" in w]
    assert len(far) == 1 and far[0].startswith("rank0.json.gz: 2 record(s)"), res.warnings
    t = analyze(s, "temporal").frame.row(0, named=True)
    assert (t["window_ns"], t["idle_ns"], t["compute_ns"]) == (350 * US, 150 * US, 200 * US)
    flags = s.sql("SELECT flag, count(*) AS n FROM events WHERE kind = 'kernel' GROUP BY flag ORDER BY flag")
    assert flags.rows() == [("far_outside", 2), (None, 4)]


def test_bursts_apart_without_steps_stay_one_trace(tmp_path: Path) -> None:
    # Ten bursts of two 50 us kernels, 2.5 s apart (idle 2.4999 s between bursts: a data-loading
    # pause), no steps: the largest gap (2.4999 s) is far shorter than the rest of the trace
    # (9 x 2.5 s + 150 us), so no record is far and the window is the whole span:
    # 9 x 2.5 s + 150 us = 22.50015 s (first start 0, last end 22.5 s + 150 us).
    starts = [b * 2_500_000.0 + k * 100 for b in range(10) for k in range(2)]
    f = kineto(tmp_path / "rank0.json.gz", _kernels([1000.0 + x for x in starts]))
    s = Store(tmp_path / "t.duckdb")
    res = ingest(s, [f])
    assert not [w for w in res.warnings if "far outside" in w], res.warnings
    t = analyze(s, "temporal").frame.row(0, named=True)
    assert t["window_ns"] == 22_500_150 * US


def test_a_burst_apart_by_more_than_the_rest_is_far(tmp_path: Path) -> None:
    # Twenty kernels 100 us apart at 1000 .. 2900 us, and three more 5 s later (at 5,001,000 ..
    # 5,001,200 us): the 5 s gap is longer than 100 x everything else together (100 x (1.9 ms +
    # 0.2 ms) = 210 ms) and than 1 s, so the
    # three are apart from the bulk (reference range [1000, 2900] us, margin 1 s): flagged; window
    # 2950 - 1000 = 1950 us, busy 20 x 50 = 1000 us.
    starts = [1000.0 + 100 * i for i in range(20)] + [5_001_000.0 + 100 * i for i in range(3)]
    f = kineto(tmp_path / "rank0.json.gz", _kernels(starts))
    s = Store(tmp_path / "t.duckdb")
    res = ingest(s, [f])
    assert any(w.startswith("rank0.json.gz: 3 record(s) lie far outside") for w in res.warnings), res.warnings
    t = analyze(s, "temporal").frame.row(0, named=True)
    assert (t["window_ns"], t["compute_ns"]) == (1950 * US, 1000 * US)


def test_a_pause_longer_than_the_work_but_not_a_hundred_times_stays_one_trace(tmp_path: Path) -> None:
    # 200 kernels 100 us apart (1000 .. 20,900 us), a 1.5 s pause, 100 more (1,520,900 ..
    # 1,530,800 us), no steps: the pause is longer than the rest together (19.9 ms + 9.9 ms) and
    # than 1 s, but not 100 x the rest (2.98 s), so it is a pause of the run, not another clock:
    # nothing far, window 1,530,850 - 1000 = 1,529,850 us, busy 300 x 50 us = 15,000 us.
    starts = [1000.0 + 100 * i for i in range(200)] + [1_520_900.0 + 100 * i for i in range(100)]
    assert _one_trace(tmp_path, starts) == (1_529_850 * US, 15_000 * US)


def test_a_small_tail_after_a_pause_is_the_runs_own(tmp_path: Path) -> None:
    # 1,000 20 us kernels 30 us apart (1000 .. 30,970 us), a 1.2 s pause, 5 more (1,230,970 ..
    # 1,231,170 us, 50 us apart), no steps. The tail is under 1 % of the records, so the 1st..99th
    # percentile range (30 ms) and its 1 s margin used to cut it off (5 flagged far_outside); the
    # pause (1.2 s) is 40 x the rest (29.97 ms + 0.2 ms), not 100 x: one trace, nothing far,
    # window 1,231,190 - 1000 = 1,230,190 us, busy 1,005 x 20 = 20,100 us.
    starts = [1000.0 + 30 * i for i in range(1000)] + [1_230_970.0 + 50 * i for i in range(5)]
    assert _one_trace(tmp_path, starts, dur=20.0) == (1_230_190 * US, 20_100 * US)


def test_two_bursts_of_about_one_size_far_apart_are_both_kept(tmp_path: Path) -> None:
    # 100 kernels 100 us apart at 1000 .. 10,900 us and 99 more 60 s later (60,001,000 ..
    # 60,010,800 us), no steps: the gap is over 100 x the rest (19.8 ms), but neither side holds
    # at most half the other's records (99 vs 100), so nothing tells which is on the wrong clock:
    # both kept, none flagged; window 60,010,850 - 1000 = 60,009,850 us, busy 199 x 50 = 9,950 us.
    starts = [1000.0 + 100 * i for i in range(100)] + [60_001_000.0 + 100 * i for i in range(99)]
    assert _one_trace(tmp_path, starts) == (60_009_850 * US, 9_950 * US)


def test_a_far_head_and_a_far_tail_are_each_measured_against_the_bulk(tmp_path: Path) -> None:
    # 200 kernels 100 us apart from t0 = 1e11 us (span 19.9 ms), 5 more a day before t0 and 5 a
    # day after the last (100 us apart), no steps. Each far side measured against the whole rest
    # met the other far side in that rest (gap 1 day vs 1 day + 19.9 ms of "rest": ratio ~1, no
    # cut) and nothing was flagged (window 2 days, idle ~100 %). Against the bulk (19.9 ms + 0.4 ms,
    # x 100 = 2.03 s < 1 day; 5 <= 200 / 2) each is far: 10 flagged, window 19,950 us, busy
    # 200 x 50 = 10,000 us.
    t0, day = 1e11, 86_400e6
    starts = [t0 - day + 100 * i for i in range(5)] + [t0 + 100 * i for i in range(200)]
    starts += [t0 + 19_900 + day + 100 * i for i in range(5)]
    s = Store(tmp_path / "t.duckdb")
    res = ingest(s, [kineto(tmp_path / "rank0.json.gz", _kernels(starts))])
    assert any(w.startswith("rank0.json.gz: 10 record(s) lie far outside") for w in res.warnings), (
        res.warnings
    )
    t = analyze(s, "temporal").frame.row(0, named=True)
    assert (t["window_ns"], t["compute_ns"]) == (19_950 * US, 10_000 * US)


def test_the_bulk_is_found_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The early-kernels trace above (six kernels, the first two 1e14 ns early, no steps): the
    # reference range and the far records both come from the bulk of the same starts, which was
    # sorted and split twice (reference_range, then far_records). Now reference_range finds it once
    # and hands far_records its first and last start: one _bulk call per trace, the same answer
    # (2 flagged far_outside; bulk 1230 .. 1530 us).
    from traceprof.collectors import _far_end

    calls: list[int] = []
    bulk = _far_end._bulk

    def counted(st: np.ndarray) -> np.ndarray:
        calls.append(len(st))
        return bulk(st)

    monkeypatch.setattr(_far_end, "_bulk", counted)
    starts = [1030.0 + 100 * i - (1e11 if i < 2 else 0) for i in range(6)]
    s = Store(tmp_path / "t.duckdb")
    ingest(s, [kineto(tmp_path / "rank0.json.gz", _kernels(starts))], jobs=1)
    assert calls == [6]
    flags = s.sql("SELECT flag, count(*) AS n FROM events WHERE kind = 'kernel' GROUP BY flag ORDER BY flag")
    assert flags.rows() == [("far_outside", 2), (None, 4)]
    ts = np.array([int(x * US) for x in starts], np.int64)
    ref = _far_end.reference_range(np.zeros(6, bool), ts, ts * 0, np.zeros(6, bool), bulk=np.ones(6, bool))
    assert ref.bulk == (1_230_000, 1_530_000) and not ref.by_steps
    far, end = _far_end.far_records(ts, np.ones(6, bool), ref, 10**9)
    assert far.tolist() == [True, True, False, False, False, False] and end == 1_530_000
