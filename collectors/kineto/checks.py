"""Sanity passes over a parsed Kineto trace: suspect timestamps, same-lane overruns, several processes.

They run on the parser's column lists (``collectors.kineto.parse``) after every record is read, and
flag records (``events.flag``) instead of dropping them, so the store keeps what the file said.

Algorithm:
  1. ``before_launch``: a GPU row (kernel / memcpy / memset) that starts more than
     :data:`LAUNCH_TOLERANCE_NS` before the CPU runtime call that launched it (same ``correlation``)
     comes from another clock domain (a known profiler bug re-registers the timestamp callback and
     stamps the first records of a session ~1e14 ns early).
  2. ``far_outside``: a record apart from the bulk of the trace: sorted by start, the records split
     where two neighbours lie more than the margin apart (the reference range's own length, at
     least :data:`FAR_MARGIN_MIN_NS`; the range is the ProfilerSteps with a set ``ts``, or without
     steps the 1st..99th percentile of the starts); the clusters that overlap the steps (without
     steps: the largest) are the bulk. ``zero_ts``: a record whose ``ts`` is 0 (an
     unset timestamp) that lies apart from the other records (farther from their 1st..99th
     percentile range than that range is long), a ProfilerStep included. Launch calls flagged
     here do not vouch for their kernels' steps or latency.
  3. ``overrun``: on one (device, stream) lane, sorted by start, a row that runs past the start of
     the next valid row by more than :data:`OVERRUN_TOLERANCE_NS` (a profiler bug reports
     seconds-long kernels; overlaps up to 5 us are programmatic dependent launch, left alone) is
     clipped to that start; the last row of a lane that ends "far" past the reference range (step
     2's margin) is clipped to the end of the rank's other GPU activity or of the range. ``raw_dur_ns`` keeps the recorded duration. Perfetto clips
     the same way.
  4. One process per file: several ProfilerStep#N with the same N, ProfilerSteps on several pids,
     or one correlation id launched from several pids mean the file merges several ranks: an error.
  5. ProfilerStep ranges that cut through a running op (a CPU op that starts in a step and ends
     after it) are counted in a warning; the op belongs to the step it starts in.
Flags 1-2 (and unmatched ``B`` records, see the parser) exclude a record from windows, idle, latency and collectives (``traceprof.classify``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from collectors.kineto._values import Ints
from collectors.kineto.columns import codes, kind_mask, lookup
from traceprof.errors import TraceFormatError
from traceprof.schema import GPU_ACTIVITY_KINDS, LAUNCH_KINDS

__all__ = ["flag_records", "check_one_process", "step_cut_warning",
           "LAUNCH_TOLERANCE_NS", "OVERRUN_TOLERANCE_NS", "FAR_MARGIN_MIN_NS", "ZERO_TS_MIN_GAP_NS"]

#: A GPU row may start this much before its launch call (CPU/GPU clock conversion jitter): 5 us.
LAUNCH_TOLERANCE_NS = 5_000
#: Same-lane overlaps up to this are programmatic dependent launch, not an overrun: 5 us.
OVERRUN_TOLERANCE_NS = 5_000
#: A ``ts == 0`` record is an unset time when it lies at least this far from the others: 1 ms.
ZERO_TS_MIN_GAP_NS = 1_000_000
#: The smallest margin around the reference range before a record is "far outside": 1 s.
FAR_MARGIN_MIN_NS = 1_000_000_000

_GPU = frozenset(GPU_ACTIVITY_KINDS)
_LAUNCH = frozenset(LAUNCH_KINDS)


def _examples(idx: np.ndarray, n: int = 3) -> str:
    return ", ".join(f"#{int(i)}" for i in idx[:n]) + (", ..." if len(idx) > n else "")


def _reference_range(step: np.ndarray, ts: np.ndarray, dur: np.ndarray, skip: np.ndarray) -> tuple[int, int, bool]:
    """The rank's reference range (ns): its ProfilerSteps (``step`` rows, not ``skip``), else the
    1st..99th percentile of the other records' starts; and whether steps defined it."""
    steps = step & ~skip
    if steps.any():
        return int(ts[steps].min()), int((ts[steps] + dur[steps]).max()), True
    pool = ts[~skip] if (~skip).any() else ts
    lo, hi = (int(v) for v in np.percentile(pool, [1, 99], method="nearest"))
    return lo, hi, False


def _far_records(ts: np.ndarray, cand: np.ndarray, lo: int, hi: int, margin: int,
                 by_steps: bool) -> tuple[np.ndarray, int]:
    """Records (of ``cand``) far from the bulk: split the sorted starts where two neighbours lie more
    than ``margin`` apart; the clusters that overlap the step range (without steps: the largest)
    are the bulk, every other record is far. Returns (mask, end of the bulk: at least ``hi``)."""
    far = np.zeros(len(ts), dtype=bool)
    idx = np.flatnonzero(cand)
    if not len(idx):
        return far, hi
    order = idx[np.argsort(ts[idx], kind="stable")]
    st = ts[order]
    cut = np.flatnonzero(np.diff(st) > margin)
    first = np.concatenate(([0], cut + 1))
    last = np.concatenate((cut, [len(st) - 1]))
    if by_steps:
        keep = (st[last] >= lo) & (st[first] <= hi)
        if not keep.any():  # the steps fall in a gap: keep the nearest cluster
            keep[int(np.argmin(np.minimum(np.abs(st[first] - hi), np.abs(st[last] - lo))))] = True
    else:
        keep = np.zeros(len(first), dtype=bool)
        keep[int(np.argmax(last - first))] = True
    for c in np.flatnonzero(~keep).tolist():
        far[order[first[c]:last[c] + 1]] = True
    return far, max(hi, int(st[last[keep]].max()))


def _unset_times(ts: np.ndarray, base_ns: int) -> np.ndarray:
    """Records whose own ``ts`` is 0 (``ts_ns == base_ns``) and that lie apart from the others:
    farther from the other records' 1st..99th percentile range than that range is long (and than
    :data:`ZERO_TS_MIN_GAP_NS`)."""
    raw_zero = ts == base_ns
    others = ts[~raw_zero]
    if not raw_zero.any() or not len(others):
        return np.zeros(len(ts), dtype=bool)
    lo, hi = (int(v) for v in np.percentile(others, [1, 99], method="nearest"))
    apart = max(hi - lo, ZERO_TS_MIN_GAP_NS)
    return raw_zero & ((ts < lo - apart) | (ts > hi + apart))


def flag_records(path: Path, cols: dict[str, Any], src_index: list[int],
                 base_ns: int = 0) -> tuple[dict[str, int], list[str]]:
    """Fill ``cols["flag"]`` / ``cols["raw_dur_ns"]`` and clip overruns in ``cols["dur_ns"]`` (steps 1-3).

    Args:
        path: The trace file (for messages).
        cols: Parser columns (``collectors.kineto.decode.Rows``): kind and flag lists, ts_ns and
            dur_ns int64 ns arrays, device, stream, correlation and raw_dur_ns ``Ints``.
        src_index: Index of each row's record in the file's ``traceEvents`` (for messages).
        base_ns: The trace's ``baseTimeNanoseconds`` (0 for old style): a record whose own ``ts`` is 0
            and that lies apart from the other records is flagged ``zero_ts``.

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
    src = np.asarray(src_index, dtype=np.int64)
    flag: list[str | None] = cols["flag"]
    counts: dict[str, int] = {}
    warnings: list[str] = []
    gpu = kind_in(_GPU)
    launch = kind_in(_LAUNCH)
    unflagged = np.fromiter((f is None for f in flag), bool, n)

    # 2 first (launch calls and steps with unset or far times must not vouch for anything)
    zero = unflagged & _unset_times(ts, base_ns)
    lo, hi, by_steps = _reference_range(kind_in({"step"}), ts, dur, zero)
    margin = max(hi - lo, FAR_MARGIN_MIN_NS)
    far, hi = _far_records(ts, unflagged & ~zero, lo, hi, margin, by_steps)
    ok_launch = launch & ~zero & ~far

    # 1. before_launch (against launch calls that are themselves sound): the earliest sound
    #    launch of each correlation id
    lr = np.flatnonzero(ok_launch & corr.ok)
    ids, inv = np.unique(corr.values[lr], return_inverse=True)
    launch_ts = np.full(len(ids), np.iinfo(np.int64).max)
    np.minimum.at(launch_ts, inv, ts[lr])
    g = np.flatnonzero(gpu & unflagged & corr.ok)
    pos, found = lookup(ids, corr.values[g])
    lt = launch_ts[pos] if len(ids) else np.zeros(len(g), np.int64)
    is_early = found & (ts[g] < lt - LAUNCH_TOLERANCE_NS)
    early = g[is_early].tolist()
    worst = int((lt[is_early] - ts[g][is_early]).max()) if early else 0
    for i in early:
        flag[i] = "before_launch"
        zero[i] = far[i] = False
    if early:
        counts["before_launch"] = len(early)
        warnings.append(
            f"{path.name}: {len(early)} GPU record(s) start before the CPU call that launched them, by up to "
            f"{worst / 1000:,.3f} us (events {_examples(src[early])}): another clock domain; flagged "
            "(events.flag = 'before_launch') and left out of windows, idle and latency")
    where = "ProfilerStep range" if by_steps else "time range"
    z = np.flatnonzero(zero)
    for i in z.tolist():
        flag[i] = "zero_ts"
    if len(z):
        counts["zero_ts"] = len(z)
        warnings.append(f"{path.name}: {len(z)} record(s) with ts == 0, apart from the other records (events "
                        f"{_examples(src[z])}): flagged (events.flag = 'zero_ts') and left out of windows, "
                        "steps and latency")
    f = np.flatnonzero(far)
    for i in f.tolist():
        flag[i] = "far_outside"
    if len(f):
        counts["far_outside"] = len(f)
        gap = int(np.maximum(lo - ts[f], ts[f] - hi).max())
        warnings.append(
            f"{path.name}: {len(f)} record(s) lie far outside the rank's {where} (up to {gap / 1e9:,.3f} s "
            f"away, more than {margin / 1e9:,.3f} s; events {_examples(src[f])}): flagged "
            "(events.flag = 'far_outside') and left out of windows")

    # 3. overrun (on valid GPU rows, per (device, stream) lane); the last row of a lane is bounded by
    #    the end of the reference range plus the margin.
    rows = np.flatnonzero(gpu & np.fromiter((f is None for f in flag), bool, n))
    clipped = []
    if len(rows):
        # each temporary is dropped once used: on 18 M events these per-GPU-row arrays were the
        # parse's peak (about 1 GB held at once)
        d = cols["device"].take(rows)
        dev = np.where(d.ok, d.values, -1)
        del d
        st = cols["stream"].take(rows)
        stream = np.where(st.ok, st.values, -1)
        del st
        order = np.lexsort((dur[rows], ts[rows], stream, dev))
        r = rows[order]
        del rows
        dev, stream = dev[order], stream[order]
        del order
        same_lane = (dev[1:] == dev[:-1]) & (stream[1:] == stream[:-1])
        del dev, stream
        start = ts[r]
        end = start + dur[r]
        last = ~np.append(same_lane, False)
        del same_lane
        nxt = np.append(start[1:], 0)
        over = np.flatnonzero(np.where(last, end > hi + margin, (end > nxt + OVERRUN_TOLERANCE_NS) & (nxt > start)))
        del start
        # a lane's last row that ends far past the range: clipped to the end of the rank's other GPU
        # activity or of the range, whichever is later
        sound = np.ones(len(r), bool)
        sound[over] = False
        tail = max(hi, int(end.max(where=sound, initial=hi)))
        del sound, end
        for j in over.tolist():
            i = int(r[j])
            cols["raw_dur_ns"][i] = int(dur[i])
            cols["dur_ns"][i] = int(max(0, (tail if last[j] else nxt[j]) - ts[i]))
            flag[i] = "overrun"
            clipped.append(i)
    if clipped:
        counts["overrun"] = len(clipped)
        most = max(cols["raw_dur_ns"][i] - int(cols["dur_ns"][i]) for i in clipped)
        warnings.append(
            f"{path.name}: {len(clipped)} GPU record(s) run past the next record on their stream (or far past "
            f"the rank's {where}) by up to {most / 1000:,.3f} us (events {_examples(src[clipped])}): clipped "
            "(events.flag = 'overrun', raw_dur_ns keeps the recorded duration)")
    return counts, warnings


def check_one_process(path: Path, cols: dict[str, Any], step_numbers: list[int | None]) -> None:
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
    for k, pid, num in zip(cols["kind"], cols["pid"], step_numbers, strict=True):
        if k != "step" or num is None:
            continue
        step_pids.add(pid)
        if num in seen:
            raise TraceFormatError(
                path, f"ProfilerStep#{num}",
                f"appears twice (pids {seen[num]} and {pid}): the file holds several processes or ranks; "
                "give each rank its own trace file")
        seen[num] = pid
    if len(step_pids) > 1:
        raise TraceFormatError(path, "ProfilerStep", f"steps on several processes (pids {sorted(step_pids)}): "
                               "the file holds several ranks; give each rank its own trace file")
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
                path, f"correlation {c}",
                f"launched from two processes (pids {other} and {pid}): the file holds several ranks; "
                "give each rank its own trace file")


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
    return (f"{path.name}: {len(cut)} CPU op(s) run past the end of the ProfilerStep they start in "
            f"(e.g. {cols['name'][first][:60]!r}); each belongs to the step it starts in")
