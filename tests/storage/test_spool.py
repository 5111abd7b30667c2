"""Multi-file ingest into the DuckDB layout: events spooled beside the store (``traceprof.storage.layout.spool``),
the spool folder removed when done and swept when a killed ingest left it; already stored files
found without hashing every file twice."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.conftest import SAMPLES
from traceprof.ingest import ingest as ingest_mod
from traceprof.ingest.ingest import ingest
from traceprof.storage import layout
from traceprof.storage.store import Store


def _spools(db: Path) -> list[Path]:
    return sorted(db.parent.glob(f".{db.name}.spool-*"))


def _events(db: Path) -> list[tuple]:
    with Store(db, read_only=True) as s:
        return s.con.execute("SELECT * EXCLUDE (trace_id) FROM events ORDER BY ALL").fetchall()


def test_spooled_ingest_stores_what_one_file_at_a_time_does(tmp_path: Path) -> None:
    """Two rank files in one ingest (spooled) store the same event rows as one ingest per file
    (no spool: a single file is parsed and inserted directly), and leave no spool folder."""
    files = sorted((SAMPLES / "normal").glob("*.trace.json.gz"))[:2]
    assert len(files) == 2
    together, apart = tmp_path / "t.duckdb", tmp_path / "a.duckdb"
    with Store(together) as s:
        ingest(s, files, run="r", align=False)
    with Store(apart) as s:
        for f in files:
            ingest(s, [f], run="r", align=False)
    assert _spools(together) == []
    assert _events(together) != [] and _events(together) == _events(apart)


def test_stale_spool_folder_is_swept_at_the_next_writable_open(tmp_path: Path) -> None:
    """A spool folder left by a killed ingest (kill -9 skips ingest's cleanup) is deleted when the
    store is next opened writable, not by a read-only open; another store's folder is kept."""
    db = tmp_path / "s.duckdb"
    Store(db).close()
    stale = layout.spool_dir(db)
    (stale / "0123.arrow").write_bytes(b"left by a killed ingest")
    other = layout.spool_dir(tmp_path / "s.duckdb2")  # a store whose name starts with this one's
    with Store(db, read_only=True):
        pass
    assert stale.is_dir()
    with Store(db):
        pass
    assert not stale.exists() and other.is_dir()


def test_already_stored_files_are_skipped_and_new_sizes_not_hashed_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Into an empty store no file is hashed before parsing (the parser hashes as it reads); a
    second ingest of the same files hashes them (their sizes are stored) and skips them all."""
    src = tmp_path / "run"
    shutil.copytree(SAMPLES / "normal", src)
    db = tmp_path / "h.duckdb"
    hashed: list[Path] = []
    real = ingest_mod._sha256
    monkeypatch.setattr(ingest_mod, "_sha256", lambda p: hashed.append(p) or real(p))
    with Store(db) as s:
        first = ingest(s, [src])
    assert hashed == [] and first.added
    with Store(db) as s:
        again = ingest(s, [src])
    assert sorted(map(str, hashed)) == sorted(first.added) == sorted(again.skipped)
    assert again.added == [] and again.runs == {}


def test_spooled_file_that_fails_mid_stream_names_the_file_and_stores_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The events of a multi-file ingest go in as one stream that DuckDB pulls; when a spooled
    file fails after some batches were inserted, the error names that file (not DuckDB's "arrow
    scan failed" or "transaction is aborted"), nothing is stored, and the store takes the files
    afterwards with every row."""
    import pyarrow as pa

    from traceprof.core.errors import StoreError

    files = sorted((SAMPLES / "normal").glob("*.trace.json.gz"))[:2]
    real = layout.SpooledTrace.read_events

    def broken(self: layout.SpooledTrace) -> pa.RecordBatchReader:
        r = real(self)

        def batches():
            yield r.read_next_batch()
            raise StoreError(f"{self.events_file}: cannot read the events spooled for {self.path}: bad block")

        return pa.RecordBatchReader.from_batches(r.schema, batches())

    db = tmp_path / "s.duckdb"
    Store(db).close()
    monkeypatch.setattr(layout.SpooledTrace, "read_events", broken)
    with Store(db) as s:
        with pytest.raises(
            StoreError, match=r"cannot read the events spooled for .*rank0\.trace\.json\.gz: bad block"
        ):
            ingest(s, files, run="r", align=False, jobs=1)
        assert s.con.execute("SELECT count(*) FROM events").fetchone() == (0,)
        assert s.con.execute("SELECT count(*) FROM runs").fetchone() == (0,)
        assert s.con.execute("SELECT current_setting('preserve_insertion_order')").fetchone() == (True,)
    monkeypatch.setattr(layout.SpooledTrace, "read_events", real)
    with Store(db) as s:
        ingest(s, files, run="r", align=False)
    apart = tmp_path / "a.duckdb"
    with Store(apart) as s:
        for f in files:
            ingest(s, [f], run="r", align=False)
    assert _events(db) == _events(apart)
    with Store(db, read_only=True) as s:  # each row carries its own trace's id and rank
        assert s.con.execute("""SELECT count(*), count(DISTINCT e.trace_id) FROM events e JOIN traces t
                                ON e.trace_id = t.trace_id AND e.rank = t.rank""").fetchone() == (
            len(_events(db)),
            2,
        )
