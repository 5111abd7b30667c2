"""The statements an ingest runs after the insert for what it cannot use (issue 34, lever 4): a run's
traced ranks are read once, and a source's ``settle`` hook runs only for a run that holds a trace of
that source. The notes stay the same (``1 of 2 ranks traced``); the store's rows too
(``scripts/store_rows.py --all`` before and after).
"""

from __future__ import annotations

import dataclasses
import json

from tests._cli_inproc import run
from tests.builders import micro_trace


def _rank0_of_two(tmp_path):
    folder = tmp_path / "job"
    folder.mkdir()
    # rank 0 of a world of 2: the ingest warns that rank 1 was not traced (the ranks were read)
    (folder / "rank0.json").write_text(json.dumps(micro_trace(["aten::mm"], rank=0, world=2)))
    return folder


def test_a_kineto_run_runs_no_settle_hook_of_another_source(tmp_path, monkeypatch):
    """Flight Recorder's and the NCCL profiler plugin's hooks read their own traces' rows alone: a run
    of one Kineto trace calls neither (hand count: 0 calls; before, each was called once and ran its
    queries for nothing). The note on the untraced rank is unchanged."""
    from traceprof.ingest import sources

    called: list[str] = []
    for c in sources.collectors():
        if c.settle is not None:

            def hook(store, run_id, name=c.name, real=c.settle):
                called.append(name)
                return real(store, run_id)

            monkeypatch.setitem(sources._REGISTRY, c.name, dataclasses.replace(c, settle=hook))
    code, _, err = run("ingest", str(_rank0_of_two(tmp_path)), "--db", str(tmp_path / "s.duckdb"))
    assert code == 0, err
    assert "run 'job': 1 of 2 ranks traced" in err
    assert called == []


def test_a_runs_traced_ranks_are_read_once(tmp_path, monkeypatch):
    """The untraced-ranks note and the profiler-gap note share one read of the run's world size and
    traces: one ``SELECT world_size FROM runs`` in the settle step (hand count: one run -> 1; before,
    3: once for the untraced ranks and twice for the profiler gap, all sources then profilers only)."""
    from traceprof.ingest import ingest as ingest_mod

    seen: list[str] = []
    real = ingest_mod._settle_run

    class Counting:
        def __init__(self, con):
            self._con = con

        def execute(self, sql, *args):
            seen.append(" ".join(sql.split()))
            return self._con.execute(sql, *args)

        def __getattr__(self, name):
            return getattr(self._con, name)

    def settle(store, run_id, align):
        con, store.con = store.con, Counting(store.con)
        try:
            return real(store, run_id, align)
        finally:
            store.con = con

    monkeypatch.setattr(ingest_mod, "_settle_run", settle)
    code, _, err = run("ingest", str(_rank0_of_two(tmp_path)), "--db", str(tmp_path / "s.duckdb"))
    assert code == 0, err
    assert "run 'job': 1 of 2 ranks traced" in err
    assert sum(s.startswith("SELECT world_size FROM runs") for s in seen) == 1
