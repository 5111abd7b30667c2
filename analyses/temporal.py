"""temporal: where each rank's accelerator time goes (idle / compute / non-compute).

Algorithm (README.md "Analyses", the same definition as HTA's temporal breakdown):
  1. Take the rank's activity intervals (``traceprof.engine.activity``): GPU kernels, memcpy and memset,
     or on CPU-only ranks the training thread's ops and the gloo work.
  2. Window = first activity start to last activity end, for the whole trace.
  3. idle = window - |∪ all activity|; compute = |∪ compute|; non-compute = |∪ all| - compute.
  4. Percentages are of the window.
  4a. Per step, the rank's time is split into step spans that tile it (``traceprof.engine.stepspans``:
     the step account's rule, on the activity launched in each step): step k's span ends where its work
     ends (its activity's last end, kept non-decreasing over the rank's steps) and starts where step
     k-1's ended, the first at its first activity's start. 1.-4. are taken on all the rank's
     activity within each span (one sweep over the rank's rows, none cut), so a step's parts sum
     to its span and the steps' parts to the rank's, less what lies outside every span (activity
     launched outside any step before the first span or after the last, and the idle time there). Communication of
     step k that runs under step k+1's compute is hidden there, as ``overlap`` counts it: where
     non-compute is only communication, a step's non_compute_ns is overlap's exposed_comm_ns
     whenever each step's communication lies in its own span (a collective that runs into the
     next step does: its step's span ends where it ends).
  5. Beside it, the step window (first ProfilerStep start to last step end, wall clock) and the idle
     time in it (``step_window_ns``, ``step_idle_ns``, ``step_idle_pct``): idle before the first
     kernel of a step (data loading, host stalls) shows there, not in the activity window.
  6. Per device (``devices``): the same breakdown per (rank, device), for processes that drive
     several GPUs (the per-rank figures then merge the devices, as a note says).
With ``hta=true`` the events are selected as HTA loads them (see ``traceprof.engine.activity``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

from traceprof.analyses import _common
from traceprof.core import columns as rc
from traceprof.core.schema import Column
from traceprof.engine.activity import (
    excluded_note,
    graph_level_notes,
    launches_without_kernels,
    multi_device_ranks,
    run_activity,
    run_measures,
    step_window,
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
    register,
)
from traceprof.engine.intervals import class_measures
from traceprof.engine.stepspans import step_span_measures
from traceprof.storage.store import Store

#: The idle share (% of the window) from which the idle topic says ``problem``.
IDLE_PROBLEM_PCT = 10.0


@dataclass(frozen=True)
class Params(RunParams):
    """``hta``: select events as HTA 0.5.0 does (drops the last step and unlaunched GPU events)."""

    hta: bool = False


@dataclass(frozen=True)
class Result(FrameResult):
    """Per-rank breakdown (``frame``), per step (``steps``) and per device (``devices``, GPU
    ranks); their columns are declared in :data:`SPEC`."""

    steps: pl.DataFrame = field(default_factory=pl.DataFrame)
    devices: pl.DataFrame = field(default_factory=pl.DataFrame)
    title = "Temporal breakdown"

    def charts(self) -> list[Chart]:
        return [
            Chart(
                "Share of the window per rank",
                "rank",
                ("compute_pct", "non_compute_pct", "idle_pct"),
                stacked=True,
                ylabel="% of window",
            )
        ]


#: The activity columns temporal reads (``traceprof.engine.activity``): not lanes nor names.
_ACTIVITY = ("rank", "class", "start_ns", "end_ns", "step", "device_kind", "device")


def _breakdown(m: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """The breakdown's columns of measures ``m`` (``intervals.class_measures`` grouped by ``by``)."""
    pct = pl.when(pl.col("window_ns") > 0).then(100.0 / pl.col("window_ns"))  # a 0 ns step span: null
    return m.select(
        *by,
        "window_ns",
        (pl.col("window_ns") - pl.col("busy_ns")).alias("idle_ns"),
        "compute_ns",
        (pl.col("busy_ns") - pl.col("compute_ns")).alias("non_compute_ns"),
    ).with_columns(
        (pl.col("idle_ns") * pct).alias("idle_pct"),
        (pl.col("compute_ns") * pct).alias("compute_pct"),
        (pl.col("non_compute_ns") * pct).alias("non_compute_pct"),
    )


def _device_measures(act: pl.DataFrame, by_rank: pl.DataFrame, multi: bool) -> pl.DataFrame:
    """``class_measures`` of ``act``'s GPU rows grouped by (rank, device); an empty frame without
    GPU rows. Where every row is a GPU row and no rank drives several devices (``multi`` False),
    each rank is one (rank, device) group of the same rows, so its measures are ``by_rank``'s
    (the per-rank measures of ``act``) with the rank's device beside them: no second sweep."""
    kind = act.get_column("device_kind")
    if not multi and act.height and not kind.null_count() and bool((kind == "gpu").all()):
        device = act.group_by("rank").agg(pl.col("device").first())
        m = by_rank.join(device, on="rank", how="left", maintain_order="left")
        return m.select("rank", "device", pl.exclude("rank", "device")).sort("rank", "device")
    gpu = (  # the columns the breakdown reads, of the GPU rows
        act.lazy()
        .filter(pl.col("device_kind") == "gpu")
        .select("rank", "device", "class", "start_ns", "end_ns")
        .collect()
    )
    return class_measures(gpu, ["rank", "device"]) if not gpu.is_empty() else pl.DataFrame()


def breakdown_columns(*keys: Column) -> tuple[Column, ...]:
    """rank, ``keys``, window_ns and the breakdown's columns (``steps``, ``devices``)."""
    return (
        rc.RANK,
        *keys,
        rc.WINDOW_NS,
        rc.ns("idle_ns", "Window minus the union of all activity"),
        rc.ns("compute_ns", "Union of compute activity"),
        rc.ns(
            "non_compute_ns",
            "Union of all activity minus compute: communication and memory work not under compute",
        ),
        rc.pct("idle_pct", "idle_ns, % of window_ns"),
        rc.pct("compute_pct", "compute_ns, % of window_ns"),
        rc.pct("non_compute_pct", "non_compute_ns, % of window_ns"),
    )


def _per_device(te: FrameResult) -> tuple[pl.DataFrame, str]:
    """Temporal's per-rank frame with the idle share of each rank that drives several GPUs taken
    over its devices (the sum of their idle time over the sum of their windows: the merged window
    hides one device's idle time under another's work), and the idle verdict's clause that says so
    with the merged figure beside it ("" where no rank drives several GPUs)."""
    frame = te.frame
    dev = te.devices if isinstance(te, Result) else pl.DataFrame()
    if dev.is_empty():
        return frame, ""
    per = (
        dev.group_by("rank")
        .agg(pl.len().alias("n"), pl.col("idle_ns").sum(), pl.col("window_ns").sum())
        .filter(pl.col("n") > 1)
        .sort("rank")
    )
    if per.is_empty():
        return frame, ""
    share = per.select("rank", (100.0 * pl.col("idle_ns") / pl.col("window_ns")).alias("dev_idle_pct"))
    merged = frame.filter(pl.col("rank").is_in(per["rank"].to_list())).sort("rank")
    frame = (
        frame.join(share, on="rank", how="left", maintain_order="left")
        .with_columns(pl.coalesce("dev_idle_pct", "idle_pct").alias("idle_pct"))
        .drop("dev_idle_pct")
    )
    figures = "; ".join(
        f"rank {r['rank']} {_common.ms(r['idle_ns'])} of {_common.ms(r['window_ns'])}"
        for r in per.iter_rows(named=True)
    )
    worst = (
        dev.filter(pl.col("rank").is_in(per["rank"].to_list()))
        .sort(["idle_pct", "rank", "device"], descending=[True, False, False])
        .row(0, named=True)
    )
    ranks = ", ".join(map(str, per["rank"]))
    return frame, (
        f"; rank(s) {ranks} drive several GPUs: their idle share is per device (idle time over the sum "
        f"of their devices' windows: {figures}; most idle rank {worst['rank']} device {worst['device']} "
        f"{worst['idle_pct']:.0f}%, temporal's devices table); merged (one window over all devices): "
        + ", ".join(f"rank {r['rank']} {r['idle_pct']:.0f}%" for r in merged.iter_rows(named=True))
        + " (the step window's figure merges them too)"
    )


def _host_bound(devices: pl.DataFrame) -> bool:
    """Whether host wait is most of the devices' idle time (``idle``'s ``devices`` frame)."""
    return 2 * _common.num(devices["host_wait_ns"].sum()) > _common.num(devices["idle_ns"].sum())


def _idle_cause(devices: pl.DataFrame) -> str:
    """The idle verdict's cause: the GPUs' idle time (no stream of a device busy, summed over the
    ranks' devices) by cause, and the stream whose kernels end most of the host wait. Not the
    per-stream sums: a stream with two kernels is idle over its whole window, all of it "host wait"."""
    total = _common.num(devices["idle_ns"].sum())
    if not total:
        return ""
    shares = ", ".join(
        f"{label} {100.0 * _common.num(devices[f'{c}_ns'].sum()) / total:.0f}%"
        for c, label in (
            ("host_wait", "host wait (kernels launched late)"),
            ("kernel_wait", "kernel wait"),
            ("other", "other"),
        )
    )
    text = f"; of the GPU's idle time (no stream busy) {shares}"
    hit = devices.filter(pl.col("host_wait_stream").is_not_null())
    if hit.height:
        top = hit.sort(["host_wait_ns", "rank", "device"], descending=[True, False, False]).row(0, named=True)
        multi = devices.height > devices["rank"].n_unique()  # a rank driving several GPUs
        where = f"rank {top['rank']}" + (f" device {top['device']}" if multi else "")
        text += (
            f"; host wait mostly before stream {top['host_wait_stream']}'s kernels ({where}: "
            f"{top['host_wait_stream_pct']:.0f}% of its host wait)"
        )
    return text


def _idle_topic(inp: FindingsInput) -> tuple[list[Finding], Verdict | None]:
    """The idle topic: the mean idle share of the window over ranks (over those that are not named
    stragglers: their idle time is their finding's), with ``idle``'s causes of the devices' idle time."""
    res = inp.results
    te = res.get("temporal")
    cpu = res.get("idle") is None
    if cpu and (why := launches_without_kernels(inp.store, inp.run_id)):
        return [], Verdict("idle", "inconclusive", why)  # its GPU rows are copies, or none: no idle share
    if te is None or te.frame.is_empty():
        return [], None
    what = "the training thread" if cpu else "the GPU"
    named = _common.named_ranks(res)
    frame, devices = _per_device(te)
    others = frame.filter(~pl.col("rank").is_in(named))
    pool = others if named and others.height else frame
    step_idle = (
        pool["step_idle_pct"].drop_nulls()
        if "step_idle_pct" in pool.columns
        else pl.Series([], dtype=pl.Float64)
    )
    step_mean = _common.num(step_idle.mean()) if step_idle.len() else None
    # where the step window's idle share reads otherwise, the window of this one is named (the
    # ranking measures over the steps, by the step account)
    mean = _common.num(pool["idle_pct"].mean())
    both = step_mean is not None and f"{step_mean:.0f}" != f"{mean:.0f}" and mean >= IDLE_PROBLEM_PCT
    window = "activity window (first to last activity; " if both else "window ("
    if named and others.height:
        # A straggler's own idle time (its sleep, its stall) is why it is late: the straggler
        # finding counts it, so idle costs what the other ranks are idle.
        own = frame.filter(pl.col("rank").is_in(named)).sort("rank")
        theirs = ", ".join(f"rank {r['rank']} {r['idle_pct']:.0f}%" for r in own.iter_rows(named=True))
        worst = others.sort(["idle_pct", "rank"], descending=[True, False]).row(0, named=True)
        text = (
            f"{what} is idle {mean:.0f}% of the {window}mean over the ranks that are not stragglers; rank "
            f"{worst['rank']} {worst['idle_pct']:.0f}%); the straggler's own idle time ({theirs}) is "
            "counted in its finding"
        )
    else:
        worst = frame.sort(["idle_pct", "rank"], descending=[True, False]).row(0, named=True)
        text = (
            f"{what} is idle {mean:.0f}% of the {window}mean over ranks; rank {worst['rank']} "
            f"{worst['idle_pct']:.0f}%)"
        )
    if both:
        text += f" and {step_mean:.0f}% of the step window (ProfilerStep start to end: the step account's)"
    idle = res.get("idle")
    cause = ""
    if idle is not None and "devices" in idle.frames():
        text += _idle_cause(idle.frames()["devices"])
        if _host_bound(idle.frames()["devices"]):
            cause = "host wait (kernels launched late)"
    text += devices
    if _common.graph_level(te):
        text += (
            "; CUDA graphs were traced per graph: each execution counts as busy compute time (nsys profile "
            "--cuda-graph-trace=node records their kernels)"
        )
    # GPU records known to be missing (graph launches, kernel launches beyond idle's threshold): the
    # shares above are not the GPU's, too high or (a window cut short) too low: inconclusive
    lost = [n for n in (_common.graph_lost(te), _common.launches_lost(idle) if idle is not None else "") if n]
    for n in lost:
        text += f"; {n}"
    problem = mean >= IDLE_PROBLEM_PCT and not lost
    status = "problem" if problem else "inconclusive" if lost else "ok"
    # The activity window (first to last kernel) hides idle time outside it: a step that launches
    # one short kernel is "0 % idle" there and ~100 % idle over the step. Where the step window's
    # idle share (wall clock) reaches the threshold the window's does not, the two disagree: not ok
    # (the step account counts that time as host-bound or idle), and not a problem on the narrower
    # measure either: inconclusive, with both figures.
    if mean < IDLE_PROBLEM_PCT and step_mean is not None and step_mean >= IDLE_PROBLEM_PCT:
        status = "inconclusive"
        text += (
            f"; but idle {step_mean:.1f}% of the step window (ProfilerStep start to end, wall clock, mean over "
            f"ranks): the activity window (first to last activity) leaves out the time between its steps' "
            "work, so it shows no idle-free step"
        )
    found = Finding(
        "idle",
        text,
        mean,
        problem,
        "temporal",
        ranks=(int(worst["rank"]),),
        metric="idle_pct",
        value=mean,
        cause=cause,
    )
    return [found], Verdict("idle", status, text)


SPEC = Analysis(
    name="temporal",
    params=Params,
    result=Result,
    frames=(
        rc.frame(
            "frame",
            "Per rank: its whole window, and its step window",
            *breakdown_columns(),
            rc.ns(
                "step_window_ns",
                "Step window: first ProfilerStep start to last step end (wall clock); null without steps",
            ),
            rc.ns("step_busy_ns", "Union of the rank's activity inside its step window"),
            rc.ns(
                "step_idle_ns",
                "step_window_ns minus step_busy_ns (idle before a step's first kernel shows here)",
            ),
            rc.pct("step_idle_pct", "step_idle_ns, % of step_window_ns; null without steps"),
        ),
        rc.frame(
            "steps",
            "Per (rank, step): the rank's activity within the step's span (spans tile the rank's time: "
            "a step ends where its activity ends, the next starts there; module doc, step 4a)",
            *breakdown_columns(rc.STEP),
            worst="idle_ns",
        ),
        rc.frame(
            "devices",
            "Per (rank, device) of GPU ranks (a process that drives several GPUs)",
            *breakdown_columns(rc.DEVICE),
        ),
    ),
    report=Report(10, "GPU kernels or CPU training-thread ops (a Kineto trace)"),
    findings=Topic("idle", 30, _idle_topic),
    per_rank=PerRank(),
)


@register(SPEC)
def run(store: Store, params: Params) -> Result:
    """Temporal breakdown per rank and per step of one run.

    Raises:
        StoreError: No such run.
        AnalysisError: The run has no GPU or CPU activity.
    """
    run_id, act = run_activity(store, params.run, hta=params.hta, columns=_ACTIVITY)
    by_rank = run_measures(store, run_id, act, ["rank"], hta=params.hta)
    per_rank = _breakdown(by_rank, ["rank"]).join(
        step_window(store, run_id, act, hta=params.hta), on="rank", how="left"
    )
    per_step = _breakdown(
        step_span_measures(act, run_measures(store, run_id, act, ["rank", "step"], hta=params.hta)),
        ["rank", "step"],
    )
    multi = multi_device_ranks(act)
    by_device = _device_measures(act, by_rank, bool(multi))
    per_device = _breakdown(by_device, ["rank", "device"]) if not by_device.is_empty() else pl.DataFrame()
    notes = ["HTA-compatible selection (last step and unlaunched GPU events dropped)"] if params.hta else []
    if multi:
        notes.append(
            Note(
                "rank(s) {ranks} drive several GPUs: the per-rank figures merge their devices (one "
                "window over all); see the devices table",
                ranks=multi,
            )
        )
    notes += graph_level_notes(store, run_id)
    notes += [
        n for n in (excluded_note(store, run_id, params.hta), _outside_steps_note(per_rank, per_step)) if n
    ]
    return Result(frame=per_rank, steps=per_step, devices=per_device, notes=tuple(notes))


# ranks named with their figure in the outside-steps note; the rest counted
_OUTSIDE_NAMED = 5


def _outside_steps_note(per_rank: pl.DataFrame, per_step: pl.DataFrame) -> str:
    """The time of each rank's activity window (``frame.window_ns``, ns) that no step span holds
    (the window less the sum of its steps' ``window_ns``): activity launched before the first step's
    work or after the last step's (a step cut at the trace's edge, a copy whose launch the trace lacks),
    which the steps table leaves out, so that its parts sum to less than the rank's. ``""`` when
    every rank with steps is tiled whole (ranks without steps have no rows there)."""
    if per_step.is_empty() or per_rank.is_empty():
        return ""
    spans = per_step.group_by("rank").agg(pl.col("window_ns").sum().alias("steps_ns"))
    out = (
        per_rank.select("rank", "window_ns")
        .join(spans, on="rank", how="inner")
        .with_columns((pl.col("window_ns") - pl.col("steps_ns")).alias("outside_ns"))
        .filter(pl.col("outside_ns") > 0)
        .sort(["outside_ns", "rank"], descending=[True, False])
    )
    if out.is_empty():
        return ""
    named = ", ".join(
        f"rank {r['rank']} {_common.ms(r['outside_ns'])} of {_common.ms(r['window_ns'])}"
        for r in out.head(_OUTSIDE_NAMED).iter_rows(named=True)
    )
    more = f" and {out.height - _OUTSIDE_NAMED} more rank(s)" if out.height > _OUTSIDE_NAMED else ""
    return (
        f"activity outside every step span (before the first step's work or after the last step's: a step "
        f"cut at the trace's edge, work launched outside the steps) is left out of the steps table, whose "
        f"parts then sum to less than the rank's: {named}{more}"
    )
