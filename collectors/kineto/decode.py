"""Columnar decoding of Kineto JSON: the ``traceEvents`` array in batches, each field as one column.

The per-event Python work of a decoder that builds one object per event and converts its fields
one at a time dominated ingest (about 15 us an event, where a bare ``orjson.loads`` takes 2-4 us).
Here the work per event is a few list comprehensions over msgspec structs; the times and the
sizes of the raw args are converted a whole column at a time in C:

  1. Split the document into the top-level keys (decoded as one small object: everything but
     ``traceEvents``, which libkineto writes between ``distributedInfo`` and
     ``baseTimeNanoseconds``) and batches of whole events (cut at ``}`` + ``,`` between two events
     of the array; a cut is accepted only when the batch decodes as a JSON array, so a ``},``
     inside a string or a nested object is never taken for a boundary). Peak memory above the
     input is one batch of Python objects (``batch_bytes`` of JSON text) plus the columns.
  2. Decode each batch with msgspec into small typed structs: ``ph, cat, name`` as strings,
     ``pid, tid, ts, dur, args`` as raw JSON text (``msgspec.Raw``), and in a second typed pass the
     id args (``correlation``, ``External id``, ``device``, ``stream``) as integers.
  3. Times: the ``ts``/``dur`` texts of the batch are joined and cast to ``decimal128(38, 3)`` by
     Arrow; the decimal's unscaled integer *is* the time in ns, so microsecond text with up to
     3 decimals converts exactly (``traceprof.timeconv`` semantics). A value with more decimals,
     an exponent Arrow rejects, or a non-number sends that batch's times through
     ``timeconv.us_text_to_ns`` one at a time (half-to-even rounding, same results).
  4. ``pid``/``tid`` keep their text (a JSON string without its quotes); args are kept as their
     JSON text.

Anything the typed decode does not accept (an id that is not an integer, a non-string name) makes
:func:`decode` return None for the whole document, and the caller uses its general per-event path.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Annotated, Any, cast

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from collectors.kineto._values import Ints, int_or_none
from collectors.kineto.columns import codes
from traceprof import spill
from traceprof.spill import TextSpill
from traceprof.timeconv import us_text_to_ns

__all__ = ["Decoded", "decode", "Rows", "rows", "Ints", "Positions"]

#: JSON text per batch: bounds the Python objects alive at once (about 5x this in memory).
BATCH_BYTES = 2 << 20

_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_NO_TEXT = msgspec.Raw(b"")


class _Ev(msgspec.Struct, gc=False):
    ph: str = ""
    cat: str = ""
    name: str = ""
    pid: int | str | float | None = None
    tid: int | str | float | None = None
    ts: msgspec.Raw = _NO_TEXT
    dur: msgspec.Raw = _NO_TEXT
    args: msgspec.Raw = msgspec.Raw(b"{}")  # as the general decoder: absent args are "{}"


_Int64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]


class _Ids(msgspec.Struct, gc=False):
    correlation: _Int64 | None = None
    external_id: _Int64 | None = msgspec.field(default=None, name="External id")
    device: _Int64 | None = None
    stream: _Int64 | None = None


class _LooseIds(msgspec.Struct, gc=False):
    correlation: Any = None
    external_id: Any = msgspec.field(default=None, name="External id")
    device: Any = None
    stream: Any = None




_ID_COLS = ("correlation", "external_id", "device", "stream")
_EVENTS = msgspec.json.Decoder(list[_Ev])
_IDS = msgspec.json.Decoder(list[_Ids])  # of the args objects alone
_LOOSE_IDS = msgspec.json.Decoder(list[_LooseIds | None])
_ARRAY = msgspec.json.Decoder(list[msgspec.Raw])
_OBJECT = msgspec.json.Decoder(dict[str, Any])


@dataclass
class Decoded:
    """Every event of a Kineto document as columns (one entry per ``traceEvents`` element).

    Attributes:
        top: The document's other top-level keys (``baseTimeNanoseconds``, ``distributedInfo``,
            ``deviceProperties``, ``host_name``, ...), decoded.
        ph, cat, name: As written ("" when absent).
        pid, tid: The value's text: a JSON string without its quotes, a number as written, "" when
            absent or null.
        ts_ns, dur_ns: int64 ns as written (relative to ``baseTimeNanoseconds`` in new-style traces;
            no base added). ``ts_ok``/``dur_ok``: False where the field is absent (value 0 then).
        bad_time: Index -> reason for values that are not JSON numbers or do not fit in int64 ns
            (value 0 then).
        args: The ``args`` object's JSON text ("{}" when absent), an Arrow string column (one
            chunk per batch: no Python object per event).
        correlation, external_id, device, stream: Integer args (int64), missing when absent.
        lanes_plain: False when some pid/tid is a float (then ``str()`` of it differs from the text).
    """

    top: dict[str, Any]
    ph: list[str] = field(default_factory=list)
    cat: list[str] = field(default_factory=list)
    name: list[str] = field(default_factory=list)
    pid: list[str] = field(default_factory=list)
    tid: list[str] = field(default_factory=list)
    ts_ns: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    dur_ns: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    ts_ok: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    dur_ok: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    bad_time: dict[int, str] = field(default_factory=dict)
    args: pa.ChunkedArray = field(default_factory=lambda: pa.chunked_array([], pa.string()))
    correlation: Ints = field(default_factory=lambda: Ints.of([]))
    external_id: Ints = field(default_factory=lambda: Ints.of([]))
    device: Ints = field(default_factory=lambda: Ints.of([]))
    stream: Ints = field(default_factory=lambda: Ints.of([]))
    lanes_plain: bool = True

    def __len__(self) -> int:
        return len(self.ph)


class _Split:
    """The events of a document as JSON array texts, and its other top-level keys (module doc, step 1).

    Iterate over it for lists of decoded events, about ``batch_bytes`` of JSON each; once
    exhausted, ``top`` holds the other keys (some are written after the events). ``ok`` turns
    False when the document does not have the shape ``{..., "traceEvents": [...], ...}`` that this
    splitter understands (the caller then decodes it whole). The source is read as it is
    consumed: at most about ``2 * batch_bytes`` of its text is held.
    """

    def __init__(self, source: bytes | Iterable[bytes], batch_bytes: int) -> None:
        if isinstance(source, bytes | bytearray | memoryview):
            view = memoryview(source)
            step = max(batch_bytes, 1 << 16)
            self.chunks: Iterator[bytes] = (bytes(view[i : i + step]) for i in range(0, len(view), step))
        else:
            self.chunks = iter(source)
        self.batch_bytes = batch_bytes
        self.top: dict[str, Any] = {}
        self.ok = True

    def _more(self, buf: bytes) -> tuple[bytes, bool]:
        """``buf`` with the next chunk appended, and whether there was one."""
        try:
            return buf + next(self.chunks), True
        except StopIteration:
            return buf, False

    def __iter__(self) -> Iterator[list[_Ev]]:
        buf, more, m = b"", True, None
        while more and m is None:  # the header is small: search it as it grows
            buf, more = self._more(buf)
            m = _EVENTS_KEY.search(buf)
        if m is None:
            self.ok = False
            return
        head, buf = buf[: m.start()].rstrip(), buf[m.end() :]
        target = self.batch_bytes
        while True:
            while more and len(buf) <= 2 * target:
                buf, more = self._more(buf)
            if len(buf) <= 2 * target:
                break
            found = _cut(buf, target)
            if found is None:  # no event ends in the first ``target`` bytes: look further
                target *= 2
                continue
            cut, evs = found
            yield evs
            buf, target = buf[cut + 1 :], self.batch_bytes  # past the comma
        # The rest: the last events, "]", the keys after the array, "}". Decoded as an array, it
        # ends at the array's "]" and msgspec names the byte where the trailing keys start.
        rest = b"[" + buf
        del buf
        try:
            _ARRAY.decode(rest)
            self.ok = False  # the document ends with the array: not an object
            return
        except msgspec.DecodeError as e:
            end = _trailing_at(e)
        close = -1 if end is None else rest.rfind(b"]", 0, end + 1)  # msgspec may count the ","
        if close < 0:
            self.ok = False
            return
        yield _EVENTS.decode(rest[: close + 1])
        try:
            top = _OBJECT.decode(_join_object(head, rest[close + 1 :].lstrip()))
        except (msgspec.DecodeError, msgspec.ValidationError):
            self.ok = False
            return
        self.top = top
        self.ok = "traceEvents" not in top


def _cut(buf: bytes, target: int) -> tuple[int, list[_Ev]] | None:
    """Position of a "}" ending an event at or before ``target`` (the text up to it decodes as an
    array of whole events) and those events, or None when there is none.

    Raises:
        msgspec.ValidationError: The events do not fit the typed structs.
    """
    probe = target
    while True:
        c = buf.rfind(b"},", 0, probe)
        if c < 0:
            return None
        try:
            return c + 1, _EVENTS.decode(b"[" + buf[: c + 1] + b"]")
        except msgspec.ValidationError:
            raise
        except msgspec.DecodeError:
            probe = c


_TRAILING = re.compile(r"trailing characters \(byte (\d+)\)")


def _trailing_at(e: msgspec.DecodeError) -> int | None:
    m = _TRAILING.search(str(e))
    return int(m.group(1)) if m else None


def _join_object(head: bytes, tail: bytes) -> bytes:
    """``{a, "traceEvents": [...], b}`` without its array: ``{a, b}`` (either side may be empty)."""
    head = head[:-1] if head.endswith(b",") else head  # "{...," before the key
    tail = tail[1:].lstrip() if tail.startswith(b",") else tail  # ", ...}" after the array
    sep = b"," if head.strip() != b"{" and tail.strip() != b"}" else b""
    return head + sep + tail


def _lane_text(values: list[int | str | float | None], out: Decoded, same: dict[str, str]) -> list[str]:
    """pid/tid as text (``str(value)``, "" for null), as the general path; few distinct values,
    each converted once and kept once (``same``: a str made per batch would outlive the batch's
    transient objects and pin their memory). A float clears ``out.lanes_plain``."""
    distinct = set(values)
    if any(isinstance(v, float) for v in distinct):
        out.lanes_plain = False
    text = {}
    for v in distinct:
        t = "" if v is None else str(v)
        text[v] = same.setdefault(t, t)
    return [text[v] for v in values]


def _times(raw: list[msgspec.Raw], base: int, bad: dict[int, str]) -> tuple[np.ndarray, np.ndarray]:
    """ns of microsecond number texts (module doc, step 3); (values, present)."""
    n = len(raw)
    text = pc.list_flatten(pc.split_pattern(pa.array([b"\n".join(raw)], pa.binary()).cast(pa.string()), "\n"))
    present = pc.not_equal(text, "")
    ok = present.to_numpy(zero_copy_only=False)
    try:
        dec = pc.cast(pc.if_else(present, text, pa.scalar(None, pa.string())), pa.decimal128(38, 3))
        words = np.frombuffer(dec.buffers()[1], np.int64)[2 * dec.offset : 2 * (dec.offset + n)]
        lo, hi = words[0::2], words[1::2]
        beyond = ok & (hi != (lo >> 63))  # the 128-bit value does not fit in int64
        for i in np.flatnonzero(beyond).tolist():  # the general path rejects these per event
            bad[base + i] = "beyond int64"
        return np.where(ok & ~beyond, lo, 0), ok
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        out = np.zeros(n, np.int64)
        for i, r in enumerate(raw):
            if r:
                try:
                    v = us_text_to_ns(bytes(r))
                except ValueError as e:
                    bad[base + i] = f"bad time: {e}"
                    continue
                if -(2**63) <= v < 2**63:
                    out[i] = v
                else:
                    bad[base + i] = "beyond int64"
        return out, ok


def _text_column(raw: list[msgspec.Raw]) -> pa.Array:
    """The JSON texts as an Arrow string array, built from their lengths and joined bytes (no Python
    string per value). The text is UTF-8: ``traceprof.fileio`` checked it (or repaired it)."""
    offsets = np.zeros(len(raw) + 1, np.int64)
    np.cumsum(np.fromiter(map(len, raw), np.int64, len(raw)), out=offsets[1:])
    return pa.StringArray.from_buffers(len(raw), pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(b"".join(raw)))


def decode(data: bytes | Iterable[bytes], batch_bytes: int = BATCH_BYTES) -> Decoded | None:
    """Decode a whole Kineto document into columns (module doc).

    Args:
        data: The document (decompressed JSON text), whole or as successive pieces (e.g. from a
            streaming gunzip: then only about ``2 * batch_bytes`` of the text is held at once).
        batch_bytes: JSON text decoded at once.

    Returns:
        The columns, or None when the document needs the general decoder: it does not have the
        shape ``{..., "traceEvents": [...]}``, is not valid JSON, or some event does not fit the
        typed structs (an id arg that is not an integer, a ``name`` that is not a string).
    """
    try:
        return _decode(data, batch_bytes)
    except RecursionError:  # nested too deeply for msgspec: the general decoder reports it
        return None


def _decode(data: bytes | Iterable[bytes], batch_bytes: int) -> Decoded | None:
    batches = _Split(data, batch_bytes)
    out = Decoded(top={})
    ts_parts, dur_parts, tsok_parts, durok_parts = [], [], [], []
    same: dict[str, str] = {}
    args = TextSpill()  # on disk when large (traceprof.spill)
    id_parts: dict[str, list[Ints]] = {col: [] for col in _ID_COLS}
    try:
        for evs in batches:
            base = len(out.ph)
            # one str object per distinct value (names repeat: millions of events, thousands of names)
            out.ph += [same.setdefault(e.ph, e.ph) for e in evs]
            out.cat += [same.setdefault(e.cat, e.cat) for e in evs]
            out.name += [same.setdefault(e.name, e.name) for e in evs]
            out.pid += _lane_text([e.pid for e in evs], out, same)
            out.tid += _lane_text([e.tid for e in evs], out, same)
            t, tok = _times([e.ts for e in evs], base, out.bad_time)
            d, dok = _times([e.dur for e in evs], base, out.bad_time)
            ts_parts.append(t)
            tsok_parts.append(tok)
            dur_parts.append(d)
            durok_parts.append(dok)
            raw_args = [e.args for e in evs]
            del evs
            args.add(_text_column(raw_args))
            ids_text = b"[" + b",".join(raw_args) + b"]"
            del raw_args
            try:
                ids = _IDS.decode(ids_text)
                for col, values in zip(_ID_COLS, ([a.correlation for a in ids], [a.external_id for a in ids],
                                                  [a.device for a in ids], [a.stream for a in ids]), strict=True):
                    id_parts[col].append(Ints.of(values))
            except msgspec.ValidationError:  # e.g. "stream": "0x0" (ROCm): coerce as the general path
                loose = _LOOSE_IDS.decode(ids_text)
                for col in _ID_COLS:  # an id beyond int64 (OverflowError): the general path rejects it
                    id_parts[col].append(Ints.of([int_or_none(getattr(a, col), keep_large=True) if a else None
                                                  for a in loose]))
    except (msgspec.DecodeError, msgspec.ValidationError, OverflowError):
        return None
    if not batches.ok:
        return None
    out.top = batches.top
    out.args = args.finish()
    # one column at a time, its batch parts dropped as soon as it is whole: all parts and all whole
    # columns at once were 2 GB of an 18 M-event trace, and the parts' pages stayed with the C heap
    for col in _ID_COLS:
        setattr(out, col, Ints.concat(id_parts.pop(col)))
    if ts_parts:
        for name, parts in (("ts_ns", ts_parts), ("dur_ns", dur_parts), ("ts_ok", tsok_parts), ("dur_ok", durok_parts)):
            setattr(out, name, np.concatenate(parts))
            parts.clear()
    spill.trim()  # the batches' transients (Arrow's scratch space of the time casts, the parts)
    return out


@dataclass
class Rows:
    """The stored rows of a document, as the general per-event loop of ``collectors.kineto.parse``
    builds them (see :func:`rows`).

    Attributes:
        cols: Column name -> column, one entry per kept event (the parser's columns, see
            ``collectors.kineto.parse``): kind, cat, name, pid, tid and flag (None) as lists;
            ts_ns and dur_ns (epoch ns: the base added) as int64 arrays; device, stream,
            correlation, external_id and raw_dur_ns (missing) as :class:`Ints`; args as an Arrow
            string column (JSON text).
        src_index: Index in ``traceEvents`` of each kept row (a :class:`Positions`).
        skipped: Records not stored by design (flows, metadata), counted by reason.
        rejected: Records dropped, counted by reason (unknown phases).
        process_names: pid -> the ``process_name`` metadata's name.
    """

    cols: dict[str, Any]
    src_index: list[int]
    skipped: dict[str, int]
    rejected: dict[str, int]
    process_names: dict[str, str]


def rows(d: Decoded, base_ns: int, kind_of: Callable[[str, str, str], str | None],
         gpu_kinds: frozenset[str], args_dict: Callable[[str], dict[str, Any]]) -> Rows | None:
    """The rows the general loop would store, built a column at a time (the common case only).

    Args:
        d: The decoded document.
        base_ns: Added to every time (``baseTimeNanoseconds``, or 0).
        kind_of: Event kind of (ph, cat, name): None for records not stored (flows, metadata,
            unknown phases), ``"end"`` for an ``E``; called once per distinct triple.
        gpu_kinds: Kinds whose device/stream default to pid/tid.
        args_dict: Decodes an args text (for ``process_name`` metadata).

    Returns:
        The rows, or None when the general loop is needed: ``B``/``E`` records, an event with a
        missing, malformed or negative time, a missing ``dur`` on an ``X`` event, or a float
        pid/tid (kept by the general loop as written).
    """
    n = len(d)
    cache: dict[tuple[str, str, str], str | None] = {}
    kinds = []
    for key in zip(d.ph, d.cat, d.name, strict=True):
        k = cache.get(key, _UNSEEN)
        if k is _UNSEEN:
            k = cache[key] = kind_of(*key)
        kinds.append(k)
    if "end" in cache.values() or d.bad_time or not d.lanes_plain or any(k[0] == "B" for k in cache):
        return None
    keep = np.fromiter((k is not None for k in kinds), bool, n)
    x_rows = np.fromiter((p == "X" for p in d.ph), bool, n)
    if (keep & ~d.ts_ok).any() or (keep & x_rows & ~d.dur_ok).any() or (keep & (d.dur_ns < 0)).any():
        return None
    if base_ns and (keep & ((d.ts_ns > 2**63 - 1 - base_ns) | (d.ts_ns < -(2**63) - base_ns))).any():
        return None  # epoch ns beyond int64: the general path rejects them per event
    keep_ix = np.flatnonzero(keep)
    kept = len(keep_ix)
    skipped: dict[str, int] = {}
    rejected: dict[str, int] = {}
    names: dict[str, str] = {}
    for i in np.flatnonzero(~keep).tolist():
        ph = d.ph[i]
        if ph == "M" and d.name[i] == "process_name":
            names[d.pid[i]] = str(args_dict(d.args[i].as_py()).get("name", ""))
        design = {"s": "flow", "f": "flow", "t": "flow", "M": "metadata"}.get(ph)
        if design:
            skipped[design] = skipped.get(design, 0) + 1
        else:
            reason = f"unknown phase ph={ph!r}"
            rejected[reason] = rejected.get(reason, 0) + 1

    def take(col: list[Any]) -> list[Any]:
        return col if kept == n else [col[i] for i in keep_ix.tolist()]

    # Each decoded list is dropped from ``d`` once taken (``d`` is not read again, bar ``len``), so
    # when rows are dropped a column is held about once, not twice.
    kind = take(kinds)
    del kinds
    gpu = np.fromiter((k in gpu_kinds for k in kind), bool, len(kind))
    pid = take(d.pid)
    d.pid = []
    tid = take(d.tid)
    d.tid = []
    device, stream = _lane_ids(d.device.take(keep_ix), pid, gpu), _lane_ids(d.stream.take(keep_ix), tid, gpu)
    if device is None or stream is None:
        return None
    cat = take(d.cat)
    d.cat = []
    name = take(d.name)
    d.name = []
    cols = {
        "kind": kind, "cat": cat, "name": name,
        "ts_ns": d.ts_ns[keep_ix] + base_ns, "dur_ns": np.where(d.dur_ok, d.dur_ns, 0)[keep_ix],
        "pid": pid, "tid": tid, "device": device, "stream": stream,
        "correlation": d.correlation.take(keep_ix), "external_id": d.external_id.take(keep_ix),
        "args": d.args if kept == n else _filter_chunks(d, keep),
        "flag": [None] * kept, "raw_dur_ns": Ints.missing(kept),
    }
    # Positions does what the parser's checks do with a list (traceprof.limits, checks.flag_records)
    return Rows(cols, cast(list[int], Positions(keep_ix)), skipped, rejected, names)


def _filter_chunks(d: Decoded, keep: np.ndarray) -> pa.ChunkedArray:
    """``d.args`` without the rows ``keep`` is False for, a chunk at a time: each chunk is dropped
    from ``d`` once filtered, so the args text is held about once, not twice (and a large column
    is written to disk again, ``traceprof.spill``)."""
    chunks, d.args = list(d.args.chunks), pa.chunked_array([], pa.string())

    def each() -> Iterator[pa.Array]:
        for i, chunk in enumerate(chunks):
            chunks[i] = None  # type: ignore[call-overload]
            yield chunk

    out, at = TextSpill(), 0
    for chunk in spill.scan(each()):
        out.add(chunk.filter(pa.array(keep[at : at + len(chunk)])))
        at += len(chunk)
    return out.finish()


class Positions:
    """Each row's index in ``traceEvents`` as an int64 array, with the list operations the parser's
    checks use (``len``, ``[i]``, iteration, ``[:] = ...``, ``np.asarray``): a Python list of
    millions of ints costs 36 bytes a row, the array 8.

    Args:
        values: The indices, ascending.
    """

    def __init__(self, values: np.ndarray) -> None:
        self.values = np.asarray(values, np.int64)

    def __len__(self) -> int:
        return len(self.values)

    def __getitem__(self, i: int) -> int:
        return int(self.values[i])

    def __iter__(self) -> Iterator[int]:
        return iter(self.values.tolist())

    def __setitem__(self, s: slice, items: Iterable[int]) -> None:
        if s != slice(None):
            raise TypeError("Positions supports [:] = ... only")
        self.values = np.fromiter(items, np.int64)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return self.values if dtype is None else self.values.astype(dtype)


_UNSEEN = object()


def _lane_ids(own: Ints, lane: list[str], gpu: np.ndarray) -> Ints | None:
    """GPU rows' device (stream): the arg, else the pid (tid) text as an integer; None elsewhere.
    None when some lane text gives an integer beyond int64 (the general path rejects the event)."""
    code, distinct = codes(lane)
    as_int = [int_or_none(t) for t in distinct]
    if any(v is not None and not -(2**63) <= v < 2**63 for v in as_int):
        return None
    from_lane = Ints.of(as_int).take(code)
    values = np.where(own.ok, own.values, from_lane.values)
    return Ints(values, gpu & (own.ok | from_lane.ok))
