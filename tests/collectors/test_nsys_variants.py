"""Nsight Systems exports in the shapes current nsys versions write (issue 28, Nsight part): CUDA graphs
traced per graph, one export holding several processes, no session start time, NVTX ranges never
closed, rows not in time order.

Inputs are the shared case ``nsys_graph_level_trace`` and exports written here with ``sqlite3`` on
nsys's own table and column names (:class:`Export`); every expected number is worked by hand in a
comment (ns after the capture start unless said otherwise).
"""

from __future__ import annotations

import gzip
import json
import shutil
import sqlite3
from pathlib import Path

import polars as pl
import pytest

from tests.builders import EPOCH, Export
from tests.conftest import analyze, case, corpus
from traceprof.collectors.nsys.parse import parse, parse_all
from traceprof.core.errors import TraceFormatError
from traceprof.core.parsed import ParseOptions
from traceprof.engine.findings import summarize
from traceprof.ingest.ingest import ingest
from traceprof.storage.store import Store

CASE_EPOCH = 1_767_225_601_000_000_000  # the case's TARGET_INFO_SESSION_START_TIME.utcEpochNs
STEPS_B = (100_000, 1_100_000, 2_100_000)  # the case's ProfilerStep#1..3 starts
AR = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"


def _store(tmp_path: Path, *paths: Path, name: str = "t") -> tuple[Store, list[str]]:
    s = Store(tmp_path / f"{name}.duckdb")
    res = ingest(s, list(paths), run="r")
    return s, res.warnings


def _row(df: pl.DataFrame, **eq: object) -> dict:
    for k, v in eq.items():
        df = df.filter(pl.col(k) == v)
    assert df.height == 1, df
    return df.row(0, named=True)


# --- 1. CUDA graphs traced per graph (the shared case) -------------------------------------------------


def _case_store(tmp_path: Path, src: Path | None = None) -> tuple[Store, list[str]]:
    return _store(tmp_path, src or case("nsys_graph_level_trace") / "train_rank0.sqlite")


def _check_case_musts(s: Store) -> None:
    # Per step (B = 100000, 1100000, 2100000): embed [B+20000, B+120000], rmsnorm [B+120000, B+220000],
    # graph [B+220000, B+820000] on device 0 stream 7: busy 800000 per step, the lane idle from B+820000
    # to the next step's B+1020000 (200000, twice).
    # window = 120000 -> 2920000 = 2800000; busy = 3 x 800000 = 2400000; idle = 400000 (14.29 %).
    t = _row(analyze(s, "temporal").frame, rank=0)
    assert (t["window_ns"], t["window_ns"] - t["idle_ns"], t["idle_ns"]) == (2_800_000, 2_400_000, 400_000)
    assert t["idle_pct"] == pytest.approx(100 * 400_000 / 2_800_000)
    assert round(t["idle_pct"], 2) == 14.29
    # Each step's GPU activity ends at B + 820000 (the graph's end), on the epoch clock.
    steps = s.sql("SELECT step, device_start_ns, device_end_ns FROM steps ORDER BY step").rows()
    assert steps == [
        (n + 1, CASE_EPOCH + b + 20_000, CASE_EPOCH + b + 820_000) for n, b in enumerate(STEPS_B)
    ]
    # temporal's step spans tile the rank (each starts where the previous step's activity ended): step 1
    # [B1+20000, B1+820000] = 800000 busy; steps 2 and 3 start at the previous graph's end, 1000000 each
    # with the lane's 200000 gap idle; the steps sum to the rank's window 2800000 and idle 400000.
    per_step = analyze(s, "temporal").steps.sort("step")
    assert per_step["window_ns"].to_list() == [800_000, 1_000_000, 1_000_000]
    assert per_step["idle_ns"].to_list() == [0, 200_000, 200_000]


def test_graph_level_case_musts(tmp_path: Path) -> None:
    s, warnings = _case_store(tmp_path)
    _check_case_musts(s)
    # The graph executions are GPU records on their lane, linked to their cudaGraphLaunch (same correlationId).
    g = s.sql("""SELECT name, class, device, stream, dur_ns, launch_name, ts_ns - launch_ts_ns AS latency
                 FROM kernels WHERE name LIKE 'CUDA graph%' ORDER BY ts_ns""").rows()
    # launch [B+30000, B+40000], graph start B+220000: 190000 ns after the call
    assert g == [("CUDA graph 1", "compute", 0, 7, 600_000, "cudaGraphLaunch", 190_000)] * 3
    # ...and the user is told, once, how much was traced per graph and how to record the nodes.
    said = [w for w in warnings if "CUPTI_ACTIVITY_KIND_GRAPH_TRACE" in w]
    assert len(said) == 1 and "3 CUDA graph execution(s) (1,800,000 ns of GPU time)" in said[0]
    assert "--cuda-graph-trace=node" in said[0]
    meta = json.loads(s.sql("SELECT meta FROM traces").item())
    assert meta["graph_level"] == {"executions": 3, "ns": 1_800_000}


def test_graph_level_case_in_every_analysis(tmp_path: Path) -> None:
    s, _ = _case_store(tmp_path)
    graph_note = "--cuda-graph-trace=node"
    # launch: 9 launch calls, 3 of them graph launches (one record each); the graph latency is 190000.
    la = _row(analyze(s, "launch").frame, rank=0)
    assert (la["launches"], la["graph_launches"], la["graph_kernels"], la["latency_max_ns"]) == (
        9,
        3,
        3,
        190_000,
    )
    # kernel_sum: the graph executions are one row; 1800000 of 2400000 ns of kernel time = 75 %.
    ks = _row(analyze(s, "kernel_sum").frame, name="CUDA graph 1")
    assert (ks["instances"], ks["total_ns"], ks["min_ns"], ks["max_ns"]) == (3, 1_800_000, 600_000, 600_000)
    assert ks["time_pct"] == pytest.approx(75.0)
    # idle (one lane): the two 200000 gaps before the next step's embed, launched after the graph ended.
    idle = _row(analyze(s, "idle").frame, rank=0, stream=7)
    assert (idle["window_ns"], idle["idle_ns"], idle["host_wait_ns"]) == (2_800_000, 400_000, 400_000)
    # kernels / overlap: graph time is busy compute time; no communication is visible.
    k = _row(analyze(s, "kernels").frame, rank=0)
    assert (k["kernels"], k["busy_ns"], k["compute_ns"], k["comm_ns"]) == (9, 2_400_000, 2_400_000, 0)
    o = _row(analyze(s, "overlap").frame, rank=0)
    assert (o["compute_ns"], o["comm_ns"]) == (2_400_000, 0)
    for name in ("temporal", "idle", "kernels", "overlap", "gaps", "launch", "kernel_sum"):
        assert any(graph_note in n for n in analyze(s, name).notes), name
    # export perfetto: the graph executions are on the lane's track, 600 us each.
    from traceprof.render.export import export_perfetto

    out = tmp_path / "p.json.gz"
    export_perfetto(s, "r", out)
    events = json.loads(gzip.decompress(out.read_bytes()))["traceEvents"]
    graphs = [e for e in events if e.get("name") == "CUDA graph 1"]
    tracks = {
        (e["pid"], e["tid"]): e["args"]["name"]
        for e in events
        if e.get("ph") == "M" and e["name"] == "thread_name"
    }
    assert [(tracks[e["pid"], e["tid"]], e["dur"]) for e in graphs] == [("dev 0 stream 7", 600.0)] * 3
    # summary: idle 14 % (not 73 %), and it says the graphs were traced per graph; communication is not "ok".
    f = summarize(s, "r")
    idle_f = next(x for x in f.findings if x.topic == "idle")
    assert round(idle_f.cost_pct) == 14 and "traced per graph" in idle_f.text and "73" not in idle_f.text
    comm = next(v for v in f.verdicts if v.topic == "communication")
    assert comm.status == "n/a" and graph_note in comm.text


def test_graph_level_rows_with_node_rows_count_once(tmp_path: Path) -> None:
    """A graph launch with both node-level kernels and a graph-trace row: the kernels are kept, the
    graph row is skipped and counted (busy time is not counted twice)."""
    e = Export()
    e.gpu(0)
    e.launch(10, 1, 1_000, 2_000, "cudaGraphLaunch_v10000")
    e.kernel(10, 0, 1, 10_000, 20_000, node=5)  # graph nodes [10000, 20000] and [20000, 35000]
    e.kernel(10, 0, 1, 20_000, 35_000, node=6)
    e.graph(10, 0, 1, 10_000, 35_000)
    e.launch(10, 2, 40_000, 41_000, "cudaGraphLaunch_v10000")
    e.graph(10, 0, 2, 50_000, 70_000)  # traced per graph only: one record
    t = parse(e.write(tmp_path / "rank0.sqlite"))
    assert t.skipped == {
        "CUPTI_ACTIVITY_KIND_GRAPH_TRACE: graph executions also traced per node (their kernels are kept)": 1
    }
    gpu = [
        (n, s - EPOCH, d)
        for k, n, s, d in zip(
            *(t.events.column(c).to_pylist() for c in ("kind", "name", "ts_ns", "dur_ns")), strict=True
        )
        if k == "kernel"
    ]
    assert sorted(gpu) == [
        ("CUDA graph 1", 50_000, 20_000),
        ("void gemm_kernel<float>()", 10_000, 10_000),
        ("void gemm_kernel<float>()", 20_000, 15_000),
    ]
    assert t.events_read == t.events.num_rows + 1


def test_graph_launches_without_any_gpu_record_are_said_missing(tmp_path: Path) -> None:
    """The case's export without its CUPTI_ACTIVITY_KIND_GRAPH_TRACE table (an nsys that does not
    export it, graph tracing off): the 3 cudaGraphLaunch calls have no GPU row at all. The figures
    over what was recorded stay (they cannot be made up), but every one that the missing graph time
    changes says so, the summary's idle finding included (the case's FAIL IF: "GPU idle 73 %, host
    wait" with no word of the graphs)."""
    src = tmp_path / "train_rank0.sqlite"
    shutil.copy(case("nsys_graph_level_trace") / "train_rank0.sqlite", src)
    src.chmod(0o644)
    con = sqlite3.connect(src)
    con.execute("DROP TABLE CUPTI_ACTIVITY_KIND_GRAPH_TRACE")
    con.commit()
    con.close()
    s, warnings = _store(tmp_path, src)
    # Recorded: per step embed [B+20000, B+120000] and rmsnorm [B+120000, B+220000]: window 120000 ->
    # 2320000 = 2200000, busy 3 x 200000 = 600000, idle 1600000 (72.73 %).
    t = _row(analyze(s, "temporal").frame, rank=0)
    assert (t["window_ns"], t["idle_ns"]) == (2_200_000, 1_600_000)
    said = [w for w in warnings if "have no GPU record" in w]
    assert len(said) == 1 and "3 of 3 CUDA graph launch(es) (cudaGraphLaunch)" in said[0]
    meta = json.loads(s.sql("SELECT meta FROM traces").item())
    assert (meta["graph_launches"], meta["graph_launches_without_gpu"]) == (3, 3)
    lost = "incomplete: CUDA graph launches with no GPU record (rank 0: 3 of 3 (100.0%)), more than 10%"
    for name in ("temporal", "idle", "kernels", "launch", "kernel_sum"):
        assert any(n.startswith(lost) for n in analyze(s, name).notes), name
    idle_f = next(x for x in summarize(s, "r").findings if x.topic == "idle")
    assert round(idle_f.cost_pct) == 73 and lost in idle_f.text and "idle time is overstated" in idle_f.text
    # the case itself (graph-level rows present) loses nothing: no such note
    c, _ = _store(tmp_path, case("nsys_graph_level_trace") / "train_rank0.sqlite", name="case")
    assert not any(n.startswith("incomplete: CUDA graph") for n in analyze(c, "temporal").notes)


def test_kernel_launches_without_kernel_rows_are_counted(tmp_path: Path) -> None:
    """The case's export with its last kernel row deleted (step 3's rmsnorm): 1 of its 6
    cudaLaunchKernel calls has no GPU row, 16.7 % > 10 %: ingest counts it (traces.meta), idle says
    "incomplete:" with the figures and its verdict is inconclusive (it was "problem", idle 14 %)."""
    src = tmp_path / "train_rank0.sqlite"
    shutil.copy(case("nsys_graph_level_trace") / "train_rank0.sqlite", src)
    src.chmod(0o644)
    con = sqlite3.connect(src)
    con.execute(
        "DELETE FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE rowid = "
        "(SELECT rowid FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY start DESC LIMIT 1)"
    )
    con.commit()
    con.close()
    s, _ = _store(tmp_path, src)
    meta = json.loads(s.sql("SELECT meta FROM traces").item())
    assert (meta["kernel_launches"], meta["kernel_launches_without_gpu"]) == (6, 1)
    lost = "incomplete: kernel launches with no GPU record (rank 0: 1 of 6 (16.7%))"
    assert any(n.startswith(lost) for n in analyze(s, "idle").notes)
    v = {v.topic: v for v in summarize(s, "r").verdicts}["idle"]
    assert v.status == "inconclusive" and lost in v.text
    # the case itself: every launch has its kernel, nothing counted
    c, _ = _store(tmp_path, case("nsys_graph_level_trace") / "train_rank0.sqlite", name="case")
    assert "kernel_launches" not in json.loads(c.sql("SELECT meta FROM traces").item())


# --- 2. One export holding several processes --------------------------------------------------------


def _two_processes(
    tmp_path: Path,
    name: str = "node0.sqlite",
    shuffle: int | None = None,
    env: str | None = None,
    mpi: bool = False,
) -> Path:
    """pid 100 drives device 0, pid 200 device 1; both use correlation ids 1, 2 and 3; pid 50 (the
    launcher) has no CUDA work, only an NVTX mark. ``env``: ``rank`` records RANK per process (pid 100
    is RANK 1), ``local`` LOCAL_RANK per process (pid 100 is 1) on node GROUP_RANK 1 of 2 local ranks."""
    e = Export()
    for dev in (0, 1):
        e.gpu(dev)
    for pid in (50, 100, 200):
        e.process(pid)
    # pid 100: launches at 1000, 20000, 60000; kernels at 5000 (10000 long), 30000 (10000), 65000 (5000)
    e.launch(100, 1, 1_000, 2_000)
    e.kernel(100, 0, 1, 5_000, 15_000)
    e.launch(100, 2, 20_000, 21_000)
    e.kernel(100, 0, 2, 30_000, 40_000)
    e.launch(100, 3, 60_000, 61_000)
    e.kernel(100, 0, 3, 65_000, 70_000)
    # pid 200: launches at 3000, 50000; kernels at 6000 (20000 long), 52000 (10000); a graph launched at
    # 70000 runs [80000, 100000] (traced per graph)
    e.launch(200, 1, 3_000, 4_000)
    e.kernel(200, 1, 1, 6_000, 26_000)
    e.launch(200, 2, 50_000, 51_000)
    e.kernel(200, 1, 2, 52_000, 62_000)
    e.launch(200, 3, 70_000, 71_000, "cudaGraphLaunch_v10000")
    e.graph(200, 1, 3, 80_000, 100_000)
    e.nvtx(50, 500, None, "torchrun start", etype=34)
    if env:  # nsys launched both processes itself: their environments are recorded
        for n, (pid, rank) in enumerate(((200, 0), (100, 1))):
            e.capture(f"PROCESS_{n}:PID", str(pid))
            e.capture(
                f"PROCESS_{n}:ENV",
                f"PATH=/bin\nLOCAL_RANK={rank}\nRANK={rank}\nWORLD_SIZE=2"
                if env == "rank"
                else f"PATH=/bin\nLOCAL_RANK={rank}\nWORLD_SIZE=4",
            )
        if env == "local":  # the node's launcher environment: node 1, 2 ranks per node
            e.rows["TARGET_INFO_SYSTEM_ENV"].append(
                (0, "Host", "DeviceEnvironment", 0, "GROUP_RANK=1\nLOCAL_WORLD_SIZE=2\nHOME=/home/user")
            )
    if mpi:  # nsys's MPI tracing names a thread of each process "MPI Rank N": pid 100 is rank 1
        e.nvtx(100, 0, None, "MPI Rank 1", etype=39)
        e.nvtx(200, 0, None, "MPI Rank 0", etype=39)
    return e.write(tmp_path / name, shuffle=shuffle)


def _check_two_processes(s: Store, rank_a: int, rank_b: int) -> None:
    """rank_a: the rank of pid 100, rank_b: of pid 200."""
    assert s.sql("SELECT rank, pid FROM traces ORDER BY rank").rows() == sorted(
        [(rank_a, "100"), (rank_b, "200")]
    )
    la = analyze(s, "launch").frame
    a, b = _row(la, rank=rank_a), _row(la, rank=rank_b)
    # pid 100: latencies 5000 - 1000, 30000 - 20000, 65000 - 60000 = 4000, 10000, 5000 -> p50 5000, max 10000.
    # Linked on (process, correlationId): colliding ids are no graph launches and no cross-process latency.
    assert (a["launches"], a["graph_launches"], a["latency_p50_ns"], a["latency_max_ns"]) == (
        3,
        0,
        5_000,
        10_000,
    )
    # pid 200: 6000 - 3000, 52000 - 50000, graph 80000 - 70000 = 3000, 2000, 10000 -> p50 3000, max 10000.
    assert (b["launches"], b["graph_launches"], b["latency_p50_ns"], b["latency_max_ns"]) == (
        3,
        1,
        3_000,
        10_000,
    )
    t = analyze(s, "temporal").frame
    # pid 100: window [5000, 70000] = 65000, busy 10000 + 10000 + 5000 = 25000, idle 40000
    ta, tb = _row(t, rank=rank_a), _row(t, rank=rank_b)
    assert (ta["window_ns"], ta["idle_ns"]) == (65_000, 40_000)
    # pid 200: window [6000, 100000] = 94000, busy 20000 + 10000 + 20000 = 50000, idle 44000
    assert (tb["window_ns"], tb["idle_ns"]) == (94_000, 44_000)
    # every kernel linked to its own process's call
    lat = s.sql(
        "SELECT rank, correlation, ts_ns - launch_ts_ns FROM kernels ORDER BY rank, correlation"
    ).rows()
    assert lat == sorted(
        [
            (rank_a, 1, 4_000),
            (rank_a, 2, 10_000),
            (rank_a, 3, 5_000),
            (rank_b, 1, 3_000),
            (rank_b, 2, 2_000),
            (rank_b, 3, 10_000),
        ]
    )


@pytest.mark.parametrize(
    ("env", "mpi", "ranks", "how", "world"),
    [
        (None, False, (0, 1), "device", None),  # pid 100 drives device 0 (of 0, 1): LOCAL_RANK 0
        ("rank", False, (1, 0), "environment RANK", 2),  # PROCESS_1:PID 100 has RANK=1
        (None, True, (1, 0), "MPI Rank N", None),  # pid 100's thread is "MPI Rank 1"
        # pid 100 has LOCAL_RANK=1 on node GROUP_RANK 1 of LOCAL_WORLD_SIZE 2: 1 x 2 + 1 = 3; pid 200: 2
        (
            "local",
            False,
            (3, 2),
            "environment LOCAL_RANK of each process; node 1 (GROUP_RANK) x 2 local ranks",
            4,
        ),
    ],
)
def test_one_export_several_processes(
    tmp_path: Path, env: str | None, mpi: bool, ranks: tuple[int, int], how: str, world: int | None
) -> None:
    src = _two_processes(tmp_path, env=env, mpi=mpi)
    s, warnings = _store(tmp_path, src)
    rank_a, rank_b = ranks
    _check_two_processes(s, rank_a, rank_b)
    said = [w for w in warnings if "2 processes with CUDA work" in w]
    assert len(said) == 1 and how in said[0]
    assert f"pid 100 -> rank {rank_a}" in said[0] and f"pid 200 -> rank {rank_b}" in said[0]
    assert "1 other process(es) without CUDA work not stored (pid 50)" in said[0]
    for meta in s.sql("SELECT meta FROM traces")["meta"]:
        assert how in json.loads(meta)["rank_source"]
    # the launcher's NVTX mark is counted, not stored; the graph is said once (pid 200's trace)
    assert (
        s.sql(
            "SELECT sum(json_extract(skipped, '$.\"rows of processes without CUDA work\"')::INT) FROM traces"
        ).item()
        == 1
    )
    assert s.sql("SELECT count(*) FROM events WHERE name = 'torchrun start'").item() == 0
    assert sum("CUPTI_ACTIVITY_KIND_GRAPH_TRACE" in w for w in warnings) == 1
    assert s.sql("SELECT world_size FROM traces").to_series().to_list() == [world, world]


def test_gpu_rows_without_global_pid(tmp_path: Path) -> None:
    """An export whose GPU tables lack globalPid: a row goes to the one process that launched its
    correlation id; ids both processes launched cannot be placed and are counted, not guessed."""
    src = _two_processes(tmp_path)
    con = sqlite3.connect(src)
    con.executescript(
        "ALTER TABLE CUPTI_ACTIVITY_KIND_KERNEL DROP COLUMN globalPid; "
        "ALTER TABLE CUPTI_ACTIVITY_KIND_GRAPH_TRACE DROP COLUMN globalPid;"
    )
    # correlation id 9: launched by pid 100 only (at 80000), its kernel [90000, 95000]
    con.execute(
        "INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME SELECT 80000, 81000, 1, (100 << 24) | 100, 9, nameId, 0, NULL "
        "FROM CUPTI_ACTIVITY_KIND_RUNTIME LIMIT 1"
    )
    con.execute(
        "INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL SELECT 90000, 95000, 0, 1, NULL, 7, 9, demangledName, shortName, "
        "64, 1, 1, 1, 1, 1, 1, 0, 0, 9, NULL FROM CUPTI_ACTIVITY_KIND_KERNEL LIMIT 1"
    )
    con.commit()
    con.close()
    traces = parse_all(src)
    # correlation ids 1, 2 and 3 were launched by both processes: their 6 GPU rows (5 kernels and pid
    # 200's graph) are counted, not given to a process by guess; id 9 goes to pid 100
    why = "GPU row without globalPid whose correlationId no single process launched"
    assert traces[0].rejected == {why: 6}
    assert [(t.trace["pid"], t.events.column("kind").to_pylist().count("kernel")) for t in traces] == [
        ("100", 1),
        ("200", 0),
    ]
    # only pid 100 drives a device: ranks by pid order, with a warning that says so
    assert [t.rank for t in traces] == [0, 1] and "numbered by pid order" in " ".join(traces[0].warnings)
    assert (
        sum(t.events_read for t in traces) == sum(t.events.num_rows for t in traces) + 6 + 1
    )  # + the launcher's mark


def test_parse_of_a_multi_process_export_says_to_use_parse_all(tmp_path: Path) -> None:
    src = _two_processes(tmp_path)
    with pytest.raises(TraceFormatError, match="holds 2 processes with CUDA work.*parse_all"):
        parse(src)
    assert [t.rank for t in parse_all(src)] == [0, 1]


# --- 3. No session start time; NVTX ranges never closed ---------------------------------------------


def _one_rank(epoch: int | None, rank: int = 0) -> Export:
    e = Export(epoch)
    e.gpu(0)
    e.capture("PROCESS_0:PID", "0")
    e.capture("PROCESS_0:ENV", f"RANK={rank}\nWORLD_SIZE=2")
    return e


@pytest.mark.parametrize("how", ["no table", "empty table", "NULL", "zero"])
def test_export_without_session_start_is_read_on_a_relative_clock(tmp_path: Path, how: str) -> None:
    e = _one_rank(None if how in ("no table", "empty table") else EPOCH)
    if how in ("NULL", "zero"):
        e.rows["TARGET_INFO_SESSION_START_TIME"] = [(None if how == "NULL" else 0, None, None)]
    e.launch(10, 1, 1_000, 2_000)
    e.kernel(10, 0, 1, 5_000, 15_000)
    e.launch(10, 2, 20_000, 21_000)
    e.kernel(10, 0, 2, 30_000, 40_000)
    src = e.write(
        tmp_path / "rank0.sqlite", drop=("TARGET_INFO_SESSION_START_TIME",) if how == "no table" else ()
    )
    s, warnings = _store(tmp_path, src)
    why = {
        "no table": "no TARGET_INFO_SESSION_START_TIME.utcEpochNs",
        "empty table": "TARGET_INFO_SESSION_START_TIME is empty",
        "NULL": "TARGET_INFO_SESSION_START_TIME.utcEpochNs is None",
        "zero": "TARGET_INFO_SESSION_START_TIME.utcEpochNs is 0",
    }[how]
    said = [w for w in warnings if "no capture start time" in w]
    assert said == [
        f"rank0.sqlite: {why} (no capture start time): its times are ns from the capture start, not "
        "epoch time; they are aligned to the other ranks' through matched collectives when there are "
        "any, else they cannot be compared with other files' times"
    ]
    # times are the export's own: ns from the capture start
    assert s.sql("SELECT ts_ns FROM events WHERE kind = 'kernel' ORDER BY 1").to_series().to_list() == [
        5_000,
        30_000,
    ]
    assert json.loads(s.sql("SELECT meta FROM traces").item())["clock"] == "session_relative"
    t = _row(analyze(s, "temporal").frame, rank=0)
    assert (t["window_ns"], t["idle_ns"]) == (35_000, 15_000)  # [5000, 40000], busy 20000


def _allreduce_rank(epoch: int | None, rank: int, shift: int, late: int) -> Export:
    """Three all-reduce kernels that end together on every rank (epoch E + 20000, 120000, 220000);
    this rank's capture started ``shift`` ns after E, it launches ``late`` ns after rank 0 (at
    E + 9000 + late + k x 100000) and its kernels start 1000 ns after its launch."""
    e = _one_rank(epoch, rank)
    for k in range(3):
        t0 = 9_000 + late + 100_000 * k - shift
        e.launch(10 + rank, k + 1, t0, t0 + 500)
        e.kernel(10 + rank, 0, k + 1, t0 + 1_000, 20_000 + 100_000 * k - shift, AR, stream=20)
    e.nvtx(10 + rank, 0, 300_000 - shift, "ProfilerStep#1")
    return e


def test_relative_clock_rank_is_aligned_through_collectives(tmp_path: Path) -> None:
    run = tmp_path / "job"
    run.mkdir()
    _allreduce_rank(EPOCH, 0, 0, 0).write(run / "rank0.sqlite")
    # rank 1 has no session start; its capture started at E + 7000, so its times are 7000 less than
    # the epoch offset from E: its end times read 13000, 113000, 213000.
    _allreduce_rank(None, 1, 7_000, 2_000).write(
        run / "rank1.sqlite", drop=("TARGET_INFO_SESSION_START_TIME",)
    )
    s = Store(tmp_path / "t.duckdb")
    res = ingest(s, [run])
    assert any("rank1.sqlite: no TARGET_INFO_SESSION_START_TIME.utcEpochNs" in w for w in res.warnings)
    # end_1 - end_0 = 13000 - (E + 20000) for all three: rank 1's clock offset is E + 7000
    assert s.sql("SELECT rank, clock_offset_ns FROM traces ORDER BY rank").rows() == [
        (0, 0),
        (1, EPOCH + 7_000),
    ]
    ends = s.sql("SELECT rank, end_ns FROM collectives ORDER BY rank, end_ns").rows()
    assert ends == [(r, EPOCH + 20_000 + 100_000 * k) for r in (0, 1) for k in range(3)]
    # arrival = launch: rank 0 at E + 9000 + k x 100000, rank 1 2000 later: skew 2000, rank 1 last
    inst = s.sql(
        "SELECT arrival_skew_ns, last_rank FROM collective_instances ORDER BY first_arrival_ns"
    ).rows()
    assert inst == [(2_000, 1)] * 3


def test_nvtx_ranges_without_end(tmp_path: Path) -> None:
    e = _one_rank(EPOCH)
    e.nvtx(10, 0, 100_000, "ProfilerStep#1")
    e.nvtx(10, 100_000, None, "ProfilerStep#2")  # the capture stopped inside step 2
    e.nvtx(10, 10_000, None, "forward")
    e.launch(10, 1, 1_000, 2_000)
    e.kernel(10, 0, 1, 5_000, 25_000)
    e.launch(10, 2, 101_000, 102_000)
    e.kernel(10, 0, 2, 105_000, 125_000)
    s, warnings = _store(tmp_path, e.write(tmp_path / "rank0.sqlite"))
    said = [w for w in warnings if "never closed" in w]
    assert len(said) == 1 and "2 NVTX range(s) never closed" in said[0] and "ProfilerStep#2" in said[0]
    assert s.sql("SELECT events_flagged FROM traces").item() == 2
    assert s.sql(
        "SELECT name, kind, dur_ns FROM events WHERE flag = 'unmatched_begin' ORDER BY name"
    ).rows() == [("ProfilerStep#2", "instant", 0), ("forward", "instant", 0)]
    # step 1 holds the first kernel; the second was launched in the unclosed step 2: no step
    assert s.sql("SELECT step, device_start_ns - ?, device_end_ns - ? FROM steps", [EPOCH, EPOCH]).rows() == [
        (1, 5_000, 25_000)
    ]
    assert s.sql("SELECT correlation, step FROM kernels ORDER BY 1").rows() == [(1, 1), (2, None)]
    t = _row(analyze(s, "temporal").frame, rank=0)
    assert (t["window_ns"], t["idle_ns"]) == (120_000, 80_000)  # [5000, 125000], busy 40000


def test_gpu_rows_take_the_step_of_their_launch(tmp_path: Path) -> None:
    # ProfilerStep#1 [0, 100000), #2 [100000, 200000) (NVTX); the GPU runs behind the CPU:
    #   corr 1: launched at 90000 (step 1), runs [110000, 150000): after step 1's range ended -> step 1
    #   corr 2: launched at 101000 (step 2), runs [150000, 170000) -> step 2
    #   corr 3: launched at 190000 (step 2), runs [205000, 215000): after every step range -> step 2
    # Device spans: step 1 [110000, 150000], step 2 [150000, 215000]. (By their own starts the
    # kernels would fall in steps 2, 2 and none, and step 1 would have no device span.)
    e = _one_rank(EPOCH)
    e.nvtx(10, 0, 100_000, "ProfilerStep#1")
    e.nvtx(10, 100_000, 200_000, "ProfilerStep#2")
    for corr, launch, start, end in [
        (1, 90_000, 110_000, 150_000),
        (2, 101_000, 150_000, 170_000),
        (3, 190_000, 205_000, 215_000),
    ]:
        e.launch(10, corr, launch, launch + 500)
        e.kernel(10, 0, corr, start, end)
    s, _ = _store(tmp_path, e.write(tmp_path / "rank0.sqlite"))
    assert s.sql("SELECT correlation, step FROM kernels ORDER BY 1").rows() == [(1, 1), (2, 2), (3, 2)]
    assert s.sql("SELECT correlation, step FROM events WHERE kind = 'cuda_runtime' ORDER BY 1").rows() == [
        (1, 1),
        (2, 2),
        (3, 2),
    ]
    assert s.sql(
        "SELECT step, device_start_ns - ?, device_end_ns - ? FROM steps ORDER BY step", [EPOCH, EPOCH]
    ).rows() == [(1, 110_000, 150_000), (2, 150_000, 215_000)]


# --- 4. Rows not in time order -------------------------------------------------------------------------


def _reversed_copy(src: Path, dst: Path) -> Path:
    """``src`` with every table's rows written in reverse order."""
    shutil.copy(src, dst)
    dst.chmod(0o644)
    con = sqlite3.connect(dst)
    for (t,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall():
        con.executescript(
            f'CREATE TABLE "_r" AS SELECT * FROM "{t}" ORDER BY rowid DESC; DELETE FROM "{t}"; '
            f'INSERT INTO "{t}" SELECT * FROM "_r"; DROP TABLE "_r";'
        )
    con.commit()
    first = con.execute("SELECT start FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY rowid LIMIT 1").fetchone()[0]
    con.close()
    assert first == 2_220_000  # the last kernel is now the first row
    return dst


def _events(s: Store) -> list[tuple]:
    return s.sql(
        "SELECT kind, name, ts_ns, dur_ns, device, stream, correlation, step, class, flag FROM events "
        "ORDER BY ALL"
    ).rows()


def test_rows_out_of_time_order(tmp_path: Path) -> None:
    src = case("nsys_graph_level_trace") / "train_rank0.sqlite"
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    ordered, _ = _case_store(tmp_path / "a")
    rev, _ = _case_store(tmp_path / "b", _reversed_copy(src, tmp_path / "b" / "train_rank0.sqlite"))
    _check_case_musts(rev)
    assert _events(rev) == _events(ordered)
    assert (
        rev.sql("SELECT * EXCLUDE (run_id, trace_id) FROM steps ORDER BY step").rows()
        == ordered.sql("SELECT * EXCLUDE (run_id, trace_id) FROM steps ORDER BY step").rows()
    )
    # a multi-process export written in a random row order: the same ranks, links and numbers
    shuffled = _two_processes(tmp_path, "shuffled.sqlite", shuffle=7)
    s, _ = _store(tmp_path, shuffled, name="shuffled")
    _check_two_processes(s, 0, 1)


def test_damaged_schema_whose_sqlite_error_is_not_utf8_is_a_clean_error(tmp_path: Path) -> None:
    """One byte of a CREATE TABLE statement turned into invalid UTF-8 (``NOT NU\\xbaL``, as the fuzz run
    found it): SQLite's "malformed database schema" message quotes the byte, and Python's sqlite3 fails to
    decode the message itself (UnicodeDecodeError, not an sqlite3.Error). It is a format error naming the file."""
    p = tmp_path / "train_rank0.sqlite"
    con = sqlite3.connect(p)
    con.execute("CREATE TABLE StringIds (id INTEGER NOT NULL PRIMARY KEY, value TEXT NOT NULL)")
    con.commit()
    con.close()
    data = p.read_bytes()
    assert data.count(b"NOT NULL") == 2
    p.write_bytes(data.replace(b"NOT NULL", b"NOT NU\xbaL", 1))
    with pytest.raises(TraceFormatError, match="damaged schema") as e:
        parse_all(p)
    assert str(p) in str(e.value)


def test_nvtx_row_whose_global_tid_is_not_an_integer_is_left_out_and_counted(tmp_path: Path) -> None:
    # A REAL globalTid (SQLite keeps whatever a cell holds) in an NVTX range: decoding its pid/tid
    # (bits 24-47 / 0-23) was a TypeError traceback (the fuzzer found it with 1.5 and 1e308). The
    # row is unusable like one with a non-integer time: left out, counted, named with --strict.
    e = _one_rank(EPOCH)
    e.nvtx(10, 0, 100_000, "ProfilerStep#1")
    e.nvtx(10, 10_000, 20_000, "forward")
    e.launch(10, 1, 1_000, 2_000)
    e.kernel(10, 0, 1, 5_000, 25_000)
    path = e.write(tmp_path / "rank0.sqlite")
    con = sqlite3.connect(path)
    con.execute("UPDATE NVTX_EVENTS SET globalTid = 1.5 WHERE text = 'forward'")
    con.commit()
    con.close()
    # the error names the value as recorded, and the row's times (ns after the capture start)
    with pytest.raises(
        TraceFormatError,
        match=r"NVTX_EVENTS row id 2: globalTid not an integer \(globalTid=1\.5, start=10000, end=20000\)",
    ):
        parse_all(path)
    exp = parse_all(path, ParseOptions(on_bad_event="skip"))[0]
    names = set(exp.events.column("name").to_pylist())
    assert "ProfilerStep#1" in names and "forward" not in names
    assert exp.rejected == {"NVTX_EVENTS: globalTid not an integer": 1}


@pytest.mark.parametrize(
    ("table", "damage", "rowid", "reason", "gone"),
    [
        # kernel 2 ("void relu_kernel()", string id 5) names an id the string table lost
        (
            "CUPTI_ACTIVITY_KIND_KERNEL",
            "DELETE FROM StringIds WHERE value = 'void relu_kernel()'",
            2,
            "demangledName string id 5 not in StringIds",
            "void relu_kernel()",
        ),
        # the second launch's nameId points past the string table
        (
            "CUPTI_ACTIVITY_KIND_RUNTIME",
            "UPDATE CUPTI_ACTIVITY_KIND_RUNTIME SET nameId = 999 WHERE correlationId = 2",
            2,
            "nameId string id 999 not in StringIds",
            None,
        ),
        # an NVTX range named by textId (nsys writes most names so) whose string is gone
        (
            "NVTX_EVENTS",
            "UPDATE NVTX_EVENTS SET text = NULL, textId = 998 WHERE text = 'forward'",
            2,
            "textId string id 998 not in StringIds",
            "forward",
        ),
    ],
)
def test_string_id_missing_from_string_table_is_a_bad_row(
    tmp_path: Path, table: str, damage: str, rowid: int, reason: str, gone: str | None
) -> None:
    # A damaged export (`DELETE FROM StringIds`) stored its rows silently named '' (a kernel ""
    # in kernel_sum): a name id that resolves to nothing is a bad row like a non-integer id.
    # Strings: 1 cudaLaunchKernel_v7000, 2 gemm, 3 ProfilerStep#1 (text), ... ids in order of use.
    e = _one_rank(EPOCH)
    e.nvtx(10, 0, 100_000, "ProfilerStep#1")
    e.nvtx(10, 10_000, 20_000, "forward")
    e.launch(10, 1, 1_000, 2_000)
    e.kernel(10, 0, 1, 5_000, 25_000)
    e.string("unused 3")
    e.string("unused 4")
    e.launch(10, 2, 30_000, 31_000)
    e.kernel(10, 0, 2, 35_000, 45_000, name="void relu_kernel()")
    assert e.ids["void relu_kernel()"] == 5
    path = e.write(tmp_path / "rank0.sqlite")
    con = sqlite3.connect(path)
    con.execute(damage)
    con.commit()
    con.close()
    with pytest.raises(TraceFormatError) as err:
        parse_all(path)
    msg = str(err.value)
    assert f"{path}: {table} row id {rowid}: {reason} (1 row(s) of {table}" in msg, msg
    assert "--skip-bad-events" in msg
    t = parse_all(path, ParseOptions(on_bad_event="skip"))[0]
    key = f"{table}: {reason.split(' string id ')[0]} string id not in StringIds"
    assert t.rejected == {key: 1}
    names = t.events.column("name").to_pylist()
    assert "" not in names and (gone is None or gone not in names)
    # 2 NVTX + 2 launches + 2 kernels, less the bad row
    assert len(names) == 5


def test_export_whose_string_table_was_emptied_fails_naming_the_file(tmp_path: Path) -> None:
    # The trial's repro on a real export: 117 rows (5 kernels, 95 CUDA calls, 17 NVTX ranges) named
    # through StringIds, which is emptied. They were stored named ''. Counted by plain SQL below.
    src = corpus("nsys/pipit_saxpy-mpi-cuda_nsys_perlmutter0.sqlite")
    d = tmp_path / "x"
    d.mkdir()
    db = d / "a.sqlite"
    shutil.copy(src, db)
    db.chmod(0o644)
    con = sqlite3.connect(db)
    kernels, calls = (
        con.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
        for t in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME")
    )
    con.execute("DELETE FROM StringIds")
    con.commit()
    con.close()
    s = Store(tmp_path / "t.duckdb")
    with pytest.raises(TraceFormatError) as err:
        ingest(s, [d], run="r")
    assert f"{db}: CUPTI_ACTIVITY_KIND_KERNEL row id 1: demangledName string id " in str(err.value)
    assert f"({kernels} row(s) of CUPTI_ACTIVITY_KIND_KERNEL" in str(err.value)
    assert s.sql("SELECT count(*) FROM runs").item() == 0
    res = ingest(s, [d], run="r", on_bad_event="skip")
    rejected = json.loads(s.sql("SELECT rejected FROM traces").item())
    assert rejected["CUPTI_ACTIVITY_KIND_KERNEL: demangledName string id not in StringIds"] == kernels
    assert rejected["CUPTI_ACTIVITY_KIND_RUNTIME: nameId string id not in StringIds"] == calls
    assert s.sql("SELECT count(*) FROM events WHERE name = ''").item() == 0
    assert any("not stored" in w for w in res.warnings)


def test_memset_of_a_memory_kind_the_enum_lacks_keeps_its_number(tmp_path: Path) -> None:
    # ENUM_CUDA_MEM_KIND (or the built-in list, ids 0-7) lacks memKind 42: the memset was named
    # "Memset (Device)", a silent guess; it is named by the number as a memcpy's unknown kinds are.
    e = _one_rank(EPOCH)
    e.launch(10, 1, 1_000, 2_000)
    e.kernel(10, 0, 1, 5_000, 25_000)
    path = e.write(tmp_path / "rank0.sqlite")
    con = sqlite3.connect(path)
    con.execute(
        "CREATE TABLE CUPTI_ACTIVITY_KIND_MEMSET (start INTEGER, end INTEGER, deviceId INTEGER, "
        "streamId INTEGER, correlationId INTEGER, globalPid INTEGER, bytes INTEGER, memKind INTEGER)"
    )
    con.executemany(
        "INSERT INTO CUPTI_ACTIVITY_KIND_MEMSET VALUES (?, ?, 0, 7, ?, ?, 64, ?)",
        [(30_000, 31_000, 2, 10 << 24, 42), (32_000, 33_000, 3, 10 << 24, 2)],
    )
    con.commit()
    con.close()
    t = parse_all(path)[0]
    memsets = [n for n in t.events.column("name").to_pylist() if n.startswith("Memset")]
    assert sorted(memsets) == ["Memset (42)", "Memset (Device)"]


# --- enum fields that hold NULL: a sync row with a NULL syncType was named "None", a copy with NULL
# memory kinds "Memcpy HtoD (None -> None)" ---------------------------------------------------------


def _with_enum_rows(path: Path, enums: bool) -> Path:
    """A one-rank export (pid 10) with sync, memcpy and memset rows whose enum fields are NULL or
    set, on nsys's column names (nullable here: the fields NULL in a damaged or unusual export);
    ``enums``: with the ENUM_* tables (schema 3.x: labels such as ``Host-to-Device``), else the
    collector's fallbacks (schema 2.x). ENUM_CUPTI_SYNC_TYPE also has a row without a label; the
    last memset has no streamId."""
    e = _one_rank(EPOCH)
    e.nvtx(10, 0, 100_000, "ProfilerStep#1")
    e.launch(10, 1, 1_000, 2_000)
    e.kernel(10, 0, 1, 5_000, 25_000)
    path = e.write(path)
    con = sqlite3.connect(path)
    gpid = 10 << 24
    con.execute(
        "CREATE TABLE CUPTI_ACTIVITY_KIND_SYNCHRONIZATION (start INTEGER, end INTEGER, deviceId INTEGER, "
        "contextId INTEGER, streamId INTEGER, correlationId INTEGER, globalPid INTEGER, syncType INTEGER, "
        "eventId INTEGER)"
    )
    con.executemany(
        "INSERT INTO CUPTI_ACTIVITY_KIND_SYNCHRONIZATION VALUES (?, ?, 0, 1, 7, ?, ?, ?, 0)",
        [(30_000, 31_000, 11, gpid, None), (32_000, 33_000, 12, gpid, 3), (34_000, 35_000, 13, gpid, 0)]
        + ([(36_000, 37_000, 14, gpid, 5)] if enums else []),
    )
    con.execute(
        "CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY (start INTEGER, end INTEGER, deviceId INTEGER, contextId "
        "INTEGER, streamId INTEGER, correlationId INTEGER, globalPid INTEGER, bytes INTEGER, copyKind INTEGER, "
        "srcKind INTEGER, dstKind INTEGER)"
    )
    con.executemany(
        "INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY VALUES (?, ?, 0, 1, 8, ?, ?, 64, ?, ?, ?)",
        [(40_000, 41_000, 21, gpid, 1, None, 2), (42_000, 43_000, 22, gpid, None, 0, None)],
    )
    con.execute(
        "CREATE TABLE CUPTI_ACTIVITY_KIND_MEMSET (start INTEGER, end INTEGER, deviceId INTEGER, contextId "
        "INTEGER, streamId INTEGER, correlationId INTEGER, globalPid INTEGER, value INTEGER, bytes INTEGER, "
        "memKind INTEGER)"
    )
    con.executemany(
        "INSERT INTO CUPTI_ACTIVITY_KIND_MEMSET VALUES (?, ?, 0, 1, ?, ?, ?, 0, 64, ?)",
        [(50_000, 51_000, 8, 31, gpid, None), (52_000, 53_000, None, 32, gpid, 2)],
    )
    if enums:
        for table, rows in (
            ("ENUM_CUPTI_SYNC_TYPE", [(0, "Unknown"), (3, "Stream sync"), (5, None)]),
            ("ENUM_CUDA_MEMCPY_OPER", [(0, "Unknown"), (1, "Host-to-Device")]),
            ("ENUM_CUDA_MEM_KIND", [(0, "Pageable"), (2, "Device"), (7, "Unknown")]),
        ):
            con.execute(f"CREATE TABLE {table} (id INTEGER NOT NULL PRIMARY KEY, name TEXT, label TEXT)")
            con.executemany(f"INSERT INTO {table} VALUES (?, 'X', ?)", rows)
    con.commit()
    con.close()
    return path


@pytest.mark.parametrize("enums", [True, False])
def test_null_enum_fields_are_named_unknown(tmp_path: Path, enums: bool) -> None:
    t = parse(_with_enum_rows(tmp_path / "rank0.sqlite", enums))
    got = [
        (r["kind"], r["name"], json.loads(r["args"]).get("syncType", "-"))
        for r in sorted(t.events.to_pylist(), key=lambda r: r["ts_ns"])
        if r["kind"] in ("sync", "memcpy", "memset")
    ]
    # NULL is "no value recorded": the enum's unknown label, as syncType 0 (recorded as unknown) is
    # named; args keep NULL and 0 apart. syncType 5 is in the ENUM table without a label: as recorded.
    assert got == [
        ("sync", "Unknown", None),
        ("sync", "Stream sync", 3),
        ("sync", "Unknown", 0),
        *([("sync", "5", 5)] if enums else []),
        ("memcpy", "Memcpy HtoD (Unknown -> Device)", "-"),
        ("memcpy", "Memcpy Unknown (Pageable -> Unknown)", "-"),
        ("memset", "Memset (Unknown)", "-"),
        ("memset", "Memset (Device)", "-"),
    ]
    assert not [n for n in t.events.column("name").to_pylist() if "None" in n]
    # a NULL lane id stays NULL in pid/tid (it was the text 'None'), as a kernel's does
    lanes = [(r["pid"], r["tid"], r["stream"]) for r in t.events.to_pylist() if r["kind"] == "memset"]
    assert sorted(lanes, key=str) == [("0", "8", 8), ("0", None, None)]


def _early_kernels(ahead_ns: int, b: int = 10_000_000, lost: bool = False) -> Export:
    """``kernel_before_its_launch`` as an nsys export: ProfilerStep#2 [B, B + 1 ms], B = ``b`` ns
    (10 ms) after the capture start (so that rows written early keep a positive start); launches
    (5 us) at B + 10 + 100 i us (i = 0..5, correlationId 501 + i), each kernel 20 us after its launch
    and 50 us long; the first two are written ``ahead_ns`` early (``lost``: without their launch rows)."""
    e = Export()
    e.gpu(0)
    e.process(10)
    e.nvtx(10, b, b + 1_000_000, "ProfilerStep#2")
    for i in range(6):
        start = b + 10_000 + 100_000 * i
        if not (lost and i < 2):
            e.launch(10, 501 + i, start, start + 5_000)
        k = start + 20_000 - (ahead_ns if i < 2 else 0)
        e.kernel(10, 0, 501 + i, k, k + 50_000)
    return e


def test_kernels_before_their_launch_are_flagged_as_in_kineto(tmp_path: Path) -> None:
    # The first two kernels start 5 ms early: 5,000,000 - 20,000 = 4,980,000 ns before their launch
    # call (> 1 ms: another clock domain). Before: window [B+30-5000 us, B+580 us] = 5,550,000 ns, idle
    # 5,250,000 ns (94.6 %), latency mean -1,646,667 ns. Left out, the 4 valid kernels give (us after
    # B): window [230, 580] = 350 us, busy 4 x 50 = 200 us, idle 150 us (42.86 %); latency 20 us each.
    f = _early_kernels(5_000_000).write(tmp_path / "rank0.sqlite")
    t = parse(f)
    assert t.flagged == {"before_launch": 2}
    (w,) = [w for w in t.warnings if "before the CPU call" in w]
    assert "rank0.sqlite: 2 GPU record(s)" in w and "4.98 ms" in w and "before_launch" in w
    s, _ = _store(tmp_path, f)
    r = analyze(s, "temporal").frame.row(0, named=True)
    assert (r["window_ns"], r["idle_ns"]) == (350_000, 150_000)
    assert r["idle_pct"] == pytest.approx(100 * 150 / 350)
    lat = analyze(s, "launch").frame.row(0, named=True)
    assert lat["kernels"] == 4
    assert lat["latency_p50_ns"] == lat["latency_max_ns"] == lat["latency_mean_ns"] == 20_000
    k = analyze(s, "kernels").frame.row(0, named=True)
    assert (k["flagged_kernels"], k["flagged_ns"]) == (2, 100_000)  # 2 x 50 us, counted apart


def test_kernels_a_few_us_before_their_launch_are_clock_jitter(tmp_path: Path) -> None:
    # 30 us early: each of the first two kernels starts 10 us before its launch (5 us < 10 us <= 1 ms):
    # launch_skew, kept with its work (6 kernels, 300 us busy), left out of latency (4 x 20 us).
    # 3 us early (17 us after the launch: no flag) changes nothing but the two latencies.
    jitter = parse(_early_kernels(30_000).write(tmp_path / "rank0.sqlite"))
    assert jitter.flagged == {"launch_skew": 2}
    s, _ = _store(tmp_path, tmp_path / "rank0.sqlite")
    assert analyze(s, "kernels").frame.row(0, named=True)["kernel_ns"] == 300_000
    lat = analyze(s, "launch").frame.row(0, named=True)
    assert lat["latency_p50_ns"] == lat["latency_max_ns"] == 20_000
    (tmp_path / "b").mkdir()
    assert parse(_early_kernels(3_000).write(tmp_path / "b" / "rank0.sqlite")).flagged == {}


@pytest.mark.parametrize("lost", [True, False])
def test_early_kernels_without_their_launch_far_from_the_steps_are_left_out(
    tmp_path: Path, lost: bool
) -> None:
    """kernel_before_its_launch's kind when the early records' launch calls are lost too (no runtime
    row with their correlationId): :func:`_early_kernels` with B = 20 s and the first two kernels
    written 10 s early. They lie 10 s from the step range (margin max(1 ms, 1 s) = 1 s): flagged
    far_outside. The 4 others: window [B + 230, B + 580] us = 350 us, busy 200, idle 150 (42.86 %).
    Before: window 10,000,550,000 ns, idle 100 %. With their launch rows (not ``lost``) they are
    judged against them instead: before_launch, the same numbers."""
    s = Store(tmp_path / "t.duckdb")
    res = ingest(
        s, [_early_kernels(10_000_000_000, b=20_000_000_000, lost=lost).write(tmp_path / "rank0.sqlite")]
    )
    flag = "far_outside" if lost else "before_launch"
    flags = s.sql(
        "SELECT flag, count(*) FROM events WHERE kind = 'kernel' GROUP BY flag ORDER BY flag"
    ).rows()
    assert flags == [(flag, 2), (None, 4)]
    far = "rank0.sqlite: 2 GPU record(s) without a launch call lie far outside the trace's step range"
    assert any(w.startswith(far) for w in res.warnings) == lost, res.warnings
    t = analyze(s, "temporal").frame.row(0, named=True)
    assert (t["window_ns"], t["idle_ns"], t["compute_ns"]) == (350_000, 150_000, 200_000)


def test_a_kernel_long_after_its_launch_and_past_the_rest_is_far(tmp_path: Path) -> None:
    """The nsys case of t12's leftovers: launches (5 us) at B + 10 + 100 i us (B = 10 ms, i = 0..5,
    correlationId 501 + i), each kernel 20 us after its launch and 50 us long, but the last one
    200 s after its launch (B + 530 us + 200 s), no steps. Before: kept as recorded, window [B + 30
    us, B + 580 us + 200 s] = 200 s + 550 us (t12 N3, a real export so edited: clipped to 0 ns as
    an overrun, its start kept, window 201 s). Now,
    200 s after its launch (> margin 1 s) and past the others' last start (B + 510 us) by more than
    1 s: far_outside, said; the 5 others: window [B + 30, B + 480] us = 450 us, busy 5 x 50 = 250
    us, idle 200 us."""
    e = Export()
    e.gpu(0)
    e.process(10)
    b = 10_000_000
    for i in range(6):
        start = b + 10_000 + 100_000 * i
        e.launch(10, 501 + i, start, start + 5_000)
        k = start + 20_000 + (200_000_000_000 if i == 5 else 0)
        e.kernel(10, 0, 501 + i, k, k + 50_000)
    s = Store(tmp_path / "t.duckdb")
    res = ingest(s, [e.write(tmp_path / "rank0.sqlite")])
    flags = s.sql(
        "SELECT flag, count(*) FROM events WHERE kind = 'kernel' GROUP BY flag ORDER BY flag"
    ).rows()
    assert flags == [("far_outside", 1), (None, 5)]
    said = "rank0.sqlite: 1 GPU record(s) that start long after their launch call (up to 200.000 s) lie far outside"
    assert any(w.startswith(said) for w in res.warnings), res.warnings
    t = analyze(s, "temporal").frame.row(0, named=True)
    assert (t["window_ns"], t["idle_ns"], t["compute_ns"]) == (450_000, 200_000, 250_000)
