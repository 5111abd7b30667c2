"""Run identity: the traces of one run must come from the same job.

The files of a new run must lie within :data:`MAX_GAP_NS` of each other in time
(:func:`check_within`: a folder that mixes an old export with today's dumps is two jobs, not one
run), nor may two traces of one host lie apart by more than the longer one's span (at least
:data:`SAME_HOST_SLACK_NS`): the ranks of one host read one clock and one job's ranks profile the
same steps, so two such traces that do not overlap are two jobs' (two jobs' rank files in one
folder, recorded minutes apart, are not clock skew); nor may traces of other hosts lie apart by
more than the longer one's span and :data:`MAX_CLOCK_OFFSET_NS` (:func:`clock_gap`: more than
hosts' clocks differ). A host name many machines report (:data:`GENERIC_HOSTS`: ``localhost``)
names no machine (:func:`machine`) and is held to the second rule only. A run that already holds traces gains new ones only when they agree with it on world
size, distributed backend, device type (accelerator name, or ``cpu``) and time: a trace whose events lie
more than :data:`MAX_GAP_NS` away from the run's span was recorded at another time, by another job.
Facts a trace does not state are not compared, and times only between sources with epoch clocks
(:data:`EPOCH_SOURCES`; the NCCL profiler plugin's steady clock and NDTimeline's step-relative times
are placed by ingest later), and not for a trace whose ``meta.clock`` is :data:`RELATIVE_CLOCK` (an
nsys export without a session start time: its times count from its capture start). A mismatch is refused; ``force`` (CLI ``--force-run``) appends anyway.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from traceprof.core.errors import StoreError
from traceprof.core.lazy import lazy
from traceprof.core.parsed import ParsedTrace

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.compute as pc
else:
    pa = lazy("pyarrow")
    pc = lazy("pyarrow.compute")

__all__ = [
    "check_append",
    "check_within",
    "same_host_gap",
    "epoch_span",
    "duration",
    "MAX_GAP_NS",
    "SAME_HOST_SLACK_NS",
    "MAX_CLOCK_OFFSET_NS",
    "GENERIC_HOSTS",
    "machine",
    "process_id",
    "clock_gap",
    "EPOCH_SOURCES",
    "RELATIVE_CLOCK",
]

#: Sources whose timestamps are epoch ns as recorded (README.md "What traceprof handles"), so spans compare across files.
EPOCH_SOURCES = ("kineto", "flight_recorder", "nsys", "nccl_inspector")

#: ``traces.meta.clock`` of a trace of an epoch source whose times are relative to its capture start.
RELATIVE_CLOCK = "session_relative"

#: Largest gap between a new trace's time span and the run's before they are another job's: one
#: hour (the ranks of one job profile the same steps; clocks differ by milliseconds).
MAX_GAP_NS = 3_600 * 10**9

#: Smallest gap between the time spans of two traces of one host (``traces.host``) that makes them
#: two jobs' when both spans are shorter (ns): one host's ranks share a clock, so one job's overlap.
SAME_HOST_SLACK_NS = 10**9

#: Largest gap between the time spans of traces of other hosts (or hosts unstated) before they are
#: two jobs' when both spans are shorter (ns): five minutes. Hosts' clocks differ by milliseconds
#: under NTP; a 61 s offset has been recorded in one job (and is aligned), while rank files 431 s
#: apart were two jobs' (t9 D1).
MAX_CLOCK_OFFSET_NS = 300 * 10**9

#: Host names that many machines report (a container or an unconfigured machine): they name no
#: machine, so traces of such a host are not held to one clock (:data:`SAME_HOST_SLACK_NS`).
GENERIC_HOSTS = frozenset(
    {"", "localhost", "localhost.localdomain", "localhost6", "127.0.0.1", "::1", "0.0.0.0"}
)


def check_append(con: Any, run_id: int, name: str, traces: list[ParsedTrace]) -> None:
    """Refuse traces that do not belong to run ``run_id`` (see the module doc).

    Args:
        con: The store's DuckDB connection (inside the ingest transaction).
        run_id: The existing run.
        name: Its name, for messages.
        traces: The traces about to be appended.

    Raises:
        StoreError: World size, backend, device type or time span differ, naming the file, both
            values and ``--force-run``.
    """
    held = con.execute(
        "SELECT list(DISTINCT world_size) FILTER (world_size IS NOT NULL), "
        "list(DISTINCT lower(backend)) FILTER (backend IS NOT NULL), "
        "list(DISTINCT lower(device_name)) FILTER (device_name IS NOT NULL) FROM traces WHERE run_id = ?",
        [run_id],
    ).fetchone()
    epoch = (
        f"trace_id IN (SELECT trace_id FROM traces WHERE run_id = ? AND source IN {EPOCH_SOURCES} AND "
        f"coalesce(json_extract_string(meta, '$.clock'), '') <> '{RELATIVE_CLOCK}')"
    )
    span = con.execute(
        f"SELECT min(lo), max(hi) FROM (SELECT min(ts_ns) lo, max(ts_ns + dur_ns) hi FROM events WHERE {epoch} "
        "UNION ALL SELECT min(coalesce(enter_ns, start_ns)), max(coalesce(end_ns, start_ns, enter_ns)) "
        f"FROM collectives WHERE {epoch})",
        [run_id, run_id],
    ).fetchone()
    worlds, backends, devices = (set(v or []) for v in held)
    force = "; if it does belong to this run, pass --force-run"
    for pt in traces:
        held_facts = {"world size": worlds, "backend": backends, "device": devices}
        for what, value in _facts(pt):
            have = held_facts[what]
            if value is not None and have and value not in have:
                raise StoreError(
                    f"{pt.path}: {what} {value!r}, but run {name!r} has {', '.join(map(repr, sorted(have)))}: "
                    f"a trace of another job; ingest it as another run (--run NAME){force}"
                )
        lo, hi = _span(pt) if _epoch(pt) else (None, None)
        if lo is not None and span[0] is not None:
            gap = max(lo - span[1], span[0] - hi, 0)
            if gap > MAX_GAP_NS:
                raise StoreError(
                    f"{pt.path}: recorded {duration(gap)} away from the traces of run {name!r}: a trace of "
                    f"another job; ingest it as another run (--run NAME){force}"
                )


def check_within(name: str, traces: list[ParsedTrace]) -> None:
    """Refuse a set of traces for one run whose epoch-clock times are hours apart (module doc).

    Only time is compared here: ingest compares the world sizes of a run's files first, and one
    job may mix devices (a heterogeneous cluster) or backends (gloo for CPU groups beside NCCL).
    Each trace, in order, is compared with the span of those before it; the first more than
    :data:`MAX_GAP_NS` away is named with the file it is farthest from. Then the traces of each
    host (:func:`machine`, where stated), in order of their first time: the first that begins more
    than max(its span, the span of the one before it that ends last, :data:`SAME_HOST_SLACK_NS`)
    after that one ends is named with it (:func:`same_host_gap`); then all traces alike with
    :data:`MAX_CLOCK_OFFSET_NS` (:func:`clock_gap`). n log n in the traces.

    Args:
        name: The run's name, for messages.
        traces: The traces about to be stored together.

    Raises:
        StoreError: Epoch time spans too far apart (an hour; 5 min between any two traces that
            do not overlap), or traces of one host that do not overlap, naming both files, how to
            split them into runs, and ``--force-run``.
    """
    lo_all: tuple[int, str] | None = None
    hi_all: tuple[int, str] | None = None
    split = (
        f"files of different jobs in run {name!r}: put each job's files in its own folder (or ingest "
        "them with --run NAME each); if they do belong together, pass --force-run"
    )
    for pt in traces:
        lo, hi = _span(pt) if _epoch(pt) else (None, None)
        if lo is None or hi is None:
            continue
        if lo_all is not None and hi_all is not None:
            gap = max(lo - hi_all[0], lo_all[0] - hi, 0)
            if gap > MAX_GAP_NS:
                other = hi_all[1] if lo > hi_all[0] else lo_all[1]
                raise StoreError(f"{pt.path}: recorded {duration(gap)} away from {Path(other).name}: {split}")
        lo_all = (lo, pt.path) if lo_all is None or lo < lo_all[0] else lo_all
        hi_all = (hi, pt.path) if hi_all is None or hi > hi_all[0] else hi_all
    apart = same_host_gap(traces)
    if apart is not None:
        first, later, host, gap = apart
        raise StoreError(
            f"{later}: recorded {duration(gap)} after {Path(first).name} ended, on the same host {host!r} "
            f"(ranks of one host share a clock, so one job's traces overlap in time): {split}"
        )
    far = clock_gap(traces)
    if far is not None:
        first, later, gap = far
        raise StoreError(
            f"{later}: recorded {duration(gap)} after {Path(first).name} ended, more than hosts' clocks "
            f"differ ({duration(MAX_CLOCK_OFFSET_NS)}; one job's ranks record the same steps): {split}"
        )


def machine(pt: ParsedTrace) -> str | None:
    """The host that names ``pt``'s machine (``trace["host"]``), or None when unstated or one of
    :data:`GENERIC_HOSTS` (compared in lower case)."""
    host = pt.trace.get("host")
    return None if host is None or str(host).strip().lower() in GENERIC_HOSTS else str(host)


def process_id(pt: ParsedTrace) -> str | None:
    """The process that recorded ``pt`` (``trace["pid"]``) as text, or None when unstated or empty:
    one reading of the pid for every rule that compares processes (a number or a name, ``"4242"``;
    :func:`machine` is the host's)."""
    pid = pt.trace.get("pid")
    return None if pid is None or str(pid) == "" else str(pid)


def clock_gap(traces: list[ParsedTrace]) -> tuple[str, str, int] | None:
    """Two traces whose epoch spans lie farther apart than clocks of other hosts differ, or None.

    The traces (epoch clock only) in order of their first time (ns); each is compared with the one
    before it that ends last: a gap (ns) above max(the two spans, :data:`MAX_CLOCK_OFFSET_NS`) is
    returned as (that file's path, this file's path, gap ns). n log n in the traces.
    """
    spans = []
    for pt in traces:
        lo, hi = epoch_span(pt)
        if lo is not None and hi is not None:
            spans.append((lo, hi, pt.path))
    spans.sort()
    last: tuple[int, int, str] | None = None
    for lo, hi, path in spans:
        if last is not None and path != last[2]:
            gap = lo - last[1]
            if gap > max(MAX_CLOCK_OFFSET_NS, hi - lo, last[1] - last[0]):
                return last[2], path, gap
        if last is None or hi > last[1]:
            last = (lo, hi, path)
    return None


def same_host_gap(traces: list[ParsedTrace]) -> tuple[str, str, str, int] | None:
    """Two traces of one host that cannot be one job's (module doc), or None.

    Per host (:func:`machine`; traces without one, of a host name many machines report such as
    ``localhost``, or not on an epoch clock, are not compared),
    the traces in order of their first time (ns); each is compared with the one before it that
    ends last: a gap (ns) above max(the two spans, :data:`SAME_HOST_SLACK_NS`) is returned as
    (that file's path, this file's path, host, gap ns). n log n in the traces.
    """
    by_host: dict[str, list[tuple[int, int, str]]] = {}
    for pt in traces:
        host = machine(pt)
        lo, hi = epoch_span(pt) if host else (None, None)
        if lo is not None and hi is not None:
            by_host.setdefault(str(host), []).append((lo, hi, pt.path))
    for host, spans in by_host.items():
        spans.sort()
        last: tuple[int, int, str] | None = None  # the trace so far that ends last
        for lo, hi, path in spans:
            if last is not None and path != last[2]:
                gap = lo - last[1]
                if gap > max(SAME_HOST_SLACK_NS, hi - lo, last[1] - last[0]):
                    return last[2], path, host, gap
            if last is None or hi > last[1]:
                last = (lo, hi, path)
    return None


def epoch_span(pt: ParsedTrace) -> tuple[int | None, int | None]:
    """First and last time (epoch ns) of a trace's events and collectives; (None, None) when it has
    none, or its times are not on an epoch clock (module doc)."""
    return _span(pt) if _epoch(pt) else (None, None)


def _epoch(pt: ParsedTrace) -> bool:
    """Whether ``pt``'s times are epoch ns (an epoch source, and not on a relative clock)."""
    if pt.source not in EPOCH_SOURCES:
        return False
    meta = pt.trace.get("meta")
    try:
        meta = json.loads(meta) if isinstance(meta, str) else meta
    except ValueError:
        meta = None
    return not (isinstance(meta, dict) and meta.get("clock") == RELATIVE_CLOCK)


def _facts(pt: ParsedTrace) -> list[tuple[str, Any]]:
    """(what, value) of world size, backend and device (lower case) as a trace states them."""
    return [
        ("world size", pt.world_size),
        ("backend", (pt.trace.get("backend") or "").lower() or None),
        ("device", (pt.trace.get("device_name") or "").lower() or None),
    ]


def duration(ns: int) -> str:
    """``12.3 s``, ``7.2 min``, ``2.5 h``, ``3.0 days`` or ``2.6 years``."""
    hours = ns / 3.6e12
    return (
        f"{ns / 1e9:.1f} s"
        if ns < 60 * 10**9
        else f"{ns / 6e10:.1f} min"
        if hours < 1
        else f"{hours:.1f} h"
        if hours < 48
        else f"{hours / 24:.1f} days"
        if hours < 24 * 365
        else f"{hours / (24 * 365.25):.1f} years"
    )


def _span(pt: ParsedTrace) -> tuple[int | None, int | None]:
    """First and last time of a trace's events and collectives (epoch ns), or (None, None)."""
    los, his = [], []
    for tbl, lo_col, hi_cols in (
        (pt.events, "ts_ns", ("ts_ns", "dur_ns")),
        (pt.collectives, "start_ns", ("end_ns",)),
    ):
        if tbl is None or tbl.num_rows == 0 or lo_col not in tbl.column_names:
            continue
        lo = pc.min(tbl[lo_col]).as_py()
        if len(hi_cols) == 2:
            hi = pc.max(
                pc.add(tbl[hi_cols[0]], pc.fill_null(tbl[hi_cols[1]], pa.scalar(0, pa.int64())))
            ).as_py()
        else:
            hi = pc.max(tbl[hi_cols[0]]).as_py()
        if lo is not None:
            los.append(lo)
        if hi is not None:
            his.append(hi)
    if not los:
        return None, None
    return min(los), max(his) if his else min(los)
