"""overlap: how much of each rank's communication is hidden behind computation.

Algorithm (README.md "Analyses"; HTA's "comm-comp overlap" and Nsight's recipes use the same definition):
  1. Merge the rank's comm intervals and its compute intervals separately, all streams together
     (``traceprof.engine.activity``: NCCL/RCCL kernels vs compute kernels; gloo work vs training-thread
     ops on CPU-only ranks).
  2. overlap = |comm ∩ compute| = |comm| + |compute| - |comm ∪ compute|.
  3. overlap_pct = overlap / |comm|; exposed communication = |comm| - overlap.
  4. The same per step: the step's communication and compute are the activity launched in it (on
     CPU ranks: started in it), window = first start to last end of that activity. Communication
     counts as hidden when any compute of the rank runs at the same time, also compute of another
     step (e.g. the next step's forward under this step's last all-reduce), so a step's exposed
     communication is |comm of the step - all compute of the rank| and overlap = comm - exposed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

from traceprof.analyses import _common, _waits
from traceprof.core import columns as rc
from traceprof.core.schema import Column
from traceprof.engine.activity import (
    activity,
    excluded_note,
    exposed_comm,
    graph_level_notes,
    multi_device_ranks,
    run_activity,
    run_measures,
)
from traceprof.engine.analysis import (
    Analysis,
    Chart,
    Finding,
    FindingsInput,
    FrameResult,
    Note,
    PerRank,
    Report,
    RunParams,
    Topic,
    Verdict,
    make_params,
    register,
)
from traceprof.engine.intervals import class_measures
from traceprof.ingest.matching import preferred_source
from traceprof.storage.runs import PROFILER_SOURCES, rank_list, untraced_ranks
from traceprof.storage.store import Store


@dataclass(frozen=True)
class Params(RunParams):
    """``hta``: select events as HTA 0.5.0 does (drops the last step and unlaunched GPU events)."""

    hta: bool = False


@dataclass(frozen=True)
class Result(FrameResult):
    """Per-rank overlap (``frame``), per step (``steps``) and per device (``devices``, only when a
    rank drives several GPUs); their columns are declared in :data:`SPEC`."""

    steps: pl.DataFrame = field(default_factory=pl.DataFrame)
    devices: pl.DataFrame = field(default_factory=pl.DataFrame)
    title = "Communication/computation overlap"

    def charts(self) -> list[Chart]:
        return [
            Chart(
                "Communication per rank: hidden vs exposed",
                "rank",
                ("overlap_ns", "exposed_comm_ns"),
                stacked=True,
                ylabel="ns",
            ),
        ]


#: The activity columns overlap reads (``traceprof.engine.activity``): not lanes nor names.
_ACTIVITY = ("rank", "class", "start_ns", "end_ns", "step", "device_kind", "device")


def _overlap(act: pl.DataFrame, by: list[str], m: pl.DataFrame | None = None) -> pl.DataFrame:
    """The overlap columns of ``act`` grouped by ``by``; ``m``: its ``class_measures`` when the
    caller has them (``run_measures``)."""
    m = class_measures(act, by) if m is None else m
    if "step" in by:  # hidden behind any compute of the rank (module doc, step 4)
        exp = (
            exposed_comm(act, by)
            .group_by(by)
            .agg((pl.col("end_ns") - pl.col("start_ns")).sum().alias("_exp"))
        )
        m = (
            m.join(exp, on=by, how="left")
            .with_columns((pl.col("comm_ns") - pl.col("_exp").fill_null(0)).alias("overlap_ns"))
            .drop("_exp")
        )
    return m.select(
        *by,
        "comm_ns",
        "compute_ns",
        "overlap_ns",
        (pl.col("comm_ns") - pl.col("overlap_ns")).alias("exposed_comm_ns"),
        "window_ns",
    ).with_columns(
        pl.when(pl.col("comm_ns") > 0)
        .then(100.0 * pl.col("overlap_ns") / pl.col("comm_ns"))
        .otherwise(None)
        .alias("overlap_pct"),
        (100.0 * pl.col("exposed_comm_ns") / pl.col("window_ns")).alias("exposed_comm_pct"),
    )


def overlap_columns(*keys: Column) -> tuple[Column, ...]:
    """rank, ``keys`` and the overlap columns."""
    return (
        rc.RANK,
        *keys,
        rc.ns("comm_ns", "Union of communication"),
        rc.ns("compute_ns", "Union of compute"),
        rc.ns("overlap_ns", "Communication hidden behind compute: |comm ∩ compute|"),
        rc.ns("exposed_comm_ns", "Communication not hidden: comm_ns - overlap_ns"),
        rc.WINDOW_NS,
        rc.pct("overlap_pct", "overlap_ns, % of comm_ns; null without communication"),
        rc.pct("exposed_comm_pct", "exposed_comm_ns, % of window_ns"),
    )


def untraced_comm_text(store: Store, run_id: int) -> str:
    """Why exposed communication is no evidence of communication to fix on run ``run_id`` when ranks
    of the job have no profiler (Kineto/nsys) trace (``storage.runs.untraced_ranks``: a rank with a
    dump only has no timeline): a collective ends after its last member arrives, so without an
    untraced member's arrival the wait for it reads as transfer. Empty when every rank was traced.
    The summary's communication verdict (inconclusive where it would be a problem) and the notes of
    ``analyze overlap`` and ``analyze gaps`` say it alike."""
    untraced, _ = untraced_ranks(store, run_id, PROFILER_SOURCES)
    if not untraced:
        return ""
    return (
        f"rank(s) {rank_list(untraced)} not traced: exposed time at a collective may be waiting for "
        "them (their arrival is unknown, so the wait counts as transfer), not communication to fix"
    )


def untraced_comm_note(store: Store, run_id: int) -> str | None:
    """:func:`untraced_comm_text` as a note of ``overlap`` and ``gaps`` (None: every rank traced)."""
    gap = untraced_comm_text(store, run_id)
    return (
        f"{gap}; so the summary calls exposed communication above its threshold inconclusive, not a problem"
        if gap
        else None
    )


def _copies(st: FrameResult | None, p2p: pl.DataFrame | None) -> pl.DataFrame | None:
    """The copies whose waits the communication verdict may take out, built once: every copy of
    ``stragglers``' ``waits`` (own arrival to the last arrival, with the instance's last_rank) and
    the point-to-point pairs ``p2p`` (``traceprof.analyses._waits.p2p_copies``: own arrival to the
    peer's; flagged p2p), as ``traceprof.analyses._waits.beyond_waits`` reads them; None when there
    is neither."""
    parts = [p2p.with_columns(pl.lit(True).alias("p2p"))] if p2p is not None and p2p.height else []
    if st is not None:
        waits = st.frames()["waits"].join(
            st.frames()["instances"].select("instance_id", "last_rank"), on="instance_id", how="left"
        )
        parts.append(waits.with_columns((pl.col("arrival_ns") + pl.col("wait_ns")).alias("last_ns")))
    if not parts:
        return None
    keep = ["rank", "instance_id", "arrival_ns", "last_ns", "last_rank", "start_ns", "end_ns"]
    return pl.concat(
        [f.select(*keep, *(["p2p"] if "p2p" in f.columns else [])) for f in parts], how="diagonal_relaxed"
    )


def _exposed(inp: FindingsInput) -> pl.DataFrame:
    """The exposed-communication intervals of each rank (overlap's, with the run's ``-p overlap.hta``):
    rank, start_ns, end_ns."""
    given = inp.params.get("overlap")
    hta = bool(make_params(SPEC, None, given).hta) if given else False
    # only the communication and compute rows, the columns exposed_comm reads: taken from the
    # session's frame while it holds one, else read alone and not kept (the report's analyses have
    # let go of their frame by now; reading it whole again here made the report's peak: 8 ranks x
    # 1 M events, 978-1,040 MiB)
    cols = ("rank", "class", "start_ns", "end_ns", "step")
    act = activity(
        inp.store, inp.run_id, hta=hta, columns=cols, classes=("comm", "compute"), alone=True, keep=False
    )
    return exposed_comm(act, ["rank"])


def _per_device(ov: FrameResult) -> tuple[pl.DataFrame, str]:
    """Overlap's per-rank frame with each rank that drives several GPUs taken over its devices (its
    devices' communication, hidden and exposed time and windows summed: merged, one device's
    communication counts as hidden behind another device's compute), and the communication verdict's
    clause that says so with the merged figure beside it ("" where no rank drives several GPUs), as
    temporal's idle share is."""
    frame = ov.frame
    dev = ov.devices if isinstance(ov, Result) else pl.DataFrame()
    if dev.is_empty():
        return frame, ""
    sums = ("comm_ns", "compute_ns", "overlap_ns", "exposed_comm_ns", "window_ns")
    per = (
        dev.group_by("rank")
        .agg(pl.len().alias("_n"), *(pl.col(c).sum() for c in sums))
        .filter(pl.col("_n") > 1)
        .drop("_n")
        .sort("rank")
    )
    if per.is_empty():
        return frame, ""
    per = per.with_columns(
        pl.when(pl.col("comm_ns") > 0)
        .then(100.0 * pl.col("overlap_ns") / pl.col("comm_ns"))
        .otherwise(None)
        .alias("overlap_pct"),
        (100.0 * pl.col("exposed_comm_ns") / pl.col("window_ns")).alias("exposed_comm_pct"),
    )
    merged = frame.filter(pl.col("rank").is_in(per["rank"].to_list())).sort("rank")
    frame = pl.concat(
        [frame.filter(~pl.col("rank").is_in(per["rank"].to_list())), per.select(frame.columns)]
    ).sort("rank")
    figures = "; ".join(
        f"rank {r['rank']} {_common.ms(r['exposed_comm_ns'])} of {_common.ms(r['window_ns'])}"
        for r in per.iter_rows(named=True)
    )
    ranks = ", ".join(map(str, per["rank"]))
    return frame, (
        f"; rank(s) {ranks} drive several GPUs: their figures are per device (each device's communication "
        f"against that device's compute, exposed time over the sum of their devices' windows: {figures}; "
        "overlap's devices table); merged (one device's communication hidden behind any device's compute): "
        + ", ".join(
            f"rank {r['rank']} exposed {r['exposed_comm_pct']:.0f}% of the window"
            for r in merged.iter_rows(named=True)
        )
    )


def _communication_topic(inp: FindingsInput) -> tuple[list[Finding], Verdict | None]:
    """The communication topic: exposed communication, median over ranks, with the worst rank and
    ``gaps``' largest cause; where ``stragglers`` names a straggler, the exposed communication
    beyond the waits for it (wall clock: the waits are its cost): the exposed-communication
    intervals (:func:`_exposed`) minus the wall-clock union of the rank's waits (:func:`_copies`) at
    the instances a named rank arrived last at and at the point-to-point pairs, less what is
    transfer of another collective (``traceprof.analyses._waits.beyond_waits``; ``critical_path``'s
    precedence); likewise beyond the waits for a rank ``stragglers`` could not judge."""
    res = inp.results
    ov = res.get("overlap")
    if ov is None or ov.frame.is_empty() or "exposed_comm_pct" not in ov.frame.columns:
        return [], None
    frame, devices = _per_device(ov)
    df = frame.filter(pl.col("exposed_comm_pct").is_not_null())
    if df.is_empty() or (df["comm_ns"] == 0).all():
        if _common.graph_level(ov):  # communication inside a graph traced per graph is not seen
            return [], Verdict(
                "communication",
                "n/a",
                "no communication kernels in the trace, but CUDA graphs were "
                "traced per graph and may hold some: record them with nsys profile "
                "--cuda-graph-trace=node",
            )
        return [], Verdict("communication", "ok", "no communication in the trace")
    worst = df.sort(["exposed_comm_pct", "rank"], descending=[True, False]).row(0, named=True)
    median = _common.num(df["exposed_comm_pct"].median())
    cause = full_cause = top_cause = ""
    gaps = res.get("gaps")
    if gaps is not None and gaps.frame.height and "cause" in gaps.frame.columns:
        top = gaps.frame.row(0, named=True)
        top_cause = str(top["cause"] or "")
        cause = f"; largest cause: {top['cause']} ({top['pct']:.0f}% of exposed time)"
        before = top.get("before") or ""
        if (
            _common.finding_name(before) != before
        ):  # a 1,000-character kernel name: its family, the full name in the report
            full_cause, cause = cause, cause.replace(before, _common.finding_name(before))
    overlap = (
        f"; {worst['overlap_pct']:.0f}% of its communication hidden"
        if worst.get("overlap_pct") is not None
        else ""
    )
    # each median names its measure: the exposed share of the window, the hidden share of communication
    hidden = (
        df["overlap_pct"].drop_nulls() if "overlap_pct" in df.columns else pl.Series([], dtype=pl.Float64)
    )
    medians = f"exposed {median:.0f}% of the window" + (
        f", hidden {_common.num(hidden.median()):.0f}% of communication" if hidden.len() else ""
    )
    text = (
        f"exposed communication: {worst['exposed_comm_pct']:.0f}% of the window on rank {worst['rank']} "
        f"({_common.ms(worst['exposed_comm_ns'])}{overlap}; median over ranks: {medians}){devices}{cause}"
    )
    cost = median
    plain = text.removeprefix("exposed communication: ")
    stragglers = res.get("stragglers")
    named_ranks = _common.named_ranks(res)
    has_waits = stragglers is not None and "waits" in stragglers.frames()
    p2p = _waits.p2p_copies(inp.store, inp.run_id, preferred_source(inp.store, inp.run_id))
    copies = _copies(stragglers if has_waits else None, p2p)  # every wait it may take out, built once
    exposed: list[pl.DataFrame] = []  # read once, when a wait is taken out

    def beyond_pct(copies: pl.DataFrame, ranks: list[int]) -> float:
        """The median over ranks of the exposed communication beyond the waits for ``ranks`` and
        the point-to-point waits, % of the window."""
        if not exposed:
            exposed.append(_exposed(inp))
        beyond = _waits.beyond_waits(exposed[0], copies, ranks)
        own = df.join(beyond, on="rank", how="left").select(
            (100.0 * pl.col("beyond_ns").fill_null(0) / pl.col("window_ns")).median()
        )
        return float(own.item() or 0.0)

    straggler = bool(named_ranks) and has_waits
    if copies is not None and (straggler or p2p.height):
        # Waiting at a collective for a late peer shows as exposed communication: it is the
        # straggler's cost (counted there), so only the exposed time beyond it costs here; so is
        # a send / recv waiting for its peer stage to post the other end (a slow stage, the
        # pipeline's bubble).
        cost = beyond_pct(copies, named_ranks)
        named = ", ".join(map(str, named_ranks))
        waited = " and ".join(
            ([f"waiting for the straggler (rank {named})"] if straggler else [])
            + (["point-to-point waits for the peer"] if p2p.height else [])
        )
        text = (
            f"exposed communication beyond {waited}: {cost:.0f}% of the window "
            f"(median over ranks); with the wait, {plain}"
        )
    problem = cost >= 5.0
    status = "problem" if problem else "ok"
    untested = _common.untested_rank(res) if problem and has_waits else None
    if untested is not None and copies is not None:
        # the waits for a rank the straggler test could not judge (too few collectives or steps):
        # its cost if it is a straggler, this topic's if not; when the verdict hangs on them, say so
        # (with the point-to-point waits, as above)
        own_pct = beyond_pct(copies, [untested])
        also = " and point-to-point waits for the peer" if p2p.height else ""
        text = (
            f"exposed communication beyond waiting for rank {untested} (the straggler test could not judge it: "
            f"too few collectives or steps, or no rank to compare with){also}: {own_pct:.0f}% of the window "
            f"(median over ranks); with the wait, {plain}"
        )
        if own_pct < 5.0:  # a problem only if that rank is not a straggler: open, as that is
            status = "inconclusive"
    gap = untraced_comm_text(inp.store, inp.run_id)
    if problem and gap:
        status = "inconclusive"
        text += f"; {gap}"
    full = text.replace(cause, full_cause) if full_cause else ""
    f = Finding(
        "communication",
        text,
        cost,
        problem,
        "gaps" if cause else "overlap",
        full,
        ranks=(int(worst["rank"]),),
        metric="exposed_comm_pct",
        value=cost,
        cause=top_cause,
    )
    return [f], Verdict("communication", status, text)


SPEC = Analysis(
    name="overlap",
    params=Params,
    result=Result,
    frames=(
        rc.frame("frame", "Per rank", *overlap_columns()),
        rc.frame(
            "steps",
            "Per (rank, step): the step's communication against all the rank's compute; window of the "
            "step's activity",
            *overlap_columns(rc.STEP),
            worst="exposed_comm_ns",
        ),
        rc.frame(
            "devices",
            "Per (rank, device), only when a rank drives several GPUs: each device's communication "
            "against that device's compute",
            *overlap_columns(rc.DEVICE),
        ),
    ),
    report=Report(20, "GPU kernels or CPU training-thread ops (a Kineto trace)"),
    findings=Topic("communication", 20, _communication_topic),
    per_rank=PerRank(),
)


@register(SPEC)
def run(store: Store, params: Params) -> Result:
    """Communication/computation overlap per rank and per step of one run.

    Raises:
        StoreError: No such run.
        AnalysisError: The run has no GPU or CPU activity.
    """
    run_id, act = run_activity(store, params.run, hta=params.hta, columns=_ACTIVITY)
    per_rank = _overlap(act, ["rank"], run_measures(store, run_id, act, ["rank"], hta=params.hta))
    by_step = run_measures(store, run_id, act, ["rank", "step"], hta=params.hta)
    per_step = _overlap(act, ["rank", "step"], by_step).filter(pl.col("step").is_not_null())
    notes: list[str] = []
    multi = multi_device_ranks(act)
    per_device = pl.DataFrame()
    if multi:
        gpu = act.lazy().filter(pl.col("device_kind") == "gpu")  # copies the columns read only
        per_device = _overlap(
            gpu.select("rank", "device", "class", "start_ns", "end_ns").collect(), ["rank", "device"]
        )
        notes.append(
            Note(
                "rank(s) {ranks} drive several GPUs: per rank, communication on one device counts as "
                "hidden behind compute on any of them; the devices table keeps them apart",
                ranks=multi,
            )
        )
    no_comm = per_rank.filter(pl.col("comm_ns") == 0)["rank"].to_list()
    if no_comm:
        notes.append(Note("ranks without communication (overlap undefined): [{ranks}]", ranks=no_comm))
    if params.hta:
        notes.append("HTA-compatible selection (last step and unlaunched GPU events dropped)")
    notes += graph_level_notes(store, run_id)
    notes += [n for n in (excluded_note(store, run_id, params.hta), untraced_comm_note(store, run_id)) if n]
    return Result(frame=per_rank, steps=per_step, devices=per_device, notes=tuple(notes))
