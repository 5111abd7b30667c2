"""Per-rank timelines for the straggler analyses, and a dependency replay of them.

Shared by ``stragglers`` (compute time per step) and ``whatif`` (the replay). Not an analysis.

Items: a rank's timeline in one step is a list of *compute items* (the top-level compute intervals
of each lane: training-thread ops on CPU ranks, compute kernels on GPU ranks, NDTimeline compute
ops) and *comm items* (its rows of the matched collective instances: arrival and end).

Replay model (a simplified version of the dependency model of "Understanding Stragglers in Large
Model Training Using What-if Analysis", OSDI'25), built from the timestamps alone:
  1. Happens-before: item v of a rank depends on every earlier item u of the same rank and step
     that ended before v started, up to a tolerance (u.end <= v.start + max(eps, 5% of the
     shorter duration)); only the maximal such u are kept (those not followed by another
     predecessor that started after u ended).
  2. Each item has a *gap* (start - the latest end of its dependencies, or - the step start when
     it has none: host time the trace does not explain) and a *duration* (compute items: end -
     start; comm items: transfer = end - the instance's last arrival).
  3. Replay: an item is ready when its dependencies are done; a compute item ends at ready + gap
     + duration; a rank arrives at a collective at ready + gap, the instance starts at the last
     arrival of its ranks and each rank's copy ends at that start + its transfer.
With the recorded gaps and durations the replay reproduces the trace (up to eps and clamping of
negative values to 0), so the difference between two replays is the effect of the changed values.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from traceprof.core import cancel
from traceprof.core.errors import AnalysisError
from traceprof.engine import intervals
from traceprof.engine.activity import activity, release_activity
from traceprof.engine.analysis import release_shared, shared
from traceprof.engine.arrivals import TRANSIENT_SKEW_FACTOR, Transient, comm_items, transient
from traceprof.ingest.matching import run_steps, unmatched_p2p
from traceprof.storage.runs import PROFILER_SOURCES, untraced_ranks
from traceprof.storage.store import Store

__all__ = [
    "compute_items",
    "release_compute_items",
    "comm_items",
    "require_matched",
    "partial_note",
    "Timeline",
    "build",
    "replay",
    "replay_weights",
    "replay_changes",
    "replay_changes_within",
    "stable_order",
    "EPS_NS",
    "KEY_SPAN",
    "Transient",
    "transient",
    "TRANSIENT_SKEW_FACTOR",
]

#: Pooling keys (``Timeline.nodes["key"]``) are key0 position x this + ordinal in the step.
KEY_SPAN = 2**32
#: Tolerance for "ended before started" (ns): float32 NDTimeline times have ~4 us resolution.
EPS_NS = 10_000
#: ... or this share of the shorter item's duration, whichever is larger (NDTimeline's GPU-event
#: times let a 3.5 ms send start 40 us before the 550 ms compute it follows has ended).
_OVERLAP_SHARE = 0.05


#: Rows of the compute items worked on at once (whole ranks; at least one rank): the sort and the
#: nesting filter hold one chunk's temporaries, not the run's.
_CHUNK_ROWS = 1 << 18
#: The activity columns the compute items are made from.
_ITEM_COLUMNS = ("rank", "step", "lane", "name", "start_ns", "end_ns")


@shared
def compute_items(store: Store, run_id: int) -> pl.DataFrame:
    """Top-level compute intervals of every rank.

    Compute = ``traceprof.engine.activity`` rows of class compute (training-thread ops on CPU ranks,
    compute kernels on GPU ranks); runs without them (NDTimeline) use their ``gpu_user_annotation``
    events. Intervals nested in another of the same rank and lane are dropped.

    Worked on in chunks of whole ranks (:data:`_CHUNK_ROWS` rows): every step reads one rank's
    rows alone, so the chunks' results, put together in rank order, are the whole run's.

    Returns:
        Frame rank, step (the run's step: ``matching.run_steps``), name, start_ns, end_ns (ns,
        aligned clock), sorted by rank (nulls last), lane, start_ns, end_ns (longest first) and name.
    """
    # a report takes the rows from the one frame it shares; outside a report only the compute
    # rows' six columns are read (not every row's class, device and device kind), and let go of
    # once the items are made from them
    comp = activity(store, run_id, columns=_ITEM_COLUMNS, classes=("compute",)).select(_ITEM_COLUMNS)
    release_activity(store, run_id, columns=_ITEM_COLUMNS, classes=("compute",))
    if comp.is_empty():
        comp = store.sql(
            """SELECT rank, step, 'tid ' || tid AS lane, name, ts_ns AS start_ns, ts_ns + dur_ns AS end_ns
               FROM events WHERE run_id = ? AND kind = 'gpu_user_annotation'""",
            [run_id],
        )
    moved = _moved_steps(store, run_id, comp)
    parts = [_top_level(_with_run_steps(c, moved)) for c in _rank_chunks(comp)]
    if not parts:  # no rows: the frame as read, its types kept
        return comp.drop("lane")
    del comp
    return intervals.concat_taking(parts)  # the chunks let go of column by column


def release_compute_items(store: Store, run_id: int) -> None:
    """Let go of the :func:`compute_items` kept for ``run_id`` in a ``traceprof analyze`` session
    (``traceprof.engine.analysis.release_shared``; a report keeps them): its caller was their last
    reader (the replay graph is built), and a later call makes them again."""
    release_shared(compute_items, store, run_id)


def _top_level(comp: pl.DataFrame) -> pl.DataFrame:
    """The rows of ``comp`` (whole ranks) not nested in an earlier one of their rank and lane, in
    :func:`compute_items`' order, without the lane."""
    # a total order (name last): of two intervals with the same bounds on a lane, the same one is
    # kept; lanes and names sorted as integers (their positions among the sorted distinct values)
    comp = (
        comp.with_columns(_code("lane").alias("_lane"), _code("name").alias("_name"))
        .sort(
            "rank",
            "_lane",
            "start_ns",
            "end_ns",
            "_name",
            descending=[False, False, False, True, False],
            nulls_last=True,
        )
        .drop("_lane", "_name")
    )
    prev = pl.col("end_ns").cum_max().shift(1).over("rank", "lane")
    return comp.filter(prev.is_null() | (pl.col("end_ns") > prev)).drop("lane")


def _rank_chunks(frame: pl.DataFrame) -> list[pl.DataFrame]:
    """``frame`` as zero-copy slices of whole ranks, about :data:`_CHUNK_ROWS` rows each, in rank
    order (nulls last); a frame whose ranks are not contiguous is sorted by rank first."""
    if frame.is_empty():
        return []
    r = frame["rank"]
    first = np.nonzero(r.ne_missing(r.shift(1)).fill_null(True).to_numpy())[0]
    runs = r.gather(first)
    if runs.n_unique() != len(first):  # a rank in several runs: not grouped by rank
        frame = frame.sort("rank", maintain_order=True, nulls_last=True)
        r = frame["rank"]
        first = np.nonzero(r.ne_missing(r.shift(1)).fill_null(True).to_numpy())[0]
        runs = r.gather(first)
    bounds = np.append(first, frame.height)
    # runs in rank order, nulls last (each a whole rank); consecutive runs joined up to the chunk size
    order = runs.arg_sort(nulls_last=True).to_numpy()
    out: list[pl.DataFrame] = []
    pending: list[pl.DataFrame] = []
    size = 0
    for i in order.tolist():
        pending.append(frame.slice(int(bounds[i]), int(bounds[i + 1] - bounds[i])))
        size += pending[-1].height
        if size >= _CHUNK_ROWS:
            out.append(pl.concat(pending) if len(pending) > 1 else pending[0])
            pending, size = [], 0
    if pending:
        out.append(pl.concat(pending) if len(pending) > 1 else pending[0])
    return out


def _code(col: str, uniq: pl.Series | None = None) -> pl.Expr:
    """A string column as int64: each value's position among the column's distinct values, sorted
    (the same order as the strings; null stays null). ``uniq``: those values, when already at hand."""
    if uniq is None:
        values: pl.Expr | pl.Series = pl.col(col).drop_nulls().unique().sort()
        codes: pl.Expr | pl.Series = pl.int_range(values.len())
    else:
        values, codes = uniq, pl.int_range(uniq.len(), eager=True)
    return pl.col(col).replace_strict(values, codes, default=None, return_dtype=pl.Int64)


def _moved_steps(store: Store, run_id: int, frame: pl.DataFrame) -> pl.DataFrame | None:
    """The (rank, step) pairs of ``frame`` whose step :func:`traceprof.ingest.matching.run_steps`
    changes: rank, step (own), _run (the run's); None when none does. Mapped on the distinct pairs
    (a few thousand), not row by row."""
    if frame.is_empty():
        return None
    keys = frame.select("rank", "step").unique()
    mapped = run_steps(store, run_id, keys.with_columns(pl.col("step").alias("_own")))
    moved = mapped.filter(pl.col("step").ne_missing(pl.col("_own")))
    if moved.is_empty():
        return None
    return moved.select("rank", pl.col("_own").alias("step"), pl.col("step").alias("_run"))


def _with_run_steps(frame: pl.DataFrame, moved: pl.DataFrame | None) -> pl.DataFrame:
    """``frame`` with its steps moved as :func:`_moved_steps` says (no join when none moves)."""
    if moved is None or frame.is_empty():
        return frame
    cols = frame.columns
    return (
        frame.join(moved, on=["rank", "step"], how="left", nulls_equal=True)
        .with_columns(pl.coalesce("_run", "step").alias("step"))
        .select(cols)
    )


def _ranks(store: Store, run_id: int) -> tuple[int, int | None]:
    """(ranks traced by a profiler (``traces.source`` in ``PROFILER_SOURCES``, any source where the
    run has none of them), world size of the job or None when unknown)."""
    untraced, world = untraced_ranks(store, run_id, PROFILER_SOURCES)
    if world is not None:
        return world - len(untraced), world
    row = store.sql("SELECT count(DISTINCT rank) FROM traces WHERE run_id = ?", [run_id]).row(0)
    return int(row[0]), None


def require_matched(
    store: Store, run_id: int, items: pl.DataFrame, source: str | None, label: str, analysis: str
) -> None:
    """Raise unless ``items`` (:func:`comm_items`) hold a collective seen by two or more ranks.

    Both straggler analyses compare ranks at the same collective; with one rank (or nothing
    matched) there is nothing to compare, and a trivial "no straggler" would be a wrong answer.

    Raises:
        AnalysisError: Saying why: one rank traced, or point-to-point ops that cannot be matched.
    """
    if source is not None and not items.is_empty() and (items["n_ranks"] >= 2).any():
        return
    traced, world = _ranks(store, run_id)
    why = [f"{traced} rank{'s' if traced != 1 else ''} traced" + (f" of {world}" if world else "")]
    if traced < 2:
        why.append("trace two or more ranks of the job")
    p2p = unmatched_p2p(store, run_id)
    if p2p:
        why.append(
            f"{p2p} point-to-point ops (send/recv) have no process group and sequence number, so "
            "their peers are unknown and they cannot be matched across ranks"
        )
    # a pipeline's send / recv: its stages are compared by parallelism (summary's stragglers verdict then)
    stages = "; `traceprof analyze parallelism --table slow` compares a pipeline's stages" if p2p else ""
    raise AnalysisError(
        f"{label}: no collective matched across two or more ranks ({'; '.join(why)}); "
        f"{analysis} compares ranks at the same collective{stages}"
    )


def partial_note(store: Store, run_id: int, consequence: str) -> str | None:
    """``"<traced> of <world> ranks traced: <consequence>"`` when only some ranks of the job were
    traced; None when all were or the world size is unknown."""
    traced, world = _ranks(store, run_id)
    if world is None or traced >= world:
        return None
    return f"{traced} of {world} ranks traced: {consequence}"


@dataclass(frozen=True)
class _Level:
    """One topological level of a :class:`Timeline` as a replay reads it (:meth:`Timeline.plan`):
    its nodes ``a..b-1`` and their predecessors' entries ``lo..hi-1`` of ``pred``; ``some``: the
    positions in the level of the nodes with a predecessor, None when every node has one; ``starts``:
    each such node's first entry, relative to ``lo`` (the ``np.maximum.reduceat`` offsets)."""

    a: int
    b: int
    lo: int
    hi: int
    some: np.ndarray | None
    starts: np.ndarray


@dataclass
class Timeline:
    """The dependency graph of a run's items, ready to replay (see :func:`build`).

    Node arrays (one entry per node, in topological order by ``level``): ``kind`` (int8: 0 compute,
    1 arrival, 2 instance, 3 comm end), ``rank`` and ``step`` (int32), ``key`` (pooling key, int64: the item's
    key0 (compute: its name; comm: op|group class|bytes) as its position k among the run's distinct
    key0s, sorted, times :data:`KEY_SPAN`, plus its ordinal among the items of its rank and step
    with that key0; null for instance nodes), ``instance``
    (instance id of comm nodes, -1 for compute; items come first, in rank, step and start order), ``gap`` and
    ``dur`` (recorded ns), ``base`` (step start ns for nodes without predecessors, else -inf),
    ``end`` (recorded end ns, NaN for instance nodes). Times are ns since the run's first item;
    ``step_start`` (step, step_start_ns) is on the same scale. Edges in CSR form by target: ``pred_ptr``,
    ``pred`` (int32 while node and edge counts fit it). ``levels``: node index ranges per topological level. ``names``: the op name (key0 up to its first ``|``)
    of each key0 position k.
    """

    nodes: pl.DataFrame
    pred_ptr: np.ndarray
    pred: np.ndarray
    levels: list[tuple[int, int]]
    step_start: pl.DataFrame
    names: pl.Series = field(default_factory=lambda: pl.Series(dtype=pl.Utf8))
    _by_step: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None
    _succ: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
    _ends: tuple[np.ndarray, np.ndarray] | None = None
    _plan: list[_Level] | None = None

    def plan(self) -> list[_Level]:
        """Computed once: each level of :attr:`levels` as every replay reads the graph there
        (:class:`_Level`), not worked out again per replay (8 x 1 M events: 352 levels, about 60
        replays; a full replay 26-37 -> 23 ms)."""
        if self._plan is None:
            ptr = self.pred_ptr
            out = []
            for a, b in self.levels:
                lo, hi = int(ptr[a]), int(ptr[b])
                seg = ptr[a : b + 1] - lo
                nonempty = seg[1:] > seg[:-1]
                some = None if bool(nonempty.all()) else np.nonzero(nonempty)[0]
                out.append(_Level(a, b, lo, hi, some, seg[:-1][nonempty]))
            self._plan = out
        return self._plan

    def successors(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Computed once: (``succ_ptr``, ``succ``: the edges in CSR form by source, of ``pred``'s
        dtype; ``level``: each node's topological level, int32, one entry per node)."""
        if self._succ is None:
            n, ix = self.nodes.height, self.pred.dtype
            o = np.argsort(self.pred, kind="stable")
            succ = np.repeat(np.arange(n, dtype=ix), np.diff(self.pred_ptr))[o]
            del o
            ptr = np.zeros(n + 1, self.pred_ptr.dtype)
            np.cumsum(np.bincount(self.pred, minlength=n), out=ptr[1:])
            level = np.zeros(n, np.int32)
            for i, (a, b) in enumerate(self.levels):
                level[a:b] = i
            self._succ = (ptr, succ, level)
        return self._succ

    def by_step(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The nodes of each step, computed once: (node indices sorted by step, instance nodes
        left out; the offset of each step's first one; the steps, ascending; their start ns)."""
        if self._by_step is None:
            step, kind = self.nodes["step"].to_numpy(), self.nodes["kind"].to_numpy()
            keep = np.nonzero(kind != 2)[0].astype(self.pred.dtype)
            order = keep[stable_order(step[keep])]
            del keep
            st = step[order]
            seg = np.concatenate([[0], np.nonzero(np.diff(st))[0] + 1]) if len(st) else np.zeros(0, np.int64)
            steps = st[seg].astype(np.int64)
            start = dict(
                zip(
                    self.step_start["step"].to_list(), self.step_start["step_start_ns"].to_list(), strict=True
                )
            )
            self._by_step = (order, seg, steps, np.array([start[int(x)] for x in steps], dtype=np.float64))
        return self._by_step

    def step_ends(self) -> tuple[np.ndarray, np.ndarray]:
        """Computed once: :meth:`by_step`'s order and step offsets with only the nodes that can
        end their step in a replay whose weights are all at least 0: those without a successor in
        their step (instance nodes aside). A node with one ends no later than it (the max of its
        predecessors' ends plus a weight >= 0; a NaN goes on to it too), so each step's latest end
        over these nodes is the latest over all its nodes, bit for bit; every step keeps one (its
        same-step successors end at such a node). 8 x 1 M events: 2.7 M nodes -> 0.13 M."""
        if self._ends is None:
            order, seg = self.by_step()[:2]
            step, kind = self.nodes["step"].to_numpy(), self.nodes["kind"].to_numpy()
            n = len(step)
            dst = np.repeat(np.arange(n, dtype=self.pred.dtype), np.diff(self.pred_ptr))
            same = (kind[dst] != 2) & (step[dst] == step[self.pred])
            del dst
            ends = np.ones(n, bool)
            ends[self.pred[same]] = False
            del same
            keep = ends[order]
            counts = np.add.reduceat(keep.astype(np.int64), seg) if len(order) else np.zeros(0, np.int64)
            self._ends = (order[keep], (np.cumsum(counts) - counts).astype(seg.dtype))
        return self._ends


def stable_order(keys: np.ndarray) -> np.ndarray:
    """``np.argsort(keys, kind="stable")`` of integer ``keys``: the same order (a stable sort has one),
    by numpy's radix sort where the keys span fewer than 2^16 values (``keys - min`` as uint16:
    levels, steps, ranks; 2.7 M levels of 352 values 174 -> 31 ms), else numpy's own (a radix sort
    of wider keys is slower than its merge sort of nearly sorted ones: the edges' ends)."""
    if len(keys) and int(keys.max()) - int(keys.min()) < 1 << 16:
        return np.argsort((keys.astype(np.int64) - int(keys.min())).astype(np.uint16), kind="stable")
    return np.argsort(keys, kind="stable")


def _deps_of(start: np.ndarray, end: np.ndarray, slack: np.ndarray, eps: int, v: int) -> np.ndarray:
    """Positions (in one rank and step, sorted by start) of the maximal happens-before
    predecessors of item ``v`` (module doc, step 1): the reference definition, O(v) per item.
    :func:`_deps` computes the same for every item at once and calls this for the few items its
    bounded look-back cannot settle."""
    # earlier items (start order, so no cycles among zero-length items) that ended before v
    # started, up to the tolerance
    tol = np.maximum(eps, np.minimum(slack[:v], slack[v]))
    prior = np.nonzero(end[:v] <= start[v] + tol)[0]
    if not len(prior):
        return prior
    # maximal ones: not followed by another predecessor w that started after they ended
    w = prior[np.argmax(start[prior])]
    tol_w = np.maximum(eps, np.minimum(slack[prior], slack[w]))
    return prior[(end[prior] > start[w] + tol_w) | (prior == w)]


#: Look-back of :func:`_deps` (items): a predecessor further back is found only through the
#: long-item check or the exact fallback.
_LOOKBACK = 16


def _deps(start: np.ndarray, end: np.ndarray, group: np.ndarray, eps: int) -> tuple[np.ndarray, np.ndarray]:
    """(src, dst) item indices of the maximal happens-before edges within each rank and step
    (module doc, step 1), for all items at once.

    Items are sorted by (group, start, end); ``group`` numbers the (rank, step) groups. The
    definition (:func:`_deps_of`) looks at every earlier item of the step, O(k^2) in a step of k
    items; this computes the same edges in O(n x L) vectorized work (L = :data:`_LOOKBACK`):
      1. w, the latest predecessor (the first of the items starting when it starts), is found
         among the L items before v; when all of those are still running at v's start (more than
         L concurrent items) the item falls back to the definition.
      2. The other kept predecessors end after w starts. Among the items before w - L only a
         *long* item can (one that ends after the item L places later starts): those are few
         (collectives spanning many kernels) and are paired with the items whose w they span.
    Memory and time grow with the items (times the long items open at once), never with the
    square of a step's items.
    """
    n = len(start)
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    L = _LOOKBACK
    i = np.arange(n)
    first = np.concatenate([[0], np.nonzero(np.diff(group))[0] + 1])
    size = np.diff(np.concatenate([first, [n]]))
    gstart = np.repeat(first, size)
    pos = i - gstart
    gend = gstart + np.repeat(size, size)  # exclusive
    slack = _OVERLAP_SHARE * (end - start)

    def before(u: np.ndarray, v: np.ndarray) -> np.ndarray:  # u ended before v started (tolerance)
        return end[u] <= start[v] + np.maximum(eps, np.minimum(slack[u], slack[v]))

    def kept(u: np.ndarray, w: np.ndarray) -> np.ndarray:  # u still ran when w started
        return end[u] > start[w] + np.maximum(eps, np.minimum(slack[u], slack[w]))

    # 1. the latest predecessor within the look-back: nearest first, each pass over the items
    # still without one (in a sequential lane nearly all find it at d = 1)
    best = np.full(n, -1)
    act = i[pos >= 1]
    for d in range(1, L + 1):
        cancel.checkpoint()
        act = act[pos[act] >= d]
        if not len(act):
            break
        hit = before(act - d, act)
        best[act[hit]] = act[hit] - d
        act = act[~hit]
    found = best >= 0
    fallback = ~found & (pos > L)
    # ... and among the items starting when it starts, the first that is a predecessor
    same = np.concatenate([[False], (start[1:] == start[:-1]) & (group[1:] == group[:-1])])
    tie_first = i[~same][np.cumsum(~same) - 1]  # first item of each run of equal starts
    b = np.where(found, best, 0)
    w = b.copy()
    fallback |= found & (b - tie_first[b] > L)
    tied = i[found & ~fallback & (b > tie_first[b])]
    for t in range(1, L + 1):
        tied = tied[b[tied] - t >= tie_first[b[tied]]]
        if not len(tied):
            break
        u = b[tied] - t
        hit = before(u, tied)
        w[tied[hit]] = u[hit]
    # 2. the kept predecessors: w, the items between w and b (equal starts), the items from w - L
    # to w - 1 that ran past w's start (none unless an earlier item of the step ends after it) ...
    todo = found & ~fallback
    src_parts, dst_parts = [w[todo]], [i[todo]]
    cm_all = pl.DataFrame({"g": group, "e": end}).select(pl.col("e").cum_max().over("g"))["e"].to_numpy()
    ran_past = todo & (w > gstart)
    ran_past &= cm_all[np.where(ran_past, w - 1, 0)] > start[w] + eps  # max end before w
    for rows, lo_off, hi_off in ((i[ran_past], -L, -1), (i[todo & (b > w)], 1, L)):
        for t in range(lo_off, hi_off + 1):
            u = w[rows] + t
            ok = (u >= gstart[rows]) & (u <= b[rows])
            uu = np.where(ok, u, 0)
            ok &= before(uu, rows) & kept(uu, w[rows])
            src_parts.append(uu[ok])
            dst_parts.append(rows[ok])
    # ... and the long items before w - L that still ran when w started
    far = i + L
    long_ = (far < gend) & (end > np.where(far < gend, start[np.minimum(far, n - 1)], 0) + eps)
    if long_.any():
        lg = np.nonzero(long_)[0]
        lim = w - L  # long items u < lim
        # the latest end of the long items up to each position, within its group
        le = np.where(long_, end, np.iinfo(np.int64).min)
        cm = pl.DataFrame({"g": group, "e": le}).select(pl.col("e").cum_max().over("g"))["e"].to_numpy()
        span = todo & (lim > gstart)
        span &= cm[np.where(span, lim - 1, 0)] > start[w] + eps
        if span.any():
            vs = pl.DataFrame({"v": i[span], "g": group[span], "w": w[span], "lim": lim[span]})
            pairs = vs.join(pl.DataFrame({"u": lg, "g": group[lg]}), on="g").filter(
                pl.col("u") < pl.col("lim")
            )
            pu, pv, pw = pairs["u"].to_numpy(), pairs["v"].to_numpy(), pairs["w"].to_numpy()
            ok = before(pu, pv) & kept(pu, pw)
            src_parts.append(pu[ok])
            dst_parts.append(pv[ok])
    for v in np.nonzero(fallback)[0]:
        cancel.checkpoint()
        g0 = gstart[v]
        keep = _deps_of(start[g0 : v + 1], end[g0 : v + 1], slack[g0 : v + 1], eps, int(v - g0)) + g0
        src_parts.append(keep)
        dst_parts.append(np.full(len(keep), v))
    return np.concatenate(src_parts).astype(np.int64), np.concatenate(dst_parts).astype(np.int64)


def _deps_by_chunk(
    start: np.ndarray, end: np.ndarray, group: np.ndarray, eps: int
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_deps` on chunks of whole groups of about :data:`_CHUNK_ROWS` items, its item indices
    offset back: the same edges (a group's edges depend on its items alone; their order may
    differ, which no replay reads: a node takes the max over its predecessors), with temporaries
    of one chunk's size rather than the run's (some twenty arrays of the items)."""
    n = len(start)
    if n <= _CHUNK_ROWS:
        return _deps(start, end, group, eps)
    first = np.concatenate([[0], np.nonzero(np.diff(group))[0] + 1])
    bounds = [0]
    while bounds[-1] < n:
        j = int(np.searchsorted(first, bounds[-1] + _CHUNK_ROWS))
        bounds.append(int(first[j]) if j < len(first) else n)
    src_parts, dst_parts = [], []
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        s, d = _deps(start[a:b], end[a:b], group[a:b], eps)
        src_parts.append(s + a)
        dst_parts.append(d + a)
    return np.concatenate(src_parts), np.concatenate(dst_parts)


def build(
    comp: pl.DataFrame | Callable[[], pl.DataFrame],
    comm: pl.DataFrame,
    eps: int = EPS_NS,
    *,
    clock_sets: dict[int, int] | None = None,
    _drop_early: bool = False,
) -> Timeline:
    """Build the replay graph from compute and comm items (module doc).

    Args:
        comp: :func:`compute_items` (rows without a step are ignored), or a function that gives
            them: called when the build reads them, its frame let go of here once read (held by
            nothing else, it is not under the build's peak: 8 ranks x 1 M events, 236 MiB); called
            again for a second attempt (a cycle, below).
        comm: :func:`comm_items` frame (rows without a step or an end are ignored).
        eps: Tolerance of "ended before started" in ns.
        clock_sets: Each rank's clock set (``traceprof.engine.arrivals.clock_sets``: sets of ranks
            whose clocks could not be aligned to each other; None or one set: the clocks are one).
            With two or more, each set's items of step k are moved by one amount so that the set's
            step k starts where the step's earliest set does: a step's start, its nodes' bases and
            its time (latest end - start) are then each set's own, on its own clock, and the
            step's time is the longest set's (the time between the sets is not measured; no item
            links them: ``comm_items`` leaves such links out). Within a set nothing moves relative
            to anything else of its step.

    A cycle (two ranks hold matched collectives in different orders, and a copy ended before its
    instance's last arrival: a wrong match or clock) is broken by dropping the dependencies on
    copies that ended before their last arrival, once.

    Memory: the items are read into arrays once (the frame let go of), each node column is made,
    put in level order and kept one at a time, and indices are int32 (``_index_dtype``): the
    graph holds 57 bytes a node and 4 an edge.

    Raises:
        AnalysisError: The graph has a cycle (ranks hold matched collectives in different orders).
    """
    make = comp
    c = (
        (comp() if callable(comp) else comp)
        .filter(pl.col("step").is_not_null())
        .select(
            pl.lit(0, pl.Int8).alias("kind"),
            "rank",
            "step",
            pl.col("name").alias("key0"),
            "start_ns",
            "end_ns",
            pl.lit(None, pl.Int64).alias("instance_id"),
        )
    )
    del comp
    m = comm.filter(
        pl.col("step").is_not_null() & pl.col("end_ns").is_not_null() & pl.col("arrival_ns").is_not_null()
    )
    k = m.select(
        pl.lit(1, pl.Int8).alias("kind"),
        "rank",
        "step",
        pl.concat_str(
            [
                pl.col("op"),
                pl.col("pg").fill_null("").str.replace_all(r"\d+", "#"),
                pl.col("bytes").cast(pl.Utf8).fill_null("?"),
            ],
            separator="|",
        ).alias("key0"),
        pl.col("arrival_ns").alias("start_ns"),
        "end_ns",
        "instance_id",
    )
    del m
    # key0 as an integer (its position among the distinct key0s, sorted): sorting, pooling and
    # blaming compare integers, not millions of strings; coded before the two are put together
    # (not a third copy of the items' strings)
    uniq = (  # kept: the Timeline's key names
        pl.concat([c["key0"].drop_nulls().unique(), k["key0"].drop_nulls().unique()]).unique().sort()
    )
    both = pl.concat([c.with_columns(_code("key0", uniq)), k.with_columns(_code("key0", uniq))])
    del c, k  # copied into both: the run's items are held once (here and below, each temporary is
    # let go of once used, so the build's peak holds one copy of the items, not several)
    # a total order: items with the same bounds keep one order whatever the input order (their
    # pooling ordinals, and so the blame, depend on it)
    items = both.sort("rank", "step", "start_ns", "end_ns", "kind", "key0", "instance_id", nulls_last=True)
    del both
    # times relative to the run's first item: epoch ns do not fit a float64 exactly
    t0 = int(items["start_ns"].min() or 0)  # type: ignore[arg-type]
    items = items.with_columns(pl.col("start_ns") - t0, pl.col("end_ns") - t0)
    if clock_sets is not None and len(set(clock_sets.values())) > 1:
        items = _one_start_per_step(items, clock_sets)
    step_start = items.group_by("step").agg(pl.col("start_ns").min().alias("step_start_ns"))
    # pooling key: key0 and its ordinal among the items of the rank's step with that key0
    key_items = items.select(
        pl.col("key0") * KEY_SPAN + pl.int_range(pl.len()).over("rank", "step", "key0")
    ).to_series()
    group = np.cumsum(
        items.select((pl.col("rank").diff() != 0) | (pl.col("step").diff() != 0))["rank"]
        .fill_null(True)
        .to_numpy()
    )  # (rank, step) groups, contiguous in the sort
    start = items["start_ns"].to_numpy()
    end = items["end_ns"].to_numpy()
    src, dst = _deps_by_chunk(start, end, group, eps)
    del group
    n_items = items.height
    kind = items["kind"].to_numpy()
    rank = items["rank"].to_numpy()
    steps = items["step"].to_numpy()
    inst = items["instance_id"].fill_null(-1).to_numpy()
    del items
    is_comm = kind == 1
    comm_idx = np.nonzero(is_comm)[0]
    inst_ids, inst_of = np.unique(inst[comm_idx], return_inverse=True)
    n_inst, n_comm = len(inst_ids), len(comm_idx)
    # each copy's instance's last arrival (the latest start of its copies: every filtered comm row
    # is an item), as a float as the durations take it
    last_i = np.full(n_inst, np.iinfo(np.int64).min)
    np.maximum.at(last_i, inst_of, start[comm_idx])
    last = last_i[inst_of].astype(np.float64)
    del last_i
    if _drop_early:
        # A copy that ended before its instance's last arrival (a wrong match or clock) made the
        # graph cyclic: dependencies on such copies are dropped (second attempt only).
        early = np.zeros(n_items, bool)
        early[comm_idx] = end[comm_idx] < last
        keep = ~early[src] if len(src) else np.zeros(0, bool)
        src, dst = src[keep], dst[keep]
        del early, keep
    # ready = latest end of the dependencies (recorded), or the step start
    ss_step = step_start["step"].to_numpy()
    o = np.argsort(ss_step)
    ss = step_start["step_start_ns"].to_numpy()[o][np.searchsorted(ss_step[o], steps)]
    del o, ss_step
    ready = ss.astype(np.float64)
    if len(src):
        np.maximum.at(ready, dst, end[src].astype(np.float64))
    gap = np.maximum(start - ready, 0.0)
    del ready
    dur = (end - start).astype(np.float64)
    dur[comm_idx] = np.maximum(end[comm_idx] - last, 0.0)  # comm: transfer
    del last
    # node numbering: items 0..n-1 (compute or arrival), instances n..n+I-1, comm ends after
    n_nodes = n_items + n_inst + n_comm
    ix = _index_dtype(n_nodes, len(src) + 2 * n_comm)
    end_node = (n_items + n_inst + np.arange(n_comm)).astype(ix)
    out_node = np.arange(n_items, dtype=ix)  # what dependents wait for
    out_node[comm_idx] = end_node
    inst_node = (n_items + inst_of).astype(ix)
    e_src = np.concatenate([out_node[src], comm_idx.astype(ix), inst_node])
    e_dst = np.concatenate([dst.astype(ix), inst_node, end_node])
    del src, dst, out_node, end_node, inst_node
    leveled = _levels(e_src, e_dst, n_nodes)
    if isinstance(leveled, int) and not _drop_early:
        return build(make, comm, eps, clock_sets=clock_sets, _drop_early=True)
    if isinstance(leveled, int):
        raise AnalysisError(
            f"the replay graph has a cycle ({leveled} of {n_nodes} nodes): two ranks hold "
            "collectives of one group in different orders, so the matching (or the clock alignment) "
            "is inconsistent there; check collective_instances"
        )
    perm, levels = leveled
    inv = np.empty(n_nodes, ix)
    inv[perm] = np.arange(n_nodes, dtype=ix)
    e_src, e_dst = inv[e_src], inv[e_dst]
    has_pred = np.zeros(n_nodes, bool)
    has_pred[e_dst] = True
    del inv
    o = np.argsort(e_dst, kind="stable")
    pred = e_src[o]
    del e_src, o
    pred_ptr = np.zeros(n_nodes + 1, ix)
    np.cumsum(np.bincount(e_dst, minlength=n_nodes), out=pred_ptr[1:])
    del e_dst

    def tail(
        items_part: np.ndarray, inst_part: np.ndarray | float, comm_part: np.ndarray | float
    ) -> np.ndarray:
        """A node column (items, instances, comm ends) in level order."""
        col = np.concatenate(
            [
                items_part,
                np.broadcast_to(inst_part, (n_inst,)).astype(items_part.dtype),
                np.broadcast_to(comm_part, (n_comm,)).astype(items_part.dtype),
            ]
        )
        return col[perm]

    zero = 0.0
    cols: dict[str, np.ndarray | pl.Series] = {}
    cols["kind"] = tail(kind, 2, 3)
    cols["rank"] = tail(rank, -1, rank[comm_idx])
    cols["step"] = tail(steps, _inst_steps(inst_of, steps[comm_idx], n_inst), steps[comm_idx])
    del rank
    cols["key"] = pl.concat(
        [key_items, pl.Series([None] * n_inst, dtype=pl.Int64), key_items.gather(comm_idx)]
    ).gather(perm)
    del key_items
    cols["instance"] = tail(inst, inst_ids, inst[comm_idx])
    del inst
    cols["gap"] = tail(gap, zero, zero)
    del gap
    cols["dur"] = tail(np.where(is_comm, 0.0, dur), zero, dur[comm_idx])
    del dur
    cols["end"] = tail(
        np.where(is_comm, start, end).astype(np.float64), np.nan, end[comm_idx].astype(np.float64)
    )
    del start, end, kind, is_comm
    base = tail(ss.astype(np.float64), zero, zero)
    base[has_pred] = -np.inf
    cols["base"] = base
    del ss, base, has_pred
    nodes = pl.DataFrame(cols)
    del cols
    return Timeline(nodes, pred_ptr, pred, levels, step_start, uniq.str.split("|").list.first())


def _one_start_per_step(items: pl.DataFrame, clock_sets: dict[int, int]) -> pl.DataFrame:
    """``items`` (rank, step, start_ns, end_ns; ns) with each clock set's items of a step moved by
    (its start of the step - the step's earliest set start), so every set starts the step at one
    time (:func:`build`'s ``clock_sets``); the row order is kept."""
    clock = pl.col("rank").replace_strict(clock_sets, default=pl.col("rank"), return_dtype=pl.Int64)
    shift = pl.col("start_ns").min().over("step", "_set") - pl.col("start_ns").min().over("step")
    return (
        items.with_columns(clock.alias("_set"))
        .with_columns(shift.alias("_shift"))
        .with_columns(pl.col("start_ns") - pl.col("_shift"), pl.col("end_ns") - pl.col("_shift"))
        .drop("_set", "_shift")
    )


def _index_dtype(n_nodes: int, n_edges: int) -> type[np.signedinteger]:
    """int32 for node indices and edge offsets when they fit, else int64."""
    return np.int32 if max(n_nodes, n_edges) < np.iinfo(np.int32).max else np.int64


def _inst_steps(inst_of: np.ndarray, comm_steps: np.ndarray, n_inst: int) -> np.ndarray:
    """Each instance's step: that of its copies (the last copy's where they differ)."""
    out = np.zeros(n_inst, comm_steps.dtype)
    out[inst_of] = comm_steps
    return out


def _levels(
    e_src: np.ndarray, e_dst: np.ndarray, n_nodes: int
) -> tuple[np.ndarray, list[tuple[int, int]]] | int:
    """Topological levels of the graph (Kahn, vectorized by level): (the nodes in level order,
    stable; the (start, end) index range of each level), or on a cycle the number of nodes left."""
    ix = e_src.dtype
    indeg = np.bincount(e_dst, minlength=n_nodes).astype(ix)
    order_e = np.argsort(e_src, kind="stable")
    succ = e_dst[order_e]
    del order_e
    succ_ptr = np.zeros(n_nodes + 1, np.int64)
    np.cumsum(np.bincount(e_src, minlength=n_nodes), out=succ_ptr[1:])
    level = np.zeros(n_nodes, np.int32)
    frontier = np.nonzero(indeg == 0)[0]
    seen = 0
    lvl = 0
    while len(frontier):
        cancel.checkpoint()  # seconds of levels on a large run: Ctrl-C stops them (traceprof.core.cancel)
        level[frontier] = lvl
        seen += len(frontier)
        # the successors of every frontier node, gathered without a Python loop
        lo, cnt = succ_ptr[frontier], succ_ptr[frontier + 1] - succ_ptr[frontier]
        tot = int(cnt.sum())
        nxt = succ[np.repeat(lo - np.concatenate([[0], np.cumsum(cnt)[:-1]]), cnt) + np.arange(tot)]
        if len(nxt):
            nxt, counts = np.unique(nxt, return_counts=True)  # one sort; faster than np.subtract.at
            indeg[nxt] -= counts.astype(ix)
            frontier = nxt[indeg[nxt] == 0]
        else:
            frontier = nxt
        lvl += 1
    del succ, succ_ptr, indeg
    if seen != n_nodes:
        return n_nodes - seen
    perm = stable_order(level).astype(e_src.dtype)
    lv = level[perm]
    del level
    bounds = np.nonzero(np.diff(lv))[0] + 1
    starts = np.concatenate([[0], bounds])
    ends = np.concatenate([bounds, [n_nodes]])
    return perm, list(zip(starts.tolist(), ends.tolist(), strict=True))


def replay(tl: Timeline, gap: np.ndarray, dur: np.ndarray) -> np.ndarray:
    """End time of every node (ns, float) when nodes take ``gap + dur`` after their predecessors
    (module doc, step 3). ``gap`` and ``dur`` are per node, in ``tl.nodes`` order."""
    return replay_weights(tl, gap + dur)


def replay_weights(tl: Timeline, w: np.ndarray) -> np.ndarray:
    """:func:`replay` with each node's weight ``gap + dur`` (ns) given as one array (not copied)."""
    base = tl.nodes["base"].to_numpy()
    val = np.empty(len(w))
    pred = tl.pred
    for lv in tl.plan():
        cancel.checkpoint()
        _level_ends(base, pred, val, w, lv, val[lv.a : lv.b])
    return val


def _level_ends(
    base: np.ndarray,
    pred: np.ndarray,
    val: np.ndarray,
    w: np.ndarray,
    lv: _Level,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """The ends (ns, float) of the level ``lv`` (:meth:`Timeline.plan`) from their predecessors' ends
    in ``val``: the max of those and each node's base, plus its weight ``w`` (:func:`replay_weights`'
    step, shared with :func:`replay_changes`' dense levels); written to ``out`` when given."""
    a, b = lv.a, lv.b
    if lv.hi == lv.lo:  # no node of the level has a predecessor
        return np.add(base[a:b], w[a:b], out=out)
    mx = np.maximum.reduceat(val[pred[lv.lo : lv.hi]], lv.starts)
    if lv.some is None:  # every node has one
        ready = np.maximum(base[a:b], mx)
    else:
        ready = base[a:b].copy()
        ready[lv.some] = np.maximum(ready[lv.some], mx)
    return np.add(ready, w[a:b], out=out)


def _gather(ptr: np.ndarray, idx: np.ndarray, at: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For CSR rows ``at``: (their entries of ``idx``, concatenated; the offset of each row's first
    one among them). Rows may be empty."""
    lo, cnt = ptr[at], ptr[at + 1] - ptr[at]
    off = np.concatenate([[0], np.cumsum(cnt)[:-1]]) if len(at) else np.zeros(0, np.int64)
    tot = int(cnt.sum())
    return idx[np.repeat(lo - off, cnt) + np.arange(tot)], off


#: :func:`replay_changes` recomputes a whole level (no gathers) when at least 1 / this of its
#: nodes wait: the same ends, in fewer steps.
_DENSE_SHARE = 3


def replay_changes(
    tl: Timeline, w: np.ndarray, val: np.ndarray, at: np.ndarray, w_at: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The nodes whose end changes from ``val`` when the nodes ``at`` take the weights ``w_at``, and
    their new ends (ns, float): :func:`replay_changes_within` with no limit."""
    out = replay_changes_within(tl, w, val, at, w_at, None)
    assert out is not None  # no limit: never stopped
    return out


def replay_changes_within(
    tl: Timeline, w: np.ndarray, val: np.ndarray, at: np.ndarray, w_at: np.ndarray, limit: int | None
) -> tuple[np.ndarray, np.ndarray] | None:
    """The nodes whose end changes from ``val`` (:func:`replay` with weights ``gap + dur`` = ``w``)
    when the nodes ``at`` take the weights ``w_at`` instead, and their new ends (ns, float).

    Only the forward cone of ``at`` is recomputed, level by level, and it stops at the nodes whose
    end comes out unchanged: each node's end is computed with the same operations as
    :func:`replay` (the max of its predecessors' ends and its base, plus its weight), so the ends
    are those of a full replay with the changed weights, bit for bit, in time and memory that grow
    with the nodes that change (and their predecessors), not with the graph.

    Args:
        tl: The graph.
        w: Weight (gap + dur, ns) of every node, in ``tl.nodes`` order; restored on return.
        val: :func:`replay`'s ends with ``w``; restored on return.
        at: Distinct node indices whose weight changes.
        w_at: Their new weights (ns), one per entry of ``at``.
        limit: Stop once more than this many nodes have changed (None: never): a cone of most of
            the graph costs more than a full replay (8 x 1 M events: 0.39 s for a cone of 92% of
            the nodes against 0.03 s), which the caller then does instead.

    Returns:
        (node indices, ascending by level; their ends), only the nodes whose end differs; None when
        stopped at ``limit`` (``w`` and ``val`` restored all the same).
    """
    base = tl.nodes["base"].to_numpy()
    ptr, pred = tl.pred_ptr, tl.pred
    sptr, succ, level = tl.successors()
    old_w = w[at].copy()
    done_i: list[np.ndarray] = []
    done_v: list[np.ndarray] = []
    old_v: list[np.ndarray] = []
    # the nodes waiting to be recomputed, marked in place, and the levels holding any (a heap):
    # a level's nodes are one index range (tl.levels), so each level's pending nodes come out
    # sorted and distinct by scanning that range alone, never the whole pending set per level
    pending = np.zeros(len(w), bool)
    waiting = np.zeros(len(tl.levels), bool)
    heap: list[int] = []
    n_changed, stopped = 0, False

    slot = np.zeros(len(tl.levels), np.int64)

    def wait(nodes: np.ndarray) -> None:
        pending[nodes] = True
        lv = level[nodes]
        lv = lv[~waiting[lv]]  # the levels not yet in the heap (most successors' are)
        if len(lv):
            # each level once, without a sort: the last entry written to its slot keeps it
            pos = np.arange(len(lv))
            slot[lv] = pos
            lv = lv[slot[lv] == pos]
            waiting[lv] = True
            for x in lv.tolist():
                heapq.heappush(heap, x)

    try:
        w[at] = w_at
        if len(at):
            wait(at)
        while heap:
            lo_l = heapq.heappop(heap)
            waiting[lo_l] = False
            a, b = tl.levels[lo_l]
            cur = np.flatnonzero(pending[a:b])
            pending[a:b] = False
            if len(cur) * _DENSE_SHARE >= b - a:
                # most of the level waits: the whole level as replay_weights takes it (the same
                # operations on the same values per node), then its waiting nodes
                new = _level_ends(base, pred, val, w, tl.plan()[lo_l])[cur]
                cur += a
            else:
                cur += a
                ready = base[cur].copy()
                pv, off = _gather(ptr, pred, cur)
                nonempty = ptr[cur + 1] > ptr[cur]
                if nonempty.any():
                    mx = np.maximum.reduceat(val[pv], off[nonempty])
                    ready[nonempty] = np.maximum(ready[nonempty], mx)
                new = ready + w[cur]
            changed = new != val[cur]
            c = cur[changed]
            if len(c):
                done_i.append(c)
                done_v.append(new[changed])
                old_v.append(val[c])
                val[c] = new[changed]
                n_changed += len(c)
                if limit is not None and n_changed > limit:
                    stopped = True
                    break
                nxt = _gather(sptr, succ, c)[0]
                if len(nxt):
                    wait(nxt)
    finally:
        w[at] = old_w
        for c, v in zip(reversed(done_i), reversed(old_v), strict=True):
            val[c] = v
    if stopped:
        return None
    if not done_i:
        return np.zeros(0, np.int64), np.zeros(0)
    return np.concatenate(done_i), np.concatenate(done_v)
