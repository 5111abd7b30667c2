"""Ingest orchestration: find trace files, parse them in parallel, group them into runs, store.

Every file is parsed before anything is written, and each run is inserted in one transaction, so
a bad file leaves the store exactly as it was. Inside that transaction the run's collectives are
matched across ranks (``traceprof.matching``) and its clocks aligned (``traceprof.clock``), over
the whole run, so both stay current when a run gains ranks.

A file is read by the collector that claims it (``traceprof.sources``: by name rule or by its
first bytes, Kineto's ``*.json`` catch-all last); a whole-run file (NDTimeline Parquet) is its own
run, named after the file. A file no collector claims is named with the formats that are read.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from traceprof import clock, matching, sources
from traceprof.errors import NotATraceError, TraceFormatError, UsageError
from traceprof.parsed import ParsedTrace
from traceprof.store import Store

__all__ = ["ingest", "discover", "IngestResult"]

Progress = Callable[[int, int, str], None]


@dataclass
class IngestResult:
    """What an ingest did.

    Attributes:
        runs: run name -> run_id of every run that gained traces.
        added: Paths of the files ingested.
        skipped: Paths skipped because a file with the same SHA-256 is already stored -> where.
        warnings: Messages for the user (missing ranks, partial world, ...).
    """

    runs: dict[str, int] = field(default_factory=dict)
    added: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def discover(
    paths: Iterable[str | Path], unclaimed: list[str] | None = None, scanned: set[Path] | None = None
) -> dict[Path, list[Path]]:
    """Trace files under ``paths``, grouped by the directory that holds them (one run each).

    Args:
        paths: Files and directories (searched recursively).
        unclaimed: If given, receives the JSON files found in directories that no collector reads.
        scanned: If given, receives the files found by scanning a directory (not named by the user).

    Raises:
        UsageError: A path does not exist or holds no trace file.
    """
    groups: dict[Path, list[Path]] = {}
    for raw in paths:
        p = Path(raw)
        if not p.exists():
            raise UsageError(f"{p}: no such file or directory")
        if p.is_file():
            if _claim(p) is None:
                raise UsageError(f"{p}: not a trace file traceprof reads; it reads: {sources.formats()}")
            files = [p]
        else:
            found = sorted(f for f in p.rglob("*") if f.is_file())
            files = [f for f in found if _claim(f)]
            if scanned is not None:
                scanned.update(f.resolve() for f in files)
            if unclaimed is not None:
                unclaimed += [str(f) for f in found if not _claim(f) and f.name.endswith(".json")
                              and not f.name.endswith(".meta.json")]
        if not files:
            raise UsageError(f"{p}: no trace files found; traceprof reads: {sources.formats()}")
        for f in files:
            f = f.resolve()
            # A whole-run file (NDTimeline) is its own group, keyed by the file itself.
            c = _claim(f)
            groups.setdefault(f if c is not None and c.whole_run else f.parent, []).append(f)
    return groups


def _claim(path: Path) -> sources.Collector | None:
    """The collector that reads ``path`` (``traceprof.sources``), or None."""
    return sources.claim(path)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _parse_one(args: tuple[Path, str, bool]) -> list[ParsedTrace] | NotATraceError:
    """Parse one file; a file found by a directory scan that is not a trace comes back as the
    error (skipped with a warning) instead of raising."""
    path, on_bad_event, scanned = args
    try:
        return _parse_source(path, on_bad_event)
    except NotATraceError as e:
        if scanned:
            return e
        raise


def _parse_source(path: Path, on_bad_event: str) -> list[ParsedTrace]:
    collector = _claim(path)
    if collector is None:
        raise UsageError(f"{path}: not a trace file traceprof reads; it reads: {sources.formats()}")
    return collector.parse(path, on_bad_event)


def ingest(
    store: Store,
    paths: Iterable[str | Path],
    *,
    run: str | None = None,
    on_bad_event: str = "raise",
    jobs: int | None = None,
    progress: Progress | None = None,
    align: bool = True,
) -> IngestResult:
    """Ingest trace files or directories into ``store``.

    Each directory of rank files is one run named after the directory (a whole-run file such as an
    NDTimeline Parquet trace: named after the file), unless ``run`` names one run for everything.
    Files already stored (same SHA-256) are skipped. Collectives of every run that gained traces
    are matched and, unless ``align`` is false, clocks are aligned (both over the whole run).

    Args:
        store: An open, writable store.
        paths: Files and directories (searched recursively).
        run: Run name for all files; default: each file's directory name.
        on_bad_event: ``raise`` or ``skip`` malformed events (see ``collectors.kineto.parse``).
        jobs: Parallel parser processes (default: CPU count, at most one per file).
        progress: Called as ``progress(done, total, path)`` after each parsed file.
        align: Estimate and apply per-rank clock offsets (``traceprof.clock``); false stores the
            source timestamps unchanged.

    Raises:
        TraceFormatError: A file cannot be parsed (nothing is written).
        UsageError: Bad paths, or ranks missing from a multi-file run.
        StoreError: Rank conflicts with what the run already holds (nothing is written).
    """
    result = IngestResult()
    unclaimed: list[str] = []
    scanned: set[Path] = set()
    groups = discover(paths, unclaimed, scanned)
    if unclaimed:
        result.warnings.append(f"{len(unclaimed)} JSON file(s) not read (no collector claims them), e.g. {unclaimed[0]}")
    todo: list[tuple[str, Path]] = []
    for group, files in groups.items():
        name = run or (group.stem if group.is_file() else group.name)
        new: list[Path] = []
        elsewhere: dict[Path, str] = {}
        for f in files:
            found = store.find_sha(_sha256(f))
            if found is None:
                new.append(f)
            else:
                result.skipped[str(f)] = found[1]
                if found[0] != name:
                    elsewhere[f] = found[1]
        if new and elsewhere:  # the new run would silently lack the ranks stored elsewhere
            f, where = next(iter(elsewhere.items()))
            raise UsageError(
                f"{f}: already stored in {where}, so run {name!r} would miss that rank; a file belongs "
                "to one run: ingest the files under that run's name, or into another store (--db)"
            )
        todo += [(name, f) for f in new]
    parsed = _parse_all([(f, on_bad_event, f in scanned) for _, f in todo], jobs, progress)
    by_run: dict[str, list[ParsedTrace]] = {}
    for (name, _), pts in zip(todo, parsed, strict=True):
        if isinstance(pts, NotATraceError):
            result.warnings.append(f"skipped {pts}")
            continue
        by_run.setdefault(name, []).extend(pts)
    for name, traces in by_run.items():
        _settle_ranks(name, traces, result)
    for name, traces in by_run.items():
        notes: list[str] = []

        def settle(run_id: int, notes: list[str] = notes) -> None:
            notes.extend(_settle_run(store, run_id, align))

        result.runs[name] = store.insert_run(name, traces, after=settle)
        result.added += sorted({pt.path for pt in traces})
        result.warnings += [f"run {name!r}: {n}" for n in notes]
    return result


def _settle_run(store: Store, run_id: int, align: bool) -> list[str]:
    """Match the run's collectives and align its clocks (inside the insert transaction).

    Returns:
        Messages worth a warning (instances missing ranks, matching fallbacks).
    """
    notes = [n for c in sources.collectors() if c.settle is not None for n in c.settle(store, run_id)]
    summary = matching.match_run(store, run_id)
    notes += summary.notes  # e.g. sequence numbers that cannot be per group: matched by order instead
    clock.align_run(store, run_id, enabled=align)
    if summary.incomplete:
        notes.append(f"{summary.incomplete} of {summary.instances} matched collectives miss some ranks "
                     "(see collective_instances.ranks_missing)")
    return notes


def _parse_all(
    tasks: list[tuple[Path, str, bool]], jobs: int | None, progress: Progress | None
) -> list[list[ParsedTrace] | NotATraceError]:
    n = len(tasks)
    workers = min(jobs or os.cpu_count() or 1, n)
    out: list[list[ParsedTrace] | NotATraceError] = []
    if workers <= 1:
        for i, task in enumerate(tasks):
            out.append(_parse_one(task))
            if progress:
                progress(i + 1, n, str(task[0]))
        return out
    with ProcessPoolExecutor(max_workers=workers) as pool:
        for i, (task, pts) in enumerate(zip(tasks, pool.map(_parse_one, tasks), strict=True)):
            out.append(pts)
            if progress:
                progress(i + 1, n, str(task[0]))
    return out


def _settle_ranks(name: str, traces: list[ParsedTrace], result: IngestResult) -> None:
    """Check ranks within one run: a lone file without a rank is rank 0 (with a warning)."""
    for pt in traces:
        result.warnings += pt.warnings
        if pt.rejected:
            why = ", ".join(f"{n} {reason}" for reason, n in pt.rejected.items())
            result.warnings.append(f"{Path(pt.path).name}: {sum(pt.rejected.values())} record(s) not stored: {why}")
    missing = [pt for pt in traces if pt.rank is None]
    if missing and len(traces) == 1:
        missing[0].rank = 0
        result.warnings.append(f"{Path(missing[0].path).name}: rank unknown, stored as rank 0 of run {name!r}")
    elif missing:
        raise TraceFormatError(
            missing[0].path, "distributedInfo",
            f"no rank in the trace and {len(traces)} files in run {name!r}; add a "
            "<name>.meta.json sidecar with \"rank\", or ingest the file alone with --run",
        )
    seen: dict[tuple[int, str], str] = {}
    for pt in traces:
        assert pt.rank is not None
        if (pt.rank, pt.source) in seen:
            raise TraceFormatError(
                pt.path, "distributedInfo.rank",
                f"rank {pt.rank} also in {seen[(pt.rank, pt.source)]} (same run {name!r}); put each run's "
                "files in their own directory or use --run",
            )
        seen[(pt.rank, pt.source)] = pt.path
    worlds = {pt.world_size: pt.path for pt in traces if pt.world_size is not None}
    ranks = len({pt.rank for pt in traces})
    if len(worlds) > 1:
        (w1, p1), (w2, p2) = sorted(worlds.items())[:2]
        raise TraceFormatError(
            p2, "distributedInfo.world_size",
            f"world size {w2}, but {p1} in the same run {name!r} says {w1}: traces of different jobs "
            "cannot be one run; ingest them as separate runs (one directory each, or --run)",
        )
    if worlds and ranks < max(worlds):
        result.warnings.append(f"run {name!r}: {ranks} of {max(worlds)} ranks traced")
