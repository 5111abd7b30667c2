"""Parse an Nsight Systems SQLite export (``nsys export --type sqlite``) into normalized rows.

The same ``events`` / ``steps`` / ``devices`` / ``collectives`` rows the Kineto collector writes, so
every analysis that runs on a Kineto run runs on an nsys run. Read with Python's ``sqlite3``
(read-only); exports from schema 2.x (Nsight Systems 2022) to 3.x (2024+) are read, tables that a
capture did not record are simply absent.

Algorithm:
  1. Epoch: nsys times are ns since the capture start; epoch ns = ``TARGET_INFO_SESSION_START_TIME
     .utcEpochNs`` + time (integers throughout).
  2. GPU rows: ``CUPTI_ACTIVITY_KIND_KERNEL`` (name = ``demangledName`` via ``StringIds``, as Kineto
     names kernels; lane = (``deviceId``, ``streamId``)), ``..._MEMCPY`` (named like Kineto:
     ``Memcpy HtoD (Pageable -> Device)``), ``..._MEMSET`` (``Memset (Device)``), classed by
     ``traceprof.classify.gpu_class``; ``..._SYNCHRONIZATION`` as ``sync``. CUDA-graph kernels carry
     the correlation id of their ``cudaGraphLaunch`` (and a ``graphNodeId``), so they link to it.
  3. CPU rows: ``CUPTI_ACTIVITY_KIND_RUNTIME`` (and ``..._DRIVER`` when present) as ``cuda_runtime``
     / ``cuda_driver`` with ``correlation`` = ``correlationId``, the key that links a kernel to its
     launch; the ``_v7000``-style version suffix is dropped from the name (kept in args). pid/tid
     are decoded from ``globalTid`` (bits 24-47: pid, 0-23: tid).
  4. NVTX (``NVTX_EVENTS``): push/pop and start/end ranges are ``user_annotation`` (name = ``text``
     or ``textId`` -> ``StringIds``; domain in args); a range whose ``end`` is NULL (never closed:
     the capture stopped inside it) and marks are ``instant`` (dur 0); the unclosed ones get
     ``events.flag`` = ``unmatched_begin`` (counted in ``traces.flagged``), not an error; domain and thread-name records are metadata (skipped).
     Ranges named like steps (``ProfilerStep#N``, ``step N``, ``iteration_N``, ``train_step:N``...)
     are ``step`` events.
  5. Steps: a CPU row gets the step whose range holds its start; a GPU row the step of its launch
     (same correlation), else its own start. One ``steps`` row per step range, with the first and
     last GPU activity launched in it.
  6. Devices from ``TARGET_INFO_GPU`` (``id`` is the kernels' ``deviceId``).
  7. Rank: the recorded environment (``RANK``, else ``OMPI_COMM_WORLD_RANK``, ``PMI_RANK``,
     ``SLURM_PROCID``, ``PMIX_RANK`` in ``META_DATA_CAPTURE`` / ``TARGET_INFO_SYSTEM_ENV`` values),
     else the thread name nsys's MPI tracing records (NVTX ``MPI Rank N``), else the file name as ``nsys profile -o name_%q{RANK}`` writes it (``rank3``, ``..._3``,
     ``....3``); world size from ``WORLD_SIZE`` / ``OMPI_COMM_WORLD_SIZE`` / ``SLURM_NTASKS``.
  8. Collectives: one ``nccl_kernel`` row per communication kernel (class ``comm``), op from the
     kernel name, enter = start of its launch call; no process group or sequence number (matched
     by order across ranks).

Source fields read: ``TARGET_INFO_SESSION_START_TIME.utcEpochNs``, ``StringIds``, the kernel /
memcpy / memset / sync / runtime / driver tables (start, end, deviceId, streamId, correlationId,
globalPid / globalTid, names, grid/block, registers, shared memory, bytes, copyKind, srcKind,
dstKind, memKind, syncType, graphNodeId), ``ENUM_CUDA_MEMCPY_OPER``, ``ENUM_CUDA_MEM_KIND``,
``NVTX_EVENTS`` (start, end, eventType, text, textId, globalTid, domainId, category, payloads),
``TARGET_INFO_GPU``, ``TARGET_INFO_SYSTEM_ENV``, ``META_DATA_CAPTURE``, ``META_DATA_EXPORT`` /
``EXPORT_META_DATA``, ``PROCESSES``.
"""

from __future__ import annotations

import hashlib
import re
import sqlite3
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa

from collectors._arrow import row_schema
from collectors.nsys.steps import assign_steps, step_number
from traceprof.classify import comm_family, gpu_class
from traceprof.errors import NotATraceError, TraceFormatError
from traceprof.limits import to_table
from traceprof.ops import kernel_op
from traceprof.parsed import ParsedTrace

__all__ = ["parse", "SQLITE_MAGIC"]

#: First bytes of every SQLite 3 database file.
SQLITE_MAGIC = b"SQLite format 3\x00"

_COLS = ("kind", "cat", "name", "ts_ns", "dur_ns", "pid", "tid", "device", "stream", "correlation",
         "external_id", "args", "class", "flag")
_NVTX_RANGES = (59, 60, 70, 71)  # Nvtx(t)PushPopRange, Nvtx(t)StartEndRange
_NVTX_MARKS = (34, 65)  # NvtxMark, NvtxtMark
_VERSION = re.compile(r"_v\d+$")
_RANK_ENV = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID", "MV2_COMM_WORLD_RANK")
_WORLD_ENV = ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS", "MV2_COMM_WORLD_SIZE")
_RANK_IN_NAME = re.compile(r"rank[_.-]?(\d+)", re.IGNORECASE)
_TRAILING_NUMBER = re.compile(r"[_.-](\d+)$")
_MPI_RANK = re.compile(r"^MPI Rank (\d+)$")
# Fallbacks for exports without ENUM_* tables (schema 2.x): the same ids and labels.
_COPY_KINDS = {0: "Unknown", 1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA", 6: "AtoD", 7: "DtoA",
               8: "DtoD", 9: "HtoH", 10: "PtoP", 11: "UVM HtoD", 12: "UVM DtoH", 13: "UVM DtoD"}
_MEM_KINDS = {0: "Pageable", 1: "Pinned", 2: "Device", 3: "Array", 4: "Managed", 5: "Device Static",
              6: "Managed Static", 7: "Unknown"}
_SYNC_TYPES = {0: "Unknown", 1: "Event sync", 2: "Stream wait sync", 3: "Stream sync", 4: "Context sync"}


def _open(path: Path, tolerant: bool = False) -> sqlite3.Connection:
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
        if tolerant:
            con.text_factory = lambda b: b.decode("utf-8", "replace")
        con.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.Error as e:
        raise TraceFormatError(path, "", f"unreadable SQLite file ({e})") from None
    return con


def _tables(con: sqlite3.Connection) -> dict[str, set[str]]:
    """Table name -> its column names."""
    names = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")]
    return {n: {r[1] for r in con.execute(f'PRAGMA table_info("{n}")')} for n in names}


def _enum(con: sqlite3.Connection, tables: dict[str, set[str]], name: str, fallback: dict[int, str]) -> dict[int, str]:
    if name not in tables:
        return fallback
    return {int(i): str(label) for i, label in con.execute(f"SELECT id, label FROM {name}")}


def _copy_label(label: str) -> str:
    """``Host-to-Device`` (ENUM label) or ``HtoD`` -> Kineto's short form ``HtoD``."""
    return label.replace("Unified ", "UVM ").replace("Host", "H").replace("Device", "D").replace(
        "Array", "A").replace("Peer", "P").replace("-to-", "to")


def _pid_tid(gtid: int | None) -> tuple[str, str]:
    if gtid is None:
        return "", ""
    return str((gtid >> 24) & 0xFFFFFF), str(gtid & 0xFFFFFF)


_INT64_MAX = 2**63 - 1


def _reason(a: str, limit: int, end_optional: bool = False, only: str = "1", ids: tuple[str, ...] = ()) -> str:
    """SQL giving why a row's ``start``/``end`` (table alias ``a``) are unusable, NULL when they are
    integers with 0 <= start <= end and end + epoch within int64 (``limit`` = int64 max - epoch, so
    ``end - start`` fits too) and its ``ids`` columns are integers or NULL (``deviceId`` within int32). ``end_optional``: a NULL
    end is an instant (NVTX), not an error; rows outside the condition ``only`` are not checked
    (NVTX metadata records)."""
    s, e = f"{a}.start", f"{a}.end"
    not_int = "".join(f"\n        WHEN {a}.{c} IS NOT NULL AND typeof({a}.{c}) <> 'integer' THEN '{c} not an integer'"
                      + (f"\n        WHEN {a}.{c} NOT BETWEEN {-(2**31)} AND {2**31 - 1} THEN '{c} beyond int32'"
                         if c == "deviceId" else "")  # events.device is INTEGER
                      for c in ids)
    null_end = f"WHEN {e} IS NULL THEN CASE WHEN {s} > {limit} THEN 'start beyond int64 on the epoch clock' END" \
        if end_optional else f"WHEN {e} IS NULL THEN 'NULL end'"
    return f"""CASE WHEN NOT ({only}) THEN NULL
        WHEN {s} IS NULL THEN 'NULL start'
        WHEN typeof({s}) <> 'integer' THEN 'start not an integer'
        WHEN {s} < 0 THEN 'negative start'
        {null_end}
        WHEN typeof({e}) <> 'integer' THEN 'end not an integer'
        WHEN {e} < {s} THEN 'end before start'
        WHEN {e} > {limit} THEN 'end beyond int64 on the epoch clock'{not_int} END"""


def _valid(con: sqlite3.Connection, p: Path, table: str, a: str, epoch: int, on_bad_event: str,
           rejected: dict[str, int], end_optional: bool = False, only: str = "1", ids: tuple[str, ...] = ()) -> str:
    """The WHERE condition (alias ``a``) of the rows of ``table`` with usable times and integer
    ``ids`` (:func:`_reason`).

    Rows without are counted in ``rejected`` under ``"<table>: <reason>"`` or, with
    ``on_bad_event="raise"``, the first one raises naming the table and its row id.
    """
    why = _reason(a, _INT64_MAX - max(epoch, 0), end_optional, only, ids)
    q = f"""SELECT why, count(*), min(id) FROM (SELECT {why} AS why, {a}.rowid AS id FROM {table} {a})
            WHERE why IS NOT NULL GROUP BY why ORDER BY min(id)"""
    for reason, n, rowid in con.execute(q).fetchall():
        if on_bad_event == "raise":
            start, end = con.execute(f"SELECT start, end FROM {table} WHERE rowid = ?", (rowid,)).fetchone()
            raise TraceFormatError(p, f"{table} row id {rowid}", f"{reason} (start={start!r}, end={end!r}); "
                                   "pass --skip-bad-events to skip such rows")
        key = f"{table}: {reason}"
        rejected[key] = rejected.get(key, 0) + n
    return f"({why}) IS NULL"


class _Rows:
    """Column lists of the events table being built."""

    def __init__(self) -> None:
        self.cols: dict[str, list[Any]] = {c: [] for c in _COLS}

    def add(self, kind: str, cat: str, name: str, ts: int, dur: int, pid: str, tid: str,
            device: int | None, stream: int | None, corr: int | None, args: dict[str, Any],
            cls: str | None = None, flag: str | None = None) -> None:
        c = self.cols
        c["kind"].append(kind)
        c["cat"].append(cat)
        c["name"].append(name)
        c["ts_ns"].append(ts)
        c["dur_ns"].append(dur)
        c["pid"].append(pid)
        c["tid"].append(tid)
        c["device"].append(device)
        c["stream"].append(stream)
        c["correlation"].append(corr)
        c["external_id"].append(None)
        c["args"].append(msgspec.json.encode(args).decode())
        c["class"].append(cls)
        c["flag"].append(flag)

    def extend(self, kind: str, cat: str, fetched: list[tuple[Any, ...]], gpu: bool,
               rename: dict[str, str] | None = None) -> None:
        """Append rows fetched as (name, ts, dur, pid, tid, device, stream, correlation, args JSON);
        GPU rows get their class (one classification per distinct name), ``rename`` maps names."""
        if not fetched:
            return
        names, ts, dur, pid, tid, dev, stream, corr, args = (list(col) for col in zip(*fetched, strict=True))
        if rename is not None:
            names = [rename[x] if x in rename else rename.setdefault(x, _VERSION.sub("", x)) for x in names]
        n = len(names)
        c = self.cols
        c["kind"] += [kind] * n
        c["cat"] += [cat] * n
        c["name"] += names
        c["ts_ns"] += ts
        c["dur_ns"] += dur
        c["pid"] += pid
        c["tid"] += tid
        c["device"] += dev
        c["stream"] += stream
        c["correlation"] += corr
        c["external_id"] += [None] * n
        c["args"] += args
        if gpu:
            classes: dict[str, str] = {}
            c["class"] += [classes[x] if x in classes else classes.setdefault(x, gpu_class(kind, x)) for x in names]
        else:
            c["class"] += [None] * n
        c["flag"] += [None] * n


#: The id columns of GPU activity rows, read as integers (lanes, the link to the launch).
_GPU_IDS = ("deviceId", "streamId", "correlationId")


def _kernels(con: sqlite3.Connection, p: Path, cols: set[str], epoch: int, rows: _Rows, on_bad_event: str,
             rejected: dict[str, int]) -> None:
    ok = _valid(con, p, "CUPTI_ACTIVITY_KIND_KERNEL", "k", epoch, on_bad_event, rejected, ids=_GPU_IDS)
    graph = ", 'graphNodeId', k.graphNodeId" if "graphNodeId" in cols else ""
    q = f"""SELECT coalesce(d.value, s.value, ''), k.start + ?, k.end - k.start, CAST(k.deviceId AS TEXT),
                   CAST(k.streamId AS TEXT), k.deviceId, k.streamId, k.correlationId,
                   json_object('device', k.deviceId, 'stream', k.streamId, 'correlation', k.correlationId,
                               'grid', json_array(k.gridX, k.gridY, k.gridZ),
                               'block', json_array(k.blockX, k.blockY, k.blockZ),
                               'registers per thread', k.registersPerThread,
                               'shared memory', k.staticSharedMemory + k.dynamicSharedMemory,
                               'shortName', s.value{graph})
            FROM CUPTI_ACTIVITY_KIND_KERNEL k
            LEFT JOIN StringIds d ON d.id = k.demangledName LEFT JOIN StringIds s ON s.id = k.shortName
            WHERE {ok}"""
    rows.extend("kernel", "kernel", con.execute(q, (epoch,)).fetchall(), gpu=True)


def _copies(con: sqlite3.Connection, p: Path, tables: dict[str, set[str]], epoch: int, rows: _Rows,
            on_bad_event: str, rejected: dict[str, int]) -> None:
    def ok(table: str) -> str:
        return _valid(con, p, table, "t", epoch, on_bad_event, rejected, ids=_GPU_IDS)

    kinds = {i: _copy_label(v) for i, v in _enum(con, tables, "ENUM_CUDA_MEMCPY_OPER", _COPY_KINDS).items()}
    mems = _enum(con, tables, "ENUM_CUDA_MEM_KIND", _MEM_KINDS)
    if "CUPTI_ACTIVITY_KIND_MEMCPY" in tables:
        q = ("SELECT start, end, deviceId, streamId, correlationId, bytes, copyKind, srcKind, dstKind "
             f"FROM CUPTI_ACTIVITY_KIND_MEMCPY t WHERE {ok('CUPTI_ACTIVITY_KIND_MEMCPY')}")
        for start, end, dev, stream, corr, nbytes, kind, src, dst in con.execute(q):
            name = f"Memcpy {kinds.get(kind, kind)} ({mems.get(src, src)} -> {mems.get(dst, dst)})"
            args = {"device": dev, "stream": stream, "correlation": corr, "bytes": nbytes, "copyKind": kind}
            rows.add("memcpy", "gpu_memcpy", name, epoch + start, end - start, str(dev), str(stream),
                     dev, stream, corr, args, gpu_class("memcpy", name, args))
    if "CUPTI_ACTIVITY_KIND_MEMSET" in tables:
        mem = "memKind" if "memKind" in tables["CUPTI_ACTIVITY_KIND_MEMSET"] else "NULL"
        q = (f"SELECT start, end, deviceId, streamId, correlationId, bytes, {mem} FROM CUPTI_ACTIVITY_KIND_MEMSET t "
             f"WHERE {ok('CUPTI_ACTIVITY_KIND_MEMSET')}")
        for start, end, dev, stream, corr, nbytes, kind in con.execute(q):
            name = f"Memset ({mems.get(kind, 'Device') if kind is not None else 'Device'})"
            args = {"device": dev, "stream": stream, "correlation": corr, "bytes": nbytes}
            rows.add("memset", "gpu_memset", name, epoch + start, end - start, str(dev), str(stream),
                     dev, stream, corr, args, gpu_class("memset", name, args))
    if "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION" in tables:
        types = _enum(con, tables, "ENUM_CUPTI_SYNC_TYPE", _SYNC_TYPES)
        q = ("SELECT start, end, deviceId, streamId, correlationId, syncType FROM CUPTI_ACTIVITY_KIND_SYNCHRONIZATION t "
             f"WHERE {ok('CUPTI_ACTIVITY_KIND_SYNCHRONIZATION')}")
        for start, end, dev, stream, corr, st in con.execute(q):
            args = {"device": dev, "stream": stream, "correlation": corr, "syncType": st}
            rows.add("sync", "cuda_sync", str(types.get(st, st)), epoch + start, end - start, str(dev),
                     str(stream), dev, stream, corr, args)


def _api(con: sqlite3.Connection, p: Path, tables: dict[str, set[str]], epoch: int, rows: _Rows,
         on_bad_event: str, rejected: dict[str, int]) -> None:
    rename: dict[str, str] = {}  # cudaLaunchKernel_v7000 -> cudaLaunchKernel, once per name
    for table, kind in (("CUPTI_ACTIVITY_KIND_RUNTIME", "cuda_runtime"), ("CUPTI_ACTIVITY_KIND_DRIVER", "cuda_driver")):
        if table not in tables:
            continue
        ok = _valid(con, p, table, "r", epoch, on_bad_event, rejected, ids=("correlationId", "globalTid"))
        q = f"""SELECT coalesce(s.value, ''), r.start + ?, r.end - r.start,
                       coalesce(CAST((r.globalTid >> 24) & 16777215 AS TEXT), ''),
                       coalesce(CAST(r.globalTid & 16777215 AS TEXT), ''), NULL, NULL, r.correlationId,
                       json_object('correlation', r.correlationId, 'nsys_name', s.value)
                FROM {table} r LEFT JOIN StringIds s ON s.id = r.nameId WHERE {ok}"""
        rows.extend(kind, kind, con.execute(q, (epoch,)).fetchall(), gpu=False, rename=rename)


def _nvtx(con: sqlite3.Connection, p: Path, tables: dict[str, set[str]], epoch: int, rows: _Rows, on_bad_event: str,
          rejected: dict[str, int], skipped: dict[str, int], flagged: dict[str, int], thread_ranks: set[int]) -> None:
    if "NVTX_EVENTS" not in tables:
        return
    have = tables["NVTX_EVENTS"]
    payload = [c for c in ("category", "uint64Value", "int64Value", "doubleValue", "uint32Value", "int32Value",
                           "floatValue", "jsonText") if c in have]
    text_id = "n.textId" if "textId" in have else "NULL"
    timed = f"n.eventType IN {_NVTX_RANGES + _NVTX_MARKS}"
    ok = _valid(con, p, "NVTX_EVENTS", "n", epoch, on_bad_event, rejected, end_optional=True, only=timed)
    q = f"""SELECT n.start, n.end, n.eventType, coalesce(n.text, s.value, ''), n.globalTid, n.domainId
                   {''.join(', n.' + c for c in payload)}
            FROM NVTX_EVENTS n LEFT JOIN StringIds s ON s.id = {text_id} WHERE {ok} ORDER BY n.start"""
    domains: dict[int, str] = {}
    for start, end, etype, text, gtid, domain, *values in con.execute(q):
        if etype == 75:  # NvtxDomainCreate: the domain's name
            domains[domain] = text
        if etype == 39 and (m := _MPI_RANK.match(text)):  # NvtxThread name set by nsys MPI tracing
            thread_ranks.add(int(m.group(1)))
        if etype not in _NVTX_RANGES and etype not in _NVTX_MARKS:
            skipped["nvtx metadata"] = skipped.get("nvtx metadata", 0) + 1
            continue
        args: dict[str, Any] = {"eventType": etype, "domain": domains.get(domain, domain) if domain else None}
        args.update({c: v for c, v in zip(payload, values, strict=True) if v is not None})
        pid, tid = _pid_tid(gtid)
        if etype in _NVTX_MARKS or end is None:
            flag = None
            if end is None and etype not in _NVTX_MARKS:  # never closed in the capture: an instant
                flag = "unmatched_begin"
                flagged[flag] = flagged.get(flag, 0) + 1
            rows.add("instant", "nvtx", text, epoch + start, 0, pid, tid, None, None, None, args, flag=flag)
            continue
        kind = "step" if step_number(text) is not None else "user_annotation"
        rows.add(kind, "nvtx", text, epoch + start, end - start, pid, tid, None, None, None, args)


def _env(con: sqlite3.Connection, tables: dict[str, set[str]]) -> str:
    """All recorded environment-like text (capture metadata and system environment values; these
    hold some non-UTF-8 bytes, replaced)."""
    parts = []
    for table in ("META_DATA_CAPTURE", "TARGET_INFO_SYSTEM_ENV"):
        if table in tables and {"name", "value"} <= tables[table]:
            q = f"SELECT CAST(name AS BLOB), CAST(value AS BLOB) FROM {table}"
            parts += [f"{bytes(n).decode('utf-8', 'replace')}\n{bytes(v).decode('utf-8', 'replace')}"
                      for n, v in con.execute(q) if v]
    return "\n".join(parts)


def _env_int(env: str, names: tuple[str, ...]) -> tuple[str, set[int]] | None:
    """(variable, its distinct values) of the first variable in ``names`` found in ``env``."""
    for var in names:
        found = {int(v) for v in re.findall(rf"(?:^|[\s;,\x00\"'{{]){var}\"?\s*[=:]\s*\"?(\d+)", env)}
        if found:
            return var, found
    return None


def _rank(path: Path, env: str, thread_ranks: set[int]) -> tuple[int | None, list[str]]:
    notes: list[str] = []
    hit = _env_int(env, _RANK_ENV) or (("NVTX thread name 'MPI Rank N'", thread_ranks) if thread_ranks else None)
    stem = path.name.split(".sqlite")[0].split(".nsys-rep")[0]
    m = _RANK_IN_NAME.search(stem) or _TRAILING_NUMBER.search(stem)
    by_name = int(m.group(1)) if m else None
    if hit:
        var, values = hit
        if len(values) > 1:
            raise TraceFormatError(path, f"environment {var}", f"several ranks recorded ({sorted(values)}): the "
                                   "report holds several ranks' processes; profile each rank to its own file "
                                   "(nsys profile -o name_%q{RANK})")
        rank = values.pop()
        if by_name is not None and by_name != rank and _RANK_IN_NAME.search(stem):
            raise TraceFormatError(path, f"environment {var}", f"rank {rank} conflicts with rank {by_name} in the file name")
        return rank, notes
    if by_name is not None:
        notes.append(f"{path.name}: rank {by_name} taken from the file name (no RANK in the recorded environment)")
    return by_name, notes


def _meta(con: sqlite3.Connection, tables: dict[str, set[str]]) -> dict[str, Any]:
    meta: dict[str, Any] = {"clock_synced_by_source": False}
    for table in ("META_DATA_EXPORT", "EXPORT_META_DATA"):
        if table in tables:
            rows = dict(con.execute(f"SELECT name, value FROM {table}").fetchall())
            meta["nsys_version"] = rows.get("EXPORT_PRODUCT_VERSION") or rows.get("NSYS_VERSION")
            meta["export_schema"] = rows.get("EXPORT_SCHEMA_VERSION")
    if "META_DATA_CAPTURE" in tables:
        cap = dict(con.execute("SELECT name, value FROM META_DATA_CAPTURE WHERE name LIKE 'PROCESS_0:%'").fetchall())
        cmd = [cap.get("PROCESS_0:COMMAND")] + [cap[k] for k in sorted(cap, key=lambda k: (len(k), k))
                                                 if k.startswith("PROCESS_0:ARGUMENT_")]
        meta["command"] = " ".join(c for c in cmd if c)
    return meta


def _devices(con: sqlite3.Connection, tables: dict[str, set[str]]) -> list[dict[str, Any]]:
    if "TARGET_INFO_GPU" not in tables:
        return []
    q = "SELECT id, name, smCount, totalMemory, computeMajor, computeMinor FROM TARGET_INFO_GPU ORDER BY id"
    return [{"device": i, "name": None if n is None else str(n), "sm_count": _int(sm), "memory_bytes": _int(mem),
             "compute_capability": f"{a}.{b}" if a is not None else None}
            for i, n, sm, mem, a, b in con.execute(q) if isinstance(i, int)]  # a device without an id is no device


def _int(v: Any) -> int | None:
    """An integer cell, else None (a damaged export's text in a number column)."""
    return v if isinstance(v, int) else None


def _read(con: sqlite3.Connection, p: Path, on_bad_event: str) -> tuple[Any, ...]:
    """Everything :func:`parse` reads from the open export (module doc, steps 1-4, 6, 7)."""
    tables = _tables(con)
    if not any(t.startswith(("CUPTI_ACTIVITY_KIND_", "NVTX_EVENTS", "TARGET_INFO_")) for t in tables):
        raise NotATraceError(p, "", "an SQLite file but not an Nsight Systems export (no CUPTI_ACTIVITY_KIND_* "
                             "/ NVTX_EVENTS / TARGET_INFO_* tables)")
    if "StringIds" not in tables:
        raise TraceFormatError(p, "StringIds", "missing: the table of names (kernels, CUDA calls) that every "
                               "export has; the export is incomplete: export the .nsys-rep again "
                               "(nsys export --type sqlite)")
    if "TARGET_INFO_SESSION_START_TIME" not in tables:
        raise TraceFormatError(p, "TARGET_INFO_SESSION_START_TIME", "missing: no capture start time, so "
                               "times cannot be put on the epoch clock; re-export with a current nsys")
    start = con.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME").fetchone()
    if not start or not isinstance(start[0], int):
        raise TraceFormatError(p, "TARGET_INFO_SESSION_START_TIME.utcEpochNs", "empty or not an integer")
    epoch = start[0]
    rows = _Rows()
    rejected: dict[str, int] = {}
    skipped: dict[str, int] = {}
    flagged: dict[str, int] = {}
    if "CUPTI_ACTIVITY_KIND_KERNEL" in tables:
        _kernels(con, p, tables["CUPTI_ACTIVITY_KIND_KERNEL"], epoch, rows, on_bad_event, rejected)
    _copies(con, p, tables, epoch, rows, on_bad_event, rejected)
    _api(con, p, tables, epoch, rows, on_bad_event, rejected)
    thread_ranks: set[int] = set()
    _nvtx(con, p, tables, epoch, rows, on_bad_event, rejected, skipped, flagged, thread_ranks)
    env = _env(con, tables)
    rank, warnings = _rank(p, env, thread_ranks)
    world = _env_int(env, _WORLD_ENV)
    devices = _devices(con, tables)
    meta = _meta(con, tables)
    host = dict(con.execute("SELECT name, value FROM TARGET_INFO_SYSTEM_ENV WHERE name = 'Hostname'").fetchall()
                ).get("Hostname") if "TARGET_INFO_SYSTEM_ENV" in tables else None
    return rows, rejected, skipped, flagged, rank, warnings, world, devices, meta, host, epoch


def parse(path: str | Path, *, on_bad_event: str = "raise") -> ParsedTrace:
    """Parse one Nsight Systems SQLite export.

    Args:
        path: A ``.sqlite`` file written by ``nsys export --type sqlite``.
        on_bad_event: ``"raise"`` stops at the first row of a kernel, memcpy, memset, sync, runtime,
            driver or NVTX table whose ``start``/``end`` are not integers with 0 <= start <= end and
            session start + end within int64; ``"skip"`` counts such rows in ``rejected`` by table
            and reason (``"CUPTI_ACTIVITY_KIND_MEMCPY: NULL end"``).

    Returns:
        A :class:`ParsedTrace` (source ``nsys``) with events, steps, devices and collectives; times
        are epoch ns.

    Raises:
        NotATraceError: An SQLite file that is not an Nsight Systems export.
        TraceFormatError: Unreadable, no session start time, conflicting ranks, or (``raise``) a
            row with unusable times, naming its table and row id.
    """
    p = Path(path).resolve()
    raw = p.read_bytes()
    for tolerant in (False, True):  # a rare non-UTF-8 string: read again, replacing bad bytes
        con = _open(p, tolerant)
        try:
            rows, rejected, skipped, flagged, rank, warnings, world, devices, meta, host, epoch = _read(
                con, p, on_bad_event)
            break
        except sqlite3.OperationalError as e:
            if tolerant or "decode" not in str(e):
                raise TraceFormatError(p, "", f"SQLite error while reading the export ({e})") from None
        except sqlite3.Error as e:
            raise TraceFormatError(p, "", f"SQLite error while reading the export ({e})") from None
        finally:
            con.close()
    cols = rows.cols
    steps, cols["step"] = assign_steps(cols)
    gpu = [d for k, d in zip(cols["kind"], cols["device"], strict=True) if k == "kernel"]
    used = max(set(gpu), key=gpu.count) if gpu else None
    names = {d["device"]: d["name"] for d in devices}
    pids = [pid for k, pid in zip(cols["kind"], cols["pid"], strict=True) if k == "cuda_runtime"]
    trace = {
        "host": host,
        "pid": max(set(pids), key=pids.count) if pids else None,
        "base_time_ns": epoch,
        "device_name": names.get(used, devices[0]["name"] if devices else None),
        "meta": msgspec.json.encode(meta).decode(),
    }
    return ParsedTrace(
        path=str(p), sha256=hashlib.sha256(raw).hexdigest(), bytes=len(raw), source="nsys",
        format=f"nsys-sqlite-{meta.get('export_schema') or '?'}", rank=rank,
        world_size=(world[1].pop() if world and len(world[1]) == 1 else None), trace=trace,
        events=pa.Table.from_pydict(cols, schema=pa.schema([row_schema("events").field(c) for c in cols])),
        devices=to_table(devices, row_schema("devices"), rejected, "TARGET_INFO_GPU"),  # ints beyond: left out
        steps=pa.Table.from_pylist(steps, schema=row_schema("steps")),
        collectives=pa.Table.from_pylist(_collectives(cols), schema=row_schema("collectives")),
        events_read=len(cols["kind"]) + sum(rejected.values()) + sum(skipped.values()),
        rejected=rejected, skipped=skipped, flagged=flagged, warnings=warnings,
    )


def _collectives(cols: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """One ``nccl_kernel`` row per communication kernel (module doc, step 8), with ordinals."""
    launch = {c: t for k, c, t in zip(cols["kind"], cols["correlation"], cols["ts_ns"], strict=True)
              if k in ("cuda_runtime", "cuda_driver") and c is not None}
    out = []
    for i, k in enumerate(cols["kind"]):
        if k != "kernel" or cols["class"][i] != "comm":
            continue
        name = cols["name"][i]
        fam = comm_family(name)
        out.append({
            "source": "nccl_kernel", "pg": None, "seq": None,
            "op": (fam.op if fam is not None and fam.op else kernel_op(name)),
            "enter_ns": launch.get(cols["correlation"][i]), "start_ns": cols["ts_ns"][i],
            "end_ns": cols["ts_ns"][i] + cols["dur_ns"][i], "stream": cols["stream"][i], "step": cols["step"][i],
        })
    out.sort(key=lambda r: r["start_ns"])
    seen: dict[str, int] = {}
    for r in out:
        r["ordinal"] = seen.get(r["op"], 0)
        seen[r["op"]] = r["ordinal"] + 1
    return out
