"""gaps (and overlap per step, idle) on hand-made traces worked out below, the CPU sample run, GPU corpus."""

from __future__ import annotations

import polars as pl
import pytest

from tests.builders import collective_args, kernel, kineto, launch
from tests.conftest import SAMPLES, analyze, corpus
from traceprof.ingest.ingest import ingest


def op(name: str, ts: float, dur: float, cat: str = "cpu_op", tid: int = 1, **args) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": args}


def nccl(name: str, ts: float, dur: float, corr: int, coll: str, pg: str, nelems: int, dtype: str) -> dict:
    return kernel(
        name,
        20,
        ts,
        dur,
        corr,
        **collective_args(coll, pg=pg, nelems=nelems, out_nelems=nelems, dtype=dtype),
    )


# Rank 0, times in us. ProfilerStep#1 [0, 100), #2 [100, 200). CPU thread 1 (ops contain the launches):
#   forward [1, 30) > aten::mm [2, 5): launches K1 (3), K1n (4)
#   autograd::engine::evaluate_function: MmBackward0 [31, 50) > MmBackward0 [31.5, 39) > aten::mm [32, 36):
#       launches K2 (33), K3 (34); MmBackward0 launches S1 (38); c10d::allreduce_ [40, 44) launches N1 (41)
#   Optimizer.step#SGD.step (annotation) [94, 99) > aten::add_ [94.5, 96): launches K4 (95)
#   forward [101, 130) > aten::mm [102, 108): launches K5 (106); c10d::allreduce_ [109, 112): N2 (110)
#   c10d::broadcast_ [164, 166): N3 (165)
# GPU: stream 7: K1 [10, 30), K2 [35, 60), K3 [60, 70) (back to back), K4 [95, 130) (launched in
#   step 1, runs across the step boundary at 100), K5 [150, 160); stream 9: K1n [12, 18) (under K1;
#   on one stream it would be an overrun of K1, clipped at ingest);
#   stream 8: S1 [40, 50) (overlaps K2 on stream 7); stream 20 (NCCL): N1 [45, 90) all_reduce pg 0
#   1024 floats (4096 B, step 1); N2 [112, 150) all_reduce pg 0 2621440 floats (10485760 B, step 2);
#   N3 [170, 180) broadcast pg 1 100 bytes (step 2).
# Compute union [10,30) [35,70) [95,130) [150,160) = 100; comm 45 + 38 + 10 = 93.
# Exposed: N1 - compute = [70, 90) 20; N2 - compute = [130, 150) 20 (K4 of step 1 hides [112, 130));
#   N3 = [170, 180) 10. Total 50, overlap 43, window [10, 180) = 170.
# Steps (by launch): 1 = K1 K1n K2 K3 S1 N1 K4: comm 45, exposed 20, overlap 25, compute 20+35+35 = 90,
#   window [10, 130) = 120. 2 = K5 N2 N3: comm 48, exposed 20 + 10 = 30, overlap 18, compute 10,
#   window [112, 180) = 68.
# Rank 1: only communication, no steps: N [10, 20) and [30, 50) all_reduce pg 0 4096 B: both exposed.
RANK0 = [
    op("ProfilerStep#1", 0, 100, cat="user_annotation"),
    op("ProfilerStep#2", 100, 100, cat="user_annotation"),
    op("forward", 1, 29),
    op("aten::mm", 2, 3),
    launch(3, 1, 0.5),
    launch(4, 2, 0.5),
    op("autograd::engine::evaluate_function: MmBackward0", 31, 19),
    op("MmBackward0", 31.5, 7.5),
    op("aten::mm", 32, 4),
    launch(33, 3, 0.5),
    launch(34, 4, 0.5),
    launch(38, 5, 0.5),
    op("c10d::allreduce_", 40, 4),
    launch(41, 6, 0.5),
    op("Optimizer.step#SGD.step", 94, 5, cat="user_annotation"),
    op("aten::add_", 94.5, 1.5),
    launch(95, 7, 0.5),
    op("forward", 101, 29),
    op("aten::mm", 102, 6),
    launch(106, 8, 0.5),
    op("c10d::allreduce_", 109, 3),
    launch(110, 9, 0.5),
    op("c10d::broadcast_", 164, 2),
    launch(165, 10, 0.5),
    kernel("K1", 7, 10, 20, 1),
    kernel("K1n", 9, 12, 6, 2),
    kernel("K2", 7, 35, 25, 3),
    kernel("K3", 7, 60, 10, 4),
    kernel("S1", 8, 40, 10, 5),
    kernel("K4", 7, 95, 35, 7),
    kernel("K5", 7, 150, 10, 8),
    nccl("ncclDevKernel_AllReduce_Sum_f32_RING_LL(x)", 45, 45, 6, "allreduce", "0", 1024, "Float"),
    nccl("ncclDevKernel_AllReduce_Sum_f32_RING_LL(x)", 112, 38, 9, "allreduce", "0", 2_621_440, "Float"),
    nccl("ncclDevKernel_Broadcast_RING_LL(x)", 170, 10, 10, "broadcast", "1", 100, "Byte"),
]
RANK1 = [
    nccl("ncclDevKernel_AllReduce_Sum_f32_RING_LL(x)", 10, 10, 1, "allreduce", "0", 1024, "Float"),
    nccl("ncclDevKernel_AllReduce_Sum_f32_RING_LL(x)", 30, 20, 2, "allreduce", "0", 1024, "Float"),
]


@pytest.fixture
def hand(store, tmp_path):
    (tmp_path / "run").mkdir()
    kineto(tmp_path / "run" / "rank0.json.gz", RANK0, rank=0, world_size=2)
    kineto(tmp_path / "run" / "rank1.json.gz", RANK1, rank=1, world_size=2)
    ingest(store, [tmp_path / "run"], run="hand")
    return store


def _rows(df, key: str) -> dict:
    return {r[key]: r for r in df.iter_rows(named=True)}


def test_gaps_hand_made(hand):
    res = analyze(hand, "gaps", "hand")
    g = res.gaps.sort("rank", "start_ns")
    us = lambda ns: (ns - 1_700_000_000_000_000_000) / 1000  # noqa: E731
    got = [
        (
            r["rank"],
            r["step"],
            us(r["start_ns"]),
            us(r["end_ns"]),
            r["collective"],
            r["last_compute"],
            r["launch_op"],
            r["top_op"],
        )
        for r in g.iter_rows(named=True)
    ]
    assert got == [
        (
            0,
            1,
            70,
            90,
            "all_reduce (pg 0, 4.0 KiB)",
            "K3",
            "aten::mm",
            "autograd::engine::evaluate_function: MmBackward0",
        ),
        (0, 2, 130, 150, "all_reduce (pg 0, 10.0 MiB)", "K4", "aten::add_", "Optimizer.step#SGD.step"),
        (0, 2, 170, 180, "broadcast (pg 1, 100 B)", "K5", "aten::mm", "forward"),
        # rank 1 has no steps: its first all-reduce is matched with rank 0's first of the same size by
        # their order over the run, and the clocks put their ends together (rank 1 moved by +70 us)
        (1, None, 80, 90, "all_reduce (pg 0, 4.0 KiB)", None, None, None),
        (1, None, 100, 120, "all_reduce (pg 0, 4.0 KiB)", None, None, None),
    ]
    assert g["bytes"].to_list() == [4096, 10_485_760, 100, 4096, 4096]
    assert g["collectives"].to_list() == [1, 1, 1, 1, 1]
    # Causes over ranks and steps: 30 us (rank 1, two gaps), then the two 20 us ones (by name), then 10.
    c = res.frame
    assert c["cause"].to_list() == [
        "all_reduce (pg 0, 4.0 KiB) with no compute before",
        "all_reduce (pg 0, 10.0 MiB) after Optimizer.step#SGD.step",
        "all_reduce (pg 0, 4.0 KiB) after autograd::engine::evaluate_function: MmBackward0",
        "broadcast (pg 1, 100 B) after forward",
    ]
    assert c["exposed_ns"].to_list() == [30_000, 20_000, 20_000, 10_000]
    assert c["pct"].to_list() == pytest.approx([37.5, 25.0, 25.0, 12.5])
    assert (c["gaps"][0], c["ranks"][0], c["steps"][0]) == (2, 1, 0)
    steps = _rows(res.steps, "step")
    assert (steps[1]["comm_ns"], steps[1]["exposed_ns"], steps[1]["step_ns"], steps[1]["gaps"]) == (
        45_000,
        20_000,
        120_000,
        1,
    )
    assert (steps[2]["comm_ns"], steps[2]["exposed_ns"], steps[2]["step_ns"], steps[2]["gaps"]) == (
        48_000,
        30_000,
        68_000,
        2,
    )
    assert steps[2]["exposed_pct"] == pytest.approx(100 * 30 / 68)
    ranks = _rows(res.ranks, "rank")
    assert (ranks[0]["comm_ns"], ranks[0]["exposed_ns"], ranks[0]["window_ns"], ranks[0]["gaps"]) == (
        93_000,
        50_000,
        170_000,
        3,
    )
    assert (ranks[1]["comm_ns"], ranks[1]["exposed_ns"], ranks[1]["exposed_pct"]) == (30_000, 30_000, 75.0)


def test_overlap_hand_made(hand):
    res = analyze(hand, "overlap", "hand")
    r = _rows(res.frame, "rank")
    assert (r[0]["comm_ns"], r[0]["compute_ns"], r[0]["overlap_ns"], r[0]["exposed_comm_ns"]) == (
        93_000,
        100_000,
        43_000,
        50_000,
    )
    assert r[0]["overlap_pct"] == pytest.approx(100 * 43 / 93)
    assert (r[1]["overlap_ns"], r[1]["exposed_comm_ns"], r[1]["overlap_pct"]) == (0, 30_000, 0.0)
    s = _rows(res.steps.filter(res.steps["rank"] == 0), "step")
    assert (s[1]["comm_ns"], s[1]["compute_ns"], s[1]["overlap_ns"], s[1]["window_ns"]) == (
        45_000,
        90_000,
        25_000,
        120_000,
    )
    # K4 (launched in step 1) hides 18 us of step 2's all-reduce: exposed 30, not the 48 of step 2 alone.
    assert (s[2]["comm_ns"], s[2]["compute_ns"], s[2]["overlap_ns"], s[2]["exposed_comm_ns"]) == (
        48_000,
        10_000,
        18_000,
        30_000,
    )
    assert s[2]["exposed_comm_pct"] == pytest.approx(100 * 30 / 68)


def test_idle_hand_made(hand):
    # Stream 7 by start: K1 [10,30) L3; K2 [35,60) L33 > 30: host wait 5;
    # K3 [60,70) L34: kernel wait 0; K4 [95,130) L95 > 70: host wait 25; K5 [150,160) L106 < 130: kernel
    # wait 20. Stream 20: N2 L110 > 90: host wait 22; N3 L165 > 150: host wait 20. Stream 8: one kernel.
    s = _rows(analyze(hand, "idle", "hand").frame.filter(pl.col("rank") == 0), "stream")
    assert (s[7]["host_wait_ns"], s[7]["kernel_wait_ns"], s[7]["other_ns"]) == (30_000, 20_000, 0)
    assert (s[20]["host_wait_ns"], s[20]["kernel_wait_ns"], s[20]["other_ns"]) == (42_000, 0, 0)
    assert (s[8]["kernels"], s[8]["idle_ns"]) == (1, 0)
    # HTA keeps only GPU work launched before the last step (K1 K2 K3 K4 on stream 7) and measures
    # from the previous row: K2 35 - 30 = 5 (host wait, 33 > 30), K3 0 (kernel wait), K4 25 (host wait).
    h = _rows(analyze(hand, "idle", "hand", hta=True).frame.filter(pl.col("rank") == 0), "stream")
    assert (h[7]["host_wait_ns"], h[7]["kernel_wait_ns"], h[7]["other_ns"]) == (30_000, 0, 0)


# CPU-only (gloo) micro run. Training thread 1, ProfilerStep#3 [0, 100):
#   autograd::engine::evaluate_function: AddmmBackward0 [10, 40) > aten::mm [12, 30)
#   c10d::allreduce_ [41, 43) (an enqueue op, not compute); ddp reducer copy_bucket_to_grad [70, 75);
#   Optimizer.step#SGD.step (annotation) [80, 90) > aten::_fused_sgd_ [81, 89)
# gloo thread 2: gloo:all_reduce [42, 70), 256 floats = 1024 B. Compute union [10,40) [70,75) [81,89):
# the whole all-reduce [42, 70) is exposed (28 us); the last compute before it ends at 40.
CPU = [
    op("ProfilerStep#3", 0, 100, cat="user_annotation"),
    op("autograd::engine::evaluate_function: AddmmBackward0", 10, 30),
    op("aten::mm", 12, 18),
    op("c10d::allreduce_", 41, 2),
    op("torch.distributed.ddp.reducer::copy_bucket_to_grad", 70, 5),
    op("Optimizer.step#SGD.step", 80, 10, cat="user_annotation"),
    op("aten::_fused_sgd_", 81, 8),
    op(
        "gloo:all_reduce",
        42,
        28,
        cat="user_annotation",
        tid=2,
        **{"Input Dims": [[256]], "Input type": ["float"]},
    ),
]


def test_gaps_cpu_gloo_hand_made(store, tmp_path):
    ingest(store, [kineto(tmp_path / "cpu.json.gz", CPU)], run="cpu")
    res = analyze(store, "gaps", "cpu")
    (g,) = res.gaps.iter_rows(named=True)
    assert (g["step"], g["dur_ns"], g["collective"], g["bytes"]) == (3, 28_000, "all_reduce (1.0 KiB)", 1024)
    assert g["last_compute"] == g["top_op"] == "autograd::engine::evaluate_function: AddmmBackward0"
    assert g["launch_op"] is None
    assert (
        res.frame["cause"][0]
        == "all_reduce (1.0 KiB) after autograd::engine::evaluate_function: AddmmBackward0"
    )


def test_cpu_sample_top_gap_is_gradient_all_reduce_at_end_of_backward(store):
    run = SAMPLES / "normal"
    if not (run / "rank0.trace.json.gz").exists():
        pytest.skip("sample_traces/normal not recorded")
    ingest(store, [run], run="normal")
    res = analyze(store, "gaps", "normal")
    assert res.frame["op"][0] == "all_reduce"
    top = res.gaps.row(0, named=True)  # the longest gap
    assert top["op"] == "all_reduce"
    # Independent check in plain SQL on the events: on that rank and step, a gloo all_reduce runs
    # across the whole gap; the training thread's backward ops have all ended before the gap starts
    # and the optimizer starts after it ends.
    q = store.sql(
        """WITH s AS (SELECT * FROM events WHERE rank = $1 AND step = $2)
           SELECT (SELECT max(ts_ns + dur_ns) FROM s WHERE name LIKE 'autograd::engine::evaluate_function:%') AS bwd_end,
                  (SELECT min(ts_ns) FROM s WHERE name LIKE 'Optimizer.step%') AS opt_start,
                  (SELECT count(*) FROM events WHERE rank = $1 AND name = 'gloo:all_reduce'
                     AND ts_ns <= $3 AND ts_ns + dur_ns >= $4) AS covering""",
        [top["rank"], top["step"], top["start_ns"], top["end_ns"]],
    ).row(0, named=True)
    assert q["bwd_end"] <= top["start_ns"] < top["end_ns"] <= q["opt_start"]
    assert q["covering"] >= 1
    # Steps add up to the rank totals (every gloo collective starts inside a ProfilerStep here).
    per_rank = res.steps.group_by("rank").agg(pl.col("exposed_ns").sum().alias("s")).sort("rank")
    assert per_rank["s"].to_list() == res.ranks.sort("rank")["exposed_ns"].to_list()


@pytest.mark.parametrize(
    "rel, ops",
    [
        ("hta/nccl_parser_config", {"all_reduce", "broadcast"}),
        ("hta/trace_filter", {"all_gather", "all_reduce", "all_to_all"}),  # named by the launching CPU op
        ("hta/df_index_resolver", {"all_reduce"}),
    ],
)
def test_gpu_corpus_gaps_name_nccl_collectives(store, rel, ops):
    ingest(store, [corpus(rel)], run="r")
    res = analyze(store, "gaps", "r")
    g = res.gaps
    assert g.height > 0 and set(g["op"].to_list()) <= ops and g["op"].null_count() == 0
    # Every gap lies inside an NCCL kernel of its rank (plain SQL on events), and nothing else.
    store.save_frames(store.resolve_run("r"), "result_gaps", res.frames())
    inside = store.sql(
        """SELECT count(DISTINCT (g.rank, g.start_ns)) AS n FROM result_gaps_gaps g JOIN events e
           ON e.rank = g.rank AND e.kind = 'kernel' AND e.name LIKE 'nccl%'
          AND e.ts_ns <= g.start_ns AND e.ts_ns + e.dur_ns >= g.end_ns"""
    )["n"][0]
    assert inside == g.height
    if rel == "hta/nccl_parser_config":  # NCCL 2.17 args: process group and sizes are known
        assert set(g["pg"].to_list()) == {"0"} and g["bytes"].min() > 0
    # Exposed per rank equals overlap's (comm - overlap).
    ov = analyze(store, "overlap", "r").frame.sort("rank")
    assert res.ranks.sort("rank")["exposed_ns"].to_list() == ov["exposed_comm_ns"].to_list()


def test_no_communication(store, tmp_path):
    ingest(store, [kineto(tmp_path / "r0.json.gz", [kernel("gemm", 7, 0, 10, 1), launch(-1, 1)])], run="c")
    res = analyze(store, "gaps", "c")
    assert res.gaps.is_empty() and res.frame.is_empty()
    assert res.ranks.row(0, named=True)["exposed_ns"] == 0
    assert res.notes == ("no exposed communication: the run has no communication",)


def test_top_cause_note_counts_in_words(store):
    # nccl_parser_config: the top cause lies on one rank; the note's counts and share are its row of
    # the causes table, "1 rank" in the singular, a share under 10% with one decimal
    ingest(store, [corpus("hta/nccl_parser_config")], run="r")
    res = analyze(store, "gaps", "r")
    top = res.frame.row(0, named=True)
    assert top["ranks"] == 1 and top["gaps"] > 1
    pct = f"{top['pct']:.0f}%" if top["pct"] >= 10 else f"{top['pct']:.1f}%"
    note = next(n for n in res.notes if n.startswith("top cause: "))
    assert note == (
        f"top cause: {top['cause']}: {pct} of exposed communication ({top['exposed_ns'] / 1e6:.2f} ms in "
        f"{top['gaps']} gaps, 1 rank, {top['steps']} steps)"
    )
    assert top["exposed_ns"] == res.gaps.filter(pl.col("cause") == top["cause"])["dur_ns"].sum()


def _hugedur_rank(huge: bool) -> list[dict]:
    """Two 1,000-us steps of a GPU rank: aten::mm [10, 30) launching a 400-us GEMM at 20, then
    record_param_comms [30, 35) launching the all-reduce kernel [425, 825) (4 MiB, pg 0). With
    ``huge`` step 0's record_param_comms has dur 3e15 us (garbage): ingest clips it to the end of
    the trace (flag ``overrun``), so it spans step 1's aten::mm and its launch."""
    comm = collective_args(ranks=[0, 1], nelems=1048576, out_nelems=1048576, group_size=2)
    ev, corr = [], 1
    for s in range(2):
        t = 1000.0 * (s + 1)
        ev.append(
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": f"ProfilerStep#{s}",
                "pid": 1,
                "tid": 1,
                "ts": t,
                "dur": 1000,
            }
        )
        ev.append(
            {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": t + 10, "dur": 20}
        )
        ev += [launch(t + 12, corr, 5), kernel("volta_sgemm_128x64_nn", 7, t + 20, 400, corr)]
        dur = 3e15 if huge and s == 0 else 5
        ev.append(
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": "record_param_comms",
                "pid": 1,
                "tid": 1,
                "ts": t + 30,
                "dur": dur,
                "args": {**comm, "Seq": s + 1},
            }
        )
        nccl = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
        ev += [launch(t + 31, corr + 1, 3), kernel(nccl, 20, t + 425, 400, corr + 1, **comm, Seq=s + 1)]
        corr += 2
    return ev


def test_a_clipped_record_is_never_the_compute_before_a_gap(store, tmp_path):
    (tmp_path / "huge").mkdir()
    for r in (0, 1):
        kineto(tmp_path / "huge" / f"rank{r}.json.gz", _hugedur_rank(huge=r == 0), rank=r, world_size=2)
    ingest(store, [tmp_path / "huge"], run="huge")
    res = analyze(store, "gaps", "huge")
    # Each rank's all-reduce [425, 825) of each step is exposed (no compute after the GEMM ends at
    # 420): 4 gaps of 400 us. Each follows the GEMM launched inside aten::mm; the clipped
    # record_param_comms (and a collective's enqueue at all) is never the compute before: one cause.
    assert res.frame.select("cause", "exposed_ns", "gaps", "pct").rows() == [
        ("all_reduce (pg 0, 4.0 MiB) after aten::mm", 1600 * 1000, 4, 100.0)
    ]
