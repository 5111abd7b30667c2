"""Parse an Nsight Systems SQLite export (``nsys export --type sqlite``) into normalized rows.

The same ``events`` / ``steps`` / ``devices`` / ``collectives`` rows the Kineto collector writes, so
every analysis that runs on a Kineto run runs on an nsys run. Read with Python's ``sqlite3``
(read-only); exports from schema 2.x (Nsight Systems 2022) to 3.x (2024-2026) are read, tables that
a capture did not record are simply absent. No query relies on the order of the rows.

Algorithm:
  1. Epoch: nsys times are ns since the capture start; epoch ns = ``TARGET_INFO_SESSION_START_TIME
     .utcEpochNs`` + time (integers throughout). Without a usable session start (table or row
     missing, NULL, not a positive integer) the times stay relative to the capture start (epoch 0),
     with a warning; ``traces.meta.clock`` = ``session_relative``: such a trace is never compared
     with other files' epoch times, and clock alignment moves it onto the other ranks' clock through
     matched collectives when there are any.
  2. GPU rows (``traceprof.collectors.nsys.tables``): ``CUPTI_ACTIVITY_KIND_KERNEL`` (name = ``demangledName``
     via ``StringIds``, as Kineto names kernels; a name id that ``StringIds`` lacks makes a bad row,
     as in every table below; lane = (``deviceId``, ``streamId``)), ``..._MEMCPY``
     (named like Kineto: ``Memcpy HtoD (Pageable -> Device)``), ``..._MEMSET`` (``Memset (Device)``),
     classed by the parse options' ``traceprof.core.classify.Classifier``; ``..._SYNCHRONIZATION`` as ``sync``. CUDA-graph
     kernels traced per node carry the correlation id of their ``cudaGraphLaunch`` (and a
     ``graphNodeId``), so they link to it. Graphs traced per graph (``--cuda-graph-trace=graph``,
     nsys's default) are ``CUPTI_ACTIVITY_KIND_GRAPH_TRACE`` rows with no kernel rows: each
     execution is one ``kernel`` event named ``CUDA graph <graphId>`` (cat ``cuda_graph``, class
     ``compute``, ``args.graph_level``) on its lane, linked to its launch, with a warning that its
     kernels and their classes are unknown and how to record them (``--cuda-graph-trace=node``).
  3. CPU rows: ``CUPTI_ACTIVITY_KIND_RUNTIME`` (and ``..._DRIVER`` when present) as ``cuda_runtime``
     / ``cuda_driver`` with ``correlation`` = ``correlationId``, the key that links a kernel to its
     launch within its process; the ``_v7000``-style version suffix is dropped from the name (kept
     in args). pid/tid are decoded from ``globalTid`` (bits 24-47: pid, 0-23: tid).
  4. NVTX (``NVTX_EVENTS``): push/pop and start/end ranges are ``user_annotation`` (name = ``text``
     or ``textId`` -> ``StringIds``; domain in args); a range whose ``end`` is NULL (never closed:
     the capture stopped inside it) and marks are ``instant`` (dur 0); the unclosed ones get
     ``events.flag`` = ``unmatched_begin`` (counted in ``traces.flagged``, with a warning naming
     the step ranges among them), not an error; domain and thread-name records are metadata (skipped).
     Ranges named like steps (``ProfilerStep#N``, ``step N``, ``iteration_N``, ``train_step:N``...)
     are ``step`` events.
  5. Processes and ranks (``traceprof.collectors.nsys.ranks``): an export with several processes with CUDA
     work (one ``nsys profile`` around a whole ``torchrun``) becomes one trace per process, its rank
     from the process's recorded environment, its ``MPI Rank N`` thread name or its device (the rule
     is in ``traces.meta.rank_source`` and a warning); one process: the recorded environment
     (``RANK``, else ``OMPI_COMM_WORLD_RANK``, ``PMI_RANK``, ``SLURM_PROCID``, ``PMIX_RANK``), else
     ``MPI Rank N``, else the file name as ``nsys profile -o name_%q{RANK}`` writes it; world size
     from ``WORLD_SIZE`` (one process: also ``OMPI_COMM_WORLD_SIZE``, ``SLURM_NTASKS``, ...).
  5a. Step ranges of different numbers that overlap: the one that runs more than 5 us past the next
     one's start ends there, as Kineto's ProfilerSteps do (``overrun``, a warning naming both,
     counted in ``traces.meta.repaired``). A CPU-side row (NVTX range, CUDA API call) that ends far past the trace's step range (more than
     its length, at least 1 s) is clipped to the end of the trace's other rows; a GPU row (kernel,
     copy, memset) that runs past the next row on its stream (by more than 5 us) to that row's start,
     the last of a stream that ends far past the range to the end of the other GPU rows;
     ``events.flag`` = ``overrun``, ``raw_dur_ns`` the recorded duration, with a warning naming them
     (``traceprof.collectors.nsys.late``, the rules Kineto's checks apply). Before that, a GPU row
     that starts more than 1 ms before the earliest launch call with its ``correlationId`` is
     stamped in another clock domain: flagged ``before_launch`` (left out of windows, idle, latency
     and collectives), 5 us to 1 ms before it ``launch_skew`` (clock jitter: kept, no latency),
     with a warning (``traceprof.collectors._launch_order``, as Kineto's step 1). A GPU row with
     no launch call (its runtime record lost with it) that lies far from the bulk of the trace
     (Kineto's ``far_outside`` rule, ``traceprof.collectors._far_end.far_records``) is flagged
     ``far_outside``, with a warning; so is one that starts more than the margin after its launch
     call and past the other rows' last start by more than the margin (a kernel 200 s after its
     launch was clipped to 0 ns as an overrun but kept its start: window 201 s).
  6. Steps: a CPU row gets the step whose range holds its start; a GPU row the step of its launch
     (same correlation), else its own start. One ``steps`` row per step range, with the first and
     last GPU activity launched in it.
  7. Devices from ``TARGET_INFO_GPU`` (``id`` is the kernels' ``deviceId``; a process of a
     multi-process export gets the devices it used).
  8. Collectives: one ``nccl_kernel`` row per communication kernel (class ``comm``), op from the
     kernel name, enter = start of its launch call; no process group or sequence number (matched
     by order across ranks).
  9. CUDA memory (``CUDA_GPU_MEMORY_USAGE_EVENTS``, ``nsys profile --cuda-memory-usage=true``): one
     ``instant`` event ``[memory]`` per allocation or free with Kineto's ``[memory]`` args (``Bytes``
     negative for a free, no totals; ``traceprof.collectors.nsys.tables.memory``), read by ``analyses/memory.py``.

Source fields read: ``TARGET_INFO_SESSION_START_TIME.utcEpochNs``, ``StringIds``, the kernel /
graph-trace / memcpy / memset / sync / runtime / driver tables (start, end, deviceId, streamId,
correlationId, globalPid / globalTid, names, grid/block, registers, shared memory, bytes, copyKind,
srcKind, dstKind, memKind, syncType, graphNodeId, graphId, graphExecId, contextId, greenContextId),
``ENUM_CUDA_MEMCPY_OPER``, ``ENUM_CUDA_MEM_KIND``, ``ENUM_CUPTI_SYNC_TYPE``, ``NVTX_EVENTS`` (start,
end, eventType, text, textId, globalTid, domainId, category, payloads), ``TARGET_INFO_GPU``,
``TARGET_INFO_SYSTEM_ENV``, ``META_DATA_CAPTURE``, ``META_DATA_EXPORT`` / ``EXPORT_META_DATA``,
``CUDA_GPU_MEMORY_USAGE_EVENTS`` (start, globalPid, deviceId, address, bytes, memKind,
memoryOperationType, pc, correlationId, name).
"""

from __future__ import annotations

import hashlib
import sqlite3
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa

from traceprof.collectors._arrow import row_schema
from traceprof.collectors._duplicates import drop_duplicates
from traceprof.collectors.nsys import ranks, tables
from traceprof.collectors.nsys.export import SQLITE_MAGIC
from traceprof.collectors.nsys.late import clip_far_ends, flag_before_launch
from traceprof.collectors.nsys.steps import assign_steps, step_number
from traceprof.core.classify import EXCLUDED_FLAGS, Classifier
from traceprof.core.errors import NotATraceError, TraceFormatError
from traceprof.core.fileio import read_file
from traceprof.core.limits import drop_long_text, to_table
from traceprof.core.ops import kernel_op
from traceprof.core.parsed import DEFAULT_OPTIONS, ParsedTrace, ParseOptions
from traceprof.core.schema import is_kernel_launch
from traceprof.core.text import first_few
from traceprof.core.vocab import CollectiveSource, TraceSource
from traceprof.storage.identity import RELATIVE_CLOCK

__all__ = ["parse", "parse_all", "SQLITE_MAGIC"]

_GPU = frozenset({"kernel", "memcpy", "memset", "sync"})
_SESSION = "TARGET_INFO_SESSION_START_TIME"
_PID_BITS = 0xFFFFFF


@dataclass
class _Export:
    """What :func:`_read` reads from an open export."""

    rows: tables.Rows
    env: ranks.Env
    devices: list[dict[str, Any]]
    meta: dict[str, Any]
    host: str | None
    epoch: int
    warnings: list[str] = field(default_factory=list)


def _session_start(con: sqlite3.Connection, have: dict[str, set[str]], p: Path) -> tuple[int, str | None]:
    """(epoch ns of the capture start, None), or (0, warning) when the export has none usable."""
    if _SESSION not in have or "utcEpochNs" not in have[_SESSION]:
        why = f"no {_SESSION}.utcEpochNs"
    else:
        row = con.execute(f"SELECT utcEpochNs FROM {_SESSION} LIMIT 1").fetchone()
        value = row[0] if row else None
        if isinstance(value, int) and value > 0:
            return value, None
        why = f"{_SESSION} is empty" if row is None else f"{_SESSION}.utcEpochNs is {value!r}"
    return 0, (
        f"{p.name}: {why} (no capture start time): its times are ns from the capture start, not epoch "
        "time; they are aligned to the other ranks' through matched collectives when there are any, "
        "else they cannot be compared with other files' times"
    )


def _meta(con: sqlite3.Connection, have: dict[str, set[str]]) -> dict[str, Any]:
    meta: dict[str, Any] = {"clock_synced_by_source": False}
    for table in ("META_DATA_EXPORT", "EXPORT_META_DATA"):
        if table in have:
            rows = dict(con.execute(f"SELECT name, value FROM {table}").fetchall())
            meta["nsys_version"] = rows.get("EXPORT_PRODUCT_VERSION") or rows.get("NSYS_VERSION")
            meta["export_schema"] = rows.get("EXPORT_SCHEMA_VERSION")
    if "META_DATA_CAPTURE" in have:
        cap = dict(
            con.execute("SELECT name, value FROM META_DATA_CAPTURE WHERE name LIKE 'PROCESS_0:%'").fetchall()
        )
        cmd = [cap.get("PROCESS_0:COMMAND")] + [
            cap[k] for k in sorted(cap, key=lambda k: (len(k), k)) if k.startswith("PROCESS_0:ARGUMENT_")
        ]
        meta["command"] = " ".join(c for c in cmd if c)
    return meta


def _devices(con: sqlite3.Connection, have: dict[str, set[str]]) -> list[dict[str, Any]]:
    if "TARGET_INFO_GPU" not in have:
        return []
    q = "SELECT id, name, smCount, totalMemory, computeMajor, computeMinor FROM TARGET_INFO_GPU ORDER BY id"
    return [
        {
            "device": i,
            "name": None if n is None else str(n),
            "sm_count": _int(sm),
            "memory_bytes": _int(mem),
            "compute_capability": f"{a}.{b}" if a is not None else None,
        }
        for i, n, sm, mem, a, b in con.execute(q)
        if isinstance(i, int)
    ]  # a device without an id is no device


def _int(v: Any) -> int | None:
    """An integer cell, else None (a damaged export's text in a number column)."""
    return v if isinstance(v, int) else None


def _read(con: sqlite3.Connection, p: Path, options: ParseOptions) -> _Export:
    """Everything :func:`parse_all` reads from the open export (module doc, steps 1-4, 7)."""
    have = tables.table_columns(con)
    if not any(t.startswith(("CUPTI_ACTIVITY_KIND_", "NVTX_EVENTS", "TARGET_INFO_")) for t in have):
        raise NotATraceError(
            p,
            "",
            "an SQLite file but not an Nsight Systems export (no CUPTI_ACTIVITY_KIND_* "
            "/ NVTX_EVENTS / TARGET_INFO_* tables)",
        )
    if "StringIds" not in have:
        raise TraceFormatError(
            p,
            "StringIds",
            "missing: the table of names (kernels, CUDA calls) that every "
            "export has; the export is incomplete: export the .nsys-rep again "
            "(nsys export --type sqlite)",
        )
    epoch, clock_warning = _session_start(con, have, p)
    rows = tables.Rows(p, epoch, options.on_bad_event, options.classifier)
    tables.kernels(con, have, rows)
    tables.copies(con, have, rows)
    tables.graphs(con, have, rows)  # after the node-level rows it may duplicate
    tables.api(con, have, rows)
    tables.nvtx(con, have, rows)
    tables.memory(con, have, rows)
    cols = {**rows.cols, "proc": rows.procs}  # a name or args text too long to store: a bad row
    drop_long_text(p, cols, None, options.on_bad_event, rows.rejected, what="row")
    rows.procs, rows.cols = cols.pop("proc"), cols
    meta = _meta(con, have)
    if clock_warning:
        meta["clock"] = RELATIVE_CLOCK
    host = (
        dict(
            con.execute("SELECT name, value FROM TARGET_INFO_SYSTEM_ENV WHERE name = 'Hostname'").fetchall()
        ).get("Hostname")
        if "TARGET_INFO_SYSTEM_ENV" in have
        else None
    )
    return _Export(
        rows,
        ranks.read_env(con, have),
        _devices(con, have),
        meta,
        host,
        epoch,
        [clock_warning] if clock_warning else [],
    )


def parse_all(path: str | Path, options: ParseOptions = DEFAULT_OPTIONS) -> list[ParsedTrace]:
    """Parse one Nsight Systems SQLite export: one trace per rank it holds.

    Args:
        path: A ``.sqlite`` file written by ``nsys export --type sqlite``.
        options: How to read it (``traceprof.core.parsed.ParseOptions``): its classifier of GPU
            activity (``--comm-kernel`` patterns), and ``on_bad_event``: ``"raise"`` stops at the first row of a kernel, graph-trace, memcpy, memset,
            sync, runtime, driver or NVTX table whose ``start``/``end`` are not integers with
            0 <= start <= end and session start + end within int64 (or whose ids are not
            integers, or whose name's string id ``StringIds`` lacks); ``"skip"`` counts such rows in ``rejected`` by table and reason
            (``"CUPTI_ACTIVITY_KIND_MEMCPY: NULL end"``).

    Returns:
        :class:`ParsedTrace` objects (source ``nsys``), one per process with CUDA work (module doc,
        step 5; one for a one-rank export), in rank order, with events, steps, devices and
        collectives; times are epoch ns (relative to the capture start without a session start
        time). Rows no trace holds (unusable times, other processes) are counted on the first.

    Raises:
        NotATraceError: An SQLite file that is not an Nsight Systems export.
        TraceFormatError: Unreadable, no ``StringIds``, conflicting ranks, or (``raise``) a row
            with unusable times, ids or name string ids, naming its table and row id.
    """
    p = Path(path).resolve()
    raw = read_file(p)
    for tolerant in (False, True):  # a rare non-UTF-8 string: read again, replacing bad bytes
        con = tables.open_export(p, tolerant)
        try:
            exp = _read(con, p, options)
            break
        except sqlite3.OperationalError as e:
            if tolerant or "decode" not in str(e):
                raise TraceFormatError(p, "", f"SQLite error while reading the export ({e})") from None
        except sqlite3.Error as e:
            raise TraceFormatError(p, "", f"SQLite error while reading the export ({e})") from None
        except UnicodeDecodeError:  # an SQLite error message quoting damaged bytes
            raise TraceFormatError(
                p, "", "SQLite error while reading the export (damaged file: SQLite's error is not UTF-8)"
            ) from None
        finally:
            con.close()
    sha = hashlib.sha256(raw).hexdigest()
    cols = exp.rows.cols
    sp = ranks.split(cols, exp.rows.procs)
    rejected = {**exp.rows.rejected, **sp.rejected}
    skipped = {**exp.rows.skipped, **sp.skipped}
    if None in sp.rows:
        names = set().union(*exp.rows.thread_ranks.values()) if exp.rows.thread_ranks else set()
        rank, how, warns = ranks.file_rank(p, exp.env.text, names)
        return [
            _trace(
                p,
                len(raw),
                sha,
                exp,
                cols,
                rank,
                how,
                ranks.world_size(exp.env, False),
                [*exp.warnings, *warns],
                rejected,
                skipped,
                None,
            )
        ]
    procs = sorted(k for k in sp.rows if k is not None)
    sub = {k: {c: [v[i] for i in sp.rows[k]] for c, v in cols.items()} for k in procs}
    used = {
        k: {d for kd, d in zip(sub[k]["kind"], sub[k]["device"], strict=True) if kd in _GPU and d is not None}
        for k in procs
    }
    rank_of, how, warns = ranks.process_ranks(p, procs, exp.env, exp.rows.thread_ranks, used)
    procs.sort(key=lambda k: rank_of[k])
    note = (
        f"{p.name}: {len(procs)} processes with CUDA work (one nsys profile around several ranks): one trace "
        f"each, kernels linked to launches within their process; rank from {how}: "
        + ", ".join(f"pid {k & _PID_BITS} -> rank {rank_of[k]}" for k in procs)
    )
    if sp.others:
        note += (
            f"; rows of {len(sp.others)} other process(es) without CUDA work not stored (pid "
            f"{first_few(sp.others, 5)})"
        )
    world = ranks.world_size(exp.env, True)
    out = []
    for i, k in enumerate(procs):
        first = i == 0
        out.append(
            _trace(
                p,
                len(raw),
                sha,
                exp,
                sub[k],
                rank_of[k],
                how,
                world,
                [*exp.warnings, note, *warns] if first else [],
                rejected if first else {},
                skipped if first else {},
                k,
            )
        )
    return out


def parse(path: str | Path, options: ParseOptions = DEFAULT_OPTIONS) -> ParsedTrace:
    """Parse a one-rank Nsight Systems SQLite export (:func:`parse_all`, which see).

    Raises:
        TraceFormatError: As :func:`parse_all`, and an export that holds several ranks' processes
            (read it with :func:`parse_all`, as ``traceprof ingest`` does).
    """
    traces = parse_all(path, options)
    if len(traces) > 1:
        raise TraceFormatError(
            path,
            "",
            f"holds {len(traces)} processes with CUDA work (several ranks): read it "
            "with parse_all() (traceprof ingest does)",
        )
    return traces[0]


def _pid(cols: dict[str, list[Any]], proc: int | None) -> str | None:
    """The trace's process (``traces.pid``, text): the process the trace was split by (``proc``);
    else the pid of most CUDA runtime calls, else of most CPU rows (NVTX, driver calls: an export
    without runtime calls); None when no row names a process (was None, shown as 'None', for an
    export without runtime calls)."""
    if proc is not None:
        return str(proc & _PID_BITS)
    for cpu in (lambda k, d: k == "cuda_runtime", lambda k, d: d is None):
        pids = Counter(
            pid
            for k, d, pid in zip(cols["kind"], cols["device"], cols["pid"], strict=True)
            if pid and cpu(k, d)
        )
        if pids:
            return min(pids, key=lambda x: (-pids[x], x))
    return None


def _trace(
    p: Path,
    size: int,
    sha: str,
    exp: _Export,
    cols: dict[str, list[Any]],
    rank: int | None,
    how: str,
    world: int | None,
    warnings: list[str],
    rejected: dict[str, int],
    skipped: dict[str, int],
    proc: int | None,
) -> ParsedTrace:
    """One trace from the rows ``cols`` of one process (``proc``; None: the whole export)."""
    label = p.name if proc is None else f"{p.name} (pid {proc & _PID_BITS})"
    repaired: dict[str, int] = {}  # exact duplicate rows dropped, rows clipped: by reason
    duplicate = drop_duplicates(label, cols, None, lambda r: _row_where(cols, r), repaired)
    early = flag_before_launch(label, cols)  # GPU rows stamped in another clock domain enter no window
    far, clipped = clip_far_ends(label, cols)  # a row ending years past the rest stretches no window
    repaired |= clipped
    steps, cols["step"] = assign_steps(cols)
    graph = [d for c, d in zip(cols["cat"], cols["dur_ns"], strict=True) if c == tables.GRAPH_CAT]
    (graph_calls, lost), (launches, lost_launches) = _launches_without_gpu(cols)
    warnings = [
        *warnings,
        *([duplicate] if duplicate else []),
        *_notices(label, cols, graph, lost, graph_calls),
        *early,
        *far,
    ]
    used = Counter(d for k, d in zip(cols["kind"], cols["device"], strict=True) if k == "kernel")
    devices = exp.devices if proc is None else [d for d in exp.devices if d["device"] in used] or exp.devices
    names = {d["device"]: d["name"] for d in devices}
    meta = {**exp.meta, "rank_source": how}
    if proc is not None:
        meta["process"] = {"pid": proc & _PID_BITS, "globalPid": proc << 24}
    if graph:
        meta["graph_level"] = {"executions": len(graph), "ns": sum(graph)}
    if lost:
        meta["graph_launches"] = graph_calls
        meta["graph_launches_without_gpu"] = lost
    if lost_launches:  # read by traceprof.engine.activity.unmatched_launch_notes
        meta["kernel_launches"] = launches
        meta["kernel_launches_without_gpu"] = lost_launches
    if repaired:  # rows clipped, by reason: the issues column of traceprof runs
        meta["repaired"] = {**meta.get("repaired", {}), **repaired}
    top = min(used, key=lambda d: (-used[d], d)) if used else None
    trace = {
        "host": exp.host,
        "pid": _pid(cols, proc),
        "base_time_ns": exp.epoch,
        "device_name": names.get(top, devices[0]["name"] if devices else None),
        "meta": msgspec.json.encode(meta).decode(),
    }
    flagged = dict(Counter(f for f in cols["flag"] if f is not None))
    return ParsedTrace(
        path=str(p),
        sha256=sha,
        bytes=size,
        source=TraceSource.nsys,
        format=f"nsys-sqlite-{meta.get('export_schema') or '?'}",
        rank=rank,
        world_size=world,
        trace=trace,
        events=pa.Table.from_pydict(cols, schema=pa.schema([row_schema("events").field(c) for c in cols])),
        devices=to_table(
            devices, row_schema("devices"), rejected, "TARGET_INFO_GPU"
        ),  # ints beyond: left out
        steps=pa.Table.from_pylist(steps, schema=row_schema("steps")),
        collectives=pa.Table.from_pylist(
            _collectives(cols, exp.rows.classifier), schema=row_schema("collectives")
        ),
        events_read=len(cols["kind"]) + sum(rejected.values()) + sum(skipped.values()),
        rejected=rejected,
        skipped=skipped,
        flagged=flagged,
        warnings=warnings,
    )


def _row_where(cols: dict[str, list[Any]], r: int) -> str:
    """``kernel 'volta_sgemm' at 1767225600001020000 ns``: row ``r`` of ``cols`` in a message."""
    return f"{cols['kind'][r]} {str(cols['name'][r])[:60]!r} at {cols['ts_ns'][r]} ns"


def _gpu_correlations(cols: dict[str, list[Any]]) -> set[Any]:
    """The correlation ids of a trace's kernel, copy and memset rows (graph-level records included)."""
    return {
        corr
        for k, corr in zip(cols["kind"], cols["correlation"], strict=True)
        if k in ("kernel", "memcpy", "memset") and corr is not None
    }


def _launches_without_gpu(cols: dict[str, list[Any]]) -> tuple[tuple[int, int], tuple[int, int]]:
    """For CUDA graph launch calls (``cudaGraphLaunch``) and kernel launch calls
    (:func:`~traceprof.core.schema.is_kernel_launch`), each with a correlation id, of a trace's rows:
    how many, and how many of them no GPU row (kernel, copy, memset, graph-level record) carries the
    correlation id of, in one pass over the rows. A graph replayed with neither node-level rows nor
    ``CUPTI_ACTIVITY_KIND_GRAPH_TRACE`` rows (an nsys that does not export that table, graph tracing
    off), or a kernel the trace does not hold, has its GPU time missing from the trace.

    Returns:
        ((graph launch calls, without a GPU row), (kernel launch calls, without a GPU row)).
    """
    gpu = _gpu_correlations(cols)
    kernel_names = {n for n in set(cols["name"]) if n is not None and is_kernel_launch(str(n))}
    graph: list[Any] = []
    kernel: list[Any] = []
    for k, n, corr in zip(cols["kind"], cols["name"], cols["correlation"], strict=True):
        if k not in ("cuda_runtime", "cuda_driver") or corr is None:
            continue
        if "graphlaunch" in str(n).lower():
            graph.append(corr)
        if n in kernel_names:
            kernel.append(corr)
    return (
        (len(graph), sum(1 for c in graph if c not in gpu)),
        (len(kernel), sum(1 for c in kernel if c not in gpu)),
    )


def _notices(
    label: str, cols: dict[str, list[Any]], graph: list[int], lost: int = 0, calls: int = 0
) -> list[str]:
    """Warnings about what a trace's rows say of themselves: graphs traced per graph (``graph``: the
    durations of its graph-level records, ns), graph launches with no GPU record (``lost`` of
    ``calls``), NVTX ranges never closed."""
    out = []
    if lost:
        out.append(
            f"{label}: {lost} of {calls} CUDA graph launch(es) (cudaGraphLaunch) have no GPU record: no kernel rows "
            "and no CUPTI_ACTIVITY_KIND_GRAPH_TRACE rows for them (an export without that table, or graph tracing "
            "off): their GPU time is missing, so busy, idle and kernel figures leave those graph "
            "executions out (idle is overstated): record them with nsys profile "
            "--cuda-graph-trace=node (or graph, with an nsys that exports the graph trace)"
        )
    if graph:
        out.append(
            f"{label}: {len(graph)} CUDA graph execution(s) ({sum(graph):,} ns of GPU time) were traced per "
            "graph (CUPTI_ACTIVITY_KIND_GRAPH_TRACE: nsys --cuda-graph-trace=graph, the default) with no "
            "kernel rows: each is one GPU record 'CUDA graph <graphId>' counted as busy compute time; the "
            "kernels inside and their classes (communication included) are unknown: record them with "
            "nsys profile --cuda-graph-trace=node"
        )
    opened = [n for n, f in zip(cols["name"], cols["flag"], strict=True) if f == "unmatched_begin"]
    if opened:
        msg = (
            f"{label}: {len(opened)} NVTX range(s) never closed (end NULL: the capture stopped inside them), "
            "stored as instants flagged unmatched_begin (left out of windows)"
        )
        open_steps = sorted({n for n in opened if step_number(n) is not None})
        if open_steps:
            msg += f"; the work launched in step range(s) {', '.join(open_steps[:3])} belongs to no step"
        out.append(msg)
    return out


def _collectives(cols: dict[str, list[Any]], classifier: Classifier) -> list[dict[str, Any]]:
    """One ``nccl_kernel`` row per communication kernel (module doc, step 8; one flagged
    ``before_launch`` has no time to match by, and is left out), with ordinals; a
    kernel's family (``classifier``) names its op where its name does (DeepEP: all_to_all)."""
    launch: dict[int, int] = {}
    for k, c, t in zip(cols["kind"], cols["correlation"], cols["ts_ns"], strict=True):
        if k in ("cuda_runtime", "cuda_driver") and c is not None:
            launch[c] = min(t, launch.get(c, t))  # the first call of the id, whatever the rows' order
    out = []
    for i, k in enumerate(cols["kind"]):
        if k != "kernel" or cols["class"][i] != "comm" or cols["flag"][i] in EXCLUDED_FLAGS:
            continue
        name = cols["name"][i]
        fam = classifier.family(name)
        out.append(
            {
                "source": CollectiveSource.nccl_kernel,
                "pg": None,
                "seq": None,
                "op": (fam.op if fam is not None and fam.op else kernel_op(name)),
                "enter_ns": launch.get(cols["correlation"][i]),
                "start_ns": cols["ts_ns"][i],
                "end_ns": cols["ts_ns"][i] + cols["dur_ns"][i],
                "stream": cols["stream"][i],
                "step": cols["step"][i],
            }
        )
    out.sort(key=lambda r: (r["start_ns"], r["end_ns"]))
    seen: dict[str, int] = {}
    for r in out:
        r["ordinal"] = seen.get(r["op"], 0)
        seen[r["op"]] = r["ordinal"] + 1
    return out
