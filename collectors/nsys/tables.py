"""Rows of the tables of an Nsight Systems SQLite export, as event columns (``traceprof.collectors.nsys.parse``
module doc, steps 2-4).

Every query names its columns and checks its rows' times and ids in SQL (:func:`valid`); no query
relies on the order of the rows (nsys 2025.6+ warns that exports may not be sorted by time).
"""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path
from typing import Any

import msgspec

from traceprof.collectors.nsys.steps import step_number
from traceprof.core.classify import Classifier
from traceprof.core.errors import TraceFormatError
from traceprof.core.limits import skip_hint

__all__ = [
    "Rows",
    "open_export",
    "table_columns",
    "kernels",
    "graphs",
    "copies",
    "api",
    "nvtx",
    "memory",
    "GRAPH_CAT",
    "MEMORY_CAT",
]

COLS = (
    "kind",
    "cat",
    "name",
    "ts_ns",
    "dur_ns",
    "pid",
    "tid",
    "device",
    "stream",
    "correlation",
    "external_id",
    "args",
    "class",
    "flag",
)
#: ``events.cat`` of a CUDA graph execution traced per graph (``CUPTI_ACTIVITY_KIND_GRAPH_TRACE``).
GRAPH_CAT = "cuda_graph"
#: ``events.cat`` of a CUDA memory allocation or free (``CUDA_GPU_MEMORY_USAGE_EVENTS``).
MEMORY_CAT = "cuda_memory"
_MEMORY = "CUDA_GPU_MEMORY_USAGE_EVENTS"
#: Memory kinds that live in host memory (``ENUM_CUDA_MEM_KIND``: pageable, pinned); the rest are device memory.
_HOST_MEM_KINDS = frozenset({0, 1})
_GRAPH = "CUPTI_ACTIVITY_KIND_GRAPH_TRACE"
_NVTX_RANGES = (59, 60, 70, 71)  # Nvtx(t)PushPopRange, Nvtx(t)StartEndRange
_NVTX_MARKS = (34, 65)  # NvtxMark, NvtxtMark
_MPI_RANK = re.compile(r"^MPI Rank (\d+)$")
_VERSION = re.compile(r"_v\d+$")
_INT64_MAX = 2**63 - 1
# Fallbacks for exports without ENUM_* tables (schema 2.x): the same ids and labels.
_COPY_KINDS = {
    0: "Unknown",
    1: "HtoD",
    2: "DtoH",
    3: "HtoA",
    4: "AtoH",
    5: "AtoA",
    6: "AtoD",
    7: "DtoA",
    8: "DtoD",
    9: "HtoH",
    10: "PtoP",
    11: "UVM HtoD",
    12: "UVM DtoH",
    13: "UVM DtoD",
}
_MEM_KINDS = {
    0: "Pageable",
    1: "Pinned",
    2: "Device",
    3: "Array",
    4: "Managed",
    5: "Device Static",
    6: "Managed Static",
    7: "Unknown",
}
#: The label of an enum field that holds no value (NULL), as the ENUM tables name their unknown value.
_UNKNOWN = "Unknown"
_SYNC_TYPES = {0: "Unknown", 1: "Event sync", 2: "Stream wait sync", 3: "Stream sync", 4: "Context sync"}
#: The id columns of GPU activity rows, read as integers (lanes, the link to the launch, the process).
_GPU_IDS = ("deviceId", "streamId", "correlationId", "globalPid")
#: The end of the reason of a row whose string id ``StringIds`` lacks (:func:`_unresolved`).
_UNRESOLVED = " string id not in StringIds"


def open_export(path: Path, tolerant: bool = False) -> sqlite3.Connection:
    """A read-only connection; ``tolerant`` replaces invalid UTF-8 in text.

    Raises:
        TraceFormatError: Not readable as SQLite, or a damaged schema whose error message is not UTF-8.
    """
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
        if tolerant:
            con.text_factory = lambda b: b.decode("utf-8", "replace")
        con.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.Error as e:
        raise TraceFormatError(path, "", f"unreadable SQLite file ({e})") from None
    except UnicodeDecodeError:  # SQLite's own error message held the damaged schema's bytes
        raise TraceFormatError(
            path, "", "unreadable SQLite file (damaged schema: SQLite's error is not UTF-8)"
        ) from None
    return con


def table_columns(con: sqlite3.Connection) -> dict[str, set[str]]:
    """Table name -> its column names."""
    names = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")]
    return {n: {r[1] for r in con.execute(f'PRAGMA table_info("{n}")')} for n in names}


def _enum(
    con: sqlite3.Connection, tables: dict[str, set[str]], name: str, fallback: dict[int, str]
) -> dict[int | None, str]:
    """An ``ENUM_*`` table's id -> label (``fallback`` without the table), and None (a NULL field:
    no value recorded) -> the enum's own unknown label (``Unknown``), so a row with a NULL
    ``syncType`` or ``srcKind`` is named ``Unknown``, not ``None``. Rows of the table without an
    integer id or a label are left out (a value that names one is shown as recorded)."""
    rows = fallback.items() if name not in tables else con.execute(f"SELECT id, label FROM {name}")
    labels: dict[int | None, str] = {
        i: str(label) for i, label in rows if isinstance(i, int) and label is not None
    }
    labels[None] = next((v for v in labels.values() if v.lower() == _UNKNOWN.lower()), _UNKNOWN)
    return labels


def _copy_label(label: str) -> str:
    """``Host-to-Device`` (ENUM label) or ``HtoD`` -> Kineto's short form ``HtoD``."""
    return (
        label.replace("Unified ", "UVM ")
        .replace("Host", "H")
        .replace("Device", "D")
        .replace("Array", "A")
        .replace("Peer", "P")
        .replace("-to-", "to")
    )


def _text(v: int | None) -> str | None:
    """A GPU row's lane id as the ``pid``/``tid`` text: NULL stays NULL (``str()`` wrote
    ``'None'``), as the kernel rows' ``CAST(deviceId AS TEXT)`` keeps it."""
    return None if v is None else str(v)


def pid_tid(gtid: int | None) -> tuple[str, str]:
    """(pid, tid) text of a ``globalTid`` (bits 24-47: pid, 0-23: tid); empty when NULL."""
    if gtid is None:
        return "", ""
    return str((gtid >> 24) & 0xFFFFFF), str(gtid & 0xFFFFFF)


def _unresolved(a: str, strings: tuple[str, ...]) -> str:
    """SQL ``WHEN`` clauses for a row (alias ``a``) whose ``strings`` columns hold a string id that
    ``StringIds`` lacks (a damaged or truncated export): its name would be empty. The reason reads
    ``'<column> string id not in StringIds'`` (:data:`_UNRESOLVED`)."""
    return "".join(
        f"\n        WHEN typeof({a}.{c}) = 'integer' AND NOT EXISTS "
        f"(SELECT 1 FROM StringIds WHERE id = {a}.{c}) THEN '{c}{_UNRESOLVED}'"
        for c in strings
    )


def _said(
    con: sqlite3.Connection, table: str, reason: str, rowid: int, n: int, columns: tuple[str, ...]
) -> str:
    """For an error: a bad row's reason with the values it is about, as recorded. A string id that
    ``StringIds`` lacks (:func:`_unresolved`): the id and how many rows of ``table`` (``n``) share
    the reason (``name string id 77 not in StringIds (2 row(s) of ...)``); else the reason and the
    row's ``columns`` that it names (``memoryOperationType not 0 (allocation) or 1
    (deallocation) (memoryOperationType=5)``)."""
    if reason.endswith(_UNRESOLVED):
        column = reason[: -len(_UNRESOLVED)]
        (sid,) = con.execute(f"SELECT {column} FROM {table} WHERE rowid = ?", (rowid,)).fetchone()
        return (
            f"{column} string id {sid} not in StringIds ({n} row(s) of {table} with a "
            "string id that StringIds lacks: a damaged export; export the .nsys-rep again)"
        )
    named = [c for c in columns if c in reason.split()]
    if not named:
        return reason
    values = con.execute(f"SELECT {', '.join(named)} FROM {table} WHERE rowid = ?", (rowid,)).fetchone()
    return f"{reason} ({', '.join(f'{c}={v!r}' for c, v in zip(named, values, strict=True))})"


def _reason(
    a: str,
    limit: int,
    end_optional: bool = False,
    only: str = "1",
    ids: tuple[str, ...] = (),
    strings: tuple[str, ...] = (),
) -> str:
    """SQL giving why a row's ``start``/``end`` (table alias ``a``) are unusable, NULL when they are
    integers with 0 <= start <= end and end + epoch within int64 (``limit`` = int64 max - epoch, so
    ``end - start`` fits too), its ``ids`` columns are integers or NULL (``deviceId`` within
    int32) and its ``strings`` columns' string ids are in ``StringIds`` (:func:`_unresolved`).
    ``end_optional``: a NULL end is an instant (NVTX), not an error; rows outside the condition
    ``only`` are not checked (NVTX metadata records)."""
    s, e = f"{a}.start", f"{a}.end"
    not_int = "".join(
        f"\n        WHEN {a}.{c} IS NOT NULL AND typeof({a}.{c}) <> 'integer' THEN '{c} not an integer'"
        + (
            f"\n        WHEN {a}.{c} NOT BETWEEN {-(2**31)} AND {2**31 - 1} THEN '{c} beyond int32'"
            if c == "deviceId"
            else ""
        )  # events.device is INTEGER
        for c in ids
    )
    null_end = (
        f"WHEN {e} IS NULL THEN CASE WHEN {s} > {limit} THEN 'start beyond int64 on the epoch clock' END"
        if end_optional
        else f"WHEN {e} IS NULL THEN 'NULL end'"
    )
    return f"""CASE WHEN NOT ({only}) THEN NULL
        WHEN {s} IS NULL THEN 'NULL start'
        WHEN typeof({s}) <> 'integer' THEN 'start not an integer'
        WHEN {s} < 0 THEN 'negative start'
        {null_end}
        WHEN typeof({e}) <> 'integer' THEN 'end not an integer'
        WHEN {e} < {s} THEN 'end before start'
        WHEN {e} > {limit} THEN 'end beyond int64 on the epoch clock'{not_int}{_unresolved(a, strings)} END"""


class Rows:
    """Column lists of the events table being built, the process of each row, and what was left out.

    Attributes:
        cols: Event columns (``COLS``).
        procs: Process key (``globalPid >> 24``) of each row, None when its table has none.
        rejected: Rows with unusable times or ids, by ``"<table>: <reason>"``.
        skipped: Rows not stored by design, by reason.
        thread_ranks: Process -> ranks named by nsys's ``MPI Rank N`` NVTX thread names.
    """

    def __init__(self, path: Path, epoch: int, on_bad_event: str, classifier: Classifier) -> None:
        self.cols: dict[str, list[Any]] = {c: [] for c in COLS}
        self.procs: list[int | None] = []
        self.rejected: dict[str, int] = {}
        self.skipped: dict[str, int] = {}
        self.thread_ranks: dict[int | None, set[int]] = {}
        self.path, self.epoch, self.on_bad_event = path, epoch, on_bad_event
        self.classifier = (
            classifier  # the parse options' (traceprof.core.classify: --comm-kernel patterns too)
        )

    def valid(
        self,
        con: sqlite3.Connection,
        table: str,
        a: str,
        end_optional: bool = False,
        only: str = "1",
        ids: tuple[str, ...] = (),
        strings: tuple[str, ...] = (),
    ) -> str:
        """The WHERE condition (alias ``a``) of the rows of ``table`` with usable times, integer
        ``ids`` and ``strings`` ids found in ``StringIds`` (:func:`_reason`).

        Rows without are counted in ``rejected`` under ``"<table>: <reason>"`` or, with
        ``on_bad_event="raise"``, the first one raises naming the table and its row id.

        Raises:
            TraceFormatError: (``raise``) the first unusable row, with its table, row id and times
                (or its unresolved string id and how many rows share the reason).
        """
        why = _reason(a, _INT64_MAX - max(self.epoch, 0), end_optional, only, ids, strings)
        q = f"""SELECT why, count(*), min(id) FROM (SELECT {why} AS why, {a}.rowid AS id FROM {table} {a})
                WHERE why IS NOT NULL GROUP BY why ORDER BY min(id)"""
        for reason, n, rowid in con.execute(q).fetchall():
            if self.on_bad_event == "raise":
                start, end = con.execute(
                    f"SELECT start, end FROM {table} WHERE rowid = ?", (rowid,)
                ).fetchone()
                what = _said(con, table, reason, rowid, n, ids)  # a string id, or an id's value
                if not reason.endswith(_UNRESOLVED):  # and the times, as recorded
                    times = f"start={start!r}, end={end!r}"
                    what = f"{what[:-1]}, {times})" if what != reason else f"{reason} ({times})"
                raise TraceFormatError(self.path, f"{table} row id {rowid}", what + skip_hint("row"))
            key = f"{table}: {reason}"
            self.rejected[key] = self.rejected.get(key, 0) + n
        return f"({why}) IS NULL"

    def add(
        self,
        kind: str,
        cat: str,
        name: str,
        ts: int,
        dur: int,
        pid: str | None,
        tid: str | None,
        device: int | None,
        stream: int | None,
        corr: int | None,
        args: dict[str, Any],
        cls: str | None = None,
        flag: str | None = None,
        proc: int | None = None,
    ) -> None:
        """Append one row (``ts`` epoch ns, ``dur`` ns)."""
        c = self.cols
        for col, v in (
            ("kind", kind),
            ("cat", cat),
            ("name", name),
            ("ts_ns", ts),
            ("dur_ns", dur),
            ("pid", pid),
            ("tid", tid),
            ("device", device),
            ("stream", stream),
            ("correlation", corr),
            ("external_id", None),
            ("args", msgspec.json.encode(args).decode()),
            ("class", cls),
            ("flag", flag),
        ):
            c[col].append(v)
        self.procs.append(proc)

    def gpu(
        self,
        kind: str,
        cat: str,
        name: str,
        ts: int,
        dur: int,
        args: dict[str, Any],
        cls: str | None = None,
        proc: int | None = None,
    ) -> None:
        """Append one GPU row (:meth:`add`): its device, stream and correlation those of ``args``,
        its lane (pid, tid) the device and the stream as text."""
        dev, stream = args["device"], args["stream"]
        self.add(
            kind,
            cat,
            name,
            ts,
            dur,
            _text(dev),
            _text(stream),
            dev,
            stream,
            args["correlation"],
            args,
            cls,
            proc=proc,
        )

    def extend(
        self,
        kind: str,
        cat: str,
        fetched: list[tuple[Any, ...]],
        gpu: bool,
        rename: dict[str, str] | None = None,
    ) -> None:
        """Append rows fetched as (name, ts, dur, pid, tid, device, stream, correlation, args JSON,
        process); GPU rows get their class (one classification per distinct name), ``rename`` maps names."""
        if not fetched:
            return
        names, ts, dur, pid, tid, dev, stream, corr, args, procs = (
            list(col) for col in zip(*fetched, strict=True)
        )
        if rename is not None:
            names = [rename[x] if x in rename else rename.setdefault(x, _VERSION.sub("", x)) for x in names]
        n = len(names)
        c = self.cols
        for col, vals in (
            ("kind", [kind] * n),
            ("cat", [cat] * n),
            ("name", names),
            ("ts_ns", ts),
            ("dur_ns", dur),
            ("pid", pid),
            ("tid", tid),
            ("device", dev),
            ("stream", stream),
            ("correlation", corr),
            ("external_id", [None] * n),
            ("args", args),
            ("flag", [None] * n),
        ):
            c[col] += vals
        if gpu:
            classes: dict[str, str] = {}
            c["class"] += [
                classes[x] if x in classes else classes.setdefault(x, self.classifier.gpu_class(kind, x))
                for x in names
            ]
        else:
            c["class"] += [None] * n
        self.procs += procs


def _proc(cols: set[str], a: str, column: str = "globalPid") -> str:
    """SQL of a row's process key (``column >> 24``), NULL when the table has no such column."""
    return f"{a}.{column} >> 24" if column in cols else "NULL"


def kernels(con: sqlite3.Connection, tables: dict[str, set[str]], rows: Rows) -> None:
    """``CUPTI_ACTIVITY_KIND_KERNEL`` rows as ``kernel`` events (name: ``demangledName``)."""
    table = "CUPTI_ACTIVITY_KIND_KERNEL"
    if table not in tables:
        return
    cols = tables[table]
    names = tuple(c for c in ("demangledName", "shortName") if c in cols)
    ok = rows.valid(con, table, "k", ids=tuple(c for c in _GPU_IDS if c in cols), strings=names)
    graph = ", 'graphNodeId', k.graphNodeId" if "graphNodeId" in cols else ""
    q = f"""SELECT coalesce(d.value, s.value, ''), k.start + ?, k.end - k.start, CAST(k.deviceId AS TEXT),
                   CAST(k.streamId AS TEXT), k.deviceId, k.streamId, k.correlationId,
                   json_object('device', k.deviceId, 'stream', k.streamId, 'correlation', k.correlationId,
                               'grid', json_array(k.gridX, k.gridY, k.gridZ),
                               'block', json_array(k.blockX, k.blockY, k.blockZ),
                               'registers per thread', k.registersPerThread,
                               'shared memory', k.staticSharedMemory + k.dynamicSharedMemory,
                               'shortName', s.value{graph}), {_proc(cols, "k")}
            FROM {table} k
            LEFT JOIN StringIds d ON d.id = k.demangledName LEFT JOIN StringIds s ON s.id = k.shortName
            WHERE {ok}"""
    rows.extend("kernel", "kernel", con.execute(q, (rows.epoch,)).fetchall(), gpu=True)


def graphs(con: sqlite3.Connection, tables: dict[str, set[str]], rows: Rows) -> None:
    """``CUPTI_ACTIVITY_KIND_GRAPH_TRACE`` rows (CUDA graphs traced per graph, ``nsys profile
    --cuda-graph-trace=graph``, the default) as ``kernel`` events named ``CUDA graph <graphId>``
    (cat :data:`GRAPH_CAT`), class ``compute``: the graph's kernels and their classes are not recorded.

    Call after :func:`kernels` and :func:`copies`: a graph execution whose launch (process,
    ``correlationId``; both known) has node-level rows (kernels, copies) is already counted by them,
    so it is skipped (counted in ``skipped``).
    """
    if _GRAPH not in tables:
        return
    cols = tables[_GRAPH]
    ids = tuple(c for c in (*_GPU_IDS, "graphId", "graphExecId") if c in cols)
    ok = rows.valid(con, _GRAPH, "g", ids=ids)
    extra = "".join(
        f", g.{c}" if c in cols else ", NULL"
        for c in ("graphId", "graphExecId", "contextId", "greenContextId")
    )
    q = f"""SELECT g.start + ?, g.end - g.start, g.deviceId, g.streamId, g.correlationId, {_proc(cols, "g")}{extra}
            FROM {_GRAPH} g WHERE {ok}"""
    c = rows.cols
    nodes = {
        (p, corr)
        for k, p, corr in zip(c["kind"], rows.procs, c["correlation"], strict=True)
        if k in ("kernel", "memcpy", "memset") and corr is not None and p is not None
    }
    for ts, dur, dev, stream, corr, proc, graph, exe, ctx, green in con.execute(q, (rows.epoch,)):
        if corr is not None and (proc, corr) in nodes:
            why = f"{_GRAPH}: graph executions also traced per node (their kernels are kept)"
            rows.skipped[why] = rows.skipped.get(why, 0) + 1
            continue
        args = {
            "device": dev,
            "stream": stream,
            "correlation": corr,
            "graphId": graph,
            "graphExecId": exe,
            "contextId": ctx,
            "greenContextId": green,
            "graph_level": True,
        }
        rows.gpu(
            "kernel",
            GRAPH_CAT,
            f"CUDA graph {graph if graph is not None else '?'}",
            ts,
            dur,
            args,
            "compute",
            proc,
        )


def copies(con: sqlite3.Connection, tables: dict[str, set[str]], rows: Rows) -> None:
    """Memcpy, memset and CUDA synchronization rows (named as Kineto names them)."""

    def ok(table: str) -> str:
        return rows.valid(con, table, "t", ids=tuple(c for c in _GPU_IDS if c in tables[table]))

    epoch = rows.epoch
    kinds = {i: _copy_label(v) for i, v in _enum(con, tables, "ENUM_CUDA_MEMCPY_OPER", _COPY_KINDS).items()}
    mems = _enum(con, tables, "ENUM_CUDA_MEM_KIND", _MEM_KINDS)
    if "CUPTI_ACTIVITY_KIND_MEMCPY" in tables:
        t = "CUPTI_ACTIVITY_KIND_MEMCPY"
        q = (
            f"SELECT start, end, deviceId, streamId, correlationId, bytes, copyKind, srcKind, dstKind, "
            f"{_proc(tables[t], 't')} FROM {t} t WHERE {ok(t)}"
        )
        for start, end, dev, stream, corr, nbytes, kind, src, dst, proc in con.execute(q):
            name = f"Memcpy {kinds.get(kind, kind)} ({mems.get(src, src)} -> {mems.get(dst, dst)})"
            args = {"device": dev, "stream": stream, "correlation": corr, "bytes": nbytes, "copyKind": kind}
            cls = rows.classifier.gpu_class("memcpy", name, args)
            rows.gpu("memcpy", "gpu_memcpy", name, epoch + start, end - start, args, cls, proc)
    if "CUPTI_ACTIVITY_KIND_MEMSET" in tables:
        t = "CUPTI_ACTIVITY_KIND_MEMSET"
        mem = "memKind" if "memKind" in tables[t] else "NULL"
        q = (
            f"SELECT start, end, deviceId, streamId, correlationId, bytes, {mem}, {_proc(tables[t], 't')} "
            f"FROM {t} t WHERE {ok(t)}"
        )
        for start, end, dev, stream, corr, nbytes, kind, proc in con.execute(q):
            # without a memKind column (older exports) named as Kineto names every memset
            name = f"Memset ({mems.get(kind, kind) if mem != 'NULL' else 'Device'})"
            args = {"device": dev, "stream": stream, "correlation": corr, "bytes": nbytes}
            cls = rows.classifier.gpu_class("memset", name, args)
            rows.gpu("memset", "gpu_memset", name, epoch + start, end - start, args, cls, proc)
    if "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION" in tables:
        t = "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"
        types = _enum(con, tables, "ENUM_CUPTI_SYNC_TYPE", _SYNC_TYPES)
        q = (
            f"SELECT start, end, deviceId, streamId, correlationId, syncType, {_proc(tables[t], 't')} "
            f"FROM {t} t WHERE {ok(t)}"
        )
        for start, end, dev, stream, corr, st, proc in con.execute(q):
            args = {"device": dev, "stream": stream, "correlation": corr, "syncType": st}
            rows.gpu("sync", "cuda_sync", str(types.get(st, st)), epoch + start, end - start, args, proc=proc)


def api(con: sqlite3.Connection, tables: dict[str, set[str]], rows: Rows) -> None:
    """CUDA runtime and driver calls (``correlationId`` links them to their GPU work)."""
    rename: dict[str, str] = {}  # cudaLaunchKernel_v7000 -> cudaLaunchKernel, once per name
    for table, kind in (
        ("CUPTI_ACTIVITY_KIND_RUNTIME", "cuda_runtime"),
        ("CUPTI_ACTIVITY_KIND_DRIVER", "cuda_driver"),
    ):
        if table not in tables:
            continue
        ok = rows.valid(con, table, "r", ids=("correlationId", "globalTid"), strings=("nameId",))
        q = f"""SELECT coalesce(s.value, ''), r.start + ?, r.end - r.start,
                       coalesce(CAST((r.globalTid >> 24) & 16777215 AS TEXT), ''),
                       coalesce(CAST(r.globalTid & 16777215 AS TEXT), ''), NULL, NULL, r.correlationId,
                       json_object('correlation', r.correlationId, 'nsys_name', s.value), r.globalTid >> 24
                FROM {table} r LEFT JOIN StringIds s ON s.id = r.nameId WHERE {ok}"""
        rows.extend(kind, kind, con.execute(q, (rows.epoch,)).fetchall(), gpu=False, rename=rename)


def nvtx(con: sqlite3.Connection, tables: dict[str, set[str]], rows: Rows) -> None:
    """NVTX ranges (``user_annotation``, or ``step`` when named like one) and marks (``instant``).

    A range whose ``end`` is NULL (never closed: the capture stopped inside it) is an instant
    flagged ``unmatched_begin``. Domain names (``NvtxDomainCreate``) are read first, so the order of
    the rows does not matter; thread names ``MPI Rank N`` (nsys's MPI tracing) fill ``thread_ranks``.
    """
    if "NVTX_EVENTS" not in tables:
        return
    have = tables["NVTX_EVENTS"]
    payload = [
        c
        for c in (
            "category",
            "uint64Value",
            "int64Value",
            "doubleValue",
            "uint32Value",
            "int32Value",
            "floatValue",
            "jsonText",
        )
        if c in have
    ]
    text_id = "n.textId" if "textId" in have else "NULL"
    text = "coalesce(n.text, s.value, '')"
    domains = dict(
        con.execute(
            f"SELECT n.domainId, {text} FROM NVTX_EVENTS n LEFT JOIN StringIds s ON s.id = "
            f"{text_id} WHERE n.eventType = 75 AND n.domainId IS NOT NULL"
        )
    )
    timed = f"n.eventType IN {_NVTX_RANGES + _NVTX_MARKS}"
    strings = ("textId",) if "textId" in have else ()
    ok = rows.valid(
        con, "NVTX_EVENTS", "n", end_optional=True, only=timed, ids=("globalTid",), strings=strings
    )
    q = f"""SELECT n.start, n.end, n.eventType, {text}, n.globalTid, n.domainId {"".join(", n." + c for c in payload)}
            FROM NVTX_EVENTS n LEFT JOIN StringIds s ON s.id = {text_id} WHERE {ok}"""
    epoch = rows.epoch
    for start, end, etype, name, gtid, domain, *values in con.execute(q):
        proc = gtid >> 24 if isinstance(gtid, int) else None
        if etype == 39 and (m := _MPI_RANK.match(name)):  # NvtxThread name set by nsys MPI tracing
            rows.thread_ranks.setdefault(proc, set()).add(int(m.group(1)))
        if etype not in _NVTX_RANGES and etype not in _NVTX_MARKS:
            rows.skipped["nvtx metadata"] = rows.skipped.get("nvtx metadata", 0) + 1
            continue
        args: dict[str, Any] = {"eventType": etype, "domain": domains.get(domain, domain) if domain else None}
        args.update({c: v for c, v in zip(payload, values, strict=True) if v is not None})
        pid, tid = pid_tid(gtid)
        if etype in _NVTX_MARKS or end is None:
            flag = "unmatched_begin" if end is None and etype not in _NVTX_MARKS else None
            rows.add(
                "instant",
                "nvtx",
                name,
                epoch + start,
                0,
                pid,
                tid,
                None,
                None,
                None,
                args,
                flag=flag,
                proc=proc,
            )
            continue
        kind = "step" if step_number(name) is not None else "user_annotation"
        rows.add(kind, "nvtx", name, epoch + start, end - start, pid, tid, None, None, None, args, proc=proc)


def memory(con: sqlite3.Connection, tables: dict[str, set[str]], rows: Rows) -> None:
    """``CUDA_GPU_MEMORY_USAGE_EVENTS`` (``nsys profile --cuda-memory-usage=true``) as ``instant``
    events named ``[memory]`` (cat :data:`MEMORY_CAT`), with Kineto's ``[memory]`` args: ``Device Type``
    1 (CUDA) and ``Device Id`` = ``deviceId`` for device memory, 0 and -1 for host memory (memKind
    pageable or pinned); ``Addr`` = ``address``; ``Bytes`` = ``bytes``, negative for a free
    (``memoryOperationType`` 1); ``Ev Idx`` = the row's place in (start, rowid) order; ``memKind``,
    ``pc``, ``correlation`` and ``name`` as recorded. No running totals: ``analyses/memory.py`` sums
    the bytes. A row whose start, device, address, bytes or operation is not a usable integer is
    rejected (or, with ``on_bad_event="raise"``, an error naming its row id).
    """
    if _MEMORY not in tables:
        return
    cols = tables[_MEMORY]
    need = ("start", "deviceId", "address", "bytes", "memoryOperationType")
    if any(c not in cols for c in need):
        rows.skipped[f"{_MEMORY}: columns missing"] = 1
        return
    limit = _INT64_MAX - max(rows.epoch, 0)
    why = "CASE " + "".join(
        f"WHEN m.{c} IS NULL OR typeof(m.{c}) <> 'integer' THEN '{c} not an integer' " for c in need
    )
    why += (
        f"WHEN m.start < 0 THEN 'negative start' WHEN m.start > {limit} THEN 'start beyond int64 on the epoch clock' "
        "WHEN m.bytes < 0 THEN 'negative bytes' WHEN m.memoryOperationType NOT IN (0, 1) THEN "
        f"'memoryOperationType not 0 (allocation) or 1 (deallocation)' {_unresolved('m', ('name',) if 'name' in cols else ())} END"
    )
    for reason, n, rowid in con.execute(
        f"SELECT why, count(*), min(id) FROM (SELECT {why} AS why, m.rowid AS id "
        f"FROM {_MEMORY} m) WHERE why IS NOT NULL GROUP BY why ORDER BY min(id)"
    ):
        if rows.on_bad_event == "raise":
            what = _said(con, _MEMORY, reason, rowid, n, need)
            raise TraceFormatError(rows.path, f"{_MEMORY} row id {rowid}", what + skip_hint("row"))
        key = f"{_MEMORY}: {reason}"
        rows.rejected[key] = rows.rejected.get(key, 0) + n
    mems = _enum(con, tables, "ENUM_CUDA_MEM_KIND", _MEM_KINDS)
    extra = [c for c in ("memKind", "pc", "correlationId", "globalPid") if c in cols]
    name = "coalesce(s.value, m.name)" if "name" in cols else "NULL"
    join = "LEFT JOIN StringIds s ON typeof(m.name) = 'integer' AND s.id = m.name" if "name" in cols else ""
    q = (
        f"SELECT m.start, m.deviceId, m.address, m.bytes, m.memoryOperationType, {name}"
        f"{''.join(', m.' + c for c in extra)} FROM {_MEMORY} m {join} WHERE ({why}) IS NULL ORDER BY m.start, m.rowid"
    )
    for i, (start, dev, addr, nbytes, op, label, *more) in enumerate(con.execute(q)):
        got = dict(zip(extra, more, strict=True))
        kind = got.get("memKind")
        host = kind in _HOST_MEM_KINDS
        gpid = got.get("globalPid")
        args = {
            "Device Type": 0 if host else 1,
            "Device Id": -1 if host else dev,
            "Addr": addr,
            "Bytes": -nbytes if op == 1 else nbytes,
            "Ev Idx": i,
            "deviceId": dev,
            "memKind": mems.get(kind, kind) if kind is not None else None,
            "pc": got.get("pc"),
            "correlation": got.get("correlationId"),
            "name": label,
        }
        pid = str((gpid >> 24) & 0xFFFFFF) if isinstance(gpid, int) else ""
        rows.add(
            "instant",
            MEMORY_CAT,
            "[memory]",
            rows.epoch + start,
            0,
            pid,
            "",
            None,
            None,
            None,
            args,
            proc=gpid >> 24 if isinstance(gpid, int) else None,
        )
