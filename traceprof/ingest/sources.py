"""The collector registry: which trace sources traceprof reads, and which collector reads a file.

Like the analysis registry (``traceprof.engine.analysis``), sources register themselves: each package or
module under ``collectors/`` (installed as ``traceprof.collectors``) calls :func:`register` when
imported, and :func:`load_all` imports them all (and those of the ``traceprof.collectors``
entry-point group), so adding a source never edits ``traceprof.ingest.ingest``.

A collector claims a file by its name or by its first bytes (content sniffing: an SQLite export
starts with ``SQLite format 3``, a pickle with ``0x80``). Claims are tried in increasing
``order``; the Kineto collector, which reads any other ``*.json``, comes last. A file that no
collector claims gets a message listing the formats that are read (:func:`formats`).

Formats that traceprof recognizes but does not read (an Nsight ``.qdrep``, a Chakra execution
trace, a CUDA memory snapshot, ...) register an :class:`Unread` entry the same way
(``collectors/unread.py``): :func:`recognize` names such a file's format and what to do, so a
folder of them is never reported as holding no trace files.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from traceprof.core import plugins
from traceprof.core.fileio import GZIP_MAGIC
from traceprof.core.parsed import ParsedTrace, ParseOptions

__all__ = [
    "Collector",
    "Unread",
    "register",
    "register_unread",
    "claim",
    "recognize",
    "collectors",
    "get",
    "formats",
    "head",
    "gunzip_head",
    "owners",
    "is_document",
    "load_all",
]

#: Bytes read from the start of a file for content sniffing.
HEAD_BYTES = 4096


@dataclass(frozen=True)
class Collector:
    """One trace source.

    Attributes:
        name: Source name, as in ``traces.source`` (``kineto``, ``nsys``, ...).
        formats: What it reads, for messages, e.g. ``"Nsight Systems SQLite export (*.sqlite)"``.
        claims: ``claims(path, head)`` -> True when this collector reads the file; ``head`` is its
            first :data:`HEAD_BYTES` bytes (raw, not decompressed).
        parse: ``parse(path, options)`` -> the file's traces (one per rank it holds); ``options``
            (a :class:`~traceprof.core.parsed.ParseOptions`) says how to read it.
        order: Claims are tried in increasing order (catch-all collectors last).
        whole_run: One file holds a whole run (it is its own run, named after the file).
        settle: Optional ``settle(store, run_id)`` -> notes, run inside the ingest transaction
            before collectives are matched (e.g. to put a source's private clock on its rank's),
            only when the run holds a trace of this source (``traces.source`` = ``name``): it reads
            that source's traces and rows alone.
        capture: Optional ``capture(script, out_dir, nproc=N) -> exit status``: run a training
            script on N local ranks recording this source (``traceprof collect``).
        rank_field / world_field: Where the source records the rank and the world size, in its
            own terms, for messages (``distributedInfo.rank``, ``rank``, ``environment RANK``).
        companions: Optional ``companions(trace)`` -> the files beside a trace this collector
            reads with it (a sidecar: Kineto's ``<name>.meta.json``, NDTimeline's ``meta-*.yaml``)
            or instead of it; such a file named on the command line is taken as its trace's
            (:func:`owner`), not refused as a file no collector reads.
        relate: Optional ``relate(traces)`` -> jobs: a would-be run's traces of this source (all of
            them, for a source whose files name ranks within a communicator) grouped into the jobs
            they belong to, each trace's rank set to its global rank; notes go in the first trace's
            warnings; raises TraceFormatError when the files contradict each other
            (``traceprof.ingest.naming.relate``).
    """

    name: str
    formats: str
    claims: Callable[[Path, bytes], bool]
    parse: Callable[[Path, ParseOptions], list[ParsedTrace]]
    order: int = 50
    whole_run: bool = False
    settle: Callable[[Any, int], list[str]] | None = None
    capture: Callable[..., int] | None = None
    rank_field: str = "rank"
    world_field: str = "world size"
    companions: Callable[[Path], list[Path]] | None = None
    relate: Callable[[list[ParsedTrace]], list[list[ParsedTrace]]] | None = None


@dataclass(frozen=True)
class Unread:
    """A format traceprof recognizes and does not read.

    Attributes:
        name: Short name, e.g. ``nsys_qdrep``.
        what: The format, for messages, e.g. ``"Nsight Systems report from before 2021.3 (.qdrep)"``.
        claims: ``claims(path, head)`` -> True for a file of this format (``head``: its first
            :data:`HEAD_BYTES` bytes, gzip already inflated).
        advice: What to do instead, e.g. ``"export it with `nsys export --type sqlite ...`"``.
    """

    name: str
    what: str
    claims: Callable[[Path, bytes], bool]
    advice: str


_REGISTRY: dict[str, Collector] = {}
_UNREAD: dict[str, Unread] = {}
_LOADED = False


def register(collector: Collector) -> Collector:
    """Add (or replace) a collector; returns it."""
    _REGISTRY[collector.name] = collector
    return collector


def register_unread(unread: Unread) -> Unread:
    """Add (or replace) a format that is recognized and not read; returns it."""
    _UNREAD[unread.name] = unread
    return unread


#: The package whose modules are the collectors (``collectors/`` in the repository, installed as this).
PACKAGE = "traceprof.collectors"
#: The entry-point group through which another installed package adds collectors.
ENTRY_POINTS = "traceprof.collectors"


def load_all() -> None:
    """Import every module of :data:`PACKAGE` and of the :data:`ENTRY_POINTS` group, so that each
    registers itself (once per process)."""
    global _LOADED
    if _LOADED:
        return
    _LOADED = True
    plugins.load(PACKAGE, ENTRY_POINTS)


def collectors() -> list[Collector]:
    """Every registered collector, in claim order."""
    load_all()
    return sorted(_REGISTRY.values(), key=lambda c: (c.order, c.name))


def get(name: str) -> Collector:
    """The collector called ``name``; raises ``KeyError`` when none is registered."""
    load_all()
    return _REGISTRY[name]


def head(path: Path) -> bytes:
    """The first :data:`HEAD_BYTES` bytes of ``path`` (empty when unreadable)."""
    try:
        with path.open("rb") as f:
            return f.read(HEAD_BYTES)
    except OSError:
        return b""


def gunzip_head(data: bytes) -> bytes:
    """The first bytes a gzip stream inflates to, from its first bytes ``data`` (empty when they are
    not a readable gzip start)."""
    try:
        return zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(data, HEAD_BYTES)
    except zlib.error:
        return b""


def recognize(path: Path, first: bytes | None = None) -> str | None:
    """``"<format>: <what to do>"`` for a file of a format traceprof recognizes and does not read,
    else None.

    Args:
        path: A file.
        first: Its first bytes when already read (else read here).
    """
    load_all()
    data = head(path) if first is None else first
    if data.startswith(GZIP_MAGIC):
        data = gunzip_head(data)
    for u in _UNREAD.values():
        if u.claims(path, data):
            return f"{u.what}, which traceprof does not read: {u.advice}"
    return None


def claim(path: Path, first: bytes | None = None) -> Collector | None:
    """The collector that reads ``path``, or None.

    Args:
        path: A file.
        first: Its first bytes when already read (else read here).
    """
    data = head(path) if first is None else first
    for c in collectors():
        if c.claims(path, data):
            return c
    return None


def owners(folder: Path) -> dict[Path, Path]:
    """Each companion file in ``folder`` (:attr:`Collector.companions`) -> the trace beside it that
    it belongs to (both resolved); one claim per file of the folder."""
    out: dict[Path, Path] = {}
    try:
        files = sorted(f for f in folder.iterdir() if f.is_file())
    except OSError:
        return out
    for f in files:
        c = claim(f)
        if c is not None and c.companions is not None:
            for side in c.companions(f):
                if side != f and side.is_file():
                    out.setdefault(side.resolve(), f.resolve())
    return out


#: Names of files that are plainly not traces, to be skipped (with a note) when named among traces, e.g.
#: by a shell glob over a run folder: documentation, text, images, notebooks, scripts, configs.
DOCUMENT_SUFFIXES = frozenset(
    {
        ".md",
        ".markdown",
        ".rst",
        ".txt",
        ".text",
        ".adoc",
        ".org",
        ".html",
        ".htm",
        ".pdf",
        ".png",
        ".jpg",
        ".jpeg",
        ".gif",
        ".svg",
        ".ipynb",
        ".py",
        ".sh",
        ".toml",
        ".ini",
        ".cfg",
        ".yaml",
        ".yml",
    }
)
#: The same for names without a suffix (any case).
DOCUMENT_NAMES = frozenset(
    {"readme", "license", "licence", "notice", "copying", "changelog", "authors", "makefile"}
)


def is_document(path: Path) -> bool:
    """True for a file named as documentation, text, an image, a script or a config
    (:data:`DOCUMENT_SUFFIXES`, :data:`DOCUMENT_NAMES`): plainly no trace. Ask only about a file no
    collector claims: a ``.txt`` NCCL profiler dump is claimed by its content first."""
    return path.suffix.lower() in DOCUMENT_SUFFIXES or path.name.lower() in DOCUMENT_NAMES


def formats() -> str:
    """The formats traceprof reads, one phrase each, for messages."""
    return "; ".join(c.formats for c in collectors())
