"""The timing gate's noise model: how far a healthy run strays, and whether a change is beyond it.

A run's timing metric (median step time, typical compute per step, ...) differs from one healthy
run of the job to the next: on a shared machine by far more than from one step to the next within
a run (the calibration runs of README "CI gating": step time 3-12 % between steps of a run, 10-97 %
between runs). So the (rank, step) samples of one run are not independent replicates of the run,
and a test on them calls the next healthy run a regression. Here the unit of evidence is the run.

For one metric, with baseline runs B_1..B_k and a candidate C, each run R has a value v_R (the
metric of the whole run) and *unit values* u_R,1..u_R,n (the same metric per step, or per rank
when a run has one step):

  1. Within-run variance w² = Σ_R Σ_j (u_R,j - mean_j u_R,j)² / Σ_R (n_R - 1), pooled over every
     run with 2+ units (baselines and candidate): the spread between steps of a run; a run's
     value then varies by at least w² / n_R from sampling its steps.
  2. Between-run variance s_b² = the sample variance of the baseline values v_B (k >= 2): how far
     healthy runs stray from each other, machine load included.
  3. Variance of one run's value: σ_R² = max(s_b², w² / n_R) (k = 1: w² / n_R, the only estimate).
  4. The change d = v_C - mean(v_B) has standard deviation SE = sqrt(σ_C² + mean(σ_B²) / k): the
     size of a healthy-vs-healthy difference, the metric's **noise floor** (``noise_pct``: SE as
     % of the metric's scale).
  5. Significance: t = d / SE (in the bad direction), one-sided p = 1 - T_df(t) with df = k - 1
     when k >= 2 (the between-run estimate has k - 1 degrees of freedom, so 3 baseline runs test
     on 2), else the within-run degrees of freedom.
  6. Verdict (:func:`judge`), with ``change`` and ``noise`` in % of the scale and threshold T:
     ``regression`` when k >= 2, change > T, change > noise and p < alpha; else ``inconclusive``
     when there is no noise estimate (one baseline run of one step), the noise exceeds T (the gate
     cannot see a change of T; but ``ok``, "no regression", with k >= 2 where the change plus the
     noise is still under T: a faster candidate), or the change exceeds T without the evidence for a regression
     (not significant, or one baseline run: its run-to-run variance is unknown, so a change
     beyond the within-run noise may be the next run's load), or, with one baseline run, the
     candidate is better by more than T (the machine or the code changed, one baseline cannot
     say which, and a faster machine can hide a regression); else ``ok``.

Student's t distribution is computed here (regularized incomplete beta function by its continued
fraction), so the gate needs no scipy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "OK",
    "INCONCLUSIVE",
    "REGRESSION",
    "Noise",
    "t_cdf",
    "t_ppf",
    "spread",
    "estimate",
    "p_value",
    "judge",
]

OK, INCONCLUSIVE, REGRESSION = "ok", "inconclusive", "regression"


def _beta_cf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz's method)."""
    tiny, eps = 1e-300, 1e-15
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        for num in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < eps:
            break
    return h


def _beta_reg(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta function I_x(a, b) for 0 <= x <= 1."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_cf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_cf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t distribution with ``df`` > 0 degrees of freedom."""
    if math.isinf(t):
        return 1.0 if t > 0 else 0.0
    tail = 0.5 * _beta_reg(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def t_ppf(q: float, df: float) -> float:
    """The ``q`` quantile (0 < q < 1) of Student's t with ``df`` degrees of freedom (bisection)."""
    if q == 0.5:
        return 0.0
    lo, hi = -1.0, 1.0
    while t_cdf(lo, df) > q:
        lo *= 2.0
    while t_cdf(hi, df) < q:
        hi *= 2.0
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if t_cdf(mid, df) < q:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * max(1.0, abs(mid)):
            break
    return (lo + hi) / 2.0


@dataclass(frozen=True)
class Noise:
    """The noise estimate of one metric (module doc, steps 1-5), in the metric's own units.

    Attributes:
        se: Standard deviation of a healthy-vs-healthy change (the noise floor), or None when
            nothing estimates it (one baseline run with one unit per run).
        df: Degrees of freedom of the test (k - 1, or the within-run ones when k = 1).
        between: Whether the between-run variance s_b² set the floor (else the within-run one).
        k: Baseline runs.
    """

    se: float | None
    df: float
    between: bool
    k: int


def spread(units: np.ndarray) -> tuple[int, float]:
    """(n, Σ (u - mean)²) of one run's unit values: what :func:`estimate` needs of them."""
    u = np.asarray(units, dtype=float)
    return len(u), float(((u - u.mean()) ** 2).sum()) if len(u) else 0.0


def estimate(
    base: Sequence[tuple[int, float]], cand: tuple[int, float], base_values: Sequence[float] | np.ndarray
) -> Noise:
    """Noise of the change of one metric between baseline runs and a candidate (module doc).

    Args:
        base: Per baseline run, :func:`spread` of its unit values (per step, or per rank).
        cand: :func:`spread` of the candidate's unit values.
        base_values: Each baseline run's value of the metric, shape (k,).

    Returns:
        The :class:`Noise`; ``se`` None when neither a between-run (k >= 2) nor a within-run
        (some run with 2+ units) estimate exists.
    """
    runs = [*base, cand]
    df_w = sum(n - 1 for n, _ in runs if n >= 2)
    w2 = sum(ss for n, ss in runs if n >= 2) / df_w if df_w else None
    k = len(base_values)
    sb2 = float(np.var(np.asarray(base_values, dtype=float), ddof=1)) if k >= 2 else None
    if w2 is None and sb2 is None:
        return Noise(None, 0.0, False, k)

    def run_var(n: int) -> float:
        within = w2 / max(n, 1) if w2 is not None else 0.0
        return max(sb2, within) if sb2 is not None else within

    var = run_var(cand[0]) + sum(run_var(n) for n, _ in base) / k / k
    between = sb2 is not None and sb2 >= (w2 or 0.0) / max(cand[0], 1)
    return Noise(math.sqrt(var), float(k - 1 if k >= 2 else df_w), between, k)


#: The reason of an ``ok`` metric whose noise is above the threshold but whose change plus its noise is below it.
NO_REGRESSION = "no regression"


def judge(
    change_pct: float,
    noise_pct: float | None,
    p: float | None,
    k: int,
    threshold_pct: float,
    alpha: float,
    of: str = "",
) -> tuple[str, str]:
    """The verdict of one metric and why (module doc, step 6).

    Args:
        change_pct: Change in the bad direction, % of the metric's scale.
        noise_pct: The noise floor (:attr:`Noise.se`) as % of the same scale, or None.
        p: One-sided p-value of the change (None without a noise estimate).
        k: Baseline runs.
        threshold_pct: The user's threshold, %.
        alpha: Significance level.
        of: What the % is of where it is not the metric's own value (``" of the step"``).

    Returns:
        (verdict, reason): ``ok``, ``inconclusive`` or ``regression``, and a short reason. The change
        is worded by its direction, ``worse by 3.6%`` / ``better by 2.0% of the step``, never as a
        signed %: the summary line and ``delta_pct`` give the metric's own sign (TFLOP/s -3.6 % is
        worse by 3.6 %).
    """
    if noise_pct is None or p is None:
        return INCONCLUSIVE, "too little data for a noise estimate (one baseline run, one sample per run)"
    change = (
        f"{'worse' if change_pct > 0 else 'better'} by {abs(change_pct):.1f}%{of}"
        if change_pct
        else "unchanged"
    )
    if k >= 2 and change_pct > threshold_pct and change_pct > noise_pct and p < alpha:
        return REGRESSION, f"{change} > threshold {threshold_pct:g}% and noise {noise_pct:.1f}%, p={p:.2g}"
    if noise_pct > threshold_pct:
        # two or more baseline runs (one cannot tell the code from the machine, below) and the change
        # stays under the threshold even one noise SE worse: no regression (a faster candidate)
        if k >= 2 and change_pct + noise_pct < threshold_pct:
            return OK, (
                f"{NO_REGRESSION}: {change}, noise {noise_pct:.1f}%: +1 SE {change_pct + noise_pct:+.1f}%{of} "
                f"< threshold {threshold_pct:g}%"
            )
        return INCONCLUSIVE, f"noise {noise_pct:.1f}% > threshold {threshold_pct:g}%"
    if change_pct > threshold_pct:
        if k < 2:
            return (
                INCONCLUSIVE,
                f"{change} > threshold {threshold_pct:g}%; one baseline run cannot tell it from run-to-run variation",
            )
        return INCONCLUSIVE, f"{change} > threshold {threshold_pct:g}% but not significant (p={p:.2g})"
    if k < 2 and -change_pct > threshold_pct:
        return INCONCLUSIVE, (
            f"{change}: the runs differ by more than the threshold {threshold_pct:g}%; one baseline run "
            "cannot tell the code from the machine"
        )
    return OK, f"{change} within threshold {threshold_pct:g}%, noise {noise_pct:.1f}%"


def p_value(delta: float, noise: Noise) -> float | None:
    """One-sided p-value of a change ``delta`` (bad direction, metric units) under ``noise``."""
    if noise.se is None:
        return None
    if noise.se == 0.0:
        return 0.0 if delta > 0 else 1.0
    if noise.df <= 0:
        return None
    return 1.0 - t_cdf(delta / noise.se, noise.df)
