"""A restricted unpickler for Flight Recorder dumps: plain data only, never code.

torch writes its default Flight Recorder dump (``TORCH_FR_DUMP_TEMP_FILE`` +  rank) as a pickle
of plain containers. A pickle can name any importable callable (opcodes ``GLOBAL`` /
``STACK_GLOBAL`` / ``INST`` / ``OBJ``, then ``REDUCE`` calls it), so a plain ``pickle.load`` of a
file copied from a cluster runs whatever it says. This unpickler refuses every global and every
persistent id, so nothing can be called; it then checks that the result holds only ``dict``,
``list``, ``tuple``, ``str``, ``bytes``, ``int``, ``float``, ``bool`` and ``None`` (a protocol 4/5
pickle can also build sets and bytearrays without a global; those are refused too).
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

from traceprof.bounded import check_nesting
from traceprof.errors import TraceFormatError
from traceprof.fileio import GZIP_MAGIC

__all__ = ["loads_plain", "is_pickle", "maybe_pickle", "as_json"]

_PLAIN = (dict, list, tuple, str, bytes, int, float, bool, type(None))


def is_pickle(head: bytes) -> bool:
    """True when ``head`` starts like a pickle of protocol 2 or later (``0x80`` + protocol byte).
    Protocols 0 and 1 have no marker (their first opcode is text-like): callers that know a file
    by its name as a pickle dump try :func:`loads_plain` on anything that is not JSON or gzip
    (:func:`maybe_pickle`)."""
    return len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5


def maybe_pickle(head: bytes) -> bool:
    """True unless ``head`` starts like JSON (``{`` / ``[`` after blanks) or gzip: for a file whose
    name says it is a pickle dump, protocol 0/1 included."""
    return is_pickle(head) or not (head.lstrip()[:1] in (b"{", b"[") or head[:2] == GZIP_MAGIC or not head)


class _Refused(pickle.UnpicklingError):
    """The pickle asks for something other than plain data (raised before anything runs)."""


class _Restricted(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise _Refused(f"refers to {module}.{name}, not plain data")

    def persistent_load(self, pid: Any) -> Any:
        raise _Refused("uses a persistent id, not plain data")


def _check(obj: Any) -> None:
    """Raise ValueError naming the first value that is not plain data (``dump['entries'][3]``).
    Each distinct container is looked at once (the depth, cycles and expansion are bounded first,
    :func:`traceprof.bounded.check_nesting`)."""
    seen: set[int] = set()
    todo: list[tuple[Any, str]] = [(obj, "dump")]
    while todo:
        value, where = todo.pop()
        if not isinstance(value, _PLAIN):
            raise ValueError(f"{where}: a {type(value).__name__}, not plain data")
        if not isinstance(value, (dict, list, tuple)) or id(value) in seen:
            continue
        seen.add(id(value))
        if isinstance(value, dict):
            for k, v in value.items():
                todo += [(v, f"{where}[{k!r}]"), (k, f"{where} key")]
        else:
            todo += [(v, f"{where}[{i}]") for i, v in reversed(list(enumerate(value)))]


def loads_plain(path: Path, data: bytes) -> Any:
    """Unpickle ``data`` (the bytes of ``path``) admitting plain data only.

    Returns:
        The unpickled object (dicts, lists, tuples, str, bytes, int, float, bool, None).

    Raises:
        TraceFormatError: The pickle names a global (a class or function: it would run code), uses
            a persistent id, builds another type, nests deeper than :data:`traceprof.bounded.MAX_DEPTH`,
            holds itself, expands past :data:`traceprof.bounded.MAX_NODES` values through shared
            references (a 326-byte pickle can stand for 2**40), or is broken; nothing of it is executed.
    """
    try:
        obj = _Restricted(io.BytesIO(data)).load()
    except _Refused as e:
        raise TraceFormatError(path, "", f"pickle {e}; refused: traceprof unpickles plain data only "
                               "(a Flight Recorder dump holds nothing else)") from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError, KeyError, AttributeError,
            MemoryError, RecursionError, OverflowError) as e:
        why = str(e).removeprefix("pickle ") or type(e).__name__
        if isinstance(e, EOFError) or "truncated" in why:
            why = "cut short (pickle data was truncated): copy the whole file, or dump it again"
        raise TraceFormatError(path, "", f"broken pickle: {why}") from None
    check_nesting(obj, path, "pickle")  # before anything walks it as a tree
    try:
        _check(obj)
    except ValueError as e:
        raise TraceFormatError(path, "", f"pickle holds {e}; refused (plain data only)") from None
    return obj


def as_json(obj: Any) -> Any:
    """The value as the JSON dump writes it: tuples become lists, bytes are decoded as UTF-8
    (invalid bytes replaced), dict keys become strings."""
    if isinstance(obj, dict):
        return {(k if isinstance(k, str) else str(as_json(k))): as_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [as_json(v) for v in obj]
    if isinstance(obj, bytes):
        return obj.decode("utf-8", "replace")
    return obj
