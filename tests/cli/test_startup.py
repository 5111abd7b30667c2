"""What the CLI's quick commands import: `--version` and `runs` load neither polars, numpy nor pyarrow
(0.6 s of CPU together), no command here loads the report's or the capture's libraries (bokeh,
holoviews, pandas, torch, dask), and `runs` prints the same table without polars as with it.

Checked on the modules loaded, not on timings, which a busy CI machine makes flaky; the timings
are in benchmarks/bench.py (``startup``)."""

from __future__ import annotations

import subprocess
import sys
from datetime import datetime

import polars as pl
import pytest

from tests.conftest import SAMPLES
from traceprof.core.display import row_cells, table_rows
from traceprof.core.names import distinct_short
from traceprof.storage.store import Store

#: Never loaded by a command that neither writes a report nor captures nor runs on Dask.
NEVER = ["bokeh", "holoviews", "pandas", "torch", "dask", "distributed"]
#: Not loaded by `--version` and `runs`.
FRAMES = ["polars", "numpy", "pyarrow"]


def _loaded(args: list[str], cwd) -> tuple[int, list[str], str]:
    """Run the CLI in a child with ``args``; its exit code, the modules of NEVER + FRAMES it loaded,
    and its stdout."""
    code = (
        "import sys\nfrom traceprof.entry import main\n"
        f"sys.argv = ['traceprof', *{args!r}]\ncode = 0\n"
        "try:\n    main()\nexcept SystemExit as e:\n    code = e.code or 0\n"
        f"print('MODULES', code, sorted(m for m in {NEVER + FRAMES!r} if m in sys.modules), file=sys.stderr)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd)
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("MODULES"), r.stderr
    _, rc, mods = last.split(" ", 2)
    return int(rc), eval(mods), r.stdout  # noqa: S307 - our own child's printed list


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("startup")
    path = tmp / "s.duckdb"
    r = subprocess.run(
        [sys.executable, "-m", "traceprof.cli", "ingest", str(SAMPLES / "normal"), "--db", str(path)],
        capture_output=True,
        text=True,
        cwd=tmp,
    )
    assert r.returncode == 0, r.stderr
    return path


def test_version_and_runs_import_no_frame_library(db):
    for args in (["--version"], ["runs", "--db", str(db)]):
        rc, mods, out = _loaded(args, db.parent)
        assert rc == 0 and mods == [], (args, mods)
    assert "normal" in out  # runs printed the run


def test_version_and_help_import_no_duckdb(tmp_path):
    # the console script imports DuckDB first (Ctrl-C held off while it loads) for the commands that
    # open a store; --version and --help open none
    for args in (["--version"], ["--help"]):
        code = (
            "import sys\nfrom traceprof.entry import main\n"
            f"sys.argv = ['traceprof', *{args!r}]\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "print('DUCKDB', 'duckdb' in sys.modules, file=sys.stderr)"
        )
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
        assert r.stderr.strip().splitlines()[-1] == "DUCKDB False", (args, r.stderr)
        assert ("traceprof " if args == ["--version"] else "Usage") in r.stdout


def test_analyze_imports_no_report_or_capture_library(db):
    rc, mods, out = _loaded(["analyze", "temporal", "--db", str(db), "--no-cache"], db.parent)
    assert rc == 0 and not set(mods) & set(NEVER), mods
    assert "Temporal breakdown" in out


def test_runs_table_same_with_and_without_polars(db):
    # run_rows() (DuckDB's Python values) and runs() (a polars frame) hold the same rows, and
    # row_cells() gives the cells table_rows() gives for them: the table `runs` prints is unchanged.
    with Store(db, read_only=True) as s:
        columns, rows = s.run_rows()
        frame = s.runs()
    assert columns == frame.columns and rows == frame.rows()
    numeric, cells = row_cells(rows)
    assert cells == [list(r) for r in table_rows(frame)]
    assert numeric == [frame[c].dtype.is_numeric() for c in frame.columns]
    # run_id, name, world_size 4, ranks 4, traces 4, events (11,652), sources, aligned, time, issues
    assert cells[0][:5] == ["1", "normal", "4", "4", "4"] and cells[0][7] == "True"


def test_row_cells_shortens_and_tells_apart_like_table_rows():
    # Two 60-character names that shorten alike (kept: 48 characters) get the forms that tell them
    # apart (traceprof.core.names.distinct_short), as table_rows gives them; None is empty, ints get separators, floats 2 places,
    # bools and datetimes their text; a column of ints (None aside) is numeric, one of bools is not.
    a, b = "x" * 50 + "_kernel_a", "x" * 50 + "_kernel_b"
    t = datetime(2026, 12, 5, 17, 0, 0)
    rows = [(1, a, 1234567, 0.5, True, t), (None, b, None, 2.0, False, t), (3, a, 7, None, None, None)]
    numeric, cells = row_cells(rows)
    frame = pl.DataFrame(rows, schema=["i", "s", "n", "f", "b", "t"], orient="row")
    assert cells == [list(r) for r in table_rows(frame)]
    forms = distinct_short([a, b], 48)
    assert (cells[0][1], cells[1][1], cells[2][1]) == (forms[a], forms[b], forms[a]) and forms[a] != forms[b]
    assert cells[0][2] == "1,234,567" and cells[1][0] == "" and cells[0][3] == "0.50"
    assert numeric == [True, False, True, True, False, False]
