"""Ingest orchestration: find trace files, parse them in parallel, group them into runs, store.

Every file is parsed before anything is written, and each run is inserted in one transaction, so
a bad file leaves the store exactly as it was. Inside that transaction the run's collectives are
matched across ranks (``traceprof.ingest.matching``) and its clocks aligned (``traceprof.ingest.clock``), over
the whole run, so both stay current when a run gains ranks.

A file is read by the collector that claims it (``traceprof.ingest.sources``: by name rule or by its
first bytes, Kineto's ``*.json`` catch-all last); a whole-run file (NDTimeline Parquet) is its own
run, named after the file. A file no collector claims is named with the formats that are read, or,
when it is of a format traceprof recognizes and does not read (``sources.recognize``: an Nsight
``.qdrep``, a Chakra ET, ...), as that format with what to do: an error for a file named alone or a
folder holding only such files, a warning for those beside traces.

In a Parquet-layout store (``traceprof.storage.layout``) each parser writes its file's events to Parquet in
the store's staging folder and hands back the rest; ``executor="dask"`` runs the parsers on a Dask
cluster (``traceprof.ingest.executor``). Matching and clock alignment always run here, on the collectives.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import shutil
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from traceprof.core import classify, fileio, limits, procs, spill
from traceprof.core.bounded import too_deep
from traceprof.core.errors import NotATraceError, StoreError, TraceFormatError, TraceprofError, UsageError
from traceprof.core.locking import special_kind
from traceprof.core.parsed import DEFAULT_INFLATE_RATIO, ParsedTrace, ParseOptions
from traceprof.core.text import COUNTED, first_few
from traceprof.core.vocab import TraceSource
from traceprof.ingest import clock, copies, matching, pair_check, sketch, sources
from traceprof.ingest.naming import Part, assign, relate, stem
from traceprof.storage import layout
from traceprof.storage.runs import profiler_gap_text, ranks_held, untraced_ranks
from traceprof.storage.store import Store

__all__ = ["ingest", "discover", "check_input", "IngestResult"]

Progress = Callable[[int, int, str], None]


@dataclass
class IngestResult:
    """What an ingest did.

    Attributes:
        runs: run name -> run_id of every run that gained traces.
        added: Paths of the files ingested.
        skipped: Paths skipped because a file with the same SHA-256 is already stored -> where.
        warnings: Messages for the user (missing ranks, partial world, ...).
        failed: Files that could not be read (``partial=True``) -> the error message.
    """

    runs: dict[str, int] = field(default_factory=dict)
    added: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)


def check_input(path: Path) -> None:
    """Refuse an input path that does not exist or is neither a file nor a folder (a FIFO: reading it
    would wait for a writer forever). The CLI calls this before it opens the store, so that a typo
    leaves no store and no lock file behind.

    Raises:
        UsageError: Naming the path and what it is.
    """
    if not path.exists():
        raise UsageError(f"{path}: {link_problem(path) or 'no such file or directory'}")
    if kind := special_kind(path):
        raise UsageError(f"{path}: {kind}, not a trace file or a folder")


def link_problem(path: Path) -> str | None:
    """What is wrong with symlink ``path`` that leads nowhere: ``a link to TARGET, which does not
    exist`` or ``a link that leads back to itself (a loop of links)``; None when ``path`` is no
    symlink or leads to something."""
    if not path.is_symlink():
        return None
    try:
        os.stat(path)
    except OSError as e:
        if e.errno == errno.ELOOP:
            return "a link that leads back to itself (a loop of links)"
        return f"a link to {os.readlink(path)}, which does not exist"
    return None


def logical_path(path: Path) -> Path:
    """``path`` made absolute as the user's shell spells it: a relative path is joined to ``$PWD``
    where that names the working folder (``cd linkedclean && traceprof ingest .`` names the run
    ``linkedclean``, not the link's target), else to ``os.getcwd()``; ``..`` and ``.`` folded as
    ``os.path.abspath`` folds them."""
    base = os.getcwd()
    pwd = os.environ.get("PWD")
    if not path.is_absolute() and pwd and os.path.isabs(pwd) and pwd != base:
        with contextlib.suppress(OSError):
            if os.path.samefile(pwd, base):
                base = pwd
    return Path(os.path.normpath(os.path.join(base, path)))


def discover(
    paths: Iterable[str | Path],
    unclaimed: list[str] | None = None,
    scanned: set[Path] | None = None,
    unread: dict[Path, str] | None = None,
    named: set[Path] | None = None,
    notes: list[str] | None = None,
    failed: dict[str, str] | None = None,
    origins: dict[Path, Path] | None = None,
) -> dict[Path, list[Path]]:
    """Trace files under ``paths`` (resolved), grouped by the directory that holds them as named
    (one run each; a symlink's own folder, not its target's; symlinked folders are followed:
    :func:`files_under`).

    A file found more than once (named twice, or named and in a folder named) is listed once; a
    path all of whose files came with another path first (a link to a folder named too) gets a
    note (``linked: the same files as clean, read once``), as does a file met again under another
    name in its own path (a link beside its target).
    A file named in ``paths`` that no collector reads is, in this order: the companion of a trace
    beside it (``sources.owners``: Kineto's ``rank0.meta.json``, NDTimeline's meta YAML), read with
    that trace when it is among the inputs too (named, or in a folder named), else refused naming
    the trace; a file of a format recognized and not read, refused with what to do; a document
    (``sources.is_document``: ``README.md``, ``notes.txt``), skipped with a note when other paths
    hold traces (a shell glob over a run folder names it); else refused as not a trace.

    Args:
        paths: Files and directories (searched recursively).
        unclaimed: If given, receives the files found in directories that no collector reads (and
            whose format is not recognized either; not a claimed trace's companion), and the
            entries that are not regular files (``"run/rank1.json: a FIFO (named pipe)"``), never opened.
        scanned: If given, receives the files found by scanning a directory (not named by the user).
        unread: If given, receives file -> ``"<format> ..., which traceprof does not read: <what to
            do>"`` for each file found in a directory beside traces whose format is recognized and
            not read (``sources.recognize``), or whose name says SQLite and is not (``not an SQLite
            database``, as for a named file).
        named: If given, receives the files named in ``paths`` themselves (resolved).
        notes: If given, receives one line per document named and skipped (else such a file is
            refused as any other file that is not a trace), per path or file read once for another
            (above), and per link met in a folder that leads nowhere or back into itself
            (:func:`files_under`).
        failed: If given (``--partial``), a path that holds no trace goes here (path as given ->
            its message) instead of being refused, unless no path holds a trace.
        origins: If given, receives each file returned (resolved) -> its absolute path as found
            (a symlink not resolved), which names its run.

    Raises:
        UsageError: A path does not exist, or holds no trace file (naming the formats of the files
            it holds that are recognized and not read), or is a companion whose trace is not among
            the inputs; with ``failed``, only when no path holds a trace (the first path's message).
    """
    given = [Path(raw) for raw in paths]
    for p in given:
        check_input(p)
    folders = [p.resolve() for p in given if p.is_dir()]
    inputs = {p.resolve() for p in given if p.is_file()}
    owners: dict[Path, dict[Path, Path]] = {}  # folder -> its companions' traces (sources.owners)
    groups: dict[Path, list[Path]] = {}
    refused: dict[Path, UsageError] = {}
    documents: list[Path] = []
    seen: dict[Path, tuple[Path, Path]] = {}  # each file read -> the path given and the file as found
    said: list[str] = []
    for p in given:
        if p.is_file() and _claim(p) is None:
            full = p.resolve()
            folder = owners.setdefault(full.parent, sources.owners(full.parent))
            trace = folder.get(full)
            if trace is not None and (trace in inputs or any(trace.is_relative_to(d) for d in folders)):
                continue  # read with its trace, as when their folder is named
            fmt = sources.recognize(p)
            if trace is not None:
                why = f"{p}: read with the trace {trace.name} beside it, which is not named; name it (or its folder)"
            elif fmt:
                why = f"{p}: {fmt}"
            elif notes is not None and sources.is_document(p):
                documents.append(p)
                continue
            else:
                why = f"{p}: {_misnamed(p) or 'not a trace file traceprof reads'}; it reads: {sources.formats()}"
            refused[p] = UsageError(why)
            continue
        try:
            files = _found(p, unclaimed, scanned, unread, named, said)
        except UsageError as e:
            refused[p] = e
            continue
        again: dict[Path, Path] = {}  # a file read already, as found here -> as found first
        before: list[Path] = []  # the paths given that the files read already came with
        for f in files:
            # The run is named from the path as given (a symlinked file or folder takes the name of
            # the folder it is named in, not its target's); the file is read once by its target.
            shown = logical_path(f)
            f = f.resolve()
            if f in seen:  # the same file named twice (or named and in a folder named): read once
                source, first = seen[f]
                again[shown] = first
                if source not in before:
                    before.append(source)
                continue
            seen[f] = (p, shown)
            if origins is not None:
                origins[f] = shown
            # A whole-run file (NDTimeline) is its own group, keyed by the file itself.
            c = _claim(f)
            groups.setdefault(shown if c is not None and c.whole_run else shown.parent, []).append(f)
        if again and len(again) == len(files) and p not in before:
            said.append(f"{p}: the same files as {', '.join(map(str, before))}, read once")
        elif p in before:  # links beside their targets in one folder
            said += [f"{f}: the same file as {first}, read once" for f, first in again.items()]
    if refused and (failed is None or not groups):
        raise next(iter(refused.values()))
    if documents and not groups:  # nothing else to ingest: the document is what was meant
        raise UsageError(f"{documents[0]}: not a trace file traceprof reads; it reads: {sources.formats()}")
    if failed is not None:
        failed.update({str(p): str(e) for p, e in refused.items()})
    if notes is not None:
        notes += [f"skipped {d}: not a trace (named as a document)" for d in documents] + said
    return groups


#: Name endings of SQLite files (Nsight Systems exports ``*.sqlite``), and the 16 bytes every SQLite
#: database starts with (the SQLite file format, "The Database Header").
_SQLITE_NAMES = (".sqlite", ".sqlite3", ".db")
_SQLITE_HEADER = b"SQLite format 3\x00"


def _misnamed(p: Path) -> str | None:
    """What file ``p`` (claimed by no collector) is not, where its name says it is: a ``.sqlite``
    file that is not an SQLite database (no SQLite header), else None."""
    if p.name.lower().endswith(_SQLITE_NAMES) and not sources.head(p).startswith(_SQLITE_HEADER):
        return (
            f"not an SQLite database (named {p.suffix}, but it does not start with the SQLite header): "
            "a damaged copy or a wrong name"
        )
    return None


def _found(
    p: Path,
    unclaimed: list[str] | None,
    scanned: set[Path] | None,
    unread: dict[Path, str] | None,
    named: set[Path] | None,
    said: list[str] | None = None,
) -> list[Path]:
    """The trace files of input path ``p``: itself (a file a collector claims), or those found in
    folder ``p`` (see :func:`discover` for the out-parameters).

    Raises:
        UsageError: ``p`` is a folder holding no trace file.
    """
    if p.is_file():
        if named is not None:
            named.add(p.resolve())
        return [p]
    passed: list[str] = []  # this folder's loops and dangling links, named if nothing else is found
    special: list[Path] = []  # FIFOs, sockets, devices: never opened
    found = files_under(p, passed, special)
    if said is not None:
        said += passed
    claims = {f: c for f in found if (c := _claim(f)) is not None}
    files = list(claims)
    # a claimed trace's companions (rank0.meta.json, an export's .nsys-rep) are read with it
    sides = {s for f, c in claims.items() if c.companions is not None for s in c.companions(f)}
    rest = [f for f in found if f not in claims]
    # a damaged .sqlite is named as when the file itself is (not an SQLite database), not passed over
    known = {f: k for f in rest if (k := sources.recognize(f) or _misnamed(f))}
    if scanned is not None:
        scanned.update(f.resolve() for f in files)
    if unclaimed is not None and files:  # a folder of no trace: its error names them
        unclaimed += [
            str(f) for f in rest if f not in known and f not in sides and not f.name.endswith(".meta.json")
        ]
        unclaimed += [f"{f}: {special_kind(f)}" for f in special]
    if files and unread is not None:
        unread.update(known)
    if not files and known:
        raise UsageError(_unread_message(p, known))
    if not files:
        left = f" (passed over: {first_few(passed, sep='; ', more='; and {} more')})" if passed else ""
        raise UsageError(f"{p}: no trace files found{left}; traceprof reads: {sources.formats()}")
    return files


def files_under(
    folder: Path, notes: list[str] | None = None, special: list[Path] | None = None
) -> list[Path]:
    """The files under ``folder``, at any depth, sorted, each as found (not resolved): a symlinked
    folder is followed (``pathlib``'s ``rglob`` left it out, so a run folder linked into a folder
    was "no trace files found"), except one that leads back to a folder already walked or to one
    that holds ``folder`` (a loop: its files are read once, where first found). A symlinked file
    is listed under its own name; :func:`discover` reads the same file once. A folder that cannot
    be listed is passed over, as ``rglob`` did.

    ``notes``, if given, receives a line for each folder passed over as one walked already
    (``links/runC: the same files as links/runA, read once``) or as a loop, and for each link
    that leads nowhere or back to itself (``links/gone: a link to x, which does not exist;
    skipped``): nothing found is left out without a word. ``special``, if given, receives each
    entry that is neither a regular file nor a folder (a FIFO, a socket, a device), never opened.
    """
    out: list[Path] = []
    root = os.path.realpath(folder)
    first = {root: str(folder)}  # each folder walked (real path) -> where it was first found
    said: list[str] = []
    for here, dirs, names in os.walk(folder, followlinks=True):
        keep = []
        for d in sorted(dirs):
            path = os.path.join(here, d)
            real = os.path.realpath(path)
            if root == real or root.startswith(real.rstrip(os.sep) + os.sep):
                said.append(f"{path}: a link back to {real}, which holds {folder} (a loop); not followed")
            elif real in first:
                said.append(f"{path}: the same files as {first[real]}, read once")
            else:
                first[real] = path
                keep.append(d)
        dirs[:] = keep
        for n in names:
            f = Path(here, n)
            if f.is_file():
                out.append(f)
            elif bad := link_problem(f):
                said.append(f"{f}: {bad}; skipped")
            elif special is not None and special_kind(f):
                special.append(f)
    if notes is not None:
        notes += sorted(said)
    return sorted(out)


def _unread_message(folder: Path, known: dict[Path, str]) -> str:
    """The error for a folder whose only files of a known format are formats not read: each format
    once, with its files (at most 3 named) and what to do."""
    by_format: dict[str, list[Path]] = {}
    for f, k in known.items():
        by_format.setdefault(k, []).append(f)
    parts = [f"{first_few(fs, more=COUNTED, shown=lambda f: f.name)}: {k}" for k, fs in by_format.items()]
    return f"{folder}: holds no trace file traceprof reads; " + "; ".join(parts)


def _claim(path: Path) -> sources.Collector | None:
    """The collector that reads ``path`` (``traceprof.ingest.sources``), or None."""
    return sources.claim(path)


def _sha256(path: Path) -> str:
    """SHA-256 hex digest of ``path``'s bytes (read in 1 MiB chunks)."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _parse_one(args: tuple[Path, ParseOptions]) -> list[ParsedTrace] | TraceprofError:
    """Parse one file with its options; its error comes back as a value (the caller skips a
    scanned non-trace, lists the failure with --partial, or refuses). What the reader repaired
    (invalid UTF-8) is added to each trace's warnings and counted in ``traces.meta`` under
    ``repaired``."""
    path, options = args
    try:
        pts = _parse_source(path, options)
    except TraceFormatError as e:  # claimed by its name or bytes, then not of that source: of a known format?
        known = sources.recognize(path)
        return NotATraceError(path, "", known) if known else e
    except TraceprofError as e:
        return e
    except RecursionError:  # any source's data nested past Python's stack, wherever it is walked
        return too_deep(path, what="data")
    except ValueError as e:  # any message that tried to print a number over 4300 digits
        if "integer string conversion" not in str(e):
            raise
        return TraceFormatError(
            path, "", "holds an integer over 4300 digits long, which no trace field holds"
        )
    finally:
        repairs = fileio.pop_repairs(path) + fileio.pop_repairs(path.resolve())
    for pt in pts:
        pt.events_digest = copies.events_digest(pt.events)  # before the rows are parked
        pt.events_sketch = sketch.events_sketch(pt.events)
        if len(pts) > 1:  # one file of several traces: held to their run's budget together
            pt.long_text = limits.long_text_rows(pt.events)
        if repairs:
            meta = msgspec.json.decode(pt.trace.get("meta") or "{}")  # as the parsers wrote it (any integer)
            meta["repaired"] = {**meta.get("repaired", {}), **{r.reason: r.count for r in repairs}}
            pt.trace["meta"] = msgspec.json.encode(meta).decode()
            pt.warnings += [r.message for r in repairs]
    return pts


def _parse_one_of_several(args: tuple[Path, ParseOptions]) -> list[ParsedTrace] | TraceprofError:
    """:func:`_parse_one`, for an ingest of several files into the DuckDB layout: each trace also
    gets its rows of long text (``ParsedTrace.long_text``), which ingest holds to their run's budget
    (``traceprof.core.limits.drop_run_long_text``; a run of one file was held to it by its parser)."""
    got = _parse_one(args)
    if not isinstance(got, TraceprofError) and len(got) == 1:
        for pt in got:
            pt.long_text = limits.long_text_rows(pt.events)
    return got


#: How a parser process writes a trace's events for the ingest process (:func:`_park_one`):
#: ``stage``: Parquet in a Parquet-layout store's staging folder; ``spool``: Arrow IPC, read back
#: and inserted one trace at a time into a DuckDB-layout store.
_PARK = {"stage": layout.stage, "spool": layout.spool}


def _park_one(args: tuple[Path, ParseOptions, str, str]) -> list[ParsedTrace] | TraceprofError:
    """Parse one file (:func:`_parse_one`) and write each trace's events into folder ``args[2]``
    the way ``args[3]`` names (:data:`_PARK`): the traces come back without their event rows."""
    got = _parse_one(args[:2]) if args[3] == "stage" else _parse_one_of_several(args[:2])
    if isinstance(got, TraceprofError):
        return got
    park = _PARK[args[3]]
    try:
        return [park(pt, Path(args[2])) for pt in got]
    except TraceprofError as e:
        return e


def _parse_source(path: Path, options: ParseOptions) -> list[ParsedTrace]:
    collector = _claim(path)
    if collector is None:
        raise UsageError(f"{path}: not a trace file traceprof reads; it reads: {sources.formats()}")
    return collector.parse(path, options)


def ingest(
    store: Store,
    paths: Iterable[str | Path],
    *,
    run: str | None = None,
    on_bad_event: str = "raise",
    jobs: int | None = None,
    progress: Progress | None = None,
    align: bool = True,
    partial: bool = False,
    force_run: bool = False,
    max_inflate_ratio: float = DEFAULT_INFLATE_RATIO,
    comm_kernels: Iterable[str] = (),
    executor: str = "local",
    scheduler: str | None = None,
) -> IngestResult:
    """Ingest trace files or directories into ``store``.

    Each directory of rank files is one run named after the directory (a whole-run file such as an
    NDTimeline Parquet trace, or a file named alone: named after the file), unless ``run`` names one
    run for everything; folders of one name, and files of one folder that cannot be one job, are
    told apart (:mod:`traceprof.ingest.naming`, each said in a warning).
    Files already stored (same SHA-256) are skipped. Collectives of every run that gained traces
    are matched and, unless ``align`` is false, clocks are aligned (both over the whole run).

    Args:
        store: An open, writable store.
        paths: Files and directories (searched recursively).
        run: Run name for all files; default: by :mod:`traceprof.ingest.naming`.
        on_bad_event: ``raise`` or ``skip`` malformed events (see ``traceprof.collectors.kineto.parse``).
        jobs: Parallel parser processes (default: CPU count, at most one per file; none for inputs
            under 16 MiB, parsed in this process).
        progress: Called as ``progress(done, total, path)`` after each parsed file.
        align: Estimate and apply per-rank clock offsets (``traceprof.ingest.clock``); false stores the
            source timestamps unchanged.
        partial: Store the files that parse and list the others in ``failed``, instead of
            storing nothing when any file fails.
        force_run: Append to an existing run even if the traces look like another job's
            (``traceprof.storage.identity``).
        max_inflate_ratio: Refuse a gzip file that inflates beyond this multiple of its size.
        comm_kernels: Extra regexes of communication kernel names (``--comm-kernel``), added to
            the built-in families of ``traceprof.core.classify``.
        executor: ``local`` (this process and forked workers) or ``dask``: parse each file on the
            Dask cluster at ``scheduler`` (``traceprof.ingest.executor``; needs a Parquet-layout store and
            files on a shared filesystem).
        scheduler: Dask scheduler address (``tcp://HOST:8786``), for ``executor="dask"``.

    Raises:
        TraceFormatError: A file cannot be parsed (nothing is written; with several such files, the
            message lists them all).
        KeyboardInterrupt: Ctrl-C; the runs stored before it are in ``store.commits``.
        UsageError: Bad paths, paths holding no trace (each file found skipped as not a trace;
            files already stored are success), ranks missing from a multi-file run, a ``run`` name that is
            all digits or holds control characters (``traceprof.storage.runs.check_name``), or a Dask
            executor without a scheduler, without Dask, or with a DuckDB-layout store.
        StoreError: Rank conflicts with what the run already holds, or another job's traces
            (checked for every run before any is inserted: nothing is written); a later run's
            insert failing after earlier runs were committed (the message names those runs).
    """
    from traceprof.storage.runs import check_name

    if run is not None:  # a numeric name would shadow a run id (`runs rm 1`), as runs mv refuses
        check_name(run, "--run")
    _check_executor(store, executor, scheduler)
    result = IngestResult()
    unclaimed: list[str] = []
    unread: dict[Path, str] = {}
    scanned: set[Path] = set()
    paths = list(paths)  # named again in a message
    named: set[Path] = set()
    documents: list[str] = []
    origins: dict[Path, Path] = {}
    groups = discover(
        paths, unclaimed, scanned, unread, named, documents, result.failed if partial else None, origins
    )
    result.warnings += documents
    result.warnings += [f"not read: {f}: {k}" for f, k in unread.items()]
    todo: list[tuple[Part, Path]] = []
    # Only a file of a stored size can be stored already: hash just those here (a second read);
    # the parser hashes every file as it reads it (``traces.sha256``).
    sizes = store.stored_sizes()
    stats: dict[Path, os.stat_result] = {}  # each file statted once, here
    earlier = copies.Earlier(_sha256)  # this ingest's runs so far: copies of their files, as of stored ones
    for group, files in groups.items():
        # a whole-run file, or a file named alone: its run is named after it (traceprof.ingest.naming)
        lone = group.is_file() or (len(files) == 1 and files[0] in named)
        origin = origins.get(files[0], files[0]) if lone else group
        name = run or (stem(origin) if lone else group.name)
        part = Part(name, origin, [])
        if not run:  # named after its folder (or whole-run file): the rules of --run hold for it too
            check_name(name, f"{origin} (its run name; set another with --run NAME)")
        new: list[Path] = []
        elsewhere: dict[Path, str] = {}
        copied: dict[Path, str] = {}  # a copy (another path) of a file stored in another run -> that run
        for f in files:
            stats[f] = f.stat()
            size = stats[f].st_size
            sha = _sha256(f) if size in sizes else None
            held = copies.stored_copies(store, sha) if sha is not None else []
            found = store.find_sha(sha, str(f), name) if sha is not None and held else None
            if found is None and (other := earlier.copy_of(name, f, size)) is not None:
                copied[f] = other  # a copy of a file of a run met earlier in this ingest
            elif found is None:
                new.append(f)
            elif any(n == name for n, _ in held) or any(p == str(f) for _, p in held):
                result.skipped[str(f)] = found[1]  # this run's, or the stored file itself
                if found[0] != name:
                    elsewhere[f] = found[1]
            else:
                copied[f] = held[0][0]
        if new and elsewhere:  # the new run would silently lack the ranks stored elsewhere
            f, where = next(iter(elsewhere.items()))
            raise UsageError(
                f"{f}: already stored in {where}, so run {name!r} would miss that rank; a file belongs "
                "to one run: ingest the files under that run's name, or into another store (--db)"
            )
        if copied and (new or run):  # copies.py rule 2: a copy is a file of each run it lies in
            new += list(copied)
            result.warnings.append(
                f"{origin}: {len(copied)} file(s) are copies (same sha256) of files stored in run "
                f"{next(iter(copied.values()))!r}, stored in run {name!r} too"
            )
        elif copied and len(set(copied.values())) == 1 and earlier.whole(next(iter(copied.values())), files):
            new += list(copied)  # a whole run of this ingest again: two runs as named (copies.same_runs)
        elif copied:  # every file a copy: that run again, a run of its own only when asked
            result.skipped.update({str(f): f"run {n!r}, as a copy" for f, n in copied.items()})
            result.warnings.append(
                f"{origin}: every file is a copy (same sha256) of one stored in run "
                f"{next(iter(copied.values()))!r}: not stored again; to store it as a run of its own, ingest "
                "it with --run NAME"
            )
        todo += [(part, f) for f in files if f in new]
        for f in new:
            earlier.add(name, f, stats[f].st_size)
    fileio.check_inflate_ratio(max_inflate_ratio)
    comm_kernels = classify.Classifier(comm_kernels).extra  # a bad pattern fails here, before parsing
    if comm_kernels and result.skipped:
        result.warnings.append(
            f"--comm-kernel applies to files parsed now; {len(result.skipped)} already stored file(s) keep the "
            "classes of their first ingest (remove the run with `traceprof runs rm NAME` and ingest again)"
        )
    spool: Path | None = None  # DuckDB layout, several files: events wait here (Arrow IPC) until inserted
    # how every file is read, carried by each task (large args text spills on the store's disk, not /tmp)
    options = ParseOptions(
        on_bad_event, comm_kernels, float(max_inflate_ratio), str(Path(store.path).absolute().parent)
    )
    try:
        tasks = [(f, options) for _, f in todo]
        if store.dataset is None and len(tasks) > 1:
            try:
                spool = layout.spool_dir(store.path)
            except OSError:  # the store's folder is not writable: the events come back in memory
                spool = None
        parsed = _parse_all(
            tasks,
            jobs,
            progress,
            store,
            scheduler if executor == "dask" else None,
            spool,
            sum(stats[f].st_size for _, f in todo if stat.S_ISREG(stats[f].st_mode)),
        )
        not_traces: list[Path] = []
        why: dict[Path, NotATraceError] = {}
        for (part, f), pts in zip(todo, parsed, strict=True):
            if isinstance(pts, NotATraceError) and f in scanned:
                result.warnings.append(f"skipped {pts}")
                not_traces.append(f)
                why[f] = pts
            elif isinstance(pts, TraceprofError):
                result.failed[str(f)] = str(pts)
            else:
                part.traces.extend(pts)
        parts = list({id(p): p for p, _ in todo if p.traces}.values())
        if run is not None:
            by_run = (
                {run: copies.once([pt for p in parts for pt in p.traces], result.warnings)} if parts else {}
            )
            if by_run and len(split_jobs := relate(by_run[run])) > 1:
                raise TraceFormatError(
                    split_jobs[1][0].path,
                    "",
                    f"its files are {len(split_jobs)} jobs' (sets of processes that share no communicator, each "
                    f"with the same ranks; first files {', '.join(Path(j[0].path).name for j in split_jobs)}) and "
                    f"cannot be one run {run!r}; {_split_hint(True)}",
                )
        else:
            for p in parts:  # a folder's copy of a rank file is that rank once (copies.py rule 1)
                p.traces = copies.once(p.traces, result.warnings)
            by_run, renamed = assign(parts, store)
            result.warnings += renamed + copies.same_runs(by_run)
        # a folder named beside others whose every file tried is not a trace holds no trace, as an empty one
        empty = _no_trace_folders(paths, todo, not_traces, result.skipped, unread, result.failed)
        if empty:
            gone = {f for fs in empty.values() for f in fs}
            said = {f"skipped {why[f]}" for f in gone}  # the folder's message names them
            result.warnings = [w for w in result.warnings if w not in said]
            messages = {str(p): _no_trace_message([p], fs, {}) for p, fs in empty.items()}
            if all(f in gone for _, f in todo) and not result.skipped:  # --partial, no path holds a trace:
                every = result.failed | messages  # the first path's error, as discover gives it
                raise UsageError(next(every[k] for k in map(str, map(Path, paths)) if k in every))
            if not partial:
                _refuse_folders(messages)
            result.failed.update(messages)
        unclaimed = [u for u in unclaimed if not any(Path(u).is_relative_to(p) for p in empty)]  # named there
        # a run folder's README.md, notes or scripts are expected there: only files of no known kind
        # (a blob.bin) and special files (a FIFO) are worth a line
        unclaimed = [u for u in unclaimed if not sources.is_document(Path(u))]
        if unclaimed:  # one line, however many: a blob.bin, a FIFO
            result.warnings.append(
                f"skipped {len(unclaimed)} file(s) that no collector reads (not traces): "
                + first_few(unclaimed, more=COUNTED)
            )
        if result.failed and not partial:
            _refuse(result.failed, [e for e in parsed if isinstance(e, TraceprofError)], len(todo))
        if not by_run and not result.failed and not result.skipped:
            _nothing_to_ingest(
                paths,
                not_traces,
                unread
                | {
                    f: pts.reason
                    for (_, f), pts in zip(todo, parsed, strict=True)
                    if isinstance(pts, NotATraceError) and sources.recognize(f)
                },
            )
        for name, traces in by_run.items():
            if store.dataset is None:  # DuckDB commits the run's files in one transaction
                limits.drop_run_long_text(traces, on_bad_event)
            _settle_ranks(name, traces, result, named=run is not None)
            copies.check_processes(name, traces, result.warnings, _field(traces[0], "rank_field"))
            copies.check_stored(store, name, traces, _field(traces[0], "rank_field"))
        if len(by_run) > 1:  # a refused run must leave no other run of this ingest stored
            store.check_runs(by_run, force=force_run)
        for name, traces in by_run.items():
            notes: list[str] = []

            def settle(run_id: int, notes: list[str] = notes, traces: list[ParsedTrace] = traces) -> None:
                _drop_events(traces)  # in the store now: matching and alignment read them there
                notes.extend(_settle_run(store, run_id, align))

            try:
                result.runs[name] = store.insert_run(name, traces, after=settle, force=force_run)
            except TraceprofError as e:
                if not result.runs:
                    raise
                stored = ", ".join(f"run {n!r} (id {i})" for n, i in result.runs.items())
                raise StoreError(f"stored {stored}; run {name!r} not stored: {e}") from None
            result.added += sorted({pt.path for pt in traces})
            result.warnings += [f"run {name!r}: {n}" for n in notes]
    finally:  # staged Parquet files no run took (failed or skipped files); spooled events, on success too
        if store.dataset is not None:
            store.dataset.discard()
        if spool is not None:
            shutil.rmtree(spool, ignore_errors=True)
    return result


def _check_executor(store: Store, executor: str, scheduler: str | None) -> None:
    """Refuse what ``traceprof.ingest.executor.check_options`` refuses, and Dask with a DuckDB-layout store."""
    from traceprof.ingest.executor import check_options

    if check_options(executor, scheduler) and store.dataset is None:
        raise UsageError(
            f"--executor dask writes the Parquet layout, but {store.path} has the duckdb layout; "
            "ingest into a new store (--db) or without --executor dask"
        )


def _refuse(failed: dict[str, str], errors: list[TraceprofError], files: int) -> None:
    """Raise the error of the one file that failed, or one that lists them all."""
    first = next(e for e in errors if str(e) in failed.values())
    if len(failed) == 1:
        if files > 1 and isinstance(first, TraceFormatError):
            raise first.with_reason("; nothing stored (--partial stores the other files)")
        raise first
    lines = "".join(f"\n  {msg}" for msg in failed.values())
    # about every file (each line below names its own): no one path heads the message
    others = " (--partial stores the others)" if len(failed) < files else ""  # none when every file failed
    raise TraceFormatError(
        "", "", f"{len(failed)} of {files} files cannot be read, nothing stored{others}:{lines}"
    )


def _no_trace_folders(
    paths: Iterable[str | Path],
    todo: list[tuple[Part, Path]],
    not_traces: list[Path],
    skipped: dict[str, str],
    unread: dict[Path, str],
    failed: dict[str, str],
) -> dict[Path, list[Path]]:
    """The folders among ``paths`` that hold no trace though a collector tried their files: every
    file of theirs parsed (``todo``) is not a trace (``not_traces``), none is stored already
    (``skipped``) and none is of a format recognized and not read (``unread``) -> those files.
    Empty when no other path holds a file to ingest and none failed (``failed``, so far):
    :func:`_nothing_to_ingest` names them all."""
    found: dict[Path, list[Path]] = {}
    for p in dict.fromkeys(Path(raw) for raw in paths):
        if not p.is_dir():
            continue
        inside = {f.resolve() for f in files_under(p)}  # through symlinked folders too
        under = [f for _, f in todo if f in inside]
        if (
            under
            and set(under) <= set(not_traces)
            and not any(Path(k).resolve() in inside for k in skipped)
            and not any(f.resolve() in inside for f in unread)
        ):
            found[p] = under
    tried = {f for fs in found.values() for f in fs}
    if all(f in tried for _, f in todo) and not skipped and not failed:
        return {}
    return found


def _refuse_folders(messages: dict[str, str]) -> None:
    """Raise the error for folders named beside others that hold no trace (path -> message)."""
    if len(messages) == 1:
        raise UsageError(next(iter(messages.values())) + "; nothing stored (--partial stores the others)")
    lines = "".join(f"\n  {m}" for m in messages.values())
    # about several paths (each line below names its own), one line each as _refuse's list of files
    raise TraceFormatError(
        "", "", f"{len(messages)} paths hold no trace, nothing stored (--partial stores the others):{lines}"
    )


def _nothing_to_ingest(paths: Iterable[str | Path], skipped: list[Path], known: dict[Path, str]) -> None:
    """Raise the error for an ingest whose directories hold no trace (:func:`_no_trace_message`)."""
    raise UsageError(_no_trace_message(paths, skipped, known))


def _no_trace_message(paths: Iterable[str | Path], skipped: list[Path], known: dict[Path, str]) -> str:
    """The error for paths whose directories hold no trace: each file a collector tried
    (``skipped``) is not a trace, the others no collector reads. One line naming the paths given
    and the files skipped (those tried first); when some are of a format recognized and not read
    (``known``: file -> its format and what to do), it names those formats instead."""
    named = ", ".join(str(p) for p in paths)
    if known:
        return _unread_message(Path(named), known)
    others = sorted(
        {f.resolve() for p in map(Path, paths) if p.is_dir() for f in files_under(p)}
        - {f.resolve() for f in skipped}
    )
    files = [*skipped, *others]
    shown = first_few(files, more=COUNTED, shown=lambda f: f.name)
    return (
        f"{named}: no trace files found (skipped {len(files)} file(s) that are not traces: {shown}); "
        f"traceprof reads: {sources.formats()}"
    )


def _drop_events(traces: list[ParsedTrace]) -> None:
    """Let go of the events rows of ``traces`` once they are inserted (their ``events_kept`` is
    stored already), and give their memory back, before matching and clock alignment run: the
    rows were held until the ingest returned, through the peak that matching adds (its polars
    import, its frames), 45 of the 145 MB above start-up of ``hta/df_index_resolver``."""
    for pt in traces:
        pt.events = None
    spill.release()


def _settle_run(store: Store, run_id: int, align: bool) -> list[str]:
    """Match the run's collectives and align its clocks (inside the insert transaction).

    Returns:
        Messages worth a warning (ranks of the job not traced, instances missing ranks, matching
        fallbacks). Ranks are counted over the whole run, with what earlier ingests stored.
    """
    held = ranks_held(store, run_id)  # read once for both counts and the settle hooks below
    untraced, world = untraced_ranks(
        store, run_id, held=held
    )  # ranks a collapsed NDTimeline worker stands for count
    notes = [f"{world - len(untraced)} of {world} ranks traced"] if world and untraced else []
    gap = profiler_gap_text(store, run_id, held)
    if gap:  # a dump of its collectives only: the timeline analyses lack that rank
        notes.append(gap)
    # a source's settle reads the run's traces (and their rows) of that source alone: none, nothing to do
    # (a Kineto run: 4 statements of Flight Recorder's and the NCCL plugin's hooks less)
    notes += [
        n
        for c in sources.collectors()
        if c.settle is not None and c.name in held.sources
        for n in c.settle(store, run_id)
    ]
    summary = matching.match_run(store, run_id)
    notes += summary.notes  # e.g. sequence numbers that cannot be per group: matched by order instead
    notes += clock.align_run(store, run_id, enabled=align).warnings  # e.g. replica groups never linked
    notes += pair_check.check_pair_order(store, run_id)  # order pairs whose times or sizes do not fit
    if summary.incomplete:
        notes.append(
            f"{summary.incomplete} of {summary.instances} matched collectives miss some ranks "
            "(see collective_instances.ranks_missing)"
        )
    return notes


#: Below this many bytes of input, files are parsed in the ingest process (starting workers costs more).
_PARALLEL_BYTES = 16 << 20


def _parse_all(
    tasks: list[tuple[Path, ParseOptions]],
    jobs: int | None,
    progress: Progress | None,
    store: Store,
    scheduler: str | None = None,
    spool: Path | None = None,
    size: int = 0,
) -> list[list[ParsedTrace] | TraceprofError]:
    """Parse every task's file: locally (``jobs`` processes) or on the Dask cluster at ``scheduler``;
    in a Parquet-layout store the events go to its staging folder, else, when ``spool`` is given, to
    Arrow IPC files there (:func:`_park_one`). ``size``: the regular files' bytes, summed (as the
    caller statted them), which decide ``jobs`` when it is None."""
    n = len(tasks)

    def done(i: int) -> None:
        if progress:
            progress(i, n, str(tasks[i - 1][0]))

    if store.dataset is not None:
        staged = [(*t, str(store.dataset.staging()), "stage") for t in tasks]
        if scheduler is not None:
            from traceprof.ingest.executor import map_on_dask

            return map_on_dask(_park_one, staged, scheduler, done)
    if jobs is None:  # parallel only when there is enough to parse to pay for starting workers
        jobs = 1 if size < _PARALLEL_BYTES else os.cpu_count() or 1
    if min(jobs, n) > 1:  # workers are forked: not while DuckDB creates the store in a thread
        store.ready()
    if store.dataset is not None:
        return procs.map_in_workers(_park_one, staged, min(jobs, n), done)
    if spool is not None:
        spooled = [(*t, str(spool), "spool") for t in tasks]
        return procs.map_in_workers(_park_one, spooled, min(jobs, n), done)
    return procs.map_in_workers(_parse_one if n == 1 else _parse_one_of_several, tasks, min(jobs, n), done)


def _field(pt: ParsedTrace, which: str) -> str:
    """Where ``pt``'s source records its rank / world size (``which``: ``rank_field`` or
    ``world_field`` of its collector), for messages."""
    try:
        return str(getattr(sources.get(pt.source), which))
    except KeyError:
        return "rank" if which == "rank_field" else "world size"


def _split_hint(named: bool) -> str:
    """How to make two jobs' files two runs: ``named`` when ``--run`` was given, which puts every file
    of the ingest in that one run and so cannot split them."""
    if named:
        return (
            "--run puts every file of this ingest in that one run, so it cannot split them: ingest each "
            "job's files on their own, each with its own --run NAME"
        )
    return "put each job's files in their own directory, or ingest them on their own with --run NAME each"


def _stores_no_event(pt: ParsedTrace) -> bool:
    """Whether ``pt`` has no event to store (none read, or only metadata, flows or rejected ones)."""
    return not pt.events_read or (pt.events is not None and pt.events.num_rows == 0)


def _no_event(pt: ParsedTrace) -> str:
    """Why ``pt`` stores no event (:func:`_stores_no_event`): ``traceEvents holds no event (an empty
    capture?)``, or what its events were (``no event to store (of 1 read: 1 metadata)``)."""
    if not pt.events_read:
        return "traceEvents holds no event (an empty capture?)"
    kinds = {**pt.skipped, **{f"rejected ({r})": n for r, n in pt.rejected.items()}}
    return (
        f"no event to store (of {pt.events_read} read: "
        + ", ".join(f"{n} {k}" for k, n in kinds.items())
        + ")"
    )


def _settle_ranks(name: str, traces: list[ParsedTrace], result: IngestResult, named: bool = False) -> None:
    """Check ranks within one run: a lone file without a rank is rank 0 (with a warning).

    Raises:
        TraceFormatError: Several files without a rank; two files of one rank and source; files
            that give different world sizes. The hint fits ``named`` (``--run`` given, one run for
            all files: :func:`_split_hint`). Every file of the run a Kineto trace without an event
            to store (``{"traceEvents": []}``, only metadata events, every event rejected): the run
            would have nothing to analyse (an empty rank among others is stored, with a warning).
    """
    if all(pt.source == TraceSource.kineto and _stores_no_event(pt) for pt in traces):
        others = f" (as are the other {len(traces) - 1} file(s) of run {name!r})" if len(traces) > 1 else ""
        raise TraceFormatError(traces[0].path, "", f"empty: {_no_event(traces[0])}{others}; nothing stored")
    for pt in traces:
        result.warnings += pt.warnings
        if _stores_no_event(pt) and not pt.empty_said:  # stored (its metadata is the file's), but no
            # analysis has anything to read; one warning per cause: not where the parser said why
            why = _no_event(pt) if pt.events_read else "no events in the trace (an empty capture?)"
            result.warnings.append(f"{Path(pt.path).name}: {why}; its run has no activity from it")
        if pt.rejected:
            first = pt.first_rejected  # the first record of a reason, where the parser names it
            why = ", ".join(
                f"{n} {reason}{f' (first: {first[reason]})' if reason in first else ''}"
                for reason, n in pt.rejected.items()
            )
            result.warnings.append(
                f"{Path(pt.path).name}: {sum(pt.rejected.values())} record(s) not stored: {why}"
            )
    missing = [pt for pt in traces if pt.rank is None]
    if missing and len(traces) == 1:
        missing[0].rank = 0
        result.warnings.append(
            f"{Path(missing[0].path).name}: rank unknown, stored as rank 0 of run {name!r}"
        )
    elif missing:
        field = _field(missing[0], "rank_field")
        # the parser's word on a rank that is there but unusable (e.g. "distributedInfo.rank is 1.5, not an integer")
        said = [w.split(": ", 1)[-1] for w in missing[0].warnings if f"{field} is " in w]
        raise TraceFormatError(
            missing[0].path,
            field,
            f"no rank in the trace{f' ({said[0]})' if said else ''} and {len(traces)} files in run {name!r}; add a "
            '<name>.meta.json sidecar with "rank", or ingest the file alone with --run',
        )
    seen: dict[tuple[int, str, str | None], ParsedTrace] = {}
    for pt in traces:
        assert pt.rank is not None
        if (other := seen.get((pt.rank, pt.source, pt.part))) is not None:
            raise TraceFormatError(
                pt.path,
                _field(pt, "rank_field"),
                f"rank {pt.rank} also in {other.path} (same run {name!r}): "
                + (
                    "the two files are the same trace (same sha256): leave one out"
                    if other.sha256 == pt.sha256
                    else f"two traces of one rank are two jobs; {_split_hint(named)}"
                ),
            )
        seen[(pt.rank, pt.source, pt.part)] = pt
    worlds = {pt.world_size: pt for pt in traces if pt.world_size is not None}
    if len(worlds) > 1:
        (w1, t1), (w2, t2) = sorted(worlds.items(), key=lambda kv: kv[0])[:2]
        raise TraceFormatError(
            t2.path,
            _field(t2, "world_field"),
            f"world size {w2}, but {t1.path} in the same run {name!r} says {w1}: traces of different jobs "
            f"cannot be one run; {_split_hint(named)}",
        )
