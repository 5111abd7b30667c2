"""The store: generated schema docs, column comments, version check, read-only SQL, no torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from tests.conftest import REPO, SAMPLES
from traceprof.core import schema
from traceprof.core.errors import SchemaVersionError, StoreError
from traceprof.ingest.ingest import ingest
from traceprof.storage.store import Store


def test_schema_doc_is_current():
    assert (REPO / "docs" / "schema.md").read_text() == schema.markdown(), "run `make schema-doc`"


def test_column_comments_carry_units(store):
    rows = dict(
        store.sql("SELECT column_name, comment FROM duckdb_columns() WHERE table_name = 'events'").rows()
    )
    assert rows["ts_ns"].endswith("[ns]") and rows["dur_ns"].endswith("[ns]")
    # Every declared column of every table and view is in the store with its doc.
    for t in schema.TABLES:
        got = store.sql("SELECT column_name FROM duckdb_columns() WHERE table_name = ?", [t.name])
        assert got["column_name"].to_list() == t.column_names, t.name
    for name in ("kernels",):
        assert store.sql(f"SELECT * FROM {name} LIMIT 0").columns == schema.table(name).column_names


def test_time_columns_are_bigint_ns():
    for t in schema.TABLES:
        for c in t.columns:
            if c.name.endswith("_ns"):
                assert c.type.startswith("BIGINT") and c.unit == "ns", (t.name, c.name)


def test_args_are_stored_zstd_compressed(store):
    """events.args holds one distinct text per row: the store asks DuckDB for zstd (about half the
    insert CPU of its default dictionary + FSST, and 2-3x smaller), and the texts come back as given."""
    from traceprof.ingest.ingest import ingest

    ingest(store, [SAMPLES / "normal"])
    store.con.execute("CHECKPOINT")
    comp = store.sql(
        "SELECT DISTINCT compression FROM pragma_storage_info('events') "
        "WHERE column_name = 'args' AND segment_type = 'JSON'"
    )["compression"].to_list()
    assert comp == ["ZSTD"]
    # the stored text is the source's: each op's args still give its external_id column
    ops = store.sql(
        "SELECT count(*) AS n, count(*) FILTER (WHERE CAST(args->>'External id' AS BIGINT) "
        "IS DISTINCT FROM external_id) AS bad FROM events WHERE kind = 'cpu_op'"
    ).row(0)
    assert ops[0] > 1000 and ops[1] == 0


def test_schema_version_mismatch_refused(tmp_path):
    db = tmp_path / "s.duckdb"
    Store(db).close()
    con = duckdb.connect(str(db))
    con.execute("UPDATE meta SET value = '999' WHERE key = 'schema_version'")
    con.close()
    with pytest.raises(SchemaVersionError, match=f"version 999.*reads version {schema.SCHEMA_VERSION}"):
        Store(db)


def _lower_version(db: Path, *sql: str) -> bytes:
    """Make ``db`` a store of schema version 7 (run ``sql`` on it first); its bytes after."""
    con = duckdb.connect(str(db))
    for stmt in (*sql, "UPDATE meta SET value = '7' WHERE key = 'schema_version'"):
        con.execute(stmt)
    con.close()
    return db.read_bytes()


def test_older_schema_version_names_what_to_reingest(tmp_path):
    # The refusal lists the runs and files to re-ingest, for every way of opening, and writes nothing.
    db = tmp_path / "s.duckdb"
    with Store(db) as store:
        ingest(store, [SAMPLES / "normal"])
    before = _lower_version(db)
    files = ", ".join(str(SAMPLES / "normal" / f"rank{k}.trace.json.gz") for k in range(4))
    want = (
        f"{db}: store schema version 7, this traceprof reads version {schema.SCHEMA_VERSION}; "
        f"re-ingest the traces into a new store: run 'normal' (4 files: {files})"
    )
    for how in ({}, {"read_only": True}, {"user_sql": True}):
        with pytest.raises(SchemaVersionError) as e:
            Store(db, **how)
        assert str(e.value) == want, how
    assert db.read_bytes() == before


@pytest.mark.parametrize(
    ("value", "said"), [("'abc'", "'abc', not a number"), ("'٣'", "'٣', not a number"), (None, "missing")]
)
def test_a_schema_version_that_is_no_number_is_a_damaged_store(tmp_path, value, said):
    # 'abc' raised a ValueError traceback (int('abc')); a missing row read as "version -1"; the
    # Arabic-Indic digit three is a digit to str.isdigit, not a version
    db = tmp_path / "s.duckdb"
    with Store(db) as store:
        ingest(store, [SAMPLES / "normal"])
    con = duckdb.connect(str(db))
    if value is None:
        con.execute("DELETE FROM meta WHERE key = 'schema_version'")
    else:
        con.execute(f"UPDATE meta SET value = {value} WHERE key = 'schema_version'")
    con.close()
    before = db.read_bytes()
    with pytest.raises(SchemaVersionError) as e:
        Store(db, read_only=True)
    assert str(e.value).startswith(
        f"{db}: the store's schema version is {said} (this traceprof reads version {schema.SCHEMA_VERSION}): "
        "a damaged store; re-ingest the traces into a new store: run 'normal' (4 files: "
    ), str(e.value)
    assert db.read_bytes() == before


def test_older_schema_version_listing_is_bounded_and_tolerant(tmp_path):
    db = tmp_path / "s.duckdb"
    Store(db).close()
    # 20 paths in all, then counts; a run without files; traces of that version without a rank column.
    rows = [(i, 1, f"/t/a{i:02}") for i in range(18)] + [(18 + i, 2, f"/t/b{i}") for i in range(5)]
    _lower_version(
        db,
        "INSERT INTO runs (run_id, name) VALUES (1, 'a'), (2, 'b'), (3, 'c')",
        "DROP TABLE traces",
        "CREATE TABLE traces (trace_id INTEGER, run_id INTEGER, path VARCHAR)",
        "INSERT INTO traces VALUES " + ", ".join(f"({t}, {r}, '{p}')" for t, r, p in rows),
    )
    a = ", ".join(f"/t/a{i:02}" for i in range(18))
    with pytest.raises(SchemaVersionError) as e:
        Store(db, read_only=True)
    assert str(e.value).endswith(
        f"a new store: run 'a' (18 files: {a}), run 'b' (5 files: /t/b0, /t/b1, 3 more), run 'c' (0 files)"
    )
    # More than 20 runs: the first 20, then a count. No path column: the runs alone.
    db2 = tmp_path / "s2.duckdb"
    Store(db2).close()
    _lower_version(
        db2,
        "INSERT INTO runs (run_id, name) SELECT i, 'r' || i FROM range(1, 23) t(i)",
        "ALTER TABLE traces DROP COLUMN path",
    )
    with pytest.raises(SchemaVersionError) as e:
        Store(db2, read_only=True)
    runs = ", ".join(f"run 'r{i}'" for i in range(1, 21))
    assert str(e.value).endswith(f"a new store: {runs}, 2 more runs")
    # Not even the runs readable: the message as before.
    db3 = tmp_path / "s3.duckdb"
    Store(db3).close()
    _lower_version(db3, "DROP TABLE runs")
    with pytest.raises(SchemaVersionError) as e:
        Store(db3, read_only=True)
    assert str(e.value).endswith("; re-ingest the traces into a new store")


def test_not_a_store(tmp_path):
    db = tmp_path / "other.duckdb"
    con = duckdb.connect(str(db))
    con.execute("CREATE TABLE x (a INT)")
    con.close()
    with pytest.raises(StoreError, match="not a traceprof store"):
        Store(db)
    with pytest.raises(StoreError, match="no such store"):
        Store(tmp_path / "missing.duckdb", read_only=True)


def test_cli_sql_is_read_only(tmp_path):
    db = tmp_path / "s.duckdb"
    Store(db).close()
    target = tmp_path / "leak.csv"
    for query in (
        "DELETE FROM runs",
        "CREATE TABLE evil (a INT)",
        f"COPY runs TO '{target}'",
        f"SELECT * FROM read_csv('{REPO / 'Makefile'}')",
    ):
        r = subprocess.run(
            [sys.executable, "-m", "traceprof.cli", "sql", query, "--db", str(db)],
            capture_output=True,
            text=True,
        )
        assert r.returncode == 1 and "error:" in r.stderr and "Traceback" not in r.stderr, query
    assert not target.exists()


def test_analysis_side_does_not_import_torch():
    code = (
        "import sys, traceprof.cli, traceprof.render.report, traceprof.ingest.ingest, traceprof.collectors.kineto;"
        "from traceprof.engine import analysis; analysis.load_all();"
        "bad = [m for m in ('torch', 'pandas') if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stdout + r.stderr


def test_ctrl_c_inside_a_stream_duckdb_reads_counts_as_interrupted():
    """A KeyboardInterrupt raised while DuckDB pulls batches from Python (spooled events streamed
    into the store) comes back as a DuckDB error; it must still read as Ctrl-C (exit 130, not a
    failed ingest)."""
    import duckdb
    import pyarrow as pa

    from traceprof.storage.store import interrupted

    schema = pa.schema([("x", pa.int64())])

    def batches():
        yield pa.record_batch([pa.array([1, 2])], schema=schema)
        raise KeyboardInterrupt

    con = duckdb.connect()
    con.register("_incoming", pa.RecordBatchReader.from_batches(schema, batches()))
    with pytest.raises(duckdb.Error) as got:
        con.execute("CREATE TABLE t AS SELECT * FROM _incoming")
    assert interrupted(got.value)
    # the form CI saw when Ctrl-C came while DuckDB read the stream's schema
    assert interrupted(
        duckdb.InvalidInputException(
            "Invalid Input Error: reading the schema of the object registered as '_incoming' failed: KeyboardInterrupt: "
        )
    )
    assert not interrupted(
        duckdb.InvalidInputException("Conversion Error: 'KeyboardInterrupt' is not a number")
    )


@pytest.mark.parametrize("holder_read_only", [True, False])
def test_a_store_held_outside_traceprofs_lock_is_named_with_its_process(tmp_path, holder_read_only):
    """A DuckDB shell or notebook holding the store (it takes no traceprof lock) makes DuckDB refuse
    the opposite kind of open: one line naming that process, not DuckDB's text about file locks."""
    db = tmp_path / "s.duckdb"
    Store(db).close()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import duckdb, sys; c = duckdb.connect(sys.argv[1], read_only=sys.argv[2] == '1'); "
            "print('ready', flush=True); sys.stdin.read()",
            str(db),
            "1" if holder_read_only else "0",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline() == "ready\n"
        with pytest.raises(StoreError) as e:
            Store(db, read_only=not holder_read_only)
        assert str(e.value) == (
            f"{db}: open in another process that does not hold traceprof's lock for this "
            f"path (PID {holder.pid}, {Path(sys.executable).resolve()}): a DuckDB shell or "
            "notebook, or traceprof through a hard link to this file; close it or wait for it, "
            "and retry"
        )
    finally:
        holder.communicate("")
    Store(db).close()  # free once it is gone


def test_one_transaction_helper_commits_or_leaves_the_store_as_it_was(tmp_path):
    # Every write of the store goes through Store.transaction: a DuckDB error rolls back and is
    # the StoreError it names; commit=False always rolls back; the commit is recorded.
    import duckdb
    import pytest

    from traceprof.core.errors import StoreError

    with Store(tmp_path / "t.duckdb") as store:
        with store.transaction(record=lambda: ("meta", 0)) as con:
            con.execute("INSERT INTO meta VALUES ('a', '1')")
        assert store.commits == [("meta", 0)]
        with (
            pytest.raises(StoreError, match="^adding b failed: "),
            store.transaction(error=lambda e: f"adding b failed: {e}") as con,
        ):
            con.execute("INSERT INTO meta VALUES ('b', '2')")
            con.execute("INSERT INTO no_such_table VALUES (1)")
        with store.transaction(commit=False) as con:
            con.execute("INSERT INTO meta VALUES ('c', '3')")
        with pytest.raises(duckdb.Error), store.transaction() as con:  # no error text given: DuckDB's own
            con.execute("SELECT * FROM no_such_table")
        keys = {k for (k,) in store.con.execute("SELECT key FROM meta").fetchall()}
        assert "a" in keys and not {"b", "c"} & keys and store.commits == [("meta", 0)]


def test_query_results_come_in_one_chunk(store):
    # DuckDB's parallel scan returns a result in one or several Arrow batches from run to run, and
    # polars computes x / scalar by chunk layout (one chunk: x times the reciprocal, 100 * 800000 /
    # 1600000 = 50.00000000000001; two: 50.0): Store.sql hands back one chunk, so analyses give the
    # same bytes on every run.
    df = store.sql("SELECT range AS x FROM range(3000000)")
    assert df.height == 3_000_000 and df.n_chunks() == 1


@pytest.mark.parametrize("layout_", ["duckdb", "parquet"])
def test_shift_traces_moves_each_trace_by_its_own_delta(tmp_path, layout_: str) -> None:
    """``Store.shift_traces`` (clock alignment's one statement per table for every rank) adds each
    trace's own delta to its events, steps and collectives and leaves the others alone: checked
    row by row against the times before (4 sample ranks: rank 0 +5 ns, rank 1 -7 ns, rank 2 0,
    rank 3 +2**40 ns), in both layouts."""
    from tests.conftest import SAMPLES
    from traceprof.ingest.ingest import ingest

    src = SAMPLES / "straggler_rank2"
    if not (src / "rank0.trace.json.gz").exists():
        pytest.skip("sample not recorded")
    import polars as pl

    with Store(tmp_path / "s.duckdb", **({"layout": "parquet"} if layout_ == "parquet" else {})) as s:
        ingest(s, [src])
        ids = dict(s.sql("SELECT rank, trace_id FROM traces").iter_rows())
        delta = {ids[0]: 5, ids[1]: -7, ids[2]: 0, ids[3]: 2**40}
        q = {
            "events": "SELECT trace_id, name, dur_ns, ts_ns AS t FROM events",
            "steps": "SELECT trace_id, step, cpu_start_ns AS t, cpu_end_ns AS u FROM steps",
            "collectives": "SELECT trace_id, op, seq, pg, end_ns AS t, enter_ns AS u FROM collectives",
        }
        before = {k: s.sql(v) for k, v in q.items()}
        s.shift_traces(delta, ("steps: cpu_start_ns, cpu_end_ns", "collectives: enter_ns, end_ns"))
        for k, v in q.items():
            after = s.sql(v)
            keys = after.columns  # a uniform shift keeps each trace's order
            moved = before[k].with_columns(
                pl.col(c) + pl.col("trace_id").replace_strict(delta, default=0, return_dtype=pl.Int64)
                for c in ("t", "u")
                if c in after.columns
            )
            assert moved.sort(keys, nulls_last=True).equals(after.sort(keys, nulls_last=True)), k
            assert after.height > 0
