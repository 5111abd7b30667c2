"""The replays (``_replay.replay_weights``, ``replay_changes``) against a node-by-node replay, on
graphs made of chains (issue 34: a guard for a replay that contracts them).

Most nodes of a run's graph are *links* (one predecessor, its only successor, base -inf): a link
ends at its predecessor's end plus its weight, so a chain's ends are a running sum from its head.
A replay that contracts chains gives a node-by-node replay's floats bit for bit only when each sum
is taken left to right, one addition per node, and when nothing that is not a link (a second
predecessor, a base, a sibling successor) is folded into a chain. The random
graphs here are rich in chains and in what breaks a wrong contraction: nodes with one predecessor
and a base of their own, predecessors with several successors, joins and forks, and weights whose
sums depend on their order (0.1s next to 1e16s), zero, negative, -0.0 and now and then NaN.

The reference is the definition, node by node in topological order (module doc, step 3): the max
of the predecessors' ends (in ``pred``'s order) and the base, plus the weight; for the cone
replays also the level-by-level cone replay they replaced (``test_replay_cone``).
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from tests.analyses.test_replay_cone import _reference_replay_changes
from traceprof.analyses import _replay


def _reference(tl: _replay.Timeline, w: np.ndarray) -> np.ndarray:
    """Each node's end, one node at a time in index (topological) order."""
    base = tl.nodes["base"].to_numpy()
    val = np.empty(len(w))
    for v in range(len(w)):
        p = tl.pred[tl.pred_ptr[v] : tl.pred_ptr[v + 1]]
        ready = np.maximum(base[v], np.maximum.reduce(val[p])) if len(p) else base[v]
        val[v] = ready + w[v]
    return val


def _chainy_timeline(rng: np.random.Generator, n: int, n_lanes: int) -> _replay.Timeline:
    """A random DAG of ``n`` nodes on ``n_lanes`` lanes (a rank's ops): each node follows the last
    node of its lane (a chain), and now and then joins other lanes (a collective: several
    predecessors), forks (a node two later nodes follow), starts anew (no predecessor: a base), or
    keeps one predecessor with a base of its own (not a link). Nodes are numbered in topological
    order and put in level order (the longest path), as ``_replay.build`` leaves them."""
    last = [-1] * n_lanes
    preds: list[list[int]] = []
    own_base = np.zeros(n, bool)
    for v in range(n):
        lane = int(rng.integers(n_lanes))
        r = rng.random()
        p: set[int] = set()
        if last[lane] >= 0 and r > 0.04:
            p.add(last[lane])
        if r < 0.12 and v:  # a join: the last nodes of other lanes
            for other in rng.choice(n_lanes, int(rng.integers(1, n_lanes + 1)), replace=False).tolist():
                if last[other] >= 0:
                    p.add(last[other])
        elif r < 0.18 and v:  # a fork: an earlier node gets a second successor
            p.add(int(rng.integers(v)))
        own_base[v] = len(p) == 1 and rng.random() < 0.05
        preds.append(sorted(p, key=lambda u: rng.random()))  # any order: pred's order is kept
        last[lane] = v
    # level order (stable within a level): the replays take nodes in Timeline.levels' ranges
    level = np.zeros(n, np.int64)
    for v, p in enumerate(preds):
        level[v] = max((level[u] + 1 for u in p), default=0)
    perm = np.argsort(level, kind="stable")
    inv = np.empty(n, np.int64)
    inv[perm] = np.arange(n)
    preds = [[int(inv[u]) for u in preds[v]] for v in perm]
    own_base = own_base[perm]
    lv = level[perm]
    bounds = np.concatenate([[0], np.nonzero(np.diff(lv))[0] + 1, [n]])
    pred_ptr = np.zeros(n + 1, np.int32)
    pred_ptr[1:] = np.cumsum([len(p) for p in preds])
    pred = np.array([u for p in preds for u in p], np.int32)
    has_pred = pred_ptr[1:] > pred_ptr[:-1]
    base = np.where(has_pred & ~own_base, -np.inf, rng.integers(0, 50, n).astype(np.float64))
    nodes = pl.DataFrame({"kind": np.zeros(n, np.int8), "step": np.zeros(n, np.int32), "base": base})
    step_start = pl.DataFrame({"step": np.zeros(1, np.int32), "step_start_ns": np.zeros(1, np.int64)})
    levels = [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    return _replay.Timeline(nodes, pred_ptr, pred, levels, step_start)


def _weights(rng: np.random.Generator, n: int, kind: str) -> np.ndarray:
    if kind == "ints":  # many ties: ends that come out unchanged
        return rng.integers(0, 4, n).astype(np.float64)
    if kind == "mixed":  # sums that depend on their order, zero, negative and -0.0 weights
        w = rng.choice(np.array([0.1, 0.2, 0.3, 1e16, -1e16, 1e-3, 0.0, -0.0, -2.5, 7.0]), n)
        return w * rng.random(n).round(1)
    w = rng.normal(5.0, 3.0, n)  # with NaN now and then
    w[rng.random(n) < 0.01] = np.nan
    return w


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("seed", range(10))
def test_chain_replays_equal_a_node_by_node_replay(seed: int) -> None:
    """A full replay (``replay_weights``) and cone replays (``replay_changes``) give the
    reference's floats bit for bit."""
    rng = np.random.default_rng(seed)
    tl = _chainy_timeline(rng, int(rng.integers(50, 1500)), int(rng.integers(1, 9)))
    n = tl.nodes.height
    for kind in ("ints", "mixed", "nan"):
        w = _weights(rng, n, kind)
        with np.errstate(invalid="ignore", over="ignore"):
            want = _reference(tl, w)
            assert _same_bits(_replay.replay_weights(tl, w), want)
            w0, val0 = w.copy(), want.copy()
            cases = [np.zeros(0, np.int64), np.array([0]), np.array([n - 1]), np.arange(n)]
            cases += [np.sort(rng.choice(n, k, replace=False)) for k in (1, 3, max(1, n // 10))]
            for at in cases:
                w_at = _weights(rng, len(at), kind)
                w2 = w.copy()
                w2[at] = w_at
                full = _reference(tl, w2)
                idx, new = _replay.replay_changes(tl, w, want, at, w_at)
                # the same nodes and floats as the level-by-level cone replay it replaced
                ref_i, ref_v = _reference_replay_changes(tl, w, want, at, w_at)
                assert np.array_equal(idx, ref_i) and _same_bits(new, ref_v)
                assert _same_bits(new, full[idx])
                if kind != "nan":  # (a NaN end differs from itself: reported where the cone reaches it)
                    assert np.array_equal(idx, np.nonzero(full != want)[0])  # ascending
                got = want.copy()
                got[idx] = new
                assert np.array_equal(got, full, equal_nan=True)
                assert _same_bits(w, w0) and _same_bits(want, val0)  # put back


def test_replays_of_a_small_graph() -> None:
    """Worked by hand: 0 -> 1 -> 2 -> 4, 3 -> 4 (a join), 4 -> 5 and 4 -> 6 (a fork), 6 -> 7.
    Links: 1 and 2 (after 0), 7 (after 6); 4 has two predecessors, 5 and 6 share one: not links."""
    preds = [[], [0], [1], [], [2, 3], [4], [4], [6]]
    levels = [(0, 1), (1, 2), (2, 4), (4, 5), (5, 7), (7, 8)]
    # levels 0 | 1 | 2 3 | 4 | 5 6 | 7: each level's predecessors on earlier ones (3 has none)
    pred_ptr = np.zeros(9, np.int32)
    pred_ptr[1:] = np.cumsum([len(p) for p in preds])
    pred = np.array([u for p in preds for u in p], np.int32)
    base = np.array([0.0, -np.inf, -np.inf, 10.0, -np.inf, -np.inf, -np.inf, -np.inf])
    nodes = pl.DataFrame({"kind": np.zeros(8, np.int8), "step": np.zeros(8, np.int32), "base": base})
    step_start = pl.DataFrame({"step": np.zeros(1, np.int32), "step_start_ns": np.zeros(1, np.int64)})
    tl = _replay.Timeline(nodes, pred_ptr, pred, levels, step_start)
    w = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0])
    # 0: 0+1 = 1; 1: 3; 2: 6; 3: 10+4 = 14; 4: max(6, 14)+5 = 19; 5: 25; 6: 26; 7: 34
    want = np.array([1.0, 3.0, 6.0, 14.0, 19.0, 25.0, 26.0, 34.0])
    assert _same_bits(_replay.replay_weights(tl, w), want)
    # node 1 takes 12 (not 2): 1 -> 13, 2 -> 16, 4 -> max(16, 14) + 5 = 21, 5 -> 27, 6 -> 28, 7 -> 36
    idx, new = _replay.replay_changes(tl, w, want.copy(), np.array([1]), np.array([12.0]))
    assert idx.tolist() == [1, 2, 4, 5, 6, 7] and new.tolist() == [13.0, 16.0, 21.0, 27.0, 28.0, 36.0]
    # node 3 takes 1 (not 4): 3 -> 11, 4 -> max(6, 11) + 5 = 16, 5 -> 22, 6 -> 23, 7 -> 31
    idx, new = _replay.replay_changes(tl, w, want.copy(), np.array([3]), np.array([1.0]))
    assert idx.tolist() == [3, 4, 5, 6, 7] and new.tolist() == [11.0, 16.0, 22.0, 23.0, 31.0]
    # node 0 takes 0.5 (not 1): 0, 1, 2 move, 4 keeps max(5.5, 14) + 5 = 19: the cone stops there
    idx, new = _replay.replay_changes(tl, w, want.copy(), np.array([0]), np.array([0.5]))
    assert idx.tolist() == [0, 1, 2] and new.tolist() == [0.5, 2.5, 5.5]
