"""Analysis results kept beside the store, so that a later command does not compute them again.

A CI job typically runs ``traceprof analyze stragglers`` (to gate on it), a few more analyses,
then ``traceprof report``, which runs every analysis again: on 8 ranks x 1 M events that is about
30 s of repeated work. In a session that caches (``traceprof.engine.session``: the CLI's ``analyze``,
``report``, ``summary``, ``diff`` and ``history``), a registered analysis first looks for its result
in the store's results folder (``STORE.results/``) and, when it computes one, writes it there.

An entry is keyed by:
  1. the store's *state*: the store file, its write-ahead log and every file of its Parquet
     dataset, each by inode, size, modification and change time (ns). Any write to the store
     (an ingest, ``runs rm``, ``--save``) changes it, so a result never outlives the data it was
     computed from. Entries of any other state (or code) are deleted when a new one is written.
  2. the *code*: a hash of every ``.py`` and ``.sql`` file of ``traceprof`` and ``analyses`` and the
     versions of Python, DuckDB, polars, pyarrow and numpy, so a new release (or an edit) never
     reads an old result.
  3. the analysis name and its parameters (``run`` as given: the latest run is part of the state).

Only stores opened read-only are cached: their shared lock keeps writers out while the command
runs. An entry holds each frame of the result as Arrow IPC and its notes as JSON (with their
figures, ``traceprof.engine.analysis.Note``); it is read back
into the analysis' own ``Result`` class (a ``FrameResult`` of ``analyses``, nothing else), and an
entry that cannot be read, or fails its checks (each frame's SHA-256 and size, its analysis and
Result class, the set of its frames), is ignored and computed again. A folder that cannot be written
(a read-only share) or read, or a results path that is a symlink or a file, just means no caching;
only folders named as this module names them (24 hex digits) are ever deleted. ``--no-cache`` (or ``TRACEPROF_NO_CACHE=1``) turns it off.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib
import io
import os
import re
import shutil
import stat
import sys
import tempfile
import threading
from collections.abc import Callable
from functools import cache, wraps
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from traceprof.core.errors import TraceprofError
from traceprof.core.lazy import lazy
from traceprof.core.locking import beside
from traceprof.storage.layout import dataset_dir

if TYPE_CHECKING:
    import polars as pl
else:  # `traceprof analyze` printing a kept view (read_view) imports no frame library
    pl = lazy("polars")

__all__ = [
    "results_dir",
    "lookup",
    "keep",
    "state_key",
    "kept_frame",
    "view_path",
    "read_view",
    "write_view",
    "remove_created",
    "forget_created",
    "make_for_another",
    "remove_partial",
]

#: Bumped when the entry format changes (3: notes with their figures).
_FORMAT = 3
#: Names of the folders this module creates in a results folder (24 hex digits); it deletes no other.
_OURS = re.compile(r"[0-9a-f]{24}")


def _key(value: Any) -> str:
    """24 hex digits of the SHA-256 of ``value`` as JSON (keys sorted; other types as their text):
    every folder and entry name here (:data:`_OURS` matches the folders)."""
    return hashlib.sha256(orjson.dumps(value, option=orjson.OPT_SORT_KEYS, default=str)).hexdigest()[:24]


def results_dir(db: str | Path) -> Path:
    """The results folder of the store ``db``: ``DB.results`` beside it (beside the file a
    symlinked ``db`` points to)."""
    return beside(db, ".results")


def _stat(p: Path) -> list[int]:
    s = p.stat()
    return [s.st_ino, s.st_size, s.st_mtime_ns, s.st_ctime_ns]


def state_key(db: Path) -> str:
    """Hex digest of the store's files' (inode, size, mtime ns, ctime ns) (module doc, 1).

    Raises:
        OSError: The store file cannot be read (the caller then does not cache).
    """
    parts: list[Any] = [str(db.resolve()), _stat(db)]
    wal = db.with_name(db.name + ".wal")
    if wal.exists():
        parts.append(_stat(wal))
    ds = dataset_dir(db)
    if ds.is_dir():
        parts.extend([str(f.relative_to(ds)), _stat(f)] for f in sorted(ds.rglob("*")) if f.is_file())
    return _key(parts)


@cache
def _code_key() -> str:
    """Hex digest of the analysis code and the libraries it computes with (module doc, 2)."""
    from importlib.metadata import PackageNotFoundError, version

    def installed(name: str) -> str:  # without importing it (polars, numpy, pyarrow: 0.5 s)
        try:
            return version(name)
        except PackageNotFoundError:
            return ""

    libs = [installed(n) for n in ("duckdb", "polars", "polars-runtime-32", "pyarrow", "numpy")]
    h = hashlib.sha256(orjson.dumps([_FORMAT, sys.version, *libs]))
    root = Path(__file__).resolve().parent.parent  # the traceprof package
    # the whole package, traceprof.analyses and traceprof.collectors included (in a checkout they
    # are links to the repository's analyses/ and collectors/ folders: followed)
    files = sorted(Path(d, f) for d, _, names in os.walk(root, followlinks=True) for f in names)
    for f in files:
        if f.suffix in (".py", ".sql") and f.is_file():
            h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:24]


def _folder(store: Any) -> Path | None:
    """The folder of ``store``'s current state and this code; None when not caching (no session
    that caches, a store open for writing, an in-memory store)."""
    session = getattr(getattr(store, "origin", None) or store, "session", None)
    if session is None or not session.cache:
        return None
    return _state_folder(store)


def _state_folder(store: Any) -> Path | None:
    """:func:`_folder` of a store, whatever its session; None for a store open for writing or in
    memory, or a results path that is not a folder this module made."""
    if not getattr(store, "read_only", False) or store.path.name == ":memory:":
        return None
    try:
        state = store.__dict__.get("_result_state") or state_key(store.path)
    except OSError:
        return None
    store.__dict__["_result_state"] = state  # one stat walk per store and command
    root = results_dir(store.path)
    try:
        if root.is_symlink() or (root.exists() and not root.is_dir()):
            return None  # not a folder this module made: leave it alone
    except OSError:
        return None
    # one folder per store state and code: writing into a new one deletes the others
    return root / _key([state, _code_key()])


def _entry(store: Any, name: str, params: Any) -> Path | None:
    """The entry folder of ``name`` with ``params`` on ``store``; None when not caching."""
    folder = _folder(store)
    if folder is None:
        return None
    try:
        fields = dataclasses.asdict(params)
        # the run by id: ``run`` None (the latest), a name and an id are one entry
        fields["run"] = store.resolve_run(fields.get("run"))
        key = _key([name, fields])  # TypeError: a value JSON cannot hold (an int beyond 64 bits)
    except (TypeError, TraceprofError):
        return None
    return folder / f"{name}-{key}"


def lookup(store: Any, name: str, params: Any) -> Any | None:
    """The cached result of analysis ``name`` with ``params`` on ``store``, or None (not
    caching, no entry, or an entry that cannot be read or fails its checks: its analysis, its
    Result class, the set of its frames and each frame's SHA-256)."""
    from traceprof.engine.analysis import Note, get

    entry = _entry(store, name, params)
    if entry is None:
        return None
    got = _read(entry)
    if got is None:
        return None
    meta, frames = got
    try:
        cls = _result_class(meta["class"])
        expected = {f.name for f in dataclasses.fields(cls)} - {"notes"}
        if (
            meta.get("analysis") != name
            or cls.__module__ != get(name).run.__module__
            or set(frames) != expected
        ):
            return None
        return cls(notes=tuple(Note.from_dict(n) for n in meta["notes"]), **frames)
    except Exception:  # noqa: BLE001 - a foreign entry: compute instead
        return None


def _regular_bytes(path: Path, size: int) -> bytes:
    """The ``size`` bytes of the regular file ``path`` (not a link, a FIFO or a device).

    Raises:
        OSError: It is not a regular file of that size, or cannot be read.
    """
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size != size:
            raise OSError(f"{path}: not the file that was written")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(size + 1)
    finally:
        os.close(fd)
    if len(data) != size:
        raise OSError(f"{path}: changed while read")
    return data


def _read(entry: Path) -> tuple[dict[str, Any], dict[str, pl.DataFrame]] | None:
    """(meta, frames) of the entry folder, each frame's bytes checked against the SHA-256 and
    size in its meta; None when it is missing, unreadable or damaged (nothing is raised)."""
    try:
        if entry.is_symlink() or not (entry / "meta.json").is_file():
            return None
        meta = orjson.loads(_regular_bytes(entry / "meta.json", (entry / "meta.json").lstat().st_size))
        frames = {}
        for f, (size, digest) in meta["frames"].items():
            data = _regular_bytes(entry / f"{f}.arrow", int(size))
            if hashlib.sha256(data).hexdigest() != digest:
                return None
            frames[str(f)] = pl.read_ipc(io.BytesIO(data))
        return meta, frames
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException:  # noqa: BLE001 - unreadable, damaged (polars panics are BaseException): compute instead
        return None


def _result_class(qualname: str) -> type:
    """The Result class ``module:Name``, only from ``analyses`` and only a FrameResult."""
    from traceprof.engine.analysis import PACKAGE, FrameResult

    module, _, attr = str(qualname).partition(":")
    if not module.startswith(f"{PACKAGE}.") or not attr.isidentifier():
        raise ValueError(qualname)
    cls = getattr(importlib.import_module(module), attr)
    if not (isinstance(cls, type) and issubclass(cls, FrameResult) and dataclasses.is_dataclass(cls)):
        raise ValueError(qualname)
    return cls


def keep(store: Any, name: str, params: Any, result: Any) -> None:
    """Write ``result`` as the entry of ``name`` with ``params`` (when caching; module doc).
    Results with fields other than frames and notes are not kept; nothing is raised."""
    entry = _entry(store, name, params)
    try:
        if entry is None or entry.exists():
            return
    except OSError:
        return
    from traceprof.engine.analysis import Note

    cls = type(result)
    fields = {f.name: getattr(result, f.name) for f in dataclasses.fields(result)}
    frames = {k: v for k, v in fields.items() if isinstance(v, pl.DataFrame)}
    if set(fields) - set(frames) != {"notes"} or not ours(cls):
        return
    notes = [(n if isinstance(n, Note) else Note(n)).to_dict() for n in result.notes]
    _write(entry, frames, {"analysis": name, "class": f"{cls.__module__}:{cls.__qualname__}", "notes": notes})


def ours(cls: type) -> bool:
    """Whether result class ``cls`` is of an analysis of traceprof's own (``traceprof.analyses``): the
    only ones whose results and views are kept, as only their code is in the key (an add-on's,
    registered by entry point, changes without the key changing)."""
    from traceprof.engine.analysis import PACKAGE

    return cls.__module__.startswith(f"{PACKAGE}.")


_UMASK_LOCK = threading.Lock()


def _umask() -> int:
    """The process's umask. Read from ``/proc/self/status`` where it is there (Linux 4.7+);
    elsewhere reading it means setting it for a moment: to 077 (a file another thread creates
    meanwhile, the report's analyses run on two, is then only the stricter), under a lock (a
    second reader must not take that moment's value)."""
    with contextlib.suppress(OSError, ValueError), open("/proc/self/status", "rb") as f:
        for line in f:
            if line.startswith(b"Umask:"):
                return int(line.split()[1], 8)
    with _UMASK_LOCK:
        umask = os.umask(0o077)
        os.umask(umask)
        return umask


#: The folders this process created for kept results (the results folder, a state folder), in the
#: order made: an interrupted command removes them (:func:`remove_created`), as it says that nothing
#: was changed.
_CREATED: list[Path] = []


def _make_folders(folder: Path) -> None:
    """Create ``folder`` (a state folder) and the results folder above it where missing, noting
    each one made in :data:`_CREATED`.

    Raises:
        OSError: One cannot be made.
    """
    for d in (folder.parent, folder):
        try:
            d.mkdir()
        except FileExistsError:
            continue
        _CREATED.append(d)


def make_for_another(store: Any) -> Path | None:
    """Create the folder of ``store``'s current state and this code (and the results folder) where
    missing, as this process's own (:data:`_CREATED`), before another process keeps results there on
    this command's behalf (the report's heavy analyses in a fresh process, which is killed on
    Ctrl-C): the folders it would have made are removed with this process's on Ctrl-C
    (:func:`remove_created`). Nothing is raised.

    Returns:
        The folder (for :func:`remove_partial`); None when not caching.
    """
    folder = _folder(store)
    if folder is not None:
        with contextlib.suppress(OSError):
            _make_folders(folder)
    return folder


def _tmp_prefix() -> str:
    """The name's start of what this process writes before renaming it into place: ``.tmp-PID-``."""
    return f".tmp-{os.getpid()}-"


def remove_partial(folder: Path | None, pid: int) -> None:
    """Remove what process ``pid`` (killed: the report's fresh process) left half-written in the
    state folder ``folder`` (:func:`make_for_another`; a folder there before this command keeps the
    entries it finished). Nothing is raised."""
    if folder is None:
        return
    with contextlib.suppress(OSError):
        for p in folder.glob(f".tmp-{pid}-*"):
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)


def forget_created() -> None:
    """Start a new command: the folders created so far are no longer its own to remove."""
    _CREATED.clear()


def remove_created() -> list[Path]:
    """Remove the results folders this process created (:data:`_CREATED`), with what they hold:
    for a command that stops (Ctrl-C) and says that nothing was changed. Nothing is raised.

    Returns:
        The folders removed.
    """
    gone = []
    for d in reversed(_CREATED):
        shutil.rmtree(d, ignore_errors=True)
        if not os.path.lexists(d):
            gone.append(d)
    _CREATED.clear()
    return gone


def _write(entry: Path, frames: dict[str, pl.DataFrame], meta: dict[str, Any]) -> None:
    """Write ``frames`` (zstd Arrow IPC) and ``meta`` (JSON, plus each frame's size and SHA-256
    under ``frames``) as the folder ``entry``, all or nothing, readable as the umask allows (a
    store several people read); then delete the other state folders this module made (24 hex
    digits: nothing else in the results folder is touched). Nothing is raised."""
    try:
        _make_folders(entry.parent)
        tmp = Path(tempfile.mkdtemp(prefix=_tmp_prefix(), dir=entry.parent))
    except OSError:
        return
    try:
        umask = _umask()
        os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes it 0700
        sums = {}
        for k, df in frames.items():
            buf = io.BytesIO()
            df.write_ipc(buf, compression="zstd")  # 8 x 1 M activity rows: 31 MB, not 474
            data = buf.getvalue()
            (tmp / f"{k}.arrow").write_bytes(data)
            sums[k] = (len(data), hashlib.sha256(data).hexdigest())
        (tmp / "meta.json").write_bytes(orjson.dumps({**meta, "frames": sums}))
        os.rename(tmp, entry)  # atomic: a reader sees the whole entry or none
    except Exception:  # noqa: BLE001 - unwritable (full disk, an Object column, a race): no entry
        shutil.rmtree(tmp, ignore_errors=True)
        return
    except BaseException:  # Ctrl-C: no half-written entry either
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    # entries of other store states or code can never be read again
    with contextlib.suppress(OSError):
        for old in entry.parent.parent.iterdir():
            if old != entry.parent and _OURS.fullmatch(old.name) and not old.is_symlink() and old.is_dir():
                shutil.rmtree(old, ignore_errors=True)


_F = Callable[..., "pl.DataFrame"]


def kept_frame(fn: _F) -> _F:
    """Decorator for a helper ``fn(store, *args, **kwargs) -> DataFrame`` that several analyses
    read, each in its own process (``traceprof.engine.activity``'s intervals: about 2 s on 8 ranks x 1 M
    events, read back in 0.2 s): in a session that caches its frame is kept as an entry too, keyed
    by the function and its (hashable, JSON-able) arguments."""

    @wraps(fn)
    def keeping(store: Any, *args: Any, **kwargs: Any) -> pl.DataFrame:
        folder = _folder(store)
        if folder is None:
            return fn(store, *args, **kwargs)
        entry = folder / f"_{fn.__name__.lstrip('_')}-{_key([fn.__module__, fn.__qualname__, args, kwargs])}"
        function = f"{fn.__module__}:{fn.__qualname__}"
        got = _read(entry)
        if got is not None and got[0].get("function") == function and set(got[1]) == {"frame"}:
            return got[1]["frame"]
        df = fn(store, *args, **kwargs)
        with contextlib.suppress(OSError):
            if entry.exists():
                return df
        _write(entry, {"frame": df}, {"function": function})
        return df

    return keeping


# --- the CLI's views: a kept result as `traceprof analyze` prints it ------------------------------


def view_path(store: Any, name: str, run: str | None, options: dict[str, str]) -> Path | None:
    """The file holding what ``traceprof analyze NAME`` printed of analysis ``name`` on ``run`` with
    the ``-p`` strings ``options`` (``traceprof.cli``: each table in each form printed, a table in its
    units, JSON or CSV), beside the store's results of its current state and this code: a later
    ``analyze`` prints it without computing, nor importing polars, numpy or pyarrow (0.5 s).
    Keyed by the run's id and the option strings as given (``hta=1`` and ``hta=true`` are two views
    of one result). None when not caching (``TRACEPROF_NO_CACHE``, a store open for writing), or
    when there is no such run (the caller computes, and says so)."""
    from traceprof.engine.session import cache_from_env

    if not cache_from_env():
        return None
    folder = _state_folder(store)
    try:
        run_id = store.resolve_run(run)
    except TraceprofError:
        return None
    if folder is None:
        return None
    return folder / f"view-{name}-{_key([name, run_id, options])}.json"


def read_view(path: Path) -> dict[str, Any] | None:
    """The view :func:`write_view` wrote at ``path``, or None (none, unreadable, or its SHA-256
    does not match: damaged)."""
    try:
        data = _regular_bytes(path, path.lstat().st_size)
        digest, _, body = data.partition(b"\n")
        if hashlib.sha256(body).hexdigest().encode() != digest:
            return None
        doc = orjson.loads(body)
        return doc if isinstance(doc, dict) else None
    except (OSError, orjson.JSONDecodeError):
        return None


def write_view(path: Path, doc: dict[str, Any]) -> None:
    """Write ``doc`` (JSON) at ``path`` with its SHA-256, all or nothing, when its folder exists
    (the results of that store state are kept there); nothing is raised."""
    if not path.parent.is_dir():
        return
    body = orjson.dumps(doc)
    try:
        fd, tmp = tempfile.mkstemp(prefix=_tmp_prefix(), dir=path.parent)
    except OSError:
        return
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(hashlib.sha256(body).hexdigest().encode() + b"\n" + body)
        os.chmod(tmp, 0o666 & ~_umask())  # readable as the umask allows, as the entries are
        os.replace(tmp, path)  # atomic: a reader sees the whole view or none
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
