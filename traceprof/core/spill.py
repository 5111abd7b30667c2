"""String columns kept on disk, not in memory: the args text of a large trace.

A Kineto event's ``args`` JSON text is most of a parsed trace: 250 of the 420 MB of Arrow rows
of a 2 M-event trace. The parser reads it only for a few rows (communication metadata) and
passes it through to the store. :class:`TextSpill` writes such a column, one Arrow chunk at a
time, to an unlinked temporary file and gives it back as a ``pa.ChunkedArray`` whose buffers are
a read-only memory map of that file: the same values and type as an in-memory column, so every
consumer (Arrow compute, DuckDB's Arrow scan, IPC and Parquet writers) reads it unchanged.

Mapped pages count in the process's resident set only once read, and are dropped from it (they
stay in the page cache; a later read maps them again) by :func:`release`, which a pass over
the whole column calls when it is done (``traceprof.collectors.kineto.columns``) or every few batches
(the store's insert, the spool and Parquet writers, through :func:`batches`).

Small columns stay in memory: a column is spilled once its text passes :data:`SPILL_BYTES`
(module variable; tests set it to 0). A spill never fills its disk, which is the store's: it
stops where less than :data:`RESERVE_BYTES` (1 GiB), or less than what it has written, would be
left free. Where the file cannot be written (no space, no folder) the rest of the column stays
in memory, and nothing is reported: the results are the same, only the peak memory differs.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import tempfile
import weakref
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, TypeVar

from traceprof.core.lazy import lazy

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa
else:
    np = lazy("numpy")
    pa = lazy("pyarrow")


__all__ = [
    "TextSpill",
    "column",
    "release",
    "trim",
    "note_read",
    "scan",
    "chunks",
    "batches",
    "readable",
    "SPILL_BYTES",
]

T = TypeVar("T", bound=Any)

#: A column's text (bytes) past which it goes to disk.
SPILL_BYTES = 16 << 20

#: Free space (bytes) a spill always leaves on its disk (see ``TextSpill._room_for``).
RESERVE_BYTES = 1 << 30

#: The live maps (weak: a map goes when the last array on it goes), for :func:`release`.
_MAPS: weakref.WeakSet[mmap.mmap] = weakref.WeakSet()

#: Rows per batch of :func:`batches`; bytes read by :func:`scan` / :func:`batches` between two
#: :func:`release` calls.
_BATCH_ROWS = 1 << 16
_RELEASE_BYTES = 32 << 20

_ALIGN = 64


def trim() -> None:
    """Give the C heap's free memory back to the system (glibc ``malloc_trim``; nothing elsewhere).
    The parser's passes free large transients (per-batch objects, column copies) that glibc keeps
    otherwise: 90 MB of the 790 MB peak of a 2 M-event trace."""
    pa.default_memory_pool().release_unused()  # Arrow's own pool (mimalloc or jemalloc) keeps pages too
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


def _malloc_trim() -> Any:
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None


_MALLOC_TRIM = _malloc_trim()


def release(heap: bool = True) -> None:
    """Drop the pages of every spilled column from this process's resident set (``madvise``
    ``MADV_DONTNEED`` on the read-only shared maps: the data stays in the file and the page cache),
    and, unless ``heap`` is false, :func:`trim` the heap."""
    global _read
    _read = 0
    if heap:
        trim()
    for mm in list(_MAPS):
        try:
            mm.madvise(mmap.MADV_DONTNEED)
        except (ValueError, OSError):  # closed, or the platform refuses: the pages just stay resident
            pass


_read = 0  # bytes read from the maps since the last release (an estimate; :func:`note_read`)


def note_read(nbytes: int) -> None:
    """Count ``nbytes`` read from spilled columns (a random read: a page, 4096, per value), and
    :func:`release` once a few tens of MB have been read since the last time: random reads over
    a spilled column keep that much of it resident, not all of it."""
    global _read
    _read += nbytes
    if _read > _RELEASE_BYTES:
        release()


def scan(items: Iterable[T], every: int = _RELEASE_BYTES) -> Iterator[T]:
    """``items`` (Arrow arrays or record batches, e.g. the chunks of a spilled column), calling
    :func:`release` after every few tens of MB of them and at the end: a pass over a spilled
    column keeps that much of it resident, not all of it.

    Args:
        items: The arrays or batches.
        every: Bytes of ``items`` between two releases. One under :data:`_RELEASE_BYTES` drops the
            maps' pages that often and trims the heap every :data:`_RELEASE_BYTES` only (a trim
            costs more than it frees when little was freed since the last).
    """
    seen = since_trim = 0
    for x in items:
        yield x
        seen += x.nbytes
        if seen > every:
            since_trim += seen
            release(heap=since_trim > _RELEASE_BYTES)
            if since_trim > _RELEASE_BYTES:
                since_trim = 0
            seen = 0
    release()


def chunks(column: pa.ChunkedArray | pa.Array) -> Iterator[pa.Array]:
    """The chunks of ``column`` (the array itself when not chunked) through :func:`scan`."""
    return scan(column.chunks if isinstance(column, pa.ChunkedArray) else [column])


def batches(
    table: pa.Table, rows: int = _BATCH_ROWS, every: int = _RELEASE_BYTES
) -> Iterator[pa.RecordBatch]:
    """``table``'s record batches of at most ``rows`` rows, through :func:`scan` (``every``: its)."""
    return scan(table.to_batches(max_chunksize=rows), every)


def readable(table: pa.Table) -> pa.Table | pa.RecordBatchReader:
    """``table`` for a scan that writes it out (DuckDB's Arrow scan, a Parquet copy): a stream of
    :func:`batches`, so that a few batches' pages of a spilled column are resident at a time and
    not the whole column's, when this process has spilled columns; else the table itself."""
    if not _MAPS:
        return table
    return pa.RecordBatchReader.from_batches(table.schema, batches(table))


def _room(folder: str, nbytes: int, written: int = 0) -> bool:
    """Whether writing ``nbytes`` more leaves ``folder``'s disk :data:`RESERVE_BYTES` free, and at
    least as much again as the column has spilled (``written`` before, plus ``nbytes``: the
    store, often on the same disk, needs room for the same rows)."""
    try:
        st = os.statvfs(folder)
    except OSError:
        return False
    free = st.f_bavail * st.f_frsize
    return free - nbytes >= max(RESERVE_BYTES, written + nbytes)


def column(
    values: pa.Array | pa.ChunkedArray, folder: str | Path | None = None
) -> pa.Array | pa.ChunkedArray:
    """A finished column of any type, on disk when it passes :data:`SPILL_BYTES` (module doc): the
    same values and type, its buffers a read-only memory map of an unlinked Arrow IPC file in
    ``folder`` (``ParseOptions.spill_dir``: ingest passes the store's; None: the system's temporary
    folder). Where the file cannot be written or mapped (no room, no folder), ``values`` itself."""
    if values.nbytes <= SPILL_BYTES or not len(values):
        return values
    folder = str(folder) if folder is not None else tempfile.gettempdir()
    if not _room(folder, values.nbytes):
        return values
    table = pa.table({"c": values})
    try:
        with tempfile.TemporaryFile(prefix="traceprof-spill-", dir=folder) as f:
            with pa.ipc.new_file(pa.PythonFile(f, mode="w"), table.schema) as w:  # f stays open
                w.write_table(table)
            f.flush()
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError, pa.ArrowException):
        return values
    _MAPS.add(mm)
    out = pa.ipc.open_file(pa.py_buffer(mm)).read_all().column(0)
    return out.chunk(0) if isinstance(values, pa.Array) and out.num_chunks == 1 else out


class TextSpill:
    """Builds a string column chunk by chunk, on disk past :data:`SPILL_BYTES` (module doc).

    Usage: ``add`` each chunk (a ``pa.StringArray``), then ``finish()`` once for the column.

    Args:
        folder: Where the file goes (``ParseOptions.spill_dir``); None: the system's temporary folder.
    """

    def __init__(self, folder: str | Path | None = None) -> None:
        self._folder = None if folder is None else str(folder)
        self._mem: list[pa.Array] = []  # chunks not written (yet)
        self._mem_bytes = 0
        self._file: IO[bytes] | None = None
        self._at = 0
        self._parts: list[
            tuple[int, int, int, int] | pa.Array
        ] = []  # (rows, offsets at, data at, data bytes)
        self._failed = False  # no more spilling (no folder, no room, a failed write)
        self._dir = ""

    def add(self, chunk: pa.Array) -> None:
        """Append ``chunk`` (a ``pa.StringArray``) to the column."""
        if self._file is None:
            self._mem.append(chunk)
            self._mem_bytes += chunk.nbytes
            if self._mem_bytes > SPILL_BYTES and not self._failed:
                self._open()
            return
        self._write(chunk)

    def finish(self) -> pa.ChunkedArray:
        """The column: memory-mapped chunks from the file, or the chunks themselves when small."""
        if self._file is None:
            return pa.chunked_array(self._mem, pa.string())
        f, self._file = self._file, None
        try:
            f.flush()
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if self._at else None
        except (OSError, ValueError):
            return self._read_back(f)
        finally:
            f.close()  # unlinked: the space goes with the map
        if mm is None:
            return self._assemble(lambda at, size: pa.py_buffer(b""))
        _MAPS.add(mm)
        buf = pa.py_buffer(mm)
        return self._assemble(buf.slice)

    def _open(self) -> None:
        self._dir = self._folder or tempfile.gettempdir()
        if not self._room_for(self._mem_bytes):
            self._failed = True
            return
        try:
            self._file = tempfile.TemporaryFile(prefix="traceprof-spill-", dir=self._dir)
        except OSError:
            self._failed = True
            return
        mem, self._mem = self._mem, []
        for c in mem:
            self._write(c)

    def _write(self, chunk: pa.Array) -> None:
        assert self._file is not None
        if self._failed or not self._room_for(chunk.nbytes):
            self._failed = True  # the disk is for the store: the rest of the column stays in memory
            self._parts.append(chunk)
            return
        if chunk.null_count or chunk.offset or not isinstance(chunk, pa.StringArray):
            self._parts.append(chunk)  # not the plain layout written below: kept as it is
            return
        _validity, offsets, data = chunk.buffers()
        rows = len(chunk)
        if offsets is None:
            self._parts.append(chunk)
            return
        ends = np.frombuffer(offsets, np.int32, rows + 1)
        if ends[0]:  # offsets not from 0 (a slice of a bigger buffer): kept as it is
            self._parts.append(chunk)
            return
        try:
            off_at = self._put(offsets, 4 * (rows + 1))
            data_len = int(ends[-1])
            data_at = self._put(data, data_len)
        except OSError:  # e.g. no space left: the rest of the column stays in memory
            self._failed = True
            self._parts.append(chunk)
            return
        self._parts.append((rows, off_at, data_at, data_len))

    def _room_for(self, nbytes: int) -> bool:
        return _room(self._dir, nbytes, self._at)

    def _put(self, buf: pa.Buffer | None, size: int) -> int:
        assert self._file is not None
        at = self._at
        self._file.seek(at)  # past what a failed write left
        if size:
            assert buf is not None
            self._file.write(memoryview(buf)[:size])
        pad = -(at + size) % _ALIGN
        if pad:
            self._file.write(b"\0" * pad)
        self._at = at + size + pad
        return at

    def _read_back(self, f: IO[bytes]) -> pa.ChunkedArray:
        """The column in memory, read from the file (when it cannot be mapped)."""

        def read(at: int, size: int) -> pa.Buffer:
            f.seek(at)
            return pa.py_buffer(f.read(size))

        return self._assemble(read)

    def _assemble(self, read: Callable[[int, int], pa.Buffer]) -> pa.ChunkedArray:
        """The column from its parts, each written one's buffers given by ``read(at, size)``."""
        chunks = []
        for p in self._parts:
            if isinstance(p, pa.Array):
                chunks.append(p)
            else:
                rows, off_at, data_at, data_len = p
                chunks.append(
                    pa.StringArray.from_buffers(rows, read(off_at, 4 * (rows + 1)), read(data_at, data_len))
                )
        self._parts = []
        return pa.chunked_array(chunks, pa.string())
