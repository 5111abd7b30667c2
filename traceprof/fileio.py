"""Reading trace files: plain or gzipped bytes, with errors that name the file."""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

from traceprof.errors import TraceFormatError

__all__ = ["read_maybe_gzip"]


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
