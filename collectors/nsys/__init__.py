"""Nsight Systems: ``parse_all`` reads the SQLite export (one trace per rank it holds; ``parse`` a
one-rank export); ``export`` turns a ``.nsys-rep`` into one and wraps a command in ``nsys profile``
(both need ``nsys`` on PATH). What is read, and how: ``docs/nsys.md``."""

from pathlib import Path

from traceprof.collectors.nsys.export import SQLITE_MAGIC, has_export, launch_nsys, sqlite_for
from traceprof.core.parsed import ParsedTrace, ParseOptions
from traceprof.ingest import sources

__all__: list[str] = []


def _claims(path: Path, head: bytes) -> bool:
    """An SQLite file (by its magic bytes, whatever its name) or a ``.nsys-rep`` report without an
    export beside it (with one, the export is read)."""
    return head.startswith(SQLITE_MAGIC) or (path.name.endswith(".nsys-rep") and not has_export(path))


def _parse(path: Path, options: ParseOptions) -> list[ParsedTrace]:
    """The file's traces. The parser is imported here, when a file of this source is read, not
    when files are claimed: an ingest of other sources does not import it."""
    from traceprof.collectors.nsys.parse import parse_all

    return parse_all(sqlite_for(path), options)


sources.register(
    sources.Collector(
        "nsys",
        "Nsight Systems SQLite exports (*.sqlite; *.nsys-rep with nsys on PATH)",
        _claims,
        _parse,
        order=5,
        capture=launch_nsys,
        rank_field="recorded environment RANK (per process: else NVTX 'MPI Rank N', LOCAL_RANK or its device; one "
        "process: else the file name)",
        world_field="recorded environment WORLD_SIZE",
        # the report an export was made from: read through the export beside it
        companions=lambda p: [p.with_name(p.name.removesuffix(".sqlite") + ".nsys-rep")],
    )
)
