"""Which files are Flight Recorder dumps, by name: what the collector's claim reads, kept apart
from the parser so that claiming a file imports nothing heavy (``traceprof.ingest.sources``)."""

from __future__ import annotations

import re
from pathlib import Path

__all__ = ["is_fr_file"]

_NAME = re.compile(
    r"(\.fr\.json(\.gz)?$)|(^fr[_-].*\.json(\.gz)?$)|(^(nccl|fr)_trace_rank_?([\w.-]*[_.-])?\d+"
    r"(\.pkl|\.pickle)?$)"
)


def is_fr_file(path: Path) -> bool:
    """True for names Flight Recorder dumps have: ``*.fr.json``, ``fr_*.json`` (optionally
    ``.gz``), and torch's default pickle names ``nccl_trace_rank_<R>`` / ``fr_trace_rank_<R>``,
    also with a host before the rank (``nccl_trace_rank_<host>_<R>``) or ``.pkl``."""
    return _NAME.search(path.name) is not None
