"""Rows of an nsys trace that end far past the rest of it: clipped, as Kineto's are.

An NVTX range, CUDA API call or other CPU-side row whose ``end`` lies years past the capture (a
damaged or hand-edited export: ``end`` is any integer up to int64) stretched every window that
reads it (``nvtx_sum`` gave it 99.99999 % of the time). The rule is the Kineto collector's step 3a
(``traceprof.collectors._far_end``): the reference range is the trace's step ranges, else the
1st..99th percentile of its rows' starts; a CPU-side row whose end lies more than the margin (the
range's length, at least 1 s) past the range's end is clipped to the end of the trace's other sound
rows, ``events.flag`` = ``overrun``, the recorded duration kept in ``raw_dur_ns``, with a warning
naming the rows. GPU rows (kernels, copies, memsets, syncs) are checked and clipped the same way: a
kernel whose ``end`` lies years past the capture made ``kernel_sum`` read 3e15 ns and the GPU "idle
0 % of the window" (Kineto clips the same case, ``traceprof.collectors.kineto.checks``). Rows of kind
``other`` and instants are not checked.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from traceprof.collectors._far_end import (
    FAR_END_REPAIR,
    FAR_MARGIN_MIN_NS,
    GPU_OVERRUN_REPAIR,
    count_repair,
    far_ends,
    lane_overruns,
    reference_range,
)

__all__ = ["clip_far_ends"]

#: Each row's kind as a code: a step range, a GPU row on a stream (kernel, copy, memset), a row not
#: checked (kind ``other``, instants), or any other (CPU-side) row (a sync is timed by the CPU's wait).
_STEP, _GPU, _UNCHECKED, _CPU = 0, 1, 2, 3
_CODE = {"step": _STEP, "other": _UNCHECKED, "instant": _UNCHECKED} | dict.fromkeys(
    ("kernel", "memcpy", "memset"), _GPU
)


def clip_far_ends(
    label: str, cols: dict[str, list[Any]], repaired: dict[str, int] | None = None
) -> list[str]:
    """Clip the rows of one trace's columns that end far past it or overrun their stream, in place.

    CPU-side rows that end far past the reference range are clipped to the trace's end; GPU rows
    (kernels, copies, memsets) that run past the next row on their (device, stream) by more than
    5 us are clipped to its start, and the last row of a stream that ends far past the range to
    the end of the other GPU rows (:func:`traceprof.collectors._far_end.lane_overruns`).

    Args:
        label: The trace in messages (``run.sqlite``, ``run.sqlite (pid 12)``).
        cols: The trace's row columns (``traceprof.collectors.nsys.tables.Rows``): ``kind``,
            ``name``, ``ts_ns``, ``dur_ns`` (ns), ``device``, ``stream`` and ``flag`` lists;
            ``raw_dur_ns`` is added (None but on the clipped rows) when a row is clipped.
        repaired: Filled with the rows clipped, by reason, for ``traces.meta.repaired`` (the
            ``issues`` column of ``traceprof runs``; ``traceprof.collectors._far_end``).

    Returns:
        The warnings naming the clipped rows (one for the CPU side, one for the GPU: their count,
        how far past, and the first three by kind and name); empty when none is clipped.
    """
    if not cols["kind"]:
        return []
    n = len(cols["kind"])
    kind = np.fromiter((_CODE.get(k, _CPU) for k in cols["kind"]), np.int8, n)
    ts = np.fromiter(cols["ts_ns"], np.int64, n)
    dur = np.fromiter(cols["dur_ns"], np.int64, n)
    sound = np.fromiter((f is None for f in cols["flag"]), bool, n)
    lo, hi, by_steps = reference_range(kind == _STEP, ts, dur, ~sound)
    margin = max(hi - lo, FAR_MARGIN_MIN_NS)
    where = "step range" if by_steps else "time range"
    warnings = []
    rows, end = far_ends(ts, dur, sound, kind != _UNCHECKED, kind == _CPU, hi, margin)
    if len(rows):
        past = int((ts[rows] + dur[rows]).max()) - hi
        _clip(cols, ts, dur, rows, np.full(len(rows), end))
        count_repair(repaired, FAR_END_REPAIR, len(rows))
        warnings.append(
            f"{label}: {len(rows)} CPU record(s) end far past the trace's {where} (up to "
            f"{past / 1e9:,.3f} s past it, more than {margin / 1e9:,.3f} s; {_named(cols, rows)}): "
            "clipped to the end of the trace (events.flag = 'overrun', raw_dur_ns keeps the recorded duration)"
        )
    gpu = np.flatnonzero((kind == _GPU) & sound & (dur >= 0))
    codes: dict[tuple[Any, Any], int] = {}
    lane = np.fromiter(
        (codes.setdefault((cols["device"][i], cols["stream"][i]), len(codes)) for i in gpu.tolist()),
        np.int64,
        len(gpu),
    )
    hit, new_end = lane_overruns(ts[gpu], dur[gpu], lane, hi, margin)
    if len(hit):
        rows = gpu[hit]
        most = int((ts[rows] + dur[rows] - new_end).max())
        _clip(cols, ts, dur, rows, new_end)
        count_repair(repaired, GPU_OVERRUN_REPAIR, len(rows))
        warnings.append(
            f"{label}: {len(rows)} GPU record(s) run past the next record on their stream (or far past the "
            f"trace's {where}) by up to {most / 1e9:,.6f} s ({_named(cols, rows)}): clipped (events.flag = "
            "'overrun', raw_dur_ns keeps the recorded duration)"
        )
    return warnings


def _clip(
    cols: dict[str, list[Any]], ts: np.ndarray, dur: np.ndarray, rows: np.ndarray, end: np.ndarray
) -> None:
    """End each of ``rows`` at ``end`` (ns), flagged ``overrun``, its recorded duration in ``raw_dur_ns``."""
    raw = cols.setdefault("raw_dur_ns", [None] * len(ts))
    for i, e in zip(rows.tolist(), end.tolist(), strict=True):
        raw[i] = int(dur[i])
        cols["dur_ns"][i] = max(0, int(e) - int(ts[i]))
        cols["flag"][i] = "overrun"


def _named(cols: dict[str, list[Any]], rows: np.ndarray) -> str:
    """The first three of ``rows`` by kind and name (``kernel 'gemm', ...``)."""
    shown = ", ".join(f"{cols['kind'][i]} {cols['name'][i]!r}" for i in rows[:3].tolist())
    return shown + (", ..." if len(rows) > 3 else "")
