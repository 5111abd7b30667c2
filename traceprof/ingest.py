"""Ingest orchestration: find trace files, parse them in parallel, group them into runs, store.

Every file is parsed before anything is written, and each run is inserted in one transaction, so
a bad file leaves the store exactly as it was.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from collectors import kineto
from traceprof.errors import TraceFormatError, UsageError
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
        skipped: Paths skipped because a file with the same SHA-256 is already stored.
        warnings: Messages for the user (missing ranks, partial world, ...).
    """

    runs: dict[str, int] = field(default_factory=dict)
    added: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def discover(paths: Iterable[str | Path], unclaimed: list[str] | None = None) -> dict[Path, list[Path]]:
    """Trace files under ``paths``, grouped by the directory that holds them (one run each).

    Args:
        paths: Files and directories (searched recursively).
        unclaimed: If given, receives the JSON files found in directories that no collector reads.

    Raises:
        UsageError: A path does not exist or holds no trace file.
    """
    groups: dict[Path, list[Path]] = {}
    for raw in paths:
        p = Path(raw)
        if not p.exists():
            raise UsageError(f"{p}: no such file or directory")
        if p.is_file():
            files = [p]
        else:
            found = sorted(f for f in p.rglob("*") if f.is_file())
            files = [f for f in found if kineto.is_trace_file(f)]
            if unclaimed is not None:
                unclaimed += [str(f) for f in found if f.name.endswith(".fr.json")]
        if not files:
            raise UsageError(f"{p}: no trace files (*.json, *.json.gz) found")
        for f in files:
            groups.setdefault(f.resolve().parent, []).append(f.resolve())
    return groups


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _parse_one(args: tuple[Path, str]) -> ParsedTrace:
    path, on_bad_event = args
    return kineto.parse(path, on_bad_event=on_bad_event)


def ingest(
    store: Store,
    paths: Iterable[str | Path],
    *,
    run: str | None = None,
    on_bad_event: str = "raise",
    jobs: int | None = None,
    progress: Progress | None = None,
) -> IngestResult:
    """Ingest trace files or directories into ``store``.

    Each directory of rank files is one run named after the directory, unless ``run`` names one run
    for everything. Files already stored (same SHA-256) are skipped.

    Args:
        store: An open, writable store.
        paths: Files and directories (searched recursively).
        run: Run name for all files; default: each file's directory name.
        on_bad_event: ``raise`` or ``skip`` malformed events (see ``collectors.kineto.parse``).
        jobs: Parallel parser processes (default: CPU count, at most one per file).
        progress: Called as ``progress(done, total, path)`` after each parsed file.

    Raises:
        TraceFormatError: A file cannot be parsed (nothing is written).
        UsageError: Bad paths, or ranks missing from a multi-file run.
        StoreError: Rank conflicts with what the run already holds (nothing is written).
    """
    result = IngestResult()
    unclaimed: list[str] = []
    groups = discover(paths, unclaimed)
    if unclaimed:
        result.warnings.append(
            f"{len(unclaimed)} Flight Recorder dump(s) not read (no collector yet), e.g. {unclaimed[0]}"
        )
    todo: list[tuple[str, Path]] = []
    for directory, files in groups.items():
        name = run or directory.name
        for f in files:
            if store.has_sha(_sha256(f)):
                result.skipped.append(str(f))
            else:
                todo.append((name, f))
    parsed = _parse_all([f for _, f in todo], on_bad_event, jobs, progress)
    by_run: dict[str, list[ParsedTrace]] = {}
    for (name, _), pt in zip(todo, parsed, strict=True):
        by_run.setdefault(name, []).append(pt)
    for name, traces in by_run.items():
        _settle_ranks(name, traces, result)
    for name, traces in by_run.items():
        result.runs[name] = store.insert_run(name, traces)
        result.added += [pt.path for pt in traces]
    return result


def _parse_all(
    files: list[Path], on_bad_event: str, jobs: int | None, progress: Progress | None
) -> list[ParsedTrace]:
    n = len(files)
    workers = min(jobs or os.cpu_count() or 1, n)
    out: list[ParsedTrace] = []
    if workers <= 1:
        for i, f in enumerate(files):
            out.append(_parse_one((f, on_bad_event)))
            if progress:
                progress(i + 1, n, str(f))
        return out
    with ProcessPoolExecutor(max_workers=workers) as pool:
        for i, pt in enumerate(pool.map(_parse_one, [(f, on_bad_event) for f in files])):
            out.append(pt)
            if progress:
                progress(i + 1, n, pt.path)
    return out


def _settle_ranks(name: str, traces: list[ParsedTrace], result: IngestResult) -> None:
    """Check ranks within one run: a lone file without a rank is rank 0 (with a warning)."""
    for pt in traces:
        result.warnings += pt.warnings
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
    seen: dict[int, str] = {}
    for pt in traces:
        assert pt.rank is not None
        if pt.rank in seen:
            raise TraceFormatError(
                pt.path, "distributedInfo.rank",
                f"rank {pt.rank} also in {seen[pt.rank]} (same run {name!r}); put each run's files "
                "in their own directory or use --run",
            )
        seen[pt.rank] = pt.path
    worlds = {pt.world_size for pt in traces if pt.world_size is not None}
    if len(worlds) > 1:
        result.warnings.append(f"run {name!r}: traces disagree on world size: {sorted(worlds)}")
    elif worlds and len(traces) < max(worlds):
        result.warnings.append(f"run {name!r}: {len(traces)} of {max(worlds)} ranks traced")
