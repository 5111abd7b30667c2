"""The explicit Session: the Python API mirrors the CLI, and nothing that changes results is a
module switch or a context variable; parsers get their options as a value."""

from __future__ import annotations

import ast
import json

import pytest

import traceprof
from tests import _cli_inproc as cli
from tests.conftest import REPO, SAMPLES
from traceprof.core.parsed import ParseOptions
from traceprof.engine.analysis import FrameResult
from traceprof.engine.session import Session
from traceprof.ingest.ingest import ingest
from traceprof.storage.store import Store


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    path = tmp_path_factory.mktemp("session") / "s.duckdb"
    with Store(path) as store:
        ingest(store, [SAMPLES / "normal", SAMPLES / "normal_repeat", SAMPLES / "extra_matmul"], jobs=1)
    return path


def test_the_library_mirrors_the_cli(db, tmp_path):
    # analyze, summary, report and diff give what the commands print
    with traceprof.open(db) as s:
        st = s.analyze("stragglers", run="normal", alpha="0.05")  # a -p string, converted by its type
        same = s.analyze("stragglers", run="normal", alpha=0.05)
        gaps = s.analyze("gaps", run="normal")
        summary = s.summary(run="normal")
        out = s.report(tmp_path / "r.html", run="normal")
        d = s.diff("normal,normal_repeat", "extra_matmul")
    assert same is st  # one session computes each analysis once per params
    code, text, _ = cli.run(
        "analyze", "gaps", "--db", str(db), "--run", "normal", "-f", "json", "--table", "gaps"
    )
    assert code == 0 and json.loads(text) == json.loads(
        json.dumps(gaps.frames()["gaps"].to_dicts(), default=str)
    )
    code, text, _ = cli.run("summary", "--db", str(db), "--run", "normal", "-f", "json")
    assert code == 0 and json.loads(text) == json.loads(json.dumps(summary.to_dict()))
    assert out.read_text().startswith("<!DOCTYPE html>")
    code, text, _ = cli.run("diff", "normal,normal_repeat", "extra_matmul", "--db", str(db), "-f", "json")
    assert json.loads(text)["verdict"] == d.verdict and code == d.exit_code


def test_a_session_holds_what_a_command_decides(db, monkeypatch):
    # cache, threads and memo are the session's; the store knows its session only while it is open
    monkeypatch.setenv("TRACEPROF_NO_CACHE", "1")
    with traceprof.open(db, threads=1) as s:
        assert s.cache is False and s.threads == 1 and s.memo == {} and s.store.session is s
        r = s.analyze("temporal", run="normal")
        assert isinstance(r, FrameResult) and len(s.memo) >= 1
    assert s.store.session is None
    with Store(db, read_only=True) as store:
        with Session(store, memo=False) as s2:
            assert s2.analyze("temporal", run="normal") is not s2.analyze("temporal", run="normal")
        assert store.session is None  # detached: the bare store computes every call again


def test_no_ambient_switches_are_left():
    # The classifier, the inflate cap and the spill folder were module globals that parsers read,
    # and the memo, the cache and the executor five context variables: all are values now (a
    # Session, ParseOptions). Only Ctrl-C's cancellation scope stays a context variable.
    from traceprof.core import classify, fileio, spill

    for mod, gone in ((classify, "_CURRENT"), (fileio, "_ratio"), (spill, "_DIR")):
        assert not hasattr(mod, gone), (mod.__name__, gone)
    for path in (REPO / "traceprof").rglob("*.py"):
        tree = ast.parse(path.read_text())
        calls = [
            n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "ContextVar"
        ]
        assert not calls or path.name == "cancel.py", path.name
    assert ParseOptions().on_bad_event == "raise" and ParseOptions(comm_kernels=("x",)).classifier.extra == (
        "x",
    )


def test_comm_kernel_patterns_travel_with_the_parse_options(tmp_path):
    # Two ingests in one process with different --comm-kernel patterns: each file is classed by
    # its own options (a process-wide classifier kept the first ingest's patterns in a worker).
    from tests.conftest import case

    src = case("deepep_comm_kernels")
    with Store(tmp_path / "a.duckdb") as a, Store(tmp_path / "b.duckdb") as b:
        ingest(a, [src], jobs=1, comm_kernels=("gemm",))
        ingest(b, [src], jobs=1)
        comm_a = a.sql("SELECT count(*) AS n FROM events WHERE class = 'comm'")["n"].item()
        comm_b = b.sql("SELECT count(*) AS n FROM events WHERE class = 'comm'")["n"].item()
        gemm = b.sql("SELECT count(*) AS n FROM events WHERE kind = 'kernel' AND name ILIKE '%gemm%'")[
            "n"
        ].item()
    assert gemm > 0 and comm_a == comm_b + gemm


def test_analyze_lets_go_of_the_activity_once_read_and_reads_it_again_when_asked(db):
    # `traceprof analyze whatif` (many=False): neither the replay's compute items (let go of once its
    # graph is built) nor the compute rows they are made from are kept (nothing else in the command
    # reads them); asked again, the activity is read again and equals the frame a report's session
    # (which never lets go) holds
    from polars.testing import assert_frame_equal

    from traceprof.engine.activity import activity

    def frames(s: Session) -> list[tuple[object, ...]]:  # the activity frames the memo holds: their keys
        assert s.memo is not None
        return [
            k for k, slot in s.memo.items() if k[0] == "traceprof.engine.activity._activity" and slot.done
        ]

    with traceprof.open(db, cache=False, many=True) as report:  # the report keeps its one frame for all
        run_id = report.store.resolve_run("normal")
        report.analyze("whatif", run="normal")
        report.analyze("critical_path", run="normal")
        assert len(frames(report)) == 1
        assert any(k[0].endswith("_replay.compute_items") for k in report.memo or {})  # the report's stay
        kept = activity(report.store, run_id)
    with traceprof.open(db, cache=False, many=False) as s:
        assert s.store.resolve_run("normal") == run_id
        s.analyze("whatif", run="normal")
        assert s.memo is not None and not any(
            k[0].endswith("_replay.compute_items") for k in s.memo
        )  # the items are let go of
        assert frames(s) == []  # and so are the rows they were made from
        again = activity(s.store, run_id)
        assert len(frames(s)) == 1  # read again, and kept until released again
        assert again.height > 0
        assert_frame_equal(again, kept.select(again.columns))
        assert activity(s.store, run_id) is again
        s.analyze("critical_path", run="normal")  # lets go of the columns it read too
        assert len(frames(s)) == 1


def test_analyze_whatif_empties_duckdbs_pool_before_its_build_and_a_report_does_not(db, monkeypatch):
    # `traceprof analyze whatif` (many=False: nothing else queries the store meanwhile) lets go of
    # DuckDB's cached blocks once its reads are done, before the replay graph's peak; a report's
    # shared phase (many=True, queries on other threads) leaves the pool alone
    from traceprof.engine.analysis import release_pool

    emptied: list[bool] = []
    real = Session.empty_buffer_pool

    def emptying(self: Session) -> None:
        emptied.append(self.many)
        real(self)

    monkeypatch.setattr(Session, "empty_buffer_pool", emptying)
    with traceprof.open(db, cache=False, many=True) as report:
        report.analyze("whatif", run="normal")
        release_pool(report.store)
        assert emptied == []
    with traceprof.open(db, cache=False, many=False) as s:
        s.analyze("whatif", run="normal")
        assert emptied == [False]
    with Store(db, read_only=True) as bare:
        release_pool(bare)  # no session: nothing to say whether another thread queries the store
    assert emptied == [False]
