"""Why a rank arrives late, and whether that is beyond the run's noise (for ``stragglers``).

Not an analysis. A rank that arrives last significantly often (``stragglers``' binomial test) is
a *suspect*; it is named only when the trace shows a cause of its own that the other ranks do not
share (issue 27: "slower than ideal" from op-time spread is the run's variability, not a straggler):

  1. Components: each rank's time between its previous arrival (or its step start) and each
     arrival splits into compute, communication not hidden by compute, and the rest (untraced
     host time: Python, data loading, sleeps) (``stragglers._split_windows``); summed per rank and
     step (:func:`per_unit`). A run without steps (Flight Recorder only: no compute to split) is
     compared per collective on its arrival lateness instead (``stragglers``).
  2. Cause: over the instances where the suspect arrived last, the component it spent most above
     the other ranks' median (:func:`excess_at_last`).
  3. Noise floor (:func:`floor_test`): in each step, the same component on the ranks *not*
     suspected; its largest value is the floor. Under no straggler the suspect is the largest of
     the ``u + 1`` ranks with chance ``1 / (u + 1)`` per step, so the number of steps it exceeds
     the floor is binomial: the cause is its own when that p-value is below ``cause_alpha``
     (0.05). With 4 ranks and 3 steps this needs all 3 steps (p = 1/64); its excess over the
     floor (median over steps) is reported as % of the median step. With too few steps the test
     cannot reach ``cause_alpha`` even when the suspect wins every step (2 ranks, 4 steps: the
     smallest p is 0.5^4 = 0.06): it has no power, so ``stragglers`` calls that inconclusive, not
     noise (:func:`smallest_p`, :func:`trials_needed`).
  4. Extra work (:func:`extra_work`), certain where the trace records shapes: the suspect's model
     FLOPs per step (``traceprof.engine.flops.shape_flops``: leaf matmul/conv/attention ops), or without
     shapes its calls of those ops, above every unsuspected rank's: it runs more work than the
     others, whatever the timing noise. When every rank runs the same work, no rank is a compute
     straggler from the work itself (it must pass step 3).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import polars as pl

from traceprof.engine.flops import shape_flops
from traceprof.storage.store import Store

__all__ = [
    "CAUSES",
    "binom_sf",
    "smallest_p",
    "trials_needed",
    "cause_of",
    "per_unit",
    "excess_at_last",
    "FloorTest",
    "floor_test",
    "ExtraWork",
    "work_ops",
    "extra_work",
]

#: Component column -> the cause's name in verdicts.
CAUSES = {"compute_ns": "compute", "comm_ns": "communication", "other_ns": "untraced host time"}


def per_unit(split: pl.DataFrame, w: pl.DataFrame) -> pl.DataFrame:
    """Each rank's components per step (module doc, step 1).

    Args:
        split: ``stragglers._split_windows`` rows: instance_id, rank, compute_ns, comm_ns, other_ns.
        w: The per-(instance, rank) frame of ``stragglers`` (instance_id, rank, step).

    Returns:
        Frame rank, unit (the step), and the three components summed (ns); instances outside the
        steps (a Flight Recorder dump also holds the unprofiled steps, with no compute traced) are
        left out.
    """
    if split.is_empty():
        return pl.DataFrame(schema={"rank": pl.Int32, "unit": pl.Int64, **{c: pl.Float64 for c in CAUSES}})
    j = split.join(w.select("instance_id", "rank", "step"), on=["instance_id", "rank"]).filter(
        pl.col("step").is_not_null()
    )
    return j.group_by("rank", pl.col("step").cast(pl.Int64).alias("unit")).agg(
        pl.col(c).sum() for c in CAUSES
    )


def excess_at_last(split: pl.DataFrame, w: pl.DataFrame, rank: int) -> dict[str, float]:
    """Module doc, step 2: per component, ``rank``'s time (ns) before the arrivals where it was last
    alone, minus the other ranks' median before those same instances, summed over them."""
    mine = w.filter(pl.col("last_rank") == rank).select("instance_id").unique()
    parts = split.join(mine, on="instance_id")
    own = parts.filter(pl.col("rank") == rank).drop("rank")
    if own.is_empty():
        return {c: 0.0 for c in CAUSES}
    others = (
        parts.filter(pl.col("rank") != rank).group_by("instance_id").agg(pl.col(c).median() for c in CAUSES)
    )
    ex = (
        own.join(others, on="instance_id", suffix="_o")
        .select((pl.col(c) - pl.col(f"{c}_o")).sum().alias(c) for c in CAUSES)
        .row(0, named=True)
    )
    return {c: float(ex[c] or 0.0) for c in CAUSES}


def binom_sf(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p): the chance of arriving last k or more times of n when
    each time has probability p. 1.0 for k <= 0."""
    if k <= 0:
        return 1.0
    if k > n or p <= 0.0:
        return 0.0
    if p >= 1.0:
        return 1.0
    lp, lq = math.log(p), math.log1p(-p)
    terms = (
        math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * lp + (n - i) * lq
        for i in range(k, n + 1)
    )
    return float(min(1.0, sum(math.exp(t) for t in terms)))


def smallest_p(n: int, p: float) -> float:
    """The smallest p-value :func:`binom_sf` can give over ``n`` trials of chance ``p``: all ``n``
    won, ``p ** n`` (1.0 for ``n = 0``). A one-sided test whose smallest p is not below its
    significance level cannot reject whatever the data: it has no power at that sample size."""
    return binom_sf(n, n, p)


def trials_needed(alpha: float, p: float) -> int:
    """The fewest trials ``n`` at which winning all of them is significant: ``p ** n < alpha``
    (2 ranks, chance 0.5, alpha 0.01: 7; 4 ranks, 0.25: 4); 0 where no number of trials is
    significant (``p >= 1``, or a level ``alpha <= 0``)."""
    if alpha <= 0.0 or p >= 1.0:
        return 0  # never significant; 0 says "no number of trials"
    if p <= 0.0:
        return 1
    n = max(1, math.floor(math.log(alpha) / math.log(p)))
    while smallest_p(n, p) >= alpha:
        n += 1
    return n


def cause_of(excess: dict[str, float]) -> tuple[str, str]:
    """(component column, cause name) of the largest positive excess; ("", "unknown") if none."""
    best = max(CAUSES, key=lambda c: excess[c])
    return (best, CAUSES[best]) if excess[best] > 0 else ("", "unknown")


@dataclass(frozen=True)
class FloorTest:
    """The noise-floor test of one suspect (module doc, step 3).

    Attributes:
        won: Steps where its time in the cause exceeded every unsuspected rank's.
        compared: Steps compared (those where some unsuspected rank has the component).
        p_value: Binomial P(won or more) with chance ``1 / (unsuspected + 1)`` per step.
        excess_ns: Median over the compared steps of its time minus the floor (ns; may be < 0).
    """

    won: int
    compared: int
    p_value: float
    excess_ns: float


def floor_test(units: pl.DataFrame, rank: int, unsuspected: list[int], col: str) -> FloorTest | None:
    """Module doc, step 3, for ``rank`` and component ``col`` against the ``unsuspected`` ranks;
    None when no unsuspected rank shares a step with it (nothing to compare with)."""
    if not unsuspected or not col:
        return None
    floor = (
        units.filter(pl.col("rank").is_in(unsuspected))
        .group_by("unit")
        .agg(pl.col(col).max().alias("_floor"), pl.len().alias("_u"))
    )
    mine = units.filter(pl.col("rank") == rank).select("unit", col).join(floor, on="unit")
    if mine.is_empty():
        return None
    won = int((mine[col] > mine["_floor"]).sum())
    chance = float((1.0 / (mine["_u"] + 1)).mean())  # type: ignore[arg-type]
    excess = float((mine[col] - mine["_floor"]).median())  # type: ignore[arg-type]
    return FloorTest(won, mine.height, binom_sf(won, mine.height, chance), excess)


@dataclass(frozen=True)
class ExtraWork:
    """Module doc, step 4: a suspect's work per step above every unsuspected rank's.

    Attributes:
        pct: Its FLOPs (or, without shapes, matmul-family calls) per step over the largest
            unsuspected rank's, in % (> 0: it runs more work).
        what: ``"FLOPs"`` or ``"calls"``.
        ops: The op names whose calls per step grew, with the extra calls, e.g. ``"+4 aten::mm"``.
    """

    pct: float
    what: str
    ops: str


def work_ops(store: Store, run_id: int) -> pl.DataFrame:
    """The run's matmul-family ops per rank, step and name (``traceprof.engine.flops.shape_flops``, inside
    steps): the input of :func:`extra_work`, read once for all suspects."""
    return shape_flops(store, run_id).filter(pl.col("step").is_not_null())


def extra_work(ops: pl.DataFrame, rank: int, unsuspected: list[int]) -> ExtraWork | None:
    """Module doc, step 4, from :func:`work_ops`; None when the trace records no matmul-family ops
    or the rank's work per step (median over steps) does not exceed every unsuspected rank's."""
    if not unsuspected or ops.is_empty():
        return None
    use_flops = bool(ops["flops"].fill_null(0).sum() > 0)
    what, col = ("FLOPs", "flops") if use_flops else ("calls", "calls")
    per = (
        ops.group_by("rank", "step")
        .agg(pl.col(col).sum().cast(pl.Float64).alias("w"))
        .group_by("rank")
        .agg(pl.col("w").median())
    )
    mine = per.filter(pl.col("rank") == rank)["w"]
    theirs = per.filter(pl.col("rank").is_in(unsuspected))["w"]
    if mine.is_empty() or theirs.is_empty():
        return None
    top = float(theirs.max())  # type: ignore[arg-type]
    own = float(mine[0])
    if own <= top or top <= 0:
        return None
    calls = (
        ops.group_by("rank", "step", "name")
        .agg(pl.col("calls").sum())
        .group_by("rank", "name")
        .agg(pl.col("calls").median())
    )
    own_calls = calls.filter(pl.col("rank") == rank).select("name", pl.col("calls").alias("own"))
    max_calls = calls.filter(pl.col("rank").is_in(unsuspected)).group_by("name").agg(pl.col("calls").max())
    grew = (
        own_calls.join(max_calls, on="name", how="left")
        .with_columns((pl.col("own") - pl.col("calls").fill_null(0)).alias("d"))
        .filter(pl.col("d") > 0)
        .sort("d", "name", descending=[True, False])
    )
    text = ", ".join(f"+{d:g} {n}" for n, d in grew.select("name", "d").iter_rows())
    return ExtraWork(100.0 * (own - top) / top, what, text)
