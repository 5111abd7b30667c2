"""kernels: where each rank's GPU time goes by kernel class and by kernel.

Algorithm (README.md "What traceprof handles": Kernel class; the same measures as HTA's kernel breakdown):
  1. Take each rank's GPU kernels, memcpys and memsets (``traceprof.engine.activity``), classed comm
     (NCCL/RCCL: ``ncclKernel_*``, ``ncclDevKernel_*``, ``ncclSymkDevKernel_*``, ``rccl*``), memory
     (memcpy/memset) or compute (the rest; ROCm traces alike).
  2. Time by class: merge each class's intervals per rank (all streams together); busy = the union
     of all three. A rank that drives several GPUs (one process, several devices) is taken per
     device and its devices' times summed (GPU time, as temporal's devices): a device's
     communication is overlapped only by that device's compute, and the rank's busy time and the
     four exclusive parts below are the sums of its devices' (noted). The class unions overlap (an NCCL kernel under a GEMM counts in both), so they
     add up to more than busy time; they get no shares.
  3. Time by overlap type (HTA's ``kernel_type_df``, per rank): sweep the class unions and label
     each instant by the set of classes active (``compute``, ``compute+comm``, ...); these add up
     to busy time. The per-rank exclusive split: ``compute_only``, ``comm_only``, ``memory_only``
     and ``overlapped`` (two or more classes at once) add up to busy time, their shares to 100%.
  4. Top kernels: group each rank's rows by full name; count, total, mean, median, p95 (linear
     interpolation), min, max and sample standard deviation of the durations (rounded to whole
     ns); keep the ``top`` with the largest total per rank (ties by name).
With ``hta=true`` events are selected and classed as HTA 0.5.0 does; its ``other`` rows (sync
events) are left out of all three tables, as in HTA.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import polars as pl

from traceprof.analyses import _common
from traceprof.core import columns as rc
from traceprof.core.classify import VALID_SQL
from traceprof.core.errors import AnalysisError
from traceprof.engine.activity import activity, excluded_note, graph_level_notes, multi_device_ranks
from traceprof.engine.analysis import Analysis, Chart, FrameResult, Note, PerRank, Report, RunParams, register
from traceprof.engine.intervals import by_rank_chunks, merge, union_ns
from traceprof.storage.runs import run_label
from traceprof.storage.store import Store

CLASSES = ("compute", "comm", "memory")  # bit 0, 1, 2 of an overlap type, in HTA's order
#: The activity columns kernels reads (``traceprof.engine.activity``): not lanes.
_ACTIVITY = ("rank", "class", "start_ns", "end_ns", "step", "name", "device_kind", "device")
_EXCLUSIVE = ("compute_only", "comm_only", "memory_only", "overlapped")


@dataclass(frozen=True)
class Params(RunParams):
    """``top``: kernels listed per rank (0: all). ``hta``: select and class events as HTA 0.5.0."""

    top: int = 20
    hta: bool = False

    def __post_init__(self) -> None:
        _common.at_least("top", self.top, 0, "0: all kernels")


@dataclass(frozen=True)
class Result(FrameResult):
    """Per-rank class times (``frame``), overlap types (``types``) and top kernels (``top``);
    their columns are declared in :data:`SPEC`."""

    types: pl.DataFrame = field(default_factory=pl.DataFrame)
    top: pl.DataFrame = field(default_factory=pl.DataFrame)
    title = "Kernel breakdown"

    def charts(self) -> list[Chart]:
        return [
            Chart(
                "GPU busy time per rank by kernel class (exclusive: stacks to busy time)",
                "rank",
                tuple(f"{c}_ns" for c in _EXCLUSIVE),
                stacked=True,
                ylabel="ns",
            )
        ]


def _class_ns(act: pl.DataFrame, cls: str, by: list[str]) -> pl.DataFrame:
    """Busy time per rank of ``act``'s rows of class ``cls``: rank, ``<cls>_ns`` (ns), the
    unions per ``by`` group (rank, or rank and device) summed per rank."""
    return _per_rank(union_ns(act.filter(pl.col("class") == cls), by, f"{cls}_ns"), f"{cls}_ns")


def _per_rank(df: pl.DataFrame, col: str) -> pl.DataFrame:
    """``df``'s ``col`` summed per rank (a frame per rank and device), or ``df`` as it is."""
    if "device" not in df.columns:
        return df
    return df.group_by("rank").agg(pl.col(col).sum())


def overlap_types(act: pl.DataFrame, by: tuple[str, ...] = ("rank",)) -> pl.DataFrame:
    """Time per rank by the set of kernel classes running (module doc, step 3).

    Args:
        act: Activity rows (rank, class, start_ns, end_ns; device with ``by`` ``("rank", "device")``)
            of classes ``CLASSES``.
        by: The groups swept apart (rank; rank and device: a device's classes overlap only with its
            own), their times summed per rank.

    Returns:
        Frame with rank, kernel_type (e.g. ``compute+comm``), time_ns (ns).
    """
    # a few ranks at a time (rank_chunks): each class's rows, their merge and the sweep's events
    # are one piece's, not the run's (8 ranks x 1 M events: the report's light peak, beside the frame)
    return by_rank_chunks(act, list(by), functools.partial(_overlap_types, by=list(by)))


def _overlap_types(act: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """:func:`overlap_types` of ``act`` in one piece."""
    parts = []
    for bit, cls in enumerate(CLASSES):
        m = merge(act.filter(pl.col("class") == cls), by)
        parts.append(m.select(*by, pl.col("start_ns").alias("t"), pl.lit(1 << bit).alias("d")))
        parts.append(m.select(*by, pl.col("end_ns").alias("t"), pl.lit(-(1 << bit)).alias("d")))
    ev = pl.concat(parts).group_by(*by, "t").agg(pl.col("d").sum()).sort(*by, "t")
    ev = ev.with_columns(
        pl.col("d").cum_sum().over(by).alias("state"), pl.col("t").shift(-1).over(by).alias("next")
    ).filter((pl.col("state") > 0) & pl.col("next").is_not_null())
    labels = pl.DataFrame(
        {
            "state": list(range(1, 8)),
            "kernel_type": ["+".join(c for b, c in enumerate(CLASSES) if s & (1 << b)) for s in range(1, 8)],
        },
        schema={"state": ev.schema["state"], "kernel_type": pl.Utf8},
    )
    return (
        ev.group_by("rank", "state")
        .agg((pl.col("next") - pl.col("t")).sum().alias("time_ns"))
        .join(labels, on="state")
        .select("rank", "kernel_type", "time_ns")
    )


def _top(act: pl.DataFrame, top: int) -> pl.DataFrame:
    d = pl.col("end_ns") - pl.col("start_ns")
    by = ["rank", "class", "name"]
    g = by_rank_chunks(  # a few ranks at a time: the groups' gathered values are one piece's
        act.select(*by, "start_ns", "end_ns"),
        by,
        lambda p: p.group_by(by).agg(
            pl.len().alias("count"),
            d.sum().alias("total_ns"),
            _common.whole_ns(d.mean()).alias("mean_ns"),
            _common.whole_ns(d.median()).alias("median_ns"),
            _common.whole_ns(d.quantile(0.95, "linear")).alias("p95_ns"),
            d.min().alias("min_ns"),
            d.max().alias("max_ns"),
            _common.whole_ns(d.std(ddof=1).fill_null(0.0)).alias("std_ns"),
        ),
    )
    g = g.sort(["rank", "total_ns", "name"], descending=[False, True, False]).with_columns(
        (100.0 * pl.col("total_ns") / pl.col("total_ns").sum().over("rank")).alias("pct"),
        pl.int_range(1, pl.len() + 1, dtype=pl.Int64).over("rank").alias("position"),
    )
    if top > 0:
        g = g.filter(pl.col("position") <= top)
    cols = [
        "rank",
        "position",
        "class",
        "name",
        "count",
        "total_ns",
        "mean_ns",
        "median_ns",
        "p95_ns",
        "min_ns",
        "max_ns",
        "std_ns",
        "pct",
    ]
    return g.select(cols).sort("rank", "position")


SPEC = Analysis(
    name="kernels",
    params=Params,
    result=Result,
    frames=(
        rc.frame(
            "frame",
            "Per rank: GPU time by kernel class",
            rc.RANK,
            rc.rows("kernels", "GPU rows (kernels, memcpy, memset)"),
            rc.ns("kernel_ns", "Their durations, summed"),
            rc.ns("busy_ns", "Union of all of them (per device, summed, on a rank that drives several GPUs)"),
            *(
                rc.ns(
                    f"{c}_ns",
                    f"Union of the {c} rows (the class unions overlap: their sum can exceed busy_ns)",
                )
                for c in CLASSES
            ),
            *(
                rc.ns(
                    f"{c}_ns", "Time only that class ran (the four *_only and overlapped add up to busy_ns)"
                )
                for c in _EXCLUSIVE[:3]
            ),
            rc.ns("overlapped_ns", "Time two or more classes ran at once"),
            *(rc.pct(f"{c}_pct", f"{c}_ns, % of busy_ns (the four add up to 100)") for c in _EXCLUSIVE),
            rc.count(
                "flagged_kernels", "GPU records flagged at ingest (events.flag) and left out of the above"
            ),
            rc.ns("flagged_ns", "Their recorded durations, summed"),
        ),
        rc.frame(
            "types",
            "Per rank and overlap type (HTA's kernel_type)",
            rc.RANK,
            rc.text("kernel_type", "The classes running at once, joined by + (compute+comm, ...)"),
            rc.ns("time_ns", "Time of that set of classes"),
            rc.pct("pct", "time_ns, % of busy_ns"),
        ),
        rc.frame(
            "top",
            "The kernels with the largest total per rank",
            rc.RANK,
            rc.count("position", "1 = largest total on the rank"),
            rc.text("class", "Kernel class"),
            rc.text("name", "Full kernel name"),
            rc.rows("count", "Rows of this name"),
            rc.ns("total_ns", "Durations summed"),
            rc.ns("mean_ns", "Mean, rounded"),
            rc.ns("median_ns", "Median, rounded"),
            rc.ns("p95_ns", "95th percentile (linear interpolation), rounded"),
            rc.ns("min_ns", "Shortest"),
            rc.ns("max_ns", "Longest"),
            rc.ns("std_ns", "Sample standard deviation, rounded; 0 for one row"),
            rc.pct("pct", "total_ns, % of the rank's kernel_ns"),
        ),
    ),
    report=Report(50, "GPU kernels (a Kineto trace with CUDA activity)"),
    per_rank=PerRank(),
)


@register(SPEC)
def run(store: Store, params: Params) -> Result:
    """Kernel breakdown per rank of one run.

    Source: events of kind kernel, memcpy, memset (and sync with ``hta``).

    Raises:
        StoreError: No such run.
        AnalysisError: The run has no GPU kernels (e.g. a CPU-only gloo run).
    """
    run_id = store.resolve_run(params.run)
    act = activity(store, run_id, hta=params.hta, columns=_ACTIVITY)
    kept = (pl.col("device_kind") == "gpu") & pl.col("class").is_in(CLASSES)
    if (
        act.select(kept.fill_null(False).all()).item() is not True
    ):  # (a run of GPU kernels keeps every row: no copy)
        act = act.filter(kept)
    flagged = store.sql(
        "SELECT rank, count(*) AS flagged_kernels, sum(coalesce(raw_dur_ns, dur_ns))::BIGINT AS flagged_ns "
        f"FROM events e WHERE run_id = {int(run_id)} AND kind IN ('kernel', 'memcpy', 'memset') "
        f"AND NOT {VALID_SQL} GROUP BY rank"
    )
    if act.is_empty():
        why = (
            f"; its {int(flagged['flagged_kernels'].sum())} GPU records are all flagged at ingest (events.flag: "
            "before their launch, far outside the steps) and left out"
            if not flagged.is_empty()
            else "; the kernel breakdown needs a GPU trace"
        )
        raise AnalysisError(f"{run_label(store, run_id)}: no GPU kernels{why}")
    d = pl.col("end_ns") - pl.col("start_ns")
    per_rank = by_rank_chunks(
        act, ["rank"], lambda p: p.group_by("rank").agg(pl.len().alias("kernels"), d.sum().alias("kernel_ns"))
    )
    # a rank that drives several GPUs: its unions and its sweep per device (module doc, step 2)
    multi = multi_device_ranks(act)
    by = ["rank", "device"] if multi else ["rank"]
    per_rank = per_rank.join(_per_rank(union_ns(act, by, "busy_ns"), "busy_ns"), on="rank")
    cut = act.select(*by, "class", "start_ns", "end_ns")  # what the filters below copy
    for cls in CLASSES:  # a few ranks' rows of the class copied at a time
        per_rank = per_rank.join(
            by_rank_chunks(cut, by, functools.partial(_class_ns, cls=cls, by=by)),
            on="rank",
            how="left",
        ).with_columns(pl.col(f"{cls}_ns").fill_null(0))
    types = overlap_types(cut, tuple(by))
    exclusive = types.with_columns(
        pl.when(pl.col("kernel_type").str.contains("+", literal=True))
        .then(pl.lit("overlapped"))
        .otherwise(pl.col("kernel_type") + "_only")
        .alias("part")
    ).pivot("part", index="rank", values="time_ns", aggregate_function="sum")
    for c in _EXCLUSIVE:
        if c not in exclusive.columns:
            exclusive = exclusive.with_columns(pl.lit(0, pl.Int64).alias(c))
    per_rank = per_rank.join(
        exclusive.select("rank", *(pl.col(c).fill_null(0).alias(f"{c}_ns") for c in _EXCLUSIVE)),
        on="rank",
        how="left",
    )
    per_rank = per_rank.with_columns(
        (100.0 * pl.col(f"{c}_ns") / pl.col("busy_ns")).alias(f"{c}_pct") for c in _EXCLUSIVE
    ).sort("rank")
    types = types.join(per_rank.select("rank", "busy_ns"), on="rank")
    types = types.with_columns((100.0 * pl.col("time_ns") / pl.col("busy_ns")).alias("pct")).drop("busy_ns")
    types = types.sort(["rank", "time_ns"], descending=[False, True])
    # a rank whose GPU records are all flagged (its whole GPU timeline in another clock domain) keeps
    # its row: no kernels, its flagged records counted (percentages unknown)
    counts = [c for c in per_rank.columns if c == "kernels" or c.endswith("_ns")]
    per_rank = (
        per_rank.join(
            flagged.with_columns(pl.col("rank").cast(per_rank["rank"].dtype)),
            on="rank",
            how="full",
            coalesce=True,
        )
        .with_columns(
            pl.col(counts).fill_null(0),
            pl.col("flagged_kernels").fill_null(0).cast(pl.Int64),
            pl.col("flagged_ns").fill_null(0),
        )
        .sort("rank")
    )
    notes = ["HTA-compatible selection and kernel classes"] if params.hta else []
    if multi:
        notes.append(
            Note(
                "rank(s) {ranks} drive several GPUs: their times are per device, summed (busy_ns is GPU time "
                "over their devices; one device's communication overlaps only that device's compute)",
                ranks=multi,
            )
        )
    notes += graph_level_notes(store, run_id)
    notes += [n for n in (excluded_note(store, run_id, params.hta),) if n]
    return Result(frame=per_rank, types=types, top=_top(act, params.top), notes=tuple(notes))
