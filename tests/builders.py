"""Micro-traces for the tests, built in the test and worked out by hand there: the one place
every test file takes them from.

- Kineto JSON: :func:`kineto` (one rank, gzip), :func:`write_rank` (a rank of a multi-rank run,
  its events shifted off ts 0), :func:`write_run` (a one-rank run folder at base time 0),
  :func:`micro_trace` (a document of one step of named ops); events :func:`step`, :func:`op`
  (with shapes), :func:`kernel`, :func:`launch`; ranks of worked cases: :func:`gloo_rank` (a
  CPU rank's all-reduces, enqueue and gloo work), :func:`cause_run` (a rank of three ops per step).
- Nsight Systems: :class:`Export`, an SQLite export built row by row.

Times are us in Kineto events (as torch writes them) and ns in nsys rows.
"""

from __future__ import annotations

import gzip
import json
import random
import sqlite3
from pathlib import Path

import polars as pl

#: The base time (ns since the epoch) of the Kineto micro-traces.
BASE = BASE_NS = 1_700_000_000_000_000_000
#: The session start (ns since the epoch) of the nsys micro-exports.
EPOCH = 1_767_225_600_000_000_000


# -- Kineto ---------------------------------------------------------------------------------------


def kineto(path: Path, events: list[dict], rank: int = 0, world_size: int = 1) -> Path:
    """Write a new-style Kineto trace (ts/dur in us relative to BASE_NS) and return its path."""
    doc = {
        "baseTimeNanoseconds": BASE_NS,
        "distributedInfo": {"rank": rank, "world_size": world_size},
        "traceEvents": events,
    }
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    return path


def kernel(name: str, stream: int, ts: float, dur: float, corr: int, cat: str = "kernel", **args) -> dict:
    return {
        "ph": "X",
        "cat": cat,
        "name": name,
        "pid": 0,
        "tid": stream,
        "ts": ts,
        "dur": dur,
        "args": {"stream": stream, "device": 0, "correlation": corr, **args},
    }


def collective_args(
    op: str = "allreduce",
    seq: int | None = None,
    pg: str | None = "0",
    ranks: list[int] | None = None,
    nelems: int | None = None,
    out_nelems: int | None = None,
    dtype: str | None = "Float",
    group_size: int | None = None,
    **more: object,
) -> dict:
    """The args torch writes for a collective on its record_param_comms op and its NCCL kernel (the
    ones ingest reads): "Collective name" ``op`` (as torch names it: ``allreduce``,
    ``_allgather_base``), "Process Group Name" ``pg``, "Process Group Ranks" (``ranks`` as JSON
    text, ``"[0, 1]"``), "Seq", "In msg nelems", "Out msg nelems", "dtype", "Group size"; a key
    whose value is None is left out. ``more``: other keys (``"In split size"``), as given."""
    args = {
        "Collective name": op,
        "Process Group Name": pg,
        "Process Group Ranks": None if ranks is None else json.dumps(ranks),
        "Seq": seq,
        "In msg nelems": nelems,
        "Out msg nelems": out_nelems,
        "dtype": dtype,
        "Group size": group_size,
    }
    return {k: v for k, v in args.items() if v is not None} | more


def launch(ts: float, corr: int, dur: float = 1.0, tid: int = 1, name: str = "cudaLaunchKernel") -> dict:
    return {
        "ph": "X",
        "cat": "cuda_runtime",
        "name": name,
        "pid": 1,
        "tid": tid,
        "ts": ts,
        "dur": dur,
        "args": {"correlation": corr},
    }


def step(n: int, ts: float, dur: float) -> dict:
    return {
        "ph": "X",
        "cat": "user_annotation",
        "name": f"ProfilerStep#{n}",
        "pid": 1,
        "tid": 1,
        "ts": ts,
        "dur": dur,
    }


def op(
    name: str,
    ts: float,
    dur: float,
    dims: list | None = None,
    types: list | None = None,
    concrete: list | None = None,
    tid: int = 1,
    cat: str = "cpu_op",
) -> dict:
    """One Kineto complete event (times in us); shape args as torch's record_shapes writes them."""
    args: dict = {}
    if dims is not None:
        args["Input Dims"] = dims
        args["Input type"] = types or ["float"] * len(dims)
    if concrete is not None:
        args["Concrete Inputs"] = concrete
    return {"ph": "X", "cat": cat, "name": name, "pid": 9, "tid": tid, "ts": ts, "dur": dur, "args": args}


def write_run(
    folder: Path, events: list[dict], rank: int = 0, world: int = 1, devices: list | None = None
) -> Path:
    """A one-rank Kineto trace in ``folder`` (baseTimeNanoseconds 0)."""
    folder.mkdir(parents=True, exist_ok=True)
    doc = {
        "baseTimeNanoseconds": 0,
        "distributedInfo": {"rank": rank, "world_size": world, "backend": "gloo"},
        "traceEvents": events,
    }
    if devices:
        doc["deviceProperties"] = devices
    (folder / f"rank{rank}.json").write_text(json.dumps(doc))
    return folder


#: write_rank moves every event this many us later and the base time as much earlier: absolute times
#: are unchanged (BASE + ts), but no record sits at ts 0, which counts as another clock domain.
SHIFT_US = 1000


def write_rank(
    path: Path, events: list[dict], rank: int, world: int = 2, backend: str = "gloo", host: str | None = None
) -> Path:
    """Write a new-style Kineto trace whose event at ``ts`` us is at BASE + ts * 1000 ns (``host_name``
    ``host`` when given)."""
    events = [{**e, "ts": e["ts"] + SHIFT_US} if "ts" in e else e for e in events]
    doc: dict = {
        "baseTimeNanoseconds": BASE - SHIFT_US * 1000,
        "distributedInfo": {"rank": rank, "world_size": world, "backend": backend},
        "traceEvents": events,
    }
    if host is not None:
        doc["host_name"] = host
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return path


def two_host_tp_run(folder: Path, spans: dict[int, list[tuple[float, float]]]) -> Path:
    """Write 4 NCCL ranks on two hosts: tensor-parallel groups "1" = [0, 1] (node-0) and "2" = [2, 3]
    (node-1, 3000 us ahead), steps 1 and 2 at 0 and 1000 us (+3000 on node-1); rank r's i-th span
    (start, end) in ``spans[r]`` (us, before the host's lead) is an all_reduce kernel of Seq i + 1,
    launched 8 us before it. Returns ``folder``."""
    ar = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
    for r in range(4):
        ahead = 3000 if r >= 2 else 0
        events = [step(1, ahead, 1000), step(2, ahead + 1000, 1000)]
        for i, (a, b) in enumerate(spans[r]):
            args = collective_args("allreduce", i + 1, pg=str(1 + r // 2), ranks=[r // 2 * 2, r // 2 * 2 + 1])
            events.append(launch(ahead + a - 8, 70 + i))
            events.append(kernel(ar, 20, ahead + a, b - a, 70 + i, **args))
        write_rank(folder / f"r{r}.json", events, r, world=4, backend="nccl", host=f"node-{r // 2}")
    return folder


def micro_trace(
    names: list[str], rank: int = 0, world: int = 1, base_ns: int = 1_700_000_000_000_000_000
) -> dict:
    """A new-style Kineto trace: one ProfilerStep (100 us) holding one 1-us cpu_op per name."""
    events = [
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "ProfilerStep#1",
            "pid": 1,
            "tid": 1,
            "ts": 0,
            "dur": 100,
        }
    ]
    events += [
        {"ph": "X", "cat": "cpu_op", "name": n, "pid": 1, "tid": 1, "ts": 1 + i, "dur": 1}
        for i, n in enumerate(names)
    ]
    return {
        "baseTimeNanoseconds": base_ns,
        "distributedInfo": {"rank": rank, "world_size": world, "backend": "gloo"},
        "traceEvents": events,
    }


def gloo_rank(enqueues: list[tuple[float, float, float, int]], step: int = 3, t0: float = 0) -> list[dict]:
    """One ProfilerStep#step over [t0, t0 + 1000] us on the training thread (tid 1); per collective a
    c10d::allreduce_ enqueue (5 us) and its gloo:all_reduce work on a runloop thread (tid 2):
    (enqueue ts, work start, work end, elements)."""
    ev = [
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": f"ProfilerStep#{step}",
            "pid": 1,
            "tid": 1,
            "ts": t0,
            "dur": 1000,
        }
    ]
    for enq, start, end, n in enqueues:
        ev.append(
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": "c10d::allreduce_",
                "pid": 1,
                "tid": 1,
                "ts": enq,
                "dur": 5,
                "args": {"Input Dims": [[[n]], []], "Input type": ["TensorList", ""]},
            }
        )
        ev.append(
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": "gloo:all_reduce",
                "pid": 1,
                "tid": 2,
                "ts": start,
                "dur": end - start,
                "args": {"Input Dims": [[n]], "Input type": ["float"]},
            }
        )
    return ev


def cause_run(folder: Path, relu_us: float, gelu_us: float) -> Path:
    """One rank, ProfilerStep#1 [0, 100 us], #2 [100, 200 us]; per step: aten::mm 10 us,
    aten::relu ``relu_us``, aten::gelu ``gelu_us`` (the same in both steps)."""
    ev = []
    for s in (0, 100):
        ev += [
            op(f"ProfilerStep#{1 + s // 100}", s, 100, cat="user_annotation"),
            op("aten::mm", s + 5, 10, [[4, 4], [4, 4]]),
            op("aten::relu", s + 20, relu_us, [[4, 4]]),
            op("aten::gelu", s + 60, gelu_us, [[4, 4]]),
        ]
    return write_run(folder, ev)


# -- Nsight Systems -------------------------------------------------------------------------------

# nsys's table and column names (the columns traceprof reads, plus a few it does not).
_DDL = {
    "StringIds": "id INTEGER NOT NULL PRIMARY KEY, value TEXT NOT NULL",
    "TARGET_INFO_SESSION_START_TIME": "utcEpochNs INTEGER, utcTime TEXT, localTime TEXT",
    "META_DATA_EXPORT": "name TEXT, value TEXT",
    "META_DATA_CAPTURE": "name TEXT NOT NULL, value TEXT",
    "TARGET_INFO_SYSTEM_ENV": "globalVid INTEGER, devStateName TEXT NOT NULL, name TEXT NOT NULL, "
    "nameEnum INTEGER NOT NULL, value TEXT NOT NULL",
    "TARGET_INFO_GPU": "vmId INTEGER NOT NULL, id INTEGER NOT NULL, name TEXT, busLocation TEXT, totalMemory INTEGER, "
    "smCount INTEGER, computeMajor INTEGER, computeMinor INTEGER",
    "PROCESSES": "globalPid INTEGER, pid INTEGER, name TEXT",
    "CUPTI_ACTIVITY_KIND_KERNEL": "start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL, "
    "contextId INTEGER NOT NULL, greenContextId INTEGER, streamId INTEGER NOT NULL, "
    "correlationId INTEGER, globalPid INTEGER, demangledName INTEGER NOT NULL, "
    "shortName INTEGER NOT NULL, registersPerThread INTEGER NOT NULL, "
    "gridX INTEGER NOT NULL, gridY INTEGER NOT NULL, gridZ INTEGER NOT NULL, "
    "blockX INTEGER NOT NULL, blockY INTEGER NOT NULL, blockZ INTEGER NOT NULL, "
    "staticSharedMemory INTEGER NOT NULL, dynamicSharedMemory INTEGER NOT NULL, "
    "gridId INTEGER NOT NULL, graphNodeId INTEGER",
    "CUPTI_ACTIVITY_KIND_RUNTIME": "start INTEGER NOT NULL, end INTEGER NOT NULL, eventClass INTEGER NOT NULL, "
    "globalTid INTEGER, correlationId INTEGER, nameId INTEGER NOT NULL, "
    "returnValue INTEGER NOT NULL, callchainId INTEGER",
    "CUPTI_ACTIVITY_KIND_GRAPH_TRACE": "start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL, "
    "contextId INTEGER NOT NULL, greenContextId INTEGER, streamId INTEGER NOT NULL, "
    "correlationId INTEGER, globalPid INTEGER, graphId INTEGER NOT NULL, "
    "graphExecId INTEGER NOT NULL",
    "NVTX_EVENTS": "start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL, rangeId INTEGER, category INTEGER, "
    "color INTEGER, text TEXT, globalTid INTEGER, endGlobalTid INTEGER, textId INTEGER, domainId INTEGER",
}


class Export:
    """An nsys SQLite export built row by row; :meth:`write` writes it (rows in any order)."""

    def __init__(self, epoch: int | None = EPOCH) -> None:
        self.rows: dict[str, list[tuple]] = {t: [] for t in _DDL}
        self.ids: dict[str, int] = {}
        if epoch is not None:
            self.rows["TARGET_INFO_SESSION_START_TIME"].append((epoch, "2026-01-01T00:00:00.000Z", None))
        self.rows["META_DATA_EXPORT"] += [
            ("EXPORT_SCHEMA_VERSION", "3.22.0"),
            ("EXPORT_PRODUCT_VERSION", "2025.6.1"),
        ]

    def string(self, s: str) -> int:
        if s not in self.ids:
            self.ids[s] = len(self.ids) + 1
            self.rows["StringIds"].append((self.ids[s], s))
        return self.ids[s]

    def gpu(self, dev: int) -> None:
        self.rows["TARGET_INFO_GPU"].append(
            (0, dev, "NVIDIA H100 80GB HBM3", f"0000:{dev:02d}:00.0", 85 << 30, 132, 9, 0)
        )

    def process(self, pid: int, name: str = "python") -> None:
        self.rows["PROCESSES"].append((pid << 24, pid, name))

    def launch(self, pid: int, corr: int, start: int, end: int, name: str = "cudaLaunchKernel_v7000") -> None:
        self.rows["CUPTI_ACTIVITY_KIND_RUNTIME"].append(
            (start, end, 1, (pid << 24) | pid, corr, self.string(name), 0, None)
        )

    def kernel(
        self,
        pid: int,
        dev: int,
        corr: int,
        start: int,
        end: int,
        name: str = "void gemm_kernel<float>()",
        stream: int = 7,
        node: int | None = None,
    ) -> None:
        sid = self.string(name)
        self.rows["CUPTI_ACTIVITY_KIND_KERNEL"].append(
            (
                start,
                end,
                dev,
                1,
                None,
                stream,
                corr,
                pid << 24,
                sid,
                sid,
                64,
                108,
                1,
                1,
                256,
                1,
                1,
                0,
                0,
                corr,
                node,
            )
        )

    def graph(
        self, pid: int, dev: int, corr: int, start: int, end: int, graph_id: int = 1, stream: int = 7
    ) -> None:
        self.rows["CUPTI_ACTIVITY_KIND_GRAPH_TRACE"].append(
            (start, end, dev, 1, None, stream, corr, pid << 24, graph_id, graph_id)
        )

    def nvtx(self, pid: int, start: int, end: int | None, text: str, etype: int = 59) -> None:
        self.rows["NVTX_EVENTS"].append(
            (start, end, etype, None, None, None, text, (pid << 24) | pid, None, None, 0)
        )

    def capture(self, name: str, value: str) -> None:
        self.rows["META_DATA_CAPTURE"].append((name, value))

    def write(self, path: Path, shuffle: int | None = None, drop: tuple[str, ...] = ()) -> Path:
        """Write the export; ``shuffle``: seed of a random row order in every table; ``drop``: tables left out."""
        con = sqlite3.connect(path)
        for table, ddl in _DDL.items():
            if table in drop:
                continue
            con.execute(f"CREATE TABLE {table} ({ddl})")
            rows = list(self.rows[table])
            if shuffle is not None:
                random.Random(shuffle).shuffle(rows)
            if rows:
                con.executemany(f"INSERT INTO {table} VALUES ({', '.join('?' * len(rows[0]))})", rows)
        con.commit()
        con.close()
        return path


# -- Kineto memory records (profile_memory=True) -------------------------------------------------


def mem(
    ts: float,
    dev: int,
    addr: int,
    nbytes: int | None,
    alloc: int | None,
    reserved: int | None,
    tid: int = 1,
    dtype: int = 1,
    **extra: object,
) -> dict:
    """A Kineto [memory] instant (ts in us); None leaves the field out."""
    args = {
        "Device Type": dtype,
        "Device Id": dev,
        "Addr": addr,
        "Bytes": nbytes,
        "Total Allocated": alloc,
        "Total Reserved": reserved,
        **extra,
    }
    return {
        "ph": "i",
        "cat": "cpu_instant_event",
        "s": "t",
        "name": "[memory]",
        "pid": 1,
        "tid": tid,
        "ts": ts,
        "args": {k: v for k, v in args.items() if v is not None},
    }


def memory_op(name: str, ts: float, dur: float, tid: int = 1) -> dict:
    """A cpu_op on pid 1 without args (times in us)."""
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur}


def memory_trace(
    path: Path, events: list[dict], devices: dict[int, int] | None = None, rank: int = 0, world_size: int = 1
) -> Path:
    """A Kineto trace with ``deviceProperties`` (device -> totalGlobalMem) when given; its folder's
    name is in ``traceName`` (two runs of equal events are two files, not one stored once)."""
    kineto(path, events, rank=rank, world_size=world_size)
    doc = json.loads(gzip.decompress(path.read_bytes()))
    doc["traceName"] = path.parent.name
    if devices:
        doc["deviceProperties"] = [
            {"id": d, "name": "Test GPU", "totalGlobalMem": m, "numSms": 1} for d, m in devices.items()
        ]
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    return path


def memory_gate_run(d: Path, extra: int = 0, jitter: int = 0) -> Path:
    """Two steps of one rank; each step allocates 4,096 at 0x30 in aten::linear (t = +20 us) over 512
    held from step 1 on, and frees it; ``extra`` bytes more in aten::cat inside aten::linear (t = +25 us,
    freed at +30), ``jitter`` bytes more in step 2's allocation."""
    d.mkdir()
    ev: list[dict] = [mem(5, 0, 0x10, 512, 512, 1 << 20)]
    for n, base in ((1, 0), (2, 100)):
        big = 4096 + (jitter if n == 2 else 0)
        ev += [
            step(n, base, 100),
            memory_op("aten::linear", base + 10, 30),
            memory_op("aten::mm", base + 40, 10),
            mem(base + 20, 0, 0x30, big, 512 + big, 1 << 20),
        ]
        if extra:
            ev += [
                memory_op("aten::cat", base + 24, 2),
                mem(base + 25, 0, 0x40, extra, 512 + big + extra, 1 << 20),
                mem(base + 30, 0, 0x40, -extra, 512 + big, 1 << 20),
            ]
        ev.append(mem(base + 35, 0, 0x30, -big, 512, 1 << 20))
    return memory_trace(d / "rank0.json.gz", ev, {0: 1 << 30})


# -- worked multi-rank runs --------------------------------------------------------------------


def _skewed_rank(a_ms: int, gloo_ms: tuple[int, int], b_ms: int) -> list[dict]:
    """Step 1: aten::A for ``a_ms``, the all-reduce enqueued at its end, gloo work over
    ``gloo_ms``, then aten::B for ``b_ms`` (none when 0) from the work's end."""
    us = 1000
    ev = [
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "ProfilerStep#1",
            "pid": 1,
            "tid": 1,
            "ts": 0,
            "dur": 40 * us,
        },
        {"ph": "X", "cat": "cpu_op", "name": "aten::A", "pid": 1, "tid": 1, "ts": 0, "dur": a_ms * us},
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": "c10d::allreduce_",
            "pid": 1,
            "tid": 1,
            "ts": a_ms * us,
            "dur": 0,
            "args": {"Input Dims": [[[256]], []]},
        },
    ]
    ev.append(
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "gloo:all_reduce",
            "pid": 1,
            "tid": 2,
            "ts": gloo_ms[0] * us,
            "dur": (gloo_ms[1] - gloo_ms[0]) * us,
            "args": {"Input Dims": [[256]], "Input type": ["float"]},
        }
    )
    if b_ms:
        ev.append(
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": "aten::B",
                "pid": 1,
                "tid": 1,
                "ts": gloo_ms[1] * us,
                "dur": b_ms * us,
            }
        )
    return ev


def write_skewed_pair(folder, world: int = 2) -> None:
    """Two ranks whose clocks disagree (ingest with ``align=False``): rank 0 arrives at 10 ms and
    its copy of the all-reduce ends at 12 ms, before rank 1 arrives at 30 ms (ends 32 ms)."""
    write_rank(folder / "r0.json", _skewed_rank(10, (11, 12), 40), 0, world=world)
    write_rank(folder / "r1.json", _skewed_rank(30, (31, 32), 0), 1, world=world)


def transient_rank(rank: int, late: bool = True) -> list[dict]:
    """Two gloo ranks, 4 steps. Rank 1's profiler starts 3 s late (``late``): rank 0's step 1 is
    [0, 3010] ms, rank 1's [3000, 3010]; each computes (aten::mm) 5 ms from its step start and
    enqueues its all-reduce (rank 0 at 5 ms, rank 1 at 3005 ms), and rank 0's gloo work spins from
    5 ms until rank 1 arrives: [5, 3005.5] ms (rank 1's [3005, 3005.5]). Steps 2-4 start at S =
    3010, 3020, 3030 ms on both: aten::mm [S, S+5], arrivals S+5 (rank 0) and S+5.1 (rank 1), gloo
    work [S+5, S+5.6] (rank 0) and [S+5.1, S+5.6] (rank 1). Without ``late`` step 1 is like the
    others, from 3000 ms on both ranks."""

    def op(name: str, cat: str, tid: int, a: float, b: float, **args: object) -> dict:
        return {
            "ph": "X",
            "cat": cat,
            "name": name,
            "pid": 1,
            "tid": tid,
            "ts": round(a * 1000, 3),
            "dur": round((b - a) * 1000, 3),
            "args": args,
        }

    ev = []
    for k, s in enumerate([0 if rank == 0 and late else 3000, 3010, 3020, 3030]):
        arr = s + 5 + (0.1 if rank == 1 and (k or not late) else 0)
        ev.append(op(f"ProfilerStep#{k + 1}", "user_annotation", 1, s, 3010 + 10 * k))
        ev.append(op("aten::mm", "cpu_op", 1, s, s + 5))
        ev.append(op("c10d::allreduce_", "cpu_op", 1, arr, arr + 0.001, **{"Input Dims": [[[64]], []]}))
        work_end = 3005.5 if k == 0 and late else s + 5.6
        ev.append(
            op(
                "gloo:all_reduce",
                "user_annotation",
                2,
                arr,
                work_end,
                **{"Input Dims": [[64]], "Input type": ["float"]},
            )
        )
    return ev


# -- one GPU rank: the critical path's step ----------------------------------------------------


def pid1_op(name: str, ts: float, dur: float, tid: int = 1, cat: str = "cpu_op", **args: object) -> dict:
    """One Kineto complete event on pid 1 (times in us), its args as given."""
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": args}


def stream_kernel(
    name: str, ts: float, dur: float, corr: int, stream: int = 7, cat: str = "kernel", **args: object
) -> dict:
    """A kernel on ``stream`` of device 0 (times in us), linked to its launch by ``corr``."""
    return {
        "ph": "X",
        "cat": cat,
        "name": name,
        "pid": 0,
        "tid": stream,
        "ts": ts,
        "dur": dur,
        "args": {"device": 0, "stream": stream, "correlation": corr, **args},
    }


def runtime_launch(ts: float, corr: int, name: str = "cudaLaunchKernel") -> dict:
    """A 1-us CUDA runtime call on thread 1 (times in us)."""
    return {
        "ph": "X",
        "cat": "cuda_runtime",
        "name": name,
        "pid": 1,
        "tid": 1,
        "ts": ts,
        "dur": 1,
        "args": {"correlation": corr},
    }


# One GPU rank, ProfilerStep#1 [0, 200) us on the CPU. Stream 7 (kernel [start, end), launch at L):
#   K1 [10, 30) L=5; memcpy [30, 40) L=8; K2 [60, 80) L=55; K3 [90, 100) L=20;
#   a CUDA graph launched at 102 runs G1 [110, 120) and G2 [125, 135) (one correlation);
#   stream 9: memset [130, 150) L=104.
# Window: from the step start 0 (before its first kernel) to its last device end 150.
#   compute: K1 20 + K2 20 + K3 10 + G1 10 + G2 10 = 70;
#   memory: memcpy 10 + memset [135, 150) 15 (compute G2 takes [130, 135)) = 25;
#   gaps: [0, 10) K1 launched at 5 > 0: host_bound 10; [40, 60) K2 launched at 55 > 40: host_bound
#   20; [80, 90) K3 launched at 20, before the gap: idle 10; [100, 110) the graph launched at 102 >
#   100: host_bound 10; [120, 125) G2, launched with the graph at 102 < 120: idle 5.
#   host_bound 40, idle 15; 70 + 25 + 40 + 15 = 150.
GPU_STEP = [
    pid1_op("ProfilerStep#1", 0, 200, cat="user_annotation"),
    runtime_launch(5, 1),
    stream_kernel("K1", 10, 20, 1),
    runtime_launch(8, 2, "cudaMemcpyAsync"),
    stream_kernel("Memcpy HtoD (Pageable -> Device)", 30, 10, 2, cat="gpu_memcpy"),
    runtime_launch(55, 3),
    stream_kernel("K2", 60, 20, 3),
    runtime_launch(20, 4),
    stream_kernel("K3", 90, 10, 4),
    runtime_launch(102, 5, "cudaGraphLaunch"),
    stream_kernel("G1", 110, 10, 5),
    stream_kernel("G2", 125, 10, 5),
    runtime_launch(104, 6, "cudaMemsetAsync"),
    stream_kernel("Memset (Device)", 130, 20, 6, stream=9, cat="gpu_memset"),
]


# -- NDTimeline ---------------------------------------------------------------------------------


def write_ndtimeline(folder: Path, rows: list[dict], trial: str, dp: int, pp: int) -> Path:
    """``rows`` (NDTimeline's columns) as ``folder/trace-<trial>.parquet`` with its column types, and
    its ``meta-<trial>.yaml`` (dp x pp workers, tp 1)."""
    df = pl.DataFrame(rows).with_columns(
        pl.col("dp_rank", "stage", "mc").cast(pl.Int8),
        pl.col("rank", "gmc").cast(pl.Int16),
        pl.col("mb_id").cast(pl.Int8),
        pl.col("start_ts", "duration").cast(pl.Float32),
        pl.col("seq_id").cast(pl.Int32),
        pl.col("optype").cast(pl.Categorical),
    )
    folder.mkdir(parents=True, exist_ok=True)
    df.write_parquet(folder / f"trace-{trial}.parquet")
    (folder / f"meta-{trial}.yaml").write_text(
        f"trial_name: {trial}\ndp_size: {dp}\npp_size: {pp}\ntp_size: 1\nworld_size: {dp * pp}\n"
    )
    return folder / f"trace-{trial}.parquet"


def long_steps_run(folder: Path) -> Path:
    """One GPU rank of 250 ProfilerSteps, step k lasting 1,000 + k us (a GEMM filling it from 10 us
    in), but step 3: 5,000 us, the slowest."""
    ev, t = [], 0.0
    for k in range(250):
        dur = 5000.0 if k == 3 else 1000.0 + k
        ev += [
            step(k, t, dur),
            launch(t + 2, k + 1),
            kernel("volta_sgemm_128x64_nn", 7, t + 10, dur - 10, k + 1),
        ]
        t += dur
    folder.mkdir()
    kineto(folder / "rank0.json.gz", ev)
    return folder


def two_gpu_ranks(folder: Path, n_ranks: int = 2, steps: int = 3) -> Path:
    """``n_ranks`` NCCL ranks, each one process driving GPUs 0 and 1 (a model split over two devices,
    data parallel across the ranks). Step s (s = 0..steps-1, b = 1000 s us) is ProfilerStep#s+1 over
    [b, b + 900] us and holds, launched 5 us before each kernel start: a GEMM on device 0 stream 7
    [b + 10, b + 410], a GEMM on device 1 stream 7 [b + 210, b + 610] and an all-reduce (pg "0" of
    every rank, Seq s) on device 0 stream 20 [b + 450, b + 550], while device 0 computes nothing and
    device 1 does."""
    folder.mkdir(parents=True, exist_ok=True)
    ranks = list(range(n_ranks))
    ar_name = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
    for r in ranks:
        ev: list[dict] = []
        for s in range(steps):
            b, c = 1000.0 * s, 10 * s
            ar = collective_args(seq=s, ranks=ranks, nelems=1 << 20, out_nelems=1 << 20, group_size=n_ranks)
            ev += [
                step(s + 1, b, 900),
                launch(b + 5, c + 1),
                stream_kernel("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", b + 10, 400, c + 1),
                launch(b + 205, c + 2),
                {**stream_kernel("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", b + 210, 400, c + 2, device=1), "pid": 1},
                {**launch(b + 445, c + 3), "args": {"correlation": c + 3, **ar}},
                stream_kernel(ar_name, b + 450, 100, c + 3, stream=20, **ar),
            ]  # fmt: skip
        write_rank(folder / f"rank{r}.json", ev, r, world=n_ranks, backend="nccl")
    return folder
