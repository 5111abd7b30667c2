"""What fixing a rank buys and who bounds the steps next: ``whatif``'s per-rank fixes, its bound
rounds and their note (``whatif`` module doc, step 5). Not an analysis.

A rank's fix is a replay of the recorded (or typical-gap) run with only that rank's lateness (its
values above the ideal) removed; the bound rounds fix the ranks one after another, the largest fix
alone first, and give each rank its saving at its turn as a share of the saving with every rank
fixed (:func:`fixes`). Each of those replays recomputes only what the changed nodes reach from a
base replay (:class:`PutBack`, over ``_replay.replay_changes``), so the blame of every rank grows
about linearly with the ranks.
"""

from __future__ import annotations

import math

import numpy as np
import polars as pl

from traceprof.analyses import _replay


def step_t(tl: _replay.Timeline, val: np.ndarray, w: np.ndarray | None = None) -> np.ndarray:
    """Each step's time (ns, float array, in step order): the latest end of its nodes (instance
    nodes aside) - the step start, for node end times ``val`` in ``tl.nodes`` order. ``val``
    a replay with weights ``w`` all at least 0: the latest end over the nodes that can end a step
    (``Timeline.step_ends``: the same floats, from a twentieth of the nodes); None: over all."""
    order, seg, _, step_start = tl.by_step()
    if w is not None and non_negative(w):
        order, seg = tl.step_ends()
    v = np.maximum.reduceat(val[order], seg) if len(order) else val[:0]
    return v - step_start


def non_negative(w: np.ndarray) -> bool:
    """Every weight at least 0 (none NaN): a replay's step ends are then those of
    ``Timeline.step_ends``."""
    return bool(np.all(w >= 0))


#: :func:`fixes` peels at most this many ranks (or groups of ranks tied), a replay each: the blame
#: stays linear in the ranks; the ranks left have no ``bound_pct``.
MAX_BOUND_GROUPS = 8


def fixes(
    tl: _replay.Timeline, w_base: np.ndarray, val: np.ndarray, w_fix: np.ndarray, ranks: np.ndarray
) -> tuple[dict[str, float], dict[str, float]]:
    """Per rank (as text, ``blame``'s group): its fix slowdown and its bound share (module doc,
    step 5). ``w_base``: each node's weight (gap + dur, ns) in the kind's recorded replay; ``val``:
    :func:`_replay.replay_weights`'s ends with them (the caller's replay of it, not done again; left
    as it was); ``w_fix``: the same weights with the lateness removed (the value above the ideal:
    the smaller of the two), ns; ``ranks``: each node's rank (-1: instance nodes).

    Fix slowdown: mean recorded step / mean step with only that rank's lateness removed (at least
    1): the other ranks' lateness stays, so the next latest rank still bounds a collective (rank 1
    140 us and rank 3 100 us late at every step's all-reduce, 4 ranks of 700 us of work and 100 us
    of transfer: fixing rank 1 makes a 940 us step 900 us, not the ideal 860: 1.044). Bound share:
    the ranks fixed one after another (the largest fix first, then the most lateness, summed over
    its nodes; ranks alike in both fixed together, sharing what they save equally), each rank's
    saving at its turn, % of the saving with every rank fixed: each rank that bounds steps gets a
    share (rank 1 40 us, then rank 3 40 us of the 80: 50% each), and the shares add up to at most
    100%. Linear: a replay of the changed nodes' cone per rank with lateness, one with all fixed,
    and one per bound turn past the first and before the last (at most :data:`MAX_BOUND_GROUPS`).

    Replays left out, the same floats: a rank without lateness saves 0; the only rank with lateness
    saves what fixing all saves; the first turn (one rank) saves that rank's fix, a turn that fixes
    the last lateness ends at all fixed, a turn of ranks without lateness saves 0. No rank's fix is
    left out for being small alone: removing a rank's lateness with the others late can save more
    than it costs alone (ranks 1 and 2 each 6 us late on one path with 10 us of slack: alone 0,
    fixed with the other late 2 us), so an alone slowdown under stragglers' 1% floor bounds nothing.
    """
    all_ranks = np.unique(ranks[ranks >= 0])
    if not len(all_ranks):
        return {}, {}
    m0 = float(step_t(tl, val, w_base).mean())
    if m0 <= 0:
        return {}, {}
    late = np.nonzero((w_fix < w_base) & (ranks >= 0))[0]
    late = late[_replay.stable_order(ranks[late])]  # by rank, each rank's nodes ascending
    by_rank, first = np.unique(ranks[late], return_index=True)
    ends = [*first[1:].tolist(), len(late)][: len(first)]
    nodes_of = {int(r): late[a:b] for r, a, b in zip(by_rank.tolist(), first.tolist(), ends, strict=True)}
    late = np.sort(late)  # a new array: nodes_of holds views of the one by rank
    put_back = PutBack(tl, w_base, val)
    # each rank's lateness (ns, summed over its nodes) and the mean step with it fixed
    excess = {r: float((w_base[at] - w_fix[at]).sum()) for r, at in nodes_of.items()}
    m_all = float(put_back.step_t(late, w_fix[late]).mean()) if len(late) else m0
    m_fix: dict[int, float] = {}
    for r, at in nodes_of.items():
        m_fix[r] = m_all if len(nodes_of) == 1 else float(put_back.step_t(at, w_fix[at]).mean())
    gain = {r: m0 - m_fix.get(r, m0) for r in all_ranks.tolist()}
    fix = {str(r): m0 / max(m0 - max(g, 0.0), 1e-300) for r, g in gain.items()}
    total = m0 - m_all
    if total <= 1e-9 * m0:  # no lateness bounds a step: nothing to share
        return fix, {str(r): 0.0 for r in gain}
    # ranks in order: the largest fix, the most lateness, the rank; alike in both (to float noise): one group
    order = sorted(gain, key=lambda r: (-gain[r], -excess.get(r, 0.0), r))
    groups: list[list[int]] = []
    for r in order:
        g0 = groups[-1][0] if groups else None
        alike = g0 is not None and all(
            math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-6)
            for a, b in ((gain[r], gain[g0]), (excess.get(r, 0.0), excess.get(g0, 0.0)))
        )
        if alike:
            groups[-1].append(r)
        else:
            groups.append([r])
    bound: dict[str, float] = {}
    fixed: list[np.ndarray] = []
    n_fixed, before = 0, m0
    for i, grp in enumerate(groups):
        if before - m_all <= 1e-9 * m0:  # every lateness that bounds a step is fixed: the rest save nothing
            bound.update((str(r), 0.0) for r in grp)
            continue
        if i >= MAX_BOUND_GROUPS:
            break
        new = [nodes_of[r] for r in grp if r in nodes_of]
        fixed += new
        n_fixed += sum(len(x) for x in new)
        if not new:  # no lateness in the turn: nothing changes
            after = before
        elif n_fixed == len(late):  # the last lateness fixed: all fixed
            after = m_all
        elif i == 0 and len(grp) == 1:  # the first turn, one rank: its fix
            after = m_fix[grp[0]]
        else:
            at = np.sort(np.concatenate(fixed))
            after = float(put_back.step_t(at, w_fix[at]).mean())
        bound.update((str(r), 100.0 * max(before - after, 0.0) / total / len(grp)) for r in grp)
        before = after
    return fix, bound


class PutBack:
    """Step times of a replay with some nodes' weights changed from a base replay's (``w``: each
    node's gap + dur, ns; ``val``: :func:`_replay.replay`'s ends with them): the changed nodes'
    forward cone is replayed (:func:`_replay.replay_changes`) and only the steps it reaches are
    taken again, so a rank's blame costs its cone, not the job (the same floats as a full replay
    and :func:`step_t`). With every weight at least 0 (``w`` and a group's ``w_at``), each step's
    latest end is taken over the nodes that can end it alone (``Timeline.step_ends``), else over all.
    """

    #: Above this share of the nodes changed, a full replay (the cone is most of the graph).
    FULL_SHARE = 0.125
    #: Above this share of the nodes in the cone, each step's latest end is taken again over all
    #: its nodes (with the cone's ends in place) rather than from the cone's steps alone.
    CONE_SHARE = 0.125
    #: A cone that grows over this share of the nodes is stopped there (``_replay.replay_changes_within``)
    #: and replayed in full, as every later call is: a cone's levels cost more per node than a full
    #: replay's (8 x 1 M events: cones of 18-28% of the nodes 52-59 ms, 44% 90 ms, 92% 385 ms, a
    #: full replay 33 ms with its step maxima), and the ranks' cones are alike (each rank's
    #: collectives reach every rank).
    FULL_AFTER_SHARE = 0.125

    def __init__(self, tl: _replay.Timeline, w: np.ndarray, val: np.ndarray, ends: bool = True) -> None:
        self.tl, self.w, self.val = tl, w, val
        order, seg, _, self.step_start = tl.by_step()
        # the step maxima over the nodes that can end a step, while the weights are at least 0
        self.ends = ends and non_negative(w)
        if self.ends:
            order, seg = tl.step_ends()
        self.order, self.seg = order, seg
        self._all: PutBack | None = None  # the same over every node: for weights below 0
        self.full = False  # replay in full from now on (FULL_AFTER_SHARE)
        n_steps = len(seg)
        self.top = self._max(val)
        self.t = self.top - self.step_start  # step_t(tl, val), its one gather and max taken once
        step_i = np.repeat(np.arange(n_steps, dtype=np.int32), np.diff(np.append(seg, len(order))))
        # each node's step (position in by_step's steps; -1: instance nodes)
        self.step_of = np.full(len(val), -1, np.int32)
        self.step_of[order] = step_i
        # how many nodes of each step end at its latest end
        self.n_top = np.bincount(step_i, weights=val[order] == self.top[step_i], minlength=n_steps)

    def step_t(self, at: np.ndarray, w_at: np.ndarray) -> np.ndarray:
        """Each step's time (:func:`step_t`, ns, float, in step order) with the nodes ``at``
        (distinct) taking the weights ``w_at`` (ns)."""
        if self.ends and not non_negative(w_at):
            if self._all is None:
                self._all = PutBack(self.tl, self.w, self.val, ends=False)
            return self._all.step_t(at, w_at)
        if self.full or len(at) > self.FULL_SHARE * len(self.w):
            return self._full(at, w_at)
        limit = int(self.FULL_AFTER_SHARE * len(self.w))
        cone = _replay.replay_changes_within(self.tl, self.w, self.val, at, w_at, limit)
        if cone is None:  # most of the graph changes: in full, now and from now on
            self.full = True
            return self._full(at, w_at)
        idx, new = cone
        if len(idx) > self.CONE_SHARE * len(self.w):
            # a cone of most of the graph (a rank's collectives reach every rank): each step's
            # latest end over the changed ends in place, as step_t takes it from a full replay,
            # costs less than working out which steps the cone reached
            old = self.val[idx]
            try:
                self.val[idx] = new
                return self._max(self.val) - self.step_start
            finally:
                self.val[idx] = old
        t = self.t.copy()
        s = self.step_of[idx]
        keep = s >= 0
        idx, new, s = idx[keep], new[keep], s[keep]
        if not len(idx):
            return t
        steps = np.unique(s)
        new_max = np.full(len(self.top), -np.inf)
        np.maximum.at(new_max, s, new)
        # a step's unchanged nodes still reach its latest end unless every node that did changed
        lost = np.bincount(s, weights=self.val[idx] == self.top[s], minlength=len(self.top))
        m = np.maximum(self.top[steps], new_max[steps])
        redo = np.nonzero((lost[steps] >= self.n_top[steps]) | np.isnan(self.top[steps]))[0]
        if len(redo):
            # those steps' latest ends taken again with the changed ends in place (a step's slice
            # of by_step's order holds its changed nodes and no other step's), then put back
            old = self.val[idx]
            try:
                self.val[idx] = new
                # the redone steps' slices of by_step's order, end to end, and each one's max
                k = steps[redo]
                a = self.seg[k]
                n = np.append(self.seg, len(self.order))[k + 1] - a
                off = np.concatenate([[0], np.cumsum(n)[:-1]])
                m[redo] = np.maximum.reduceat(
                    self.val[self.order[np.repeat(a - off, n) + np.arange(int(n.sum()))]], off
                )
            finally:
                self.val[idx] = old
        t[steps] = m - self.step_start[steps]
        return t

    def _full(self, at: np.ndarray, w_at: np.ndarray) -> np.ndarray:
        """:meth:`step_t` by a full replay: the new weights in place of the base's (no copy of every
        weight), put back after."""
        old_w = self.w[at]
        try:
            self.w[at] = w_at + 0.0  # what replay(w, 0) adds (-0.0 + 0.0 is 0.0): the same floats
            return self._max(_replay.replay_weights(self.tl, self.w)) - self.step_start
        finally:
            self.w[at] = old_w

    def _max(self, val: np.ndarray) -> np.ndarray:
        """Each step's latest end (in step order) of the node ends ``val``: :func:`step_t` with
        this put-back's nodes."""
        return np.maximum.reduceat(val[self.order], self.seg) if len(self.order) else val[:0]


#: :func:`bounds_text` names the ranks whose bound share is at least this (%).
BOUND_NAMED_PCT = 1.0


def bounds_text(ranks: pl.DataFrame) -> str:
    """The ranks that bound steps, for a note: each rank of one kind's ``blame`` rows by rank whose
    ``bound_pct`` is at least :data:`BOUND_NAMED_PCT`, the largest first, with its fix slowdown
    (``rank 1 50% (fixed alone 1.044x), rank 3 50% (fixed alone 1.000x)``); "" when none (or
    without those columns)."""
    if not {"bound_pct", "fix_slowdown"} <= set(ranks.columns):
        return ""
    b = ranks.filter(pl.col("bound_pct") >= BOUND_NAMED_PCT).sort(
        ["bound_pct", "group"], descending=[True, False]
    )
    if b.is_empty():
        return ""
    parts = [
        f"rank {g} {p:.0f}% (fixed alone {f:.3f}x)"
        for g, p, f in b.select("group", "bound_pct", "fix_slowdown").rows()
    ]
    return (
        "ranks that bound steps, each one's % of the saving with every rank fixed (bound_pct; not of S's "
        "excess: the ranks fixed one after another, the largest fix alone first, then the most lateness, "
        "each rank's saving at its turn; a rank's fix alone leaves the next latest rank bounding): "
        + ", ".join(parts)
    )
