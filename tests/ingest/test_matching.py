"""Collective matching: pg+seq, ordinal fallback, gloo enqueue pairing, re-matching, NDTimeline."""

from __future__ import annotations

import gzip
import json

import polars as pl
import pytest

from tests.builders import BASE, collective_args, gloo_rank, kernel, launch, step, two_host_tp_run, write_rank
from tests.conftest import SAMPLES, analyze, corpus
from traceprof.ingest import matching
from traceprof.ingest.ingest import ingest
from traceprof.storage.store import Store


def test_gloo_enqueue_pairing_and_ordinal_matching(store, tmp_path):
    # Two all-reduces (100 then 200 floats). Rank 0 enqueues at 100 and 300 us; its runloop is
    # busy, so the second work item starts only at 420. Rank 1 enqueues at 150 and 500 us.
    write_rank(tmp_path / "run" / "r0.json", gloo_rank([(100, 110, 400, 100), (300, 420, 600, 200)]), 0)
    write_rank(tmp_path / "run" / "r1.json", gloo_rank([(150, 160, 401, 100), (500, 510, 601, 200)]), 1)
    ingest(store, [tmp_path / "run"])
    rows = store.sql(
        "SELECT rank, enter_ns - $1 AS enter, start_ns - $1 AS start, step, match_method "
        "FROM collectives ORDER BY rank, start_ns",
        [BASE],
    ).rows()
    # enter = the c10d enqueue (us * 1000), start = the gloo work; both rows in step 3.
    assert rows == [
        (0, 100_000, 110_000, 3, "ordinal"),
        (0, 300_000, 420_000, 3, "ordinal"),
        (1, 150_000, 160_000, 3, "ordinal"),
        (1, 500_000, 510_000, 3, "ordinal"),
    ]
    inst = store.sql(
        "SELECT ranks_present, ranks_missing, first_arrival_ns - $1 AS first, last_arrival_ns - $1 AS last, "
        "last_rank, arrival_skew_ns, bytes FROM collective_instances ORDER BY instance_id",
        [BASE],
    ).rows()
    # Instance 1: arrivals 100 (rank 0) and 150 us (rank 1): skew 50 us; instance 2: 300 and 500.
    assert inst == [
        ([0, 1], [], 100_000, 150_000, 1, 50_000, 400),
        ([0, 1], [], 300_000, 500_000, 1, 200_000, 800),
    ]


def test_a_collective_of_unknown_size_pairs_by_its_order(store, tmp_path):
    # Three all-reduces (100, 200, 100 floats) per rank; rank 0's second holds "Input Dims": [[NaN]]
    # (read as null with --skip-bad-events). Its size was taken as 1 element (4 bytes, the null dim
    # skipped): a kind of its own, so it and rank 1's 200 made two one-rank instances (4 in all).
    # Unknown: its element count and bytes are NULL, and the all-reduces pair by their order (3).
    enq = [(100, 110, 150, 100), (300, 310, 350, 200), (500, 510, 550, 100)]
    events = gloo_rank(enq)
    events[4]["args"]["Input Dims"] = [[float("nan")]]  # json.dumps writes NaN
    write_rank(tmp_path / "run" / "r0.json", events, 0)
    write_rank(
        tmp_path / "run" / "r1.json", gloo_rank([(e + 20, s + 20, t + 20, n) for e, s, t, n in enq]), 1
    )
    ingest(store, [tmp_path / "run"], on_bad_event="skip")
    rows = store.sql(
        "SELECT rank, start_ns - $1 AS start, nelems_in, bytes_in, instance_id, match_method "
        "FROM collectives ORDER BY rank, start_ns",
        [BASE],
    ).rows()
    assert rows == [
        (0, 110_000, 100, 400, 1, "ordinal"),
        (0, 310_000, None, None, 2, "ordinal"),
        (0, 510_000, 100, 400, 3, "ordinal"),
        (1, 130_000, 100, 400, 1, "ordinal"),
        (1, 330_000, 200, 800, 2, "ordinal"),
        (1, 530_000, 100, 400, 3, "ordinal"),
    ]
    assert store.sql("SELECT ranks_present FROM collective_instances ORDER BY instance_id").rows() == [
        ([0, 1],),
        ([0, 1],),
        ([0, 1],),
    ]


def test_ordinals_count_within_each_step(store, tmp_path):
    # All-reduces of 100 floats without ids, ProfilerStep#1 [0, 1000] and #2 [1000, 2000] us. Rank 0
    # enqueues two in step 1 (100, 300 us) and one in step 2 (1100); rank 1's trace lost step 1's
    # second (enqueues at 150 and 1150). Ordinals count within (group, op, size, step): step 1
    # #0 = rank 0's 100 + rank 1's 150; step 1 #1 = rank 0's 300 alone (rank 1 missing); step 2 #0 =
    # 1100 + 1150. Counted over the whole trace instead, step 2's would be #2 on rank 0 and #1 on
    # rank 1: two one-rank instances, and the loss in step 1 would spread into every later step.
    write_rank(
        tmp_path / "run" / "r0.json",
        gloo_rank([(100, 110, 200, 100), (300, 310, 400, 100)], step=1)
        + gloo_rank([(1100, 1110, 1200, 100)], step=2, t0=1000),
        0,
    )
    write_rank(
        tmp_path / "run" / "r1.json",
        gloo_rank([(150, 160, 201, 100)], step=1) + gloo_rank([(1150, 1160, 1201, 100)], step=2, t0=1000),
        1,
    )
    ingest(store, [tmp_path / "run"])
    inst = store.sql(
        "SELECT step, ranks_present, ranks_missing, first_arrival_ns - $1 AS first, "
        "last_arrival_ns - $1 AS last, match_method FROM collective_instances ORDER BY instance_id",
        [BASE],
    ).rows()
    assert inst == [
        (1, [0, 1], [], 100_000, 150_000, "ordinal"),
        (1, [0], [1], 300_000, 300_000, "ordinal"),
        (2, [0, 1], [], 1_100_000, 1_150_000, "ordinal"),
    ]


def _nccl_rank(seqs: list[int]) -> list[dict]:
    """A GPU rank whose k-th all-reduce (Seq seqs[k]) is launched at 100*k + 10 us and runs on
    stream 7 from 100*k + 20 + seq to 100*k + 60 us."""
    ev = [
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "ProfilerStep#1",
            "pid": 1,
            "tid": 1,
            "ts": 0,
            "dur": 1000,
        }
    ]
    for k, seq in enumerate(seqs):
        ev.append(
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": "cudaLaunchKernel",
                "pid": 1,
                "tid": 1,
                "ts": 100 * k + 10,
                "dur": 2,
                "args": {"correlation": 50 + k},
            }
        )
        ev.append(
            {
                "ph": "X",
                "cat": "kernel",
                "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
                "pid": 0,
                "tid": 7,
                "ts": 100 * k + 20 + seq,
                "dur": 40 - seq,
                "args": {
                    "correlation": 50 + k,
                    "device": 0,
                    "stream": 7,
                    **collective_args(seq=seq, nelems=1024),
                },
            }
        )
    return ev


def test_pg_seq_matching_records_missing_ranks(store, tmp_path):
    # Rank 1 has no record of Seq 2 (e.g. cut from its trace). Matching by (pg, seq) keeps Seq 3
    # of both ranks together, where matching by order would have paired rank 1's Seq 3 with
    # rank 0's Seq 2.
    write_rank(tmp_path / "run" / "r0.json", _nccl_rank([1, 2, 3]), 0, backend="nccl")
    write_rank(tmp_path / "run" / "r1.json", _nccl_rank([1, 3]), 1, backend="nccl")
    res = ingest(store, [tmp_path / "run"])
    assert any("1 of 3 matched collectives miss some ranks" in w for w in res.warnings)
    inst = store.sql(
        "SELECT seq, ranks_present, ranks_missing, first_arrival_ns - $1 AS first, match_method "
        "FROM collective_instances ORDER BY seq",
        [BASE],
    ).rows()
    # Arrival on GPU = kernel start: Seq 1 at 21 us on both; Seq 2 at 122 on rank 0 only; Seq 3
    # at 223 on rank 0 (3rd launch) and 123 on rank 1 (2nd launch).
    assert inst == [
        (1, [0, 1], [], 21_000, "pg_seq"),
        (2, [0], [1], 122_000, "pg_seq"),
        (3, [0, 1], [], 123_000, "pg_seq"),
    ]


def test_matching_is_redone_when_the_run_gains_a_rank(store, tmp_path):
    write_rank(tmp_path / "a" / "r0.json", gloo_rank([(100, 110, 400, 100)]), 0)
    write_rank(tmp_path / "b" / "r1.json", gloo_rank([(150, 160, 401, 100)]), 1)
    ingest(store, [tmp_path / "a"], run="job")
    assert store.sql("SELECT ranks_present FROM collective_instances").rows() == [([0],)]
    ingest(store, [tmp_path / "b"], run="job")
    assert store.sql("SELECT ranks_present, last_rank FROM collective_instances").rows() == [([0, 1], 1)]
    assert store.sql("SELECT count(DISTINCT instance_id) FROM collectives").item() == 1


def test_sample_enqueue_pairing_is_the_order_pairing(store):
    run = SAMPLES / "straggler_rank2"
    if not (run / "rank0.trace.json.gz").exists():
        pytest.skip("sample_traces/straggler_rank2 not recorded")
    ingest(store, [run], align=False)
    # Independent pairing from the raw JSON: the k-th c10d::allreduce_ (by ts) of a rank feeds its
    # k-th gloo:all_reduce (by ts); enter_ns must be base + that enqueue's ts.
    for rank in range(4):
        doc = json.loads(gzip.decompress((run / f"rank{rank}.trace.json.gz").read_bytes()))
        enq = sorted(e["ts"] for e in doc["traceEvents"] if e.get("name") == "c10d::allreduce_")
        got = store.sql(
            "SELECT enter_ns FROM collectives WHERE rank = ? AND source = 'gloo' ORDER BY start_ns", [rank]
        )["enter_ns"].to_list()
        assert len(got) == len(enq) == 12
        assert all(
            abs(g - (doc["baseTimeNanoseconds"] + round(t * 1000))) <= 1
            for g, t in zip(got, enq, strict=True)
        )
    # 3 steps x 4 gradient buckets, every one seen by the 4 ranks.
    inst = store.sql(
        "SELECT n_ranks, count(*) AS n FROM collective_instances WHERE source = 'gloo' GROUP BY ALL"
    )
    assert inst.rows() == [(4, 12)]


def test_ndtimeline_groups(store):
    path = corpus("kineto_misc/bytedance_straggler_whatif/trace-ST.parquet")
    ingest(store, [path])
    df = pl.read_parquet(path).with_columns(pl.col("optype").cast(pl.Utf8))
    n = dict(df.group_by("optype").len().iter_rows())
    dp = df["dp_rank"].n_unique()
    # Worked out from the Parquet rows: every send pairs with one receive; an all-gather or a
    # reduce-scatter spans the dp ranks of a stage; the embedding all-reduce spans the first and
    # last stage of a dp rank; the grad-norm all-reduce spans every worker (one per step).
    expected = (
        n["forward-send"]
        + n["backward-send"]
        + (n["params-all-gather"] + n["grads-reduce-scatter"]) // dp
        + n["embedding-grads-all-reduce"] // 2
        + df["step"].n_unique()
    )
    assert expected == 1888
    got = store.sql(
        "SELECT count(*), min(n_ranks), bool_and(len(ranks_missing) = 0) FROM collective_instances"
    ).row(0)
    assert got == (expected, 2, True)
    # Point-to-point pairs join the same dp rank on adjacent stages.
    where = dict(
        zip(
            df["rank"].to_list(),
            zip(df["dp_rank"].to_list(), df["stage"].to_list(), strict=True),
            strict=True,
        )
    )
    for (present,) in store.sql("SELECT ranks_present FROM collective_instances WHERE pg LIKE 'pp%'").rows():
        (d0, s0), (d1, s1) = where[present[0]], where[present[1]]
        assert d0 == d1 and abs(s0 - s1) == 1


def _p2p_rank(starts: list[int]) -> list[dict]:
    """An old-style GPU rank: one SendRecv NCCL kernel (no process group, no Seq) per start (us),
    20 us long, on stream 9, each launched 5 us before it starts."""
    ev = [
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "ProfilerStep#1",
            "pid": 1,
            "tid": 1,
            "ts": 0,
            "dur": 1000,
        }
    ]
    for k, t in enumerate(starts):
        ev.append(
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": "cudaLaunchKernel",
                "pid": 1,
                "tid": 1,
                "ts": t - 5,
                "dur": 2,
                "args": {"correlation": 70 + k},
            }
        )
        ev.append(
            {
                "ph": "X",
                "cat": "kernel",
                "name": "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t",
                "pid": 0,
                "tid": 9,
                "ts": t,
                "dur": 20,
                "args": {"correlation": 70 + k, "device": 0, "stream": 9},
            }
        )
    return ev


def test_point_to_point_without_ids_is_not_matched_by_order(store, tmp_path):
    # Rank 0's second SendRecv (100 us) ends at 120, before rank 1's second one starts (400): the
    # k-th send/recv of two ranks need not be the same transfer (each has one unknown peer), so
    # they stay unmatched instead of being paired by ordinal.
    write_rank(tmp_path / "run" / "r0.json", _p2p_rank([10, 100]), 0, world=128, backend="nccl")
    write_rank(tmp_path / "run" / "r1.json", _p2p_rank([12, 400]), 1, world=128, backend="nccl")
    ingest(store, [tmp_path / "run"])
    rows = store.sql("SELECT op, instance_id, match_method FROM collectives ORDER BY rank, start_ns").rows()
    assert rows == [("send_recv", None, None)] * 4
    assert store.sql("SELECT count(*) FROM collective_instances").item() == 0
    assert matching.unmatched_p2p(store, store.resolve_run("run")) == 4


def _pipeline_rank(ops: list[tuple], rank: int, comms_id: bool, ar_us: int = 600) -> list[dict]:
    """One rank of a 3-stage pipeline on the world group "0" [0, 1, 2]: its send / recv kernels (op,
    peer, start, end in us[, elements: 1024 unless given]) numbered by the rank's own p2p counter
    (Seq 1, 2, ... in issue order, as c10d's seqP2P_ is), then an all-reduce (collective Seq 1) at
    ``ar_us`` + 10 * rank, ending at ``ar_us`` + 100, in one step of ``ar_us`` + 400 us."""
    group = {"ranks": [0, 1, 2], "group_size": 3}
    rows = [
        (
            SR,
            collective_args(op, seq, nelems=n[0] if n else 1024, **group),
            a,
            b,
            rank if op == "send" else peer,
            peer if op == "send" else rank,
        )
        for seq, (op, peer, a, b, *n) in enumerate(ops, 1)
    ] + [
        (AR, collective_args("allreduce", 1, nelems=256, **group), ar_us + 10 * rank, ar_us + 100, None, None)
    ]
    ev = [step(1, 0, ar_us + 400)]
    for k, (name, args, a, b, src, dst) in enumerate(rows):
        if src is not None:
            args |= {"Src Rank": src, "Dst Rank": dst}
        if comms_id:  # hashes (pg, this rank's seq, p2p, ...): differs between the two ends, as Seq does
            args["Comms Id"] = 1000 * args["Seq"] + (name == SR)
        ev += [launch(a - 5, 90 + k), kernel(name, 9, a, b - a, 90 + k, **args)]
    return ev  # fmt: skip


SR = "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"
AR = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


@pytest.mark.parametrize("comms_id", [False, True])
def test_point_to_point_of_a_wide_group_is_matched_per_pair(store, tmp_path, comms_id):
    # g7 variant p2p_and_collective_seq/pp3_world_pg(_comms_id): a 3-stage pipeline on the world
    # group, two micro-batches. Rank 1 receives from 0 and sends to 2 on one counter, so its send to
    # rank 2 is its Seq 2 while rank 2's recv is Seq 1: (pg, Seq) and the Comms Id (which hashes Seq)
    # cannot pair them. Each is the k-th transfer from one rank to the other: 0->1 #1 (send 100,
    # recv 80: skew 20 us, last 0), 1->2 #1 (recv 250, send 300: 50, last 1), 0->1 #2 (send 300,
    # recv 350: 50, last 1), 1->2 #2 (recv 450, send 500: 50, last 1), none missing a rank; the
    # all-reduce stays one instance of the three ranks (skew 20 us, last 2).
    ops = {
        0: [("send", 1, 100, 200), ("send", 1, 300, 400)],
        1: [("recv", 0, 80, 200), ("send", 2, 300, 350), ("recv", 0, 350, 400), ("send", 2, 500, 550)],
        2: [("recv", 1, 250, 350), ("recv", 1, 450, 550)],
    }
    for r, lst in ops.items():
        write_rank(
            tmp_path / "run" / f"r{r}.json", _pipeline_rank(lst, r, comms_id), r, world=3, backend="nccl"
        )
    res = ingest(store, [tmp_path / "run"])
    assert not any("miss some ranks" in w for w in res.warnings)
    assert any(
        "matched as the k-th transfer between those two ranks (match_method pair_order)" in w
        for w in res.warnings
    )
    inst = store.sql(
        "SELECT ranks_present, ranks_missing, first_arrival_ns - $1, arrival_skew_ns, last_rank, match_method "
        "FROM collective_instances ORDER BY first_arrival_ns",
        [BASE],
    ).rows()
    assert inst == [
        ([0, 1], [], 80_000, 20_000, 0, "pair_order"),
        ([1, 2], [], 250_000, 50_000, 1, "pair_order"),
        ([0, 1], [], 300_000, 50_000, 1, "pair_order"),
        ([1, 2], [], 450_000, 50_000, 1, "pair_order"),
        ([0, 1, 2], [], 600_000, 20_000, 2, "comms_id" if comms_id else "pg_seq"),
    ]
    assert matching.unmatched_p2p(store, store.resolve_run("run")) == 0


def test_a_direction_whose_ends_differ_in_transfers_is_left_unmatched(store, tmp_path):
    # g7's pipeline with rank 1's first receive (from rank 0, 80-200 us) lost from its trace: rank 0
    # sent 2 transfers to rank 1, which holds 1 (its recv of 350-400 us, the second). By order,
    # rank 0's send #1 (100-200 us) paired with it, every later transfer shifted: direction 0->1 is
    # left unmatched with a note, 1->2 (2 and 2) stays matched: (recv 250, send 300), (450, 500).
    ops = {
        0: [("send", 1, 100, 200), ("send", 1, 300, 400)],
        1: [("send", 2, 300, 350), ("recv", 0, 350, 400), ("send", 2, 500, 550)],
        2: [("recv", 1, 250, 350), ("recv", 1, 450, 550)],
    }
    for r, lst in ops.items():
        write_rank(tmp_path / "run" / f"r{r}.json", _pipeline_rank(lst, r, False), r, world=3, backend="nccl")
    notes = [w for w in ingest(store, [tmp_path / "run"]).warnings if "received" in w]
    assert notes == [
        "run 'run': source nccl_kernel, process group '0' [0, 1, 2] (point-to-point): rank 0 sent 2 transfers "
        "to rank 1, which received 1: one end's trace lacks some, so the k-th of each end need not be the same "
        "transfer; this direction was left unmatched"
    ]
    sql = "SELECT rank, op, start_ns - $1, instance_id, match_method FROM collectives WHERE peer >= 0"
    assert store.sql(sql + " ORDER BY rank, start_ns", [BASE]).rows() == [
        (0, "send", 100_000, None, None),
        (0, "send", 300_000, None, None),
        (1, "send", 300_000, 1, "pair_order"),
        (1, "recv", 350_000, None, None),
        (1, "send", 500_000, 2, "pair_order"),
        (2, "recv", 250_000, 1, "pair_order"),
        (2, "recv", 450_000, 2, "pair_order"),
    ]
    assert matching.unmatched_p2p(store, store.resolve_run("run")) == 3


def _lost_at_each_end(why: str) -> dict[int, list[tuple]]:
    """The 3-stage pipeline's ops per rank (:func:`_pipeline_rank`) with a transfer of 0 -> 1 lost
    from each end (module doc of the tests using it)."""
    if why == "time":  # 4 micro-batches every 250 us; rank 0's send #1 and rank 1's recv #4 lost
        return {
            0: [("send", 1, 250 * k + 20, 250 * k + 100) for k in (1, 2, 3)],
            1: [
                op
                for k in range(4)
                for op in (
                    ("recv", 0, 250 * k + 10, 250 * k + 100),
                    ("send", 2, 250 * k + 110, 250 * k + 130),
                )
                if not (op[0] == "recv" and k == 3)
            ],
            2: [("recv", 1, 250 * k + 105, 250 * k + 130) for k in range(4)],
        }
    # two concurrent transfers of 1024 and 2048 elements (Float: 4096 and 8192 bytes); rank 0's
    # first send and rank 1's second recv lost
    return {
        0: [("send", 1, 60, 140, 2048)],
        1: [("recv", 0, 10, 100, 1024), ("send", 2, 150, 170)],
        2: [("recv", 1, 145, 170)],
    }


@pytest.mark.parametrize(
    ("why", "detail", "pairs"),
    [
        # Direction 0 -> 1, transfers k = 1..4: send [250(k-1) + 20, 250(k-1) + 100] us, recv [250(k-1)
        # + 10, 250(k-1) + 100]; 1 -> 2: send [250(k-1) + 110, + 130], recv [250(k-1) + 105, + 130].
        # Rank 0's send #1 and rank 1's recv #4 are lost: 3 and 3, so order pairs rank 0's send of
        # transfer 2 (starts 270 us; its p2p Seq 1) with rank 1's recv of transfer 1 (ends 100 us; Seq
        # 1): the recv ends 170 us before the send starts, beyond the clocks' uncertainty (the ranks
        # share a clock: residual 0, so 50 us, MIN_OFFSET_NS). Before: 3 pair_order instances of 0
        # -> 1, each one transfer off. 1 -> 2 (4 and 4, all fitting) stays matched: 4 pairs.
        (
            "time",
            "the time check fails: rank 1's recv #1 (p2p Seq 1) ended 170.000 us before rank 0's send #1 (p2p "
            "Seq 1) started (more than the clocks' uncertainty, 50.000 us), and a recv cannot end before its send "
            "starts: the k-th of each end is not one transfer (pairs shift by a transfer missing from each end's "
            "trace, or clocks further apart than measured)",
            4,
        ),
        # Two transfers 0 -> 1 running at once, of 1024 and 2048 elements; rank 0's first send and
        # rank 1's second recv lost: 1 and 1, order pairs the send of 2048 elements (8192 bytes, 60
        # to 140 us) with the recv of 1024 (4096 bytes, 10 to 100 us): in time (the recv ends after
        # the send starts) but not in size. 1 -> 2 (1 and 1, 1024 each) stays matched.
        (
            "bytes",
            "the size check fails: rank 0's send #1 (p2p Seq 1) moves 8,192 bytes, rank 1's recv #1 (p2p Seq 1) "
            "4,096, and both ends of one transfer move one message: the k-th of each end is not one transfer "
            "(pairs shift by a transfer missing from each end's trace)",
            1,
        ),
    ],
)
def test_a_direction_that_lost_a_transfer_at_each_end_is_left_unmatched(store, tmp_path, why, detail, pairs):
    for r, lst in _lost_at_each_end(why).items():
        write_rank(
            tmp_path / "run" / f"r{r}.json",
            _pipeline_rank(lst, r, False, ar_us=1100),
            r,
            world=3,
            backend="nccl",
        )
    notes = [w for w in ingest(store, [tmp_path / "run"]).warnings if "paired by order" in w]
    n = 3 if why == "time" else 1
    assert notes == [
        f"run 'run': source nccl_kernel, process group '0' [0, 1, 2] (point-to-point): rank 0 sent {n} "
        f"transfer{'s' if n > 1 else ''} to rank 1, which received {n}, but paired by order {detail}; this "
        "direction was left unmatched"
    ]
    got = store.sql(
        """SELECT (op = 'send')::INT * rank + (op = 'recv')::INT * peer AS src, count(*) FILTER (WHERE instance_id
                  IS NULL) AS unmatched, count(*) FILTER (WHERE match_method = 'pair_order') AS paired
           FROM collectives WHERE peer >= 0 GROUP BY ALL ORDER BY ALL"""
    ).rows()
    assert got == [(0, 2 * n, 0), (1, 0, 2 * pairs)]
    # the instances left: the 1 -> 2 pairs and the all-reduce, numbered 1.. without a gap
    ids = store.sql("SELECT instance_id FROM collective_instances ORDER BY 1")["instance_id"].to_list()
    assert ids == list(range(1, pairs + 2))
    assert matching.unmatched_p2p(store, store.resolve_run("run")) == 2 * n


def test_a_pair_that_fails_the_time_check_is_not_said_to_have_lost_transfers(store, tmp_path):
    """No transfer lost, the ranks on one host (t10's p2p/far): 0 -> 1 transfers k = 0..3, send
    [250k + 20, 250k + 100] us, recv [250k - 180, 250k - 90] us (190 us earlier than the send's
    recv): 4 sends and 4 recvs, each recv ends 250k - 90, 110 us before its send starts at
    250k + 20, beyond the tolerance max(50 us, 2 x residual 0) = 50 us. 1 -> 2: send [250k + 110,
    + 130], recv [250k + 105, + 130], all fitting. The note said "each end's trace lacks a
    different transfer" though none is lost; now it says the time check failed and names the
    causes it cannot tell apart."""
    ops = {
        0: [("send", 1, 250 * k + 20, 250 * k + 100) for k in range(4)],
        1: [
            op
            for k in range(4)
            for op in (("recv", 0, 250 * k - 180, 250 * k - 90), ("send", 2, 250 * k + 110, 250 * k + 130))
        ],
        2: [("recv", 1, 250 * k + 105, 250 * k + 130) for k in range(4)],
    }
    for r, lst in ops.items():
        write_rank(
            tmp_path / "run" / f"r{r}.json",
            _pipeline_rank(lst, r, False, ar_us=1100),
            r,
            world=3,
            backend="nccl",
        )
    (note,) = [w for w in ingest(store, [tmp_path / "run"]).warnings if "paired by order" in w]
    assert (
        "rank 0 sent 4 transfers to rank 1, which received 4, but paired by order the time check fails: rank 1's "
        "recv #1 (p2p Seq 1) ended 110.000 us before rank 0's send #1 (p2p Seq 1) started (more than the "
        "clocks' uncertainty, 50.000 us)"
    ) in note
    assert "lacks" not in note and "clocks further apart than measured" in note


def test_trace_filter_collectives_are_named_by_their_launching_op(store):
    # Old-style traces (hta/trace_filter, ranks 0 and 1 of a 128-rank job) carry no metadata on the
    # kernels, and NCCL runs their all-to-alls, all-reduces and all-gathers all as
    # ncclKernel_SendRecv. The launching CPU ops name them (nccl:all_to_all / c10d::alltoall_base_,
    # nccl:all_reduce / c10d::allreduce_, nccl:_all_gather_base): per rank 4 all_to_all, 4
    # all_reduce, 2 all_gather (the raw trace's counts of those annotations), none send_recv, and
    # so they match by order across the two ranks. The all-reduces' sizes come from their
    # nccl:all_reduce annotations' Input Dims (t16 D4): rank 0's 2nd and 3rd (26,955,536 and
    # 26,258,430 floats) differ from rank 1's (26,258,430 and 19,618,307), so those are 4
    # one-rank instances, not 2 two-rank ones: 6 all_reduce instances, min 1 rank (before, sizes
    # unknown: 4 of 2 ranks each, 10 instances in all).
    ingest(store, [corpus("hta/trace_filter")], run="tf")
    ops = store.sql(
        "SELECT rank, op, count(*) AS n, count(instance_id) AS matched FROM collectives "  # instance: maybe 1 rank
        "GROUP BY ALL ORDER BY ALL"
    ).rows()
    assert ops == [
        (r, op, n, n) for r in (0, 1) for op, n in (("all_gather", 2), ("all_reduce", 4), ("all_to_all", 4))
    ]
    inst = store.sql(
        "SELECT op, count(*), min(n_ranks), any_value(match_method) FROM collective_instances "
        "GROUP BY ALL ORDER BY ALL"
    ).rows()
    assert inst == [
        ("all_gather", 2, 2, "ordinal"),
        ("all_reduce", 6, 1, "ordinal"),
        ("all_to_all", 4, 2, "ordinal"),
    ]
    # stragglers and whatif run on the only real multi-rank GPU sample and name real ops.
    res = analyze(store, "stragglers", "tf")
    assert sorted(set(res.instances["op"].to_list())) == ["all_gather", "all_reduce", "all_to_all"]
    wi = analyze(store, "whatif", "tf")
    assert wi.summary["steps"].item() == 2 and "send_recv" not in wi.blame["group"].to_list()
    assert "all_to_all" in wi.blame.filter(wi.blame["by"] == "op")["group"].to_list()


def test_cli_stragglers_and_whatif_on_trace_filter(tmp_path):
    # Issue 8.2 done-means, through the CLI: both run on the old-style GPU sample and print real
    # collective ops (no send_recv).
    from tests._cli_inproc import run

    db = str(tmp_path / "t.duckdb")
    assert run("ingest", str(corpus("hta/trace_filter")), "--run", "tf", "--db", db)[0] == 0
    code, out, err = run(
        "analyze", "stragglers", "--run", "tf", "--db", db, "--table", "instances", "-f", "csv"
    )
    assert code == 0, err
    assert (
        all(f",{op}," in out for op in ("all_to_all", "all_reduce", "all_gather")) and "send_recv" not in out
    )
    code, out, err = run("analyze", "whatif", "--run", "tf", "--db", db, "--table", "blame", "-f", "csv")
    assert code == 0, err
    assert "all_to_all" in out and "send_recv" not in out


def _launched(namers: list[tuple[str, str, dict]], kernel_args: dict | None = None) -> list[dict]:
    """One rank: a ncclKernel_SendRecv kernel without metadata (an old-style trace; else with
    ``kernel_args``), launched at 60 us inside the given CPU events (cat, name, args), nested from
    outermost [10, 110] inward."""
    ev = [
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "ProfilerStep#1",
            "pid": 1,
            "tid": 1,
            "ts": 0,
            "dur": 200,
        }
    ]
    for d, (cat, name, args) in enumerate(namers):
        ev.append(
            {
                "ph": "X",
                "cat": cat,
                "name": name,
                "pid": 1,
                "tid": 1,
                "ts": 10 + d,
                "dur": 100 - 2 * d,
                "args": args,
            }
        )
    ev.append(
        {
            "ph": "X",
            "cat": "cuda_runtime",
            "name": "cudaLaunchKernel",
            "pid": 1,
            "tid": 1,
            "ts": 60,
            "dur": 2,
            "args": {"correlation": 7},
        }
    )
    ev.append(
        {
            "ph": "X",
            "cat": "kernel",
            "name": "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t",
            "pid": 0,
            "tid": 9,
            "ts": 70,
            "dur": 20,
            "args": {"correlation": 7, "device": 0, "stream": 9, **(kernel_args or {})},
        }
    )
    return ev


@pytest.mark.parametrize(
    "namers, op, pg",
    [
        # the c10d op alone names it
        ([("cpu_op", "c10d::allreduce_", {})], "all_reduce", None),
        # ProcessGroupNCCL's annotation beats the c10d op around it
        (
            [("cpu_op", "c10d::alltoall_base_", {}), ("user_annotation", "nccl:all_to_all", {})],
            "all_to_all",
            None,
        ),
        # record_param_comms with metadata beats both, and brings its process group and Seq
        (
            [
                ("cpu_op", "c10d::allreduce_", {}),
                (
                    "cpu_op",
                    "record_param_comms",
                    {
                        "Collective name": "_allgather_base",
                        "Process Group Name": "3",
                        "Seq": 5,
                        "Process Group Ranks": "[1, 0]",
                    },
                ),
                ("user_annotation", "nccl:all_reduce", {}),
            ],
            "all_gather",
            "3",
        ),
        # record_param_comms without metadata (old traces) names nothing: the annotation does
        (
            [
                ("cpu_op", "record_param_comms", {"Input Dims": [[384]]}),
                ("user_annotation", "nccl:broadcast", {}),
            ],
            "broadcast",
            None,
        ),
    ],
)
def test_launching_op_names_old_style_collectives(store, tmp_path, namers, op, pg):
    write_rank(tmp_path / "run" / "r0.json", _launched(namers), 0, backend="nccl")
    ingest(store, [tmp_path / "run"])
    row = store.sql("SELECT op, pg, seq, pg_ranks, enter_ns - $1 FROM collectives", [BASE]).row(0)
    assert row == (op, pg, 5 if pg else None, "[0, 1]" if pg else None, 60_000)  # enter = the launch at 60 us


def test_kernel_metadata_wins_key_by_key_over_its_launching_op(store, tmp_path):
    # The kernel carries Seq 9 and a null process group; its record_param_comms (inside an
    # nccl: annotation, itself inside a second record_param_comms that names another op) brings
    # process group "3", Seq 5 and the dtype: the kernel's own Seq wins, the null and missing keys
    # come from the innermost record_param_comms, whose op (all_gather) beats the annotation's.
    namers = [
        ("cpu_op", "record_param_comms", {"Collective name": "broadcast", "Process Group Name": "8"}),
        ("user_annotation", "nccl:all_reduce", {}),
        (
            "cpu_op",
            "record_param_comms",
            {
                "Collective name": "_allgather_base",
                "Process Group Name": "3",
                "Seq": 5,
                "dtype": "Float",
                "In msg nelems": 256,
            },
        ),
    ]
    write_rank(
        tmp_path / "run" / "r0.json",
        _launched(namers, {"Seq": 9, "Process Group Name": None}),
        0,
        backend="nccl",
    )
    ingest(store, [tmp_path / "run"])
    row = store.sql("SELECT op, pg, seq, dtype, bytes_in, enter_ns - $1 FROM collectives", [BASE]).row(0)
    assert row == ("all_gather", "3", 9, "Float", 256 * 4, 60_000)


@pytest.mark.parametrize(
    ("dtype", "size"),
    [
        ("c10::Float8_e4m3fnuz", 1),  # ROCm's FP8 (t6: its collectives' bytes were unknown)
        ("Float8_e5m2fnuz", 1),
        ("Float8_e8m0fnu", 1),  # MX scales
        ("UInt16", 2),
        ("ComplexDouble", 16),
    ],
)
def test_every_torch_dtype_has_its_element_size(store, tmp_path, dtype, size):
    # torch's ScalarType names as record_param_comms writes them; sizes from torch.finfo / iinfo bits
    _all_reduce_of(store, tmp_path, dtype)
    assert store.sql("SELECT nelems_in, bytes_in FROM collectives").row(0) == (256, 256 * size)


def _all_reduce_of(store, tmp_path, dtype):
    """Ingest one rank whose one all-reduce of 256 elements has the record_param_comms ``dtype``."""
    namers = [
        (
            "cpu_op",
            "record_param_comms",
            {
                "Collective name": "allreduce",
                "Process Group Name": "0",
                "Seq": 1,
                "dtype": dtype,
                "In msg nelems": 256,
            },
        )
    ]
    write_rank(tmp_path / "run" / "r0.json", _launched(namers), 0, backend="nccl")
    return ingest(store, [tmp_path / "run"])


@pytest.mark.parametrize("dtype", [7, {"t": "Float"}, ["Float"], True])
def test_a_dtype_that_is_not_a_name_is_ignored_with_a_warning(store, tmp_path, dtype):
    # Trace contents are untrusted: a record_param_comms dtype of another JSON type was a traceback
    # (str.rsplit on an int), then stored as Python's text of it ("{'t': 'Float'}"); it is read as
    # absent, so the byte counts stay unknown, and the warning names the record_param_comms (event #1).
    res = _all_reduce_of(store, tmp_path, dtype)
    row = store.sql("SELECT op, dtype, nelems_in, bytes_in FROM collectives").row(0)
    assert row == ("all_reduce", None, 256, None)
    assert (
        f"r0.json: 1 value(s) ignored, read as absent: 'dtype' not a string, e.g. {dtype!r} (events #1)"
        in res.warnings
    )


@pytest.mark.parametrize("name", [5, ["allreduce"], {"op": "allreduce"}, True])
def test_a_collective_name_that_is_not_a_string_names_nothing(store, tmp_path, name):
    # A record_param_comms (event #2) with Collective name 5 named the op "5"; now it names nothing,
    # with a warning naming it: the nccl:broadcast annotation around it (event #1) names the op, and the
    # record_param_comms no longer brings its process group. The same name on the kernel itself (event
    # #3 of a trace with the annotation alone) is ignored too: the launching op names it.
    namers = [
        ("user_annotation", "nccl:broadcast", {}),
        ("cpu_op", "record_param_comms", {"Collective name": name, "Process Group Name": "3", "Seq": 5}),
    ]
    write_rank(tmp_path / "run" / "r0.json", _launched(namers), 0, backend="nccl")
    res = ingest(store, [tmp_path / "run"])
    assert store.sql("SELECT op, pg, seq FROM collectives").row(0) == ("broadcast", None, None)
    assert (
        f"r0.json: 1 value(s) ignored, read as absent: 'Collective name' not a string, e.g. {name!r} "
        "(events #2)"
    ) in res.warnings
    write_rank(
        tmp_path / "k" / "r0.json", _launched(namers[:1], {"Collective name": name}), 0, backend="nccl"
    )
    with Store(tmp_path / "k.duckdb") as s:
        res = ingest(s, [tmp_path / "k"])
        assert s.sql("SELECT op FROM collectives").row(0) == ("broadcast",)
        assert (
            f"r0.json: 1 value(s) ignored, read as absent: 'Collective name' not a string, e.g. {name!r} "
            "(events #3)"
        ) in res.warnings


@pytest.mark.parametrize(
    ("key", "value", "column", "reason"),
    [
        (
            "Process Group Name",
            {"name": "0"},
            "pg",
            "'Process Group Name' not a string",
        ),  # was "{'name': '0'}"
        ("Process Group Name", 0, "pg", "'Process Group Name' not a string"),
        ("Comms Id", [1, 2], "comms_id", "'Comms Id' not a string or an integer"),  # was NULL, silently
    ],
)
def test_group_metadata_of_another_type_is_ignored_with_a_warning(
    store, tmp_path, key, value, column, reason
):
    # The kernel (event #2) carries the odd value; the rest of its metadata stays.
    kernel = {"Collective name": "allreduce", "Process Group Name": "7", "Seq": 2, "Comms Id": 99, key: value}
    write_rank(tmp_path / "run" / "r0.json", _launched([], kernel), 0, backend="nccl")
    res = ingest(store, [tmp_path / "run"])
    row = store.sql(f"SELECT op, seq, {column} FROM collectives").row(0)
    assert row == ("all_reduce", 2, None)
    assert (
        f"r0.json: 1 value(s) ignored, read as absent: {reason}, e.g. {value!r} (events #2)" in res.warnings
    )


def test_of_two_launching_ops_that_start_together_the_inner_one_names_the_collective(store, tmp_path):
    # Two record_param_comms start at 10 us, [10, 110] (broadcast, pg "outer") around [10, 90]
    # (allreduce, pg "inner"); the launch at 60 us is inside both: the shorter, inner one names it.
    ev = _launched(
        [
            (
                "cpu_op",
                "record_param_comms",
                {"Collective name": "broadcast", "Process Group Name": "outer", "Seq": 1},
            )
        ]
    )
    ev.append(
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": "record_param_comms",
            "pid": 1,
            "tid": 1,
            "ts": 10,
            "dur": 80,
            "args": {"Collective name": "allreduce", "Process Group Name": "inner", "Seq": 2},
        }
    )
    write_rank(tmp_path / "run" / "r0.json", ev, 0, backend="nccl")
    ingest(store, [tmp_path / "run"])
    assert store.sql("SELECT op, pg, seq FROM collectives").row(0) == ("all_reduce", "inner", 2)


@pytest.mark.parametrize("siblings", [0, 63, 64, 70, 200])
def test_short_siblings_that_ended_before_the_launch_do_not_hide_the_enclosing_op(store, tmp_path, siblings):
    # record_param_comms [10, 110] us (all_gather, pg "3", Seq 5) holds `siblings` nccl:all_reduce
    # user annotations of 0.1 us each, from 12 us on, 0.2 us apart (all ended by 52 us), then the
    # launch at 60 us. Only ops around the launch count towards the bound of 64 looked at: with 64 or
    # more ended siblings the record_param_comms was out of reach and the kernel's own name
    # (SendRecv) named it, with no process group.
    ev = _launched(
        [
            (
                "cpu_op",
                "record_param_comms",
                {"Collective name": "_allgather_base", "Process Group Name": "3", "Seq": 5},
            )
        ]
    )
    ev += [
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "nccl:all_reduce",
            "pid": 1,
            "tid": 1,
            "ts": 12 + 0.2 * i,
            "dur": 0.1,
        }
        for i in range(siblings)
    ]
    write_rank(tmp_path / "run" / "r0.json", ev, 0, backend="nccl")
    ingest(store, [tmp_path / "run"])
    row = store.sql("SELECT op, pg, seq, enter_ns - $1 FROM collectives", [BASE]).row(0)
    assert row == ("all_gather", "3", 5, 60_000)


def test_enclosing_ops_beyond_the_bound_are_not_looked_at(store, tmp_path):
    # The bound still holds for ops that do enclose the launch: a record_param_comms [10, 110] us,
    # then 64 nested nccl:all_reduce annotations around the launch at 60 us (each from 11 + 0.1 k
    # to 109 - 0.1 k us). The 64 innermost are looked at: the annotation names the op (all_reduce),
    # and the record_param_comms, 65th from the inside, brings no process group.
    ev = _launched(
        [
            (
                "cpu_op",
                "record_param_comms",
                {"Collective name": "_allgather_base", "Process Group Name": "3", "Seq": 5},
            )
        ]
    )
    ev += [
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "nccl:all_reduce",
            "pid": 1,
            "tid": 1,
            "ts": round(11 + 0.1 * k, 1),
            "dur": round(98 - 0.2 * k, 1),
        }
        for k in range(64)
    ]
    write_rank(tmp_path / "run" / "r0.json", ev, 0, backend="nccl")
    ingest(store, [tmp_path / "run"])
    assert store.sql("SELECT op, pg, seq FROM collectives").row(0) == ("all_reduce", None, None)


def _renumbered_rank(first_step: int, late_us: int, collectives: bool = True, steps: int = 2) -> list[dict]:
    """``steps`` steps, ProfilerStep#first_step, #first_step + 1, ..., over [0, 1000], [1000, 2000], ...
    us; in step s an all-reduce (Seq s + 1) launched at 1000 s + 10 us runs from 1000 s + 100 +
    late_us to 1000 s + 300 us."""
    ev = []
    for s in range(steps):
        ev.append(
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": f"ProfilerStep#{first_step + s}",
                "pid": 1,
                "tid": 1,
                "ts": 1000 * s,
                "dur": 1000,
            }
        )
        if collectives:
            ev.append(
                {
                    "ph": "X",
                    "cat": "cuda_runtime",
                    "name": "cudaLaunchKernel",
                    "pid": 1,
                    "tid": 1,
                    "ts": 1000 * s + 10,
                    "dur": 2,
                    "args": {"correlation": 50 + s},
                }
            )
            ev.append(
                {
                    "ph": "X",
                    "cat": "kernel",
                    "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
                    "pid": 0,
                    "tid": 7,
                    "ts": 1000 * s + 100 + late_us,
                    "dur": 200 - late_us,
                    "args": {
                        "correlation": 50 + s,
                        "device": 0,
                        "stream": 7,
                        **collective_args(seq=s + 1, nelems=1024),
                    },
                }
            )
    return ev


def test_steps_compared_by_each_ranks_step_order(store, tmp_path):
    # Rank 0 numbers its steps #100, #101; rank 1 (50 us late at both all-reduces) #500, #501, with
    # consistent Seq values; rank 2 is traced (#100, #101) but runs no collective.
    write_rank(tmp_path / "run" / "r0.json", _renumbered_rank(100, 0), 0, world=3, backend="nccl")
    write_rank(tmp_path / "run" / "r1.json", _renumbered_rank(500, 50), 1, world=3, backend="nccl")
    write_rank(
        tmp_path / "run" / "r2.json", _renumbered_rank(100, 0, collectives=False), 2, world=3, backend="nccl"
    )
    res = ingest(store, [tmp_path / "run"])
    # Compared by step order, Seq 1 is in the first step of both ranks and Seq 2 in the second: the
    # sequence numbers are per group (no fallback warning), 2 instances of ranks 0 and 1 labelled
    # with rank 0's step numbers, rank 1 last by 50 us (arrival = kernel start: 100 vs 150 us).
    assert not [w for w in res.warnings if "sequence numbers" in w]
    inst = store.sql(
        "SELECT seq, step, ranks_present, last_rank, arrival_skew_ns, match_method "
        "FROM collective_instances ORDER BY instance_id"
    ).rows()
    assert inst == [(1, 100, [0, 1], 1, 50_000, "pg_seq"), (2, 101, [0, 1], 1, 50_000, "pg_seq")]
    res = analyze(store, "stragglers", "run")
    per = {r["rank"]: (r["instances"], r["last_count"]) for r in res.frame.iter_rows(named=True)}
    assert per == {0: (2, 0), 1: (2, 2)}
    # rank 2 holds no matched instance: a note says it is left out, not a silent chance of 1/2
    assert [n for n in res.notes if n.startswith("rank 2 traced but no nccl_kernel collective")]


def test_a_rank_whose_trace_starts_a_step_later_is_aligned_by_step_number(store, tmp_path):
    # Rank 1 records ProfilerStep#4, #5, #6 over [0, 1000], [1000, 2000], [2000, 3000] us; rank 0's
    # trace starts a step later (#5, #6 only). In step s each runs an all-reduce (Seq s - 3) over
    # [1000 (s - 4) + 100, 1000 (s - 4) + 300] us, rank 0 arriving 50 us late.
    r0 = [e for e in _renumbered_rank(4, 50, steps=3) if e["ts"] >= 1000]
    write_rank(tmp_path / "run" / "r0.json", r0, 0, world=2, backend="nccl")
    write_rank(tmp_path / "run" / "r1.json", _renumbered_rank(4, 0, steps=3), 1, world=2, backend="nccl")
    ingest(store, [tmp_path / "run"])
    # both ranks' #5 and #6 are the same steps (by number, not the k-th of each rank: rank 0's
    # #5 was rank 1's #4 before, and rank 1's #5 and #6 both the run's step 6)
    got = store.sql(matching.RUN_STEPS_SQL.replace("$run", "1") + " ORDER BY rank, step").rows()
    assert got == [(0, 5, 5), (0, 6, 6), (1, 4, 4), (1, 5, 5), (1, 6, 6)]
    inst = store.sql(
        "SELECT seq, step, ranks_present, last_rank, arrival_skew_ns FROM collective_instances "
        "WHERE len(ranks_present) = 2 ORDER BY instance_id"
    ).rows()
    assert inst == [(2, 5, [0, 1], 0, 50_000), (3, 6, [0, 1], 0, 50_000)]
    # the step account has one row per (rank, step) and no traceback: step k ends at the end of
    # its all-reduce (1000 (k - 4) + 300 us) and starts where k - 1 ended (the first: its
    # ProfilerStep's start)
    cp = analyze(store, "critical_path", "run")
    rows = cp.frame.select("rank", "step", "step_ns").sort("rank", "step").rows()
    assert rows == [(0, 5, 300_000), (0, 6, 1_000_000), (1, 4, 300_000), (1, 5, 1_000_000), (1, 6, 1_000_000)]
    assert (
        "rank 0 has no step 4 (its trace does not record it): that step is taken over the ranks that have it"
        in (cp.notes)
    )
    # the summary says it first, with the ranks ("Ranks: ..."), as it says an untraced rank
    from traceprof.engine.findings import summarize

    assert summarize(store, "run").coverage == (
        "rank 0 has no step 4 (its trace does not record it): that step is taken over the ranks that have it"
    )


def test_missing_step_notes_by_hand():
    # rank 0 has 4-8; rank 1 lacks 4 (starts later) and 6 (lost between 5 and 7); rank 2 lacks 7 and 8
    # (ends earlier): only rank 1's step 6 lies inside its steps, so its time is in its step 7
    have = {0: [4, 5, 6, 7, 8], 1: [5, 7, 8], 2: [4, 5, 6]}
    steps = pl.DataFrame(
        {"rank": [r for r, s in have.items() for _ in s], "step": [x for s in have.values() for x in s]}
    )
    assert matching.missing_step_notes(steps) == [
        "rank 1 has no step 4, 6 (its trace does not record them): those steps are taken over the ranks "
        "that have it; its time of step 6 is counted in its step 7",
        "rank 2 has no step 7, 8 (its trace does not record them): those steps are taken over the ranks "
        "that have it",
    ]
    assert matching.missing_step_notes(steps.filter(pl.col("rank") == 0)) == []
    # the rank-step whose window holds the lost step: rank 1's step 7 (a lost first or last step is in none)
    assert matching.absorbing_steps(steps).rows() == [(1, 7, [6])]
    assert matching.absorbing_steps(steps.filter(pl.col("rank") != 1)).is_empty()


def _gloo_steps(
    first: int, steps: int, late_us: int, at: int = 0, numbered: bool = True, grow: bool = False
) -> list[dict]:
    """Gloo steps #first.. (ProfilerStep#first + s over [1000 (at + s), 1000 (at + s + 1)] us; none
    when not ``numbered``); in each an all-reduce of 100 then one of 200 floats (with ``grow``, times
    at + s + 1: each step of the job its own sizes), enqueued at +100 and +300 us (plus ``late_us``),
    worked on from +400 and +600 us for 100 us."""
    ev = []
    for s in range(steps):
        t0 = 1000 * (at + s)
        k = at + s + 1 if grow else 1
        ev += gloo_rank(
            [
                (t0 + 100 + late_us, t0 + 400, t0 + 500, 100 * k),
                (t0 + 300 + late_us, t0 + 600, t0 + 700, 200 * k),
            ],
            step=first + s,
            t0=t0,
        )
    return [e for e in ev if numbered or not e["name"].startswith("ProfilerStep")]


def test_a_rank_without_steps_is_matched_by_order_over_the_run(store, tmp_path):
    # Rank 1 runs the same two steps as rank 0 (#3, #4) 50 us later, but its trace has no ProfilerStep.
    # Gloo all-reduces have no sequence number: matched by order within the step, rank 1's (no step)
    # were 4 one-rank instances beside rank 0's 4. By order over the run (the k-th all-reduce of each
    # size on each rank) they are 4 instances of both ranks, rank 1 last by 50 us, with a note.
    write_rank(tmp_path / "run" / "r0.json", _gloo_steps(3, 2, 0), 0)
    write_rank(tmp_path / "run" / "r1.json", _gloo_steps(3, 2, 50, numbered=False), 1)
    res = ingest(store, [tmp_path / "run"])
    inst = store.sql(
        "SELECT step, bytes, ranks_present, last_rank, arrival_skew_ns, match_method "
        "FROM collective_instances ORDER BY instance_id"
    ).rows()
    assert inst == [
        (3, 400, [0, 1], 1, 50_000, "ordinal"),
        (3, 800, [0, 1], 1, 50_000, "ordinal"),
        (4, 400, [0, 1], 1, 50_000, "ordinal"),
        (4, 800, [0, 1], 1, 50_000, "ordinal"),
    ]
    assert [w for w in res.warnings if "rank 1 has no steps (no ProfilerStep in the trace)" in w]
    assert not [w for w in res.warnings if "miss some ranks" in w]
    # the summary's coverage says it too (it said nothing)
    from traceprof.engine.findings import summarize

    assert summarize(store, "run").coverage == (
        "rank 1 has no steps (no ProfilerStep in its trace): its collectives without sequence numbers were "
        "matched with the other ranks' by their order over the run"
    )
    assert matching.stepless_notes(store, 1) == [summarize(store, "run").coverage]


def test_a_rank_numbering_its_steps_one_higher_is_lined_up_by_its_collectives(store, tmp_path):
    # Ranks 0 and 1 run the same three steps at the same times, rank 1 50 us late at each
    # all-reduce, but rank 1 numbers them #5..#7 where rank 0 says #4..#6. Rank 2's trace starts a
    # step later (#5, #6 at the times of rank 0's #5, #6). By number (the ranges overlap), rank 1's
    # #5 was rank 0's #5: a step off, 4 of its 6 all-reduces matched with the wrong ones. Each step
    # of the job all-reduces its own sizes (step k: 100 k then 200 k floats), so by number rank 1's
    # collectives differ from rank 0's in 2 steps (#5, #6), a position off they agree in 3 and differ
    # in none: lined up by position, with a note. Rank 2 differs in none by number: kept (a late start).
    write_rank(tmp_path / "run" / "r0.json", _gloo_steps(4, 3, 0, grow=True), 0, world=3)
    write_rank(tmp_path / "run" / "r1.json", _gloo_steps(5, 3, 50, grow=True), 1, world=3)
    write_rank(tmp_path / "run" / "r2.json", _gloo_steps(5, 2, 0, at=1, grow=True), 2, world=3)
    res = ingest(store, [tmp_path / "run"])
    got = store.sql(matching.RUN_STEPS_SQL.replace("$run", "1") + " ORDER BY rank, step").rows()
    assert got == [(0, 4, 4), (0, 5, 5), (0, 6, 6), (1, 5, 4), (1, 6, 5), (1, 7, 6), (2, 5, 5), (2, 6, 6)]
    inst = store.sql(
        "SELECT step, bytes, ranks_present, last_rank, arrival_skew_ns FROM collective_instances "
        "ORDER BY instance_id"
    ).rows()
    assert inst == [(4, b, [0, 1], 1, 50_000) for b in (400, 800)] + [
        (s, b * (s - 3), [0, 1, 2], 1, 50_000) for s in (5, 6) for b in (400, 800)
    ]
    said = [
        "rank 1 numbers its steps #5..#7 where rank 0 numbers the same steps #4..#6 (offset -1): its "
        "collectives differ from rank 0's in 2 step(s) lined up by step number and agree in 3 lined up so, "
        "so they are taken as rank 0's steps"
    ]
    assert matching.step_shift_notes(store, 1) == said
    assert [w for w in res.warnings if "numbers its steps" in w] == [f"run 'run': {said[0]}"]
    # the summary says it first, with the step rank 2 lacks
    from traceprof.engine.findings import summarize

    assert summarize(store, "run").coverage == (
        f"{said[0]}; rank 2 has no step 4 (its trace does not record it): that step is taken over the "
        "ranks that have it"
    )
    # only rank 2's missing step 4 is left incomplete (before: 6 of 10 instances)
    assert [w for w in res.warnings if "miss some ranks" in w] == [
        "run 'run': 2 of 6 matched collectives miss some ranks (see collective_instances.ranks_missing)"
    ]


def _late_window(store: Store, tmp_path, hosts: tuple[str, str]) -> None:
    """Rank 0 records steps #4..#6 over [0, 3] ms, rank 1 (its all-reduces enqueued 50 us later)
    the same job's #5..#7 over [1, 4] ms: its profiling window really starts a step later."""
    write_rank(tmp_path / "run" / "r0.json", _gloo_steps(4, 3, 0), 0, host=hosts[0])
    write_rank(tmp_path / "run" / "r1.json", _gloo_steps(5, 3, 50, at=1), 1, host=hosts[1])
    ingest(store, [tmp_path / "run"])


def test_a_late_window_on_the_same_host_stays_by_number(store, tmp_path):
    # Every step runs the same all-reduces, so rank 1's collectives agree with rank 0's in 3 steps
    # one position off (its #5..#7 as #4..#6) and in 2 by number (#5, #6): by the collectives alone
    # it looked like a rank numbering its steps one higher and was lined up a step off (its clock
    # then moved by the 1 ms between the all-reduces so paired). Both ranks on host "vm" share one
    # clock: by number its steps start 0 us from rank 0's (median over #5, #6), a position off
    # 1000 us, a whole step (1 ms): the times decide, by number.
    _late_window(store, tmp_path, ("vm", "vm"))
    got = store.sql(matching.RUN_STEPS_SQL.replace("$run", "1") + " ORDER BY rank, step").rows()
    assert got == [(0, 4, 4), (0, 5, 5), (0, 6, 6), (1, 5, 5), (1, 6, 6), (1, 7, 7)]
    assert matching.step_shift_notes(store, 1) == []
    inst = store.sql(
        "SELECT step, bytes, ranks_present, arrival_skew_ns FROM collective_instances ORDER BY instance_id"
    ).rows()
    assert inst == (
        [(4, b, [0], 0) for b in (400, 800)]
        + [(s, b, [0, 1], 50_000) for s in (5, 6) for b in (400, 800)]
        + [(7, b, [1], 0) for b in (400, 800)]
    )
    assert store.sql("SELECT rank, clock_offset_ns FROM traces ORDER BY rank").rows() == [(0, 0), (1, 0)]


def test_across_hosts_identical_steps_keep_their_numbers(store, tmp_path):
    # The same traces on two hosts: start times of two clocks say nothing, and every step runs the
    # same all-reduces, so no step's collectives differ by number: no evidence, rank 1 keeps its
    # numbers and its clock (before: lined up a position off because it "agreed" in 3 steps so and
    # in 2 by number, and its clock moved by a whole step).
    _late_window(store, tmp_path, ("a", "b"))
    got = store.sql(matching.RUN_STEPS_SQL.replace("$run", "1") + " WHERE rank = 1 ORDER BY step").rows()
    assert got == [(1, 5, 5), (1, 6, 6), (1, 7, 7)]
    assert matching.step_shift_notes(store, 1) == []
    assert store.sql("SELECT rank, clock_offset_ns FROM traces ORDER BY rank").rows() == [(0, 0), (1, 0)]


def test_a_renumbered_rank_on_the_same_host_is_lined_up_by_its_step_times(store, tmp_path):
    # Rank 1 runs rank 0's steps at the same times but numbers them #5..#7 (rank 0: #4..#6), both on
    # host "vm": a position off its steps start 0 us from rank 0's, by number 1 ms (#5, #6 against
    # rank 0's #5, #6 a step later; #7 has no partner), steps of 1 ms: lined up by position.
    write_rank(tmp_path / "run" / "r0.json", _gloo_steps(4, 3, 0), 0, host="vm")
    write_rank(tmp_path / "run" / "r1.json", _gloo_steps(5, 3, 50), 1, host="vm")
    res = ingest(store, [tmp_path / "run"])
    got = store.sql(matching.RUN_STEPS_SQL.replace("$run", "1") + " WHERE rank = 1 ORDER BY step").rows()
    assert got == [(1, 5, 4), (1, 6, 5), (1, 7, 6)]
    said = (
        "rank 1 numbers its steps #5..#7 where rank 0 numbers the same steps #4..#6 (offset -1): on rank 0's "
        "host, its steps start a median 0 ms from rank 0's lined up so and 1 ms by step number (steps of 1 ms), "
        "so they are taken as rank 0's steps"
    )
    assert matching.step_shift_notes(store, 1) == [said]
    assert [w for w in res.warnings if "numbers its steps" in w] == [f"run 'run': {said}"]
    assert not [w for w in res.warnings if "miss some ranks" in w]


def _stepless_late(store: Store, tmp_path, hosts: tuple[str, str]) -> list[str]:
    """Rank 0 records steps #4..#6 over [0, 3] ms; rank 1 (no ProfilerStep) the job's next window,
    [1, 4] ms, its all-reduces enqueued 50 us after rank 0's. Returns the ingest's warnings."""
    write_rank(tmp_path / "run" / "r0.json", _gloo_steps(4, 3, 0), 0, host=hosts[0])
    write_rank(tmp_path / "run" / "r1.json", _gloo_steps(5, 3, 50, at=1, numbered=False), 1, host=hosts[1])
    return ingest(store, [tmp_path / "run"]).warnings


def test_a_rank_without_steps_on_the_same_host_is_lined_up_by_its_times(store, tmp_path):
    # Rank 0 records steps #4..#6 over [0, 3] ms; rank 1 (no ProfilerStep, same host "vm": one clock)
    # records the job's next window, [1, 4] ms, its all-reduces 50 us after rank 0's. By run order its
    # first all-reduce of each size was rank 0's first, 1050 us earlier: every pair a step off and the
    # clocks moved rank 1 by about a step. Lined up by time, its k-th of each size is rank 0's (k+1)-th:
    # 50 us apart (median), 1050 us by run order, rank 0's all-reduces of a size 1000 us apart.
    warnings = _stepless_late(store, tmp_path, ("vm", "vm"))
    inst = store.sql("SELECT step, bytes, ranks_present, arrival_skew_ns FROM collective_instances").rows()
    both = [
        (s, b, [0, 1], 50_000) for s in (5, 6) for b in (400, 800)
    ]  # rank 1's step NULL: its own last two
    assert sorted(inst, key=str) == sorted(
        [(4, 400, [0], 0), (4, 800, [0], 0), *both, (None, 400, [1], 0), (None, 800, [1], 0)], key=str
    )
    assert store.sql("SELECT rank, clock_offset_ns FROM traces ORDER BY rank").rows() == [(0, 0), (1, 0)]
    assert [w for w in warnings if "lined up" in w] == [
        "run 'run': source gloo, process group '': rank 1 (no steps) shares rank 0's host (one clock), so its "
        "collectives were lined up with rank 0's by their times, its k-th of a kind rank 0's (k +1)-th: they "
        "arrive a median 0.05 ms apart so and 1.05 ms by run order (collectives of a kind 1 ms apart)"
    ]


def test_a_rank_without_steps_on_another_host_keeps_the_run_order(store, tmp_path):
    # The same traces on hosts "a" and "b": two clocks, so times say nothing; run order, as before.
    warnings = _stepless_late(store, tmp_path, ("a", "b"))
    inst = store.sql(
        "SELECT step, bytes, ranks_present FROM collective_instances ORDER BY instance_id"
    ).rows()
    assert inst == [(s, b, [0, 1]) for s in (4, 5, 6) for b in (400, 800)]
    assert not [w for w in warnings if "lined up" in w]
    assert [w for w in warnings if "rank 1 has no steps (no ProfilerStep in the trace)" in w]


def test_collectives_of_a_lost_step_marker_are_matched_in_the_step_they_fall_in(store, tmp_path):
    # Rank 1 runs rank 0's steps #4..#6 (its all-reduces 50 us later), both on host "vm", but its trace
    # lost the ProfilerStep#5 marker and kept that step's events: its two all-reduces of [1, 2] ms have no
    # step. Within the step they were two one-rank instances beside rank 0's two (8 instances, 4 of them
    # missing a rank). Enqueued at 1150 and 1350 us, inside rank 0's step 5 ([1000, 2000] us), a step
    # rank 1 lacks: matched within step 5, with a note.
    write_rank(tmp_path / "run" / "r0.json", _gloo_steps(4, 3, 0), 0, host="vm")
    ev = [e for e in _gloo_steps(4, 3, 50) if e["name"] != "ProfilerStep#5"]
    write_rank(tmp_path / "run" / "r1.json", ev, 1, host="vm")
    res = ingest(store, [tmp_path / "run"])
    inst = store.sql(
        "SELECT step, bytes, ranks_present, last_rank, arrival_skew_ns FROM collective_instances ORDER BY instance_id"
    ).rows()
    assert inst == [(s, b, [0, 1], 1, 50_000) for s in (4, 5, 6) for b in (400, 800)]
    assert [w for w in res.warnings if "outside its steps" in w] == [
        "run 'run': rank 1 has 2 collective(s) outside its steps, at the time of step 5 on another rank of its "
        "host (one clock), which it lacks (a lost ProfilerStep): matched within that step"
    ]
    assert not [w for w in res.warnings if "miss some ranks" in w]


def test_one_arrival_clock_per_instance_on_a_cpu_source(store):
    """The arrival rule on a source whose preferred clock is the CPU enqueue (Flight Recorder: enter
    = time_created_ns, start = time_started_ns), ranks 0 and 1 of group g:
    seq 1: rank 0 enter 1000 start 1500, rank 1 enter NULL start 1600: not every rank has an
      enqueue, so both starts: skew 1600 - 1500 = 100 ns (before: 1600 - 1000 = 600, an enqueue
      against a start);
    seq 2: rank 0 enter 5000 start NULL, rank 1 enter NULL start 5600: no clock common to both:
      arrivals and skew unknown (NULL; before: 5600 - 5000 = 600);
    seq 3: both enter (9000, 9200) and start: skew 200, as before. The note counts seq 1 and 2."""
    con = store.con
    con.execute("INSERT INTO runs VALUES (1, 'r', NULL, TIMESTAMP '2026-01-01', [], false)")
    rows = [
        (0, 1, 1000, 1500),
        (1, 1, None, 1600),
        (0, 2, 5000, None),
        (1, 2, None, 5600),
        (0, 3, 9000, 9100),
        (1, 3, 9200, 9300),
    ]
    for rank, seq, enter, start in rows:
        con.execute(
            "INSERT INTO collectives (run_id, rank, trace_id, source, pg, pg_ranks, seq, p2p, op, bytes_in, enter_ns, "
            "start_ns, end_ns) VALUES (1, ?, ?, 'fr', 'g', '[0, 1]', ?, false, 'all_reduce', 8, ?, ?, 20000)",
            [rank, rank + 1, seq, enter, start],
        )
    matching.match_run(store, 1)
    assert store.sql("SELECT seq, arrival_skew_ns FROM collective_instances ORDER BY seq").rows() == [
        (1, 100),
        (2, None),
        (3, 200),
    ]
    assert store.sql("SELECT seq, rank, arrival_ns FROM collective_perf ORDER BY seq, rank").rows() == [
        (1, 0, 1500),
        (1, 1, 1600),
        (2, 0, None),
        (2, 1, None),
        (3, 0, 9000),
        (3, 1, 9200),
    ]
    assert matching.arrival_clock_note(store, 1) == (
        "arrival clock: fr: 1 of 3 instances compare every rank's start of the work time (a rank's record "
        "lacks the CPU enqueue; one clock per instance, else the gap between the two would count as skew); "
        "fr: 1 of 3 instances have no arrival, skew and waits unknown (a rank's record holds only the CPU "
        "enqueue, another's only the start of the work)"
    )


def test_a_point_to_point_pair_reads_one_arrival_clock(store):
    """``arrivals.p2p_items`` (gloo send / recv without sequence numbers, paired by peer): rank 0's send
    enter 1000 start 1300, rank 1's recv enter NULL start 1500. gloo prefers the enqueue, which the recv
    lacks: both starts, arrivals 1300 and 1500 (the recv waits 200 ns, not 1500 - 1000 = 500)."""
    from traceprof.engine.arrivals import p2p_items

    con = store.con
    con.execute("INSERT INTO runs VALUES (1, 'r', NULL, TIMESTAMP '2026-01-01', [], false)")
    for rank, op, peer, enter, start in ((0, "send", 1, 1000, 1300), (1, "recv", 0, None, 1500)):
        con.execute(
            "INSERT INTO collectives (run_id, rank, trace_id, source, p2p, op, peer, bytes_in, enter_ns, start_ns, "
            "end_ns) VALUES (1, ?, ?, 'gloo', true, ?, ?, 8, ?, ?, 2000)",
            [rank, rank + 1, op, peer, enter, start],
        )
    got = p2p_items(store, 1).sort("rank")
    assert got.select("rank", "op", "arrival_ns").rows() == [(0, "send", 1300), (1, "recv", 1500)]


@pytest.mark.parametrize("listed", [False, True])
def test_groups_sharing_a_name_without_member_lists_are_not_matched(store, tmp_path, listed):
    """fr_two_groups_same_pg_name's kind in Kineto traces that do not list the members (torch
    before "Process Group Ranks"): pg "5" is [0, 1] on ranks 0, 1 and [2, 3] on ranks 2, 3
    ("Group size" 2 on every row), all-reduces Seq 1, 2 per group. Group A: rank 0 enters at 100 us,
    rank 1 at 130, both end at 400 (+5000 us for Seq 2); group B runs 2000 us later, rank 3 70 us
    late. Hosts 'a' (ranks 0, 1) and 'b' (2, 3). Before: 2 instances of 4 ranks (n_ranks 4 for a
    group of 2), skew 2070 us; ranks 2, 3 shifted by -2,000,000 ns to line group B's ends up with
    group A's. Now 4 ranks holding a sequence number of a 2-rank group say that the name is shared:
    the rows are left unmatched, with a note, and no clock is shifted. With the member lists
    (``listed``), the 4 instances of 2 ranks (skew 30 us at [0, 1], last 1; 70 us at [2, 3], last 3)."""
    for r in range(4):
        a_side = r < 2
        late = (30 if r == 1 else 0) if a_side else (70 if r == 3 else 0)
        evs = []
        for i in (1, 2):
            t = (i - 1) * 5000 + (0 if a_side else 2000)
            args = collective_args(
                seq=i, pg="5", ranks=([0, 1] if a_side else [2, 3]) if listed else None, nelems=1024
            )
            args["Group size"] = 2
            evs += [
                step(i, (i - 1) * 5000, 5000),
                launch(t + 90 + late, 10 + i),
                kernel(
                    "ncclDevKernel_AllReduce_Sum_f32_RING_LL", 20, t + 100 + late, 300 - late, 10 + i, **args
                ),
            ]
        write_rank(
            tmp_path / "run" / f"r{r}.json", evs, r, world=4, backend="nccl", host="a" if a_side else "b"
        )
    res = ingest(store, [tmp_path / "run"])
    inst = store.sql(
        "SELECT seq, ranks_present, arrival_skew_ns, last_rank FROM collective_instances ORDER BY first_arrival_ns"
    ).rows()
    offsets = store.sql("SELECT rank, clock_offset_ns FROM traces ORDER BY rank").rows()
    if listed:
        assert inst == [
            (1, [0, 1], 30_000, 1),
            (1, [2, 3], 70_000, 3),
            (2, [0, 1], 30_000, 1),
            (2, [2, 3], 70_000, 3),
        ]
    else:
        assert inst == []
        assert store.sql("SELECT count(*) FROM collectives WHERE instance_id IS NULL").item() == 8
        assert any(
            "process group '5' (collectives): 4 ranks hold one sequence number of a group of 2" in w
            and "left unmatched" in w
            for w in res.warnings
        ), res.warnings
    assert offsets == [(r, 0) for r in range(4)]


def test_a_collective_launched_just_before_its_step_still_matches_by_its_sequence_number(store, tmp_path):
    """Two hosts, all_reduce Seq 1 and 2 in groups "1" = [0, 1] (node-0) and "2" = [2, 3] (node-1,
    3 ms ahead); steps 1 and 2 at 0 and 1000 us (+3000 on node-1), each launch 8 us before its kernel.
    Rank 0 launches Seq 1 at -8 us (before ProfilerStep#1: no step) and Seq 2 at 992 (step 1); rank 1
    launches them at 12 (step 1) and 1092 (step 2). Seq 2 lies in steps 1 and 2: one collective
    astride the step boundary (the last of rank 0's step 1, the first of rank 1's step 2), so the
    group's sequence numbers stay per group. By hand: (pg 1, Seq 1) = {r0 at 0, r1 at 20 us},
    (pg 1, Seq 2) = {r0 at 1000, r1 at 1100}, all pg_seq, no note; rank 1's clock offset 0 (one
    host). Before: 1 of 2 keys in different steps > 10 %, matched by order within the step (r0 Seq 2
    with r1 Seq 1) and rank 1 shifted +1,200,000 ns."""
    spans = {0: [(0, 200), (1000, 1400)], 1: [(20, 200), (1100, 1400)], 2: [(500, 700), (1600, 1700)]}
    spans[3] = [(530, 700), (1600, 1700)]
    two_host_tp_run(tmp_path / "tp", spans)
    summary = ingest(store, [tmp_path / "tp"], run="tp")
    assert not [w for w in summary.warnings if "cannot be per group" in w]
    assert store.sql("SELECT rank, clock_offset_ns FROM traces ORDER BY rank").rows() == [
        (r, 0) for r in range(4)
    ]
    got = store.sql(
        "SELECT pg, seq, list(rank ORDER BY rank), list(start_ns - $1 ORDER BY rank), any_value(match_method) "
        "FROM collectives GROUP BY instance_id, pg, seq ORDER BY pg, seq",
        [BASE],
    ).rows()
    assert got == [
        ("1", 1, [0, 1], [0, 20_000], "pg_seq"),
        ("1", 2, [0, 1], [1_000_000, 1_100_000], "pg_seq"),
        ("2", 1, [2, 3], [3_500_000, 3_530_000], "pg_seq"),
        ("2", 2, [2, 3], [4_600_000, 4_600_000], "pg_seq"),
    ]
