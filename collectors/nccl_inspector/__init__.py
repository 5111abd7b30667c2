"""NCCL Inspector plugin output (``ext-profiler/inspector``, NCCL 2.28.3+): ``parse``."""

from pathlib import Path

from traceprof.collectors.nccl_inspector.names import looks_like_inspector
from traceprof.core.fileio import GZIP_MAGIC, blank_bom
from traceprof.core.parsed import ParsedTrace, ParseOptions
from traceprof.ingest import sources

__all__: list[str] = []


def _claims(path: Path, head: bytes) -> bool:
    """A file (any name; ``.gz`` too) whose first line is an Inspector JSON record."""
    if head.startswith(GZIP_MAGIC):
        head = sources.gunzip_head(head)
    return looks_like_inspector(blank_bom(head))


def _parse(path: Path, options: ParseOptions) -> list[ParsedTrace]:
    """The file's traces. The parser is imported here, when a file of this source is read, not
    when files are claimed: an ingest of other sources does not import it."""
    from traceprof.collectors.nccl_inspector.parse import parse

    return [parse(path, options)]


sources.register(
    sources.Collector(
        "nccl_inspector",
        "NCCL Inspector output (<host>-pid<pid>.log JSON lines, versions v4.x)",
        _claims,
        _parse,
        order=15,
        rank_field="header.rank (largest communicator)",
        world_field="header.n_ranks (largest communicator)",
    )
)
