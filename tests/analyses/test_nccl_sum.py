"""Collective efficiency (issue 31, item 2): the ``collective_perf`` view's time split and bandwidth
(nccl-tests' bus factors and byte conventions, worked by hand on micro-traces), nccl_sum's split and
``bandwidth`` table against a ceiling, on the samples and the corpus, checked against plain SQL."""

from __future__ import annotations

import math
import re

import pytest

from tests.builders import write_rank
from tests.conftest import REPO, SAMPLES, analyze, corpus
from traceprof.collectors.nccl_profiler.parse import parse as plugin_parse
from traceprof.core import links
from traceprof.core.errors import UsageError
from traceprof.core.schema import COLLECTIVE_COPIES_SQL
from traceprof.ingest.ingest import ingest

#: Every micro collective below moves its data in 65.536 us after the last rank arrives, so that a
#: size of 4 MiB gives algbw 4,194,304 B / 65,536 ns = 64 GB/s exactly.
XFER_NS = 65_536
K = 1_048_576  # elements per rank (float32: 4 MiB)
MIB4 = 4 * K


def _kernel(
    op_name: str,
    kernel: str,
    rank: int,
    start_us: float,
    end_us: float,
    seq: int,
    corr: int,
    ranks: list[int],
    n_in: int | None,
    n_out: int | None,
) -> list[dict]:
    """One NCCL kernel (stream 7) with Kineto's collective args and its launch 5 us before."""
    args = {
        "correlation": corr,
        "device": 0,
        "stream": 7,
        "Collective name": op_name,
        "Process Group Name": "0",
        "Process Group Ranks": ranks,
        "Seq": seq,
        "Group size": len(ranks),
        "dtype": "Float",
    }
    if n_in is not None:
        args["In msg nelems"] = n_in
    if n_out is not None:
        args["Out msg nelems"] = n_out
    return [
        {
            "ph": "X",
            "cat": "cuda_runtime",
            "name": "cudaLaunchKernel",
            "pid": 1,
            "tid": 1,
            "ts": start_us - 5,
            "dur": 2,
            "args": {"correlation": corr},
        },
        {
            "ph": "X",
            "cat": "kernel",
            "name": kernel,
            "pid": 0,
            "tid": 7,
            "ts": start_us,
            "dur": round(end_us - start_us, 3),
            "args": args,
        },
    ]


def _run(tmp_path, store, op_name: str, kernel: str, n: int, n_in, n_out, per_rank_op=None) -> None:
    """An n-rank job with one collective: rank r's kernel starts at 100 + 10 r us (the last rank
    arrives at 100 + 10 (n - 1)) and every rank's ends 65.536 us after that."""
    last = 100 + 10 * (n - 1)
    for r in range(n):
        name = per_rank_op[r] if per_rank_op else op_name
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
        ev += _kernel(
            name,
            kernel,
            r,
            100 + 10 * r,
            last + XFER_NS / 1000,
            1,
            50,
            list(range(n)),
            n_in(r) if callable(n_in) else n_in,
            n_out(r) if callable(n_out) else n_out,
        )
        write_rank(tmp_path / "run" / f"r{r}.json", ev, r, world=n, backend="nccl")
    ingest(store, [tmp_path / "run"])


def _perf(store) -> list[dict]:
    return store.sql(
        "SELECT rank, op, size_bytes, group_size, bus_factor, algbw_gbps, busbw_gbps, wait_ns, launch_ns, "
        "transfer_ns, span_ns, all_ranks_traced FROM collective_perf ORDER BY rank"
    ).to_dicts()


# (collective name as torch records it, kernel, ranks, In msg nelems, Out msg nelems, S bytes, factor)
# worked by hand with n = 4 unless said, transfer 65,536 ns:
#   all_reduce: S = the buffer, 4 MiB: algbw 64 GB/s; busbw x 2(4-1)/4 = 1.5 -> 96
#   all_gather: S = the output of all ranks, 4 x 4 MiB = 16 MiB: algbw 256; busbw x 3/4 -> 192
#     (from Out msg nelems 4K; or, without it, n x In msg nelems: the same 16 MiB)
#   reduce_scatter: S = the input of all ranks (In msg nelems 4K): 16 MiB: 256; x 3/4 -> 192
#   all_to_all: S = the whole send buffer of a rank, 4 MiB: 64; x 3/4 -> 48
#   broadcast: S = the message, 4 MiB: 64; x 1 -> 64
#   send/recv (2 ranks): S = the message, 4 MiB: 64; x 1 -> 64
OPS = [
    ("allreduce", "ncclDevKernel_AllReduce_Sum_f32_RING_LL", 4, K, K, MIB4, 1.5, 96.0),
    ("_allgather_base", "ncclDevKernel_AllGather_RING_LL", 4, K, 4 * K, 4 * MIB4, 0.75, 192.0),
    ("_allgather_base", "ncclDevKernel_AllGather_RING_LL", 4, K, None, 4 * MIB4, 0.75, 192.0),
    (
        "_reduce_scatter_base",
        "ncclDevKernel_ReduceScatter_Sum_f32_RING_LL",
        4,
        4 * K,
        K,
        4 * MIB4,
        0.75,
        192.0,
    ),
    (
        "_reduce_scatter_base",
        "ncclDevKernel_ReduceScatter_Sum_f32_RING_LL",
        4,
        None,
        K,
        4 * MIB4,
        0.75,
        192.0,
    ),
    ("all_to_all", "ncclDevKernel_SendRecv", 4, K, K, MIB4, 0.75, 48.0),
    ("broadcast", "ncclDevKernel_Broadcast_RING_LL", 4, K, K, MIB4, 1.0, 64.0),
    ("reduce", "ncclDevKernel_Reduce_Sum_f32_RING_LL", 4, K, K, MIB4, 1.0, 64.0),
]


@pytest.mark.parametrize(
    "name, kernel, n, n_in, n_out, size, factor, busbw",
    OPS,
    ids=[f"{o[0]}-{'in' if o[3] else ''}{'out' if o[4] else ''}" for o in OPS],
)
def test_bus_factor_and_bytes_per_op(store, tmp_path, name, kernel, n, n_in, n_out, size, factor, busbw):
    _run(tmp_path, store, name, kernel, n, n_in, n_out)
    rows = _perf(store)
    assert len(rows) == n
    for r in rows:
        assert (r["size_bytes"], r["group_size"], r["bus_factor"]) == (size, n, factor)
        assert r["algbw_gbps"] == pytest.approx(size / XFER_NS, rel=1e-12)
        assert r["busbw_gbps"] == pytest.approx(busbw, rel=1e-12)
        # GPU: arrival = kernel start 100 + 10 r us, last arrival 100 + 10 (n - 1): wait 10 (n - 1 - r) us,
        # no launch part, transfer 65,536 ns; together the kernel
        assert (r["wait_ns"], r["launch_ns"], r["transfer_ns"]) == (10_000 * (n - 1 - r["rank"]), 0, XFER_NS)
        assert r["span_ns"] == r["wait_ns"] + r["transfer_ns"] and r["all_ranks_traced"]


def test_send_recv_is_factor_one_with_the_message_size(store, tmp_path):
    # rank 0 sends 4 MiB (In msg nelems), rank 1 receives it (Out msg nelems): one p2p instance of
    # the pair (pg 0, p2p seq 1); S = 4 MiB on both ends, factor 1: 64 GB/s
    _run(
        tmp_path,
        store,
        "",
        "ncclDevKernel_SendRecv",
        2,
        lambda r: K if r == 0 else None,
        lambda r: K if r == 1 else None,
        per_rank_op=["send", "recv"],
    )
    rows = _perf(store)
    assert [(r["op"], r["size_bytes"], r["bus_factor"]) for r in rows] == [
        ("send", MIB4, 1.0),
        ("recv", MIB4, 1.0),
    ]
    assert [r["busbw_gbps"] for r in rows] == [pytest.approx(64.0, rel=1e-12)] * 2
    assert [r["wait_ns"] for r in rows] == [10_000, 0]


def test_gloo_split_wait_launch_transfer(store, tmp_path):
    from tests.builders import gloo_rank

    # Rank 0 enqueues at 100 us, its work runs 110..400; rank 1 enqueues at 150 (the last arrival),
    # its runloop starts the work only at 200 and ends at 401. Data can move from 200 on
    # (transfer_start). Rank 0: span 300 us = wait 50 (100..150) + launch 50 (150..200) +
    # transfer 200 (200..400). Rank 1: span 251 = wait 0 + launch 50 + transfer 201.
    # 100 floats = 400 B, all-reduce of 2: factor 2(2-1)/2 = 1: busbw 400 / 200,000 = 0.002 GB/s and
    # 400 / 201,000 on rank 1.
    write_rank(tmp_path / "run" / "r0.json", gloo_rank([(100, 110, 400, 100)]), 0)
    write_rank(tmp_path / "run" / "r1.json", gloo_rank([(150, 200, 401, 100)]), 1)
    ingest(store, [tmp_path / "run"])
    rows = _perf(store)
    assert [(r["span_ns"], r["wait_ns"], r["launch_ns"], r["transfer_ns"]) for r in rows] == [
        (300_000, 50_000, 50_000, 200_000),
        (251_000, 0, 50_000, 201_000),
    ]
    assert [r["busbw_gbps"] for r in rows] == [
        pytest.approx(400 / 200_000, rel=1e-12),
        pytest.approx(400 / 201_000, rel=1e-12),
    ]
    res = analyze(store, "nccl_sum")
    row = res.frame.row(0, named=True)
    assert (row["span_ns"], row["wait_ns"], row["launch_ns"], row["transfer_ns"], row["unsplit_ns"]) == (
        551_000,
        50_000,
        100_000,
        401_000,
        0,
    )
    assert row["split_pct"] == 100.0
    # the two ranks' calls overlap: 551 us summed, 301 us of wall clock (100..401); the headline says
    # it is a sum, and how the other analyses' waits differ (wait 50 of 551 = 9.1 %)
    note = next(n for n in res.notes if n.startswith("communication time"))
    assert note.startswith(
        "communication time (arrival to end, summed over all calls: calls that overlap in time each count, so "
        "it may exceed the ranks' windows) 0.551 ms: 100.0% split into wait for peers 9.1%, launch 18.1%, "
        "transfer 72.8%"
    )
    assert note.endswith(
        "; span and wait are per call, summed (stream-time: overlapping calls add up); stragglers' "
        "wait is wall clock (the union of a rank's waits), critical_path's the wall-clock time that "
        "is waiting and nothing else (compute, transfer and memory take precedence)"
    )


def test_zero_or_unknown_transfer_is_null_never_inf(store, tmp_path):
    # Two ranks, all-reduce of 4 MiB. Rank 1 arrives at 100 + 10 us = 110 and both kernels end at
    # 110: the transfer is 0 on both, so no bandwidth (NULL), never 4 MiB / 0 = inf.
    for r in (0, 1):
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
        ev += _kernel(
            "allreduce", "ncclDevKernel_AllReduce_Sum_f32_RING_LL", r, 100 + 10 * r, 110, 1, 50, [0, 1], K, K
        )
        write_rank(tmp_path / "run" / f"r{r}.json", ev, r, world=2, backend="nccl")
    ingest(store, [tmp_path / "run"])
    rows = _perf(store)
    assert [(r["transfer_ns"], r["algbw_gbps"], r["busbw_gbps"], r["size_bytes"]) for r in rows] == [
        (0, None, None, MIB4),
        (0, None, None, MIB4),
    ]
    res = analyze(store, "nccl_sum")
    assert res.bandwidth.is_empty()
    assert any("no call with a known size has a transfer time above 0" in n for n in res.notes)


def test_flight_recorder_without_times_has_no_bandwidth(store):
    # gloo Flight Recorder entries record only their enqueue (started / completed 0 = unknown)
    ingest(store, [corpus("flight_recorder/gloo_cpu_4rank")])
    got = store.sql(
        "SELECT count(*), count(span_ns), count(algbw_gbps), count(busbw_gbps), "
        "count(*) FILTER (isinf(algbw_gbps) OR isinf(busbw_gbps)) FROM collective_perf"
    ).row(0)
    assert got[0] > 0 and got[1:] == (0, 0, 0, 0)


def test_plugin_reduce_scatter_count_is_the_per_rank_output(tmp_path):
    # ncclReduceScatter(sendbuff, recvbuff, recvcount, ...): the plugin's Count is the per-rank output
    f = tmp_path / "nccl_profile_5_0.json"
    f.write_text(
        '[\n{"name": "ReduceScatter", "cat": "COLL", "ph": "b", "id": 0, "pid": 1, "tid": 1, "ts": 10.0, '
        '"args": {"SeqNum": 0, "CommHash": 5, "Rank": 0, "Count": 1024, "Datatype": "ncclFloat32"}},\n'
        '{"name": "ReduceScatter", "cat": "COLL", "ph": "e", "id": 0, "pid": 1, "tid": 1, "ts": 20.0},\n'
        '{"name": "AllGather", "cat": "COLL", "ph": "b", "id": 1, "pid": 1, "tid": 1, "ts": 30.0, '
        '"args": {"SeqNum": 1, "CommHash": 5, "Rank": 0, "Count": 1024, "Datatype": "ncclFloat32"}},\n'
        '{"name": "AllGather", "cat": "COLL", "ph": "e", "id": 1, "pid": 1, "tid": 1, "ts": 40.0},\n{}]\n'
    )
    rows = plugin_parse(f).collectives.to_pylist()
    assert [(r["op"], r["nelems_in"], r["bytes_in"], r["nelems_out"], r["bytes_out"]) for r in rows] == [
        ("reduce_scatter", None, None, 1024, 4096),
        ("all_gather", 1024, 4096, None, None),
    ]


# ---- the samples: 4 gloo ranks, 4 all-reduces per step of 131072, 131072, 131072, 139264 floats

#: busbw by plain SQL from the stored rows alone: S = elements x 4 B (float32), n = 4 ranks
#: (factor 2(4-1)/4 = 1.5), transfer = end - max(last enqueue, last start of the gloo work).
_PLAIN = """
WITH i AS (SELECT instance_id, max(enter_ns) AS last_enq, max(start_ns) AS last_start, count(*) AS n
           FROM collectives WHERE run_id = $1 GROUP BY instance_id)
SELECT c.rank, c.instance_id, c.nelems_in, i.n,
       c.nelems_in * 4 / (c.end_ns - greatest(i.last_enq, i.last_start)) * 2.0 * (i.n - 1) / i.n AS busbw
FROM collectives c JOIN i USING (instance_id) WHERE c.run_id = $1
"""


@pytest.fixture(scope="module")
def samples(tmp_path_factory):
    from traceprof.storage.store import Store

    s = Store(tmp_path_factory.mktemp("s") / "s.duckdb")
    ingest(s, [SAMPLES / "normal"])
    yield s
    s.close()


def test_samples_busbw_agrees_with_plain_sql(samples):
    run_id = samples.resolve_run("normal")
    plain = samples.sql(_PLAIN, [run_id])
    got = samples.sql(
        "SELECT rank, instance_id, busbw_gbps, group_size, size_bytes FROM collective_perf WHERE run_id = ?",
        [run_id],
    ).join(plain, on=["rank", "instance_id"])
    assert got.height == 48  # 4 ranks x 3 steps x 4 all-reduces
    # the sizes the sample recorded: per step 3 x 131072 and 1 x 139264 floats on every rank
    assert sorted(got["nelems_in"].unique().to_list()) == [131072, 139264]
    assert got.group_by("nelems_in").len().sort("nelems_in")["len"].to_list() == [36, 12]
    assert (got["n"] == 4).all() and (got["group_size"] == 4).all()
    assert (got["size_bytes"] == got["nelems_in"] * 4).all()
    for a, b in zip(got["busbw_gbps"].to_list(), got["busbw"].to_list(), strict=True):
        assert a == pytest.approx(b, rel=1e-12) and a > 0 and math.isfinite(a)


def test_samples_split_covers_all_communication_time(samples):
    res = analyze(samples, "nccl_sum", "normal")
    row = res.frame.row(0, named=True)
    assert row["wait_ns"] + row["launch_ns"] + row["transfer_ns"] + row["unsplit_ns"] == row["span_ns"]
    # every rank of the 4 was traced: all of it is split (the issue asks >= 90 %)
    assert row["split_pct"] == 100.0 and row["unsplit_ns"] == 0
    span = samples.sql(
        "SELECT sum(end_ns - enter_ns) FROM collectives WHERE run_id = ?", [samples.resolve_run("normal")]
    ).item()
    assert row["span_ns"] == span
    per = res.ranks.select("span_ns", "wait_ns", "launch_ns", "transfer_ns", "unsplit_ns").sum().row(0)
    assert per == (row["span_ns"], row["wait_ns"], row["launch_ns"], row["transfer_ns"], row["unsplit_ns"])


def test_samples_bandwidth_table_and_ceiling(samples):
    res = analyze(samples, "nccl_sum", "normal")
    bw = res.bandwidth
    # both sizes (512 KiB and 544 KiB) fall in the [512 KiB, 1 MiB) bucket
    assert bw.select("op", "group_size", "size_bucket", "bucket_bytes", "calls").rows() == [
        ("all_reduce", 4, "512 KiB-1 MiB", 524_288, 48)
    ]
    med = samples.sql(
        "SELECT median(busbw_gbps) FROM collective_perf WHERE run_id = ?", [samples.resolve_run("normal")]
    ).item()
    assert bw["busbw_gbps"][0] == pytest.approx(med, rel=1e-12)
    # CPU devices: no ceiling, and the note says why
    assert bw["ceiling_gbps"][0] is None and bw["ceiling"][0].startswith("no ceiling: CPU devices")
    assert any("no ceiling: CPU devices" in n for n in res.notes)
    # user-given ceiling beats everything: 1 GB/s
    given = analyze(samples, "nccl_sum", "normal", link_gbps=1.0).bandwidth.row(0, named=True)
    assert given["ceiling_gbps"] == 1.0 and given["of_ceiling_pct"] == pytest.approx(100.0 * med, rel=1e-12)
    assert "given (link_gbps)" in given["ceiling"]


@pytest.mark.parametrize("bad", [{"link_gbps": 0}, {"link_gbps": "x"}, {"network": "ethernet"}])
def test_bad_parameters(samples, bad):
    with pytest.raises(UsageError):
        analyze(samples, "nccl_sum", "normal", **bad)


# ---- corpus: real NCCL Kineto traces


def test_corpus_busbw_agrees_with_the_kernels(store):
    # nccl_parser_config: rank 0 of 2 (A100-PG509-200), NCCL kernels with In msg nelems, dtype Float,
    # Group size 2. Rank 1 is not traced, so each call's last traced arrival is its own kernel start:
    # transfer = the kernel's duration (a lower bound on bandwidth: all_ranks_traced false), and
    # busbw = element size x elements / duration x factor (1 for all-reduce of 2 and for broadcast);
    # the kernels' dtype is Float (4 B) or Long (8 B: the broadcasts of 53 elements).
    ingest(store, [corpus("hta/nccl_parser_config")])
    plain = store.sql("""
        SELECT ts_ns AS start_ns, json_extract_string(args, '$.dtype') AS dt,
               CASE dt WHEN 'Float' THEN 4 WHEN 'Long' THEN 8 END
                 * json_extract(args, '$."In msg nelems"')::BIGINT / dur_ns AS busbw
        FROM events WHERE kind = 'kernel' AND name LIKE 'ncclKernel%'""")
    assert set(plain["dt"]) == {"Float", "Long"}
    got = store.sql(
        "SELECT start_ns, op, busbw_gbps, all_ranks_traced, group_size FROM collective_perf"
    ).join(plain, on="start_ns")
    assert got.height == 21 and set(got["op"]) == {"all_reduce", "broadcast"}
    assert not got["all_ranks_traced"].any() and (got["group_size"] == 2).all()
    for a, b in zip(got["busbw_gbps"].to_list(), got["busbw"].to_list(), strict=True):
        assert a == pytest.approx(b, rel=1e-12)
    res = analyze(store, "nccl_sum")
    bw = res.bandwidth
    assert set(bw["ceiling_gbps"]) == {300.0}
    assert bw["ceiling"][0] == "NVLink 3, A100 SXM: 300 GB/s per direction; hosts unknown, assumed one node"
    assert any("lower bounds" in n for n in res.notes)
    # nothing traced another rank: no call's time could be split into wait and transfer
    assert res.frame["split_pct"].to_list() == [0.0, 0.0]


def test_corpus_two_of_128_ranks(store):
    # trace_filter: ranks 0 and 1 of a 128-rank job; the 8 all-reduce instances' sizes come from
    # their nccl:all_reduce annotations' Input Dims x float (before: no message sizes, 0 of 20); the
    # group size is unknown (the ranks seen are not the group), so no bandwidth, and the split is
    # among the traced ranks only
    ingest(store, [corpus("hta/trace_filter")])
    got = store.sql(
        "SELECT count(*), count(group_size), count(size_bytes), count(busbw_gbps), "
        "bool_or(all_ranks_traced) FROM collective_perf WHERE instance_id IS NOT NULL"
    ).row(0)
    assert got == (20, 0, 8, 0, False)
    res = analyze(store, "nccl_sum")
    assert res.bandwidth.is_empty() and any("the process groups' sizes are unknown" in n for n in res.notes)
    assert any("among the traced ranks of groups not traced on every rank" in n for n in res.notes)


# ---- the ceiling

H100 = "NVIDIA H100 80GB HBM3"


@pytest.mark.parametrize(
    "device, spans, n, gbps, network, want, text",
    [
        (H100, False, 8, None, "", 450.0, "NVLink 4, H100 SXM: 450 GB/s per direction"),
        (
            H100,
            False,
            8,
            123.0,
            "",
            123.0,
            "123 GB/s per direction, given (link_gbps)",
        ),  # user beats the table
        (
            H100,
            True,
            16,
            None,
            "",
            50.0,
            "InfiniBand NDR, 50 GB/s per direction per GPU (the group spans hosts; "
            "assumed: one NIC per GPU as in the H100 SXM reference system)",
        ),
        (
            H100,
            True,
            16,
            None,
            "hdr",
            25.0,
            "InfiniBand HDR, 25 GB/s per direction per GPU (the group spans hosts; given (network))",
        ),
        (
            H100,
            None,
            16,
            None,
            "",
            50.0,
            "InfiniBand NDR, 50 GB/s per direction per GPU (the group spans hosts, hosts "
            "unknown: 16 ranks exceed one 8-GPU node; assumed: one NIC per GPU as in the H100 SXM reference system)",
        ),
        (
            H100,
            None,
            4,
            None,
            "",
            450.0,
            "NVLink 4, H100 SXM: 450 GB/s per direction; hosts unknown, assumed one node",
        ),
        (
            "NVIDIA H100 PCIe",
            False,
            2,
            None,
            "",
            63.015,
            "PCIe 5.0 x16, H100 PCIe: 63.015 GB/s per direction",
        ),
        ("NVIDIA A100-SXM4-80GB", False, 8, None, "", 300.0, "NVLink 3, A100 SXM: 300 GB/s per direction"),
        ("NVIDIA B200", False, 8, None, "", 900.0, "NVLink 5, B200: 900 GB/s per direction"),
        (
            "Tesla V100-SXM2-32GB",
            True,
            16,
            None,
            "",
            None,
            "no ceiling: the group spans hosts and the V100 SXM's network "
            "is unknown; give -p network= (ndr, hdr, ...) or -p link_gbps=",
        ),
        (
            "Foo Accelerator 9000",
            False,
            8,
            None,
            "",
            None,
            "no ceiling: device 'Foo Accelerator 9000' not in the link "
            "table; give -p link_gbps= (GB/s per direction per GPU)",
        ),
        (
            None,
            False,
            8,
            None,
            "",
            None,
            "no ceiling: device unknown; give -p link_gbps= (GB/s per direction per GPU)",
        ),
        (
            "cpu",
            None,
            4,
            None,
            "",
            None,
            "no ceiling: CPU devices; give -p link_gbps= (GB/s per direction per GPU)",
        ),
    ],
)
def test_choose_ceiling(device, spans, n, gbps, network, want, text):
    c = links.choose_ceiling(device, spans, n, gbps, network)
    assert (c.gbps, c.text) == (want, text)


def test_link_rates_are_bytes_per_direction():
    # NVLink 4: 900 GB/s bidirectional -> 450 per direction; NDR: 400 Gb/s -> 50 GB/s; PCIe 4.0 x16:
    # 16 GT/s x 16 lanes x 128/130 / 8 bits = 31.508 GB/s
    assert links.LINKS["nvlink4"].gbps == 450.0 and links.LINKS["ndr"].gbps == 50.0
    assert links.LINKS["xdr"].gbps == 100.0 and links.LINKS["hdr"].gbps == 25.0
    assert links.LINKS["pcie4"].gbps == round(16 * 16 * 128 / 130 / 8, 3) == 31.508


def test_readme_lists_the_link_table():
    readme = (REPO / "README.md").read_text()
    rows = {
        m.group(1): float(m.group(2))
        for m in re.finditer(r"^ *\| `(\w+)` \| [^|]+ \| ([\d.]+) \|", readme, re.M)
    }
    assert {k: v.gbps for k, v in links.LINKS.items()} == rows
    for d in links.DEVICE_LINKS:
        inter = links.LINKS[d.inter].name if d.inter else "none"
        row = f"| {d.label} | `{d.pattern.replace('|', '&#124;')}` | {links.LINKS[d.intra].name} | {inter} |"
        assert row in readme, row


def test_report_shows_collective_bandwidth(samples, tmp_path):
    from traceprof.render.report import render_html

    page = render_html(samples, "normal", params={"nccl_sum": {"link_gbps": "2"}})
    assert 'id="nccl_sum"' in page and "bandwidth (1 rows)" in page
    assert re.search(
        r"busbw [\d.]+ GB/s \(median\) of 2 GB/s \(\d+%; 2 GB/s per direction, given \(link_gbps\)\)", page
    )


def test_no_infinite_bandwidth_on_samples(samples):
    inf = samples.sql(
        "SELECT count(*) FROM collective_perf WHERE isinf(algbw_gbps) OR isinf(busbw_gbps) "
        "OR isnan(busbw_gbps)"
    ).item()
    assert inf == 0


def test_a_call_two_sources_recorded_counts_once(tmp_path):
    """t14 D2: straggler_rank2 holds per rank a Kineto trace (gloo work, no sequence numbers) and a
    Flight Recorder dump (29 all-reduces: seq 5 and 8..35, enqueue only). The 12 profiled
    all-reduces are FR seq 20..31 again (sample README), created 15-70 us after their gloo enqueue
    and before the gloo work ends. By hand from the dumps (float32): 4 ranks x 29 = 116 all-reduces,
    4 x (532,480 + 21 x 131,072 + 7 x 139,264) x 4 B = 68,157,440 B (before: 164 and 93,716,480,
    the 48 gloo rows counted again); collective_perf: 35 FR entries x 4 = 140 calls, the 48 profiled as gloo's rows
    (before: 140 FR + 48 gloo rows)."""
    from traceprof.storage.store import Store

    with Store(tmp_path / "s.duckdb") as s:
        ingest(s, [SAMPLES / "straggler_rank2"])
        res = analyze(s, "nccl_sum", "straggler_rank2")
        ar = res.frame.filter(res.frame["name"] == "all_reduce").row(0, named=True)
        assert (ar["instances_total"], ar["bytes_in"], ar["sources"]) == (116, 68_157_440, "fr,gloo")
        assert ar["instances"] == 48  # the timed calls: gloo's
        assert any("48 fr rows record the same calls as gloo rows" in n for n in res.notes)
        got = s.sql("SELECT source, count(*) FROM collective_perf GROUP BY ALL ORDER BY ALL").rows()
        assert got == [("fr", 92), ("gloo", 48)]
        # every FR copy is one of seq 20..31, each gloo row stands for one of them
        seqs = s.sql(
            f"SELECT DISTINCT seq FROM ({COLLECTIVE_COPIES_SQL}) WHERE copy_of = 'gloo' ORDER BY seq"
        )["seq"].to_list()
        assert seqs == list(range(20, 32))


def test_the_copies_are_computed_once_per_call(tmp_path, monkeypatch):
    """nccl_sum computes ``COLLECTIVE_COPIES_SQL`` (window sorts per rank holding two sources) once
    per call, into a temporary table its timed rows, counts and copy notes read; it ran it 4 times
    (the counts, the copy notes, and the timed rows twice: per op and per (rank, op)). The table is
    dropped after the call, and a second call gives the same figures (straggler_rank2, by hand in
    :func:`test_a_call_two_sources_recorded_counts_once`: 116 all-reduces, 48 fr copies)."""
    from traceprof.storage.store import Store

    queries: list[str] = []
    arrow = Store.arrow

    def spy(self: Store, query: str, params: object = None) -> object:
        queries.append(query)
        return arrow(self, query, params)  # type: ignore[arg-type]

    with Store(tmp_path / "s.duckdb") as s:
        ingest(s, [SAMPLES / "straggler_rank2"])
        monkeypatch.setattr(Store, "arrow", spy)
        for _ in range(2):
            queries.clear()
            res = analyze(s, "nccl_sum", "straggler_rank2")
            assert sum(COLLECTIVE_COPIES_SQL in q for q in queries) == 1
            ar = res.frame.filter(res.frame["name"] == "all_reduce").row(0, named=True)
            assert ar["instances_total"] == 116
            assert any("48 fr rows record the same calls as gloo rows" in n for n in res.notes)
            assert s.sql("SELECT count(*) FROM duckdb_tables() WHERE temporary").item() == 0


def _copies(rows: list[tuple]) -> list[tuple]:
    """(source, pg, seq, enter_ns, copy_of) of each row of a bare ``collectives`` table holding ``rows``
    (run_id, rank, trace_id, source, pg, p2p, seq, op, bytes_in, nelems_in, enter_ns, start_ns, end_ns,
    ordinal) through :data:`COLLECTIVE_COPIES_SQL`, by source, pg, seq, enter_ns."""
    import duckdb

    con = duckdb.connect()
    con.execute(
        "CREATE TABLE collectives (run_id INT, rank INT, trace_id INT, source VARCHAR, pg VARCHAR, p2p BOOLEAN, "
        "seq BIGINT, op VARCHAR, bytes_in BIGINT, nelems_in BIGINT, enter_ns BIGINT, start_ns BIGINT, "
        "end_ns BIGINT, ordinal INT)"
    )
    con.executemany("INSERT INTO collectives VALUES (" + ", ".join("?" * 14) + ")", rows)
    return con.execute(
        f"SELECT source, pg, seq, enter_ns, copy_of FROM ({COLLECTIVE_COPIES_SQL}) ORDER BY source, pg, seq, enter_ns"
    ).fetchall()


def test_copies_by_sequence_number_pair_one_to_one():
    """The rule's other half, on a bare ``collectives`` table: rank 0's Kineto NCCL kernels of
    all-reduces seq 1..3 (pg '0') and its Flight Recorder entries seq 1..4, enqueued ahead of the
    GPU (entry k+1 created while kernel k runs, so order and overlap would pair them wrongly). By
    hand: FR seq 1..3 are the kernels' copies, FR seq 4 (after the profiled window) is counted, every
    kernel is counted: 4 calls; a second group '1' with the same seq numbers is no copy of group '0'."""
    rows = [
        (1, 0, 1, "nccl_kernel", "0", False, k, "all_reduce", 64, 16, 100 * k, 100 * k + 50, 100 * k + 140, k)
        for k in (1, 2, 3)
    ]
    rows += [
        (1, 0, 2, "fr", "0", False, k, "all_reduce", 64, 16, 100 * k - 90, 100 * k + 50, 100 * k + 140, k)
        for k in (1, 2, 3, 4)
    ]
    rows += [(1, 0, 2, "fr", "1", False, 1, "all_reduce", 64, 16, 5, None, None, 5)]
    assert [r[:3] + r[4:] for r in _copies(rows)] == [
        ("fr", "0", 1, "nccl_kernel"),
        ("fr", "0", 2, "nccl_kernel"),
        ("fr", "0", 3, "nccl_kernel"),
        ("fr", "0", 4, None),
        ("fr", "1", 1, None),
        ("nccl_kernel", "0", 1, None),
        ("nccl_kernel", "0", 2, None),
        ("nccl_kernel", "0", 3, None),
    ]


def _gloo(at: int, end: int, k: int) -> tuple:
    """A gloo all-reduce of 64 B on rank 0 enqueued at ``at`` ns, its work ending at ``end``."""
    return (1, 0, 1, "gloo", None, False, None, "all_reduce", 64, 16, at, at + 60_000, end, k)


def _fr(seq: int, at: int) -> tuple:
    """A Flight Recorder gloo entry (enqueue only) of the same all-reduce size, created at ``at`` ns."""
    return (1, 0, 2, "fr", "0", False, seq, "all_reduce", 64, 16, at, None, None, seq)


def test_calls_enqueued_closer_than_flight_recorders_lag_pair_in_order():
    """t15 'burst' (straggler_rank2, rank 0's call B moved to 10 us after call A): gloo A enqueued at
    0, gloo B at 10,000 ns (both running for ms); FR seq 20 created 54 us after A, seq 21 64 us after
    (after B: Flight Recorder creates its entry 15-70 us after the enqueue). The rows' arrival order
    is A, B, FR 20, FR 21: pairing neighbours paired FR 20 with B and counted FR 21 again (3 calls).
    By hand: one burst (gaps 10, 44, 10 us <= 1 ms); the 1st FR is A's copy, the 2nd B's: 2 calls.
    A call 10 ms later in FR only (seq 22) is its own burst and counted: 3 calls in all."""
    rows = [_gloo(0, 5_000_000, 1), _gloo(10_000, 6_000_000, 2)]
    rows += [_fr(20, 54_000), _fr(21, 64_000), _fr(22, 10_000_000)]
    assert [(r[0], r[2], r[4]) for r in _copies(rows)] == [
        ("fr", 20, "gloo"),
        ("fr", 21, "gloo"),
        ("fr", 22, None),
        ("gloo", None, None),
        ("gloo", None, None),
    ]


def test_a_call_one_source_alone_holds_is_no_copy_of_a_running_call():
    """t15 'edge' (straggler_rank2, rank 0: FR seq 20 and the gloo rows of the call FR seq 21
    records removed, as when a trace window ends where the FR buffer begins): gloo call 20 enqueued
    at 0 and running until 6 ms; FR seq 21 created at 4,954,000 ns, while it runs. Pairing an earlier
    row still running made FR 21 a copy of gloo 20 (1 call). By hand: 4.954 ms apart > 1 ms, two
    bursts, no copy: 2 calls."""
    assert [(r[0], r[2], r[4]) for r in _copies([_gloo(0, 6_000_000, 1), _fr(21, 4_954_000)])] == [
        ("fr", 21, None),
        ("gloo", None, None),
    ]


def test_flight_recorder_entries_created_ms_after_their_enqueue_pair_in_order():
    """A heavily loaded host: rank 0's FR entries created 2-5 ms after their gloo enqueue (the
    1 ms burst gap split each from its call: each counted twice). Gloo all-reduces of one size at
    0, 3.3, 8.1 ms and a step later at 70, 73.3, 78.1 ms; FR seq 1..6 created 2, 3, 4, 5, 2, 3 ms
    after each: 2.0, 6.3, 12.1, 75.0, 75.3, 81.1 ms. By hand: each FR row's lag to the latest gloo
    enqueue before it, where a gloo enqueue follows (so inside the trace's calls): 2.0, 3.0, 4.0,
    1.7 (seq 4 after call 5's enqueue), 2.0 ms (seq 6: none after); median 2.0 ms, so calls split
    at gaps over 1 + 2 x 2.0 = 5 ms: the merged rows 0, 2.0, 3.3, 6.3, 8.1, 12.1 (gaps <= 4 ms) are
    one burst, 70, 73.3, 75.0, 75.3, 78.1, 81.1 another (57.9 ms after 12.1); in each the k-th FR
    row is the k-th gloo call's copy: 6 calls (every FR row a copy), not 12."""
    ms = 1_000_000
    at = [0, 3_300_000, 8_100_000, 70 * ms, 73_300_000, 78_100_000]
    rows = [_gloo(a, a + 20 * ms, k) for k, a in enumerate(at, 1)]
    rows += [
        _fr(k, a + lag)
        for k, (a, lag) in enumerate(
            zip(at, [2 * ms, 3 * ms, 4 * ms, 5 * ms, 2 * ms, 3 * ms], strict=True), 1
        )
    ]
    got = _copies(rows)
    assert [(r[0], r[2], r[4]) for r in got if r[0] == "fr"] == [("fr", k, "gloo") for k in range(1, 7)]
    assert sum(r[4] is None for r in got) == 6
