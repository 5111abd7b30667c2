"""critical_path: where every nanosecond of each step went on each rank, and the path across ranks.

The step account (docs/critical_path.md; README.md "Analyses"): every ns of a
rank's step belongs to exactly one category, so the categories add up to the step to the ns:

- ``compute``: compute work runs (GPU compute kernels; CPU ranks: the training thread's ops);
- ``transfer``: communication runs after the last rank arrived (or communication that matched no
  collective across ranks);
- ``memory``: memory copies and sets run (memcpy / memset);
- ``wait``: the rank has arrived at a collective whose last rank has not (from its own arrival to
  the last arrival), credited to that last rank;
- ``host_bound``: nothing runs and the work that ends the gap was launched after the gap began:
  the device waited for the host to launch it (or, on a CPU rank, the training thread ran
  untraced host code: Python, data loading, a sleep);
- ``idle``: nothing runs and no cause was found (the next work was queued before the gap began,
  behind a dependency, or has no known launch).

Where several overlap, the first in this order wins: compute > transfer > memory > wait >
host_bound > idle.

Algorithm:
  1. Step windows per rank, which tile its profiled time: step k ends where its work ends (GPU
     ranks: the last device row launched in it, ``steps.device_end_ns``; CPU ranks:
     ``steps.cpu_end_ns``), kept non-decreasing, and starts where step k-1 ended; the first starts
     at its ProfilerStep (or its first device row, if earlier). Steps are the run's
     (``matching.run_steps``): step k is the same step on every rank. Without steps: one window
     per rank, its first to last activity, step null.
     Excluded time is one definition (``traceprof.engine.activity``, ``traceprof.engine.arrivals``): the steps
     of the profiler-start transient are left out (their windows, so the account covers the
     other steps only; a note says so, as in overlap, temporal, stragglers and whatif), and so
     are the transient's collectives (their waits are not blamed on anyone).
  2. Intervals per rank (``traceprof.engine.activity``; traces at op granularity such as NDTimeline:
     ``activity.op_activity``): compute C, communication K, memory M. For the collectives seen by
     two or more ranks (``_replay.comm_items``: arrival by ``matching.ARRIVAL_SQL``; last arrival
     and last rank by ``stragglers.per_rank_instance``), and the send / recv pairs that matching
     left alone (``traceprof.engine.arrivals.p2p_items``: gloo's, paired by order per (sender,
     receiver) and step; the peer is the other end): wait W = [own arrival, last arrival),
     ended early where the copy ends before; transfer X = [max(work start, last arrival), end).
     Transfer T = X ∪ (K - W).
  3. Precedence: compute keeps C; transfer T - C; memory M - C - T; wait W - C - T - M
     (``intervals.remove``; W and X: ``traceprof.analyses._waits``). Each is first cut into
     per-op pieces (``intervals.tile``: in start order an interval keeps the part past the
     earlier ones), so every piece names its op, kernel or collective.
  4. What is left of the rank's time are gaps between pieces. A gap is host-bound when the work
     that ends it was launched after it began (``traceprof.analyses.idle.host_wait``, HTA's host-wait rule
     on the rank's merged timeline; a CPU row and a CPU rank's arrival are their own launch, so a
     CPU rank's gaps are host-bound), else idle; the gap after the rank's last work is idle.
  5. Pieces and gaps, cut at the step windows (``intervals.cut``), are summed per (rank, step) and
     category: the sums equal the window to the ns. Compute is also summed per op family
     (``traceprof.core.names.family``).
  6. Path, per step of the job: the job's step k runs from the end of its step k-1 to the latest
     end of step k over the ranks. From that end, walk back through the pieces of the rank that
     ended last. At a transfer of a collective whose last rank was another (ties: the lowest
     rank that arrived last), or at a wait that lasted until the last arrival, the path crosses to
     the last rank at its arrival and goes on there. The path's pieces tile the job's step.
     Where the run's clocks form sets that could not be aligned to each other (pipeline stages
     on hosts linked by send / recv only: ``traceprof.engine.arrivals.clock_sets``), the job's
     steps are taken per set on its own clock and step k is the set's whose step k is longest
     (a lower bound of the job's: the time from one set to the next is not measurable), its path
     within that set; never the clocks' offset as idle time.
  7. Blame: each exposed wait piece is credited to its collective's last rank (nobody on a
     tie); intersected with that rank's pieces, it says what that rank was doing while the others
     waited (its op: compute, host-bound time, ...). Where that rank was itself waiting for
     another, the wait passes on to that one (a chain through a pipeline ends at the rank that
     held it up). Every ns of exposed wait is credited once. Ranked by the rank's total, then
     the op's.

A process that drives several GPUs (one rank, several devices) has one account, on the rank's wall
clock: its step ends when its last device's work does, and an instant counts once for the rank, by
the precedence above over all its devices' rows (so one device's communication while another device
computes is compute here: the rank was computing then). The account says how the rank's time went,
not how each device's did: a device's exposed communication (its own compute idle meanwhile) is in
``gaps`` and ``overlap``'s devices table, and a note gives the rank's per-device figure beside this
account's transfer. The path walks the rank's merged pieces, so it runs through whichever device
worked last at each instant (the device that finishes last at the step's end); dependencies between
one device's kernels are not followed across the other device's work.

Linear in events and steps after sorts: interval sweeps and as-of joins, and a walk whose Python
loop runs once per rank crossing (steps without one are taken together).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from traceprof.analyses import _replay, _waits
from traceprof.analyses._common import missing_step_notes, named_ranks, step_windows
from traceprof.analyses.idle import host_wait
from traceprof.analyses.stragglers import per_rank_instance
from traceprof.core import columns as rc
from traceprof.core.errors import AnalysisError
from traceprof.core.names import family
from traceprof.engine import intervals
from traceprof.engine.activity import (
    activity,
    excluded_note,
    exposed_comm,
    graph_level_notes,
    multi_device_ranks,
    op_activity,
    release_activity,
)
from traceprof.engine.analysis import (
    Analysis,
    Chart,
    Finding,
    FindingsInput,
    FrameResult,
    Lead,
    Note,
    Report,
    RunParams,
    register,
    reusing,
)
from traceprof.engine.arrivals import clock_sets, p2p_items, run_transient, unaligned_note
from traceprof.ingest.matching import run_steps
from traceprof.storage.runs import run_label
from traceprof.storage.store import Store

__all__ = ["CATEGORIES", "Params", "Result", "run"]

#: The categories, in precedence order (the first that covers an instant takes it).
CATEGORIES = ("compute", "transfer", "memory", "wait", "host_bound", "idle")
_COMPUTE, _TRANSFER, _MEMORY, _WAIT, _HOST, _IDLE = range(6)
#: Path pieces where it runs before a rank's first window or after its last (a rank crossed to
#: outside the steps it traced).
_OUTSIDE = "(outside the rank's profiled steps)"
#: The activity columns read (``traceprof.engine.activity``): the pieces', the launches', and the
#: device columns of the notes.
_ACT_COLUMNS = (
    "rank",
    "class",
    "start_ns",
    "end_ns",
    "step",
    "name",
    "device_kind",
    "device",
    "launch_ts_ns",
)


@dataclass(frozen=True)
class Params(RunParams):
    """``source``: collectives source whose arrivals split communication into wait and transfer
    (default: the best matched, as ``stragglers``)."""

    source: str = ""


@dataclass(frozen=True)
class Result(FrameResult):
    """The step account per (rank, step) (``frame``) and what follows from it: per rank
    (``ranks``), the path across ranks (``path``), the blame for waits (``blame``), compute by op
    family (``compute``) and the job's steps (``steps``); their columns are declared in :data:`SPEC`."""

    ranks: pl.DataFrame = field(default_factory=pl.DataFrame)
    path: pl.DataFrame = field(default_factory=pl.DataFrame)
    blame: pl.DataFrame = field(default_factory=pl.DataFrame)
    compute: pl.DataFrame = field(default_factory=pl.DataFrame)
    steps: pl.DataFrame = field(default_factory=pl.DataFrame)
    title = "Critical path: where each step went"

    def charts(self) -> list[Chart]:
        return [
            Chart(
                "Where each rank's step time went (% of its steps)",
                "rank",
                tuple(f"{c}_pct" for c in CATEGORIES),
                stacked=True,
                ylabel="% of step time",
                frame="ranks",
            )
        ]


# -- 1. windows ------------------------------------------------------------------------------------


def _windows(store: Store, run_id: int, act: pl.DataFrame) -> pl.DataFrame:
    """Step windows per rank (module doc, step 1): rank, step, start_ns, end_ns (ns)."""
    steps = run_steps(
        store,
        run_id,
        store.sql(
            """SELECT rank, step, cpu_start_ns, cpu_end_ns, device_start_ns, device_end_ns FROM steps
           WHERE run_id = ? AND step IS NOT NULL""",
            [run_id],
        ),
    )
    span = act.group_by("rank").agg(pl.col("start_ns").min(), pl.col("end_ns").max())
    if steps.is_empty():
        return span.select(
            pl.col("rank").cast(pl.Int32), pl.lit(None, pl.Int32).alias("step"), "start_ns", "end_ns"
        ).sort("rank")
    w = step_windows(steps).select(
        pl.col("rank").cast(pl.Int32), pl.col("step").cast(pl.Int32), "start_ns", "end_ns"
    )
    others = span.filter(~pl.col("rank").is_in(w["rank"].unique().to_list()))  # ranks without steps
    if others.height:
        w = pl.concat(
            [
                w,
                others.select(
                    pl.col("rank").cast(pl.Int32), pl.lit(None, pl.Int32).alias("step"), "start_ns", "end_ns"
                ),
            ]
        )
    return w.sort("rank", "start_ns")


# -- 2.-4. pieces ----------------------------------------------------------------------------------

_PIECE = {
    "rank": pl.Int32,
    "start_ns": pl.Int64,
    "end_ns": pl.Int64,
    "name": pl.Utf8,
    "instance_id": pl.Int64,
    "peer": pl.Int32,
    "cross": pl.Int32,
    "last_ns": pl.Int64,
}


def _piece(df: pl.DataFrame) -> pl.DataFrame:
    """``df`` with the piece schema (:data:`_PIECE`), the columns it lacks null."""
    return df.select(
        pl.col(c).cast(t) if c in df.columns else pl.lit(None, t).alias(c) for c, t in _PIECE.items()
    )


def _collective_parts(
    store: Store, run_id: int, source: str | None
) -> tuple[pl.DataFrame, pl.DataFrame, str | None, int, int]:
    """(W, X, source, instances, pairs): wait and transfer intervals of every rank's copy of the
    collectives seen by two or more ranks and of the point-to-point pairs
    (``traceprof.engine.arrivals.p2p_items``; module doc, step 2), in the piece schema; peer = the
    last rank (null on a tie), cross = the rank the path crosses to (the lowest that arrived
    last), last_ns = the last arrival."""
    items, source = _replay.comm_items(store, run_id, source)
    empty = pl.DataFrame(schema=_PIECE)
    if source is not None and items.height:
        items = items.filter(pl.col("n_ranks") >= 2, pl.col("arrival_ns").is_not_null())
        items = items.filter(
            ~pl.col("instance_id").is_in(list(_replay.transient(items, store, run_id).instances))
        )
    # the point-to-point ops matching left alone, paired by order (their waits: the one definition)
    p2p = p2p_items(store, run_id, source)
    if p2p.height:
        items = pl.concat([items.select(p2p.columns), p2p], how="vertical_relaxed") if items.height else p2p
    if items.is_empty():
        return empty, empty, source, 0, 0
    w = per_rank_instance(items).with_columns(
        pl.col("rank")
        .filter(pl.col("arrival_ns") == pl.col("last_ns"))
        .min()
        .over("instance_id")
        .alias("cross"),
        pl.col("last_rank").alias("peer"),
        pl.col("op").fill_null("collective").alias("name"),
    )
    return (
        _piece(_waits.wait_spans(w)),  # the one definition: stragglers' wall-clock waits read it too
        _piece(_waits.transfer_spans(w)),
        source,
        int(w.filter(pl.col("instance_id") >= 0)["instance_id"].n_unique()),
        int(w.filter(pl.col("instance_id") < 0)["instance_id"].n_unique()),
    )


def _pieces(act: pl.DataFrame, wait: pl.DataFrame, xfer: pl.DataFrame) -> pl.DataFrame:
    """Disjoint named pieces of compute, transfer, memory and wait per rank (module doc, step 3),
    with ``cat`` (category code), sorted by rank and start."""

    def of(cls: str) -> pl.DataFrame:
        return _piece(act.filter(pl.col("class") == cls))

    comp, comm, mem = of("compute"), of("comm"), of("memory")
    by = ["rank"]
    c = intervals.tile(comp, by)
    k = intervals.remove(intervals.tile(comm, by), wait, by)
    t_src = pl.concat([xfer.with_columns(pl.lit(0).alias("_prio")), k.with_columns(pl.lit(1).alias("_prio"))])
    t = intervals.remove(intervals.tile(t_src, by, order=["_prio"]).drop("_prio"), comp, by)
    m = intervals.remove(intervals.tile(mem, by), pl.concat([comp, t]), by)
    w = intervals.remove(intervals.tile(wait, by), pl.concat([comp, t, m]), by)
    return pl.concat(
        [
            p.with_columns(pl.lit(code, pl.Int8).alias("cat"))
            for p, code in ((c, _COMPUTE), (t, _TRANSFER), (m, _MEMORY), (w, _WAIT))
        ]
    ).sort("rank", "start_ns")


def _launches(act: pl.DataFrame, wait: pl.DataFrame, cpu_ranks: list[int]) -> pl.DataFrame:
    """Per (rank, start_ns): the earliest launch (ns) of the work starting then: a GPU row's CPU
    runtime call, a CPU row's own start, a CPU rank's arrival at a collective (module doc, step 4)."""
    parts = []
    if "launch_ts_ns" in act.columns:
        parts.append(
            act.select(pl.col("rank").cast(pl.Int32), "start_ns", pl.col("launch_ts_ns").alias("launch_ns"))
        )
    if cpu_ranks and wait.height:
        parts.append(
            wait.filter(pl.col("rank").is_in(cpu_ranks)).select(
                "rank", "start_ns", pl.col("start_ns").alias("launch_ns")
            )
        )
    if not parts:
        return pl.DataFrame(schema={"rank": pl.Int32, "start_ns": pl.Int64, "launch_ns": pl.Int64})
    rows = pl.concat(parts)
    if not intervals.sorted_by(rows, ["rank", "start_ns"]):
        return rows.group_by("rank", "start_ns").agg(pl.col("launch_ns").min())
    # in order (a rank's activity): only the rows that share their start with a neighbour are grouped
    same = pl.col("rank").eq_missing(pl.col("rank").shift(1)) & pl.col("start_ns").eq_missing(
        pl.col("start_ns").shift(1)
    )
    rows = rows.with_columns((same | same.shift(-1, fill_value=False)).alias("_tied"))
    tied = rows.filter("_tied").group_by("rank", "start_ns").agg(pl.col("launch_ns").min())
    return pl.concat([rows.filter(~pl.col("_tied")).drop("_tied"), tied])


def _gaps(pieces: pl.DataFrame, windows: pl.DataFrame, launches: pl.DataFrame) -> pl.DataFrame:
    """The gaps of each rank's time between its pieces, in the piece schema plus ``cat``
    (host_bound or idle; module doc, step 4); name: the work that ends the gap."""
    span = windows.group_by("rank").agg(
        pl.col("start_ns").min().alias("_lo"), pl.col("end_ns").max().alias("_hi")
    )
    p = pieces.select("rank", "start_ns", "end_ns", "name")
    # each piece's predecessor end (pieces are disjoint and sorted); the first: the rank's span start
    p = p.join(span, on="rank", how="left").with_columns(
        pl.coalesce(pl.col("end_ns").shift(1).over("rank"), pl.min_horizontal("_lo", "start_ns")).alias(
            "_prev"
        )
    )
    inner = p.filter(pl.col("start_ns") > pl.col("_prev")).select(
        "rank", pl.col("_prev").alias("start_ns"), pl.col("start_ns").alias("_next"), "name"
    )
    if inner.get_column("rank").null_count():  # a null rank matches no launch: the join says so
        inner = inner.join(launches, left_on=["rank", "_next"], right_on=["rank", "start_ns"], how="left")
    else:
        inner = _launched(inner, launches)
    inner = inner.with_columns(
        pl.when(host_wait(pl.col("launch_ns"), pl.col("start_ns")))
        .then(pl.lit(_HOST, pl.Int8))
        .otherwise(pl.lit(_IDLE, pl.Int8))
        .alias("cat"),
        pl.col("_next").alias("end_ns"),
    )
    last = p.group_by("rank").agg(
        pl.col("end_ns").max().alias("start_ns"), pl.col("_hi").first().alias("end_ns")
    )
    empty = span.filter(~pl.col("rank").is_in(p["rank"].unique().to_list())).select(
        "rank", pl.col("_lo").alias("start_ns"), pl.col("_hi").alias("end_ns")
    )  # ranks with no work at all
    tail = pl.concat([last, empty]).with_columns(
        pl.lit(_IDLE, pl.Int8).alias("cat"), pl.lit("").alias("name")
    )
    out = pl.concat([_piece(inner).with_columns(inner["cat"]), _piece(tail).with_columns(tail["cat"])])
    return out.filter(pl.col("end_ns") > pl.col("start_ns"))


def _launched(inner: pl.DataFrame, launches: pl.DataFrame) -> pl.DataFrame:
    """``inner`` (gaps, rank never null) with the ``launch_ns`` of the work starting at its ``_next``
    (null: none): launches hold one row per (rank, start_ns), so the last one at or before ``_next``
    is that one when it starts at ``_next``; an as-of join on sorted bounds costs less than a hash
    join of every piece (8 x 1 M events: 0.5 s CPU)."""
    return (
        inner.sort("_next")
        .join_asof(
            launches.sort("start_ns").rename({"start_ns": "_ls"}),
            left_on="_next",
            right_on="_ls",
            by="rank",
            strategy="backward",
            check_sortedness=False,
        )
        .with_columns(pl.when(pl.col("_ls") == pl.col("_next")).then(pl.col("launch_ns")).alias("launch_ns"))
        .drop("_ls")
    )


def _segment_columns(act: pl.DataFrame) -> list[str]:
    """The columns of ``act`` that :func:`_segments` reads."""
    return [c for c in act.columns if c in _PIECE or c in ("class", "launch_ts_ns")]


def _rank_rows(act: pl.DataFrame) -> dict[int | None, pl.DataFrame]:
    """``act``'s rows of each rank (rank cast to int32), keyed by rank, in their order: zero-copy
    slices where ``act`` is sorted by rank without nulls (the activity), else filtered. A slice of
    the activity's rows of one rank holds its own chunks (one per group of ranks), so the caller
    that holds no other reference lets go of a rank's rows by dropping its entry."""
    act = act.select(_segment_columns(act)).with_columns(pl.col("rank").cast(pl.Int32))  # no copy
    r = act.get_column("rank")
    if act.height and not r.null_count() and r.is_sorted():
        ranks = r.unique().sort()
        at = [*r.search_sorted(ranks, "left").to_list(), act.height]
        return {k: act.slice(lo, hi - lo) for k, lo, hi in zip(ranks.to_list(), at, at[1:], strict=False)}
    return {k: act.filter(pl.col("rank").eq_missing(k)) for k in r.unique().to_list()}


def _segments(
    acts: dict[int | None, pl.DataFrame],
    schema: pl.Schema,
    wait: pl.DataFrame,
    xfer: pl.DataFrame,
    windows: pl.DataFrame,
    cpu_ranks: list[int],
) -> pl.DataFrame:
    """Pieces and gaps cut at the step windows (module doc, steps 2-5), with ``step``, sorted by
    rank and start_ns; ``acts``: the activity's rows of each rank (:func:`_rank_rows`; taken: each
    entry is dropped once its rank is done), ``schema``: the activity's.

    Every step works on one rank's rows alone, so the segments are built one rank at a time and
    put together in rank order: the temporaries (sorts, as-of joins, the pieces before the cut)
    hold one rank's rows, not the run's (on 8 ranks x 1 M events, ~330 k rows rather than 2.6 M),
    and a rank's activity is let go of once its segments are made (outside a report, where nothing
    else holds it: the activity and the segments are not held whole at once).
    The segments of a rank are disjoint, so (rank, start_ns) orders them completely: the frame
    is the one the whole run's ``cut(...).sort("rank", "start_ns")`` gives.
    """
    empty = pl.DataFrame(schema=schema).select(_segment_columns(pl.DataFrame(schema=schema)))
    empty = empty.with_columns(pl.col("rank").cast(pl.Int32))
    ranks = pl.concat(
        [pl.DataFrame({"rank": list(acts)}, schema={"rank": pl.Int32})]
        + [f.select(pl.col("rank").cast(pl.Int32)) for f in (wait, xfer, windows)]
    )
    parts = []
    for r in ranks["rank"].unique().sort(nulls_last=False).to_list():

        def mine(df: pl.DataFrame, r: int | None = r) -> pl.DataFrame:
            return df.filter(pl.col("rank").eq_missing(r))

        a, w, x, win = acts.pop(r, empty), mine(wait), mine(xfer), mine(windows)
        pieces = _pieces(a, w, x)
        gaps = _gaps(pieces, win, _launches(a, w, cpu_ranks))
        del a  # this rank's activity: let go of before the next rank's
        parts.append(intervals.cut(pl.concat([pieces, gaps]), win, "rank", ["step"]).sort("start_ns"))
    if not parts:  # nothing at all: the whole run's (empty) frame
        pieces = _pieces(empty, wait, xfer)
        gaps = _gaps(pieces, windows, _launches(empty, wait, cpu_ranks))
        return intervals.cut(pl.concat([pieces, gaps]), windows, "rank", ["step"]).sort("rank", "start_ns")
    return intervals.concat_taking(parts)  # the ranks' parts let go of column by column


# -- 5. account ------------------------------------------------------------------------------------


def _account(segs: pl.DataFrame, windows: pl.DataFrame) -> pl.DataFrame:
    """Per (rank, step): step_ns and one <category>_ns column each (module doc, step 5)."""
    dur = pl.col("end_ns") - pl.col("start_ns")
    sums = segs.group_by("rank", "step").agg(
        *(dur.filter(pl.col("cat") == i).sum().alias(f"{c}_ns") for i, c in enumerate(CATEGORIES))
    )
    out = (
        windows.join(sums, on=["rank", "step"], how="left", nulls_equal=True)
        .select(
            "rank",
            "step",
            (pl.col("end_ns") - pl.col("start_ns")).alias("step_ns"),
            *(pl.col(f"{c}_ns").fill_null(0).cast(pl.Int64) for c in CATEGORIES),
        )
        .sort("rank", "step")
    )
    bad = out.filter(pl.sum_horizontal(*(pl.col(f"{c}_ns") for c in CATEGORIES)) != pl.col("step_ns"))
    if bad.height:  # the pieces tile each window by construction: a mismatch is a bug
        raise RuntimeError(
            f"critical_path: categories do not add up to the step in {bad.height} rows: {bad.head(3)}"
        )
    return out


def _families(segs: pl.DataFrame) -> pl.DataFrame:
    """Compute time per (rank, step, op family)."""
    dur = (pl.col("end_ns") - pl.col("start_ns")).alias("compute_ns")
    # summed per name first (a few hundred per rank and step), then per family: integer sums, exact
    comp = (
        segs.lazy()
        .filter(pl.col("cat") == _COMPUTE)
        .group_by("rank", "step", "name")
        .agg(dur.sum())
        .collect()
    )
    names = comp["name"].unique().drop_nulls()
    fam = pl.DataFrame(
        {"name": names, "family": [family(n) for n in names.to_list()]},
        schema={"name": pl.Utf8, "family": pl.Utf8},
    )
    return (
        comp.join(fam, on="name", how="left")
        .group_by("rank", "step", "family")
        .agg(pl.col("compute_ns").sum())
        .sort(
            ["rank", "step", "compute_ns", "family"], descending=[False, False, True, False], nulls_last=True
        )
    )


def _ranks(frame: pl.DataFrame) -> pl.DataFrame:
    cols = ["step_ns", *(f"{c}_ns" for c in CATEGORIES)]
    out = frame.group_by("rank").agg(pl.len().cast(pl.Int64).alias("steps"), *(pl.col(c).sum() for c in cols))
    return out.with_columns(
        (pl.when(pl.col("step_ns") > 0).then(100.0 * pl.col(f"{c}_ns") / pl.col("step_ns"))).alias(f"{c}_pct")
        for c in CATEGORIES
    ).sort("rank")


# -- 6. path ---------------------------------------------------------------------------------------


def _job_steps(windows: pl.DataFrame, sets: dict[int, int] | None = None) -> pl.DataFrame:
    """The job's steps: step, start_ns, end_ns (the latest end over ranks, non-decreasing; start:
    the previous step's end, the first: the earliest window start), end_rank. ``sets``: each rank's
    clock set when the run's clocks form sets that could not be aligned to each other
    (``traceprof.engine.arrivals.clock_sets``): then each set's steps are taken so on its own clock
    and the job's step k is the set's whose step k is longest (ties: the lowest set), since the
    time between the sets is not measured."""
    w = windows.filter(pl.col("end_ns") > pl.col("start_ns"))
    clock = (
        pl.lit(0, pl.Int64) if sets is None else pl.col("rank").replace_strict(sets, return_dtype=pl.Int64)
    )
    g = (
        w.with_columns(clock.alias("_set"))
        .group_by("_set", "step")
        .agg(
            pl.col("start_ns").min().alias("_lo"),
            pl.col("end_ns").max().alias("end_ns"),
            pl.col("rank").sort_by("end_ns", "rank", descending=[True, False]).first().alias("end_rank"),
        )
    )
    g = g.sort("_set", "step", nulls_last=True).with_columns(pl.col("end_ns").cum_max().over("_set"))
    g = g.with_columns(pl.coalesce(pl.col("end_ns").shift(1).over("_set"), "_lo").alias("start_ns"))
    if sets is not None:
        g = g.sort(
            "step",
            pl.col("end_ns") - pl.col("start_ns"),
            "_set",
            descending=[False, True, False],
            nulls_last=True,
        ).unique("step", keep="first", maintain_order=True)
    return g.select("step", "start_ns", "end_ns", pl.col("end_rank").cast(pl.Int32))


def _rank_start_sorted(df: pl.DataFrame) -> bool:
    """Whether ``df`` is sorted by rank (no nulls) and start_ns (one pass, no copy; its
    temporaries a chunk of rows at a time)."""
    if df["rank"].null_count():
        return False
    r, t = df["rank"].to_numpy(), df["start_ns"].to_numpy()
    step = 1 << 20
    for a in range(0, max(len(r) - 1, 0), step):
        rr, tt = r[a : a + step + 1].astype(np.int64), t[a : a + step + 1]
        dr = np.diff(rr)
        if not ((dr > 0) | ((dr == 0) & (np.diff(tt) >= 0))).all():
            return False
    return True


class _AtRows:
    """Values of an array at some of its rows (``rows``, ascending), read by row index as the
    array would be: ``x[j]`` for a row ``j`` among them."""

    def __init__(self, rows: np.ndarray, values: np.ndarray) -> None:
        self.rows, self.values = rows, values

    def __getitem__(self, j: int) -> int:
        return int(self.values[int(np.searchsorted(self.rows, j))])


class _Walk:
    """The segments of every rank as arrays, and the backward walk over them (module doc, step 6)."""

    def __init__(self, segs: pl.DataFrame) -> None:
        s = segs if _rank_start_sorted(segs) else segs.sort("rank", "start_ns")  # run's: sorted, kept
        self.segs = s.select("cat", "name", "start_ns", "end_ns")  # no copy: what the path rows take
        self.rank = s["rank"].to_numpy()
        self.start = s["start_ns"].to_numpy()
        self.end = s["end_ns"].to_numpy()
        cross = pl.col("cross").fill_null(-1)
        trig = (
            (cross >= 0)
            & cross.ne_missing(pl.col("rank"))
            & (
                ((pl.col("cat") == _TRANSFER) & pl.col("instance_id").is_not_null())
                | ((pl.col("cat") == _WAIT) & (pl.col("end_ns") == pl.col("last_ns").fill_null(-1)))
            )
        )
        self.trig = s.select(trig).to_series().to_numpy()
        # where the path jumps from a trigger (read at triggers only: kept for those rows alone)
        at = np.flatnonzero(self.trig)
        self.jump_t = _AtRows(at, s["last_ns"].gather(at).fill_null(-1).to_numpy())
        self.jump_rank = _AtRows(at, s["cross"].gather(at).fill_null(-1).to_numpy())
        # the latest trigger at or before each segment (-1: none), in int32 while the rows fit it
        ix = np.int32 if len(s) < np.iinfo(np.int32).max else np.int64
        prev = np.where(self.trig, np.arange(len(s), dtype=ix), ix(-1))
        self.prev_trig = np.maximum.accumulate(prev, out=prev) if len(s) else prev
        # each rank's first segment: the rows are sorted by rank
        first = np.flatnonzero(self.rank[1:] != self.rank[:-1]) + 1 if len(s) else np.zeros(0, np.int64)
        first = np.concatenate([[0], first]) if len(s) else first
        ranks = self.rank[first]
        bounds = np.append(first, len(s))
        self.bounds = {int(r): (int(bounds[i]), int(bounds[i + 1])) for i, r in enumerate(ranks)}

    def _at(self, r: int, t: int) -> int:
        """Index of the segment of rank ``r`` that holds the instant just before ``t`` (the last one
        starting before t), or lo - 1 when there is none."""
        lo, hi = self.bounds[r]
        return lo + int(np.searchsorted(self.start[lo:hi], t, side="left")) - 1

    def walk(self, r: int, t: int, stop: int) -> list[tuple[int, int, int, int, int, int]]:
        """Stretches (rank, i0, i1, lo_ns, hi_ns, waiting_rank) of the path from ``t`` back to
        ``stop`` starting on rank ``r``, latest first: segments i0..i1 clipped to [lo_ns, hi_ns);
        i0 = -1 marks a piece outside the rank's segments; waiting_rank: the rank the path went
        on with after this stretch (-1: none)."""
        out: list[tuple[int, int, int, int, int, int]] = []
        came_from, seen_t = -1, None
        seen: set[int] = set()
        while t > stop:
            if r not in self.bounds:
                out.append((r, -1, -1, stop, t, came_from))
                break
            lo, hi = self.bounds[r]
            i = self._at(r, t)
            if i < lo:
                out.append((r, -1, -1, stop, t, came_from))
                break
            if self.end[i] < t:  # t lies past the rank's last window
                out.append((r, -1, -1, max(int(self.end[i]), stop), t, came_from))
                came_from, t = -1, int(self.end[i])
                continue
            if seen_t != t:
                seen_t, seen = t, set()
            seen.add(r)
            j = int(self.prev_trig[i])
            # not taken: a wait that lasts past t (the rank went on working meanwhile: its later
            # arrival is its own doing), or a jump with no progress to a rank already left at t
            while j >= lo and (
                self.jump_t[j] > t or (self.jump_t[j] == t and int(self.jump_rank[j]) in seen)
            ):
                j = int(self.prev_trig[j - 1]) if j - 1 >= lo else -1
            if j < lo or self.end[j] <= stop:
                i0 = self._at(r, stop + 1)
                if i0 < lo:  # the stretch runs past the rank's first segment
                    out.append((r, lo, i, int(self.start[lo]), t, came_from))
                    out.append((r, -1, -1, stop, int(self.start[lo]), -1))
                else:
                    out.append((r, i0, i, stop, t, came_from))
                break
            jt = int(self.jump_t[j])
            if jt < t:
                i0 = self._at(r, max(jt, stop) + 1)
                out.append((r, max(i0, lo), i, max(jt, stop), t, came_from))
            if jt <= stop:
                break
            came_from, r, t = r, int(self.jump_rank[j]), jt
        return out

    def path(self, jobs: pl.DataFrame) -> pl.DataFrame:
        """The path of every job step (columns of ``Result.path`` plus cat)."""
        steps, starts = jobs["step"].to_list(), jobs["start_ns"].to_numpy()
        ends, end_ranks = jobs["end_ns"].to_numpy(), jobs["end_rank"].to_numpy()
        rows: list[
            tuple[int | None, int, int, int, int, int, int]
        ] = []  # step, rank, i0, i1, lo, hi, waiting
        simple = np.zeros(len(steps), bool)
        # steps whose path stays on the rank that ended them: taken together, no Python loop per step
        for r in np.unique(end_ranks):
            sel = np.nonzero(end_ranks == r)[0]
            if int(r) not in self.bounds:
                continue
            lo, hi = self.bounds[int(r)]
            i = lo + np.searchsorted(self.start[lo:hi], ends[sel], side="left") - 1
            i0 = lo + np.searchsorted(self.start[lo:hi], starts[sel] + 1, side="left") - 1
            ic = np.clip(i, lo, hi - 1)
            j = self.prev_trig[ic]
            ok = (
                (i >= lo)
                & (i0 >= lo)
                & (self.end[ic] >= ends[sel])
                & ((j < lo) | (self.end[np.maximum(j, 0)] <= starts[sel]))
            )
            simple[sel[ok]] = True
            for k, a, b in zip(sel[ok].tolist(), i0[ok].tolist(), i[ok].tolist(), strict=True):
                rows.append((steps[k], int(r), a, b, int(starts[k]), int(ends[k]), -1))
        for k in np.nonzero(~simple)[0].tolist():
            for r, a, b, lo_t, hi_t, waiting in reversed(
                self.walk(int(end_ranks[k]), int(ends[k]), int(starts[k]))
            ):
                rows.append((steps[k], r, a, b, lo_t, hi_t, waiting))
        return self._rows(rows)

    def _rows(self, rows: list[tuple[int | None, int, int, int, int, int, int]]) -> pl.DataFrame:
        """Path rows from stretches (step, rank, i0, i1, lo_ns, hi_ns, waiting_rank): the
        segments of each stretch clipped to [lo_ns, hi_ns), waiting_rank on its last one."""
        schema = {
            "step": pl.Int32,
            "rank": pl.Int32,
            "i0": pl.Int64,
            "i1": pl.Int64,
            "lo": pl.Int64,
            "hi": pl.Int64,
            "waiting_rank": pl.Int32,
        }
        st = pl.DataFrame(rows, schema=schema, orient="row")
        real = st.filter(pl.col("i0") >= 0)
        n = (real["i1"] - real["i0"] + 1).to_numpy()
        of = np.repeat(np.arange(real.height), n)  # the stretch of each path segment
        idx = real["i0"].to_numpy()[of] + np.arange(len(of)) - np.concatenate([[0], np.cumsum(n)[:-1]])[of]
        last = np.append(of[1:] != of[:-1], True) if len(of) else np.zeros(0, bool)
        body = pl.concat(
            [
                real[of].select("step", "rank", "lo", "hi", "waiting_rank"),
                self.segs[idx].select("cat", "name", "start_ns", "end_ns"),
            ],
            how="horizontal",
        )
        body = body.with_columns(
            pl.max_horizontal("start_ns", "lo").alias("start_ns"),
            pl.min_horizontal("end_ns", "hi").alias("end_ns"),
            pl.when(pl.Series(last) & (pl.col("waiting_rank") >= 0))
            .then(pl.col("waiting_rank"))
            .alias("waiting_rank"),
        )
        outside = st.filter(pl.col("i0") < 0).select(
            "step",
            "rank",
            "lo",
            "hi",
            pl.when(pl.col("waiting_rank") >= 0).then(pl.col("waiting_rank")).alias("waiting_rank"),
            pl.lit(_IDLE, pl.Int8).alias("cat"),
            pl.lit(_OUTSIDE).alias("name"),
            pl.col("lo").alias("start_ns"),
            pl.col("hi").alias("end_ns"),
        )
        full = pl.concat([body, outside.cast(body.schema)]).filter(pl.col("end_ns") > pl.col("start_ns"))
        full = full.sort("step", "start_ns", nulls_last=True).with_columns(
            pl.int_range(pl.len()).over("step").alias("seq")
        )
        return full.select(
            "step",
            pl.col("seq").cast(pl.Int64),
            "rank",
            _kind(pl.col("cat")),
            "name",
            "start_ns",
            (pl.col("end_ns") - pl.col("start_ns")).alias("duration_ns"),
            "waiting_rank",
        )


def _kind(cat: pl.Expr) -> pl.Expr:
    """Category codes as names (column ``kind``)."""
    return (
        cat.cast(pl.Int64)
        .replace_strict(list(range(len(CATEGORIES))), list(CATEGORIES), return_dtype=pl.Utf8)
        .alias("kind")
    )


# -- 7. blame --------------------------------------------------------------------------------------


def _blame(segs: pl.DataFrame, total_ns: int) -> pl.DataFrame:
    """What the ranks that others waited for were doing meanwhile (module doc, step 7)."""
    dur = pl.col("end_ns") - pl.col("start_ns")
    waits = segs.filter(pl.col("cat") == _WAIT).select("rank", "start_ns", "end_ns", "peer")
    ties = waits.filter(pl.col("peer").is_null()).select(
        "peer",
        pl.lit(None, pl.Int8).alias("cat"),
        pl.lit("(a tie: several ranks arrived last together)").alias("name"),
        dur.alias("waited_ns"),
    )
    runs = segs.select(
        pl.col("rank").alias("peer"), "start_ns", "end_ns", "cat", "name", pl.col("peer").alias("_next")
    )
    level = waits.filter(pl.col("peer").is_not_null()).select("peer", "start_ns", "end_ns")
    parts = [ties]
    for _ in range(len(segs["rank"].unique()) + 1):  # a chain of waits visits each rank at most once
        if level.is_empty():
            break
        level = level.with_row_index("_l")
        inside = intervals.cut(level, runs, "peer", ["cat", "name", "_next"])
        covered = inside.group_by("_l").agg(dur.sum().alias("_in"))
        # a wait for a rank before its first profiled step (or after its last): nothing says what it did
        parts.append(
            level.join(covered, on="_l", how="left").select(
                "peer",
                pl.lit(_IDLE, pl.Int8).alias("cat"),
                pl.lit(_OUTSIDE).alias("name"),
                (dur - pl.col("_in").fill_null(0)).alias("waited_ns"),
            )
        )
        # the rank was itself waiting for another: the wait passes on to that one
        on = (pl.col("cat") == _WAIT) & pl.col("_next").is_not_null()
        parts.append(inside.filter(~on).select("peer", "cat", "name", dur.alias("waited_ns")))
        level = inside.filter(on).select(pl.col("_next").alias("peer"), "start_ns", "end_ns")
    parts.append(
        level.select(
            "peer", pl.lit(_WAIT, pl.Int8).alias("cat"), pl.lit("").alias("name"), dur.alias("waited_ns")
        )
    )
    rows = pl.concat(parts, how="vertical_relaxed").filter(pl.col("waited_ns") > 0)
    out = rows.group_by("peer", "cat", "name").agg(pl.col("waited_ns").sum())
    out = out.with_columns(pl.col("waited_ns").sum().over("peer").alias("rank_waited_ns"))

    def pct(c: str) -> pl.Expr:
        return 100.0 * pl.col(c) / total_ns if total_ns else pl.lit(None, pl.Float64)

    out = out.select(
        pl.col("peer").alias("rank"),
        pl.when(pl.col("cat").is_null()).then(pl.lit("tie")).otherwise(_kind(pl.col("cat"))).alias("kind"),
        "name",
        "waited_ns",
        pct("waited_ns").alias("pct"),
        "rank_waited_ns",
        pct("rank_waited_ns").alias("rank_pct"),
    )
    return out.sort(
        ["rank_waited_ns", "rank", "waited_ns", "kind", "name"],
        descending=[True, False, True, False, False],
        nulls_last=True,
    )


# -- run -------------------------------------------------------------------------------------------


def _credited(f: Finding) -> bool:
    """Whether ``f`` is a straggling group's finding (no single rank) that arrives with the exposed
    communication its analysis credited to it (``recoverable_ns``: ``parallelism``'s slow pipeline
    stage, the other stages' point-to-point waits for it)."""
    return f.topic == "stragglers" and f.rank is None and f.problem and f.recoverable_ns is not None


def _recoverable(inp: FindingsInput, findings: list[Finding]) -> list[Finding]:
    """The findings with ``recoverable_pct``: the time fixing each could recover by the step
    account, as % of all ranks' step time (the spec's ``refine`` hook): a named straggler, the
    others' exposed waits credited to it (blame); a slow pipeline stage whose analysis measured
    the other stages' point-to-point waits for it (``recoverable_ns`` already set: with no
    collective matched, the account counts them as transfer), that time; another straggling run
    with no single rank to blame, all exposed waits; communication, the exposed transfer time less
    the time credited to such a stage; idle, the host-bound and idle
    time of the ranks that are not named stragglers (a straggler's own is why it is late, counted
    in its finding); ``recoverable_ns`` the same time in ns. Other findings keep None."""
    cp = inp.results.get("critical_path")
    if cp is None:
        return findings
    frame, blame = cp.frame, cp.frames()["blame"]
    total = int(frame["step_ns"].sum()) if "step_ns" in frame.columns else 0
    if not total:
        return findings
    named = named_ranks(inp.results)
    others = frame.filter(~pl.col("rank").is_in(named))
    transfer = float(frame["transfer_ns"].sum())

    def waited(f: Finding) -> float:
        """The account's waits credited to ``f``'s ranks (blame): a slow stage's point-to-point
        peers waiting for it, paired by ``traceprof.engine.arrivals.p2p_items``."""
        return float(blame.filter(pl.col("rank").is_in(list(f.ranks)))["waited_ns"].sum())

    # time its own analysis credited to a straggling group (a slow pipeline stage: the other stages'
    # exposed point-to-point time waiting for it) whose waits the account does not hold (its
    # point-to-point ops unpaired): the account counts that time as transfer, so it is the
    # group's, and communication's is what lies beyond it
    credited = min(
        transfer,
        float(sum(f.recoverable_ns or 0 for f in findings if _credited(f) and not waited(f))),
    )
    beyond = (
        f" (less {credited / 1e6:.1f} ms of point-to-point waits for the slow stage, its finding's)"
        if credited
        else ""
    )
    multi = cp.note("multi_device")
    wall = (  # the wall clock of a multi-GPU rank (module doc)
        f" (rank(s) {', '.join(map(str, multi.ranks))} drive several GPUs: on their wall clock one device's "
        "communication while another device computes counts as compute; per device it is exposed: gaps)"
        if multi is not None and multi.ranks
        else ""
    )
    ns: dict[str, tuple[float, str]] = {
        "communication": (transfer - credited, "exposed transfer" + beyond),
        "idle": (
            float((others["host_bound_ns"] + others["idle_ns"]).sum()),
            "host-bound and idle time" + (" of the other ranks" if named else ""),
        ),
    }
    # without steps the account's one window per rank is its first to last activity: no step time
    account, of = (
        ("time account (no steps)", "all ranks' windows (first to last activity)")
        if frame["step"].is_null().all()
        else ("step account", "all ranks' step time")
    )
    out = []
    for f in findings:
        x = ns.get(f.topic)
        if f.topic == "stragglers" and f.rank is not None:
            x = (float(blame.filter(pl.col("rank") == f.rank)["waited_ns"].sum()), "the others' waits for it")
        elif _credited(f):
            x = (waited(f) or float(f.recoverable_ns or 0), "the other stages' point-to-point waits for it")
        elif f.topic == "stragglers" and f.problem:
            x = (float(frame["wait_ns"].sum()), "all waits at collectives")
        if x is None:
            out.append(f)
            continue
        pct = 100.0 * x[0] / total
        said = f"; {account}: {x[1]} {pct:.1f}% of {of}" + (wall if f.topic == "communication" else "")
        out.append(
            dataclasses.replace(
                f,
                recoverable_pct=pct,
                recoverable_ns=int(x[0]),
                text=f.text + said,
                full=f.full + said if f.full else "",
            )
        )
    return out


def waterfall(result: FrameResult) -> tuple[pl.DataFrame, Chart] | str:
    """The report's lead chart (``Lead``): a stacked bar per rank of its mean step by category
    (table ``ranks``), titled with the shares over all ranks; or why there is none."""
    ranks = result.frames()["ranks"]
    if ranks.is_empty():
        return "no steps"
    per_step = ranks.select(
        "rank", *((pl.col(f"{c}_ns") / pl.col("steps")).alias(f"{c}_ns") for c in CATEGORIES)
    )
    total = ranks.select([pl.col(f"{c}_ns").sum() for c in CATEGORIES]).row(0)
    whole = sum(total) or 1
    shares = ", ".join(
        f"{c.replace('_', '-')} {100 * v / whole:.0f}%" for c, v in zip(CATEGORIES, total, strict=True)
    )
    return per_step, Chart(
        f"Where each rank's mean step went (all ranks: {shares})",
        "rank",
        tuple(f"{c}_ns" for c in CATEGORIES),
        stacked=True,
    )


_CATEGORY_DOCS = {
    "compute": "compute work runs",
    "transfer": "communication runs after the last rank arrived",
    "memory": "memory copies and sets run",
    "wait": "waiting at a collective for its last rank",
    "host_bound": "waiting for the host to launch the next work",
    "idle": "nothing runs, no cause found",
}
_CATEGORIES_NS = tuple(rc.ns(f"{c}_ns", f"Time {d}") for c, d in _CATEGORY_DOCS.items())

SPEC = Analysis(
    name="critical_path",
    params=Params,
    result=Result,
    frames=(
        rc.frame(
            "frame",
            "The step account per (rank, step): the categories add up to step_ns exactly",
            rc.RANK,
            rc.STEP,
            rc.ns("step_ns", "The rank's step window"),
            *_CATEGORIES_NS,
            worst="step_ns",
        ),
        rc.frame(
            "ranks",
            "The account summed over each rank's steps",
            rc.RANK,
            rc.count("steps", "Steps"),
            rc.ns("step_ns", "Its steps' time"),
            *_CATEGORIES_NS,
            *(rc.pct(f"{c}_pct", f"{c}_ns, % of step_ns") for c in CATEGORIES),
        ),
        rc.frame(
            "path",
            "The critical path of each job step: pieces that tile it",
            rc.STEP,
            rc.count("seq", "Order of the piece in the step"),
            rc.RANK,
            rc.text("kind", "Category of the piece"),
            rc.text("name", "Op, kernel or collective (a gap: the work that ended it)"),
            rc.ns("start_ns", "Start"),
            rc.ns("duration_ns", "Length (a step's add up to its step_ns)"),
            rc.Column(
                "waiting_rank",
                "INTEGER",
                "Where the path crosses ranks: the rank that had waited for this one; null elsewhere",
            ),
        ),
        rc.frame(
            "blame",
            "What the ranks the others waited for were doing meanwhile, ranked",
            rc.Column(
                "rank", "INTEGER", "The last rank the others waited for (null: a tie, credited to nobody)"
            ),
            rc.text("kind", "What it was doing: category"),
            rc.text("name", "Its op, kernel or collective"),
            rc.ns("waited_ns", "The other ranks' exposed waits over that time"),
            rc.pct("pct", "waited_ns, % of all ranks' step time"),
            rc.ns("rank_waited_ns", "The rank's total"),
            rc.pct("rank_pct", "rank_waited_ns, % of all ranks' step time"),
        ),
        rc.frame(
            "compute",
            "Compute per (rank, step, op family)",
            rc.RANK,
            rc.STEP,
            rc.text("family", "Op family (traceprof.core.names.family)"),
            rc.ns("compute_ns", "Its compute time (the families add up to the frame's compute_ns)"),
            worst="compute_ns",
        ),
        rc.frame(
            "steps",
            "The job's steps",
            rc.STEP,
            rc.ns("start_ns", "Start: the end of the job's previous step"),
            rc.ns("step_ns", "The job's step"),
            rc.Column("end_rank", "INTEGER", "The rank that ended it last"),
            rc.count("crossings", "Rank changes on its path"),
            worst="step_ns",
        ),
    ),
    report=Report(
        105,
        "GPU kernels, CPU training-thread ops or op-level ranges (Kineto, Nsight or NDTimeline traces)",
        lead=Lead("waterfall", "step account", waterfall),
        timeline_path="path",
    ),
    refine=_recoverable,
)


@register(SPEC)
def run(store: Store, params: Params) -> Result:
    """The step account, its path across ranks and the blame for waits, of one run (module doc).

    Source fields read: ``events`` through ``traceprof.engine.activity`` (kernels, memcpy/memset with their
    launching runtime call's start; CPU ranks: training-thread ops and ``gloo:*`` work; NDTimeline:
    ``gpu_user_annotation`` and ``collective`` events), ``steps``, ``collectives`` and
    ``collective_instances`` (arrivals, ends).

    Raises:
        StoreError: No such run.
        UsageError: An unknown collectives ``source``.
        AnalysisError: The run has no activity to account for (no GPU kernels, no CPU
            training-thread ops, no op-level ranges): e.g. Flight Recorder dumps alone.
    """
    run_id = store.resolve_run(params.run)
    label = run_label(store, run_id)
    notes: list[str] = []
    # outside a report only the columns read are fetched (a report's one frame has them all)
    act = activity(store, run_id, detail=True, columns=None if reusing(store) else _ACT_COLUMNS)
    # outside a report nothing else reads these columns: held here alone (the cast below copies rank)
    release_activity(store, run_id, detail=True, columns=_ACT_COLUMNS)
    cpu_ranks: list[int] = []
    op_level = act.is_empty()
    if op_level:
        act = op_activity(store, run_id)
        if act.is_empty():
            raise AnalysisError(
                f"{label}: no GPU kernels, no CPU training-thread ops and no op-level ranges "
                "(NDTimeline): nothing to account for (Flight Recorder dumps record collectives only)"
            )
        notes.append(
            "op-level trace (NDTimeline): compute = its compute ranges, communication = its collectives; "
            "no launches are recorded, so gaps between ops are idle, never host-bound"
        )
    else:
        # the two columns taken first: grouping the whole frame kept ~220 MiB more resident (8 x 1 M)
        kinds = (
            act.lazy()
            .select("rank", (pl.col("device_kind") == "cpu").alias("cpu"))
            .group_by("rank")
            .agg(pl.col("cpu").all())
            .collect()
        )
        cpu_ranks = sorted(kinds.filter("cpu")["rank"].to_list())
    act = act.with_columns(pl.col("rank").cast(pl.Int32))
    # the profiler-start transient's steps are left out (their activity is, by traceprof.engine.activity)
    windows = _windows(store, run_id, act).filter(
        ~pl.col("step").is_in(list(run_transient(store, run_id).steps)).fill_null(False)
    )
    wait, xfer, source, n_inst, n_p2p = _collective_parts(store, run_id, params.source or None)
    multi = multi_device_ranks(act) if "device" in act.columns else []
    # a multi-GPU rank's exposed communication per device, for the note (module doc)
    dev_exposed: dict[int, int] = {}
    if multi:
        cols = ("rank", "device", "class", "start_ns", "end_ns")
        mine = act.lazy().filter(pl.col("rank").is_in(multi)).select(cols).collect()
        dev_exposed = dict.fromkeys(multi, 0) | dict(
            exposed_comm(mine, ["rank", "device"])
            .group_by("rank")
            .agg((pl.col("end_ns") - pl.col("start_ns")).sum())
            .iter_rows()
        )
    # the segments read six columns of each rank's rows: outside a report (nothing else holds the
    # frame) the other columns are let go of before them, and each rank's rows once its segments
    # are made
    acts, schema = _rank_rows(act), act.schema
    del act  # the rest reads the segments
    segs = _segments(acts, schema, wait, xfer, windows, cpu_ranks)
    frame = _account(segs, windows)
    total = int(frame["step_ns"].sum())
    jobs = _job_steps(windows, clock_sets(store, run_id))
    path = _Walk(segs).path(jobs)
    crossings = path.group_by("step").agg(
        (pl.col("rank") != pl.col("rank").shift(1)).sum().alias("crossings")
    )
    steps = (
        jobs.join(crossings, on="step", how="left", nulls_equal=True)
        .select(
            "step",
            "start_ns",
            (pl.col("end_ns") - pl.col("start_ns")).alias("step_ns"),
            "end_rank",
            pl.col("crossings").fill_null(0).cast(pl.Int64),
        )
        .sort("step", nulls_last=True)
    )
    blame = _blame(segs, total)
    notes += _notes(frame, segs, source, (n_inst, n_p2p), cpu_ranks, dev_exposed, op_level)
    notes += missing_step_notes(windows)
    notes += graph_level_notes(store, run_id)
    notes += [n for n in (excluded_note(store, run_id), unaligned_note(store, run_id)) if n]
    return Result(
        frame=frame,
        ranks=_ranks(frame),
        path=path,
        blame=blame,
        compute=_families(segs),
        steps=steps,
        notes=tuple(notes),
    )


def _notes(
    frame: pl.DataFrame,
    segs: pl.DataFrame,
    source: str | None,
    counts: tuple[int, int],
    cpu_ranks: list[int],
    dev_exposed: dict[int, int],
    op_level: bool = False,
) -> list[str]:
    own, first = (
        ("its ops", "its first op's start (NDTimeline records no ProfilerStep)")
        if op_level
        else ("device rows launched in it; CPU ranks: its ProfilerStep", "its ProfilerStep start")
    )
    notes = [
        "step windows tile each rank's time: a step runs from the end of the previous step's work to the end "
        f"of its own ({own}), the first from {first}; categories add up to step_ns exactly, by precedence "
        "compute > transfer > memory > wait > host_bound > idle"
    ]
    n_inst, n_p2p = counts
    if n_inst:
        notes.append(
            f"waits and transfers from source {source}: {n_inst:,} collectives seen by two or more ranks; a "
            "wait runs from the rank's arrival to the last arrival and is credited to the last rank (blame)"
        )
    if n_p2p:
        notes.append(
            f"{n_p2p:,} point-to-point transfers (send / recv without a sequence number) paired across their "
            "two ranks by order per (sender, receiver) and step: a send or recv waits from its arrival to its "
            "peer's, credited to the peer (blame)"
        )
    if not n_inst and not n_p2p:
        notes.append(
            "no collective matched across two or more ranks: communication counts as transfer, no waits"
        )
    loose = segs.filter((pl.col("cat") == _TRANSFER) & pl.col("instance_id").is_null())
    if (n_inst or n_p2p) and loose.height:
        ns = int((loose["end_ns"] - loose["start_ns"]).sum())
        notes.append(
            f"{ns / 1e6:,.3f} ms of transfer is communication that matched no collective across ranks "
            "(its waits, if any, are unknown)"
        )
    if cpu_ranks:
        notes.append(
            "CPU-only ranks (gloo): compute = the training thread's top-level ops, communication = gloo "
            "work, arrival = the c10d enqueue; the gaps between the training thread's ops are host_bound "
            "(untraced host time: Python, data loading, sleeps)"
        )
    if dev_exposed:
        figures = ", ".join(f"rank {r} {ns / 1e3:,.0f} us" for r, ns in sorted(dev_exposed.items()))
        notes.append(
            Note(
                "rank(s) {ranks} drive several GPUs: their account is the rank's wall clock (an instant counts "
                "once, by precedence over all its devices: one device's communication while another device "
                f"computes is compute here); per device their exposed communication is {figures} (gaps, "
                "overlap's devices table)",
                ranks=sorted(dev_exposed),
                kind="multi_device",
            )
        )
    return notes
