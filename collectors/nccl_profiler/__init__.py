"""NCCL profiler plugin (ext-profiler example) dumps: ``parse`` and the clock ``align`` hook."""

from collections.abc import Hashable
from pathlib import Path

from traceprof.collectors import _communicators
from traceprof.collectors.nccl_profiler.align import settle
from traceprof.collectors.nccl_profiler.names import looks_like_plugin_dump, rank_in_name
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


def _process(pt: ParsedTrace) -> Hashable:
    """A file's process: the ``pid`` its events carry (the plugin prints ``getpid()``), else the file."""
    pid = pt.trace.get("pid")
    return ("pid", str(pid)) if pid not in (None, "None", "") else ("file", pt.path)


def _comms(pt: ParsedTrace) -> dict[str, int]:
    """{communicator: the file's rank in it}: the plugin's file of one communicator (``Rank``); none
    for a file named ``rank<R>`` (its name states the global rank) or holding several communicators."""
    hashes = (pt.part or "").split(",")
    if pt.rank is None or len(hashes) != 1 or not hashes[0] or rank_in_name(Path(pt.path).name) is not None:
        return {}
    return {hashes[0]: pt.rank}


def _relate(traces: list[ParsedTrace]) -> list[list[ParsedTrace]]:
    """The plugin's files as jobs with global ranks (``traceprof.collectors._communicators``): the
    plugin writes one file per communicator and process, ``Rank`` its rank in that communicator and
    every event the process's ``pid``; no host, job id or global rank. A communicator that spans
    all of a job's processes (the world's) gives the global ranks."""
    res = _communicators.relate(traces, _comms, _process, lambda p: f"{p[0]} {p[1]}")  # type: ignore[index]
    if res.notes:
        res.jobs[0][0].warnings.extend(f"NCCL profiler-plugin files: {n}" for n in res.notes)
    return res.jobs


sources.register(
    sources.Collector(
        "nccl_profiler",
        "NCCL profiler-plugin (example) JSON dumps (*.json, *.txt)",
        _claims,
        _parse,
        order=20,
        settle=settle,
        rank_field="file name rank<R> (or the events' Rank)",
        relate=_relate,
    )
)
