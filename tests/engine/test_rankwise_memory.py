"""Bounded-memory paths of large runs give the frames of the straightforward ones, exactly.

- ``traceprof.engine.intervals``: a frame sorted by rank and larger than ``CHUNK_ROWS`` is worked
  in slices of whole ranks (``rank_chunks``). Here ``CHUNK_ROWS`` is made tiny, so that small random
  frames and sample runs take that path, and every result is compared with the one-piece path.
- ``traceprof.engine.activity``: the activity of a run of several ranks is fetched rank by rank,
  text columns built from their distinct values (``_by_rank``); compared with the one query
  sorted by polars that it replaces.
"""

from __future__ import annotations

import random

import polars as pl
import pytest

from tests.conftest import analyze, corpus, sample_run
from traceprof.core.errors import TraceprofError
from traceprof.engine import activity as act_mod
from traceprof.engine import intervals
from traceprof.engine.intervals import class_measures, merge, rank_chunks, subtract, union_ns

SCHEMA = {"rank": pl.Int32, "step": pl.Int32, "class": pl.Utf8, "start_ns": pl.Int64, "end_ns": pl.Int64}


def _random(rng: random.Random, n: int, ranks: int) -> pl.DataFrame:
    """``n`` random intervals over ``ranks`` ranks (overlapping, touching, empty, nested; null steps),
    sorted by rank and start as the activity is."""
    rows = []
    for _ in range(n):
        s = rng.randint(0, 200)
        rows.append(
            {
                "rank": rng.randrange(ranks),
                "step": rng.choice([None, 0, 1, 2]),
                "class": rng.choice(["comm", "compute", "memory"]),
                "start_ns": s,
                "end_ns": s + rng.choice([0, 1, 3, 10, 40]),
            }
        )
    return pl.DataFrame(rows, schema=SCHEMA).sort("rank", "start_ns", "end_ns")


def _both(monkeypatch: pytest.MonkeyPatch, fn):
    """``fn()`` computed in one piece and in pieces of whole ranks (CHUNK_ROWS = 7 rows)."""
    monkeypatch.setattr(intervals, "CHUNK_ROWS", 10**12)
    whole = fn()
    monkeypatch.setattr(intervals, "CHUNK_ROWS", 7)
    return whole, fn()


def _rows(df: pl.DataFrame) -> pl.DataFrame:
    return df.sort(df.columns, nulls_last=True)


def test_rank_chunks_cut_between_ranks_only(monkeypatch: pytest.MonkeyPatch) -> None:
    # ranks 0,0,0,1,1,2,2,2,2,3 with pieces of >= 3 rows: [0,0,0] [1,1,2,2,2,2] [3]
    # (a piece closes once it holds 3 rows at a rank boundary)
    monkeypatch.setattr(intervals, "CHUNK_ROWS", 3)
    df = pl.DataFrame({"rank": [0, 0, 0, 1, 1, 2, 2, 2, 2, 3], "x": list(range(10))})
    parts = rank_chunks(df, ["rank"])
    assert parts is not None
    assert [p["rank"].to_list() for p in parts] == [[0, 0, 0], [1, 1, 2, 2, 2, 2], [3]]
    assert rank_chunks(df, ["step"]) is None  # groups not within ranks
    assert rank_chunks(df.reverse(), ["rank"]) is None  # not sorted by rank
    with_null = df.with_columns(pl.when(pl.col("x") == 0).then(None).otherwise(pl.col("rank")).alias("rank"))
    assert rank_chunks(with_null, ["rank"]) is None


@pytest.mark.parametrize("seed", range(25))
def test_pieces_of_ranks_match_one_piece(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    rng = random.Random(seed)
    a = _random(rng, rng.randint(0, 80), rng.randint(1, 6))
    b = _random(rng, rng.randint(0, 80), rng.randint(1, 6))
    for by in (["rank"], ["rank", "step"]):
        whole, pieces = _both(monkeypatch, lambda by=by: merge(a, by))
        assert pieces.equals(whole)  # sorted by by and start: the same rows in the same order
        whole, pieces = _both(monkeypatch, lambda by=by: union_ns(a, by, "u"))
        assert _rows(pieces).equals(_rows(whole))  # union_ns's rows come in no particular order
        whole, pieces = _both(monkeypatch, lambda by=by: subtract(a, b, by, ["rank"]))
        assert pieces.equals(whole)
        whole, pieces = _both(monkeypatch, lambda by=by: subtract(b, a, by, ["rank"]))
        assert pieces.equals(whole)
        if a.height:
            whole, pieces = _both(monkeypatch, lambda by=by: class_measures(a, by))
            assert pieces.equals(whole)


def _ingest(store, source: str) -> tuple[str, int]:
    """A multi-rank run: a CPU-only sample run (gloo) or HTA's GPU trace_filter (2 ranks)."""
    if source == "straggler_rank2":
        return source, sample_run(store, source)
    from traceprof.ingest.ingest import ingest

    ingest(store, [corpus("hta/trace_filter")], run=source, jobs=1)
    return source, store.resolve_run(source)


def _outcome(store, name: str, run: str):
    try:
        r = analyze(store, name, run)
    except TraceprofError as e:
        return f"{type(e).__name__}: {e}"
    return r.notes, r.frames()


def _assert_same(got, want) -> None:
    """The same error, or the same notes and every frame equal (values, dtypes and row order)."""
    if isinstance(want, str):
        assert got == want
        return
    assert got[0] == want[0]
    for key, frame in want[1].items():
        assert got[1][key].equals(frame), key


@pytest.mark.parametrize("source", ["straggler_rank2", "trace_filter"])
@pytest.mark.parametrize("name", ["temporal", "overlap", "gaps", "idle", "kernels", "parallelism"])
def test_analyses_in_pieces_of_ranks_match(
    monkeypatch: pytest.MonkeyPatch, store, name: str, source: str
) -> None:
    """Multi-rank runs with pieces of 7 rows: every frame and note (or the error) as in one piece."""
    run, _ = _ingest(store, source)
    whole, pieces = _both(monkeypatch, lambda: _outcome(store, name, run))
    _assert_same(pieces, whole)


@pytest.mark.parametrize("group_events", [1, 5_000, 10**12])
@pytest.mark.parametrize("detail", [False, True])
@pytest.mark.parametrize("source", ["straggler_rank2", "trace_filter"])
def test_activity_fetched_by_rank_matches_one_query(
    monkeypatch: pytest.MonkeyPatch, store, detail: bool, source: str, group_events: int
) -> None:
    # groups of ranks of at least 1 event (each rank alone), of 5,000 (two ranks of the sample's
    # ~2,900 each) and of every rank at once: the frame of one query sorted by polars
    monkeypatch.setattr(act_mod, "GROUP_EVENTS", group_events)
    _, run_id = _ingest(store, source)
    ranks = store.sql("SELECT count(DISTINCT rank) AS n FROM traces WHERE run_id = ?", [run_id])["n"][0]
    assert ranks >= 2  # the by-rank path is taken
    by_rank = act_mod._activity(store, run_id, hta=False, detail=detail)
    monkeypatch.setattr(
        act_mod,
        "_by_rank",
        lambda s, r, sql, keep: act_mod._with_lanes(keep(s.sql(sql).sort("rank", "start_ns", "end_ns"))),
    )
    one = act_mod._activity(store, run_id, hta=False, detail=detail)
    assert by_rank.schema == one.schema
    assert by_rank.height > 0
    assert by_rank.equals(one)


@pytest.mark.parametrize("source", ["straggler_rank2", "trace_filter"])
def test_launch_rank_by_rank_matches_whole_run(monkeypatch: pytest.MonkeyPatch, store, source: str) -> None:
    """launch reads and works a run of several ranks one rank at a time: the frames and notes (or
    the error) of one read of the whole run."""
    from traceprof.analyses import launch

    run, run_id = _ingest(store, source)
    assert act_mod.rank_list(store, run_id) is not None  # several ranks: the rank-by-rank path
    by_rank = _outcome(store, "launch", run)
    monkeypatch.setattr(launch, "rank_list", lambda s, r: None)
    whole = _outcome(store, "launch", run)
    _assert_same(by_rank, whole)


@pytest.mark.parametrize("source", ["straggler_rank2", "trace_filter"])
def test_step_activity_is_the_steps_rows_of_activity(store, source: str) -> None:
    """The report's timeline reads one step's activity from the store: every step's rows equal
    those of the run's activity with that step (rows sorted: ties of the sort come in any order)."""
    _, run_id = _ingest(store, source)
    act = act_mod.activity(store, run_id)
    steps = act["step"].drop_nulls().unique().sort().to_list()
    assert steps
    for step in steps:
        one = act_mod.step_activity(store, run_id, step)
        assert one.height > 0
        assert _rows(one).equals(_rows(act.filter(pl.col("step") == step))), step


def test_rank_groups_hold_enough_events(monkeypatch: pytest.MonkeyPatch, store) -> None:
    # straggler_rank2: ranks 0-3; groups close once they hold GROUP_EVENTS events or more
    _, run_id = _ingest(store, "straggler_rank2")
    counts = store.sql(
        "SELECT rank, count(*) AS n FROM events WHERE run_id = ? GROUP BY rank ORDER BY rank", [run_id]
    )
    n = counts["n"].to_list()
    monkeypatch.setattr(act_mod, "GROUP_EVENTS", 1)
    assert act_mod.rank_groups(store, run_id) == [(0, 0), (1, 1), (2, 2), (3, 3)]
    monkeypatch.setattr(act_mod, "GROUP_EVENTS", n[0] + 1)  # rank 0 alone is one short
    assert act_mod.rank_groups(store, run_id) == [(0, 1), (2, 3)]
    monkeypatch.setattr(act_mod, "GROUP_EVENTS", 10**12)
    assert act_mod.rank_groups(store, run_id) == [(0, 3)]


@pytest.mark.parametrize("group_events", [1, 10**12])
def test_transient_left_out_group_by_group_as_of_the_whole_frame(
    monkeypatch: pytest.MonkeyPatch, store, tmp_path, group_events: int
) -> None:
    """The profiler-start transient is cut from each group's rows as they come: the rows of one
    query with the transient cut from all of it (two gloo ranks, rank 1 started 3 s late)."""
    from tests.builders import transient_rank, write_rank
    from traceprof.ingest.ingest import ingest

    for r in (0, 1):
        write_rank(tmp_path / "run" / f"rank{r}.json", transient_rank(r), r)
    ingest(store, [tmp_path / "run"], run="tr")
    run_id = store.resolve_run("tr")
    monkeypatch.setattr(act_mod, "GROUP_EVENTS", group_events)
    by_group = act_mod._activity(store, run_id, hta=False, detail=True)
    monkeypatch.setattr(
        act_mod,
        "_by_rank",
        lambda s, r, sql, keep: act_mod._with_lanes(keep(s.sql(sql).sort("rank", "start_ns", "end_ns"))),
    )
    whole = act_mod._activity(store, run_id, hta=False, detail=True)
    everything = store.sql(act_mod._query(store, run_id, hta=False, detail=True))
    assert 0 < by_group.height < everything.height  # the transient's rows are gone
    assert by_group.equals(whole)


@pytest.mark.parametrize("name", ["temporal", "overlap", "gaps", "idle", "kernels", "parallelism"])
def test_analyses_reading_their_columns_alone_match_the_whole_frame(tmp_path, name: str) -> None:
    """``traceprof analyze`` (one analysis: its columns read alone) gives every frame and note of
    a session that holds the whole detail frame (the report: every analysis takes its columns
    from it)."""
    import traceprof
    from traceprof.ingest.ingest import ingest
    from traceprof.storage.store import Store

    path = tmp_path / "s.duckdb"
    with Store(path) as s:
        ingest(s, [corpus("hta/trace_filter")], run="tf", jobs=1)
    with traceprof.open(path, cache=False, many=False) as s:
        alone = _outcome(s.store, name, "tf")
    with traceprof.open(path, cache=False) as s:
        act_mod.activity(s.store, s.store.resolve_run("tf"), detail=True)  # the whole frame, held
        shared = _outcome(s.store, name, "tf")
    _assert_same(alone, shared)


@pytest.mark.parametrize("source", ["straggler_rank2", "trace_filter"])
def test_rows_of_some_classes_read_alone_match_the_whole_frame(store, tmp_path, source: str) -> None:
    """``classes`` (the replay's compute items read the compute rows alone outside a report): the
    rows of those classes of the whole frame, read alone (a bare store, ``traceprof analyze``) or
    taken from the frame a report holds; rows compared sorted (ties of the sort come in any order)."""
    import traceprof

    _, run_id = _ingest(store, source)
    whole = act_mod.activity(store, run_id, detail=True)
    cols = ("rank", "step", "lane", "name", "start_ns", "end_ns")
    for classes in (("compute",), ("comm", "memory")):
        want = whole.filter(pl.col("class").is_in(list(classes)))
        assert 0 < want.height < whole.height
        got = act_mod.activity(store, run_id, columns=cols, classes=classes)
        assert got.columns == list(cols)
        assert _rows(got).equals(_rows(want.select(cols)))
        assert _rows(act_mod.activity(store, run_id, detail=True, classes=classes)).equals(_rows(want))
    store.close()
    with traceprof.open(store.path, cache=False) as s:  # a report's session: from its one frame
        act_mod.activity(s.store, run_id, detail=True)
        got = act_mod.activity(s.store, run_id, columns=cols, classes=("compute",))
        assert got.equals(whole.filter(pl.col("class") == "compute").select(cols))  # its order


@pytest.mark.parametrize("source", ["straggler_rank2", "trace_filter"])
@pytest.mark.parametrize("name", ["critical_path", "whatif", "stragglers"])
def test_replay_analyses_letting_go_alone_match_the_whole_frame(store, source: str, name: str) -> None:
    """``traceprof analyze`` of the analyses that let go of what they read (the compute rows read
    alone, the items released once the replay graph is built, critical_path's unread columns): every
    frame and note (or the error) of a session that holds the whole frame and every item (the report)."""
    import traceprof

    run, _ = _ingest(store, source)
    store.close()
    with traceprof.open(store.path, cache=False, many=False) as s:
        alone = _outcome(s.store, name, run)
    with traceprof.open(store.path, cache=False) as s:
        shared = _outcome(s.store, name, run)
    _assert_same(alone, shared)
