"""Copies at ingest: files of one content, and one process's trace under two ranks.

The rule (README.md "Runs and copies"), within one ingest and across ingests alike:
  1. A file's content (SHA-256) read twice as the same rank of one run is one trace: a folder
     holding a rank file twice under two names stores it once, with a warning naming both
     (:func:`once`; before, the run was refused). One content read as two ranks (Flight Recorder
     dumps of ranks that recorded nothing: byte-identical, their rank in the file name) is two.
  2. Between runs a copy is a file of each run it lies in: a run and its copy with one rank
     edited, or a set of baseline copies, are each stored whole. A file stored from the same path
     is that stored trace (skipped; new files beside it for another run are refused, as that run
     would miss the rank). A copy from another path is stored again with its run's new files
     (:func:`stored_copies`), with a warning; a folder all of whose files are copies of stored
     files is that run again and skipped, with a message saying ``--run NAME`` stores it as a run of
     its own (a copy of a whole run is a second run only when asked). Within one ingest each folder
     named is a run as asked: two identical folders are two runs, said in a warning
     (:func:`same_runs`).
  3. Two ranks of one run are never one process: traces of one source from two files that state
     a host and whose events are identical, row for row, in every time (ns), name, lane, pid and id
     (:func:`events_digest`) are a copy of one rank's file with its rank edited (its host name
     too, or not: t12 F5 was stored as a new rank), and the run is refused naming both files; so is
     a near-copy of the same pid, nearly all of whose events (by a sample, ``traceprof.ingest.sketch``)
     are another rank's at the same times (ns) (t15 F5b: one ``aten::mm`` removed, stored as a new
     rank; hand-built ranks of other pids at one time, as in /work/shared/cases/deepep_comm_kernels, are
     no copy); the same host and pid recorded at
     overlapping times with other events is a warning (containers that share a host name and a pid
     namespace's numbers could do that) (:func:`check_processes`). Files added to a run already
     stored are held to this rule against the run's stored traces of their source too, with the same
     refusal (:func:`check_stored`; t17 nc_exact, nc_basic: a copy of rank 1 ingested later as rank 3
     was stored as the run's 4th rank): the stored trace's sketch is taken again from its stored events
     (name, ``ts_ns`` less its ``clock_offset_ns``, ``dur_ns``), and an exact copy is its stored
     events, row for row, less ``args``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from traceprof.core.errors import TraceFormatError
from traceprof.core.parsed import ParsedTrace
from traceprof.ingest import sketch
from traceprof.storage.identity import epoch_span, process_id

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "events_digest",
    "once",
    "stored_copies",
    "same_runs",
    "check_processes",
    "check_stored",
    "Earlier",
]


#: Rule 3's words for a near-copy, before the other file's rank.
_NEAR_WHAT = (
    "{n} of {of} of its events sampled (by a hash of name, start and duration in ns) are at the very times of "
    "events of rank"
)

#: Event columns the digest leaves out: ``args`` is the source's text as written, whose spacing a
#: JSON rewrite (``json.dump`` of a file whose rank was edited) changes while the events do not.
UNDIGESTED = ("args",)


def events_digest(events: pa.Table | None) -> str | None:
    """A BLAKE2b digest (32 hex digits) of ``events``' column names and data buffers, less
    :data:`UNDIGESTED` (times in ns, names, lanes, ids, classes), or None when there is no row. Two
    tables built alike from the same records digest alike; linear in the table's bytes, no copy."""
    if events is None or events.num_rows == 0:
        return None
    h = hashlib.blake2b(digest_size=16)
    for name, column in zip(events.column_names, events.columns, strict=True):
        if name in UNDIGESTED:
            continue
        h.update(name.encode() + b"\0" + str(column.type).encode() + b"\0")
        for chunk in column.chunks:
            h.update(chunk.offset.to_bytes(8, "little") + len(chunk).to_bytes(8, "little"))
            for buf in chunk.buffers():
                h.update(b"-" if buf is None else memoryview(buf))
    return h.hexdigest()


def once(traces: list[ParsedTrace], warnings: list[str]) -> list[ParsedTrace]:
    """Rule 1 of the module doc: ``traces`` (one run's, or one folder's) less the second and later
    files of one content read as the same rank, source and part, each said in ``warnings``
    (``b.json: the same bytes (sha256) as a.json, read as rank 1 both: one trace, b.json not
    stored``). Linear in the traces."""
    first: dict[tuple[str, int | None, str, str | None], ParsedTrace] = {}
    by_file: dict[str, list[ParsedTrace]] = {}
    for pt in traces:
        by_file.setdefault(pt.path, []).append(pt)
    dropped: set[str] = set()
    for path, pts in sorted(by_file.items()):
        keys = [(pt.sha256, pt.rank, pt.source, pt.part) for pt in pts]
        seen = [first[k] for k in keys if k in first]
        if seen and len(seen) == len(keys) and all(s.path == seen[0].path for s in seen):
            dropped.add(path)
            ranks = ", ".join(str(pt.rank) for pt in pts)
            warnings.append(
                f"{path}: the same bytes (sha256) as {seen[0].path}, read as rank {ranks} both: one trace, "
                f"{Path(path).name} not stored (leave the copy out)"
            )
            continue
        for k, pt in zip(keys, pts, strict=True):
            first.setdefault(k, pt)
    return [pt for pt in traces if pt.path not in dropped]


def stored_copies(store: Any, sha256: str) -> list[tuple[str, str]]:
    """(run name, stored path) of every trace stored with this SHA-256, in run order."""
    rows = store.con.execute(
        "SELECT r.name, t.path FROM traces t JOIN runs r USING (run_id) WHERE t.sha256 = ? ORDER BY run_id, trace_id",
        [sha256],
    ).fetchall()
    return [(str(n), str(p)) for n, p in rows]


class Earlier:
    """The files of the runs met earlier in one ingest, for rule 2 within it as across ingests: a
    file of a later run with the bytes of an earlier run's is a copy of that run's file, as one of a
    stored run is. Files are hashed (``sha``) only when their size is an earlier file's; each at
    most once. Linear in the files (and their bytes where sizes meet)."""

    def __init__(self, sha: Callable[[Path], str]) -> None:
        self._sha = sha  # Path -> SHA-256 hex
        self._by_size: dict[int, list[tuple[Path, str]]] = {}
        self._known: dict[Path, str] = {}
        self._runs: dict[str, list[Path]] = {}

    def _digest(self, f: Path) -> str:
        if f not in self._known:
            self._known[f] = self._sha(f)
        return self._known[f]

    def copy_of(self, run: str, f: Path, size: int) -> str | None:
        """The earlier run (another than ``run``) one of whose files has ``f``'s bytes, or None."""
        for g, other in self._by_size.get(size, []):
            if other != run and g != f and self._digest(g) == self._digest(f):
                return other
        return None

    def whole(self, run: str, files: list[Path]) -> bool:
        """Whether ``files`` are, content for content, every file of the earlier run ``run`` (two
        identical folders: two runs as named, :func:`same_runs`)."""
        mine = self._runs.get(run, [])
        return len(mine) == len(files) and {self._digest(f) for f in mine} == {self._digest(f) for f in files}

    def add(self, run: str, f: Path, size: int) -> None:
        """Note ``f`` (``size`` bytes) as a file of ``run``, to be stored by this ingest."""
        self._by_size.setdefault(size, []).append((f, run))
        self._runs.setdefault(run, []).append(f)


def same_runs(by_run: dict[str, list[ParsedTrace]]) -> list[str]:
    """Rule 2's note for the runs of one ingest whose files are, content for content, another's
    (``run 'job_3' holds the same files (sha256) as run 'job_0': stored as two runs, as named``).
    Linear in the traces."""
    first: dict[frozenset[str], str] = {}
    notes = []
    for name, traces in by_run.items():
        key = frozenset(pt.sha256 for pt in traces)
        if key in first:
            notes.append(
                f"run {name!r} holds the same files (sha256) as run {first[key]!r}: stored as two runs, as named"
            )
        else:
            first[key] = name
    return notes


def check_processes(name: str, traces: list[ParsedTrace], warnings: list[str], field: str) -> None:
    """Rule 3 of the module doc on run ``name``'s traces (ranks settled): refuse one process's
    events under two ranks; warn of two ranks that share host and pid at overlapping times.

    Reads ``traces.host`` and ``traces.pid`` (``pt.trace``), the rank, the events' digest and
    sketch and the traces' epoch spans (ns). n log n in the traces (sorted by path; grouped by
    digest, by sketch value, and by host and pid for the warning).

    Args:
        name: The run's name, for messages.
        traces: Its traces.
        warnings: Receives the warning of rule 3.
        field: Where the source of the first clash records its rank, for the error.

    Raises:
        TraceFormatError: Two files of different ranks whose events are identical, or of one pid
            and nearly all at identical times (a sketch's :data:`traceprof.ingest.sketch.NEAR` or more), each
            stating a host (the same or not), naming both files, their hosts and pids, and what to do.
    """
    by_process: dict[tuple[str, str, str], list[ParsedTrace]] = {}
    seen: dict[tuple[str, str], ParsedTrace] = {}  # (source, digest) -> its first file
    # (source, pid) -> (trace, sketch): a near-copy keeps its pid, so only traces of one pid are
    # compared (near_pairs meets each trace's first near trace alone: another pid's would hide it)
    sketched: dict[tuple[str, str], list[tuple[ParsedTrace, tuple[int, ...]]]] = {}
    for pt in sorted(traces, key=lambda pt: (pt.path, pt.rank if pt.rank is not None else -1)):
        host = str(pt.trace.get("host") or "")
        d = pt.events_digest
        if not host or d is None:  # hand-built traces (no host_name) share pid and events by design
            continue
        other = seen.setdefault((pt.source, d), pt)
        if other.path != pt.path and other.rank != pt.rank:
            _refuse(name, field, other, pt, f"its {pt.events_kept} events are, row for row, those of rank")
        pid = process_id(pt)
        if pt.events_sketch is not None and pid is not None:
            sketched.setdefault((pt.source, pid), []).append((pt, pt.events_sketch))
    for pairs in sketched.values():
        for other, pt, n, of in sketch.near_pairs(pairs):
            if other.path != pt.path and other.rank != pt.rank:  # one pid: a copy keeps its pid
                _refuse(
                    name,
                    field,
                    other,
                    pt,
                    _NEAR_WHAT.format(n=n, of=of),
                    "near-",
                )
    for pt in traces:
        pid = process_id(pt)
        if pid is not None:
            by_process.setdefault((pt.source, str(pt.trace.get("host") or ""), pid), []).append(pt)
    for (_, host, pid), pts in by_process.items():
        if host:
            pts = sorted(pts, key=lambda pt: (pt.path, pt.rank if pt.rank is not None else -1))
            _overlapping(name, host, pid, pts, warnings)


def check_stored(store: Any, name: str, traces: list[ParsedTrace], field: str) -> None:
    """Rule 3 of the module doc between ``traces``, about to be added to run ``name``, and the run's
    stored traces (none when the run is new): refuse a new trace whose events are, row for row, a
    stored trace's of another rank and the same source (both stating a host), or a near-copy of one
    of the same pid, with :func:`check_processes`' refusal.

    Reads ``traces`` (rank, source, path, host, pid, events_kept, events_digest, events_sketch and
    ``events`` (ns)) and, of the run's stored traces of those sources that state a host and whose
    pid or events_kept is a new trace's, ``traces.path, rank, source, host, pid, events_kept,
    clock_offset_ns`` and their events' ``name``, ``ts_ns``, ``dur_ns`` (ns; less the trace's
    clock offset: as parsed), and for an exact copy every ``events`` column the new rows hold but
    ``args``, ``run_id``, ``rank`` and ``trace_id``. Linear in the events of those stored traces.

    Raises:
        TraceFormatError: What :func:`check_processes` raises for a copy, the stored file named as
            the other file.
    """
    row = store.con.execute("SELECT run_id FROM runs WHERE name = ?", [name]).fetchone()
    new = [pt for pt in traces if pt.trace.get("host") and pt.events_digest is not None]
    if row is None or not new:
        return
    stored = store.con.execute(
        "SELECT trace_id, path, rank, source, host, pid, events_kept, coalesce(clock_offset_ns, 0) FROM traces "
        "WHERE run_id = ? AND coalesce(host, '') <> '' ORDER BY trace_id",
        [row[0]],
    ).fetchall()
    # candidates by (source, pid) for a near-copy and (source, events_kept) for an exact one: each new
    # trace meets only those (linear in the traces, not new x stored)
    by_key: dict[tuple[str, str, object], list[tuple[Any, ...]]] = {}
    for t in stored:
        by_key.setdefault((t[3], "pid", None if t[5] is None else str(t[5])), []).append(t)
        by_key.setdefault((t[3], "kept", t[6]), []).append(t)
    sketches: dict[int, tuple[int, ...] | None] = {}
    for pt in sorted(new, key=lambda pt: (pt.path, pt.rank if pt.rank is not None else -1)):
        pid = process_id(pt)
        near = by_key.get((pt.source, "pid", pid), []) if pid is not None else []
        same = by_key.get((pt.source, "kept", pt.events_kept), [])
        for trace_id, path, rank, source, host, spid, kept, offset in dict.fromkeys(near + same):
            if rank == pt.rank or path == pt.path:
                continue
            exact = kept == pt.events_kept
            if trace_id not in sketches:  # each stored trace's events read once
                sketches[trace_id] = sketch.events_sketch(
                    store.con.sql(
                        "SELECT name, ts_ns - ? AS ts_ns, dur_ns FROM events WHERE trace_id = ?",
                        params=[offset, trace_id],
                    ).to_arrow_table()
                )
            sk = sketches[trace_id]
            other = ParsedTrace(
                str(path), "", 0, str(source), "", rank, None, trace={"host": host, "pid": spid}
            )
            if exact and sk == pt.events_sketch and _same_rows(store, pt, trace_id, int(offset)):
                _refuse(
                    name, field, other, pt, f"its {pt.events_kept} events are, row for row, those of rank"
                )
            if sk is not None and pt.events_sketch is not None and spid is not None and str(spid) == pid:
                got = sketch.near(sk, pt.events_sketch)
                if got is not None:
                    _refuse(name, field, other, pt, _NEAR_WHAT.format(n=got[0], of=got[1]), "near-")


def _same_rows(store: Any, pt: ParsedTrace, trace_id: int, offset: int) -> bool:
    """Whether ``pt.events`` holds, row for row, stored trace ``trace_id``'s events (its ``ts_ns``
    less ``offset`` ns), in every column both hold but ``args`` (:data:`UNDIGESTED`); False when
    ``pt``'s events are no longer held (the near-copy rule still applies)."""
    if pt.events is None:
        return False
    kept = {r[0] for r in store.con.execute("DESCRIBE events").fetchall()} - {"run_id", "rank", "trace_id"}
    cols = [c for c in pt.events.column_names if c in kept and c not in UNDIGESTED]
    mine = ", ".join(f'CAST(n."{c}" AS VARCHAR)' for c in cols)
    theirs = ", ".join(f'CAST(e."{c}"{" - ?" if c == "ts_ns" else ""} AS VARCHAR)' for c in cols)
    store.con.register("_copy_check_new", pt.events)
    try:
        ((left,),) = store.con.execute(
            f"SELECT count(*) FROM (SELECT {mine} FROM _copy_check_new n EXCEPT ALL "
            f"SELECT {theirs} FROM events e WHERE e.trace_id = ?)",
            [offset, trace_id],
        ).fetchall()
    finally:
        store.con.unregister("_copy_check_new")
    return int(left) == 0


def _refuse(name: str, field: str, other: ParsedTrace, pt: ParsedTrace, what: str, near: str = "") -> None:
    """Rule 3's error: ``pt`` holds ``other``'s events (``what``, then its rank and file)."""
    raise TraceFormatError(
        pt.path,
        field,
        f"rank {pt.rank}, but {what} {other.rank} in {other.path} ({_where(other, pt)}): one process's trace "
        f"under two ranks, a {near}copy of one rank's file with its rank edited; run {name!r} not stored: leave the "
        "copy out",
    )


def _where(a: ParsedTrace, b: ParsedTrace) -> str:
    """The process of two files in rule 3's error: ``host 'vm', pid 101 both``, or each file's when
    the copy's host or pid was edited too (``host 'vm', pid 101; host 'vm2', pid 101``). The pid as
    :func:`~traceprof.storage.identity.process_id` reads it, ``pid unknown`` when unstated."""
    one, two = ((str(pt.trace.get("host") or ""), process_id(pt) or "unknown") for pt in (a, b))
    if one == two:
        return f"host {one[0]!r}, pid {one[1]} both"
    return f"host {one[0]!r}, pid {one[1]}; host {two[0]!r}, pid {two[1]}"


def _overlapping(name: str, host: str, pid: str, pts: list[ParsedTrace], warnings: list[str]) -> None:
    """Rule 3's warning for one (source, host, pid): the first two files of other ranks whose epoch
    spans overlap."""
    spans = []
    for pt in pts:
        lo, hi = epoch_span(pt)
        if lo is not None and hi is not None:
            spans.append((lo, hi, pt))
    spans.sort(key=lambda s: (s[0], s[1]))
    last: tuple[int, int, ParsedTrace] | None = None
    for lo, hi, pt in spans:
        if last is not None and lo < last[1] and last[2].path != pt.path and last[2].rank != pt.rank:
            warnings.append(
                f"run {name!r}: rank {last[2].rank} ({Path(last[2].path).name}) and rank {pt.rank} "
                f"({Path(pt.path).name}) were recorded at the same time by one process (host {host!r}, pid "
                f"{pid}): two ranks of one job are two processes; check that the files are two jobs' or two "
                "containers' that share a host name"
            )
            return
        if last is None or hi > last[1]:
            last = (lo, hi, pt)
