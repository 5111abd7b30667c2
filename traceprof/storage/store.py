"""The DuckDB store: open, version-check, insert parsed traces in one transaction, query.

One DuckDB file (default ``traceprof.duckdb`` in the working directory) holds any number of runs.
Tables and views are declared in :mod:`traceprof.core.schema`. In the Parquet layout the ``events`` rows
live in Parquet files beside the file, behind a view of the same name (:mod:`traceprof.storage.layout`).
"""

from __future__ import annotations

import contextlib
import copy
import os
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import duckdb
import orjson

from traceprof.core import cancel, schema, spill
from traceprof.core.errors import SchemaVersionError, StoreError
from traceprof.core.lazy import lazy
from traceprof.core.limits import INT32, fits, shown
from traceprof.core.locking import StoreLock, check_store_path
from traceprof.core.parsed import ParsedTrace
from traceprof.core.procs import counted_sigint, deferred_sigint
from traceprof.core.text import COUNTED, first_few
from traceprof.core.vocab import PROFILER_SOURCES, TraceSource
from traceprof.storage import sandbox, template
from traceprof.storage.identity import check_append, check_within
from traceprof.storage.layout import (
    LAYOUTS,
    Dataset,
    SpooledTrace,
    StagedTrace,
    dataset_dir,
    error_line,
    interrupted,
    sweep_spools,
)

if TYPE_CHECKING:
    import numpy as np
    import polars as pl
    import pyarrow as pa
else:
    np = lazy("numpy")
    pl = lazy("polars")
    pa = lazy("pyarrow")

__all__ = ["Store", "DEFAULT_DB", "damaged"]

DEFAULT_DB = "traceprof.duckdb"
#: Longest store file name (bytes) a writer takes: its sidecars (``.<name>.spool-XXXXXXXX``, the
#: longest, then ``<name>.parquet`` and ``<name>.results``) must fit the usual 255-byte name limit.
MAX_NAME_BYTES = 255 - len(".") - len(".spool-") - 8
#: DuckDB's memory limit while a run is inserted (MB): the ingest of a run of many ranks otherwise holds
#: all their inserted pages until the commit (8 x 280 MB rank files: 2.4 GB); past it DuckDB writes
#: pages to the store file or its temporary folder (``<store>.tmp``) and reads them back as needed.
#: 8 x 1 M events: the ingest process peaks at 361-391 MiB under 96 (1.39-1.51x the 260 MiB rank file),
#: 406-419 MiB under 128, 340-345 MiB under 64 (about 1 s slower), 460 MB under 256 (about 190 MiB of it
#: is the interpreter, its libraries and the open store; matching adds about 60 MiB after the insert);
#: a 4.9 GB rank file at 1.74 GB.
INGEST_MEMORY_LIMIT_MB = 96
#: Fewer events than this (two of DuckDB's 122,880-row groups) go in on one DuckDB thread: the second
#: thread only builds a partial row group that is merged after, for more CPU and memory. A 54 MB
#: rank file (151 k events; ``hta/df_index_resolver``): insert 0.20 instead of 0.27 s of CPU, peak
#: 5-10 MB lower (median of 3 pairs); 1 M events keep both threads (1.4 s wall against 1.8 s on one,
#: for 0.2 s more CPU and 30 MB more memory, on this project's 2-core machines).
SERIAL_INSERT_ROWS = 2 * 122_880
#: Bytes of events the insert reads between two drops of the spilled args' pages from memory
#: (``traceprof.core.spill.scan``): DuckDB copies each batch's text into its row group, so the pages
#: read are not needed again. At the default 32 MiB the whole args of ``hta/df_index_resolver``
#: (18 MiB) stayed resident through the insert, its peak.
INSERT_RELEASE_BYTES = 1 << 20
T = TypeVar("T")
#: The per-batch trace_id and rank columns added to events on their way into the store.
_TRACE_ID, _RANK = "__traceprof_trace_id", "__traceprof_rank"


def _check_file(path: Path) -> None:
    """Refuse a path that is not a DuckDB file, an empty file or absent (``--db some.json``).

    Raises:
        StoreError: A directory, an SQLite file, or any other non-DuckDB file.
    """
    if path.is_dir():
        raise StoreError(f"{path}: a directory; --db takes a store file, e.g. {path / DEFAULT_DB}")
    try:
        with path.open("rb") as f:
            head = f.read(16)
    except FileNotFoundError:
        return
    except OSError as e:
        raise StoreError(f"{path}: cannot read: {e.strerror or e}") from None
    if not head or head[8:12] == b"DUCK":
        return
    if head == b"SQLite format 3\x00":
        raise StoreError(
            f"{path}: an SQLite file (an Nsight Systems export?), not a traceprof store (DuckDB)"
        )
    raise StoreError(
        f"{path}: not a DuckDB file (it starts with {head[:8]!r}); --db takes a traceprof store or a new path"
    )


#: DuckDB's word on a store file locked by a connection that is not traceprof's (its own lock
#: waits for other traceprof processes).
_HELD = re.compile(r"Conflicting lock is held in (?P<exe>.*?) \(PID (?P<pid>\d+)\)")


#: DuckDB's words for a store file cut short (a copy that stopped, a truncated download) or whose
#: bytes changed (DuckDB: "Corrupt database file: computed checksum ... does not match").
_DAMAGED = re.compile(r"Could not read enough bytes from file|Corrupt database file")

#: The store files this process opened, latest last: the one a damage error names when the
#: error reaches the CLI after the store was closed (:func:`damaged` without a path).
_OPENED: list[Path] = []


def damaged(e: BaseException, path: str | Path | None = None) -> StoreError | None:
    """The :class:`StoreError` saying that the store file is damaged, when ``e`` is DuckDB's word
    for that (:data:`_DAMAGED`: a file cut short, a block that fails its checksum); else None.

    Args:
        e: Any exception (only a ``duckdb.Error`` can be damage).
        path: The store file; None: the one this process opened last.
    """
    if not isinstance(e, duckdb.Error) or not _DAMAGED.search(str(e)):
        return None
    where = path if path is not None else _OPENED[-1] if _OPENED else "the store"
    return StoreError(
        f"{where}: the store file is damaged (cut short or overwritten: {error_line(e)}); restore it "
        "from a copy or ingest the traces into a new store"
    )


def _create_file(path: Path, layout: str = "duckdb") -> None:
    """Create a new store file at ``path`` whole or not at all: it is written beside (as
    ``<name>.new``) and renamed into place. A process killed while DuckDB wrote the file's
    headers left a file no later open could read ("not a valid DuckDB database file"); now it
    leaves at most the ``.new`` file, which the next creation replaces. Call with the store's
    exclusive lock held. A DuckDB-layout store is a copy of the empty store of this schema
    (:mod:`traceprof.storage.template`, its schema made already) where there is one; otherwise an
    empty DuckDB file, whose schema :meth:`Store._check_or_create` creates."""
    tmp = path.with_name(path.name + ".new")
    tmp.unlink(missing_ok=True)
    if layout != "duckdb" or not template.copy_to(tmp):
        duckdb.connect(str(tmp)).close()
    os.replace(tmp, path)


class Store:
    """A traceprof DuckDB store.

    Opening takes a lock (``<store>.lock``, see :mod:`traceprof.core.locking`) before the file is
    checked or created: exclusive for a writable store, shared for a read-only one, held until
    :meth:`close`. A store that fails to open is deleted only if this same call created it.

    Args:
        path: Store file; created (with the schema) when absent unless ``read_only``.
        read_only: Open read-only, with external file access disabled (for user SQL; a
            Parquet-layout store may read exactly its own files, see :mod:`traceprof.storage.layout`).
        lock_timeout_s: How long to wait for another process using the store, in seconds.
        layout: ``duckdb`` or ``parquet`` (:mod:`traceprof.storage.layout`) for a new store; for an existing
            one it must match the store's layout. None: the store's, ``duckdb`` for a new one.
        create: Create the file when absent (false: a missing file is an error, as read-only).
        user_sql: For user SQL (``traceprof sql``; implies ``read_only``): the store is attached to a
            private DuckDB with no writable place and locked settings (:mod:`traceprof.storage.sandbox`);
            run user text only after :func:`traceprof.storage.sandbox.check`.
        background: A new DuckDB-layout store (the path absent, writable) is created in a helper
            thread (its file, connection and schema: about 0.08 s of DuckDB work, most of it outside
            the GIL) while the caller goes on, e.g. parsing traces; the first use of :attr:`con`
            (or :meth:`ready`) waits for it and raises what creating it raised. The lock is taken
            and the path checked before this returns, as without it. ``traceprof ingest`` sets it.

    Attributes:
        created: This Store created the file (see :meth:`discard_if_new`).
        layout: The store's layout, ``duckdb`` or ``parquet``.
        dataset: The Parquet files of a Parquet-layout store, else None.
        commits: (run name, run_id) of every :meth:`insert_run` (and (prefix, run_id) of every
            :meth:`save_frames`) committed through this Store, in order; exact even when Ctrl-C
            interrupts (a commit and its entry here happen together).

    Raises:
        StoreError: The file is missing (read-only, or ``create`` false), not a DuckDB file, locked by another
            process for longer than ``lock_timeout_s``, or in another layout than ``layout``.
        SchemaVersionError: The file was written by another schema version.
    """

    def __init__(
        self,
        path: str | Path = DEFAULT_DB,
        *,
        read_only: bool = False,
        lock_timeout_s: float = 120.0,
        layout: str | None = None,
        create: bool = True,
        user_sql: bool = False,
        background: bool = False,
    ) -> None:
        if layout is not None and layout not in LAYOUTS:
            raise StoreError(f"layout {layout!r}: expected one of {', '.join(LAYOUTS)}")
        check_store_path(path)  # as given: Path() drops the trailing '/' of a folder
        self.path = Path(path)
        self.created = False
        read_only = read_only or user_sql
        self.read_only = read_only
        self.layout = layout or "duckdb"
        self.dataset: Dataset | None = None
        self.commits: list[tuple[str, int]] = []
        #: The file's size once open for writing, while no transaction of this Store has committed
        #: (None: read-only, a commit came, or a WAL was there: its checkpoint may grow the file):
        #: :meth:`_shrink_back` restores it.
        self._size_at_open: int | None = None
        self._committed = False  # a transaction of this Store committed
        self._wal = self.path.with_name(self.path.name + ".wal")
        #: The :class:`traceprof.engine.session.Session` running analyses on this store, if any (it sets this).
        self.session: Any = None
        if (read_only or not create) and not self.path.exists():
            raise StoreError(f"{self.path}: no such store; create it with `traceprof ingest PATH`")
        if not read_only and len(name := os.fsencode(self.path.resolve().name)) > MAX_NAME_BYTES:
            raise StoreError(
                f"{self.path}: a store file name of {len(name)} bytes is too long to write: its "
                f"Parquet, results and spool folders are kept beside it under longer names; use "
                f"a name of at most {MAX_NAME_BYTES} bytes"
            )
        _check_file(self.path)
        self._lock = StoreLock(self.path, exclusive=not read_only, timeout_s=lock_timeout_s)
        self._open = False
        self._opening: threading.Thread | None = None
        self._failed: BaseException | None = None
        existed = True
        try:
            existed = self.path.exists()
            _check_file(self.path)  # again: it may have been created while we waited
        except BaseException as e:
            self._drop(not existed and self.path.exists())
            if interrupted(e):
                raise KeyboardInterrupt from None
            raise
        if background and not existed and not read_only and self.layout == "duckdb":
            # here, not in the thread: the caller may spool events beside the store at once
            sweep_spools(self.path)  # events a killed ingest spooled (we hold the exclusive lock)
            self._opening = threading.Thread(
                target=self._open_aside, name="traceprof-store-create", daemon=True
            )
            self._opening.start()
        else:
            self._connect(existed, read_only, layout, user_sql)

    def _connect(
        self, existed: bool, read_only: bool, layout: str | None, user_sql: bool, sweep: bool = True
    ) -> None:
        """Create the file when absent (``existed`` false), connect, check or create the schema,
        and (``sweep``) delete the spools of a killed ingest; on any error the store is dropped
        (deleted if this call created it, unlocked) and the error raised (a Ctrl-C as
        KeyboardInterrupt)."""
        try:
            try:
                if not existed and not read_only:
                    _create_file(self.path, self.layout)
                # Read-only: external access is disabled once the store's own files are allowed.
                self.con = (
                    sandbox.connect(str(self.path))
                    if user_sql
                    else duckdb.connect(str(self.path), read_only=read_only)
                )
                # No progress bar: DuckDB would draw it on stdout, into CSV or JSON output.
                self.con.execute("SET enable_progress_bar = false")
            except duckdb.Error as e:
                if held := _HELD.search(
                    str(e)
                ):  # a process outside traceprof's lock (a DuckDB shell, a notebook)
                    raise StoreError(
                        f"{self.path}: open in another process that does not hold traceprof's lock for this "
                        f"path (PID {held['pid']}, {held['exe']}): a DuckDB shell or notebook, or traceprof "
                        "through a hard link to this file; close it or wait for it, and retry"
                    ) from None
                raise damaged(e, self.path) or StoreError(
                    f"{self.path}: cannot open as a DuckDB store: {e}"
                ) from None
            except OSError as e:  # creating it beside: the folder refused
                raise StoreError(f"{self.path}: cannot create the store: {e}") from None
            self._open = True
            self.created = not existed
            _OPENED.append(self.path)
            self._check_or_create(read_only, layout)
            if not read_only and sweep:
                sweep_spools(self.path)  # events a killed ingest spooled (we hold the exclusive lock)
                if not self._committed and not os.path.lexists(self._wal):  # see _shrink_back
                    self._size_at_open = self.path.stat().st_size
            if read_only:
                if self.dataset is not None:
                    self.dataset.allow_reads()
                if user_sql:
                    sandbox.lock(self.con)
                else:
                    self.con.execute("SET enable_external_access = false")
        except BaseException as e:
            self._drop(self.created or (not existed and self.path.exists()))
            if interrupted(e):
                raise KeyboardInterrupt from None
            if (bad := damaged(e, self.path)) is not None:
                raise bad from None
            raise

    def _open_aside(self) -> None:
        """:meth:`_connect` a new store in the helper thread (``background``); its error is kept
        for :meth:`ready` (the store is dropped already)."""
        try:
            self._connect(False, False, None, False, sweep=False)
        except BaseException as e:  # noqa: BLE001 - raised again by ready(), in the caller's thread
            self._failed = e

    def ready(self) -> None:
        """Wait for a store being created in the background (``background``); a no-op otherwise.

        Raises:
            StoreError: Creating it failed (the store is deleted and unlocked).
            KeyboardInterrupt: Ctrl-C while waiting, or creating it was interrupted.
        """
        if self._opening is not None:
            self._opening.join()
            self._opening = None
        if self._failed is not None:
            raise self._failed

    @property
    def con(self) -> duckdb.DuckDBPyConnection:
        """The store's DuckDB connection (waits for a store created in the background: :meth:`ready`)."""
        aside = self._opening
        if (aside is not None and aside is not threading.current_thread()) or self._failed is not None:
            self.ready()
        return self._con

    @con.setter
    def con(self, value: duckdb.DuckDBPyConnection) -> None:
        self._con = value

    @property
    def opening(self) -> bool:
        """A new, empty store is being created in the background (``background``): it holds no run."""
        return self._opening is not None and self._failed is None

    def _drop(self, delete: bool) -> None:
        """Close, delete the files if ``delete`` (only ever files this Store created), unlock."""
        if self._opening is not None and self._opening is not threading.current_thread():
            self._opening.join()  # its own error path dropped it already, when it failed
            self._opening = None
        if self._failed is not None:
            return
        try:
            if self._open:
                self._open = False
                try:
                    self.con.close()
                except duckdb.Error:  # busy with an interrupted result: stop it, then close
                    self._size_at_open = None
                    with contextlib.suppress(duckdb.Error):
                        self.con.interrupt()
                        self.con.close()
                else:
                    if not delete:
                        self._shrink_back()
            if self.dataset is not None:
                self.dataset.discard()
            if delete:
                for f in (self.path, self.path.with_name(self.path.name + ".wal")):
                    f.unlink(missing_ok=True)
                shutil.rmtree(dataset_dir(self.path), ignore_errors=True)
        finally:
            # no store here (a failed first ingest): its lock file goes too, if this process made it
            self._lock.release(no_store=not self.path.exists())

    def _shrink_back(self) -> None:
        """Give the file back its size at open when no transaction of this Store committed (call
        once the connection is closed). DuckDB writes a transaction's rows into blocks of the file
        before the commit, appending blocks as it needs them; a rollback (a full disk, a bad trace)
        frees them but leaves the file that much larger (a failed ingest on a full disk: 7,352,320
        -> 8,069,120 bytes). Uncommitted, those blocks lie past every block the file's header
        counts (a checkpoint, which writes the header, follows a commit only), so cutting them off
        leaves the store as it was: its rows, and its size. (Free blocks inside the file that the
        transaction used keep what it wrote: they are free again.) Nothing is raised."""
        size, self._size_at_open = self._size_at_open, None
        if size is None or os.path.lexists(self._wal):
            return
        with contextlib.suppress(OSError):
            if self.path.stat().st_size > size:
                os.truncate(self.path, size)

    def discard_if_new(self) -> bool:
        """Close the store and delete it if this Store created it and it holds no run.

        For a failed first ingest: no empty store is left behind, and a store another process
        created or wrote is never touched (this Store held the lock from creation to here).

        Returns:
            True when the file was deleted.
        """
        if self._opening is not None:
            self._opening.join()
            self._opening = None
        if self._failed is not None:  # creating it failed: its error path deleted it already
            return False
        delete = False
        if self._open and self.created:
            try:
                delete = self._one("SELECT count(*) FROM runs") == (0,)
            except duckdb.Error:
                delete = False
        self._drop(delete)
        return delete

    def _check_or_create(self, read_only: bool, layout: str | None) -> None:
        have = {r[0] for r in self.con.execute("SELECT table_name FROM duckdb_tables()").fetchall()}
        if "meta" not in have:
            if have:
                raise StoreError(f"{self.path}: a DuckDB file, but not a traceprof store")
            if read_only:
                raise StoreError(f"{self.path}: empty store; run `traceprof ingest PATH` first")
            with self.transaction() as con:
                if self.layout == "duckdb":  # no template could be copied (_create_file)
                    template.create_schema(con)
                    return
                for stmt in schema.ddl(self.layout):
                    if self.layout == "parquet" and self.dataset is None and stmt.startswith("CREATE VIEW"):
                        self.dataset = Dataset(con, self.path)  # the views read its temporary views
                        self.dataset.sweep()  # a stale folder of an earlier store of this name
                        self.dataset.refresh()
                    con.execute(stmt)
                for key, value in template.meta_rows(self.layout):
                    con.execute("INSERT INTO meta VALUES (?, ?)", [key, value])
            return
        row = self._one("SELECT value FROM meta WHERE key = 'schema_version'")
        text = str(row[0]).strip() if row and row[0] is not None else ""
        if not text.isascii() or not text.lstrip("-").isdigit():  # a damaged meta row: no version to compare
            raise SchemaVersionError(
                f"{self.path}: the store's schema version is "
                + (f"{shown(text)}, not a number" if text else "missing")
                + f" (this traceprof reads version {schema.SCHEMA_VERSION}): a damaged store; re-ingest the "
                "traces into a new store" + self._stored_runs()
            )
        version = int(text)
        if version != schema.SCHEMA_VERSION:
            raise SchemaVersionError(
                f"{self.path}: store schema version {version}, this traceprof reads version "
                f"{schema.SCHEMA_VERSION}; "
                + (
                    "upgrade traceprof"
                    if version > schema.SCHEMA_VERSION
                    else "re-ingest the traces into a new store" + self._stored_runs()
                )
            )
        row = self._one("SELECT value FROM meta WHERE key = 'layout'")
        self.layout = str(row[0]) if row else "duckdb"
        if layout is not None and layout != self.layout:
            raise StoreError(
                f"{self.path}: the store has the {self.layout} layout (chosen at its first ingest, kept for "
                f"every later one), not {layout}; drop --layout, or ingest into a new store with --db"
            )
        if self.layout == "parquet":
            self.dataset = Dataset(self.con, self.path)
            if not read_only:
                self.dataset.sweep()  # files a crashed ingest left behind (we hold the exclusive lock)
            self.dataset.refresh()
        if not read_only:
            self._refresh_views()
        else:
            self._stale_views = self._one("SELECT value FROM meta WHERE key = 'views'") != (
                schema.views_digest(),
            )
            self._temp_views(self.con)

    def _stored_runs(self, max_files: int = 20, max_runs: int = 20) -> str:
        """What a store of another schema version holds, for the message that refuses it:
        ``": run 'a' (2 files: /x/r0.json, /x/r1.json), run 'b' (1 file: ...)"``, at most
        ``max_files`` paths and ``max_runs`` runs in all (then counts); empty when it holds no run
        or cannot be read.

        Reads only (plain SELECTs of the columns of ``runs`` and ``traces`` that exist in that
        version), so the store is left as it was."""
        try:
            cols = {
                (t, c)
                for t, c in self.con.execute(
                    "SELECT table_name, column_name FROM duckdb_columns() WHERE database_name = "
                    "current_database() AND schema_name = 'main' AND table_name IN ('runs', 'traces')"
                ).fetchall()
            }
            runs = self.con.execute("SELECT run_id, name FROM runs ORDER BY run_id").fetchall()
            paths: dict[Any, list[str]] | None = None
            if {("traces", "run_id"), ("traces", "path")} <= cols:
                paths = {}
                order = ", rank" if ("traces", "rank") in cols else ""
                for run_id, path in self.con.execute(
                    f"SELECT run_id, path FROM traces ORDER BY run_id{order}, path"
                ).fetchall():
                    paths.setdefault(run_id, []).append(str(path))
        except duckdb.Error:
            return ""
        listed, parts = 0, []
        for run_id, name in runs[:max_runs]:
            if paths is None:  # that version kept no file paths
                parts.append(f"run {name!r}")
                continue
            files = paths.get(run_id, [])
            shown = files[: max(0, max_files - listed)]
            listed += len(shown)
            more = f", {len(files) - len(shown)} more" if len(shown) < len(files) else ""
            listing = f": {', '.join(shown)}{more}" if shown else ""
            parts.append(f"run {name!r} ({len(files)} file{'s' if len(files) != 1 else ''}{listing})")
        if len(runs) > max_runs:
            parts.append(f"{len(runs) - max_runs} more runs")
        return ": " + ", ".join(parts) if parts else ""

    def _temp_views(self, con: duckdb.DuckDBPyConnection) -> None:
        """On a read-only store whose derived views an earlier traceprof created (another views
        digest): this traceprof's views as temporary views of connection ``con``, which shadow the
        stored ones (a view added since, such as ``collective_perf``, exists then too)."""
        if getattr(self, "_stale_views", False):
            for t in schema.TABLES:
                if t.view_sql:
                    con.execute(f"CREATE OR REPLACE TEMP VIEW {t.name} AS {t.view_sql.strip()}")

    def _refresh_views(self) -> None:
        """Replace the derived views of a store created by an earlier traceprof with this one's
        (:func:`traceprof.core.schema.views_digest`; same rows, faster definitions)."""
        digest = schema.views_digest()
        if self._one("SELECT value FROM meta WHERE key = 'views'") == (digest,):
            return
        with self.transaction() as con:
            for stmt in schema.view_ddl():
                con.execute(stmt)
            con.execute("DELETE FROM meta WHERE key = 'views'")
            con.execute("INSERT INTO meta VALUES ('views', ?)", [digest])

    @contextlib.contextmanager
    def transaction(
        self,
        *,
        error: Callable[[duckdb.Error], str] | None = None,
        commit: bool = True,
        record: Callable[[], tuple[str, int]] | None = None,
        before_commit: Callable[[], Any] | None = None,
        undo_commit: Callable[[Any], object] | None = None,
        after_rollback: Callable[[], object] | None = None,
    ) -> Iterator[duckdb.DuckDBPyConnection]:
        """One transaction on the store's connection, the one way the store writes: ``BEGIN``, the
        block (given the connection), then ``COMMIT``, during which a Ctrl-C is held off until it is
        done (then raised: the caller learns from :attr:`commits` what was stored); on any error or
        Ctrl-C before it, ``ROLLBACK`` and nothing is written.

        Args:
            error: The message of the :class:`StoreError` a DuckDB error becomes (None: raised as is).
            commit: False: roll back after the block too (checks that must leave no trace).
            record: The entry appended to :attr:`commits` once committed, e.g. (run name, run id).
            before_commit: Runs just before the ``COMMIT``, Ctrl-C held off (moving staged files into
                place); ``undo_commit`` gets its result when the ``COMMIT`` fails.
            after_rollback: Runs after a rollback (deleting staged files).

        Raises:
            StoreError: A DuckDB error, when ``error`` is given (the store unchanged).
            KeyboardInterrupt: Ctrl-C (DuckDB's report of one too, and any error raised after a Ctrl-C
                arrived in the block): before the commit, nothing stored; during it, stored (and in
                :attr:`commits`).
        """
        con = self.con
        with counted_sigint() as arrived:
            con.execute("BEGIN")
            committed = False
            try:
                yield con
                if not commit:
                    with contextlib.suppress(duckdb.Error):
                        con.execute("ROLLBACK")
                    return
                with deferred_sigint():
                    prepared = before_commit() if before_commit is not None else None
                    try:
                        con.execute("COMMIT")
                    except BaseException:
                        if undo_commit is not None:
                            undo_commit(prepared)
                        raise
                    self._size_at_open = None  # the file holds this commit's blocks now
                    self._committed = True
                    if record is not None:
                        self.commits.append(record())
                    committed = True
                if arrived():  # a Ctrl-C whose KeyboardInterrupt was dropped before the commit: stored
                    raise KeyboardInterrupt
            except BaseException as e:
                if committed:  # Ctrl-C held off during the commit
                    raise
                with contextlib.suppress(duckdb.Error):
                    con.execute("ROLLBACK")
                if after_rollback is not None:
                    after_rollback()
                # a Ctrl-C DuckDB reported, or one whose report was lost and left the transaction
                # aborted ("Current transaction is aborted" from a later statement): nothing stored
                if interrupted(e) or arrived():
                    raise KeyboardInterrupt from None
                if (bad := damaged(e, self.path)) is not None:
                    raise bad from None
                if error is not None and isinstance(e, duckdb.Error):
                    raise StoreError(error(e)) from None
                raise

    def _one(self, query: str, params: Sequence[Any] | None = None) -> tuple[Any, ...] | None:
        """First row of a query (the result is fully consumed), or None."""
        rows = self.con.execute(query, params or []).fetchall()
        return rows[0] if rows else None

    def close(self) -> None:
        """Close the connection and release the lock (a second call does nothing)."""
        self._drop(False)

    @contextlib.contextmanager
    def for_thread(self) -> Iterator[Store]:
        """This read-only store for another thread: the same database through a connection of its
        own (``con.cursor()``: DuckDB refuses a call on a connection busy with another thread's).
        Analyses run on it share their results through this store's session (``traceprof.engine.session``;
        the view's ``origin``). Leaving the block closes that
        connection only: the lock, the files and this store stay as they were.

        Raises:
            StoreError: The store is open for writing (writes stay on one connection).
        """
        if not self.read_only:
            raise StoreError(
                f"{self.path}: open for writing; only a read-only store is shared with other threads"
            )
        view = object.__new__(_ThreadStore)
        view.__dict__.update(self.__dict__)
        view.origin = self
        view.con = self.con.cursor()
        try:
            if self.dataset is not None:  # its temporary views belong to a connection: make them on this one
                view.dataset = copy.copy(self.dataset)
                view.dataset.con = view.con
                view.dataset.refresh()
            self._temp_views(view.con)
            yield view
        finally:
            with contextlib.suppress(duckdb.Error):
                view.con.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- queries -------------------------------------------------------------------------------

    def interruptible(self, fn: Callable[[], T], timeout_s: float | None = None) -> T:
        """``fn()`` (DuckDB work on this store) in a helper thread, so that Ctrl-C interrupts it.

        DuckDB does not see Python's SIGINT while a query runs; the main thread waits here instead,
        and on Ctrl-C interrupts the connection (again every 50 ms, until ``fn`` stops) and raises.

        Args:
            fn: The work.
            timeout_s: Stop it the same way after this many seconds (None: no limit).

        Raises:
            KeyboardInterrupt: Ctrl-C (the query was interrupted).
            TimeoutError: ``timeout_s`` passed (the query was interrupted).
        """
        box: list[Any] = []
        # Not Thread.join: a join that Ctrl-C interrupts can leave the thread marked as stopped
        # (CPython < 3.13), and the next join returns at once while DuckDB runs on.
        done = threading.Event()

        def target() -> None:
            try:
                box.append((True, fn()))
            except BaseException as e:  # handed to the main thread
                box.append((False, e))
            finally:
                done.set()

        threading.Thread(target=target, daemon=True).start()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        stop: type[BaseException] = KeyboardInterrupt
        try:
            while not done.wait(0.05):
                if deadline is not None and time.monotonic() >= deadline:
                    stop = TimeoutError
                    raise KeyboardInterrupt
        except KeyboardInterrupt:
            # Interrupt until ``fn`` stops: a Ctrl-C that lands before DuckDB has started the query
            # (or while an earlier statement of ``fn`` runs) finds nothing to interrupt, and the
            # query would run on.
            while not done.wait(0.05):
                self.con.interrupt()
            box.clear()  # a result it returned meanwhile would keep the connection busy
            raise stop from None
        ok, value = box[0]
        if not ok:
            if interrupted(value):
                raise KeyboardInterrupt from None
            raise value
        return value

    def shift_events(self, trace_id: int, delta_ns: int) -> None:
        """Add ``delta_ns`` (ns) to every ``events.ts_ns`` of trace ``trace_id``, on the store's
        connection (inside the caller's transaction). In the Parquet layout the files stay as written
        and ``parts.ts_shift_ns`` grows instead (the ``events`` view adds it).

        Raises:
            duckdb.Error: DuckDB rejects the update.
        """
        self.shift_traces({trace_id: delta_ns})

    def shift_traces(self, deltas: dict[int, int], tables: Sequence[str] = ()) -> None:
        """:meth:`shift_events` for many traces in one statement per table (one pass over the
        events, not one per trace: a per-trace ``UPDATE`` scans the table each time, ranks x events
        on a job of many ranks), and the same shift of ``tables`` ``(table, columns)`` specs written
        ``"table: col1, col2"`` (rows matched on ``trace_id``).

        Args:
            deltas: ns to add, by trace_id (zero entries are skipped).
            tables: Further tables to shift, e.g. ``"steps: cpu_start_ns, cpu_end_ns"``.

        Raises:
            duckdb.Error: DuckDB rejects an update.
        """
        moved = {int(t): int(d) for t, d in deltas.items() if d}
        if not moved:
            return
        shift = "(SELECT unnest($t) AS trace_id, unnest($d) AS d) s"
        args = {"t": list(moved), "d": list(moved.values())}
        specs = ["events: ts_ns" if self.dataset is None else "parts: ts_shift_ns", *tables]
        for spec in specs:
            table, cols = (x.strip() for x in spec.split(":"))
            sets = ", ".join(f"{c} = {c} + s.d" for c in (c.strip() for c in cols.split(",")))
            self.con.execute(
                f"UPDATE {table} SET {sets} FROM {shift} WHERE {table}.trace_id = s.trace_id", args
            )

    def remove_run_files(self, run_id: int) -> None:
        """Delete run ``run_id``'s Parquet files once its rows are deleted and committed
        (``traceprof.storage.runs.remove``); nothing in the DuckDB layout."""
        if self.dataset is not None:
            self.dataset.remove_run(run_id)

    def sql(self, query: str, params: Sequence[Any] | None = None) -> pl.DataFrame:
        """Run a query and return a polars DataFrame, in one chunk (the same bytes out on every run).

        Raises:
            StoreError: The query fails (the message is DuckDB's).
        """
        table = self.arrow(query, params)
        if table is None:  # a statement without a result
            return pl.DataFrame()
        # One chunk always: polars takes another kernel path by chunk layout (x / scalar as x times
        # the reciprocal on one chunk, exact division on two: 50.00000000000001 or 50.0), and DuckDB's
        # parallel scans return one or several batches from run to run.
        return pl.from_arrow(table).rechunk()  # type: ignore[return-value]

    def arrow(self, query: str, params: Sequence[Any] | None = None) -> pa.Table | None:
        """Run a query and return its rows as DuckDB's Arrow table (batches as DuckDB wrote them), or
        None for a statement without a result.

        Raises:
            StoreError: The query fails (the message is DuckDB's).
        """
        cancel.checkpoint()  # a report's analysis thread after Ctrl-C: stop before the next query
        try:
            rel = self.con.sql(query, params=list(params) if params else None)
            return None if rel is None else rel.to_arrow_table()
        except (duckdb.Error, RuntimeError) as e:
            self._raise_query_error(e)

    def _raise_query_error(self, e: BaseException) -> NoReturn:
        """Raise what a failed query means (:meth:`arrow`, :meth:`batches`): KeyboardInterrupt for an
        interrupt, the damaged-store error, else StoreError with DuckDB's line; a non-DuckDB error as is."""
        if interrupted(e):
            raise KeyboardInterrupt from None
        if not isinstance(e, duckdb.Error):
            raise e
        raise damaged(e, self.path) or StoreError(f"SQL error: {error_line(e)}") from None

    def batches(self, query: str, params: Sequence[Any] | None, rows: int) -> Iterator[pa.RecordBatch]:
        """Run a query and yield its rows as Arrow record batches of up to ``rows`` rows, fetched
        as they are read: a caller that reduces each batch holds one batch's rows at a time, not
        the result's (DuckDB streams a query without a sort or an aggregate).

        Raises:
            StoreError: The query fails (the message is DuckDB's).
        """
        cancel.checkpoint()
        try:
            reader = self.con.sql(query, params=list(params) if params else None).to_arrow_reader(rows)
            for batch in reader:
                yield batch
                cancel.checkpoint()
        except (duckdb.Error, RuntimeError) as e:
            self._raise_query_error(e)

    #: The query behind :meth:`runs` and :meth:`run_rows` (without ``issues``).
    # ranks: with a profiler (Kineto/nsys) trace, the ones the timeline verdicts see (all ranks with a
    # file when the run has no profiler trace at all, as storage.runs.untraced_ranks counts them);
    # dump_only_ranks: the others with a file, a Flight Recorder or NCCL dump only (summary's coverage)
    # A trace stands for the ranks from its own on that its meta's stands_for.ranks names (an NDTimeline
    # worker for its collapsed tensor-parallel group, as storage.runs.untraced_ranks counts them).
    _RUNS_SQL = f"""
        WITH spans AS (
            SELECT run_id, source, range(rank, rank + greatest(coalesce(TRY_CAST(
                       json_extract_string(meta, '$.stands_for.ranks') AS INTEGER), 1), 1)) AS _span
            FROM traces WHERE rank IS NOT NULL
        ), covered AS (
            SELECT run_id, list_distinct(flatten(list(_span))) AS _ranks,
                   list_distinct(flatten(list(_span) FILTER (WHERE source IN {TraceSource.sql(*PROFILER_SOURCES)}))) AS _prof
            FROM spans GROUP BY run_id
        ), per AS (
            SELECT r.run_id, r.name, r.world_size, coalesce(len(any_value(c._ranks)), 0) AS _with_file,
                   coalesce(len(any_value(c._prof)), 0) AS _profiled,
                   count(t.trace_id) AS traces, sum(t.events_kept)::BIGINT AS events, r.sources,
                   r.clock_aligned, r.ingested_at
            FROM runs r LEFT JOIN traces t USING (run_id) LEFT JOIN covered c USING (run_id)
            GROUP BY ALL
        )
        SELECT run_id, name, world_size, CASE WHEN _profiled > 0 THEN _profiled ELSE _with_file END AS ranks,
               CASE WHEN _profiled > 0 THEN _with_file - _profiled ELSE 0 END AS dump_only_ranks,
               traces, events, sources, clock_aligned, ingested_at
        FROM per ORDER BY run_id
        """

    def runs(self) -> pl.DataFrame:
        """One row per run: run_id, name, world_size, ranks (with a profiler (Kineto/nsys) trace, or stood
        for by one, as an NDTimeline worker for its collapsed TP group; every
        rank with a file when the run has none), dump_only_ranks (ranks with a Flight Recorder or NCCL
        dump but no profiler trace: no timeline, as the summary's coverage line says), traces, events,
        sources, clock_aligned, ingested_at, and ``issues``: what ingest dropped (``traces.rejected``) or
        repaired (``traces.meta.repaired``), counted per reason over the run's traces, e.g.
        ``"2 rejected: ts beyond int64; 1 repaired: invalid UTF-8 replaced by U+FFFD"`` ("" if none)."""
        frame = self.sql(self._RUNS_SQL)
        text = self._run_issues(frame["run_id"].to_list())
        return frame.with_columns(pl.Series("issues", text, dtype=pl.String))

    def run_rows(self) -> tuple[list[str], list[tuple[Any, ...]]]:
        """:meth:`runs` as (column names, rows of Python values), without polars, numpy or pyarrow
        (``traceprof runs`` imports none of them: about 0.5 s of CPU)."""
        cur = self.con.execute(self._RUNS_SQL)
        columns = [d[0] for d in cur.description]
        rows = cur.fetchall()
        issues = self._run_issues([r[0] for r in rows])
        return [*columns, "issues"], [(*r, i) for r, i in zip(rows, issues, strict=True)]

    def run_issues(self, run_id: int) -> str:
        """The ``issues`` text of run ``run_id`` (:meth:`runs`): what ingest dropped or repaired."""
        return self._run_issues([run_id])[0]

    def _run_issues(self, run_ids: list[int]) -> list[str]:
        """The ``issues`` text of each run of ``run_ids`` (see :meth:`runs`)."""
        issues: dict[int, dict[str, int]] = {}
        for rid, rejected, repaired in self.con.execute(
            "SELECT run_id, rejected, json_extract(meta, '$.repaired') FROM traces ORDER BY trace_id"
        ).fetchall():
            got = issues.setdefault(rid, {})
            for what, counts in (("rejected", rejected), ("repaired", repaired)):
                parsed = orjson.loads(counts) if counts else {}
                for reason, n in parsed.items() if isinstance(parsed, dict) else ():
                    key = f"{what}: {reason}"
                    got[key] = got.get(key, 0) + int(n)
        return ["; ".join(f"{n} {k}" for k, n in issues.get(rid, {}).items()) for rid in run_ids]

    def own_table(self, name: str) -> str:
        """``"db".main.NAME``: the store's own table ``name``, catalog-qualified, so that it is read
        even where a temporary view of that name shadows it (a temp view is ``temp.main.NAME``;
        ``traceprof.engine.rankwise.restrict`` shadows the tables with one rank's rows)."""
        ((db,),) = self.con.execute("SELECT current_database()").fetchall()
        return '"' + str(db).replace('"', '""') + f'".main.{name}'

    def resolve_run(self, run: str | int | None, *, whole: bool = True) -> int:
        """The run_id of run name or id ``run``; ``None`` means the only (or latest) run.

        ``whole``: refuse a run of a Parquet-layout store whose files are missing or damaged
        (false for ``runs rm`` / ``runs mv``, which do not read them).

        Raises:
            StoreError: No such run, the store is empty, or (Parquet layout) a file of the run is
                missing or damaged.
        """
        rows = self.con.execute("SELECT run_id, name FROM runs ORDER BY run_id").fetchall()
        if not rows:
            raise StoreError(f"{self.path}: no runs; ingest traces first with `traceprof ingest PATH`")
        if run is None:
            return self._readable(int(rows[-1][0]), rows[-1][1], whole)
        for rid, name in rows:  # names first: a run may be named "1"
            if name == str(run):
                return self._readable(int(rid), name, whole)
        for rid, name in rows:
            if str(rid) == str(run):
                return self._readable(int(rid), name, whole)
        names = ", ".join(f"{n} (id {rid})" for rid, n in rows)
        raise StoreError(f"no run with name or id {str(run)!r} in {self.path}; runs: {names}")

    def _readable(self, run_id: int, name: str, whole: bool) -> int:
        """``run_id``, once the Parquet layout has every file of the run (``Dataset.check_run``)."""
        if whole and self.dataset is not None:
            self.dataset.check_run(run_id, name)
        return run_id

    def stored_sizes(self) -> set[int]:
        """The sizes in bytes of the files stored (``traces.bytes``: every collector records the
        file's size as read, compressed or not). A file of another size is not stored, so its
        SHA-256 need not be looked up (:meth:`find_sha`) before it is parsed."""
        if self.opening:  # being created by this process, under its lock: empty
            return set()
        return {
            int(b)
            for (b,) in self.con.execute("SELECT DISTINCT bytes FROM traces").fetchall()
            if b is not None
        }

    def find_sha(self, sha256: str, path: str = "", run: str = "") -> tuple[str, str] | None:
        """Where a file with this SHA-256 is stored: (run name, "run 'x' (id 3), rank 0"), or None.

        Of several stored copies (``traces.sha256``), the one stored from ``path`` (``traces.path``)
        comes first, then one of run ``run`` (``runs.name``), then the earliest stored."""
        row = self._one(
            "SELECT r.name, r.run_id, t.rank FROM traces t JOIN runs r USING (run_id) WHERE t.sha256 = ? "
            "ORDER BY t.path = ? DESC, r.name = ? DESC, r.run_id, t.trace_id LIMIT 1",
            [sha256, path, run],
        )
        return None if row is None else (row[0], f"run {row[0]!r} (id {row[1]}), rank {row[2]}")

    def save_frames(self, run_id: int, prefix: str, frames: dict[str, pl.DataFrame]) -> list[str]:
        """Store analysis result frames as tables ``<prefix>_<frame>`` so SQL can join them.

        Each table gets a leading ``run_id`` column; rows of the same run are replaced, other runs'
        rows are kept. Returns the table names written.

        Raises:
            StoreError: DuckDB rejects the rows (e.g. the columns changed; drop the table).
            KeyboardInterrupt: Ctrl-C; nothing saved, unless it came during the commit (then
                ``prefix`` is the last entry of :attr:`commits`, with run_id).
        """
        written = []
        with self.transaction(
            error=lambda e: f"cannot save {prefix} results: {e}", record=lambda: (prefix, run_id)
        ) as con:
            for fname, frame in frames.items():
                name = f"{prefix}_{fname}"
                tbl = (
                    frame.with_columns(pl.lit(run_id, pl.Int32).alias("run_id"))
                    .select("run_id", *[c for c in frame.columns if c != "run_id"])
                    .to_arrow()
                )
                con.register("_result", tbl)
                con.execute(f'CREATE TABLE IF NOT EXISTS "{name}" AS SELECT * FROM _result LIMIT 0')
                con.execute(f'DELETE FROM "{name}" WHERE run_id = ?', [run_id])
                con.execute(f'INSERT INTO "{name}" BY NAME SELECT * FROM _result')
                con.unregister("_result")
                written.append(name)
        return written

    # -- ingest --------------------------------------------------------------------------------

    def insert_run(
        self,
        name: str,
        traces: list[ParsedTrace],
        after: Callable[[int], object] | None = None,
        *,
        force: bool = False,
    ) -> int:
        """Insert parsed traces as (part of) run ``name`` in one transaction.

        A run that exists already gains the traces if they come from the same job (world size,
        backend, device, time span: :mod:`traceprof.storage.identity`; ``force`` skips that check); a trace
        whose rank and source the run already holds from another file is an error. On any error,
        and on Ctrl-C before the commit, nothing is written; a Ctrl-C during the commit is held
        off until it is done (then raised), and one during the checkpoint after it is raised too,
        so the caller knows (from :attr:`commits`) that the run was stored.
        ``after(run_id)``, if given, runs inside the transaction once the rows are in (ingest
        matches collectives and aligns clocks there); its errors roll everything back.

        Returns:
            The run_id.

        Raises:
            StoreError: Rank conflicts, another job's traces, or DuckDB rejects the rows.
            KeyboardInterrupt: Ctrl-C before the commit (nothing stored) or during or after it
                (stored, and the last entry of :attr:`commits`).
        """
        # The run's events go in in one transaction: DuckDB would cache every page it wrote (up to
        # 80% of RAM); past this limit it writes them to the file and evicts them. Only here: the
        # analyses (window functions) may need more, and get DuckDB's default again after. The
        # checkpoint (compressing the new rows into the file) runs under the limit too: at close, under
        # DuckDB's default, it took 1.3 GB for 32 ranks x 125 k events.
        self.con.execute(f"SET memory_limit = '{INGEST_MEMORY_LIMIT_MB}MB'")
        try:
            run_id = self._insert_run(name, traces, after, force)
            self._housekeep("CHECKPOINT")  # the rows are committed; if this fails, a later checkpoint will do
            return run_id
        finally:
            self._housekeep("RESET memory_limit")
            # a failed events insert cannot reset them inside its aborted transaction
            self._housekeep("RESET preserve_insertion_order")
            self._housekeep("RESET threads")

    def check_runs(self, runs: dict[str, list[ParsedTrace]], *, force: bool = False) -> None:
        """Refuse, before any is inserted, what :meth:`insert_run` would refuse for one of several
        runs (name -> its traces): ranks the run holds already, another job's traces. The checks
        are the insert's own, run in a transaction that is rolled back (the runs rows they add
        go with it), so that an ingest of several runs stores none when one is refused.

        Raises:
            StoreError: What ``insert_run`` raises for those conflicts.
        """
        with self.transaction(commit=False):
            for name, traces in runs.items():
                self._run_id(name, traces, force)

    def _housekeep(self, sql: str) -> None:
        """Run ``sql``, which changes no data (a checkpoint, a setting), ignoring DuckDB's errors
        but not Ctrl-C: DuckDB reports an interrupted query as an error (:func:`interrupted`),
        which is raised here as KeyboardInterrupt so that it is never swallowed (after a commit
        the caller reads from :attr:`commits` what was stored).

        Raises:
            KeyboardInterrupt: Ctrl-C during ``sql``.
        """
        try:
            self.con.execute(sql)
        except (duckdb.Error, RuntimeError) as e:  # RuntimeError: DuckDB's "Query interrupted"
            if interrupted(e):
                raise KeyboardInterrupt from None
            if not isinstance(e, duckdb.Error):
                raise

    def _insert_run(
        self, name: str, traces: list[ParsedTrace], after: Callable[[int], object] | None, force: bool
    ) -> int:
        """:meth:`insert_run`'s transaction."""
        run_id = -1
        settling = False  # ``after`` (matching, clock alignment) runs: not the insert or the commit

        def failed(e: duckdb.Error) -> str:
            files = first_few(traces, more=COUNTED, shown=lambda pt: str(pt.path))
            limit = f"DuckDB's ingest memory limit ({INGEST_MEMORY_LIMIT_MB} MB)"
            if not (isinstance(e, duckdb.OutOfMemoryException) or "failed to pin block" in str(e)):
                hint = ""
            elif settling:  # ingesting fewer files at a time would not help: the step reads the whole run
                hint = (
                    f"; {limit} was too small for matching the run's collectives across ranks and aligning "
                    "its clocks (a traceprof limitation: please report it, with the run's ranks and steps)"
                )
            else:
                text = (
                    " (traceprof.core.limits holds them to 48 MiB of text values of 40 KiB or more together)"
                    if any(pt.long_text for pt in traces)
                    else ""
                )
                hint = (
                    f"; {limit} is too small for the rows of these files together{text}: ingest them a few at a "
                    "time with the same --run (the run gains each ingest's ranks)"
                )
            return f"ingest of run {name!r} ({files}) failed, store unchanged: {error_line(e)}{hint}"

        with self.transaction(
            error=failed,
            before_commit=self.dataset.publish if self.dataset is not None else None,
            undo_commit=self.dataset.unpublish if self.dataset is not None else None,
            record=lambda: (name, run_id),
            after_rollback=self._forget_staged,
        ) as con:
            run_id = self._run_id(name, traces, force)
            self._insert_events(run_id, [(pt, self._insert_trace(run_id, pt)) for pt in traces])
            # A trace's world size is a lower bound (a Flight Recorder dump shows only its own
            # groups: replica group [2, 3] says 2): the run has at least its highest rank + 1.
            con.execute(
                """
                UPDATE runs SET
                  world_size = (SELECT max(greatest(coalesce(world_size, 0), rank + 1)) FROM traces WHERE run_id = ?),
                  sources = (SELECT list(DISTINCT source ORDER BY source) FROM traces WHERE run_id = ?)
                WHERE run_id = ?
                """,
                [run_id, run_id, run_id],
            )
            if self.dataset is not None:
                self.dataset.refresh()  # matching and clock alignment read the staged files
            if after is not None:
                settling = True
                after(run_id)
                settling = False
        return run_id

    def _forget_staged(self) -> None:
        """After a rollback: delete the transaction's staged files, point the views at the rest."""
        if self.dataset is not None:
            for p in self.dataset.pending.values():
                p.unlink(missing_ok=True)
            self.dataset.pending.clear()
            with contextlib.suppress(duckdb.Error):
                self.dataset.refresh()

    def _run_id(self, name: str, traces: list[ParsedTrace], force: bool = False) -> int:
        row = self._one("SELECT run_id FROM runs WHERE name = ?", [name])
        if row:
            run_id = int(row[0])
            if not force:
                check_append(self.con, run_id, name, traces)
        if not force:
            check_within(name, traces)
        if not row:
            run_id = int(self._one("SELECT coalesce(max(run_id), 0) + 1 FROM runs")[0])  # type: ignore[index]
            self.con.execute(
                "INSERT INTO runs VALUES (?, ?, NULL, ?, [], false)",
                [run_id, name, datetime.now(timezone.utc).replace(tzinfo=None)],
            )
        # a rank's files of one source clash unless they hold different parts (ParsedTrace.part,
        # kept in traces.meta: the NCCL plugin writes one file per communicator)
        held = dict(
            self.con.execute(
                "SELECT rank || '/' || source || '/' || coalesce(json_extract_string(meta, '$.part'), ''), path "
                "FROM traces WHERE run_id = ?",
                [run_id],
            ).fetchall()
        )
        for pt in traces:
            for what, v in (("rank", pt.rank), ("world size", pt.world_size)):
                if v is not None and not fits(v, INT32):
                    raise StoreError(f"{pt.path}: {what} {v} is beyond int32; not a real {what}")
            key = f"{pt.rank}/{pt.source}/{pt.part or ''}"
            if key in held:
                raise StoreError(
                    f"{pt.path}: run {name!r} already has rank {pt.rank} ({pt.source}) from "
                    f"{held[key]}; ingest into another run with --run NAME"
                )
            held[key] = pt.path
        return run_id

    def _insert_trace(self, run_id: int, pt: ParsedTrace) -> int:
        """Insert ``pt``'s traces row and its small tables (devices, steps, collectives); its
        events are inserted by :meth:`_insert_events`. Returns its new trace_id."""
        con = self.con
        trace_id = int(self._one("SELECT coalesce(max(trace_id), 0) + 1 FROM traces")[0])  # type: ignore[index]
        t = pt.trace

        con.execute(
            f"INSERT INTO traces ({', '.join(schema.table('traces').column_names)}) "
            f"VALUES ({', '.join('?' * len(schema.table('traces').columns))})",
            [
                trace_id,
                run_id,
                pt.rank,
                pt.world_size,
                pt.source,
                pt.format,
                pt.path,
                pt.sha256,
                pt.bytes,
                t.get("host"),
                t.get("pid"),
                t.get("backend"),
                t.get("device_name"),
                t.get("torch_version"),
                t.get("base_time_ns", 0),
                0,
                None,
                pt.events_read,
                pt.events_kept,
                sum(pt.rejected.values()),
                orjson.dumps(pt.rejected).decode(),
                sum(pt.skipped.values()),
                orjson.dumps(pt.skipped).decode(),
                sum(pt.flagged.values()),
                orjson.dumps(pt.flagged).decode(),
                t.get("flops_per_step"),
                t.get("flops_method"),
                t.get("meta"),
            ],
        )
        if self.dataset is not None:
            if pt.rank is None:  # ingest settles ranks first; a direct caller may not have
                raise StoreError(f"{pt.path}: no rank; a Parquet-layout store files events by rank")
            part = self.dataset.add(pt, run_id, pt.rank, trace_id)
            if part is not None:
                con.execute(
                    "INSERT INTO parts VALUES (?, ?, ?, 'events', ?, ?, ?, 0)",
                    [run_id, pt.rank, trace_id, *part],
                )
        elif isinstance(pt, StagedTrace):
            raise StoreError(f"{pt.path}: events staged as Parquet, but {self.path} has the duckdb layout")
        for name in ("devices", "steps", "collectives"):
            tbl = getattr(pt, name)
            if tbl is not None and tbl.num_rows:
                self._insert_arrow(name, tbl, run_id, (trace_id, pt.rank))
        return trace_id

    def _insert_events(self, run_id: int, traces: list[tuple[ParsedTrace, int]]) -> None:
        """Insert the events of ``traces`` ((trace, its trace_id)) in one statement per distinct
        Arrow schema (one per source, mostly), not one per trace.

        A single ``INSERT`` of many ranks' rows, with insertion order not preserved, converts and
        compresses them on every thread and writes full row groups; one ``INSERT`` per trace ran on
        one thread and left partial row groups that the checkpoint rewrote (32 x 125 k events:
        2.1 s instead of 6.9 s, and a store half the size); under :data:`SERIAL_INSERT_ROWS` rows,
        on one thread. Spooled events (a multi-file ingest)
        are streamed from their file a batch at a time, a trace's file opened only when its rows
        are reached; spilled args are read through :func:`traceprof.core.spill.batches`.

        Raises:
            StoreError: A spooled events file is gone or damaged.
            duckdb.Error: DuckDB rejects the rows (:meth:`insert_run` says so and rolls back).
        """
        if self.dataset is not None:
            return
        groups: dict[tuple[tuple[str, str], ...], tuple[pa.Schema, list[tuple[ParsedTrace, int]]]] = {}
        for pt, trace_id in traces:
            if isinstance(pt, StagedTrace):
                continue
            if isinstance(pt, SpooledTrace):
                sch = pt.events_schema()
            elif pt.events is not None and pt.events.num_rows:
                sch = pt.events.schema
            else:
                continue
            key = tuple((f.name, str(f.type)) for f in sch)
            groups.setdefault(key, (sch, []))[1].append((pt, trace_id))
        for sch, members in groups.values():
            full = sch.append(pa.field(_TRACE_ID, pa.int32())).append(pa.field(_RANK, pa.int32()))
            failed: list[StoreError] = []
            serial = sum(pt.events_kept for pt, _ in members) < SERIAL_INSERT_ROWS
            if serial:  # reset below, or by insert_run after a failed insert (its transaction refuses it)
                self.con.execute("SET threads = 1")
            try:
                self._insert_arrow(
                    "events",
                    pa.RecordBatchReader.from_batches(full, _tagged(members, full, failed)),
                    run_id,
                    parallel=True,
                )
            except duckdb.Error:
                if failed:  # DuckDB's message hides the reader's own error (a damaged spool file)
                    raise failed[0] from None
                raise
            if serial:
                self.con.execute("RESET threads")

    def _insert_arrow(
        self,
        name: str,
        src: pa.Table | pa.RecordBatchReader,
        run_id: int,
        trace: tuple[int, int | None] | None = None,
        *,
        parallel: bool = False,
    ) -> None:
        """``INSERT INTO name`` the rows of ``src``, its columns matched to the table's by name
        (absent ones NULL). ``trace``: (trace_id, rank) of every row; None: ``src``'s columns
        :data:`_TRACE_ID` and :data:`_RANK` hold them. ``parallel``: insertion order is not kept,
        so every thread converts and compresses rows.

        Raises:
            duckdb.Error: DuckDB rejects the rows.
        """
        con = self.con
        have = set(src.schema.names)
        given = {"run_id": run_id} | ({} if trace is None else {"trace_id": trace[0], "rank": trace[1]})
        from_src = {} if trace is not None else {"trace_id": f'"{_TRACE_ID}"', "rank": f'"{_RANK}"'}
        cols = schema.table(name).column_names
        select = ", ".join(
            f"? AS {c}"
            if c in given
            else f"{from_src[c]} AS {c}"
            if c in from_src
            else f'"{c}"'
            if c in have
            else f'NULL AS "{c}"'
            for c in cols
        )
        # a table with spilled args (traceprof.core.spill) goes in as batches, its pages dropped as read
        con.register("_incoming", spill.readable(src) if isinstance(src, pa.Table) else src)
        try:
            if parallel:
                con.execute("SET preserve_insertion_order = false")
            con.execute(
                f"INSERT INTO {name} SELECT {select} FROM _incoming", [given[c] for c in cols if c in given]
            )
        finally:
            # after a failed INSERT the transaction refuses statements (insert_run resets the setting
            # after its rollback); the registration is the connection's, not the transaction's
            if parallel:
                self._housekeep("RESET preserve_insertion_order")
            with contextlib.suppress(duckdb.Error):
                con.unregister("_incoming")


class _ThreadStore(Store):
    """A :meth:`Store.for_thread` view: closing it is its creator's business, not its own."""

    origin: Store

    def close(self) -> None:
        """Nothing: :meth:`Store.for_thread` closes the view's connection."""


def _tagged(
    traces: list[tuple[ParsedTrace, int]], schema_: pa.Schema, failed: list[StoreError]
) -> Iterator[pa.RecordBatch]:
    """The events of ``traces`` ((trace, trace_id), all with ``schema_`` less its last two
    columns) as record batches of ``schema_``: each batch with its trace's trace_id and rank
    (:data:`_TRACE_ID`, :data:`_RANK`) appended. Spooled traces are read one file at a time.

    Raises:
        StoreError: A spooled events file is gone or damaged (also appended to ``failed``: DuckDB,
            which pulls these batches, reports it only as a failed scan).
    """
    try:
        for pt, trace_id in traces:
            src = (
                pt.read_events()
                if isinstance(pt, SpooledTrace)
                else spill.batches(pt.events, every=INSERT_RELEASE_BYTES)
            )
            for b in src:
                n = b.num_rows
                tid = pa.array(np.full(n, trace_id, np.int32))
                rank = pa.nulls(n, pa.int32()) if pt.rank is None else pa.array(np.full(n, pt.rank, np.int32))
                yield pa.RecordBatch.from_arrays([*b.columns, tid, rank], schema=schema_)
    except StoreError as e:
        failed.append(e)
        raise
