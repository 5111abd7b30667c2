"""Parse the JSON dump of NCCL's example profiler plugin (``ext-profiler/example``, NCCL 2.23+).

The plugin (``NCCL_PROFILER_PLUGIN=libnccl-profiler-example.so``, ``NCCL_PROFILE_DUMP_FILE=prefix``)
writes a Chrome-trace array, one event per line: begin (``ph`` ``b``) and end (``ph`` ``e``) records
with ``cat`` ``GROUP``, ``COLL`` (args ``SeqNum``, ``CommHash``, ``Rank``, ``Count``, ``Datatype``,
``Algorithm``, ``Protocol``, ``nMaxChannels``), ``P2P`` (``CommHash``, ``Rank``, ``Peer``, ``Count``,
``Datatype``), ``PROXY`` (proxy ops and proxy-progress states), ``NET`` (proxy steps) and ``GPU``
(``KernelCh``), closed by an empty object: ``{}]``. ``ts`` is microseconds on the plugin's own
steady clock (from the plugin's start in that process), so it is not comparable across processes
until aligned (``traceprof.collectors.nccl_profiler.align``).

Algorithm:
  1. Decode the array strictly. When that fails, read it line by line (the plugin writes one event
     per line) and repair what is unambiguous, counting each kind in a warning and in
     ``traces.meta.repaired`` (``non-strict JSON: <kind>``, shown by ``runs``): a trailing comma
     before ``]``, bare enum tokens as values (``"Datatype": ncclFloat32`` -> a string), bare
     pointers printed by ``%p`` (``"Stream": 0x55d0c3a1f0`` -> a string, ``(nil)`` -> null),
     ``nan`` / ``inf`` printed by ``%f`` (-> null), a missing closing ``]`` and a last line cut
     short (the process died while writing). Anything else is a TraceFormatError naming line:column.
  2. Pair each ``e`` with the latest open ``b`` of the same (cat, name, id, pid, tid); times to
     integer ns exactly from the number text. Unclosed begins are counted in ``flagged``. A
     ``ts`` of 0 is a time the plugin never set (NCCL 2.28's example plugin prints 0.000000 for
     the begin of ``COLL_API``, ``P2P_API`` and ``KERNEL_LAUNCH`` events, and for the end of
     ``KernelCh`` on channels other than 0), never the plugin's time 0: that side of the pair is
     unknown; the event is stored at its known time with duration 0 and flagged ``zero_ts`` (left
     out of windows and latency), a collective gets a NULL start or end, and a warning counts
     them. A missing, non-numeric or negative ``ts`` (the steady clock never reads below 0), one
     beyond int64 ns, or an end before its begin, is a bad event: an error naming it, or with
     ``on_bad_event="skip"`` skipped and counted (an end before its begin: the pair).
  3. COLL and P2P pairs are ``collective`` events and ``collectives`` rows (source
     ``nccl_profiler``): pg = ``CommHash`` (P2P: ``CommHash:p2p``), seq = ``SeqNum`` (P2P: none),
     op from the name, dtype from ``Datatype`` (``ncclFloat32`` -> ``float32``), elements =
     ``Count`` as NCCL's API counts them: the input (``nelems_in``), except ReduceScatter's
     ``recvcount``, the per-rank output (``nelems_out``); enter = begin, end = end; a P2P's
     ``Peer`` (the other end's rank in the communicator) is ``peer_group_rank``. NCCL numbers
     each op type of a communicator separately (``seqNumber[func]``: AllReduce 0 and AllGather 0
     are different collectives), so ``comms_id`` = ``<CommHash>:<op>:<SeqNum>``
     (``traceprof.core.ops.nccl_comms_id``) identifies an instance across ranks.
     A ``CE_COLL`` pair (NCCL 2.28+: a collective run by the copy engine, printed with
     ``count`` and ``datatype`` but no SeqNum, CommHash or Rank) is a collective too, of the
     file's one CommHash (none where the file holds several), seq none: matched across ranks by
     its order among the communicator's collectives of its op (``ordinal``).
     GROUP, PROXY, NET, GPU and the CE_COLL's ``CE_SYNC`` / ``CE_BATCH`` children are kept as
     ``other`` events with their args.
  4. Rank: ``rank<R>`` in the file name, else the ``Rank`` of the collectives (the rank in the
     communicator; with several communicators, the one with the most collectives, with a warning).
     The plugin writes one file per communicator (``<NCCL_PROFILE_DUMP_FILE>_<commHash>_<rank>.json``),
     so a rank may have several: each file's ``part`` (``ParsedTrace.part``) is its communicators'
     hashes, and files of one rank with other communicators are parts of one job's record. ``Rank``
     is the rank in that communicator: at ingest the files of a run are related by their folder,
     dump prefix and events' ``pid`` (``traceprof.collectors.nccl_profiler._processes`` and
     ``traceprof.collectors._communicators``: global ranks from the communicator spanning a job's
     processes; two jobs' files told apart).

Integers (``traceprof.core.values``' two rules, as the Flight Recorder and NCCL Inspector readers
read theirs): ``Count`` and ``SeqNum`` are a record's numbers, JSON integers: one written as a
string (``"7"``), a float (``7.0``) or a boolean makes its COLL / P2P record bad, as a negative
one does (an error naming it, or skipped and counted with ``--skip-bad-events``). ``Rank`` is an
identity: written as a string or float that is an integer it is read as it, one that is no integer
ignored, either said and counted in ``traces.meta.repaired`` (``args.Rank a string: read as its
integer``). ``ts`` is read from its number's text (a string is no number: a bad event).

Source fields read: ``name, cat, ph, id, pid, tid, ts, args`` and in args ``SeqNum, CommHash, Rank,
Count, Datatype, Peer`` (``CE_COLL``: ``count, datatype``).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import msgspec
import pyarrow as pa

from traceprof.collectors._arrow import row_schema
from traceprof.collectors._duplicates import duplicate_records
from traceprof.collectors.nccl_profiler.names import looks_like_plugin_dump, rank_in_name
from traceprof.core.bounded import too_deep
from traceprof.core.errors import TraceFormatError
from traceprof.core.fileio import GZIP_MAGIC, blank_bom, read_file, read_maybe_gzip
from traceprof.core.limits import INT64, fits, record_fits, shown, skip_hint
from traceprof.core.ops import dtype_bytes, nccl_comms_id, normalize_op
from traceprof.core.parsed import DEFAULT_OPTIONS, ParsedTrace, ParseOptions
from traceprof.core.timeconv import us_text_to_ns
from traceprof.core.values import identity_int, integer, record_int
from traceprof.core.vocab import CollectiveSource, TraceSource

__all__ = ["parse", "looks_like_plugin_dump"]

_BARE = re.compile(r"(:\s*)(-?(?:nan|inf)|0[xX][0-9a-fA-F]+|\(nil\)|[A-Za-z_][A-Za-z0-9_.]*)(\s*[,}\]])")
_KEYWORDS = frozenset({"true", "false", "null"})
_BYTE = re.compile(r"byte (\d+)")


class _Event(msgspec.Struct):
    name: str = ""
    cat: str = ""
    ph: str = ""
    id: Any = None
    pid: Any = None
    tid: Any = None
    ts: msgspec.Raw = msgspec.Raw(b"")
    args: dict[str, Any] | None = None


def _lane(v: Any) -> str:
    """An event's ``pid`` / ``tid`` as lane text: ``""`` where the event has none (``str()`` wrote
    ``'None'``, which read as a process named None)."""
    return "" if v is None else str(v)


def _identities() -> Callable[[_Event], tuple[Any, ...] | None]:
    """What identifies each plugin event, called on the events in file order: every field (``ts``
    as written, args with keys sorted); None for the closing empty object and a ``ts`` of 0 (never
    set: such records repeat legitimately, e.g. one ``KernelCh`` end per channel). An end record
    has no args: its identity also holds that of the begin it closes (the latest open begin of the
    same cat, name, id, pid and tid, copies included), so the ends of two channels that end at one
    ``ts`` are not copies of each other (the example plugin prints every ``KernelCh`` with one id),
    while a begin / end pair written twice is."""
    open_: dict[tuple[Any, ...], list[tuple[Any, ...]]] = {}

    def identity(ev: _Event) -> tuple[Any, ...] | None:
        if not (ev.ph or ev.name or ev.cat):
            return None
        ts = bytes(ev.ts)
        key = (ev.cat, ev.name, repr(ev.id), repr(ev.pid), repr(ev.tid))
        args = msgspec.json.encode(ev.args, order="sorted") if ev.args is not None else None
        own: tuple[Any, ...] = (ev.name, ev.cat, ev.ph, *key[2:], ts, args)
        if ev.ph == "b":
            open_.setdefault(key, []).append(own)
        elif ev.ph == "e":
            stack = open_.get(key)
            own = (*own, stack.pop() if stack else None)
        return own if ts.strip(b"0.-+ ") else None

    return identity


def _repair_line(line: str, counts: Counter[str]) -> str:
    def fix(m: re.Match[str]) -> str:
        tok = m.group(2)
        if tok in _KEYWORDS:
            return m.group(0)
        if tok.lstrip("-") in ("nan", "inf"):
            counts["nan/inf printed as a number -> null"] += 1
            return f"{m.group(1)}null{m.group(3)}"
        if tok == "(nil)":
            counts["null pointer (nil) -> null"] += 1
            return f"{m.group(1)}null{m.group(3)}"
        if tok[:2] in ("0x", "0X"):
            counts["bare pointer token quoted"] += 1
            return f'{m.group(1)}"{tok}"{m.group(3)}'
        counts["bare enum token quoted"] += 1
        return f'{m.group(1)}"{tok}"{m.group(3)}'

    prev = None
    while prev != line:  # overlapping matches (",x,y}") need a second pass
        prev, line = line, _BARE.sub(fix, line)
    return line


def _decode_lines(path: Path, text: str) -> tuple[list[_Event], Counter[str]]:
    """Line-by-line decoding with repairs (module doc, step 1)."""
    counts: Counter[str] = Counter()
    events: list[_Event] = []
    lines = text.split("\n")
    last = max((i for i, ln in enumerate(lines) if ln.strip()), default=-1)
    closed = False
    for i, raw in enumerate(lines):
        s = raw.strip()
        if not s:
            continue
        if i == 0 or (s.startswith("[") and not events):
            s = s[1:].strip()
            if not s:
                continue
        if s in ("]", "{}]", "{}],", "{}", "{},"):
            closed = closed or "]" in s
            if s.startswith("{}"):
                events.append(_Event())  # the plugin's closing empty object
            continue
        if s.endswith("]") and closed is False and i == last:
            s, closed = s[:-1].rstrip(), True
        body = s[:-1] if s.endswith(",") else s
        try:
            events.append(msgspec.json.decode(body, type=_Event))
            continue
        except (msgspec.DecodeError, msgspec.ValidationError):
            pass
        except RecursionError:
            raise too_deep(path, f"line {i + 1}") from None
        fixed = _repair_line(body, counts)
        try:
            events.append(msgspec.json.decode(fixed, type=_Event))
            continue
        except RecursionError:
            raise too_deep(path, f"line {i + 1}") from None
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            if i == last and not closed:
                counts["last event cut short (file truncated) dropped"] += 1
                closed = True
                continue
            m = _BYTE.search(str(e))
            col = (int(m.group(1)) if m else 0) + 1 + (len(raw) - len(raw.lstrip()))
            raise TraceFormatError(
                path, f"line {i + 1}:{col}", f"not an event the plugin writes ({e}); fix or remove the line"
            ) from None
    if not closed:
        counts["missing closing ']' added"] += 1
    if text.rstrip().rstrip("]").rstrip().endswith(","):
        counts["trailing comma before ']' dropped"] += 1
    return events, counts


def _decode(path: Path, data: bytes) -> tuple[list[_Event], Counter[str]]:
    try:
        return msgspec.json.decode(data, type=list[_Event]), Counter()
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):  # the lines say which one
        return _decode_lines(path, data.decode("utf-8", "replace"))


def _dtype(v: Any) -> str | None:
    """``ncclFloat32`` -> ``float32``, ``ncclBfloat16`` -> ``bfloat16``; other values as text."""
    if v is None:
        return None
    s = str(v)
    return s[4:].lower() if s.startswith("nccl") else s


def _bad_value(a: dict[str, Any]) -> str | None:
    """Why a COLL / P2P record cannot be stored (``"negative 'Count' (-4)"``, ``"negative 'SeqNum'
    (-1)"``, ``"'SeqNum' not an integer ('7')"``: a JSON integer only, module doc; ``"'CommHash'
    not a string or an integer ({'a': 1})"``), or None. A CommHash or Datatype of another JSON type
    would be stored as Python's text of it."""
    for key in ("Count", "SeqNum"):
        n, problem = record_int(a.get(key))
        if problem is not None:
            return f"{key!r} {problem} ({shown(a.get(key))})"
        if n is not None and n < 0:
            return f"negative {key!r} ({n})"
    comm, dtype = a.get("CommHash"), a.get("Datatype")
    if comm is not None and (isinstance(comm, bool) or not isinstance(comm, (int, str))):
        return f"'CommHash' not a string or an integer ({shown(comm)})"
    if dtype is not None and not isinstance(dtype, str):
        return f"'Datatype' not a string ({shown(dtype)})"
    return None


def parse(path: str | Path, options: ParseOptions = DEFAULT_OPTIONS) -> ParsedTrace:
    """Parse one NCCL example-profiler dump.

    Args:
        path: The plugin's JSON file.
        options: How to read it (``traceprof.core.parsed.ParseOptions``); its ``on_bad_event``: ``"raise"`` stops at an event without a numeric ``ts`` or with a negative one, or a COLL / P2P event
            with a value that cannot be stored (:func:`_rows`); ``"skip"`` counts it.

    Returns:
        A :class:`ParsedTrace` (source ``nccl_profiler``) with events and collectives; times are the
        plugin's clock in ns (``traces.meta.clock`` = ``plugin``) until ingest aligns them.

    Raises:
        TraceFormatError: Unreadable; JSON that cannot be repaired (naming line:column); a bad
            ``ts`` (with ``raise``); no COLL / P2P event, or no rank.
    """
    p = Path(path).resolve()
    on_bad_event = options.on_bad_event
    raw = read_file(p)
    if raw[:2] == GZIP_MAGIC:  # a gzipped dump (``gzip nccl_profile_rank0.json``): inflated under the cap
        raw = read_maybe_gzip(p, options.max_inflate_ratio)[1]
    evs, repairs = _decode(p, blank_bom(raw))  # a leading BOM: blanked, offsets kept
    rejected: Counter[str] = Counter()
    skipped: Counter[str] = Counter()
    open_: dict[tuple[Any, ...], list[tuple[int, int | None]]] = {}
    spans: list[_Span] = []
    unset: Counter[str] = Counter()  # records whose ts is 0 (never set), by "cat name begin|end"
    copied: dict[str, int] = {}  # an event written twice: kept once, counted in traces.meta.repaired
    copies, said_copies = duplicate_records(
        p, evs, _identities(), lambda i: f"event #{i} ({evs[i].cat} {evs[i].name!r})", copied
    )
    for i, ev in enumerate(evs):
        if not ev.ph and not ev.name and not ev.cat:
            skipped["empty object"] += 1
            continue
        if i in copies:
            continue
        try:
            ts = us_text_to_ns(bytes(ev.ts)) if ev.ts else None
        except ValueError:
            ts = None
        if ts is None or not fits(ts, (0, INT64[1])):  # the plugin's steady clock never reads below 0
            # a ts beyond int64 ns is named by the field and its text, as Kineto's are (it was
            # 'enter_ns' beyond int64 in ns on its pair, or "ends before its begin" on a begin)
            why = (
                "missing or non-numeric 'ts'"
                if ts is None
                else "negative 'ts'"
                if ts < 0
                else "'ts' beyond int64"
            )
            if on_bad_event == "raise":
                value = "" if ts is None else f" ({bytes(ev.ts).decode()[:40]} us)"
                raise TraceFormatError(
                    p,
                    f"event #{i} ({ev.cat} {ev.name!r})",
                    f"{why}{value}{skip_hint('event')}",
                )
            rejected[why] += 1
            continue
        if ts == 0:  # module doc, step 2: a time never set
            unset[
                f"{ev.cat} {ev.name} {'begin' if ev.ph == 'b' else 'end' if ev.ph == 'e' else 'instant'}"
            ] += 1
        known = ts or None
        key = (ev.cat, ev.name, str(ev.id), str(ev.pid), str(ev.tid))
        if ev.ph == "b":
            open_.setdefault(key, []).append((i, known))
        elif ev.ph == "e":
            stack = open_.get(key)
            if stack:
                j, start = stack.pop()
                if start and known and known < start:  # a negative duration: neither time can be trusted
                    if on_bad_event == "raise":
                        raise TraceFormatError(
                            p,
                            f"event #{i} ({ev.cat} {ev.name!r})",
                            f"ends before its begin (event #{j}) by {_us_text(start - known)} us"
                            + skip_hint("event"),
                        )
                    rejected["ends before its begin"] += 1
                    continue
                spans.append(_Span(j, start, known, None if start and known else "zero_ts"))
            else:
                rejected["end without a begin"] += 1
        else:
            spans.append(_Span(i, known, known, None if known else "zero_ts"))
    spans += [
        _Span(j, s, None, "unmatched_begin" if s else "zero_ts") for stack in open_.values() for j, s in stack
    ]
    flagged = Counter(sp.flag for sp in spans if sp.flag)
    spans.sort(key=lambda sp: (sp.start or sp.end or 0, sp.at))
    events, colls = _rows(p, evs, spans, on_bad_event, rejected)
    if not any(ev.ph or ev.name or ev.cat for ev in evs):
        raise TraceFormatError(
            p,
            "",
            "no events: the NCCL profiler plugin wrote an empty dump (the process ran "
            "no NCCL operation while profiled, or exited before the plugin flushed)",
        )
    if not colls and rejected:
        raise TraceFormatError(p, "", f"no valid COLL or P2P event: all skipped ({dict(rejected)})")
    if not colls:
        raise TraceFormatError(
            p, "", "no COLL or P2P event: not an NCCL profiler-plugin dump with collectives"
        )
    rank, warnings, repaired = _rank(p, evs)
    # this file's communicators (module doc, step 4): a rank's other files hold others
    part = ",".join(sorted({str(c["pg"]).removesuffix(":p2p") for c in colls if c["pg"] is not None})) or None
    # counted where every source's repairs are (traces.meta.repaired: `runs` issues, the report)
    repaired |= {f"non-strict JSON: {what}": n for what, n in repairs.items()} | copied
    warnings += [said_copies] if said_copies else []
    if repairs:
        warnings.append(
            f"{p.name}: repaired non-strict JSON: "
            + ", ".join(f"{n} x {what}" for what, n in sorted(repairs.items()))
        )
    if unset:
        warnings.append(
            f"{p.name}: {sum(unset.values())} record(s) with ts 0.000000, a time the plugin never set ("
            + ", ".join(f"{n} x {what}" for what, n in sorted(unset.items()))
            + "): that begin or end "
            "is unknown; stored at the other end with duration 0, flagged zero_ts (a collective's start "
            "or end NULL)"
        )
    return ParsedTrace.of_bytes(
        p,
        raw,
        source=TraceSource.nccl_profiler,
        format="nccl-profiler-example",
        rank=rank,
        world_size=None,
        part=part,
        trace={
            "pid": next((e["pid"] for e in events if e["pid"]), None),  # every event's getpid()
            "meta": msgspec.json.encode(
                {
                    "clock": "plugin",
                    **({"part": part} if part else {}),
                    **({"repaired": repaired} if repaired else {}),
                }
            ).decode(),
        },
        events=pa.Table.from_pylist(events, schema=_EVENT_SCHEMA),
        collectives=pa.Table.from_pylist(colls, schema=_COLL_SCHEMA),
        events_read=len(evs),
        rejected=dict(rejected),
        skipped=dict(skipped),
        flagged=dict(flagged),
        warnings=warnings,
    )


class _Span(NamedTuple):
    """A paired (or lone) record: the begin's event index (``at``), its start and end ns (None: unknown,
    a ts of 0, or no end record) and its ``events.flag``."""

    at: int
    start: int | None
    end: int | None
    flag: str | None


_EVENT_COLS = (
    "kind",
    "cat",
    "name",
    "ts_ns",
    "dur_ns",
    "pid",
    "tid",
    "correlation",
    "external_id",
    "args",
    "flag",
)
_EVENT_SCHEMA = pa.schema([row_schema("events").field(c) for c in _EVENT_COLS])
_COLL_SCHEMA = row_schema("collectives")
#: Store column -> the dump's field it is read from, for a value too long or too large to be named as
#: the file spells it (``'name' longer than 1 MiB``, not ``'op'``; ``traceprof.core.limits.record_fits``).
_FIELDS = {
    "op": "name",
    "pg": "args.CommHash",
    "seq": "args.SeqNum",
    "external_id": "args.SeqNum",
    "nelems_in": "args.Count",
    "nelems_out": "args.Count",
}


def _us_text(ns: int) -> str:
    """``ns`` as microseconds with 3 decimals (the plugin's own notation)."""
    return f"{ns // 1000:,}.{ns % 1000:03d}"


def _rows(
    p: Path, evs: list[_Event], spans: list[_Span], on_bad_event: str, rejected: Counter[str]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Event and collective rows of the paired spans (module doc, step 3). A COLL / P2P record
    whose ``Count`` or ``SeqNum`` is not an integer, is beyond int64 (its bytes too), whose
    ``Count`` is negative, or whose ``CommHash`` / ``Datatype`` is of another JSON type
    (:func:`_bad_value`) is refused: an error naming the event, or with ``on_bad_event="skip"``
    left out (its event too) and counted in ``rejected``."""
    events: list[dict[str, Any]] = []
    colls: list[dict[str, Any]] = []
    file_comm = _file_comm(evs)
    for j, start, end, flag in spans:
        ev = evs[j]
        a = ev.args or {}
        if ev.cat == "CE_COLL":  # NCCL 2.28+ copy-engine collective: its args as a COLL's
            a = {"Count": a.get("count"), "Datatype": a.get("datatype"), "CommHash": file_comm} | a
        coll = ev.cat in ("COLL", "P2P", "CE_COLL")
        where = f"event #{j} ({ev.cat} {ev.name!r})"
        problem = _bad_value(a) if coll else None
        if problem is not None:
            if on_bad_event == "raise":
                raise TraceFormatError(p, where, problem + skip_hint(where))
            rejected[problem[: problem.index(" (")]] += 1
            continue
        events.append(
            {
                "kind": "collective" if coll else "other",
                "cat": f"nccl:{ev.cat}",
                "name": ev.name,
                "ts_ns": start or end or 0,
                "dur_ns": max(end - start, 0) if start and end else 0,
                "pid": _lane(ev.pid),
                "tid": _lane(ev.tid),
                "correlation": None,
                "external_id": integer(a.get("SeqNum")) if coll else None,
                "args": msgspec.json.encode(a).decode(),
                "flag": flag,
            }
        )
        if not coll:
            if not record_fits(p, where, on_bad_event, rejected, (events[-1], _EVENT_SCHEMA), fields=_FIELDS):
                events.pop()
            continue
        p2p = ev.cat == "P2P"
        dtype = _dtype(a.get("Datatype"))
        n = integer(a.get("Count"))
        size = dtype_bytes(dtype)
        comm = a.get("CommHash")
        op = normalize_op(ev.name) if ev.name else "unknown"
        nbytes = n * size if n is not None and size else None
        side = "out" if op == "reduce_scatter" else "in"  # ncclReduceScatter's count is the per-rank output
        colls.append(
            {
                "source": CollectiveSource.nccl_profiler,
                "pg": None if comm is None else f"{comm}{':p2p' if p2p else ''}",
                "seq": None if p2p else integer(a.get("SeqNum")),
                "op": op,
                "dtype": dtype,
                "comms_id": None if p2p else nccl_comms_id(comm, op, integer(a.get("SeqNum"))),
                f"nelems_{side}": n,
                f"bytes_{side}": nbytes,
                "enter_ns": start,
                "start_ns": start,
                "end_ns": end,
                "tid": str(ev.tid),
                "peer_group_rank": _peer(a.get("Peer")) if p2p else None,
            }
        )
        if not record_fits(
            p,
            where,
            on_bad_event,
            rejected,
            (colls[-1], _COLL_SCHEMA),
            (events[-1], _EVENT_SCHEMA),
            fields=_FIELDS,
        ):
            colls.pop(), events.pop()
    seen: Counter[tuple[Any, str]] = Counter()
    for r in colls:
        r["ordinal"] = seen[(r["pg"], r["op"])]
        seen[(r["pg"], r["op"])] += 1
    return events, colls


def _file_comm(evs: list[_Event]) -> Any:
    """The one ``CommHash`` of a file's COLL / P2P records (the plugin writes a file per
    communicator), given to its copy-engine collectives (``CE_COLL``, which print none); None
    where the file holds none or several. A refused record's (:func:`_bad_value`) is none."""
    comms = {
        (ev.args or {}).get("CommHash")
        for ev in evs
        if ev.cat in ("COLL", "P2P") and ev.ph == "b" and _bad_value(ev.args or {}) is None
    }
    return comms.pop() if len(comms) == 1 else None


def _peer(value: Any) -> int | None:
    """A P2P record's ``Peer`` (the other end's rank in the communicator) when it is an integer
    rank (>= 0, int32), else None."""
    n = integer(value)
    return n if n is not None and 0 <= n < 2**31 else None


def _rank(path: Path, evs: list[_Event]) -> tuple[int | None, list[str], dict[str, int]]:
    """(rank, warnings, repairs): the rank (module doc, step 4) and the ``Rank`` values read or
    ignored by the identity rule (module doc), counted by ``"args.Rank <what>"``."""
    per_comm: dict[Any, Counter[int]] = {}
    said: Counter[str] = Counter()  # what identity_int says of a Rank -> records
    first: dict[str, str] = {}  # what it says -> the first such value, shown
    for ev in evs:
        a = ev.args or {}
        if (
            ev.cat in ("COLL", "P2P") and ev.ph == "b" and _bad_value(a) is None
        ):  # a refused record says nothing
            r, what = identity_int(a.get("Rank"))
            if what is not None:
                said[what] += 1
                first.setdefault(what, shown(a.get("Rank")))
            if r is not None:
                per_comm.setdefault(a.get("CommHash"), Counter())[r] += 1
    warnings = [
        f"{path.name}: {n} COLL / P2P record(s) whose args.Rank is {first[what]} (first), {what}"
        for what, n in said.items()
    ]
    repaired = {f"args.Rank {what}": n for what, n in said.items()}
    named = rank_in_name(path.name)
    if named is not None:
        return named, warnings, repaired
    if not per_comm:
        return None, warnings, repaired
    ranks = {r for c in per_comm.values() for r in c}
    if len(ranks) == 1:
        return ranks.pop(), warnings, repaired
    comm, counts = max(per_comm.items(), key=lambda kv: sum(kv[1].values()))
    rank = counts.most_common(1)[0][0]
    return (
        rank,
        [
            *warnings,
            f"{path.name}: ranks {sorted(ranks)} in several communicators; rank {rank} of communicator "
            f"{comm} (most collectives) taken as the global rank; name the file rank<R>... to say otherwise",
        ],
        repaired,
    )
