"""launch: latency figures and short-kernel share worked out by hand, and a corpus cross-check."""

from __future__ import annotations

import math

import polars as pl
import pytest

from tests.builders import kernel, kineto, launch, step
from tests.conftest import analyze, corpus
from traceprof.core.errors import AnalysisError, UsageError
from traceprof.ingest.ingest import ingest

# Times in us. kernel [start, end), launch L, latency = start - L:
#   stream 7: K1 [10, 12) L=0 -> 10 (stream idle: first kernel); K2 [12, 42) L=1 -> 11 (K1 still queued)
#             K3 [100, 103) L=95 -> 5 (K2 ended at 42: idle); K4 [103, 203) L=96 -> 7 (K3 runs until 103)
#   stream 9: K5 [50, 51) without a launch in the trace; K6 [60, 80) L=40 -> 20 (K5 ended at 51 > 40)
# Latencies sorted 5, 7, 10, 11, 20: p50 10; p90 at 0.9*4 = 3.6 -> 11 + 0.6*9 = 16.4;
# p99 at 3.96 -> 11 + 0.96*9 = 19.64; max 20; mean 53/5 = 10.6.
# Launched onto an idle stream: K1, K3 -> median(10, 5) = 7.5.
# Short (< 10 us): K1 2, K3 3, K5 1 -> 3 kernels, 6 us of 2+30+3+100+1+20 = 156 us.
# Steps (by launch; K5 by its own start): step 1 [-5, 50): K1, K2, K6 -> p50 11; step 2 [50, 200):
# K3, K4, K5 -> p50 of 5, 7 = 6.
EVENTS = [
    step(1, -5, 55),
    step(2, 50, 150),
    kernel("K1", 7, 10, 2, 1),
    launch(0, 1),
    kernel("K2", 7, 12, 30, 2),
    launch(1, 2),
    kernel("K3", 7, 100, 3, 3),
    launch(95, 3),
    kernel("K4", 7, 103, 100, 4),
    launch(96, 4),
    kernel("K5", 9, 50, 1, 5),
    kernel("K6", 9, 60, 20, 6),
    launch(40, 6),
]


def test_latency_and_short_kernels_by_hand(store, tmp_path):
    ingest(store, [kineto(tmp_path / "r0.json.gz", EVENTS)], run="r")
    res = analyze(store, "launch", "r")
    r = res.frame.row(0, named=True)
    assert (r["kernels"], r["launched"], r["latency_max_ns"]) == (6, 5, 20_000)
    assert (r["latency_p50_ns"], r["latency_p90_ns"], r["latency_p99_ns"]) == (10_000, 16_400, 19_640)
    assert r["latency_mean_ns"] == 10_600
    assert (r["idle_launches"], r["idle_latency_p50_ns"]) == (2, 7_500)
    assert (r["short_kernels"], r["short_ns"], r["kernel_ns"]) == (3, 6_000, 156_000)
    assert (r["short_kernels_pct"], r["short_pct"]) == (pytest.approx(50.0), pytest.approx(100 * 6 / 156))
    s7 = res.streams.filter(res.streams["stream"] == 7).row(0, named=True)
    assert (s7["kernels"], s7["latency_p50_ns"]) == (4, pytest.approx(8_500))  # (7 + 10) / 2
    steps = {row["step"]: row for row in res.steps.iter_rows(named=True)}
    assert (steps[1]["kernels"], steps[1]["latency_p50_ns"]) == (3, pytest.approx(11_000))
    assert (steps[2]["kernels"], steps[2]["launched"], steps[2]["latency_p50_ns"]) == (
        3,
        2,
        pytest.approx(6_000),
    )
    # A 3 us threshold (strict) leaves K1 (2 us) and K5 (1 us), not K3 (3 us): 3 of 156 us.
    r = analyze(store, "launch", "r", short_ns=3_000).frame.row(0, named=True)
    assert (r["short_kernels"], r["short_ns"]) == (2, 3_000)


def test_copy_running_on_the_lane_makes_it_busy_at_launch(store, tmp_path):
    """A kernel launched while a copy still runs on its stream queues behind the copy: it is not a
    launch onto an idle lane (g13 h03: a copy then a kernel on "stream 1" of two devices).

    By hand (us), stream 1 of device 0 and of device 1:
      dev 0: copy [100, 200) (cudaMemcpyAsync 80), K [200, 500) L=150 -> 50 (copy running: busy),
             K [700, 1100) L=680 -> 20 (idle);
      dev 1: copy [400, 450) (380), K [450, 800) L=420 -> 30 (busy), K [1000, 1400) L=980 -> 20 (idle).
      dev 0 again: a graph launch at 1200 whose first node is a copy [1250, 1260), then K [1260, 1300):
             latency 50 to the copy; the lane was idle at 1200 (its own copy is no earlier work).
    Latencies 50, 20, 30, 20, 50: p50 30, max 50, mean 34; idle launches 3 (680, 980, 1200; 4 before
    the fix counted the kernels at 150 and 420, not 1200's), their p50 = median(20, 20, 50) = 20.
    """
    dev = [
        ("copy", 0, 100, 100, 1, 80),
        ("K", 0, 200, 300, 2, 150),
        ("copy", 1, 400, 50, 3, 380),
        ("K", 1, 450, 350, 4, 420),
        ("K", 0, 700, 400, 5, 680),
        ("K", 1, 1000, 400, 6, 980),
        ("copy", 0, 1250, 10, 7, 1200),
        ("K", 0, 1260, 40, 7, None),
    ]
    events = [step(1, 0, 1500)]
    for name, device, ts, dur, corr, at in dev:
        if name == "copy":
            events.append(
                kernel("Memcpy HtoD (Pinned -> Device)", 1, ts, dur, corr, cat="gpu_memcpy", bytes=4096)
            )
            events.append(launch(at, corr, name="cudaMemcpyAsync" if corr < 7 else "cudaGraphLaunch"))
        else:
            events.append(kernel("K", 1, ts, dur, corr))
            if at is not None:
                events.append(launch(at, corr))
        gpu = events[-1] if at is None and name == "K" else events[-2]
        gpu["args"]["device"] = gpu["pid"] = device
    ingest(store, [kineto(tmp_path / "r0.json.gz", events)], run="r")
    r = analyze(store, "launch", "r").frame.row(0, named=True)
    assert (r["kernels"], r["latency_p50_ns"], r["latency_max_ns"], r["latency_mean_ns"]) == (
        5,
        30_000,
        50_000,
        34_000,
    )
    assert (r["idle_launches"], r["idle_latency_p50_ns"]) == (3, 20_000)


def test_cpu_only_run_is_an_error(store, tmp_path):
    cpu = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0, "dur": 5}]
    ingest(store, [kineto(tmp_path / "cpu.json.gz", cpu)], run="cpu")
    with pytest.raises(AnalysisError, match="no GPU kernels"):
        analyze(store, "launch", "cpu")


def test_corpus_against_plain_sql(store):
    # Independent recomputation straight from the events table: kernel start minus the start of the
    # cuda_runtime event with the same correlation (one per kernel in this trace).
    ingest(store, [corpus("hta/nccl_parser_config")], run="r")
    lat = store.sql(
        """SELECT k.ts_ns - r.ts_ns AS lat, k.dur_ns FROM events k
           JOIN events r ON r.trace_id = k.trace_id AND r.correlation = k.correlation AND r.kind = 'cuda_runtime'
           WHERE k.kind = 'kernel'"""
    )
    r = analyze(store, "launch", "r").frame.row(0, named=True)
    assert r["launched"] == lat.height == r["kernels"]
    assert r["latency_max_ns"] == lat["lat"].max()

    # Statistics are whole ns (the interpolated p90 used to print as 55404400.000000045 on
    # trace_filter): the independent percentiles, halves rounded up (all are positive here).
    def up(x: float) -> int:
        return math.floor(x + 0.5)

    assert r["latency_p50_ns"] == up(lat["lat"].quantile(0.5, "linear"))  # 12_786.5 -> 12_787
    assert r["latency_p90_ns"] == up(lat["lat"].quantile(0.9, "linear"))
    assert r["latency_p99_ns"] == up(lat["lat"].quantile(0.99, "linear"))
    assert r["latency_mean_ns"] == up(lat["lat"].mean())
    res = analyze(store, "launch", "r")
    for frame in res.frames().values():
        assert all(t == pl.Int64 for c, t in frame.schema.items() if c.endswith("_ns")), frame.schema
    assert r["short_kernels"] == (lat["dur_ns"] < 10_000).sum()


def test_bad_short_ns():
    from traceprof.analyses.launch import Params

    with pytest.raises(UsageError, match=r"short_ns=-1: must be >= 0"):
        Params(short_ns=-1)


def test_kernels_view_is_filtered_by_run_before_its_window(store, tmp_path):
    """``kernels`` numbers each launch's GPU rows with a window function: partitioned by run first,
    a query on one run reads that run's events only (before, every run of the store was windowed,
    so launch took longer with each run a CI store kept). The rows are the same either way."""
    ingest(store, [kineto(tmp_path / "a.json.gz", EVENTS)], run="a")
    ingest(store, [kineto(tmp_path / "b.json.gz", EVENTS[:6])], run="b")
    plan = store.con.execute("EXPLAIN SELECT * FROM kernels WHERE run_id = 1").fetchall()[0][1]
    scans = plan.split("Seq Scan")[1:]
    assert len(scans) == 2 and all("run_id = 1" in s.split("rows")[0] for s in scans), plan
    cols = "rank, trace_id, name, ts_ns, launch_ts_ns, launch_name, first_of_launch"
    alone = store.sql(f"SELECT {cols} FROM kernels WHERE run_id = 1 ORDER BY ts_ns")
    by_hand = (
        store.sql(  # the launch call: the earliest runtime event of the correlation id, in the same trace
            """SELECT k.rank, k.trace_id, k.name, k.ts_ns, r.ts_ns AS launch_ts_ns, r.name AS launch_name,
                   r.ts_ns IS NOT NULL AS first_of_launch FROM events k
            LEFT JOIN events r ON r.trace_id = k.trace_id AND r.correlation = k.correlation AND r.kind = 'cuda_runtime'
            WHERE k.run_id = 1 AND k.kind = 'kernel' ORDER BY k.ts_ns"""
        )
    )
    assert alone.equals(by_hand) and alone.height == 6 and alone["launch_ts_ns"].null_count() == 1


def test_a_store_with_older_views_gets_these_at_a_writable_open(tmp_path):
    """Views hold no data: a store made by an earlier traceprof (its ``meta.views`` digest differs)
    has them replaced, comments and all, at its next writable open; read-only, this version's views
    shadow them as temporary views of the connection, and the file is left alone."""
    from traceprof.core import schema
    from traceprof.storage.store import Store

    db = tmp_path / "s.duckdb"
    with Store(db) as s:
        ingest(s, [kineto(tmp_path / "a.json.gz", EVENTS)], run="a")
        want = s.sql("SELECT * FROM kernels ORDER BY ts_ns")
        s.con.execute(
            "CREATE OR REPLACE VIEW kernels AS SELECT * FROM events WHERE false"
        )  # stands for the old one
        s.con.execute("UPDATE meta SET value = 'old' WHERE key = 'views'")
    with Store(db, read_only=True) as s:
        assert s.sql("SELECT * FROM kernels ORDER BY ts_ns").equals(want)  # the temporary view
        assert s.sql("SELECT value FROM meta WHERE key = 'views'")["value"].item() == "old"  # file unchanged
    with Store(db) as s:
        assert s.sql("SELECT * FROM kernels ORDER BY ts_ns").equals(want)
        assert s.sql("SELECT value FROM meta WHERE key = 'views'")["value"].item() == schema.views_digest()
        comment = s.sql(
            "SELECT comment FROM duckdb_columns() WHERE table_name = 'kernels' AND column_name = 'first_of_launch'"
        )
        assert comment["comment"].item().startswith("First GPU row of its launch call")
