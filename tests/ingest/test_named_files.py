"""Files named on the command line, as a shell glob over a run folder names them (``ingest run1/*``):
sidecars are read with their traces, documents skipped with a note, anything else refused; and
``--partial`` lists a path holding no trace instead of stopping the ingest."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests._cli_inproc import run
from tests.builders import micro_trace
from tests.conftest import SAMPLES
from traceprof.ingest import sources
from traceprof.storage.store import Store

FORMATS_TAIL = "; it reads: "


def _copy(tmp_path: Path, name: str = "normal") -> Path:
    d = tmp_path / name
    shutil.copytree(SAMPLES / "normal", d)
    return d


def _traces(db: Path) -> list[tuple]:
    with Store(db, read_only=True) as s:
        return s.con.execute(
            "SELECT r.name, t.rank, t.world_size, t.host, t.torch_version, t.flops_per_step, t.sha256, t.path "
            "FROM traces t JOIN runs r USING (run_id) ORDER BY t.rank"
        ).fetchall()


def test_a_glob_over_a_run_folder_ingests_what_the_folder_does(tmp_path):
    d = _copy(tmp_path)
    # sample_traces/normal holds README.md, rank<R>.meta.json and rank<R>.trace.json.gz for R = 0..3
    assert sorted(p.name for p in d.iterdir())[:3] == ["README.md", "rank0.meta.json", "rank0.trace.json.gz"]
    code, _, err = run("ingest", *sorted(map(str, d.iterdir())), "--db", str(tmp_path / "glob.duckdb"))
    assert code == 0, err
    assert err.splitlines() == [
        f"warning: skipped {d}/README.md: not a trace (named as a document)",
        f"run 'normal' (id 1): stored in {tmp_path}/glob.duckdb",
        "4 file(s) ingested, 0 already stored",
    ]
    code, _, err = run("ingest", str(d), "--db", str(tmp_path / "folder.duckdb"))
    assert code == 0, err
    glob, folder = _traces(tmp_path / "glob.duckdb"), _traces(tmp_path / "folder.duckdb")
    # the sidecars were read: host, torch version and FLOPs per step come from rank<R>.meta.json only
    assert glob == folder and len(glob) == 4 and {(r[3], r[4]) for r in glob} == {("vm", "2.13.0+cpu")}
    assert all(json.loads(r[5]) == {"4": 1511071744.0, "5": 1511071744.0, "6": 1511071744.0} for r in glob)


def test_a_sidecar_named_without_its_trace_is_refused_naming_it(tmp_path):
    d = _copy(tmp_path)
    db = tmp_path / "s.duckdb"
    code, _, err = run("ingest", str(d / "rank0.meta.json"), str(d / "rank1.trace.json.gz"), "--db", str(db))
    assert (code, err) == (
        1,
        f"error: {d}/rank0.meta.json: read with the trace rank0.trace.json.gz beside it, which is not named; "
        "name it (or its folder)\n",
    )
    assert list(tmp_path.iterdir()) == [d]  # no store, no lock file
    # named with its folder, it is that folder's sidecar: nothing to refuse
    code, _, err = run("ingest", str(d), str(d / "rank0.meta.json"), "--db", str(db))
    assert code == 0 and "4 file(s) ingested" in err and "skipped" not in err, err


def test_a_document_named_alone_is_still_refused(tmp_path):
    d = _copy(tmp_path)
    code, _, err = run("ingest", str(d / "README.md"), "--db", str(tmp_path / "s.duckdb"))
    assert code == 1 and err.startswith(
        f"error: {d}/README.md: not a trace file traceprof reads{FORMATS_TAIL}"
    )
    assert err.count("\n") == 1 and list(tmp_path.iterdir()) == [d]


@pytest.mark.parametrize(
    ("name", "content", "want"),
    [
        # no collector claims it and it is not named as a document: refused, as before
        ("data.bin", b"\x00\x01", "data.bin: not a trace file traceprof reads"),
        # claimed (a *.json is Kineto's) and not parseable: a trace that fails, whatever is beside it
        ("rank9.json", b'{"traceEvents": [', "rank9.json"),
        # named as SQLite (an Nsight export's name), not one: said so, not "not a trace file"
        (
            "run.sqlite",
            b"garbage\n",
            "run.sqlite: not an SQLite database (named .sqlite, but it does not start with the SQLite header)",
        ),
        ("empty.sqlite", b"", "empty.sqlite: not an SQLite database (named .sqlite, "),
    ],
)
def test_a_file_that_is_not_a_document_still_fails_the_ingest(tmp_path, name, content, want):
    d = _copy(tmp_path)
    (d / name).write_bytes(content)
    code, _, err = run("ingest", *sorted(map(str, d.iterdir())), "--db", str(tmp_path / "s.duckdb"))
    assert code == 1 and want in err and "Traceback" not in err, err
    assert list(tmp_path.iterdir()) == [d]  # nothing stored, no lock file


@pytest.mark.parametrize("content", [b"garbage\n", b""], ids=["garbage", "empty"])
def test_a_damaged_sqlite_found_in_a_folder_is_named_as_a_named_one_is(tmp_path, content):
    # it was passed over in silence beside traces, and alone the folder was "no trace files found"
    said = (
        "rank0.sqlite: not an SQLite database (named .sqlite, but it does not start with the SQLite header)"
    )
    alone = tmp_path / "alone"
    alone.mkdir()
    (alone / "rank0.sqlite").write_bytes(content)
    code, _, err = run("ingest", str(alone), "--db", str(tmp_path / "s.duckdb"))
    assert code == 1 and err.startswith(f"error: {alone}: holds no trace file traceprof reads; {said}"), err
    assert err.count("\n") == 1 and sorted(p.name for p in tmp_path.iterdir()) == ["alone"]
    d = _copy(tmp_path)
    (d / "rank0.sqlite").write_bytes(content)
    code, _, err = run("ingest", str(d), "--db", str(tmp_path / "s.duckdb"))
    assert code == 0 and f"warning: not read: {d}/{said}" in err, err
    assert [r[1] for r in _traces(tmp_path / "s.duckdb")] == [0, 1, 2, 3]


def test_partial_lists_a_path_holding_no_trace_and_ingests_the_rest(tmp_path):
    d = _copy(tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"\x00")
    db = tmp_path / "s.duckdb"
    # without --partial: refused at the first such path, nothing stored
    code, _, err = run("ingest", str(d), str(empty), "--db", str(db))
    assert code == 1 and err.startswith(f"error: {empty}: no trace files found; traceprof reads: ")
    assert not db.exists() and not (tmp_path / "s.duckdb.lock").exists()
    # with it: each listed (one line), exit 1, the run folder stored
    code, _, err = run("ingest", str(empty), str(d), str(junk), "--partial", "--db", str(db))
    lines = err.splitlines()
    assert code == 1 and lines[0] == f"run 'normal' (id 1): stored in {db}", err
    assert lines[1].startswith(f"failed: {empty}: no trace files found; traceprof reads: ")
    assert lines[2].startswith(f"failed: {junk}: not a trace file traceprof reads{FORMATS_TAIL}")
    assert lines[3:] == ["4 file(s) ingested, 0 already stored, 2 failed"]
    assert [r[1] for r in _traces(db)] == [0, 1, 2, 3]


def test_partial_with_no_path_holding_a_trace_stores_nothing(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    (tmp_path / "notes.txt").write_text("x")
    db = tmp_path / "s.duckdb"
    code, _, err = run("ingest", str(empty), str(tmp_path / "notes.txt"), "--partial", "--db", str(db))
    assert code == 1 and err.startswith(f"error: {empty}: no trace files found; ") and err.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "notes.txt"]


def test_a_folder_of_files_that_are_not_traces_beside_a_run_is_as_an_empty_folder(tmp_path):
    d = _copy(tmp_path)
    nt, nt2 = tmp_path / "notrace", tmp_path / "nt2"
    for folder, text, conf in ((nt, "a.txt", "conf.json"), (nt2, "b.txt", "c.json")):
        folder.mkdir()
        (folder / text).write_text("hi")  # no collector claims it
        (folder / conf).write_text('{"a":1}')  # Kineto's *.json tries it: no traceEvents, not a trace
    db = tmp_path / "s.duckdb"
    # the message of the folder named alone: the file a collector tried first, then the others
    one = f"{nt}: no trace files found (skipped 2 file(s) that are not traces: conf.json, a.txt); traceprof reads: "
    code, _, err = run("ingest", str(d), str(nt), "--db", str(db))
    assert code == 1 and err.startswith(f"error: {one}") and "nothing stored" in err, err
    assert not db.exists() and not (tmp_path / "s.duckdb.lock").exists()
    # two such folders: each named, one line each
    code, _, err = run("ingest", str(d), str(nt), str(nt2), "--db", str(db))
    lines = err.splitlines()
    assert (
        code == 1
        and lines[0] == "error: 2 paths hold no trace, nothing stored (--partial stores the others):"
    )
    assert lines[1].startswith(f"  {one}") and lines[2].startswith(
        f"  {nt2}: no trace files found (skipped 2 "
    )
    assert not db.exists()
    # --partial: each listed as failed (no "skipped" warning for its files), the run stored, exit 1
    code, _, err = run("ingest", str(d), str(nt), str(nt2), "--partial", "--db", str(db))
    lines = err.splitlines()
    assert code == 1 and lines[0] == f"run 'normal' (id 1): stored in {db}", err
    assert lines[1].startswith(f"failed: {one}") and lines[2].startswith(
        f"failed: {nt2}: no trace files found"
    )
    assert lines[3:] == ["4 file(s) ingested, 0 already stored, 2 failed"]
    assert [r[1] for r in _traces(db)] == [0, 1, 2, 3]
    # --partial with no path holding a trace (an empty folder, then this one): the first path's error
    empty = tmp_path / "empty"
    empty.mkdir()
    for first, paths in ((empty, [empty, nt]), (nt, [nt, empty])):
        code, _, err = run("ingest", *map(str, paths), "--partial", "--db", str(tmp_path / "new.duckdb"))
        assert (
            code == 1 and err.startswith(f"error: {first}: no trace files found") and err.count("\n") == 1
        ), err
        assert not (tmp_path / "new.duckdb").exists()


def test_a_file_named_twice_is_read_once(tmp_path):
    d = _copy(tmp_path)
    f = d / "rank0.trace.json.gz"
    once, twice = tmp_path / "once.duckdb", tmp_path / "twice.duckdb"
    code, _, err = run("ingest", str(f), "--db", str(once))
    assert code == 0, err
    # the same file by two spellings of its path: one file, stored as when named once (run 'rank0')
    code, _, err = run("ingest", str(f), str(d / ".." / d.name / f.name), "--db", str(twice))
    assert code == 0 and "also in" not in err and "1 file(s) ingested, 0 already stored" in err, err
    assert _traces(twice) == _traces(once) and [r[:2] for r in _traces(once)] == [("rank0", 0)]
    # a folder and a file in it: the folder's four ranks, each once
    code, _, err = run("ingest", str(d), str(f), "--db", str(tmp_path / "both.duckdb"))
    assert code == 0 and "4 file(s) ingested, 0 already stored" in err, err
    assert [r[:2] for r in _traces(tmp_path / "both.duckdb")] == [("normal", r) for r in range(4)]


def test_each_collector_names_its_companions(tmp_path):
    # Kineto: rank0.trace.json.gz -> rank0.meta.json; NDTimeline: trace-AR.parquet -> meta-AR.yaml;
    # nsys: x.sqlite (by its magic bytes) -> x.nsys-rep, the report it was exported from
    (tmp_path / "rank0.trace.json.gz").write_bytes(b"")
    (tmp_path / "rank0.meta.json").write_text("{}")
    (tmp_path / "trace-AR.parquet").write_bytes(b"")
    (tmp_path / "meta-AR.yaml").write_text("")
    (tmp_path / "x.sqlite").write_bytes(b"SQLite format 3\x00" + bytes(100))
    (tmp_path / "x.nsys-rep").write_bytes(b"")
    (tmp_path / "lonely.meta.json").write_text("{}")  # no trace beside it: no owner
    assert sources.owners(tmp_path) == {
        tmp_path / "rank0.meta.json": tmp_path / "rank0.trace.json.gz",
        tmp_path / "meta-AR.yaml": tmp_path / "trace-AR.parquet",
        tmp_path / "x.nsys-rep": tmp_path / "x.sqlite",
    }


@pytest.mark.parametrize(
    ("name", "document"),
    [
        ("README.md", True),
        ("notes.TXT", True),
        ("LICENSE", True),
        ("plot.png", True),
        ("run.sh", True),
        ("rank0.json", False),
        ("trace.bin", False),
        ("nccl.log", False),
        ("rank0", False),
    ],
)
def test_documents_are_told_by_their_names(name, document):
    assert sources.is_document(Path("run1") / name) is document


def test_a_document_beside_one_named_trace_is_skipped(tmp_path):
    # one trace and a README named: the README skipped, the trace ingested as a run of its own
    d = tmp_path / "job"
    d.mkdir()
    (d / "rank0.json").write_text(json.dumps(micro_trace(["aten::mm"])))
    (d / "README.md").write_text("# notes")
    code, _, err = run(
        "ingest", str(d / "README.md"), str(d / "rank0.json"), "--db", str(tmp_path / "s.duckdb")
    )
    assert code == 0 and f"warning: skipped {d}/README.md: not a trace (named as a document)" in err, err
