"""NCCL profiler plugin (ext-profiler example) dumps: ``parse`` and the clock ``align`` hook."""

from pathlib import Path

from traceprof.collectors.nccl_profiler.align import settle
from traceprof.collectors.nccl_profiler.names import looks_like_plugin_dump
from traceprof.core.parsed import ParsedTrace, ParseOptions
from traceprof.ingest import sources

__all__: list[str] = []


def _claims(path: Path, head: bytes) -> bool:
    """``*.json`` / ``*.txt`` files holding an event array with NCCL plugin categories, or named
    ``nccl_profile*`` (so an empty dump is told "no events", not "not a Kineto trace")."""
    return path.suffix in (".json", ".txt") and looks_like_plugin_dump(head, path.name)


def _parse(path: Path, options: ParseOptions) -> list[ParsedTrace]:
    """The file's traces. The parser is imported here, when a file of this source is read, not
    when files are claimed: an ingest of other sources does not import it."""
    from traceprof.collectors.nccl_profiler.parse import parse

    return [parse(path, options)]


sources.register(
    sources.Collector(
        "nccl_profiler",
        "NCCL profiler-plugin (example) JSON dumps (*.json, *.txt)",
        _claims,
        _parse,
        order=20,
        settle=settle,
        rank_field="file name rank<R> (or the events' Rank)",
    )
)
