"""CPU-side rows of an nsys trace that end far past the rest of it: clipped, as Kineto's are.

An NVTX range, CUDA API call or other CPU-side row whose ``end`` lies years past the capture (a
damaged or hand-edited export: ``end`` is any integer up to int64) stretched every window that
reads it (``nvtx_sum`` gave it 99.99999 % of the time). The rule is the Kineto collector's step 3a
(``traceprof.collectors._far_end``): the reference range is the trace's step ranges, else the
1st..99th percentile of its rows' starts; a CPU-side row whose end lies more than the margin (the
range's length, at least 1 s) past the range's end is clipped to the end of the trace's other sound
rows, ``events.flag`` = ``overrun``, the recorded duration kept in ``raw_dur_ns``, with a warning
naming the rows. GPU rows (kernels, copies, syncs) keep their recorded times; rows of kind ``other``
and instants are not checked.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from traceprof.collectors._far_end import FAR_MARGIN_MIN_NS, far_ends, reference_range

__all__ = ["clip_far_ends"]

#: Each row's kind as a code: a step range, a GPU row (kernel, copy, sync: the GPU's own times, not
#: clipped here), a row not checked (kind ``other``, instants), or any other (CPU-side) row.
_STEP, _GPU, _UNCHECKED, _CPU = 0, 1, 2, 3
_CODE = {"step": _STEP, "other": _UNCHECKED, "instant": _UNCHECKED} | dict.fromkeys(
    ("kernel", "memcpy", "memset", "sync"), _GPU
)


def clip_far_ends(label: str, cols: dict[str, list[Any]]) -> str | None:
    """Clip the CPU-side rows of one trace's columns that end far past it (module doc), in place.

    Args:
        label: The trace in messages (``run.sqlite``, ``run.sqlite (pid 12)``).
        cols: The trace's row columns (``traceprof.collectors.nsys.tables.Rows``): ``kind``,
            ``name``, ``ts_ns``, ``dur_ns`` (ns) and ``flag`` lists; ``raw_dur_ns`` is added (None
            but on the clipped rows) when a row is clipped.

    Returns:
        The warning naming the clipped rows (their count, how far past, and the first three by
        kind and name), or None when none ends far past.
    """
    if not cols["kind"]:
        return None
    n = len(cols["kind"])
    kind = np.fromiter((_CODE.get(k, _CPU) for k in cols["kind"]), np.int8, n)
    ts = np.fromiter(cols["ts_ns"], np.int64, n)
    dur = np.fromiter(cols["dur_ns"], np.int64, n)
    sound = np.fromiter((f is None for f in cols["flag"]), bool, n)
    lo, hi, by_steps = reference_range(kind == _STEP, ts, dur, ~sound)
    margin = max(hi - lo, FAR_MARGIN_MIN_NS)
    rows, end = far_ends(ts, dur, sound, kind != _UNCHECKED, kind != _GPU, hi, margin)
    if not len(rows):
        return None
    past = int((ts[rows] + dur[rows]).max()) - hi
    raw = cols.setdefault("raw_dur_ns", [None] * len(ts))
    for i in rows.tolist():
        raw[i] = int(dur[i])
        cols["dur_ns"][i] = max(0, end - int(ts[i]))
        cols["flag"][i] = "overrun"
    shown = ", ".join(f"{cols['kind'][i]} {cols['name'][i]!r}" for i in rows[:3].tolist())
    where = "step range" if by_steps else "time range"
    return (
        f"{label}: {len(rows)} CPU record(s) end far past the trace's {where} (up to {past / 1e9:,.3f} s "
        f"past it, more than {margin / 1e9:,.3f} s; {shown}{', ...' if len(rows) > 3 else ''}): clipped to "
        "the end of the trace (events.flag = 'overrun', raw_dur_ns keeps the recorded duration)"
    )
