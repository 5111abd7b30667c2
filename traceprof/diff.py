"""Regression diff of two runs: what changed per step, and whether it is a regression (CI gate).

Algorithm (README.md "Analyses": Regression diff):
  1. Samples per (rank, step) of each run: step time (``steps``: device span where present, else
     the ProfilerStep annotation), exposed communication and idle time (activity launched in the
     step, as the ``overlap`` and ``temporal`` analyses define them), and MFU (or achieved TFLOP/s
     when the device peak is unknown) from the ``mfu`` analysis.
  2. Items, each as a *typical* time per step: GPU kernels by name (CPU-only ranks: the training
     thread's CPU ops by name, self time), and collectives by op. Calls are grouped by name and
     shape (kernel grid/block; op ``Input Dims``; collective size); typical time per step =
     Σ over groups of (calls per step × median call duration). The median per shape discards
     calls inflated by preemption or a slow outlier, which on a shared CPU dominate plain sums.
     ``compute_ns`` (a metric) is the typical time of the compute items (kernels of class compute;
     CPU ops other than the ``c10d::`` enqueues).
  3. Per metric: base and candidate value (median of the samples, or the typical time), delta,
     and ``change_pct``: the change in the bad direction (up for times, down for MFU/TFLOP/s) as
     % of the base value, or, for the step's components (exposed communication, idle), as % of
     the base step time, so that a component that is tiny cannot trip the gate by doubling.
  4. Noise-aware rule: a metric regressed when change_pct > its threshold (relative, default
     :data:`DEFAULT_THRESHOLD`) and, for sampled metrics with at least :data:`MIN_SAMPLES` samples
     per run, a one-sided Mann-Whitney U test says the candidate's samples are worse (p <
     ``alpha``, default 0.01): a shift the size of the spread between steps is not evidence.
  5. Items are sorted by |delta| (their contribution to the change of step time); the summary
     names the items that grew. Times are rounded to whole ns (int64) before the deltas.

Only comparable runs are diffed: both on GPUs or both CPU-only (a run is a GPU run when it has
kernels, memcpys or memsets), and the same world size when both runs record one. Per-rank step
times of a different device or job size differ by design, not by regression (UsageError).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import polars as pl

from traceprof import analysis as registry
from traceprof.activity import activity
from traceprof.analysis import Chart, FrameResult
from traceprof.errors import AnalysisError, UsageError
from traceprof.intervals import class_measures
from traceprof.names import shorten
from traceprof.optree import self_times, with_parents
from traceprof.runs import run_name
from traceprof.store import Store

__all__ = ["DEFAULT_THRESHOLD", "MIN_SAMPLES", "METRICS", "DiffResult", "diff_runs", "typical_items", "mann_whitney_p"]

#: Default relative threshold of every metric (10 %); see README "CI gating" for how it was chosen.
DEFAULT_THRESHOLD = 0.10
#: Fewest (rank, step) samples per run for the noise test; below it the threshold alone decides.
MIN_SAMPLES = 5
#: Gated metrics: name -> (higher is worse, measured relative to the base step time).
METRICS: dict[str, tuple[bool, bool]] = {
    "step_time_ns": (True, False),
    "compute_ns": (True, False),
    "mfu_pct": (False, False),
    "tflops": (False, False),
    "exposed_comm_ns": (True, True),
    "idle_ns": (True, True),
}
#: An item "grew" when it rose by more than the compute threshold and by this share of the step.
MIN_ITEM_SHARE_PCT = 1.0


@dataclass(frozen=True)
class DiffResult(FrameResult):
    """Metrics (``frame``), items (``items``), the verdict and the one-line summary.

    ``frame`` columns: metric, base, cand, delta (units of the metric: ns, % or TFLOP/s),
    delta_pct (% of base), change_pct (% change in the bad direction, see module doc),
    threshold_pct, p_value (null when not tested), n_base, n_cand (samples), regressed.
    ``items`` columns: kind (kernel, op, collective), name, class (compute, comm, memory), base_ns,
    cand_ns (typical ns per step),
    delta_ns, delta_pct (% of the item's base; null when new), share_of_step_pct (delta as % of the
    base step time), base_calls, cand_calls (per step), grew.
    """

    items: pl.DataFrame = field(default_factory=pl.DataFrame)
    regressed: bool = False
    summary: str = ""
    title: ClassVar[str] = "Regression diff"

    def frames(self) -> dict[str, pl.DataFrame]:
        top = self.items.head(15).with_row_index("rank", 1).select(
            (pl.col("rank").cast(pl.Utf8) + ". " + pl.col("name").str.slice(0, 32)).alias("label"),
            pl.exclude("rank"))  # short, unique chart labels: kernel names run to hundreds of characters
        return {"frame": self.frame, "items": self.items, "top": top}

    def to_dict(self) -> dict[str, object]:
        """The verdict, summary, notes, metrics and items as JSON-ready Python values."""
        metrics = [{k: int(v) if k in ("base", "cand", "delta") and str(m["metric"]).endswith("_ns") else v
                    for k, v in m.items()} for m in self.frame.to_dicts()]
        return {"regressed": self.regressed, "summary": self.summary, "notes": list(self.notes[1:]),
                "metrics": metrics, "items": self.items.to_dicts()}

    def charts(self) -> list[Chart]:
        # One series (the change) on a plain categorical axis: the report rotates its labels, which
        # it cannot do for the group labels of grouped base/cand bars (they overlapped).
        return [Chart("Largest changes: typical time per step, candidate minus base", "label", ("delta_ns",),
                      frame="top")]


def mann_whitney_p(base: np.ndarray, cand: np.ndarray) -> float:
    """One-sided Mann-Whitney U p-value that ``cand`` tends to be larger than ``base``.

    Normal approximation with tie correction and continuity correction (fine from ~5 samples a
    side). Returns 1.0 when every value is equal.
    """
    n1, n2 = len(base), len(cand)
    values = np.concatenate([base, cand]).astype(float)
    _, inv, counts = np.unique(values, return_inverse=True, return_counts=True)
    avg_rank = np.cumsum(counts) - (counts - 1) / 2.0  # 1-based average rank of each distinct value
    u = avg_rank[inv][n1:].sum() - n2 * (n2 + 1) / 2.0
    n = n1 + n2
    var = n1 * n2 / 12.0 * ((n + 1) - (counts**3 - counts).sum() / (n * (n - 1)))
    if var <= 0:
        return 1.0
    z = (u - n1 * n2 / 2.0 - 0.5) / math.sqrt(var)
    return 0.5 * math.erfc(z / math.sqrt(2.0))


_OPS_SQL = """
WITH gpu_ranks AS (SELECT DISTINCT rank FROM events WHERE run_id = $run AND kind IN ('kernel', 'memcpy', 'memset')),
tt AS (SELECT DISTINCT rank, pid, tid FROM events WHERE run_id = $run AND kind = 'step')
SELECT e.rank, e.pid, e.tid, e.step, e.name, coalesce(json_extract_string(e.args, '$."Input Dims"'), '') AS sig,
       e.ts_ns AS start_ns, e.ts_ns + e.dur_ns AS end_ns
FROM events e JOIN tt USING (rank, pid, tid)
WHERE e.run_id = $run AND e.kind = 'cpu_op' AND e.rank NOT IN (SELECT rank FROM gpu_ranks)
"""
_CALLS_SQL = """
SELECT 'kernel' AS kind, name, coalesce(grid, '') || coalesce(block, '') AS sig, class, dur_ns AS ns
FROM kernels WHERE run_id = $run AND step IS NOT NULL
UNION ALL
SELECT 'collective', op, coalesce(CAST(bytes_in AS VARCHAR), ''), 'comm', end_ns - start_ns
FROM collectives
WHERE run_id = $run AND step IS NOT NULL AND end_ns IS NOT NULL
  AND (source <> 'fr' OR NOT EXISTS (SELECT 1 FROM collectives WHERE run_id = $run AND source <> 'fr'))
"""


def typical_items(store: Store, run_id: int) -> pl.DataFrame:
    """Typical time per step of every kernel, CPU op and collective of a run (module doc, step 2).

    Returns:
        Frame with columns kind (kernel/op/collective), name, class (compute/comm/memory), ns
        (typical ns per rank-step), calls (calls per rank-step).
    """
    samples = store.sql("SELECT count(*) AS n FROM steps WHERE run_id = ?", [run_id])["n"][0]
    if not samples:
        raise AnalysisError(f"run {run_name(store, run_id)!r}: no ProfilerSteps, nothing to compare per step")
    ops = store.sql(_OPS_SQL.replace("$run", str(int(run_id))))
    tree = with_parents(ops, ["rank", "pid", "tid"])
    enqueue = pl.col("name").str.starts_with("c10d::") | (pl.col("name") == "record_param_comms")
    op_calls = tree.with_columns(self_times(tree).alias("ns")).filter(pl.col("step").is_not_null()).select(
        pl.lit("op").alias("kind"), "name", "sig",
        pl.when(enqueue).then(pl.lit("comm")).otherwise(pl.lit("compute")).alias("class"), "ns")
    calls = pl.concat([op_calls, store.sql(_CALLS_SQL.replace("$run", str(int(run_id))))], how="vertical_relaxed")
    groups = calls.group_by("kind", "name", "class", "sig").agg(
        pl.len().alias("n"), pl.col("ns").cast(pl.Float64).median().alias("med"))
    # sorted first (group_by returns groups in any order): the class and the float sums do not
    # change from one run of diff to the next; a name under several classes takes its most called one
    return groups.sort("kind", "name", "class", "sig", nulls_last=True).group_by("kind", "name", maintain_order=True).agg(
        pl.col("class").sort_by("n", descending=True, maintain_order=True).first(),
        ((pl.col("n") * pl.col("med")).sum() / samples).alias("ns"), (pl.col("n").sum() / samples).alias("calls"))


def _samples(store: Store, run_id: int, mfu_options: dict[str, str]) -> tuple[pl.DataFrame, list[str]]:
    """Per (rank, step): step_time_ns, exposed_comm_ns, idle_ns, tflops, mfu_pct (module doc, step 1)."""
    notes: list[str] = []
    steps = store.sql(
        """SELECT rank, step, CASE WHEN device_end_ns IS NOT NULL THEN device_end_ns - device_start_ns
                                   ELSE cpu_end_ns - cpu_start_ns END AS step_time_ns
           FROM steps WHERE run_id = ?""",
        [run_id],
    )
    act = activity(store, run_id).filter(pl.col("step").is_not_null())
    if not act.is_empty():
        m = class_measures(act, ["rank", "step"]).select(
            "rank", "step", (pl.col("comm_ns") - pl.col("overlap_ns")).alias("exposed_comm_ns"),
            (pl.col("window_ns") - pl.col("busy_ns")).alias("idle_ns"))
        steps = steps.join(m, on=["rank", "step"], how="left")
    an = registry.get("mfu")
    params = registry.make_params(an, str(run_id), mfu_options)  # bad -p values: UsageError, not a note
    try:
        mfu = an.run(store, params).to_frame()
        steps = steps.join(mfu.select("rank", "step", "tflops", "mfu_pct"), on=["rank", "step"], how="left")
    except AnalysisError as e:
        notes.append(f"run {run_name(store, run_id)!r}: no MFU ({e})")
    return steps, notes


def _metric(name: str, b: np.ndarray, c: np.ndarray, step_base: float, threshold: float, alpha: float,
            sampled: bool) -> dict[str, object]:
    worse_up, of_step = METRICS[name]
    base, cand = float(np.median(b)), float(np.median(c))
    if name.endswith("_ns"):
        base, cand = float(round(base)), float(round(cand))  # whole ns
    delta = cand - base
    scale = step_base if of_step else abs(base)
    change = 100.0 * (delta if worse_up else -delta) / scale if scale else (0.0 if delta == 0 else math.inf)
    p = None
    if sampled and min(len(b), len(c)) >= MIN_SAMPLES:
        p = mann_whitney_p(b, c) if worse_up else mann_whitney_p(-b, -c)
    return {
        "metric": name, "base": base, "cand": cand, "delta": delta,
        "delta_pct": 100.0 * delta / abs(base) if base else None, "change_pct": change,
        "threshold_pct": 100.0 * threshold, "p_value": p, "n_base": len(b), "n_cand": len(c),
        "regressed": bool(change > 100.0 * threshold and (p is None or p < alpha)),
    }


def diff_runs(store: Store, base: str, cand: str, thresholds: dict[str, float] | None = None,
              alpha: float = 0.01, mfu_options: dict[str, str] | None = None, force: bool = False) -> DiffResult:
    """Compare run ``cand`` against run ``base`` (module doc).

    Args:
        store: An open store holding both runs.
        base: Baseline run name or id.
        cand: Candidate run name or id.
        thresholds: Relative threshold per metric (0.1 = 10 %); key ``*`` sets every metric.
        alpha: Significance level of the noise test.
        mfu_options: Parameters of the ``mfu`` analysis (e.g. ``peak_tflops``), for both runs.
        force: Compare runs that are not comparable anyway: each metric's samples are then the
            per-rank medians over steps (ranks, not rank-steps, are the samples), with a note.

    Raises:
        StoreError: No such run.
        UsageError: A threshold for an unknown metric, or one outside (0, 1]; runs that are not
            comparable (GPU vs CPU-only, different world sizes) unless ``force``; bad ``mfu_options``.
        AnalysisError: A run without ProfilerSteps.
    """
    limits = _thresholds(thresholds or {})
    ids = store.resolve_run(base), store.resolve_run(cand)
    forced: list[str] = []
    try:
        _check_comparable(store, ids)
    except UsageError as e:
        if not force:
            raise
        forced.append(f"forced (--force): {str(e).split(': diff two runs')[0]}; each metric compares "
                      "per-rank medians over steps")
    (sb, nb), (sc, nc) = (_samples(store, i, mfu_options or {}) for i in ids)
    if forced:
        sb, sc = (s.group_by("rank").agg(pl.exclude("step").median()).with_columns(pl.lit(0).alias("step"))
                  for s in (sb, sc))
    ib, ic = typical_items(store, ids[0]), typical_items(store, ids[1])
    notes = forced + nb + nc
    step_base = float(np.median(sb["step_time_ns"].to_numpy()))
    has_mfu = all("mfu_pct" in s.columns and s["mfu_pct"].is_not_null().any() for s in (sb, sc))
    rows = []
    for name in METRICS:
        if name == "compute_ns":
            b = np.array([ib.filter(pl.col("class") == "compute")["ns"].sum()])
            c = np.array([ic.filter(pl.col("class") == "compute")["ns"].sum()])
            rows.append(_metric(name, b, c, step_base, limits[name], alpha, sampled=False))
            continue
        if name == ("tflops" if has_mfu else "mfu_pct") or name not in sb.columns or name not in sc.columns:
            continue  # with MFU known, gate on it rather than on its numerator; else on TFLOP/s
        b, c = sb[name].drop_nulls().to_numpy(), sc[name].drop_nulls().to_numpy()
        if len(b) and len(c):
            rows.append(_metric(name, b.astype(float), c.astype(float), step_base, limits[name], alpha, sampled=True))
    metrics = pl.DataFrame(rows, schema_overrides={"p_value": pl.Float64, "delta_pct": pl.Float64})
    if min(sb.height, sc.height) < MIN_SAMPLES:
        notes.append(f"fewer than {MIN_SAMPLES} (rank, step) samples in a run: thresholds only, no noise test")
    items = _items(ib, ic, step_base, limits["compute_ns"])
    regressed = bool(metrics["regressed"].any())
    names = [run_name(store, i) for i in ids]
    summary = _summary(names[0], names[1], metrics, items, regressed)
    return DiffResult(frame=metrics, items=items, regressed=regressed, summary=summary, notes=(summary, *notes))


def _check_comparable(store: Store, ids: tuple[int, int]) -> None:
    """Raise UsageError when one run is on GPUs and the other CPU-only, or their world sizes differ."""
    runs = {r["run_id"]: r for r in store.sql(
        """SELECT run_id, name, world_size, EXISTS (SELECT 1 FROM events e WHERE e.run_id = r.run_id
                                                     AND e.kind IN ('kernel', 'memcpy', 'memset')) AS gpu
           FROM runs r WHERE run_id IN (?, ?)""",
        list(ids),
    ).iter_rows(named=True)}
    b, c = runs[ids[0]], runs[ids[1]]
    why = []
    if b["gpu"] != c["gpu"]:
        why.append(f"{b['name']} is {'a GPU' if b['gpu'] else 'a CPU-only'} run, {c['name']} "
                   f"{'a GPU' if c['gpu'] else 'a CPU-only'} run")
    if b["world_size"] is not None and c["world_size"] is not None and b["world_size"] != c["world_size"]:
        why.append(f"world size {b['world_size']} vs {c['world_size']}")
    if why:
        raise UsageError(f"runs {b['name']} and {c['name']} are not comparable ({'; '.join(why)}): "
                         "diff two runs of the same job on the same kind of device, or pass --force to "
                         "compare per-rank medians anyway")


def _thresholds(given: dict[str, float]) -> dict[str, float]:
    out = dict.fromkeys(METRICS, given.get("*", DEFAULT_THRESHOLD))
    for key, value in given.items():
        if key != "*" and key not in METRICS:
            raise UsageError(f"--threshold {key}=...: no such metric; metrics: {', '.join(METRICS)}")
        if not 0 < value <= 1:
            raw = f"{value:g}" if key == "*" else f"{key}={value:g}"
            raise UsageError(f"-t {raw}: thresholds are fractions in (0, 1] (0.05 = 5%)")
        if key != "*":
            out[key] = value
    return out


def _items(ib: pl.DataFrame, ic: pl.DataFrame, step_base: float, threshold: float) -> pl.DataFrame:
    cols = ["kind", "name", "class"]
    both = ib.select(*cols, pl.col("ns").alias("base_ns"), pl.col("calls").alias("base_calls")).join(
        ic.select(*cols, pl.col("ns").alias("cand_ns"), pl.col("calls").alias("cand_calls")),
        on=cols, how="full", coalesce=True,
    ).with_columns(pl.col("base_calls", "cand_calls").fill_null(0.0),
                   pl.col("base_ns", "cand_ns").fill_null(0.0).round().cast(pl.Int64))
    delta = pl.col("cand_ns") - pl.col("base_ns")
    return both.with_columns(
        delta.alias("delta_ns"),
        pl.when(pl.col("base_ns") > 0).then(100.0 * delta / pl.col("base_ns")).otherwise(None).alias("delta_pct"),
        (100.0 * delta / step_base).alias("share_of_step_pct"),
    ).with_columns(
        ((pl.col("delta_pct").fill_null(math.inf) > 100.0 * threshold)
         & (pl.col("share_of_step_pct") >= MIN_ITEM_SHARE_PCT)).alias("grew"),
    ).select("kind", "name", "class", "base_ns", "cand_ns", "delta_ns", "delta_pct", "share_of_step_pct",
             "base_calls", "cand_calls", "grew").sort(  # ties by kind and name: one order every run
        delta.abs(), "kind", "name", descending=[True, False, False], nulls_last=True)


def _summary(base: str, cand: str, metrics: pl.DataFrame, items: pl.DataFrame, regressed: bool) -> str:
    def fmt(r: dict[str, object]) -> str:
        return f"{r['metric']} {r['delta_pct'] if r['delta_pct'] is not None else 0:+.1f}%"

    # Name first what the regressed metrics point at: compute items for compute_ns, collectives
    # and comm ops for exposed_comm_ns; then the rest, each by growth.
    bad = set(metrics.filter(pl.col("regressed"))["metric"])
    first = ["compute"] if "compute_ns" in bad else []
    first += ["comm"] if "exposed_comm_ns" in bad else []
    grew = items.filter(pl.col("grew")).sort(~pl.col("class").is_in(first), -pl.col("delta_ns")).head(3)
    grown = ", ".join(
        f"{shorten(r['name'], 60)} +{r['delta_ns'] / 1e6:.2f} ms/step" + (f" ({r['delta_pct']:+.0f}%)" if r["delta_pct"] is not None else " (new)")
        for r in grew.iter_rows(named=True)
    )
    if regressed:
        rows = metrics.filter(pl.col("regressed")).iter_rows(named=True)
        what = "; ".join(f"{fmt(r)} (change {r['change_pct']:.1f}% > {r['threshold_pct']:g}%)" for r in rows)
        return f"REGRESSION {base} -> {cand}: {what}" + (f"; grew: {grown}" if grown else "")
    seen = ", ".join(fmt(r) for r in metrics.iter_rows(named=True))
    return f"OK {base} -> {cand}: no regression beyond thresholds ({seen})" + (f"; grew: {grown}" if grown else "")
