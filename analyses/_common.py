"""Helpers shared by the analyses (not an analysis).

Range checks for parameters, called from each ``Params.__post_init__``: every check raises
:class:`traceprof.core.errors.UsageError` naming the parameter, the value given and the allowed range,
so that the CLI (``-p key=value``) and Python API users get the same message. And
:func:`whole_ns`, the one rounding of ns statistics to int64, and :func:`ratio_interval`, the one
interval of a ratio of per-step means (the what-if slowdowns). And what the findings hooks
(each spec's ``Topic``) share: names shortened, durations in words, the ranks ``stragglers`` names.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
import polars as pl

from traceprof.core.errors import UsageError
from traceprof.core.names import shorten
from traceprof.engine.activity import GRAPH_LEVEL_NOTE, GRAPH_LOST_NOTE, LAUNCH_LOST_NOTE
from traceprof.engine.analysis import FrameResult
from traceprof.engine.stepspans import step_windows  # the step account's tiling, here for analyses
from traceprof.ingest.matching import (
    absorbing_steps,
    missing_step_notes,
)  # the run's steps' one rule, here for analyses

__all__ = [
    "step_windows",
    "missing_step_notes",
    "absorbing_steps",
    "at_least",
    "fraction",
    "choice",
    "positive_or_none",
    "whole_ns",
    "ratio_interval",
    "BOOTSTRAP_REPS",
    "MIN_INTERVAL_STEPS",
    "NAME_WIDTH",
    "finding_name",
    "num",
    "ms",
    "graph_level",
    "named_ranks",
    "untested_rank",
]

#: Resamples of :func:`ratio_interval`.
BOOTSTRAP_REPS = 1000

#: Fewest steps :func:`ratio_interval` gives an interval over. With n steps a percentile bootstrap of
#: a mean has C(2n-1, n) distinct resamples (3 at n = 2, 35 at 4, 126 at 5) and a resample of one
#: step repeated has chance n^-n, above 2.5% for n <= 3: there the "95% interval" is just the
#: smallest and largest step (over 2 steps, the two step values). Its coverage of the true ratio
#: (normal steps, simulated) is 50% at 2 steps, 74% at 3, 82% at 4, 84% at 5, 92% at 10: from 5 the
#: resamples number over 100 and the low end misses about 1 time in 12, not 1 in 4.
MIN_INTERVAL_STEPS = 5


def ratio_interval(
    num: np.ndarray, den: np.ndarray, level: float = 0.95, reps: int = BOOTSTRAP_REPS, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap over steps of ``sum(num) / sum(den)`` (= mean / mean).

    Args:
        num, den: One value per step (ns), the same length N.
        level: Two-sided coverage (0.95: the 2.5th and 97.5th percentiles).
        reps: Resamples (each draws N steps with replacement).
        seed: The generator's seed: the same input gives the same interval.

    Returns:
        (low, high); (nan, nan) with fewer than :data:`MIN_INTERVAL_STEPS` steps (too few to
        resample: no interval, and no decision may rest on one) or with a zero denominator sum.
        Memory: at most about a million draws at a time, whatever N x reps; time O(N x reps).
    """
    num, den = np.asarray(num, np.float64), np.asarray(den, np.float64)
    n = len(num)
    if n < MIN_INTERVAL_STEPS or not den.sum():
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    out = np.empty(reps)
    chunk = max(1, (1 << 20) // n)
    for at in range(0, reps, chunk):
        k = min(chunk, reps - at)
        idx = rng.integers(0, n, size=(k, n))
        d = den[idx].sum(axis=1)
        out[at : at + k] = np.divide(num[idx].sum(axis=1), d, out=np.full(k, np.nan), where=d != 0)
    tail = 100 * (1 - level) / 2
    lo, hi = np.nanpercentile(out, [tail, 100 - tail])
    return float(lo), float(hi)


def whole_ns(x: pl.Expr) -> pl.Expr:
    """A statistic of ns values (mean, median, percentile) as int64 ns, halves rounded away from
    zero as DuckDB's ``round`` does (``round(x)::BIGINT``)."""
    return x.round(0, mode="half_away_from_zero").cast(pl.Int64)


def _finite(name: str, value: float) -> float:
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise UsageError(f"{name}={value!r}: expected a number") from None
    if not math.isfinite(x):
        raise UsageError(f"{name}={value!r}: expected a finite number")
    return x


def at_least(name: str, value: float, low: float = 0, meaning: str = "") -> None:
    """``value`` must be a finite number >= ``low``; ``meaning`` explains the boundary value."""
    if _finite(name, value) < low:
        extra = f" ({meaning})" if meaning else ""
        raise UsageError(f"{name}={value!r}: must be >= {low:g}{extra}")


def fraction(name: str, value: float) -> None:
    """``value`` must be a finite number in [0, 1]."""
    if not 0.0 <= _finite(name, value) <= 1.0:
        raise UsageError(f"{name}={value!r}: must be between 0 and 1")


def choice(name: str, value: str, allowed: Iterable[str]) -> None:
    """``value`` must be one of ``allowed``."""
    allowed = list(allowed)
    if value not in allowed:
        raise UsageError(f"{name}={value!r}: choose one of {', '.join(allowed)}")


def positive_or_none(name: str, value: float | str | None) -> float | None:
    """None (not given), or a finite number > 0 (a string is converted: the CLI passes one for
    parameters whose default is None). Returns the number."""
    if value is None:
        return None
    x = _finite(name, value)  # type: ignore[arg-type]
    if x <= 0:
        raise UsageError(f"{name}={value!r}: must be a finite number > 0")
    return x


# -- findings hooks (each analysis' ``Topic``): what several of them read -------------------------

#: Kernel and op names longer than this may be shortened to their family in a finding's text
#: (:func:`finding_name`).
NAME_WIDTH = 60


def finding_name(name: str) -> str:
    """A kernel or op name as a finding's text shows it: whole (searchable), unless its short form
    (:func:`traceprof.core.names.shorten` to :data:`NAME_WIDTH`) is at most half as long: a
    1,000-character template kernel shows its family, but a 61-character op is not cut to 60
    (``evaluate_function: Co…iledFunctionBackward``)."""
    short = shorten(name, NAME_WIDTH)
    return short if 2 * len(short) <= len(name) else name


def num(v: object) -> float:
    """A polars scalar (sum, mean, median) as float; null as 0."""
    return float(v) if isinstance(v, int | float) else 0.0


def ms(ns: float) -> str:
    """``ns`` in human units for a finding's text (``traceprof.core.display.duration``: ``12.3 ms``)."""
    from traceprof.core.display import duration

    return duration(ns)


def graph_level(res: FrameResult) -> bool:
    """Whether an analysis noted GPU records that stand for whole CUDA graphs (``traceprof.engine.activity``)."""
    return GRAPH_LEVEL_NOTE in res.notes


def graph_lost(res: FrameResult) -> str:
    """An analysis's note on CUDA graph launches with no GPU record (``traceprof.engine.activity``), or ""."""
    return next((n for n in res.notes if n.startswith(GRAPH_LOST_NOTE)), "")


def launches_lost(res: FrameResult) -> str:
    """An analysis's note on kernel launches with no GPU record beyond ``idle``'s threshold
    (``traceprof.engine.activity.unmatched_launch_notes``), or ""."""
    return next((n for n in res.notes if n.startswith(LAUNCH_LOST_NOTE)), "")


def named_ranks(res: dict[str, FrameResult]) -> list[int]:
    """The ranks the ``stragglers`` analysis names in ``res`` (results by analysis name), and those it
    reports as part of a slow stage or replica (``slow_group``): their lateness is the straggler
    finding's either way."""
    st = res.get("stragglers")
    if st is None or "verdict" not in st.frames() or st.frames()["verdict"].is_empty():
        return []
    v = st.frames()["verdict"]
    late = (
        pl.col("named") | pl.col("slow_group").is_not_null() if "slow_group" in v.columns else pl.col("named")
    )
    return [int(r) for r in v.filter(late)["rank"]]


def untested_rank(res: dict[str, FrameResult]) -> int | None:
    """The rank ``stragglers`` could not judge for too few collectives or steps (its verdict row
    with status inconclusive and a rank: the one last most often, or a suspect whose cause could
    not be tested), or None: a straggler neither named nor ruled out."""
    st = res.get("stragglers")
    if st is None or "verdict" not in st.frames():
        return None
    v = st.frames()["verdict"].filter((pl.col("status") == "inconclusive") & pl.col("rank").is_not_null())
    return int(v["rank"][0]) if v.height else None
