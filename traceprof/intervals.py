"""Interval arithmetic on polars frames: merge (union), clip, measure. All bounds are int64 ns.

Intersections are measured without materializing them: for merged sets A and B,
``|A ∩ B| = |A| + |B| - |A ∪ B|``.
"""

from __future__ import annotations

import polars as pl

__all__ = ["merge", "union_ns", "clip", "subtract"]


def merge(df: pl.DataFrame, by: list[str], start: str = "start_ns", end: str = "end_ns") -> pl.DataFrame:
    """Merge overlapping or touching intervals within each group.

    Args:
        df: Frame with the ``by`` columns and int64 ``start``/``end`` (ns, end exclusive).
        by: Group columns (e.g. ``["rank"]``); intervals of different groups never merge.

    Returns:
        Frame with columns ``by + [start, end]``, disjoint and sorted within each group.
    """
    if df.is_empty():
        return df.select([*by, start, end])
    # Sorting is the main cost; it is cheap when ``df`` is sorted already (e.g. a filtered subset).
    s = df.select([*by, start, end]).filter(pl.col(end) > pl.col(start)).sort([*by, start])

    def over(e: pl.Expr) -> pl.Expr:
        return e.over(by) if by else e

    # A row opens a segment when it starts after every earlier end of its group; the running max
    # end at a segment's last row is the segment's end (earlier segments all ended before it).
    s = s.with_columns(over(pl.col(end).cum_max()).alias("_cm"))
    prev = over(pl.col("_cm").shift(1))
    s = s.with_columns((prev.is_null() | (pl.col(start) > prev)).alias("_new"))
    ends = s.filter(over(pl.col("_new").shift(-1, fill_value=True))).get_column("_cm").alias(end)
    return s.filter(pl.col("_new")).select(*by, start).with_columns(ends)


def union_ns(
    df: pl.DataFrame, by: list[str], name: str, start: str = "start_ns", end: str = "end_ns"
) -> pl.DataFrame:
    """Length of the union of the intervals of each group, in ns, as column ``name``."""
    m = merge(df, by, start, end)
    return m.group_by(by).agg((pl.col(end) - pl.col(start)).sum().alias(name))


def clip(df: pl.DataFrame, lo: str, hi: str, start: str = "start_ns", end: str = "end_ns") -> pl.DataFrame:
    """Clip each interval to ``[df[lo], df[hi])`` (columns of ``df``) and drop what falls outside."""
    return df.with_columns(
        pl.max_horizontal(start, lo).alias(start), pl.min_horizontal(end, hi).alias(end)
    ).filter(pl.col(end) > pl.col(start))


def subtract(
    a: pl.DataFrame, b: pl.DataFrame, by: list[str], b_by: list[str] | None = None
) -> pl.DataFrame:
    """The parts of ``a`` not covered by ``b``: ``∪a - ∪b`` within each group, as maximal intervals.

    Args:
        a: Intervals (``by`` columns, int64 ``start_ns``/``end_ns``, end exclusive).
        b: Intervals to remove, grouped by ``b_by`` (a subset of ``by``, default ``by``).
            With ``b_by`` coarser than ``by`` every group of ``a`` loses all of its ``b_by`` group's
            intervals (e.g. one step's communication minus all of the rank's compute).

    Returns:
        Frame with columns ``by + [start_ns, end_ns]``: disjoint, sorted within each group, touching
        pieces merged.
    """
    b_by = by if b_by is None else b_by
    ma = merge(a, by)
    if ma.is_empty():
        return ma
    spans = ma.group_by(by).agg(pl.col("start_ns").min().alias("_lo"), pl.col("end_ns").max().alias("_hi"))
    mb = clip(merge(b, b_by).join(spans, on=b_by), "_lo", "_hi").select(ma.columns)
    one, zero = pl.lit(1, pl.Int32), pl.lit(0, pl.Int32)
    ev = pl.concat([
        ma.select(*by, pl.col("start_ns").alias("t"), one.alias("da"), zero.alias("db")),
        ma.select(*by, pl.col("end_ns").alias("t"), (-one).alias("da"), zero.alias("db")),
        mb.select(*by, pl.col("start_ns").alias("t"), zero.alias("da"), one.alias("db")),
        mb.select(*by, pl.col("end_ns").alias("t"), zero.alias("da"), (-one).alias("db")),
    ])
    ev = ev.group_by([*by, "t"]).agg(pl.col("da").sum(), pl.col("db").sum()).sort([*by, "t"])
    ev = ev.with_columns(
        pl.col("da").cum_sum().over(by).alias("in_a"),
        pl.col("db").cum_sum().over(by).alias("in_b"),
        pl.col("t").shift(-1).over(by).alias("next_t"),
    )
    pieces = ev.filter((pl.col("in_a") > 0) & (pl.col("in_b") == 0) & pl.col("next_t").is_not_null())
    return merge(pieces.select(*by, pl.col("t").alias("start_ns"), pl.col("next_t").alias("end_ns")), by)


def class_measures(act: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """Union lengths per group of an activity frame (see ``traceprof.activity``).

    Returns:
        Frame with ``by`` plus first_ns, last_ns (window bounds), window_ns = last - first,
        busy_ns = |∪ all|, compute_ns = |∪ compute|, comm_ns = |∪ comm|, overlap_ns =
        |comm ∩ compute| (all ns).
    """
    act = act.sort([*by, "start_ns"])  # once: the merges of its subsets below then skip sorting
    bounds = act.group_by(by).agg(
        pl.col("start_ns").min().alias("first_ns"), pl.col("end_ns").max().alias("last_ns")
    )
    comp = act.filter(pl.col("class") == "compute")
    comm = act.filter(pl.col("class") == "comm")
    both = act.filter(pl.col("class").is_in(["compute", "comm"]))
    out = bounds.with_columns((pl.col("last_ns") - pl.col("first_ns")).alias("window_ns"))
    for name, part in (("busy_ns", act), ("compute_ns", comp), ("comm_ns", comm), ("_cc_ns", both)):
        out = out.join(union_ns(part, by, name), on=by, how="left")
    out = out.with_columns(pl.col(c).fill_null(0) for c in ("busy_ns", "compute_ns", "comm_ns", "_cc_ns"))
    return out.with_columns(
        (pl.col("comm_ns") + pl.col("compute_ns") - pl.col("_cc_ns")).alias("overlap_ns")
    ).drop("_cc_ns").sort(by)
