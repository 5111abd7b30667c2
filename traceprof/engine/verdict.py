"""One straggler verdict for a run: ``stragglers`` and ``whatif`` read together, never contradicting.

A job is a ``problem`` only with a cause the trace supports; a slowdown without one is the run's
variability, reported with its figures (issue 27). The causes, in order:

  1. A rank: ``stragglers`` names it (it arrives last significantly more often than chance, and its
     own cause, compute, communication or untraced host time, exceeds the same measure on the
     ranks not suspected in significantly many steps, or it runs more work than they do; or one
     hold-up of it was over 20x the median skew). "straggler: rank R ...", with the what-if figures.
  2. A group: more ranks pass that rule than ``stragglers``' ``max_named_share`` (a quarter): "no
     single straggler: N of M ranks (...) ...: a systematic imbalance", with what-if's largest
     pipeline stage where the collector records stages.
  3. A stage: what-if's blame by pipeline stage, when the job's slowdown (S, or the host-gap
     slowdown) and that stage's own slowdown both have their interval's low end above 1.1.
  4. None: "no straggler". When S or the host-gap slowdown is above 1.1 it is the run's
     variability (op-time or host-time spread over ranks and steps: on a shared CPU one sample
     reaches 1.14 from ranks that are not slowed), said with its interval, not a problem.

  4. The mesh (``traceprof.analyses.parallelism``): a slow pipeline stage or data-parallel replica (every
     rank of it computing more than its peers) leads the text as that group, and the ranks of it
     that ``stragglers`` named are not named as stragglers (the OSDI'25 ST trace: "slow stage:
     pipeline stage 3 (ranks 6, 7)", no straggler rank); a named rank outside them is given its
     place in the mesh (stage, replica, tensor-parallel group).

The what-if slowdowns carry 95% intervals (a bootstrap over steps, ``whatif``'s summary): the OSDI'25
threshold 1.1 counts only when an interval's low end is above it.

The report and summary put :attr:`Verdict.text` at the top; ``status`` is the verdict of the
``stragglers`` topic (``problem`` or ``ok``) that the findings list, the verdicts table, ``summary -f
json`` and the report all show.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import polars as pl

from traceprof.core.errors import AnalysisError, TraceprofError
from traceprof.core.text import first_few
from traceprof.engine import analysis
from traceprof.storage.runs import not_shown_to_straggle, straggler_gap_text
from traceprof.storage.store import Store

__all__ = ["Verdict", "combined_verdict", "STRAGGLING_S"]

#: The OSDI'25 straggling threshold on S (and on the host-gap slowdown).
STRAGGLING_S = 1.1


@dataclass(frozen=True)
class Verdict:
    """The combined verdict of one run.

    Attributes:
        text: One line for the top of a report.
        status: ``problem`` (a cause is named), ``ok``, or ``inconclusive`` (none named, but ranks of
            the job that are members of its collectives have no profiler trace:
            ``traceprof.storage.runs.untraced_members``).
        cause: What is named: ``rank``, ``group``, ``stage``, or None.
        stragglers: Ranks named by ``stragglers`` (empty when none).
        slowdown: What-if S (blocking slowdown), None when the replay cannot run (e.g. Flight
            Recorder only); ``slowdown_interval`` its 95% interval over steps (None likewise).
        host_slowdown: What-if host-gap slowdown (recorded host gaps vs each at its median over
            ranks), None likewise; ``host_interval`` its interval.
        launch_slowdown: What-if launch slowdown (actual / no host gaps at all, the artifact's),
            None likewise.
        straggling: ``status == "problem"``.
        figures: Per-rank figures of ``stragglers`` (rank -> last_count, instances, p_value,
            cost_pct, cause, floor_p_value) and the what-if blame by rank (rank -> alone S, the
            larger of blocking and host).
    """

    text: str
    stragglers: tuple[int, ...]
    slowdown: float | None
    host_slowdown: float | None
    launch_slowdown: float | None
    straggling: bool
    status: str = "ok"
    cause: str | None = None
    slowdown_interval: tuple[float, float] | None = None
    host_interval: tuple[float, float] | None = None
    figures: dict[str, Any] = field(default_factory=dict)


def _params(name: str, run: str | None, options: dict[str, dict[str, str]] | None) -> Any:
    """Analysis ``name``'s parameters for ``run``: the defaults, or ``options[name]`` (``-p
    name.key=value`` as strings, as the report and summary pass them)."""
    an = analysis.get(name)
    given = (options or {}).get(name)
    return analysis.make_params(an, run, given) if given else an.params(run=run)


def _whatif_text(wi: Any) -> str:
    """The what-if figures with their intervals, or why there are none."""
    if wi is None:
        return "what-if: not available (no compute traced)"
    m = wi.summary.row(0, named=True)
    if m["slowdown_lo"] is None or m["host_slowdown_lo"] is None:  # too few steps to resample
        return (
            f"what-if S = {m['slowdown']:.3f}, host-gap slowdown = {m['host_slowdown']:.3f} (no 95% intervals: "
            f"{m['steps']} steps are too few to resample; launch slowdown {m['launch_slowdown']:.3f})"
        )
    return (
        f"what-if S = {m['slowdown']:.3f} [{m['slowdown_lo']:.3f}, {m['slowdown_hi']:.3f}], host-gap slowdown = "
        f"{m['host_slowdown']:.3f} [{m['host_slowdown_lo']:.3f}, {m['host_slowdown_hi']:.3f}] (95% intervals over "
        f"{m['steps']} steps; launch slowdown {m['launch_slowdown']:.3f})"
    )


def _stage(wi: Any) -> dict[str, Any] | None:
    """What-if's largest stage by blocking blame (by, group, slowdown, slowdown_lo), or None."""
    if wi is None:
        return None
    b = wi.blame.filter((pl.col("by") == "stage") & (pl.col("kind") == "blocking"))
    return b.sort("slowdown", "group", descending=[True, False]).row(0, named=True) if b.height else None


def combined_verdict(
    store: Store, run: str | None = None, options: dict[str, dict[str, str]] | None = None
) -> Verdict:
    """The straggler verdict of a run from ``stragglers`` and ``whatif`` (module doc).

    Args:
        store: The store.
        run: Run name or id (None: the only run).
        options: Analysis parameters as strings by analysis (``{"stragglers": {"alpha": "0.05"}}``),
            the report's and summary's ``-p``: the verdict reads the results they show.

    Returns:
        A :class:`Verdict`.

    Raises:
        StoreError: No such run.
        AnalysisError: No collective matched across two or more ranks (from ``stragglers``).
    """
    rule = _params("stragglers", run, options)  # the rule's thresholds
    st: Any = analysis.get("stragglers").run(store, rule)  # a stragglers Result
    wi: Any  # a whatif Result, or None
    try:
        wi = analysis.get("whatif").run(store, _params("whatif", run, options))
    except AnalysisError:
        wi = None
    per = st.frame
    # stragglers leaves the ranks of a slow stage or replica unnamed (its slow_group): regrouped here alike
    named = tuple(
        int(r) for r in per.filter(pl.col("named") | pl.col("slow_group").is_not_null())["rank"].to_list()
    )
    mesh = _mesh_regroup(store, run, named)  # ranks of a slow stage or replica are named as that group
    per = per.with_columns(pl.col("named") & ~pl.col("rank").is_in(list(mesh.absorbed)))
    named = tuple(r for r in named if r not in mesh.absorbed)
    m = wi.summary.row(0, named=True) if wi is not None else None
    s, hs, ls = (None, None, None) if m is None else (m["slowdown"], m["host_slowdown"], m["launch_slowdown"])
    # no intervals below MIN_INTERVAL_STEPS steps (null ends): none, and nothing rests on one
    s_ci = None if m is None or m["slowdown_lo"] is None else (m["slowdown_lo"], m["slowdown_hi"])
    h_ci = (
        None if m is None or m["host_slowdown_lo"] is None else (m["host_slowdown_lo"], m["host_slowdown_hi"])
    )
    alone: dict[int, float] = {}
    if wi is not None:
        b = wi.blame.filter(pl.col("by") == "rank").group_by("group").agg(pl.col("slowdown").max())
        alone = {int(g): float(x) for g, x in b.iter_rows()}
    whatif = _whatif_text(wi)
    low = max(s_ci[0], h_ci[0]) if s_ci and h_ci else None  # the low ends: "straggling" needs one above 1.1
    point = max(s or 1.0, hs or 1.0)
    # without steps (Flight Recorder only) a cost is a share of the time the collectives cover
    has_steps = bool(
        store.sql("SELECT count(*) FROM steps WHERE run_id = ?", [store.resolve_run(run)]).item()
    )
    of_time = "of step time" if has_steps else "of the time the collectives cover"
    gap = straggler_gap_text(store, store.resolve_run(run))  # why "ok" would be "inconclusive", or ""
    stage = _stage(wi)
    # stragglers' verdict on a rank its tests could not judge (too few collectives or steps)
    untested = st.verdict.filter((pl.col("status") == "inconclusive") & pl.col("rank").is_not_null())
    weak = str(untested["evidence"][0]) if untested.height else None
    untested_rank = int(untested["rank"][0]) if untested.height else None
    cause: str | None = None
    if named:
        causes = dict(zip(st.verdict["rank"].to_list(), st.verdict["cause"].to_list(), strict=True))
        parts = []
        for r in per.filter(pl.col("named")).iter_rows(named=True):
            episodic = "" if r["p_value"] < rule.alpha else " (not more often than chance: an episodic stall)"
            # a cause is claimed where a compute z-score backs the split (none without steps)
            said = (
                f"{causes.get(r['rank'], 'unknown')}: "
                if r.get("compute_z") is not None
                else "no cause claimed (no compute z); "
            )
            parts.append(
                f"rank {r['rank']} ({said}last at {r['last_count']} of "
                f"{r['instances']} collectives, p = {r['p_value']:.2g}{episodic}; {_own(r, rule.alpha, has_steps)}; its delays alone "
                f"cost {r['cost_pct']:.1f}% {of_time})"
            )
        text, cause = f"straggler: {'; '.join(parts)}; {whatif}", "rank"
    elif per["qualifies"].any():
        many = per.filter(pl.col("qualifies"))
        where = f"; largest by stage: {stage['group']} (alone S = {stage['slowdown']:.3f})" if stage else ""
        ranks = first_few(many["rank"].to_list(), 8)
        text = (
            f"no single straggler: {many.height} of {per.height} ranks ({ranks}) each arrive last significantly "
            "often with a cause of their own beyond the other ranks' noise: a systematic imbalance (a slow stage "
            f"or group, uneven work), not one rank; {whatif}{where}"
        )
        cause = "group"
    elif (
        stage is not None
        and low is not None
        and low > STRAGGLING_S
        and stage["slowdown_lo"] is not None
        and stage["slowdown_lo"] > STRAGGLING_S
    ):
        text = (
            f"slow stage: pipeline stage {stage['group']} alone makes the job {stage['slowdown']:.3f}x slower "
            f"than its ideal (interval low end {stage['slowdown_lo']:.3f} > {STRAGGLING_S}); {whatif}"
        )
        cause = "stage"
    elif weak is not None:
        # a test had no power (too few collectives or steps): inconclusive with its figures, never
        # "the run's variability" (that rests on the test that could not be made)
        own = weak.removesuffix(f"; {gap}") if gap else weak
        text = f"{own}; {whatif}"
    elif point > STRAGGLING_S:
        worst = max(alone.items(), key=lambda kv: kv[1]) if alone else None
        shown = (
            "too few steps for an interval, so not even that is shown"
            if low is None
            else f"its interval's low end {low:.3f} is above {STRAGGLING_S}"
            if low > STRAGGLING_S
            else f"its interval reaches below {STRAGGLING_S}, so not even that is shown"
        )
        # with ranks untraced (gap) the status is inconclusive: the traced ranks' variability only
        what = (
            "the traced ranks' variability, as far as they show"
            if gap
            else "the run's variability, not a problem"
        )
        text = (
            f"no straggler: the job runs {100 * (point - 1):.0f}% slower than its ideal ({whatif}; {shown}), from "
            "variation spread over ranks and steps (op-time or host-time noise) with no rank, group or stage "
            f"to blame: {what}"
            + (f" (largest single-rank cost: rank {worst[0]}, {100 * (worst[1] - 1):.0f}%)" if worst else "")
        )
    else:
        # the reason for untraced ranks is said once, at the end (stragglers' evidence ends with it)
        own = st.verdict["evidence"][0].removeprefix("no straggler: ").removeprefix("not shown to straggle: ")
        own = own.removesuffix(f"; {gap}") if gap else own
        text = f"no straggler: {own}; {whatif}"
    figures = {
        "ranks": {
            int(r["rank"]): {
                k: r[k] for k in ("last_count", "instances", "p_value", "cost_pct", "cause", "floor_p_value")
            }
            for r in per.iter_rows(named=True)
        },
        "whatif_alone_by_rank": alone,
    }
    if untested_rank is not None and cause is None:
        figures["untested"] = untested_rank  # the rank stragglers' tests had too little data to judge
    if cause is None and mesh.groups:
        cause = "group"  # a slow stage or replica: the mesh names it
    problem = cause is not None
    status = "problem" if problem else "inconclusive" if weak is not None else "ok"
    if gap and not problem:
        # the ranks compared are the traced ones: an untraced member the others wait for would make
        # every traced rank's lateness look small; a traced rank named as the straggler stays named.
        # ``analyze stragglers`` says the same in its verdict table.
        status = "inconclusive"
        text += f"; {gap}"
    if status == "inconclusive":
        text = not_shown_to_straggle(text)
    return Verdict(
        text=mesh.text(text, named),
        stragglers=named,
        slowdown=s,
        host_slowdown=hs,
        launch_slowdown=ls,
        straggling=problem,
        status=status,
        cause=cause,
        slowdown_interval=s_ci,
        host_interval=h_ci,
        figures={**figures, **mesh.figures()},
    )


def _own(r: dict[str, Any], alpha: float, has_steps: bool = True) -> str:
    """Why a named rank's cause is its own (the noise-floor test, or its extra work); without steps
    the test is of its arrival lateness per collective (``stragglers``' noise floor)."""
    if r["p_value"] >= alpha or r.get("floor_steps") is None:
        return "one hold-up far above the run's skew"
    if r.get("extra_work_pct") is not None and r["extra_work_pct"] > 0:
        return f"it runs {r['extra_work_pct']:.1f}% more work per step than every other rank"
    if not has_steps:
        return (
            f"its arrival lateness above every unsuspected rank's in {r['floor_steps_won']} of {r['floor_steps']} "
            f"collectives (p = {r['floor_p_value']:.2g}), by {r['excess_pct']:+.1f}% of the collectives' mean spacing"
        )
    return (
        f"its {r['cause']} above every unsuspected rank's in {r['floor_steps_won']} of {r['floor_steps']} steps "
        f"(p = {r['floor_p_value']:.2g}), by {r['excess_pct']:+.1f}% of a step"
    )


@dataclass(frozen=True)
class _MeshNaming:
    """The mesh's say in the verdict (:func:`_mesh_regroup`): ``groups``, one sentence per slow
    stage or data-parallel replica; ``absorbed``, the named ranks inside them (named as the group,
    not as stragglers); ``labels``, rank -> its place in the mesh (``pp stage 2, dp replica 1, tp
    group 4, 5, 6, 7``)."""

    groups: tuple[str, ...] = ()
    absorbed: frozenset[int] = frozenset()
    labels: dict[int, str] = field(default_factory=dict)

    def text(self, text: str, named: tuple[int, ...]) -> str:
        """The verdict text with the slow groups first and each named rank's place in the mesh."""
        if named and self.labels:
            text += "; in the mesh: " + "; ".join(
                f"rank {r} is {self.labels[r]}" for r in named if r in self.labels
            )
        if self.groups:
            also = (
                f" (ranks {', '.join(map(str, sorted(self.absorbed)))} arrive last because of it: named as the "
                "group, not as stragglers)"
                if self.absorbed
                else ""
            )
            text = "; ".join(self.groups) + also + "; " + text
        return text

    def figures(self) -> dict[str, Any]:
        return {"mesh_groups": list(self.groups), "mesh_absorbed": sorted(self.absorbed)}


def _mesh_regroup(store: Store, run: str | None, named: tuple[int, ...]) -> _MeshNaming:
    """Mesh-aware naming (``traceprof.analyses.parallelism``): its slow stages and replicas (a whole stage or
    replica slower than its peers) become the verdict's subject, and the ranks ``stragglers`` named
    inside them are not called stragglers; the other named ranks get their place in the mesh (a rank
    slow only within its tensor-parallel group is named with that group). Nothing when the analysis
    is not registered or does not apply."""
    try:
        an = analysis.get("parallelism")
        res: Any = an.run(store, an.params(run=run))
    except TraceprofError:
        return _MeshNaming()
    view = res.mesh_view()
    return _MeshNaming(view.texts, frozenset(view.absorbed(named)), view.labels)
