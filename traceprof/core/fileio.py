"""Reading trace files and writing output files, safely.

Reading (:func:`read_maybe_gzip`: the whole file; :class:`TextStream`: its text in pieces, never held
whole, for parsers that decode as they read): plain or gzipped bytes. Gzip is inflated as a stream under a cap
on the decompressed size (``max_ratio``: ``ParseOptions.max_inflate_ratio``, default 64x the file, at least 64 MiB), so
a small file that inflates to gigabytes (a gzip bomb) is refused before it fills the memory.
Invalid UTF-8 is replaced by U+FFFD and reported (:func:`pop_repairs`) instead of failing the file.
A leading UTF-8 byte order mark (``EF BB BF``, as some Windows editors and tools write, and as
Chrome's trace viewer and Python's ``utf-8-sig`` accept) is blanked to three spaces (:func:`blank_bom`):
JSON allows leading whitespace, and every byte offset a parser reports stays the file's offset.
Errors name the file and the byte offset.

Writing (:func:`write_output`, :func:`check_not_store`): an output path the user named never
overwrites the store, also through a symlink, a hard link or a descriptor (``-o - >> s.duckdb``), nor
any other DuckDB database (another store): :func:`write_output` reads the first bytes of an existing
file and refuses DuckDB's magic.
It writes the output whole or not at all (a temporary file beside, renamed into place).
"""

from __future__ import annotations

import codecs
import contextlib
import hashlib
import os
import re
import sys
import types
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from traceprof.core.errors import TraceFormatError, UsageError
from traceprof.core.locking import beside, check_store_path, special_kind

_inflater: types.ModuleType
try:  # ISA-L's inflate, zlib's interface: 0.45 s for a 272 MB rank file where zlib takes 0.80-0.94 s
    from isal import isal_zlib as _inflater
except ImportError:  # not installed (e.g. a platform without its wheel): the standard library's
    _inflater = zlib
#: What a broken stream raises (``zlib.error``, or ISA-L's own).
_INFLATE_ERROR: type[Exception] = _inflater.error

__all__ = [
    "read_file",
    "read_maybe_gzip",
    "check_inflate_ratio",
    "not_json_because",
    "misnamed_gzip",
    "TextStream",
    "NotUtf8",
    "pop_repairs",
    "Repair",
    "write_output",
    "check_not_store",
    "DEFAULT_INFLATE_RATIO",
    "on_read",
    "blank_bom",
    "UTF8_BOM",
    "GZIP_MAGIC",
]

#: (pid that set it, hook): see :func:`on_read`.
_ON_READ: tuple[int, Callable[[Path, int, int], None]] | None = None


def on_read(hook: Callable[[Path, int, int], None] | None) -> None:
    """Call ``hook(path, bytes_read, file_bytes)`` as :class:`TextStream` reads a file in this
    process (about every MiB; bytes as stored, compressed or not), for a progress bar of a long
    ingest; ``None`` stops. Forked parser workers inherit the hook but never call it (their reads are
    not this process's, and a worker must not draw on the terminal)."""
    global _ON_READ
    _ON_READ = None if hook is None else (os.getpid(), hook)


#: Default cap on decompressed size, as a multiple of the compressed file size. Real Kineto
#: traces compress 8-20x; 64x leaves room and still stops a bomb early.
#: Small files may always inflate to this many bytes (a 1 KiB file 64x is no memory risk).
MIN_INFLATE_BYTES = 64 << 20
#: Default cap on gzip inflation: 64x the compressed size (``--max-inflate``, ``ParseOptions.max_inflate_ratio``).
DEFAULT_INFLATE_RATIO = 64.0
_IN_CHUNK = 1 << 16  # compressed bytes fed per step
_OUT_CHUNK = 1 << 20  # decompressed bytes produced per step at most

#: The UTF-8 byte order mark. JSON (RFC 8259 section 8.1) must not carry one, but parsers may
#: ignore it, and real tools do; :func:`blank_bom` makes it whitespace.
UTF8_BOM = codecs.BOM_UTF8
#: The first two bytes of every gzip member (RFC 1952): how a file is told to be gzip, whatever its name.
GZIP_MAGIC = b"\x1f\x8b"
_BOM_BLANK = b" " * len(UTF8_BOM)

_repairs: dict[str, list[Repair]] = {}


@dataclass(frozen=True)
class Repair:
    """A repair made while reading a file.

    Attributes:
        reason: What was repaired, e.g. ``"invalid UTF-8 replaced by U+FFFD"``.
        count: How many places were repaired.
        message: One line for the user, naming the file and the first byte offset.
    """

    reason: str
    count: int
    message: str


#: Largest ``--max-inflate`` ratio: deflate cannot inflate more than about 1032x, so any ratio above
#: that is no limit at all; beyond this one the byte limit would not fit an integer (1e308 did not).
MAX_INFLATE_RATIO = 1_000_000


def check_inflate_ratio(ratio: float, typed: str | None = None) -> None:
    """Refuse a ``--max-inflate`` ratio that is not a number above 0 and at most
    :data:`MAX_INFLATE_RATIO` (nan, inf and 1e308 included).

    Args:
        ratio: The ratio.
        typed: The ratio as the user typed it, for the message (default: ``ratio``).

    Raises:
        UsageError: Naming the option and the value.
    """
    if not 0 < ratio <= MAX_INFLATE_RATIO:
        raise UsageError(
            f"--max-inflate {ratio if typed is None else typed}: expected a ratio above 0 and at most {MAX_INFLATE_RATIO:,}, "
            "e.g. 64 (gzip inflates at most about 1032x)"
        )


def pop_repairs(path: str | Path) -> list[Repair]:
    """The repairs made while reading ``path`` in this process (forgotten once returned)."""
    return _repairs.pop(str(path), [])


def blank_bom(text: bytes) -> bytes:
    """``text`` with a leading UTF-8 byte order mark replaced by as many spaces (else ``text``
    itself): a JSON parser then reads it, and the byte offsets it reports are unchanged."""
    return _BOM_BLANK + text[len(UTF8_BOM) :] if text.startswith(UTF8_BOM) else text


def _blank_bom_pieces(pieces: Iterator[bytes]) -> Iterator[bytes]:
    """:func:`blank_bom` on the text that ``pieces`` yield (a first piece shorter than the mark is
    joined with the next ones until it can be told)."""
    first = b""
    for piece in pieces:
        first += piece
        if len(first) >= len(UTF8_BOM):
            break
    if first:
        yield blank_bom(first)
    yield from pieces


def read_file(path: Path) -> bytes:
    """The bytes of the file ``path`` as stored (not gunzipped: :func:`read_maybe_gzip`).

    Raises:
        TraceFormatError: The file cannot be read (naming it and the system's reason).
    """
    try:
        return path.read_bytes()
    except OSError as e:
        raise TraceFormatError(path, "", f"cannot read file: {e.strerror or e}") from None


def read_maybe_gzip(path: Path, max_ratio: float = DEFAULT_INFLATE_RATIO) -> tuple[bytes, bytes]:
    """Read a file, gunzipping it when it starts with the gzip magic bytes (under the cap:
    ``max_ratio`` x its size, at least 64 MiB); repair invalid UTF-8.

    Returns:
        (the file's bytes, the decompressed bytes, or the same bytes when not gzip), the latter with
        every invalid UTF-8 sequence replaced by U+FFFD (see :func:`pop_repairs`) and a leading
        byte order mark blanked (:func:`blank_bom`).

    Raises:
        TraceFormatError: The file cannot be read, the gzip stream is broken or truncated (naming
            the byte offset in the file), or it inflates beyond the cap.
    """
    raw = read_file(path)
    if raw[:2] != GZIP_MAGIC:
        return raw, _repair_utf8(path, blank_bom(raw), gz=False)
    view = memoryview(raw)
    pieces = (view[i : i + _IN_CHUNK] for i in range(0, len(raw), _IN_CHUNK))
    data = b"".join(_inflate(path, pieces, len(raw), max_ratio))
    return raw, _repair_utf8(path, blank_bom(data), gz=True)


class NotUtf8(ValueError):
    """Raised by :class:`TextStream` when the text holds invalid UTF-8 (read the file whole with
    :func:`read_maybe_gzip` instead: it repairs and reports it)."""


class TextStream:
    """A trace file's text as successive pieces, never held whole: read in chunks, gunzipped as a
    stream under the inflate cap (see the module doc), its UTF-8 checked as it goes, a leading
    byte order mark blanked (:func:`blank_bom`).

    Iterate once for the pieces (``bytes`` of at most about 1 MiB each). Afterwards ``sha256``
    (hex digest of the file's bytes, compressed as stored) and ``size`` (bytes of the file) are
    set; reading them drains what the consumer left unread.

    Args:
        path: The file (plain, or gzip by its magic bytes).
        max_ratio: The inflate cap: ``max_ratio`` x the file's size (at least 64 MiB).

    Raises:
        TraceFormatError: While iterating: the file cannot be read, the gzip stream is broken or
            truncated, or it inflates beyond the cap (naming the file and the byte offset).
        NotUtf8: While iterating: invalid UTF-8 in the text (nothing is repaired here).
    """

    def __init__(self, path: Path, max_ratio: float = DEFAULT_INFLATE_RATIO) -> None:
        self.path = path
        self.max_ratio = max_ratio
        self._hash = hashlib.sha256()
        self._size = 0
        self._it: Iterator[bytes] | None = None

    def __iter__(self) -> Iterator[bytes]:
        if self._it is None:
            self._it = self._pieces()
        return self._it

    def _raw(self, f: BinaryIO, chunk: int) -> Iterator[bytes]:
        hook = _ON_READ[1] if _ON_READ is not None and _ON_READ[0] == os.getpid() else None
        total = os.fstat(f.fileno()).st_size if hook else 0
        try:
            while block := f.read(chunk):
                self._hash.update(block)
                self._size += len(block)
                if hook is not None and (self._size % _OUT_CHUNK < chunk or self._size == total):
                    hook(self.path, self._size, total)
                yield block
        except OSError as e:
            raise TraceFormatError(self.path, "", f"cannot read file: {e.strerror or e}") from None

    def _pieces(self) -> Iterator[bytes]:
        try:
            f = self.path.open("rb")
        except OSError as e:
            raise TraceFormatError(self.path, "", f"cannot read file: {e.strerror or e}") from None
        with f:
            gz = f.read(2) == GZIP_MAGIC
            f.seek(0)
            size = os.fstat(f.fileno()).st_size
            text = (
                _inflate(self.path, self._raw(f, _IN_CHUNK), size, self.max_ratio)
                if gz
                else self._raw(f, _OUT_CHUNK)
            )
            text = _blank_bom_pieces(text)
            utf8 = codecs.getincrementaldecoder("utf-8")()
            for piece in text:
                if not (piece.isascii() and not utf8.getstate()[0]):
                    try:
                        utf8.decode(piece)
                    except UnicodeDecodeError:
                        raise NotUtf8(str(self.path)) from None
                yield piece
            try:
                utf8.decode(b"", final=True)
            except UnicodeDecodeError:
                raise NotUtf8(str(self.path)) from None

    def _drain(self) -> None:
        for _ in self:
            pass

    @property
    def sha256(self) -> str:
        """SHA-256 hex digest of the file's bytes (reads the rest of the file if needed)."""
        self._drain()
        return self._hash.hexdigest()

    @property
    def size(self) -> int:
        """Bytes in the file (reads the rest of the file if needed)."""
        self._drain()
        return self._size


def _over_cap(limit: int, max_ratio: float, size: int) -> str:
    """What a file inflated past: ``limit`` bytes, and which limit that is, ``max_ratio`` x its
    ``size`` bytes, or the floor :data:`MIN_INFLATE_BYTES` where that ratio allows less."""
    if limit > max_ratio * size:  # the floor applied
        return (
            f"inflates to more than {limit:,} bytes (the cap's floor; {max_ratio:g}x the {size:,}-byte "
            f"file is {int(max_ratio * size):,} bytes)"
        )
    return f"inflates to more than {limit:,} bytes ({max_ratio:g}x the {size:,}-byte file)"


def _inflate(path: Path, src: Iterable[bytes | memoryview], size: int, max_ratio: float) -> Iterator[bytes]:
    """Inflate every gzip member of the ``size``-byte file whose bytes ``src`` yields, under the cap
    (``max_ratio`` x ``size``, see the module doc); pieces of at most ``_OUT_CHUNK`` bytes.

    Raises:
        TraceFormatError: Broken or truncated gzip, data after the last member, or beyond the cap.
    """
    limit = max(int(min(max_ratio * size, 2**62)), MIN_INFLATE_BYTES)
    chunks = iter(src)
    total = 0
    at = 0  # offset in the file of buf[0]
    buf: bytes | memoryview = b""
    piece = b""
    d = _inflater.decompressobj(31)
    while True:
        if not buf:
            nxt = next(chunks, None)
            if nxt is None:
                break
            buf = nxt
        try:
            piece = d.decompress(buf, _OUT_CHUNK)
        except _INFLATE_ERROR as e:
            raise TraceFormatError(
                path, f"bytes {at}-{at + len(buf)}", f"broken gzip stream ({e}); re-copy the file"
            ) from None
        tail = d.unconsumed_tail
        total += len(piece)
        if total > limit:
            raise TraceFormatError(
                path,
                f"byte {at + len(buf) - len(tail)}",
                f"{_over_cap(limit, max_ratio, size)}: a gzip bomb "
                "or an unusually compressible trace; raise the cap with --max-inflate RATIO",
            )
        if piece:
            yield piece
        if not d.eof:
            at, buf = at + len(buf) - len(tail), tail
            continue
        # the input after the member: CPython's zlib leaves it in both unused_data and the tail
        # when the output cap stopped it at the member's end (feeding both doubled it), ISA-L in
        # unused_data only
        rest = bytes(d.unused_data) or bytes(tail)
        at, buf = at + len(buf) - len(rest), rest
        while len(buf) < 2 and (nxt := next(chunks, None)) is not None:
            buf = bytes(buf) + bytes(nxt)
        if buf[:2] == GZIP_MAGIC:  # another member (as pigz or cat write)
            d = _inflater.decompressobj(31)
            continue
        if bytes(buf).strip(b"\x00") or any(bytes(c).strip(b"\x00") for c in chunks):
            raise TraceFormatError(
                path, f"byte {at}", "data after the end of the gzip stream; re-copy the file"
            )
        return
    if piece:  # output was pending at the end of the input: drain it
        while not d.eof and (piece := d.decompress(b"", _OUT_CHUNK)):
            total += len(piece)
            if total > limit:
                raise TraceFormatError(
                    path,
                    f"byte {size}",
                    f"{_over_cap(limit, max_ratio, size)}; raise the cap with --max-inflate RATIO",
                )
            yield piece
        if d.eof:
            return
    raise TraceFormatError(
        path,
        f"byte {size}",
        f"broken gzip stream (truncated: the file ends after {size:,} bytes, {total:,} decompressed, "
        "before the end of the compressed data); re-copy the file",
    )


def _repair_utf8(path: Path, data: bytes, gz: bool) -> bytes:
    try:
        data.decode("utf-8")
        return data
    except UnicodeDecodeError as e:
        first = e.start
    text = data.decode("utf-8", "replace")
    count = text.count("\ufffd") - data.count("\ufffd".encode())
    reason = "invalid UTF-8 replaced by U+FFFD"
    where = f"byte {first}" + (" of the decompressed data" if gz else "")
    _repairs.setdefault(str(path), []).append(
        Repair(reason, count, f"{path}: {where}: {count} invalid UTF-8 sequence(s) replaced by U+FFFD")
    )
    return text.encode("utf-8")


#: Magic bytes of compressed formats traceprof does not inflate (gzip it does: here it means a gzip
#: inside the gzip, or a gzip member behind a plain prefix).
_COMPRESSED = (
    (GZIP_MAGIC, "gzip inside gzip"),
    (b"BZh", "bzip2"),
    (b"\xfd7zXZ\x00", "xz"),
    (b"\x28\xb5\x2f\xfd", "zstd"),
    (b"PK\x03\x04", "zip"),
    (b"7z\xbc\xaf\x27\x1c", "7z"),
)


def not_json_because(data: bytes) -> str | None:
    """Why text that fails to decode as JSON is no JSON at all, when its first bytes say it: still
    compressed (bzip2, xz, zstd, zip, 7z, or a gzip inside the gzip), with what to do; else None.
    ``data``: the file's text as traceprof read it (after gzip inflation, and maybe with invalid
    UTF-8 replaced by U+FFFD, as the reader repairs it: the magic is matched in both forms)."""
    for magic, what in _COMPRESSED:
        if data.startswith(magic) or data.startswith(magic.decode("utf-8", "replace").encode()):
            return (
                f"{what}-compressed, which traceprof does not read (it reads JSON, plain or gzip): "
                "decompress it first"
                if what != "gzip inside gzip"
                else "a gzip inside the gzip: gunzip it once, then ingest the result (a .json.gz)"
            )
    return None


def misnamed_gzip(path: Path) -> str:
    """``"; ..."`` saying the file is named ``.gz`` but holds no gzip (its first bytes are not
    the gzip magic ``1f 8b``), to add to a JSON error (a wrong name, or a damaged copy, where the
    JSON error alone points into the text); ``""`` otherwise, or when the file cannot be read."""
    if not path.name.lower().endswith(".gz"):
        return ""
    try:
        with path.open("rb") as f:
            gz = f.read(2) == GZIP_MAGIC
    except OSError:
        return ""
    return (
        ""
        if gz
        else "; the file is named .gz but is not gzip (no gzip magic bytes): a wrong name or a damaged copy"
    )


#: The output file name that means stdout (``report -o -``, ``export perfetto -o -``).
STDOUT = "-"


def output_name(path: str | Path) -> str:
    """How a message names an output path: ``stdout`` for :data:`STDOUT`, else the path."""
    return "stdout" if os.fspath(path) == STDOUT else os.fspath(path)


def check_not_store(out: str | Path, db: str | Path) -> None:
    """Refuse an output path that is the store, its WAL or lock file, or a file in its folders (the
    Parquet dataset ``<db>.parquet/``, kept results ``<db>.results/``), symlinks and hard links followed.

    Raises:
        UsageError: ``out`` resolves to the store or one of its sidecar files, or is a symlink loop.
        StoreError: ``db`` cannot be a store (:func:`traceprof.core.locking.check_store_path`).
    """
    check_store_path(db)  # a --db loop: StoreError (the store cannot be opened either)
    fd = _open_fd(out)  # -o - and -o /dev/stdout alike: the file the descriptor is open on
    try:
        target = (_fd_file(fd) if fd is not None else Path(out)).resolve()
    except RuntimeError:  # Path.resolve on a symlink loop (Python < 3.13)
        raise UsageError(f"{out}: a symlink loop; write the output elsewhere") from None
    store = Path(db).resolve()
    # a file with one name is no hard link to a file of the folders: their walk is skipped (an
    # existing report.html is overwritten every day; a dataset holds a file per trace)
    st = target.stat() if target.is_file() else None
    for folder in (beside(store, ".parquet"), beside(store, ".results")):
        inside = target == folder or folder in target.parents
        if not inside and st is not None and st.st_nlink > 1 and folder.is_dir():
            inside = any(f.is_file() and os.path.samestat(st, f.stat()) for f in folder.rglob("*"))
        if inside:
            raise UsageError(
                f"{output_name(out)}: would overwrite a file of the store {db} (in {folder.name}/); "
                "write the output elsewhere"
            )
    guarded = [store, beside(store, ".wal"), beside(store, ".lock")]
    for g in guarded:
        same = target == g
        if not same and target.exists() and g.exists():
            try:
                same = os.path.samefile(target, g)
            except OSError:
                same = False
        if same:
            raise UsageError(
                f"{output_name(out)}: would overwrite the store {db}{'' if g == store else ' (' + g.name + ')'}; "
                "write the output elsewhere"
            )


#: A DuckDB database file holds these bytes at this offset (after an 8-byte checksum).
DUCKDB_MAGIC, DUCKDB_MAGIC_AT = b"DUCK", 8


def is_duckdb(path: str | Path) -> bool:
    """Whether ``path`` is an existing file that starts like a DuckDB database."""
    try:
        with open(path, "rb") as f:
            head = f.read(DUCKDB_MAGIC_AT + len(DUCKDB_MAGIC))
    except OSError:
        return False
    return head[DUCKDB_MAGIC_AT:] == DUCKDB_MAGIC


#: Output paths that name a descriptor this process holds open (``/dev/fd/N``, ``/proc/self/fd/N``).
_FD_PATH = re.compile(r"/(?:dev|proc/self)/fd/(\d+)")


def _open_fd(path: str | Path) -> int | None:
    """The open file descriptor that output ``path`` names (:data:`STDOUT` and ``/dev/stdout``: 1,
    ``/dev/stderr``: 2, ``/dev/fd/N``: N), else None: the one test every check of an output and
    its write take, so ``-o -`` and ``-o /dev/stdout`` are one output."""
    name = os.fspath(path)
    fds = {STDOUT: 1, "/dev/stdout": 1, "/dev/stderr": 2}
    m = _FD_PATH.fullmatch(name)
    return fds.get(name) if m is None else int(m.group(1))


def _fd_file(fd: int) -> Path:
    """A path that opens what descriptor ``fd`` is open on (``/dev/fd/N``: on Linux a link to the
    file the shell opened, ``pipe:[n]`` for a pipe)."""
    return Path(f"/dev/fd/{fd}")


def _refuse_duckdb(path: str | Path) -> None:
    """Refuse an output that is an existing DuckDB database, named by its path or by a descriptor
    open on it (``-o - >> other.duckdb`` as ``-o /dev/stdout >> other.duckdb``).

    Raises:
        UsageError: It is one, named as :func:`output_name` names the output.
    """
    fd = _open_fd(path)
    file = _fd_file(fd) if fd is not None else Path(path)
    if file.is_file() and is_duckdb(file):
        raise UsageError(
            f"{output_name(path)}: is a DuckDB database (a traceprof store?); not overwriting it, write the "
            "output elsewhere"
        )


def write_output(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to an output file the user named, whole or not at all.

    The bytes go to a temporary file beside it (``.<name>.<random>.tmp``), which is renamed over the
    output once written and flushed to disk: a full disk or a Ctrl-C leaves the earlier file (or
    none), never a cut or empty one. An output that is a symlink is written where it points; one
    that exists and is not a regular file (a FIFO) is written directly, and :data:`STDOUT` (``-``)
    is stdout. ``-``, ``/dev/stdout``, ``/dev/stderr`` and ``/dev/fd/N`` are written through that
    open descriptor, as the shell opened it (``>> file`` appends; a rename replaced the file), with
    the same checks and errors as a path: ``-o -`` and ``-o /dev/stdout`` differ only in the name
    a message gives them (``stdout``, ``/dev/stdout``).

    Raises:
        UsageError: The folder does not exist (or takes no new files, or a file above it is in the
            way), the path is a directory, it cannot be written (a full disk: nothing is left
            behind), or it (or the file a descriptor is open on) is an existing DuckDB database (a
            store: never overwritten by a report or an export).
    """
    out = Path(path)
    _refuse_duckdb(path)
    held = _open_fd(path)
    name = output_name(path)
    target = out.resolve() if held is None and out.is_symlink() else out
    tmp: Path | None = None
    try:
        if held is not None:  # through the descriptor: a rename would replace the file the shell opened
            for stream in (sys.stdout, sys.stderr):
                stream.flush()
            with open(held, "wb", closefd=False) as f:
                f.write(data)
            return out
        if out.is_dir():
            raise IsADirectoryError
        # checked on the path as given: /dev/stdout on a pipe resolves to /proc/<pid>/fd/pipe:[n],
        # which is no file, while its stat follows the link to the pipe
        if special_kind(out):
            out.write_bytes(data)
            return out
        tmp = target.with_name(f".{target.name[:200]}.{os.urandom(4).hex()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
        with open(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
        tmp = None
    except IsADirectoryError:
        raise UsageError(f"{out}: is a directory; give a file name, e.g. {out / 'report.html'}") from None
    except (FileNotFoundError, NotADirectoryError) as e:
        raise UsageError(f"{out}: {_no_folder(target.parent, e)}") from None
    except BrokenPipeError:  # a pipe's reader gone (`-o /dev/stdout | head -c 10`): as in the CLI's main
        raise
    except OSError as e:
        raise UsageError(
            f"{name}: cannot write: {e.strerror or e}"
            + ("; nothing written (an earlier file there is kept)" if tmp is not None else "")
        ) from None
    finally:
        if tmp is not None:  # not created, or in a folder that is none (``/etc/hostname/x``)
            with contextlib.suppress(OSError):
                tmp.unlink()
    return out


def _no_folder(folder: Path, e: OSError) -> str:
    """Why an output in ``folder`` could not be created (``e``: FileNotFoundError or
    NotADirectoryError), naming the folder, never the temporary file: a path in it that is a file
    (``-o /etc/hostname/x.html``), a folder that does not exist, or one that exists and takes no
    new files (``-o /proc/version``: procfs answers ENOENT)."""
    for above in (folder, *folder.parents):
        with contextlib.suppress(OSError):
            if above.is_dir():
                if above == folder:
                    return f"cannot write: folder {folder} takes no new files ({e.strerror or e})"
                break
            if above.exists():
                return f"cannot write: {above} is a file, not a folder"
    return f"folder {folder} does not exist"
