"""NCCL profiler plugin (ext-profiler example) dumps: ``parse`` and the clock ``align`` hook."""

import re
from pathlib import Path
from typing import Any

from traceprof.collectors import _communicators
from traceprof.collectors._dtypes import unknown_dtypes
from traceprof.collectors.nccl_profiler.align import settle
from traceprof.collectors.nccl_profiler.names import looks_like_plugin_dump, rank_in_name
from traceprof.core.errors import TraceFormatError
from traceprof.core.fileio import GZIP_MAGIC
from traceprof.core.parsed import ParsedTrace, ParseOptions
from traceprof.core.text import COUNTED, first_few
from traceprof.ingest import sources
from traceprof.storage.identity import process_id

__all__: list[str] = []


def _claims(path: Path, head: bytes) -> bool:
    """``*.json`` / ``*.txt`` files (gzipped too: ``*.json.gz``, ``*.txt.gz``) holding an event
    array with NCCL plugin categories, or named ``nccl_profile*`` (so an empty dump is told "no
    events", not "not a Kineto trace")."""
    name = path.name
    if head.startswith(GZIP_MAGIC):
        if path.suffix != ".gz":
            return False
        head, name = sources.gunzip_head(head), name[:-3]
    return Path(name).suffix in (".json", ".txt") and looks_like_plugin_dump(head, name)


def _parse(path: Path, options: ParseOptions) -> list[ParsedTrace]:
    """The file's traces. The parser is imported here, when a file of this source is read, not
    when files are claimed: an ingest of other sources does not import it."""
    from traceprof.collectors.nccl_profiler.parse import parse

    return [parse(path, options)]


#: The plugin's file name, ``<NCCL_PROFILE_DUMP_FILE>_<commHash>_<rank>.json``: group 1 the dump prefix.
_DUMP_NAME = re.compile(r"^(.*)_\d+_\d+\.(?:json|txt)(?:\.gz)?$")


def _process(pt: ParsedTrace) -> tuple[str, ...]:
    """A file's process as its name and events say it: (folder, dump prefix, ``pid``), else
    ``("file", path)`` without a pid. A process writes every file with its one
    ``NCCL_PROFILE_DUMP_FILE`` prefix and ``getpid()``; processes of two hosts or containers can
    share a pid (:func:`_processes` tells them apart where the files do)."""
    pid = process_id(pt)
    if pid is None:
        return ("file", pt.path)
    path = Path(pt.path)
    m = _DUMP_NAME.match(path.name)
    return (str(path.parent), m.group(1) if m else "", "pid", str(pid))


def _label(p: tuple[str, ...]) -> str:
    """A process key as messages name it: ``pid 5100`` (``pid 7 (nccl_profile_11_2.json)`` for a
    process split off by :func:`_processes`), or the file's name."""
    if p[0] == "file":
        return Path(p[1]).name
    return f"pid {p[3]}" + (f" ({p[4]})" if len(p) > 4 else "")


def _processes(traces: list[ParsedTrace]) -> tuple[dict[str, tuple[str, ...]], list[str]]:
    """{file: its process key} and notes. The files of one (folder, prefix, pid) are one process,
    unless they hold two ranks of one communicator: a process has one rank in a communicator, so
    they are processes of several hosts or containers that share a pid. When every such file is
    one rank of that one communicator, each file is a process of its own (said in a note);
    otherwise which files are one process is not in the files.

    Raises:
        TraceFormatError: Files of one pid hold two ranks of a communicator and files of others:
            naming the files, and the fix (a folder per host, ingested with --run).
    """
    groups: dict[tuple[str, ...], list[ParsedTrace]] = {}
    for pt in traces:
        groups.setdefault(_process(pt), []).append(pt)
    keys: dict[str, tuple[str, ...]] = {}
    notes: list[str] = []
    for key, pts in groups.items():
        ranks: dict[str, set[int]] = {}
        for pt in pts:
            for comm, r in _comms(pt).items():
                ranks.setdefault(comm, set()).add(r)
        twice = sorted(c for c, rs in ranks.items() if len(rs) > 1)
        if not twice:
            keys.update((pt.path, key) for pt in pts)
            continue
        names = sorted(Path(pt.path).name for pt in pts)
        if len(ranks) == 1 and all(len(_comms(pt)) == 1 for pt in pts):  # each file a rank of one comm
            keys.update((pt.path, (*key, Path(pt.path).name)) for pt in pts)
            notes.append(
                f"{len(pts)} files of {_label(key)} hold ranks {sorted(ranks[twice[0]])} of communicator "
                f"{twice[0]}: processes of several hosts or containers with one pid, one per file"
            )
            continue
        comm = twice[0]
        raise TraceFormatError(
            pts[0].path,
            "pid",
            f"{len(pts)} files of {_label(key)} ({first_few(names, 8, more=COUNTED)}) "
            f"hold ranks {sorted(ranks[comm])} of communicator {comm}: processes of several hosts or "
            "containers with one pid, and which of these files are one process is not in them; put each "
            "host's (container's) files in a folder of its own and ingest the folders together "
            "(one run of their folder name, or --run NAME)",
        )
    return keys, notes


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
    all of a job's processes (the world's) gives the global ranks. Processes are told apart by
    :func:`_processes`.

    Raises:
        TraceFormatError: Processes of one pid that the files do not tell apart (:func:`_processes`).
    """
    keys, split = _processes(traces)
    res = _communicators.relate(traces, _comms, lambda pt: keys[pt.path], _label)  # type: ignore[arg-type]
    if split or res.notes:
        res.jobs[0][0].warnings.extend(f"NCCL profiler-plugin files: {n}" for n in [*split, *res.notes])
    return res.jobs


def _settle(store: Any, run_id: int) -> list[str]:
    """Clock alignment (``align.settle``), then records of a dtype of unknown size (``collectors._dtypes``)."""
    return [*settle(store, run_id), *unknown_dtypes(store, run_id, "nccl_profiler", "NCCL profiler-plugin")]


sources.register(
    sources.Collector(
        "nccl_profiler",
        "NCCL profiler-plugin (example) JSON dumps (*.json, *.txt, gzipped too)",
        _claims,
        _parse,
        order=20,
        settle=_settle,
        rank_field="file name rank<R> (or the events' Rank)",
        relate=_relate,
    )
)
