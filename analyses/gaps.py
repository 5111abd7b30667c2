"""gaps: where communication is exposed, which collective ran, and what compute came just before.

Algorithm (README.md "Analyses": Exposed communication / overlap gaps):
  1. Take each rank's activity (``traceprof.engine.activity``): NCCL/RCCL kernels vs compute kernels on
     GPU ranks; gloo work vs training-thread ops on CPU-only ranks.
  2. Gaps: for each (rank, step), the step's communication minus all of the rank's compute
     (``traceprof.analyses.overlap.exposed_comm``), as maximal intervals. A gap belongs to the step its
     communication was launched in (CPU ranks: started in); null step = outside ProfilerSteps.
     Exposed communication of two steps running at the same time counts in both steps' gaps.
  3. Collectives running: the ``collectives`` rows of the same rank and step that overlap the gap.
     The one overlapping it longest (ties: the earliest) names it: op, process group, seq, bytes
     (the larger of input and output size).
  4. Compute before: the rank's compute interval with the latest end at or before the gap start
     (``last_compute``). For a kernel, the CPU ops around the runtime call that launched it (same
     correlation): the innermost (``launch_op``) and outermost (``top_op``) ``cpu_op`` or
     ``user_annotation`` on the launching thread containing the call. For a CPU op, ``top_op`` is
     the outermost op containing its start (``launch_op`` is null: nothing was launched).
  5. Cause = "<collective> after <top_op, else launch_op, else last_compute>"; causes are ranked by
     their exposed time summed over ranks and steps.
  6. Per rank: exposed = |comm - compute| and its share of the rank's window (as ``overlap``); per
     step: the step's gaps as ns and as % of the step's window (as ``overlap --table steps``).
On a run where a process drives several GPUs all of the above is per (rank, device) (noted): a
device's communication is exposed unless that device computes, its gap's collective is one on that
device and its compute before is that device's; a rank's and a step's comm_ns, exposed_ns and
window are the sums of its devices' (as ``overlap``'s devices table and the communication verdict).
Every gap names its ``device``: the GPU its communication ran on (a one-GPU rank's only GPU; null on
CPU ranks).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from traceprof.analyses.overlap import exposed_comm, untraced_comm_note
from traceprof.core import columns as rc
from traceprof.core.schema import sql_texts
from traceprof.engine.activity import (
    compute_merged,
    excluded_note,
    graph_level_notes,
    multi_device_ranks,
    run_activity,
)
from traceprof.engine.analysis import Analysis, Chart, FrameResult, Note, PerRank, Report, RunParams, register
from traceprof.engine.intervals import by_rank_chunks, overlapped_range, union_ns
from traceprof.storage.store import Store

_COLLECTIVES_SQL, _OPS_SQL, _DEVICE_COLLECTIVES_SQL = (
    s.strip() for s in Path(__file__).with_name("gaps.sql").read_text().split(";\n")
)
_NO_STEP = -1  # join key for activity outside ProfilerSteps (step numbers are >= 0)
#: The activity columns gaps reads (``traceprof.engine.activity``).
_ACTIVITY = (
    "rank",
    "class",
    "step",
    "start_ns",
    "end_ns",
    "name",
    "device_kind",
    "trace_id",
    "launch_tid",
    "launch_ts_ns",
    "device",
)
_THREAD = ["trace_id", "tid"]


@dataclass(frozen=True)
class Params(RunParams):
    """``hta``: select GPU events as HTA 0.5.0 does (drops the last step and unlaunched events)."""

    hta: bool = False


@dataclass(frozen=True)
class Result(FrameResult):
    """Causes (``frame``), the gaps (``gaps``), exposed time per step (``steps``) and rank
    (``ranks``); their columns are declared in :data:`SPEC`."""

    gaps: pl.DataFrame = field(default_factory=pl.DataFrame)
    steps: pl.DataFrame = field(default_factory=pl.DataFrame)
    ranks: pl.DataFrame = field(default_factory=pl.DataFrame)
    title = "Overlap gaps (exposed communication)"

    def charts(self) -> list[Chart]:
        return [Chart("Exposed communication per rank", "rank", ("exposed_ns",), ylabel="ns", frame="ranks")]


def _size(col: str) -> pl.Expr:
    b = pl.col(col).cast(pl.Float64)
    fmt = [(2.0**30, "GiB"), (2.0**20, "MiB"), (2.0**10, "KiB")]  # binary, as the tables' bytes (KiB) columns
    expr: Any = pl.when(b.is_null()).then(None)  # Then, then ChainedThen
    for scale, unit in fmt:
        expr = expr.when(b >= scale).then(pl.format("{} " + unit, (b / scale).round(1)))
    return expr.otherwise(pl.format("{} B", pl.col(col)))


def _label() -> pl.Expr:
    """``all_reduce (pg 0, 2.0 MiB)`` from op, pg, bytes."""
    inner = pl.concat_str(
        [pl.format("pg {}", pl.col("pg")), _size("bytes")], separator=", ", ignore_nulls=True
    )
    op = pl.col("op").fill_null("unknown collective")
    return pl.when(inner == "").then(op).otherwise(pl.format("{} ({})", op, inner))


def _collectives_per_gap(gaps: pl.DataFrame, colls: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    """For each gap id: the overlapping collectives' count and the primary one (module doc, step 3).

    Gaps are disjoint and sorted within (``keys``: rank, or rank and device; step_key), so the gaps
    a collective overlaps are a contiguous id range (``intervals.overlapped_range``): first gap ending
    after its start to last gap starting before its end.
    """
    by = [*keys, "step_key"]
    g = gaps.select(*by, "gid", "start_ns", "end_ns")
    c = overlapped_range(colls, g, by, "gid")
    pairs = (
        c.filter(pl.col("_i0") <= pl.col("_i1"))
        .with_columns(pl.int_ranges("_i0", pl.col("_i1") + 1).alias("gid"))
        .explode("gid")
        .join(g.select("gid", pl.col("start_ns").alias("gs"), pl.col("end_ns").alias("ge")), on="gid")
    )
    pairs = pairs.with_columns(
        (pl.min_horizontal("end_ns", "ge") - pl.max_horizontal("start_ns", "gs")).alias("_ov")
    ).filter(pl.col("_ov") > 0)
    return (
        pairs.sort(["gid", "_ov", "start_ns"], descending=[False, True, False])
        .group_by("gid", maintain_order=True)
        .agg(pl.len().alias("collectives"), pl.col("op", "pg", "seq", "bytes").first())
    )


def enclosing(points: pl.DataFrame, ops: pl.DataFrame) -> pl.DataFrame:
    """Innermost and outermost op containing each point, ops nested per thread.

    With the ops of a thread sorted by (start, longest first), an op's depth is its position minus
    the number of ops that ended by its start, plus one; the open depth at a point is (ops started
    by it) - (ops ended by it), and the op containing the point at depth d is the last op of depth d
    starting by it (checked to contain it, so improperly nested ops give null, never a wrong op).
    Vectorized per thread and depth level (numpy ``searchsorted``); no loop over rows.

    Args:
        points: Frame with pid (point id), trace_id, tid, p (ns).
        ops: Frame with trace_id, tid, start_ns, end_ns (ns, end exclusive, end > start), name.

    Returns:
        Frame with pid, launch_op (innermost name), top_op (outermost name); null where no op
        contains the point.
    """
    names = ops["name"]
    ops = ops.with_row_index("_i")
    pids, inner_idx, top_idx = [], [], []
    for (trace_id, tid), o in ops.partition_by(_THREAD, as_dict=True).items():
        pt = points.filter((pl.col("trace_id") == trace_id) & (pl.col("tid") == tid))
        if pt.is_empty():
            continue
        s, e, idx = (o[c].to_numpy() for c in ("start_ns", "end_ns", "_i"))
        order = np.lexsort((-e, s))
        s, e, idx = s[order], e[order], idx[order]
        ends = np.sort(e)
        depth = np.arange(len(s)) - np.searchsorted(ends, s, "right") + 1
        p = pt["p"].to_numpy()
        open_depth = np.searchsorted(s, p, "right") - np.searchsorted(ends, p, "right")
        inner = np.full(len(p), -1)
        top = np.full(len(p), -1)
        for d in np.unique(depth):
            at_d = np.flatnonzero(depth == d)
            j = np.searchsorted(s[at_d], p, "right") - 1
            cand = at_d[np.maximum(j, 0)]
            contains = (j >= 0) & (e[cand] > p)
            inner = np.where(contains & (open_depth == d), idx[cand], inner)
            if d == 1:
                top = np.where(contains, idx[cand], top)
        pids.append(pt["pid"].to_numpy())
        inner_idx.append(inner)
        top_idx.append(top)
    if not pids:
        return pl.DataFrame(schema={"pid": pl.Int64, "launch_op": pl.Utf8, "top_op": pl.Utf8})

    def name_of(ix: np.ndarray) -> pl.Series:
        return pl.select(
            pl.when(pl.lit(pl.Series(ix >= 0))).then(names.gather(np.maximum(ix, 0)))
        ).to_series()

    inner, top = np.concatenate(inner_idx), np.concatenate(top_idx)
    return pl.DataFrame({"pid": np.concatenate(pids).astype(np.int64)}).with_columns(
        name_of(inner).alias("launch_op"), name_of(top).alias("top_op")
    )


def _compute_before(
    store: Store,
    run_id: int,
    gaps: pl.DataFrame,
    act: pl.DataFrame,
    comp_merged: pl.DataFrame,
    keys: list[str],
) -> pl.DataFrame:
    """For each gap id: last_compute, last_compute_end_ns, launch_op, top_op (module doc, step 4);
    ``act``: the activity (its compute rows are the candidates); ``keys``: rank, or rank and device
    (a gap's compute before is its device's).

    The compute interval ending last by the gap start ends where the last merged compute interval
    before the gap ends (a gap start is never inside compute), so the search runs on the merged
    intervals and only their ends are looked up among the raw ones.
    """
    last = (
        gaps.select("gid", *keys, "start_ns")
        .sort("start_ns")
        .join_asof(
            comp_merged.select(*keys, pl.col("end_ns").alias("last_compute_end_ns")).sort(
                "last_compute_end_ns"
            ),
            left_on="start_ns",
            right_on="last_compute_end_ns",
            by=keys,
            check_sortedness=False,
        )
    )
    ends = last.select(*keys, pl.col("last_compute_end_ns").alias("end_ns")).drop_nulls().unique()

    def ending(part: pl.DataFrame) -> pl.DataFrame:
        """The compute rows of ``part`` ending there, in the activity's order (found on two columns,
        then taken whole)."""
        rows = (
            part.select(*keys, "end_ns", _comp=pl.col("class") == "compute")
            .with_row_index("_row")
            .filter("_comp")
            .join(ends, on=[*keys, "end_ns"], how="semi", maintain_order="left")["_row"]
        )
        return part[rows]

    # Among intervals ending together keep the longest (the outer op of nested CPU ops).
    cand = (
        by_rank_chunks(act, ["rank"], ending)
        .sort(*keys, "end_ns", "start_ns")
        .unique([*keys, "end_ns"], keep="first")
    )
    last = last.join(
        cand.select(
            *keys,
            pl.col("end_ns").alias("last_compute_end_ns"),
            pl.col("name").alias("last_compute"),
            "device_kind",
            "trace_id",
            "launch_tid",
            "launch_ts_ns",
        ),
        on=[*keys, "last_compute_end_ns"],
        how="left",
    )
    pts = last.filter(pl.col("launch_ts_ns").is_not_null() & pl.col("launch_tid").is_not_null()).select(
        pl.col("gid").alias("pid"),
        "trace_id",
        pl.col("launch_tid").alias("tid"),
        pl.col("launch_ts_ns").alias("p"),
    )
    found = pl.DataFrame(schema={"pid": pl.Int64, "launch_op": pl.Utf8, "top_op": pl.Utf8})
    if not pts.is_empty():
        traces = ", ".join(str(int(t)) for t in pts["trace_id"].unique())
        tids = sql_texts(str(t) for t in pts["tid"].unique())
        sql = _OPS_SQL.replace("$run", str(run_id)).replace("$traces", traces).replace("$tids", tids)
        found = enclosing(pts, store.sql(sql).join(pts.select(_THREAD).unique(), on=_THREAD, how="semi"))
    out = last.join(found, left_on="gid", right_on="pid", how="left")
    cpu = pl.col("device_kind") == "cpu"
    return out.select(
        "gid",
        "last_compute",
        "last_compute_end_ns",
        pl.when(cpu).then(None).otherwise(pl.col("launch_op")).alias("launch_op"),
        "top_op",
    )


def _causes(gaps: pl.DataFrame) -> pl.DataFrame:
    total = gaps["dur_ns"].sum()
    causes = (
        gaps.group_by("cause")
        .agg(
            pl.col("op", "pg", "bytes", "before").first(),
            pl.col("dur_ns").sum().alias("exposed_ns"),
            pl.len().alias("gaps"),
            pl.col("rank").n_unique().alias("ranks"),
            pl.col("step").drop_nulls().n_unique().alias("steps"),
            pl.col("dur_ns").max().alias("max_gap_ns"),
        )
        .with_columns((100.0 * pl.col("exposed_ns") / total).alias("pct"))
    )
    return causes.sort(["exposed_ns", "cause"], descending=[True, False]).select(
        "cause", "op", "pg", "bytes", "before", "exposed_ns", "pct", "gaps", "ranks", "steps", "max_gap_ns"
    )


def top_cause_note(causes: pl.DataFrame) -> Note:
    """The note naming the first of ``causes`` (:func:`_causes`, not empty): its share of the
    exposed communication (one decimal under 10%: 0.6%, not "1%"), ms, and its counts in words."""
    top = causes.row(0, named=True)
    pct = f"{top['pct']:.0f}%" if top["pct"] >= 10 else f"{top['pct']:.1f}%"
    counts = ", ".join(f"{top[k]:,} {k[:-1] if top[k] == 1 else k}" for k in ("gaps", "ranks", "steps"))
    return Note(
        f"top cause: {top['cause']}: {pct} of exposed communication ({top['exposed_ns'] / 1e6:.2f} ms in "
        f"{counts})",
        kind="top_cause",
    )


_SPAN = pl.col("end_ns").max() - pl.col("start_ns").min()


def _spans(act: pl.DataFrame, by: list[str], name: str) -> pl.DataFrame:
    """First start to last end (ns) of every ``by`` group of ``act`` (``by`` starting with rank), as
    column ``name``, in no particular order, worked a few ranks at a time."""
    return by_rank_chunks(
        act.select(*by, "start_ns", "end_ns"), by, lambda p: p.group_by(by).agg(_SPAN.alias(name))
    )


def _summed(df: pl.DataFrame, by: list[str], col: str) -> pl.DataFrame:
    """``df``'s ``col`` summed per ``by`` (a frame per ``by`` and device: a process's devices), or
    ``df`` as it is."""
    return df.group_by(by).agg(pl.col(col).sum()) if "device" in df.columns else df


def _per_step(act: pl.DataFrame, comm: pl.DataFrame, gaps: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    per_step = (
        gaps.filter(pl.col("step").is_not_null())
        .group_by("rank", "step")
        .agg(pl.col("dur_ns").sum().alias("exposed_ns"), pl.len().alias("gaps"))
    )
    by = [*keys, "step"]
    comm_ns = _summed(
        union_ns(comm.filter(pl.col("step").is_not_null()), by, "comm_ns"), ["rank", "step"], "comm_ns"
    )
    return (
        _summed(_spans(act, by, "step_ns"), ["rank", "step"], "step_ns")
        .filter(pl.col("step").is_not_null())
        .join(comm_ns, on=["rank", "step"], how="left")
        .join(per_step, on=["rank", "step"], how="left")
        .with_columns(pl.col("comm_ns", "exposed_ns", "gaps").fill_null(0))
        .with_columns((100.0 * pl.col("exposed_ns") / pl.col("step_ns")).alias("exposed_pct"))
        .select("rank", "step", "comm_ns", "exposed_ns", "gaps", "step_ns", "exposed_pct")
        .sort("rank", "step")
    )


def _per_rank(
    act: pl.DataFrame, comm: pl.DataFrame, lite: pl.DataFrame, gaps: pl.DataFrame, keys: list[str]
) -> pl.DataFrame:
    exposed = (
        exposed_comm(lite, keys)
        .group_by("rank")
        .agg((pl.col("end_ns") - pl.col("start_ns")).sum().alias("exposed_ns"))
    )
    return (
        _summed(_spans(act, keys, "window_ns"), ["rank"], "window_ns")
        .join(_summed(union_ns(comm, keys, "comm_ns"), ["rank"], "comm_ns"), on="rank", how="left")
        .join(exposed, on="rank", how="left")
        .join(
            gaps.group_by("rank").agg(pl.len().alias("gaps"), pl.col("dur_ns").max().alias("max_gap_ns")),
            on="rank",
            how="left",
        )
        .with_columns(pl.col("comm_ns", "exposed_ns", "gaps").fill_null(0))
        .with_columns((100.0 * pl.col("exposed_ns") / pl.col("window_ns")).alias("exposed_pct"))
        .select("rank", "comm_ns", "exposed_ns", "window_ns", "exposed_pct", "gaps", "max_gap_ns")
        .sort("rank")
    )


def _rank_device(act: pl.DataFrame) -> pl.DataFrame:
    """Each rank's GPU (rank, device) where no rank drives several (null for a CPU-only rank: absent)."""
    gpu = pl.col("device_kind") == "gpu"
    return by_rank_chunks(
        act.select("rank", "device_kind", "device"),
        ["rank"],
        lambda p: (
            p.filter(gpu & pl.col("device").is_not_null()).group_by("rank").agg(pl.col("device").first())
        ),
    )


#: The gaps table's order: longest first, then by rank, start and device.
_GAP_ORDER = ["dur_ns", "rank", "start_ns", "device"]


def _finish(merged: FrameResult, per_rank: list[FrameResult]) -> FrameResult:
    """The per-rank merge's last step: the causes and their note from every rank's gaps (module doc
    steps 5-6, rows in the same order as there: by rank, step, start)."""
    g = merged.frames()["gaps"]
    src = g.sort(pl.col("rank"), pl.col("step").fill_null(_NO_STEP), pl.col("start_ns"), maintain_order=True)
    src = src.with_columns(pl.coalesce("top_op", "launch_op", "last_compute").alias("before"))
    causes = _causes(src)
    said = [n for r in per_rank for n in r.notes if isinstance(n, Note) and n.kind in ("hidden", "no_comm")]
    if causes.is_empty():  # every rank says why: hidden wins over "no communication" (any rank had some)
        first = sorted(said, key=lambda n: n.kind != "hidden")[:1]
    else:
        first = [top_cause_note(causes)]
    drop = ("top_cause", "hidden", "no_comm")
    rest = [n for n in merged.notes if not (isinstance(n, Note) and n.kind in drop)]
    return dataclasses.replace(merged, frame=causes, notes=(*first, *rest))


_GAP_COLUMNS = (
    rc.RANK,
    dataclasses.replace(rc.DEVICE, doc="GPU its communication ran on (null on CPU ranks)"),
    rc.STEP,
    rc.ns("start_ns", "Start of the exposed interval"),
    rc.ns("end_ns", "End of the exposed interval"),
    rc.ns("dur_ns", "Its length"),
    rc.text("collective", "The collective running through it, as a label: op (pg P, size)"),
    rc.text("op", "Op of the collective overlapping the gap longest (ties: the earliest); null when none"),
    rc.text("pg", "Its process group"),
    rc.count("seq", "Its sequence number in the group"),
    rc.count("bytes", "Its size: the larger of input and output", "BIGINT"),
    rc.rows("collectives", "Collectives of the rank and step overlapping the gap"),
    rc.text("last_compute", "The rank's compute that ended last at or before the gap start"),
    rc.ns("last_compute_end_ns", "Its end"),
    rc.text("launch_op", "Innermost CPU op around the runtime call that launched last_compute (GPU ranks)"),
    rc.text("top_op", "Outermost such op (on CPU ranks: the outermost op containing last_compute's start)"),
    rc.text("cause", "<collective> after <top_op, else launch_op, else last_compute>"),
)

SPEC = Analysis(
    name="gaps",
    params=Params,
    result=Result,
    frames=(
        rc.frame(
            "frame",
            "Causes of exposed communication, by exposed time summed over ranks and steps",
            rc.text("cause", "<collective> after <the compute before it>"),
            rc.text("op", "Collective op"),
            rc.text("pg", "Process group"),
            rc.count("bytes", "Collective size (the larger of input and output)"),
            rc.text("before", "The op or kernel named in the cause"),
            rc.ns("exposed_ns", "Exposed time of its gaps, summed"),
            rc.pct("pct", "exposed_ns, % of all gaps' time"),
            rc.rows("gaps", "Gaps with this cause"),
            rc.rows("ranks", "Distinct ranks"),
            rc.rows("steps", "Distinct steps"),
            rc.ns("max_gap_ns", "Longest gap"),
        ),
        rc.frame("gaps", "Each gap (exposed communication interval), longest first", *_GAP_COLUMNS),
        rc.frame(
            "steps",
            "Exposed communication per (rank, step)",
            rc.RANK,
            rc.STEP,
            rc.ns("comm_ns", "Union of the step's communication"),
            rc.ns("exposed_ns", "Its gaps' time"),
            rc.rows("gaps", "Its gaps"),
            rc.ns("step_ns", "Window of the step's activity"),
            rc.pct("exposed_pct", "exposed_ns, % of step_ns"),
            worst="exposed_ns",
        ),
        rc.frame(
            "ranks",
            "Exposed communication per rank",
            rc.RANK,
            rc.ns("comm_ns", "Union of the rank's communication"),
            rc.ns("exposed_ns", "Communication not hidden behind compute: |comm - compute|"),
            rc.WINDOW_NS,
            rc.pct("exposed_pct", "exposed_ns, % of window_ns"),
            rc.rows("gaps", "Gaps"),
            rc.ns("max_gap_ns", "Longest gap"),
        ),
    ),
    report=Report(30, "GPU kernels or CPU training-thread ops (a Kineto trace)"),
    per_rank=PerRank(resort={"gaps": (_GAP_ORDER, [True, False, False, False])}, finish=_finish),
)


@register(SPEC)
def run(store: Store, params: Params) -> Result:
    """Overlap gaps, their collectives and causes, and exposed communication per rank and step.

    Source: activity (``traceprof.engine.activity``), the ``collectives`` table, and cpu_op /
    user_annotation events (with the runtime calls' correlation and thread) for the launching ops.

    Raises:
        StoreError: No such run.
        AnalysisError: The run has no GPU or CPU activity.
    """
    run_id, act = run_activity(store, params.run, hta=params.hta, detail=True, columns=_ACTIVITY)
    # copies of the few columns each step reads, never of the activity's rows (the compute rows'
    # text columns are looked up by row for the gaps' candidates only)
    # a process that drives several GPUs: everything per (rank, device) (module doc)
    multi = multi_device_ranks(act)
    keys = ["rank", "device"] if multi else ["rank"]
    cols = [*keys, "class", "step", "start_ns", "end_ns"]
    comm = act.select(cols).filter(pl.col("class") == "comm")
    # The merged compute hides communication as well as every compute row does, and is far smaller.
    comp_merged = compute_merged(act, keys)
    lite = pl.concat(
        [
            comm,
            comp_merged.with_columns(
                pl.lit("compute").alias("class"), pl.lit(None, act.schema["step"]).alias("step")
            ).select(cols),
        ]
    )
    gaps = exposed_comm(lite, [*keys, "step"]).with_columns(
        pl.col("step").fill_null(_NO_STEP).alias("step_key")
    )
    gaps = (
        gaps.sort(*keys, "step_key", "start_ns")
        .with_row_index("gid")
        .with_columns(pl.col("gid").cast(pl.Int64))
    )
    colls = store.sql((_DEVICE_COLLECTIVES_SQL if multi else _COLLECTIVES_SQL).replace("$run", str(run_id)))
    colls = colls.with_columns(pl.col(k).cast(gaps.schema[k]) for k in ("step_key", *keys))
    gaps = (
        gaps.join(_collectives_per_gap(gaps, colls, keys), on="gid", how="left")
        .join(_compute_before(store, run_id, gaps, act, comp_merged, keys), on="gid", how="left")
        .with_columns(
            (pl.col("end_ns") - pl.col("start_ns")).alias("dur_ns"),
            _label().alias("collective"),
            pl.col("collectives").fill_null(0),
        )
    )
    before = pl.coalesce("top_op", "launch_op", "last_compute")
    gaps = gaps.with_columns(
        before.alias("before"),
        pl.when(before.is_null())
        .then(pl.format("{} with no compute before", pl.col("collective")))
        .otherwise(pl.format("{} after {}", pl.col("collective"), before))
        .alias("cause"),
    )
    causes = _causes(gaps)
    steps, ranks = _per_step(act, comm, gaps, keys), _per_rank(act, comm, lite, gaps, keys)
    if not multi:  # each rank's one GPU (null on CPU ranks)
        gaps = gaps.join(_rank_device(act), on="rank", how="left")
    gaps = gaps.select(
        "rank",
        pl.col("device").cast(pl.Int32),
        "step",
        "start_ns",
        "end_ns",
        "dur_ns",
        "collective",
        "op",
        "pg",
        "seq",
        "bytes",
        "collectives",
        "last_compute",
        "last_compute_end_ns",
        "launch_op",
        "top_op",
        "cause",
    ).sort(_GAP_ORDER, descending=[True, False, False, False])
    notes: list[str] = []
    if causes.is_empty():
        notes.append(
            Note("no exposed communication: all of it is hidden behind compute", kind="hidden")
            if comm.height
            else Note("no exposed communication: the run has no communication", kind="no_comm")
        )
    else:
        notes.append(top_cause_note(causes))
    if multi:
        notes.append(
            Note(
                "rank(s) {ranks} drive several GPUs: their gaps are per device (a device's communication "
                "hidden only behind that device's compute); their comm_ns, exposed_ns and windows are their "
                "devices' summed",
                ranks=multi,
            )
        )
    if params.hta:
        notes.append("HTA-compatible selection (last step and unlaunched GPU events dropped)")
    notes += graph_level_notes(store, run_id)
    notes += [n for n in (excluded_note(store, run_id, params.hta), untraced_comm_note(store, run_id)) if n]
    return Result(frame=causes, gaps=gaps, steps=steps, ranks=ranks, notes=tuple(notes))
