"""Timing profile of one run for the gate's second layer: metrics per (rank, step) and typical item times.

Algorithm:
  1. Samples per (rank, step): step time (``steps``: device span where present, else the
     ProfilerStep annotation), exposed communication and idle time (activity launched in the
     step, as the ``overlap`` and ``temporal`` analyses define them), MFU (or achieved TFLOP/s when
     the device peak is unknown) from the ``mfu`` analysis, and ``compute_ns`` (step 2). A process
     that drives several GPUs has its exposed communication and idle time taken per device and
     summed over its devices (a device's communication is hidden only behind that device's compute;
     as ``gaps`` and ``temporal``'s devices table), said in a note.
  2. Items, each as a *typical* time per rank-step: GPU kernels by name (CPU-only ranks: the
     training thread's CPU ops by name, self time), and collectives by op. Calls are grouped by
     name and shape (kernel grid/block; op ``Input Dims``; collective size); typical time =
     Σ over groups of (calls × median call duration) / rank-steps. The median per shape discards
     calls inflated by preemption or a slow outlier, which on a shared CPU dominate plain sums.
     Computed over the whole run (the item's value), per step (its unit values for the noise
     model, :mod:`traceprof.engine.noise`), per rank and per (rank, step).
  3. ``compute_ns``: the typical time of the compute items (kernels of class compute; CPU ops
     other than the ``c10d::`` enqueues): of the whole run, per step, per rank and per rank-step.
  4. ``inflation``: the compute calls' summed durations over their typical time (Σ calls × median
     per shape). A call preempted or time-sliced by other load on the machine takes longer than its
     shape's median, so this measures the contention the run ran under (calibration runs of the
     unchanged job: 1.9-2.6 on a busy 2-core machine, 5.9-11.4 when it was oversubscribed, with
     median step times 2.4-5.7x longer), while a change of the code moves the medians themselves.

Times are ns (float until the diff rounds them to whole ns).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import polars as pl

from traceprof.core.errors import AnalysisError
from traceprof.engine import analysis as registry
from traceprof.engine.activity import activity, multi_device_ranks
from traceprof.engine.intervals import class_measures
from traceprof.engine.optree import self_times, with_parents
from traceprof.storage.runs import run_label
from traceprof.storage.store import Store

__all__ = ["Timing", "profile", "typical_items", "item_frames"]

_OPS_SQL = """
WITH gpu_ranks AS (SELECT DISTINCT rank FROM events WHERE run_id = $run AND kind IN ('kernel', 'memcpy', 'memset')),
tt AS (SELECT DISTINCT rank, pid, tid FROM events WHERE run_id = $run AND kind = 'step')
SELECT e.rank, e.pid, e.tid, e.step, e.name, coalesce(json_extract_string(e.args, '$."Input Dims"'), '') AS sig,
       e.ts_ns AS start_ns, e.ts_ns + e.dur_ns AS end_ns
FROM events e JOIN tt USING (rank, pid, tid)
WHERE e.run_id = $run AND e.kind = 'cpu_op' AND e.rank NOT IN (SELECT rank FROM gpu_ranks)
"""
_CALLS_SQL = """
SELECT rank, step, 'kernel' AS kind, name, coalesce(grid, '') || coalesce(block, '') AS sig, class, dur_ns AS ns
FROM kernels WHERE run_id = $run AND step IS NOT NULL
UNION ALL
SELECT rank, step, 'collective', op, coalesce(CAST(bytes_in AS VARCHAR), ''), 'comm', end_ns - start_ns
FROM collectives
WHERE run_id = $run AND step IS NOT NULL AND end_ns IS NOT NULL
  AND (source <> 'fr' OR NOT EXISTS (SELECT 1 FROM collectives WHERE run_id = $run AND source <> 'fr'))
"""


@dataclass(frozen=True)
class Timing:
    """The timing profile of one run (module doc).

    Attributes:
        samples: Per (rank, step): step_time_ns, exposed_comm_ns, idle_ns, compute_ns, and
            tflops, mfu_pct when the ``mfu`` analysis applies.
        items: Per item (kind, name, class): ns (typical ns per rank-step), calls (per rank-step).
        item_steps: Per (kind, name, step): ns (typical ns per rank-step in that step).
        compute_steps: Per step: compute_ns (typical, per rank-step in that step).
        compute_ranks: Per rank: compute_ns (typical per step of the rank).
        inflation: Σ of the compute calls' durations / their typical time (step 4): 1 when no call
            ran longer than its shape's median; CPU contention (preemption) raises it.
        notes: What the user should know (no MFU, ...).
    """

    samples: pl.DataFrame
    items: pl.DataFrame
    item_steps: pl.DataFrame
    compute_steps: pl.DataFrame
    compute_ranks: pl.DataFrame
    inflation: float = 1.0
    notes: tuple[str, ...] = field(default=())

    @property
    def compute_ns(self) -> float:
        """Typical compute per rank-step over the run."""
        return float(self.items.filter(pl.col("class") == "compute")["ns"].sum())


def _calls(store: Store, run_id: int) -> pl.DataFrame:
    """Every timed call of the run in a step: rank, step, kind, name, sig, class, ns (module doc, step 2)."""
    ops = store.sql(_OPS_SQL.replace("$run", str(int(run_id))))
    tree = with_parents(ops, ["rank", "pid", "tid"])
    enqueue = pl.col("name").str.starts_with("c10d::") | (pl.col("name") == "record_param_comms")
    op_calls = (
        tree.with_columns(self_times(tree).alias("ns"))
        .filter(pl.col("step").is_not_null())
        .select(
            "rank",
            "step",
            pl.lit("op").alias("kind"),
            "name",
            "sig",
            pl.when(enqueue).then(pl.lit("comm")).otherwise(pl.lit("compute")).alias("class"),
            "ns",
        )
    )
    return pl.concat(
        [op_calls, store.sql(_CALLS_SQL.replace("$run", str(int(run_id))))], how="vertical_relaxed"
    )


def _typical(calls: pl.DataFrame, by: list[str], denom: pl.DataFrame) -> pl.DataFrame:
    """Per (*by, kind, name): Σ over shapes of calls × median ns, and the calls, divided by the
    rank-steps of each ``by`` group (``denom``: the ``by`` columns and ``n``)."""
    groups = calls.group_by(*by, "kind", "name", "sig").agg(
        pl.len().alias("c"), pl.col("ns").cast(pl.Float64).median().alias("med")
    )
    out = groups.group_by(*by, "kind", "name").agg(
        (pl.col("c") * pl.col("med")).sum().alias("ns"), pl.col("c").sum().alias("calls")
    )
    out = out.join(denom, on=by, how="left") if by else out.with_columns(pl.lit(denom["n"][0]).alias("n"))
    return out.with_columns(
        (pl.col("ns") / pl.col("n")).alias("ns"), (pl.col("calls") / pl.col("n")).alias("calls")
    ).drop("n")


def typical_items(store: Store, run_id: int) -> pl.DataFrame:
    """Typical time per rank-step of every kernel, CPU op and collective of a run (module doc, step 2).

    Returns:
        Frame with columns kind (kernel/op/collective), name, class (compute/comm/memory), ns
        (typical ns per rank-step), calls (calls per rank-step).

    Raises:
        AnalysisError: The run has no ProfilerSteps.
    """
    return item_frames(store, run_id)["items"]


def item_frames(store: Store, run_id: int, ranks: frozenset[int] | None = None) -> dict[str, pl.DataFrame]:
    """items, item_steps, compute_steps, compute_ranks, compute_rank_steps and inflation (module
    doc, steps 2-4) of run ``run_id``, over ``ranks`` only when given (None: every rank). The
    medians per shape and the rank-steps they are divided by count those ranks' calls and steps
    alone, so that two runs compared over their common ranks (``traceprof.engine.diff``) count
    the same ranks.

    Raises:
        AnalysisError: The run (or those ranks) has no ProfilerSteps.
    """
    keep = pl.col("rank").is_in(sorted(ranks)) if ranks is not None else pl.lit(True)
    steps = store.sql("SELECT rank, step FROM steps WHERE run_id = ?", [run_id]).filter(keep)
    if not steps.height:
        raise AnalysisError(f"{run_label(store, run_id)}: no ProfilerSteps, nothing to compare per step")
    calls = _calls(store, run_id).filter(keep)
    # one class per name (a name under several classes takes its most called one), sorted first so
    # that the class and the float sums do not change from one run of diff to the next
    cls = (
        calls.group_by("kind", "name", "class")
        .agg(pl.len().alias("c"))
        .sort("kind", "name", "class")
        .group_by("kind", "name", maintain_order=True)
        .agg(pl.col("class").sort_by("c", descending=True, maintain_order=True).first())
    )
    calls = calls.drop("class").join(cls, on=["kind", "name"])
    denoms = {
        (): pl.DataFrame({"n": [steps.height]}),
        ("step",): steps.group_by("step").agg(pl.len().alias("n")),
        ("rank",): steps.group_by("rank").agg(pl.len().alias("n")),
        ("rank", "step"): steps.with_columns(pl.lit(1).alias("n")),
    }
    typ = {by: _typical(calls, list(by), d).join(cls, on=["kind", "name"]) for by, d in denoms.items()}
    items = typ[()].sort("kind", "name").select("kind", "name", "class", "ns", "calls")
    compute = pl.col("class") == "compute"

    def compute_by(by: list[str]) -> pl.DataFrame:
        keys = steps.select(by).unique()
        got = typ[tuple(by)].filter(compute).group_by(by).agg(pl.col("ns").sum().alias("compute_ns"))
        return keys.join(got, on=by, how="left").with_columns(pl.col("compute_ns").fill_null(0.0)).sort(by)

    item_steps = typ[("step",)].select("kind", "name", "step", "ns").sort("kind", "name", "step")
    g = (
        calls.filter(compute)
        .group_by("kind", "name", "sig")
        .agg(
            pl.len().alias("c"),
            pl.col("ns").cast(pl.Float64).median().alias("med"),
            pl.col("ns").cast(pl.Float64).sum().alias("tot"),
        )
    )
    typical = float((g["c"] * g["med"]).sum())
    return {
        "items": items,
        "item_steps": item_steps,
        "compute_steps": compute_by(["step"]),
        "compute_ranks": compute_by(["rank"]),
        "compute_rank_steps": compute_by(["rank", "step"]),
        "inflation": pl.DataFrame({"inflation": [float(g["tot"].sum()) / typical if typical else 1.0]}),
    }


def _samples(store: Store, run_id: int, mfu_options: dict[str, str]) -> tuple[pl.DataFrame, list[str]]:
    """Per (rank, step): step_time_ns, exposed_comm_ns, idle_ns, tflops, mfu_pct (module doc, step 1;
    a rank that drives several GPUs: exposed_comm_ns and idle_ns summed over its devices)."""
    notes: list[str] = []
    steps = store.sql(
        """SELECT rank, step, CASE WHEN device_end_ns IS NOT NULL THEN device_end_ns - device_start_ns
                                   ELSE cpu_end_ns - cpu_start_ns END AS step_time_ns
           FROM steps WHERE run_id = ?""",
        [run_id],
    )
    act = activity(store, run_id).filter(pl.col("step").is_not_null())
    if not act.is_empty():
        multi = multi_device_ranks(act)  # per device, summed over a process's devices (module doc)
        m = class_measures(act, ["rank", "device", "step"] if multi else ["rank", "step"]).select(
            "rank",
            "step",
            (pl.col("comm_ns") - pl.col("overlap_ns")).alias("exposed_comm_ns"),
            (pl.col("window_ns") - pl.col("busy_ns")).alias("idle_ns"),
        )
        if multi:
            m = m.group_by("rank", "step").agg(pl.col("exposed_comm_ns", "idle_ns").sum())
            notes.append(
                f"{run_label(store, run_id)}: rank(s) {', '.join(map(str, multi))} drive several GPUs: their "
                "exposed communication and idle time per step are per device, summed over their devices"
            )
        steps = steps.join(m, on=["rank", "step"], how="left")
    an = registry.get(MFU)
    params = registry.make_params(an, str(run_id), mfu_options)  # bad -p values: UsageError, not a note
    try:
        mfu = an.run(store, params).to_frame()
        steps = steps.join(mfu.select("rank", "step", "tflops", "mfu_pct"), on=["rank", "step"], how="left")
    except AnalysisError as e:
        notes.append(f"{run_label(store, run_id)}: no MFU ({e})")
    return steps, notes


#: The analysis the gate's MFU metric reads.
MFU = "mfu"


def analysis_mfu_options(params: dict[str, dict[str, str]] | None) -> dict[str, str]:
    """The options for :data:`MFU` among a command's ``-p ANALYSIS.KEY=VALUE`` options (the report
    and the summary pass theirs to the regression diff)."""
    return (params or {}).get(MFU, {})


def profile(store: Store, run_id: int, mfu_options: dict[str, str] | None = None) -> Timing:
    """The timing profile of run ``run_id`` (module doc).

    Source fields read: ``steps`` (cpu/device start and end), ``events`` (the training thread's
    cpu_ops: name, ``args."Input Dims"``, ts_ns, dur_ns, step), the ``kernels`` view (name, grid,
    block, class, dur_ns, step), ``collectives`` (op, bytes_in, start_ns, end_ns, step, source),
    the ``activity`` intervals and the ``mfu`` analysis.

    Raises:
        AnalysisError: The run has no ProfilerSteps.
        UsageError: Bad ``mfu_options``.
    """
    f = item_frames(store, run_id)
    samples, notes = _samples(store, run_id, mfu_options or {})
    samples = samples.join(f["compute_rank_steps"], on=["rank", "step"], how="left").sort("rank", "step")
    return Timing(
        samples,
        f["items"],
        f["item_steps"],
        f["compute_steps"],
        f["compute_ranks"],
        float(f["inflation"]["inflation"][0]),
        tuple(notes),
    )


def unit_values(samples: pl.DataFrame, metric: str) -> tuple[float, np.ndarray]:
    """A sampled metric's run value (median over the (rank, step) samples) and unit values: per
    step, the median over ranks (per rank instead when the run has one step); nulls left out."""
    s = samples.filter(pl.col(metric).is_not_null())
    if not s.height:
        return float("nan"), np.zeros(0)
    unit = "step" if s["step"].n_unique() >= 2 else "rank"
    units = s.group_by(unit).agg(pl.col(metric).cast(pl.Float64).median()).sort(unit)[metric].to_numpy()
    return float(np.median(s[metric].cast(pl.Float64).to_numpy())), units
