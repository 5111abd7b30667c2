"""Sanity passes over a parsed Kineto trace: suspect timestamps, same-lane overruns, several processes.

They run on the parser's column lists (``traceprof.collectors.kineto.parse``) after every record is read, and
flag records (``events.flag``) instead of dropping them, so the store keeps what the file said.

Algorithm:
  1. ``before_launch``: a GPU row (kernel / memcpy / memset) that starts more than
     :data:`LAUNCH_SKEW_MAX_NS` (1 ms) before the CPU runtime call that launched it (same
     ``correlation``) comes from another clock domain (a known profiler bug re-registers the
     timestamp callback and stamps the first records of a session ~1e14 ns early): its time cannot
     be right, and it is left out. ``launch_skew``: one that starts before its launch by more than
     :data:`LAUNCH_TOLERANCE_NS` (5 us) but at most 1 ms is clock jitter (the CPU and GPU clocks are
     converted onto one another to a few us): its work is real and it is kept everywhere, noted,
     and only its launch latency (negative) is not measured. The rule is shared with the Nsight
     Systems collector (``traceprof.collectors._launch_order``).
  2. ``far_outside``: a record apart from the bulk of the trace: sorted by start, the records split
     where two neighbours lie more than the margin apart (the reference range's own length, at
     least :data:`FAR_MARGIN_MIN_NS`; the range is the ProfilerSteps with a set ``ts``, or without
     steps the 1st..99th percentile of the bulk's starts, ``traceprof.collectors._far_end``); the
     clusters that overlap the steps are the bulk (without steps: the largest cluster, taking in
     each neighbour within 100 times the two sides' spans or with more than half its records). ``zero_ts``: a
     record whose ``ts`` is 0 (an unset timestamp) that lies apart from the other records (farther
     from their 1st..99th percentile range than that range is long), a ProfilerStep included. Launch calls flagged
     here do not vouch for their kernels' steps or latency.
  3. ``overrun``: on one (device, stream) lane, sorted by start, a row that runs past the start of
     the next valid row by more than :data:`OVERLAP_TOLERANCE_NS` (a profiler bug reports
     seconds-long kernels; overlaps up to 5 us are programmatic dependent launch, left alone) is
     clipped to that start; the last row of a lane that ends "far" past the reference range (step
     2's margin) is clipped to the end of the rank's other GPU activity or of the range. ``raw_dur_ns`` keeps the recorded duration. Perfetto clips
     the same way.
  3a. ``overrun`` off the GPU: any other record (a CPU op, annotation, runtime call) whose start is
     in the bulk but whose end lies far past the reference range (more than step 2's margin past
     its end, e.g. ``dur: 3e15`` us) is clipped, as the last GPU row of a lane is, to the trace's
     end: the latest end of its other sound records (those that do not end that far past);
     ``raw_dur_ns`` keeps the recorded duration, with a warning naming each. Kept, so a 95-year
     op neither stretches the windows nor vanishes. Records of unknown categories (kind
     ``other``, e.g. the profiler session's own ``Trace`` span ``PyTorch Profiler (0)``, which
     rightly runs from profiler start to stop, seconds past the steps) enter no window and are
     left as recorded.
  3b. ``unclosed``: a CPU op with ``dur: -1`` (the profiler's mark for an op still open when it
     stopped; the only negative duration the parsers keep) is clipped to the trace's end (as in
     3a), ``raw_dur_ns`` -1000, with a warning naming each.
  3c. ``overrun`` of a ProfilerStep (before step 2 takes the range from the steps): a step that
     runs past the start of the next one (sorted by start) by more than
     :data:`OVERLAP_TOLERANCE_NS` ends where that one starts (a warning names both; counted in
     ``traces.meta.repaired``, the ``issues`` column). Then the trace's
     end is the latest end of its other sound records (not steps, not ``other``), or the
     profiler's ``Record Window End`` instant when later. A step that ends past it by more than
     :data:`OVERLAP_TOLERANCE_NS` is clipped to it (``raw_dur_ns`` keeps the recorded duration,
     a warning names each step) when the trace has a ``Record Window End`` (nothing after the
     profiler stopped is recorded, so no step runs past it), or, without one, when it ends far
     past the trace's end: by more than :data:`FAR_MARGIN_MIN_NS` (1 s, as in 3a) and more than
     the part of it before that end (a 13 s ProfilerStep whose records end 1.5 ms in). The steps table, every window and every analysis then read the clipped step.
  4. One process per file: several ProfilerStep#N with the same N, ProfilerSteps on several pids,
     or one correlation id launched from several pids mean the file merges several ranks: an error.
     One id launched by several calls of the process (two threads, or two records) is a warning
     naming the id and the count: a GPU record with it is paired with the earliest call.
  5. ProfilerStep ranges that cut through a running op (a CPU op that starts in a step and ends
     after it) are counted in a warning; the op belongs to the step it starts in.
Flags 1 (``before_launch``) and 2 (and unmatched ``B`` records, see the parser) exclude a record from windows, idle,
latency and collectives; ``launch_skew`` and ``overrun`` records are kept (``traceprof.core.classify``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from traceprof.collectors._far_end import (
    FAR_END_REPAIR,
    FAR_MARGIN_MIN_NS,
    GPU_OVERRUN_REPAIR,
    OVERLAP_TOLERANCE_NS,
    STEP_OVERLAP_REPAIR,
    STEP_PAST_END_REPAIR,
    count_repair,
    far_ends,
    far_records,
    far_rule,
    lane_overruns,
    reference_range,
    step_overlap_warning,
    step_overlaps,
)
from traceprof.collectors._launch_order import LAUNCH_SKEW_MAX_NS, LAUNCH_TOLERANCE_NS, before_launch
from traceprof.collectors.kineto._values import Ints, Strs
from traceprof.collectors.kineto.columns import GPU_KINDS, RowInts, codes, kind_mask
from traceprof.core.display import duration
from traceprof.core.errors import TraceFormatError
from traceprof.core.schema import GPU_ACTIVITY_KINDS, LAUNCH_KINDS, is_kernel_launch
from traceprof.core.text import first_few

__all__ = [
    "launches_without_gpu",
    "flag_records",
    "check_one_process",
    "shared_correlation_warning",
    "step_cut_warning",
    "LAUNCH_TOLERANCE_NS",
    "LAUNCH_SKEW_MAX_NS",
    "OVERLAP_TOLERANCE_NS",
    "FAR_MARGIN_MIN_NS",
    "ZERO_TS_MIN_GAP_NS",
]

#: A ``ts == 0`` record is an unset time when it lies at least this far from the others: 1 ms.
ZERO_TS_MIN_GAP_NS = 1_000_000

_GPU = frozenset(GPU_ACTIVITY_KINDS)
_LAUNCH = frozenset(LAUNCH_KINDS)


def _examples(src_index: list[int], rows: np.ndarray | list[int], n: int = 3) -> str:
    """The first ``n`` of ``rows`` as the indices of their events in the file (``#12, #40, ...``)."""
    return first_few(rows, n, shown=lambda i: f"#{src_index[int(i)]}")


def _unset_times(ts: np.ndarray, base_ns: int) -> np.ndarray:
    """Records whose own ``ts`` is 0 (``ts_ns == base_ns``) and that lie apart from the others:
    farther from the other records' 1st..99th percentile range than that range is long (and than
    :data:`ZERO_TS_MIN_GAP_NS`)."""
    raw_zero = ts == base_ns
    if not raw_zero.any():
        return raw_zero
    others = ts[~raw_zero]
    if not len(others):
        return np.zeros(len(ts), dtype=bool)
    lo, hi = (int(v) for v in np.percentile(others, [1, 99], method="nearest"))
    apart = max(hi - lo, ZERO_TS_MIN_GAP_NS)
    return raw_zero & ((ts < lo - apart) | (ts > hi + apart))


def flag_records(
    path: Path,
    cols: dict[str, Any],
    src_index: list[int],
    base_ns: int = 0,
    repaired: dict[str, int] | None = None,
) -> tuple[dict[str, int], list[str]]:
    """Fill ``cols["flag"]`` / ``cols["raw_dur_ns"]`` and clip overruns in ``cols["dur_ns"]`` (steps 1-3).

    Args:
        path: The trace file (for messages).
        cols: Parser columns (``traceprof.collectors.kineto.decode.Rows``): kind and flag lists, ts_ns and
            dur_ns int64 ns arrays, device, stream, correlation and raw_dur_ns ``Ints``.
        src_index: Index of each row's record in the file's ``traceEvents`` (for messages).
        base_ns: The trace's ``baseTimeNanoseconds`` (0 for old style): a record whose own ``ts`` is 0
            and that lies apart from the other records is flagged ``zero_ts``.
        repaired: Filled with the records clipped, by reason, for ``traces.meta.repaired`` (the
            ``issues`` column of ``traceprof runs``; ``traceprof.collectors._far_end``): ProfilerSteps
            clipped where the next one starts or past the trace's end, GPU rows past the next on their
            stream, records ending far past the trace.

    Returns:
        (counts by flag, warnings naming the file, the count, the size of the discrepancy and
        example event indices).
    """
    n = len(cols["kind"])
    if n == 0:
        return {}, []
    kind_in = kind_mask(cols["kind"])
    # views, not copies, of the int64 columns (dur is read at a row before that row is clipped)
    ts = np.asarray(cols["ts_ns"], dtype=np.int64)
    dur = np.asarray(cols["dur_ns"], dtype=np.int64)
    corr: Ints = cols["correlation"]
    flag: Strs = cols["flag"]
    counts: dict[str, int] = {}
    warnings: list[str] = []
    gpu = kind_in(_GPU)
    launch = kind_in(_LAUNCH)
    unflagged = flag.is_none()

    # 2 first (launch calls and steps with unset or far times must not vouch for anything)
    zero = unflagged & _unset_times(ts, base_ns)
    # 3c. before the range is taken from the steps: a step that runs into the next ends where it
    #    starts, and a step that outlasts the trace ends with it
    _clip_steps_past_end(path, cols, kind_in, ~zero & unflagged, counts, warnings, repaired)
    pool = unflagged & ~zero
    ref = reference_range(kind_in({"step"}), ts, dur, zero, bulk=pool)
    lo, hi, by_steps = ref.lo, ref.hi, ref.by_steps
    margin = max(hi - lo, FAR_MARGIN_MIN_NS)
    far, hi = far_records(ts, pool, ref, margin)
    ok_launch = launch & ~zero & ~far

    # 1. before_launch (against launch calls that are themselves sound): the earliest sound
    #    launch of each correlation id
    early, worst, skew, skew_max = before_launch(ts, corr.values, corr.ok, ok_launch, gpu & unflagged)
    del ok_launch
    flag.codes[early] = flag.code("before_launch")
    zero[early] = far[early] = False
    if len(early):
        counts["before_launch"] = len(early)
        warnings.append(
            f"{path.name}: {len(early)} GPU record(s) start before the CPU call that launched them, by up to "
            f"{duration(worst)} (events {_examples(src_index, early)}): another clock domain; flagged "
            "(events.flag = 'before_launch') and left out of windows, idle and latency"
        )
    skew = skew[~(zero[skew] | far[skew])]  # a record far off for another reason keeps that flag
    flag.codes[skew] = flag.code("launch_skew")
    if len(skew):
        counts["launch_skew"] = len(skew)
        warnings.append(
            f"{path.name}: {len(skew)} GPU record(s) start before the CPU call that launched them by up to "
            f"{duration(skew_max)} (events {_examples(src_index, skew)}): clock jitter, not another clock "
            f"domain (at most {LAUNCH_SKEW_MAX_NS / 1e6:g} ms); kept with their work (events.flag = "
            "'launch_skew'), left out of launch latency only"
        )
    where = "ProfilerStep range" if by_steps else "time range"
    z = np.flatnonzero(zero)
    flag.codes[z] = flag.code("zero_ts")
    if len(z):
        counts["zero_ts"] = len(z)
        warnings.append(
            f"{path.name}: {len(z)} record(s) with ts == 0, apart from the other records (events "
            f"{_examples(src_index, z)}): flagged (events.flag = 'zero_ts') and left out of windows, "
            "steps and latency"
        )
    f = np.flatnonzero(far)
    flag.codes[f] = flag.code("far_outside")
    if len(f):
        counts["far_outside"] = len(f)
        gap = int(np.maximum(lo - ts[f], ts[f] - hi).max())
        warnings.append(
            f"{path.name}: {len(f)} record(s) lie far outside the rank's {where} (up to {gap / 1e9:,.3f} s "
            f"away, {far_rule(by_steps, margin)}; events {_examples(src_index, f)}): flagged "
            "(events.flag = 'far_outside') and left out of windows"
        )

    # 3a/3b. records that end far past the range (GPU rows: step 3) and ops still open at profiler
    #    stop (dur -1): the end of the trace is the latest end of the other sound records
    sound = flag.is_none() | flag.isin({"launch_skew"})
    # "other": e.g. the session's span, not checked
    late, end = far_ends(ts, dur, sound, ~kind_in({"other"}), ~gpu, hi, margin)
    _clip_far_end(path, cols, src_index, late, end, hi, margin, where, counts, warnings)
    count_repair(repaired, FAR_END_REPAIR, len(late))
    del late
    _clip_unclosed(path, cols, src_index, end, counts, warnings)

    # 3. overrun (on valid GPU rows, per (device, stream) lane); the last row of a lane is bounded by
    #    the end of the reference range plus the margin.
    rows = np.flatnonzero(gpu & (flag.is_none() | flag.isin({"launch_skew"})))
    clipped: list[int] = []
    if len(rows):
        lane, lanes = _lanes(cols["device"], cols["stream"], rows)
        place = np.zeros(max(lanes) + 1, lane.dtype)  # each lane's place in (device, stream) order
        place[lanes] = np.arange(len(lanes))
        lane = place[lane]
        del place
        hit, new_end = lane_overruns(ts, dur, lane, hi, margin, rows)
        # in (device, stream, start) order, as the warning names the first ones
        at = np.searchsorted(rows, hit)
        by_lane = np.lexsort((dur[hit], ts[hit], lane[at]))
        del lane, lanes, rows, at
        for i, e in zip(hit[by_lane].tolist(), new_end[by_lane].tolist(), strict=True):
            cols["raw_dur_ns"][i] = int(dur[i])
            cols["dur_ns"][i] = int(max(0, e - ts[i]))
            flag[i] = "overrun"
            clipped.append(i)
    if clipped:
        counts["overrun"] = counts.get("overrun", 0) + len(clipped)
        count_repair(repaired, GPU_OVERRUN_REPAIR, len(clipped))
        most = max(cols["raw_dur_ns"][i] - int(cols["dur_ns"][i]) for i in clipped)
        warnings.append(
            f"{path.name}: {len(clipped)} GPU record(s) run past the next record on their stream (or far past "
            f"the rank's {where}) by up to {most / 1000:,.3f} us (events {_examples(src_index, clipped)}): clipped "
            "(events.flag = 'overrun', raw_dur_ns keeps the recorded duration)"
        )
    return counts, warnings


#: The instant the profiler writes when it stops recording (Kineto ``ph: "i"``).
WINDOW_END_NAME = "Record Window End"


def _clip_steps_past_end(
    path: Path,
    cols: dict[str, Any],
    kind_in: Any,
    ok: np.ndarray,
    counts: dict[str, int],
    warnings: list[str],
    repaired: dict[str, int] | None = None,
) -> None:
    """Step 3c of the module doc: ProfilerSteps (``ok`` rows of kind ``step``) that run into the
    next one end where it starts (:func:`_clip_overlapping_steps`); then those that outlast the
    trace end at its end (ns), flagged ``overrun``, ``raw_dur_ns`` keeping the recorded duration;
    a warning names each (``ProfilerStep#1``, its recorded and clipped duration).

    Source fields read: the rows' kind, name (``Record Window End``), ts_ns and dur_ns (ns)."""
    ts = np.asarray(cols["ts_ns"], np.int64)
    dur = np.asarray(cols["dur_ns"], np.int64)
    step = kind_in({"step"}) & ok & (dur >= 0)
    if not step.any():
        return
    overlaps = _clip_overlapping_steps(path, cols, np.flatnonzero(step))
    if overlaps:
        counts["overrun"] = counts.get("overrun", 0) + overlaps[0]
        warnings.append(overlaps[1])
        count_repair(repaired, STEP_OVERLAP_REPAIR, overlaps[0])
    others = ok & ~kind_in({"step", "other"}) & (dur >= 0)
    if not others.any():
        return
    end = int((ts[others] + dur[others]).max())
    marks = ok & kind_in({"instant"}) & cols["name"].isin({WINDOW_END_NAME})
    window = bool(marks.any())
    if window:
        end = max(end, int(ts[marks].max()))
    step_end = ts + dur
    past = step & (step_end > end + OVERLAP_TOLERANCE_NS)
    if not window:  # without the profiler's stop: only a step far past the trace's records (as 3a)
        past &= step_end - end > np.maximum(end - ts, FAR_MARGIN_MIN_NS)
    rows = np.flatnonzero(past)
    if not len(rows):
        return
    said = first_few(
        rows,
        shown=lambda i: (
            f"{cols['name'][int(i)]} ({duration(int(dur[i]))} recorded, {duration(max(0, end - int(ts[i])))} kept)"
        ),
    )
    _clip_to(cols, rows, end, "overrun")
    counts["overrun"] = counts.get("overrun", 0) + len(rows)
    count_repair(repaired, STEP_PAST_END_REPAIR, len(rows))
    stop = "the profiler's Record Window End" if window else "its other records"
    warnings.append(
        f"{path.name}: {len(rows)} ProfilerStep(s) run past the end of the trace ({stop}): {said}; "
        "clipped to the trace's end (events.flag = 'overrun', raw_dur_ns keeps the recorded duration)"
    )


def _clip_overlapping_steps(path: Path, cols: dict[str, Any], rows: np.ndarray) -> tuple[int, str] | None:
    """Step 3c of the module doc, first part: of the ProfilerSteps ``rows``, one that runs past
    the start of the next one (sorted by start) by more than :data:`OVERLAP_TOLERANCE_NS` ends
    where that one starts (ns), flagged ``overrun``, ``raw_dur_ns`` keeping the recorded
    duration. Overlapping steps claimed the same time twice (``mfu`` read 298 ms of steps in a
    178 ms trace). O(n log n) in the steps.

    Returns:
        (the count clipped, the warning naming each with the step it runs into), or None.

    Source fields read: the rows' name, ts_ns and dur_ns (ns)."""
    ts = np.asarray(cols["ts_ns"], np.int64)
    dur = np.asarray(cols["dur_ns"], np.int64)
    if len(rows) < 2:
        return None
    mine, into = step_overlaps(ts[rows], dur[rows])
    if not len(mine):
        return None
    pairs = [
        (cols["name"][i], cols["name"][j], int(dur[i]), int(ts[i] + dur[i] - ts[j]))
        for i, j in zip(rows[mine].tolist(), rows[into].tolist(), strict=True)
    ]
    for i, j in zip(rows[mine].tolist(), rows[into].tolist(), strict=True):
        _clip_to(cols, np.array([i]), int(ts[j]), "overrun")
    return len(mine), step_overlap_warning(path.name, "ProfilerStep", pairs)


def _clip_to(cols: dict[str, Any], rows: np.ndarray, end: int, why: str) -> None:
    """End each of ``rows`` at ``end`` (ns; never before its own start), flagged ``why``, the
    recorded duration kept in ``raw_dur_ns`` (the first one recorded, if clipped twice)."""
    for i in rows.tolist():
        if cols["raw_dur_ns"][i] is None:
            cols["raw_dur_ns"][i] = int(cols["dur_ns"][i])
        cols["dur_ns"][i] = max(0, end - int(cols["ts_ns"][i]))
        cols["flag"][i] = why


def _named(cols: dict[str, Any], src_index: list[int], rows: np.ndarray) -> str:
    """The first three of ``rows`` as their event index and name (``#12 'aten::mm', ...``)."""
    return first_few(rows, shown=lambda i: f"#{src_index[int(i)]} {cols['name'][int(i)]!r}")


def _clip_far_end(
    path: Path,
    cols: dict[str, Any],
    src_index: list[int],
    rows: np.ndarray,
    end: int,
    hi: int,
    margin: int,
    where: str,
    counts: dict[str, int],
    warnings: list[str],
) -> None:
    """Step 3a of the module doc: ``rows`` (sound records other than GPU rows whose recorded end lies
    more than ``margin`` ns past ``hi``, the end of the reference range) end at ``end`` (the latest
    end of the trace's other sound records, ns); flagged ``overrun``, the recorded duration kept in
    ``raw_dur_ns``; a warning names the rows (event index and name)."""
    if not len(rows):
        return
    past = (
        int((np.asarray(cols["ts_ns"], np.int64)[rows] + np.asarray(cols["dur_ns"], np.int64)[rows]).max())
        - hi
    )
    _clip_to(cols, rows, end, "overrun")
    counts["overrun"] = counts.get("overrun", 0) + len(rows)
    warnings.append(
        f"{path.name}: {len(rows)} CPU record(s) end far past the rank's {where} (up to {past / 1e9:,.3f} s past "
        f"it, more than {margin / 1e9:,.3f} s; events {_named(cols, src_index, rows)}): clipped to the end of the "
        "trace (events.flag = 'overrun', raw_dur_ns keeps the recorded duration)"
    )


def _clip_unclosed(
    path: Path,
    cols: dict[str, Any],
    src_index: list[int],
    end: int,
    counts: dict[str, int],
    warnings: list[str],
) -> None:
    """Step 3b of the module doc: every row with a negative ``dur_ns`` (the parsers keep only
    ``dur: -1`` on a CPU op, ``decode.STILL_OPEN_DUR_NS``) ends at ``end`` (the latest end of the
    trace's sound rows that have a duration and do not end far past the range, ns; never before its
    own start); flagged ``unclosed``, the recorded duration kept in ``raw_dur_ns``; a warning names
    the rows (event index and name)."""
    open_ = np.flatnonzero(np.asarray(cols["dur_ns"], dtype=np.int64) < 0)
    if not len(open_):
        return
    _clip_to(cols, open_, end, "unclosed")
    counts["unclosed"] = len(open_)
    warnings.append(
        f"{path.name}: {len(open_)} CPU op(s) still open when the profiler stopped (dur -1; events "
        f"{_named(cols, src_index, open_)}): kept, clipped to the end of the trace (events.flag = 'unclosed', "
        "raw_dur_ns = -1000)"
    )


def _lanes(device: Ints, stream: Ints, rows: np.ndarray) -> tuple[np.ndarray, list[int]]:
    """(The (device, stream) lane of each of ``rows``, as a code; the codes present, in (device,
    stream) order, a missing value first). Coded by Arrow's hash table: no sort of the rows."""
    parts = []
    for col in (device, stream):
        v = col.values[rows]
        v[~col.ok[rows]] = -1
        enc = pc.dictionary_encode(pa.array(v))
        del v
        parts.append((enc.indices.to_numpy(), enc.dictionary.to_numpy()))
    (dev, dev_values), (st, st_values) = parts
    lane = dev.astype(np.int32 if len(dev_values) * len(st_values) < 2**31 else np.int64)
    lane *= len(st_values)
    lane += st
    present = np.flatnonzero(np.bincount(lane, minlength=len(dev_values) * len(st_values)))
    present = present[
        np.lexsort((st_values[present % len(st_values)], dev_values[present // len(st_values)]))
    ]
    return lane, present.tolist()


def check_one_process(path: Path, cols: dict[str, Any], step_numbers: RowInts) -> None:
    """Refuse a file that merges several processes (module doc, step 4).

    Args:
        path: The trace file.
        cols: Parser columns (kind, pid lists; correlation ``Ints``).
        step_numbers: N of each ``step`` row's ProfilerStep#N (None elsewhere).

    Raises:
        TraceFormatError: Duplicate ProfilerStep numbers, steps on several pids, or one correlation
            id launched from several pids.
    """
    seen: dict[int, str] = {}
    step_pids: set[str] = set()
    for i in np.flatnonzero(kind_mask(cols["kind"])({"step"})).tolist():
        num, pid = step_numbers[i], cols["pid"][i]
        if num is None:
            continue
        step_pids.add(pid)
        if num in seen:
            raise TraceFormatError(
                path,
                f"ProfilerStep#{num}",
                f"appears twice ({f'pids {seen[num]} and {pid}' if seen[num] != pid else f'both on pid {pid}'}): "
                "the file holds several processes, ranks or profiler sessions; give each its own trace file",
            )
        seen[num] = pid
    if len(step_pids) > 1:
        raise TraceFormatError(
            path,
            "ProfilerStep",
            f"steps on several processes (pids {sorted(step_pids)}): "
            "the file holds several ranks; give each rank its own trace file",
        )
    corr: Ints = cols["correlation"]
    rows = np.flatnonzero(kind_mask(cols["kind"])(_LAUNCH) & corr.ok)
    pids = codes(cols["pid"])[0][rows]
    ids = corr.values[rows]
    order = np.lexsort((pids, ids))
    same_id = ids[order][1:] == ids[order][:-1]
    if not (same_id & (pids[order][1:] != pids[order][:-1])).any():
        return
    launcher: dict[int, str] = {}  # a conflict: find the first, in file order, for the message
    for i, c in zip(rows.tolist(), ids.tolist(), strict=True):
        pid = cols["pid"][i]
        other = launcher.setdefault(c, pid)
        if other != pid:
            raise TraceFormatError(
                path,
                f"correlation {c}",
                f"launched from two processes (pids {other} and {pid}): the file holds several ranks; "
                "give each rank its own trace file",
            )


def shared_correlation_warning(path: Path, cols: dict[str, Any], src_index: list[int]) -> str | None:
    """A warning when GPU records carry a correlation id that several runtime calls of the one
    process share (module doc, step 4: two pids are an error), naming the count and an example.

    A sound trace gives each launch its own id; a shared one (a damaged or hand-merged trace) leaves
    the launch of such a GPU record ambiguous. It is paired with the earliest of the calls
    (``traceprof.collectors.kineto.columns.PAIRING``: the rule the store's ``kernels`` view uses too).

    Args:
        path: The trace file.
        cols: Parser columns (kind, tid; correlation ``Ints``; ts_ns ns).
        src_index: Index of each row's record in the file's ``traceEvents`` (for messages).
    """
    corr: Ints = cols["correlation"]
    kind_in = kind_mask(cols["kind"])
    rows = np.flatnonzero(kind_in(_LAUNCH) & corr.ok)
    ids, counts = np.unique(corr.values[rows], return_counts=True)
    shared = ids[counts > 1]
    if not len(shared):
        return None
    used = np.unique(corr.values[kind_in(GPU_KINDS) & corr.ok])
    shared = shared[np.isin(shared, used)]
    if not len(shared):
        return None
    calls = rows[corr.values[rows] == shared[0]]
    calls = calls[np.argsort(np.asarray(cols["ts_ns"])[calls], kind="stable")]
    tids = sorted({cols["tid"][int(i)] for i in calls})
    return (
        f"{path.name}: {len(shared)} correlation id(s) of GPU records belong to several CUDA runtime/driver calls "
        f"(e.g. correlation {int(shared[0])}: {len(calls)} calls, events {_examples(src_index, calls)}, on "
        f"thread(s) {', '.join(map(repr, tids))}): each such GPU record is paired with the earliest of them "
        "(its step, class, collective and launch latency follow from that call)"
    )


def launches_without_gpu(
    path: Path, cols: dict[str, Any]
) -> tuple[tuple[int, int], tuple[int, int], str | None]:
    """CUDA graph launch calls (``cudaGraphLaunch``, ``cuGraphLaunch``) and kernel launch calls
    (:func:`~traceprof.core.schema.is_kernel_launch`), each with a correlation id, and how many of
    them no GPU activity row (:data:`~traceprof.core.schema.GPU_ACTIVITY_KINDS`: kernel, memcpy,
    memset) carries the correlation id of, with one mask of those rows for both counts (as the nsys
    collector counts them). A graph replay with no such row (a CUPTI that does not trace graph
    nodes) or a kernel the trace does not hold has its GPU time missing from the trace; a
    ``gpu_user_annotation`` or ``sync`` row with the id holds no GPU time of the launch, so it does
    not count (``traces.meta.graph_launches`` / ``graph_launches_without_gpu``, ``kernel_launches``
    / ``kernel_launches_without_gpu``, read by ``traceprof.engine.activity``). Reads the distinct
    names first: a trace without launch calls costs one pass over them.

    Returns:
        ((graph launch calls, without a GPU row), (kernel launch calls, without a GPU row), a
        warning naming the graph launches without one or None).
    """
    names: Strs = cols["name"]
    graph = {n for n in names.values if "graphlaunch" in n.lower()}
    kernel = {n for n in names.values if is_kernel_launch(n)}
    if not graph and not kernel:
        return (0, 0), (0, 0), None
    corr: Ints = cols["correlation"]
    kind_in = kind_mask(cols["kind"])
    calls = kind_in(_LAUNCH) & corr.ok
    gpu = corr.values[kind_in(_GPU) & corr.ok]

    def count(which: set[str]) -> tuple[int, int]:
        ids = corr.values[calls & names.isin(which)] if which else corr.values[:0]
        return len(ids), int((~np.isin(ids, gpu)).sum())

    (graphs, lost), launches = count(graph), count(kernel)
    if not lost:
        return (graphs, 0), launches, None
    why = (
        "the profiler did not trace the graphs' nodes"
        if lost == graphs
        else f"the other {graphs - lost} have theirs"
    )
    return (
        (graphs, lost),
        launches,
        (
            f"{path.name}: {lost} of {graphs} CUDA graph launch(es) have no GPU record (no kernel rows for "
            f"those replays; {why}): their GPU time is missing, so busy, idle and kernel figures leave those "
            "graph executions out (idle is overstated)"
        ),
    )


def step_cut_warning(path: Path, cols: dict[str, Any], spans: list[tuple[int, int, int]]) -> str | None:
    """A warning when ProfilerStep ranges cut through running CPU ops (module doc, step 5).

    Args:
        path: The trace file.
        cols: Parser columns (kind, name, ts_ns, dur_ns; ns).
        spans: ProfilerStep (start_ns, end_ns, N), sorted by start.
    """
    if not spans:
        return None
    starts = np.array([s[0] for s in spans], dtype=np.int64)
    ends = np.array([s[1] for s in spans], dtype=np.int64)
    ops = np.flatnonzero(kind_mask(cols["kind"])({"cpu_op"}))
    if not len(ops):
        return None
    ts = np.asarray(cols["ts_ns"], np.int64)[ops]
    end = ts + np.asarray(cols["dur_ns"], np.int64)[ops]
    j = np.searchsorted(starts, ts, side="right") - 1
    inside = (j >= 0) & (ts < ends[np.clip(j, 0, None)])
    cut = np.flatnonzero(inside & (end > ends[np.clip(j, 0, None)]))
    if not len(cut):
        return None
    first = ops[int(cut[0])]
    return (
        f"{path.name}: {len(cut)} CPU op(s) run past the end of the ProfilerStep they start in "
        f"(e.g. {cols['name'][first][:60]!r}); each belongs to the step it starts in"
    )
