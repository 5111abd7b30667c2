"""whatif's blame table (``traceprof.analyses.whatif``, module doc step 5): each group's slowdown alone.

:func:`blame` replays the ideal with one group's recorded values put back (a rank's charged nodes,
:func:`charged`; a pipeline stage; an op type) and gives the ``blame`` frame's rows.
"""

from __future__ import annotations

import math

import numpy as np
import polars as pl

from traceprof.analyses import _common, _replay, _whatif_fix
from traceprof.storage.store import Store

__all__ = ["blame", "charged", "at_least_1"]


def _stages(store: Store, run_id: int) -> dict[int, int]:
    df = store.sql(
        """SELECT DISTINCT rank, try_cast(json_extract(meta, '$.stage') AS INTEGER) AS stage
           FROM traces WHERE run_id = ? AND json_extract(meta, '$.stage') IS NOT NULL""",
        [run_id],
    )
    return {int(r): int(s) for r, s in df.iter_rows() if s is not None}


def blame(
    store: Store,
    run_id: int,
    tl: _replay.Timeline,
    charged: np.ndarray,
    recorded: tuple[np.ndarray, np.ndarray],
    ideal: tuple[np.ndarray, np.ndarray],
    ref: tuple[float, np.ndarray | None],
    s_ref: float,
    kind: str,
    top_ops: int,
    ideal_steps: np.ndarray | None = None,
    base: np.ndarray | None = None,
    fixes: tuple[dict[str, float], dict[str, float]] = ({}, {}),
) -> pl.DataFrame:
    """Slowdown of the ``ideal`` replay with one group's ``recorded`` values put back (whatif's
    module doc, step 5): durations for ``kind="blocking"``, host gaps for ``kind="host"``. ``ref``: the mean
    step time the slowdown is over, and per step (in step order) the cap of each step's time, as
    S caps the ideal at the step it is compared with (None: no cap). ``charged``: :func:`charged`.
    ``ideal_steps``: the per-step time the slowdown is over (its mean is ``ref``'s), for the stage
    rows' interval (``slowdown_lo``: the low end of a bootstrap over steps); None: that mean.
    ``base``: :func:`_replay.replay`'s ends with the ``ideal`` values when at hand (run's replay of
    them), not replayed again. ``fixes``: :func:`_whatif_fix.fixes` of the kind (its ``fix_slowdown`` and
    ``bound_pct`` per rank; none: null). ``top_ops``: how many op types get a row (blocking only).

    Returns:
        The ``blame`` frame's rows of the kind: by, kind, group, slowdown, slowdown_lo,
        excess_alone_pct, fix_slowdown, bound_pct (ratios and %), by ``by`` then slowdown, most first.
    """
    mean_ideal, cap = ref
    (gap0, dur0), (gap_i, dur_i) = recorded, ideal
    nodes = tl.nodes
    node_kind = nodes["kind"].to_numpy()
    # each node's weight (gap + dur, as _replay.replay adds them) in the ideal replay and with its
    # recorded value put back; a group changes the nodes where the two differ
    w_ideal = gap_i + dur_i
    val = _replay.replay_weights(tl, w_ideal) if base is None else base
    w_rec = gap_i + dur0 if kind == "blocking" else gap0 + dur_i
    differs = w_rec != w_ideal
    put_back = _whatif_fix.PutBack(tl, w_ideal, val)  # = replay(gap_i, dur_i)
    del val

    def per_step(mask: np.ndarray) -> np.ndarray:
        """Each step's time with the group's recorded values put back (capped as S is)."""
        at = np.nonzero(mask & differs)[0]
        t = put_back.step_t(at, w_rec[at])
        return np.minimum(t, cap) if cap is not None else t

    def with_group(mask: np.ndarray) -> float:
        return max(float(per_step(mask).mean()) / mean_ideal, 1.0)

    ranks = nodes["rank"].to_numpy()
    rows: list[tuple[str, str, float]] = []
    # a rank's changed nodes are its charged ones that differ: grouped by rank in one sort, not
    # one mask over every node per rank
    cand = np.nonzero(charged & differs)[0]
    cand = cand[_replay.stable_order(ranks[cand])]
    cand_ranks, first = np.unique(ranks[cand], return_index=True)
    last = [*first[1:].tolist(), len(cand)][: len(first)]
    bounds = {r: (a, b) for r, a, b in zip(cand_ranks.tolist(), first.tolist(), last, strict=True)}
    alone_ideal: float | None = None  # a rank with nothing to put back: the ideal itself
    for r in np.unique(ranks[ranks >= 0]).tolist():
        if r in bounds:
            at = cand[bounds[r][0] : bounds[r][1]]
            t = put_back.step_t(at, w_rec[at])
            alone = max(float((np.minimum(t, cap) if cap is not None else t).mean()) / mean_ideal, 1.0)
        else:
            if alone_ideal is None:
                alone_ideal = with_group(np.zeros(len(node_kind), bool))
            alone = alone_ideal
        rows.append(("rank", str(int(r)), alone))
    stages = _stages(store, run_id)
    low: dict[str, float | None] = {}  # stage -> the low end of its alone slowdown's interval over steps
    if stages:
        stage_of = np.array([stages.get(int(r), -1) for r in ranks])
        for st in sorted(set(stages.values())):
            t = per_step(stage_of == st)
            rows.append(("stage", str(st), max(float(t.mean()) / mean_ideal, 1.0)))
            low[str(st)] = at_least_1(
                _common.ratio_interval(
                    t, np.broadcast_to(mean_ideal, t.shape) if ideal_steps is None else ideal_steps
                )[0]
            )
    if kind == "blocking":
        # each node's op name as an integer: the dense rank of its name (0: no name, instance nodes)
        name_code = tl.names.rank("dense").cast(pl.Int64).to_numpy()
        k0 = (nodes["key"] // _replay.KEY_SPAN).fill_null(-1).to_numpy()
        code = np.where(k0 >= 0, name_code[np.maximum(k0, 0)] if len(name_code) else 0, 0)
        name_of = dict(zip(name_code.tolist(), tl.names.to_list(), strict=True))
        # op types by their time above the ideal (the signed excess sums to float noise around 0
        # when the ideal is the mean, which then picked the top list at random), summed in node
        # order (np.bincount: one summation order), the most first, then by name
        real = node_kind != 2
        x = np.bincount(
            code[real], weights=np.maximum(dur0 - dur_i, 0.0)[real], minlength=int(code.max(initial=0)) + 1
        )
        present = np.unique(code[real])
        excess = pl.DataFrame(
            {"name": [name_of.get(int(c)) for c in present], "code": present, "x": x[present]},
            schema={"name": pl.Utf8, "code": pl.Int64, "x": pl.Float64},
        )
        top = excess.sort(["x", "name"], descending=[True, False], nulls_last=True).head(top_ops)
        rows.extend(
            ("op", str(name), with_group(code == c)) for name, c in zip(top["name"], top["code"], strict=True)
        )
    else:
        rows.append(("op", "(host gaps)", with_group(node_kind != 2)))
    excess_pct = (100 * (pl.col("slowdown") - 1) / (s_ref - 1)).clip(0.0, 100.0) if s_ref - 1 > 1e-9 else None
    fix, bound = fixes
    blame = pl.DataFrame(rows, schema=["by", "group", "slowdown"], orient="row").with_columns(
        pl.lit(kind).alias("kind"),
        pl.when(pl.col("by") == "rank")
        .then(pl.col("group").replace_strict(fix, default=None, return_dtype=pl.Float64))
        .alias("fix_slowdown"),
        pl.when(pl.col("by") == "rank")
        .then(pl.col("group").replace_strict(bound, default=None, return_dtype=pl.Float64))
        .alias("bound_pct"),
        pl.lit(None, pl.Float64).alias("excess_alone_pct")
        if excess_pct is None
        else excess_pct.alias("excess_alone_pct"),
        pl.when(pl.col("by") == "stage")
        .then(pl.col("group").replace_strict(low, default=None, return_dtype=pl.Float64))
        .alias("slowdown_lo"),
    )
    return blame.select(
        "by", "kind", "group", "slowdown", "slowdown_lo", "excess_alone_pct", "fix_slowdown", "bound_pct"
    ).sort(["by", "slowdown", "group"], descending=[False, True, False])  # group: a total order


def at_least_1(x: float) -> float | None:
    """An interval end of a slowdown, at least 1; None for no interval (nan: too few steps)."""
    return None if math.isnan(x) else max(x, 1.0)


def charged(nodes: pl.DataFrame) -> np.ndarray:
    """Nodes a rank's blame may put back (whatif's module doc, step 5): its items up to a collective it
    arrived at last, alone (the compute and host gaps that made it late, and that collective's
    transfer). A rank's slow ops hidden while it waited for another rank, or after its step's last
    collective, delayed no one and are not charged to it.

    In node order within each rank and step, an item is charged when the next arrival item at or
    after it (itself, for an arrival) is its instance's only last arrival. Worked on node arrays
    (the comm nodes, a few per cent of them, in frames)."""
    kind = nodes["kind"].to_numpy()
    n = len(kind)
    comm = nodes.select(  # the comm nodes alone (arrivals and ends): instances' last arrivals
        pl.int_range(pl.len(), dtype=pl.Int64).alias("i"), "kind", "rank", "instance", "end"
    ).filter(pl.col("kind").is_in([1, 3]))
    arr = comm.filter(pl.col("kind") == 1)
    arr = arr.with_columns(
        (
            (pl.col("end") == pl.col("end").max().over("instance"))
            & ((pl.col("end") == pl.col("end").max().over("instance")).sum().over("instance") == 1)
        ).alias("last")
    )
    # each item's next arrival in node order within its (rank, step): a backward fill, by one sort
    items = np.nonzero(kind <= 1)[0]
    rank = nodes["rank"].to_numpy()[items].astype(np.int64)
    step = nodes["step"].to_numpy()[items].astype(np.int64)
    o = _by_rank_step(items, rank, step)
    del rank, step
    it = items[o]
    del items, o
    r_it, s_it = nodes["rank"].to_numpy()[it], nodes["step"].to_numpy()[it]
    new_group = np.ones(len(it), bool)
    new_group[1:] = (r_it[1:] != r_it[:-1]) | (s_it[1:] != s_it[:-1])
    del r_it, s_it
    group = np.cumsum(new_group)
    del new_group
    is_arr = kind[it] == 1
    pos = np.where(is_arr, np.arange(len(it)), len(it))
    nxt = np.minimum.accumulate(pos[::-1])[::-1]  # the first arrival at or after each position
    del pos
    last_of = np.zeros(n, bool)
    last_of[arr["i"].to_numpy()] = arr["last"].to_numpy()
    found = nxt < len(it)
    nq = np.where(found, nxt, 0)
    ok = found & (group[nq] == group)
    out = np.zeros(n, bool)
    out[it] = ok & last_of[it[nq]]
    del nxt, nq, ok, found, group, is_arr, it, last_of
    # a comm end node (its transfer) goes with its arrival item
    tx = comm.filter(pl.col("kind") == 3).join(
        arr.select("instance", "rank", pl.col("i").alias("_a")), on=["instance", "rank"], how="left"
    )
    a_i = tx["_a"].to_numpy()
    has = ~np.isnan(a_i) if a_i.dtype.kind == "f" else np.ones(len(a_i), bool)
    out[tx["i"].to_numpy()] = np.where(has, out[np.where(has, a_i, 0).astype(np.int64)], False)
    return out


def _by_rank_step(items: np.ndarray, rank: np.ndarray, step: np.ndarray) -> np.ndarray:
    """``np.lexsort((items, step, rank))`` for ascending distinct ``items``: by rank, step, then
    item. Where (rank, step) take under 2^16 values as one number, a stable sort of it
    (``_replay.stable_order``, a radix sort: ties stay in item order; 8 x 1 M, 8 ranks x 1,000
    steps: 300 -> 30 ms); else when (rank, step, item) fit one int64 as a number, one argsort of it
    (distinct: the same order; about a third of the three-key sort's time)."""
    if not len(items):
        return np.zeros(0, np.intp)
    r0, s0 = int(rank.min()), int(step.min())
    n_r, n_s, n_i = int(rank.max()) - r0 + 1, int(step.max()) - s0 + 1, int(items[-1]) + 1
    if n_r * n_s < 2**16:
        return _replay.stable_order((rank - r0) * n_s + (step - s0))
    if n_r * n_s * n_i >= 2**62:
        return np.lexsort((items, step, rank))
    return np.argsort(((rank - r0) * n_s + (step - s0)) * n_i + items)
