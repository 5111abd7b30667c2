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


def _settle_statements(tmp_path, monkeypatch) -> list[str]:
    """The statements (white space folded) the settle step runs when ingest stores rank 0 of a
    world of 2 (its note on the untraced rank checked)."""
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
    return seen


def test_a_runs_traced_ranks_are_read_once(tmp_path, monkeypatch):
    """The untraced-ranks note and the profiler-gap note share one read of the run's world size and
    traces: one ``SELECT world_size FROM runs`` in the settle step (hand count: one run -> 1; before,
    3: once for the untraced ranks and twice for the profiler gap, all sources then profilers only)."""
    seen = _settle_statements(tmp_path, monkeypatch)
    assert sum(s.startswith("SELECT world_size FROM runs") for s in seen) == 1


def test_the_runs_sources_are_read_with_its_ranks(tmp_path, monkeypatch):
    """The settle hooks' choice (which sources the run holds) comes from the one read of the run's
    traces that counts its ranks (``storage.runs.ranks_held``): one ``SELECT DISTINCT ... FROM traces``
    in the settle step before matching (hand count: 1; before, 2: the ranks', then ``SELECT DISTINCT
    source FROM traces``)."""
    seen = _settle_statements(tmp_path, monkeypatch)
    reads = [s for s in seen if s.startswith("SELECT DISTINCT") and "traces WHERE run_id = ?" in s]
    assert len(reads) == 1, reads


def test_ingest_stats_each_file_once(tmp_path, monkeypatch):
    """``ingest`` stats each file once (its size: the stored-size check, this ingest's copies, whether
    to parse in workers); it statted each new file three times (``f.stat()`` twice in ``ingest``, once
    more in ``_parse_all`` for the size that decides the workers). Hand count: 2 files -> 2 calls of
    ``Path.stat`` from ``traceprof/ingest/ingest.py`` itself (``is_file`` etc. in discovery call it
    from pathlib, not counted)."""
    import sys
    from pathlib import Path

    from traceprof.ingest import ingest as ingest_mod

    folder = tmp_path / "job"
    folder.mkdir()
    for r in (0, 1):
        (folder / f"rank{r}.json").write_text(json.dumps(micro_trace(["aten::mm"], rank=r, world=2)))
    calls: list[str] = []
    real = Path.stat

    def stat(self, *a, **k):
        if sys._getframe(1).f_code.co_filename == ingest_mod.__file__:
            calls.append(self.name)
        return real(self, *a, **k)

    monkeypatch.setattr(Path, "stat", stat)
    code, _, err = run("ingest", str(folder), "--db", str(tmp_path / "s.duckdb"))
    assert code == 0, err
    assert sorted(calls) == ["rank0.json", "rank1.json"]
