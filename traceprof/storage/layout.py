"""The store's Parquet layout: the per-event table as Parquet files beside the DuckDB file.

A store has one of two layouts, chosen when it is created and recorded in ``meta`` (key ``layout``);
every later ingest into it uses the same one:

- ``duckdb`` (the default): every table lives in the one DuckDB file.
- ``parquet``: the tables of :data:`traceprof.core.schema.PARQUET_TABLES` (``events``, the one that grows
  with the trace) are a hive-partitioned Parquet dataset beside the store, one file per trace:
  ``<store>.parquet/events/run_id=R/rank=K/trace_id=T/part-0.parquet``. The DuckDB file keeps the
  small tables (runs, traces, steps, collectives, ...) and a view ``events`` over the files, so every
  analysis, ``sql``, report and export reads them in place, unchanged. ``ingest --layout parquet``
  chooses it, and so does a new store whose input is above :data:`AUTO_PARQUET_BYTES`
  (uncompressed, estimated: see :func:`estimate_bytes`), and ``--executor dask``.

How the guarantees of the store hold with files outside it:

1. *One transaction per ingest.* Parsers write each trace's rows to ``<store>.parquet/_staging/<id>/``.
   The DuckDB transaction adds one ``parts`` row per file; just before its commit the files are
   renamed into place, and deleted again when the commit fails. The view reads only files named in
   ``parts``, so a file left by a crash is never read; the next writable open deletes it.
2. *Clock alignment* never rewrites a file: it adds to ``parts.ts_shift_ns``, which the view adds to
   ``ts_ns`` (:meth:`traceprof.storage.store.Store.shift_events`).
3. *Read-only SQL* keeps DuckDB's external access disabled except for exactly the files that
   ``parts`` names (DuckDB ``allowed_paths``); ``traceprof sql`` runs queries only
   (:mod:`traceprof.storage.sandbox`), so it reads no other file and writes none.
4. ``runs rm`` deletes the run's ``parts`` rows with its other rows, then its folders.

Partition values come from the folder names, so a parquet store's path must not hold ``=``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import glob
import json
import os
import re
import shutil
import tempfile
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import duckdb

from traceprof.core import schema, spill, term
from traceprof.core.errors import StoreError, UsageError
from traceprof.core.lazy import lazy
from traceprof.core.locking import beside, check_store_path
from traceprof.core.parsed import ParsedTrace
from traceprof.core.text import COUNTED, first_few

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa
else:
    np = lazy("numpy")
    pa = lazy("pyarrow")

__all__ = [
    "LAYOUTS",
    "AUTO_PARQUET_BYTES",
    "GZ_INFLATE_ESTIMATE",
    "StagedTrace",
    "SpooledTrace",
    "Dataset",
    "dataset_dir",
    "estimate_bytes",
    "choose",
    "stage",
    "spool",
    "spool_dir",
    "sweep_spools",
    "write_part",
    "interrupted",
    "error_line",
]

#: The store layouts (module doc).
LAYOUTS = ("duckdb", "parquet")
#: DuckDB's memory limit while a parser process writes a trace's Parquet file (MB).
_STAGE_MEMORY_LIMIT_MB = 256
#: A new store takes the Parquet layout when its first ingest reads more than this (2 GiB), uncompressed.
AUTO_PARQUET_BYTES = 2 << 30
#: Assumed inflation of a ``.gz`` trace (JSON traces compress 8-12x) for :func:`estimate_bytes`.
GZ_INFLATE_ESTIMATE = 8
#: Partition columns, from the folder names, with their types.
_HIVE = "{'run_id': INTEGER, 'rank': INTEGER, 'trace_id': INTEGER}"
_STAGING = "_staging"
#: Rows per record batch of a spool file: the store inserts (and holds) one batch at a time.
SPOOL_BATCH_ROWS = 1 << 16
_SPOOL = ".spool-"  # spool folders: .<store name>.spool-<random> beside the store


def dataset_dir(db: str | Path) -> Path:
    """The Parquet dataset folder of store file ``db``: ``<db>.parquet`` beside it (absolute; beside
    the file a symlinked ``db`` points to)."""
    return beside(db, ".parquet")


def estimate_bytes(paths: Iterable[Path]) -> int:
    """Estimated uncompressed size of trace files in bytes: a ``.gz`` file counts
    :data:`GZ_INFLATE_ESTIMATE` times its size, any other file its size; folders are searched."""
    total = 0
    for p in paths:
        files = [f for f in p.rglob("*") if f.is_file()] if p.is_dir() else [p] if p.is_file() else []
        for f in files:
            total += f.stat().st_size * (GZ_INFLATE_ESTIMATE if f.name.endswith(".gz") else 1)
    return total


def choose(db: str | Path, paths: Iterable[Path], requested: str | None) -> str | None:
    """The layout to ask for when opening store ``db`` for an ingest of ``paths``.

    Returns:
        ``requested`` when given; None for an existing store (it keeps its layout); for a new store
        ``parquet`` when :func:`estimate_bytes` of ``paths`` exceeds :data:`AUTO_PARQUET_BYTES`,
        else ``duckdb``.

    Raises:
        UsageError: ``requested`` is not one of :data:`LAYOUTS`.
    """
    if requested is not None:
        if requested not in LAYOUTS:
            raise UsageError(f"--layout {requested!r}: expected one of {', '.join(LAYOUTS)}")
        return requested
    check_store_path(db)
    if Path(db).exists():
        return None
    return "parquet" if estimate_bytes(Path(p) for p in paths) > AUTO_PARQUET_BYTES else "duckdb"


def _columns(table: str) -> list[schema.Column]:
    """Columns a Parquet file of ``table`` holds: all but the partition columns."""
    return [c for c in schema.table(table).columns if c.name not in ("run_id", "rank", "trace_id")]


def interrupted(e: BaseException) -> bool:
    """Whether a DuckDB error means Ctrl-C interrupted the query (raise KeyboardInterrupt then):
    DuckDB's own interrupt, or a KeyboardInterrupt raised in Python code DuckDB was reading from
    (an Arrow stream of batches), which DuckDB reports inside its error: ``...failed: KeyboardInterrupt: ``
    (reading the stream's schema) or Python's traceback ending in a ``KeyboardInterrupt`` line (a batch)."""
    return (
        isinstance(e, duckdb.InterruptException)
        or (isinstance(e, RuntimeError) and "interrupted" in str(e).lower())
        or (isinstance(e, duckdb.Error) and _PY_INTERRUPT.search(str(e)) is not None)
    )


#: Python's KeyboardInterrupt as DuckDB quotes it in an error (after ": " or alone on a line).
_PY_INTERRUPT = re.compile(r"(?:: |\n)KeyboardInterrupt(?::|\n|$)")


def error_line(e: BaseException) -> str:
    """DuckDB's message, for one line: its first line, with the JSON some IO errors carry
    (``{"exception_type":"IO","exception_message":...,"errno":"28"}``) replaced by its message,
    and a full disk said plainly."""
    text = str(e).strip()
    if f'"errno":"{errno.ENOSPC}"' in text or "No space left on device" in text:
        return "no space left on the device"
    m = _IO_JSON.search(text)
    if m:
        try:
            text = text[: m.start()] + str(json.loads(m.group(0)).get("exception_message", ""))
        except ValueError:
            pass
    return text.splitlines()[0] if text else type(e).__name__


_IO_JSON = re.compile(r'\{"exception_type".*\}', re.S)


def write_part(tbl: pa.Table, path: Path, table: str = "events") -> int:
    """Write rows of store table ``table`` (a ParsedTrace row table) as one Parquet file.

    Columns are cast to the store's types (a column the table lacks is NULL), in schema order, so
    every file of the dataset has the same schema; ``run_id``, ``rank`` and ``trace_id`` are not
    written (they are the partition folders).

    Args:
        tbl: Arrow rows, columns named as in the store table.
        path: The file to write (its folder is created).
        table: The store table.

    Returns:
        The number of rows written.

    Raises:
        StoreError: DuckDB cannot cast or write the rows (the message names ``path``).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    select = ", ".join(
        f'CAST("{c.name}" AS {schema.sql_type(c)}) AS "{c.name}"'
        if c.name in tbl.column_names
        else f'NULL::{schema.sql_type(c)} AS "{c.name}"'
        for c in _columns(table)
    )
    con = duckdb.connect()
    try:
        con.execute("SET enable_progress_bar = false")
        # as a DuckDB-layout ingest (store.INGEST_MEMORY_LIMIT_MB): past it DuckDB writes the row
        # groups out sooner instead of holding them (its default is 80% of RAM, in every parser process)
        con.execute(f"SET memory_limit = '{_STAGE_MEMORY_LIMIT_MB}MB'")
        con.register("_incoming", spill.readable(tbl))
        con.execute(
            f"COPY (SELECT {select} FROM _incoming) TO {schema.sql_text(str(path))} (FORMAT parquet, COMPRESSION zstd)"
        )
    except duckdb.Error as e:
        if interrupted(e):  # Ctrl-C while DuckDB read the rows (a stream of spilled batches)
            raise KeyboardInterrupt from None
        raise StoreError(f"{path}: cannot write {table} rows as Parquet: {error_line(e)}") from None
    finally:
        con.close()
    return tbl.num_rows


@dataclass
class _ParkedTrace(ParsedTrace):
    """A :class:`~traceprof.core.parsed.ParsedTrace` whose events were written to a file by a parser
    process (:class:`StagedTrace`: Parquet, :class:`SpooledTrace`: Arrow IPC), so that they need
    not travel back to the ingest process.

    ``events`` holds two stand-in rows, the first start and the last end (``ts_ns``, ``dur_ns`` 0),
    for ``traceprof.storage.identity``'s time checks; the rows themselves are in ``events_file``.

    Attributes:
        events_file: Absolute path of the file ("" when the trace has no events).
        events_rows: Rows in it.
    """

    events_file: str = ""
    events_rows: int = 0

    @property
    def events_kept(self) -> int:
        return self.events_rows


@dataclass
class StagedTrace(_ParkedTrace):
    """A trace whose events are already written to a Parquet file of the store's staging folder
    (by :func:`stage`, in a parser process or on a Dask worker); the store moves it into place."""


def _span(ev: pa.Table) -> pa.Table:
    """Two stand-in rows for ``traceprof.storage.identity``'s time checks: the first start and the last end
    of ``ev`` (``ts_ns``; ``dur_ns`` 0); no rows when ``ev`` has no times."""
    span = pa.table({"ts_ns": pa.array([], pa.int64()), "dur_ns": pa.array([], pa.int64())})
    if "ts_ns" in ev.column_names:
        import pyarrow.compute as pc

        dur = pc.fill_null(ev["dur_ns"], 0) if "dur_ns" in ev.column_names else pa.scalar(0, pa.int64())
        lo, hi = pc.min(ev["ts_ns"]).as_py(), pc.max(pc.add(ev["ts_ns"], dur)).as_py()
        if lo is not None:
            span = pa.table({"ts_ns": pa.array([lo, hi], pa.int64()), "dur_ns": pa.array([0, 0], pa.int64())})
    return span


def stage(pt: ParsedTrace, folder: Path) -> StagedTrace:
    """Write ``pt.events`` to a new file in ``folder`` and return the trace without its rows.

    Raises:
        StoreError: The rows cannot be written (:func:`write_part`).
    """
    ev = pt.events
    if ev is None or ev.num_rows == 0:
        return StagedTrace(**_fields(pt))
    path = folder / f"{uuid.uuid4().hex}.parquet"
    return _parked(StagedTrace, pt, ev, path, write_part(ev, path))


P = TypeVar("P", bound=_ParkedTrace)


def _fields(pt: ParsedTrace) -> dict[str, Any]:
    """``pt``'s :class:`~traceprof.core.parsed.ParsedTrace` fields, by name."""
    return {f.name: getattr(pt, f.name) for f in dataclasses.fields(ParsedTrace)}


def _parked(cls: type[P], pt: ParsedTrace, ev: pa.Table, path: Path, rows: int) -> P:
    """``pt`` as a ``cls`` whose ``rows`` events (``ev``) are in ``path``: its events replaced by their span."""
    return cls(**{**_fields(pt), "events": _span(ev)}, events_file=str(path), events_rows=rows)


@dataclass
class SpooledTrace(_ParkedTrace):
    """A trace whose events wait in an Arrow IPC file (written by :func:`spool` in a parser
    process) until the store inserts them, so that a multi-file ingest into the DuckDB layout holds
    one trace's rows at a time, not every rank's. :meth:`read_events` gives the rows (the same
    table, column types included).
    """

    def events_schema(self) -> pa.Schema:
        """The Arrow schema of the spooled events (read from the file's footer).

        Raises:
            StoreError: The file is gone or damaged.
        """
        try:
            with pa.OSFile(self.events_file, "rb") as f:
                return pa.ipc.open_file(f).schema
        except (OSError, pa.ArrowInvalid) as e:
            raise self._unreadable(e) from None

    #: Positions (ascending) of spooled events left out (:meth:`drop_events`).
    dropped: list[int] = field(default_factory=list)

    def drop_events(self, rows: list[int]) -> None:
        """Leave the events at positions ``rows`` (ascending) out of :meth:`read_events`."""
        if not rows:
            return
        self.dropped = sorted({*self.dropped, *rows})
        self.events_rows -= len(rows)

    def read_events(self) -> pa.RecordBatchReader:
        """The events as a stream of record batches of at most :data:`SPOOL_BATCH_ROWS` rows each
        (the same columns and types as the parsed table), read from the file as they are consumed,
        so that inserting them holds one batch at a time (a memory-mapped table kept every page it
        touched resident until the commit: 1.6 GB for 8 x 1 M events), less the rows dropped.

        Raises:
            StoreError: The file is gone or damaged (when called, or while the batches are read).
        """
        try:
            f = pa.OSFile(self.events_file, "rb")
            r = pa.ipc.open_file(f)
        except (OSError, pa.ArrowInvalid) as e:
            raise self._unreadable(e) from None
        dropped = np.asarray(self.dropped, np.int64)

        def batches() -> Iterator[pa.RecordBatch]:
            start = 0
            with f:
                for i in range(r.num_record_batches):
                    try:
                        b = r.get_batch(i)
                    except (OSError, pa.ArrowInvalid) as e:
                        raise self._unreadable(e) from None
                    here = dropped[(dropped >= start) & (dropped < start + b.num_rows)] - start
                    start += b.num_rows
                    if here.size:
                        keep = np.ones(b.num_rows, bool)
                        keep[here] = False
                        b = b.filter(pa.array(keep))
                    yield b

        return pa.RecordBatchReader.from_batches(r.schema, batches())

    def _unreadable(self, e: Exception) -> StoreError:
        """The error for a spool file that is gone or damaged (``e``: why)."""
        return StoreError(f"{self.events_file}: cannot read the events spooled for {self.path}: {e}")


#: Characters a Parquet-layout store's dataset path cannot hold (:class:`Dataset`).
_PATH_SPECIAL = ("=", "*", "?", "[")


def spool_dir(db: str | Path) -> Path:
    """Create a new spool folder for one ingest into store file ``db``: ``.<db name>.spool-<random>``
    beside it (absolute), for :func:`spool`. The ingest deletes it when done; one a killed ingest
    left is deleted by :func:`sweep_spools` at the next writable open.

    Raises:
        OSError: The folder cannot be created (e.g. the store's folder is not writable).
    """
    p = Path(db).resolve()
    return Path(tempfile.mkdtemp(prefix=f".{p.name}{_SPOOL}", dir=p.parent))


def sweep_spools(db: str | Path) -> list[Path]:
    """Delete the spool folders of store file ``db`` (:func:`spool_dir`). Call only under the
    store's exclusive lock (a writable open): no ingest into it runs then, so every one is stale.

    Returns:
        The folders deleted.
    """
    p = Path(db).resolve()
    stale = [d for d in p.parent.glob(f".{glob.escape(p.name)}{_SPOOL}*") if d.is_dir()]
    for d in stale:
        shutil.rmtree(d, ignore_errors=True)
    return stale


def spool(pt: ParsedTrace, folder: Path) -> ParsedTrace:
    """Write ``pt.events`` to a new Arrow IPC file in ``folder``; the trace without its rows
    (:class:`SpooledTrace`), or ``pt`` itself when it has no events.

    Raises:
        StoreError: The file cannot be written.
    """
    ev = pt.events
    if ev is None or ev.num_rows == 0:
        return pt
    path = folder / f"{uuid.uuid4().hex}.arrow"
    try:
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, ev.schema) as w:
            for b in spill.batches(ev, SPOOL_BATCH_ROWS):
                w.write_batch(b)
    except (OSError, pa.ArrowInvalid) as e:
        raise StoreError(f"{path}: cannot spool the events of {pt.path}: {e}") from None
    return _parked(SpooledTrace, pt, ev, path, ev.num_rows)


class Dataset:
    """The Parquet files of one open store in the Parquet layout (module doc).

    Args:
        con: The store's connection.
        db: The store file.

    Raises:
        StoreError: The dataset path holds ``=`` (it would read as a partition column) or a glob
            character (``*``, ``?``, ``[``: DuckDB would read every store the pattern matches).
    """

    def __init__(self, con: duckdb.DuckDBPyConnection, db: Path) -> None:
        self.con = con
        self.root = dataset_dir(db)
        odd = [c for c in _PATH_SPECIAL if c in str(self.root)]
        if odd:  # read_parquet globs each path it is given, even a listed file's: no escape exists
            raise StoreError(
                f"{self.root}: a Parquet-layout store needs a path without {', '.join(map(repr, odd))} "
                "(DuckDB reads key=value folders as partition columns and '*', '?', '[' as a glob "
                "pattern, which would read another store's files); move the store"
            )
        self._staging: Path | None = None
        #: Files of the open transaction: path relative to the root -> where it is staged.
        self.pending: dict[str, Path] = {}

    # -- reading -----------------------------------------------------------------------------------

    def _named(self, table: str) -> list[tuple[int, str, Path]]:
        """(run_id, path relative to the dataset, absolute path) of ``table``'s files named in
        ``parts`` (staged ones where they lie)."""
        rows = self.con.execute(
            "SELECT run_id, path FROM parts WHERE table_name = ? ORDER BY trace_id", [table]
        ).fetchall()
        return [(int(run_id), rel, self.pending.get(rel, self.root / rel)) for run_id, rel in rows]

    def files(self, table: str = "events") -> list[Path]:
        """Absolute paths of ``table``'s files named in ``parts`` (staged ones where they lie)."""
        return [path for _, _, path in self._named(table)]

    def refresh(self) -> None:
        """(Re)create the temporary views ``_<table>_files`` over the intact files named in ``parts``.

        A file that is missing or not Parquet (deleted or damaged by hand: no ``PAR1`` magic at
        both ends) is left out of the view and listed in :attr:`broken` by run_id, so that the
        other runs stay readable and ``runs rm`` can remove the damaged one;
        :meth:`check_run` refuses a run with such a file (never a silently partial result).
        """
        #: run_id -> the run's files (relative to the dataset) that are missing or damaged.
        self.broken: dict[int, list[str]] = {}
        for table in schema.PARQUET_TABLES:
            paths = []
            for run_id, rel, path in self._named(table):
                if _intact(path):
                    paths.append(path)
                else:
                    self.broken.setdefault(run_id, []).append(rel)
            if paths:
                listed = schema.sql_texts(str(p) for p in paths)
                body = (
                    f"SELECT * FROM read_parquet([{listed}], hive_partitioning = true, hive_types = {_HIVE})"
                )
            else:  # read_parquet refuses an empty list: the same columns, no rows
                cols = ", ".join(
                    f'NULL::{schema.sql_type(c)} AS "{c.name}"' for c in schema.table(table).columns
                )
                body = f"SELECT {cols} LIMIT 0"
            try:
                self.con.execute(f"CREATE OR REPLACE TEMP VIEW _{table}_files AS {body}")
            except duckdb.Error as e:  # damaged past the magic bytes
                raise StoreError(
                    f"{self.root}: cannot read the store's Parquet files: {str(e).splitlines()[0]}; "
                    "restore them, or remove the affected run (`traceprof runs rm`) and ingest "
                    "it again"
                ) from None

    def check_run(self, run_id: int, name: str) -> None:
        """Refuse run ``run_id`` when one of its files is missing or damaged (see :meth:`refresh`).

        Raises:
            StoreError: Naming the run, the first files and the two ways out.
        """
        bad = self.broken.get(run_id)
        if bad:
            shown = first_few(bad, more=COUNTED, shown=lambda b: str(self.root / b))
            raise StoreError(
                f"run {name!r}: {len(bad)} of its Parquet file(s) are missing or damaged ({shown}); "
                f"restore them, or remove the run (`{term.command('traceprof', 'runs', 'rm', name)}`) and ingest it again"
            )

    def allow_reads(self) -> None:
        """Allow the read-only connection to read exactly the dataset's files; call before disabling
        external access (DuckDB refuses to change ``allowed_paths`` after).

        A second read-only open of the store in this process (e.g. two Dask tasks of one worker,
        ``traceprof.engine.rankwise``) shares the first one's DuckDB database, whose access is already
        restricted to these files: nothing to do then."""
        ((external,),) = self.con.execute("SELECT current_setting('enable_external_access')").fetchall()
        if not external:
            return
        paths = [str(p) for t in schema.PARQUET_TABLES for p in self.files(t)]
        if paths:
            self.con.execute("SET allowed_paths = ?", [paths])

    # -- writing (inside the store's transaction) ---------------------------------------------------

    def staging(self) -> Path:
        """This store's staging folder, ``<dataset>/_staging/<random>/`` (created on first use)."""
        if self._staging is None:
            self._staging = self.root / _STAGING / uuid.uuid4().hex
            self._staging.mkdir(parents=True, exist_ok=True)
        return self._staging

    def add(self, pt: ParsedTrace, run_id: int, rank: int, trace_id: int) -> tuple[str, int, int] | None:
        """Stage the events of one trace under its final name (within the staging folder).

        Returns:
            (path relative to the dataset, rows, bytes), or None when the trace has no events.

        Raises:
            StoreError: The rows cannot be written.
        """
        rel = f"events/run_id={run_id}/rank={rank}/trace_id={trace_id}/part-0.parquet"
        dest = self.staging() / "tree" / rel
        if isinstance(pt, StagedTrace):
            if not pt.events_file:
                return None
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(pt.events_file, dest)
            rows = pt.events_rows
        elif isinstance(pt, SpooledTrace):
            rows = write_part(pt.read_events(), dest)
        elif pt.events is None or pt.events.num_rows == 0:
            return None
        else:
            rows = write_part(pt.events, dest)
        self.pending[rel] = dest
        return rel, rows, dest.stat().st_size

    def publish(self) -> list[Path]:
        """Move the staged files of the transaction into place and point the views at them (call
        right before the commit; :meth:`unpublish` undoes it when the commit fails).

        Returns:
            The files moved.
        """
        moved: list[Path] = []
        try:
            for rel, src in self.pending.items():
                dest = self.root / rel
                dest.parent.mkdir(parents=True, exist_ok=True)
                os.replace(src, dest)
                moved.append(dest)
        except OSError as e:
            self.unpublish(moved)
            raise StoreError(f"{self.root}: cannot move Parquet files into place: {e}") from None
        self.pending.clear()
        self.refresh()
        return moved

    def unpublish(self, moved: list[Path]) -> None:
        """Delete files :meth:`publish` moved (their commit failed)."""
        for p in moved:
            p.unlink(missing_ok=True)

    def discard(self) -> None:
        """Forget the transaction's staged files (after a rollback) and delete the staging folder."""
        self.pending.clear()
        if self._staging is not None:
            shutil.rmtree(self._staging, ignore_errors=True)
            with contextlib.suppress(OSError):
                self._staging.parent.rmdir()  # when no other ingest stages there
            self._staging = None

    def sweep(self) -> None:
        """Delete what no committed ``parts`` row names: staging folders and files left by a crash.
        Only under the store's exclusive lock (a writable open)."""
        shutil.rmtree(self.root / _STAGING, ignore_errors=True)
        known = {str(self.root / r[0]) for r in self.con.execute("SELECT path FROM parts").fetchall()}
        for table in schema.PARQUET_TABLES:
            top = self.root / table
            if not top.is_dir():
                continue
            for f in top.rglob("*"):
                if f.is_file() and str(f) not in known:
                    f.unlink(missing_ok=True)
            _prune(top)

    def remove_run(self, run_id: int) -> None:
        """Delete run ``run_id``'s folders (its ``parts`` rows are already deleted and committed)."""
        self.refresh()
        for table in schema.PARQUET_TABLES:
            shutil.rmtree(self.root / table / f"run_id={run_id}", ignore_errors=True)


def _intact(path: Path) -> bool:
    """Whether ``path`` exists and starts and ends with Parquet's ``PAR1`` magic (two reads)."""
    try:
        with open(path, "rb") as f:
            if f.read(4) != b"PAR1":
                return False
            f.seek(-4, os.SEEK_END)
            return f.read(4) == b"PAR1"
    except OSError:
        return False


def _prune(top: Path) -> None:
    """Remove empty folders under ``top`` (deepest first)."""
    for d in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(OSError):
            d.rmdir()
