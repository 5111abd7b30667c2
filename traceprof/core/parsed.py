"""What a collector's parser is given and what it hands to the store.

A parser receives the file and a :class:`ParseOptions` (what to do with a bad record, the
``--comm-kernel`` patterns, the gzip inflate cap, where large text may spill to disk): every
choice that changes how a file is read travels with the task, to a worker process or a Dask worker
alike, never as a module switch.

Collectors build a :class:`ParsedTrace`; the store assigns run and trace ids and inserts it in one
transaction. Row tables are pyarrow Tables whose columns are those of the store table of the same
name (``traceprof.core.schema``) minus ``run_id`` and ``trace_id``.
"""

from __future__ import annotations

import builtins
import functools
import hashlib
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from traceprof.core.fileio import DEFAULT_INFLATE_RATIO
from traceprof.core.lazy import lazy

if TYPE_CHECKING:
    import pyarrow as pa
else:
    pa = lazy("pyarrow")

if TYPE_CHECKING:
    from traceprof.core.classify import Classifier

__all__ = ["ParsedTrace", "ParseOptions", "DEFAULT_OPTIONS", "DEFAULT_INFLATE_RATIO", "ON_BAD_EVENT"]

#: The longest reason a record was not stored (``rejected``'s keys), in characters.
REASON_CHARS = 120

#: What a parser may do with a malformed record: stop with an error naming it, or skip and count it.
ON_BAD_EVENT = ("raise", "skip")


@dataclass(frozen=True)
class ParseOptions:
    """How a parser reads a file (module doc). Picklable: it goes to parser processes as is.

    Attributes:
        on_bad_event: ``raise`` (stop at the first malformed record, naming it) or ``skip`` (count
            it in ``rejected``; ``--skip-bad-events``).
        comm_kernels: Extra regexes of communication kernel names (``--comm-kernel``), added to the
            built-in families of ``traceprof.core.classify``.
        max_inflate_ratio: Refuse a gzip file that inflates beyond this multiple of its size (and
            at least 64 MiB; ``--max-inflate``).
        spill_dir: Folder for the files large args text spills to (``traceprof.core.spill``; ingest
            passes the store's folder); None: the system's temporary folder.
    """

    on_bad_event: str = "raise"
    comm_kernels: tuple[str, ...] = ()
    max_inflate_ratio: float = DEFAULT_INFLATE_RATIO
    spill_dir: str | None = None

    @property
    def classifier(self) -> Classifier:
        """The GPU-activity classifier of these patterns (built once per process and patterns).

        Raises:
            UsageError: A pattern is not a valid regular expression, or matches the empty string.
        """
        return _classifier(self.comm_kernels)


#: The options of a parser called without any: raise on a bad record, the built-in classifier, the
#: default inflate cap, spill files in the system's temporary folder.
DEFAULT_OPTIONS = ParseOptions()


@functools.lru_cache(maxsize=8)
def _classifier(patterns: tuple[str, ...]) -> Classifier:
    from traceprof.core.classify import Classifier

    return Classifier(patterns)


@dataclass
class ParsedTrace:
    """One parsed source file of one rank.

    Attributes:
        path: Absolute path of the file.
        sha256: SHA-256 hex digest of the file bytes.
        bytes: File size in bytes.
        source: ``kineto``, ``flight_recorder``, ``nccl_profiler``, ``nccl_inspector``, ``nsys``,
            ``ndtimeline`` or ``memory_timeline`` (the collector's name in ``traceprof.ingest.sources``).
        format: Source dialect, e.g. ``kineto-new`` or ``kineto-old``.
        rank: Global rank, or ``None`` when the file does not say (the store decides).
        world_size: World size the file states, or ``None``.
        trace: Other ``traces`` columns (host, pid, backend, device_name, base_time_ns, ...).
        events / devices / steps / collectives: Row tables, see the module doc.
        events_read: Records read from the file.
        rejected: Malformed or unknown records not stored in ``events``, counted by reason.
        first_rejected: Per reason of ``rejected``, the first record so rejected as messages name
            it (Kineto: ``event #11 (ph='', name='gloo:all_reduce')``), where the parser names it.
        skipped: Records not stored by design (Kineto flows and metadata), counted by kind.
        flagged: Records stored with an ``events.flag``, counted by flag.
        warnings: Messages the user should see (e.g. "rank missing, assumed 0").
        empty_said: The parser's ``warnings`` already say why the file stores no event (a Flight
            Recorder dump without entries), so ingest adds no warning of its own for that cause.
        part: Which part of its rank's record the file holds, for a source that writes several
            files per rank (the NCCL profiler plugin: one per communicator, ``<prefix>_<commHash>_<rank>.json``;
            its communicators' hashes), else ``None``. Two files of one rank and source are one
            job's only when their parts differ.
        long_text: The rows of ``events`` holding long text (``traceprof.core.limits.long_text_rows``:
            row, bytes, its longest field, the record as messages name it), set by ingest for its check over a run's
            files together (``traceprof.core.limits.drop_run_long_text``).
        events_digest: A digest of ``events`` as parsed (``traceprof.ingest.copies.events_digest``),
            set by ingest before the rows are parked; None when none was read. Two files whose
            events are identical bar the trace's own fields (the rank) digest alike.
        events_sketch: A sample of ``events``' hashes (``traceprof.ingest.sketch.events_sketch``),
            set with ``events_digest``; None when too few events. Two files one of which is the
            other with a few events edited share nearly all of it.
    """

    path: str
    sha256: str
    bytes: int
    source: str
    format: str
    rank: int | None
    world_size: int | None
    trace: dict[str, Any] = field(default_factory=dict)
    events: pa.Table | None = None
    devices: pa.Table | None = None
    steps: pa.Table | None = None
    collectives: pa.Table | None = None
    events_read: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    first_rejected: dict[str, str] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)
    flagged: dict[str, int] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    long_text: list[tuple[int, int, str, str]] = field(default_factory=list)
    part: str | None = None
    empty_said: bool = False
    events_digest: str | None = None
    events_sketch: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        """Hold the trace's text to the store's rules: a reason quoting a trace's value (``unknown
        phase ph='...'``) is cut to :data:`REASON_CHARS` (the counts of reasons that then read
        the same add up), and a text column of ``trace`` longer than
        ``traceprof.core.limits.MAX_FIELD_BYTES`` is an error (the JSON columns ``meta`` and
        ``flops_per_step``, built by the parser from many values, are not checked).

        Raises:
            TraceFormatError: A ``trace`` text longer than the limit, naming the file and the column.
        """
        from traceprof.core.errors import TraceFormatError
        from traceprof.core.limits import shown, text_problem

        if any(len(k) > REASON_CHARS for k in self.rejected):
            cut: dict[str, int] = {}
            first: dict[str, str] = {}
            for k, n in self.rejected.items():
                short = k if len(k) <= REASON_CHARS else k[: REASON_CHARS - 3] + "..."
                cut[short] = cut.get(short, 0) + n
                if k in self.first_rejected:
                    first.setdefault(short, self.first_rejected[k])
            self.rejected, self.first_rejected = cut, first
        for k, v in self.trace.items():
            problem = None if k in ("meta", "flops_per_step") else text_problem(k, v)
            if problem:
                raise TraceFormatError(
                    self.path,
                    f"the trace's {k} ({shown(v, 40)})",
                    f"{problem}: the file is damaged or was not written by a profiler",
                )

    @classmethod
    def of_bytes(cls, path: str | os.PathLike[str], raw: builtins.bytes, **fields: Any) -> ParsedTrace:
        """The trace of file ``path`` whose whole content is ``raw`` (read in one piece): ``path``
        as text, ``sha256`` of ``raw`` (hex) and ``bytes`` its length, with the other ``fields``.

        Raises:
            TraceFormatError: As the constructor.
        """
        return cls(path=str(path), sha256=hashlib.sha256(raw).hexdigest(), bytes=len(raw), **fields)

    @property
    def events_kept(self) -> int:
        return 0 if self.events is None else self.events.num_rows

    def drop_events(self, rows: list[int]) -> None:
        """Leave the events at positions ``rows`` (ascending) out of what the store inserts."""
        if rows and self.events is not None:
            keep = [True] * self.events.num_rows
            for r in rows:
                keep[r] = False
            self.events = self.events.filter(pa.array(keep))

    def drop_rows(self, table: str, rows: list[int]) -> None:
        """Leave the rows at positions ``rows`` (ascending) of row table ``table`` (``events``:
        :meth:`drop_events`, which a trace whose events were parked overrides; ``collectives``,
        ``steps``, ``devices``) out of what the store inserts."""
        if table == "events":
            self.drop_events(rows)
            return
        t: pa.Table | None = getattr(self, table)
        if rows and t is not None:
            keep = [True] * t.num_rows
            for r in rows:
                keep[r] = False
            setattr(self, table, t.filter(pa.array(keep)))
