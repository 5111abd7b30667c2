"""Step spans that tile a rank's time, and the rank's activity measured within each.

Algorithm (``temporal``'s per-step table reads it):
  1. Each rank's (or device's) step windows (:func:`step_windows`, ``critical_path``'s step account): step k ends
     where its work ends, kept non-decreasing over the rank's steps, and starts where step k-1
     ended. :func:`step_span_measures` takes the bounds of the activity launched in each step
     (its first start and last end) as that work, so a collective that runs into the next step
     ends its step's span where it ends.
  2. All of the group's activity (any step's, or none) is measured within each span without
     cutting it: over the rows in start order, ``F(t) = |∪ rows ∩ (-inf, t)|`` is the running sum
     of what each row adds to the union (the part of it past the running max end of the rows
     before it) up to the last row starting before t, less what that union holds at or after t
     (from t to that running max end: the row that reached it started before t, so covers it).
     A span [a, b) holds ``F(b) - F(a)`` ns of activity; the same with only the compute rows.
     One pass over the rows (a sort only when they are not in (group, start) order) and a binary
     search per span bound: O(n + s log n) for n rows and s spans.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import polars as pl

from traceprof.engine.intervals import sorting

__all__ = ["step_windows", "window_measures", "step_span_measures"]


def step_windows(
    steps: pl.DataFrame, keep: list[str] | None = None, by: Sequence[str] = ("rank",)
) -> pl.DataFrame:
    """Each rank's step windows, which tile its profiled time (``critical_path``'s step account).

    Step k ends where its work ends (its last GPU activity's end, ``device_end_ns``; without GPU
    activity its ProfilerStep's end, ``cpu_end_ns``), kept non-decreasing over the rank's steps,
    and starts where step k-1 ended; the first starts at its ProfilerStep's start, or its first
    GPU activity's if earlier. So a rank's windows never overlap: a step that runs into the next
    ones (a ProfilerStep recorded 50x too long) leaves them 0 ns. O(n log n) in the steps.

    Args:
        steps: rank, step, cpu_start_ns, cpu_end_ns, device_start_ns, device_end_ns (ns; device
            ones null for a step without GPU activity), one row per (rank, step).
        keep: Other columns of ``steps`` to keep.
        by: The columns whose steps tile one timeline: rank (``["rank", "device"]``: each device
            of a rank its own, ``steps`` one row per (rank, device, step)).

    Returns:
        ``by``, step, start_ns, end_ns (ns) and the ``keep`` columns, sorted by ``by`` and step.
    """
    by = list(by)
    w = steps.sort(*by, "step").with_columns(
        pl.coalesce("device_end_ns", "cpu_end_ns").cum_max().over(by).alias("end_ns"),
        pl.min_horizontal("cpu_start_ns", "device_start_ns").alias("_first"),
    )
    w = w.with_columns(pl.coalesce(pl.col("end_ns").shift(1).over(by), "_first").alias("start_ns"))
    return w.select(*by, "step", "start_ns", "end_ns", *(keep or []))


def _covered_before(s: np.ndarray, e: np.ndarray, t: np.ndarray) -> np.ndarray:
    """``|∪ [s_i, e_i) ∩ (-inf, t_j)|`` for each ``t_j`` (int64 ns), ``s`` ascending (module doc,
    step 2). O(n + len(t) log n)."""
    reach = np.maximum.accumulate(e)  # the union of rows 0..i ends at reach[i] (or earlier)
    before = np.concatenate((s[:1], reach[:-1]))  # the running max end of the rows before (s[0]: none)
    added = np.maximum(e - np.maximum(s, before), 0)
    total = np.cumsum(added)
    k = np.searchsorted(s, t, side="left")  # rows 0..k-1 start before t; the others add nothing there
    last = np.maximum(k - 1, 0)
    out = total[last] - np.maximum(reach[last] - t, 0)
    return np.where(k > 0, out, 0)


def window_measures(
    act: pl.DataFrame, windows: pl.DataFrame, keys: Sequence[str] = ("rank",)
) -> pl.DataFrame:
    """The activity of each group within each of its rank's windows, measured without cutting it.

    Args:
        act: Activity rows (``traceprof.engine.activity``): the ``keys`` columns, class, start_ns,
            end_ns (int64 ns, end exclusive). Sorted here only when not in (``keys``, start_ns) order.
        windows: Disjoint windows per group: rank (and the other ``keys`` it has), start_ns,
            end_ns (ns) and any other columns (kept), e.g. step; a window of zero length measures 0.
        keys: The groups whose unions are measured, starting with rank (``["rank"]``, or
            ``["rank", "device"]``: each device of a rank within each of its windows, or of the
            rank's where ``windows`` has no device; a null key is a group of its own).

    Returns:
        ``windows``' rows (one per group of ``act`` and window of it; windows of a group without
        rows are left out), with the ``keys`` and busy_ns = |∪ rows ∩ window|,
        compute_ns = |∪ compute rows ∩ window| (int64 ns), in ``windows``' order within each group.
        O(n + w log n) after the sort: n rows, w windows (module doc, step 2).
    """
    keys = list(keys)
    rows = act.select(*keys, "class", "start_ns", "end_ns")
    order = sorting([rows.get_column(c) for c in [*keys, "start_ns"]])
    if order is not None:
        rows = rows[order]
    # each group's rows are one slice [lo, hi) of the sorted rows
    gid = rows.select(pl.struct(keys).rle_id()).to_series().to_numpy()
    lo = (
        np.flatnonzero(np.concatenate(([True], gid[1:] != gid[:-1])))
        if rows.height
        else np.zeros(0, np.int64)
    )
    bounds = np.append(lo, rows.height)
    groups = rows[lo.tolist()].select(keys).with_columns(pl.Series("_g", np.arange(len(lo))))
    on = [k for k in keys if k in windows.columns]
    pairs = groups.join(windows, on=on, how="inner", maintain_order="left_right", nulls_equal=True)
    s, e = rows.get_column("start_ns").to_numpy(), rows.get_column("end_ns").to_numpy()
    comp = (rows.get_column("class") == "compute").to_numpy()
    g, a, b = (pairs.get_column(c).to_numpy() for c in ("_g", "start_ns", "end_ns"))
    busy, compute = np.zeros(len(g), np.int64), np.zeros(len(g), np.int64)
    starts = np.searchsorted(g, np.arange(len(lo) + 1))  # pairs come grouped by _g, in its order
    for i in range(len(lo)):
        if starts[i] == starts[i + 1]:
            continue  # a group of a rank without steps
        r, w = slice(bounds[i], bounds[i + 1]), slice(starts[i], starts[i + 1])
        si, ei, t = s[r], e[r], np.concatenate((a[w], b[w]))
        f = _covered_before(si, ei, t)
        busy[w] = f[len(t) // 2 :] - f[: len(t) // 2]
        ec = np.where(comp[r], ei, si[0])  # a non-compute row ends before anything: adds nothing
        f = _covered_before(si, ec, t)
        compute[w] = f[len(t) // 2 :] - f[: len(t) // 2]
    # a zero-length or reversed window holds nothing
    empty = b <= a
    busy[empty], compute[empty] = 0, 0
    return pairs.drop("_g").with_columns(pl.Series("busy_ns", busy), pl.Series("compute_ns", compute))


def step_span_measures(
    act: pl.DataFrame, bounds: pl.DataFrame | None = None, keys: Sequence[str] = ("rank",)
) -> pl.DataFrame:
    """Per step span (module doc, step 1) of each group of ``keys``: its length and the group's
    activity within it.

    Args:
        act: Activity rows of the run (``traceprof.engine.activity``): rank, class, start_ns,
            end_ns (ns), step and the ``keys`` columns.
        bounds: Per (``keys``, step) first_ns and last_ns (ns) of the activity launched in the step
            (``intervals.class_measures`` of ``act`` by ``keys`` and step, when the caller has it;
            null steps are left out); None: taken from ``act``.
        keys: ``["rank"]``, or ``["rank", "device"]``: each device of a rank its own spans, of
            the device's activity launched in each step (a process that drives several GPUs).

    Returns:
        ``keys``, step, window_ns (the span's length), busy_ns and compute_ns (ns) of all of the
        group's rows within the span, sorted by ``keys`` and step; steps without activity
        launched in them are absent. Activity outside every span (launched outside any step
        before the first span or after the last) is in no row.
    """
    keys = list(keys)
    if bounds is None:
        bounds = (
            act.lazy()
            .filter(pl.col("step").is_not_null())
            .group_by(*keys, "step")
            .agg(pl.col("start_ns").min().alias("first_ns"), pl.col("end_ns").max().alias("last_ns"))
            .collect()
        )
    m = bounds.filter(pl.col("step").is_not_null())
    spans = step_windows(
        m.select(
            *keys,
            "step",
            pl.col("first_ns").alias("cpu_start_ns"),
            pl.col("last_ns").alias("cpu_end_ns"),
            pl.col("first_ns").alias("device_start_ns"),
            pl.col("last_ns").alias("device_end_ns"),
        ),
        by=keys,
    )
    out = window_measures(act, spans, keys).select(
        *keys,
        "step",
        (pl.col("end_ns") - pl.col("start_ns")).alias("window_ns"),
        "busy_ns",
        "compute_ns",
    )
    return out.sort(*keys, "step")
