"""What a collector's parser hands to the store: one trace file, normalized.

Collectors build a :class:`ParsedTrace`; the store assigns run and trace ids and inserts it in one
transaction. Row tables are pyarrow Tables whose columns are those of the store table of the same
name (``traceprof.schema``) minus ``run_id`` and ``trace_id``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

__all__ = ["ParsedTrace"]


@dataclass
class ParsedTrace:
    """One parsed source file of one rank.

    Attributes:
        path: Absolute path of the file.
        sha256: SHA-256 hex digest of the file bytes.
        bytes: File size in bytes.
        source: ``kineto``, ``flight_recorder``, ``nccl_profiler``, ``nccl_inspector``, ``nsys``,
            ``ndtimeline`` or ``memory_timeline`` (the collector's name in ``traceprof.sources``).
        format: Source dialect, e.g. ``kineto-new`` or ``kineto-old``.
        rank: Global rank, or ``None`` when the file does not say (the store decides).
        world_size: World size the file states, or ``None``.
        trace: Other ``traces`` columns (host, pid, backend, device_name, base_time_ns, ...).
        events / devices / steps / collectives: Row tables, see the module doc.
        events_read: Records read from the file.
        rejected: Malformed or unknown records not stored in ``events``, counted by reason.
        skipped: Records not stored by design (Kineto flows and metadata), counted by kind.
        flagged: Records stored with an ``events.flag``, counted by flag.
        warnings: Messages the user should see (e.g. "rank missing, assumed 0").
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
    skipped: dict[str, int] = field(default_factory=dict)
    flagged: dict[str, int] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    @property
    def events_kept(self) -> int:
        return 0 if self.events is None else self.events.num_rows
