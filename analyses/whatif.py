"""whatif: how fast would each step be without stragglers, and who accounts for the difference.

Following "Understanding Stragglers in Large Model Training Using What-if Analysis" (OSDI'25,
arXiv 2505.05713) and its artifact (ByteDance-Seed/StragglerAnalysis): replay every step on its
dependency graph with each operation's time replaced by the typical one, and compare.

Algorithm:
  1. Items and graph (``traceprof.analyses._replay``): per rank and step, top-level compute intervals and
     the rank's matched collectives; an item depends on the earlier items of its rank that ended
     before it started; a collective starts at its last arrival. The profiler-start transient
     (``_replay.transient``) is left out: its steps are dropped, with a note. Where the run's
     clocks form sets that could not be aligned to each other (pipeline stages on hosts linked
     by send / recv only: ``traceprof.engine.arrivals.clock_sets``), the links between the sets
     are left out (their arrivals are on different clocks; a note) and each set's step is
     measured on its own clock from its own first item (``_replay.build``'s ``clock_sets``): a
     step's time is its longest set's, a lower bound of the job's (the time from one set to the
     next is not measurable), never the clocks' offset.
  2. Every item has a gap (unexplained host time before it, the artifact's "launch delay") and a
     duration (compute: its length; collective: transfer = end - last arrival, at least 0).
     Typical values over the items with the same pooling key (name and ordinal in the step;
     collectives: op, group class, size and ordinal), over ranks and steps (``pool=all``, the
     artifact's pooling) or over ranks within each step (``pool=step``); ``pool=auto`` (default):
     ``step`` where the steps do different work (:func:`_steps_differ`: the mean compute time of a
     step over its ranks varies from step to step more than :data:`STEP_WORK_SPREAD` times the
     noise, and by more than :data:`STEP_WORK_MIN_PCT` (2.5%) of a rank's step; steps of different
     lengths, e.g. varying sequence lengths), else ``all``: pooled over
     steps, each long step's ops would sit above their ideal on every rank and the step's excess be
     blamed on whichever rank is a hair later (a 10 us late rank cost 10.3% with steps of
     700/1000/1300 us, not 0.5%). The noise is what is left of each rank's compute time per step
     once its step's mean and its rank's mean are taken out (the residual of the two-way fit step +
     rank, as in a two-way analysis of variance; its mean square estimates the noise's variance
     without bias, so noise alone keeps the step means' spread below it): a rank late by the same
     time in every step, the straggler the replay is there to price, is its rank's mean and counts
     for none of it, however late and however many such ranks. The spread across a step's ranks
     counted its lateness as noise: with 2 ranks of 700/1000/1300 us steps, rank 1 late over 122 us
     (12% of a step) pooled them over all steps (140 us: S 1.185, rank 1 cost 14.8%, for 1.080 and
     7.1% by hand). A robust spread across ranks does not help where it matters: the median absolute
     deviation of two ranks is half their difference, the lateness itself; leaving out each step's
     slowest rank leaves 2 ranks nothing to measure, takes the top of the noise from the others
     (noise alone then reads low) and still counts a second late rank. Lateness that comes and goes
     from step to step (a rank x step interaction) is all residual too: the noise is the smaller of
     that and a robust residual, each rank's median step taken out and the median absolute residual
     (:func:`_noise`; 2 ranks of those steps, rank 1 300 us late in 5 of 9: 111.8 us, pooled over
     all steps, S 1.189; robust 0: within steps, S 1.094 as by hand), and a step's work is its
     median over ranks, not its mean (one rank of 4 stalled in one step of 5 is no step of more work).
     The 2.5%:
     pooled over steps, the longer steps' excess over the mean (on average at most half the standard
     deviation) is what a rank that is last in them can be blamed for, so under it at most 1.25% of a
     step, about the 1% a straggler must cost (``stragglers``' ``min_cost_pct``); the artifact's ST
     trace (2.0%, 3.8x its noise: S 1.182 pooled over all steps as published, 1.166 within steps)
     and 4 ranks drifting 0-40 us together on 1000 us steps (2.0%, 16x: S 1.008, no rank over
     0.65%) stay pooled over all steps, with or without a rank late 30 us in every step. Ideal value
     (``ideal``): ``mean`` (default, the artifact): compute durations at their **mean**, transfers
     and gaps at their **median** (medians for compute would drop a slow worker from the ideal
     entirely: on the artifact's AR and ST traces they overstate S by 8-13%); ``median``: every
     value at its median; ``min``: the smaller of its own value and the median (ideal <= replay
     by construction; S an upper bound).
  3. Replays (step time = latest end - earliest start of the step): ``replay_ns`` with the
     recorded gaps and durations (checks the model against ``actual_ns``); ``nogap_ns`` with the
     recorded durations and no gaps; ``typgap_ns`` with the recorded durations and every gap at
     its median; ``ideal_ns`` with the ideal durations and, with the default ``gaps=zero``, no
     gaps (``gaps=median``: median gaps).
  4. S (``slowdown``), the artifact's blocking slowdown: mean(nogap) / mean(ideal) with
     ``gaps=zero``, each step's ideal capped at its nogap time (one stalled step lifts the pooled
     means, so the other steps' ideals would exceed them and hide the stall: g_onestep, one step
     of 20 stalled 12 ms, gave 1.263 uncapped, 1.378 capped; no step of the artifact's traces is
     capped); mean(actual) / mean(ideal) with ``gaps=median``. Host time, two figures:
     the artifact's launch slowdown mean(actual) / mean(nogap), what *all* untraced host time
     costs (the GPU waiting for the CPU on every rank alike counts), and the host-gap slowdown
     mean(replay) / mean(typgap), what host gaps that *differ across ranks* cost (a rank that
     sleeps, loads data or stalls; 1.0 when every rank has the same gaps). Each has a 95%
     interval, a percentile bootstrap over the steps (``_common.ratio_interval``: 1,000
     resamples, seeded; none below ``_common.MIN_INTERVAL_STEPS``, 5, steps: over 2 or 3 steps
     the "interval" is the smallest and largest step); a run is straggling (``straggling``) when
     the low end of S's or the host-gap slowdown's interval exceeds 1.1 (the paper's threshold):
     with one stalled step the interval reaches below it, and without an interval it is not. That is the slowdown alone: a problem also needs
     a cause (a rank, group or stage: ``traceprof.engine.verdict``). On the artifact's traces
     S is 1.975 (AR), 1.536 (SE), 1.182 (ST) against the published 1.973, 1.537, 1.179, and the
     launch slowdown 1.005 / 1.002 / 1.018 against 1.007 / 1.005 / 1.019. Per step slowdowns (at
     least 1; ``clamped`` where the ideal is slower than the time it is compared with) and
     ``model_slowdown`` = mean(replay) / mean(ideal). On the CPU samples the unslowed runs have
     host-gap slowdowns of 1.00-1.04 and the slowed ones 1.07-1.30; op-time noise on a shared
     few-core CPU can still lift S above 1.1 (straggler_rank3: 1.14, from ranks 0 and 2, not the
     slowed rank 3): a note then gives each rank's S alone, and ``traceprof.engine.verdict`` puts this
     next to the stragglers rule in one sentence.
  5. Blame (paper's Eq. 2 and 4), of two kinds: ``blocking``: for each rank, pipeline stage
     (when the collector records one) and op type, replay the ideal with that group's recorded
     durations put back; ``host``: replay the typical-gap run with that group's recorded gaps put
     back. A rank gets back only its items up to the collectives it arrived at last, alone, and
     those collectives' transfers (``_whatif_blame.charged``): slow ops it ran while waiting for another rank
     delayed no one (on straggler_rank2 ranks 1 and 3, never last, were charged 1.19 and 1.22 for
     op times hidden behind rank 2's sleep; now 1.00). Its slowdown over the kind's base (at least 1) says how much the group explains *on
     its own* (``excess_alone_pct``: its share of the kind's slowdown - 1, clipped to 0..100).
     Groups are not additive: two ranks that are each late at the same collective each explain it
     all alone. So, per rank and kind, what fixing it buys and who bounds the steps
     (:func:`_whatif_fix.fixes`): ``fix_slowdown``, the recorded replay (``nogap``; host: ``replay``) over the
     same with only that rank's lateness removed (each of its values above the ideal set to it;
     the others' kept, so the next latest rank still bounds a collective: ranks 1 and 3 140 and
     100 us late, 4 ranks of 700 us of work: rank 1 alone explains the whole excess, 860 -> 940 us,
     but fixing it buys 940 -> 900 us, 1.044); ``bound_pct``, each rank's saving when the ranks are
     fixed one after another (the largest fix first, then the most lateness; ranks alike in both
     together, sharing equally), % of the saving with all fixed: rank 1 50%, rank 3 50%. These
     add up to at most 100%; a note names the ranks with 1% or more. On the artifact's traces the
     largest groups are those it publishes (AR: worker 0 / stage 0, backward compute; SE: stage 1,
     backward compute, no worker above 1.2; ST: stage 3).
     Each group's replay recomputes only the nodes its put-back values reach, from the ideal
     replay (``_replay.replay_changes``: the same numbers as replaying the whole job, in time that
     grows with what changes), so the blame of every rank grows about linearly with the ranks.
  A run needs a collective matched across two or more ranks (a one-rank run has nothing to
  compare: an error, as in ``stragglers``); with only some ranks of the job traced, the replay
  covers those ranks (a note says so).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np
import polars as pl

from traceprof.analyses import _common, _replay, _whatif_blame, _whatif_fix
from traceprof.core import columns as rc
from traceprof.core.errors import AnalysisError
from traceprof.core.trim import trim
from traceprof.engine.analysis import Analysis, Chart, FrameResult, Report, RunParams, register, release_pool
from traceprof.engine.arrivals import clock_sets, unaligned_note
from traceprof.storage.runs import run_label
from traceprof.storage.store import Store

#: A run whose slowdown exceeds this is straggling (the paper's threshold).
STRAGGLING_S = 1.1
#: ``pool=auto`` pools within each step when the spread (standard deviation) of the mean compute time
#: per step across steps is over this many times the noise (:func:`_steps_differ`)...
STEP_WORK_SPREAD = 3.0
#: ... and over this % of the mean compute time of a rank's step (less is immaterial: pooling over
#: steps blames a rank for at most half the spread, 1.25% of a step, about stragglers' 1% floor).
STEP_WORK_MIN_PCT = 2.5
#: The robust noise (:func:`_noise`, 2.) counts this many times: a median absolute deviation varies
#: more from run to run than a mean square, so it reads low by chance more often. Seeded pure-noise
#: runs (20,000 each, noise 10% of a cell) go to ``pool=step`` as often as with the mean square and
#: the steps' means alone from 12 steps of 2 ranks or 9 of 3 (none either way), but more often with
#: fewer: 9 steps of 2 ranks 7 for 3, 5 steps of 2 ranks 326 for 152 (1.6% for 0.8%), 5 of 3 5 for 1.
ROBUST_MARGIN = 3.0


@dataclass(frozen=True)
class Params(RunParams):
    """``ideal``: ``mean`` (default, the OSDI'25 artifact: each compute op at its mean, each
    communication transfer at its median), ``median`` (every value at its median) or ``min`` (the
    smaller of its own value and its median: ideal <= replay, S an upper bound);
    ``pool``: ``auto`` (default: ``step`` where the steps do different work, else ``all``; module
    doc), ``all`` (over ranks and steps, as the artifact) or ``step`` (over ranks within each step); ``gaps``: ``zero`` (default: host gaps left out of both replays, S is the
    artifact's blocking slowdown) or ``median`` (gaps kept and idealized like durations: S =
    actual / ideal); ``source``: collectives source (default: the best matched one); ``eps_ns``:
    tolerance of "ended before started"; ``top_ops``: op types blamed (the most time above their ideal first, then by name)."""

    pool: str = "auto"
    gaps: str = "zero"
    ideal: str = "mean"
    source: str = ""
    eps_ns: int = _replay.EPS_NS
    top_ops: int = 12

    def __post_init__(self) -> None:
        _common.choice("pool", self.pool, ("auto", "all", "step"))
        _common.choice("gaps", self.gaps, ("zero", "median"))
        _common.choice("ideal", self.ideal, ("mean", "median", "min"))
        _common.at_least("eps_ns", self.eps_ns, 0)
        _common.at_least("top_ops", self.top_ops, 0, "0: no op types blamed")


@dataclass(frozen=True)
class Result(FrameResult):
    """Per step (``frame``), blame by group (``blame``) and the run's slowdowns (``summary``);
    their columns are declared in :data:`SPEC`."""

    blame: pl.DataFrame = field(default_factory=pl.DataFrame)
    summary: pl.DataFrame = field(default_factory=pl.DataFrame)
    title = "What-if: step time without stragglers"

    def charts(self) -> list[Chart]:
        return [
            Chart(
                "Step time: actual vs simulated without stragglers (ns)",
                "step",
                ("actual_ns", "ideal_ns"),
                ylabel="ns",
            )
        ]


def _ideal(nodes: pl.DataFrame, pool: str, ideal: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Ideal gap and duration per node (module doc, step 2): the mean (compute durations with
    ``ideal="mean"``) or median of its pool, or with ``ideal="min"`` the smaller of its own value
    and that median; and third, each gap at its pool's median (the typical-gap replay's). One pass
    over the pools (the window expressions share their groups)."""
    by: list[str | pl.Expr] = ["kind", "key"]
    if int(nodes["key"].max() or 0) < 2**60:  # type: ignore[arg-type]
        # (kind, key) as one integer: the same groups, rows in the same order, so the same
        # figures; grouping one column holds no row encoding of two (8 x 1 M: 250 -> 115 MiB at
        # whatif's peak). key = key0 position x 2^32 + ordinal: below 2^60 but for 2^28 key0s.
        by = [pl.col("key").fill_null(-1) * 4 + pl.col("kind").cast(pl.Int64)]
    if pool == "step":
        by.append("step")
    d_typ = pl.col("dur").median().over(by)
    if ideal == "mean":
        d_typ = pl.when(pl.col("kind") == 0).then(pl.col("dur").mean().over(by)).otherwise(d_typ)
    med = nodes.select(pl.col("gap").median().over(by).alias("g"), d_typ.alias("d"))
    g_med = med["g"].fill_null(0.0).to_numpy()
    g, d = g_med, med["d"].fill_null(0.0).to_numpy()
    if ideal == "min":
        g, d = np.minimum(g, nodes["gap"].to_numpy()), np.minimum(d, nodes["dur"].to_numpy())
    inst = nodes["kind"].to_numpy() == 2
    return np.where(inst, 0.0, g), np.where(inst, 0.0, d), np.where(inst, 0.0, g_med)


def _steps_differ(nodes: pl.DataFrame) -> bool:
    """Whether the steps do different work (``pool=auto``, module doc step 2): per rank and step, the
    compute time (the sum of its compute items' durations, ns), over the steps that every rank has; the
    standard deviation over steps of each step's median over ranks (a rank late in some steps only
    moves none of them, from 3 ranks on) above :data:`STEP_WORK_SPREAD` times the noise (:func:`_noise`) and
    above :data:`STEP_WORK_MIN_PCT` % of the mean cell. Two steps with two ranks or more are needed
    (else False)."""
    per = (
        nodes.lazy()
        .filter(pl.col("kind") == 0)
        .group_by("step", "rank")
        .agg(pl.col("dur").sum())
        .filter(pl.len().over("step") == pl.col("rank").n_unique())
        .sort("step", "rank")
        .collect()
    )
    n_ranks = per["rank"].n_unique()
    if n_ranks < 2 or per.height < 2 * n_ranks:
        return False
    c = per["dur"].to_numpy().astype(np.float64).reshape(-1, n_ranks)  # steps x ranks
    # a step's work: its median over ranks (of 2, their mean), which a rank late in that step leaves
    # alone from 3 ranks on (one rank stalled in one step of 5 lifted that step's mean over 4 ranks)
    between = float(np.median(c, axis=1).std(ddof=1))
    return between > max(STEP_WORK_SPREAD * _noise(c), STEP_WORK_MIN_PCT / 100 * float(c.mean()))


def _noise(c: np.ndarray) -> float:
    """The noise (ns) of a steps x ranks table of compute times (ns, at least 2 x 2): the smaller of
    two estimates of one cell's standard deviation once the step and the rank are taken out.

    1. The residual standard deviation of the two-way fit step + rank (each cell less its step's mean
       and its rank's mean, plus the grand mean; squares over (steps - 1) x (ranks - 1)): unbiased
       under noise alone, but a rank late in some steps only (its rank x step interaction) is all
       residual.
    2. Robust: each cell less its step's mean (over ranks) and its rank's **median** over steps of
       that, then 1.4826 x the median absolute residual x sqrt(ranks / (ranks - 1)) (the residual's
       scale under normal noise), times :data:`ROBUST_MARGIN`. A rank late in some of the steps puts
       its lateness (or, late in most, its time on time) into those steps' residuals only, which the
       median passes over: 2 ranks, rank 1 300 us late in 5 of 9 steps: 111.8 us by (1), 0 by (2).
       Late in exactly half the steps, neither half is the rank's typical step: (2) then reads half
       its lateness, as (1) does.
    """
    n_steps, n_ranks = c.shape
    d = c - c.mean(axis=1, keepdims=True)
    resid = d - d.mean(axis=0)
    rms = math.sqrt(float((resid**2).sum()) / ((n_steps - 1) * (n_ranks - 1)))
    robust = 1.4826 * float(np.median(np.abs(d - np.median(d, axis=0)))) * math.sqrt(n_ranks / (n_ranks - 1))
    return min(rms, ROBUST_MARGIN * robust)


def _step_times(tl: _replay.Timeline, val: np.ndarray, w: np.ndarray | None = None) -> pl.DataFrame:
    """Per step (in step order): step, t = latest end of its nodes (instance nodes aside) - the
    step start (ns, float), for node end times ``val`` in ``tl.nodes`` order (``w``: the weights
    ``val`` was replayed with, see :func:`_whatif_fix.step_t`)."""
    return pl.DataFrame({"step": tl.by_step()[2], "t": _whatif_fix.step_t(tl, val, w)})


def _ratio(num: pl.Series, den: pl.Series) -> float:
    """mean(num) / mean(den) (nan when den is empty or zero)."""
    d = float(den.mean() or 0.0)  # type: ignore[arg-type]
    return float(num.mean()) / d if d else float("nan")  # type: ignore[arg-type]


def _no_steps_text(store: Store, run_id: int, label: str, no_comp: bool) -> str:
    """Why the replay has no step to replay, in summary's terms, and what to ingest (``no_comp``:
    the run has no compute items)."""
    if no_comp:
        sources = ", ".join(
            store.sql("SELECT DISTINCT source FROM traces WHERE run_id = ? ORDER BY source", [run_id])[
                "source"
            ].to_list()
        )
        return (
            f"{label}: no compute traced (its traces: {sources or 'none'}; Flight Recorder dumps hold "
            "collectives only): what-if replays each step's compute and collectives, so ingest the run's "
            "Kineto traces (torch.profiler) into the same run (--run)"
        )
    return (
        f"{label}: no ProfilerSteps, so no step to replay: profile with a torch.profiler schedule "
        "(its ProfilerStep#N annotations mark the steps) and ingest those traces"
    )


def _slowdown(name: str, what: str) -> tuple:
    return (
        rc.ratio(name, what),
        rc.ratio(f"{name}_lo", "Its 95% interval over steps: low end (null below 5 steps: too few)"),
        rc.ratio(f"{name}_hi", "Its 95% interval over steps: high end (null below 5 steps)"),
    )


SPEC = Analysis(
    name="whatif",
    params=Params,
    result=Result,
    frames=(
        rc.frame(
            "frame",
            "Per step: the recorded time and the replays",
            rc.count("step", "ProfilerStep number"),
            rc.ns("actual_ns", "Recorded step time"),
            rc.ns("replay_ns", "Replay of the recorded gaps and durations"),
            rc.ns("nogap_ns", "Replay of the recorded durations without host gaps"),
            rc.ns("typgap_ns", "Replay of the recorded durations, host gaps at their median"),
            rc.ns("ideal_ns", "Replay of the ideal (module doc)"),
            rc.ratio("slowdown", "S of the step, at least 1"),
            rc.ratio("launch_slowdown", "actual / nogap, at least 1"),
            rc.ratio("host_slowdown", "replay / typgap, at least 1"),
            rc.ratio("model_slowdown", "replay / ideal, at least 1"),
            rc.flag("clamped", "The ideal exceeded the time it is compared with; slowdowns set to 1"),
            worst="slowdown",
        ),
        rc.frame(
            "blame",
            "Each group's share of the slowdown, alone",
            rc.text("by", "Grouped by rank, stage or op"),
            rc.text(
                "kind",
                "blocking (the ideal replay with only that group's recorded durations) or host (the "
                "typical-gap replay with only that group's recorded host gaps)",
            ),
            rc.text("group", "The rank, stage or op"),
            rc.ratio("slowdown", "That group alone: S, at least 1"),
            rc.ratio(
                "slowdown_lo",
                "Rows by stage: the low end of that stage's own 95% interval; null otherwise (and below 5 steps)",
            ),
            rc.pct(
                "excess_alone_pct",
                "That group alone, % of the kind's slowdown - 1 (0..100; null without "
                "excess; not additive across groups)",
            ),
            rc.ratio(
                "fix_slowdown",
                "Rows by rank: the recorded replay over the same with only that rank's lateness (its "
                "values above the ideal) removed, at least 1: what fixing it alone buys, the other ranks' "
                "lateness kept; null otherwise",
            ),
            rc.pct(
                "bound_pct",
                "Rows by rank: its share of the saving with every rank fixed (not of S's excess), its "
                "saving at its turn when the ranks are fixed one after another (the largest fix alone "
                "first, then the most lateness; ranks alike share equally), 0..100, adding up to at most "
                "100; null otherwise and past the first 8 ranks fixed",
            ),
        ),
        rc.frame(
            "summary",
            "One row: the run's slowdowns",
            rc.text("source", "Collectives source replayed"),
            rc.text("pool", "The pool parameter"),
            rc.text("gaps", "The gaps parameter"),
            rc.text("ideal", "The ideal parameter"),
            rc.count("steps", "Steps replayed"),
            *_slowdown("slowdown", "S: the job's blocking slowdown"),
            *_slowdown("host_slowdown", "Host-gap slowdown: recorded gaps vs each at its median"),
            rc.ratio("launch_slowdown", "actual / no host gaps at all (the artifact's)"),
            rc.ratio("model_slowdown", "replay / ideal"),
            rc.pct("replay_error_pct", "Mean |replay - actual| / actual over steps"),
            rc.count("clamped_steps", "Steps whose ideal exceeded them"),
            rc.count("transient_steps", "Steps left out as the profiler-start transient"),
            rc.flag("straggling", "An interval's low end above 1.1 (false without intervals)"),
        ),
    ),
    report=Report(
        80, "per-step ops and collectives on 2+ ranks (Kineto traces of every rank, or NDTimeline)"
    ),
)


@register(SPEC)
def run(store: Store, params: Params) -> Result:
    """What-if replay of one run (module doc).

    Raises:
        StoreError: No such run.
        AnalysisError: No collective matched across two or more ranks (the message says why), no
            compute traced or no ProfilerSteps (the message says which, and what to ingest), or a replay graph with a cycle (inconsistent matching).
    """
    run_id = store.resolve_run(params.run)
    label = run_label(store, run_id)
    comm, source = _replay.comm_items(store, run_id, params.source or None)
    _replay.require_matched(store, run_id, comm, source, label, "whatif")
    transient = _replay.transient(comm, store, run_id)
    if transient.steps:
        comm = comm.filter(~pl.col("step").is_in(list(transient.steps)))
    no_comp = False

    def items() -> pl.DataFrame:
        """The compute items, as the build reads them: outside a report let go of there once read
        (8 x 1 M events: 236 MiB, under the build's peak and so whatif's and stragglers'), and
        DuckDB's cached blocks of the reads before it let go of too (80 MiB there)."""
        nonlocal no_comp
        comp = _replay.compute_items(store, run_id)
        _replay.release_compute_items(store, run_id)
        release_pool(store)
        if transient.steps:
            comp = comp.filter(~pl.col("step").is_in(list(transient.steps)))
        no_comp = comp.is_empty()
        return comp

    tl = _replay.build(items, comm, params.eps_ns, clock_sets=clock_sets(store, run_id))
    if tl.step_start.is_empty():
        raise AnalysisError(_no_steps_text(store, run_id, label, no_comp))
    trim()  # the build's freed arrays handed back before the replays (traceprof.core.trim)
    nodes = tl.nodes
    gap0, dur0 = nodes["gap"].to_numpy(), nodes["dur"].to_numpy()
    if params.pool == "auto":  # the pool the run's steps call for, in the frames and notes as used
        params = replace(params, pool="step" if _steps_differ(nodes) else "all")
    gap_i, dur_i, gap_m = _ideal(nodes, params.pool, params.ideal)  # gap_m: each host gap at its median
    zero = np.zeros(len(gap0))  # calloc'd: pages never written take no memory
    if params.gaps == "zero":
        gap_i = zero
    actual = _step_times(tl, np.nan_to_num(nodes["end"].to_numpy(), nan=-np.inf))
    frame = actual.rename({"t": "actual_ns"})
    replays = (
        ("replay_ns", (gap0, dur0)),
        ("nogap_ns", (zero, dur0)),
        ("typgap_ns", (gap_m, dur0)),
        ("ideal_ns", (gap_i, dur_i)),
    )
    ideal_val = np.zeros(0)  # the ideal replay's ends: the base of the blocking blame, kept for it
    ranks = nodes["rank"].to_numpy()
    # each kind's fixes (_whatif_fix.fixes) from the recorded replay it is blamed over, taken from this loop's
    # replay of it (blocking: nogap with gaps=zero, else replay; host: replay), not replayed again
    fix_base = {"blocking": "nogap_ns" if params.gaps == "zero" else "replay_ns", "host": "replay_ns"}
    fixes: dict[str, tuple[dict[str, float], dict[str, float]]] = {}
    for col, (g, d) in replays:
        w = g + d  # what _replay.replay adds
        val = _replay.replay_weights(tl, w)
        frame = frame.join(_step_times(tl, val, w).rename({"t": col}), on="step")
        if col == "ideal_ns":
            ideal_val = val
        for kind in (k for k, c in fix_base.items() if c == col):
            # each rank's lateness removed (the kind's own values: durations or host gaps)
            w_fix = g + np.minimum(d, dur_i) if kind == "blocking" else np.minimum(g, gap_m) + d
            fixes[kind] = _whatif_fix.fixes(tl, w, val, w_fix, ranks)
            del w_fix
        del w, val
    frame = frame.with_columns(_common.whole_ns(pl.col(c)) for c in ("actual_ns", *(c for c, _ in replays)))
    base = "nogap_ns" if params.gaps == "zero" else "actual_ns"
    frame = frame.with_columns(
        pl.max_horizontal(pl.col(base) / pl.col("ideal_ns"), 1.0).alias("slowdown"),
        pl.max_horizontal(pl.col("actual_ns") / pl.col("nogap_ns"), 1.0).alias("launch_slowdown"),
        pl.max_horizontal(pl.col("replay_ns") / pl.col("typgap_ns"), 1.0).alias("host_slowdown"),
        pl.max_horizontal(pl.col("replay_ns") / pl.col("ideal_ns"), 1.0).alias("model_slowdown"),
        (pl.col(base) < pl.col("ideal_ns")).alias("clamped"),
    )
    # a step whose ideal exceeds it (an outlier elsewhere lifted a mean) counts at its own time,
    # not above it: one stalled step of 20 must not make the other 19 look faster than ideal
    capped = frame.select(pl.min_horizontal(base, "ideal_ns"))[base]
    s_raw = _ratio(frame[base], capped)
    s_launch = max(_ratio(frame["actual_ns"], frame["nogap_ns"]), 1.0)
    s_host = max(_ratio(frame["replay_ns"], frame["typgap_ns"]), 1.0)
    s_model_raw = _ratio(frame["replay_ns"], frame["ideal_ns"])
    s, s_model = max(s_raw, 1.0), max(s_model_raw, 1.0)
    err = float(((frame["replay_ns"] - frame["actual_ns"]).abs() / frame["actual_ns"]).mean()) * 100  # type: ignore[arg-type]
    ideal_gaps = (gap_i, dur_i)
    charged = _whatif_blame.charged(nodes)  # the same for both kinds of blame
    blocking = _whatif_blame.blame(
        store,
        run_id,
        tl,
        charged,
        (gap0 if params.gaps == "median" else zero, dur0),
        ideal_gaps,
        (float(frame["ideal_ns"].mean()), None)  # type: ignore[arg-type]
        if params.gaps == "median"
        else (float(capped.mean()), frame[base].to_numpy()),  # type: ignore[arg-type]
        s_model if params.gaps == "median" else s,
        "blocking",
        params.top_ops,
        frame["ideal_ns"].to_numpy() if params.gaps == "median" else capped.to_numpy(),
        ideal_val,
        fixes["blocking"],
    )
    del ideal_val  # let go of before the host blame replays its own base
    blame = pl.concat(
        [
            blocking,
            _whatif_blame.blame(
                store,
                run_id,
                tl,
                charged,
                (gap0, dur0),
                (gap_m, dur0),
                (float(frame["typgap_ns"].mean()), None),  # type: ignore[arg-type]
                s_host,
                "host",
                params.top_ops,
                frame["typgap_ns"].to_numpy(),
                fixes=fixes["host"],
            ),
        ]
    )
    # intervals over steps (percentile bootstrap): straggling needs the low end above 1.1
    # (none below _common.MIN_INTERVAL_STEPS steps: null, and never straggling)
    s_lo, s_hi = (
        _whatif_blame.at_least_1(x) for x in _common.ratio_interval(frame[base].to_numpy(), capped.to_numpy())
    )
    h_lo, h_hi = (
        _whatif_blame.at_least_1(x)
        for x in _common.ratio_interval(frame["replay_ns"].to_numpy(), frame["typgap_ns"].to_numpy())
    )
    straggling = s_lo is not None and h_lo is not None and max(s_lo, h_lo) > STRAGGLING_S
    summary = pl.DataFrame(
        {
            "source": [source],
            "pool": [params.pool],
            "gaps": [params.gaps],
            "ideal": [params.ideal],
            "steps": [frame.height],
            "slowdown": [s],
            "slowdown_lo": [s_lo],
            "slowdown_hi": [s_hi],
            "host_slowdown": [s_host],
            "host_slowdown_lo": [h_lo],
            "host_slowdown_hi": [h_hi],
            "launch_slowdown": [s_launch],
            "model_slowdown": [s_model],
            "replay_error_pct": [err],
            "clamped_steps": [int(frame["clamped"].sum())],
            "transient_steps": [len(transient.steps)],
            "straggling": [straggling],
        },
        schema_overrides={
            c: pl.Float64 for c in ("slowdown_lo", "slowdown_hi", "host_slowdown_lo", "host_slowdown_hi")
        },
    )
    s_uncapped = _ratio(frame[base], frame["ideal_ns"])
    partial = _replay.partial_note(
        store,
        run_id,
        "the replay covers the traced ranks only (a collective starts "
        "at the last traced arrival; an untraced rank's delay counts as transfer time)",
    )
    notes = _notes(
        (s_raw, s_host, s_launch, s_model_raw, s_uncapped),
        (s_lo, s_hi, h_lo, h_hi),
        err,
        frame,
        blame,
        params,
        partial is not None,
    )
    extra = tuple(n for n in (transient.note, unaligned_note(store, run_id), partial) if n)
    return Result(frame=frame, blame=blame, summary=summary, notes=notes + extra)


def _notes(
    raw: tuple[float, float, float, float, float],
    ci: tuple[float | None, float | None, float | None, float | None],
    err: float,
    frame: pl.DataFrame,
    blame: pl.DataFrame,
    params: Params,
    partial: bool = False,
) -> tuple[str, ...]:
    s_raw, s_host, s_launch, s_model_raw, s_uncapped = raw
    s_lo, s_hi, h_lo, h_hi = ci
    s = max(s_raw, 1.0)
    # with ranks of the job untraced (``partial``) the replay cannot see their delays: a low S
    # there rules out no straggler, so it never reads "not straggling"
    if s_lo is None or s_hi is None or h_lo is None or h_hi is None:  # too few steps: no intervals
        unseen = "; ranks untraced: their delays are unseen" if partial else ""
        verdict = (
            f"not shown to straggle (too few steps for an interval: {_common.MIN_INTERVAL_STEPS} are needed"
            f"{unseen})"
        )
        s_ci = h_ci = ""
        ci_what = f"no 95% intervals: {frame.height} steps, fewer than {_common.MIN_INTERVAL_STEPS}"
    else:
        verdict = (
            "straggling"
            if max(s_lo, h_lo) > STRAGGLING_S
            else "not straggling"
            if max(s_hi, h_hi) <= STRAGGLING_S and not partial
            else "not shown to straggle (ranks untraced: their delays are unseen)"
            if partial
            else "not shown to straggle"
        )
        s_ci, h_ci = f" [{s_lo:.3f}, {s_hi:.3f}]", f" [{h_lo:.3f}, {h_hi:.3f}]"
        ci_what = f"95% intervals, bootstrap over the {frame.height} steps"
    what = (
        "blocking slowdown S (no host gaps, recorded vs ideal op times"
        if params.gaps == "zero"
        else "S (mean actual step / mean ideal step with idealized host gaps"
    )
    notes = [
        f"{what}; ideal: {'compute ops at their mean, transfers at their median' if params.ideal == 'mean' else params.ideal}"
        f", pooled over {'ranks and steps' if params.pool == 'all' else 'ranks within each step'}) = {s:.3f}"
        f"{s_ci}; host-gap slowdown (recorded host gaps vs each at its median over ranks) = "
        f"{s_host:.3f}{h_ci} ({ci_what}); "
        f"{verdict} by the OSDI'25 threshold (either interval's low end above {STRAGGLING_S}); launch slowdown "
        f"(actual / no host gaps at all, the artifact's) = {s_launch:.3f}; replay error {err:.1f}% of step time"
    ]
    ranks = blame.filter((pl.col("by") == "rank") & (pl.col("kind") == "blocking"))
    if s > STRAGGLING_S and ranks.height:
        alone = ", ".join(f"{g} {x:.3f}" for g, x in ranks.select("group", "slowdown").head(4).rows())
        largest = (
            f"the largest, rank {ranks['group'][0]}, explains {ranks['excess_alone_pct'][0] or 0:.0f}% of the "
            "excess alone"
            if ranks["slowdown"][0] - 1 > 1e-6
            else "no rank's op times at the collectives it arrived at last explain any of it (slower ops hidden "
            "while waiting for another rank are not charged)"
        )
        notes.append(
            "S counts every op slower than its typical value, run-to-run op-time noise included (ranks that share "
            "a busy host's cores can differ by 10-30% in op times with no straggler among them), so "
            f"S > {STRAGGLING_S} does not by itself mean one rank is to blame. Alone S by rank (its recorded values "
            f"up to the collectives it arrived at last, the rest ideal): {alone}; {largest}. Whether one rank holds up "
            "the collectives: "
            "traceprof analyze stragglers (the combined verdict: traceprof.engine.verdict)"
        )
    clamped = frame.filter("clamped")
    if clamped.height:
        why = (
            "the replay overestimates those steps (replay error; with ideal=min the ideal is never slower "
            "than the replay)"
            if params.ideal == "min"
            else "ideal values are slower there than the recording (an op short on one rank's critical path is long "
            "on another, where it was hidden; ideal=min rules this out) or the replay overestimates them"
        )
        notes.append(
            f"{clamped.height} of {frame.height} steps: the ideal replay is slower than the step it is "
            f"compared with because {why}: slowdowns clamped to 1 there, and S counts those steps at their "
            "own time (the ideal capped at the step)"
            + (f"; S clamped to 1 (ratio {s_uncapped:.3f})" if s_uncapped < 1 else "")
            + (f"; model S clamped to 1 (replay / ideal = {s_model_raw:.3f})" if s_model_raw < 1 else "")
        )
    if s - 1 <= 1e-9 and s_host - 1 <= 1e-9:
        notes.append("no excess over the ideal: nothing to blame")
        return tuple(notes)
    for kind, s_k in (("blocking", s), ("host", s_host)):
        if s_k - 1 <= 1e-9:
            continue
        for by in ("rank", "stage", "op"):
            b = blame.filter((pl.col("by") == by) & (pl.col("kind") == kind))
            if b.height and b["slowdown"][0] - 1 > 1e-6:
                top = b.row(0, named=True)
                # no share where the kind's own base has no excess (gaps=median: replay / ideal
                # at most 1 while actual / ideal is above it)
                share = top["excess_alone_pct"]
                notes.append(
                    f"{kind}: largest by {by}: {top['group']} (alone S = {top['slowdown']:.3f}"
                    + (f", {share:.0f}% of the excess on its own)" if share is not None else ")")
                )
        bounds = _whatif_fix.bounds_text(blame.filter((pl.col("by") == "rank") & (pl.col("kind") == kind)))
        if bounds:
            notes.append(f"{kind}: {bounds}")
    notes.append(
        "blame shares are each group alone and not additive: groups late at the same collectives each "
        "explain it alone, so one category's shares can add up to more than 100%; bound shares "
        "(bound_pct: ranks fixed one after another) add up to at most 100%"
    )
    return tuple(notes)
