"""Which files are NCCL Inspector output, by their first bytes: what the collector's claim reads,
kept apart from the parser so that claiming a file imports nothing heavy
(``traceprof.ingest.sources``)."""

from __future__ import annotations

import re

__all__ = ["looks_like_inspector"]

_RECORD_HEAD = re.compile(rb'^\s*\{\s*"header"\s*:')
_MARKS = (b'"coll_perf"', b'"p2p_perf"', b'"inspector_output_format_version"', b'"dump_stats"')


def looks_like_inspector(head: bytes) -> bool:
    """True when the first bytes (decompressed) are a JSON line opening with ``"header"`` that names
    an Inspector field (``coll_perf``, ``p2p_perf``, ``inspector_output_format_version``)."""
    return _RECORD_HEAD.match(head) is not None and any(m in head for m in _MARKS)
