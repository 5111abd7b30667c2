"""stragglers: which rank makes the others wait at collectives, by how much, and why.

Algorithm (DESIGN.md §4 "Stragglers"; needs matched collectives and aligned clocks, which ingest
provides):
  1. Instances of one collectives source (default: the best matched, ``matching.preferred_source``)
     seen by two or more ranks. Arrival of a rank: ``matching.ARRIVAL_SQL`` (CPU enqueue, or NCCL
     kernel start).
  2. Per instance: skew = last - first arrival; the last-arriving rank; each rank's wait = last
     arrival - its arrival; arrival offset = its arrival - the median arrival of the instance
     (with two ranks: - the other rank's arrival; negative = early) and lateness = max(offset, 0);
     transfer = its end - last arrival. A collective cannot end on any rank before its last rank
     arrived: an end before the last arrival means a wrong match or clock (a buffered send may
     also finish before its receiver arrives). Such rows are flagged
     (``end_before_last_arrival``), counted in a note, and their transfer is clipped to 0.
     When only some ranks of the job were traced, everything is among the traced ranks (a note
     says so): waits are lower bounds, transfers upper bounds.
  3. Per rank: share of its instances where it arrived last; wait it caused others (the sum of the
     other ranks' waits at the instances where it was last); median lateness, also as % of the
     run's pace (the median time between a rank's consecutive arrivals in a step: the spacing of
     collectives, a few ms for DDP buckets, a microbatch for pipeline sends) and of the median
     step; compute time per step (top-level compute intervals, ``analyses._replay``)
     against the median rank as a robust z-score: (x - median) / (1.4826 * MAD), the MAD floored
     at 1% of the median so that equal ranks give 0, not infinity.
  4. Verdict: a rank is named when it arrived last in at least ``min_share`` of its instances and
     its median lateness is at least ``min_late_pct`` of the pace (default 100%: it holds up its
     collectives by more than their spacing); below that, the skew is within the run's noise (on
     the CPU samples unslowed ranks reach 30%, slowed ones 200-350%). Why it was late: over the
     instances where it arrived last, the span since its previous arrival (or step start) is split into compute, communication not hidden
     by compute, and the rest (untraced host time: Python, data loading, sleeps); the part that
     exceeds the other ranks' median the most is the cause.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import polars as pl

from analyses import _common, _replay
from traceprof.analysis import Chart, FrameResult, RunParams, register
from traceprof.errors import AnalysisError
from traceprof.intervals import merge, union_ns
from traceprof.store import Store

_CAUSES = {"compute_ns": "compute", "comm_ns": "communication", "other_ns": "untraced host time"}


@dataclass(frozen=True)
class Params(RunParams):
    """``source``: collectives source (default: the best matched); ``min_share``: fraction of
    instances a rank must arrive last in to be named; ``min_late_pct``: its median lateness as %
    of the pace (median spacing of collectives) must reach this to be named."""

    source: str = ""
    min_share: float = 0.5
    min_late_pct: float = 100.0

    def __post_init__(self) -> None:
        _common.fraction("min_share", self.min_share)
        _common.at_least("min_late_pct", self.min_late_pct, 0)


@dataclass(frozen=True)
class Result(FrameResult):
    """Per rank (``frame``): rank, instances, last_count, last_arrival_share (0..1),
    median_lateness_ns (>= 0), late_pct (% of the pace), late_step_pct (% of the median step),
    wait_caused_ns, wait_ns (it waited for others), transfer_ns (median, >= 0), compute_ns (median
    per step), compute_z, named (bool). ``instances``: instance_id, step, op, pg, n_ranks,
    first_arrival_ns, last_arrival_ns, last_rank, transfer_ns (median over ranks),
    ends_before_last_arrival (ranks whose end precedes the last arrival), skew_ns. ``waits``:
    instance_id, step, rank, arrival_ns, wait_ns, arrival_offset_ns (signed: negative = early),
    lateness_ns (>= 0), transfer_ns (>= 0), end_before_last_arrival (bool: transfer clipped).
    ``heatmap``: step, rank, lateness_ms (mean). All ``_ns`` columns are int64 ns. ``verdict``:
    one row per named rank (or one with rank null): rank, named, cause, compute_excess_ns,
    comm_excess_ns, other_excess_ns, evidence."""

    instances: pl.DataFrame = field(default_factory=pl.DataFrame)
    waits: pl.DataFrame = field(default_factory=pl.DataFrame)
    heatmap: pl.DataFrame = field(default_factory=pl.DataFrame)
    verdict: pl.DataFrame = field(default_factory=pl.DataFrame)
    title = "Stragglers"

    def frames(self) -> dict[str, pl.DataFrame]:
        return {"frame": self.frame, "verdict": self.verdict, "instances": self.instances,
                "waits": self.waits, "heatmap": self.heatmap}

    def charts(self) -> list[Chart]:
        return [
            Chart("Share of collectives where the rank arrived last", "rank", ("last_arrival_share",),
                  ylabel="share"),
            Chart("Mean arrival lateness per step and rank (ms)", "step", ("rank",), kind="heatmap",
                  value="lateness_ms", frame="heatmap"),
        ]


def _pace_ns(w: pl.DataFrame) -> float:
    """Median time between a rank's consecutive arrivals within a step (ns, at least 1)."""
    gaps = w.sort("rank", "arrival_ns").select(pl.col("arrival_ns").diff().over("rank", "step")).drop_nulls()
    return max(float(gaps.to_series().median() or 1.0), 1.0)  # type: ignore[arg-type]


def _robust_z(x: pl.Expr) -> pl.Expr:
    med = x.median()
    mad = (x - med).abs().median()
    return (x - med) / (1.4826 * pl.max_horizontal(mad, med.abs() * 0.01, pl.lit(1.0)))


def _coverage(iv: pl.DataFrame, t: np.ndarray) -> np.ndarray:
    """Covered length of merged, sorted intervals ``iv`` (start_ns, end_ns) before each time t."""
    if iv.is_empty():
        return np.zeros(len(t))
    s, e = iv["start_ns"].to_numpy(), iv["end_ns"].to_numpy()
    before = np.concatenate([[0], np.cumsum(e - s)])
    i = np.searchsorted(s, t, side="right") - 1
    inside = np.where(i >= 0, np.minimum(t, e[np.maximum(i, 0)]) - s[np.maximum(i, 0)], 0)
    return np.where(i >= 0, before[np.maximum(i, 0)] + inside, 0).astype(np.float64)


def _split_windows(waits: pl.DataFrame, comp: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
    """Compute / communication / other time of each rank between its previous arrival (or step
    start) and each arrival (module doc, step 4)."""
    w = waits.sort("rank", "arrival_ns").with_columns(pl.col("arrival_ns").shift(1).over("rank", "step").alias("prev"))
    w = w.join(steps, on=["rank", "step"], how="left").with_columns(
        pl.coalesce("prev", "step_start_ns").alias("from_ns")).filter(pl.col("from_ns").is_not_null())
    out = []
    comp_m = merge(comp, ["rank"])
    busy_m = merge(pl.concat([comp.select("rank", "start_ns", "end_ns"),
                              waits.select("rank", "start_ns", "end_ns").drop_nulls()]), ["rank"])
    for (rank,), g in w.group_by("rank"):
        a, b = g["from_ns"].to_numpy(), g["arrival_ns"].to_numpy()
        c = comp_m.filter(pl.col("rank") == rank).sort("start_ns")
        u = busy_m.filter(pl.col("rank") == rank).sort("start_ns")
        cc = _coverage(c, b) - _coverage(c, a)
        uu = _coverage(u, b) - _coverage(u, a)
        out.append(g.select("instance_id", "rank").with_columns(
            pl.Series("compute_ns", cc), pl.Series("comm_ns", uu - cc), pl.Series("other_ns", (b - a) - uu)))
    return pl.concat(out) if out else pl.DataFrame()


@register("stragglers", Params)
def run(store: Store, params: Params) -> Result:
    """Straggler statistics and verdict for one run (module doc).

    Raises:
        StoreError: No such run.
        AnalysisError: No collective instance seen by two or more ranks (the message says why).
    """
    run_id = store.resolve_run(params.run)
    label = params.run or str(run_id)
    items, source = _replay.comm_items(store, run_id, params.source or None)
    _replay.require_matched(store, run_id, items, source, label, "stragglers")
    items = items.filter(pl.col("n_ranks") >= 2, pl.col("arrival_ns").is_not_null())
    if items.is_empty():
        raise AnalysisError(f"run {label}: no collective matched across two or more ranks has an arrival time")
    w = _per_rank_instance(items)
    last = w.sort("arrival_ns", "rank", descending=[True, False]).group_by("instance_id").first().select(
        "instance_id", pl.col("rank").alias("last_rank"))
    w = w.join(last, on="instance_id")
    inst = w.group_by("instance_id").agg(
        pl.col("step").first(), pl.col("op").first(), pl.col("pg").first(), pl.len().alias("n_ranks"),
        pl.col("arrival_ns").min().alias("first_arrival_ns"), pl.col("arrival_ns").max().alias("last_arrival_ns"),
        pl.col("last_rank").first(), _common.whole_ns(pl.col("transfer_ns").median()),
        pl.col("end_before_last_arrival").sum().cast(pl.Int64).alias("ends_before_last_arrival"),
    ).with_columns((pl.col("last_arrival_ns") - pl.col("first_arrival_ns")).alias("skew_ns")).sort("instance_id")
    caused = w.filter(pl.col("rank") != pl.col("last_rank")).group_by("last_rank").agg(
        pl.col("wait_ns").sum().alias("wait_caused_ns")).rename({"last_rank": "rank"})
    steps = store.sql(
        """SELECT rank, step, cpu_start_ns AS step_start_ns, cpu_end_ns - cpu_start_ns AS step_ns
           FROM steps WHERE run_id = ?""", [run_id])
    step_med = float(steps["step_ns"].median()) if steps.height else None  # type: ignore[arg-type]
    pace = _pace_ns(w)
    comp = _replay.compute_items(store, run_id)
    comp_step = union_ns(comp.filter(pl.col("step").is_not_null()), ["rank", "step"], "compute_ns")
    comp_rank = comp_step.group_by("rank").agg(_common.whole_ns(pl.col("compute_ns").median()))
    per = w.group_by("rank").agg(
        pl.len().alias("instances"), (pl.col("last_rank") == pl.col("rank")).sum().alias("last_count"),
        _common.whole_ns(pl.col("lateness_ns").median()).alias("median_lateness_ns"),
        pl.col("wait_ns").sum().alias("wait_ns"), _common.whole_ns(pl.col("transfer_ns").median()),
    ).join(caused, on="rank", how="left").join(comp_rank, on="rank", how="left").with_columns(
        (pl.col("last_count") / pl.col("instances")).alias("last_arrival_share"),
        (100.0 * pl.col("median_lateness_ns") / pace).alias("late_pct"),
        (100.0 * pl.col("median_lateness_ns") / step_med if step_med else pl.lit(None, pl.Float64)).alias("late_step_pct"),
        pl.col("wait_caused_ns").fill_null(0),
        _robust_z(pl.col("compute_ns")).alias("compute_z"),
    )
    per = per.with_columns(
        ((pl.col("last_arrival_share") >= params.min_share) & (pl.col("late_pct") >= params.min_late_pct)).alias("named")
    ).select("rank", "instances", "last_count", "last_arrival_share", "median_lateness_ns", "late_pct",
             "late_step_pct", "wait_caused_ns", "wait_ns", "transfer_ns", "compute_ns", "compute_z", "named").sort("rank")
    verdict = _verdict(per, w, comp, steps, pace, params)
    heat = w.group_by("step", "rank").agg((pl.col("lateness_ns").mean() / 1e6).alias("lateness_ms")).sort("step", "rank")
    waits = w.select("instance_id", "step", "rank", "arrival_ns", "wait_ns", "arrival_offset_ns", "lateness_ns",
                     "transfer_ns", "end_before_last_arrival").sort("instance_id", "rank")
    notes = [f"source {source}: {inst.height} collectives matched across two or more ranks; pace (median "
             f"spacing of a rank's collectives) {pace / 1e6:.2f} ms"
             + (f", median step {step_med / 1e6:.1f} ms" if step_med else "")]
    partial = _replay.partial_note(store, run_id, "arrivals, skew, waits and last arrivals are among the traced "
                                   "ranks only; an untraced rank may have arrived later, so waits are lower "
                                   "bounds and transfers (end - last traced arrival) upper bounds")
    notes += [n for n in (partial, _early_end_note(w)) if n]
    notes += verdict["evidence"].to_list()
    return Result(frame=per, instances=inst, waits=waits, heatmap=heat, verdict=verdict, notes=tuple(notes))


def _per_rank_instance(items: pl.DataFrame) -> pl.DataFrame:
    """Per rank and instance: last_ns, wait_ns, arrival_offset_ns, lateness_ns, transfer_ns and
    end_before_last_arrival (module doc, step 2)."""
    # relative to the instance's first arrival: epoch ns do not fit a float64 exactly
    rel = pl.col("arrival_ns") - pl.col("arrival_ns").min().over("instance_id")
    raw_transfer = pl.col("end_ns") - pl.col("last_ns")
    return items.with_columns(
        pl.col("arrival_ns").max().over("instance_id").alias("last_ns"),
        rel.alias("rel_ns"),
        pl.len().over("instance_id").alias("n"),
    ).with_columns(
        (pl.col("last_ns") - pl.col("arrival_ns")).alias("wait_ns"),
        _common.whole_ns(pl.when(pl.col("n") == 2).then(2 * pl.col("rel_ns") - pl.col("rel_ns").sum().over("instance_id"))
             .otherwise(pl.col("rel_ns") - pl.col("rel_ns").median().over("instance_id"))).alias("arrival_offset_ns"),
        pl.max_horizontal(raw_transfer, 0).alias("transfer_ns"),
        (raw_transfer < 0).fill_null(False).alias("end_before_last_arrival"),
        raw_transfer.alias("_raw_transfer_ns"),
    ).with_columns(pl.max_horizontal("arrival_offset_ns", 0).alias("lateness_ns"))


def _early_end_note(w: pl.DataFrame) -> str | None:
    """Say how many rank copies ended before their instance's last arrival, and what that means."""
    bad = w.filter(pl.col("end_before_last_arrival"))
    if bad.is_empty():
        return None
    ops = ", ".join(sorted(set(bad["op"].drop_nulls().to_list()))) or "unknown op"
    worst = -int(bad["_raw_transfer_ns"].min())  # type: ignore[arg-type]
    return (f"{bad.height} of {w.filter(pl.col('end_ns').is_not_null()).height} rank copies ({ops}) ended before "
            f"the last rank arrived, by up to {worst / 1e6:.3f} ms: a collective cannot, so the match, the clock "
            "alignment or the timestamps' resolution is off there (a buffered send, though, may finish before its "
            "receiver arrives); their transfer_ns is clipped to 0 (waits.end_before_last_arrival)")


def _z_text(z: float | None) -> str:
    """The compute z-score with one decimal, or "n/a (no compute traced)" when the run has none
    (a Flight Recorder-only run records collectives, not compute)."""
    return "n/a (no compute traced)" if z is None or np.isnan(z) else f"{z:.1f}"


def _verdict(per: pl.DataFrame, w: pl.DataFrame, comp: pl.DataFrame, steps: pl.DataFrame, pace: float,
             params: Params) -> pl.DataFrame:
    named = per.filter(pl.col("named"))
    if named.is_empty():
        top = per.sort("last_arrival_share", "median_lateness_ns", descending=True).row(0, named=True)
        evidence = (
            f"no single straggler: rank {top['rank']} arrived last most often ({top['last_count']} of "
            f"{top['instances']}, share {top['last_arrival_share']:.2f}), but its median lateness "
            f"{top['median_lateness_ns'] / 1e6:.2f} ms is {top['late_pct']:.0f}% of the pace "
            f"({pace / 1e6:.2f} ms), below {params.min_late_pct:g}%: the skew is within the run's noise")
        return pl.DataFrame({"rank": [None], "named": [False], "cause": ["none"], "compute_excess_ns": [0],
                             "comm_excess_ns": [0], "other_excess_ns": [0], "evidence": [evidence]},
                            schema_overrides={"rank": pl.Int32})
    split = _split_windows(w, comp, steps.select("rank", "step", "step_start_ns"))
    rows = []
    for r in named.iter_rows(named=True):
        mine = w.filter(pl.col("last_rank") == r["rank"])
        parts = split.join(mine.select("instance_id", "rank"), on=["instance_id", "rank"])
        own = parts.filter(pl.col("rank") == r["rank"]).drop("rank")
        others = parts.filter(pl.col("rank") != r["rank"]).group_by("instance_id").agg(
            pl.col(c).median() for c in _CAUSES)
        ex = own.join(others, on="instance_id", suffix="_o").select(
            (pl.col(c) - pl.col(f"{c}_o")).sum().alias(c) for c in _CAUSES).row(0, named=True) if own.height else {
            c: 0.0 for c in _CAUSES}
        best = max(_CAUSES, key=lambda c: ex[c] or 0.0)
        cause = _CAUSES[best] if (ex[best] or 0) > 0 else "unknown"
        evidence = (
            f"straggler: rank {r['rank']} arrived last at {r['last_count']} of {r['instances']} collectives "
            f"(share {r['last_arrival_share']:.2f}), median {r['median_lateness_ns'] / 1e6:.2f} ms late "
            f"({r['late_pct']:.0f}% of the {pace / 1e6:.2f} ms pace), making the others wait "
            f"{r['wait_caused_ns'] / 1e6:.1f} ms in total; compute z = {_z_text(r['compute_z'])}; before those "
            f"arrivals it spent {(ex['compute_ns'] or 0) / 1e6:+.1f} ms compute, {(ex['comm_ns'] or 0) / 1e6:+.1f} ms "
            f"communication, {(ex['other_ns'] or 0) / 1e6:+.1f} ms untraced host time vs the other ranks' median: "
            f"late because of {cause}")
        rows.append({"rank": r["rank"], "named": True, "cause": cause,
                     "compute_excess_ns": int(ex["compute_ns"] or 0), "comm_excess_ns": int(ex["comm_ns"] or 0),
                     "other_excess_ns": int(ex["other_ns"] or 0), "evidence": evidence})
    return pl.DataFrame(rows, schema_overrides={"rank": pl.Int32})
