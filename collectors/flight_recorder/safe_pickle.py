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

from traceprof.core.bounded import check_nesting, max_nodes
from traceprof.core.errors import TraceFormatError
from traceprof.core.fileio import GZIP_MAGIC

__all__ = ["loads_plain", "is_pickle", "maybe_pickle", "as_json"]

_PLAIN = (dict, list, tuple, str, bytes, int, float, bool, type(None))
#: Largest integer kept (bits): beyond, Python cannot even print it (4300 digits) and a JSON dump
#: could not hold it either (msgspec refuses such a number); out-of-range fields are then rejected
#: per entry as for JSON.
_MAX_INT_BITS = 4096


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
    :func:`traceprof.core.bounded.check_nesting`)."""
    seen: set[int] = set()
    todo: list[tuple[Any, str]] = [(obj, "dump")]
    while todo:
        value, where = todo.pop()
        if not isinstance(value, _PLAIN):
            raise ValueError(f"{where}: a {type(value).__name__}, not plain data")
        if isinstance(value, int) and value.bit_length() > _MAX_INT_BITS:
            raise ValueError(f"{where}: an integer of {value.bit_length():,} bits, which no dump field holds")
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
            a persistent id, builds another type, holds an integer over 4096 bits, nests deeper than
            :data:`traceprof.core.bounded.MAX_DEPTH`, holds itself, expands past
            :func:`traceprof.core.bounded.max_nodes` values through shared references (a 326-byte pickle
            can stand for 2**40), or is broken; nothing of it is executed.
    """
    try:
        obj = _Restricted(io.BytesIO(data)).load()
    except _Refused as e:
        raise TraceFormatError(
            path,
            "",
            f"pickle {e}; refused: traceprof unpickles plain data only "
            "(a Flight Recorder dump holds nothing else)",
        ) from None
    except (
        pickle.UnpicklingError,
        EOFError,
        ValueError,
        TypeError,
        IndexError,
        KeyError,
        AttributeError,
        MemoryError,
        RecursionError,
        OverflowError,
    ) as e:
        why = str(e).removeprefix("pickle ") or type(e).__name__
        if isinstance(e, EOFError) or "truncated" in why:
            why = "cut short (pickle data was truncated): copy the whole file, or dump it again"
        raise TraceFormatError(path, "", f"broken pickle: {why}") from None
    check_nesting(obj, path, "pickle", max_nodes=max_nodes(len(data)))  # before anything walks it as a tree
    try:
        _check(obj)
    except ValueError as e:
        raise TraceFormatError(path, "", f"pickle holds {e}; refused (plain data only)") from None
    return obj


def as_json(obj: Any, _done: dict[int, Any] | None = None) -> Any:
    """The value as the JSON dump writes it: tuples become lists, bytes are decoded as UTF-8
    (invalid bytes replaced), dict keys become strings. A container the pickle shares is converted
    once and stays shared (call after :func:`loads_plain`, which refuses cycles)."""
    done = {} if _done is None else _done
    if isinstance(obj, (dict, list, tuple)) and id(obj) in done:
        return done[id(obj)]
    if isinstance(obj, dict):
        out: Any = {
            (k if isinstance(k, str) else str(as_json(k, done))): as_json(v, done) for k, v in obj.items()
        }
    elif isinstance(obj, (list, tuple)):
        out = [as_json(v, done) for v in obj]
    elif isinstance(obj, bytes):
        return obj.decode("utf-8", "replace")
    else:
        return obj
    done[id(obj)] = out
    return out
