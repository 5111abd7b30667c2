"""Parse PyTorch profiler (Kineto) Chrome-trace JSON into normalized rows.

Reads ``.json`` and ``.json.gz`` files, new style (top-level ``baseTimeNanoseconds``, ``ts``/``dur``
in microseconds with up to 3 decimals relative to it) and old style (integer epoch microseconds),
GPU traces (CUDA or ROCm) and CPU-only (gloo) traces.

Algorithm:
  1. Decode the JSON with msgspec into typed events; ``ts``/``dur`` from their text so the
     microsecond text converts to integer ns exactly (``traceprof.core.timeconv``). The common case
     (no B/E pairs, no malformed event, valid UTF-8) is decoded as the file is read
     (``traceprof.core.fileio.TextStream``: plain files in chunks, gzip inflated as a stream; the whole
     text is never held) and turned into rows a column at a time by ``traceprof.collectors.kineto.decode``;
     the per-event loop below is the general path, with the same rows, on the file read whole.
     Rows are columns from here on: strings as lists, integers as numpy arrays
     (``traceprof.collectors.kineto._values.Ints`` where values may be missing), ``args`` an Arrow string
     column; the passes below work a column at a time (``traceprof.collectors.kineto.columns``).
     An event whose epoch time (base + ``ts``) is below 0, before 1970, is a bad event, as a
     negative time is in every source: an error naming it, or with ``on_bad_event="skip"``
     skipped, counted and its first named (a ``ts`` below 0 after a base is an ordinary time).
  2. Map each record to an event kind (README.md "What traceprof handles") from ``ph``, ``cat`` and ``name``; flows
     (``ph`` s/f) and metadata (``ph`` M) are counted, not stored (correlation ids carry the links).
  3. Assign each CPU event the ProfilerStep whose interval holds its start (on any thread), and each
     GPU event the step of the runtime call that launched it (``args.correlation``; of calls that
     share an id, the earliest, with a warning: ``traceprof.collectors.kineto.columns.PAIRING``), falling back
     to its own start time.
  4. Derive collectives: one row per NCCL/RCCL kernel on GPU traces; one per ``gloo:<op>``
     annotation on CPU-only traces.

Source fields read: top-level ``baseTimeNanoseconds``, ``host_name``, ``distributedInfo.{rank,world_size,backend}``,
``distributedInfo.pg_config[].{pg_name,pg_desc,ranks}`` (kept normalized as ``traces.meta.process_groups``),
``deviceProperties[]``; per event ``ph, cat, name, pid, tid, ts, dur, args`` and in args
``correlation``, ``External id``, ``device``, ``stream``, ``Collective name``, ``Process Group Name``,
``Seq``, ``In msg nelems``, ``Out msg nelems``, ``dtype``, ``Group size``, ``Input Dims``,
``Input type``.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import msgspec
import numpy as np
import pyarrow as pa

from traceprof.collectors._arrow import row_schema
from traceprof.collectors._duplicates import drop_duplicates
from traceprof.collectors.kineto._values import IdRepairs, Ints, Strs
from traceprof.collectors.kineto._values import args_dict as _args_dict
from traceprof.collectors.kineto._values import int_or_none as _int_or_none
from traceprof.collectors.kineto.checks import (
    check_one_process,
    flag_records,
    launches_without_gpu,
    shared_correlation_warning,
    step_cut_warning,
)
from traceprof.collectors.kineto.collectives import collectives as _collectives
from traceprof.collectors.kineto.columns import GPU_KINDS as _GPU_KINDS
from traceprof.collectors.kineto.columns import STR_DICT, Frame, assign_steps, classes
from traceprof.collectors.kineto.decode import OPEN_KINDS, STILL_OPEN_DUR_NS, byte_at, event_where
from traceprof.collectors.kineto.decode import decode as decode_columns
from traceprof.collectors.kineto.decode import rows as fast_rows
from traceprof.collectors.kineto.nonfinite import (
    WORD,
    NotANumber,
    NumberWords,
    not_a_number,
    null_words,
    word_at,
)
from traceprof.core import limits, spill
from traceprof.core.bounded import check_nesting, max_nodes, too_deep
from traceprof.core.errors import NotATraceError, TraceFormatError
from traceprof.core.fileio import (
    NotUtf8,
    TextStream,
    blank_bom,
    misnamed_gzip,
    not_json_because,
    read_maybe_gzip,
)
from traceprof.core.limits import INT32, INT64, columns_to_table, drop_out_of_range, fits, skip_hint, to_table
from traceprof.core.parsed import DEFAULT_OPTIONS, ParsedTrace, ParseOptions
from traceprof.core.schema import GPU_ACTIVITY_KINDS, LAUNCH_KINDS
from traceprof.core.timeconv import TimeOutOfRange, us_text_to_ns
from traceprof.core.values import identity_int, world_size_int
from traceprof.core.vocab import TraceSource

__all__ = ["parse", "sidecar_path", "is_trace_file"]

_KIND_BY_CAT = {
    "cpu_op": "cpu_op",
    "operator": "cpu_op",
    "user_annotation": "user_annotation",
    "gpu_user_annotation": "gpu_user_annotation",
    "python_function": "python_function",
    "cuda_runtime": "cuda_runtime",
    "runtime": "cuda_runtime",
    "cuda_driver": "cuda_driver",
    "kernel": "kernel",
    "gpu_memcpy": "memcpy",
    "memcpy": "memcpy",
    "gpu_memset": "memset",
    "memset": "memset",
    "cuda_sync": "sync",
    "cpu_instant_event": "instant",
}
_LAUNCH_KINDS = frozenset(LAUNCH_KINDS)
_ACTIVITY_KINDS = frozenset(GPU_ACTIVITY_KINDS)
_STEP_PREFIX = "ProfilerStep#"


_MISSING = msgspec.Raw(b"")


class _Event(msgspec.Struct):
    # ph, cat, name: strings in a trace; any JSON value here, so that one event's number or null is
    # that event's problem (:func:`_not_strings`), not the file's
    ph: Any = ""
    cat: Any = ""
    name: Any = ""
    pid: Any = None
    tid: Any = None
    ts: msgspec.Raw = _MISSING  # the number's text: converted to ns exactly
    dur: msgspec.Raw = _MISSING
    args: msgspec.Raw = msgspec.Raw(b"{}")


class _Ids(msgspec.Struct):
    """The args every event needs, decoded in C in a second typed pass."""

    correlation: int | float | str | None = None
    external_id: int | float | str | None = msgspec.field(default=None, name="External id")
    device: int | float | str | None = None
    stream: int | float | str | None = None


class _IdsEvent(msgspec.Struct):
    args: _Ids | None = None


class _IdsTrace(msgspec.Struct):
    traceEvents: list[_IdsEvent]


#: An entry of ``traceEvents``: an event, or a JSON value that is not an object (that entry's
#: problem, :func:`_not_object`, not the file's).
_Entry = _Event | int | float | str | bool | list[Any] | None


class _Trace(msgspec.Struct):
    traceEvents: list[_Entry]
    baseTimeNanoseconds: int | None = None
    distributedInfo: dict[str, Any] | None = None
    deviceProperties: list[dict[str, Any]] | None = None
    host_name: str | None = None


def is_trace_file(path: Path) -> bool:
    """True for names a Kineto trace may have (``*.json``, ``*.json.gz``), not sidecars or FR dumps."""
    n = path.name
    return (n.endswith(".json") or n.endswith(".json.gz")) and not n.endswith((".meta.json", ".fr.json"))


def sidecar_path(path: Path) -> Path:
    """The collector's sidecar of a trace: ``rank0.trace.json.gz`` -> ``rank0.meta.json``."""
    n = path.name
    for suffix in (".trace.json.gz", ".trace.json", ".pt.trace.json.gz", ".json.gz", ".json"):
        if n.endswith(suffix):
            return path.with_name(n[: -len(suffix)] + ".meta.json")
    return path.with_name(n + ".meta.json")


#: A document that is an empty array (``[]``): no events, not "a bare array of events".
_EMPTY_ARRAY = re.compile(rb"[ \t\n\r]*\[[ \t\n\r]*\][ \t\n\r]*")


def _typed(path: Path, data: bytes) -> _Trace:
    try:
        return msgspec.json.decode(data, type=_Trace)
    except msgspec.ValidationError as e:
        top = "$." not in str(e)  # the document itself, e.g. a JSON array or a config object
        if top and (
            "missing required field `traceEvents`" in str(e) or str(e).startswith("Expected `object`")
        ):
            # msgspec stops at the first byte of an array: is the rest JSON at all ('[' * 200000 is not)?
            msgspec.json.decode(data, type=msgspec.Raw)  # a DecodeError or RecursionError: _decode says why
            if _EMPTY_ARRAY.fullmatch(data):
                raise NotATraceError(path, "", "empty: a JSON array with no events in it ([])") from None
            raise NotATraceError(
                path,
                "",
                "valid JSON but not a Kineto trace (no top-level traceEvents)"
                + (
                    ": a bare array of events (the Trace Event Format's array form, which other tools "
                    'write; torch.profiler writes {"traceEvents": [...]})'
                    if data.lstrip()[:1] == b"["
                    else ""
                ),
            ) from None
        raise TraceFormatError(path, "", f"not a Kineto trace: {e}") from None


class NonFiniteNumber(TraceFormatError):
    """A number word (``NaN``, ``-Infinity``, ``nan``: ``traceprof.collectors.kineto.nonfinite``; not
    JSON) at byte ``offset`` of the text."""

    def __init__(self, path: Path, offset: int, token: bytes) -> None:
        self.offset, self.token = offset, token
        super().__init__(
            path,
            f"byte {offset}",
            f"{token.decode()} is not a JSON number (what Python's json.dumps, C's printf and others "
            "write for a float that is not finite); pass --skip-bad-events to read each as null "
            "(its event is then reported)",
        )


def _not_a_number(path: Path, e: NotANumber) -> TraceFormatError:
    return TraceFormatError(path, f"byte {e.offset}", e.reason())


def _non_finite(path: Path, data: bytes, error: msgspec.DecodeError) -> TraceFormatError | None:
    """The error to raise when msgspec stopped at a word where a value goes: :class:`NonFiniteNumber`
    for a number word, else the word's refusal (``NaNx``); None for any other error."""
    at = byte_at(error)
    start = None if at is None else word_at(data, at, str(error))
    if start is None:
        return None
    word = WORD.match(data, start)
    if word is None:
        return _not_a_number(path, not_a_number(data, start, start))
    return NonFiniteNumber(path, start, word.group(0))


def _decode(path: Path, data: bytes) -> _Trace:
    try:
        return _typed(path, data)
    except msgspec.DecodeError as e:
        if (found := _non_finite(path, data, e)) is not None:
            raise found from None
        if not data.strip():  # blank_bom made a leading BOM whitespace
            raise TraceFormatError(
                path,
                "",
                "empty: no JSON text"
                if not data
                else f"no JSON text, only {len(data)} bytes of whitespace or byte order mark",
            ) from None
        if "truncated" in str(e).lower():
            raise TraceFormatError(path, f"byte {len(data)}", f"truncated JSON ({e})") from None
        raise TraceFormatError(
            path, "", not_json_because(data) or f"invalid JSON ({e})" + misnamed_gzip(path)
        ) from None
    except RecursionError:
        raise too_deep(path) from None


class _Source:
    """A trace file: its text streamed (``stream``), or read whole when the general path needs it."""

    def __init__(self, path: Path, max_ratio: float) -> None:
        self.path = path
        self.max_ratio = max_ratio  # the gzip inflate cap (ParseOptions.max_inflate_ratio)
        self.stream = TextStream(path, max_ratio)
        self._whole: tuple[bytes, bytes] | None = None

    def data(self) -> bytes:
        """The whole text (decompressed, invalid UTF-8 repaired: ``traceprof.core.fileio``)."""
        if self._whole is None:
            self._whole = read_maybe_gzip(self.path, self.max_ratio)
        return self._whole[1]

    def null_non_finite(self, start: int) -> NumberWords:
        """Replace every number word (``NaN``, ``-inf``: ``traceprof.collectors.kineto.nonfinite``)
        outside strings from byte ``start`` on (the first, where msgspec stopped: the text before it
        holds none) by ``null`` in the whole text; returns them (one pass, strings skipped whole)."""
        raw, text = self._whole or read_maybe_gzip(self.path, self.max_ratio)
        out, found = null_words(text, start)
        words = NumberWords()
        for pos, word in found:  # the offsets in the text as read (the words before: grown by 4 - len)
            words.add(pos, word)
        self._whole = (raw, out)
        return words

    def sha256(self) -> str:
        return self.stream.sha256 if self._whole is None else hashlib.sha256(self._whole[0]).hexdigest()

    def size(self) -> int:
        return self.stream.size if self._whole is None else len(self._whole[0])


def _top_keys(path: Path, src: _Source, top: dict[str, Any]) -> _Trace:
    """The top-level keys as a :class:`_Trace` without events (as :func:`_decode` checks them)."""
    try:
        return msgspec.convert({**top, "traceEvents": []}, _Trace)
    except msgspec.ValidationError:
        return _decode(path, src.data())  # raises the general decoder's error


def _kind_of_text(ph: str, cat: str, name: str) -> str | None:
    """:func:`_kind` of an event with these fields."""
    return _kind(_Event(ph=ph, cat=cat, name=name))


def _stored_phase(ph: str) -> bool:
    """Whether events of phase ``ph`` may be stored (:func:`_kind` is None for the others, whatever
    their category and name: flows, metadata, unknown phases)."""
    return _kind_of_text(ph, "", "") is not None


def _lane(v: Any) -> str:
    return "" if v is None else str(v)


def _kind_of_cat(cat: str) -> str:
    """Event kind of a category: the table above; any device's runtime / driver category
    (``cuda_runtime``, ``hip_runtime``, ``xpu_runtime``, ``privateuse1_driver``, ``mtia_runtime``, ...)
    is a launch kind; the rest ``other``."""
    c = cat.lower()
    kind = _KIND_BY_CAT.get(c)
    if kind is None:
        kind = (
            "cuda_runtime" if c.endswith("_runtime") else "cuda_driver" if c.endswith("_driver") else "other"
        )
    return kind


#: A JSON value's kind, by the Python type msgspec decodes it to, for messages.
_JSON_KINDS = {
    int: "a number",
    float: "a number",
    bool: "a boolean",
    str: "a string",
    list: "an array",
    dict: "an object",
}


def _not_object(ev: _Entry) -> str:
    """The problem of a ``traceEvents`` entry that is not a JSON object: ``"entry is a number,
    not an object"``."""
    return f"entry is {_JSON_KINDS.get(type(ev), 'null')}, not an object"


def _event_at(trace: _Trace, i: int) -> _Event:
    """Entry ``i`` of ``traceEvents``, a stored row's event (an object: no other entry is stored)."""
    return cast(_Event, trace.traceEvents[i])


def _not_strings(ev: _Event) -> str | None:
    """The problem of an event whose ``ph``, ``cat`` or ``name`` is not a JSON string (a number,
    null, ...), e.g. ``"'name' is a number, not a string"``, or None."""
    for field in ("ph", "cat", "name"):
        value = getattr(ev, field)
        if not isinstance(value, str):
            return f"{field!r} is {_JSON_KINDS.get(type(value), 'null')}, not a string"
    return None


def _as_text(value: Any) -> str:
    """A string field's value for a message: itself, or the JSON of a value of another type (``null``)."""
    return value if isinstance(value, str) else msgspec.json.encode(value).decode()


#: The Kineto field each time column is read from, for messages and reasons (``'ts' beyond int64``).
_TIME_FIELDS = {"ts_ns": "ts", "dur_ns": "dur"}


def _as_written(ev: _Event, i: int, base_ns: int, problem: str) -> tuple[str, str]:
    """(record, problem) of event ``ev`` (index ``i``) whose ``problem`` (``'ts' beyond int64
    (...)``, as :func:`traceprof.core.limits.drop_out_of_range` spells it) is a time: the event
    as the other bad-event messages name it, and its ``ts``/``dur`` as the trace writes them (us),
    after ``baseTimeNanoseconds`` where the trace has one (epoch ns = base + ts * 1000)."""
    where = f"event #{i} (ph={_as_text(ev.ph)!r}, name={_as_text(ev.name)[:60]!r})"
    ts, dur = (bytes(v).decode(errors="replace")[:40] for v in (ev.ts, ev.dur))
    after = f" after baseTimeNanoseconds {base_ns}" if base_ns else ""
    head = problem.split(" (", 1)[0]
    if head == "'ts' + 'dur' beyond int64":
        return where, f"{head} ({ts} us + {dur} us{after})"
    if head == "'ts' beyond int64":
        return where, f"{head} ({ts} us{after})"
    if head == "'dur' beyond int64":
        return where, f"{head} ({dur} us)"
    if head == "'ts' before the epoch":  # epoch ns below 0: before 1970
        return where, f"{head} ({ts} us{after})"
    return where, problem


def _where_at(ev: _Event, i: int) -> str:
    """``event #12 (ph='X', name='aten::mm', ts=1020.0)``: event ``i`` and its ``ts`` as written."""
    return f"{_as_written(ev, i, 0, '')[0][:-1]}, ts={bytes(ev.ts).decode(errors='replace')[:40]})"


def _kind(ev: _Event) -> str | None:
    """Event kind, or None for records that are not stored (flows, metadata); ``"end"`` for a ``B``
    event's closing ``E``."""
    ph = ev.ph
    if ph in ("X", "B"):
        if ev.name.startswith(_STEP_PREFIX) and ev.cat in ("user_annotation", "cpu_op", "Operator"):
            return "step"
        return _kind_of_cat(ev.cat)
    if ph == "E":
        return "end"
    if ph in ("i", "I"):
        return "instant"
    if ph == "C":
        return "counter"
    if ph in ("b", "e", "n"):
        return "other"
    return None


def ph_needs_dur(ph: str) -> bool:
    """Complete events (``X``) must have a duration."""
    return ph == "X"


def _decode_ids(data: bytes) -> list[_IdsEvent] | None:
    """Second, typed pass over the JSON for the id args; None when some value does not fit
    (then :func:`_ids_of` decodes each event's args on its own)."""
    try:
        return msgspec.json.decode(data, type=_IdsTrace).traceEvents
    except (msgspec.ValidationError, msgspec.DecodeError):
        return None


def _ids_of(raw: msgspec.Raw) -> _Ids | None:
    d = _args_dict(bytes(raw)) if raw else {}
    return _Ids(d.get("correlation"), d.get("External id"), d.get("device"), d.get("stream"))


def _step_number(name: str) -> int | None:
    try:
        return int(name[len(_STEP_PREFIX) :])
    except ValueError:
        return None


def parse(path: str | Path, options: ParseOptions = DEFAULT_OPTIONS) -> ParsedTrace:
    """Parse one Kineto trace file.

    Args:
        path: A ``.json`` or ``.json.gz`` Chrome trace written by torch.profiler.
        options: How to read it (``traceprof.core.parsed.ParseOptions``): ``on_bad_event`` ``"raise"``
            (default) stops at the first malformed event (e.g. an ``X`` event without ``dur``),
            ``"skip"`` counts it in ``rejected`` and goes on; the classifier of GPU activity
            (``--comm-kernel`` patterns); the gzip inflate cap; where large args text spills.

    Returns:
        A :class:`ParsedTrace` with ``events``, ``steps``, ``devices`` and ``collectives`` tables.
        Times are epoch ns (``baseTimeNanoseconds + round(ts_us * 1000)``, or ``ts_us * 1000``).

    Raises:
        TraceFormatError: Unreadable, broken gzip, truncated or invalid JSON, not a Kineto trace, or
            (with ``on_bad_event="raise"``) a malformed event, naming the event index.
    """
    p = Path(path).resolve()
    on_bad_event, classifier = options.on_bad_event, options.classifier
    # Columnar decode and row building (traceprof.collectors.kineto.decode) for the common case, streamed
    # from the file; the loop below is the general path (B/E records, malformed events, unusual
    # values, invalid UTF-8), which reads the file whole.
    src = _Source(p, options.max_inflate_ratio)
    # number words (NaN, -inf) read as null (--skip-bad-events): by the fast path, else the general one
    words = NumberWords() if on_bad_event == "skip" else None

    def general() -> _Trace:
        """The whole text by the general decoder; with ``skip`` number words read as null."""
        nonlocal words
        try:
            return _decode(p, src.data())
        except NonFiniteNumber as e:
            if on_bad_event == "raise":
                raise
            found = src.null_non_finite(e.offset)
            if words is None or found.total() > words.total():  # the fast path's, if as many: located
                words = found
        return _decode(p, src.data())

    try:
        decoded = decode_columns(src.stream, spill_dir=options.spill_dir, stored=_stored_phase, words=words)
    except NotUtf8:
        decoded = None
    except NotANumber as e:
        raise _not_a_number(p, e) from None
    doc = general() if decoded is None else _top_keys(p, src, decoded.top)
    base_ns = doc.baseTimeNanoseconds or 0
    if not fits(base_ns, INT64):  # every event's time is base + ts: none could be stored
        raise TraceFormatError(
            p,
            "baseTimeNanoseconds",
            f"{base_ns} is beyond int64 (epoch ns must fit a "
            "64-bit integer); the file is damaged or not written by the profiler",
        )

    def refuse(i: int, ph: str, name: str, problem: str) -> None:  # the general loop's words, below
        where = event_where(i, ph, name)
        raise TraceFormatError(p, where, problem + skip_hint(where))

    fast = (
        None
        if decoded is None
        else fast_rows(
            decoded,
            base_ns,
            _kind_of_text,
            _GPU_KINDS,
            _args_dict,
            refuse if on_bad_event == "raise" else None,
        )
    )
    if decoded is not None and fast is None:
        doc = general()
    data = src.data() if fast is None else b""
    events_read = len(decoded) if fast is not None and decoded is not None else len(doc.traceEvents)
    del decoded
    spill.release()  # each pass's transients back to the system (glibc keeps them otherwise), spilled pages too
    dist = doc.distributedInfo or {}
    identity_warnings: list[str] = []  # a rank or world size that is not an integer (shown after the checks')
    rank = _identity_int(dist, "rank", f"{p.name}: distributedInfo.rank", identity_warnings)
    world = _identity_int(dist, "world_size", f"{p.name}: distributedInfo.world_size", identity_warnings)

    cols: dict[str, Any] = {
        k: []
        for k in (
            "kind",
            "cat",
            "name",
            "ts_ns",
            "dur_ns",
            "pid",
            "tid",
            "device",
            "stream",
            "correlation",
            "external_id",
            "args",
            "flag",
            "raw_dur_ns",
        )
    }
    src_index: list[int] = []  # index in traceEvents of each row
    open_b: dict[tuple[str, str], list[int]] = {}  # B rows waiting for their E, per (pid, tid)
    rejected: dict[str, int] = {}
    first_rejected: dict[str, str] = {}  # reason -> its first event, for the warning
    skipped: dict[str, int] = {}
    process_names: dict[str, str] = {}
    thread_names: dict[str, str] = {}  # pid/tid -> name (export perfetto names its tracks by them)
    if fast is not None:
        cols, src_index, skipped, rejected, process_names, thread_names = (
            fast.cols,
            fast.src_index,
            fast.skipped,
            fast.rejected,
            fast.process_names,
            fast.thread_names,
        )
        first_rejected = fast.first_rejected
    ids = _decode_ids(data) if fast is None else None
    id_repairs = IdRepairs()  # id args that are not integers, args that are not an object
    for i, attr, v in fast.loose_ids if fast is not None else ():  # "0x0", 5.0: read, and said
        id_repairs.note(i, attr, v)
    for i, ev in enumerate(doc.traceEvents if fast is None else ()):
        if not isinstance(ev, _Event):  # 1, "x", null among the events: that entry's problem
            entry = _not_object(ev)
            if on_bad_event == "raise":
                raise TraceFormatError(p, f"event #{i}", entry + skip_hint("event"))
            rejected[entry] = rejected.get(entry, 0) + 1
            first_rejected.setdefault(entry, f"event #{i}")
            continue
        if wrong := _not_strings(ev):
            if on_bad_event == "raise":
                refuse(i, _as_text(ev.ph), _as_text(ev.name), wrong)
            rejected[wrong] = rejected.get(wrong, 0) + 1
            first_rejected.setdefault(wrong, event_where(i, _as_text(ev.ph), _as_text(ev.name)))
            continue
        kind = _kind(ev)
        if kind is None:
            if ev.ph == "M" and ev.name == "process_name":
                process_names[_lane(ev.pid)] = str(_args_dict(bytes(ev.args)).get("name", ""))
            elif ev.ph == "M" and ev.name == "thread_name":
                key = f"{_lane(ev.pid)}/{_lane(ev.tid)}"
                thread_names[key] = str(_args_dict(bytes(ev.args)).get("name", ""))
            design = {"s": "flow", "f": "flow", "t": "flow", "M": "metadata"}.get(ev.ph)
            if design:  # by design: flows are links (kept as correlation ids), metadata is read above
                skipped[design] = skipped.get(design, 0) + 1
            else:
                reason = f"unknown phase ph={ev.ph!r}"
                rejected[reason] = rejected.get(reason, 0) + 1
                first_rejected.setdefault(reason, event_where(i, ev.ph, ev.name))
            continue
        problem = None
        ts = dur = 0
        try:
            if not ev.ts:
                problem = "missing 'ts'"
            elif null := next((f for f in ("ts", "dur") if bytes(getattr(ev, f)) == b"null"), None):
                problem = f"{null!r} is null"  # also a NaN read as null (--skip-bad-events)
            else:
                field = "ts"  # the field an out-of-range time is named by
                ts = us_text_to_ns(bytes(ev.ts))
                if ev.dur:
                    field = "dur"
                    dur = us_text_to_ns(bytes(ev.dur))
                elif ph_needs_dur(ev.ph):
                    problem = "missing 'dur'"
                if dur < 0 and not (dur == STILL_OPEN_DUR_NS and kind in OPEN_KINDS):  # -1: still open, kept
                    problem = f"negative 'dur' ({bytes(ev.dur).decode()} us)"
        except TimeOutOfRange as e:
            problem = f"{field!r} {e}"
        except ValueError as e:
            problem = f"bad time: {e}"
        if kind == "end" and not problem:
            _close_begin(cols, open_b, ev, base_ns + ts, rejected, skipped)
            continue
        if problem:
            if on_bad_event == "raise":
                refuse(i, ev.ph, ev.name, problem)
            rejected[problem] = rejected.get(problem, 0) + 1
            first_rejected.setdefault(problem, event_where(i, ev.ph, ev.name))
            continue
        a = ids[i].args if ids is not None else _ids_of(ev.args)
        gpu = kind in _GPU_KINDS
        id_repairs.check(i, ev.args, a, gpu)
        cols["kind"].append(kind)
        cols["cat"].append(ev.cat)
        cols["name"].append(ev.name)
        cols["ts_ns"].append(base_ns + ts)
        cols["dur_ns"].append(dur)
        cols["pid"].append(_lane(ev.pid))
        cols["tid"].append(_lane(ev.tid))
        if a is None:
            cols["device"].append(_int_or_none(ev.pid) if gpu else None)
            cols["stream"].append(_int_or_none(ev.tid) if gpu else None)
            cols["correlation"].append(None)
            cols["external_id"].append(None)
        else:
            # beyond int64 kept, for drop_out_of_range to reject the event (it was a NULL device)
            dev, stream = (
                (ev.pid if a.device is None else a.device),
                (ev.tid if a.stream is None else a.stream),
            )
            d = _int_or_none(dev, keep_large=True) if gpu else None
            no_device = d is not None and d < 0 and a.device is not None  # IdRepairs says so
            cols["device"].append(None if no_device else d)
            cols["stream"].append(_int_or_none(stream, keep_large=True) if gpu else None)
            cols["correlation"].append(_int_or_none(a.correlation, keep_large=True))
            cols["external_id"].append(_int_or_none(a.external_id, keep_large=True))
        cols["args"].append(bytes(ev.args).decode() if ev.args else "{}")
        cols["flag"].append(None)
        cols["raw_dur_ns"].append(None)
        src_index.append(i)
        if ev.ph == "B":
            open_b.setdefault((cols["pid"][-1], cols["tid"][-1]), []).append(len(src_index) - 1)

    for rows_ in open_b.values():
        for r in rows_:
            cols["flag"][r] = "unmatched_begin"
    if not isinstance(cols["args"], pa.ChunkedArray | pa.Array):
        cols["args"] = pa.array(cols["args"], pa.string())
    for c in _STR_COLS:
        if isinstance(cols[c], list):
            cols[c] = Strs.of(cols[c])
    by_name = _StepNumbers(cols)
    if not by_name.fit():  # a ProfilerStep#N beyond int32: its row is rejected, with the others
        cols["step_no"] = list(by_name)
    again: list[_Trace] = []  # the fast path's events decoded again, once, for the messages only

    def _events_again() -> _Trace:
        if fast is None:
            return doc
        if not again:
            again.append(general())
        return again[0]

    drop_out_of_range(
        p,
        cols,
        src_index,
        on_bad_event,
        rejected,
        extra={"step": cols["step_no"]} if "step_no" in cols else None,
        fields=_TIME_FIELDS,
        describe=lambda i, problem: _as_written(_event_at(_events_again(), i), i, base_ns, problem),
        first=first_rejected,
        epoch=("ts_ns",),
    )
    _as_arrays(cols)
    dropped: dict[str, int] = {}  # exact duplicate records, counted in traces.meta.repaired
    duplicates = drop_duplicates(
        p,
        cols,
        src_index,
        lambda r: _where_at(_event_at(doc if fast is None else general(), src_index[r]), src_index[r]),
        dropped,
    )
    step_numbers: _StepNumbers | list[int | None] = cols.pop("step_no", by_name)
    unmatched = int(cols["flag"].isin({"unmatched_begin"}).sum())
    clipped: dict[str, int] = {}  # records clipped, by reason, counted in traces.meta.repaired
    flagged, warnings = flag_records(p, cols, src_index, base_ns, clipped)
    warnings[:0] = [duplicates] if duplicates else []
    spill.release()
    for what in (_E_MISMATCH, _E_EARLY):
        if skipped.get(what):
            warnings.append(f"{p.name}: {skipped[what]} {what}")
    if unmatched:
        flagged["unmatched_begin"] = unmatched
        warnings.append(
            f"{p.name}: {unmatched} 'B' record(s) without their 'E' (not extended to the end of "
            "the trace; events.flag = 'unmatched_begin')"
        )
    check_one_process(p, cols, step_numbers)
    shared = shared_correlation_warning(p, cols, src_index)
    if shared:
        warnings.append(shared)
    (graphs, lost_graphs), (launches, lost_launches), lost_warning = launches_without_gpu(p, cols)
    if lost_warning:
        warnings.append(lost_warning)
    spill.release()
    frame = Frame(cols)
    cols["class"] = classes(frame, classifier)
    steps_rows, step_col, spans = assign_steps(frame, step_numbers, cols["flag"])
    cols["step"] = step_col
    spill.release()
    cut = step_cut_warning(p, cols, spans)
    if cut:
        warnings.append(cut)
    gpu_present = bool(cols["kind"].isin(_GPU_KINDS).any())
    coll, bad_values = _collectives(cols, frame, gpu_present, classifier)
    bad_values.count(rejected)
    warnings += bad_values.warnings(p.name, src_index)
    spill.release()
    devices = _devices(doc.deviceProperties or [])
    main_pid = _main_pid(cols)
    process_names = limits.drop_long_items(
        p, process_names, "process_name of pid", "args.name", on_bad_event, rejected
    )
    thread_names = limits.drop_long_items(
        p, thread_names, "thread_name of pid/tid", "args.name", on_bad_event, rejected
    )
    trace_info = {
        "backend": _identity_text(dist, "backend", f"{p.name}: distributedInfo.backend", identity_warnings),
        "host": doc.host_name,
        "base_time_ns": base_ns,
        "pid": main_pid,
        "device_name": devices[0]["name"] if devices else ("cpu" if not gpu_present else None),
        "meta": msgspec.json.encode(
            {
                "distributedInfo": dist,
                "process_names": process_names,
                "thread_names": thread_names,
                "process_groups": _process_groups(dist),
                **(
                    {"graph_launches": graphs, "graph_launches_without_gpu": lost_graphs}
                    if lost_graphs
                    else {}
                ),
                **(
                    {"kernel_launches": launches, "kernel_launches_without_gpu": lost_launches}
                    if lost_launches
                    else {}
                ),
            }
        ).decode(),
    }
    side = _read_sidecar(p)
    if side:
        side_rank = _identity_int(side, "rank", f"{sidecar_path(p).name}: rank", identity_warnings)
        if rank is not None and side_rank is not None and side_rank != rank:
            raise TraceFormatError(
                p,
                "distributedInfo.rank",
                f"rank {rank} conflicts with rank {side_rank} in {sidecar_path(p).name}",
            )
        rank = rank if rank is not None else side_rank
        side_world = _identity_int(
            side, "world_size", f"{sidecar_path(p).name}: world_size", identity_warnings
        )
        world = world if world is not None else side_world
        side_text = {
            k: _identity_text(side, k, f"{sidecar_path(p).name}: {k}", identity_warnings)
            for k in ("host", "torch_version", "backend", "device", "flops_method")
        }
        trace_info["host"] = side_text["host"] or doc.host_name
        trace_info["torch_version"] = side_text["torch_version"]
        trace_info["backend"] = trace_info["backend"] or side_text["backend"]
        if side_text["device"] and not devices:
            trace_info["device_name"] = side_text["device"]
        if side.get("flops_per_step") is not None:
            trace_info["flops_per_step"] = msgspec.json.encode(side["flops_per_step"]).decode()
            trace_info["flops_method"] = side_text["flops_method"]
    warnings += identity_warnings + id_repairs.warnings(p.name)
    if words:
        warnings.append(words.warning(p.name))
    repaired = _identity_repairs(identity_warnings) | id_repairs.counts() | clipped | dropped
    repaired |= words.repaired() if words else {}
    if repaired:  # counted for the issues column (traceprof.ingest adds what the reader repaired)
        meta = msgspec.json.decode(str(trace_info["meta"]))
        trace_info["meta"] = msgspec.json.encode({**meta, "repaired": repaired}).decode()
    if rank is None:
        if not any(": distributedInfo.rank is " in w for w in identity_warnings):
            warnings.append(f"{p.name}: no distributedInfo.rank in the trace")
    elif rank < 0 or (world is not None and rank >= world):
        raise TraceFormatError(
            p,
            "distributedInfo.rank",
            f"rank {rank} is outside 0..world_size-1 "
            f"(world_size {world}); fix the trace's distributedInfo or its sidecar",
        )
    return ParsedTrace(
        path=str(p),
        sha256=src.sha256(),
        bytes=src.size(),
        source=TraceSource.kineto,
        format="kineto-new" if doc.baseTimeNanoseconds is not None else "kineto-old",
        rank=rank,
        world_size=world,
        trace=trace_info,
        events=_events_table(cols, options.spill_dir),
        devices=to_table(devices, _DEVICE_SCHEMA, rejected, "device"),
        steps=to_table(steps_rows, _STEP_SCHEMA, rejected, "step"),
        collectives=columns_to_table(coll, _COLL_SCHEMA, rejected, "collective"),
        events_read=events_read,
        rejected=rejected,
        first_rejected=first_rejected,
        skipped=skipped,
        flagged=flagged,
        warnings=warnings,
    )


_E_MISMATCH = "'E' whose name matches no open 'B' on its thread (closed the latest)"
_E_EARLY = "'E' before its 'B' (the B is flagged unmatched_begin)"


def _close_begin(
    cols: dict[str, list[Any]],
    open_b: dict[tuple[str, str], list[int]],
    ev: _Event,
    end_ns: int,
    rejected: dict[str, int],
    skipped: dict[str, int],
) -> None:
    """Close a ``B`` row with its ``E`` (stack-matched per pid/tid; a named ``E`` closes the latest ``B``
    of that name, an unnamed one the latest ``B``). An ``E`` with nothing open is rejected."""
    stack = open_b.get((_lane(ev.pid), _lane(ev.tid)))
    if not stack:
        rejected["'E' without an open 'B'"] = rejected.get("'E' without an open 'B'", 0) + 1
        return
    j = len(stack) - 1
    if ev.name:
        j = next((x for x in range(len(stack) - 1, -1, -1) if cols["name"][stack[x]] == ev.name), -1)
        if j < 0:  # no open B of that name on this thread: close the latest, and say so
            j = len(stack) - 1
            skipped[_E_MISMATCH] = skipped.get(_E_MISMATCH, 0) + 1
    row = stack.pop(j)
    if end_ns < cols["ts_ns"][row]:
        cols["flag"][row] = "unmatched_begin"  # an E before its B: no interval
        skipped[_E_EARLY] = skipped.get(_E_EARLY, 0) + 1
    cols["dur_ns"][row] = max(0, end_ns - cols["ts_ns"][row])
    skipped["'E' (merged into its 'B')"] = skipped.get("'E' (merged into its 'B')", 0) + 1


def _as_arrays(cols: dict[str, Any]) -> None:
    """The general path's lists as the columns :func:`traceprof.collectors.kineto.decode.rows` builds
    (in place; the values fit int64: ``traceprof.core.limits.drop_out_of_range`` ran)."""
    for c in ("ts_ns", "dur_ns"):
        cols[c] = np.asarray(cols[c], np.int64)
    for c in ("device", "stream", "correlation", "external_id", "raw_dur_ns"):
        if isinstance(cols[c], list):
            cols[c] = Ints.of(cols[c])


def _identity_int(doc: dict[str, Any], key: str, what: str, warnings: list[str]) -> int | None:
    """``doc[key]`` (a rank or world size) as an int, or None: absent, or not an integer (``1.5``,
    ``"4.0"``, ``"abc"``, ``true``; 1.5 was read as 1, the others as no rank at all, silently), with
    a warning ``what`` names (the file and the field; :func:`_identity_repairs` counts it). A string
    or float that writes an integer (``"7"``, ``7.0``) is read as it, said and counted the same way
    (``... is '7', a string: read as its integer``; it was read silently), as Kineto's id args are.
    A world size below 1 is ignored the same way (``traceprof.core.values.world_size_int``)."""
    v = doc.get(key)
    n, said = world_size_int(v) if key == "world_size" else identity_int(v)
    if said is not None:
        shown = repr(v) if len(repr(v)) <= 60 else repr(v)[:57] + "..."
        warnings.append(f"{what} is {shown}, {said}")
    return n


def _identity_repairs(warnings: list[str]) -> dict[str, int]:
    """The identity values ignored or read from a string or float (:func:`_identity_int`,
    :func:`_identity_text`), counted by
    reason for ``traces.meta.repaired`` (the ``issues`` column of ``traceprof runs``):
    ``"rank0.json: distributedInfo.rank is 1.5, not an integer: ignored"`` ->
    ``{"distributedInfo.rank not an integer: ignored": 1}``."""
    out: dict[str, int] = {}
    for w in warnings:
        field, _, rest = w.partition(": ")[2].partition(" is ")
        reason = f"{field} {rest.rpartition(', ')[2]}"
        out[reason] = out.get(reason, 0) + 1
    return out


def _identity_text(doc: dict[str, Any], key: str, what: str, warnings: list[str]) -> str | None:
    """``doc[key]`` (a backend, host or device name) when it is a string, else None: absent, or
    another JSON type, which was stored as Python's text of it (``"{'x': 1}"``), now ignored with a
    warning ``what`` names (the file and the field)."""
    v = doc.get(key)
    if v is None or isinstance(v, str):
        return v
    shown = repr(v) if len(repr(v)) <= 60 else repr(v)[:57] + "..."
    warnings.append(f"{what} is {shown}, not a string: ignored")
    return None


def _read_sidecar(trace: Path) -> dict[str, Any] | None:
    """The collector's sidecar next to ``trace`` (see ``traceprof.collectors.kineto.capture``), or None."""
    side = sidecar_path(trace)
    if not side.is_file():
        return None
    try:
        raw = side.read_bytes()
        doc = msgspec.json.decode(blank_bom(raw))
    except (OSError, msgspec.DecodeError) as e:
        raise TraceFormatError(side, "", f"unreadable sidecar: {e}") from None
    except RecursionError:
        raise too_deep(side) from None
    if not isinstance(doc, dict):
        raise TraceFormatError(side, "", "sidecar is not a JSON object")
    check_nesting(doc, side, "sidecar", max_nodes=max_nodes(len(raw)))
    return doc


def _main_pid(cols: dict[str, Any]) -> str | None:
    """The pid of the first ProfilerStep, else of the first CPU op."""
    for kind in ("step", "cpu_op"):
        rows = np.flatnonzero(cols["kind"].isin({kind}))
        if len(rows):
            return cols["pid"][int(rows[0])]
    return None


#: The parser's string columns (lists in the general path's loop, :class:`Strs` after it).
_STR_COLS = ("kind", "cat", "name", "pid", "tid", "flag")


class _StepNumbers:
    """N of each ``step`` row's ``ProfilerStep#N`` name (None elsewhere), read through the row's
    name code in ``cols`` as it is now (rows dropped by ``traceprof.core.limits`` included): no column
    of one value per row. Reads like a list (``[i]``, ``len``, iteration)."""

    def __init__(self, cols: dict[str, Any]) -> None:
        self.cols = cols  # kind and name Strs; a take() keeps their values, so the codes below hold
        self.per_name = [_step_number(n) for n in cols["name"].values]
        kinds = cols["kind"].values
        self.step = kinds.index("step") if "step" in kinds else -2

    def _codes(self) -> tuple[np.ndarray, np.ndarray]:
        return self.cols["kind"].codes, self.cols["name"].codes

    def __getitem__(self, i: int) -> int | None:
        kind, name = self._codes()
        return self.per_name[name[i]] if kind[i] == self.step else None

    def __len__(self) -> int:
        return len(self.cols["kind"])

    def __iter__(self) -> Iterator[int | None]:
        kind, name = self._codes()
        is_step = (kind == self.step).tolist()
        return (self.per_name[c] if s else None for c, s in zip(name.tolist(), is_step, strict=True))

    def fit(self) -> bool:
        """Whether every step row's N fits the store's INTEGER (``traceprof.core.limits``)."""
        kind, name = self._codes()
        used = np.unique(name[kind == self.step]).tolist()
        return all(fits(self.per_name[c], INT32) for c in used)


def _devices(props: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for d in props:
        major, minor = d.get("computeMajor"), d.get("computeMinor")
        out.append(
            {
                "device": _int_or_none(d.get("id")),
                "name": d.get("name"),
                "sm_count": _int_or_none(d.get("numSms")),
                "memory_bytes": _int_or_none(d.get("totalGlobalMem")),
                "compute_capability": f"{major}.{minor}" if major is not None else None,
            }
        )
    return out


#: Event string columns with few distinct values (kind, cat, name, pid, tid, class, flag) are
#: dictionary-encoded (int32 codes into the distinct strings): a quarter of the bytes of plain
#: strings for ``name``, far less for the rest. DuckDB and Parquet read them as the strings they
#: stand for (``VARCHAR``), so the stored rows are the same.
_EVENT_SCHEMA = pa.schema(
    [
        ("kind", STR_DICT),
        ("cat", STR_DICT),
        ("name", STR_DICT),
        ("ts_ns", pa.int64()),
        ("dur_ns", pa.int64()),
        ("pid", STR_DICT),
        ("tid", STR_DICT),
        ("device", pa.int32()),
        ("stream", pa.int64()),
        ("correlation", pa.int64()),
        ("external_id", pa.int64()),
        ("step", pa.int32()),
        ("args", pa.string()),
        ("class", STR_DICT),
        ("flag", STR_DICT),
        ("raw_dur_ns", pa.int64()),
    ]
)
_STEP_SCHEMA = pa.schema(
    [
        ("step", pa.int32()),
        ("cpu_start_ns", pa.int64()),
        ("cpu_end_ns", pa.int64()),
        ("device_start_ns", pa.int64()),
        ("device_end_ns", pa.int64()),
        ("is_last", pa.bool_()),
    ]
)
_DEVICE_SCHEMA = pa.schema(
    [
        ("device", pa.int32()),
        ("name", pa.string()),
        ("sm_count", pa.int32()),
        ("memory_bytes", pa.int64()),
        ("compute_capability", pa.string()),
    ]
)


def _process_groups(dist: Any) -> list[dict[str, Any]]:
    """The process groups the rank belongs to, from ``distributedInfo.pg_config``, normalized for
    ``traces.meta.process_groups``: ``[{"name": "1", "desc": "mesh_dp", "ranks": [0, 2]}, ...]``
    (name and description as text or null; entries without a list of integer ranks are left out)."""
    cfg = dist.get("pg_config") if isinstance(dist, dict) else None
    out: list[dict[str, Any]] = []
    for g in cfg if isinstance(cfg, list) else []:
        ranks = g.get("ranks") if isinstance(g, dict) else None
        if (
            not isinstance(ranks, list)
            or not ranks
            or not all(isinstance(r, int) and not isinstance(r, bool) for r in ranks)
        ):
            continue
        name, desc = g.get("pg_name"), g.get("pg_desc")
        out.append(
            {
                "name": name if isinstance(name, str) else None,
                "desc": desc if isinstance(desc, str) else None,
                "ranks": sorted(set(ranks)),
            }
        )
    return out


# the store's collectives columns (traceprof.core.schema): one declaration, so new columns reach the store
_COLL_SCHEMA = row_schema("collectives")


def _events_table(cols: dict[str, Any], spill_dir: str | None) -> pa.Table:
    """The events table of the parser's columns, emptying ``cols`` as it goes (each column is
    converted, then its list or array dropped, so the two copies of one column live at once at
    most; a large column is then on disk in ``spill_dir``, ``traceprof.core.spill.column``).

    Returns:
        Columns of :data:`_EVENT_SCHEMA`; the low-cardinality strings dictionary-encoded (:data:`STR_DICT`).
    """
    arrays = []
    for f in _EVENT_SCHEMA:
        v = cols.pop(f.name)
        # each column built here goes to disk once whole when large (traceprof.core.spill: the events
        # table of 18 M events is 1.6 GB, more than the columns it is built from); args already is
        arrays.append(v if f.name == "args" else spill.column(pa.array(v, f.type), spill_dir))
        del v
    return pa.Table.from_arrays(arrays, schema=_EVENT_SCHEMA)
