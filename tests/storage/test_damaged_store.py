"""A store file cut short or overwritten is one line naming it, for every command.

Before: `head -c 4194304 demo.duckdb > t.duckdb; traceprof ingest ... --db t.duckdb` ended in a
traceback (`_duckdb.IOException: IO Error: Could not read enough bytes from file ...`, from
`SELECT DISTINCT bytes FROM traces`); `runs` on it said `error: SQL error: IO Error: ...`.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tests._cli_inproc import run

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"

#: Each command that reads the store, with what it needs.
COMMANDS = [
    ("ingest", str(SAMPLES / "straggler_rank2")),
    ("runs",),
    ("runs", "-f", "csv"),
    ("sql", "select count(*) from cpu_ops"),
    ("analyze", "stragglers", "--run", "normal", "--no-cache"),
    ("summary", "--run", "normal", "--no-cache"),
    ("diff", "normal", "extra_matmul"),
    ("baseline", "list"),
    ("history", "normal,extra_matmul"),
    ("runs", "rm", "normal"),
    ("runs", "mv", "normal", "n2"),
]


@pytest.fixture(scope="module")
def whole(tmp_path_factory) -> bytes:
    db = tmp_path_factory.mktemp("whole") / "s.duckdb"
    for r in ("normal", "extra_matmul"):
        assert run("ingest", str(SAMPLES / r), "--db", str(db))[0] == 0
    return db.read_bytes()


def _cut_in_its_data(data: bytes) -> bytes:
    # DuckDB's file: 3 headers of 4 KiB, then blocks of 256 KiB; the first data blocks hold the catalog,
    # so keeping two of them opens the file and its tables' rows are gone (as `head -c` left it)
    assert len(data) > 12288 + 4 * 262144
    return data[: 12288 + 2 * 262144]


def _header_overwritten(data: bytes) -> bytes:
    # both database headers (at 4 KiB and 8 KiB) zeroed: DuckDB's checksum of them fails at open
    return data[:4096] + bytes(8192) + data[12288:]


@pytest.mark.parametrize(
    "damage",
    [_cut_in_its_data, lambda d: d[:100_000], _header_overwritten],
    ids=["cut in its data", "cut in its catalog", "headers overwritten"],
)
@pytest.mark.parametrize("args", COMMANDS, ids=" ".join)
def test_a_damaged_store_is_one_line_naming_it(tmp_path, whole, damage, args):
    db = tmp_path / "t.duckdb"
    db.write_bytes(damage(whole))
    before = db.read_bytes()
    code, _, err = run(*args, "--db", str(db))
    assert code == 1 and err.count("\n") == 1, err
    assert re.fullmatch(
        rf"error: {re.escape(str(db))}: the store file is damaged \(cut short or overwritten: "
        r"(IO Error: Could not read enough bytes from file .*|Corrupt database file: .*)\); restore it "
        r"from a copy or ingest the traces into a new store\n",
        err,
    ), err
    assert db.read_bytes() == before  # nothing written to it
    assert sorted(os.listdir(tmp_path)) in (["t.duckdb"], ["t.duckdb", "t.duckdb.lock"])
