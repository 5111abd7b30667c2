"""The ``stragglers`` topic of the findings: its findings hook (``stragglers``' spec, ``Topic``).

Reads ``stragglers`` and ``whatif`` together (cost: 100·(S − 1) of the named rank alone, the
straggler analysis' ``cost_pct``; the speed-up of fixing it alone, the other ranks' lateness kept:
``whatif``'s ``fix_slowdown``), then the combined verdict of ``traceprof.engine.verdict`` where it
applies, so the findings list, the verdicts and ``stragglers`` never disagree; adds a caution when
many collectives ended before their last arrival (the waits rest on the match and the clocks).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import polars as pl

from traceprof.analyses._common import ms
from traceprof.analyses._whatif_fix import BOUND_NAMED_PCT
from traceprof.core.errors import TraceprofError
from traceprof.core.text import COUNTED, first_few
from traceprof.engine.analysis import Finding, FindingsInput, FrameResult, Verdict
from traceprof.storage.runs import not_shown_to_straggle
from traceprof.storage.store import Store

__all__ = ["topic", "STRAGGLING_S", "EARLY_END_SHARE"]

#: A straggler costs the job when the what-if slowdown of its rank alone exceeds this (OSDI'25: S > 1.1).
STRAGGLING_S = 1.1


def topic(inp: FindingsInput) -> tuple[list[Finding], Verdict | None]:
    """The stragglers topic's findings and verdict (module doc)."""
    return _stragglers(inp.results, inp.store, inp.run_id, inp.params)


def _alone_slowdown(row: dict[str, Any], blame: pl.DataFrame | None) -> float | None:
    """The job's what-if slowdown from one rank's recorded times alone: the straggler analysis'
    ``cost_pct`` (the time that rank's delays add, % of the step: 1 + cost_pct / 100) where it
    has one, else the largest ``whatif`` blame slowdown
    of that rank."""
    if row.get("cost_pct") is not None:
        return 1.0 + float(row["cost_pct"]) / 100.0
    if blame is None or blame.is_empty() or not {"by", "group", "slowdown"} <= set(blame.columns):
        return None
    mine = blame.filter((pl.col("by") == "rank") & (pl.col("group") == str(row["rank"])))["slowdown"]
    return float(mine.max()) if mine.len() else None  # type: ignore[arg-type]


def _fix_slowdown(rank: int, blame: pl.DataFrame | None) -> float | None:
    """How much faster steps would be with one rank's lateness alone removed, the other ranks' kept
    (``whatif``'s ``fix_slowdown``, the larger of blocking and host; a second late rank then still
    bounds the collectives), or None without it."""
    row = _fix_row(rank, blame)
    return None if row is None else float(row["fix_slowdown"])


#: What the finding's "then rank 1 (45%), rank 3 (4%) bound them" shares are: whatif's ``bound_pct``,
#: a share of the saving with every rank fixed, not of the excess its delays alone add.
BOUND_SHARES = (
    "whatif's bound shares: % of the saving with every rank fixed, the ranks fixed one after another, "
    "the largest fix alone first"
)


def _fix_row(rank: int, blame: pl.DataFrame | None) -> dict[str, Any] | None:
    """The rank's ``whatif`` blame row (``by`` rank) of the kind (blocking or host) whose
    ``fix_slowdown`` is the larger, or None without one."""
    if blame is None or blame.is_empty() or "fix_slowdown" not in blame.columns:
        return None
    mine = blame.filter(
        (pl.col("by") == "rank") & (pl.col("group") == str(rank)) & pl.col("fix_slowdown").is_not_null()
    ).sort(["fix_slowdown", "kind"], descending=[True, False])
    return mine.row(0, named=True) if mine.height else None


def _other_bounds(rank: int, blame: pl.DataFrame | None) -> str:
    """The other ranks that bound steps (``whatif``'s ``bound_pct`` of 1% or more, of the kind whose
    fix of ``rank`` is the larger (:func:`_fix_row`: a straggler by host gaps is followed by the
    ranks its host gaps' peel names, not by the blocking kind's shares of a negligible excess); up
    to 3, the largest first, each with its share of the saving with every rank fixed, then how many
    more): ``rank 1 (45%), rank 3 (4%)``, ``rank 1 (40%), rank 2 (30%), rank 3 (20%) and 1 more``;
    "" if none."""
    row = _fix_row(rank, blame)
    if row is None or blame is None or "bound_pct" not in blame.columns:
        return ""
    b = (
        blame.filter(
            (pl.col("by") == "rank")
            & (pl.col("kind") == row["kind"])
            & (pl.col("group") != str(rank))
            & (pl.col("bound_pct") >= BOUND_NAMED_PCT)
        )
        .select("group", "bound_pct")
        .sort(["bound_pct", "group"], descending=[True, False])
    )
    return first_few(b.rows(), 3, more=COUNTED, shown=lambda r: f"rank {r[0]} ({r[1]:.0f}%)")


def _combined(
    store: Store, run_id: int, findings: list[Finding], params: dict[str, dict[str, str]] | None = None
) -> tuple[list[Finding], Verdict | None]:
    """The straggler verdict of ``traceprof.engine.verdict`` (stragglers and whatif read together) where
    that module exists; None otherwise or when it does not apply."""
    try:
        from traceprof.engine import verdict
    except ImportError:
        return findings, None
    try:
        v = verdict.combined_verdict(store, str(run_id), params)
    except TraceprofError:
        return findings, None
    absorbed = set(v.figures.get("mesh_absorbed", ()))  # named as their slow stage or replica instead
    findings = [f for f in findings if f.rank not in absorbed]
    s_max = max((x for x in (v.slowdown, v.host_slowdown) if x is not None), default=None)
    if v.status == "problem" and not v.stragglers:
        # A group or stage to blame, no single rank: costed as a named straggler is, by the what-if
        # slowdown (S - 1, in %), the larger of blocking and host.
        cost = 100.0 * (s_max - 1) if s_max is not None else None
        findings = [
            *findings,
            Finding(
                "stragglers",
                v.text,
                cost,
                True,
                "whatif",
                metric="slowdown",
                value=s_max,
                cause=str(v.cause or ""),
                evidence="whatif:blame",
            ),
        ]
    elif v.status in ("ok", "inconclusive") and s_max is not None and s_max > verdict.STRAGGLING_S:
        # slower than ideal with nothing to blame: the run's variability, said (no cost: not a problem);
        # or a rank the straggler test could not judge (too few collectives or steps)
        untested = v.figures.get("untested")
        findings = [
            *findings,
            Finding(
                "stragglers",
                v.text,
                None,
                False,
                "whatif",
                metric="slowdown",
                value=s_max,
                cause="op-time variation spread over the ranks"
                if untested is None
                else f"rank {untested} untested: too few collectives or steps, or no rank to compare with",
                evidence="whatif:summary",
            ),
        ]
    return findings, Verdict("stragglers", v.status, v.text)


def _stragglers(
    res: dict[str, FrameResult], store: Store, run_id: int, params: dict[str, dict[str, str]] | None = None
) -> tuple[list[Finding], Verdict | None]:
    st, wi = res.get("stragglers"), res.get("whatif")
    if st is None and wi is None:
        return [], None
    findings, verdict = _straggler_findings(st, wi)
    if st is not None:  # the combined verdict, where traceprof.engine.verdict exists, replaces this module's
        named = [f for f in findings if f.problem]
        found, combined = _combined(store, run_id, named, params)
        if combined is not None:
            findings, verdict = found, combined
    caveat = _early_end_caveat(st)
    if not caveat:
        return findings, verdict
    # every straggler problem rests on the arrivals (the what-if replay too): say what is off with them
    findings = [
        dataclasses.replace(f, text=f.text + caveat, full=f.full and f.full + caveat)
        if f.topic == "stragglers" and f.problem
        else f
        for f in findings
    ]
    if verdict is not None and verdict.status == "problem":
        verdict = dataclasses.replace(verdict, text=verdict.text + caveat)
    return findings, verdict


#: Share of rank copies ending before their collective's last arrival past which a straggler finding
#: says its waits are not to be trusted (a few are clock noise; most mean the match or the clocks are off).
EARLY_END_SHARE = 0.01


def _early_end_caveat(st: FrameResult | None) -> str:
    """ "; caution: ..." when over :data:`EARLY_END_SHARE` of the rank copies (``stragglers``'
    ``waits`` rows) ended before their instance's last arrival (``end_before_last_arrival``), which
    no collective can: the waits and lateness measured from those arrivals are overstated; else ""."""
    waits = st.frames().get("waits") if st is not None else None
    if waits is None or "end_before_last_arrival" not in waits.columns or not waits.height:
        return ""
    early = int(waits["end_before_last_arrival"].sum())  # false where a source records no end
    if early / waits.height <= EARLY_END_SHARE:
        return ""
    return (
        f"; caution: {early:,} of {waits.height:,} rank copies ended before their collective's last arrival, "
        "which no collective can: the match, the clock alignment or the timestamps are off, so these waits "
        "are overstated"
    )


def _straggler_findings(
    st: FrameResult | None, wi: FrameResult | None
) -> tuple[list[Finding], Verdict | None]:
    """Findings and verdict from the ``stragglers`` and ``whatif`` results alone."""
    s_job = alone = None
    if wi is not None and "summary" in wi.frames() and wi.frames()["summary"].height:
        s_job = wi.frames()["summary"]["slowdown"][0]
    blame = wi.frames().get("blame") if wi is not None else None
    findings: list[Finding] = []
    named = (
        st.frames()["verdict"].filter(pl.col("named"))
        if st is not None and "verdict" in st.frames()
        else None
    )
    if named is not None and named.height:
        per = st.frame if st is not None else pl.DataFrame()
        for v in named.iter_rows(named=True):
            r = per.filter(pl.col("rank") == v["rank"]).row(0, named=True)
            alone = _alone_slowdown(r, blame)
            # the straggler analysis' own cost (% of the step) where it has one, so the two agree
            cost = (
                float(r["cost_pct"])
                if r.get("cost_pct") is not None
                else 100.0 * (alone - 1)
                if alone and alone > 1
                else None
            )
            # wall clock: a waiting rank's overlapping waits (concurrent collectives) count once
            waited = f"the others waited {ms(r['wait_caused_ns'])} in total (wall clock)"
            late = f"median {ms(r['median_lateness_ns'])} late" + (
                f" ({r['late_step_pct']:.0f}% of a step)" if r.get("late_step_pct") is not None else ""
            )
            stepless = r.get("late_step_pct") is None  # null exactly where the run has no steps
            # what fixing it alone buys: the other ranks' lateness kept, a second late rank still
            # bounds the collectives (ranks 1 and 3 140 / 100 us late: 1.04x, while its delays alone
            # add 8% of a step: cost_pct, (alone S - 1) x the ideal step over the recorded one)
            fixed = _fix_slowdown(int(v["rank"]), blame) or alone or 1.0
            spacing = "the collectives' mean spacing"
            others = _other_bounds(int(v["rank"]), blame)
            faster = (
                f"; its delays alone add {100 * (alone - 1):.0f}% of {spacing if stepless else 'a step'} "
                "(what-if), and fixing it alone, "
                f"the other ranks' lateness kept, {'the run' if stepless else 'steps'} would be {fixed:.2f}x "
                "faster (what-if with only its lateness removed"
                + (
                    f"; then {others or 'other ranks'} bound them ({BOUND_SHARES})"
                    if alone - fixed > 0.005
                    else ""
                )
                + ")"
                if alone and alone > 1
                else ""
            )
            # a cause is claimed where a compute z-score backs the split (none without steps)
            because = (
                f"late because of {v['cause']}"
                if r.get("compute_z") is not None
                else f"largest excess: {v['cause']} (no cause claimed without a compute z)"
            )
            text = (
                f"rank {v['rank']} is a straggler: last at {r['last_count']}/{r['instances']} collectives, "
                f"{late}, {waited}; {because}{faster}"
            )
            findings.append(
                Finding(
                    "stragglers",
                    text,
                    cost,
                    True,
                    "stragglers",
                    rank=int(v["rank"]),
                    ranks=(int(v["rank"]),),
                    metric="wait_caused_ns",
                    value=float(r["wait_caused_ns"]),
                    cause=str(v["cause"] or ""),
                    evidence="stragglers:verdict",
                )
            )
        verdict = Verdict(
            "stragglers",
            "problem",
            findings[0].text
            if len(findings) == 1
            else f"ranks {', '.join(str(r) for r in named['rank'])} are stragglers",
        )
        return findings, verdict
    own = st.frames()["verdict"] if st is not None and "verdict" in st.frames() else None
    why = own["evidence"][0] if own is not None and own.height else "no straggler analysis"
    # the straggler analysis' own status: inconclusive stays so, and says "not shown to straggle"
    # (a negative claim it cannot make otherwise), as the combined verdict does
    status = (
        "inconclusive"
        if own is not None and own.height and "status" in own.columns and own["status"][0] == "inconclusive"
        else "ok"
    )
    text = "no straggler: " + why.removeprefix("no single straggler: ").removeprefix(
        "no straggler: "
    ).removeprefix("not shown to straggle: ")
    if status == "inconclusive":
        text = not_shown_to_straggle(text)
    if s_job is not None and s_job > STRAGGLING_S:
        text += (
            f"; steps are {s_job:.2f}x the what-if ideal, from op-time variation spread over the ranks "
            "(no single rank explains it)"
        )
        findings.append(
            Finding(
                "stragglers",
                text,
                None,
                False,
                "whatif",
                metric="slowdown",
                value=float(s_job),
                cause="op-time variation spread over the ranks",
                evidence="whatif:summary",
            )
        )
    elif s_job is not None:
        text += f"; what-if slowdown S = {s_job:.2f} (straggling above {STRAGGLING_S})"
    return findings, Verdict("stragglers", status, text)
