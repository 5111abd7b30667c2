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

First of all, as Kineto's overlapping ProfilerSteps: step ranges of different numbers that overlap
(each number's span: from its ranges' first start to their last end, as ``steps`` reads them; ranges
of one number nest) are clipped by :func:`traceprof.collectors._far_end.step_overlaps`: the ranges
of a number whose span runs more than 5 us past the start of the next number's span end at that
start, ``overrun``, with a warning naming both and a count in ``traces.meta.repaired``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from traceprof.collectors._far_end import (
    FAR_END_REPAIR,
    FAR_MARGIN_MIN_NS,
    GPU_OVERRUN_REPAIR,
    STEP_OVERLAP_REPAIR,
    count_repair,
    far_ends,
    far_records,
    far_rule,
    lane_overruns,
    reference_range,
    step_overlap_warning,
    step_overlaps,
)
from traceprof.collectors._launch_order import LAUNCH_SKEW_MAX_NS, before_launch
from traceprof.collectors.nsys.steps import step_number
from traceprof.core.display import duration
from traceprof.core.schema import LAUNCH_KINDS
from traceprof.core.text import first_few

__all__ = ["clip_far_ends", "flag_before_launch"]

#: Each row's kind as a code: a step range, a GPU row on a stream (kernel, copy, memset), a row not
#: checked (kind ``other``, instants), or any other (CPU-side) row (a sync is timed by the CPU's wait).
_STEP, _GPU, _UNCHECKED, _CPU = 0, 1, 2, 3
_CODE = {"step": _STEP, "other": _UNCHECKED, "instant": _UNCHECKED} | dict.fromkeys(
    ("kernel", "memcpy", "memset"), _GPU
)


def flag_before_launch(label: str, cols: dict[str, list[Any]]) -> list[str]:
    """Flag the GPU rows of one process that start before the CPU call that launched them, in place.

    The rule Kineto's checks apply (``traceprof.collectors._launch_order``): a kernel, copy or
    memset that starts more than 1 ms before the earliest runtime / driver call with its
    ``correlationId`` is stamped in another clock domain: ``events.flag`` = ``before_launch``, left
    out of windows, idle, latency and collectives; one that starts before it by 5 us to 1 ms is
    clock jitter: ``launch_skew``, kept with its work, left out of launch latency only. O(n log n).

    Args:
        label: The trace in messages (``run.sqlite``, ``run.sqlite (pid 12)``).
        cols: The process's row columns (``traceprof.collectors.nsys.tables.Rows``): ``kind``,
            ``name``, ``ts_ns`` (ns), ``correlation`` and ``flag`` lists; rows already flagged are
            neither checked nor vouch for their kernels.

    Returns:
        The warnings (one per flag: the count, the largest gap, the first three rows by kind and
        name), empty when no row starts before its launch.
    """
    n = len(cols["kind"])
    if not n:
        return []
    kinds = cols["kind"]
    ts = np.fromiter(cols["ts_ns"], np.int64, n)
    corr_ok = np.fromiter((c is not None for c in cols["correlation"]), bool, n)
    corr = np.fromiter((0 if c is None else c for c in cols["correlation"]), np.int64, n)
    sound = np.fromiter((f is None for f in cols["flag"]), bool, n)
    gpu = np.fromiter((_CODE.get(k) == _GPU for k in kinds), bool, n) & sound
    launch = np.fromiter((k in LAUNCH_KINDS for k in kinds), bool, n) & sound
    early, worst, skew, most = before_launch(ts, corr, corr_ok, launch, gpu)
    out = _flag_far_without_launch(label, cols, ts, sound, corr, corr_ok, gpu, launch, early)
    for rows, flag, gap, what in (
        (
            early,
            "before_launch",
            worst,
            "another clock domain; flagged (events.flag = 'before_launch') and left "
            "out of windows, idle, latency and collectives",
        ),
        (
            skew,
            "launch_skew",
            most,
            f"clock jitter, not another clock domain (at most {LAUNCH_SKEW_MAX_NS / 1e6:g} "
            "ms); kept with their work (events.flag = 'launch_skew'), left out of launch latency only",
        ),
    ):
        for i in rows.tolist():
            cols["flag"][i] = flag
        if len(rows):
            out.append(
                f"{label}: {len(rows)} GPU record(s) start before the CPU call that launched them (same "
                f"correlationId), by up to {duration(gap)} ({_named(cols, rows)}): {what}"
            )
    return out


def _flag_far_without_launch(
    label: str,
    cols: dict[str, list[Any]],
    ts: np.ndarray,
    sound: np.ndarray,
    corr: np.ndarray,
    corr_ok: np.ndarray,
    gpu: np.ndarray,
    launch: np.ndarray,
    early: np.ndarray,
) -> list[str]:
    """Flag ``far_outside``, in place, the GPU rows that no launch call of the process vouches for
    (no runtime / driver row with their ``correlationId``) and that lie far from the bulk of the
    trace (:func:`traceprof.collectors._far_end.far_records` over the sound rows' starts, the
    reference range and margin of :func:`traceprof.collectors._far_end.reference_range`: the steps,
    else the bulk, at least 1 s): the head records of a profiling session stamped in another clock
    domain lose their runtime records too, and without a launch to compare with, their distance
    from everything else is what shows it (two kernels 10 s before a 1 ms step stretched the window
    to 10 s and the idle to 100 %). A row with its launch is judged against it (:func:`before_launch`).

    Returns:
        The warning (the count, how far, the first three rows by kind and name), or none.
    """
    n = len(ts)
    kind = np.fromiter((_CODE.get(k, _CPU) for k in cols["kind"]), np.int8, n)
    launched = corr_ok & np.isin(corr, corr[launch & corr_ok])
    cand = gpu & ~launched
    cand[early] = False
    if not cand.any():
        return []
    dur = np.fromiter((max(int(d), 0) for d in cols["dur_ns"]), np.int64, n)
    pool = sound & (kind != _UNCHECKED)
    ref = reference_range(kind == _STEP, ts, dur, ~sound, bulk=pool)
    lo, hi, by_steps = ref.lo, ref.hi, ref.by_steps
    margin = max(hi - lo, FAR_MARGIN_MIN_NS)
    far, _ = far_records(ts, pool, ref, margin, cand)
    rows = np.flatnonzero(far)
    if not len(rows):
        return []
    for i in rows.tolist():
        cols["flag"][i] = "far_outside"
    gap = int(np.maximum(lo - ts[rows], ts[rows] - hi).max())
    where = "step range" if by_steps else "time range"
    return [
        f"{label}: {len(rows)} GPU record(s) without a launch call lie far outside the trace's {where} "
        f"(up to {gap / 1e9:,.3f} s away, {far_rule(by_steps, margin)}; {_named(cols, rows)}): another "
        "clock domain; flagged (events.flag = 'far_outside') and left out of windows, idle and latency"
    ]


def clip_far_ends(label: str, cols: dict[str, list[Any]]) -> tuple[list[str], dict[str, int]]:
    """Clip the rows of one trace's columns that end far past it or overrun their stream, in place.

    Step ranges that run into the next step's are clipped to its start (module doc). CPU-side
    rows that end far past the reference range are clipped to the trace's end; GPU rows (kernels,
    copies, memsets) that run past the next row on their (device, stream) by more than 5 us are
    clipped to its start, and the last row of a stream that ends far past the range to the end of
    the other GPU rows (:func:`traceprof.collectors._far_end.lane_overruns`).

    Args:
        label: The trace in messages (``run.sqlite``, ``run.sqlite (pid 12)``).
        cols: The trace's row columns (``traceprof.collectors.nsys.tables.Rows``): ``kind``,
            ``name``, ``ts_ns``, ``dur_ns`` (ns), ``device``, ``stream`` and ``flag`` lists;
            ``raw_dur_ns`` is added (None but on the clipped rows) when a row is clipped.

    Returns:
        (the warnings naming the clipped rows (one for the steps, one for the CPU side, one for
        the GPU: their count, how far past, and the first three by kind and name), empty when none
        is clipped; the rows clipped by reason for ``traces.meta.repaired``, the ``issues`` column of
        ``traceprof runs`` (``traceprof.collectors._far_end``: step ranges, CPU far ends, GPU overruns)).
    """
    if not cols["kind"]:
        return [], {}
    n = len(cols["kind"])
    kind = np.fromiter((_CODE.get(k, _CPU) for k in cols["kind"]), np.int8, n)
    ts = np.fromiter(cols["ts_ns"], np.int64, n)
    dur = np.fromiter(cols["dur_ns"], np.int64, n)
    sound = np.fromiter((f is None for f in cols["flag"]), bool, n)
    warnings, repaired = _clip_overlapping_steps(label, cols, ts, dur, (kind == _STEP) & sound & (dur >= 0))
    lo, hi, by_steps, _ = reference_range(kind == _STEP, ts, dur, ~sound)
    margin = max(hi - lo, FAR_MARGIN_MIN_NS)
    where = "step range" if by_steps else "time range"
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
    return warnings, repaired


def _clip_overlapping_steps(
    label: str, cols: dict[str, list[Any]], ts: np.ndarray, dur: np.ndarray, steps: np.ndarray
) -> tuple[list[str], dict[str, int]]:
    """Clip the step ranges (``steps``, a mask) of a number whose span runs into the next number's
    (module doc), in place (``dur`` too). O(n log n) in the ranges.

    Returns:
        ([the warning], {:data:`STEP_OVERLAP_REPAIR`: ranges clipped}), or ([], {}) when none is.
    """
    rows = np.flatnonzero(steps)
    if len(rows) < 2:
        return [], {}
    num = np.fromiter((step_number(cols["name"][i]) for i in rows.tolist()), np.int64, len(rows))
    nums, of = np.unique(num, return_inverse=True)  # each range's number, as an index into nums
    end = ts[rows] + dur[rows]
    first = np.full(len(nums), np.iinfo(np.int64).max)
    last = np.full(len(nums), np.iinfo(np.int64).min)
    np.minimum.at(first, of, ts[rows])
    np.maximum.at(last, of, end)
    mine, into = step_overlaps(first, last - first)
    if not len(mine):
        return [], {}
    stop = np.full(len(nums), np.iinfo(np.int64).max)  # where each number's ranges now end
    stop[mine] = first[into]
    longest: dict[int, int] = {}  # number -> its range that ends last, and the one that starts first
    opening: dict[int, int] = {}
    for k, r in zip(of.tolist(), rows.tolist(), strict=True):
        if k not in longest or ts[r] + dur[r] > ts[longest[k]] + dur[longest[k]]:
            longest[k] = r
        if k not in opening or ts[r] < ts[opening[k]]:
            opening[k] = r
    pairs = [
        (
            repr(cols["name"][longest[k]]),
            repr(cols["name"][opening[j]]),
            int(dur[longest[k]]),
            int(last[k] - first[j]),
        )
        for k, j in zip(mine.tolist(), into.tolist(), strict=True)
    ]
    hit = np.flatnonzero(end > stop[of])
    clip = rows[hit]
    _clip(cols, ts, dur, clip, stop[of[hit]])
    dur[clip] = np.maximum(0, stop[of[hit]] - ts[clip])
    return [step_overlap_warning(label, "step range", pairs)], {STEP_OVERLAP_REPAIR: len(pairs)}


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
    return first_few(rows, shown=lambda i: f"{cols['kind'][int(i)]} {cols['name'][int(i)]!r}")
