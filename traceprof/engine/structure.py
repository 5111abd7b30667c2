"""Structural diff: what a run does per step, counted exactly, and what changed (the gate's first layer).

Counts have no timing noise: 16 healthy recordings of the sample job have the same 962 CPU ops of
the same shapes per rank and step, the same 4 all-reduces of the same sizes. So a change in them is
certain, whatever the machine's load, and is reported as such.

Algorithm:
  1. Per (rank, step) (ProfilerStep; rows outside steps are left out), count *keys*: CPU ops by
     name and input shapes (Kineto ``args."Input Dims"``; every thread, nested ops included), GPU
     activity by kind, name, grid and block (``kernels`` view), collectives by op and process
     group (``pg``, else its member ranks ``pg_ranks``) with the bytes they move (the larger of
     ``bytes_in``/``bytes_out``: an all-gather's output, a reduce-scatter's input, as nccl-tests
     sizes them; Flight Recorder rows only when no other source has the run's collectives).
     Model FLOPs per key from shapes (leaf matmul/convolution/attention calls,
     :func:`traceprof.engine.flops.signature_flops`); without shapes, the collector sidecar's FLOPs
     per step (``traces.flops_per_step``) give the rank-step total only.
  2. A rank's value per step of a key or a total is the **median over the rank's steps** (a step
     where a key is absent counts 0): a step cut short at the profiler's stop, or a one-off step,
     does not change it. Job values per step are sums over ranks.
  3. Totals (:data:`METRICS`): ``flops``; ``launches`` (GPU kernels; on CPU-only ranks, CPU
     ops); ``collectives`` (calls); ``comm_bytes``.
  4. :func:`compare`: a total grew when the candidate's value is above every baseline run's;
     ``change_pct`` = 100 · (cand - largest baseline) / largest baseline (a decrease: against the
     smallest; inside the baselines' range: 0, with no one baseline run as its base). It is a regression when it grew by more than its
     threshold. Keys are compared per rank, so a change on one rank is named with its rank.
  5. A total is **exact** in a run (:meth:`Structure.exact`) when each rank counts the same in all
     its steps (a step without a row counting 0). Otherwise its median per step is no count the
     program repeats (hta/trace_compare: kernels per step 4 and 1, median 2.5): the gate noise-tests
     it from the job totals per step (:meth:`Structure.units`) instead of gating it as certain.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import polars as pl

from traceprof.engine.flops import sidecar_flops, signature_flops
from traceprof.storage.store import Store

__all__ = [
    "METRICS",
    "DEFAULT_THRESHOLDS",
    "Structure",
    "profile",
    "compare",
    "shape_text",
    "metric_change",
    "against_text",
]

#: Structural metrics and what each counts per step (job total: the sum over ranks).
METRICS = {
    "flops": "model FLOPs per step (from shapes; else the collector sidecar)",
    "launches": "GPU kernels per step (CPU-only ranks: CPU ops per step)",
    "collectives": "collective calls per step",
    "comm_bytes": "bytes communicated per step (all collectives)",
}
#: Default growth that makes a structural change a regression (README "CI gating": exact counts have no
#: noise, so these are policy: 1 % more FLOPs, bytes or collectives is real extra work; 5 % more
#: launches, since refactors often add cheap views and reshapes).
DEFAULT_THRESHOLDS = {"flops": 0.01, "launches": 0.05, "collectives": 0.01, "comm_bytes": 0.01}

_KEYS = ["kind", "name", "sig"]

_COUNTS_SQL = """
WITH gpu_ranks AS (SELECT DISTINCT rank FROM events WHERE run_id = $run AND kind IN ('kernel', 'memcpy', 'memset'))
SELECT rank, step, 'op' AS kind, name, coalesce(json_extract_string(args, '$."Input Dims"'), '') AS sig,
       count(*) AS calls, 0::BIGINT AS bytes,
       rank NOT IN (SELECT rank FROM gpu_ranks) AS launch
FROM events WHERE run_id = $run AND kind = 'cpu_op' AND step IS NOT NULL GROUP BY ALL
UNION ALL
SELECT rank, step, kind, name, coalesce(grid, '') || ' ' || coalesce(block, ''), count(*), 0, kind = 'kernel'
FROM kernels WHERE run_id = $run AND step IS NOT NULL GROUP BY ALL
UNION ALL
SELECT rank, step, 'collective', op, coalesce(pg, pg_ranks, ''), count(*),
       sum(coalesce(greatest(bytes_in, bytes_out), bytes_in, bytes_out, 0)), false
FROM collectives
$collectives
GROUP BY ALL
"""
#: The collectives ``_COUNTS_SQL`` counts (Flight Recorder rows only where no other source has any).
_COLLECTIVES_WHERE = """WHERE run_id = $run AND step IS NOT NULL
  AND (source <> 'fr' OR NOT EXISTS (SELECT 1 FROM collectives WHERE run_id = $run AND source <> 'fr'))"""
_COUNTS_SQL = _COUNTS_SQL.replace("$collectives", _COLLECTIVES_WHERE)
#: Those collectives and how many of them have a size (Structure.unsized).
_BYTES_KNOWN_SQL = f"""SELECT count(*), count(coalesce(bytes_in, bytes_out)) FROM collectives
{_COLLECTIVES_WHERE}"""


@dataclass(frozen=True)
class Structure:
    """The structural profile of one run (module doc, steps 1-3).

    Attributes:
        keys: Frame with columns rank, kind (op, kernel, memcpy, memset, collective), name, sig
            (op: ``Input Dims`` JSON; GPU: grid and block; collective: process group), calls,
            flops, bytes (each per step: the median over the rank's steps).
        totals: Frame with columns rank, steps (ProfilerSteps of the rank) and each of
            :data:`METRICS` per step (medians over the rank's steps).
        flops_source: ``shapes``, ``sidecar`` or None (no FLOPs known: ``flops`` is 0).
        per_step: Frame with columns rank, step and each of :data:`METRICS`: the values in every
            (rank, step) of the ``steps`` table (0 where a step has none); None for a profile built
            without them (every total is then taken as exact).
        unsized: (collectives in the run's steps without a size, all of them): ``comm_bytes`` sums
            the others' (an old Kineto trace sizes an all-reduce from its ``Input Dims``, not an
            all-to-all); (0, n) when every size is known.
    """

    keys: pl.DataFrame
    totals: pl.DataFrame
    flops_source: str | None
    per_step: pl.DataFrame | None = None
    unsized: tuple[int, int] = (0, 0)

    @property
    def bytes_known(self) -> bool:
        """False when the run has collectives in its steps but none with a size (``bytes_in`` /
        ``bytes_out`` NULL: an old Kineto trace without collective metadata): ``comm_bytes`` is then
        0 for want of sizes, not measured."""
        missing, of = self.unsized
        return of == 0 or missing < of

    def total(self, metric: str) -> float:
        """The job's value of a metric per step: the sum over ranks."""
        return float(self.totals[metric].sum())

    def exact(self, metric: str) -> bool:
        """Whether ``metric`` is exact in this run (module doc, step 5): each rank counts the same in
        all its steps. True without ``per_step`` (a profile built by hand)."""
        if self.per_step is None or self.per_step.is_empty():
            return True
        return bool(self.per_step.group_by("rank").agg(pl.col(metric).n_unique())[metric].max() == 1)

    def units(self, metric: str) -> np.ndarray:
        """The job's value of ``metric`` in each step (the sum over the ranks that have it), in step
        order: shape (steps,), the metric's unit; empty without ``per_step``."""
        if self.per_step is None:
            return np.zeros(0)
        return self.per_step.group_by("step").agg(pl.col(metric).sum()).sort("step")[metric].to_numpy()

    def varying(self, metric: str) -> str:
        """The first rank whose steps count ``metric`` differently, with its counts in step order
        (``rank 1: 4, 1``), or "" when the steps agree."""
        if self.exact(metric) or self.per_step is None:
            return ""
        by = self.per_step.sort("rank", "step").group_by("rank", maintain_order=True).agg(pl.col(metric))
        for rank, vals in by.iter_rows():
            if len(set(vals)) > 1:
                shown = ", ".join(f"{v:,.0f}" for v in vals[:6]) + (", ..." if len(vals) > 6 else "")
                return f"rank {rank}: {shown}"
        return ""

    def odd_steps(self, metric: str) -> str:
        """The steps whose job total of ``metric`` (the sum over ranks) differs from the most common
        one, with both values (``step 5: 12 (the other steps 16)``; a tie: the smaller value is the
        common one), or "" when every step counts the same. Linear in the (rank, step) rows."""
        if self.per_step is None or self.per_step.is_empty():
            return ""
        per = self.per_step.group_by("step").agg(pl.col(metric).sum()).sort("step")
        counts = per.group_by(metric).len().sort(["len", metric], descending=[True, False])
        if counts.height < 2:
            return ""
        usual = counts[metric][0]
        odd = per.filter(pl.col(metric) != usual)
        shown = ", ".join(f"step {s}: {v:,.0f}" for s, v in odd.head(6).iter_rows())
        more = f", ... ({odd.height} steps)" if odd.height > 6 else ""
        return f"{shown}{more} (the other steps {usual:,.0f})"


def _median_over_steps(
    rows: pl.DataFrame, by: list[str], values: list[str], steps: pl.DataFrame
) -> pl.DataFrame:
    """Per (rank, *by): the median of each value column over the rank's steps, a missing step being 0.

    ``rows`` holds one row per (rank, step, *by) present; ``steps`` the number of steps per rank
    (columns rank, steps). Sorted lists per group: linear in the rows, never rows x steps.
    """
    g = rows.group_by("rank", *by).agg(pl.col(v).sort() for v in values).join(steps, on="rank")
    zeros = pl.col("steps") - pl.col(values[0]).list.len()

    def at(v: str, i: pl.Expr) -> pl.Expr:
        return pl.when(i < zeros).then(0).otherwise(pl.col(v).list.get(i - zeros, null_on_oob=True))

    lo, hi = (pl.col("steps") - 1) // 2, pl.col("steps") // 2
    return g.select("rank", *by, *(((at(v, lo) + at(v, hi)) / 2.0).cast(pl.Float64).alias(v) for v in values))


def profile(store: Store, run_id: int) -> Structure:
    """The structural profile of run ``run_id`` (module doc, steps 1-3 and 5's values per step).

    Source fields read: ``events`` (cpu_op name, step, ``args."Input Dims"``, ``"Input type"``,
    ``"Concrete Inputs"``), the ``kernels`` view (kind, name, grid, block, step), ``collectives``
    (op, pg, pg_ranks, bytes_in, bytes_out, step, source), ``steps`` and ``traces.flops_per_step``.
    """
    steps = store.sql("SELECT rank, count(*) AS steps FROM steps WHERE run_id = ? GROUP BY rank", [run_id])
    step_rows = store.sql("SELECT DISTINCT rank, step FROM steps WHERE run_id = ?", [run_id])
    counts = store.sql(_COUNTS_SQL.replace("$run", str(int(run_id))))
    sig = signature_flops(store, run_id).filter(
        pl.col("step").is_not_null() & pl.col("flops_call").is_not_null()
    )
    source: str | None = "shapes" if sig.height else None
    per_key = (
        sig.group_by("rank", "step", "name", pl.col("dims").alias("sig"))
        .agg((pl.col("calls") * pl.col("flops_call")).sum().alias("flops"))
        .with_columns(pl.lit("op").alias("kind"))
    )
    counts = counts.join(per_key, on=["rank", "step", *_KEYS], how="left").with_columns(
        pl.col("flops").fill_null(0.0), pl.col("calls").cast(pl.Float64), pl.col("bytes").cast(pl.Float64)
    )
    step_flops = per_key.group_by("rank", "step").agg(pl.col("flops").sum())
    if source is None:
        side = sidecar_flops(store, run_id)
        if side.height:
            source, step_flops = (
                "sidecar",
                side.select(pl.col("rank").cast(pl.Int32), pl.col("step").cast(pl.Int32), "flops"),
            )
    keys = _median_over_steps(counts, _KEYS, ["calls", "flops", "bytes"], steps)
    kind = pl.col("kind")
    per_step = (
        counts.group_by("rank", "step")
        .agg(
            pl.col("calls").filter(pl.col("launch")).sum().alias("launches"),
            pl.col("calls").filter(kind == "collective").sum().alias("collectives"),
            pl.col("bytes").sum().alias("comm_bytes"),
        )
        .join(
            step_flops.with_columns(pl.col("flops").cast(pl.Float64)),
            on=["rank", "step"],
            how="full",
            coalesce=True,
        )
    )
    per_step = per_step.with_columns(pl.col(m).fill_null(0.0).cast(pl.Float64) for m in METRICS)
    totals = (
        steps.join(_median_over_steps(per_step, [], list(METRICS), steps), on="rank", how="left")
        .with_columns(pl.col(m).fill_null(0.0) for m in METRICS)
        .sort("rank")
    )
    n_coll, n_sized = store.sql(_BYTES_KNOWN_SQL.replace("$run", str(int(run_id)))).row(0)
    # every (rank, step) of the steps table, a step without a row counting 0 (step 5)
    grid = step_rows.with_columns(pl.col("rank").cast(pl.Int32), pl.col("step").cast(pl.Int32)).join(
        per_step.with_columns(pl.col("rank").cast(pl.Int32), pl.col("step").cast(pl.Int32)),
        on=["rank", "step"],
        how="left",
    )
    grid = grid.select("rank", "step", *(pl.col(m).fill_null(0.0) for m in METRICS)).sort("rank", "step")
    return Structure(keys.sort("rank", *_KEYS), totals, source, grid, (n_coll - n_sized, n_coll))


def shape_text(kind: str, name: str, sig: str) -> str:
    """A key's signature for a message: ``(512,128)@(128,512)`` for a two-input matmul-like op,
    ``(8,64,128), ()`` for other ops, the grid and block of a kernel, ``pg 0`` for a collective."""
    if kind == "op":
        try:
            import msgspec

            dims = msgspec.json.decode(sig) if sig else []
        except msgspec.DecodeError:
            return sig
        shapes = ["(" + ",".join(str(d) for d in x) + ")" if isinstance(x, list) else str(x) for x in dims]
        tensors = [s for s, x in zip(shapes, dims, strict=True) if isinstance(x, list) and x]
        if name.endswith(("::mm", "::bmm", "::matmul")) and len(tensors) == 2:
            return "@".join(tensors)
        return ", ".join(shapes)
    if kind == "collective":
        return f"pg {sig}" if sig else ""
    return sig.strip()


def _range(values: Sequence[float]) -> tuple[float, float]:
    return min(values), max(values)


def metric_change(bases: Sequence[float], cand: float) -> tuple[float | None, float]:
    """(baseline value compared with, change_pct) of a structural total (module doc, step 4).

    The value compared with is a baseline run's own: the largest when the candidate is above every
    baseline, the smallest when below, the one it equals at a bound; None when it lies strictly
    inside the range of baselines that differ (no one run is its base; change 0).
    """
    lo, hi = _range(bases)
    if cand > hi:
        return hi, (100.0 * (cand - hi) / hi if hi else math.inf)
    if cand < lo:
        return lo, 100.0 * (cand - lo) / lo
    if cand in (lo, hi):
        return cand, 0.0
    return None, 0.0


def metric_row(
    metric: str,
    bases: Sequence[float],
    cand: float,
    threshold: float,
    names: Sequence[str],
    forced: bool = False,
) -> dict[str, object]:
    """A structural total's comparison, the keys every structural row of ``diff`` starts with:
    metric, base and change_pct (:func:`metric_change`), cand, delta (cand - base; None without a
    base), delta_pct (% of base; None without one or at 0), threshold_pct (``threshold``, a fraction,
    in %), regressed (change_pct above it, never when ``forced``: not gated), varies (the baselines
    differ) and against (:func:`against_text`; ``names``: the baseline runs' names). Values in the
    metric's unit (per step)."""
    base, change = metric_change(bases, cand)
    return {
        "metric": metric,
        "base": base,
        "cand": cand,
        "delta": None if base is None else cand - base,
        "delta_pct": 100.0 * (cand - base) / base if base else None,
        "change_pct": change,
        "threshold_pct": 100.0 * threshold,
        "regressed": bool(change > 100.0 * threshold) and not forced,
        "varies": len(set(bases)) > 1,
        "against": against_text(metric, bases, cand, names),
    }


def against_text(metric: str, bases: Sequence[float], cand: float, names: Sequence[str] = ()) -> str:
    """What a structural total was compared with when the baseline runs differ (else ""):
    ``within the baselines' range 3.42-7.11 GFLOP`` or ``compared with the nearest, extra_matmul:
    7.11 GFLOP``; ``names``: the baseline runs' names in the order of ``bases`` (default
    ``baseline 1``, ...). Values in the metric's unit (:func:`traceprof.core.display.metric_text`)."""
    from traceprof.core.display import metric_text

    if len(set(bases)) < 2:
        return ""
    names = list(names) or [f"baseline {i + 1}" for i in range(len(bases))]
    base, _ = metric_change(bases, cand)
    if base is None:
        lo, hi = (metric_text(v, metric) for v in _range(bases))
        unit = lo.rsplit(" ", 1)[1] if " " in lo else ""
        if unit and hi.endswith(" " + unit):
            lo = lo.rsplit(" ", 1)[0]
        return f"within the baselines' range {lo}-{hi}"
    run = names[list(bases).index(base)]
    return f"the baseline runs differ; compared with the nearest, {run}: {metric_text(base, metric)}"


def compare(
    bases: Sequence[Structure], cand: Structure, thresholds: dict[str, float], names: Sequence[str] = ()
) -> tuple[list[dict[str, object]], pl.DataFrame]:
    """Compare the structure of a candidate run with its baseline runs (module doc, step 4).

    Args:
        bases: The baseline runs' profiles (1 or more).
        cand: The candidate's.
        thresholds: Growth per metric (fraction, 0.01 = 1 %) beyond which it is a regression.
        names: The baseline runs' names (for ``against``; default ``baseline 1``, ...).

    Returns:
        (metrics, items). ``metrics``: one dict per metric of :data:`METRICS` with the job values
        per step: metric, base (None inside the range of baselines that differ), cand, delta,
        delta_pct, change_pct, threshold_pct, regressed, varies (the baselines differ), against
        (:func:`against_text`), ranks (those whose own value is outside the baselines'
        range), per_rank (the change on each of them when it is the same on all, else None). ``items``: frame of the keys whose per-rank count, FLOPs or
        bytes per step is outside the baselines' range on some rank, with columns kind, name, sig,
        shape (:func:`shape_text`), base_calls, cand_calls, delta_calls, base_flops, cand_flops,
        delta_flops, base_bytes, cand_bytes, delta_bytes (job per step; base: on each rank the
        nearest bound of the baselines' range, as for the metrics: the baseline value when they
        agree, the nearest baseline run's when they differ), ranks (the ranks where it changed, e.g. ``[2]``), largest FLOPs change first.
    """
    metrics: list[dict[str, object]] = []
    for m in METRICS:
        values = [b.total(m) for b in bases]
        c = cand.total(m)
        if m == "flops" and (cand.flops_source is None or any(b.flops_source is None for b in bases)):
            continue  # FLOPs unknown on a side: nothing to compare
        if m == "comm_bytes" and not (cand.bytes_known and all(b.bytes_known for b in bases)):
            continue  # sizes unknown on a side: its 0 B is no measure (diff notes it)
        ranks, per_rank = _ranks_changed(bases, cand, m)
        metrics.append(
            metric_row(m, values, c, thresholds[m], names) | {"ranks": ranks, "per_rank": per_rank}
        )
    return metrics, _changed_keys(bases, cand)


def _ranks_changed(
    bases: Sequence[Structure], cand: Structure, metric: str
) -> tuple[list[int], float | None]:
    """The ranks whose value of ``metric`` is outside the baselines' range, and the change on each
    of them when it is the same on all (else None)."""
    got: dict[int, list[float]] = {}
    for b in bases:
        for r, v in b.totals.select("rank", metric).iter_rows():
            got.setdefault(r, []).append(v)
    ranks, deltas = [], set()
    for r, v in cand.totals.select("rank", metric).iter_rows():
        ref = got.get(r, [0.0])
        base, _ = metric_change(ref, v)
        if base is not None and v != base:
            ranks.append(r)
            deltas.add(v - base)
    return ranks, (deltas.pop() if len(deltas) == 1 else None)


def _changed_keys(bases: Sequence[Structure], cand: Structure) -> pl.DataFrame:
    vals = ["calls", "flops", "bytes"]
    idx = ["rank", *_KEYS]
    stacked = pl.concat([b.keys.with_columns(pl.lit(i).alias("_b")) for i, b in enumerate(bases)])
    k = len(bases)
    # a key a baseline lacks counts 0 there: min and max over the present rows and 0
    agg = stacked.group_by(idx).agg(
        *(
            pl.when(pl.len() < k)
            .then(pl.min_horizontal(pl.col(v).min(), pl.lit(0.0)))
            .otherwise(pl.col(v).min())
            .alias(f"lo_{v}")
            for v in vals
        ),
        *(
            pl.when(pl.len() < k)
            .then(pl.max_horizontal(pl.col(v).max(), pl.lit(0.0)))
            .otherwise(pl.col(v).max())
            .alias(f"hi_{v}")
            for v in vals
        ),
    )
    both = agg.join(cand.keys, on=idx, how="full", coalesce=True).with_columns(
        *(pl.col(v).fill_null(0.0) for v in vals),
        *(pl.col(f"{p}_{v}").fill_null(0.0) for p in ("lo", "hi") for v in vals),
    )
    outside = pl.any_horizontal(
        *((pl.col(v) > pl.col(f"hi_{v}")) | (pl.col(v) < pl.col(f"lo_{v}")) for v in vals)
    )
    # each (rank, key) is compared with the nearest bound of the baselines' range (as
    # :func:`metric_change` does for the totals): inside it, with itself (no change); the mean of
    # baselines that differ would quote a change (+2.67 calls) that no baseline run shows
    changed = both.with_columns(
        outside.alias("_changed"),
        *(pl.col(v).clip(pl.col(f"lo_{v}"), pl.col(f"hi_{v}")).alias(f"near_{v}") for v in vals),
    )
    job = (
        changed.group_by(_KEYS)
        .agg(
            *(pl.col(v).sum().alias(f"cand_{v}") for v in vals),
            *(pl.col(f"near_{v}").sum().alias(f"base_{v}") for v in vals),
            pl.col("rank").filter(pl.col("_changed")).sort().alias("ranks"),
        )
        .filter(pl.col("ranks").list.len() > 0)
    )
    out = job.with_columns(*((pl.col(f"cand_{v}") - pl.col(f"base_{v}")).alias(f"delta_{v}") for v in vals))
    out = out.with_columns(
        pl.struct(_KEYS)
        .map_elements(lambda r: shape_text(r["kind"], r["name"], r["sig"]), return_dtype=pl.Utf8)
        .alias("shape")
        if out.height
        else pl.lit("").alias("shape")
    )
    cols = [*_KEYS, "shape", *(f"{p}_{v}" for v in vals for p in ("base", "cand", "delta")), "ranks"]
    return out.select(cols).sort(
        pl.col("delta_flops").abs(),
        pl.col("delta_calls").abs(),
        *_KEYS,
        descending=[True, True, False, False, False],
    )
