"""``traceprof sql`` writes nothing, anywhere, reads only the store, and cannot change its settings
(issue 29; traceprof/sandbox.py). Every escape tried by the attack on main, and the others that
DuckDB's statement kinds allow, is one line of refusal and leaves every file as it was."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest

from tests._cli_inproc import run
from tests.builders import micro_trace
from tests.conftest import REPO


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    """A store (one micro run), its ``<store>.tmp/`` folder (the spill folder DuckDB allowed to SQL,
    made by the attacker in advance) holding a file, and a file outside."""
    d = tmp_path_factory.mktemp("sandbox")
    (d / "run").mkdir()
    (d / "run" / "rank0.json").write_text(json.dumps(micro_trace(["aten::mm"])))
    db = d / "s.duckdb"
    code, _, err = run("ingest", str(d / "run"), "--db", str(db))
    assert code == 0, err
    (d / "s.duckdb.tmp").mkdir()
    (d / "s.duckdb.tmp" / "old.csv").write_text("a\n1\n")
    (d / "secret.txt").write_text("secret\n")
    return d, db


def _snapshot(root: Path) -> dict[str, str]:
    """Every file under ``root`` (the working folder of the test) with its SHA-256."""
    return {
        str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()
    }


def _escapes(d: Path, db: Path) -> list[str]:
    tmp, out = d / "s.duckdb.tmp", d / "out"
    return [
        # the reported escapes: the spill folder by name, relative and absolute
        "COPY (SELECT 42 AS x) TO 's.duckdb.tmp/out.csv'",
        f"COPY (SELECT 42 AS x) TO '{tmp}/out.csv'",
        f"ATTACH '{tmp}/a.duckdb' AS a (READ_WRITE)",
        "SET threads = 1000000",
        # other writes: files, databases, the store itself
        f"COPY runs TO '{out}.parquet' (FORMAT parquet)",
        f"COPY (SELECT 1) TO '{db}.wal'",
        f"EXPORT DATABASE '{out}'",
        f"IMPORT DATABASE '{out}'",
        "ATTACH ':memory:' AS m",
        f"ATTACH '{out}.duckdb' AS o",
        "COPY FROM DATABASE store TO memory",
        "DETACH store",
        "INSERT INTO runs (run_id, name) VALUES (99, 'x')",
        "UPDATE runs SET name = 'x'",
        "DELETE FROM runs",
        "DROP TABLE runs",
        "ALTER TABLE runs ADD COLUMN x INT",
        "CREATE TABLE memory.main.t AS SELECT 1",
        "CREATE TEMP TABLE t AS SELECT 1",
        "CREATE TEMP MACRO m(x) AS x + 1",
        "CREATE MACRO m(x) AS x + 1",
        "CREATE VIEW v AS SELECT 1",
        "CREATE SEQUENCE s",
        "CREATE SECRET s (TYPE s3, KEY_ID 'a', SECRET 'b')",
        "CREATE PERSISTENT SECRET s (TYPE s3, KEY_ID 'a', SECRET 'b')",
        "CHECKPOINT",
        "FORCE CHECKPOINT",
        "CALL checkpoint()",
        "VACUUM",
        "ANALYZE",
        "BEGIN",
        "BEGIN; SELECT 1; COMMIT",
        "PREPARE p AS SELECT 1",
        # extensions
        "INSTALL httpfs",
        "FORCE INSTALL httpfs",
        "LOAD httpfs",
        f"LOAD '{out}.duckdb_extension'",
        "UPDATE EXTENSIONS",
        # settings: none may change (threads, memory, spill folder, file access, the lock itself)
        "SET memory_limit = '100TB'",
        "RESET threads",
        "SET GLOBAL enable_external_access = true",
        "SET allowed_directories = ['/']",
        f"SET temp_directory = '{tmp}'",
        "SET lock_configuration = false",
        "SET VARIABLE x = 1",
        "USE memory",
        "PRAGMA threads = 4",
        "PRAGMA enable_profiling",
        f"PRAGMA profiling_output = '{out}.json'",
        "PRAGMA table_info('runs')",
        "PRAGMA show_tables",
        # statements hidden in a query's clothes
        "SELECT 1; COPY (SELECT 1) TO 'x.csv'",
        "/* a comment */ COPY (SELECT 1) TO 'x.csv'",
        "-- a comment\nCOPY (SELECT 1) TO 'x.csv'",
        "EXPLAIN ANALYZE COPY (SELECT 1) TO 'x.csv'",
        "EXPLAIN /* c */ ANALYZE CREATE TABLE memory.main.t AS SELECT 1",
        "EXPLAIN (ANALYZE) COPY (SELECT 1) TO 'x.csv'",
        "EXPLAIN COPY (SELECT 1) TO 'x.csv'",
        "SELECT * FROM query('COPY (SELECT 1) TO ''x.csv''')",
        "PIVOT runs ON name",
        # reading files other than the store (not allowed either)
        "SELECT * FROM read_csv('/etc/passwd')",
        f"SELECT * FROM read_text('{d / 'secret.txt'}')",
        f"SELECT * FROM read_blob('{d / 'secret.txt'}')",
        f"SELECT * FROM read_csv('{tmp}/old.csv')",
        f"SELECT * FROM '{tmp}/old.csv'",
        f"SELECT * FROM glob('{d}/*')",
        f"SELECT * FROM glob('{tmp}/*')",
        f"SELECT * FROM read_parquet('{REPO}/*.parquet')",
        # text that is not a statement
        ";",
        "-- nothing",
        "\udcff SELECT 1",
    ]


def test_every_escape_is_refused_and_writes_nothing(home, monkeypatch):
    d, db = home
    monkeypatch.chdir(d)  # relative paths ('x.csv', 's.duckdb.tmp/out.csv') land here
    before = _snapshot(d)
    held = []
    for q in _escapes(d, db):
        code, out, err = run(
            "sql", "--db", str(db), "-f", "csv", "--", q
        )  # '--': a query may start with '--'
        assert "No such option" not in err, q
        lines = err.strip().splitlines()
        assert code == 1 and len(lines) == 1 and lines[0].startswith("error: "), (q, code, out, err)
        assert "Traceback" not in err and out == "", q
        held.append(q)
        assert _snapshot(d) == before, f"{q!r} wrote a file"
    assert len(held) == len(_escapes(d, db))


def test_the_engine_has_no_writable_place_and_default_limits(home):
    d, db = home
    code, out, err = run(
        "sql",
        "SELECT current_setting('temp_directory') AS t, current_setting('allowed_directories') "
        "AS dirs, current_setting('threads') AS th, current_setting('enable_external_access') AS ext, "
        "current_setting('lock_configuration') AS locked",
        "--db",
        str(db),
        "-f",
        "json",
    )
    assert code == 0, err
    # no spill folder, no directory allowed, external access off, settings locked; threads as
    # DuckDB's default (one per core), which SET threads cannot raise
    assert json.loads(out) == [
        {
            "t": "",
            "dirs": [],  # a VARCHAR[]: a JSON list in -f json
            "th": duckdb.connect().execute("SELECT current_setting('threads')").fetchone()[0],
            "ext": False,
            "locked": True,
        }
    ]


def test_queries_still_run(home, monkeypatch):
    d, db = home
    monkeypatch.chdir(d)
    for q, first in [
        ("SELECT count(*) AS n FROM runs", "n"),
        ("DESCRIBE runs", "column_name"),
        ("SHOW TABLES", "name"),
        ("SUMMARIZE runs", "column_name"),
        ("FROM runs SELECT name", "name"),
        ("WITH a AS (SELECT 1 AS x) SELECT * FROM a", "x"),
        ("VALUES (1)", "col0"),
        ("SELECT * FROM pragma_table_info('runs')", "cid"),
        ("EXPLAIN SELECT 1", "explain_key"),
        ("EXPLAIN ANALYZE SELECT count(*) FROM events", "explain_key"),
        ("EXPLAIN (ANALYZE, FORMAT json) SELECT 1", "explain_key"),
        ("/* c */ SELECT 1 AS x -- ; COPY (SELECT 1) TO 'x.csv'", "x"),
        ("SELECT * FROM main.runs", "run_id"),
        ("SELECT * FROM store.main.runs", "run_id"),
    ]:
        code, out, err = run("sql", q, "--db", str(db), "-f", "csv")
        assert code == 0 and out.splitlines()[0].split(",")[0] == first, (q, out, err)
    assert not Path("x.csv").exists()


def test_non_utf8_query_is_one_line(home):
    # bytes that are not UTF-8 in argv reach Python as lone surrogates; was a TypeError traceback
    # in DuckDB's extract_statements
    d, db = home
    r = subprocess.run(
        [sys.executable, "-m", "traceprof.cli", "sql", b"SELECT '\xff' AS x", "--db", str(db)],
        capture_output=True,
        cwd=d,
    )
    assert r.returncode == 1 and b"Traceback" not in r.stderr, r.stderr
    assert (
        r.stderr.decode() == "error: SQL error: the query is not UTF-8 text (a byte that is not UTF-8 at "
        "character 8); write it in UTF-8\n"
    )


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "1e308", "604801"])
def test_timeout_option_is_range_checked(home, value):
    d, db = home
    code, out, err = run("sql", "SELECT 1", "--db", str(db), "--timeout", value)
    assert (
        code == 1
        and err.startswith(f"error: --timeout {value}: expected seconds above 0")  # as typed
        and out == ""
    )


def test_timeout_stops_a_long_query(home):
    d, db = home
    start = time.monotonic()
    code, out, err = run(
        "sql",
        "SELECT count(*) FROM range(100000000000) a WHERE a.range % 7 = 3",
        "--db",
        str(db),
        "--timeout",
        "0.5",
    )
    took = time.monotonic() - start
    assert (code, out) == (1, "")
    assert err == (
        "error: SQL error: the query ran for over 0.5 s and was stopped (--timeout); give it more time "
        "with --timeout SECONDS\n"
    )
    assert took < 10, took  # the interrupt lands within DuckDB's next check, well under a second here


def test_huge_max_rows_is_all_rows(home):
    d, db = home
    code, out, err = run(
        "sql", "SELECT range AS n FROM range(3)", "--db", str(db), "-f", "csv", "--max-rows", str(10**30)
    )
    assert (code, out, err) == (0, "n\n0\n1\n2\n", "")


def test_the_engine_alone_holds_too(home, tmp_path):
    """Layers 2 and 3 without layer 1: statements run straight on the sandboxed connection (no
    statement check) still write nothing and change no setting."""
    from traceprof.storage.store import Store

    d, db = home
    with Store(db, user_sql=True) as store:
        for q in [
            f"COPY (SELECT 1) TO '{d}/s.duckdb.tmp/x.csv'",
            f"COPY (SELECT 1) TO '{tmp_path}/x.csv'",
            f"ATTACH '{tmp_path}/a.duckdb' AS a",
            f"EXPORT DATABASE '{tmp_path}/e'",
            "INSTALL httpfs",
            "LOAD httpfs",
            f"SELECT * FROM read_text('{d / 'secret.txt'}')",
        ]:
            with pytest.raises(duckdb.Error, match="Permission Error|disabled"):
                store.con.execute(q)
        for q in [
            "SET threads = 1000000",
            "SET memory_limit = '1TB'",
            f"SET temp_directory = '{tmp_path}'",
            "SET enable_external_access = true",
            "RESET threads",
            "SET lock_configuration = false",
        ]:
            with pytest.raises(duckdb.Error, match="locked|disabled"):
                store.con.execute(q)
        for q in ["CREATE TABLE t AS SELECT 1", "DELETE FROM runs"]:  # the store is attached read-only
            with pytest.raises(duckdb.Error, match="read-only"):
                store.con.execute(q)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("q", "word"),
    [
        ("INSTALL httpfs", "INSTALL"),
        ("FORCE INSTALL httpfs", "FORCE INSTALL"),
        ("LOAD httpfs", "LOAD"),
        ("CHECKPOINT", "CHECKPOINT"),
        ("FORCE CHECKPOINT", "FORCE CHECKPOINT"),
        ("ANALYZE", "ANALYZE"),
        ("USE memory", "USE"),
        ("RESET threads", "RESET"),
        ("COMMENT ON TABLE runs IS 'x'", "COMMENT"),
        ("WITH a AS (SELECT 1) INSERT INTO runs SELECT * FROM a", "INSERT"),
    ],
)
def test_a_refused_statement_is_named_by_its_own_word(q, word):
    # DuckDB files INSTALL under LOAD statements, CHECKPOINT under CALL, ANALYZE under VACUUM, USE and
    # RESET under SET, COMMENT under ALTER: the message said "CALL statement 'CHECKPOINT'"
    import duckdb

    from traceprof.core.errors import StoreError
    from traceprof.storage.sandbox import check

    with pytest.raises(StoreError, match="^" + re.escape(f"SQL error: {word} statement {q!r} is refused")):
        check(duckdb.connect(), q)
