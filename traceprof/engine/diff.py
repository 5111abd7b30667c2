"""The regression gate: a candidate run against one or more baseline runs, in two layers (CI gate).

Algorithm (README.md "CI gating"):
  1. **Structural** (:mod:`traceprof.engine.structure`): per step, CPU ops and kernels by name and shape,
     model FLOPs, collectives and the bytes they move, counted exactly. A change is certain and is
     reported whatever the timing noise; ``flops``, ``launches``, ``collectives`` and
     ``comm_bytes`` are a regression when they grow past their threshold (defaults
     :data:`traceprof.engine.structure.DEFAULT_THRESHOLDS`). A total is exact only when every
     run's ranks count it the same in all their steps (:meth:`traceprof.engine.structure.Structure.exact`);
     one that differs between two steps of a rank in some run goes through step 2's noise test
     instead, its unit values the job totals per step, with a note (:func:`_varying_rows`).
  2. **Timing** (:mod:`traceprof.engine.timing`, :mod:`traceprof.engine.noise`): ``step_time_ns``,
     ``compute_ns``, ``mfu_pct`` (or ``tflops`` without a known peak), ``exposed_comm_ns``,
     ``idle_ns``. Each run's value (median over its (rank, step) samples; ``compute_ns``: the
     typical time) against the baselines' mean; ``change_pct`` is the change in the bad direction
     (up for times, down for MFU/TFLOP/s) as % of the base value, or, for the step's components
     (exposed communication, idle), as % of the base step time, so that a tiny component cannot
     trip the gate by doubling. Every metric has the noise test of :mod:`traceprof.engine.noise`: a
     timing regression needs 2+ baseline runs, a change beyond the threshold and the noise floor,
     and p < ``alpha``; with the noise above the threshold, or a change the evidence cannot
     decide, the metric is ``inconclusive``. The wall-clock metrics (all but ``compute_ns``, a
     typical time that discards preempted calls) are also ``inconclusive`` instead of a regression
     when the candidate ran under more contention than every baseline run: its compute calls'
     inflation over their per-shape medians (:attr:`traceprof.engine.timing.Timing.inflation`) above the
     largest baseline's by more than the step-time threshold.
  3. **Cause**: timing items (kernels, CPU ops, collectives: typical time per step) and each
     rank's compute are named only when their growth passes the same test against their own
     healthy spread (:func:`_grew`). A collective's time is never named as the cause of a compute
     regression (its wait is the symptom); the ranks whose compute grew are named instead.
  4. Verdict: ``regression`` when a structural or a timing metric regressed (exit 3), else
     ``inconclusive`` when a timing metric is (exit 4), else ``ok`` (exit 0); the one-line summary
     that says so is :mod:`traceprof.engine.difftext`'s.

Ranks: when the runs' ranks with ProfilerSteps differ (a rank's trace missing, ``runs.world_size``
less ``traces.rank``), everything is compared over the ranks every run has (the timing items too:
computed again over those ranks, ``timing.item_frames``), with a first note naming what each run lacks; with no rank in common the structural metrics are ``inconclusive``
(:func:`_on_common_ranks`). A missing trace is not less work per step.

Only comparable runs are diffed: both on GPUs or both CPU-only (a run is a GPU run when it has
kernels, memcpys or memsets), and the same world size when both runs record one. Per-rank step
times of a different device or job size differ by design, not by regression (UsageError).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import ClassVar

import numpy as np
import polars as pl

from traceprof.core.errors import TraceprofError, UsageError
from traceprof.core.names import shorten
from traceprof.engine import analysis as registry
from traceprof.engine import dropped, noise, structure, timing
from traceprof.engine.analysis import Chart, FrameResult
from traceprof.engine.difftext import UNEVEN, structural_reason, summary_line
from traceprof.engine.timing import typical_items
from traceprof.ingest.matching import run_missing_step_notes
from traceprof.storage import comparable
from traceprof.storage.baselines import resolve
from traceprof.storage.runs import rank_list, run_label, untraced_ranks
from traceprof.storage.store import Store

__all__ = [
    "DEFAULT_THRESHOLD",
    "DEFAULT_ALPHA",
    "METRICS",
    "EXIT_CODES",
    "MIN_ITEM_SHARE_PCT",
    "RunProfile",
    "DiffResult",
    "diff_runs",
    "run_profile",
    "compare_profiles",
    "thresholds",
    "typical_items",
    "MEMORY_METRIC",
    "MEMORY_THRESHOLD",
    "MemoryProfile",
    "memory_profile",
]

#: Default relative threshold of every timing metric (10 %); see README "CI gating" for how it was chosen.
DEFAULT_THRESHOLD = 0.10
#: Significance level of the timing test.
DEFAULT_ALPHA = 0.01
#: Timing metrics: name -> (higher is worse, measured relative to the base step time).
METRICS: dict[str, tuple[bool, bool]] = {
    "step_time_ns": (True, False),
    "compute_ns": (True, False),
    "mfu_pct": (False, False),
    "tflops": (False, False),
    "exposed_comm_ns": (True, True),
    "idle_ns": (True, True),
    "peak_mem_bytes": (True, False),  # structural when allocations are deterministic (see _memory_rows)
}
#: Exit code of each verdict (``traceprof diff``); 1 is an input or usage error.
EXIT_CODES = {noise.OK: 0, noise.REGRESSION: 3, noise.INCONCLUSIVE: 4}
#: An item can be a cause only when it rose by at least this share of the base step time.
MIN_ITEM_SHARE_PCT = 1.0


#: ``(run_id, ranks) -> frames``: a run's timing item frames over some of its ranks
#: (:func:`traceprof.engine.timing.item_frames` with the store bound).
Regather = Callable[[int, frozenset[int]], dict[str, pl.DataFrame]]


@dataclass(frozen=True)
class RunProfile:
    """What the gate reads of one run: its structure and timing (computed once per run)."""

    run_id: int
    name: str
    gpu: bool
    world_size: int | None
    structure: structure.Structure
    timing: timing.Timing
    memory: MemoryProfile | None = None
    #: Ranks of the job (0..world_size-1) that no trace of the run holds
    #: (:func:`traceprof.storage.runs.untraced_ranks`).
    untraced: tuple[int, ...] = ()
    #: One note per rank that lacks steps other ranks of the run have
    #: (:func:`traceprof.ingest.matching.run_missing_step_notes`).
    lost_steps: tuple[str, ...] = ()
    #: The collectives a traced rank dropped inside its traced window
    #: (:func:`traceprof.engine.dropped.dropped`); None: not looked for (a profile built by hand).
    dropped: pl.DataFrame | None = None

    @property
    def ranks(self) -> frozenset[int]:
        """The ranks with ProfilerSteps (those the structural and timing profiles cover)."""
        return frozenset(self.structure.totals["rank"].to_list())


def run_profile(
    store: Store,
    run_id: int,
    mfu_options: dict[str, str] | None = None,
    cache: dict[int, RunProfile] | None = None,
) -> RunProfile:
    """The :class:`RunProfile` of run ``run_id`` (from ``cache`` when it holds it; stored there).

    Raises:
        AnalysisError: The run has no ProfilerSteps.
        UsageError: Bad ``mfu_options``.
    """
    if cache is not None and run_id in cache:
        return cache[run_id]
    kind = comparable.kind_of(store, run_id)
    p = RunProfile(
        run_id,
        kind.name,
        kind.gpu,
        kind.world_size,
        structure.profile(store, run_id),
        timing.profile(store, run_id, mfu_options),
        memory_profile(store, run_id),
        untraced_ranks(store, run_id)[0],
        tuple(run_missing_step_notes(store, run_id)),
        dropped.dropped(store, run_id),
    )
    if cache is not None:
        cache[run_id] = p
    return p


@dataclass(frozen=True)
class DiffResult(FrameResult):
    """The gate's verdict, its metrics (``frame``), the structural changes, the timing items, each
    rank's compute, and the one-line summary.

    ``frame`` columns: metric, layer (structural, timing), base (the baselines' value: timing, their
    mean; structural, the nearest baseline run's value, null when the candidate lies inside the range
    of baselines that differ), cand, delta (units of the metric: ns, %,
    TFLOP/s, FLOPs, calls, bytes per step), delta_pct (% of base), change_pct (% change in the bad
    direction, see module doc), threshold_pct, noise_pct (timing: the noise floor, % of the same
    scale as change_pct), p_value, base_runs, n_base, n_cand (samples), verdict (ok, inconclusive,
    regression), regressed, reason.
    ``structure``: :func:`traceprof.engine.structure.compare`'s changed keys.
    ``items`` columns: kind (kernel, op, collective), name, class (compute, comm, memory), base_ns,
    cand_ns (typical ns per rank-step, over the ranks every run traced), delta_ns, delta_pct (% of the item's base; null when new),
    share_of_step_pct (delta as % of the base step time), noise_pct (its noise floor, % of the base
    step time), p_value, base_calls, cand_calls (per step), grew (named as a cause).
    ``ranks`` columns: rank, base_ns, cand_ns, delta_ns (typical compute per step), change_pct,
    noise_pct, p_value, grew.
    """

    items: pl.DataFrame = field(default_factory=pl.DataFrame)
    structure: pl.DataFrame = field(default_factory=pl.DataFrame)
    ranks: pl.DataFrame = field(default_factory=pl.DataFrame)
    verdict: str = noise.OK
    layers: tuple[str, ...] = ()
    summary: str = ""
    baseline: str = ""
    title: ClassVar[str] = "Regression diff"

    @property
    def regressed(self) -> bool:
        """Whether the verdict is ``regression``."""
        return self.verdict == noise.REGRESSION

    @property
    def exit_code(self) -> int:
        """0 ok, 3 regression, 4 inconclusive (:data:`EXIT_CODES`)."""
        return EXIT_CODES[self.verdict]

    def frames(self) -> dict[str, pl.DataFrame]:
        top = (
            self.items.head(15)
            .with_row_index("rank", 1)
            .select(
                (pl.col("rank").cast(pl.Utf8) + ". " + pl.col("name").str.slice(0, 32)).alias("label"),
                pl.exclude("rank"),
            )
        )  # short, unique chart labels: kernel names run to hundreds of characters
        return {
            "frame": self.frame,
            "structure": self.structure,
            "items": self.items,
            "ranks": self.ranks,
            "top": top,
        }

    def to_dict(self) -> dict[str, object]:
        """The verdict, summary, notes, metrics, structural changes, items and ranks as JSON-ready values."""
        metrics = [
            {
                k: int(v)
                if k in ("base", "cand", "delta")
                and str(m["metric"]).endswith("_ns")
                and v is not None
                and math.isfinite(v)
                else v
                for k, v in m.items()
            }
            for m in self.frame.to_dicts()
        ]
        return {
            "verdict": self.verdict,
            "regressed": self.regressed,
            "exit_code": self.exit_code,
            "layers": list(self.layers),
            "baseline": self.baseline,
            "summary": self.summary,
            "notes": list(self.notes[1:]),
            "metrics": metrics,
            "structure": self.structure.to_dicts(),
            "items": self.items.to_dicts(),
            "ranks": self.ranks.to_dicts(),
        }

    def charts(self) -> list[Chart]:
        # One series (the change) on a plain categorical axis: the report rotates its labels, which
        # it cannot do for the group labels of grouped base/cand bars (they overlapped).
        return [
            Chart(
                "Largest changes: typical time per step, candidate minus base",
                "label",
                ("delta_ns",),
                frame="top",
            )
        ]


def thresholds(given: dict[str, float]) -> dict[str, float]:
    """Every metric's threshold: ``*`` sets the timing metrics, a metric's name sets it (fractions).

    Raises:
        UsageError: An unknown metric, or a value outside (0, 1].
    """
    out = {
        **dict.fromkeys(METRICS, given.get("*", DEFAULT_THRESHOLD)),
        **structure.DEFAULT_THRESHOLDS,
        MEMORY_METRIC: MEMORY_THRESHOLD,
    }
    for key, value in given.items():
        if key != "*" and key not in out:
            raise UsageError(f"--threshold {key}=...: no such metric; metrics: {', '.join(out)}")
        if not 0 < value <= 1:
            raw = f"{value:g}" if key == "*" else f"{key}={value:g}"
            raise UsageError(f"-t {raw}: thresholds are fractions in (0, 1] (0.05 = 5%)")
        if key != "*":
            out[key] = value
    return out


def diff_runs(
    store: Store,
    base: str | Sequence[str],
    cand: str,
    thresholds_: dict[str, float] | None = None,
    alpha: float = DEFAULT_ALPHA,
    mfu_options: dict[str, str] | None = None,
    force: bool = False,
    cache: dict[int, RunProfile] | None = None,
) -> DiffResult:
    """Compare run ``cand`` with the baseline run(s) ``base`` (module doc).

    Args:
        store: An open store holding the runs.
        base: A baseline spec (:mod:`traceprof.storage.baselines`: a run, ``a,b,c``, or a baseline set),
            or a list of them.
        cand: Candidate run name or id.
        thresholds_: Relative threshold per metric (0.1 = 10 %); key ``*`` sets every timing metric.
        alpha: Significance level of the timing test.
        mfu_options: Parameters of the ``mfu`` analysis (e.g. ``peak_tflops``), for every run.
        force: Compare runs that are not comparable anyway: each timing metric's samples are then
            the per-rank medians over steps (ranks, not rank-steps, are the samples), and the
            structural metrics are shown but not gated (another device kind or job size counts
            other things per step), with a note.
        cache: Run profiles computed already (:func:`run_profile`), filled as runs are profiled.

    Raises:
        StoreError: No such run or baseline set.
        UsageError: A threshold for an unknown metric, or one outside (0, 1]; runs that are not
            comparable (GPU vs CPU-only, different world sizes) unless ``force``; bad ``mfu_options``;
            a baseline that holds no run besides ``cand`` (a run is no baseline of itself).
        AnalysisError: A run without ProfilerSteps.
    """
    limits = thresholds(thresholds_ or {})
    cand_id = store.resolve_run(cand)
    bl = resolve(store, base)
    ids = [i for i in bl.run_ids if i != cand_id]
    if not ids:  # a run against itself always passes: a CI gate that did this would never fail
        raise UsageError(
            f"{run_label(store, cand_id)} is the only run of the baseline {bl.label!r}: a run is no "
            "baseline of itself; diff against other runs of the job (a named set: traceprof baseline add "
            "NAME RUN...)"
        )
    notes = [
        f"run {name!r} is named more than once in the baseline: counted once (a run is one sample of the "
        "baseline's noise, not several)"
        for name in bl.repeated
    ]
    if len(ids) < len(bl.run_ids):
        notes.append(f"{run_label(store, cand_id)} is in the baseline {bl.label!r}: left out of it")
    cache = {} if cache is None else cache
    bases = [run_profile(store, i, mfu_options, cache) for i in ids]
    c = run_profile(store, cand_id, mfu_options, cache)
    label = bl.label if len(bl.run_ids) == len(ids) else ",".join(b.name for b in bases)
    return compare_profiles(bases, c, limits, alpha, force, label, notes, partial(timing.item_frames, store))


def _check_comparable(bases: Sequence[RunProfile], cand: RunProfile) -> None:
    """Raise UsageError when the runs are not comparable (:func:`traceprof.storage.comparable.differences`:
    one on GPUs and another CPU-only, or their world sizes differ)."""

    def kind(p: RunProfile) -> comparable.Kind:
        return comparable.Kind(p.name, p.gpu, p.world_size)

    why = comparable.differences([kind(b) for b in bases], kind(cand))
    if why:
        names = ", ".join(repr(b.name) for b in bases)
        raise UsageError(
            f"runs {names} and {cand.name!r} are not comparable ({'; '.join(why)}): "
            "diff runs of the same job on the same kind of device, or pass --force to "
            "compare per-rank medians anyway"
        )


def _per_rank(samples: pl.DataFrame) -> pl.DataFrame:
    return (
        samples.group_by("rank")
        .agg(pl.exclude("step").median())
        .with_columns(pl.lit(0).alias("step"))
        .sort("rank")
    )


def compare_profiles(
    bases: Sequence[RunProfile],
    cand: RunProfile,
    limits: dict[str, float],
    alpha: float = DEFAULT_ALPHA,
    force: bool = False,
    label: str = "",
    notes: Sequence[str] = (),
    regather: Regather | None = None,
) -> DiffResult:
    """The gate on run profiles computed already (module doc); what :func:`diff_runs` returns.

    Args:
        bases: The baseline runs (1 or more).
        cand: The candidate.
        limits: Every metric's threshold (:func:`thresholds`).
        alpha: Significance level of the timing test.
        force: Compare runs that are not comparable, by per-rank medians (see :func:`diff_runs`).
        label: How messages name the baseline (default: the run names joined by commas).
        notes: Notes to add.
        regather: ``(run_id, ranks) -> frames`` (``functools.partial(timing.item_frames, store)``):
            when the runs' ranks differ, each run's timing items, per-step and per-rank compute are
            computed again over the common ranks (their medians per shape count those ranks'
            calls only); None: those stay over each run's own ranks, and a note says so.

    Raises:
        UsageError: The runs are not comparable and not ``force``.
    """
    label = label or ",".join(b.name for b in bases)
    notes = list(notes)
    try:
        _check_comparable(bases, cand)
        forced = False
    except UsageError as e:
        if not force:
            raise
        forced = True
        notes.append(
            f"forced (--force): {str(e).split(': diff runs')[0]}; each metric compares per-rank medians over steps"
        )
    k = len(bases)
    blind = ""
    if not forced:  # another job size (--force) has other ranks by design
        bases, cand, blind = _on_common_ranks(bases, cand, notes, regather)
    smp = [b.timing.samples for b in bases] + [cand.timing.samples]
    if forced:
        smp = [_per_rank(s) for s in smp]
    step_base = float(np.mean([timing.unit_values(s, "step_time_ns")[0] for s in smp[:-1]]))
    s_rows, s_items = structure.compare(
        [b.structure for b in bases], cand.structure, limits, [b.name for b in bases]
    )
    unsized = list(dict.fromkeys(r.name for r in (*bases, cand) if not r.structure.bytes_known))
    if unsized:
        notes.append(
            f"comm_bytes not compared: the sizes of the collectives are unknown in {', '.join(map(repr, unsized))} "
            "(bytes_in / bytes_out NULL: a trace without collective metadata), so its bytes per step are n/a"
        )
    partly = [
        f"{r.name!r} {r.structure.unsized[0]:,} of {r.structure.unsized[1]:,}"
        for r in (*bases, cand)
        if r.structure.bytes_known and r.structure.unsized[0]
    ]
    if partly:
        notes.append(
            "comm_bytes sums the collectives of known size only: unknown in "
            + ", ".join(dict.fromkeys(partly))
            + " collective(s) in steps (a trace that records no size for them)"
        )
    if forced or blind:  # other device kinds or job sizes count other things per step: shown, not gated
        s_rows = [{**r, "regressed": False} for r in s_rows]
    noisy: list[dict[str, object]] = []
    uneven: list[str] = []
    if not blind:  # a count that differs between the steps of a run is no exact count (step 1)
        noisy = _varying_rows([*bases, cand], s_rows, limits, alpha, step_base, forced, notes, uneven)
        s_rows = [r for r in s_rows if r["metric"] not in {m["metric"] for m in noisy}]
    rows = [
        {
            **_exact_row(r, k),
            "verdict": noise.INCONCLUSIVE if blind else noise.REGRESSION if r["regressed"] else noise.OK,
            "reason": (f"not gated: {blind}: " if blind else "not gated (--force): " if forced else "")
            + structural_reason(r),
        }
        for r in s_rows
    ]
    order = list(structure.METRICS)
    rows = sorted([*rows, *noisy], key=lambda r: order.index(str(r["metric"])))  # each in its place
    mem_rows = _memory_rows(bases, cand, limits[MEMORY_METRIC], alpha, step_base, forced, notes)
    rows += mem_rows
    desync_rows = _dropped_rows(bases, cand, forced, notes)
    rows += desync_rows
    busier = _contention(bases, cand, limits["step_time_ns"])
    has_mfu = all(
        s.get_column("mfu_pct").is_not_null().any() if "mfu_pct" in s.columns else False for s in smp
    )
    for name in METRICS:
        if (
            name == ("tflops" if has_mfu else "mfu_pct")
            or name == MEMORY_METRIC
            or any(name not in s.columns for s in smp)
        ):
            continue  # with MFU known, gate on it rather than on its numerator; else on TFLOP/s
        if name == "compute_ns":
            per = [(b.timing.compute_ns, _compute_units(b.timing, forced)) for b in (*bases, cand)]
            counts = [s.height for s in smp]
        else:
            per = [timing.unit_values(s, name) for s in smp]
            counts = [int(s[name].is_not_null().sum()) for s in smp]
        if any(math.isnan(v) for v, _ in per):
            continue
        rows.append(_timing_row(name, per, counts, step_base, limits[name], alpha, busier))
    metrics = pl.DataFrame(
        rows,
        schema_overrides={
            "p_value": pl.Float64,
            "delta_pct": pl.Float64,
            "noise_pct": pl.Float64,
            "n_base": pl.Int64,
            "n_cand": pl.Int64,
        },
    )
    metrics = metrics.select(
        "metric",
        "layer",
        "base",
        "cand",
        "delta",
        "delta_pct",
        "change_pct",
        "threshold_pct",
        "noise_pct",
        "p_value",
        "base_runs",
        "n_base",
        "n_cand",
        "verdict",
        "regressed",
        "reason",
    )
    items = _items(bases, cand, step_base, limits["compute_ns"], alpha)
    ranks = _rank_compute(bases, cand, limits["compute_ns"], alpha)
    verdicts = set(metrics["verdict"])
    layers = tuple(
        layer
        for layer in ("structural", "timing")
        if metrics.filter((pl.col("layer") == layer) & pl.col("regressed")).height
    )
    verdict = (
        noise.REGRESSION if layers else noise.INCONCLUSIVE if noise.INCONCLUSIVE in verdicts else noise.OK
    )
    if busier:
        notes.append(
            f"contention: {cand.name}'s compute calls took {cand.timing.inflation:.2f}x their per-shape median "
            f"time in total, the baselines' at most {max(b.timing.inflation for b in bases):.2f}x: it ran on a "
            "busier machine, so a change of its wall-clock metrics (step time, MFU, exposed communication, "
            "idle) cannot be told from the load and is not called a regression"
        )
    if k == 1 and noise.INCONCLUSIVE in verdicts:
        notes.append(
            "one baseline run: a timing change cannot be told from run-to-run variation; give 3+ baseline "
            "runs (`traceprof diff a,b,c CAND`, or a set: `traceprof baseline add NAME RUN...`)"
        )
    lacking = [p for p in (*bases, cand) if p.lost_steps]
    notes += [f"{_role(p, cand)} {p.name!r}: {n}" for p in lacking for n in p.lost_steps]
    mixed = _mixed_baselines(bases, s_rows, limits)
    if mixed:
        notes.append(mixed)
    struct_rows = s_rows + [r for r in mem_rows if r["layer"] == "structural"] + desync_rows
    summary = summary_line(
        label, cand.name, verdict, layers, metrics, struct_rows, s_items, items, ranks, k, uneven
    )
    if notes and notes[0].startswith("ranks: "):  # which ranks a run lacks: in the one line CI shows too
        summary += f" ({notes[0]})"
    if lacking:  # in the one line CI shows too: a lost step changes the samples, not the structure
        runs = ", ".join(f"{_role(p, cand)} {p.name!r}" for p in lacking)
        summary += f" (ranks lack steps in {runs}: see the notes)"
    if mixed:  # in the one line CI shows too: it explains a wide noise floor
        summary += " (the baseline runs are not one configuration: see the notes)"
    return DiffResult(
        frame=metrics,
        items=items,
        structure=s_items,
        ranks=ranks,
        verdict=verdict,
        layers=layers,
        summary=summary,
        baseline=label,
        notes=(summary, *notes),
    )


def _dropped_rows(
    bases: Sequence[RunProfile], cand: RunProfile, forced: bool, notes: list[str]
) -> list[dict[str, object]]:
    """The :data:`dropped.METRIC` row (structural, exact), only when some run dropped a collective:
    a regression (exit 3) when the candidate dropped more than every baseline run (threshold 0: one
    rank skipping a collective its peers ran is a desync, hard evidence, whatever the timing), with
    the candidate's drops in words (``text``) and a note."""
    runs = [*bases, cand]
    if all(r.dropped is None or r.dropped.is_empty() for r in runs):
        return []
    counts = [0 if r.dropped is None else r.dropped.height for r in runs]
    row: dict[str, object] = structure.metric_row(
        dropped.METRIC, counts[:-1], counts[-1], 0.0, [b.name for b in bases], forced
    )
    text = dropped.dropped_text(cand.dropped) if cand.dropped is not None else ""
    regressed = bool(row["regressed"]) and counts[-1] > max(counts[:-1])
    row = _exact_row(row | {"regressed": regressed}, len(bases), text)
    row["reason"] = (
        ("not gated (--force): " if forced else "")
        + f"{counts[-1]} dropped in {cand.name!r}, at most {max(counts[:-1])} in the baseline runs (exact)"
        + (f": {text}" if text else "")
    )
    if text:
        notes.append(f"desync in {cand.name!r}: {text}")
    return [row]


def _exact_row(row: dict[str, object], k: int, text: str | None = None) -> dict[str, object]:
    """A structural row from :func:`traceprof.engine.structure.metric_row`'s keys: exact (no noise),
    its verdict from ``regressed``; ``k`` baseline runs. ``text``: the words that name its cause, for
    a metric of the gate's own (:data:`MEMORY_METRIC`, :data:`traceprof.engine.dropped.METRIC`: no
    changed keys, no ranks); None: a total of :data:`traceprof.engine.structure.METRICS`."""
    own: dict[str, object] = {} if text is None else {"ranks": [], "per_rank": None, "text": text}
    return (
        row
        | own
        | {
            "layer": "structural",
            "noise_pct": None,
            "p_value": None,
            "base_runs": k,
            "n_base": None,
            "n_cand": None,
            "verdict": noise.REGRESSION if row["regressed"] else noise.OK,
        }
    )


def _role(p: RunProfile, cand: RunProfile) -> str:
    """``candidate`` or ``baseline``: what ``p`` is in a diff of ``cand``."""
    return "candidate" if p is cand else "baseline"


def _mixed_baselines(
    bases: Sequence[RunProfile], s_rows: Sequence[dict[str, object]], limits: dict[str, float]
) -> str:
    """A note ("" if none) when the baseline runs are not one configuration: a structural total
    (:data:`traceprof.engine.structure.METRICS`, per step) differs between two of them by more than
    its gate threshold (their smallest value as the base). Their timing spread then holds that
    difference besides run-to-run noise, and widens the noise floor every timing metric is judged by."""
    from traceprof.core.display import metric_text

    parts = []
    for r in s_rows:
        if not r["varies"]:
            continue
        metric = str(r["metric"])
        values = [b.structure.total(metric) for b in bases]
        lo, hi = min(values), max(values)
        if hi - lo > limits[metric] * lo:
            low, high = (bases[values.index(v)].name for v in (lo, hi))
            parts.append(f"{metric} {metric_text(lo, metric)} ({low}) to {metric_text(hi, metric)} ({high})")
    if not parts:
        return ""
    return (
        f"the baseline runs are not one configuration: per step, {'; '.join(parts)}; their timing spread holds "
        "that difference besides run-to-run noise and widens the noise floor: gate against runs of one "
        "configuration"
    )


def _on_common_ranks(
    bases: Sequence[RunProfile], cand: RunProfile, notes: list[str], regather: Regather | None = None
) -> tuple[list[RunProfile], RunProfile, str]:
    """The runs restricted to the ranks that every one of them traced (with ProfilerSteps), so that
    per-step job totals (sums over ranks) count the same ranks on both sides: a run that lacks a
    rank's trace is not a run that does less work. The timing items (the ``items`` table and
    ``compute_ns``) are computed again over those ranks by ``regather`` (see
    :func:`compare_profiles`). Puts first in ``notes`` which ranks each run lacks; the third value
    says why nothing can be compared when no rank is common (else ""). Linear in the profiles'
    rows (``regather``: in each run's calls)."""
    runs = [*bases, cand]
    common = frozenset.intersection(*(r.ranks for r in runs))
    if all(r.ranks == common for r in runs):
        return list(bases), cand, ""
    every = sorted(frozenset.union(*(r.ranks for r in runs)) | {x for r in runs for x in r.untraced})
    lacks = [
        f"{r.name!r} has no trace of rank{'s' if len(m) > 1 else ''} {rank_list(m)}"
        for r in runs
        if (m := [x for x in every if x not in r.ranks])
    ]
    if not common:
        blind = "no rank was traced in every run"
        notes.insert(0, f"ranks: {'; '.join(lacks)}; {blind}, so the structure cannot be compared")
        return list(bases), cand, blind
    items = (
        "and so are the per-item timings (items)"
        if regather is not None
        else "the per-item timings (items) are over each run's own ranks"
    )
    notes.insert(
        0,
        f"ranks: {'; '.join(lacks)}; compared on the ranks every run traced ({rank_list(sorted(common))}) "
        f"only: per-step totals are over those ranks, {items}",
    )

    def on(p: RunProfile) -> RunProfile:
        keep = pl.col("rank").is_in(sorted(common))
        s, t = p.structure, p.timing
        if regather is not None and p.ranks != common:  # a run with more ranks: its items again
            f = regather(p.run_id, common)
            t = replace(
                t,
                items=f["items"],
                item_steps=f["item_steps"],
                compute_steps=f["compute_steps"],
                compute_ranks=f["compute_ranks"],
                inflation=float(f["inflation"]["inflation"][0]),
            )
        return replace(
            p,
            structure=structure.Structure(
                s.keys.filter(keep),
                s.totals.filter(keep),
                s.flops_source,
                None if s.per_step is None else s.per_step.filter(keep),
                s.unsized,
            ),
            timing=replace(
                t,
                samples=t.samples.filter(keep),
                compute_ranks=t.compute_ranks.filter(keep),
            ),
            memory=None if p.memory is None else MemoryProfile(p.memory.steps.filter(keep), p.memory.ops),
        )

    return [on(b) for b in bases], on(cand), ""


def _compute_units(t: timing.Timing, forced: bool) -> np.ndarray:
    by = t.compute_ranks if forced or t.compute_steps.height < 2 else t.compute_steps
    return by["compute_ns"].to_numpy()


def _contention(bases: Sequence[RunProfile], cand: RunProfile, threshold: float) -> str:
    """Why the candidate's wall-clock metrics cannot be compared (module doc, step 2), or ""."""
    most = max(b.timing.inflation for b in bases)
    if cand.timing.inflation <= most * (1.0 + threshold):
        return ""
    return (
        f"the candidate ran under more contention than every baseline run ({cand.timing.inflation:.2f}x "
        f"vs at most {most:.2f}x)"
    )


def _timing_row(
    name: str,
    per: list[tuple[float, np.ndarray]],
    counts: list[int],
    step_base: float,
    threshold: float,
    alpha: float,
    busier: str = "",
) -> dict[str, object]:
    """One timing metric's row (module doc, step 2): per run (value, unit values), baselines first;
    ``busier``: why a wall-clock metric (all but ``compute_ns``) cannot regress (:func:`_contention`)."""
    worse_up, of_step = METRICS.get(name, (True, False))  # a structural count: more is worse
    values = np.array([v for v, _ in per])
    base, cand = float(values[:-1].mean()), float(values[-1])
    if name.endswith("_ns"):
        base, cand = float(round(base)), float(round(cand))  # whole ns
    delta = cand - base
    bad = delta if worse_up else -delta
    scale = step_base if of_step else abs(base)
    n = noise.estimate([noise.spread(u) for _, u in per[:-1]], noise.spread(per[-1][1]), values[:-1])
    p = noise.p_value(bad, n)
    change = 100.0 * bad / scale if scale else (0.0 if delta == 0 else math.inf)
    floor = 100.0 * n.se / scale if n.se is not None and scale else (None if n.se is None else 0.0)
    verdict, reason = noise.judge(
        change, floor, p, n.k, 100.0 * threshold, alpha, " of the step" if of_step else ""
    )
    if verdict == noise.REGRESSION and busier and name != "compute_ns":
        verdict, reason = noise.INCONCLUSIVE, f"{reason}; but {busier}"
    return {
        "metric": name,
        "layer": "timing",
        "base": base,
        "cand": cand,
        "delta": delta,
        "delta_pct": 100.0 * delta / abs(base) if base else None,
        "change_pct": change,
        "threshold_pct": 100.0 * threshold,
        "noise_pct": floor,
        "p_value": p,
        "base_runs": n.k,
        "n_base": sum(counts[:-1]),
        "n_cand": counts[-1],
        "verdict": verdict,
        "regressed": verdict == noise.REGRESSION,
        "reason": reason,
    }


def _varying_rows(
    runs: Sequence[RunProfile],
    s_rows: Sequence[dict[str, object]],
    limits: dict[str, float],
    alpha: float,
    step_base: float,
    forced: bool,
    notes: list[str],
    uneven: list[str],
) -> list[dict[str, object]]:
    """The rows of the structural totals that are not exact (module doc, step 1): some run (baseline
    or candidate; ``runs``, the candidate last) counts the metric differently in two steps of one
    rank (:meth:`traceprof.engine.structure.Structure.exact`). Each goes through the timing layer's
    noise test, a run's unit values being its job totals per step
    (:meth:`~traceprof.engine.structure.Structure.units`), with a note naming the first such run and
    rank, and in ``uneven`` the metric with that run's odd steps
    (:meth:`~traceprof.engine.structure.Structure.odd_steps`, for the summary); ``forced``: shown, not gated. Linear in the runs' (rank, step) rows."""
    out: list[dict[str, object]] = []
    for r in s_rows:
        metric = str(r["metric"])
        varying = [p for p in runs if not p.structure.exact(metric)]
        if not varying:
            continue
        per = [(p.structure.total(metric), p.structure.units(metric)) for p in runs]
        row = _timing_row(metric, per, [len(u) for _, u in per], step_base, limits[metric], alpha)
        name, where, odd = (
            varying[0].name,
            varying[0].structure.varying(metric),
            varying[0].structure.odd_steps(metric),
        )
        row["reason"] = (
            f"{row['reason']}; {UNEVEN}" + (f" ({name!r}: {odd})" if odd else "") + ": noise-tested"
        )
        if forced and row["verdict"] == noise.REGRESSION:
            row |= {
                "verdict": noise.OK,
                "regressed": False,
                "reason": f"not gated (--force): {row['reason']}",
            }
        out.append(row)
        uneven.append(f"{metric} ({name!r}: {odd or where + ' per step on a rank'})")
        notes.append(
            f"{metric}: the steps of {name!r} count it differently ({where} per step)"
            + (f" (job totals {odd})" if odd else "")
            + ", so the median per step "
            "is no exact count: noise-tested as a timing metric, not gated as a structural change"
        )
    return out


def _grew(
    delta: float, scale: float, noise_: noise.Noise, alpha: float
) -> tuple[float | None, float | None, bool]:
    """(noise_pct, p, above its healthy spread): ``delta`` beyond its noise floor and significant."""
    p = noise.p_value(delta, noise_)
    if noise_.se is None or p is None or not scale:
        return None, p, False
    return 100.0 * noise_.se / scale, p, delta > noise_.se and p < alpha


def _items(
    bases: Sequence[RunProfile], cand: RunProfile, step_base: float, threshold: float, alpha: float
) -> pl.DataFrame:
    """Timing items (module doc, step 3): typical time per step, and whether each grew beyond its noise."""
    k = len(bases)
    runs = [*bases, cand]
    cols = ["kind", "name", "class"]
    stacked = pl.concat([r.timing.items.with_columns(pl.lit(i).alias("_r")) for i, r in enumerate(runs)])
    # per (item, run): Σ and Σ² of the per-step values (a step without the item counts 0), and the run's steps
    steps_of = [r.timing.compute_steps.height for r in runs]
    nsteps = pl.DataFrame({"_r": list(range(len(runs))), "_n": steps_of})
    st = (
        pl.concat([r.timing.item_steps.with_columns(pl.lit(i).alias("_r")) for i, r in enumerate(runs)])
        .group_by("kind", "name", "_r")
        .agg(pl.col("ns").sum().alias("_s1"), (pl.col("ns") ** 2).sum().alias("_s2"))
    )
    per = (
        stacked.join(st, on=["kind", "name", "_r"], how="left")
        .join(nsteps, on="_r")
        .with_columns(
            (pl.col("_s2").fill_null(0.0) - pl.col("_s1").fill_null(0.0) ** 2 / pl.col("_n"))
            .clip(0.0)
            .alias("_ss")
        )
    )
    rows = []
    for key, g in per.sort("_r").group_by(cols, maintain_order=True):
        got = {r: (v, c, n, ss) for r, v, c, n, ss in g.select("_r", "ns", "calls", "_n", "_ss").iter_rows()}
        b, c = (
            [got.get(i, (0.0, 0.0, steps_of[i], 0.0)) for i in range(k)],
            got.get(k, (0.0, 0.0, steps_of[k], 0.0)),
        )
        base_ns = float(np.mean([x[0] for x in b]))
        delta = round(c[0]) - round(base_ns)
        nz = noise.estimate([(x[2], x[3]) for x in b], (c[2], c[3]), [x[0] for x in b])
        floor, p, beyond = _grew(float(delta), step_base, nz, alpha)
        rows.append(
            (*key, round(base_ns), round(c[0]), float(np.mean([x[1] for x in b])), c[1], floor, p, beyond)
        )
    schema = {
        "kind": pl.Utf8,
        "name": pl.Utf8,
        "class": pl.Utf8,
        "base_ns": pl.Int64,
        "cand_ns": pl.Int64,
        "base_calls": pl.Float64,
        "cand_calls": pl.Float64,
        "noise_pct": pl.Float64,
        "p_value": pl.Float64,
        "_beyond": pl.Boolean,
    }
    both = pl.DataFrame(rows, schema=schema, orient="row")
    delta = pl.col("cand_ns") - pl.col("base_ns")
    return (
        both.with_columns(
            delta.alias("delta_ns"),
            pl.when(pl.col("base_ns") > 0)
            .then(100.0 * delta / pl.col("base_ns"))
            .otherwise(None)
            .alias("delta_pct"),
            (100.0 * delta / step_base).alias("share_of_step_pct"),
        )
        .with_columns(
            (
                (pl.col("delta_pct").fill_null(math.inf) > 100.0 * threshold)
                & (pl.col("share_of_step_pct") >= MIN_ITEM_SHARE_PCT)
                & pl.col("_beyond")
            ).alias("grew"),
        )
        .select(
            "kind",
            "name",
            "class",
            "base_ns",
            "cand_ns",
            "delta_ns",
            "delta_pct",
            "share_of_step_pct",
            "noise_pct",
            "p_value",
            "base_calls",
            "cand_calls",
            "grew",
        )
        .sort(  # ties by kind and name: one order every run
            delta.abs(), "kind", "name", descending=[True, False, False], nulls_last=True
        )
    )


def _rank_compute(
    bases: Sequence[RunProfile], cand: RunProfile, threshold: float, alpha: float
) -> pl.DataFrame:
    """Each rank's typical compute per step, and whether it grew beyond its own noise (module doc, step 3)."""
    runs = [*bases, cand]
    values = [dict(r.timing.compute_ranks.iter_rows()) for r in runs]
    units = [
        {
            key[0]: g["compute_ns"].drop_nulls().to_numpy()
            for key, g in r.timing.samples.select("rank", "compute_ns").group_by("rank")
        }
        for r in runs
    ]
    rows = []
    for rank, c_val in values[-1].items():
        if any(rank not in v for v in values[:-1]):
            continue
        b_vals = [float(v[rank]) for v in values[:-1]]
        u = [x.get(rank, np.zeros(0)) for x in units]
        base = float(np.mean(b_vals))
        nz = noise.estimate([noise.spread(x) for x in u[:-1]], noise.spread(u[-1]), b_vals)
        delta = round(c_val) - round(base)
        floor, p, beyond = _grew(float(delta), base, nz, alpha)
        change = 100.0 * delta / base if base else math.inf
        rows.append(
            (rank, round(base), round(c_val), delta, change, floor, p, beyond and change > 100.0 * threshold)
        )
    return pl.DataFrame(
        rows,
        orient="row",
        schema={
            "rank": pl.Int32,
            "base_ns": pl.Int64,
            "cand_ns": pl.Int64,
            "delta_ns": pl.Int64,
            "change_pct": pl.Float64,
            "noise_pct": pl.Float64,
            "p_value": pl.Float64,
            "grew": pl.Boolean,
        },
    ).sort("rank")


# --- peak memory (issue 35): the gate's memory metric ---------------------------------------------------
#: The metric: per step, the largest peak allocated over the ranks (``memory`` analysis, each rank's
#: primary series, the largest of its devices); a run's value is the largest over its steps, the peak
#: that can run out of memory.
MEMORY_METRIC = "peak_mem_bytes"
#: Default growth that makes it a regression (1 %: with deterministic allocations any growth is real
#: extra memory; set it by name, ``-t peak_mem_bytes=0.05``).
MEMORY_THRESHOLD = 0.01


@dataclass(frozen=True)
class MemoryProfile:
    """A run's memory for the gate.

    Attributes:
        steps: rank, step, peak_bytes: each rank's peak allocated per ProfilerStep (bytes).
        ops: op, top_op, live_bytes: bytes live at each rank's peak by allocating op, summed over ranks.
    """

    steps: pl.DataFrame
    ops: pl.DataFrame

    def rank_values(self) -> dict[int, int]:
        """Rank -> its largest step peak (bytes)."""
        return dict(self.steps.group_by("rank").agg(pl.col("peak_bytes").max()).iter_rows())

    def units(self) -> np.ndarray:
        """Per step (in step order), the largest peak over the ranks: the metric's unit values."""
        return (
            self.steps.group_by("step").agg(pl.col("peak_bytes").max()).sort("step")["peak_bytes"].to_numpy()
        )

    @property
    def value(self) -> float:
        """The run's value of :data:`MEMORY_METRIC` (bytes)."""
        return float(self.steps["peak_bytes"].max())  # type: ignore[arg-type]


def memory_profile(store: Store, run_id: int) -> MemoryProfile | None:
    """The run's :class:`MemoryProfile` from the ``memory`` analysis, or None when it recorded no
    memory (or none within ProfilerSteps)."""
    try:
        an = registry.get("memory")
        res = an.run(store, an.params(run=str(run_id)))
    except TraceprofError:
        return None
    key = ["rank", "device", "source"]
    primary = res.frame.filter(pl.col("primary")).select(key)
    steps = (
        res.frames()["steps"]
        .join(primary, on=key, nulls_equal=True)
        .filter(pl.col("step").is_not_null() & pl.col("peak_allocated_bytes").is_not_null())
        .group_by("rank", "step")
        .agg(pl.col("peak_allocated_bytes").max().alias("peak_bytes"))
    )
    if steps.is_empty():
        return None
    ops = (
        res.frames()["ops"]
        .join(primary, on=key, nulls_equal=True)
        .group_by("op", "top_op")
        .agg(pl.col("live_bytes").sum())
    )
    return MemoryProfile(steps.sort("rank", "step"), ops)


def _memory_deterministic(bases: Sequence[RunProfile]) -> bool:
    """Whether the baselines' allocations are deterministic: 2+ baseline runs whose ranks' peaks agree
    to the byte, or one in which each rank repeats its peak to the byte: all its 2+ steps, or its 2+
    steps after the first (which allocates the optimizer state, workspaces, ...)."""
    mems = [b.memory for b in bases if b.memory is not None]
    if len(mems) >= 2:
        first = mems[0].rank_values()
        return all(m.rank_values() == first for m in mems[1:])
    for _, g in mems[0].steps.sort("step").group_by("rank"):
        vals = g["peak_bytes"].to_list()  # repetition is the evidence: 2+ equal steps, the first aside or not
        if not ((len(vals) >= 2 and len(set(vals)) == 1) or (len(vals) >= 3 and len(set(vals[1:])) == 1)):
            return False
    return True


def _memory_cause(bases: Sequence[RunProfile], cand: RunProfile) -> str:
    """The op whose live bytes at the peak grew most (candidate minus the baselines' mean), or ""."""
    from traceprof.core.display import size

    k = len(bases)
    parts = [b.memory.ops.with_columns(pl.lit(-1.0 / k).alias("_w")) for b in bases if b.memory is not None]
    if cand.memory is not None:
        parts.append(cand.memory.ops.with_columns(pl.lit(1.0).alias("_w")))
    stacked = pl.concat(parts)
    grew = (
        stacked.group_by("op", "top_op")
        .agg((pl.col("live_bytes") * pl.col("_w")).sum().alias("d"))
        .filter(pl.col("d") > 0)
        .sort("d", "op", descending=[True, False], nulls_last=True)
    )
    if grew.is_empty():
        return ""
    r = grew.row(0, named=True)
    who = (
        "memory allocated before the trace"
        if r["op"] == "(before the trace)"
        else shorten(str(r["op"] or "allocations outside any CPU op"), 60)
        + (f" in {shorten(r['top_op'], 60)}" if r["top_op"] else "")
    )
    return f"{who} holds +{size(r['d'])} more at the peak"


def _memory_rows(
    bases: Sequence[RunProfile],
    cand: RunProfile,
    threshold: float,
    alpha: float,
    step_base: float,
    forced: bool,
    notes: list[str],
) -> list[dict[str, object]]:
    """The :data:`MEMORY_METRIC` row: structural (exact) when the baselines' allocations are
    deterministic (:func:`_memory_deterministic`), else through the timing layer's noise test; none
    when a side recorded no memory (with a note when only one did)."""
    have = [b.memory is not None for b in bases] + [cand.memory is not None]
    if not all(have):
        if any(have):
            notes.append(
                f"{MEMORY_METRIC} not compared: only some of the runs recorded memory (profile_memory=True)"
            )
        return []
    cause = _memory_cause(bases, cand)
    if not _memory_deterministic(bases):
        per = [(b.memory.value, b.memory.units()) for b in (*bases, cand) if b.memory is not None]
        noisy = _timing_row(MEMORY_METRIC, per, [len(u) for _, u in per], step_base, threshold, alpha)
        noisy["reason"] = (
            f"{noisy['reason']} (allocations differ between the baseline runs: noise-tested)"
            + (f"; {cause}" if cause and float(noisy["delta"]) > 0 else "")  # type: ignore[arg-type]
        )
        return [noisy]
    values = [b.memory.value for b in bases if b.memory is not None]
    c = cand.memory.value if cand.memory is not None else math.nan
    row: dict[str, object] = structure.metric_row(
        MEMORY_METRIC, values, c, threshold, [b.name for b in bases if b.memory is not None], forced
    )
    change = float(row["change_pct"])  # type: ignore[arg-type]
    row = _exact_row(row, len(bases), cause)
    reason = structural_reason(row)
    if change:
        reason += "; allocations are deterministic (the baselines' peaks agree to the byte)" + (
            f"; {cause}" if cause and change > 0 else ""
        )
    row["reason"] = ("not gated (--force): " if forced else "") + reason
    return [row]
