"""Which files are NCCL profiler-plugin dumps, by their first bytes and name: what the collector's
claim reads, kept apart from the parser so that claiming a file imports nothing heavy
(``traceprof.ingest.sources``)."""

from __future__ import annotations

import re

from traceprof.core.fileio import blank_bom

__all__ = ["looks_like_plugin_dump", "rank_in_name"]

_RANK_IN_NAME = re.compile(r"rank[_-]?(\d+)", re.IGNORECASE)
_CAT = re.compile(rb'"cat"\s*:\s*"(GROUP|COLL|P2P|PROXY|NET|GPU)"')


def looks_like_plugin_dump(head: bytes, name: str = "") -> bool:
    """True when the first bytes are a JSON array of events with an NCCL plugin ``cat``, or any
    JSON array (an empty dump included) in a file named like one (``nccl_profile*``)."""
    body = blank_bom(head).lstrip()
    return body.startswith(b"[") and (
        _CAT.search(body) is not None or name.lower().startswith("nccl_profile")
    )


def rank_in_name(name: str) -> int | None:
    """The global rank a file's name states (``rank<R>``, ``rank_<R>``, ``rank-<R>``), else None:
    the plugin's own names (``<prefix>_<commHash>_<rank>.json``) state none."""
    m = _RANK_IN_NAME.search(name)
    return int(m.group(1)) if m else None
