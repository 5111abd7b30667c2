"""Pipeline bubbles, slow stages and slow replicas: a helper of ``traceprof.analyses.parallelism``.

Algorithm:
  1. Windows: each rank's steps (``steps``: device start/end, else the ProfilerStep), numbered as
     the run's steps (``matching.run_steps``). A pipeline is the ranks that share every coordinate
     but pp (one data-parallel replica's stages); its step window is the earliest start to the
     latest end of the step over those ranks.
  2. Per rank and step, inside its pipeline's window W: compute = |∪ compute|; p2p exposed =
     |∪ point-to-point communication − ∪ compute of the rank|; warm-up = first compute start − W
     start, cool-down = W end − last compute end; micro-batches = the rank's forward micro-batches
     in the step (:data:`FORWARD_MICROBATCH`: torch.distributed.pipelining's ``Forward i`` /
     ``PP:<stage>F<i>`` annotations, NDTimeline ``forward-compute`` ops by ``mb_id``).
  3. Per stage, means over its ranks and steps (whole ns): step, compute, bubble = step − compute,
     split exactly (each part at most what is left of the bubble, in this order):
       a. schedule: the schedule's own warm-up/cool-down bubble. With m micro-batches and p stages,
          1F1B and GPipe leave (p−1)/(m+p−1) of a balanced step idle; for this stage that is
          (p−1)/m × its compute (its step if every stage computed as it does). Without m: the
          measured warm-up + cool-down.
       b. imbalance: the slowest stage's compute − this stage's (the pipeline runs at the slowest
          stage's pace; 0 for the slowest).
       c. p2p wait: the point-to-point wait (waiting for the neighbour stage's activations or
          gradients) not already explained by a and b: the waits of the send / recv pairs
          (``traceprof.analyses._waits.p2p_copies``, own arrival to the peer's, less transfer: the
          one definition ``critical_path`` and the communication verdict read) not under compute;
          without pairs (peers unknown) the exposed point-to-point time.
       d. other: the rest (other axes' exposed collectives, host time, idle).
  4. Slow stage / replica: along pp (stages) and dp (replicas of two or more ranks: a one-rank
     replica is a rank, the stragglers analysis' business): a slice is slow when each of its
     ranks computes more than ``slow_pct`` % above the median of its peers (the ranks that share its
     other coordinates) on the other slices, and the slice's extra compute (its mean minus its
     peers' median) is at least ``min_cost_pct`` % of its mean step: the whole stage (replica) is
     slow, not one rank. Compute per rank: the mean per step of its compute union (step 2 in a
     pipeline; else the union of its compute by launch step).
     Replicas within a stage (a stage of three or more data-parallel replicas, three or more
     steps): per step, a replica's compute is its slowest rank's in the stage, the stage's median
     is the median over its replicas, and the slowest replica's ratio to it is taken; R = the
     median of that ratio over the steps. The noise is the stage's own spread across steps:
     σ = 1.4826 × MAD over the steps of the stage's median / their median (a robust relative
     standard deviation). The slowest replica is named (the one slowest in the most steps, with
     R) when R − 1 exceeds max(``slow_pct`` %, 3σ): a material margin that the stage's step-to-step
     noise does not explain. Said in the stage's ``slow`` text, and as a note for a stage not slow.
  5. Timeline: the median step (by window length) of the first pipeline: per stage its compute,
     point-to-point and other communication not hidden by compute, ms from the window start.

A process that drives several GPUs (one rank, several devices) is one stage or replica member on its
wall clock: its devices' activity merged (its compute is the union over its devices, a device's
point-to-point time hidden behind any of them computing), said in a note; a stage is a rank, and
its devices' shares of it are in ``gaps`` and ``overlap``'s devices table.

Work: sorts and linear sweeps over the activity (``traceprof.engine.intervals``); one SQL scan of the
run's annotations for the micro-batch counts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import polars as pl

from traceprof.analyses import _common, _waits
from traceprof.analyses._mesh import Mesh
from traceprof.core.text import short_list
from traceprof.engine.activity import multi_device_ranks
from traceprof.engine.analysis import Note
from traceprof.engine.intervals import clip, merge, subtract, union_ns
from traceprof.ingest.matching import preferred_source, run_steps
from traceprof.storage.store import Store

__all__ = [
    "Pipe",
    "pipeline",
    "rank_labels",
    "slice_name",
    "FORWARD_MICROBATCH",
    "STAGE_COLUMNS",
    "STEP_COLUMNS",
    "TIMELINE_COLUMNS",
    "SLOW_COLUMNS",
]

#: Names of one forward micro-batch: torch.distributed.pipelining annotates ``Forward i``
#: (ScheduleGPipe and single-stage schedules) and ``PP:<stage>F<i>`` (multi-stage schedules);
#: NDTimeline's ``forward-compute`` ops are counted by distinct ``mb_id``.
FORWARD_MICROBATCH = r"^(Forward [0-9]+|PP:[0-9]+F[0-9]+)$"

STAGE_COLUMNS = {
    "stage": "pp coordinate",
    "ranks": "ranks of the stage",
    "samples": "rank-steps averaged",
    "step_ns": "mean pipeline step (window) of the stage's rank-steps",
    "compute_ns": "mean compute per step",
    "bubble_ns": "step_ns - compute_ns",
    "bubble_pct": "bubble_ns as % of step_ns",
    "microbatches": "forward micro-batches per step (median; null unknown)",
    "schedule_bubble_ns": "the schedule's own bubble: (p-1)/m x compute_ns, else warm-up + cool-down",
    "schedule_from": "formula ((p-1)/m) or measured (warm-up + cool-down)",
    "imbalance_ns": "waiting for the slowest stage: its compute - this stage's",
    "p2p_wait_ns": "point-to-point wait for the peer not under compute (paired send / recv; unpaired: their exposed time), "
    "beyond schedule and imbalance",
    "other_ns": "the rest of the bubble",
    "p2p_exposed_ns": "mean exposed point-to-point time per step (raw)",
    "warmup_ns": "mean first compute start - window start",
    "cooldown_ns": "mean window end - last compute end",
    "slow": "the stage is slow (module doc, step 4)",
}
STEP_COLUMNS = {
    "rank": "global rank",
    "stage": "pp coordinate",
    "pipeline": "the other coordinates (the replica)",
    "step": "run step",
    "window_ns": "the pipeline's step window",
    "compute_ns": "compute inside it",
    "p2p_exposed_ns": "point-to-point communication not hidden by compute",
    "warmup_ns": "first compute - start",
    "cooldown_ns": "end - last compute",
    "microbatches": "forward micro-batches (null unknown)",
}
TIMELINE_COLUMNS = {
    "lane": "stage s (rank r)",
    "stage": "pp coordinate",
    "rank": "global rank",
    "state": "compute, p2p (exposed point-to-point), communication (other exposed)",
    "start_ms": "ms from the window start",
    "end_ms": "ms from the window start",
}
SLOW_COLUMNS = {
    "kind": "stage or replica",
    "axis": "pp or dp",
    "index": "the coordinate",
    "ranks": "its ranks",
    "compute_ns": "mean compute per step of its ranks",
    "peers_ns": "its ranks' peers (the same position on the other slices): each one's median, averaged",
    "excess_pct": "the smallest excess of one of its ranks over its peers (%)",
    "cost_pct": "its extra compute over peers_ns as % of its mean step (0 when it computes less)",
    "slow": "excess > slow_pct and cost >= min_cost_pct",
    "text": "one sentence",
}

_STAGE_TYPES: dict[str, Any] = {
    "ranks": pl.List(pl.Int64),
    "bubble_pct": pl.Float64,
    "schedule_from": pl.Utf8,
    "slow": pl.Boolean,
}
_STEP_TYPES: dict[str, Any] = {"pipeline": pl.Utf8, "step": pl.Int32}
_TIMELINE_TYPES: dict[str, Any] = {
    "lane": pl.Utf8,
    "state": pl.Utf8,
    "start_ms": pl.Float64,
    "end_ms": pl.Float64,
}
_SLOW_TYPES: dict[str, Any] = {
    "kind": pl.Utf8,
    "axis": pl.Utf8,
    "ranks": pl.List(pl.Int64),
    "excess_pct": pl.Float64,
    "cost_pct": pl.Float64,
    "slow": pl.Boolean,
    "text": pl.Utf8,
}


def _empty(columns: dict[str, str], types: dict[str, Any]) -> pl.DataFrame:
    """An empty table with ``columns``: ``types`` where given, else int64 (counts, ns, coordinates)."""
    return pl.DataFrame(schema={c: types.get(c, pl.Int64) for c in columns})


_STEPS_SQL = """
SELECT rank, step, coalesce(device_start_ns, cpu_start_ns) AS s, coalesce(device_end_ns, cpu_end_ns) AS e
FROM steps WHERE run_id = ? AND step IS NOT NULL
"""
_MICROBATCH_SQL = f"""
SELECT rank, step,
       count(*) FILTER (WHERE kind = 'user_annotation' AND regexp_matches(name, '{FORWARD_MICROBATCH}')) AS k,
       count(DISTINCT json_extract(args, '$.mb_id')) FILTER (WHERE name = 'forward-compute') AS nd
FROM events WHERE run_id = ? AND kind IN ('user_annotation', 'gpu_user_annotation') AND step IS NOT NULL
GROUP BY rank, step
"""


@dataclass(frozen=True)
class Pipe:
    """The pipeline tables (empty when the run has no pp axis) and notes."""

    stages: pl.DataFrame = field(default_factory=pl.DataFrame)
    steps: pl.DataFrame = field(default_factory=pl.DataFrame)
    timeline: pl.DataFrame = field(default_factory=pl.DataFrame)
    slow: pl.DataFrame = field(default_factory=pl.DataFrame)
    notes: tuple[str, ...] = ()


def _coord_frame(mesh: Mesh) -> pl.DataFrame:
    """rank, one column per axis (``c_<axis>``), and ``pipeline``: the coordinates but pp as text."""
    pp = mesh.axis("pp")
    rows = []
    for r, c in mesh.coords.items():
        rest = ",".join(f"{a.name}{c[i]}" for i, a in enumerate(mesh.axes) if i != pp)
        rows.append((r, *c, rest or "-"))
    return pl.DataFrame(
        rows,
        schema={"rank": pl.Int64, **{f"c_{a.name}": pl.Int64 for a in mesh.axes}, "pipeline": pl.Utf8},
        orient="row",
    )


def _windows(store: Store, run_id: int, coords: pl.DataFrame) -> pl.DataFrame:
    """Per rank and run step: its own step (s, e) and its pipeline's window (ws, we)."""
    st = run_steps(store, run_id, store.sql(_STEPS_SQL, [run_id]))
    st = (
        st.filter(pl.col("s").is_not_null() & pl.col("e").is_not_null())
        .group_by("rank", "step")
        .agg(pl.col("s").min(), pl.col("e").max())
        .with_columns(pl.col("rank").cast(pl.Int64))
    )
    st = st.join(coords.select("rank", "pipeline", "c_pp"), on="rank")
    return st.with_columns(
        pl.col("s").min().over("pipeline", "step").alias("ws"),
        pl.col("e").max().over("pipeline", "step").alias("we"),
    )


def _per_step(
    store: Store, run_id: int, act: pl.DataFrame, comm: pl.DataFrame, win: pl.DataFrame
) -> pl.DataFrame:
    """Per rank and step: window, compute, p2p exposed, warm-up, cool-down, micro-batches (step 2)."""
    keyed = run_steps(store, run_id, act.filter(pl.col("step").is_not_null())).with_columns(
        pl.col("rank").cast(pl.Int64)
    )
    w = win.select("rank", "step", "ws", "we")
    comp = clip(keyed.filter(pl.col("class") == "compute").join(w, on=["rank", "step"]), "ws", "we")
    p2p = run_steps(store, run_id, comm.filter(pl.col("p2p") & pl.col("step").is_not_null())).with_columns(
        pl.col("rank").cast(pl.Int64)
    )
    exposed = subtract(
        p2p.select("rank", "step", "start_ns", "end_ns"),
        comp.select("rank", "step", "start_ns", "end_ns"),
        ["rank", "step"],
        ["rank"],
    )
    exposed = clip(exposed.join(w, on=["rank", "step"]), "ws", "we")
    c = union_ns(comp, ["rank", "step"], "compute_ns")
    x = union_ns(exposed, ["rank", "step"], "p2p_exposed_ns")
    # the point-to-point waits (the one definition: each pair's copy from its arrival to its peer's,
    # less transfer), not under compute, in the step's window
    pairs = _waits.p2p_copies(store, run_id, preferred_source(store, run_id))
    if pairs.height:
        waits = _waits.wait_only(pairs, pl.lit(True), pl.Int64())
        # wait_only merges per rank: each merged interval keeps the run's step of its window
        waits = waits.join(w, on="rank").filter(
            pl.col("start_ns") < pl.col("we"), pl.col("end_ns") > pl.col("ws")
        )
        pw = subtract(
            waits.select("rank", "step", "start_ns", "end_ns"),
            comp.select("rank", "step", "start_ns", "end_ns"),
            ["rank", "step"],
            ["rank"],
        )
        pw = union_ns(clip(pw.join(w, on=["rank", "step"]), "ws", "we"), ["rank", "step"], "p2p_wait_ns")
    else:
        pw = pl.DataFrame(schema={"rank": pl.Int64, "step": w.schema["step"], "p2p_wait_ns": pl.Int64})
    # (the column stays null without pairs)
    edges = comp.group_by("rank", "step").agg(
        pl.col("start_ns").min().alias("_f"), pl.col("end_ns").max().alias("_l")
    )
    mb = (
        run_steps(store, run_id, store.sql(_MICROBATCH_SQL, [run_id]))
        .with_columns(
            pl.col("rank").cast(pl.Int64),
            pl.when(pl.col("nd") > 0)
            .then(pl.col("nd"))
            .when(pl.col("k") > 0)
            .then(pl.col("k"))
            .alias("microbatches"),
        )
        .group_by("rank", "step")
        .agg(pl.col("microbatches").max())
    )
    out = (
        win.join(c, on=["rank", "step"], how="left")
        .join(x, on=["rank", "step"], how="left")
        .join(pw, on=["rank", "step"], how="left")
        .join(edges, on=["rank", "step"], how="left")
        .join(mb, on=["rank", "step"], how="left")
    )
    return out.select(
        "rank",
        pl.col("c_pp").alias("stage"),
        "pipeline",
        "step",
        (pl.col("we") - pl.col("ws")).alias("window_ns"),
        pl.col("compute_ns").fill_null(0).cast(pl.Int64),
        pl.col("p2p_exposed_ns").fill_null(0).cast(pl.Int64),
        # null without pairs: the stage split then reads the exposed point-to-point time
        (pl.col("p2p_wait_ns").fill_null(0) if pairs.height else pl.col("p2p_wait_ns")).cast(pl.Int64),
        (pl.col("_f") - pl.col("ws")).fill_null(0).alias("warmup_ns"),
        (pl.col("we") - pl.col("_l")).fill_null(0).alias("cooldown_ns"),
        pl.col("microbatches").cast(pl.Int64),
        "ws",
    ).sort("pipeline", "step", "stage", "rank")


def _stages(per: pl.DataFrame, p: int) -> tuple[pl.DataFrame, list[str]]:
    """Per stage means and the exact bubble split (step 3)."""
    mean = [
        _common.whole_ns(pl.col(c).mean()).alias(c)
        for c in ("window_ns", "compute_ns", "p2p_exposed_ns", "p2p_wait_ns", "warmup_ns", "cooldown_ns")
    ]
    st = (
        per.group_by("stage")
        .agg(
            pl.col("rank").unique().sort().alias("ranks"),
            pl.len().alias("samples"),
            *mean,
            pl.col("microbatches").median().alias("m"),
        )
        .sort("stage")
    )
    cmax = int(st["compute_ns"].max() or 0)  # type: ignore[arg-type]
    rows, notes = [], []
    for r in st.iter_rows(named=True):
        step, comp = int(r["window_ns"]), int(r["compute_ns"])
        bubble = max(step - comp, 0)
        m = int(r["m"]) if r["m"] is not None and r["m"] >= 1 else None
        if m is not None:
            sched, source = min(bubble, (p - 1) * comp // m), "formula"
        else:
            sched, source = min(bubble, int(r["warmup_ns"]) + int(r["cooldown_ns"])), "measured"
        imb = min(bubble - sched, cmax - comp)
        # without paired point-to-point ops (peers unknown) their exposed time stands for the wait
        p2p = min(
            bubble - sched - imb, int(r["p2p_exposed_ns"] if r["p2p_wait_ns"] is None else r["p2p_wait_ns"])
        )
        rows.append(
            {
                "stage": r["stage"],
                "ranks": r["ranks"],
                "samples": r["samples"],
                "step_ns": step,
                "compute_ns": comp,
                "bubble_ns": bubble,
                "bubble_pct": 100.0 * bubble / step if step else None,
                "microbatches": m,
                "schedule_bubble_ns": sched,
                "schedule_from": source,
                "imbalance_ns": imb,
                "p2p_wait_ns": p2p,
                "other_ns": bubble - sched - imb - p2p,
                "p2p_exposed_ns": int(r["p2p_exposed_ns"]),
                "warmup_ns": int(r["warmup_ns"]),
                "cooldown_ns": int(r["cooldown_ns"]),
            }
        )
    if rows and all(x["microbatches"] is None for x in rows):
        notes.append(
            "pipeline: no forward micro-batch annotations, so the schedule's bubble is the measured "
            "warm-up + cool-down (first compute after the step's start, last compute before its end)"
        )
    elif rows:
        ms = sorted({x["microbatches"] for x in rows if x["microbatches"] is not None})
        notes.append(
            f"pipeline: {p} stages, {'/'.join(map(str, ms))} micro-batches per step: the schedule's own "
            f"bubble is (p-1)/(m+p-1) = {p - 1}/{ms[0] + p - 1} of a balanced step"
        )
    return pl.DataFrame(rows, schema_overrides={"ranks": pl.List(pl.Int64), "microbatches": pl.Int64}), notes


def _rank_compute(store: Store, run_id: int, act: pl.DataFrame, per: pl.DataFrame | None) -> pl.DataFrame:
    """rank, compute_ns (mean per step), step_ns (mean own step) (step 4)."""
    if per is not None and per.height:
        return per.group_by("rank").agg(
            pl.col("compute_ns").mean(), pl.col("window_ns").mean().alias("step_ns")
        )
    comp = (  # copies the columns the union reads only
        act.lazy()
        .filter((pl.col("class") == "compute") & pl.col("step").is_not_null())
        .select("rank", "step", "start_ns", "end_ns")
        .collect()
    )
    c = union_ns(comp, ["rank", "step"], "compute_ns").group_by("rank").agg(pl.col("compute_ns").mean())
    st = store.sql(f"SELECT rank, avg(e - s) AS step_ns FROM ({_STEPS_SQL}) GROUP BY rank", [run_id])
    return c.with_columns(pl.col("rank").cast(pl.Int64)).join(
        st.with_columns(pl.col("rank").cast(pl.Int64)), on="rank", how="inner"
    )


#: Spread of a robust relative standard deviation: 1.4826 x MAD estimates sigma for normal data.
_MAD_SIGMA = 1.4826
#: A replica's excess over its stage's median must exceed this many sigmas of the stage's noise.
_NOISE_SIGMAS = 3.0
#: Replicas and steps a stage needs before its slowest replica is compared with its median.
_MIN_REPLICAS = _MIN_STEPS = 3


def _replica_spread(per: pl.DataFrame | None, coords: pl.DataFrame, slow_pct: float) -> dict[int, str]:
    """Stage -> the clause naming its slowest data-parallel replica, for stages whose slowest
    replica exceeds the stage's median per step by the noise-calibrated margin (step 4, module doc).

    Args:
        per: Per rank and step (``rank``, ``step``, ``compute_ns``: ns), or None.
        coords: rank, ``c_pp``, ``c_dp`` (:func:`_coord_frame`); no ``c_dp``: no replicas, {}.
        slow_pct: The material margin, % (``parallelism.Params.slow_pct``).

    Returns:
        {stage: "within the stage, its slowest replica each step computes a median 1.40x ..."};
        stages under the margin, with fewer than 3 replicas or 3 steps, are left out. O(n log n).
    """
    if per is None or not per.height or not {"c_pp", "c_dp"} <= set(coords.columns):
        return {}
    rep = (
        per.select("rank", "step", "compute_ns")
        .join(coords.select("rank", "c_pp", "c_dp"), on="rank")
        .group_by("c_pp", "c_dp", "step")
        .agg(pl.col("compute_ns").max().alias("c"), pl.col("rank").sort())
        .with_columns(
            pl.col("c").median().over("c_pp", "step").alias("m"),
            pl.len().over("c_pp", "step").alias("n"),
        )
        .filter((pl.col("n") >= _MIN_REPLICAS) & (pl.col("m") > 0))
    )
    top = rep.sort("c_pp", "step", "c", "c_dp", descending=[False, False, True, False]).unique(
        ["c_pp", "step"], keep="first", maintain_order=True
    )
    out = {}
    for (stage,), g in top.group_by("c_pp"):
        if g.height < _MIN_STEPS:
            continue
        ratio = float((g["c"] / g["m"]).median())  # type: ignore[arg-type]
        m = g["m"].cast(pl.Float64)
        mid = float(m.median())  # type: ignore[arg-type]
        sigma = _MAD_SIGMA * float((m - mid).abs().median()) / mid  # type: ignore[arg-type]
        margin = max(slow_pct / 100.0, _NOISE_SIGMAS * sigma)
        if ratio - 1.0 <= margin:
            continue
        counts = (
            g.group_by("c_dp")
            .agg(pl.len().alias("k"), pl.col("rank").first())
            .sort(["k", "c_dp"], descending=[True, False])
        )
        who = counts.row(0, named=True)
        tied = int((counts["k"] == who["k"]).sum()) - 1
        also = f", as {tied} other replica{'s' if tied > 1 else ''}" if tied else ""
        turns = (
            "" if 2 * who["k"] > g.height else ": the replicas take turns, no one replica is slow throughout"
        )
        out[int(stage)] = (
            f"within the stage, its slowest replica each step computes a median {ratio:.2f}x the stage's median "
            f"(more than the {100 * margin:.0f}% margin: {slow_pct:g}% or 3x the stage's own step-to-step "
            f"spread of {100 * sigma:.1f}%), most often {slice_name('replica', who['c_dp'])} "
            f"(rank{'s' if len(who['rank']) > 1 else ''} {_ranks_text(who['rank'])}; slowest in {who['k']} "
            f"of {g.height} steps{also}){turns}"
        )
    return out


def _slow(
    mesh: Mesh, coords: pl.DataFrame, rc: pl.DataFrame, params: Any, spread: dict[int, str] | None = None
) -> pl.DataFrame:
    """Slow stages and replicas (step 4). A rank's peers along an axis are the ranks on the same
    line of the mesh (every other coordinate equal): O(ranks x axis size). ``spread``: stage -> the
    clause on its slowest replica (:func:`_replica_spread`), added to the stage's text."""
    rows = []
    data = coords.join(rc, on="rank")
    names = [a.name for a in mesh.axes]
    for axis, kind in (("pp", "stage"), ("dp", "replica")):
        if axis not in names or mesh.axes[names.index(axis)].size < 2 or data.is_empty():
            continue
        at = names.index(axis)
        lines: dict[
            tuple[Any, ...], list[tuple[int, int, float]]
        ] = {}  # other coords -> (coord, rank, compute)
        for r in data.iter_rows(named=True):
            key = tuple(r[f"c_{n}"] for i, n in enumerate(names) if i != at)
            lines.setdefault(key, []).append((r[f"c_{axis}"], int(r["rank"]), float(r["compute_ns"] or 0.0)))
        per_rank: dict[int, tuple[Any, float, float | None]] = {}  # rank -> (coord, compute, peers' median)
        for line in lines.values():
            for v, rank, comp in line:
                peers = sorted(c for w, _, c in line if w != v)
                med = (peers[(len(peers) - 1) // 2] + peers[len(peers) // 2]) / 2 if peers else None
                per_rank[rank] = (v, comp, med)
        steps = dict(zip(data["rank"].to_list(), data["step_ns"].to_list(), strict=True))
        for v in sorted({x[0] for x in per_rank.values() if x[0] is not None}):
            mine = sorted(r for r, x in per_rank.items() if x[0] == v)
            meds = [per_rank[r][2] for r in mine]
            if (
                len(mine) == len(per_rank)
                or any(m is None or m <= 0 for m in meds)
                or (kind == "replica" and len(mine) < 2)
            ):
                continue  # a one-rank replica is a rank: the stragglers analysis' business
            excess = min(100.0 * (per_rank[r][1] / per_rank[r][2] - 1) for r in mine)  # type: ignore[operator]
            comp = sum(per_rank[r][1] for r in mine) / len(mine)
            # like with like: each rank's peers are the same position on the other slices, so the mean
            # of its ranks' peer medians is what its mean compute is compared with (a replica spans the
            # pipeline stages: the median of those medians compared a stage's peers with every stage)
            peer = sum(meds) / len(meds)  # type: ignore[arg-type]
            step = sum(float(steps[r] or 0) for r in mine) / len(mine)
            cost = max(100.0 * (comp - peer) / step, 0.0) if step else 0.0  # extra compute: never negative
            slow = excess > params.slow_pct and cost >= params.min_cost_pct
            what = slice_name(kind, v)
            rel = 100.0 * (comp / peer - 1)
            head = f"{what} (rank{'s' if len(mine) > 1 else ''} {_ranks_text(mine)}) computes {comp / 1e6:,.1f} ms per step"
            vs = f"its peers on the other {kind}s ({peer / 1e6:,.1f} ms, its ranks' peer medians averaged"
            text = (
                f"slow {kind}: {head}, {rel:.0f}% more than {vs}; each of its ranks at least {excess:.0f}% more), "
                f"costing {cost:.0f}% of its {step / 1e6:,.1f} ms step: the whole {kind} is slow, not one rank"
                if slow
                else f"{head}, {abs(rel):.0f}% {'more' if rel >= 0 else 'less'} than {vs}): not slow"
            )
            if kind == "stage" and spread and int(v) in spread:
                text += f"; {spread[int(v)]}"
            rows.append(
                {
                    "kind": kind,
                    "axis": axis,
                    "index": int(v),
                    "ranks": mine,
                    "compute_ns": round(comp),
                    "peers_ns": round(peer),
                    "excess_pct": excess,
                    "cost_pct": cost,
                    "slow": slow,
                    "text": text,
                }
            )
    return pl.DataFrame(rows, schema={c: _SLOW_TYPES.get(c, pl.Int64) for c in SLOW_COLUMNS})


def slice_name(kind: str, index: Any) -> str:
    """What a row of the ``slow`` table is called: ``pipeline stage 3`` or ``data-parallel replica 1``."""
    return f"pipeline stage {index}" if kind == "stage" else f"data-parallel replica {index}"


def _ranks_text(ranks: list[int]) -> str:
    return short_list(ranks)


def _timeline(per: pl.DataFrame, act: pl.DataFrame, comm: pl.DataFrame) -> pl.DataFrame:
    """The median step of the first pipeline as intervals per stage (step 5)."""
    schema = {c: _TIMELINE_TYPES.get(c, pl.Int64) for c in TIMELINE_COLUMNS}
    if per.is_empty():
        return pl.DataFrame(schema=schema)
    first = per.filter(pl.col("pipeline") == per["pipeline"].min())
    lens = first.group_by("step").agg(pl.col("window_ns").max(), pl.col("ws").min()).sort("window_ns", "step")
    pick = lens.row((lens.height - 1) // 2, named=True)
    ws, we = int(pick["ws"]), int(pick["ws"]) + int(pick["window_ns"])
    ranks = first.filter(pl.col("step") == pick["step"]).select("rank", "stage")

    def in_window(df: pl.DataFrame) -> pl.DataFrame:
        """``df``'s rows of the picked step's ranks, with their stage, clipped to [ws, we]."""
        df = df.with_columns(pl.col("rank").cast(pl.Int64)).join(ranks, on="rank")
        return clip(df.with_columns(pl.lit(ws).alias("_lo"), pl.lit(we).alias("_hi")), "_lo", "_hi")

    a, c = in_window(act), in_window(comm)
    comp = a.filter(pl.col("class") == "compute").select("rank", "start_ns", "end_ns")
    parts = [comp.with_columns(pl.lit("compute").alias("state"))]
    for state, sel in (("p2p", pl.col("p2p")), ("communication", ~pl.col("p2p"))):
        ex = subtract(c.filter(sel).select("rank", "start_ns", "end_ns"), comp, ["rank"], ["rank"])
        parts.append(ex.with_columns(pl.lit(state).alias("state")))
    out = pl.concat(
        [merge(p, ["rank", "state"]) for p in parts if p.height]
        or [
            pl.DataFrame(
                schema={"rank": pl.Int64, "state": pl.Utf8, "start_ns": pl.Int64, "end_ns": pl.Int64}
            )
        ]
    )
    out = out.join(ranks, on="rank").with_columns(
        pl.format("stage {} (rank {})", "stage", "rank").alias("lane"),
        ((pl.col("start_ns") - ws) / 1e6).alias("start_ms"),
        ((pl.col("end_ns") - ws) / 1e6).alias("end_ms"),
    )
    return out.select(*schema).sort("stage", "rank", "start_ms")


def pipeline(
    store: Store, run_id: int, mesh: Mesh, act: pl.DataFrame, comm: pl.DataFrame, params: Any
) -> Pipe:
    """The pipeline tables of a run (module doc).

    Args:
        store: An open store.
        run_id: The run.
        mesh: Its mesh.
        act: Activity rank, class, start_ns, end_ns, step (ns); and device_kind, device when read
            from kernels or CPU ops (a rank that drives several GPUs is noted).
        comm: The activity's communication intervals with rank, start_ns, end_ns, step, p2p, axis.
        params: ``parallelism.Params`` (slow_pct, min_cost_pct).
    """
    coords = (
        _coord_frame(mesh)
        if mesh.axis("pp") is not None
        else _coord_frame(mesh).with_columns(pl.lit(0, pl.Int64).alias("c_pp"))
    )
    pp = mesh.axis("pp")
    per = None
    stages, steps, timeline = (
        _empty(STAGE_COLUMNS, _STAGE_TYPES),
        _empty(STEP_COLUMNS, _STEP_TYPES),
        _empty(TIMELINE_COLUMNS, _TIMELINE_TYPES),
    )
    notes: list[str] = []
    if pp is not None and mesh.axes[pp].size > 1 and act.height:
        win = _windows(store, run_id, coords)
        if win.height:
            per = _per_step(store, run_id, act, comm, win)
            stages, notes = _stages(per, mesh.axes[pp].size)
            timeline = _timeline(per, act, comm)
            steps = per.drop("ws", "p2p_wait_ns")
    slow = _empty(SLOW_COLUMNS, _SLOW_TYPES)
    if act.height:
        rc = _rank_compute(store, run_id, act, per)
        spread = _replica_spread(per, coords, params.slow_pct)
        slow = _slow(mesh, coords, rc, params, spread)
        flagged = set(slow.filter((pl.col("kind") == "stage") & pl.col("slow"))["index"].to_list())
        if stages.height:
            stages = stages.with_columns(pl.col("stage").is_in(list(flagged)).alias("slow"))
        # a stage not slow says its replicas' imbalance in a note (a slow one in its finding)
        notes += [f"{slice_name('stage', v)}: {t}" for v, t in sorted(spread.items()) if v not in flagged]
    if stages.height:
        stages = stages.select(*STAGE_COLUMNS)
    notes += [t for t in slow.filter(pl.col("slow"))["text"].to_list()] if slow.height else []
    multi = multi_device_ranks(act) if "device" in act.columns else []
    if multi and (steps.height or slow.height):
        notes.append(
            Note(
                "rank(s) {ranks} drive several GPUs: the pipeline and slow-stage figures take their devices "
                "merged (compute = the union over the devices, wall clock; per device: gaps, overlap's "
                "devices table)",
                ranks=multi,
            )
        )
    return Pipe(stages, steps, timeline, slow, tuple(notes))


def rank_labels(ranks: pl.DataFrame) -> dict[int, str]:
    """rank -> its place in the mesh, for verdicts: ``pp stage 1, dp replica 0, tp group 4, 5, 6, 7``
    (``ranks``: the parallelism ``ranks`` table; axes with one coordinate left out; nothing for a
    mesh of one data-parallel axis, where the rank number says it all)."""
    axes = [c for c in ranks.columns if c not in ("rank", "traced") and ranks[c].n_unique() > 1]
    if len(axes) == 1 and (axes[0].startswith("dp") or axes[0] == "world"):
        return {}  # one data-parallel axis: the rank number says it all
    rows = list(ranks.iter_rows(named=True))
    lines: dict[tuple[str, tuple[Any, ...]], list[int]] = {}  # (axis, other coords) -> ranks on that line
    for r in rows:
        for a in axes:
            lines.setdefault((a, tuple(r[o] for o in axes if o != a)), []).append(int(r["rank"]))
    out: dict[int, str] = {}
    for r in rows if axes else []:
        parts = []
        for a in axes:
            if r[a] is None:
                continue
            if a == "pp":
                parts.append(f"pp stage {r[a]}")
            elif a.startswith("dp"):
                parts.append(f"{a} replica {r[a]}")
            else:
                parts.append(
                    f"{a} group {_ranks_text(sorted(lines[(a, tuple(r[o] for o in axes if o != a))]))}"
                )
        out[int(r["rank"])] = ", ".join(parts)
    return out
