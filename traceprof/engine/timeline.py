"""Per-rank lanes of one step: compute, communication (hidden or exposed) and idle, for the report.

Algorithm:
  1. Choose the step: the one given, else the median step (steps sorted by their median duration
     over ranks, the middle one), so the picture is typical rather than the first (warm-up) or an
     outlier.
  2. Take the activity (``traceprof.engine.activity``; for per-op traces without kernels, NDTimeline, its
     GPU-annotated compute ranges and collectives) launched in that step on every rank, merge it per
     (rank, class): compute, and communication; exposed communication is communication minus the
     rank's compute (``traceprof.analyses.overlap.exposed_comm``), as in ``overlap`` and ``gaps``.
     A process that drives several GPUs has one lane, its devices merged: said in ``note``.
  3. Times are ms from the step's earliest start over all ranks (clocks aligned at ingest).
  4. Up to ``detail_ranks`` ranks and ``max_intervals`` merged intervals: the intervals themselves
     (``intervals``). More: each rank's lane cut into ``bins`` equal time bins, each bin labelled
     with the state that held most of its time (0 idle, 1 compute, 2 hidden communication, 3 exposed
     communication) (``grid``), so 1,024 ranks, or a step of 20,000 kernels, are one image, not a
     glyph per kernel (the report's size stays bounded).
  5. :func:`with_path` adds the step's critical path (``traceprof.analyses.critical_path`` table ``path``) on the
     same time axis, which the report draws over the lanes; above ``max_pieces`` pieces, consecutive
     pieces on one rank are drawn as one (at most ``max_pieces`` plus one per change of rank), named
     by their count and their longest piece.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import polars as pl

from traceprof.engine import intervals
from traceprof.engine.activity import activity, exposed_comm, multi_device_ranks, op_activity, step_activity
from traceprof.storage.store import Store

__all__ = [
    "Timeline",
    "STATES",
    "MAX_INTERVALS",
    "MAX_PATH_PIECES",
    "choose_step",
    "lanes",
    "step_timeline",
    "with_path",
]

#: Most merged intervals drawn one by one (:func:`lanes`); above, the binned grid. 2,000 rectangles are
#: about 60 KB of the report (its budget: 1 MB, of which bokeh's JavaScript takes 0.47 MB).
MAX_INTERVALS = 2000
#: Most critical-path pieces drawn one by one (:func:`with_path`); above, consecutive ones merged.
MAX_PATH_PIECES = 2000

#: Lane states, in the order of their codes in ``Timeline.grid``.
STATES = ("idle", "compute", "communication (hidden)", "communication (exposed)")


@dataclass(frozen=True)
class Timeline:
    """Lanes of one step.

    ``step``: the step shown (-1: the whole trace of a run without steps); ``ranks``: rank numbers in lane order; ``span_ms``: the step's length
    (earliest start to latest end over ranks, ms); ``intervals``: rank, state (a :data:`STATES`
    name other than idle), start_ms, end_ms (from the step's start), or None when binned;
    ``grid``: uint8 array ranks × bins of state codes, or None when detailed; ``bin_ms``: bin width.
    ``note``: how the step was chosen. ``t0_ns``: the epoch ns the axis starts at (None: not
    known). ``path``: the critical path over the lanes (:func:`with_path`): rank, kind, name,
    start_ms, end_ms, in time order; None when not added.
    """

    step: int
    ranks: tuple[int, ...]
    span_ms: float
    intervals: pl.DataFrame | None
    grid: np.ndarray | None
    bin_ms: float
    note: str
    t0_ns: int | None = None
    path: pl.DataFrame | None = None

    @property
    def axis(self) -> str:
        """What the time axis measures: ms from the step's start, or from the trace's first
        compute or communication when the run has no steps (the whole trace is shown)."""
        return "ms from the step's start" if self.step >= 0 else "ms from the first compute or communication"


def choose_step(store: Store, run_id: int) -> tuple[int | None, str]:
    """The median step of a run (module doc, step 1) and a note saying so; (None, reason) without steps."""
    df = store.sql(
        """SELECT step, median(coalesce(device_end_ns - device_start_ns, cpu_end_ns - cpu_start_ns)) AS ns
           FROM steps WHERE run_id = ? GROUP BY step ORDER BY ns, step""",
        [run_id],
    )
    if df.is_empty():
        return None, "the run has no ProfilerSteps"
    row = df.row((df.height - 1) // 2, named=True)
    return int(
        row["step"]
    ), f"step {row['step']}, the median of {df.height} steps ({row['ns'] / 1e6:,.1f} ms)"


def lanes(
    act: pl.DataFrame, detail_ranks: int = 64, bins: int = 400, max_intervals: int = MAX_INTERVALS
) -> tuple[tuple[int, ...], float, pl.DataFrame | None, np.ndarray | None, float]:
    """Lanes of the activity of one step (module doc, steps 2-4).

    Args:
        act: Activity rows of the step (rank, class, start_ns, end_ns).
        detail_ranks: Up to this many ranks, intervals; above, a binned grid.
        bins: Time bins per lane when binned.
        max_intervals: Above this many merged intervals (all ranks and states), a binned grid too.

    Returns:
        (ranks, span_ms, intervals or None, grid or None, bin_ms); see :class:`Timeline`.
    """
    ranks = tuple(sorted(int(r) for r in act["rank"].unique()))
    t0 = int(act["start_ns"].to_numpy().min())
    span_ns = max(int(act["end_ns"].to_numpy().max()) - t0, 1)
    comp = intervals.merge(act.filter(pl.col("class") == "compute"), ["rank"])
    comm = intervals.merge(act.filter(pl.col("class") == "comm"), ["rank"])
    exposed = exposed_comm(act.filter(pl.col("class").is_in(["comm", "compute"])), ["rank"])
    parts = [(comp, STATES[1]), (comm, STATES[2]), (exposed, STATES[3])]
    if len(ranks) <= detail_ranks and sum(p.height for p, _ in parts) <= max_intervals:
        rows = pl.concat(
            [
                p.select(
                    pl.col("rank").cast(pl.Int32),
                    pl.lit(state).alias("state"),
                    ((pl.col("start_ns") - t0) / 1e6).alias("start_ms"),
                    ((pl.col("end_ns") - t0) / 1e6).alias("end_ms"),
                )
                for p, state in parts
            ]
        )
        return ranks, span_ns / 1e6, rows, None, 0.0
    edges = t0 + np.linspace(0, span_ns, bins + 1)
    index = {r: i for i, r in enumerate(ranks)}
    covered = np.zeros((4, len(ranks), bins))
    for code, (p, _) in enumerate(parts, start=1):
        for (rank,), g in p.group_by(["rank"]):
            covered[code, index[int(rank)]] = _coverage(
                g["start_ns"].to_numpy(), g["end_ns"].to_numpy(), edges
            )
    covered[2] -= covered[3]  # hidden = all communication - exposed
    busy = intervals.merge(act, ["rank"])
    covered[0] = span_ns / bins
    for (rank,), g in busy.group_by(["rank"]):
        covered[0, index[int(rank)]] -= _coverage(g["start_ns"].to_numpy(), g["end_ns"].to_numpy(), edges)
    return ranks, span_ns / 1e6, None, covered.argmax(axis=0).astype(np.uint8), span_ns / bins / 1e6


def _coverage(start: np.ndarray, end: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Covered ns of disjoint sorted intervals in each bin between consecutive ``edges``."""
    order = np.argsort(start)
    start, end = start[order].astype(np.float64), end[order].astype(np.float64)
    cum = np.concatenate([[0.0], np.cumsum(end - start)])

    def upto(t: np.ndarray) -> np.ndarray:  # covered time before t
        i = np.searchsorted(start, t, side="right")  # intervals starting before t
        last = np.clip(i - 1, 0, len(start) - 1)
        partial = np.where(i > 0, np.clip(t - start[last], 0, end[last] - start[last]), 0.0)
        return cum[np.maximum(i - 1, 0)] * (i > 0) + partial

    return np.diff(upto(edges))


def step_timeline(
    store: Store, run_id: int, step: int | None = None, detail_ranks: int = 64, bins: int = 400
) -> Timeline | str:
    """The lanes of ``step`` (default: the median step) of a run, or a sentence saying why none.

    Args:
        store: An open store.
        run_id: The run.
        step: ProfilerStep number; None for the median step.
        detail_ranks: See :func:`lanes`.
        bins: See :func:`lanes`.
    """
    note = f"step {step}"
    if step is None:
        step, note = choose_step(store, run_id)
    if step is None:  # no ProfilerSteps (e.g. an nsys capture without step ranges): the whole trace
        note = "the whole trace (no ProfilerSteps)"
        act = activity(store, run_id)
    else:
        act = step_activity(store, run_id, step)  # the step's rows only
    act = act.filter(pl.col("class").is_in(["compute", "comm"]))
    if act.is_empty():  # per-op traces without kernels (NDTimeline): its GPU annotations and collectives
        act = op_activity(store, run_id, step)
    if act.is_empty():
        return "no compute or communication " + (
            f"launched in step {step}" if step is not None else "in the trace"
        )
    ranks, span, rows, grid, bin_ms = lanes(act, detail_ranks, bins)
    multi = multi_device_ranks(act) if "device_kind" in act.columns else []
    if multi:  # one lane per rank (module doc, step 2)
        note += (
            f"; rank(s) {', '.join(map(str, multi))} drive several GPUs: each one's lane merges its devices "
            "(its communication exposed only where none of them computes; per device: gaps)"
        )
    return Timeline(
        -1 if step is None else step,
        ranks,
        span,
        rows,
        grid,
        bin_ms,
        note,
        t0_ns=int(act["start_ns"].to_numpy().min()),
    )


def with_path(tl: Timeline, path: pl.DataFrame, max_pieces: int = MAX_PATH_PIECES) -> Timeline:
    """``tl`` with the critical path of its step (``traceprof.analyses.critical_path`` table ``path``: step,
    rank, kind, name, start_ns, duration_ns) on its time axis, clipped to the lanes' span and to
    the ranks shown, at most ``max_pieces`` pieces plus one per change of rank (:func:`_bounded`);
    unchanged when its origin is unknown or the path has no piece there."""
    if tl.t0_ns is None or path.is_empty():
        return tl
    p = path if tl.step < 0 else path.filter(pl.col("step") == tl.step)
    p = (
        p.filter(pl.col("rank").is_in(list(tl.ranks)))
        .sort("start_ns")
        .select(
            "rank",
            "kind",
            "name",
            ((pl.col("start_ns") - tl.t0_ns) / 1e6).clip(0, tl.span_ms).alias("start_ms"),
            ((pl.col("start_ns") + pl.col("duration_ns") - tl.t0_ns) / 1e6)
            .clip(0, tl.span_ms)
            .alias("end_ms"),
        )
    )
    p = p.filter(pl.col("end_ms") > pl.col("start_ms"))
    return tl if p.is_empty() else replace(tl, path=_bounded(p, max_pieces))


def _bounded(p: pl.DataFrame, max_pieces: int) -> pl.DataFrame:
    """Path ``p`` (rank, kind, name, start_ms, end_ms, in time order) with at most ``max_pieces`` rows
    plus one per change of rank: above, each ``ceil(n / max_pieces)`` consecutive pieces on one rank
    become one from the first start to the last end, kind ``"<k> pieces; longest: <kind>"`` and the
    longest piece's name (one piece keeps its own). Linear in the pieces."""
    n = p.height
    if n <= max_pieces:
        return p
    per = -(-n // max_pieces)
    ms = pl.col("end_ms") - pl.col("start_ms")
    return (
        p.with_row_index("_i")
        .with_columns((pl.col("rank") != pl.col("rank").shift(1)).fill_null(True).cum_sum().alias("_run"))
        .with_columns(((pl.col("_i") - pl.col("_i").min().over("_run")) // per).alias("_chunk"))
        .group_by("_run", "_chunk", maintain_order=True)
        .agg(
            pl.col("rank").first(),
            pl.len().alias("_n"),
            pl.col("kind").sort_by(ms).last(),
            pl.col("name").sort_by(ms).last(),
            pl.col("start_ms").min(),
            pl.col("end_ms").max(),
        )
        .with_columns(
            pl.when(pl.col("_n") > 1)
            .then(pl.format("{} pieces; longest: {}", pl.col("_n"), pl.col("kind")))
            .otherwise(pl.col("kind"))
            .alias("kind")
        )
        .select(p.columns)
    )
