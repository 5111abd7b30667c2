"""Interval algebra (``traceprof.engine.intervals``) against a naive reference on random intervals.

The reference works on a grid of whole ns: a group's set is the set of integer instants t with
start <= t < end for some interval, so union, difference and measure are plain set operations.
Random small intervals (many overlapping, touching, empty and nested ones, null steps) exercise
every boundary case; the fast versions must return exactly the same maximal intervals.
"""

from __future__ import annotations

import random

import polars as pl
import pytest

from traceprof.engine.intervals import (
    class_measures,
    concat_taking,
    merge,
    overlapped_range,
    sorting,
    subtract,
    union_ns,
)

SCHEMA = {"rank": pl.Int64, "step": pl.Int64, "class": pl.Utf8, "start_ns": pl.Int64, "end_ns": pl.Int64}


def _random(rng: random.Random, n: int) -> pl.DataFrame:
    rows = []
    for _ in range(n):
        s = rng.randint(0, 120)
        rows.append(
            {
                "rank": rng.randint(0, 2),
                "step": rng.choice([None, 0, 1, 2, 3]),
                "class": rng.choice(["comm", "compute", "memory"]),
                "start_ns": s,
                "end_ns": s + rng.choice([0, 1, 2, 5, 10, 30]),
            }
        )
    return pl.DataFrame(rows, schema=SCHEMA)


def _points(df: pl.DataFrame, by: list[str]) -> dict[tuple, set[int]]:
    out: dict[tuple, set[int]] = {}
    for r in df.iter_rows(named=True):
        out.setdefault(tuple(r[c] for c in by), set()).update(range(r["start_ns"], r["end_ns"]))
    return out


def _runs(points: set[int]) -> list[tuple[int, int]]:
    """Maximal [start, end) runs of a set of integer instants."""
    out: list[tuple[int, int]] = []
    for t in sorted(points):
        if out and out[-1][1] == t:
            out[-1] = (out[-1][0], t + 1)
        else:
            out.append((t, t + 1))
    return out


def _as_rows(groups: dict[tuple, set[int]], by: list[str]) -> list[tuple]:
    return sorted(
        ((*k, s, e) for k, p in groups.items() for s, e in _runs(p)),
        key=lambda r: tuple((x is not None, x) for x in r),
    )


def _rows(df: pl.DataFrame, by: list[str]) -> list[tuple]:
    return sorted(
        df.select(*by, "start_ns", "end_ns").rows(), key=lambda r: tuple((x is not None, x) for x in r)
    )


@pytest.mark.parametrize("seed", range(40))
def test_merge_and_union_match_reference(seed: int) -> None:
    rng = random.Random(seed)
    a = _random(rng, rng.randint(0, 60))
    for by in (["rank"], ["rank", "step"]):
        ref = _points(a, by)
        assert _rows(merge(a, by), by) == _as_rows(ref, by)
        got = {tuple(r[:-1]): r[-1] for r in union_ns(a, by, "u").select(*by, "u").rows()}
        assert {k: v for k, v in got.items() if v} == {k: len(p) for k, p in ref.items() if p}


@pytest.mark.parametrize("seed", range(60))
def test_subtract_matches_reference(seed: int) -> None:
    rng = random.Random(seed)
    a, b = _random(rng, rng.randint(0, 50)), _random(rng, rng.randint(0, 50))
    for by, b_by in (
        (["rank", "step"], ["rank"]),
        (["rank"], ["rank"]),
        (["rank", "step"], ["rank", "step"]),
    ):
        pa, pb = _points(a, by), _points(b, b_by)
        ref = {k: p - pb.get(tuple(k[by.index(c)] for c in b_by), set()) for k, p in pa.items()}
        assert _rows(subtract(a, b, by, b_by), by) == _as_rows(ref, by), (by, b_by)


def test_subtract_per_step_minus_rank_wide() -> None:
    # Step 0's comm [0, 50) and step 1's comm [40, 100) minus the rank's compute [10, 20) and [45, 60)
    # (the latter launched in step 1, yet it hides step 0's comm too): step 0 keeps [0, 10) [20, 45),
    # step 1 keeps [40, 45) [60, 100).
    a = pl.DataFrame({"rank": [0, 0], "step": [0, 1], "start_ns": [0, 40], "end_ns": [50, 100]})
    b = pl.DataFrame({"rank": [0, 0], "step": [0, 1], "start_ns": [10, 45], "end_ns": [20, 60]})
    got = subtract(a, b, ["rank", "step"], ["rank"]).rows()
    assert got == [(0, 0, 0, 10), (0, 0, 20, 45), (0, 1, 40, 45), (0, 1, 60, 100)]


@pytest.mark.parametrize("seed", range(30))
def test_class_measures_match_reference(seed: int) -> None:
    rng = random.Random(seed)
    act = _random(rng, rng.randint(1, 60)).filter(pl.col("end_ns") > pl.col("start_ns"))
    if act.is_empty():
        return
    by = ["rank", "step"]
    got = {
        tuple(r[:2]): r[2:]
        for r in class_measures(act, by)
        .select(*by, "window_ns", "busy_ns", "compute_ns", "comm_ns", "overlap_ns")
        .rows()
    }
    for key, part in act.group_by(by):
        every = _points(part, by)[tuple(key)]
        comp = _points(part.filter(pl.col("class") == "compute"), by).get(tuple(key), set())
        comm = _points(part.filter(pl.col("class") == "comm"), by).get(tuple(key), set())
        window = part["end_ns"].max() - part["start_ns"].min()
        assert got[tuple(key)] == (window, len(every), len(comp), len(comm), len(comp & comm))


def test_tile_gives_the_same_pieces_whatever_the_row_order() -> None:
    # Two copies over the same [10, 20) ns on one rank, and one [15, 30): the copy that keeps the
    # common part is the first in (start, end desc, then name): "Memcpy DtoD" < "Memcpy HtoD", so DtoD
    # keeps [10, 20) whole, HtoD gives nothing, [15, 30) keeps its tail [20, 30). Before, the tie was
    # broken by the input's row order (a parallel scan's), and critical_path's path named either copy.
    from traceprof.engine.intervals import tile

    rows = [(0, 10, 20, "Memcpy HtoD"), (0, 10, 20, "Memcpy DtoD"), (0, 15, 30, "K")]
    want = [(0, 10, 20, "Memcpy DtoD"), (0, 20, 30, "K")]
    for order in (rows, rows[::-1], [rows[1], rows[2], rows[0]]):
        df = pl.DataFrame(order, schema=["rank", "start_ns", "end_ns", "name"], orient="row")
        assert tile(df, ["rank"]).rows() == want


@pytest.mark.parametrize("seed", range(5))
def test_concat_taking_is_the_one_chunk_concat(seed: int) -> None:
    """Parts of random sizes (empty ones too; nulls, strings, several chunks each; a column null in
    every part, one null in some): the frame of ``pl.concat(parts, rechunk=True)``, in one chunk,
    and the parts let go of (no columns left)."""
    rng = random.Random(seed)
    parts = []
    for _ in range(rng.randint(1, 6)):
        n = rng.choice([0, 1, 5, 40])
        a, b = _random(rng, n), _random(rng, rng.randint(0, 3))
        part = pl.concat([a, b], rechunk=False)  # two chunks
        some = pl.lit(rng.choice([None, 7]), pl.Int32)
        parts.append(part.with_columns(pl.lit(None, pl.Int64).alias("none"), some.alias("some")))
    want = pl.concat(parts, rechunk=True)
    taken = list(parts)
    got = concat_taking(taken)
    assert got.schema == want.schema and got.equals(want)
    assert got.n_chunks("all") == [1] * got.width
    assert all(p.width == 0 for p in taken)
    assert got["none"].null_count() == got.height
    assert all(p.width == 7 for p in parts)  # the frames given are not changed, only the list


def test_strictly_sorted_by_hand() -> None:
    from traceprof.engine.intervals import _strictly_sorted

    df = pl.DataFrame({"rank": [0, 0, 1, 1], "start_ns": [5, 7, 1, 2]})
    assert _strictly_sorted(df, ["rank", "start_ns"])
    assert not _strictly_sorted(
        df.with_columns(pl.Series("start_ns", [5, 5, 1, 2])), ["rank", "start_ns"]
    )  # a tie
    assert not _strictly_sorted(df.reverse(), ["rank", "start_ns"])
    assert not _strictly_sorted(df.with_columns(pl.Series("rank", [0, 0, 1, None])), ["rank", "start_ns"])
    assert _strictly_sorted(df.head(1), ["rank", "start_ns"]) and _strictly_sorted(df.head(0), ["rank"])


@pytest.mark.parametrize("seed", range(8))
def test_tile_of_rows_in_start_order_is_the_tile_of_any_order(seed: int) -> None:
    # rows in (rank, start) order, no two alike there (a rank's compute rows of the activity): tile
    # leaves them in that order, unsorted; the pieces are those of the same rows in any order
    from traceprof.engine.intervals import tile

    rng = random.Random(seed)
    rows, at = [], {0: 0, 1: 0}
    for r in (0, 0, 0, 1, 1) * 8:
        at[r] += rng.randint(1, 20)
        rows.append((r, at[r], at[r] + rng.choice([0, 3, 30, 100]), rng.choice(["a", "b", None])))
    df = pl.DataFrame(sorted(rows), schema=["rank", "start_ns", "end_ns", "name"], orient="row")
    want = tile(df.sample(fraction=1.0, shuffle=True, seed=seed), ["rank"])
    assert tile(df, ["rank"]).equals(want) and want.height


@pytest.mark.parametrize("numbered", [True, False])
def test_cut_by_hand_with_runs_numbered_as_rows_or_not(numbered: bool) -> None:
    # runs [0, 10) step 1, [10, 20) step 2, [30, 40) step 3; a [5, 35) -> three pieces, b [21, 29)
    # none, c [38, 50) -> [38, 40) of step 3; the run positions by row (cut's) or not (other groups)
    from traceprof.engine.intervals import _intersect_runs, cut

    runs = pl.DataFrame(
        {"rank": [0, 0, 0], "start_ns": [0, 10, 30], "end_ns": [10, 20, 40], "step": [1, 2, 3]}
    )
    a = pl.DataFrame(
        {"rank": [0, 0, 0], "start_ns": [5, 21, 38], "end_ns": [35, 29, 50], "name": ["a", "b", "c"]}
    )
    want = [(0, 5, 10, "a", 1), (0, 10, 20, "a", 2), (0, 30, 35, "a", 3), (0, 38, 40, "c", 3)]
    if numbered:
        assert sorted(cut(a, runs, "rank", ["step"]).rows()) == want
        return
    r = runs.select("rank", "start_ns", "end_ns", (pl.col("step").cast(pl.Int64) + 100).alias("_c"))
    got = _intersect_runs(a, r, "rank", keep="_pos").select(
        "rank", "start_ns", "end_ns", "name", pl.col("_pos") - 100
    )
    assert sorted(got.rows()) == want


def test_overlapped_range_is_the_run_of_positions_an_interval_meets():
    """``overlapped_range`` (gaps' collectives per gap and ``cut``'s pieces, one helper): b = [0, 10),
    [20, 30), [40, 50) at positions 0, 1, 2 on rank 0. By hand: [5, 25) meets 0..1; [10, 20) touches
    both ends only (half-open): 1..0, empty; [31, 39) lies between: 2..1, empty; [45, 60) meets 2..2;
    [55, 60) is after all: no first (null); rank 1 has no b: nulls."""
    b = pl.DataFrame({"rank": [0, 0, 0], "start_ns": [0, 20, 40], "end_ns": [10, 30, 50], "p": [0, 1, 2]})
    a = pl.DataFrame(
        {"rank": [0, 0, 0, 0, 0, 1], "start_ns": [5, 10, 31, 45, 55, 5], "end_ns": [25, 20, 39, 60, 60, 25]}
    )
    got = overlapped_range(a, b, ["rank"], "p").sort("rank", "start_ns")
    assert got.select("_i0", "_i1").rows() == [(0, 1), (1, 0), (2, 1), (2, 2), (None, 2), (None, None)]
    assert got.columns == ["rank", "start_ns", "end_ns", "_i0", "_i1"]


def test_sorting_by_hand() -> None:
    """Positions that sort rows by (rank, start, end), ascending, nulls last, ties in the order
    given; None for rows in order already. By hand: rows (0, 5, 9), (0, 3, 4), (1, 1, 2), (0, 3, 4)
    -> rank 0's (3, 4) at 1 and 3 (a tie: 1 first), then (0, 5, 9) at 0, then rank 1 at 2:
    [1, 3, 0, 2]. With a null rank, (None, 1), (0, 2), (0, 1) -> [2, 1, 0]."""

    def cols(**kw: list[int | None]) -> list[pl.Series]:
        return [pl.Series(k, v, dtype=pl.Int64) for k, v in kw.items()]

    at = sorting(cols(rank=[0, 0, 1, 0], start=[5, 3, 1, 3], end=[9, 4, 2, 4]))
    assert at is not None and at.to_list() == [1, 3, 0, 2]
    assert sorting(cols(rank=[0, 0, 0, 1], start=[3, 3, 5, 1], end=[4, 4, 9, 2])) is None  # in order, a tie
    assert sorting(cols(rank=[0], start=[1], end=[2])) is None
    at = sorting(cols(rank=[None, 0, 0], start=[1, 2, 1]))
    assert at is not None and at.to_list() == [2, 1, 0]
    assert sorting(cols(rank=[0, 1, None], start=[1, 2, 3])) is None  # in order: the null last


@pytest.mark.parametrize("seed", range(5))
def test_sorting_is_polars_stable_sort(seed: int) -> None:
    # rows nearly in order (a few swapped) and in random order, keys with many ties: the rows
    # gathered at the positions are polars' stable sort of them (nulls last)
    rng = random.Random(seed)
    n = 500
    start = sorted(rng.randrange(50) for _ in range(n))
    for _ in range(20):
        i = rng.randrange(n - 1)
        start[i], start[i + 1] = start[i + 1], start[i]
    for order in (start, rng.sample(start, n)):
        df = pl.DataFrame(
            {
                "rank": [rng.randrange(3) for _ in range(n)],
                "start": order,
                "end": [rng.randrange(5) for _ in range(n)],
            }
        ).with_row_index("i")
        at = sorting([df["rank"], df["start"], df["end"]])
        got = df if at is None else df[at]
        assert got.equals(df.sort("rank", "start", "end", maintain_order=True, nulls_last=True))


def test_sorted_by_nulls_last_is_the_check_sorting_makes() -> None:
    """``sorted_by(..., nulls_last=True)`` is the one check :func:`sorting` makes (no loop of its
    own). By hand: rank [0, 1, None] with start [1, 2, 3] is in order with nulls last (the null
    row last), not with nulls first; [None, 0] the reverse; rank [0, 0] start [2, 1] in neither."""
    from traceprof.engine.intervals import sorted_by

    tail = pl.DataFrame({"rank": [0, 1, None], "start": [1, 2, 3]})
    head = pl.DataFrame({"rank": [None, 0], "start": [5, 1]})
    down = pl.DataFrame({"rank": [0, 0], "start": [2, 1]})
    assert sorted_by(tail, ["rank", "start"], nulls_last=True) and not sorted_by(tail, ["rank", "start"])
    assert sorted_by(head, ["rank", "start"]) and not sorted_by(head, ["rank", "start"], nulls_last=True)
    assert not sorted_by(down, ["rank", "start"]) and not sorted_by(down, ["rank", "start"], nulls_last=True)
    # sorting agrees: None for rows in order (nulls last), positions otherwise
    assert sorting([tail["rank"], tail["start"]]) is None
    at = sorting([head["rank"], head["start"]])
    assert at is not None and at.to_list() == [1, 0]
