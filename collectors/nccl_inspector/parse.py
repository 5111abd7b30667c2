"""Parse NCCL Inspector output (``ext-profiler/inspector``, NCCL 2.28.3+) into collectives rows.

The Inspector plugin (``NCCL_PROFILER_PLUGIN=libnccl-profiler-inspector.so``,
``NCCL_INSPECTOR_ENABLE=1``) writes one file per process, ``<dump dir>/<hostname>-pid<pid>.log``
(dump dir ``nccl-inspector-<SLURM job id>`` or ``nccl-inspector-unknown-jobid`` by default), one
JSON object per line: ``header`` (communicator ``id``, this process's ``rank`` in it, ``n_ranks``,
``nnodes``; ``comm_name`` from v4.2), ``metadata`` (``inspector_output_format_version``,
``dump_timestamp_us``, ``hostname``, ``pid``) and ``coll_perf`` (``coll``, ``coll_sn``,
``coll_msg_size_bytes``, ``coll_exec_time_us``, ``coll_timing_source``, ``coll_algobw_gbs``,
``coll_busbw_gbs``; with ``NCCL_INSPECTOR_DUMP_VERBOSE=1`` also ``event_trace_sn`` and
``event_trace_ts``: ``coll_start_ts``, ``coll_stop_ts`` and per channel ``kernel_start_ts``,
``kernel_stop_ts``, ``kernel_record_ts``, epoch microseconds). Point-to-point records hold
``p2p_perf`` (``p2p``, ``p2p_peer``, ``p2p_sn``, ...) instead; v4.1+ adds ``dump_stats`` records
counting records the plugin dropped. Versions read: v4.0 to v4.x (v4.1 ``dump_stats``, v4.2
``coll_algo`` / ``coll_proto`` add fields only); any other version is refused naming it.

Algorithm:
  1. Read the file (gzip too), one record per line (the plugin's output; records printed over
     several lines, as the plugin's README shows them, are read one JSON object after another); a
     line that is not JSON, not an Inspector record or holds a value that cannot be stored is a
     bad record: an error naming the file and the line, or with ``on_bad_event="skip"`` skipped
     and counted. A last record cut short (the process died while writing) is dropped with a
     warning. Its numbers (``coll_sn``, the message sizes, the epoch-us times) are JSON integers
     (``traceprof.core.values.record_int``'s rule): ``"7"`` or ``7.0`` makes the record bad.
  2. Each ``coll_perf`` record is one collectives row (source ``nccl_inspector``): pg = the
     communicator ``id``, seq = ``coll_sn``, op from ``coll``; NCCL numbers each op type of a
     communicator separately (``seqNumber[func]``), so ``comms_id`` = ``<id>:<op>:<coll_sn>`` (``traceprof.core.ops.nccl_comms_id``)
     is the key that matches one instance across ranks. Bytes as nccl-tests counts them (the
     plugin's ``coll_msg_size_bytes`` is the per-rank size of AllGather / ReduceScatter: bytes_in
     = size, bytes_out = size x n_ranks for AllGather, the reverse for ReduceScatter, both = size
     otherwise). enter = ``coll_start_ts``, start = the earliest ``kernel_start_ts``, end = the
     latest ``kernel_stop_ts`` (all channels; a 0 is a time never set: unknown, flagged
     ``zero_ts``, as is a record whose ``kernel_events`` is empty or absent: no kernel time was
     recorded, start and end unknown, with a warning counting them). The reported ``coll_algobw_gbs`` / ``coll_busbw_gbs`` are kept as
     ``reported_algbw_gbps`` / ``reported_busbw_gbps`` (a value that is not a finite non-negative
     number is a bad record), beside the bandwidth ``collective_perf`` computes from the times.
     One ``collective`` event per record keeps the whole record as args (the
     reported ``coll_exec_time_us``, ``coll_algobw_gbs``, ``coll_busbw_gbs``); a record without
     ``event_trace_ts`` (not verbose) has no start / end: its event is an ``instant`` at its dump
     time, with a warning. ``p2p_perf`` records are point-to-point rows (pg ``<id>:p2p``), left
     unmatched (``p2p_sn`` does not pair a send with its recv); ``p2p_peer`` (the other end's rank in
     the communicator, a JSON integer) is ``peer_group_rank``.
  3. Rank: the file is one process; its rank is ``header.rank`` in its largest communicator (the
     world communicator when it has one), with a warning when communicators disagree; world size
     = the largest ``n_ranks``. Host and pid from ``metadata``. A ``header.rank`` or ``n_ranks``
     written as a string (``"3"``) is read as its integer, said and counted in
     ``traces.meta.repaired`` (``traceprof.core.values.identity_int``'s rule).

Source fields read: ``header.{id, rank, n_ranks, nnodes, comm_name}``,
``metadata.{inspector_output_format_version, dump_timestamp_us, hostname, pid}``,
``coll_perf.{coll, coll_sn, coll_msg_size_bytes, coll_exec_time_us, coll_algobw_gbs, coll_busbw_gbs,
event_trace_ts}``,
``p2p_perf.{p2p, p2p_peer, p2p_msg_size_bytes, event_trace_ts}``, ``dump_stats.*num_dropped*``.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa

from traceprof.collectors._arrow import row_schema
from traceprof.collectors._duplicates import duplicate_records
from traceprof.collectors.nccl_inspector.names import looks_like_inspector
from traceprof.core.errors import TraceFormatError
from traceprof.core.fileio import read_maybe_gzip
from traceprof.core.limits import INT64, fits, record_fits, skip_hint
from traceprof.core.ops import nccl_comms_id, normalize_op
from traceprof.core.parsed import DEFAULT_OPTIONS, ParsedTrace, ParseOptions
from traceprof.core.values import identity_int, number, record_int, spelled_int
from traceprof.core.vocab import CollectiveSource, TraceSource

__all__ = ["parse", "looks_like_inspector", "READ_VERSIONS"]

#: What this parser reads, for messages.
READ_VERSIONS = "v4.0 to v4.x (NCCL 2.28.3+)"
_VERSION = re.compile(r"v?(\d+)\.(\d+)")


def version_of(record: Any) -> str | None:
    """A record's ``metadata.inspector_output_format_version`` (None when absent)."""
    meta = record.get("metadata") if isinstance(record, dict) else None
    v = meta.get("inspector_output_format_version") if isinstance(meta, dict) else None
    return None if v is None else str(v)


def version_read(v: str | None) -> bool:
    """Whether version ``v`` is one this parser reads (major 4)."""
    m = _VERSION.fullmatch(v or "")
    return m is not None and int(m.group(1)) == 4


#: The process id in the Inspector's file name, ``<hostname>-pid<pid>.log``.
_PID_NAME = re.compile(r"-pid(\d+)\.log(?:\.gz)?$")


def _pid(p: Path, events: list[dict[str, Any]]) -> str | None:
    """The file's process: the records' ``metadata.pid`` (the most common), else the ``-pid<pid>``
    of the file's name, else None."""
    said = Counter(e["pid"] for e in events if e["pid"])
    if said:
        return said.most_common(1)[0][0]
    m = _PID_NAME.search(p.name)
    return m.group(1) if m else None


class _Bad(Exception):
    """A record that cannot be stored: ``reason`` (counted) and ``detail`` (shown)."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(reason)
        self.reason, self.detail = reason, detail


def _uint(obj: dict[str, Any], key: str, where: str, *, required: bool = True) -> int | None:
    """A non-negative integer field, None when absent and not required; else :class:`_Bad`. A
    record's number (a time in epoch us, ``coll_sn``, a message size) is a JSON integer
    (``traceprof.core.values.record_int``): a string (``"1700000000000000"``, ``"7"``) or a float
    is not one (``coll_sn`` and the sizes were read from them silently)."""
    v = obj.get(key)
    if v is None:
        if required:
            raise _Bad(f"missing '{where}.{key}'")
        return None
    n, problem = record_int(v)
    if problem is not None or n is None or n < 0:
        raise _Bad(f"'{where}.{key}' not a non-negative integer", repr(v))
    return n


def _identity(obj: dict[str, Any], key: str, where: str) -> int:
    """A non-negative identity (``header.rank``, ``header.n_ranks``): a JSON integer, or a string
    or float that writes one (read as it, said and counted by the caller:
    ``traceprof.core.values.identity_int``); else :class:`_Bad`."""
    v = obj.get(key)
    if v is None:
        raise _Bad(f"missing '{where}.{key}'")
    n, _ = identity_int(v)
    if n is None or n < 0:
        raise _Bad(f"'{where}.{key}' not a non-negative integer", repr(v))
    return n


def _peer_rank(value: Any) -> int | None:
    """A p2p_perf record's ``p2p_peer`` (the other end's rank in the communicator) when it is a
    JSON integer rank (>= 0, int32), else None."""
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**31
    return value if ok else None


def _gbps(perf: dict[str, Any], key: str) -> float | None:
    """A reported bandwidth (GB/s): a finite non-negative number, None when absent; else :class:`_Bad`."""
    v = perf.get(key)
    if v is None:
        return None
    x = number(v)
    if x is None or x < 0:
        raise _Bad(f"'coll_perf.{key}' not a non-negative number", repr(v))
    return x


def _us_ns(v: int | None, key: str) -> int | None:
    """Epoch microseconds -> ns; 0 (a time never set) -> None."""
    if not v:
        return None
    if not fits(v * 1000, INT64):
        raise _Bad(f"'{key}' beyond int64 ns", repr(v))
    return v * 1000


def _times(perf: dict[str, Any]) -> tuple[int | None, int | None, int | None, bool, bool]:
    """(enter, start, end ns, verbose: the record has event_trace_ts, an unset kernel time)."""
    ts = perf.get("event_trace_ts")
    if ts is None:
        return None, None, None, False, False
    if not isinstance(ts, dict):
        raise _Bad("'event_trace_ts' not an object")
    enter = _us_ns(_uint(ts, "coll_start_ts", "event_trace_ts", required=False), "coll_start_ts")
    kernels = ts.get("kernel_events") or []
    if not isinstance(kernels, list) or not all(isinstance(k, dict) for k in kernels):
        raise _Bad("'event_trace_ts.kernel_events' not a list of objects")
    starts = [
        _us_ns(_uint(k, "kernel_start_ts", "kernel_events[]", required=False), "kernel_start_ts")
        for k in kernels
    ]
    stops = [
        _us_ns(_uint(k, "kernel_stop_ts", "kernel_events[]", required=False), "kernel_stop_ts")
        for k in kernels
    ]
    # no kernel event at all (``kernel_events`` empty or absent: the kernel times were never
    # recorded) leaves start and end as unknown as a kernel time of 0 does
    unset = not kernels or None in starts or None in stops
    start = min((s for s in starts if s is not None), default=None)
    known = [t for t in stops if t is not None]
    end = (
        max(known) if known and len(known) == len(stops) else None
    )  # one channel's end unknown: so is the end
    return enter, start, end, True, unset


def _bytes(op: str, size: int | None, n: int) -> tuple[int | None, int | None]:
    """(bytes_in, bytes_out) from the plugin's message size (module doc, step 2)."""
    if size is None:
        return None, None
    if op == "all_gather":
        return size, size * n
    if op == "reduce_scatter":
        return size * n, size
    return size, size


def _record(rec: Any) -> tuple[dict[str, Any], dict[str, Any], str, dict[str, Any]]:
    """(header, metadata, kind, perf) of a record; :class:`_Bad` when it is none."""
    if not isinstance(rec, dict):
        raise _Bad("not a JSON object")
    header, meta = rec.get("header"), rec.get("metadata")
    kind = next((k for k in ("coll_perf", "p2p_perf", "dump_stats") if k in rec), None)
    if not isinstance(header, dict) or not isinstance(meta, dict) or kind is None:
        raise _Bad("not an NCCL Inspector record (no 'header', 'metadata' and 'coll_perf' / 'p2p_perf')")
    perf = rec[kind]
    if not isinstance(perf, dict):
        raise _Bad(f"'{kind}' not an object")
    return header, meta, kind, perf


def _dropped(stats: Any) -> int:
    """Sum of the ``*num_dropped*`` counters anywhere in a ``dump_stats`` record."""
    if isinstance(stats, dict):
        return sum(
            v if "num_dropped" in k and isinstance(v, int) and not isinstance(v, bool) else _dropped(v)
            for k, v in stats.items()
        )
    if isinstance(stats, list):
        return sum(_dropped(v) for v in stats)
    return 0


def _fields(kind: str) -> dict[str, str]:
    """Store column -> the record's field it is read from (``op`` -> ``coll_perf.coll``), for a value
    too long or too large to be named as the file spells it (``traceprof.core.limits.record_fits``)."""
    name = f"{kind}.{'p2p' if kind == 'p2p_perf' else 'coll'}"
    seq = f"{kind}.coll_sn"
    return {
        "pg": "header.id",
        "op": name,
        "name": name,
        "seq": seq,
        "external_id": seq,
        "pid": "metadata.pid",
    }


def _rows_of(
    rec: dict[str, Any], header: dict[str, Any], meta: dict[str, Any], kind: str, perf: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any], str]:
    """The collectives row and event row of one coll_perf / p2p_perf record, and its warning key
    ("" when its times are complete)."""
    comm = header.get("id")
    if not isinstance(comm, str) or not comm:
        raise _Bad("'header.id' not a string", repr(comm))
    n = _identity(header, "n_ranks", "header")
    if n < 1:
        raise _Bad("'header.n_ranks' below 1", "0")
    p2p = kind == "p2p_perf"
    name = perf.get("p2p" if p2p else "coll")
    if not isinstance(name, str) or not name:
        raise _Bad(f"'{kind}.{'p2p' if p2p else 'coll'}' not a string", repr(name))
    seq = None if p2p else _uint(perf, "coll_sn", kind)
    size = _uint(perf, "p2p_msg_size_bytes" if p2p else "coll_msg_size_bytes", kind, required=not p2p)
    enter, start, end, verbose, unset = _times(perf)
    op = normalize_op(name)
    b_in, b_out = _bytes(op, size, n)
    dump_ns = _us_ns(_uint(meta, "dump_timestamp_us", "metadata", required=False), "dump_timestamp_us")
    pid = meta.get("pid")
    row = {
        "source": CollectiveSource.nccl_inspector,
        "pg": f"{comm}:p2p" if p2p else comm,
        "pg_ranks": None,
        "seq": seq,
        "p2p": p2p,
        "comms_id": None if p2p else nccl_comms_id(comm, op, seq),
        "op": op,
        "dtype": None,
        "nelems_in": None,
        "nelems_out": None,
        "bytes_in": b_in,
        "bytes_out": b_out,
        "group_size": n,
        "enter_ns": enter,
        "start_ns": start,
        "end_ns": end,
        "stream": None,
        "tid": None,
        "step": None,
        "reported_algbw_gbps": None if p2p else _gbps(perf, "coll_algobw_gbs"),
        "reported_busbw_gbps": None if p2p else _gbps(perf, "coll_busbw_gbs"),
        "peer_group_rank": _peer_rank(perf.get("p2p_peer")) if p2p else None,
    }
    at = start or enter or end
    event = {
        "kind": "collective" if verbose else "instant",
        "cat": "nccl_inspector",
        "name": name,
        "ts_ns": at if at is not None else (dump_ns or 0),
        "dur_ns": end - start if start and end and end >= start else 0,
        "pid": "" if pid is None else str(pid),
        "tid": "",
        "device": None,
        "stream": None,
        "correlation": None,
        "external_id": seq,
        "step": None,
        "args": msgspec.json.encode(rec).decode(),
        "flag": "zero_ts" if unset else None,
    }
    if end is not None and start is not None and end < start:
        raise _Bad("kernel stop before kernel start", f"{start} > {end} ns")
    why = (
        ""
        if verbose and not unset
        else (
            "no event_trace_ts"
            if not verbose
            else (
                "a kernel time never set (0)"
                if perf["event_trace_ts"].get("kernel_events")
                else "no kernel_events"
            )
        )
    )
    return row, event, why


_CUT = object()  # a last record cut short


def _records(p: Path, data: bytes) -> Iterator[tuple[int, Any]]:
    """(line number from 1, decoded record, or :class:`_Bad` / ``_CUT``) per record (module doc, step 1)."""
    lines = data.split(b"\n")
    filled = [i for i, ln in enumerate(lines) if ln.strip()]
    if filled and lines[filled[0]].strip() == b"{":  # pretty-printed: JSON objects one after another
        yield from _objects(p, data.decode("utf-8", "replace"))
        return
    for i in filled:
        try:
            yield i + 1, msgspec.json.decode(lines[i])
        except msgspec.DecodeError as e:
            cut = i == filled[-1] and not data.endswith(b"\n")
            yield i + 1, _CUT if cut else _Bad("not JSON", str(e))


def _objects(p: Path, text: str) -> Iterator[tuple[int, Any]]:
    """Records printed over several lines: JSON objects one after another. A broken one leaves no
    way to find the next: an error naming its line, unless it is the last, cut short."""
    dec, i, line = json.JSONDecoder(), 0, 1
    while True:
        j = len(text) - len(text[i:].lstrip())
        line += text.count("\n", i, j)
        if j >= len(text):
            return
        try:
            rec, end = dec.raw_decode(text, j)
        except (json.JSONDecodeError, RecursionError) as e:
            if isinstance(e, json.JSONDecodeError) and e.pos >= len(text.rstrip()):
                yield line, _CUT
                return
            raise TraceFormatError(
                p, f"line {line}", f"not JSON ({e}); the records after it cannot be found: fix or remove it"
            ) from None
        yield line, rec
        line += text.count("\n", j, end)
        i = end


def _same(item: tuple[int, Any]) -> bytes | None:
    """What identifies an Inspector record: all of it (keys sorted); None for a bad or cut one."""
    rec = item[1]
    if not isinstance(rec, dict):
        return None
    try:
        return msgspec.json.encode(rec, order="sorted")
    except (TypeError, OverflowError, msgspec.EncodeError):
        return repr(rec).encode()


def _rank(p: Path, comms: dict[str, tuple[int, int, int]]) -> tuple[int, int, list[str]]:
    """(rank, world size, warnings) from {communicator: (rank, n_ranks, records)} (module doc, step 3)."""
    comm, (rank, world, _) = max(comms.items(), key=lambda kv: (kv[1][1], kv[1][2], kv[0]))
    ranks = {r for r, _, _ in comms.values()}
    warn = (
        []
        if len(ranks) == 1
        else [
            f"{p.name}: the process has ranks {sorted(ranks)} in its {len(comms)} communicators; rank {rank} of "
            f"communicator {comm} ({world} ranks, the largest) taken as its rank"
        ]
    )
    return rank, world, warn


def parse(path: str | Path, options: ParseOptions = DEFAULT_OPTIONS) -> ParsedTrace:
    """Parse one NCCL Inspector output file (module doc).

    Args:
        path: A ``<host>-pid<pid>.log`` file (or any name; ``.gz`` too).
        options: How to read it (``traceprof.core.parsed.ParseOptions``); its ``on_bad_event``: ``"raise"`` stops at a bad record naming its line; ``"skip"`` counts it in
            ``rejected`` (keyed by the reason).

    Returns:
        A :class:`ParsedTrace` (source ``nccl_inspector``) with collectives and events; times are
        epoch ns (the plugin's microseconds x 1000).

    Raises:
        TraceFormatError: Unreadable; a record of a version not read (naming it and the line); with
            ``on_bad_event="raise"`` a bad record (naming the line); no record left.
    """
    p = Path(path).resolve()
    on_bad_event = options.on_bad_event
    raw, data = read_maybe_gzip(p, options.max_inflate_ratio)
    colls: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = []
    rejected: Counter[str] = Counter()
    skipped: Counter[str] = Counter()
    incomplete: Counter[str] = Counter()
    comms: dict[str, tuple[int, int, int]] = {}
    versions: Counter[str] = Counter()
    hosts: Counter[str] = Counter()
    dropped = read = 0
    warnings: list[str] = []
    spelled: Counter[str] = Counter()  # header.rank / n_ranks written as a string: reason -> records
    coll_schema, event_schema = row_schema("collectives"), row_schema("events")
    records = list(_records(p, data))
    # a record written twice (every field equal, its dump time included: a re-dump of the same
    # collective at a later dump time is no copy) is kept once, said and counted
    copied: dict[str, int] = {}
    copies, said_copies = duplicate_records(p, records, _same, lambda i: f"line {records[i][0]}", copied)
    warnings += [said_copies] if said_copies else []
    for k, (line, rec) in enumerate(records):
        read += 1
        if k in copies:
            continue
        where = f"line {line}"
        if rec is _CUT:
            warnings.append(
                f"{p.name}: the last record (line {line}) is cut short (the process died while writing?): "
                "dropped"
            )
            rejected["last record cut short"] += 1
            continue
        try:
            if isinstance(rec, _Bad):
                raise rec
            header, meta, kind, perf = _record(rec)
            v = version_of(rec)
            if not version_read(v):
                raise TraceFormatError(
                    p,
                    where,
                    f"NCCL Inspector output version {v!r}, which traceprof does not "
                    f"read: it reads versions {READ_VERSIONS}",
                )
            versions[str(v)] += 1
            if kind == "dump_stats":
                skipped["dump_stats record"] += 1
                dropped += _dropped(perf)
                continue
            row, event, why = _rows_of(rec, header, meta, kind, perf)
            header_rank = _identity(header, "rank", "header")
            if header_rank >= row["group_size"]:
                raise _Bad(
                    "'header.rank' not below 'header.n_ranks'", f"{header_rank} >= {row['group_size']}"
                )
        except _Bad as bad:
            if on_bad_event == "raise":
                detail = f" ({bad.detail})" if bad.detail else ""
                raise TraceFormatError(p, where, f"{bad.reason}{detail}{skip_hint(where)}") from None
            rejected[bad.reason] += 1
            continue
        if not record_fits(
            p, where, on_bad_event, rejected, (row, coll_schema), (event, event_schema), fields=_fields(kind)
        ):
            continue
        if why:
            incomplete[why] += 1
        comm = header["id"]
        comms[comm] = (header_rank, row["group_size"], comms.get(comm, (0, 0, 0))[2] + 1)
        if isinstance(meta.get("hostname"), str):
            hosts[meta["hostname"]] += 1
        for key in (
            "rank",
            "n_ranks",
        ):  # "3" is read as 3, said and counted (traceprof.core.values.identity_int)
            if (how := spelled_int(header.get(key))) is not None:
                spelled[f"header.{key} {how}: read as its integer"] += 1
        colls.append(row)
        events.append(event)
    if not colls:
        what = f"all {read} skipped ({dict(rejected)})" if rejected else "the file holds none"
        raise TraceFormatError(p, "", f"no NCCL Inspector collective record: {what}")
    rank, world, notes = _rank(p, comms)
    warnings += notes
    warnings += [f"{p.name}: {n} record(s) with {why}" for why, n in spelled.items()]
    if incomplete.get("no event_trace_ts"):
        warnings.append(
            f"{p.name}: {incomplete['no event_trace_ts']} record(s) without event_trace_ts (written with "
            "NCCL_INSPECTOR_DUMP_VERBOSE=0): exec time and bandwidth kept in events.args, but no start "
            "or end, so stragglers cannot time them (nccl_sum takes coll_exec_time_us); record with "
            "NCCL_INSPECTOR_DUMP_VERBOSE=1"
        )
    if incomplete.get("a kernel time never set (0)"):
        warnings.append(
            f"{p.name}: {incomplete['a kernel time never set (0)']} record(s) with a kernel timestamp of 0 "
            "(never set): that start or end is unknown (NULL), the event flagged zero_ts"
        )
    if incomplete.get("no kernel_events"):
        warnings.append(
            f"{p.name}: {incomplete['no kernel_events']} record(s) with event_trace_ts but no kernel "
            "times (kernel_events empty or absent): start and end unknown (NULL), arrival taken from "
            "coll_start_ts, the event flagged zero_ts (nccl_sum takes coll_exec_time_us)"
        )
    if dropped:
        warnings.append(
            f"{p.name}: the Inspector dropped {dropped} record(s) (dump_stats: its ring buffer filled "
            "before the dump thread wrote it); those collectives are missing here"
        )
    seen: Counter[tuple[Any, str]] = Counter()
    for row in sorted(colls, key=lambda r: r["start_ns"] or r["enter_ns"] or 0):
        row["ordinal"] = seen[(row["pg"], row["op"])]
        seen[(row["pg"], row["op"])] += 1
    meta_out = {
        "inspector_output_format_version": dict(versions),
        "dropped_records": dropped,
        "communicators": {c: {"rank": r, "n_ranks": n, "records": k} for c, (r, n, k) in comms.items()},
        **({"repaired": dict(spelled) | copied} if spelled or copied else {}),
    }
    return ParsedTrace.of_bytes(
        p,
        raw,
        source=TraceSource.nccl_inspector,
        format=f"nccl-inspector-{versions.most_common(1)[0][0]}",
        rank=rank,
        world_size=world,
        trace={
            "host": hosts.most_common(1)[0][0] if hosts else None,
            "pid": _pid(p, events),
            "meta": msgspec.json.encode(meta_out).decode(),
        },
        events=pa.Table.from_pylist(events, schema=event_schema),
        collectives=pa.Table.from_pylist(colls, schema=coll_schema),
        events_read=read,
        rejected=dict(rejected),
        skipped=dict(skipped),
        flagged={"zero_ts": n} if (n := sum(1 for e in events if e["flag"])) else {},
        warnings=warnings,
    )
