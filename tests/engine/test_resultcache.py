"""Results kept beside the store (traceprof.engine.resultcache): read back equal, never stale, never trusted blindly."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import orjson
import polars as pl
import pytest
from polars.testing import assert_frame_equal

from tests import _cli_inproc as cli
from tests.conftest import SAMPLES, corpus
from traceprof.core.errors import TraceprofError
from traceprof.engine import analysis as registry
from traceprof.engine import resultcache
from traceprof.engine.session import Session
from traceprof.storage.store import Store


def _ingest(db: Path, *folders: Path) -> None:
    for f in folders:
        code, _, err = cli.run("ingest", str(f), "--db", str(db), "--run", f.name)
        assert code == 0, err


@pytest.fixture
def hits(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Names of the analyses that were read from the results folder (a spy on lookup)."""
    seen: list[str] = []
    real = resultcache.lookup

    def spy(store, name, params):  # noqa: ANN001, ANN202
        out = real(store, name, params)
        if out is not None:
            seen.append(name)
        return out

    monkeypatch.setattr(resultcache, "lookup", spy)
    return seen


def _results(store: Store) -> dict[str, object]:
    out = {}
    for name in registry.names():
        an = registry.get(name)
        try:
            out[name] = an.run(store, an.params())
        except TraceprofError as e:
            out[name] = type(e)
    return out


@pytest.mark.parametrize("where", ["sample", "gpu"])
def test_every_analysis_reads_back_what_it_computed(tmp_path: Path, hits: list[str], where: str) -> None:
    # a 4-rank CPU run (stragglers, whatif, mfu from shapes) and a 2-rank GPU corpus run (kernels,
    # launch, overlap): every result's frames (values, dtypes, column order) and notes come back equal
    db = tmp_path / "s.duckdb"
    _ingest(db, SAMPLES / "normal" if where == "sample" else corpus("hta/trace_filter"))
    with Store(db, read_only=True) as store, Session(store, cache=True, memo=False):
        first = _results(store)
    # kept when stragglers ran it for its costs, and mfu's waterfall reads critical_path's account
    assert set(hits) <= {"whatif", "critical_path"}
    hits.clear()
    with Store(db, read_only=True) as store, Session(store, cache=True, memo=False):
        again = _results(store)
    computed = [n for n, r in first.items() if not isinstance(r, type)]
    assert len(computed) >= 8 and sorted(hits) == sorted(computed)
    for name, r in first.items():
        a = again[name]
        if isinstance(r, type):
            assert a is r, name  # errors are not kept: raised again
            continue
        assert type(a) is type(r) and a is not r and a.notes == r.notes, name
        assert list(a.frames()) == list(r.frames()), name
        for t, df in r.frames().items():
            assert_frame_equal(a.frames()[t], df, check_exact=True)


def test_a_write_to_the_store_makes_every_kept_result_stale(tmp_path: Path, hits: list[str]) -> None:
    db = tmp_path / "s.duckdb"
    _ingest(db, SAMPLES / "normal")
    code, before, _ = cli.run("analyze", "stragglers", "--db", str(db), "-f", "csv")
    assert code == 0 and hits == []
    folders = list(resultcache.results_dir(db).iterdir())
    assert len(folders) == 1 and {p.name.split("-")[0] for p in folders[0].iterdir()} == {
        "stragglers",
        "whatif",
        "_activity",
        "view",  # how `analyze stragglers` prints the result (traceprof.cli._keep_view)
    }
    # a second run becomes the latest: `analyze stragglers` (no --run) must not answer for the first one
    _ingest(db, SAMPLES / "straggler_rank2")
    code, after, _ = cli.run("analyze", "stragglers", "--db", str(db), "-f", "csv")
    assert code == 0 and hits == [] and after != before
    assert [p.name for p in resultcache.results_dir(db).iterdir()] != [
        folders[0].name
    ]  # the old state is gone
    code, by_name, _ = cli.run("analyze", "stragglers", "--db", str(db), "-f", "csv", "--run", "normal")
    assert code == 0 and hits == [] and by_name == before
    # the same run by id is the same entry (printed from the view `--run normal` kept: no lookup)
    code, by_id, _ = cli.run("analyze", "stragglers", "--db", str(db), "-f", "csv", "--run", "1")
    assert code == 0 and hits == [] and by_id == before


def test_the_report_reuses_what_analyze_kept(tmp_path: Path, hits: list[str]) -> None:
    db = tmp_path / "s.duckdb"
    _ingest(db, SAMPLES / "straggler_rank2")
    assert cli.run("analyze", "stragglers", "--db", str(db))[0] == 0
    assert cli.run("report", "--db", str(db), "-o", str(tmp_path / "r.html"))[0] == 0
    assert {"stragglers", "whatif"} <= set(hits)  # whatif: kept when stragglers ran it for its costs
    assert "straggler" in (tmp_path / "r.html").read_text()


def test_no_cache_and_the_environment_switch_turn_it_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "s.duckdb"
    _ingest(db, SAMPLES / "normal")
    assert cli.run("analyze", "temporal", "--db", str(db), "--no-cache")[0] == 0
    assert not resultcache.results_dir(db).exists()
    monkeypatch.setenv("TRACEPROF_NO_CACHE", "1")
    assert cli.run("analyze", "temporal", "--db", str(db))[0] == 0
    assert not resultcache.results_dir(db).exists()
    monkeypatch.delenv("TRACEPROF_NO_CACHE")
    # a store open for writing (analyze --save) is never cached: it may change under the analysis
    assert cli.run("analyze", "temporal", "--db", str(db), "--save")[0] == 0
    assert not resultcache.results_dir(db).exists()
    assert cli.run("analyze", "temporal", "--db", str(db))[0] == 0
    assert resultcache.results_dir(db).exists()


def _entry(db: Path, name: str) -> Path:
    (entry,) = [p for p in resultcache.results_dir(db).glob(f"*/{name}-*")]
    return entry


def test_a_damaged_or_foreign_entry_is_computed_again(tmp_path: Path, hits: list[str]) -> None:
    db = tmp_path / "s.duckdb"
    _ingest(db, corpus("hta/trace_filter"))
    code, good, _ = cli.run("analyze", "overlap", "--db", str(db), "-f", "csv", "--table", "steps")
    assert code == 0 and good.count("\n") > 2
    entry = _entry(db, "overlap")
    meta, frame = entry / "meta.json", entry / "steps.arrow"
    intact_meta, intact = meta.read_bytes(), frame.read_bytes()

    def again() -> None:
        code, out, _ = cli.run("analyze", "overlap", "--db", str(db), "-f", "csv", "--table", "steps")
        assert code == 0 and out == good and hits == []
        for f, data in ((meta, intact_meta), (frame, intact)):  # (the entry is not written again)
            f.unlink()
            f.write_bytes(data)

    # any flipped byte (some made polars panic, others silently changed a value) or a truncation
    for at in (0, len(intact) // 3, len(intact) // 2, len(intact) - 9):
        flipped = bytearray(intact)
        flipped[at] ^= 1
        frame.write_bytes(bytes(flipped))
        again()
    frame.write_bytes(intact[:100])
    again()
    # a meta that names another analysis' class, drops a frame, or a class that is no result
    m = orjson.loads(intact_meta)
    for edit in (
        {"class": "traceprof.analyses.temporal:Result"},
        {"analysis": "temporal"},
        {"frames": {k: v for k, v in m["frames"].items() if k != "steps"}},
        {"class": "os:system"},
        {"class": "traceprof.storage.store:Store"},
        {"class": "traceprof.analyses.overlap:Params"},
    ):
        meta.write_bytes(orjson.dumps({**m, **edit}))
        again()
    # special files are not read (a FIFO would block, /dev/zero never end)
    frame.unlink()
    os.mkfifo(frame)
    again()
    frame.unlink()
    frame.symlink_to("/dev/zero")
    again()


def test_only_its_own_folders_are_deleted(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    _ingest(db, SAMPLES / "normal")
    mine = resultcache.results_dir(db)
    (mine / "notebooks").mkdir(parents=True)
    (mine / "notebooks" / "a.ipynb").write_text("keep")
    (mine / "summary.csv").write_text("keep")
    assert cli.run("analyze", "temporal", "--db", str(db))[0] == 0
    _ingest(db, SAMPLES / "sleep_rank1")  # a new state: the old state's folder goes, nothing else
    assert cli.run("analyze", "temporal", "--db", str(db))[0] == 0
    names = sorted(p.name for p in mine.iterdir())
    assert (
        len(names) == 3
        and names[1:] == ["notebooks", "summary.csv"]
        and (mine / "notebooks" / "a.ipynb").exists()
    )
    # a results path that is a symlink is not followed: no caching, its target untouched
    victim = tmp_path / "victim"
    (victim / "photos").mkdir(parents=True)
    db2 = tmp_path / "t.duckdb"
    _ingest(db2, SAMPLES / "normal")
    resultcache.results_dir(db2).symlink_to(victim)
    assert cli.run("analyze", "temporal", "--db", str(db2))[0] == 0
    assert [p.name for p in victim.iterdir()] == ["photos"]


def test_entries_are_readable_as_the_umask_allows(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    _ingest(db, SAMPLES / "normal")
    old = os.umask(0o022)
    try:
        assert cli.run("analyze", "temporal", "--db", str(db))[0] == 0
    finally:
        os.umask(old)
    entry = _entry(db, "temporal")
    assert entry.stat().st_mode & 0o777 == 0o755 and (entry / "meta.json").stat().st_mode & 0o777 == 0o644


def test_an_unwritable_folder_only_means_no_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = tmp_path / "s.duckdb"
    _ingest(db, SAMPLES / "normal")

    def refused(*args: object, **kwargs: object) -> str:
        raise PermissionError(13, "Permission denied")  # a read-only share (root ignores chmod)

    monkeypatch.setattr(resultcache.tempfile, "mkdtemp", refused)
    code, out, err = cli.run("analyze", "temporal", "--db", str(db), "-f", "csv")
    assert code == 0 and out.startswith("rank,") and not err
    assert not list(resultcache.results_dir(db).rglob("*.arrow"))


def test_the_code_is_part_of_the_key(
    tmp_path: Path, hits: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "s.duckdb"
    _ingest(db, SAMPLES / "normal")
    assert cli.run("analyze", "temporal", "--db", str(db))[0] == 0
    monkeypatch.setattr(resultcache, "_code_key", lambda: "another release")
    assert cli.run("analyze", "temporal", "--db", str(db))[0] == 0
    assert hits == []
    assert len(list(resultcache.results_dir(db).iterdir())) == 1  # the other code's entries deleted


def test_params_change_the_key(tmp_path: Path, hits: list[str]) -> None:
    db = tmp_path / "s.duckdb"
    _ingest(db, SAMPLES / "normal")
    an = registry.get("gaps")
    with Store(db, read_only=True) as store, Session(store, cache=True, memo=False):
        an.run(store, an.params())
        an.run(store, dataclasses.replace(an.params(), run="1"))  # the same run by id: one entry
        assert hits == ["gaps"]
        hits.clear()
        an2 = registry.get("stragglers")
        an2.run(store, an2.params(alpha=0.01))
        an2.run(store, an2.params(alpha=0.05))
        hits.remove("whatif")  # the second one reads the whatif the first kept (it does not depend on alpha)
        assert hits == []
        an.run(store, an.params(run="normal"))
    assert hits == ["gaps"]


def test_the_activity_intervals_are_kept_for_the_next_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # every time-based analysis starts from traceprof.engine.activity's frame; a second command reads it back
    from traceprof.engine import activity

    db = tmp_path / "s.duckdb"
    _ingest(db, corpus("hta/trace_filter"))
    with Store(db, read_only=True) as store, Session(store, cache=True, memo=False):
        computed = activity.activity(store, 1)
        detail = activity.activity(store, 1, detail=True)
    (entry, other) = sorted(
        resultcache.results_dir(db).glob("*/_activity-*"), key=lambda p: (p / "frame.arrow").stat().st_size
    )
    calls: list[object] = []
    monkeypatch.setattr(Store, "sql", lambda self, *a, **k: calls.append(a) or pl.DataFrame())
    with Store(db, read_only=True) as store, Session(store, cache=True, memo=False):
        assert_frame_equal(activity.activity(store, 1), computed, check_exact=True)
        assert_frame_equal(activity.activity(store, 1, detail=True), detail, check_exact=True)
    assert calls == []  # no query ran
    monkeypatch.undo()
    (entry / "frame.arrow").write_bytes(b"not arrow")  # damaged: computed again
    with Store(db, read_only=True) as store, Session(store, cache=True, memo=False):
        assert_frame_equal(activity.activity(store, 1), computed, check_exact=True)
