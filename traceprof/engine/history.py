"""History of a job: each gate metric per run, with its noise band and change points (``traceprof history``).

A CI that gates every run against a baseline sees a regression only when it crosses the threshold;
drift that creeps up a few % per run shows here first.

Algorithm:
  1. The job's runs (:func:`job_runs`): a baseline set, a comma-separated list, or every run whose
     name starts with the given prefix; in the order they were recorded (their first step's start,
     epoch ns; ties by run id).
  2. Per run, the gate's metrics (:mod:`traceprof.engine.diff`): the timing metrics (value and unit
     values per step) and the structural totals per step: exact when every run's ranks count the
     same in all their steps (``diff``'s rule), else timing metrics (with a note). ``peak_mem_bytes`` (the largest
     step peak of allocated memory over the ranks; per step, the step's) is structural when every
     run's allocations are deterministic (each rank repeats its peak to the byte: ``diff``'s rule
     for one baseline run), else a timing metric; a note says which.
  3. Change points per timing metric, by binary segmentation of the run values: the split that
     maximises Welch's t between the runs before and after it (2+ runs on each side) is a change
     point when its two-sided p-value, times the number of splits tried (Bonferroni), is below
     ``alpha``; then each side is split again. Structural metrics change where their value does.
  4. Noise band of each run: what a healthy next run of its segment could show, from the 2+ runs
     before it in the segment (at most ``window``; one earlier run shows no run-to-run spread):
     mean ± t(1 - alpha/2, df) · SE, with SE the noise floor of :func:`traceprof.engine.noise.estimate`
     (those runs as the baseline, this run as the candidate). A band whose half-width is the mean
     or more (it would reach 0: few earlier runs, t(0.995, 1) = 63.7, or noisy ones) bounds nothing
     and is left out, with a note. A run outside its band is ``outside``: drift the gate may not
     flag yet. An exact metric's band is zero-width, at the value of the 2+ equal runs before it
     (at a change point: those of the segment it ends), so the run that breaks them is outside.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import polars as pl

from traceprof.core.errors import StoreError, UsageError
from traceprof.engine import noise, timing
from traceprof.engine.analysis import FrameResult
from traceprof.engine.diff import DEFAULT_ALPHA, MEMORY_METRIC, METRICS, RunProfile, run_profile
from traceprof.engine.diff import _memory_deterministic as memory_deterministic  # the gate's own rule
from traceprof.engine.structure import METRICS as STRUCTURAL
from traceprof.storage.baselines import members
from traceprof.storage.store import Store

__all__ = ["DEFAULT_WINDOW", "HistoryResult", "job_runs", "history", "change_points"]

#: Most earlier runs of a segment that a run's noise band is computed from.
DEFAULT_WINDOW = 10


@dataclass(frozen=True)
class HistoryResult(FrameResult):
    """One row per (run, metric) in ``frame``: order (1 = first recorded), run, metric, layer
    (structural, timing), value (the run's value: ns, %, TFLOP/s, FLOPs, calls or bytes per step),
    noise_pct (timing: the run's own within-run noise, SE of its value from its steps, % of the
    value), band_lo, band_hi (the noise band; null with fewer than 2 runs before it to make it of
    (a timing metric's: of its segment), and where the band would reach 0), change_pct (value
    against the mean of the runs the band is made of, or at a change point of the runs before it, %), outside (value outside the band),
    change_point (a new segment starts at this run), segment (from 1)."""

    job: str = ""
    title: ClassVar[str] = "History"

    def to_dict(self) -> dict[str, object]:
        """The job, notes and rows as JSON-ready values."""
        return {"job": self.job, "notes": list(self.notes), "rows": self.frame.to_dicts()}


def job_runs(store: Store, job: str) -> list[int]:
    """The run ids of a job (module doc, step 1), in the order they were recorded.

    Raises:
        StoreError: No baseline set, run list or run-name prefix matches ``job``.
    """
    ids = members(store, job)
    if not ids and "," in job:
        ids = [store.resolve_run(s.strip()) for s in job.split(",") if s.strip()]
    if not ids:
        ids = store.sql("SELECT run_id FROM runs WHERE starts_with(name, ?)", [job])["run_id"].to_list()
    if not ids:
        raise StoreError(
            f"no job {job!r}: name a baseline set, runs separated by commas, or the start of run names"
        )
    order = store.sql(
        """SELECT r.run_id, min(s.cpu_start_ns) AS t FROM runs r LEFT JOIN steps s USING (run_id)
           WHERE r.run_id IN (SELECT unnest(?::INTEGER[])) GROUP BY r.run_id ORDER BY t NULLS LAST, r.run_id""",
        [list(dict.fromkeys(ids))],
    )
    return order["run_id"].to_list()


def change_points(values: Sequence[float], alpha: float) -> list[int]:
    """Indices where a new segment starts (module doc, step 3), ascending; [] when none.

    Args:
        values: The metric per run, in run order.
        alpha: Significance level (Bonferroni-corrected over the splits tried).
    """
    x = np.asarray(values, dtype=float)
    found: list[int] = []

    def split(lo: int, hi: int) -> None:  # segment x[lo:hi]
        n = hi - lo
        if n < 4:
            return
        seg = x[lo:hi]
        c1, c2 = np.cumsum(seg), np.cumsum(seg * seg)
        best, best_p = -1, 1.0
        tries = n - 3  # splits with 2+ runs on each side
        for i in range(2, n - 1):
            a, b = i, n - i
            ma, mb = c1[i - 1] / a, (c1[-1] - c1[i - 1]) / b
            va = max(c2[i - 1] - a * ma * ma, 0.0) / (a - 1)
            vb = max(c2[-1] - c2[i - 1] - b * mb * mb, 0.0) / (b - 1)
            se2 = va / a + vb / b
            if se2 == 0.0:
                p = 0.0 if ma != mb else 1.0
            else:
                df = se2 * se2 / ((va / a) ** 2 / (a - 1) + (vb / b) ** 2 / (b - 1)) if va or vb else 1.0
                p = 2.0 * (1.0 - noise.t_cdf(abs(ma - mb) / math.sqrt(se2), max(df, 1.0)))
            if p < best_p:
                best, best_p = i, p
        if best > 0 and best_p * tries < alpha:
            found.append(lo + best)
            split(lo, lo + best)
            split(lo + best, hi)

    split(0, len(x))
    return sorted(found)


def _series(p: RunProfile, metric: str) -> tuple[float, np.ndarray]:
    if metric == MEMORY_METRIC:  # the largest step peak over the ranks; per step, its units
        return (p.memory.value, p.memory.units()) if p.memory is not None else (math.nan, np.zeros(0))
    if metric == "compute_ns":
        units = p.timing.compute_steps["compute_ns"].to_numpy()
        return p.timing.compute_ns, units
    if metric in STRUCTURAL:
        return p.structure.total(metric), p.structure.units(metric)
    if metric not in p.timing.samples.columns:
        return math.nan, np.zeros(0)
    return timing.unit_values(p.timing.samples, metric)


def history(
    store: Store,
    job: str,
    alpha: float = DEFAULT_ALPHA,
    window: int = DEFAULT_WINDOW,
    mfu_options: dict[str, str] | None = None,
    metrics: Sequence[str] = (),
) -> HistoryResult:
    """Each gate metric of a job's runs, with noise bands and change points (module doc).

    Args:
        store: An open store.
        job: A baseline set, comma-separated runs, or a run-name prefix.
        alpha: Significance level of change points and bands.
        window: Most earlier runs a band is computed from (2 or more: one earlier run shows no
            run-to-run spread).
        mfu_options: Parameters of the ``mfu`` analysis.
        metrics: Only these metrics (rows and notes); empty: every one.

    Raises:
        StoreError: No such job.
        UsageError: ``window`` < 2; bad ``mfu_options``; a metric the job does not have.
        AnalysisError: A run without ProfilerSteps.
    """
    if window < 2:
        raise UsageError(f"--window {window}: must be at least 2 (a noise band needs 2+ earlier runs)")
    ids = job_runs(store, job)
    cache: dict[int, RunProfile] = {}
    profiles = [run_profile(store, i, mfu_options, cache) for i in ids]
    has_mfu = all(
        "mfu_pct" in p.timing.samples.columns and p.timing.samples["mfu_pct"].is_not_null().any()
        for p in profiles
    )
    names = [m for m in STRUCTURAL] + [m for m in METRICS if m != ("tflops" if has_mfu else "mfu_pct")]
    mem_notes, exact = _memory_layer(profiles)
    rows: list[tuple[object, ...]] = []
    varying: list[str] = []  # structural totals that some run counts differently in two steps of a rank
    wide: list[tuple[str, str]] = []  # (run, metric) whose band would be wider than the value itself
    for metric in names:
        series = [_series(p, metric) for p in profiles]
        if any(math.isnan(v) for v, _ in series):
            continue
        values = [v for v, _ in series]
        structural = (metric in STRUCTURAL and all(p.structure.exact(metric) for p in profiles)) or (
            metric == MEMORY_METRIC and exact
        )
        if metric in STRUCTURAL and not structural:
            varying.append(metric)
        cps = (
            [i for i in range(1, len(values)) if values[i] != values[i - 1]]
            if structural
            else change_points(values, alpha)
        )
        starts = [0, *cps]
        for i, (v, units) in enumerate(series):
            seg_start = max(s for s in starts if s <= i)
            prev = list(range(max(seg_start, i - window), i))
            lo = hi = change = None
            if not prev and i:  # a change point: against the segment before it
                prev_start = max(s for s in starts if s < i)
                before = list(range(max(prev_start, i - window), i))
            else:
                before = prev
            # the runs a band is made of: 2+ (one earlier run shows no run-to-run spread, nor that a
            # count repeats); an exact metric's from the equal runs before it, so that the run that
            # breaks them is outside their zero-width band; a timing metric's from its own segment
            band_of = before if structural else prev
            if len(band_of) >= 2:
                ref = [values[j] for j in band_of]
                mean = float(np.mean(ref))
                half = 0.0
                if not structural:
                    nz = noise.estimate([noise.spread(series[j][1]) for j in prev], noise.spread(units), ref)
                    half = (
                        noise.t_ppf(1.0 - alpha / 2.0, nz.df) * nz.se
                        if nz.se is not None and nz.df > 0
                        else math.inf
                    )
                if half < mean or half == 0.0:  # structural and noiseless bands are exact
                    lo, hi = mean - half, mean + half
                else:  # a band reaching 0 bounds nothing (every metric is >= 0): too few or too noisy runs
                    wide.append((profiles[i].name, metric))
            if before:
                mean = float(np.mean([values[j] for j in before]))
                change = 100.0 * (v - mean) / mean if mean else None
            own = None
            if not structural and len(units) >= 2 and v:
                own = 100.0 * float(np.std(units, ddof=1)) / math.sqrt(len(units)) / abs(v)
            outside = bool(lo is not None and hi is not None and not lo <= v <= hi)
            if metric.endswith("_ns"):  # whole ns, as the diff shows them
                v = float(round(v))
                lo, hi = (None if x is None or not math.isfinite(x) else float(round(x)) for x in (lo, hi))
            rows.append(
                (
                    i + 1,
                    profiles[i].name,
                    metric,
                    "structural" if structural else "timing",
                    v,
                    own,
                    lo if lo is None or math.isfinite(lo) else None,
                    hi if hi is None or math.isfinite(hi) else None,
                    change,
                    outside,
                    i in cps,
                    starts.index(seg_start) + 1,
                )
            )
    frame = pl.DataFrame(
        rows,
        orient="row",
        schema={
            "order": pl.Int64,
            "run": pl.Utf8,
            "metric": pl.Utf8,
            "layer": pl.Utf8,
            "value": pl.Float64,
            "noise_pct": pl.Float64,
            "band_lo": pl.Float64,
            "band_hi": pl.Float64,
            "change_pct": pl.Float64,
            "outside": pl.Boolean,
            "change_point": pl.Boolean,
            "segment": pl.Int64,
        },
    )
    if metrics:  # only these: their rows and notes
        unknown = sorted(set(metrics) - set(frame["metric"]))
        if unknown:
            have = ", ".join(dict.fromkeys(frame["metric"]))
            raise UsageError(f"--metric {unknown[0]!r}: the job has metrics {have}")
        frame = frame.filter(pl.col("metric").is_in(list(metrics)))
        wide = [w for w in wide if w[1] in metrics]
        varying = [m for m in varying if m in metrics]
        if MEMORY_METRIC not in metrics:
            mem_notes = []
    notes = _notes(frame, len(profiles))
    if wide:
        notes.append(
            f"no noise band for {len(wide)} value(s) (first: {wide[0][0]} {wide[0][1]}): the runs before them are "
            "too few or too noisy (the band would reach from 0 to more than twice the mean; with 2 earlier runs "
            f"it is the mean ± t = {noise.t_ppf(1.0 - alpha / 2.0, 1):.1f} standard errors)"
        )
    notes[1:1] = mem_notes
    if varying:
        notes.insert(
            1,
            f"{', '.join(varying)}: counted differently in two steps of a rank in some run (no exact count per "
            "step): noise bands and change points as a timing metric",
        )
    kinds = {(p.gpu, p.world_size) for p in profiles}
    if len(kinds) > 1:
        notes.insert(
            1,
            "the runs are not all comparable ("
            + "; ".join(f"{'GPU' if g else 'CPU-only'}, world size {w}" for g, w in sorted(kinds, key=str))
            + "): their values differ by design, not by drift",
        )
    return HistoryResult(frame=frame, notes=tuple(notes), job=job)


def _memory_layer(profiles: Sequence[RunProfile]) -> tuple[list[str], bool]:
    """How :data:`~traceprof.engine.diff.MEMORY_METRIC` is shown (notes, exact): exact, as a structural
    metric, when every run's allocations are deterministic by the gate's rule (each rank repeats
    its peak to the byte over its steps: ``diff``'s test of one baseline run); else with noise
    bands, as a timing metric. Not shown when some run recorded no memory."""
    have = [p.memory is not None for p in profiles]
    if not all(have):
        return (
            [
                f"{MEMORY_METRIC} not shown: only {sum(have)} of {len(have)} runs recorded memory "
                "(profile_memory=True)"
            ]
            if any(have)
            else []
        ), False
    if all(memory_deterministic([p]) for p in profiles):
        return [
            f"{MEMORY_METRIC}: allocations are deterministic (each run's ranks repeat their peak to the byte "
            "over their steps): compared exactly, as a structural metric"
        ], True
    return [
        f"{MEMORY_METRIC}: peaks differ between the steps of a run (allocations not deterministic): noise bands "
        "and change points as a timing metric"
    ], False


def _notes(frame: pl.DataFrame, runs: int) -> list[str]:
    notes = [f"{runs} runs, in the order they were recorded"]
    for r in frame.filter(pl.col("change_point")).iter_rows(named=True):
        ch = f" ({r['change_pct']:+.1f}% vs the runs before)" if r["change_pct"] is not None else ""
        notes.append(f"change point: {r['metric']} from run {r['run']!r} (order {r['order']}){ch}")
    out = frame.filter(pl.col("outside") & ~pl.col("change_point"))
    if out.height:
        notes.append(
            "outside the noise band of the runs before: "
            + ", ".join(f"{r['run']} {r['metric']}" for r in out.iter_rows(named=True))
        )
    return notes
