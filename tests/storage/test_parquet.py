"""The Parquet layout (traceprof.storage.layout): same answers as the DuckDB layout, atomic ingest, runs rm,
read-only SQL that reads only the store's own files."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import polars as pl
import pytest

from tests._cli_inproc import run as cli
from tests.conftest import SAMPLES
from traceprof.core.errors import StoreError, TraceprofError
from traceprof.core.parsed import ParseOptions
from traceprof.engine import analysis as registry
from traceprof.ingest.ingest import ingest
from traceprof.storage import layout
from traceprof.storage.runs import remove
from traceprof.storage.store import Store

#: Tables compared row for row between the layouts (order-independent: sorted on all columns).
TABLES = ("runs", "traces", "devices", "events", "steps", "collectives", "collective_instances", "kernels")
#: Columns that differ by design: the store's own file paths and the time of ingest.
VOLATILE = {"ingested_at"}


def _files(store_path: Path) -> set[str]:
    root = layout.dataset_dir(store_path)
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()} if root.exists() else set()


def _table(store: Store, name: str) -> pl.DataFrame:
    df = store.sql(f"SELECT * FROM {name}")
    df = df.drop([c for c in df.columns if c in VOLATILE])
    return df.sort(df.columns, nulls_last=True)


def _sorted(df: pl.DataFrame) -> pl.DataFrame:
    """Rows in a fixed order, floats to 9 decimals: ties may come in any order and floating-point
    sums in another order (scan order differs between the layouts)."""
    df = df.with_columns(pl.col(c).round(9) for c, t in df.schema.items() if t.is_float())
    cols = [c for c, t in df.schema.items() if not t.is_nested()]
    return df.sort(cols, nulls_last=True) if cols and df.height else df


def _results(store: Store) -> dict[tuple[str, str], object]:
    """Every analysis on every run: its frames, or its error message."""
    registry.load_all()
    out: dict[tuple[str, str], object] = {}
    for run in store.sql("SELECT name FROM runs ORDER BY run_id")["name"].to_list():
        for name in registry.names():
            an = registry.get(name)
            try:
                out[(run, name)] = an.run(store, an.params(run=run)).frames()
            except TraceprofError as e:
                out[(run, name)] = f"error: {e}"
    return out


@pytest.fixture(scope="module")
def both(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """sample_traces ingested into a DuckDB-layout and a Parquet-layout store."""
    d = tmp_path_factory.mktemp("layouts")
    paths = []
    for lay in layout.LAYOUTS:
        with Store(d / f"{lay}.duckdb", layout=lay) as s:
            ingest(s, [SAMPLES], jobs=1)
        paths.append(d / f"{lay}.duckdb")
    return paths[0], paths[1]


def test_same_rows_and_analyses_as_duckdb_layout(both: tuple[Path, Path]) -> None:
    duck, parq = both
    with Store(duck, read_only=True) as a, Store(parq, read_only=True) as b:
        assert (a.layout, b.layout) == ("duckdb", "parquet")
        for t in TABLES:
            assert _table(a, t).equals(_table(b, t)), t
        assert a.sql("SELECT count(*) AS n FROM parts")["n"][0] == 0
        assert (
            b.sql("SELECT sum(rows) AS n FROM parts")["n"][0]
            == a.sql("SELECT count(*) AS n FROM events")["n"][0]
        )
        ra, rb = _results(a), _results(b)
    assert ra.keys() == rb.keys()
    for key, fa in ra.items():
        fb = rb[key]
        if isinstance(fa, str):
            assert fa == fb, key
            continue
        assert isinstance(fb, dict) and fa.keys() == fb.keys(), key
        for name, frame in fa.items():
            if key[1] == "whatif" and name == "blame":
                continue  # its top-op list varies between runs on one store, in either layout
            assert _sorted(frame).equals(_sorted(fb[name])), (key, name)


def test_events_live_in_parquet_files_and_the_store_stays_small(both: tuple[Path, Path]) -> None:
    duck, parq = both
    files = _files(parq)
    assert files and all(f.startswith("events/run_id=") and f.endswith("/part-0.parquet") for f in files)
    assert parq.stat().st_size < duck.stat().st_size
    with Store(parq, read_only=True) as s:
        kinds = dict(s.sql("SELECT table_name, table_type FROM information_schema.tables").iter_rows())
        assert kinds["events"] == "VIEW" and kinds["parts"] == "BASE TABLE"
        # the column docs are there for SQL users as in the DuckDB layout
        doc = s.sql(
            "SELECT comment FROM duckdb_columns() WHERE table_name = 'events' AND column_name = 'ts_ns'"
        )
        assert "[ns]" in doc["comment"][0]


def test_read_only_sql_reads_only_the_store(both: tuple[Path, Path], tmp_path: Path) -> None:
    _, parq = both
    outside = tmp_path / "secret.csv"
    outside.write_text("a\n1\n")
    part = sorted(layout.dataset_dir(parq).rglob("*.parquet"))[0]
    refused = [
        "SELECT * FROM read_csv('/etc/passwd')",
        f"SELECT * FROM read_csv('{outside}')",
        f"SELECT * FROM glob('{layout.dataset_dir(parq)}/*')",
        f"COPY (SELECT 1 AS a) TO '{part}' (USE_TMP_FILE false)",
        f"COPY (SELECT 1 AS a) TO '{part.parent}/x.parquet'",
        "SET allowed_paths = ['/etc/passwd']",
        "SET allowed_directories = ['/']",
        "SET enable_external_access = true",
        "CREATE TABLE t AS SELECT 1",
    ]
    for q in refused:
        code, out, err = cli("sql", q, "--db", str(parq))
        assert code == 1 and "error" in err, (q, out)
    assert part.stat().st_size > 100  # not overwritten
    code, out, _ = cli("sql", "SELECT count(*) AS n FROM events", "--db", str(parq), "-f", "csv")
    assert code == 0 and int(out.split()[1]) > 0


def test_layout_is_kept_by_later_ingests(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    code, _, err = cli("ingest", str(SAMPLES / "normal"), "--db", str(db), "--layout", "parquet")
    assert code == 0, err
    code, _, err = cli("ingest", str(SAMPLES / "clean"), "--db", str(db))  # no --layout: the store's
    assert code == 0, err
    with Store(db, read_only=True) as s:
        assert s.layout == "parquet"
        assert sorted(s.sql("SELECT DISTINCT run_id FROM parts")["run_id"].to_list()) == [1, 2]
    code, _, err = cli("ingest", str(SAMPLES / "sleep_rank1"), "--db", str(db), "--layout", "duckdb")
    assert code == 1 and "parquet layout" in err
    code, _, err = cli("ingest", str(SAMPLES / "sleep_rank1"), "--db", str(db), "--layout", "arrow")
    assert code == 1 and "--layout 'arrow'" in err


def test_layout_chosen_by_input_size(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = tmp_path / "s.duckdb"
    size = layout.estimate_bytes([SAMPLES / "normal"])
    gz = sum(f.stat().st_size for f in (SAMPLES / "normal").glob("*.gz"))
    assert size >= layout.GZ_INFLATE_ESTIMATE * gz  # a .gz counts as 8x its size
    assert layout.choose(db, [SAMPLES / "normal"], None) == "duckdb"
    monkeypatch.setattr(layout, "AUTO_PARQUET_BYTES", size - 1)
    assert layout.choose(db, [SAMPLES / "normal"], None) == "parquet"
    assert layout.choose(db, [SAMPLES / "normal"], "duckdb") == "duckdb"
    db.write_bytes(b"")  # an existing store keeps its layout, whatever the size
    assert layout.choose(db, [SAMPLES / "normal"], None) is None


def test_failed_ingest_leaves_no_parquet_files(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    with Store(db, layout="parquet") as s:
        ingest(s, [SAMPLES / "normal"], jobs=1)
    before = _files(db)
    bad = tmp_path / "mixed"
    shutil.copytree(SAMPLES / "clean", bad)
    (bad / "rank3.trace.json.gz").write_bytes(b"\x1f\x8b not gzip")
    with Store(db) as s, pytest.raises(TraceprofError, match="rank3"):
        ingest(s, [bad], jobs=1)
    assert _files(db) == before  # nothing staged is left, nothing published

    # A failure inside the transaction, after the files were staged: rolled back, files gone.
    def boom(run_id: int) -> None:
        raise StoreError("injected")

    with Store(db) as s:
        from traceprof.ingest.ingest import _parse_one

        pts = [pt for f in sorted((SAMPLES / "clean").glob("*.gz")) for pt in _parse_one((f, ParseOptions()))]
        with pytest.raises(StoreError, match="injected"):
            s.insert_run("clean", pts, after=boom)
        assert (
            s.sql("SELECT count(*) AS n FROM events")["n"][0]
            == s.sql("SELECT sum(events_kept) AS n FROM traces")["n"][0]
        )
    assert _files(db) == before


def test_crash_leftovers_are_never_read_and_swept(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    with Store(db, layout="parquet") as s:
        ingest(s, [SAMPLES / "normal"], jobs=1)
        n = s.sql("SELECT count(*) AS n FROM events")["n"][0]
    root = layout.dataset_dir(db)
    stray = root / "events/run_id=9/rank=0/trace_id=99/part-0.parquet"
    stray.parent.mkdir(parents=True)
    shutil.copy(next(root.rglob("part-0.parquet")), stray)
    (root / "_staging/abc").mkdir(parents=True)
    with Store(db, read_only=True) as s:
        assert s.sql("SELECT count(*) AS n FROM events")["n"][0] == n
    with Store(db) as s:
        assert s.sql("SELECT count(*) AS n FROM events")["n"][0] == n
    assert not stray.exists() and not (root / "events/run_id=9").exists() and not (root / "_staging").exists()


def test_runs_rm_removes_partitions(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    with Store(db, layout="parquet") as s:
        ingest(s, [SAMPLES / "normal", SAMPLES / "clean"], jobs=1)
        ids = dict(s.sql("SELECT name, run_id FROM runs").iter_rows())
        events = s.sql("SELECT count(*) AS n FROM events WHERE run_id = ?", [ids["normal"]])["n"][0]
        removed = remove(s, "normal").rows
        assert removed > events  # rows in its files count as removed rows
        assert s.sql("SELECT count(*) AS n FROM events WHERE run_id = ?", [ids["normal"]])["n"][0] == 0
        assert s.sql("SELECT count(*) AS n FROM events")["n"][0] > 0
    files = _files(db)
    assert files and not any(f.startswith(f"events/run_id={ids['normal']}/") for f in files)
    assert not (layout.dataset_dir(db) / f"events/run_id={ids['normal']}").exists()
    with Store(db) as s:  # its files can be ingested again
        ingest(s, [SAMPLES / "normal"], jobs=1)
        assert s.sql("SELECT count(*) AS n FROM runs")["n"][0] == 2
    with Store(tmp_path / "d.duckdb", layout="duckdb") as s:  # the same count as the DuckDB layout's
        ingest(s, [SAMPLES / "normal"], jobs=1)
        assert remove(s, "normal").rows == removed


def test_failed_first_ingest_deletes_store_and_dataset(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "rank0.trace.json").write_text("{not json")
    code, _, err = cli("ingest", str(bad), "--db", str(db), "--layout", "parquet")
    assert code == 1 and "rank0.trace.json" in err
    assert not db.exists() and not layout.dataset_dir(db).exists()


def test_realignment_shifts_existing_files(tmp_path: Path) -> None:
    """A run that gains ranks is realigned; existing files get a new ts_shift_ns, not a rewrite."""
    files = sorted((SAMPLES / "straggler_rank2").glob("*.gz"))
    out = {}
    for lay in layout.LAYOUTS:
        db = tmp_path / f"{lay}.duckdb"
        with Store(db, layout=lay) as s:
            ingest(s, files[:2], run="r", jobs=1)
            ingest(s, files[2:], run="r", jobs=1)
            out[lay] = (_table(s, "events"), _table(s, "traces").drop("trace_id"))
    assert out["duckdb"][0].equals(out["parquet"][0])
    assert out["duckdb"][1].equals(out["parquet"][1])


def test_store_path_with_equals_sign_refused(tmp_path: Path) -> None:
    d = tmp_path / "a=b"
    d.mkdir()
    with pytest.raises(StoreError, match="without '='"):
        Store(d / "s.duckdb", layout="parquet")
    assert not (d / "s.duckdb").exists()


@pytest.mark.parametrize(
    ("folder", "why"),
    [
        ("st*ar", "Parquet-layout store needs a path without '*'"),
        ("br[ack]et", "Parquet-layout store needs a path without '['"),
        ("qu?es", "DuckDB cannot keep a store at a path holding '?'"),  # any layout (test_reliability)
    ],
)
def test_store_path_with_a_glob_character_refused(tmp_path: Path, folder: str, why: str) -> None:
    # DuckDB globs every path read_parquet is given: 'st*ar' would also read 'stXar''s files
    d = tmp_path / folder
    d.mkdir()
    (tmp_path / folder.replace("*", "X").replace("[ack]", "c")).mkdir(exist_ok=True)
    with pytest.raises(StoreError, match=re.escape(why)):
        Store(d / "s.duckdb", layout="parquet")
    assert not (d / "s.duckdb").exists()


@pytest.mark.parametrize("damage", ["delete", "truncate"])
def test_a_damaged_file_refuses_its_run_only_and_runs_rm_recovers(tmp_path: Path, damage: str) -> None:
    db = tmp_path / "s.duckdb"
    with Store(db, layout="parquet") as s:
        ingest(s, [SAMPLES / "normal", SAMPLES / "clean"], jobs=1)
        ((kept,),) = s.con.execute(
            "SELECT count(*) FROM events e JOIN runs r USING (run_id) WHERE r.name = 'clean'"
        ).fetchall()
        ((total,),) = s.con.execute("SELECT count(*) FROM events").fetchall()
    part = next((layout.dataset_dir(db) / "events").glob("run_id=1/rank=*/trace_id=*/part-0.parquet"))
    with Store(db, read_only=True) as s:
        rel = str(part.relative_to(layout.dataset_dir(db)))
        ((lost,),) = s.con.execute("SELECT rows FROM parts WHERE path = ?", [rel]).fetchall()
    if damage == "delete":
        part.unlink()
    else:
        part.write_bytes(part.read_bytes()[:-100])
    code, out, err = cli("runs", "--db", str(db))  # the listing still works, and says which run is damaged
    assert code == 0 and "normal" in out and "clean" in out, err
    assert "run(s) 'normal': Parquet files missing or damaged" in err
    code, out, err = cli("sql", "SELECT count(*) AS n FROM events", "--db", str(db), "-f", "csv")
    assert code == 0 and out.split() == ["n", str(total - lost)] and "left out of queries" in err
    code, _, err = cli("analyze", "temporal", "--db", str(db), "--run", "normal")
    assert code == 1 and "run 'normal'" in err and "missing or damaged" in err and str(part) in err
    assert "traceprof runs rm normal" in err and "Traceback" not in err
    code, out, err = cli("analyze", "temporal", "--db", str(db), "--run", "clean", "-f", "csv")
    assert code == 0, err  # the intact run is read as before
    with Store(db, read_only=True) as s:
        assert s.con.execute("SELECT count(*) FROM events WHERE run_id = 2").fetchall() == [(kept,)]
    code, _, err = cli("runs", "rm", "normal", "--db", str(db))
    assert code == 0, err
    assert not (layout.dataset_dir(db) / "events" / "run_id=1").exists()
    code, _, err = cli("ingest", str(SAMPLES / "normal"), "--db", str(db))
    assert code == 0, err
    code, _, err = cli("analyze", "temporal", "--db", str(db), "--run", "normal", "-f", "csv")
    assert code == 0, err


@pytest.mark.parametrize("cmd", [["runs", "rm", "x"], ["runs", "mv", "x", "y"]])
def test_runs_rm_and_mv_never_create_a_store(tmp_path: Path, cmd: list[str]) -> None:
    db = tmp_path / "typo.duckdb"
    code, _, err = cli(*cmd, "--db", str(db))
    assert code == 1 and "no such store" in err
    assert list(tmp_path.iterdir()) == []


def test_ctrl_c_while_a_part_is_written_is_a_keyboard_interrupt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # DuckDB reads the rows as a stream of batches (spilled args); Ctrl-C in that Python generator
    # comes back inside DuckDB's error, which was reported as "cannot write events rows" (exit 1).
    import pyarrow as pa

    from traceprof.core import spill

    tbl = pa.table({"ts_ns": pa.array(range(200_000), pa.int64())})

    def interrupted_after_one(t: pa.Table) -> pa.RecordBatchReader:
        def gen():  # type: ignore[no-untyped-def]
            yield from t.to_batches(max_chunksize=1000)[:1]
            raise KeyboardInterrupt

        return pa.RecordBatchReader.from_batches(t.schema, gen())

    monkeypatch.setattr(spill, "readable", interrupted_after_one)
    with pytest.raises(KeyboardInterrupt):
        layout.write_part(tbl, tmp_path / "p" / "part-0.parquet")


def test_duckdb_io_errors_are_one_plain_line() -> None:
    import duckdb

    full = duckdb.IOException(
        'IO Error: Async write failed for range [offset=2026602, size=124794]: {"exception_type":'
        '"IO","exception_message":"Could not write file \\"/x/p.parquet\\": No space left on device",'
        '"errno":"28"}'
    )
    assert layout.error_line(full) == "no space left on the device"
    other = duckdb.IOException(
        'IO Error: {"exception_type":"IO","exception_message":"Cannot open file \\"/x\\": '
        'Permission denied","errno":"13"}\nmore'
    )
    assert layout.error_line(other) == 'IO Error: Cannot open file "/x": Permission denied'


def test_a_symlinked_store_finds_the_dataset_and_results_of_its_target(tmp_path: Path) -> None:
    """Every sidecar (lock, Parquet dataset, kept results, spool) is beside the file a symlinked
    --db points to: before, a link looked for LINK.parquet and called the run's files missing."""
    real, link = tmp_path / "real.duckdb", tmp_path / "link.duckdb"
    assert cli("ingest", str(SAMPLES / "normal"), "--db", str(real), "--layout", "parquet")[0] == 0
    link.symlink_to(real.name)
    assert layout.dataset_dir(link) == layout.dataset_dir(real) == tmp_path / "real.duckdb.parquet"
    via_real = cli("analyze", "overlap", "--db", str(real), "-f", "csv", "--no-cache")
    via_link = cli("analyze", "overlap", "--db", str(link), "-f", "csv")
    assert via_link == via_real and via_real[0] == 0 and via_real[1].count("\n") == 5  # header + 4 ranks
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".results")] == ["real.duckdb.results"]
    # an ingest through the link writes into the target's dataset, its spool beside the target too
    code, _, err = cli("ingest", str(SAMPLES / "sleep_rank1"), "--db", str(link))
    assert code == 0, err
    with Store(real, read_only=True) as s:
        assert s.sql("SELECT count(*) AS n FROM runs")["n"].item() == 2
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".link")]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "link.duckdb",
        "real.duckdb",
        "real.duckdb.lock",
        "real.duckdb.parquet",
        "real.duckdb.results",
    ]


@pytest.mark.parametrize("lay", layout.LAYOUTS)
def test_store_names_too_long_for_their_sidecars_are_refused(tmp_path: Path, lay: str) -> None:
    """The longest name a writer takes still fits every sidecar's name (a multi-file ingest spools
    beside the store, then a report keeps its results); one byte more is one clear line."""
    from traceprof.storage.store import MAX_NAME_BYTES

    longest = tmp_path / ("s" * (MAX_NAME_BYTES - len(".duckdb")) + ".duckdb")
    assert cli("ingest", str(SAMPLES / "normal"), "--db", str(longest), "--layout", lay)[0] == 0
    code, _, err = cli("report", "--db", str(longest), "-o", str(tmp_path / "r.html"))
    assert (code, err) == (0, f"report written to {tmp_path / 'r.html'}\n")
    assert (tmp_path / (longest.name + ".results")).is_dir()
    over = tmp_path / ("s" * (MAX_NAME_BYTES + 1 - len(".duckdb")) + ".duckdb")
    code, _, err = cli("ingest", str(SAMPLES / "normal"), "--db", str(over), "--layout", lay)
    assert (code, err) == (
        1,
        f"error: {over}: a store file name of {MAX_NAME_BYTES + 1} bytes is too long to "
        "write: its Parquet, results and spool folders are kept beside it under longer names; "
        f"use a name of at most {MAX_NAME_BYTES} bytes\n",
    )
    assert not over.exists()
