"""parallelism: the mesh, exposed communication per axis, pipeline bubbles, all-to-all load, slow stages.

Algorithm:
  1. The mesh (``traceprof.analyses._mesh``): each rank's coordinate on each axis (dp, tp, pp, cp, ep, ...)
     from the process groups the traces record, by their names and by size and stride; NDTimeline's
     stage and dp_rank; or the user's ``-p mesh=pp:4,dp:2,tp:8`` (outermost first). Table ``ranks``.
  2. The group of each collective row: its ``pg_ranks``; else its ``pg`` looked up among the rank's
     recorded groups (then the run's). Kineto's gloo rows name no group: theirs is the group of the
     Flight Recorder entry their rank created while enqueueing them (when the run has those dumps),
     else the one the other rows of their gloo worker thread name, else the rank's only group of
     two or more ranks. Its axis label: the axes along which the members' coordinates differ
     (``_mesh.Mesh.label``; a group of a candidate axis left out of the mesh: that axis, its
     ``found_by`` saying so). Point-to-point rows with no group (or a group of which only their own
     rank is known) are the pipeline's (``pp``) when the mesh has a pp axis. Rows whose group stays
     unknown are ``unassigned``, never dropped.
  3. Per axis: each communication interval of the activity (``traceprof.engine.activity``, as ``overlap``
     reads it; NDTimeline: its collective and compute ops) takes the label of the collectives row
     with its rank, start and end. Exposed communication = communication minus compute, per rank
     (``traceprof.analyses.overlap.exposed_comm``). **Attribution rule**: where collectives of several axes run
     at the same exposed instant, that instant goes to the first of them in :func:`label_order`:
     tp, cp, ep, pp, dp_shard, dp, dp_replicate, other single axes by name, then labels spanning
     several axes (fewest first), ``world``, and ``unassigned`` last (the inner axes' collectives
     block every layer; data-parallel traffic is meant to run behind compute). In that order each
     label takes the exposed time its intervals cover and removes it, so every exposed ns is
     counted once and the axes' ``exposed_comm_ns`` sum exactly to ``overlap``'s total.
     A process that drives several GPUs (one rank, several devices) is taken per device (noted): a
     device's communication is exposed unless that device computes, the attribution runs per
     (rank, device), and the rank's ``comm_ns``, ``exposed_comm_ns`` and hidden time are its devices'
     summed (as ``gaps``' ranks table and the communication verdict: the axes then sum to ``gaps``'
     total, not to ``overlap``'s merged per-rank one).
  4. Pipeline (a pp axis of 2+ stages; ``traceprof.analyses._pipeline``): per stage and step, the bubble
     (step - compute) split into the schedule's own bubble, stage imbalance, waiting for p2p and the
     rest; slow stages and slow data-parallel replicas (table ``slow``).
  5. All-to-all (``traceprof.analyses._alltoall``): per instance the bytes each rank sends to and receives
     from each peer (recorded split sizes, else an even split), the load's max/mean and Gini, the
     arrival waits and the transfer time the imbalance costs; a rank x peer matrix of bytes.

Linear in events after one sort per interval operation (``traceprof.engine.intervals``); the labels are
computed once per distinct (rank, group) key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import polars as pl

from traceprof.analyses import _alltoall, _common, _mesh, _pipeline
from traceprof.analyses.overlap import exposed_comm
from traceprof.core import columns as rc
from traceprof.core.errors import AnalysisError
from traceprof.engine.activity import activity, compute_merged, multi_device_ranks
from traceprof.engine.analysis import (
    Analysis,
    Chart,
    Finding,
    FindingsInput,
    FrameResult,
    Note,
    Report,
    RunParams,
    Topic,
    Verdict,
    register,
)
from traceprof.engine.intervals import subtract, union_ns
from traceprof.ingest.matching import INSTANCE_ARRIVAL_SQL, run_steps
from traceprof.storage.runs import run_label
from traceprof.storage.store import Store

__all__ = ["Params", "Result", "run", "COLUMNS", "label_order", "MeshView"]


@dataclass(frozen=True)
class Params(RunParams):
    """``mesh``: the mesh as ``axis:size`` pairs, outermost first (``pp:4,dp:2,tp:8``; "" infers it);
    ``slow_pct``: a stage or replica is slow when each of its ranks computes more than this % above
    the median of its peers on the other stages (replicas); ``min_cost_pct``: and the extra compute
    costs at least this % of the step (as ``stragglers``' rule)."""

    mesh: str = ""
    slow_pct: float = 10.0
    min_cost_pct: float = 5.0

    def __post_init__(self) -> None:
        _common.at_least("slow_pct", self.slow_pct, 0)
        _common.at_least("min_cost_pct", self.min_cost_pct, 0)


#: The tables of a result and their columns (all ``_ns`` int64 ns, ``bytes`` int64 bytes).
COLUMNS: dict[str, dict[str, str]] = {
    "frame": {
        "axis": "mesh axis (dp, tp, pp, ...), a label spanning axes (dp+pp), world, or unassigned",
        "size": "ranks per group of the axis (a spanning label: its largest group; null unassigned)",
        "groups": "distinct process groups of the label",
        "collectives": "collective rows of the label",
        "bytes": "bytes moved (sum of the known bytes_in; null when no size is known, a note counts the unknown)",
        "comm_ns": "communication of the label, its own union per rank (per device of a rank that drives "
        "several GPUs), summed over ranks",
        "exposed_comm_ns": "exposed communication attributed to the label (rule: module doc, step 3); "
        "sums to overlap's total (to gaps' where a rank drives several GPUs; on a per-op NDTimeline trace, "
        "where overlap does not run, overlap's rule applied here to its collectives and compute ops)",
        "exposed_pct": "share of all exposed communication (%)",
        "hidden_ns": "the label's communication hidden behind compute (comm_ns minus its own exposed part)",
        "hidden_pct": "hidden_ns as a share of comm_ns (%)",
        "found_by": "how the axis was found",
    },
    "ranks": {
        "rank": "global rank",
        "traced": "a trace of the rank is in the run",
        "<axis>": "one column per mesh axis: the rank's coordinate",
    },
    "axis_ranks": {
        "rank": "global rank",
        "axis": "label",
        "comm_ns": "communication of the label on the rank",
        "exposed_comm_ns": "exposed communication attributed to the label on the rank",
    },
    "stages": _pipeline.STAGE_COLUMNS,
    "pipeline": _pipeline.STEP_COLUMNS,
    "timeline": _pipeline.TIMELINE_COLUMNS,
    "slow": _pipeline.SLOW_COLUMNS,
    "alltoall": _alltoall.INSTANCE_COLUMNS,
    "alltoall_peers": _alltoall.PEER_COLUMNS,
    "alltoall_matrix": _alltoall.MATRIX_COLUMNS,
}

_SINGLE_ORDER = ("tp", "cp", "ep", "pp", "dp_shard", "dp", "dp_replicate")


def label_order(label: str) -> tuple[int, int, str]:
    """Sort key of an axis label in the attribution rule (module doc, step 3)."""
    if label == "unassigned":
        return (4, 0, label)
    if label == "world":
        return (3, 0, label)
    if "+" in label:
        return (2, label.count("+"), label)
    return (0, _SINGLE_ORDER.index(label), label) if label in _SINGLE_ORDER else (1, 0, label)


@dataclass(frozen=True)
class MeshView:
    """What the straggler verdict needs of the mesh (:meth:`Result.mesh_view`).

    ``slow``: the slow stages and replicas (rows of the ``slow`` table with ``slow`` true) as
    dicts; ``labels``: rank -> its place in the mesh (``pp stage 1, dp replica 0, tp group 4, 5, 6,
    7``); ``texts``: one sentence per slow group.
    """

    slow: tuple[dict[str, Any], ...]
    labels: dict[int, str]
    texts: tuple[str, ...]

    def absorbed(self, ranks: tuple[int, ...] | list[int]) -> set[int]:
        """The ``ranks`` that lie in a slow stage or replica (named as that group, not as ranks)."""
        return set(self.group_of(ranks))

    def group_of(self, ranks: tuple[int, ...] | list[int]) -> dict[int, tuple[str, str]]:
        """The ``ranks`` that lie in a slow stage or replica -> (its name, ``pipeline stage 3``; its
        sentence)."""
        inside = {
            r: (_pipeline.slice_name(s["kind"], s["index"]), s["text"]) for s in self.slow for r in s["ranks"]
        }
        return {r: inside[r] for r in ranks if r in inside}


@dataclass(frozen=True)
class Result(FrameResult):
    """Per axis (``frame``), the mesh (``ranks``), per rank and axis (``axis_ranks``), the pipeline
    per stage (``stages``), per rank and step (``pipeline``), its median step as intervals
    (``timeline``), slow stages and replicas (``slow``), all-to-all instances (``alltoall``) and
    bytes per (instance, rank, peer) (``alltoall_peers``) and summed over instances
    (``alltoall_matrix``). Columns: :data:`COLUMNS`; a table that does not
    apply (no pipeline, no all-to-all) is empty."""

    ranks: pl.DataFrame = field(default_factory=pl.DataFrame)
    axis_ranks: pl.DataFrame = field(default_factory=pl.DataFrame)
    stages: pl.DataFrame = field(default_factory=pl.DataFrame)
    pipeline: pl.DataFrame = field(default_factory=pl.DataFrame)
    timeline: pl.DataFrame = field(default_factory=pl.DataFrame)
    slow: pl.DataFrame = field(default_factory=pl.DataFrame)
    alltoall: pl.DataFrame = field(default_factory=pl.DataFrame)
    alltoall_peers: pl.DataFrame = field(default_factory=pl.DataFrame)
    alltoall_matrix: pl.DataFrame = field(default_factory=pl.DataFrame)
    title = "Parallelism: mesh, axes, pipeline, all-to-all"

    def mesh_view(self) -> MeshView:
        """The slow stages and replicas and each rank's place in the mesh (for ``traceprof.engine.verdict``)."""
        slow = tuple(r for r in self.slow.iter_rows(named=True) if r["slow"]) if self.slow.height else ()
        return MeshView(slow, _pipeline.rank_labels(self.ranks), tuple(r["text"] for r in slow))

    def charts(self) -> list[Chart]:
        return [
            Chart(
                "Communication per mesh axis: hidden behind compute, and exposed (attributed)",
                "axis",
                ("hidden_ns", "exposed_comm_ns"),
                stacked=True,
                ylabel="ns",
            ),
            Chart(
                "Pipeline bubble per stage (mean step)",
                "stage",
                ("schedule_bubble_ns", "imbalance_ns", "p2p_wait_ns", "other_ns"),
                stacked=True,
                ylabel="ns",
                frame="stages",
            ),
            Chart(
                "Pipeline stages over the median step: compute, p2p, other communication",
                "lane",
                ("start_ms", "end_ms"),
                kind="spans",
                value="state",
                frame="timeline",
            ),
            Chart(
                "All-to-all bytes sent, rank x peer (MiB, all instances)",
                "peer",
                ("rank",),
                kind="heatmap",
                value="mib",
                frame="alltoall_matrix",
            ),
        ]


_OP_ACTIVITY = """
SELECT rank, CASE WHEN kind = 'collective' THEN 'comm' ELSE 'compute' END AS class,
       ts_ns AS start_ns, ts_ns + dur_ns AS end_ns, step
FROM events WHERE run_id = ? AND kind IN ('collective', 'gpu_user_annotation') AND dur_ns > 0
ORDER BY rank, start_ns, end_ns
"""

_ROWS = f"""
SELECT rank, source, regexp_replace(pg, ':p2p$', '') AS pg, pg_ranks, coalesce(p2p, false) AS p2p, op,
       start_ns, end_ns, bytes_in, split_in, step, instance_id, {INSTANCE_ARRIVAL_SQL} AS arrival_ns, enter_ns, tid
FROM collectives WHERE run_id = ?
"""


def _gloo_groups(rows: pl.DataFrame) -> tuple[pl.DataFrame, list[str]]:
    """Name the group of gloo rows, which Kineto records without one (module doc, step 2): from the
    Flight Recorder entry the same rank created for the same op while enqueueing it (the first one
    created at or after the ``c10d`` enqueue and before the rank's next enqueue of that op), then
    for the rest from the other rows of their gloo worker thread (a process group's work runs on
    its own threads), when those name exactly one group."""
    gloo = (pl.col("source") == "gloo") & pl.col("pg").is_null() & ~pl.col("p2p")
    fr = rows.filter(
        (pl.col("source") == "fr") & pl.col("pg").is_not_null() & pl.col("enter_ns").is_not_null()
    )
    todo = rows.with_row_index("_i").filter(gloo & pl.col("enter_ns").is_not_null())
    if todo.is_empty():
        return rows, []
    notes = []
    named = todo.head(0).select("_i", pl.lit(None, pl.Utf8).alias("_pg"))
    if fr.height:
        left = (
            todo.select("_i", "rank", "op", "enter_ns")
            .sort("enter_ns")
            .with_columns(pl.col("enter_ns").shift(-1).over("rank", "op", order_by="enter_ns").alias("_next"))
        )
        right = fr.select("rank", "op", pl.col("enter_ns").alias("_created"), pl.col("pg").alias("_pg")).sort(
            "_created"
        )
        got = left.join_asof(
            right,
            left_on="enter_ns",
            right_on="_created",
            by=["rank", "op"],
            strategy="forward",
            check_sortedness=False,
        )
        named = got.filter(
            pl.col("_pg").is_not_null() & (pl.col("_next").is_null() | (pl.col("_created") < pl.col("_next")))
        )
        named = named.select("_i", "_pg")
        if named.height:
            notes.append(
                f"{named.height} gloo collectives take their process group from the Flight Recorder entry "
                "their rank created while enqueueing them"
            )
    threads = (
        todo.join(named, on="_i", how="left")
        .filter(pl.col("_pg").is_not_null())
        .group_by("rank", "tid")
        .agg(pl.col("_pg").unique().alias("_pgs"))
        .filter(pl.col("_pgs").list.len() == 1)
        .select("rank", "tid", pl.col("_pgs").list.first().alias("_tpg"))
    )
    out = (
        rows.with_row_index("_i")
        .join(named, on="_i", how="left")
        .join(threads, on=["rank", "tid"], how="left")
    )
    out = out.with_columns(pl.when(gloo).then(pl.coalesce("_pg", "_tpg")).otherwise(pl.col("pg")).alias("pg"))
    return out.drop("_i", "_pg", "_tpg"), notes


def _activity(store: Store, run_id: int) -> tuple[pl.DataFrame, str]:
    """Activity intervals (rank, class, start_ns, end_ns, step) and what they are: kernels or
    training-thread ops (``traceprof.engine.activity``), else per-op traces' collective and compute ops."""
    act = activity(
        store, run_id, columns=("rank", "class", "start_ns", "end_ns", "step", "device_kind", "device")
    )
    if act.height:
        return act, "activity"
    return store.sql(_OP_ACTIVITY, [run_id]), "ops"


def _labels(
    rows: pl.DataFrame, mesh: _mesh.Mesh, groups: list[_mesh.Group], own: dict[int, list[_mesh.Group]]
) -> tuple[pl.DataFrame, list[str]]:
    """Each row's group members and axis label (module doc, step 2), computed once per distinct
    (rank, pg, pg_ranks, p2p)."""
    by_name: dict[str, list[tuple[int, ...]]] = {}
    for g in groups:
        if g.name is not None:
            by_name.setdefault(g.name, []).append(g.ranks)
    has_pp = (i := mesh.axis("pp")) is not None and mesh.axes[i].size > 1
    keys = rows.select("rank", "pg", "pg_ranks", "p2p").unique()
    out, notes = [], set()
    for rank, pg, pg_ranks, p2p in keys.iter_rows():
        members = _mesh._ranks(pg_ranks)
        if members is None and pg is not None:
            mine = [g.ranks for g in own.get(rank, []) if g.name == pg]
            cands = mine or [m for m in by_name.get(pg, []) if rank in m]
            members = cands[0] if len(set(cands)) == 1 else None
        if members is None and pg is None and not p2p:
            multi = {g.ranks for g in own.get(rank, []) if len(g.ranks) > 1}
            if len(multi) == 1:
                members = next(iter(multi))
                notes.add("collectives that name no process group (gloo) are on their rank's only group")
        label = mesh.label(members) if members is not None else None
        if label is None and p2p and has_pp:  # no group, or only this rank of it seen
            label = "pp"
            notes.add("point-to-point ops that name no process group are the pipeline's (pp)")
        out.append(
            (
                rank,
                pg,
                pg_ranks,
                p2p,
                "[" + ", ".join(map(str, members)) + "]" if members else None,
                label or "unassigned",
            )
        )
    lab = pl.DataFrame(
        out,
        schema={
            "rank": rows.schema["rank"],
            "pg": pl.Utf8,
            "pg_ranks": pl.Utf8,
            "p2p": pl.Boolean,
            "members": pl.Utf8,
            "axis": pl.Utf8,
        },
        orient="row",
    )
    return rows.join(lab, on=["rank", "pg", "pg_ranks", "p2p"], how="left", nulls_equal=True), sorted(notes)


def _comm_labels(act: pl.DataFrame, rows: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    """The activity's communication intervals (``keys``: rank, or rank and device; start_ns, end_ns,
    step) with the label (``axis``) and ``p2p`` flag of the collectives row of the same rank, start
    and end (the first in :func:`label_order` if several), else ``unassigned`` (p2p false)."""
    comm = act.lazy().filter(pl.col("class") == "comm").select(*keys, "start_ns", "end_ns", "step").collect()
    order = {lab: i for i, lab in enumerate(sorted(set(rows["axis"].to_list()), key=label_order))}
    keyed = rows.filter(pl.col("start_ns").is_not_null() & pl.col("end_ns").is_not_null()).select(
        pl.col("rank").cast(comm.schema["rank"]),
        "start_ns",
        "end_ns",
        "axis",
        "p2p",
        "source",
        pl.col("axis").replace_strict(order, return_dtype=pl.Int64).alias("_o"),
    )
    keyed = (
        keyed.sort("_o", "rank", "start_ns").unique(["rank", "start_ns", "end_ns"], keep="first").drop("_o")
    )
    return comm.join(keyed, on=["rank", "start_ns", "end_ns"], how="left").with_columns(
        pl.col("axis").fill_null("unassigned"), pl.col("p2p").fill_null(False)
    )


def _axes(
    act: pl.DataFrame, labelled: pl.DataFrame, rows: pl.DataFrame, mesh: _mesh.Mesh, keys: list[str]
) -> tuple[pl.DataFrame, pl.DataFrame, list[str]]:
    """The ``frame`` (per axis) and ``axis_ranks`` tables (module doc, step 3), and a note per axis
    whose collectives' sizes are not all known (``bytes`` sums the known ones, null when none is:
    unknown is never 0); ``keys``: rank, or rank and device (a process that drives several GPUs: its
    devices' figures summed)."""
    compute = compute_merged(act, keys)  # merged once: each label's subtraction below reads it
    remaining = exposed_comm(act, keys, compute)
    per_rank = []
    labels = sorted(set(labelled["axis"].to_list()) | {"unassigned"}, key=label_order)
    before = union_ns(remaining, keys, "_b")  # then each label's ``after``: what the next one starts from
    for label in labels:
        mine = labelled.filter(pl.col("axis") == label).select(*keys, "start_ns", "end_ns")
        if label == "unassigned":  # the rest: every exposed ns lies under some communication
            left = remaining.clear()
        else:
            left = subtract(remaining, mine, keys)
        after = union_ns(left, keys, "_a")
        comm = union_ns(mine, keys, "comm_ns")
        own = union_ns(subtract(mine, compute, keys, keys), keys, "_own")
        nulls = len(keys) > 1  # a CPU rank's null device beside a multi-GPU rank's devices
        got = (
            before.join(after, on=keys, how="left", nulls_equal=nulls)
            .join(comm, on=keys, how="full", coalesce=True, nulls_equal=nulls)
            .join(own, on=keys, how="left", nulls_equal=nulls)
            .with_columns(pl.col(c).fill_null(0) for c in ("_b", "_a", "comm_ns", "_own"))
        )
        if len(keys) > 1:  # a process's devices summed (module doc, step 3)
            got = got.group_by("rank").agg(pl.col("_b", "_a", "comm_ns", "_own").sum())
        per_rank.append(
            got.select(
                "rank",
                pl.lit(label).alias("axis"),
                pl.col("comm_ns").cast(pl.Int64),
                (pl.col("_b") - pl.col("_a")).cast(pl.Int64).alias("exposed_comm_ns"),
                pl.col("_own").cast(pl.Int64).alias("_own"),
            )
        )
        remaining, before = left, after.rename({"_a": "_b"})
    ar = pl.concat(per_rank).filter((pl.col("comm_ns") > 0) | (pl.col("exposed_comm_ns") > 0))
    total = int(ar["exposed_comm_ns"].sum() or 0)
    linked = set(labelled.filter(pl.col("source").is_not_null())["source"].to_list())
    rows = rows.filter(pl.col("source").is_in(sorted(linked))) if linked else rows
    counts = rows.group_by("axis").agg(
        pl.col("members").n_unique().alias("groups"),
        pl.len().alias("collectives"),
        pl.when(pl.col("bytes_in").is_not_null().any())
        .then(pl.col("bytes_in").sum())
        .cast(pl.Int64)
        .alias("bytes"),
        pl.col("bytes_in").null_count().alias("_unknown"),
    )
    sizes = {a.name: a.size for a in mesh.axes} | {a.name: a.size for a, _ in mesh.left_out}
    found = {a.name: a.found_by for a in mesh.axes} | {
        a.name: f"{a.found_by}; left out of the mesh (a note says why)" for a, _ in mesh.left_out
    }
    # a spanning label's groups need not fill the sub-mesh of its axes: their own size, the largest
    held = dict(
        rows.filter(pl.col("members").is_not_null() & pl.col("axis").str.contains("+", literal=True))
        .group_by("axis")
        .agg((pl.col("members").str.count_matches(",", literal=True) + 1).max().alias("n"))
        .iter_rows()
    )

    def size(label: str) -> int | None:
        if label == "world":
            return mesh.world_size
        if label in held:
            return int(held[label])
        parts = label.split("+")
        if label == "unassigned" or any(p not in sizes for p in parts):
            return None
        n = 1
        for p in parts:
            n *= sizes[p]
        return n

    frame = ar.group_by("axis").agg(
        pl.col("comm_ns").sum(), pl.col("exposed_comm_ns").sum(), pl.col("_own").sum()
    )
    frame = frame.join(counts, on="axis", how="left").with_columns(
        pl.col("axis").map_elements(size, return_dtype=pl.Int64).alias("size"),
        pl.col("groups").fill_null(0).cast(pl.Int64),
        pl.col("collectives").fill_null(0).cast(pl.Int64),
        (100.0 * pl.col("exposed_comm_ns") / total if total else pl.lit(0.0)).alias("exposed_pct"),
        (pl.col("comm_ns") - pl.col("_own")).alias("hidden_ns"),
        pl.when(pl.col("comm_ns") > 0)
        .then(100.0 * (pl.col("comm_ns") - pl.col("_own")) / pl.col("comm_ns"))
        .alias("hidden_pct"),
        pl.col("axis")
        .map_elements(lambda a: found.get(a) or _label_how(a), return_dtype=pl.Utf8)
        .alias("found_by"),
    )
    order = {lab: i for i, lab in enumerate(sorted(frame["axis"].to_list(), key=label_order))}
    frame = frame.with_columns(pl.col("axis").replace_strict(order, return_dtype=pl.Int64).alias("_o")).sort(
        "_o"
    )
    unknown = [
        f"axis {axis}: {n:,} of {of:,} collectives have no recorded size: bytes "
        + ("sums the other ones" if n < of else "is null, not 0")
        for axis, n, of in frame.filter(pl.col("_unknown") > 0)
        .select("axis", "_unknown", "collectives")
        .iter_rows()
    ]
    return (
        frame.select(*COLUMNS["frame"]),
        ar.drop("_own").sort("rank", pl.col("axis").replace_strict(order, return_dtype=pl.Int64)),
        unknown,
    )


def _label_how(label: str) -> str:
    if label == "unassigned":
        return "collectives whose process group the traces do not record"
    if label == "world":
        return "groups of every rank"
    return "groups spanning the axes " + label.replace("+", ", ")


def _waited_for(stages: pl.DataFrame | None, slow: dict[str, Any]) -> tuple[int, float] | None:
    """(ns, % of the stages' step time) the other stages spent in exposed point-to-point
    communication waiting for slow stage ``slow`` (a ``slow`` table row), when it is the slowest
    stage (``stages``: the one every other stage's ``imbalance_ns`` is measured against): per other
    stage, min(imbalance_ns, p2p_exposed_ns) (its compute shortfall against the slow stage, as far
    as its exposed point-to-point time covers it) times its rank-steps (``samples``), summed; the
    % is of Σ step_ns x samples over every stage. None when the stage is not the slowest or there
    is no such time. Exposed point-to-point time whose peers are unknown is all ``transfer`` in the
    step account (``critical_path``): that finding's ``refine`` credits this much to the stage and
    takes it out of communication's.
    """
    if stages is None or stages.is_empty() or slow["index"] is None:
        return None
    top = stages.sort(["compute_ns", "stage"], descending=[True, False])["stage"][0]
    if int(top) != int(slow["index"]):
        return None
    others = stages.filter(pl.col("stage") != top)
    ns = int(
        others.select(
            (pl.min_horizontal("imbalance_ns", "p2p_exposed_ns").clip(0) * pl.col("samples")).sum()
        ).item()
        or 0
    )
    total = int(stages.select((pl.col("step_ns") * pl.col("samples")).sum()).item() or 0)
    return (ns, 100.0 * ns / total) if ns and total else None


def _parallelism_topic(inp: FindingsInput) -> tuple[list[Finding], Verdict | None]:
    """Informational findings of ``parallelism``: exposed communication per mesh axis, and the
    pipeline's bubble split of the stage with the largest bubble beyond the schedule's own (no
    cost: the exposed time is the communication finding's, a slow stage the straggler verdict's).
    Where ``stragglers`` does not apply (nothing matched across ranks), its slow stages and
    replicas are the stragglers topic's findings, with their cost."""
    res = inp.results
    p = res.get("parallelism")
    if p is None:
        return [], None
    out, verdict = [], None
    slow = (
        p.frames()["slow"].filter(pl.col("slow"))
        if "slow" in p.frames() and p.frames()["slow"].height
        else None
    )
    if slow is not None and slow.height and res.get("stragglers") is None:
        # no straggler verdict (no collective matched across ranks): the slow stages speak here
        stages = p.frames().get("stages")
        for r in slow.iter_rows(named=True):
            waited = _waited_for(stages, r) if r["kind"] == "stage" else None
            out.append(
                Finding(
                    "stragglers",
                    r["text"],
                    r["cost_pct"],
                    True,
                    "parallelism",
                    ranks=tuple(int(x) for x in r["ranks"] or ()),
                    metric="excess_pct",
                    value=r["excess_pct"],
                    cause=f"slow {r['kind']}",
                    evidence="parallelism:slow",
                    recoverable_pct=waited[1] if waited else None,
                    recoverable_ns=waited[0] if waited else None,
                )
            )
        verdict = Verdict("stragglers", "problem", "; ".join(slow["text"].to_list()))
    axes = p.frame.filter(pl.col("exposed_comm_ns") > 0)
    total = _common.num(axes["exposed_comm_ns"].sum()) if axes.height else 0.0
    mesh = str(p.note("mesh") or "").split(" (")[0]  # the mesh note's head: "mesh pp:2, dp:2"
    if total and axes.height >= 2:  # one axis (a DDP run): the communication finding says it all
        parts = ", ".join(
            f"{r['axis']} {r['exposed_pct']:.0f}% ({_common.ms(r['exposed_comm_ns'])})"
            for r in axes.iter_rows(named=True)
        )
        out.append(
            Finding(
                "parallelism",
                f"exposed communication by mesh axis ({mesh}): {parts}",
                None,
                False,
                "parallelism",
                metric="exposed_comm_ns",
                value=total,
                cause=str(axes.sort("exposed_comm_ns", descending=True)["axis"][0]),
            )
        )
    stages = p.frames().get("stages")
    if stages is not None and stages.height:
        top = (
            stages.with_columns((pl.col("bubble_ns") - pl.col("schedule_bubble_ns")).alias("_x"))
            .sort("_x", "stage", descending=[True, False])
            .row(0, named=True)
        )
        step = top["step_ns"] or 1
        out.append(
            Finding(
                "parallelism",
                (
                    f"pipeline bubble: stage {top['stage']} idle {top['bubble_pct']:.0f}% of its {_common.ms(step)} step: schedule "
                    f"{100 * top['schedule_bubble_ns'] / step:.0f}% ({top['schedule_from']}), imbalance "
                    f"{100 * top['imbalance_ns'] / step:.0f}%, p2p wait {100 * top['p2p_wait_ns'] / step:.0f}%, other "
                    f"{100 * top['other_ns'] / step:.0f}%"
                ),
                None,
                False,
                "parallelism",
                ranks=tuple(int(x) for x in top.get("ranks") or ()),
                metric="bubble_pct",
                value=top["bubble_pct"],
                cause=max(
                    ("schedule", "imbalance", "p2p_wait", "other"),
                    key=lambda k: top["schedule_bubble_ns" if k == "schedule" else f"{k}_ns"] or 0,
                ),
                evidence="parallelism:stages",
            )
        )
    return out, verdict


_RANKS = "BIGINT[]"
#: Types of the columns whose names do not say it (``traceprof.core.columns.typed``).
_TYPES = {
    "axis": "VARCHAR",
    "size": "BIGINT",
    "groups": "BIGINT",
    "collectives": "BIGINT",
    "bytes": "BIGINT",
    "found_by": "VARCHAR",
    "rank": "INTEGER",
    "traced": "BOOLEAN",
    "<axis>": "INTEGER",
    "stage": "BIGINT",
    "ranks": _RANKS,
    "samples": "BIGINT",
    "microbatches": "BIGINT",
    "schedule_from": "VARCHAR",
    "slow": "BOOLEAN",
    "pipeline": "VARCHAR",
    "step": "INTEGER",
    "lane": "VARCHAR",
    "state": "VARCHAR",
    "start_ms": "DOUBLE",
    "end_ms": "DOUBLE",
    "kind": "VARCHAR",
    "index": "BIGINT",
    "text": "VARCHAR",
    "instance": "BIGINT",
    "splits": "VARCHAR",
    "send_mean_bytes": "DOUBLE",
    "send_max_mean": "DOUBLE",
    "send_gini": "DOUBLE",
    "recv_mean_bytes": "DOUBLE",
    "recv_max_mean": "DOUBLE",
    "recv_gini": "DOUBLE",
    "peer": "BIGINT",
    "mib": "DOUBLE",
}
#: Where a table's types differ from :data:`_TYPES`: the pipeline's and the all-to-all tables' ranks.
_OWN_TYPES = {
    "pipeline": {"rank": "BIGINT"},
    "timeline": {"rank": "BIGINT", "step": "BIGINT"},
    "alltoall": {"step": "BIGINT"},
    "alltoall_peers": {"rank": "BIGINT"},
    "alltoall_matrix": {"rank": "BIGINT"},
}
_TABLE_DOCS = {
    "frame": "Per mesh axis (or label spanning axes)",
    "ranks": "The mesh: each rank's coordinate per axis",
    "axis_ranks": "Per (rank, axis)",
    "stages": "The pipeline per stage (mean step)",
    "pipeline": "The pipeline per (rank, step)",
    "timeline": "The pipeline's median step as intervals per lane",
    "slow": "Slow pipeline stages and data-parallel replicas",
    "alltoall": "All-to-all instances: their load",
    "alltoall_peers": "Bytes per (all-to-all instance, rank, peer)",
    "alltoall_matrix": "Bytes per (rank, peer), summed over the instances",
}

SPEC = Analysis(
    name="parallelism",
    params=Params,
    result=Result,
    frames=tuple(
        rc.frame(
            name,
            _TABLE_DOCS[name],
            *rc.typed(docs, {**_TYPES, **_OWN_TYPES.get(name, {})}),
            worst="window_ns" if name == "pipeline" else "",
        )
        for name, docs in COLUMNS.items()
    ),
    report=Report(85, "collectives or compute and communication activity (any trace with process groups)"),
    findings=Topic("parallelism", 70, _parallelism_topic),
)


@register(SPEC)
def run(store: Store, params: Params) -> Result:
    """The mesh, communication per axis, the pipeline and the all-to-all load of one run (module doc).

    Raises:
        StoreError: No such run.
        UsageError: A ``mesh`` that is malformed or does not multiply to the world size.
        AnalysisError: The run has no activity and no collectives.
    """
    run_id = store.resolve_run(params.run)
    mesh, groups, own = _mesh.infer(store, run_id, params.mesh)
    traced = store.sql("SELECT DISTINCT rank FROM traces WHERE run_id = ?", [run_id])["rank"].to_list()
    rows = run_steps(store, run_id, store.sql(_ROWS, [run_id]))
    act, what = _activity(store, run_id)
    if act.is_empty() and rows.is_empty():
        raise AnalysisError(f"{run_label(store, run_id)}: no activity and no collectives to place on a mesh")
    rows, gloo_notes = _gloo_groups(rows)
    rows, label_notes = _labels(rows, mesh, groups, own)
    label_notes = gloo_notes + label_notes
    notes = [_mesh_note(mesh), *mesh.notes, *label_notes]
    frame = pl.DataFrame(
        schema={
            c: pl.Utf8 if c in ("axis", "found_by") else pl.Float64 if c.endswith("_pct") else pl.Int64
            for c in COLUMNS["frame"]
        }
    )
    axis_ranks = pl.DataFrame(
        schema={"rank": pl.Int32, "axis": pl.Utf8, "comm_ns": pl.Int64, "exposed_comm_ns": pl.Int64}
    )
    labelled: pl.DataFrame | None = None
    if act.height:
        # a process that drives several GPUs: per (rank, device), summed per rank (module doc, step 3)
        multi = multi_device_ranks(act) if "device" in act.columns else []
        keys = ["rank", "device"] if multi else ["rank"]
        labelled = _comm_labels(act, rows, keys)
        frame, axis_ranks, unknown = _axes(act, labelled, rows, mesh, keys)
        notes += unknown
        if multi:
            notes.append(
                Note(
                    "rank(s) {ranks} drive several GPUs: their communication per axis is per device (a "
                    "device's communication hidden only behind that device's compute), their devices' "
                    "comm_ns and exposed_comm_ns summed",
                    ranks=multi,
                )
            )
        if what == "ops":
            notes.append(
                "no kernels or CPU ops traced: communication and compute are the run's per-op records "
                "(collectives; and NDTimeline's compute ops); exposed_comm_ns is computed here from them by "
                "overlap's rule (a collective's time under no compute op of its rank): `analyze overlap` reads "
                "kernels or CPU ops and does not run on this trace, so there is no overlap total to compare"
            )
    comm = (
        labelled
        if labelled is not None
        else pl.DataFrame(
            schema={
                "rank": pl.Int64,
                "start_ns": pl.Int64,
                "end_ns": pl.Int64,
                "step": pl.Int64,
                "axis": pl.Utf8,
                "p2p": pl.Boolean,
            }
        )
    )
    pipe = _pipeline.pipeline(store, run_id, mesh, act, comm, params)
    notes += pipe.notes
    a2a = _alltoall.alltoall(rows, mesh)
    notes += a2a.notes
    return Result(
        frame=frame,
        ranks=mesh.frame(traced),
        axis_ranks=axis_ranks,
        stages=pipe.stages,
        pipeline=pipe.steps,
        timeline=pipe.timeline,
        slow=pipe.slow,
        alltoall=a2a.instances,
        alltoall_peers=a2a.peers,
        alltoall_matrix=_alltoall.matrix(a2a.peers),
        notes=tuple(notes),
    )


def _mesh_note(mesh: _mesh.Mesh) -> Note:
    return Note(
        "mesh "
        + ", ".join(f"{a.name}:{a.size}" for a in mesh.axes)
        + " (outermost first; "
        + "; ".join(f"{a.name}: {a.found_by}" for a in mesh.axes)
        + ")",
        kind="mesh",
    )
