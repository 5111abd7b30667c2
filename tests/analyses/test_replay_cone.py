"""The blame's cone replays (issue 34: CPU) against the per-level loops they replaced, kept here.

``_replay.replay_changes`` keeps the nodes waiting to be recomputed as marks and a heap of their
levels (a level's nodes are one index range), where it took the union of every waiting node at
each level; ``_whatif_fix.PutBack.step_t`` writes the changed ends in place and takes each recomputed
step's latest end from its slice (then puts them back), where it compared every changed node with
each such step and copied the step's ends out. Both must give the same
nodes, in the same order, and the same floats bit for bit, on random graphs (ties, nodes with no
predecessor, a step all of whose latest nodes change) and on generated and sample runs.

Each way the two can take a level or a step is checked (the ``paths`` fixture): a level most of whose
nodes wait is recomputed whole (``_replay._DENSE_SHARE``), and a cone of most of the graph takes every
step's latest end again over all its nodes (``_whatif_fix.PutBack.CONE_SHARE``).
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from tests.analyses.test_whatif import _gen_job
from tests.conftest import SAMPLES
from traceprof.analyses import _replay, _whatif_blame, _whatif_fix
from traceprof.ingest.ingest import ingest


def _reference_replay_changes(
    tl: _replay.Timeline, w: np.ndarray, val: np.ndarray, at: np.ndarray, w_at: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``replay_changes`` as it was: every waiting node in one sorted array, the lowest level's
    taken at each turn and the changed nodes' successors merged in with ``np.union1d``."""
    base = tl.nodes["base"].to_numpy()
    ptr, pred = tl.pred_ptr, tl.pred
    sptr, succ, level = tl.successors()
    old_w = w[at].copy()
    done_i: list[np.ndarray] = []
    done_v: list[np.ndarray] = []
    old_v: list[np.ndarray] = []
    pending = np.unique(at)
    try:
        w[at] = w_at
        while len(pending):
            lv = level[pending]
            first = lv == lv.min()
            cur, pending = pending[first], pending[~first]
            ready = base[cur].copy()
            pv, off = _replay._gather(ptr, pred, cur)
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
                pending = np.union1d(pending, _replay._gather(sptr, succ, c)[0])
    finally:
        w[at] = old_w
        for c, v in zip(reversed(done_i), reversed(old_v), strict=True):
            val[c] = v
    if not done_i:
        return np.zeros(0, np.int64), np.zeros(0)
    return np.concatenate(done_i), np.concatenate(done_v)


def _reference_step_t(pb: _whatif_fix.PutBack, at: np.ndarray, w_at: np.ndarray) -> np.ndarray:
    """``PutBack.step_t`` as it was (cone branch): a mask over every changed node per step, and
    each recomputed step's ends copied out with its changed ones set by their place in the step."""
    idx, new = _reference_replay_changes(pb.tl, pb.w, pb.val, at, w_at)
    t = pb.t.copy()
    s = pb.step_of[idx]
    keep = s >= 0
    idx, new, s = idx[keep], new[keep], s[keep]
    if not len(idx):
        return t
    steps = np.unique(s)
    new_max = np.full(len(pb.top), -np.inf)
    np.maximum.at(new_max, s, new)
    lost = np.bincount(s, weights=pb.val[idx] == pb.top[s], minlength=len(pb.top))
    m = np.maximum(pb.top[steps], new_max[steps])
    pos = np.zeros(len(pb.val), pb.order.dtype)  # each node's place in by_step's order
    pos[pb.order] = np.arange(len(pb.order), dtype=pb.order.dtype)
    for j in np.nonzero((lost[steps] >= pb.n_top[steps]) | np.isnan(pb.top[steps]))[0]:
        k = steps[j]
        a, b = pb.seg[k], pb.seg[k + 1] if k + 1 < len(pb.seg) else len(pb.order)
        v = pb.val[pb.order[a:b]]
        mine = s == k
        v[pos[idx[mine]] - a] = new[mine]
        m[j] = v.max()
    t[steps] = m - pb.step_start[steps]
    return t


def _random_timeline(rng: np.random.Generator, n_levels: int, width: int, n_steps: int) -> _replay.Timeline:
    """A random DAG in level order: each node of a level after the first has 0-3 predecessors on
    earlier levels (one on the level just before, so its level is its longest path); a node with
    none starts at a random base. Kinds and steps at random (kind 2 has no step in by_step)."""
    sizes = rng.integers(1, width + 1, n_levels)
    starts = np.concatenate([[0], np.cumsum(sizes)])
    n = int(starts[-1])
    preds: list[list[int]] = []
    for lv in range(n_levels):
        for _ in range(sizes[lv]):
            if lv == 0 or rng.random() < 0.1:
                preds.append([])
                continue
            p = {int(rng.integers(starts[lv - 1], starts[lv]))}  # one on the level before
            for _ in range(int(rng.integers(0, 3))):
                p.add(int(rng.integers(0, starts[lv])))
            preds.append(sorted(p))
    pred_ptr = np.zeros(n + 1, np.int32)
    pred_ptr[1:] = np.cumsum([len(p) for p in preds])
    pred = np.array([u for p in preds for u in p], np.int32)
    levels = [(int(a), int(b)) for a, b in zip(starts[:-1], starts[1:], strict=True)]
    # pieces of every level are no-predecessor nodes only when their list is empty: levels above 0
    # with an empty list are still valid (the replay needs edges to go to earlier levels only)
    base = np.where(pred_ptr[1:] > pred_ptr[:-1], -np.inf, rng.integers(0, 5, n).astype(np.float64))
    step = rng.integers(0, n_steps, n).astype(np.int32)
    nodes = pl.DataFrame(
        {
            "kind": rng.choice(np.array([0, 1, 2, 3], np.int8), n, p=[0.6, 0.15, 0.1, 0.15]),
            "step": step,
            "base": base,
        }
    )
    step_start = pl.DataFrame(
        {"step": np.arange(n_steps, dtype=np.int32), "step_start_ns": np.arange(n_steps) * 3}
    )
    return _replay.Timeline(nodes, pred_ptr, pred, levels, step_start)


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


#: (``_replay._DENSE_SHARE``, ``_whatif_fix.PutBack.CONE_SHARE``): as shipped; never a whole level and
#: always the steps the cone reached (the incremental step maxima, redone steps included); every
#: level whole and every step's maximum taken again.
_PATHS = {
    "shipped": (_replay._DENSE_SHARE, _whatif_fix.PutBack.CONE_SHARE),
    "sparse": (0, 2.0),
    "dense": (10**9, 0.0),
}


@pytest.fixture(params=list(_PATHS))
def paths(request, monkeypatch) -> str:
    """Each way the cone replay and the step maxima can be taken: all must give the reference's bits."""
    dense, cone = _PATHS[request.param]
    monkeypatch.setattr(_replay, "_DENSE_SHARE", dense)
    monkeypatch.setattr(_whatif_fix.PutBack, "CONE_SHARE", cone)
    return str(request.param)


@pytest.mark.parametrize("seed", range(12))
def test_cone_replay_equals_the_reference_on_random_graphs(seed: int, paths: str) -> None:
    """Random graphs of 1-400 levels; integer weights (many ties: ends that come out unchanged stop
    the cone), a NaN weight now and then; changed sets empty, single, random, whole levels, all."""
    rng = np.random.default_rng(seed)
    tl = _random_timeline(rng, int(rng.integers(1, 400)), int(rng.integers(1, 30)), int(rng.integers(1, 6)))
    n = tl.nodes.height
    w = rng.integers(0, 4, n).astype(np.float64)
    val = _replay.replay_weights(tl, w.copy())
    w0, val0 = w.copy(), val.copy()
    pb = _whatif_fix.PutBack(tl, w, val)
    a, b = tl.levels[len(tl.levels) // 2]
    cases = [np.zeros(0, np.int64), np.array([0]), np.array([n - 1]), np.arange(a, b), np.arange(n)]
    cases += [np.sort(rng.choice(n, k, replace=False)) for k in {1, min(5, n), min(n, n // 3 + 1)}]
    for at in cases:
        for w_at in (
            rng.integers(0, 6, len(at)).astype(np.float64),
            w[at] + 100.0,  # every changed node's end moves: long cones
            np.where(rng.random(len(at)) < 0.05, np.nan, w[at] * 0.5),
        ):
            with np.errstate(invalid="ignore"):  # NaN weights: NaN ends, as in the reference
                want_i, want_v = _reference_replay_changes(tl, w, val, at, w_at)
                got_i, got_v = _replay.replay_changes(tl, w, val, at, w_at)
                assert np.array_equal(got_i, want_i) and _same_bits(got_v, want_v)
                assert _same_bits(pb.step_t(at, w_at), _reference_step_t(pb, at, w_at))
            # the whole: a full replay with the changed weights gives the same ends
            w2 = w.copy()
            w2[at] = w_at
            full = _replay.replay_weights(tl, w2)
            got = val.copy()
            got[got_i] = got_v
            assert _same_bits(got, full)
            assert _same_bits(w, w0) and _same_bits(val, val0)  # put back


@pytest.mark.parametrize(
    "job",
    [
        {"ranks": 8, "group": 4, "steps": 3, "events": 300},
        {"ranks": 6, "group": 3, "steps": 2, "drop": 4},
        "straggler_rank2",
    ],
    ids=["8-ranks-subgroups-of-4", "5-of-6-ranks-traced", "sample-straggler-rank2"],
)
def test_cone_replay_equals_the_reference_on_runs(store, tmp_path, job, paths) -> None:
    """Each rank's put-back set (its charged nodes, recorded durations over the ideal's pooled
    mean) and random sets on generated jobs and a sample run: same cone, same step times."""
    if isinstance(job, dict):
        ingest(store, [_gen_job(tmp_path / "job", **job)], run="job")
        run_id = store.resolve_run("job")
    else:
        if not (SAMPLES / job / "rank0.trace.json.gz").exists():
            pytest.skip(f"{job} not recorded")
        ingest(store, [SAMPLES / job])
        run_id = store.resolve_run(job)
    comm, _ = _replay.comm_items(store, run_id, None)
    tl = _replay.build(_replay.compute_items(store, run_id), comm)
    n = tl.nodes.height
    gap, dur = tl.nodes["gap"].to_numpy(), tl.nodes["dur"].to_numpy()
    w = np.full(n, dur.mean()) + 0.5
    val = _replay.replay_weights(tl, w.copy())
    pb = _whatif_fix.PutBack(tl, w, val)
    charged = _whatif_blame.charged(tl.nodes)
    ranks = tl.nodes["rank"].to_numpy()
    rng = np.random.default_rng(3)
    sets = [np.nonzero(charged & (ranks == r))[0] for r in np.unique(ranks[ranks >= 0])]
    sets += [np.sort(rng.choice(n, k, replace=False)) for k in (1, 10, 200)]
    for at in sets:
        w_at = (gap + dur)[at]
        want_i, want_v = _reference_replay_changes(tl, w, val, at, w_at)
        got_i, got_v = _replay.replay_changes(tl, w, val, at, w_at)
        assert np.array_equal(got_i, want_i) and _same_bits(got_v, want_v)
        assert _same_bits(pb.step_t(at, w_at), _reference_step_t(pb, at, w_at))
    assert any(len(s) for s in sets)


@pytest.mark.parametrize("seed", range(8))
def test_step_maxima_over_the_step_ends_equal_those_over_every_node(seed: int) -> None:
    """``Timeline.step_ends`` (the nodes with no successor in their step, instance nodes aside):
    with weights at least 0 each step's latest end over them is the latest over all its nodes, bit
    for bit, in a replay and in every put-back; a weight below 0 takes every node again."""
    rng = np.random.default_rng(100 + seed)
    tl = _random_timeline(rng, int(rng.integers(1, 300)), int(rng.integers(1, 30)), int(rng.integers(1, 6)))
    n = tl.nodes.height
    order, seg = tl.step_ends()
    all_order, all_seg = tl.by_step()[:2]
    assert len(seg) == len(all_seg) and len(order) <= len(all_order)
    assert set(order.tolist()) <= set(all_order.tolist())
    w = rng.integers(0, 4, n).astype(np.float64)
    val = _replay.replay_weights(tl, w.copy())
    assert _same_bits(_whatif_fix.step_t(tl, val, w), _whatif_fix.step_t(tl, val))
    pb, every = _whatif_fix.PutBack(tl, w, val), _whatif_fix.PutBack(tl, w, val, ends=False)
    assert pb.ends and not every.ends
    a, b = tl.levels[len(tl.levels) // 2]
    cases = [
        np.array([0]),
        np.arange(a, b),
        np.arange(n),
        np.sort(rng.choice(n, min(n, n // 3 + 1), replace=False)),
    ]
    for at in cases:
        for w_at in (
            rng.integers(0, 6, len(at)).astype(np.float64),
            w[at] + 100.0,
            np.where(rng.random(len(at)) < 0.05, np.nan, w[at] * 0.5),  # NaN: every node
            w[at] - 3.0,  # below 0: every node
        ):
            with np.errstate(invalid="ignore"):
                assert _same_bits(pb.step_t(at, w_at), every.step_t(at, w_at))
            w2 = w.copy()
            w2[at] = w_at
            with np.errstate(invalid="ignore"):
                full = _replay.replay_weights(tl, w2)
                assert _same_bits(_whatif_fix.step_t(tl, full, w2), _whatif_fix.step_t(tl, full))


def test_step_ends_of_a_run_are_its_ranks_last_items(store, tmp_path) -> None:
    """On a generated job each step's ends are a few nodes (each rank's last items, its arrivals
    and collective ends), not all its nodes; the replays' step times over them are those over all."""
    ingest(store, [_gen_job(tmp_path / "job", ranks=4, group=2, steps=3, events=300)], run="job")
    run_id = store.resolve_run("job")
    comm, _ = _replay.comm_items(store, run_id, None)
    tl = _replay.build(_replay.compute_items(store, run_id), comm)
    order, seg = tl.step_ends()
    all_order = tl.by_step()[0]
    assert 0 < len(order) < len(all_order) / 4
    kind = tl.nodes["kind"].to_numpy()
    assert not (kind[order] == 2).any()
    w = tl.nodes["gap"].to_numpy() + tl.nodes["dur"].to_numpy()
    val = _replay.replay_weights(tl, w)
    assert _same_bits(_whatif_fix.step_t(tl, val, w), _whatif_fix.step_t(tl, val))


def _chain() -> _replay.Timeline:
    """Three compute nodes of one step in a chain (0 -> 1 -> 2), one a level; node 0 starts at 0."""
    nodes = pl.DataFrame(
        {
            "kind": np.zeros(3, np.int8),
            "step": np.zeros(3, np.int32),
            "base": np.array([0.0, -np.inf, -np.inf]),
        }
    )
    step_start = pl.DataFrame({"step": np.zeros(1, np.int32), "step_start_ns": np.zeros(1)})
    return _replay.Timeline(
        nodes,
        np.array([0, 0, 1, 2], np.int32),
        np.array([0, 1], np.int32),
        [(0, 1), (1, 2), (2, 3)],
        step_start,
    )


def test_cone_stopped_past_its_limit_gives_none_and_puts_back() -> None:
    """``replay_changes_within`` stops once more nodes have changed than its limit (issue 34: a cone
    of most of the graph costs more than a full replay). By hand: weights 1, 1, 1 end at 1, 2, 3;
    node 0 at 2 moves every end by 1: 2, 3, 4, three nodes changed. A limit of 2 stops (None, the
    weights and ends as they were); 3 or none gives the three."""
    tl = _chain()
    w = np.ones(3)
    val = _replay.replay_weights(tl, w)
    assert val.tolist() == [1.0, 2.0, 3.0]
    at, w_at = np.array([0]), np.array([2.0])
    assert _replay.replay_changes_within(tl, w, val, at, w_at, 2) is None
    assert w.tolist() == [1.0, 1.0, 1.0] and val.tolist() == [1.0, 2.0, 3.0]  # put back
    for limit in (3, None):
        got = _replay.replay_changes_within(tl, w, val, at, w_at, limit)
        assert got is not None
        assert got[0].tolist() == [0, 1, 2] and got[1].tolist() == [2.0, 3.0, 4.0]
    assert w.tolist() == [1.0, 1.0, 1.0] and val.tolist() == [1.0, 2.0, 3.0]


def test_put_back_replays_in_full_after_a_stopped_cone(monkeypatch) -> None:
    """A cone past ``PutBack.FULL_AFTER_SHARE`` of the nodes is stopped and the step replayed in full,
    as every later call is (the same floats). By hand on the chain (step start 0): node 0 at weight
    2 makes the step 4 ns (1 + 1 + 2); then node 2 at weight 5 alone: 1 + 1 + 5 = 7 ns."""
    tl = _chain()
    w = np.ones(3)
    pb = _whatif_fix.PutBack(tl, w, _replay.replay_weights(tl, w))
    monkeypatch.setattr(_whatif_fix.PutBack, "FULL_SHARE", 2.0)  # a cone first, however many change
    monkeypatch.setattr(_whatif_fix.PutBack, "FULL_AFTER_SHARE", 0.5)  # limit 1 of the 3 nodes
    calls: list[object] = []
    real = _replay.replay_changes_within

    def counted(*a: object) -> object:
        calls.append(out := real(*a))  # type: ignore[arg-type]
        return out

    monkeypatch.setattr(_replay, "replay_changes_within", counted)
    assert pb.step_t(np.array([0]), np.array([2.0])).tolist() == [4.0]
    assert calls == [None] and pb.full  # stopped: in full, and from now on
    assert pb.step_t(np.array([2]), np.array([5.0])).tolist() == [7.0]
    assert len(calls) == 1  # no cone tried again
    assert w.tolist() == [1.0, 1.0, 1.0]


def test_stable_order_is_numpys_stable_argsort() -> None:
    """``_replay.stable_order`` gives ``np.argsort(kind="stable")``'s order (ties in input order) by a
    radix sort of keys spanning under 2^16 values: by hand, [3, 1, 3, 1, 2] -> [1, 3, 4, 0, 2];
    int8 keys from -128 to 127 (a span that overflows int8), negative ranks, one key, none, and
    keys too wide for uint16 (numpy's own sort) all match numpy's."""
    assert _replay.stable_order(np.array([3, 1, 3, 1, 2], np.int32)).tolist() == [1, 3, 4, 0, 2]
    rng = np.random.default_rng(3)
    cases = [
        np.array([127, -128, 0, 127, -128], np.int8),
        rng.integers(-1, 8, 5_000).astype(np.int32),
        rng.integers(0, 352, 20_000).astype(np.int32),
        rng.integers(0, 1 << 16, 5_000).astype(np.int64),  # span 2^16 - 1: the last that fits
        rng.integers(-(2**40), 2**40, 5_000),
        np.full(7, 5, np.int16),
        np.zeros(0, np.int32),
    ]
    for keys in cases:
        assert np.array_equal(_replay.stable_order(keys), np.argsort(keys, kind="stable"))
