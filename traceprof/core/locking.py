"""A cross-process lock on a store file, taken before the store is opened or created.

DuckDB locks its file only once it is open; creating the file, checking it and deleting a store
that a failed first ingest left empty all happen before or after that. A sidecar ``<store>.lock``,
locked with ``flock`` (shared for readers, exclusive for writers), covers those moments too, so two
processes never both believe they created the same store. The kernel drops a lock when its holder
dies, ``kill -9`` included.

The lock file stays beside the store. Only a process that created it, and leaves no store behind
(a failed first ingest), removes it, while it still holds it exclusively: a process waiting for
the lock then finds, once it has it, that the file it locked is no longer at the path (its inode
differs, or it is gone), and locks the path afresh, so two processes never hold two files' locks
for one store. Another process's lock file, or one beside a store, is never removed.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import sys
import time
from pathlib import Path

from traceprof.core.errors import StoreError

__all__ = [
    "StoreLock",
    "lock_path",
    "beside",
    "check_store_path",
    "check_not_folder",
    "close_inherited",
    "special_kind",
]

#: Lock files held by this process: path -> [fd, exclusive, holders, made]. A second Store of the
#: same file in one process shares the lock (DuckDB arbitrates within a process); ``made``: this
#: process created the file.
_HELD: dict[str, list[int]] = {}


def check_store_path(db: str | Path) -> None:
    """Refuse a ``--db`` path no store can be at: a folder (an existing one, or a path written as
    one: ending in ``/``, ``.`` or ``..``), a symlink loop, a name too long for the file
    system, or a symlink to a path that does not exist (creating the store there would replace the
    link with a file, and a failed first ingest would delete the user's link).

    DuckDB itself cannot open a path holding ``?`` (it reads what follows as options: the store
    and its ``.wal`` end up at different paths) or a backslash (read as a folder separator).

    Also refused: a path that is not UTF-8 (DuckDB takes UTF-8 paths only; it failed with
    ``std::bad_cast``), and an existing store or ``.wal`` that is not a regular file (a FIFO, a
    socket, a device): opening a FIFO waits forever for a writer.

    Raises:
        StoreError: Saying which of these it is.
    """
    try:
        try:
            full = os.path.abspath(db)
        except OSError:  # the working folder was deleted: the path as given
            full = str(db)
        os.fsencode(full).decode("utf-8")
    except UnicodeDecodeError:
        shown = str(db).encode("utf-8", "backslashreplace").decode()
        raise StoreError(
            f"{shown}: the store path is not UTF-8 (DuckDB takes UTF-8 paths only); use another --db "
            "path, or run from a folder whose path is UTF-8"
        ) from None
    odd = [c for c in ("?", "\\") if c in str(db)]
    if odd:
        shown = " or ".join(f"'{c}'" for c in odd)
        raise StoreError(
            f"{db}: DuckDB cannot keep a store at a path holding {shown} (it reads "
            "'?' as the start of connection options and '\\' as a folder separator); use another --db path"
        )
    check_not_folder(db)
    p = Path(db)
    for f in (p, p.with_name(p.name + ".wal")):
        kind = special_kind(f)
        if kind:
            raise StoreError(f"{f}: {kind}, not a regular file; --db takes a store file or a new path")
    loop = f"{db}: a symlink loop; --db takes a store file or a new path"
    try:
        p.resolve()
        p.lstat()
    except FileNotFoundError:
        return
    except RuntimeError:  # Path.resolve on a loop (Python < 3.13)
        raise StoreError(loop) from None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise StoreError(loop) from None
        if e.errno == errno.ENAMETOOLONG:
            raise StoreError(
                f"{db}: a file name too long for the file system; use a shorter --db path"
            ) from None
        raise StoreError(f"{db}: cannot use as a store: {e.strerror or e}") from None
    if p.is_symlink() and not p.exists():
        raise StoreError(
            f"{db}: a symlink to {os.readlink(p)}, which does not exist; give the target as --db "
            "to create the store there, or remove the link"
        )


def check_not_folder(db: str | Path) -> None:
    """Refuse a ``--db`` path that is a folder: an existing one (a symlink to one too), or one
    written as a folder (``.``, ``..``, ``/``, or ending in ``/`` or ``/.``: ``Path``
    drops a trailing ``/``, so ``x/`` would otherwise become the file ``x``). Give it the path as
    typed (a ``str``): a ``Path`` has lost the trailing ``/`` already.

    Raises:
        StoreError: Naming the path; an empty path is said to be empty.
    """
    text = os.fspath(db)
    if not text:  # Path("") is ".": said as what it is, not as a folder
        raise StoreError("--db: the path is empty (''); --db takes a store file or a new path")
    p = Path(text)
    if not p.name or p.name == ".." or text.endswith(("/", "/.")) or os.path.isdir(text):
        raise StoreError(f"{text!r}: a folder, not a store file; --db takes a store file or a new path")


#: What a file that is not a regular file or a folder is, for messages.
_KINDS = (
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def special_kind(path: Path) -> str | None:
    """What ``path`` is when it exists (symlinks followed) and is neither a regular file nor a folder."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return None
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    return next((what for test, what in _KINDS if test(mode)), "a special file")


def beside(db: str | Path, suffix: str) -> Path:
    """A sidecar of store file ``db``: ``<db><suffix>`` beside the file a symlinked ``db`` points
    to (absolute), so that every link to one store finds the same lock, dataset and results."""
    real = Path(db).resolve()
    return real.with_name(real.name + suffix)


def lock_path(db: Path) -> Path:
    """The sidecar lock file of store ``db`` (``traceprof.duckdb`` -> ``traceprof.duckdb.lock``)."""
    return beside(db, ".lock")


class StoreLock:
    """An acquired lock on one store; :meth:`release` it (or let the process end).

    Args:
        db: The store file (it need not exist).
        exclusive: Exclusive (writer) rather than shared (reader) lock.
        timeout_s: How long to wait for another process to release the lock, in seconds.

    Raises:
        StoreError: Another process holds the lock for longer than ``timeout_s``, or the lock file
            cannot be created (only for writers: a reader of a read-only folder goes unlocked).
    """

    def __init__(self, db: Path, *, exclusive: bool, timeout_s: float = 120.0) -> None:
        self.key = str(lock_path(db))
        self.active = False
        held = _HELD.get(self.key)
        if held is not None:
            if exclusive and not held[1]:
                _flock(held[0], True, timeout_s, db)
                held[1] = 1
            held[2] += 1
            self.active = True
            return
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fd, made = _open(self.key)
            except OSError as e:
                if not exclusive:
                    return  # a read-only folder: nobody can write the store there either
                raise StoreError(_cannot_lock(db, self.key, e)) from None
            try:
                _flock(fd, exclusive, max(deadline - time.monotonic(), 0.0), db, timeout_s)
                if _same_file(fd, self.key):
                    break
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)  # its creator removed it while we waited: lock the path afresh
        _HELD[self.key] = [fd, int(exclusive), 1, int(made)]
        self.active = True

    def release(self, no_store: bool = False) -> None:
        """Release this holder's share of the lock (the lock itself when it was the last).

        Args:
            no_store: The store was not created (or was deleted): when this process created the
                lock file and holds it exclusively, the last holder removes it too (see the module doc).
        """
        if not self.active:
            return
        self.active = False
        held = _HELD[self.key]
        held[2] -= 1
        if held[2] == 0:
            del _HELD[self.key]
            try:
                if no_store and held[1] and held[3] and _same_file(held[0], self.key):
                    with contextlib.suppress(OSError):
                        os.unlink(self.key)  # still locked: a waiter sees it gone and starts over
            finally:
                os.close(held[0])


def _open(path: str) -> tuple[int, bool]:
    """Open lock file ``path``, creating it when absent: (fd, whether this call created it)."""
    flags = os.O_RDWR | os.O_CLOEXEC
    while True:
        try:
            return os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o644), True
        except FileExistsError:
            pass
        try:
            return os.open(path, flags), False
        except FileNotFoundError:  # removed between the two calls: create it
            continue


def _same_file(fd: int, path: str) -> bool:
    """Whether ``path`` still names the file open as ``fd`` (not removed, nor replaced)."""
    try:
        a, b = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _cannot_lock(db: Path, key: str, e: OSError) -> str:
    """Why the lock file ``key`` of store ``db`` cannot be created: a folder that does not exist
    is named as such (it was reported as a lock file that cannot be created)."""
    if e.errno == errno.ENOENT and not Path(key).parent.is_dir():
        folder = Path(db).parent  # as typed
        return (
            f"{db}: the folder {folder} does not exist; create it first (mkdir -p {folder}), or give "
            "--db a path in an existing folder"
        )
    return f"{db}: cannot create the lock file {key}: {e.strerror or e}"


#: Seconds of waiting for the lock before saying so on stderr (a silent wait looks like a hang).
NOTE_AFTER_S = 1.0


def _flock(fd: int, exclusive: bool, timeout_s: float, db: Path, said_s: float | None = None) -> None:
    """Lock ``fd``, waiting up to ``timeout_s``; one line on stderr once the wait passes
    :data:`NOTE_AFTER_S` (messages give ``said_s``, the whole wait allowed, when given)."""
    said_s = timeout_s if said_s is None else said_s
    mode = (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB
    start = time.monotonic()
    deadline = start + timeout_s
    noted = False
    while True:
        try:
            fcntl.flock(fd, mode)
            return
        except BlockingIOError:
            now = time.monotonic()
            if not noted and now - start >= NOTE_AFTER_S:
                noted = True
                # A reader waits only for a writer; a writer for anyone.
                holder = "is writing it (ingest?)" if not exclusive else "is using it (ingest, or a reader?)"
                sys.stderr.write(
                    f"waiting for {db}: another traceprof process {holder}; waiting up to {said_s:.0f} s...\n"
                )
                sys.stderr.flush()
            if now >= deadline:
                raise StoreError(
                    f"{db}: in use by another traceprof process for over {said_s:.0f} s; "
                    "try again when it has finished"
                ) from None
            time.sleep(0.05)


def close_inherited() -> None:
    """Close the lock files a forked child inherited (call first thing in a worker process).

    The parent keeps its locks; the child's copies would otherwise keep the store locked for as
    long as the child lives, even after the parent died.
    """
    for fd, *_ in _HELD.values():
        try:
            os.close(fd)
        except OSError:
            pass
    _HELD.clear()
