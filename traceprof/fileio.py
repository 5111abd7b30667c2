"""Reading trace files: plain or gzipped bytes, with errors that name the file."""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

from traceprof.errors import TraceFormatError, UsageError

__all__ = ["read_maybe_gzip", "write_output"]


def read_maybe_gzip(path: Path) -> tuple[bytes, bytes]:
    """Read a file, gunzipping it when it starts with the gzip magic bytes.

    Returns:
        (the file's bytes, the decompressed bytes or the same bytes when not gzip).

    Raises:
        TraceFormatError: The file cannot be read, or the gzip stream is broken or truncated.
    """
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise TraceFormatError(path, "", f"cannot read file: {e.strerror or e}") from None
    if raw[:2] != b"\x1f\x8b":
        return raw, raw
    try:
        return raw, gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as e:
        raise TraceFormatError(path, "", f"broken gzip stream ({e}); re-copy the file") from None


def write_output(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to an output file the user named.

    Raises:
        UsageError: The folder does not exist, the path is a directory, or it cannot be written.
    """
    out = Path(path)
    try:
        out.write_bytes(data)
    except IsADirectoryError:
        raise UsageError(f"{out}: is a directory; give a file name, e.g. {out / 'report.html'}") from None
    except FileNotFoundError:
        raise UsageError(f"{out}: folder {out.parent} does not exist") from None
    except OSError as e:
        raise UsageError(f"{out}: cannot write: {e.strerror or e}") from None
    return out
