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
     ``pid, tid`` as their JSON values, ``ts, dur, args`` as raw JSON text (``msgspec.Raw``; the
     times as numbers where that is exact, step 3), and in a second typed pass the
     id args (``correlation``, ``External id``, ``device``, ``stream``) as integers.
  3. Times: msgspec reads a batch's ``ts``/``dur`` as numbers where that is exact: JSON integers
     (old-style epoch microseconds) times 1000; else binary floats below 2**36 us (new-style, after
     the base) within 0.25 ns of a whole ns, rounded to it (the float's error is under 0.01 ns, so
     that is the text's value, or its nearest ns past 3 decimals). Any other batch (a value off a
     whole ns or larger, a negative float ``dur``, a string, a null) keeps the texts, which are
     joined and cast to ``decimal128(38, 3)`` by Arrow; the decimal's unscaled integer *is* the
     time in ns, so microsecond text with up to 3 decimals converts exactly
     (``traceprof.core.timeconv`` semantics). A value with more decimals, an exponent Arrow
     rejects, or a non-number sends that batch's times through ``timeconv.us_text_to_ns`` one at
     a time (half-to-even rounding, same results). Reading the numbers rather than the texts:
     ``hta/df_index_resolver`` (54 MB, integers) decodes in 0.33-0.35 s of CPU instead of 0.38-0.41
     (best of 5 in one process, load 20-25).
  4. ``pid``/``tid`` keep their text (a JSON string without its quotes); args are kept as their
     JSON text (with ``stored``, only for the events whose phase may be stored: flows' and
     metadata's texts would be copied only to be dropped).
  5. The five string fields are coded (:class:`Strs`) through one dictionary lookup of the event's
     (ph, cat, name, pid, tid) combination (:class:`_Combos`).

Anything the typed decode does not accept (an id that is not an integer, a non-string name) makes
:func:`decode` return None for the whole document, and the caller uses its general per-event path.
"""

from __future__ import annotations

import bisect
import operator
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from itertools import compress
from typing import Annotated, Any, cast

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from traceprof.collectors.kineto._values import Ints, Strs, code_type, int_or_none
from traceprof.collectors.kineto.nonfinite import WORD, NumberWords, Where, not_a_number, null_words, word_at
from traceprof.core import spill
from traceprof.core.spill import TextSpill
from traceprof.core.timeconv import TimeOutOfRange, us_text_to_ns
from traceprof.core.values import integer

__all__ = ["Decoded", "decode", "Rows", "rows", "Ints", "Positions"]

#: JSON text per batch: bounds the Python objects alive at once (about 5x this in memory). 1 MiB
#: rather than 2: the ingest of ``hta/df_index_resolver`` (54 MB) peaks 8 MiB lower (227 against
#: 235 MiB, median of 5 pairs) for the same CPU.
BATCH_BYTES = 1 << 20
#: JSON's whitespace, each as a one-byte bytes (``bytes.isspace`` also takes \x0b and \x0c).
_JSON_SPACE = frozenset((b" ", b"\t", b"\n", b"\r"))

_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_SPACE_RUN = re.compile(rb"[ \t\n\r]*")
_NO_TEXT = msgspec.Raw(b"")


class _Head(msgspec.Struct, gc=False):
    """The fields every event struct reads alike. Each struct lists its fields in libkineto's order
    of the keys (ph, cat, name, pid, tid, ts, dur, args): msgspec looks a key up at the field after
    the last one found first."""

    ph: str = ""
    cat: str = ""
    name: str = ""


class _Lanes(_Head, gc=False):
    """:class:`_Head` with the common types of ``pid`` and ``tid``."""

    pid: int | str | None = None
    tid: int | str | None = None


class _Ev(_Lanes, gc=False):
    """An event with its times' texts; absent args are "{}", as the general decoder's."""

    ts: msgspec.Raw = _NO_TEXT
    dur: msgspec.Raw = _NO_TEXT
    args: msgspec.Raw = msgspec.Raw(b"{}")


class _FloatLaneEv(_Head, gc=False):
    """:class:`_Ev` whose ``pid`` or ``tid`` may be a float (rare: then ``str()`` of it differs from
    its text, and the general path keeps it as written)."""

    pid: int | str | float | None = None
    tid: int | str | float | None = None
    ts: msgspec.Raw = _NO_TEXT
    dur: msgspec.Raw = _NO_TEXT
    args: msgspec.Raw = msgspec.Raw(b"{}")


class _FloatLanes(list[Any]):
    """A batch decoded as :class:`_FloatLaneEv` (some pid/tid is a float)."""


#: An absent id arg, in :class:`_Ids`: int64's least value, which the typed decode refuses as a
#: value (a batch holding it takes the loose decode), so a column of ids is read by ``np.fromiter``.
#: Likewise an absent ``ts``/``dur`` in :class:`_IntTimeEv`.
_ABSENT = -(2**63)
_Int64 = Annotated[int, msgspec.Meta(ge=_ABSENT + 1, le=2**63 - 1)]
_NAN = float("nan")  # an absent ``ts``/``dur`` in :class:`_FloatTimeEv` (JSON has no NaN)


class _IntTimeEv(_Lanes, gc=False):
    """:class:`_Ev` whose ``ts``/``dur`` are JSON integers (old-style traces: epoch microseconds)."""

    ts: _Int64 = _ABSENT
    dur: _Int64 = _ABSENT
    args: msgspec.Raw = msgspec.Raw(b"{}")


class _FloatTimeEv(_Lanes, gc=False):
    """:class:`_Ev` whose ``ts``/``dur`` are JSON numbers read as binary floats (new-style traces:
    microseconds with 3 decimals after the base); :func:`_float_ns` keeps them only where exact."""

    ts: float = _NAN
    dur: float = _NAN
    args: msgspec.Raw = msgspec.Raw(b"{}")


class _Timed(list[Any]):
    """A batch whose ``ts``/``dur`` msgspec read as numbers, converted to ns here (module doc, step 3):
    ``ns[col]`` is (int64 ns, present) of each event."""

    ns: dict[str, tuple[np.ndarray, np.ndarray]]


class _Ids(msgspec.Struct, gc=False):
    correlation: _Int64 | None = _ABSENT
    external_id: _Int64 | None = msgspec.field(default=_ABSENT, name="External id")
    device: _Int64 | None = _ABSENT
    stream: _Int64 | None = _ABSENT


class _LooseIds(msgspec.Struct, gc=False):
    correlation: Any = None
    external_id: Any = msgspec.field(default=None, name="External id")
    device: Any = None
    stream: Any = None


_ID_COLS = ("correlation", "external_id", "device", "stream")
_LANE_COLS = frozenset({"device", "stream"})  # read on GPU rows only
_ID_GETS = {c: operator.attrgetter(c) for c in _ID_COLS}  # map() of these: 15% less than getattr()
_EVENTS = msgspec.json.Decoder(list[_Ev])
_INT_TIME_EVENTS = msgspec.json.Decoder(list[_IntTimeEv])
_FLOAT_TIME_EVENTS = msgspec.json.Decoder(list[_FloatTimeEv])
_FLOAT_LANE_EVENTS = msgspec.json.Decoder(list[_FloatLaneEv])
_IDS = msgspec.json.Decoder(list[_Ids])  # of the args objects alone
_LOOSE_IDS = msgspec.json.Decoder(list[_LooseIds | None])
_ARRAY = msgspec.json.Decoder(list[msgspec.Raw])
_OBJECT = msgspec.json.Decoder(dict[str, Any])
_I64 = np.iinfo(np.int64)


def _no_strs() -> Strs:
    return Strs(np.zeros(0, np.int32), [])


@dataclass
class Decoded:
    """Every event of a Kineto document as columns (one entry per ``traceEvents`` element).

    Attributes:
        top: The document's other top-level keys (``baseTimeNanoseconds``, ``distributedInfo``,
            ``deviceProperties``, ``host_name``, ...), decoded.
        ph, cat, name: As written ("" when absent), as :class:`Strs` (codes into the distinct strings).
        pid, tid: The value's text: a JSON string without its quotes, a number as written, "" when
            absent or null (:class:`Strs`).
        ts_ns, dur_ns: int64 ns as written (relative to ``baseTimeNanoseconds`` in new-style traces;
            no base added). ``ts_ok``/``dur_ok``: False where the field is absent (value 0 then).
        bad_time: Index -> reason for values that are not JSON numbers or do not fit in int64 ns
            (value 0 then).
        negative_dur: Index -> the text of a ``dur`` below 0 (the general loop's message quotes it).
        args: The ``args`` object's JSON text ("{}" when absent), an Arrow string column (one
            chunk per batch: no Python object per event); of the rows ``args_rows`` marks only,
            when it is set.
        args_rows: None (``args`` has a text per event), or whether each event's text is in ``args``:
            :func:`decode`'s ``stored`` left out the texts of the events whose phase is never
            stored (flows, metadata), so that they are not copied again to be dropped. Their
            times and id args are not read either: 0 / absent, and no ``bad_time``,
            ``negative_dur`` or ``loose_ids`` entry.
        meta_args: With ``args_rows``: the args text of each ``process_name`` / ``thread_name``
            metadata event, by index (:func:`rows` reads their names).
        correlation, external_id, device, stream: Integer args (int64), missing when absent.
        lanes_plain: False when some pid/tid is a float (then ``str()`` of it differs from the text).
        loose_ids: (index, column, value) of each id arg written as a string or a float that is
            an integer (``"stream": "0x0"``): read as that integer, and said (``IdRepairs``).
        spill_dir: Where large args text spills (``ParseOptions.spill_dir``; None: the temporary folder).
    """

    top: dict[str, Any]
    ph: Strs = field(default_factory=_no_strs)
    cat: Strs = field(default_factory=_no_strs)
    name: Strs = field(default_factory=_no_strs)
    pid: Strs = field(default_factory=_no_strs)
    tid: Strs = field(default_factory=_no_strs)
    ts_ns: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    dur_ns: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    ts_ok: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    dur_ok: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    bad_time: dict[int, str] = field(default_factory=dict)
    negative_dur: dict[int, str] = field(default_factory=dict)
    args: pa.ChunkedArray = field(default_factory=lambda: pa.chunked_array([], pa.string()))
    correlation: Ints = field(default_factory=lambda: Ints.of([]))
    external_id: Ints = field(default_factory=lambda: Ints.of([]))
    device: Ints = field(default_factory=lambda: Ints.of([]))
    stream: Ints = field(default_factory=lambda: Ints.of([]))
    lanes_plain: bool = True
    spill_dir: str | None = None
    loose_ids: list[tuple[int, str, Any]] = field(default_factory=list)
    args_rows: np.ndarray | None = None
    meta_args: dict[int, str] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.ph)


class _Split:
    """The events of a document as JSON array texts, and its other top-level keys (module doc, step 1).

    Iterate over it for lists of decoded events, about ``batch_bytes`` of JSON each; once
    exhausted, ``top`` holds the other keys (some are written after the events). ``ok`` turns
    False when the document does not have the shape ``{..., "traceEvents": [...], ...}`` that this
    splitter understands (the caller then decodes it whole). The source is read as it is
    consumed: at most about ``2 * batch_bytes`` of its text is held.

    With ``words`` (``--skip-bad-events``), each number word (``NaN``, ``-inf``: module
    ``traceprof.collectors.kineto.nonfinite``) that stops a batch's decode is read as ``null``, with
    the rest of the words of the text held (one scan); ``words`` counts them and locates the first
    few (byte in the text, event index). A word that is no number raises ``nonfinite.NotANumber``.
    """

    def __init__(
        self, source: bytes | Iterable[bytes], batch_bytes: int, words: NumberWords | None = None
    ) -> None:
        if isinstance(source, bytes | bytearray | memoryview):
            view = memoryview(source)
            step = max(batch_bytes, 1 << 16)
            self.chunks: Iterator[bytes] = (bytes(view[i : i + step]) for i in range(0, len(view), step))
        else:
            self.chunks = iter(source)
        self.batch_bytes = batch_bytes
        self.top: dict[str, Any] = {}
        self.ok = True
        self.words = words
        self.at = 0  # offset in the text of the held text's first byte
        self.grown: list[tuple[int, int]] = []  # (position in the held text, bytes added) of each word nulled
        # (position in the held text, its record) of each word nulled whose event is not known yet
        self.unlocated: list[tuple[int, Where]] = []
        self.events = 0  # events yielded so far
        self.numbers = _Numbers()  # times read as numbers where exact (:class:`_Timed`)

    def _fill(self, buf: bytes | memoryview, size: int) -> tuple[bytes, bool]:
        """``buf`` with the next chunks appended until it holds more than ``size`` bytes, joined
        once (appending chunk by chunk copied the text again for each one: quadratic in a long run
        without an event boundary, as in a gzip bomb), and whether the source has more."""
        parts, n = [buf], len(buf)
        while n <= size:
            chunk = next(self.chunks, None)
            if chunk is None:
                return b"".join(parts), False
            parts.append(chunk)
            n += len(chunk)
        return b"".join(parts), True

    def _header(self) -> tuple[bytes, bytes, bool] | None:
        """(the text before ``"traceEvents": [``, the text after it, whether the source has more),
        or None when the source ends first. Each search starts where a match can still begin
        (the last ``"traceEvents"`` seen, else near the end), so a long header costs one pass."""
        buf, start = bytearray(), 0
        while True:
            chunk = next(self.chunks, None)
            if chunk is None:
                return None
            buf += chunk  # amortized: a bytearray grows in place
            m = _EVENTS_KEY.search(buf, start)
            if m is not None:
                self.at = m.end()
                return bytes(buf[: m.start()]).rstrip(), bytes(buf[m.end() :]), True
            seen = buf.rfind(b'"traceEvents"', start)
            start = seen if seen >= 0 else max(0, len(buf) - len(b'"traceEvents"'))

    def __iter__(self) -> Iterator[list[_Ev]]:
        found_key = self._header()
        if found_key is None:
            self.ok = False
            return
        head, buf, more = found_key
        target = self.batch_bytes
        while True:
            if buf[:1] in _JSON_SPACE:  # between two events: a long run of it would otherwise be held whole
                self._drop(len(buf) - len(stripped := buf.lstrip(b" \t\n\r")))
                buf, target = stripped, self.batch_bytes
                del stripped
            if more and len(buf) <= 2 * target:
                buf, more = self._fill(buf, 2 * target)
            if len(buf) <= 2 * target:
                break
            try:
                found = _cut(buf, target, self.words is not None, self.numbers)
            except _Word as w:  # --skip-bad-events: read as null, then cut again
                buf = self._null(buf, w.at, w.end)
                continue
            if found is None:  # no event ends in the first ``target`` bytes: look further
                target *= 2
                continue
            cut, evs = found
            self._locate(buf, cut, len(evs))
            yield evs
            # past the comma and the whitespace after it; the rest is copied once, joined to what follows
            space = _SPACE_RUN.match(buf, cut + 1)
            self._drop(space.end() if space else cut + 1)
            after, target = memoryview(buf)[space.end() if space else cut + 1 :], self.batch_bytes
            buf, more = self._fill(after, 2 * target) if more else (bytes(after), False)
            del after
        # The rest: the last events, "]", the keys after the array, "}". Decoded as an array, it
        # ends at the array's "]" and msgspec names the byte where the trailing keys start.
        while True:
            rest = b"[" + buf
            try:
                _ARRAY.decode(rest)
                self.ok = False  # the document ends with the array: not an object
                return
            except msgspec.DecodeError as e:
                end = _trailing_at(e)
                at = byte_at(e)
                if self.words is None or at is None or (start := word_at(rest, at, str(e))) is None:
                    break
                buf = self._null(buf, start - 1)  # --skip-bad-events: read as null, then decode again
        del buf
        close = -1 if end is None else rest.rfind(b"]", 0, end + 1)  # msgspec may count the ","
        if close < 0:
            self.ok = False
            return
        evs = _events(rest[: close + 1], self.numbers)
        self._locate(rest[1:] if self.unlocated else b"", close - 1, len(evs))
        yield evs
        try:
            top = _OBJECT.decode(_join_object(head, rest[close + 1 :].lstrip()))
        except (msgspec.DecodeError, msgspec.ValidationError):
            self.ok = False
            return
        self.top = top
        self.ok = "traceEvents" not in top

    def _drop(self, n: int) -> None:
        """The held text's first ``n`` bytes are let go: its first byte's offset moves on."""
        if not n:
            return
        self.at += n - sum(d for q, d in self.grown if q < n)
        if self.grown:
            self.grown = [(q - n, d) for q, d in self.grown if q >= n]
        if self.unlocated:
            self.unlocated = [(q - n, w) for q, w in self.unlocated]

    def _null(self, buf: bytes, start: int, end: int | None = None) -> bytes:
        """``buf`` with the number word at ``start`` and the next ones before ``end`` read as null
        (counted in ``words``; the scan stops at a string not closed before ``end``). Raises
        ``NotANumber`` when the word at ``start`` is no number."""
        words = self.words if self.words is not None else NumberWords()
        offset = self.at + start - sum(d for q, d in self.grown if q < start)
        if WORD.match(buf, start) is None:
            raise not_a_number(buf, start, offset)
        out, found = null_words(buf, start, end)
        grown = 0  # bytes added by the words before this one
        for pos, word in found:
            where = words.add(offset + pos - start, word)
            if where is not None:
                self.unlocated.append((pos + grown, where))
            self.grown.append((pos + grown, 4 - len(word)))
            grown += 4 - len(word)
        return out

    def _locate(self, buf: bytes, cut: int, n: int) -> None:
        """Give the words nulled in ``buf[:cut]`` (a batch of ``n`` events, decoded) their event index."""
        if self.unlocated and self.unlocated[0][0] < cut:
            starts, pos = [], 0
            for raw in _ARRAY.decode(b"".join((b"[", memoryview(buf)[:cut], b"]"))):
                pos = buf.find(bytes(raw), pos)
                starts.append(pos)
            for q, where in self.unlocated:
                if q < cut:
                    where.event = self.events + bisect.bisect_right(starts, q) - 1
            self.unlocated = [(q, w) for q, w in self.unlocated if q >= cut]
        self.events += n


class _Word(Exception):
    """A batch's decode stopped at a sign or a letter where a value goes (``NaN``), at byte ``at``;
    the batch ends at ``end`` (the words up to there are read as null at once: the whole held
    text may be far longer, the file itself when its first piece is)."""

    def __init__(self, at: int, end: int) -> None:
        self.at, self.end = at, end


#: Microseconds below which a ``ts``/``dur`` read as a binary float converts to ns exactly
#: (:func:`_float_ns`): 2**36 us (19 hours). Below it the float's error and that of ``* 1000`` are
#: under 0.01 ns, far inside the 0.25 ns margin; old-style epoch microseconds (about 2**50) are above.
_FLOAT_EXACT_US = float(2**36)
#: Nanoseconds a value may lie from a whole ns and still be read through a float (:func:`_float_ns`).
_FLOAT_MARGIN_NS = 0.25
#: Microseconds whose ns fit in int64.
_INT_MAX_US = (2**63 - 1) // 1000


def _int_ns(evs: list[_IntTimeEv]) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]] | None, bool]:
    """(ns, present) of ``ts`` and ``dur`` of a batch whose times are JSON integers (us * 1000,
    exact), or None where one is beyond int64 ns (the text path names it); never ``far``."""
    out = {}
    for col in ("ts", "dur"):
        us = np.fromiter(map(_RAW[col], evs), np.int64, len(evs))
        ok = us != _ABSENT
        us[~ok] = 0
        if np.any((us > _INT_MAX_US) | (us < -_INT_MAX_US)):
            return None, False
        out[col] = (us * 1000, ok)
    return out, False


def _float_ns(evs: list[_FloatTimeEv]) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]] | None, bool]:
    """(ns, present) of ``ts`` and ``dur`` of a batch read as binary floats, where that is exact:
    each value below :data:`_FLOAT_EXACT_US` and within :data:`_FLOAT_MARGIN_NS` of a whole ns.
    Such a value is the text's ns as :func:`traceprof.core.timeconv.us_text_to_ns` gives it (3
    decimals: exactly; more: rounded to the nearest, which no tie can be so near). Otherwise
    (None, ``far``): ``far`` when some value is too large (the document's times are epoch
    microseconds: its later batches are not tried as floats), not when only a value off a whole
    ns or a negative ``dur`` (whose message quotes its text) sends this batch to the text path."""
    out = {}
    for col in ("ts", "dur"):
        us = np.fromiter(map(_RAW[col], evs), np.float64, len(evs))
        ok = ~np.isnan(us)
        us[~ok] = 0.0
        if not np.all(np.abs(us) < _FLOAT_EXACT_US):
            return None, True
        ns = us * 1000.0
        whole = np.rint(ns)
        if not np.all(np.abs(ns - whole) <= _FLOAT_MARGIN_NS) or (col == "dur" and np.any(whole < 0)):
            return None, False
        out[col] = (whole.astype(np.int64), ok)
    return out, False


_NumberDecode = tuple[
    msgspec.json.Decoder, Callable[[Any], tuple[dict[str, tuple[np.ndarray, np.ndarray]] | None, bool]]
]


class _Numbers:
    """The decoders that read a document's ``ts``/``dur`` as numbers (:class:`_Timed`), in the order
    tried: the last that read a batch first (a document keeps its style). When a value is too large
    for floats (:func:`_float_ns`), floats are dropped for good, and so are integers where they
    failed on the same batch: the document's times are large with decimals (real new-style traces
    write ``"ts": 5177552537952.524``; epoch us with decimals), read from their texts without
    trying the numbers again on each batch."""

    def __init__(self) -> None:
        self.order: list[_NumberDecode] = [(_INT_TIME_EVENTS, _int_ns), (_FLOAT_TIME_EVENTS, _float_ns)]

    def events(self, text: bytes) -> _Timed | None:
        """The batch's events with their times (module doc, step 3), or None (the text path reads it).

        Raises:
            msgspec.DecodeError: Not a JSON array (never a ValidationError).
        """
        for k, (decoder, exact) in enumerate(self.order):
            try:
                evs = decoder.decode(text)
            except msgspec.ValidationError:  # a float where ints go, a string, a null, a float pid
                continue
            ns, far = exact(evs)
            if ns is None:
                if far:  # too large for floats, and not all integers where k > 0: texts from now on
                    del self.order[: k + 1]
                return None
            if k:
                self.order.insert(0, self.order.pop(k))
            timed = _Timed(evs)
            timed.ns = ns
            return timed
        return None


def _events(text: bytes, numbers: _Numbers | None = None) -> list[Any]:
    """The events of a JSON array text: with ``numbers``, read with their times as numbers where
    exact (:class:`_Timed`), else with their times' texts. A pid/tid that is a float fails the
    common types (so no batch pays a check of every pid's type): the batch is decoded again as
    :class:`_FloatLanes`.

    Raises:
        msgspec.DecodeError: Not a JSON array.
        msgspec.ValidationError: The events do not fit the typed structs.
    """
    if numbers is not None and (timed := numbers.events(text)) is not None:
        return timed
    try:
        return _EVENTS.decode(text)
    except msgspec.ValidationError:
        return _FloatLanes(_FLOAT_LANE_EVENTS.decode(text))


def _cut(
    buf: bytes, target: int, words: bool = False, numbers: _Numbers | None = None
) -> tuple[int, list[Any]] | None:
    """Position of a "}" ending an event at or before ``target`` (the text up to it decodes as an
    array of whole events) and those events, or None when there is none.

    Raises:
        msgspec.ValidationError: The events do not fit the typed structs.
        _Word: With ``words``, a decode stopped at a word (``NaN``) where a value goes.
    """
    probe = target
    while True:
        c = buf.rfind(b"},", 0, probe)
        if c < 0:
            return None
        try:
            return c + 1, _events(
                b"".join((b"[", memoryview(buf)[: c + 1], b"]")), numbers
            )  # one copy, not three
        except msgspec.ValidationError:
            raise
        except msgspec.DecodeError as e:
            # an error inside the text (a NaN token, a bad character), not at the cut: the next cut
            # goes before it at once, not one event back at a time (each try decodes the whole prefix)
            at = byte_at(e)
            if words and at is not None and at - 1 < c:
                start = word_at(buf, at - 1, str(e))  # ``buf`` has no "[": a byte earlier
                if start is not None:
                    raise _Word(start, c + 1) from None
            probe = at - 1 if at is not None and at - 1 < c else c


_BYTE = re.compile(r"\(byte (\d+)\)")


def byte_at(e: msgspec.DecodeError) -> int | None:
    """The byte offset msgspec names in its message (``... (byte 1178)``), or None."""
    m = _BYTE.search(str(e))
    return int(m.group(1)) if m else None


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


class _Codes(dict[str, int]):
    """String -> its code in a :class:`Strs` column (the next code for a string not seen yet):
    ``map(codes.__getitem__, values)`` codes a batch in C, calling Python once per new string."""

    def __missing__(self, key: str) -> int:
        code = self[key] = len(self)
        return code


class _LaneCodes(dict[Any, int]):
    """A pid/tid value (int, str, float or None) -> the code of its text (``str(value)``, "" for
    null, as the general path) in ``text``."""

    def __init__(self, text: _Codes) -> None:
        super().__init__()
        self.text = text

    def __missing__(self, key: Any) -> int:
        code = self[key] = self.text["" if key is None else str(key)]
        return code


def _coded(values: Iterable[Any], codes: dict[Any, int], n: int) -> np.ndarray:
    return np.fromiter(map(codes.__getitem__, values), np.int32, n)


_FIELDS = {f: operator.attrgetter(f) for f in ("ph", "cat", "name", "pid", "tid")}
#: An event's (ph, cat, name, pid, tid), as one tuple.
_ROW_KEY = operator.attrgetter(*_FIELDS)
#: Distinct (ph, cat, name, pid, tid) combinations :class:`_Combos` holds at most (a trace with
#: more codes its later batches one field at a time).
_MAX_COMBOS = 1 << 16
#: Combinations allowed whatever the events read so far; past it, once they are more than a quarter
#: of those events (they do not repeat: e.g. a distinct name per event), the rest of the batches are
#: coded one field at a time, which costs less then.
_FEW_COMBOS = 4096


class _Combos(dict[tuple[Any, ...], int]):
    """An event's (ph, cat, name, pid, tid) -> the code of that combination (the next code when
    new), and for each field the code its value has in the field's own codes (``fields``, in
    :data:`_FIELDS`' order), kept per combination in ``per_field``.

    One dictionary lookup per event codes all five fields: a trace has few combinations
    (``hta/df_index_resolver``: 191 for 216 k events), and the per-field codes of a batch are then
    taken from small tables (:meth:`tables`). The per-field codes are given in the order the values
    first occur, as coding each field on its own gives them (a value first met is in a combination
    first met).
    """

    def __init__(self, fields: list[dict[Any, int]]) -> None:
        super().__init__()
        self.fields = fields
        self.per_field: list[list[int]] = [[] for _ in fields]  # of the combinations not in ``_tables`` yet
        self._tables = [_Growing(np.int32) for _ in fields]
        self.used = True  # False once the combinations are too many (:data:`_FEW_COMBOS`)

    def __missing__(self, key: tuple[Any, ...]) -> int:
        code = self[key] = len(self)
        for codes, value, out in zip(self.fields, key, self.per_field, strict=True):
            out.append(codes[value])
        return code

    def tables(self) -> list[np.ndarray]:
        """Per field, the code of its value in each combination (index: the combination's code)."""
        for table, new in zip(self._tables, self.per_field, strict=True):
            if new:
                table.add(np.asarray(new, np.int32))
                new.clear()
        return [table.a[: table.n] for table in self._tables]


_RAW = {f: operator.attrgetter(f) for f in ("ts", "dur", "args")}  # the raw-text fields


#: :attr:`Decoded.bad_time`'s reason for a time beyond int64 ns (the general path rejects it later).
_BEYOND = "beyond int64"


def _times(
    raw: list[msgspec.Raw], base: int, bad: dict[int, str], col: str = "ts"
) -> tuple[np.ndarray, np.ndarray]:
    """ns of microsecond number texts of field ``col`` (module doc, step 3); (values, present)."""
    n = len(raw)
    lengths = np.fromiter(map(len, raw), np.int64, n)
    ok = lengths > 0  # absent: null (Arrow casts no "" to a number)
    try:
        dec = pc.cast(_text_column(raw, lengths, ok), pa.decimal128(38, 3))
        words = np.frombuffer(dec.buffers()[1], np.int64)[2 * dec.offset : 2 * (dec.offset + n)]
        lo, hi = words[0::2], words[1::2]
        beyond = ok & (hi != (lo >> 63))  # the 128-bit value does not fit in int64
        for i in np.flatnonzero(beyond).tolist():  # the general path rejects these per event
            bad.setdefault(base + i, _BEYOND)
        return np.where(ok & ~beyond, lo, 0), ok
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return _times_one_by_one(raw, base, bad, col), ok


def _times_one_by_one(raw: list[msgspec.Raw], base: int, bad: dict[int, str], col: str = "ts") -> np.ndarray:
    """:func:`_times`' values for a batch Arrow cannot cast (``traceprof.core.timeconv``, one at a time)."""
    out = np.zeros(len(raw), np.int64)
    for i, r in enumerate(raw):
        if r:
            try:
                v = us_text_to_ns(bytes(r))
            except ValueError as e:
                # a bad ts is named before the dur; null: also a NaN read as null (--skip-bad-events)
                bad.setdefault(
                    base + i,
                    f"{col!r} is null"
                    if bytes(r) == b"null"
                    else f"{col!r} {e}"
                    if isinstance(e, TimeOutOfRange)
                    else f"bad time: {e}",
                )
                continue
            if -(2**63) <= v < 2**63:
                out[i] = v
            else:
                bad.setdefault(base + i, _BEYOND)
    return out


def _not_integers(loose: list[_LooseIds | None]) -> bool:
    """Whether some id arg of a batch is present and not an integer (``IdRepairs`` of the general
    path counts it; rare, so the loose decode alone pays for the test)."""
    return any(
        v is not None and integer(v) is None
        for a in loose
        if a is not None
        for v in (a.correlation, a.external_id, a.device, a.stream)
    )


def _id_column(typed: list[_Ids], get: Callable[[_Ids], int | None]) -> Ints:
    """One id column of a batch's typed args (:data:`_ABSENT` where the arg is absent, None where it
    is null: both missing)."""
    try:
        values = np.fromiter(map(get, typed), np.int64, len(typed))
    except TypeError:  # a null: rare
        return Ints.of([None if v == _ABSENT else v for v in map(get, typed)])
    ok = values != _ABSENT
    values[~ok] = 0
    return Ints(values, ok)


def _text_column(
    raw: list[msgspec.Raw], lengths: np.ndarray | None = None, valid: np.ndarray | None = None
) -> pa.Array:
    """The JSON texts as an Arrow string array, built from their ``lengths`` (bytes; None: measured
    here) and joined bytes (no Python string per value), null where ``valid`` is False. The text is
    UTF-8: ``traceprof.core.fileio`` checked it (or repaired it), and each text is a whole JSON value."""
    offsets = np.zeros(len(raw) + 1, np.int64)
    if lengths is None:
        lengths = np.fromiter(map(len, raw), np.int64, len(raw))
    np.cumsum(lengths, out=offsets[1:])
    nulls = 0 if valid is None else len(valid) - int(np.count_nonzero(valid))
    return pa.StringArray.from_buffers(
        len(raw),
        pa.py_buffer(offsets.astype(np.int32)),
        pa.py_buffer(b"".join(raw)),
        pa.py_buffer(np.packbits(valid, bitorder="little")) if valid is not None and nulls else None,
        nulls,
    )


#: The metadata events whose args :func:`rows` reads (``ph`` "M"): their names.
_META_NAMES = ("process_name", "thread_name")


def _meta_args(
    out: dict[int, str],
    raw_args: list[msgspec.Raw],
    base: int,
    codes: dict[str, np.ndarray],
    str_codes: dict[str, _Codes],
) -> None:
    """Add the args texts of a batch's ``process_name`` / ``thread_name`` metadata events to ``out``
    (event index -> text); ``codes``: the batch's ph and name codes, ``str_codes`` the distinct values."""
    m, names = str_codes["ph"].get("M"), [str_codes["name"].get(n) for n in _META_NAMES]
    if m is None or names == [None, None]:
        return
    meta = (codes["ph"] == m) & np.isin(codes["name"], [n for n in names if n is not None])
    for i in np.flatnonzero(meta).tolist():
        out[base + i] = bytes(raw_args[i]).decode()


def decode(
    data: bytes | Iterable[bytes],
    batch_bytes: int = BATCH_BYTES,
    spill_dir: str | None = None,
    stored: Callable[[str], bool] | None = None,
    words: NumberWords | None = None,
) -> Decoded | None:
    """Decode a whole Kineto document into columns (module doc).

    Args:
        data: The document (decompressed JSON text), whole or as successive pieces (e.g. from a
            streaming gunzip: then only about ``2 * batch_bytes`` of the text is held at once).
        batch_bytes: JSON text decoded at once.
        spill_dir: Where the args text goes when large (``traceprof.core.spill``; None: the system's
            temporary folder).
        stored: Whether events of a phase (``ph``) may be stored (called once per distinct phase);
            the args texts of the others are left out of ``args`` (:attr:`Decoded.args_rows`).
            None: every text is kept.
        words: With ``--skip-bad-events``: number words (``NaN``) are read as null and counted
            here (:class:`_Split`).

    Returns:
        The columns, or None when the document needs the general decoder: it does not have the
        shape ``{..., "traceEvents": [...]}``, is not valid JSON, or some event does not fit the
        typed structs (an id arg that is not an integer, a ``name`` that is not a string).

    Raises:
        NotANumber: With ``words``, a word where a value goes that is no number (``NaNx``).
    """
    try:
        return _decode(data, batch_bytes, spill_dir, stored, words)
    except RecursionError:  # nested too deeply for msgspec: the general decoder reports it
        return None


class _Growing:
    """A numpy column appended a batch at a time, grown in place (``ndarray.resize``: ``realloc``,
    which moves a large block by remapping its pages, not by copying them). Collecting the batches'
    arrays and concatenating them at the end held every column twice for a moment, and left the
    parts' pages with the C heap.
    """

    def __init__(self, dtype: type[np.generic]) -> None:
        self.a = np.zeros(0, dtype)
        self.n = 0

    def add(self, values: np.ndarray) -> None:
        need = self.n + len(values)
        if need > len(self.a):
            self.a.resize(max(need, len(self.a) * 5 // 4 + 4096), refcheck=False)
        if not np.can_cast(values.dtype, self.a.dtype, "safe"):  # codes past int8 / int16: widen
            self.a = self.a.astype(np.promote_types(values.dtype, self.a.dtype))
        self.a[self.n : need] = values
        self.n = need

    def finish(self) -> np.ndarray:
        self.a.resize(self.n, refcheck=False)
        out, self.a = self.a, np.zeros(0, self.a.dtype)
        return out


def _spread(values: np.ndarray, at: np.ndarray | None, n: int) -> np.ndarray:
    """A column of a batch of ``n`` events from ``values``, those of the events at ``at`` (None:
    every event); 0 (False) for the others."""
    if at is None:
        return values
    out = np.zeros(n, values.dtype)
    out[at] = values
    return out


def _decode(
    data: bytes | Iterable[bytes],
    batch_bytes: int,
    spill_dir: str | None,
    stored: Callable[[str], bool] | None,
    words: NumberWords | None = None,
) -> Decoded | None:
    batches = _Split(data, batch_bytes, words)
    out = Decoded(top={}, spill_dir=spill_dir)
    times = {c: _Growing(np.int64) for c in ("ts_ns", "dur_ns")} | {
        c: _Growing(np.bool_) for c in ("ts_ok", "dur_ok")
    }
    # ph, cat and name each have their own codes; pid and tid share the codes of their texts
    str_codes = {f: _Codes() for f in _FIELDS}
    value_codes: dict[str, dict[Any, int]] = {f: str_codes[f] for f in ("ph", "cat", "name")}
    value_codes["pid"] = _LaneCodes(str_codes["pid"])
    value_codes["tid"] = _LaneCodes(str_codes["tid"])
    str_cols = {f: _Growing(np.int8) for f in _FIELDS}
    combos = _Combos([value_codes[f] for f in _FIELDS])
    args_rows = None if stored is None else _Growing(np.bool_)
    ph_stored: list[bool] = []  # per ph code: stored(ph)
    rows = 0
    args = TextSpill(spill_dir)  # on disk when large (traceprof.core.spill)
    ids = {col: (_Growing(np.int64), _Growing(np.bool_)) for col in _ID_COLS}
    try:
        for evs in batches:
            if not evs:  # e.g. "traceEvents": []
                continue
            base, n = rows, len(evs)
            rows += n
            if isinstance(evs, _FloatLanes):
                out.lanes_plain = False  # str() of a float differs from its text
            # strings as codes (names repeat: millions of events, thousands of names), the five
            # fields of an event through one lookup of their combination while combinations are few
            batch_codes = {}
            if combos.used and len(combos) > min(_MAX_COMBOS, max(base // 4, _FEW_COMBOS)):
                combos.used = False  # for good: combinations that do not repeat
            if combos.used:
                combo = _coded(map(_ROW_KEY, evs), combos, len(evs))
                for f, table in zip(_FIELDS, combos.tables(), strict=True):
                    batch_codes[f] = table[combo]
                del combo
            else:
                for f, get in _FIELDS.items():
                    batch_codes[f] = _coded(map(get, evs), value_codes[f], len(evs))
            for f, codes in batch_codes.items():
                str_cols[f].add(codes.astype(code_type(len(str_codes[f])), copy=False))
            # The events whose phase may be stored (``stored``) only: their times and id args are
            # read and their args texts kept; the others' (flows and metadata: 30% of the events of
            # hta/df_index_resolver) are 0 and missing, never read (:func:`rows` keeps none of them).
            at: np.ndarray | None = None  # their positions in the batch; None: every event
            timed = evs.ns if isinstance(evs, _Timed) else None  # the times, read as numbers
            raw_args = list(map(_RAW["args"], evs))
            if stored is not None and args_rows is not None:
                ph_stored += map(stored, list(str_codes["ph"])[len(ph_stored) :])
                keep = np.asarray(ph_stored, bool)[batch_codes["ph"]]
                _meta_args(out.meta_args, raw_args, base, batch_codes, str_codes)
                args_rows.add(keep)
                if not keep.all():
                    at = np.flatnonzero(keep)
                    evs, raw_args = (
                        list(compress(evs, keep.tolist())),
                        list(compress(raw_args, keep.tolist())),
                    )
                del keep
            del batch_codes
            pos = range(len(evs)) if at is None else at.tolist()  # the batch's index of each event read
            bad: dict[int, str] = {}
            for col in ("ts", "dur"):
                if timed is not None:
                    values, ok = timed[col] if at is None else (timed[col][0][at], timed[col][1][at])
                    if col == "dur":  # rare; only JSON integers (_float_ns leaves these to the text):
                        # the integer's text is its str()
                        out.negative_dur.update(
                            (base + pos[i], str(int(values[i]) // 1000))
                            for i in np.flatnonzero(values < 0).tolist()
                        )
                else:
                    raw = list(map(_RAW[col], evs))
                    values, ok = _times(raw, 0, bad, col)
                    if col == "dur":  # rare: their texts, for the message
                        out.negative_dur.update(
                            (base + pos[i], bytes(raw[i]).decode())
                            for i in np.flatnonzero(values < 0).tolist()
                        )
                times[f"{col}_ns"].add(_spread(values, at, n))
                times[f"{col}_ok"].add(_spread(ok, at, n))
            out.bad_time.update((base + pos[i], why) for i, why in bad.items())
            del evs, bad
            args.add(_text_column(raw_args))
            ids_text = b"[" + b",".join(raw_args) + b"]"
            del raw_args
            try:
                typed = _IDS.decode(ids_text)
                batch = [_id_column(typed, _ID_GETS[col]) for col in _ID_COLS]
            except msgspec.ValidationError:  # e.g. "stream": "0x0" (ROCm): coerce as the general path
                loose = _LOOSE_IDS.decode(ids_text)
                if _not_integers(loose):  # 1.5, "abc": the general path keeps the event and says so
                    return None
                # "0x0", "1", 5.0: read as their integer, and noted for IdRepairs to say so
                out.loose_ids += [
                    (base + pos[j], col, v)
                    for j, a in enumerate(loose)
                    if a is not None
                    for col in _ID_COLS
                    if type(v := getattr(a, col)) in (str, float)
                ]
                # an id beyond int64 (OverflowError): the general path rejects it
                batch = [
                    Ints.of([int_or_none(getattr(a, col), keep_large=True) if a else None for a in loose])
                    for col in _ID_COLS
                ]
            for col, part in zip(_ID_COLS, batch, strict=True):
                ids[col][0].add(_spread(part.values, at, n))
                ids[col][1].add(_spread(part.ok, at, n))
            del batch
    except (msgspec.DecodeError, msgspec.ValidationError, OverflowError):
        return None
    if not batches.ok:
        return None
    out.top = batches.top
    out.args = args.finish()
    out.args_rows = None if args_rows is None else args_rows.finish()
    spill.release()  # the spill file's pages, read back while its chunks were assembled
    for f in _FIELDS:
        setattr(out, f, Strs(str_cols[f].finish(), list(str_codes[f])))
    for col in _ID_COLS:  # int32 where every id fits (the store's columns stay BIGINT)
        setattr(out, col, Ints(ids[col][0].finish(), ids[col][1].finish()).narrow())
    for name, grown in times.items():
        setattr(out, name, grown.finish())
    spill.trim()  # the batches' transients (Arrow's scratch of the time casts)
    return out


@dataclass
class Rows:
    """The stored rows of a document, as the general per-event loop of ``traceprof.collectors.kineto.parse``
    builds them (see :func:`rows`).

    Attributes:
        cols: Column name -> column, one entry per kept event (the parser's columns, see
            ``traceprof.collectors.kineto.parse``): kind, cat, name, pid, tid and flag (None) as lists;
            ts_ns and dur_ns (epoch ns: the base added) as int64 arrays; device, stream,
            correlation, external_id and raw_dur_ns (missing) as :class:`Ints`; args as an Arrow
            string column (JSON text).
        src_index: Index in ``traceEvents`` of each kept row (a :class:`Positions`).
        skipped: Records not stored by design (flows, metadata), counted by reason.
        rejected: Records dropped, counted by reason (unknown phases).
        first_rejected: Per reason of ``rejected``, its first event (:func:`event_where`).
        process_names: pid -> the ``process_name`` metadata's name.
        thread_names: ``pid/tid`` -> the ``thread_name`` metadata's name (``export perfetto``).
        loose_ids: :attr:`Decoded.loose_ids` of the kept events whose arg is read (a device or
            stream on GPU rows only).
    """

    cols: dict[str, Any]
    src_index: list[int]
    skipped: dict[str, int]
    rejected: dict[str, int]
    process_names: dict[str, str]
    thread_names: dict[str, str] = field(default_factory=dict)
    loose_ids: list[tuple[int, str, Any]] = field(default_factory=list)
    first_rejected: dict[str, str] = field(default_factory=dict)


def event_where(i: int, ph: str, name: str) -> str:
    """``event #11 (ph='X', name='aten::mm')``: event ``i`` (its index in ``traceEvents``) in a
    message, its name cut to 60 characters."""
    return f"event #{i} (ph={ph!r}, name={name[:60]!r})"


#: ``"dur": -1`` (us), what the PyTorch profiler writes for an op still open when it stopped.
STILL_OPEN_DUR_NS = -1000
#: Kinds of the CPU-side records that can be still open at stop: stored with ``dur_ns`` =
#: :data:`STILL_OPEN_DUR_NS`, then clipped to the trace's end (``checks.flag_records``); any other
#: negative ``dur`` is an error.
OPEN_KINDS = frozenset({"cpu_op", "user_annotation", "python_function"})

#: Called with (event index, ph, name, problem) for the first malformed event, in "raise" mode.
BadEvent = Callable[[int, str, str, str], None]


def _time_problems(
    d: Decoded, keep: np.ndarray, ph_x: np.ndarray, may_be_open: np.ndarray
) -> dict[int, str] | None:
    """The problem of each stored event whose times the general loop refuses, by index, in its
    words and order: ``missing 'ts'``, ``bad time: ...`` (the ts's before the dur's), ``missing
    'dur'`` (an ``X`` event), ``negative 'dur' (TEXT us)`` (not ``dur: -1`` on a row of
    ``may_be_open``: an op still open at profiler stop, kept); None when one needs the general loop
    itself (a time beyond int64 ns, which it rejects later)."""
    out: dict[int, str] = {}
    for i, why in d.bad_time.items():
        if keep[i]:
            if why == _BEYOND:
                return None
            out[i] = why
    for i in np.flatnonzero(keep & ~d.ts_ok).tolist():
        out[i] = "missing 'ts'"  # before a bad dur
    for i in np.flatnonzero(keep & ph_x & ~d.dur_ok).tolist():
        out.setdefault(i, "missing 'dur'")
    for i, text in d.negative_dur.items():
        if keep[i] and not (may_be_open[i] and d.dur_ns[i] == STILL_OPEN_DUR_NS):
            out.setdefault(i, f"negative 'dur' ({text} us)")
    return out


def rows(
    d: Decoded,
    base_ns: int,
    kind_of: Callable[[str, str, str], str | None],
    gpu_kinds: frozenset[str],
    args_dict: Callable[[str], dict[str, Any]],
    bad_event: BadEvent | None = None,
) -> Rows | None:
    """The rows the general loop would store, built a column at a time (the common case only).

    Args:
        d: The decoded document.
        base_ns: Added to every time (``baseTimeNanoseconds``, or 0).
        kind_of: Event kind of (ph, cat, name): None for records not stored (flows, metadata,
            unknown phases), ``"end"`` for an ``E``; called once per distinct triple.
        gpu_kinds: Kinds whose device/stream default to pid/tid.
        args_dict: Decodes an args text (for ``process_name`` metadata).

        bad_event: Called for the first event with a missing or malformed time (it raises: the
            parser's "raise" mode); None rejects each such event, counted by its problem as the
            general loop counts it ("skip" mode).

    Returns:
        The rows, or None when the general loop is needed: ``B``/``E`` records, an event with a
        time beyond int64 ns, or a float pid/tid (kept by the general loop as written). Events
        with a missing, malformed or negative time are handled here (``bad_event``),
        so one bad event does not send a large file through the general loop, which holds the
        whole document.
    """
    n = len(d)
    if "B" in d.ph.values or not d.lanes_plain:
        return None
    kind, ph_x = _kinds(d, kind_of)
    if kind is None:
        return None
    keep = ~kind.is_none()
    if d.args_rows is not None and (keep & ~d.args_rows).any():
        return None  # a kept row whose phase ``stored`` said is never stored: no times, ids nor args read
    problems = _time_problems(d, keep, ph_x, kind.isin(OPEN_KINDS))
    if problems is None:
        return None
    del ph_x
    not_stored = ~keep  # flows, metadata, unknown phases: counted by their phase below
    rejected: dict[str, int] = {}
    first: dict[str, str] = {}

    def where(i: int) -> str:
        return event_where(i, d.ph.values[d.ph.codes[i]], d.name.values[d.name.codes[i]])

    if problems:
        if bad_event is not None:
            i = min(problems)
            bad_event(i, d.ph.values[d.ph.codes[i]], d.name.values[d.name.codes[i]], problems[i])
        for i, why in sorted(problems.items()):
            rejected[why] = rejected.get(why, 0) + 1
            if why not in first:
                first[why] = where(i)
        keep[list(problems)] = False
    if base_ns and (keep & ((d.ts_ns > 2**63 - 1 - base_ns) | (d.ts_ns < -(2**63) - base_ns))).any():
        return None  # epoch ns beyond int64: the general path rejects them per event
    kept = int(np.count_nonzero(keep))
    keep_ix = np.flatnonzero(keep) if kept < n else np.zeros(0, np.int64)
    skipped: dict[str, int] = {}
    names: dict[str, str] = {}
    threads: dict[str, str] = {}
    if kept < n:
        for code, count in enumerate(
            np.bincount(d.ph.codes[not_stored], minlength=len(d.ph.values)).tolist()
        ):
            if not count:
                continue
            ph = d.ph.values[code]
            design = {"s": "flow", "f": "flow", "t": "flow", "M": "metadata"}.get(ph)
            if design:
                skipped[design] = skipped.get(design, 0) + count
            else:
                reason = f"unknown phase ph={ph!r}"
                rejected[reason] = rejected.get(reason, 0) + count
                first.setdefault(reason, where(int(np.flatnonzero(not_stored & (d.ph.codes == code))[0])))
        if "M" in d.ph.values and "process_name" in d.name.values:
            meta = d.ph.isin({"M"}) & d.name.isin({"process_name"})
            for i in np.flatnonzero(meta).tolist():
                names[d.pid[i] or ""] = str(args_dict(_args_text(d, i)).get("name", ""))
        if "M" in d.ph.values and "thread_name" in d.name.values:
            meta = d.ph.isin({"M"}) & d.name.isin({"thread_name"})
            for i in np.flatnonzero(meta).tolist():
                threads[f"{d.pid[i] or ''}/{d.tid[i] or ''}"] = str(
                    args_dict(_args_text(d, i)).get("name", "")
                )

    def take(col: Any) -> Any:
        return col if kept == n else col.take(keep_ix)

    loose: list[tuple[int, str, Any]] = []
    if d.loose_ids:  # rare: the events kept, and a device or stream only where it is read
        on_gpu = kind.isin(gpu_kinds)
        loose = [x for x in d.loose_ids if keep[x[0]] and (x[1] not in _LANE_COLS or on_gpu[x[0]])]
    # the args of the kept rows: ``d.args`` holds those of the rows ``d.args_rows`` marks, if set
    args_keep = keep if d.args_rows is None else keep[d.args_rows]

    # Each decoded column is dropped from ``d`` once taken (``d`` is not read again, bar ``len``),
    # and nothing is copied when every row is kept, so a column is held once, not twice.
    kind = take(kind)
    gpu = kind.isin(gpu_kinds)
    pid, d.pid = take(d.pid), _no_strs()
    tid, d.tid = take(d.tid), _no_strs()
    device, d.device = _lane_ids(take(d.device), pid, gpu), Ints.missing(0)
    stream, d.stream = _lane_ids(take(d.stream), tid, gpu), Ints.missing(0)
    if device is None or stream is None or (device.ok & (device.values < 0)).any():
        return None  # a negative device (no device): the general path stores NULL and says so
    del gpu
    ts, d.ts_ns = take(d.ts_ns), np.zeros(0, np.int64)
    if base_ns:
        if len(ts) and not (
            _I64.min - min(base_ns, 0) <= ts.min() and ts.max() <= _I64.max - max(base_ns, 0)
        ):
            return None  # some base + ts beyond int64 (numpy would wrap): the general path names them
        ts += base_ns  # in place: ``ts`` is the decoded array, or its copy
    dur, d.dur_ns = d.dur_ns, np.zeros(0, np.int64)
    dur[~d.dur_ok] = 0
    dur = take(dur)
    cols = {
        "kind": kind,
        "cat": take(d.cat),
        "name": take(d.name),
        "ts_ns": ts,
        "dur_ns": dur,
        "pid": pid,
        "tid": tid,
        "device": device,
        "stream": stream,
        "correlation": take(d.correlation),
        "external_id": take(d.external_id),
        "args": d.args if args_keep.all() else _filter_chunks(d, args_keep),
        "flag": Strs.none(kept),
        "raw_dur_ns": Ints.missing(kept),
    }
    d.cat = d.name = _no_strs()
    d.correlation = d.external_id = Ints.missing(0)
    # Positions does what the parser's checks do with a list (traceprof.core.limits, checks.flag_records)
    return Rows(
        cols,
        cast(list[int], Positions(kept if kept == n else keep_ix)),
        skipped,
        rejected,
        names,
        threads,
        loose,
        first,
    )


def _kinds(d: Decoded, kind_of: Callable[[str, str, str], str | None]) -> tuple[Strs | None, np.ndarray]:
    """(The kind of every row, None where it is not stored; None when some row is an ``E``) and
    the ``X`` rows. ``kind_of`` is called once per distinct (ph, cat, name) of the document."""
    n_cat, n_name = max(len(d.cat.values), 1), max(len(d.name.values), 1)
    space = len(d.ph.values) * n_cat * n_name
    combo: Any = d.ph.codes.astype(np.int64 if space >= 2**31 else np.int32)
    combo *= n_cat
    combo += d.cat.codes
    combo *= n_name
    combo += d.name.codes
    if space <= _DENSE_KEYS:  # a table of every (ph, cat, name): no sort of the rows
        seen = np.zeros(space, bool)
        seen[combo] = True
        keys = np.flatnonzero(seen)
        del seen
        at = np.zeros(space, np.int32)
        at[keys] = np.arange(len(keys), dtype=np.int32)
        inv = at[combo]
        del at
    else:
        keys, inv = np.unique(combo, return_inverse=True)
    del combo
    kind = Strs(np.zeros(0, np.int8), [])
    per_key = []
    for k in keys.tolist():
        ph, rest = divmod(k, n_cat * n_name)
        c, nm = divmod(rest, n_name)
        kd = kind_of(d.ph.values[ph], d.cat.values[c], d.name.values[nm])
        if kd == "end":
            return None, np.zeros(0, bool)
        per_key.append(kind.code(kd))
    kind.codes = (
        np.asarray(per_key, code_type(len(kind.values)))[inv.reshape(-1)]
        if len(keys)
        else np.zeros(len(d), np.int8)
    )
    del inv
    ph_x = d.ph.isin({"X"})
    return kind, ph_x


#: (ph, cat, name) combinations up to which :func:`_kinds` uses a table (bytes: 5 per entry).
_DENSE_KEYS = 1 << 26


def _args_text(d: Decoded, i: int) -> str:
    """The args text of event ``i``, a metadata event (:attr:`Decoded.meta_args` when ``d.args``
    holds only the texts of the stored phases)."""
    return d.meta_args[i] if d.args_rows is not None else d.args[i].as_py()


def _filter_chunks(d: Decoded, keep: np.ndarray) -> pa.ChunkedArray:
    """``d.args`` without the rows ``keep`` (one per text in ``d.args``) is False for, a chunk at a time: each chunk is dropped
    from ``d`` once filtered, so the args text is held about once, not twice (and a large column
    is written to disk again, ``traceprof.core.spill``)."""
    chunks, d.args = list(d.args.chunks), pa.chunked_array([], pa.string())

    def each() -> Iterator[pa.Array]:
        for i, chunk in enumerate(chunks):
            chunks[i] = None
            yield chunk

    out, at = TextSpill(d.spill_dir), 0
    for chunk in spill.scan(each()):
        out.add(chunk.filter(pa.array(keep[at : at + len(chunk)])))
        at += len(chunk)
    return out.finish()


class Positions:
    """Each row's index in ``traceEvents`` as an int64 array, with the list operations the parser's
    checks use (``len``, ``[i]``, iteration, ``[:] = ...``, ``np.asarray``): a Python list of
    millions of ints costs 36 bytes a row, the array 8.

    Args:
        values: The indices, ascending; or their count ``n`` when they are 0..n-1.
    """

    def __init__(self, values: np.ndarray | int) -> None:
        # an int n: the rows are the events 0..n-1 (nothing held)
        self.values: np.ndarray | int = values if isinstance(values, int) else np.asarray(values, np.int64)

    def __len__(self) -> int:
        return self.values if isinstance(self.values, int) else len(self.values)

    def __getitem__(self, i: int) -> int:
        if isinstance(self.values, int):
            if not -self.values <= i < self.values:
                raise IndexError(i)
            return i % self.values
        return int(self.values[i])

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.values) if isinstance(self.values, int) else self.values.tolist())

    def __setitem__(self, s: slice, items: Iterable[int]) -> None:
        if s != slice(None):
            raise TypeError("Positions supports [:] = ... only")
        self.values = np.fromiter(items, np.int64)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        values = np.arange(self.values, dtype=np.int64) if isinstance(self.values, int) else self.values
        return values if dtype is None else values.astype(dtype)


def _lane_ids(own: Ints, lane: Strs, gpu: np.ndarray) -> Ints | None:
    """GPU rows' device (stream): the arg, else the pid (tid) text as an integer; None elsewhere.
    None when some lane text gives an integer beyond int64 (the general path rejects the event).
    ``own`` is changed in place."""
    as_int = [int_or_none(t) for t in lane.values]
    if any(v is not None and not -(2**63) <= v < 2**63 for v in as_int):
        return None
    per_lane = Ints.of(as_int)
    missing = ~own.ok
    if not own.fits(per_lane.values):
        own = Ints(own.values.astype(np.int64), own.ok.copy())
    elif not (own.values.flags.writeable and own.ok.flags.writeable):
        own = Ints(own.values.copy(), own.ok.copy())
    own.values[missing] = per_lane.values[lane.codes[missing]]
    own.ok[missing] = per_lane.ok[lane.codes[missing]]
    own.ok &= gpu
    return own
