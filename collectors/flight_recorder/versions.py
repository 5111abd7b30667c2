"""Flight Recorder dump versions: which fields number the entries, and what an empty dump says.

torch writes ``version`` as "major.minor" (minor: fields added; major: fields changed). The two
majors that exist number the ring buffer's entries differently:

- **2.x** (torch 2.4+; 2.10 in torch 2.13): ``collective_seq_id`` for collectives and
  ``p2p_seq_id`` for point-to-point ops, two counters per process group (``is_p2p`` says which
  applies), plus ``op_id`` for logical ops inside a coalesced group; ``pg_status`` per group
  (``last_enqueued/started/completed_collective``, -1 for none; JSON writes them as strings).
- **1.x** (torch 2.2-2.3): one ``seq_id`` per process group for every op, collectives and
  point-to-point alike, no ``is_p2p`` and no ``pg_status``.

The dialect is read from the entries' fields, so a dump with an unexpected ``version`` string is
still read when its fields are known (with a warning), and refused, naming its version, when its
entries carry neither numbering.
"""

from __future__ import annotations

from typing import Any

from traceprof.core.errors import TraceFormatError
from traceprof.core.limits import INT64, fits
from traceprof.core.values import checked_int, json_int

__all__ = ["dialect", "entry_seq", "progress_by_pg_id", "version_text", "READ_VERSIONS"]

#: What this parser reads, for messages.
READ_VERSIONS = "1.x (seq_id) and 2.x (collective_seq_id / p2p_seq_id; up to 2.10)"
_V2_FIELDS = ("collective_seq_id", "p2p_seq_id")
#: The newest minor of version 2 this parser knows (READ_VERSIONS' "up to 2.10").
_NEWEST_V2_MINOR = 10


def version_text(version: Any) -> tuple[Any, str | None]:
    """``version`` as torch writes it, a string, and what was said of it: a JSON number (``2.1``) is
    read as its text (``"2.1"``, said: a number drops a minor's trailing zero, 2.10 reads as 2.1);
    another value is left as it is (:func:`dialect` says it is unreadable)."""
    if isinstance(version, bool) or not isinstance(version, (int, float)):
        return version, None
    text = repr(version)
    return text, (
        f"Flight Recorder dump version is the JSON number {text}, not the string torch writes; read as "
        f"version {text!r} (a number loses a minor's trailing zero: 2.10 would read as 2.1)"
    )


def _major(version: Any) -> int | None:
    """The major number of a ``version`` such as ``"2.10"`` (None when not of that form)."""
    head = str(version).split(".", 1)[0] if version is not None else ""
    return int(head) if head.isdigit() else None


def _minor(version: Any) -> int | None:
    """The minor number of a ``version`` such as ``"2.10"`` (10; None when it has none)."""
    parts = str(version).split(".") if version is not None else []
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None


def dialect(path: Any, version: Any, entries: list[Any]) -> tuple[int, list[str]]:
    """Which numbering the entries use (2 or 1) and warnings about the version.

    Args:
        path: The dump, for messages.
        version: The dump's ``version`` field (any type; None when absent).
        entries: Its ``entries``.

    Returns:
        (2 or 1, warnings): 2 when any entry has ``collective_seq_id`` or ``p2p_seq_id``, else 1
        when any has ``seq_id``; 2 for a dump without entries. The warnings do not name the file:
        the parser keeps them in ``traces.meta.version_notes``, said once per run.

    Raises:
        TraceFormatError: Entries that carry none of these fields (the version is named).
    """
    dicts = [e for e in entries if isinstance(e, dict)]
    if not dicts:
        return 2, []
    if any(k in e for e in dicts for k in _V2_FIELDS):
        style = 2
    elif any("seq_id" in e for e in dicts):
        style = 1
    else:
        raise TraceFormatError(
            path,
            "entries",
            f"Flight Recorder dump version {version!r}: its entries carry "
            "neither 'collective_seq_id' / 'p2p_seq_id' nor 'seq_id', so its collectives "
            f"cannot be numbered; traceprof reads versions {READ_VERSIONS}",
        )
    major = _major(version)
    if major is None:
        return style, [
            f"Flight Recorder dump without a readable version ({version!r}); read as "
            f"version {style}.x by its fields"
        ]
    minor = _minor(version)
    if major > 2:  # a major changes what fields mean (module doc): what was assumed, said plainly
        return style, [
            f"Flight Recorder dump version {version}: major version {major} is unknown to traceprof "
            f"({READ_VERSIONS}); assumed its entries mean what version {style}.x's do, as their fields "
            f"({_fields(style)}) suggest: a major version changes fields, so check its collectives "
            "(sequence numbers, sizes) against torch's own reader (torch.distributed.flight_recorder)"
        ]
    if major == style == 2 and minor is not None and minor > _NEWEST_V2_MINOR:
        return style, [
            f"Flight Recorder dump version {version} is newer than the versions traceprof knows "
            f"({READ_VERSIONS}); read by its fields as version {style}.x"
        ]
    if major != style:
        return style, [
            f"Flight Recorder dump version {version} has the fields of version {style}.x; read by its fields"
        ]
    return style, []


def _fields(style: int) -> str:
    """The numbering fields of a dialect, for messages."""
    return " / ".join(_V2_FIELDS) if style == 2 else "seq_id"


def entry_seq(e: dict[str, Any], style: int, p2p: bool) -> tuple[int | None, str | None, str]:
    """The entry's sequence number in its family (``seq_id`` in 1.x, else ``p2p_seq_id`` or
    ``collective_seq_id``), or why there is none: (n, None, "") or (None, reason, detail), e.g.
    ``"missing 'seq_id'"`` or ``"'collective_seq_id' not an integer"`` with detail ``"'x'"``."""
    key = "seq_id" if style == 1 else ("p2p_seq_id" if p2p else "collective_seq_id")
    if e.get(key) is None:
        return None, f"missing '{key}'", f"version {style}.x numbers its entries there"
    n = e[key]
    # a record's number: a JSON integer only (traceprof.core.values.json_int); beyond int64: refused
    # by the row check (traceprof.core.limits), naming the column
    if json_int(n) is None:
        return None, f"'{key}' not an integer", repr(n)
    if n < 0:
        return None, f"negative '{key}'", repr(n)
    return n, None, ""


def progress_by_pg_id(pg_status: Any) -> dict[str, dict[str, int | None]]:
    """``pg_status`` as {pg_id: {enqueued, started, completed}} integers (-1: none; None when a
    value is not an integer or beyond int64). JSON dumps write the numbers as strings."""
    out: dict[str, dict[str, int | None]] = {}
    if isinstance(pg_status, dict):
        for pg_id, st in pg_status.items():
            if isinstance(st, dict):
                out[str(pg_id)] = {
                    k: v if fits(v := checked_int(st.get(f"last_{k}_collective"))[0], INT64) else None
                    for k in ("enqueued", "started", "completed")
                }  # beyond int64: unknown
    return out
