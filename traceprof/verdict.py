"""One straggler verdict for a run: ``stragglers`` and ``whatif`` read together, never contradicting.

``stragglers`` names a rank when it arrives last significantly more often than chance and its
delays alone cost the job a material share of step time (5%), measured by the same what-if replay whose
per-rank blame ``whatif`` reports; ``whatif`` says how much slower the job is than its ideal
(S, the OSDI'25 blocking slowdown, and the host-gap slowdown: what host gaps that differ across
ranks cost; the artifact's launch slowdown, what all host gaps cost, is shown beside). The
combined verdict:

  1. A rank is named: "straggler: rank R ..." with its last-arrival count, p-value, cost and cause,
     and the what-if S and host-gap slowdown beside it. When too many ranks pass the rule to call
     them stragglers (``stragglers``' ``max_named_share``): "no single straggler: a systematic
     imbalance", with what-if's largest stage.
  2. No rank named and S and the host-gap slowdown at most 1.1: "no straggler", with the figures.
  3. No rank named but S or the host-gap slowdown above 1.1: "no single straggler": the job is
     slower than its ideal from op-time (or host-time) variation spread over ranks (no rank alone
     is both last significantly often and costly), e.g. CPU op-time noise on a shared machine. Not a contradiction: S counts every
     op slower than typical, whoever runs it.

  4. The mesh (``analyses.parallelism``): a slow pipeline stage or data-parallel replica (every
     rank of it computing more than its peers) leads the text as that group, and the ranks of it
     that ``stragglers`` named are not named as stragglers (the OSDI'25 ST trace: "slow stage:
     pipeline stage 3 (ranks 6, 7)", no straggler rank); a named rank outside them is given its
     place in the mesh (stage, replica, tensor-parallel group).

The report and summary put :attr:`Verdict.text` at the top.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import polars as pl

from traceprof import analysis
from traceprof.errors import AnalysisError, TraceprofError
from traceprof.store import Store

__all__ = ["Verdict", "combined_verdict", "STRAGGLING_S"]

#: The OSDI'25 straggling threshold on S (and on the host-gap slowdown).
STRAGGLING_S = 1.1


@dataclass(frozen=True)
class Verdict:
    """The combined verdict of one run.

    Attributes:
        text: One line for the top of a report.
        stragglers: Ranks named by ``stragglers`` (empty when none).
        slowdown: What-if S (blocking slowdown), None when the replay cannot run (e.g. Flight
            Recorder only).
        host_slowdown: What-if host-gap slowdown (recorded host gaps vs each at its median over
            ranks), None likewise.
        launch_slowdown: What-if launch slowdown (actual / no host gaps at all, the artifact's),
            None likewise.
        straggling: The job straggles: a rank is named, or S or the host-gap slowdown exceeds 1.1.
            (A systematic imbalance with S > 1.1 straggles without a named rank.)
        figures: Per-rank figures of ``stragglers`` (rank -> last_count, instances, p_value,
            cost_pct) and the what-if blame by rank (rank -> alone S, the larger of blocking and
            host).
    """

    text: str
    stragglers: tuple[int, ...]
    slowdown: float | None
    host_slowdown: float | None
    launch_slowdown: float | None
    straggling: bool
    figures: dict[str, Any] = field(default_factory=dict)


def _run(name: str, store: Store, run: str | None) -> Any:
    an = analysis.get(name)
    return an.run(store, an.params(run=run))


def combined_verdict(store: Store, run: str | None = None) -> Verdict:
    """The straggler verdict of a run from ``stragglers`` and ``whatif`` (module doc).

    Args:
        store: The store.
        run: Run name or id (None: the only run).

    Returns:
        A :class:`Verdict`.

    Raises:
        StoreError: No such run.
        AnalysisError: No collective matched across two or more ranks (from ``stragglers``).
    """
    stragglers = analysis.get("stragglers")
    rule = stragglers.params(run=run)  # the rule's thresholds (defaults)
    st: Any = stragglers.run(store, rule)  # a stragglers Result
    cost_rule = f"cost >= {rule.min_cost_pct:g}%"
    try:
        wi = _run("whatif", store, run)
    except AnalysisError:
        wi = None
    per = st.frame
    named = tuple(int(r) for r in per.filter(pl.col("named"))["rank"].to_list())
    mesh = _mesh_regroup(store, run, named)  # ranks of a slow stage or replica are named as that group
    per = per.with_columns(pl.col("named") & ~pl.col("rank").is_in(list(mesh.absorbed)))
    named = tuple(r for r in named if r not in mesh.absorbed)
    s = float(wi.summary["slowdown"].item()) if wi is not None else None
    ls = float(wi.summary["launch_slowdown"].item()) if wi is not None else None
    hs = float(wi.summary["host_slowdown"].item()) if wi is not None else None
    alone: dict[int, float] = {}
    if wi is not None:
        b = wi.blame.filter(pl.col("by") == "rank").group_by("group").agg(pl.col("slowdown").max())
        alone = {int(g): float(x) for g, x in b.iter_rows()}
    whatif = (f"what-if S = {s:.3f}, host-gap slowdown = {hs:.3f} (launch slowdown {ls:.3f})"
              if s is not None and hs is not None and ls is not None else "what-if: not available (no compute traced)")
    slow = s is not None and hs is not None and max(s, hs) > STRAGGLING_S
    # without steps (Flight Recorder only) a cost is a share of the time the collectives cover
    has_steps = bool(store.sql("SELECT count(*) FROM steps WHERE run_id = ?", [store.resolve_run(run)]).item())
    of_time = "of step time" if has_steps else "of the time the collectives cover"
    if named:
        causes = dict(zip(st.verdict["rank"].to_list(), st.verdict["cause"].to_list(), strict=True))
        parts = []
        for r in per.filter(pl.col("named")).iter_rows(named=True):
            episodic = "" if r["p_value"] < rule.alpha else " (not more often than chance: an episodic stall)"
            parts.append(f"rank {r['rank']} ({causes.get(r['rank'], 'unknown')}: last at {r['last_count']} of "
                         f"{r['instances']} collectives, p = {r['p_value']:.2g}{episodic}; its delays alone cost "
                         f"{r['cost_pct']:.1f}% {of_time})")
        text = f"straggler: {'; '.join(parts)}; {whatif}"
    elif per["qualifies"].any():
        many = per.filter(pl.col("qualifies"))
        stage = ""
        if wi is not None:
            b = wi.blame.filter((pl.col("by") == "stage") & (pl.col("kind") == "blocking"))
            if b.height:
                top = b.row(0, named=True)
                stage = f"; largest by stage: {top['group']} (alone S = {top['slowdown']:.3f})"
        text = (f"no single straggler: {many.height} of {per.height} ranks each arrive last significantly often and "
                f"{cost_rule}: a systematic imbalance (a slow stage or group, uneven work), not one rank; "
                f"{whatif}{stage}")
    elif not slow:
        top = per.sort("p_value", "rank").row(0, named=True)
        text = (f"no straggler: no rank both arrives last significantly more often than chance (p < {rule.alpha:g}) "
                f"and has a {cost_rule} {of_time} (closest: rank "
                f"{top['rank']}, last at {top['last_count']} of {top['instances']}, p = {top['p_value']:.2g}, cost "
                f"{top['cost_pct']:.1f}%); {whatif}")
    else:
        worst = max(alone.items(), key=lambda kv: kv[1]) if alone else None
        text = (f"no single straggler: the job runs {100 * (max(s or 1, hs or 1) - 1):.0f}% slower than its ideal "
                f"({whatif}), from variation spread over ranks (op-time noise, or host time): no rank is last "
                "significantly more often than chance"
                + (f" (largest single-rank cost: rank {worst[0]}, {100 * (worst[1] - 1):.0f}%)" if worst else ""))
    figures = {
        "ranks": {int(r["rank"]): {k: r[k] for k in ("last_count", "instances", "p_value", "cost_pct")}
                  for r in per.iter_rows(named=True)},
        "whatif_alone_by_rank": alone,
    }
    return Verdict(text=mesh.text(text, named), stragglers=named, slowdown=s, host_slowdown=hs, launch_slowdown=ls,
                   straggling=bool(named) or slow or bool(mesh.groups),
                   figures={**figures, **mesh.figures()})


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
            text += "; in the mesh: " + "; ".join(f"rank {r} is {self.labels[r]}" for r in named if r in self.labels)
        if self.groups:
            also = (f" (ranks {', '.join(map(str, sorted(self.absorbed)))} arrive last because of it: named as the "
                    "group, not as stragglers)" if self.absorbed else "")
            text = "; ".join(self.groups) + also + "; " + text
        return text

    def figures(self) -> dict[str, Any]:
        return {"mesh_groups": list(self.groups), "mesh_absorbed": sorted(self.absorbed)}


def _mesh_regroup(store: Store, run: str | None, named: tuple[int, ...]) -> _MeshNaming:
    """Mesh-aware naming (``analyses.parallelism``): its slow stages and replicas (a whole stage or
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
