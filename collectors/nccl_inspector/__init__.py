"""NCCL Inspector plugin output (``ext-profiler/inspector``, NCCL 2.28.3+): ``parse``."""

import json
from collections.abc import Hashable
from pathlib import Path

from traceprof.collectors import _communicators
from traceprof.collectors.nccl_inspector.names import looks_like_inspector
from traceprof.core.errors import TraceFormatError
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


def _comms(pt: ParsedTrace) -> dict[str, int]:
    """{communicator id: the process's ``header.rank`` in it} (the parser's ``traces.meta``)."""
    comms = json.loads(pt.trace.get("meta") or "{}").get("communicators") or {}
    return {c: int(v["rank"]) for c, v in comms.items()}


def _process(pt: ParsedTrace) -> Hashable:
    """A file's process: (host, pid) from its records, else (host, the file): one file per process."""
    pid = pt.trace.get("pid")
    return (str(pt.trace.get("host")), str(pid) if pid is not None else pt.path)


def _relate(traces: list[ParsedTrace]) -> list[list[ParsedTrace]]:
    """The Inspector's files (one per process, ``header.rank`` per communicator) as jobs with global
    ranks (``traceprof.collectors._communicators``): processes that share communicators are one
    job's, their global ranks those of the communicator spanning them all (else numbered in
    (host, pid) order, said in a note).

    Raises:
        TraceFormatError: Two files claim one rank of a communicator, or a file holds two ranks in one.
    """
    names = {_process(pt): Path(pt.path).name for pt in traces}
    res = _communicators.relate(traces, _comms, _process, lambda p: names[p])
    if res.conflicts:
        raise TraceFormatError(
            traces[0].path,
            "header.rank",
            "these NCCL Inspector files cannot be one job's: "
            + "; ".join(res.conflicts)
            + " (one rank of a communicator is one process); put each job's files in a folder of its own",
        )
    if res.notes:  # the parser's pick of a rank among the communicators no longer holds
        for pt in traces:
            pt.warnings[:] = [w for w in pt.warnings if "the process has ranks" not in w]
        res.jobs[0][0].warnings.extend(f"NCCL Inspector files: {n}" for n in res.notes)
    return res.jobs


sources.register(
    sources.Collector(
        "nccl_inspector",
        "NCCL Inspector output (<host>-pid<pid>.log JSON lines, versions v4.x)",
        _claims,
        _parse,
        order=15,
        rank_field="header.rank (largest communicator)",
        world_field="header.n_ranks (largest communicator)",
        relate=_relate,
    )
)
