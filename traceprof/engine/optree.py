"""The call tree of nested intervals on one lane (CPU ops of a thread): parents and self time.

CPU ops of one thread nest like a call stack. Sorted by (start, longer first), the parent of an op
is the nearest earlier op that still encloses it. Computed without a pairwise join (which is
quadratic in the ops per thread):

  1. depth(i) = the number of ops open at i's start that sort before i: those that started
     earlier and end after it (a count of starts minus a count of ends, by binary search), plus
     those with the same start sorted before i.
  2. parent(i) = the last op before i (sort order) at depth(i) - 1: an as-of join per lane.
  3. self time = duration - Σ children's durations (never below 0).

Intervals that overlap without nesting (clock rounding, async work on one thread) get the
parent that step 2 finds only when it really encloses them, else none.
"""

from __future__ import annotations

import numpy as np
import polars as pl

__all__ = ["with_parents", "self_times"]


def with_parents(df: pl.DataFrame, lane: list[str], priority: str | None = None) -> pl.DataFrame:
    """``df`` sorted into call order, with ``id`` (row in that order) and ``parent`` (an ``id`` or null).

    Args:
        df: Frame with the ``lane`` columns and int64 ``start_ns``, ``end_ns`` (ns, end >= start).
        lane: Columns naming a lane (e.g. ``["rank", "pid", "tid"]``); ops of different lanes
            never nest.
        priority: Optional integer column; of two ops with the same start and end, the one with
            the smaller value is the parent.

    Returns:
        ``df`` sorted by lane, start, end descending (and ``priority``), plus ``id`` (UInt32) and
        ``parent`` (UInt32, null for top-level ops).
    """
    keys = [*lane, "start_ns", "end_ns"] + ([priority] if priority else [])
    desc = [False] * len(lane) + [False, True] + ([False] if priority else [])
    s = df.sort(keys, descending=desc).with_row_index("id")
    # every step below stays within a lane: a large frame is worked in pieces of whole lanes (cut
    # where the first lane column changes, in the one sorted order), so that its temporaries
    # (window groups, the as-of join's) hold one piece at a time
    return pl.concat([_parents(p, lane) for p in _lane_pieces(s, lane[0])], rechunk=True)


#: Rows of a piece of :func:`with_parents` (whole lanes; a lane of more is a piece of its own).
PIECE_ROWS = 1 << 16


def _lane_pieces(s: pl.DataFrame, first: str) -> list[pl.DataFrame]:
    """``s`` (sorted by ``first``) as consecutive slices (no copy) of whole runs of equal ``first``
    values, each of :data:`PIECE_ROWS` rows or more (the last may hold fewer)."""
    if s.height <= PIECE_ROWS:
        return [s]
    bounds, at, size = [0], 0, 0
    for n in s.get_column(first).rle().struct.field("len").to_list():
        at, size = at + n, size + n
        if size >= PIECE_ROWS and at < s.height:
            bounds.append(at)
            size = 0
    bounds.append(s.height)
    return [s.slice(lo, hi - lo) for lo, hi in zip(bounds, bounds[1:], strict=False)]


def _parents(s: pl.DataFrame, lane: list[str]) -> pl.DataFrame:
    """Steps 1-2 of the module doc on ``s``: whole lanes of :func:`with_parents`' sorted frame, with
    its ``id``; ``s`` plus ``parent``."""
    depth = np.zeros(s.height, dtype=np.int64)
    start_all, end_all = s["start_ns"].to_numpy(), s["end_ns"].to_numpy()
    pos = end_all > start_all
    # Same-start ops sorted before i that have a duration enclose it (they end no earlier; step 1).
    has_dur = (pl.col("end_ns") > pl.col("start_ns")).cast(pl.Int64)
    same = s.select(has_dur.cum_sum().over([*lane, "start_ns"]) - has_dur).to_series().to_numpy()
    bounds = (
        s.with_row_index("_r")
        .group_by(lane, maintain_order=True)
        .agg(pl.col("_r").first().alias("lo"), pl.col("_r").last().alias("hi"))
    )
    for lo, hi in zip(bounds["lo"], bounds["hi"], strict=True):
        st, en, p = start_all[lo : hi + 1], end_all[lo : hi + 1], pos[lo : hi + 1]
        starts, ends = np.sort(st[p]), np.sort(en[p])
        depth[lo : hi + 1] = np.searchsorted(starts, st, "left") - np.searchsorted(ends, st, "right")
    s = s.with_columns(pl.Series("_depth", depth + same))
    right = s.select(
        *lane,
        (pl.col("_depth") + 1).alias("_depth"),
        pl.col("id").alias("parent"),
        pl.col("start_ns").alias("_ps"),
        pl.col("end_ns").alias("_pe"),
    )
    out = s.join_asof(
        right,
        left_on="id",
        right_on="parent",
        by=[*lane, "_depth"],
        strategy="backward",
        allow_exact_matches=False,
        check_sortedness=False,
    )
    encloses = (pl.col("_ps") <= pl.col("start_ns")) & (pl.col("_pe") >= pl.col("end_ns"))
    return out.with_columns(pl.when(encloses).then(pl.col("parent")).otherwise(None).alias("parent")).drop(
        "_depth", "_ps", "_pe"
    )


def self_times(tree: pl.DataFrame) -> pl.Series:
    """Self time (ns) of each row of a :func:`with_parents` frame: duration minus its children's."""
    child = (
        tree.filter(pl.col("parent").is_not_null())
        .group_by("parent")
        .agg((pl.col("end_ns") - pl.col("start_ns")).sum().alias("_child"))
    )
    joined = tree.select("id", "start_ns", "end_ns").join(
        child, left_on="id", right_on="parent", how="left", maintain_order="left"
    )
    own = pl.col("end_ns") - pl.col("start_ns") - pl.col("_child").fill_null(0)
    return joined.select(pl.max_horizontal(own, pl.lit(0)).alias("self_ns"))["self_ns"]
