"""Shortcuts of the activity query (``traceprof.engine.activity``) and of the transient
(``traceprof.engine.arrivals``) that must not change a result: a run of GPU ranks alone reads its GPU
rows without the CPU branch (which reads every cpu_op) and gets the frame the whole query gives; a
run with fewer than three collectives seen by two or more ranks has no transient, found without
matching arrivals to steps; an analysis that needs a few of the activity's columns (idle) reads them
alone, or takes them from the frame its session already holds."""

from __future__ import annotations

import polars as pl
import pytest

import traceprof
from tests.conftest import SAMPLES, corpus
from traceprof.engine import activity as act
from traceprof.engine.analysis import shared_done
from traceprof.engine.arrivals import comm_items, run_transient, transient
from traceprof.ingest.ingest import ingest
from traceprof.storage.store import Store


@pytest.mark.parametrize("rel", ["hta/df_index_resolver", "hta/trace_filter"])
def test_gpu_ranks_alone_read_as_the_whole_query_reads_them(store, rel, monkeypatch):
    ingest(store, [corpus(rel)], jobs=1)
    run_id = store.resolve_run(None)
    assert not act._cpu_ranks(store, run_id)  # every rank has kernels
    for detail in (False, True):
        lean = act._activity(store, run_id, hta=False, detail=detail)
        with monkeypatch.context() as m:
            m.setattr(act, "_cpu_ranks", lambda *_: True)  # the whole query, CPU branch included
            whole = act._activity(store, run_id, hta=False, detail=detail)
        assert lean.height > 1000 and lean.schema == whole.schema
        # the same rows (sorted by rank, start, end both: rows that tie on those in any order)
        assert lean.sort(lean.columns).equals(whole.sort(whole.columns))


def test_cpu_only_ranks_read_their_training_thread(store):
    # sample 'normal': 4 gloo ranks, no GPU: the CPU branch runs and gives their ops
    ingest(store, [SAMPLES / "normal"], jobs=1)
    run_id = store.resolve_run(None)
    assert act._cpu_ranks(store, run_id)
    frame = act.activity(store, run_id)
    assert frame.height > 0 and set(frame["device_kind"]) == {"cpu"}
    assert sorted(set(frame["rank"])) == [0, 1, 2, 3]


@pytest.mark.parametrize("source", ["sample", "corpus"])
def test_transient_shortcut_gives_the_full_detection(store, source):
    # 'normal': 4 ranks, 12 instances of all four (the full detection runs: no transient there);
    # df_index_resolver: one rank, no instance of two ranks (the shortcut). Both as computed in full.
    ingest(store, [SAMPLES / "normal" if source == "sample" else corpus("hta/df_index_resolver")], jobs=1)
    run_id = store.resolve_run(None)
    items, _ = comm_items(store, run_id)
    assert run_transient(store, run_id) == transient(items, store, run_id)
    many = store.sql(
        "SELECT count(*) FROM collective_instances WHERE run_id = ? AND n_ranks >= 2", [run_id]
    ).item()
    assert (many >= 3) == (source == "sample")


@pytest.fixture(scope="module")
def corpus_db(tmp_path_factory):
    path = tmp_path_factory.mktemp("activity") / "a.duckdb"
    with Store(path) as s:
        ingest(s, [corpus("hta/df_index_resolver")], jobs=1)
    return path


def test_a_few_columns_read_alone_or_taken_from_the_shared_frame(corpus_db):
    # idle reads 9 of the activity's 15 columns: alone when it runs first in a session (the query
    # reads no name nor launch thread), from the frame the session holds when another analysis read
    # it first (the report): the same result both ways, and as a session that shares nothing gives.
    results = []
    for first in ([], ["temporal"]):  # idle alone first; idle after temporal (the detail frame held)
        with traceprof.open(corpus_db) as s:
            for name in first:
                s.analyze(name)
            run_id = s.store.resolve_run(None)
            assert shared_done(act._activity, s.store, run_id, hta=False, detail=True) == bool(first)
            results.append(s.analyze("idle"))
    with traceprof.open(corpus_db, memo=False) as s:  # nothing shared: every call reads for itself
        results.append(s.analyze("idle"))
    assert results[0].frame.height > 0
    for r in results[1:]:
        assert r.frame.equals(results[0].frame) and r.ranks.equals(results[0].ranks)
        assert r.notes == results[0].notes


def test_columns_must_hold_what_the_rows_are_sorted_and_cut_by(store):
    with pytest.raises(ValueError, match="rank, start_ns, end_ns and step"):
        act.activity(store, 1, columns=("rank", "start_ns", "end_ns"))


def test_cpu_ranks_asked_once_per_run_in_a_session(corpus_db, monkeypatch):
    # the report's activity frame and its timeline's step rows both build the activity query: in a
    # session the run's scan for ranks without GPU rows runs once; without one, each call scans
    asked = []
    sql = Store.sql

    def spy(self, query, params=None):
        asked.append("HAVING NOT bool_or" in query)
        return sql(self, query, params)

    monkeypatch.setattr(Store, "sql", spy)
    with traceprof.open(corpus_db) as s:
        run_id = s.store.resolve_run(None)
        frame = act.activity(s.store, run_id)
        step = int(frame["step"].drop_nulls()[0])
        rows = act.step_activity(s.store, run_id, step)
    assert rows.height > 0 and sum(asked) == 1
    asked.clear()
    with traceprof.open(corpus_db, memo=False) as s:
        act.activity(s.store, run_id)
        act.step_activity(s.store, run_id, step)
    assert sum(asked) == 2


def test_exposed_comm_from_the_compute_the_caller_holds():
    # rank 0: comm [0, 10) and [20, 30); compute [5, 8), [6, 12), [25, 40) -> merged [5, 12), [25, 40);
    # exposed: [0, 5) and [20, 25). Rank 1: comm [0, 4), no compute: all of it exposed.
    frame = pl.DataFrame(
        {
            "rank": [0, 0, 0, 0, 0, 1],
            "class": ["comm", "compute", "compute", "comm", "compute", "comm"],
            "start_ns": [0, 5, 6, 20, 25, 0],
            "end_ns": [10, 8, 12, 30, 40, 4],
            "step": [1, 1, 1, 1, 1, 1],
        }
    )
    merged = act.compute_merged(frame)
    assert merged.rows() == [(0, 5, 12), (0, 25, 40)]
    want = [(0, 0, 5), (0, 20, 25), (1, 0, 4)]
    assert act.exposed_comm(frame, ["rank"]).rows() == want
    assert act.exposed_comm(frame, ["rank"], merged).rows() == want
    assert act.exposed_comm(frame, ["rank"], act.compute_rows(frame)).rows() == want


@pytest.mark.parametrize("key_span", [2**62, 0])  # one integer key; a join (ids too far apart)
def test_gpu_rows_launch_call_is_the_first_of_their_trace_and_correlation(tmp_path, monkeypatch, key_span):
    # two ranks reuse correlation id 5; on rank 0 two runtime calls carry it (the earlier, at 10 us on
    # thread 3, is the launch) and id 6 has none
    from tests.builders import BASE, kernel, launch, write_rank

    monkeypatch.setattr(act, "_KEY_SPAN", key_span)
    folder = tmp_path / "run"
    write_rank(
        folder / "r0.json",
        [launch(12, 5, tid=4), launch(10, 5, tid=3), kernel("k5", 7, 30, 5, 5), kernel("k6", 7, 40, 5, 6)],
        rank=0,
    )
    write_rank(folder / "r1.json", [launch(20, 5, tid=9), kernel("k5", 7, 50, 5, 5)], rank=1)
    with Store(tmp_path / "s.duckdb") as s:
        ingest(s, [folder], jobs=1)
        run_id = s.resolve_run(None)
        for cols in (None, ("rank", "start_ns", "end_ns", "step", "name", "launch_tid", "launch_ts_ns")):
            got = act._activity(s, run_id, hta=False, detail=True, columns=cols)
            assert got.select("rank", "name", "launch_tid", "launch_ts_ns").rows() == [
                (0, "k5", "3", BASE + 10_000),
                (0, "k6", None, None),
                (1, "k5", "9", BASE + 20_000),
            ]
            assert got.columns == list(cols or (*act.ACTIVITY_COLUMNS, *act.DETAIL_COLUMNS))
