"""torch.profiler ``export_memory_timeline`` output: memory by category over time (a source).

``prof.export_memory_timeline(path, device)`` (``torch.profiler._memory_profiler``, needs
``profile_memory=True, record_shapes=True, with_stack=True``) writes, by the suffix of ``path``:

- ``*.raw.json.gz`` (raw): a JSON list of entries ``[t, action, bytes, category]`` for one device:
  ``t`` the time (epoch ns, as the profiler's events; ``-1`` for memory allocated before the
  profile, ``PREEXISTING``), ``action`` 1 PREEXISTING, 2 CREATE, 3 INCREMENT_VERSION (two entries:
  ``-bytes`` in the old version's category, ``+bytes`` in the new one's), 4 DESTROY (``-bytes``);
  ``category`` 0 parameter, 1 optimizer_state, 2 input, 3 temporary, 4 activation, 5 gradient,
  6 autograd_detail, 7 unknown (torch's ``_CATEGORY_TO_INDEX``; unknown: memory it could not
  attribute to a tensor). torch sorts the entries by (t, action).
- ``*.json`` / ``*.json.gz`` (coalesced): ``[times, sizes]``: ``times[i]`` in microseconds
  (``int(t / 1000)``; the preexisting entries at the first time), ``sizes[i]`` the bytes per
  category after every entry at that time, ``[0, parameter, optimizer_state, ..., unknown]``.

Neither form names the rank or the device: the rank comes from the file name (``rank3``,
``rank_3``, ``rank-3``), else ingest's rule for a file without rank; the device from a
``cuda:1`` / ``cuda_1`` / ``cuda1`` in the name, else unknown (NULL).

Algorithm:
  1. Read the file (gzip too), decode it as one of the two forms; an entry that is not four
     integers, an action outside 1..4 or a category outside 0..7 is a bad entry (an error naming
     the file and the entry, or with ``on_bad_event="skip"`` skipped and counted). Entries whose
     bytes add up (in absolute value) beyond int64 are refused: a running total of them would
     overflow the analysis' int64 sums (a silent wrong peak).
  2. Every entry is one ``events`` row of kind ``instant``, cat ``memory_timeline``, named after its
     category, at ``t`` (preexisting entries at the first real time), with args ``Ev Idx`` (its
     index: the order of entries of one time), ``Action``, ``Bytes`` (signed as in the file),
     ``Category`` and ``Device Id`` when the name gives it. The coalesced form becomes one row per
     (time, category) whose bytes changed, with the change as ``Bytes`` (action ``create`` or
     ``destroy``). The ``memory_events`` view and ``analyses/memory.py`` read them.

Source fields read: the entries' four integers; the coalesced form's times and sizes.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa

from traceprof.collectors._arrow import row_schema
from traceprof.core.errors import NotATraceError, TraceFormatError
from traceprof.core.fileio import GZIP_MAGIC, blank_bom, read_maybe_gzip
from traceprof.core.limits import INT32, INT64, fits, shown, skip_hint
from traceprof.core.parsed import DEFAULT_OPTIONS, ParsedTrace, ParseOptions
from traceprof.core.vocab import MemoryCategory, TraceSource
from traceprof.ingest import sources

__all__ = ["parse", "CATEGORIES", "ACTIONS"]

#: torch's category index -> name (``_CATEGORY_TO_INDEX``: the order of ``_CATEGORY_TO_COLORS``).
CATEGORIES = MemoryCategory.values()
#: torch's ``Action`` value -> name.
ACTIONS = {1: "preexisting", 2: "create", 3: "increment_version", 4: "destroy"}
_HEAD = re.compile(rb"^\s*\[\s*\[\s*-?\d")
_RANK = re.compile(r"(?i)rank[_-]?(\d+)")
_DEVICE = re.compile(r"(?i)cuda[:_-]?(\d+)")


def _claims(path: Path, head: bytes) -> bool:
    """A file (any name; ``.gz`` too) whose text starts with a list of lists of integers."""
    if head.startswith(GZIP_MAGIC):
        head = sources.gunzip_head(head)
    return _HEAD.match(blank_bom(head)) is not None


def _name_int(pattern: re.Pattern[str], name: str) -> int | None:
    m = pattern.search(name)
    return int(m.group(1)) if m else None


def _entries(
    p: Path, doc: Any, on_bad_event: str, rejected: dict[str, int]
) -> tuple[list[tuple[int, int, int, int, int]], str]:
    """(entries as (index, t, action, bytes, category), form): the raw form as it is, the coalesced
    form as the changes of each category between consecutive times (t in ns)."""
    coalesced = (
        isinstance(doc, list)
        and len(doc) == 2
        and isinstance(doc[0], list)
        and isinstance(doc[1], list)
        and bool(doc[1])
        and isinstance(doc[1][0], list)
        and len(doc[1][0]) == len(CATEGORIES) + 1
    )
    if coalesced:
        return _coalesced(p, doc), "coalesced"
    if not isinstance(doc, list) or not doc or _bad_entry(doc[0]):
        # a JSON list of integer lists of another kind (a config, say): not this source's file
        raise NotATraceError(
            p,
            "",
            "not an export_memory_timeline file: expected a JSON list of entries [t, action, "
            "bytes, category], or [times, sizes]",
        )
    out: list[tuple[int, int, int, int, int]] = []
    for i, e in enumerate(doc):
        why = _bad_entry(e)
        if why:
            if on_bad_event == "raise":
                raise TraceFormatError(p, f"entry #{i} ({_show(e)})", why + skip_hint("entry"))
            rejected[why] = rejected.get(why, 0) + 1
            continue
        out.append((i, e[0], e[1], e[2], e[3]))
    return out, "raw"


def _bad_entry(e: Any) -> str:
    """Why a raw entry cannot be read, or ""."""
    if not isinstance(e, list) or len(e) != 4:
        return "not a list of four values [t, action, bytes, category]"
    if any(not isinstance(v, int) or isinstance(v, bool) for v in e):
        return "a value that is not an integer"
    if not all(fits(v, INT64) for v in e):
        return "a value beyond int64"
    t, action, nbytes, cat = e
    if action not in ACTIONS:
        return f"action {action} is not one of 1..4 (preexisting, create, increment_version, destroy)"
    if not 0 <= cat < len(CATEGORIES):
        return f"category {cat} is not one of 0..7"
    if t < 0 and not (t == -1 and action == 1):
        return "a negative time on an entry that is not preexisting (t = -1)"
    if (action in (1, 2) and nbytes < 0) or (action == 4 and nbytes > 0):
        return "bytes of the wrong sign for the action (created memory is positive, destroyed negative)"
    return ""


def _show(e: Any) -> str:
    text = msgspec.json.encode(e).decode() if not isinstance(e, bytes) else repr(e)
    return text if len(text) <= 80 else text[:77] + "..."


def _coalesced(p: Path, doc: list[Any]) -> list[tuple[int, int, int, int, int]]:
    """The changes per category between consecutive times of the ``[times, sizes]`` form."""
    times, sizes = doc
    if not isinstance(times, list) or len(times) != len(sizes):
        raise TraceFormatError(p, "", "export_memory_timeline [times, sizes]: the two lists differ in length")
    width = len(CATEGORIES) + 1
    prev = [0] * len(CATEGORIES)
    out: list[tuple[int, int, int, int, int]] = []
    for i, (t, row) in enumerate(zip(times, sizes, strict=True)):
        if (
            not isinstance(t, int)
            or isinstance(t, bool)
            or not isinstance(row, list)
            or len(row) != width
            or any(not isinstance(v, int) or isinstance(v, bool) for v in row)
            or t < 0
            or t > INT64[1] // 1000
        ):
            raise TraceFormatError(
                p,
                f"time #{i}",
                f"expected an integer time in us and {width} integer sizes "
                f"[0, {', '.join(CATEGORIES)}], got {_show([t, row])}",
            )
        for c, v in enumerate(row[1:]):
            if v != prev[c]:
                out.append((len(out), t * 1000, 2 if v > prev[c] else 4, v - prev[c], c))
                prev[c] = v
    return out


def parse(path: str | Path, options: ParseOptions = DEFAULT_OPTIONS) -> ParsedTrace:
    """Parse one ``export_memory_timeline`` file (module doc) into ``instant`` events.

    Args:
        path: The file (``.gz`` or plain JSON).
        options: How to read it (``traceprof.core.parsed.ParseOptions``): the gzip inflate cap, and
            ``on_bad_event``: ``raise`` (default) or ``skip`` bad entries (counted in ``rejected``).

    Returns:
        A :class:`ParsedTrace` (source ``memory_timeline``); rank from the file name or None.

    Raises:
        TraceFormatError: Unreadable or not JSON; not one of the two forms; with
            ``on_bad_event="raise"`` a bad entry (naming its index); no entry left; a device in
            the file name beyond int32; bytes adding up (in absolute value) beyond int64.
    """
    p = Path(path).resolve()
    on_bad_event = options.on_bad_event
    raw, data = read_maybe_gzip(p, options.max_inflate_ratio)
    try:
        doc = msgspec.json.decode(data)
    except msgspec.DecodeError as e:
        raise TraceFormatError(p, "", f"not valid JSON ({e})") from None
    rejected: dict[str, int] = {}
    entries, form = _entries(p, doc, on_bad_event, rejected)
    if not entries:
        raise TraceFormatError(p, "", f"no readable entry (all {sum(rejected.values())} skipped: {rejected})")
    moved = sum(abs(b) for _, _, _, b, _ in entries)  # bounds every running total the analysis sums in int64
    if moved > INT64[1]:
        raise TraceFormatError(
            p,
            "",
            f"the entries' bytes add up to {shown(moved)} (allocated and freed), beyond "
            "int64: not a real timeline (its totals would overflow)",
        )
    device = _name_int(_DEVICE, p.name)
    if device is not None and not fits(
        device, INT32
    ):  # the view reads Device Id as INTEGER: never a silent NULL
        raise TraceFormatError(
            p, "", f"device {shown(device)} in the file name (cuda:N) is beyond int32; not a real device"
        )
    real = [t for _, t, _, _, _ in entries if t >= 0]
    first = min(real) if real else 0
    warnings = [] if real else [f"{p.name}: every entry is preexisting (t = -1): no time, stored at 0"]
    dev_arg = "" if device is None else f',"Device Id":{device}'
    n = len(entries)
    cols = {
        "kind": ["instant"] * n,
        "cat": ["memory_timeline"] * n,
        "name": [CATEGORIES[c] for *_, c in entries],
        "ts_ns": [t if t >= 0 else first for _, t, _, _, _ in entries],
        "dur_ns": [0] * n,
        "pid": [""] * n,
        "tid": [""] * n,
        "args": [
            f'{{"Ev Idx":{i},"Action":"{ACTIONS[a]}","Bytes":{b},"Category":"{CATEGORIES[c]}"{dev_arg}}}'
            for i, _, a, b, c in entries
        ],
    }
    schema = row_schema("events")
    table = pa.table(
        {f.name: pa.array(cols[f.name], f.type) if f.name in cols else pa.nulls(n, f.type) for f in schema},
        schema=schema,
    )
    if device is None:
        warnings.append(
            f"{p.name}: export_memory_timeline output does not name its device and the file name has "
            "no cuda:N: stored with device unknown (name it <...>_cuda<N>.raw.json.gz to say)"
        )
    return ParsedTrace.of_bytes(
        p,
        raw,
        source=TraceSource.memory_timeline,
        format=f"memory-timeline-{form}",
        rank=_name_int(_RANK, p.name),
        world_size=None,
        trace={"device_name": None, "meta": msgspec.json.encode({"form": form, "device": device}).decode()},
        events=table,
        events_read=len(doc) if form == "raw" else n,
        rejected=rejected,
        warnings=warnings,
    )


sources.register(
    sources.Collector(
        "memory_timeline",
        "torch.profiler export_memory_timeline output (*.raw.json.gz, or [times, sizes] *.json)",
        _claims,
        lambda p, options: [parse(p, options)],
        order=30,
        rank_field="rank<N> in the file name",
        world_field="world size (not recorded)",
    )
)
