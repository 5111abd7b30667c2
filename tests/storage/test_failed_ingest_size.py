"""A failed ingest leaves the store file as it was: its rows and its size.

Before: on a full disk `ingest` said "failed, store unchanged: no space left on the device" and the
file had grown from 7,352,320 to 8,069,120 bytes (DuckDB writes a transaction's rows into new blocks
of the file before the commit; the rollback frees them but kept the file that long).
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import duckdb

from tests._cli_inproc import run
from tests.conftest import corpus

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"
BLOCK = 262144  # DuckDB's block size (bytes)


def _rows(db: Path) -> dict[str, tuple[int, int]]:
    """(rows, hash of the rows) of each table: the store's contents, read by DuckDB itself."""
    con = duckdb.connect(str(db), read_only=True)
    try:
        tables = [t for (t,) in con.execute("SELECT table_name FROM duckdb_tables() ORDER BY 1").fetchall()]
        return {
            t: con.execute(f'SELECT count(*), coalesce(sum(hash(x)), 0) FROM "{t}" x').fetchone()
            for t in tables
        }
    finally:
        con.close()


def test_an_ingest_stopped_by_a_full_disk_leaves_the_file_its_size(tmp_path):
    db = tmp_path / "s.duckdb"
    assert run("ingest", str(SAMPLES / "normal"), "--db", str(db))[0] == 0
    size, rows = db.stat().st_size, _rows(db)
    # the disk holds 2 more blocks: DuckDB's write past them fails (EFBIG, as ENOSPC on a full disk)
    limit = size + 2 * BLOCK

    def full_disk() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))

    trace = corpus("hta/df_index_resolver")
    r = subprocess.run(
        [sys.executable, "-m", "traceprof.cli", "ingest", str(trace), "--db", str(db)],
        capture_output=True,
        text=True,
        preexec_fn=full_disk,
    )
    assert r.returncode == 1 and "failed, store unchanged: " in r.stderr and "File too large" in r.stderr, (
        r.stderr
    )
    assert db.stat().st_size == size  # was up to `limit`
    assert _rows(db) == rows
    assert sorted(os.listdir(tmp_path)) == ["s.duckdb", "s.duckdb.lock"]
    # the store takes the same ingest once there is room, and keeps the earlier run
    assert run("ingest", str(trace), "--db", str(db))[0] == 0
    assert [
        n
        for (n,) in duckdb.connect(str(db), read_only=True)
        .execute("SELECT name FROM runs ORDER BY 1")
        .fetchall()
    ] == [
        "df_index_resolver",
        "normal",
    ]
