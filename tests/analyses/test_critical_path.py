"""critical_path: the step account to the ns on hand-worked micro-traces, its path and blame, and
exact sums on every sample run, corpus trace and case."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from tests.builders import BASE, GPU_STEP, transient_rank, write_rank
from tests.builders import pid1_op as _op
from tests.builders import runtime_launch as _launch
from tests.builders import stream_kernel as _kernel
from tests.conftest import CASES, CORPUS, SAMPLES, analyze, corpus
from traceprof.core.errors import AnalysisError, TraceprofError
from traceprof.ingest.ingest import ingest
from traceprof.storage.store import Store

US = 1000
CATS = ["compute_ns", "transfer_ns", "memory_ns", "wait_ns", "host_bound_ns", "idle_ns"]


def _account(res, rank: int) -> dict:
    (row,) = res.frame.filter(pl.col("rank") == rank).iter_rows(named=True)
    return {c: row[c] // US for c in ["step_ns", *CATS]}


def _path(res) -> list[tuple]:
    return [
        (r["rank"], r["kind"], r["start_ns"] // US - BASE // US, r["duration_ns"] // US, r["waiting_rank"])
        for r in res.path.iter_rows(named=True)
    ]


# Two CPU (gloo) ranks, one all-reduce, rank 1 late. Times in us, ProfilerStep#1 [0, 1000).
#   rank 0: aten::mm [0, 100); enqueues the all-reduce at 100 (c10d::allreduce_, arrival);
#           its gloo work [100, 420) spins until rank 1 arrives; aten::add [450, 500).
#   rank 1: aten::mm [0, 100); 300 us of untraced host time (a sleep); enqueues at 400 (the last
#           arrival); gloo work [400, 420); aten::add [430, 500).
# Rank 0: compute 100 + 50 = 150; wait = [own arrival 100, last arrival 400) = 300; transfer =
#   [400, 420) = 20; gap [420, 450) ends with aten::add, a CPU op started (launched) after the gap
#   began: host_bound 30; after its last op [500, 1000): idle 500. 150+300+20+30+500 = 1000.
# Rank 1: compute 100 + 70 = 170; no wait (it arrived last); transfer [400, 420) = 20; gaps
#   [100, 400) (ended by its gloo work, started then) and [420, 430): host_bound 310; idle 500.
#   170+20+310+500 = 1000.
def _gloo_rank(late: bool) -> list[dict]:
    arrive = 400 if late else 100
    add = (430, 70) if late else (450, 50)
    return [
        _op("ProfilerStep#1", 0, 1000, cat="user_annotation"),
        _op("aten::mm", 0, 100),
        _op("c10d::allreduce_", arrive, 1, **{"Input Dims": [[[64]], []]}),
        _op(
            "gloo:all_reduce",
            arrive,
            420 - arrive,
            tid=2,
            cat="user_annotation",
            **{"Input Dims": [[64]], "Input type": ["float"]},
        ),
        _op("aten::add", *add),
    ]


def test_two_cpu_ranks_one_late(store, tmp_path):
    for r in (0, 1):
        write_rank(tmp_path / "run" / f"r{r}.json", _gloo_rank(late=r == 1), r)
    ingest(store, [tmp_path / "run"])
    res = analyze(store, "critical_path", "run")
    assert res.frame.columns == ["rank", "step", "step_ns", *CATS]
    assert _account(res, 0) == {
        "step_ns": 1000,
        "compute_ns": 150,
        "transfer_ns": 20,
        "memory_ns": 0,
        "wait_ns": 300,
        "host_bound_ns": 30,
        "idle_ns": 500,
    }
    assert _account(res, 1) == {
        "step_ns": 1000,
        "compute_ns": 170,
        "transfer_ns": 20,
        "memory_ns": 0,
        "wait_ns": 0,
        "host_bound_ns": 310,
        "idle_ns": 500,
    }
    # Path: both ranks end the step at 1000, the lower one (0) is taken. Walking back on rank 0:
    # idle [500, 1000), aten::add [450, 500), host_bound [420, 450), the transfer [400, 420) of
    # the all-reduce whose last arrival was rank 1's at 400: the path crosses to rank 1 there,
    # which spent [100, 400) host-bound (rank 0 waited for it) after aten::mm [0, 100).
    assert _path(res) == [
        (1, "compute", 0, 100, None),
        (1, "host_bound", 100, 300, 0),
        (0, "transfer", 400, 20, None),
        (0, "host_bound", 420, 30, None),
        (0, "compute", 450, 50, None),
        (0, "idle", 500, 500, None),
    ]
    assert res.steps.select("step_ns", "end_rank", "crossings").row(0) == (1000 * US, 0, 1)
    # Blame: rank 0's 300 us of wait, credited to rank 1, which was host-bound all that time
    # (the gap ends with the all-reduce); 300 / 2000 us of the job's rank-time = 15%.
    (b,) = res.blame.iter_rows(named=True)
    assert (b["rank"], b["kind"], b["name"], b["waited_ns"], b["rank_waited_ns"]) == (
        1,
        "host_bound",
        "all_reduce",
        300 * US,
        300 * US,
    )
    assert b["pct"] == pytest.approx(15.0)
    ranks = res.ranks.row(1, named=True)
    assert (ranks["steps"], ranks["host_bound_ns"], ranks["host_bound_pct"]) == (
        1,
        310 * US,
        pytest.approx(31.0),
    )
    assert res.compute.filter(pl.col("rank") == 1).select("family", "compute_ns").rows() == [
        ("mm", 100 * US),
        ("add", 70 * US),
    ]


def test_gpu_step_host_bound_gap_graph_launch_and_memory(store, tmp_path):
    ingest(store, [write_rank(tmp_path / "r0.json", GPU_STEP, 0, world=1, backend="nccl")], run="g")
    res = analyze(store, "critical_path", "g")
    assert _account(res, 0) == {
        "step_ns": 150,
        "compute_ns": 70,
        "transfer_ns": 0,
        "memory_ns": 25,
        "wait_ns": 0,
        "host_bound_ns": 40,
        "idle_ns": 15,
    }
    # One rank: the path is its timeline, each gap named after the work that ended it.
    assert [(k, s, d) for _, k, s, d, _ in _path(res)] == [
        ("host_bound", 0, 10),
        ("compute", 10, 20),
        ("memory", 30, 10),
        ("host_bound", 40, 20),
        ("compute", 60, 20),
        ("idle", 80, 10),
        ("compute", 90, 10),
        ("host_bound", 100, 10),
        ("compute", 110, 10),
        ("idle", 120, 5),
        ("compute", 125, 10),
        ("memory", 135, 15),
    ]
    assert res.path["name"].to_list()[:4] == ["K1", "K1", "Memcpy HtoD (Pageable -> Device)", "K2"]
    assert res.blame.is_empty()


def _nccl(ts: float, dur: float, corr: int) -> dict:
    return _kernel(
        "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
        ts,
        dur,
        corr,
        stream=20,
        **{
            "Collective name": "allreduce",
            "Process Group Name": "0",
            "Process Group Ranks": "[0, 1]",
            "Seq": 1,
            "In msg nelems": 1024,
            "Out msg nelems": 1024,
            "Group size": 2,
            "dtype": "Float",
        },
    )


# Two GPU ranks, one NCCL all-reduce; a rank arrives when its kernel starts. Step [0, 300) us.
#   rank 0: A [10, 50) L=5; NCCL [60, 200) L=55 (arrives at 60); B [210, 250) L=100.
#   rank 1: A [10, 150) L=5; NCCL [160, 200) L=55 (arrives at 160, last); B [210, 250) L=100.
# Windows [0, 250). Rank 0: compute 40 + 40 = 80; wait [60, 160) = 100; transfer [160, 200) = 40;
#   host_bound [0, 10) (A launched at 5) + [50, 60) (NCCL launched at 55) = 20; idle [200, 210)
#   (B launched at 100, queued) = 10. 80+100+40+20+10 = 250.
# Rank 1: compute 140 + 40 = 180; transfer 40; host_bound [0, 10) = 10; idle [150, 160) (NCCL
#   launched at 55, before the gap) + [200, 210) = 20. 180+40+10+20 = 250.
def test_two_gpu_ranks_nccl_late_rank(store, tmp_path):
    for r, a_end in ((0, 50), (1, 150)):
        arrive = a_end + 10
        ev = [
            _op("ProfilerStep#1", 0, 300, cat="user_annotation"),
            _launch(5, 1),
            _kernel("A", 10, a_end - 10, 1),
            _launch(55, 2),
            _nccl(arrive, 200 - arrive, 2),
            _launch(100, 3),
            _kernel("B", 210, 40, 3),
        ]
        write_rank(tmp_path / "run" / f"r{r}.json", ev, r, backend="nccl")
    ingest(store, [tmp_path / "run"])
    res = analyze(store, "critical_path", "run")
    assert _account(res, 0) == {
        "step_ns": 250,
        "compute_ns": 80,
        "transfer_ns": 40,
        "memory_ns": 0,
        "wait_ns": 100,
        "host_bound_ns": 20,
        "idle_ns": 10,
    }
    assert _account(res, 1) == {
        "step_ns": 250,
        "compute_ns": 180,
        "transfer_ns": 40,
        "memory_ns": 0,
        "wait_ns": 0,
        "host_bound_ns": 10,
        "idle_ns": 20,
    }
    # Path from rank 0's end back to the transfer, across to rank 1 at its arrival (160).
    assert _path(res) == [
        (1, "host_bound", 0, 10, None),
        (1, "compute", 10, 140, None),
        (1, "idle", 150, 10, 0),
        (0, "transfer", 160, 40, None),
        (0, "idle", 200, 10, None),
        (0, "compute", 210, 40, None),
    ]
    # Rank 0 waited [60, 160) for rank 1, which ran A until 150 and then sat idle: 90 + 10 us
    # (a gap is named after the work that ends it: here the all-reduce).
    assert res.blame.select("rank", "kind", "name", "waited_ns").rows() == [
        (1, "compute", "A", 90 * US),
        (1, "idle", "all_reduce", 10 * US),
    ]
    assert res.blame["rank_pct"][0] == pytest.approx(100 * 100 / 500)


def test_cuda_graph_case(store):
    # ../shared/cases/cuda_graph_launch: a GEMM launched at 10 runs [30, 130), a graph launched at
    # 200 runs [260, 600) back to back, a GEMM launched at 620 runs [640, 700), a graph launched
    # at 800 runs [830, 1170) (us from the step start). Compute 100 + 340 + 60 + 340 = 840 us; the
    # gaps before each launch's first kernel are host-bound (each launched after the gap began):
    # 30 + 130 + 40 + 130 = 330; none inside a graph. Window [0, 1170).
    ingest(
        store,
        [Path(CASES) / "cuda_graph_launch"]
        if (Path(CASES) / "cuda_graph_launch").exists()
        else pytest.skip("cases not available"),
    )
    row = analyze(store, "critical_path").frame.row(0, named=True)
    assert (row["step_ns"], row["compute_ns"], row["host_bound_ns"], row["idle_ns"]) == (
        1_170_000,
        840_000,
        330_000,
        0,
    )


def test_straggler_rank2_blame_and_path(store):
    # sample_traces/straggler_rank2: rank 2 sleeps 30 ms per step before its backward.
    ingest(store, [SAMPLES / "straggler_rank2"])
    res = analyze(store, "critical_path")
    # Every exposed wait of the others ends at rank 2 (directly, or through a rank that was
    # itself waiting for rank 2): it holds all of the waited time.
    assert res.blame["rank"][0] == 2 and res.blame["rank"].unique().to_list() == [2]
    assert res.blame["waited_ns"].sum() == res.frame["wait_ns"].sum() == res.blame["rank_waited_ns"][0]
    # the sleep is on the path: every step's path holds a host-bound stretch of rank 2 over 25 ms
    sleep = (
        res.path.filter((pl.col("rank") == 2) & (pl.col("kind") == "host_bound"))
        .group_by("step")
        .agg(pl.col("duration_ns").max())
    )
    assert sleep.height == 3 and (sleep["duration_ns"] > 25_000_000).all()
    # the others' waits are the larger part of their step; rank 2 never waits
    ranks = res.ranks.sort("rank")
    assert ranks["wait_ns"][2] == 0 and (ranks.filter(pl.col("rank") != 2)["wait_pct"] > 10).all()


def test_flight_recorder_only_run_has_nothing_to_account(store):
    ingest(store, [corpus("flight_recorder/gloo_cpu_4rank")])
    with pytest.raises(AnalysisError, match="nothing to account for"):
        analyze(store, "critical_path")


def _inputs() -> list[Path]:
    """Every sample run, corpus trace and case: each folder that holds files (one run), and the
    corpus' lone-file runs (Nsight exports, NDTimeline Parquet)."""

    def runs(root: Path) -> list[Path]:
        if not root.exists():
            return []
        return sorted(
            d
            for d in [root, *root.rglob("*")]
            if d.is_dir() and d != root and any(f.is_file() and f.suffix != ".md" for f in d.iterdir())
        )

    return (
        runs(SAMPLES)
        + runs(CORPUS / "hta")
        + runs(CORPUS / "flight_recorder")
        + runs(CASES)
        + sorted(CORPUS.glob("nsys/*.sqlite"))
        + sorted(CORPUS.glob("kineto_misc/*/trace-*.parquet"))
    )


@pytest.mark.parametrize("path", _inputs(), ids=lambda p: "/".join(p.parts[-3:]))
def test_every_row_sums_to_its_step(path: Path, tmp_path):
    s = Store(tmp_path / "t.duckdb")
    try:
        try:
            ingest(s, [path], run="r", jobs=1)
        except TraceprofError:
            pytest.skip(f"{path.name}: not a trace traceprof ingests as one run")
        try:
            res = analyze(s, "critical_path", "r")
        except AnalysisError as e:  # only a run with nothing to account for may refuse
            assert "nothing to account for" in str(e)
            return
        f = res.frame
        assert [c for c in f.columns if c.endswith("_ns")] == ["step_ns", *CATS]
        assert f.filter(pl.sum_horizontal(CATS) != pl.col("step_ns")).is_empty()
        assert (f.select(CATS).min_horizontal() >= 0).all()
        per_step = res.path.group_by("step").agg(pl.col("duration_ns").sum().alias("p"))
        both = res.steps.join(per_step, on="step", how="left", nulls_equal=True)
        assert (both["p"] == both["step_ns"]).all()
        assert res.blame["waited_ns"].sum() == f["wait_ns"].sum()  # every ns of wait credited once
        fam = res.compute.group_by("rank", "step").agg(pl.col("compute_ns").sum().alias("c"))
        got = f.filter(pl.col("compute_ns") > 0).join(fam, on=["rank", "step"], how="left", nulls_equal=True)
        assert (got["c"] == got["compute_ns"]).all()
    finally:
        s.close()


def test_report_opens_with_the_step_waterfall_and_marks_the_path(store):
    from traceprof.engine.timeline import step_timeline, with_path
    from traceprof.render import plots
    from traceprof.render.report import render_html

    ingest(store, [SAMPLES / "straggler_rank2"])
    page = render_html(store, None)
    assert page.index('id="waterfall"') < page.index('id="findings"') < page.index('id="timeline"')
    assert "No step account" not in page and "<!--PLOT" not in page  # every plot's place filled
    # the median step's timeline carries its critical path, which runs through rank 2's sleep
    res = analyze(store, "critical_path")
    tl = with_path(step_timeline(store, store.resolve_run(None)), res.path)
    assert tl.path is not None and set(tl.path["rank"].to_list()) <= set(tl.ranks)
    assert (tl.path["start_ms"] >= 0).all() and (tl.path["end_ms"] <= tl.span_ms).all()
    sleep = tl.path.filter((pl.col("rank") == 2) & (pl.col("kind") == "host_bound"))
    assert (sleep["end_ms"] - sleep["start_ms"]).max() > 25  # ms
    fig = plots.render(plots.timeline(tl))
    labels = [
        str(i.label.get("value") if isinstance(i.label, dict) else i.label) for i in fig.legend[0].items
    ]
    assert any("critical path" in x for x in labels), labels


def test_profiler_start_transient_is_left_out_of_the_account_and_the_waterfall(store, tmp_path):
    # tests.builders.transient_rank: rank 1's profiler starts 3 s late, so rank 0's step 1
    # [0, 3010] ms waits 3000 ms at its first all-reduce. Step 1 is the transient (the one
    # definition of excluded time, traceprof.engine.arrivals) and is left out, as overlap leaves it out.
    for r in (0, 1):
        write_rank(tmp_path / "run" / f"rank{r}.json", transient_rank(r), r)
    ingest(store, [tmp_path / "run"], run="tr")
    cp = analyze(store, "critical_path", "tr")
    (note,) = [
        n for n in cp.notes if n.startswith("profiler-start transient: the first collective to arrive")
    ]
    assert note in analyze(store, "overlap", "tr").notes  # the same note
    # Steps 2-4 (S = 3010, 3020, 3030 ms), each 10 ms on both ranks. Rank 0: aten::mm [S, S+5] =
    # 5 ms compute; arrival S+5, rank 1's S+5.1: wait 0.1 ms; transfer [S+5.1, S+5.6] = 0.5 ms;
    # the 4.4 ms gap to the next step's aten::mm is host-bound (a CPU rank's own work), the one
    # after its last step's work idle. Rank 1: compute 5; host-bound 0.1 ms before its arrival
    # (and 4.4 after, but idle after its last work); transfer 0.5 ms; no wait.
    ms = 1_000_000
    want = {
        (0, 2): (5, 0.5, 0.1, 4.4, 0),
        (0, 3): (5, 0.5, 0.1, 4.4, 0),
        (0, 4): (5, 0.5, 0.1, 0, 4.4),
        (1, 2): (5, 0.5, 0, 4.5, 0),
        (1, 3): (5, 0.5, 0, 4.5, 0),
        (1, 4): (5, 0.5, 0, 0.1, 4.4),
    }
    got = {
        (r["rank"], r["step"]): (
            r["compute_ns"],
            r["transfer_ns"],
            r["wait_ns"],
            r["host_bound_ns"],
            r["idle_ns"],
        )
        for r in cp.frame.iter_rows(named=True)
    }
    assert got == {k: tuple(round(x * ms) for x in v) for k, v in want.items()}
    assert cp.frame["step_ns"].to_list() == [10 * ms] * 6 and cp.frame["memory_ns"].sum() == 0
    assert cp.steps["step"].to_list() == [2, 3, 4]
    # Blame: rank 0's 3 x 0.1 ms of waits, for rank 1 (host-bound before its arrival); not the
    # transient's 3000 ms
    assert cp.blame.select("rank", "kind", "waited_ns").rows() == [(1, "host_bound", 300_000)]
    # The MFU waterfall over the same account: 6 rank-steps x 10 ms = 60 ms. 2e9 FLOPs per step for
    # the job = 1e9 per rank at 1 TFLOP/s: 1 ms at peak per rank-step, 6 ms in all (MFU 10%);
    # kernel efficiency 30 - 6 = 24 ms; idle 2 x 4.4 = 8.8; exposed communication 6 x 0.5 = 3.0;
    # waiting 0.3; host-bound 2 x 4.4 + 2 x 4.5 + 0.1 = 17.9 ms.
    m = analyze(store, "mfu", "tr", peak_tflops=1.0, model_flops_per_step=2e9)
    wf = dict(m.waterfall.select("component", "ns").iter_rows())
    assert wf == {
        "idle": 8_800_000,
        "exposed communication": 3_000_000,
        "waiting for peers": 300_000,
        "launch/host-bound": 17_900_000,
        "memory": 0,
        "kernel efficiency": 24_000_000,
        "MFU": 6_000_000,
    }
    assert sum(wf.values()) == 60 * ms and m.waterfall["pct"].sum() == pytest.approx(100.0)
    # mfu's per-step frame leaves step 1 out too: every rank-step 1e9 FLOPs in 10 ms = 0.1 TFLOP/s
    assert (
        m.frame["step"].unique().sort().to_list() == [2, 3, 4] and m.frame["mfu_pct"].to_list() == [10.0] * 6
    )
    assert note in m.notes


def test_launches_by_hand_rows_in_order_or_not():
    # per (rank, start): the earliest launch; starts 10 and 40 of rank 0 are shared (a null launch
    # is none), the rest alone; the rows in (rank, start) order take the tied ones alone to a group
    from traceprof.analyses.critical_path import _launches

    rows = [(0, 10, 7), (0, 10, 3), (0, 20, None), (0, 40, None), (0, 40, None), (0, 50, 44), (1, 10, 9)]
    act = pl.DataFrame(
        rows, schema={"rank": pl.Int32, "start_ns": pl.Int64, "launch_ts_ns": pl.Int64}, orient="row"
    )
    want = [(0, 10, 3), (0, 20, None), (0, 40, None), (0, 50, 44), (1, 10, 9)]
    for df in (act, act.reverse()):
        got = _launches(df, pl.DataFrame(), [])
        assert got.schema == {"rank": pl.Int32, "start_ns": pl.Int64, "launch_ns": pl.Int64}
        assert sorted(got.rows(), key=str) == sorted(want, key=str)


@pytest.mark.parametrize("seed", range(6))
def test_gaps_take_the_launch_of_the_work_they_end_as_a_join(seed):
    # the as-of join on sorted bounds gives each gap the launch a join on (rank, start) gives
    import random

    from traceprof.analyses.critical_path import _launched

    rng = random.Random(seed)
    starts = sorted(rng.sample(range(1000), 60))
    launches = pl.DataFrame(
        {
            "rank": pl.Series([rng.randint(0, 2) for _ in starts], dtype=pl.Int32),
            "start_ns": starts,
            "launch_ns": [rng.choice([None, s - rng.randint(0, 50)]) for s in starts],
        }
    ).unique(["rank", "start_ns"])
    nexts = [rng.choice([*starts, rng.randint(0, 1100)]) for _ in range(40)]
    inner = pl.DataFrame(
        {
            "rank": pl.Series([rng.randint(0, 2) for _ in nexts], dtype=pl.Int32),
            "start_ns": [n - 5 for n in nexts],
            "_next": nexts,
            "name": [f"k{i}" for i in range(len(nexts))],
        }
    )
    want = inner.join(launches, left_on=["rank", "_next"], right_on=["rank", "start_ns"], how="left")
    got = _launched(inner, launches)
    assert got.columns == want.columns and got.sort("name").equals(want.sort("name"))
    assert got["launch_ns"].null_count() < got.height
