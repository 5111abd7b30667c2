"""Interval arithmetic on polars frames: merge (union), clip, measure. All bounds are int64 ns.

Intersections are measured without materializing them: for merged sets A and B,
``|A ∩ B| = |A| + |B| - |A ∪ B|``.

Every operation is a sort followed by linear passes (cumulative max, shifts, as-of joins on sorted
bounds): time O(n log n) and memory O(n) in the intervals (plus the output), independent of the
number of groups. Nothing joins the intervals of one group with every other group (e.g. compute
intervals x steps), which grew with the square of the step count.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import polars as pl

if TYPE_CHECKING:
    from polars._typing import AsofJoinStrategy

__all__ = [
    "merge",
    "union_ns",
    "clip",
    "subtract",
    "remove",
    "tile",
    "cut",
    "overlapped_range",
    "complement",
    "class_measures",
    "rank_chunks",
    "by_rank_chunks",
    "concat_taking",
    "sorted_by",
]


#: Frames of more rows than this are worked in pieces of whole ranks of about this many rows
#: (:func:`rank_chunks`), so that a sweep's temporaries (sort keys, window groups, shifted
#: columns) hold one piece at a time: on 8 ranks x 1 M events, ~330 k activity rows per rank.
CHUNK_ROWS = 1 << 18


def rank_chunks(df: pl.DataFrame, by: list[str]) -> list[pl.DataFrame] | None:
    """``df`` as consecutive slices (no copy) of whole ranks, each of about :data:`CHUNK_ROWS` rows
    or more, when an operation grouped by ``by`` may work on each alone: ``by`` starts with
    ``rank``, ``df`` has more than :data:`CHUNK_ROWS` rows and is sorted by a rank column without
    nulls (``traceprof.engine.activity``'s order, which filters keep). None
    otherwise (one piece: nothing to gain).

    Every group of such an operation lies within one slice, so its rows are computed as on the
    whole frame, and the slices come in rank order."""
    if not by or by[0] != "rank" or df.height <= CHUNK_ROWS or not _rank_sorted(df):
        return None
    runs = df.get_column("rank").rle()
    bounds, at, size = [0], 0, 0
    for n in runs.struct.field("len").to_list():
        at, size = at + n, size + n
        if size >= CHUNK_ROWS and at < df.height:
            bounds.append(at)
            size = 0
    if len(bounds) < 2:
        return None
    bounds.append(df.height)
    return [df.slice(lo, hi - lo) for lo, hi in zip(bounds, bounds[1:], strict=False)]


def by_rank_chunks(
    df: pl.DataFrame, by: list[str], fn: Callable[[pl.DataFrame], pl.DataFrame]
) -> pl.DataFrame:
    """``fn(df)`` for an ``fn`` whose rows are those of its ``by`` groups (a grouping by ``by``,
    starting with rank; rows in no particular order): ``fn`` of each piece of :func:`rank_chunks`,
    concatenated in order, so that its temporaries (group keys, gathered values) hold one piece of
    a large frame at a time; ``fn(df)`` when there is one piece."""
    parts = rank_chunks(df, by)
    return fn(df) if parts is None else _concat([fn(p) for p in parts])


def _rank_sorted(df: pl.DataFrame) -> bool:
    """Whether ``df`` has a rank column without nulls, sorted ascending (one pass)."""
    if "rank" not in df.columns:
        return False
    r = df.get_column("rank")
    return not r.null_count() and r.is_sorted()


def _split(df: pl.DataFrame, firsts: list[object]) -> list[pl.DataFrame]:
    """``df`` (sorted by a rank column without nulls) cut before each rank of ``firsts`` (the
    first rank of each piece of :func:`rank_chunks`, ascending): slices, no copy."""
    r = df.get_column("rank")
    at = [0, *(int(i) for i in r.search_sorted(pl.Series(firsts[1:], dtype=r.dtype), "left")), df.height]
    return [df.slice(lo, hi - lo) for lo, hi in zip(at, at[1:], strict=False)]


def concat_taking(parts: list[pl.DataFrame]) -> pl.DataFrame:
    """``pl.concat(parts, rechunk=True)`` (frames of one schema, at least one), copied a column at
    a time and taking the parts: each part's column is let go of once the result holds it, so the
    rows are held about once, not twice (the parts and their one-chunk copy). A column null in
    every part is made null at once, its memory never written (critical_path's segments of a run
    whose collectives never reach the path: four columns, 62 MB of 8 x 1 M events). ``parts`` is
    left holding frames of no columns; the caller must not read them again.

    Raises:
        polars.exceptions.SchemaError: The parts' columns differ in dtype.
    """
    cols: list[pl.Series] = []
    n = sum(p.height for p in parts)
    for c in parts[0].columns:
        pieces = [p.get_column(c) for p in parts]
        if all(s.null_count() == s.len() for s in pieces) and len({s.dtype for s in pieces}) == 1:
            cols.append(pieces[0].clear(n))  # one chunk of nulls: zeroed pages, never touched
        else:
            cols.append(pl.concat(pieces, rechunk=True))
        del pieces
        parts[:] = [p.drop(c) for p in parts]  # in place: the caller's list lets go of the column too
    return pl.DataFrame(cols)


def _concat(parts: list[pl.DataFrame]) -> pl.DataFrame:
    """The pieces' results, in order, in one chunk (polars' arithmetic may differ by chunk layout)."""
    return pl.concat(parts, how="vertical", rechunk=True)


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
    parts = rank_chunks(df, by)
    if parts is not None:
        return _concat([merge(p, by, start, end) for p in parts])
    # Sorting is the main cost; it is cheap when ``df`` is sorted already (e.g. a filtered subset)
    # or nearly (sorted runs put together: compute items and the waits after them) with polars'
    # stable sort, which polars' default sort is not (8 ranks x 1 M events: 0.2 s, not 0.9 s, for
    # the stragglers' merges). Rows tied on the keys may come in any order: the segments are the same.
    s = (
        df.select([*by, start, end])
        .filter(pl.col(end) > pl.col(start))
        .sort([*by, start], maintain_order=True)
    )

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
    """Length of the union of the intervals of each group, in ns, as column ``name``.

    One sort (none when ``df`` is sorted by the first ``by`` column and start) and one sweep, no
    merged intervals built: in start order an interval adds the part of it past the running max
    end of its group's earlier intervals (as :func:`class_measures`).

    Args:
        df: Frame with the ``by`` columns and int64 ``start``/``end`` (ns, end exclusive).
        by: Group columns (a null key is a group of its own).

    Returns:
        Frame with ``by`` and ``name`` (int64 ns), one row per group holding an interval of
        positive length, in no particular order.
    """
    parts = rank_chunks(df, by)
    if parts is not None:
        return _concat([union_ns(p, by, name, start, end) for p in parts])
    s = df.select(*by, start, end).filter(pl.col(end) > pl.col(start))
    if s.is_empty():
        return s.select(*by, (pl.col(end) - pl.col(start)).alias(name))
    if not sorted_by(s, [*by[:1], start]):  # sorted by the first key and start: each group in start order
        s = s.sort([*by, start]) if by else s.sort(start)
    s = s.select(*by, _added(by, start, end).alias(name))
    return s.group_by(by).agg(pl.col(name).sum()) if by else s.select(pl.col(name).sum())


#: :func:`_packed_key`'s column.
_KEY = "_group_key"


def _packed_key(df: pl.DataFrame, by: list[str]) -> tuple[pl.DataFrame, list[str]]:
    """``df`` and the columns to group its sweep by: for two integer ``by`` columns of at most 32
    bits whose first has no null and lies in [0, 2**29) (rank, step), ``df`` with one int64
    column holding both (``first * 2**33 + second + 2**31``, a null second ``2**32``: one value per
    distinct pair, a null step a group of its own) and that column's name; else ``df`` and ``by``.
    A window over one integer column costs about 30 % less than over two
    (``class_measures(act, ["rank", "step"])`` on 8 x 1 M events: 0.52 -> 0.36 s CPU)."""
    small = (pl.Int8, pl.Int16, pl.Int32, pl.UInt8, pl.UInt16)
    if len(by) != 2 or df.is_empty() or any(df.schema[c] not in small for c in by):
        return df, by
    first = df.get_column(by[0])
    if first.null_count() or first.min() < 0 or first.max() >= 2**29:  # type: ignore[operator]
        return df, by
    second = (pl.col(by[1]).cast(pl.Int64) + 2**31).fill_null(2**32)
    return df.with_columns((pl.col(by[0]).cast(pl.Int64) * 2**33 + second).alias(_KEY)), [_KEY]


def _added(
    by: list[str], start: str = "start_ns", end: str = "end_ns", mask: pl.Expr | None = None
) -> pl.Expr:
    """Per row of a frame whose groups (``by``) lie in start order, what the row adds to the union
    of its group's rows of ``mask`` (all rows when None; 0 outside it): the part of it past the
    running max end of the earlier ones, ``max(0, end - max(start, that end))`` (int64 ns). The
    sweep of :func:`union_ns` and :func:`class_measures`."""
    lo = pl.lit(_LO, pl.Int64)
    e = pl.col(end) if mask is None else pl.when(mask).then(pl.col(end)).otherwise(lo)
    before = e.cum_max().shift(1)
    before = (before.over(by) if by else before).fill_null(lo)
    part = pl.max_horizontal(pl.col(end) - pl.max_horizontal(pl.col(start), before), 0)
    return part if mask is None else pl.when(mask).then(part).otherwise(0)


def clip(df: pl.DataFrame, lo: str, hi: str, start: str = "start_ns", end: str = "end_ns") -> pl.DataFrame:
    """Clip each interval to ``[df[lo], df[hi])`` (columns of ``df``) and drop what falls outside."""
    return df.with_columns(
        pl.max_horizontal(start, lo).alias(start), pl.min_horizontal(end, hi).alias(end)
    ).filter(pl.col(end) > pl.col(start))


def subtract(a: pl.DataFrame, b: pl.DataFrame, by: list[str], b_by: list[str] | None = None) -> pl.DataFrame:
    """The parts of ``a`` not covered by ``b``: ``∪a - ∪b`` within each group, as maximal intervals.

    :func:`remove` applied to the merged ``a``: linear after one sort (never a join of intervals x
    groups). Work and memory grow with ``|a| + |b|`` plus the number of pieces returned, whatever
    the number of groups (e.g. one group per step).

    Args:
        a: Intervals (``by`` columns, int64 ``start_ns``/``end_ns``, end exclusive).
        b: Intervals to remove, grouped by ``b_by`` (a subset of ``by``, default ``by``).
            With ``b_by`` coarser than ``by`` every group of ``a`` loses all of its ``b_by`` group's
            intervals (e.g. one step's communication minus all of the rank's compute). A null
            key is a group of its own, as in :func:`merge`.

    Returns:
        Frame with columns ``by + [start_ns, end_ns]``: disjoint, sorted within each group, touching
        pieces merged.
    """
    b_by = by if b_by is None else b_by
    big, other = (a, b) if a.height >= b.height else (b, a)
    parts = rank_chunks(big, b_by)
    if parts is not None and _rank_sorted(other):
        cut = _split(other, [p.get_column("rank")[0] for p in parts])
        pairs = zip(parts, cut, strict=True) if big is a else zip(cut, parts, strict=True)
        return _concat([subtract(pa, pb, by, b_by) for pa, pb in pairs])
    ma = merge(a, by)
    if ma.is_empty():
        return ma
    return remove(ma, b, by, b_by).select(*by, "start_ns", "end_ns").sort([*by, "start_ns"])


def remove(a: pl.DataFrame, b: pl.DataFrame, by: list[str], b_by: list[str] | None = None) -> pl.DataFrame:
    """The parts of each interval of ``a`` not covered by any interval of ``b`` of its group,
    keeping ``a``'s other columns on every piece (``a`` is not merged: overlapping intervals of
    ``a`` give overlapping pieces).

    Linear after one sort: ``∪b`` of each ``b_by`` group is turned into its complement, the sorted
    disjoint gaps between its intervals (plus the two unbounded ends); each interval of ``a`` meets a
    contiguous run of those gaps, found by two as-of joins, and its pieces are its intersections
    with them.

    Args:
        a: Intervals (``by`` columns, int64 ``start_ns``/``end_ns``, end exclusive, any other columns).
        b: Intervals to remove (``b_by`` columns, start_ns, end_ns).
        by: Group columns of ``a``.
        b_by: Group columns of ``b``, a subset of ``by`` (default ``by``); a null key is a group
            of its own.

    Returns:
        ``a``'s columns, one row per piece (ns), unordered; intervals of ``a`` of zero length and
        those ``b`` covers entirely give none.
    """
    b_by = by if b_by is None else b_by
    a = a.filter(pl.col("end_ns") > pl.col("start_ns"))
    if a.is_empty():
        return a
    # One dense id per b_by group of ``a``; b's groups that ``a`` lacks remove nothing.
    keys = a.select(b_by).unique().with_row_index("_g")
    ag = a.join(keys, on=b_by, how="left", nulls_equal=True)
    mb = merge(
        b.select(*b_by, "start_ns", "end_ns").join(keys, on=b_by, how="inner", nulls_equal=True), ["_g"]
    )
    gaps = complement(mb, "_g", keys.select("_g"))
    return _intersect_runs(ag, gaps, "_g").drop("_g").select(a.columns)


def tile(df: pl.DataFrame, by: list[str], order: list[str] | None = None) -> pl.DataFrame:
    """Disjoint pieces that tile the union of each group's intervals, each keeping the other
    columns of the interval it comes from.

    In start order (ties broken by ``order``, then end, longest first, then the other plain columns in
    ascending order, so the result is the same whatever the input's row order), each interval keeps the part
    of it past the running max end of its group's earlier intervals, ``[max(start, that end), end)``
    when that is not empty (the sweep of :func:`union_ns`): an interval nested in an earlier one
    gives nothing, one overlapping an earlier one gives its tail. One sort and one pass.

    Args:
        df: Intervals (``by`` columns, int64 ``start_ns``/``end_ns``, end exclusive, any other columns).
        by: Group columns.
        order: Columns that decide, among intervals starting at the same time, which comes first
            (and so keeps the common part), ascending.

    Returns:
        ``df``'s columns, one row per piece (ns), disjoint and sorted by ``by`` and start within
        each group; their lengths add up to ``|∪ df|`` of the group.
    """
    s = df.filter(pl.col("end_ns") > pl.col("start_ns"))
    keys = [*by, "start_ns", *(order or []), "end_ns"]
    # then every other plain column, so that equal intervals come in one order on every run (the
    # rows' order from a parallel scan varies, and which of two equal intervals keeps the common
    # part names the piece)
    rest = [
        c for c, t in s.schema.items() if c not in keys and (t.is_numeric() or t in (pl.Utf8, pl.Boolean))
    ]
    if not _strictly_sorted(s, [*by, "start_ns"]):  # else no two rows tie on the keys: already in their order
        s = s.sort(
            [*keys, *rest],
            descending=[False] * (len(keys) - 1) + [True] + [False] * len(rest),
            nulls_last=True,
        )
    before = pl.col("end_ns").cum_max().shift(1)
    before = (before.over(by) if by else before).fill_null(_LO)
    return s.with_columns(pl.max_horizontal("start_ns", before).alias("start_ns")).filter(
        pl.col("end_ns") > pl.col("start_ns")
    )


_LO, _HI = -(2**63), 2**63 - 1  # unbounded ends of a complement (int64 ns)


def complement(m: pl.DataFrame, g: str, groups: pl.DataFrame) -> pl.DataFrame:
    """The gaps of merged intervals per group: (-inf, s0), [e0, s1), ..., [e_last, +inf).

    Args:
        m: Merged intervals (:func:`merge` by ``[g]``): columns ``g``, start_ns, end_ns (ns),
            disjoint, not touching and sorted within each group.
        g: Name of the group column.
        groups: Every group to return (column ``g``); one without intervals is one unbounded gap.

    Returns:
        Frame with ``g``, start_ns, end_ns (int64 ns; -2**63 and 2**63-1 stand for the unbounded
        ends), sorted by ``g`` then start, plus ``_c``, the row's position (0, 1, ...).
    """
    first = groups.join(m.group_by(g).agg(pl.col("start_ns").min().alias("end_ns")), on=g, how="left")
    head = first.select(g, pl.lit(_LO, pl.Int64).alias("start_ns"), pl.col("end_ns").fill_null(_HI))
    tail = m.select(
        g,
        pl.col("end_ns").alias("start_ns"),
        pl.col("start_ns").shift(-1).over(g).fill_null(_HI).alias("end_ns"),
    )
    out = pl.concat([head, tail.cast(head.schema)]).filter(pl.col("end_ns") > pl.col("start_ns"))
    return out.sort(g, "start_ns").with_row_index("_c").with_columns(pl.col("_c").cast(pl.Int64))


def cut(a: pl.DataFrame, runs: pl.DataFrame, g: str, carry: list[str]) -> pl.DataFrame:
    """Each interval of ``a`` intersected with the intervals ``runs`` of its group (e.g. a rank's
    step windows), the run's ``carry`` columns added to each piece.

    Args:
        a: Intervals (``g``, int64 ``start_ns``/``end_ns``, any other columns).
        runs: Disjoint intervals per ``g`` (``g``, start_ns, end_ns and the ``carry`` columns);
            those of zero length are left out.
        g: Group column of both (one column).
        carry: Columns of ``runs`` to copy onto the pieces.

    Returns:
        ``a``'s columns (start_ns, end_ns replaced by the pieces, ns) plus ``carry``, unordered;
        parts of ``a`` outside every run are dropped. Linear after sorts (two as-of joins).
    """
    r = (
        runs.filter(pl.col("end_ns") > pl.col("start_ns"))
        .sort(g, "start_ns")
        .with_row_index("_c")
        .with_columns(pl.col("_c").cast(pl.Int64))
    )
    if a.is_empty() or r.is_empty():
        return a.head(0).with_columns(*(pl.lit(None, runs.schema[c]).alias(c) for c in carry))
    pieces = _intersect_runs(a, r.select(g, "start_ns", "end_ns", "_c"), g, keep="_pos")
    return pieces.join(r.select(pl.col("_c").alias("_pos"), *carry), on="_pos", how="left").drop("_pos")


def _intersect_runs(a: pl.DataFrame, runs: pl.DataFrame, g: str, keep: str | None = None) -> pl.DataFrame:
    """Each interval of ``a`` intersected with the disjoint sorted intervals ``runs`` of its group.

    The runs an interval [s, e) meets are a contiguous range of positions ``_c``
    (:func:`overlapped_range`); each position in between gives one non-empty piece.

    Args:
        a: Intervals with ``g``, start_ns, end_ns and any other columns (kept on the pieces).
        runs: Output of :func:`complement` (or any disjoint intervals sorted within ``g``, ``_c``
            their positions).
        g: Group column shared by both.
        keep: Name of a column to hold each piece's run position ``_c`` (None: not kept).

    Returns:
        ``a``'s columns with start_ns, end_ns replaced by the pieces (ns), unordered.
    """
    both = overlapped_range(a, runs, [g], "_c")
    pairs = (
        both.filter(pl.col("_i0") <= pl.col("_i1"))
        .with_columns(pl.int_ranges("_i0", pl.col("_i1") + 1, dtype=pl.Int64).alias("_c"))
        .drop("_i0", "_i1")
        .explode("_c")
    )
    bounds = runs.select("_c", pl.col("start_ns").alias("_rs"), pl.col("end_ns").alias("_re"))
    if runs.select((pl.col("_c") == pl.int_range(pl.len(), dtype=pl.Int64)).all()).item():
        # positions numbered as rows (complement's, cut's): each piece's run is taken by its row, no join
        pairs = pairs.with_columns(bounds.select("_rs", "_re")[pairs.get_column("_c")])
    else:
        pairs = pairs.join(bounds, on="_c")
    out = pairs.with_columns(
        pl.max_horizontal("start_ns", "_rs").alias("start_ns"),
        pl.min_horizontal("end_ns", "_re").alias("end_ns"),
    ).drop("_rs", "_re")
    return out.rename({"_c": keep}) if keep else out.drop("_c")


def overlapped_range(a: pl.DataFrame, b: pl.DataFrame, by: list[str], pos: str) -> pl.DataFrame:
    """Which intervals of ``b`` each interval of ``a`` overlaps, as a range of ``b``'s positions.

    ``b``'s intervals are disjoint within ``by`` and numbered in time order by ``pos``, so those an
    interval [s, e) of ``a`` meets are a contiguous range: from the first ending after s to the last
    starting before e (two as-of joins on the sorted bounds: linear after sorts).

    Args:
        a: Intervals with ``by``, start_ns, end_ns (ns) and any other columns (kept).
        b: Disjoint intervals with ``by``, start_ns, end_ns (ns) and ``pos`` (an integer, increasing
            with time within ``by``).
        by: Group columns of both.
        pos: ``b``'s position column.

    Returns:
        ``a``'s rows (in end_ns order) with ``_i0`` and ``_i1``: the first and last position of the
        range; it is empty where ``_i0 > _i1`` or either is null (none ends after s, none starts
        before e).
    """

    def nearest(df: pl.DataFrame, on: str, b_on: str, alias: str, strategy: AsofJoinStrategy) -> pl.DataFrame:
        # each row's nearest b bound strictly after (forward) or before (backward) its own, and its position
        bounds = b.select(*by, pl.col(b_on).alias("_b"), pl.col(pos).alias(alias)).sort("_b")
        return (
            df.sort(on)
            .join_asof(
                bounds,
                left_on=on,
                right_on="_b",
                by=by,
                strategy=strategy,
                allow_exact_matches=False,
                check_sortedness=False,
            )
            .drop("_b")
        )

    return nearest(
        nearest(a, "start_ns", "end_ns", "_i0", "forward"), "end_ns", "start_ns", "_i1", "backward"
    )


def _strictly_sorted(df: pl.DataFrame, keys: list[str]) -> bool:
    """Whether ``df``'s rows increase strictly by ``keys`` (ascending, lexicographic) and no key is null:
    then any sort whose first keys are ``keys`` leaves them in this order (a rank's compute rows of
    ``traceprof.engine.activity``, that :func:`tile` need not sort again by every column). One pass."""
    if df.select(pl.any_horizontal(pl.col(keys).is_null().any())).item():
        return False
    if df.height < 2:
        return True
    after, _ = _after(keys)
    return bool(df.select(after.slice(1).all()).item())


def sorting(keys: list[pl.Series]) -> pl.Series | None:
    """The row positions (UInt32/Int64 Series) that sort rows by the columns ``keys`` (each of the
    rows' length; ascending, lexicographic, nulls last, rows that tie on every key in the order
    given), or None when the rows are in that order already (or there are fewer than two, or no
    keys): one pass to check (:func:`sorted_by`), then a stable sort, which on rows nearly in order
    costs little more than the pass (numpy's timsort, key by key from the last; polars' where a key
    holds nulls). Rows read from the store come nearly sorted (stored order): a full sort on read
    (DuckDB's ORDER BY, a polars sort) pays for disorder that is mostly not there."""
    import numpy as np

    if not keys or len(keys[0]) < 2:
        return None
    df = pl.DataFrame([k.alias(f"_k{i}") for i, k in enumerate(keys)])  # names of their own: no clash
    if sorted_by(df, df.columns, nulls_last=True):
        return None
    if any(k.null_count() for k in keys):
        return df.select(pl.arg_sort_by(df.columns, nulls_last=True, maintain_order=True)).to_series()
    return pl.Series(np.lexsort([k.to_numpy() for k in reversed(keys)]))


def sorted_by(df: pl.DataFrame, keys: list[str], nulls_last: bool = False) -> bool:
    """Whether ``df`` is sorted by ``keys`` (ascending, lexicographic, nulls first unless
    ``nulls_last``): one linear pass, so that a frame sorted once (``traceprof.engine.activity`` is
    sorted by rank and start) is not sorted again."""
    if df.height < 2:
        return True
    after, tie = _after(keys, nulls_last)
    return bool(df.select((after | tie).slice(1).all()).item())


def _after(keys: list[str], nulls_last: bool = False) -> tuple[pl.Expr, pl.Expr]:
    """Per row: whether it comes after the row before it by ``keys`` (ascending, lexicographic,
    nulls first unless ``nulls_last``), and whether it ties with it on every key (false and true on
    the first row)."""
    after: pl.Expr = pl.lit(False)
    tie: pl.Expr = pl.lit(True)
    for k in keys:
        c, p = pl.col(k), pl.col(k).shift(1)
        null_after = (c.is_null() & p.is_not_null()) if nulls_last else (p.is_null() & c.is_not_null())
        gt = (c > p).fill_null(False) | null_after
        eq = (c == p).fill_null(False) | (p.is_null() & c.is_null())
        after, tie = after | (tie & gt), tie & eq
    return after, tie


def class_measures(act: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """Union lengths per group of an activity frame (see ``traceprof.engine.activity``).

    One sweep over the rows sorted by rank and start (sorted here only when they are not
    already), for every class and every grouping at once: in start order, an interval adds to
    its set's union the part of it past the latest end of the set's earlier intervals in the
    group (all of those started before it, so what they cover from its start on is one piece
    up to that end): ``|∪| = Σ max(0, end - max(start, running max end before it))``. No
    interval is merged or copied per class. Time O(n log n) for the sort (O(n) when sorted),
    memory O(n).

    Args:
        act: Frame with rank (int), class (str), start_ns, end_ns (int64 ns) and the ``by`` columns.
        by: Group columns, starting with ``"rank"`` (e.g. ``["rank"]``, ``["rank", "step"]``;
            a null key is a group of its own).

    Returns:
        Frame with ``by`` plus first_ns, last_ns (window bounds), window_ns = last - first,
        busy_ns = |∪ all|, compute_ns = |∪ compute|, comm_ns = |∪ comm|, overlap_ns =
        |comm ∩ compute| (all ns, int64), sorted by ``by``.

    Raises:
        ValueError: ``by`` does not start with ``"rank"``.
    """
    if not by or by[0] != "rank":
        raise ValueError(f"class_measures: by must start with 'rank', got {by}")
    pieces = rank_chunks(act, by)
    if pieces is not None:
        return _concat([class_measures(p, by) for p in pieces])
    act = act.select(*by, "class", "start_ns", "end_ns")
    if not sorted_by(act, ["rank", "start_ns"]):
        act = act.sort("rank", "start_ns")  # a group's rows then lie in start order, whatever ``by``
    cls = pl.col("class")
    comp, comm = cls == "compute", cls == "comm"
    act, over = _packed_key(act, by)
    parts = act.select(
        *by,
        "start_ns",
        "end_ns",
        _added(over).alias("busy_ns"),
        _added(over, mask=comp).alias("compute_ns"),
        _added(over, mask=comm).alias("comm_ns"),
        _added(over, mask=comp | comm).alias("_cc_ns"),
    )
    out = parts.group_by(by).agg(
        pl.col("start_ns").min().alias("first_ns"),
        pl.col("end_ns").max().alias("last_ns"),
        *(pl.col(c).sum() for c in ("busy_ns", "compute_ns", "comm_ns", "_cc_ns")),
    )
    return out.select(
        *by,
        "first_ns",
        "last_ns",
        (pl.col("last_ns") - pl.col("first_ns")).alias("window_ns"),
        *(pl.col(c).cast(pl.Int64) for c in ("busy_ns", "compute_ns", "comm_ns")),
        (pl.col("comm_ns") + pl.col("compute_ns") - pl.col("_cc_ns")).cast(pl.Int64).alias("overlap_ns"),
    ).sort(by)
