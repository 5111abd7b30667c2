"""Calibration of the regression gate: how often it cries wolf, and how often it catches an injected change.

:func:`diff_rates` runs the gate (:func:`traceprof.engine.diff.compare_profiles`) over a store's runs:

- **A/A** (healthy vs healthy): with one baseline run, every ordered pair of healthy runs; with
  ``k`` baseline runs, every healthy run against every ``k``-subset of the other healthy runs
  (at most ``max_sets`` per candidate, drawn with a fixed seed, so the figures are reproducible).
  Every ``regression`` here is a false alarm.
- **Injected** runs (a rank slowed, extra compute): each against every healthy baseline (and
  ``k``-subsets likewise), recording the verdict, which layer caught it, and whether the op the
  injection adds (``expect``, default ``aten::mm``) is named in the summary.

Each run is profiled once (:func:`traceprof.engine.diff.run_profile`); the gate itself is arithmetic on
the profiles, so thousands of diffs take minutes, not hours.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

import polars as pl

from traceprof.engine import diff as gate
from traceprof.engine.timing import item_frames
from traceprof.storage.store import Store

__all__ = ["Rates", "diff_rates"]


@dataclass(frozen=True)
class Rates:
    """What :func:`diff_rates` measured.

    Attributes:
        diffs: One row per diff: kind (``healthy`` or ``injected``), k (baseline runs), baseline
            (run names joined by commas), candidate, verdict (ok, inconclusive, regression),
            exit_code (0, 4, 3), structural (a structural metric regressed), timing (a timing
            metric regressed), named (``expect`` appears in the summary), summary.
        rates: Per (kind, k, and for injected runs the candidate): diffs, regression, inconclusive,
            ok (counts) and regression_pct, inconclusive_pct, ok_pct, named_pct (% of the diffs).
    """

    diffs: pl.DataFrame
    rates: pl.DataFrame


def _sets(pool: Sequence[str], k: int, cap: int | None, rng: random.Random) -> list[tuple[str, ...]]:
    every = list(itertools.combinations(pool, k))
    return every if cap is None or len(every) <= cap else rng.sample(every, cap)


def diff_rates(
    store: Store,
    healthy: Sequence[str],
    injected: Sequence[str] = (),
    sizes: Sequence[int] = (1, 3),
    thresholds: dict[str, float] | None = None,
    alpha: float = gate.DEFAULT_ALPHA,
    max_sets: int | None = 40,
    expect: str = "aten::mm",
    seed: int = 0,
    mfu_options: dict[str, str] | None = None,
) -> Rates:
    """A/A false-alarm rates and injected-change verdicts of the gate (module doc).

    Args:
        store: The store holding every run named.
        healthy: Names (or ids) of runs of the unchanged job (at least ``max(sizes) + 1``).
        injected: Names (or ids) of runs with a change injected.
        sizes: Baseline sizes k to measure (1: single baseline; 3: sets of three).
        thresholds: Per-metric thresholds as ``traceprof diff -t`` takes them (default: the gate's).
        alpha: Significance level of the timing test.
        max_sets: Most k-subsets per candidate for k > 1 (None: all of them).
        expect: The name the summary of an injected diff should mention.
        seed: Seed of the draw of k-subsets.
        mfu_options: Parameters of the ``mfu`` analysis.

    Returns:
        The :class:`Rates`.

    Raises:
        UsageError: Fewer healthy runs than a size needs; a bad threshold.
        StoreError: No such run.
    """
    from traceprof.core.errors import UsageError

    limits = gate.thresholds(thresholds or {})
    if len(healthy) < max(sizes) + 1:
        raise UsageError(
            f"diff_rates: {len(healthy)} healthy runs; baselines of {max(sizes)} need at least {max(sizes) + 1}"
        )
    cache: dict[int, gate.RunProfile] = {}
    prof = {
        name: gate.run_profile(store, store.resolve_run(name), mfu_options, cache)
        for name in (*healthy, *injected)
    }
    regather = partial(item_frames, store)  # runs with other ranks: items over the common ones
    rng = random.Random(seed)
    rows = []
    for k in sizes:
        for kind, cands in (("healthy", healthy), ("injected", injected)):
            for c in cands:
                pool = [h for h in healthy if h != c]
                for bset in _sets(pool, k, None if k == 1 else max_sets, rng):
                    res = gate.compare_profiles(
                        [prof[b] for b in bset], prof[c], limits, alpha, regather=regather
                    )
                    rows.append(
                        (
                            kind,
                            k,
                            ",".join(bset),
                            c,
                            res.verdict,
                            res.exit_code,
                            "structural" in res.layers,
                            "timing" in res.layers,
                            expect in res.summary,
                            res.summary,
                        )
                    )
    diffs = pl.DataFrame(
        rows,
        orient="row",
        schema={
            "kind": pl.Utf8,
            "k": pl.Int64,
            "baseline": pl.Utf8,
            "candidate": pl.Utf8,
            "verdict": pl.Utf8,
            "exit_code": pl.Int64,
            "structural": pl.Boolean,
            "timing": pl.Boolean,
            "named": pl.Boolean,
            "summary": pl.Utf8,
        },
    )
    return Rates(diffs, _rates(diffs))


def _rates(diffs: pl.DataFrame) -> pl.DataFrame:
    def agg(by: list[str]) -> pl.DataFrame:
        return diffs.group_by(by, maintain_order=True).agg(
            pl.len().alias("diffs"),
            *((pl.col("verdict") == v).sum().alias(v) for v in ("regression", "inconclusive", "ok")),
            *(
                (100.0 * (pl.col("verdict") == v).mean()).alias(f"{v}_pct")
                for v in ("regression", "inconclusive", "ok")
            ),
            (100.0 * pl.col("named").mean()).alias("named_pct"),
        )

    whole = agg(["kind", "k"]).with_columns(pl.lit("(all)").alias("candidate"))
    per = agg(["kind", "k", "candidate"]).filter(pl.col("kind") == "injected")
    return pl.concat([whole.select(per.columns), per]).sort("kind", "k", "candidate")
