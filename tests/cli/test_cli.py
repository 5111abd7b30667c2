"""The CLI as a careless user drives it: one-line errors with exit 1, never a traceback."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SAMPLES, corpus


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "traceprof.cli", *args], cwd=cwd, capture_output=True, text=True
    )


def _one_line_error(r: subprocess.CompletedProcess, *needles: str) -> None:
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr and len(lines) == 1, r.stderr
    for n in needles:
        assert n in lines[0], lines[0]


def _trace(rank: int, world: int) -> dict:
    return {
        "baseTimeNanoseconds": 0,
        "distributedInfo": {"rank": rank, "world_size": world},
        "traceEvents": [
            {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1, "dur": 2}
        ],
    }


@pytest.fixture
def db(tmp_path):
    path = tmp_path / "s.duckdb"
    assert cli("ingest", str(SAMPLES / "normal"), "--db", str(path), cwd=tmp_path).returncode == 0
    return path


def test_output_paths(db, tmp_path):
    _one_line_error(
        cli("report", "--db", str(db), "-o", str(tmp_path / "no" / "r.html"), cwd=tmp_path), "does not exist"
    )
    _one_line_error(cli("report", "--db", str(db), "-o", str(tmp_path), cwd=tmp_path), "is a directory")
    _one_line_error(
        cli("export", "perfetto", "--db", str(db), "-o", str(tmp_path / "no" / "t.json"), cwd=tmp_path),
        "does not exist",
    )


def test_bad_params_and_queries(db, tmp_path):
    _one_line_error(
        cli("analyze", "temporal", "--db", str(db), "-p", "hta=maybe", cwd=tmp_path),
        "hta='maybe'",
        "true or false",
    )
    _one_line_error(
        cli("analyze", "temporal", "--db", str(db), "-p", "nope=1", cwd=tmp_path), "no parameter 'nope'"
    )
    _one_line_error(cli("sql", "", "--db", str(db), cwd=tmp_path), "empty query")
    _one_line_error(cli("sql", "SELEC 1", "--db", str(db), cwd=tmp_path), "SQL error")
    # settings (no statement but a query runs; these would make DuckDB print into the result, a
    # profile tree in the middle of a CSV): refused, pointing to EXPLAIN ANALYZE for a profile
    for q in (
        "PRAGMA enable_profiling; SELECT 1 AS x",
        "SET enable_profiling = 'json'",
        "pragma ENABLE_PROFILE",
    ):
        _one_line_error(
            cli("sql", q, "-f", "csv", "--db", str(db), cwd=tmp_path), "is refused", "use EXPLAIN ANALYZE"
        )
    _one_line_error(
        cli("sql", "SET enable_progress_bar = true", "-f", "csv", "--db", str(db), cwd=tmp_path),
        "SET statement",
        "is refused",
        "queries only",
    )
    r = cli("sql", "EXPLAIN ANALYZE SELECT count(*) FROM events", "-f", "csv", "--db", str(db), cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.startswith("explain_key,explain_value"), r.stderr
    _one_line_error(
        cli("ingest", str(SAMPLES / "normal"), "--db", str(db), "-j", "0", cwd=tmp_path), "--jobs"
    )


def test_numeric_run_name_refused_and_resolves_by_name_first(db, tmp_path):
    # A numeric --run would shadow a run id: refused. A store from before that rule may hold one:
    # run id 1 is "normal"; a run *named* "1" (id 2) must be reachable by its name.
    d = tmp_path / "other"
    d.mkdir()
    (d / "rank0.json").write_text(json.dumps(_trace(0, 1)))
    _one_line_error(
        cli("ingest", str(d), "--run", "1", "--db", str(db), cwd=tmp_path), "would read as a run id"
    )
    assert cli("ingest", str(d), "--run", "other", "--db", str(db), cwd=tmp_path).returncode == 0
    import duckdb

    with duckdb.connect(str(db)) as con:
        con.execute("UPDATE runs SET name = '1' WHERE run_id = 2")
    out = cli(
        "sql", "SELECT name FROM runs WHERE run_id = 2", "--db", str(db), "-f", "csv", cwd=tmp_path
    ).stdout
    assert out.split() == ["name", "1"]
    r = cli("analyze", "temporal", "--run", "1", "--db", str(db), "-f", "json", cwd=tmp_path)
    assert [row["rank"] for row in json.loads(r.stdout)] == [0]  # run "1" has one rank; "normal" has 4


def test_world_size_conflict_and_failed_first_ingest_leaves_no_store(tmp_path):
    d = tmp_path / "mixed"
    d.mkdir()
    (d / "a.json").write_text(json.dumps(_trace(0, 2)))
    (d / "b.json").write_text(json.dumps(_trace(1, 128)))
    db = tmp_path / "new.duckdb"
    # named one run, they cannot be (without --run they are two runs: tests/ingest/test_run_names.py)
    r = cli("ingest", str(d), "--db", str(db), "--run", "mixed", cwd=tmp_path)
    _one_line_error(r, "world size 128", "a.json")
    assert not db.exists()
    # two copies of rank 0 of one 2-rank job in one folder: refused without --run too
    second = _trace(0, 2)
    second["traceEvents"][0]["ts"] = 5
    (d / "b.json").write_text(json.dumps(second))
    _one_line_error(cli("ingest", str(d), "--db", str(db), cwd=tmp_path), "rank 0 also in", "a.json")
    assert not db.exists()


def test_scanned_non_trace_json_is_skipped_named_one_fails(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    (d / "rank0.json").write_text(json.dumps(_trace(0, 1)))
    (d / "config.json").write_text(json.dumps({"lr": 0.1}))
    db = tmp_path / "s.duckdb"
    r = cli("ingest", str(d), "--db", str(db), cwd=tmp_path)
    assert r.returncode == 0 and "skipped" in r.stderr and "config.json" in r.stderr
    _one_line_error(
        cli("ingest", str(d / "config.json"), "--db", str(db), cwd=tmp_path),
        "config.json",
        "not a Kineto trace",
    )


def test_sqlite_file_as_store(tmp_path):
    f = tmp_path / "report.sqlite"
    sqlite3.connect(f).execute("CREATE TABLE t (a)").connection.commit()
    _one_line_error(cli("runs", "--db", str(f), cwd=tmp_path), "SQLite file")


def test_skip_bad_events_says_how_many(tmp_path):
    doc = _trace(0, 1)
    doc["traceEvents"].append({"ph": "X", "cat": "cpu_op", "name": "broken", "pid": 1, "tid": 1, "ts": 5})
    d = tmp_path / "run"
    d.mkdir()
    (d / "rank0.json").write_text(json.dumps(doc))
    r = cli("ingest", str(d), "--db", str(tmp_path / "s.duckdb"), "--skip-bad-events", cwd=tmp_path)
    assert r.returncode == 0 and "1 record(s) not stored: 1 missing 'dur'" in r.stderr


def test_files_stored_in_another_run_are_not_split_off(tmp_path):
    # Ranks 0-1 ingested as run "a"; then the same two files plus a new rank 2 under run "b":
    # "b" would silently hold rank 2 only, so that is an error naming the stored file.
    d = tmp_path / "job"
    d.mkdir()
    for r in (0, 1):
        (d / f"rank{r}.json").write_text(json.dumps(_trace(r, 3)))
    db = tmp_path / "s.duckdb"
    assert cli("ingest", str(d), "--run", "a", "--db", str(db), cwd=tmp_path).returncode == 0
    (d / "rank2.json").write_text(json.dumps(_trace(2, 3)))
    _one_line_error(
        cli("ingest", str(d), "--run", "b", "--db", str(db), cwd=tmp_path), "already stored in run 'a'"
    )
    # Into the same run it is an incremental ingest: rank 2 is added, ranks 0-1 skipped.
    r = cli("ingest", str(d), "--run", "a", "--db", str(db), cwd=tmp_path)
    assert r.returncode == 0 and "1 file(s) ingested, 2 already stored" in r.stderr


# A library missing from the environment (a partial install, an analyst's laptop): the console
# entry point runs with an import hook that finds no module of that name.
_WITHOUT = """import sys
blocked = sys.argv[1]
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == blocked:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Block())
sys.argv = ["traceprof", *sys.argv[2:]]
from traceprof.entry import main
main()
"""


@pytest.mark.parametrize(("module", "package"), [("bokeh", "bokeh"), ("typer", "typer")])
def test_missing_library_is_one_line_naming_what_to_install(
    tmp_path: Path, module: str, package: str
) -> None:
    db = tmp_path / "s.duckdb"
    assert cli("ingest", str(SAMPLES / "normal"), "--db", str(db), cwd=tmp_path).returncode == 0
    cmd = ["report", "--db", str(db), "-o", str(tmp_path / "r.html")]
    r = subprocess.run(
        [sys.executable, "-c", _WITHOUT, module, *cmd], cwd=tmp_path, capture_output=True, text=True
    )
    _one_line_error(r, f"module {module!r}", f"pip install '{package}'")
    assert not (tmp_path / "r.html").exists()


def test_a_library_that_does_not_load_is_one_line_too(tmp_path: Path) -> None:
    # a broken install: the module is there, but importing it raises a plain ImportError
    db = tmp_path / "s.duckdb"
    assert cli("ingest", str(SAMPLES / "normal"), "--db", str(db), cwd=tmp_path).returncode == 0
    broken = _WITHOUT.replace(
        'raise ModuleNotFoundError(f"No module named {name!r}", name=name)',
        "raise ImportError(\"cannot import name 'file_html'\", name=name)",
    )
    assert broken != _WITHOUT
    r = subprocess.run(
        [sys.executable, "-c", broken, "bokeh", "report", "--db", str(db), "-o", str(tmp_path / "r.html")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    _one_line_error(
        r,
        "cannot load the Python module 'bokeh",
        "cannot import name 'file_html'",
        "pip install --force-reinstall 'bokeh'",
    )


@pytest.mark.parametrize(
    ("module", "package", "source"),
    [
        ("pyarrow", "pyarrow", None),  # every ingest builds Arrow columns
        # only an NDTimeline file needs pyyaml (its meta YAML): a Kineto ingest runs without it
        ("yaml", "pyyaml", "kineto_misc/bytedance_straggler_whatif/trace-AR.parquet"),
    ],
)
def test_missing_library_at_ingest_stores_nothing(
    tmp_path: Path, module: str, package: str, source: str | None
) -> None:
    db = tmp_path / "s.duckdb"
    src = SAMPLES / "normal" if source is None else corpus(source)
    r = subprocess.run(
        [sys.executable, "-c", _WITHOUT, module, "ingest", str(src), "--db", str(db)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    _one_line_error(r, f"module {module!r}", f"pip install '{package}'")
    assert not db.exists()


def test_sql_table_cuts_a_long_cell_saying_its_length(db, tmp_path):
    # 'a' x 6,000 then 'b' x 24,000: 30,000 characters, over the 10,000 a table cell shows; the table
    # keeps the first 5,000 ('a's) and the last 5,000 ('b's) around a marker with the length
    q = "SELECT repeat('a', 6000) || repeat('b', 24000) AS v"
    r = cli("sql", q, "--db", str(db), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    flat = "".join(ch for ch in r.stdout if ch not in "│┃┏┓┗┛━┡┩└┘─ \n")  # the cell, unfolded
    marker = "…[30,000characters;-fcsvor-fjsonprintsthevaluewhole]…"
    assert flat == "v" + "a" * 5000 + marker + "b" * 5000, flat[:200]
    # CSV prints it whole
    r = cli("sql", q, "-f", "csv", "--db", str(db), cwd=tmp_path)
    assert r.stdout.splitlines()[1] == "a" * 6000 + "b" * 24000
