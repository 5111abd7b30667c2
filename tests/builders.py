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

#: The base time (ns since the epoch) of the Kineto micro-traces.
BASE = BASE_NS = 1_700_000_000_000_000_000
#: The session start (ns since the epoch) of the nsys micro-exports.
EPOCH = 1_767_225_600_000_000_000


# -- Kineto ---------------------------------------------------------------------------------------

def kineto(path: Path, events: list[dict], rank: int = 0, world_size: int = 1) -> Path:
    """Write a new-style Kineto trace (ts/dur in us relative to BASE_NS) and return its path."""
    doc = {"baseTimeNanoseconds": BASE_NS, "distributedInfo": {"rank": rank, "world_size": world_size},
           "traceEvents": events}
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    return path


def kernel(name: str, stream: int, ts: float, dur: float, corr: int, cat: str = "kernel", **args) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur,
            "args": {"stream": stream, "device": 0, "correlation": corr, **args}}


def launch(ts: float, corr: int, dur: float = 1.0, tid: int = 1, name: str = "cudaLaunchKernel") -> dict:
    return {"ph": "X", "cat": "cuda_runtime", "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur,
            "args": {"correlation": corr}}


def step(n: int, ts: float, dur: float) -> dict:
    return {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "pid": 1, "tid": 1,
            "ts": ts, "dur": dur}


def op(name: str, ts: float, dur: float, dims: list | None = None, types: list | None = None,
       concrete: list | None = None, tid: int = 1, cat: str = "cpu_op") -> dict:
    """One Kineto complete event (times in us); shape args as torch's record_shapes writes them."""
    args: dict = {}
    if dims is not None:
        args["Input Dims"] = dims
        args["Input type"] = types or ["float"] * len(dims)
    if concrete is not None:
        args["Concrete Inputs"] = concrete
    return {"ph": "X", "cat": cat, "name": name, "pid": 9, "tid": tid, "ts": ts, "dur": dur, "args": args}


def write_run(folder: Path, events: list[dict], rank: int = 0, world: int = 1, devices: list | None = None) -> Path:
    """A one-rank Kineto trace in ``folder`` (baseTimeNanoseconds 0)."""
    folder.mkdir(parents=True, exist_ok=True)
    doc = {"baseTimeNanoseconds": 0, "distributedInfo": {"rank": rank, "world_size": world, "backend": "gloo"},
           "traceEvents": events}
    if devices:
        doc["deviceProperties"] = devices
    (folder / f"rank{rank}.json").write_text(json.dumps(doc))
    return folder


#: write_rank moves every event this many us later and the base time as much earlier: absolute times
#: are unchanged (BASE + ts), but no record sits at ts 0, which counts as another clock domain.
SHIFT_US = 1000


def write_rank(path: Path, events: list[dict], rank: int, world: int = 2, backend: str = "gloo") -> Path:
    """Write a new-style Kineto trace whose event at ``ts`` us is at BASE + ts * 1000 ns."""
    events = [{**e, "ts": e["ts"] + SHIFT_US} if "ts" in e else e for e in events]
    doc = {"baseTimeNanoseconds": BASE - SHIFT_US * 1000,
           "distributedInfo": {"rank": rank, "world_size": world, "backend": backend}, "traceEvents": events}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return path


def micro_trace(names: list[str], rank: int = 0, world: int = 1, base_ns: int = 1_700_000_000_000_000_000) -> dict:
    """A new-style Kineto trace: one ProfilerStep (100 us) holding one 1-us cpu_op per name."""
    events = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 100}]
    events += [{"ph": "X", "cat": "cpu_op", "name": n, "pid": 1, "tid": 1, "ts": 1 + i, "dur": 1}
               for i, n in enumerate(names)]
    return {"baseTimeNanoseconds": base_ns, "distributedInfo": {"rank": rank, "world_size": world, "backend": "gloo"},
            "traceEvents": events}


def gloo_rank(enqueues: list[tuple[float, float, float, int]], step: int = 3, t0: float = 0) -> list[dict]:
    """One ProfilerStep#step over [t0, t0 + 1000] us on the training thread (tid 1); per collective a
    c10d::allreduce_ enqueue (5 us) and its gloo:all_reduce work on a runloop thread (tid 2):
    (enqueue ts, work start, work end, elements)."""
    ev = [{"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": 1, "tid": 1, "ts": t0,
           "dur": 1000}]
    for enq, start, end, n in enqueues:
        ev.append({"ph": "X", "cat": "cpu_op", "name": "c10d::allreduce_", "pid": 1, "tid": 1, "ts": enq, "dur": 5,
                   "args": {"Input Dims": [[[n]], []], "Input type": ["TensorList", ""]}})
        ev.append({"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "pid": 1, "tid": 2, "ts": start,
                   "dur": end - start, "args": {"Input Dims": [[n]], "Input type": ["float"]}})
    return ev


def cause_run(folder: Path, relu_us: float, gelu_us: float) -> Path:
    """One rank, ProfilerStep#1 [0, 100 us], #2 [100, 200 us]; per step: aten::mm 10 us,
    aten::relu ``relu_us``, aten::gelu ``gelu_us`` (the same in both steps)."""
    ev = []
    for s in (0, 100):
        ev += [op(f"ProfilerStep#{1 + s // 100}", s, 100, cat="user_annotation"),
               op("aten::mm", s + 5, 10, [[4, 4], [4, 4]]), op("aten::relu", s + 20, relu_us, [[4, 4]]),
               op("aten::gelu", s + 60, gelu_us, [[4, 4]])]
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
        self.rows["META_DATA_EXPORT"] += [("EXPORT_SCHEMA_VERSION", "3.22.0"), ("EXPORT_PRODUCT_VERSION", "2025.6.1")]

    def string(self, s: str) -> int:
        if s not in self.ids:
            self.ids[s] = len(self.ids) + 1
            self.rows["StringIds"].append((self.ids[s], s))
        return self.ids[s]

    def gpu(self, dev: int) -> None:
        self.rows["TARGET_INFO_GPU"].append((0, dev, "NVIDIA H100 80GB HBM3", f"0000:{dev:02d}:00.0", 85 << 30, 132, 9, 0))

    def process(self, pid: int, name: str = "python") -> None:
        self.rows["PROCESSES"].append((pid << 24, pid, name))

    def launch(self, pid: int, corr: int, start: int, end: int, name: str = "cudaLaunchKernel_v7000") -> None:
        self.rows["CUPTI_ACTIVITY_KIND_RUNTIME"].append(
            (start, end, 1, (pid << 24) | pid, corr, self.string(name), 0, None))

    def kernel(self, pid: int, dev: int, corr: int, start: int, end: int, name: str = "void gemm_kernel<float>()",
               stream: int = 7, node: int | None = None) -> None:
        sid = self.string(name)
        self.rows["CUPTI_ACTIVITY_KIND_KERNEL"].append(
            (start, end, dev, 1, None, stream, corr, pid << 24, sid, sid, 64, 108, 1, 1, 256, 1, 1, 0, 0, corr, node))

    def graph(self, pid: int, dev: int, corr: int, start: int, end: int, graph_id: int = 1, stream: int = 7) -> None:
        self.rows["CUPTI_ACTIVITY_KIND_GRAPH_TRACE"].append(
            (start, end, dev, 1, None, stream, corr, pid << 24, graph_id, graph_id))

    def nvtx(self, pid: int, start: int, end: int | None, text: str, etype: int = 59) -> None:
        self.rows["NVTX_EVENTS"].append((start, end, etype, None, None, None, text, (pid << 24) | pid, None, None, 0))

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
