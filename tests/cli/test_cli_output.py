"""What the CLI prints: tables that name the run, human units, unwrapped numbers, literal brackets,
findings, analysis help, one-line usage errors, a fast --help."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SAMPLES
from traceprof.core.display import duration, table_columns, table_rows


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "traceprof.cli", *args], cwd=cwd, capture_output=True, text=True
    )


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cli")
    path = tmp / "s.duckdb"
    r = cli("ingest", str(SAMPLES / "straggler_rank2"), "--db", str(path), cwd=tmp)
    assert r.returncode == 0, r.stderr
    return path


@pytest.mark.parametrize(
    "ns, text",
    [
        (0, "0 ns"),
        (999, "999 ns"),
        (1_234, "1.23 us"),
        (72_200_000, "72.2 ms"),
        (813_532_961, "814 ms"),
        (999_999, "1,000 us"),
        (1_234_567_890, "1.23 s"),
    ],
)
def test_durations_in_human_units(ns, text):
    assert duration(ns) == text


def test_table_cells_human_or_exact():
    import polars as pl

    df = pl.DataFrame(
        {
            "rank": [0],
            "step_ns": [72_200_000],
            "name": [
                "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>(int)"
            ],
        }
    )
    assert table_columns(df) == ["rank", "step", "name"]
    assert list(next(table_rows(df))) == ["0", "72.2 ms", "vectorized_elementwise_kernel"]
    assert table_columns(df, "ns") == ["rank", "step_ns", "name"]
    assert list(next(table_rows(df, "ns")))[1] == "72,200,000"


def test_timestamps_print_as_utc_times_not_durations():
    import polars as pl

    # Epoch 1,700,000,000 s is 2023-11-14 22:13:20 UTC; +123,456,789 ns shows as .123456 (us, truncated).
    # arrival_skew_ns and wait_ns are durations; a start_ns below 1973 is an offset, a duration too.
    t0 = 1_700_000_000_123_456_789
    df = pl.DataFrame(
        {
            "first_arrival_ns": [t0],
            "arrival_skew_ns": [6_790_000],
            "wait_ns": [1_500],
            "start_ns": [t0 + 1_000],
            "ts_ns": [t0 + 86_400 * 10**9],
            "offset_start_ns": [12_300_000],
        }
    )
    assert table_columns(df) == [
        "first_arrival_utc",
        "arrival_skew",
        "wait",
        "start_utc",
        "ts_utc",
        "offset_start",
    ]
    assert list(next(table_rows(df))) == [
        "22:13:20.123456",
        "6.79 ms",
        "1.5 us",
        "22:13:20.123457",
        "22:13:20.123456",
        "12.3 ms",
    ]
    # ts_ns spans two days (t0 and t0 + 1 day): the date is shown.
    df2 = pl.DataFrame({"ts_ns": [t0, t0 + 86_400 * 10**9]})
    assert [r[0] for r in table_rows(df2)] == ["2023-11-14 22:13:20.123456", "2023-11-15 22:13:20.123456"]
    assert table_columns(df, "ns")[0] == "first_arrival_ns" and next(table_rows(df, "ns"))[0] == f"{t0:,}"


def test_brackets_print_literally(db, tmp_path):
    # rich would read [memory] and [red]...[/red] as markup and print them blank or coloured.
    r = cli(
        "sql",
        "SELECT '[memory]' AS kind, 'run[red]x[/red]' AS name, '[bold]' AS b",
        "--db",
        str(db),
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    assert "[memory]" in r.stdout and "run[red]x[/red]" in r.stdout and "[bold]" in r.stdout


def test_numbers_never_wrap(db, tmp_path):
    cols = ", ".join(f"1234567890123 + {i} AS column_number_{i}" for i in range(25))  # ~500 columns wide
    r = cli("sql", f"SELECT {cols}", "--db", str(db), cwd=tmp_path)
    for i in range(25):
        assert f"{1234567890123 + i:,}" in r.stdout, r.stdout[:2000]


def test_analyze_table_names_the_run_in_human_units(db, tmp_path):
    r = cli("analyze", "temporal", "--db", str(db), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "Temporal breakdown: run 'straggler_rank2'" in r.stdout and " ms " in r.stdout
    exact = cli("analyze", "temporal", "--db", str(db), "--units", "ns", cwd=tmp_path).stdout
    assert "window_ns" in exact and " ms " not in exact


def test_summary_leads_with_the_straggler(db, tmp_path):
    r = cli("summary", "--db", str(db), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("Findings for run 'straggler_rank2'")
    assert "rank 2 is a straggler" in lines[1]
    data = json.loads(cli("summary", "--db", str(db), "-f", "json", cwd=tmp_path).stdout)
    assert data["run"] == "straggler_rank2" and data["findings"][0]["topic"] == "stragglers"
    assert {m["analysis"] for m in data["missing"]} >= {"idle", "kernels", "launch"}


def test_analyze_help_and_list(tmp_path):
    r = cli("analyze", "gaps", "--help", cwd=tmp_path)
    assert r.returncode == 0 and "Parameters (-p KEY=VALUE):" in r.stdout and "hta" in r.stdout
    assert "Tables (--table NAME): frame, gaps, steps, ranks" in r.stdout
    names = [a["name"] for a in json.loads(cli("analyze", "list", "-f", "json", cwd=tmp_path).stdout)]
    assert {"temporal", "overlap", "gaps", "stragglers", "whatif", "mfu"} <= set(names)
    assert "Usage" in cli("analyze", "--help", cwd=tmp_path).stdout


def test_usage_errors_are_one_line(tmp_path):
    for args in (("analyze", "gaps", "--nope"), ("runs", "mv", "a"), ("analyze",)):
        r = cli(*args, cwd=tmp_path)
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert r.returncode == 1 and len(lines) == 1 and lines[0].startswith("error:"), r.stderr


def test_help_starts_fast(tmp_path):
    # --help imports neither polars, pyarrow, DuckDB nor numpy (0.5 s and more on a loaded machine):
    # checked on the modules loaded, not on a timing, which a busy CI machine makes flaky.
    code = (
        "import sys\nfrom traceprof.cli import main\nsys.argv = ['traceprof', '--help']\n"
        "code = 0\ntry:\n    main()\nexcept SystemExit as e:\n    code = e.code\n"
        "heavy = {'polars', 'pyarrow', 'duckdb', 'numpy'} & set(sys.modules)\n"
        "print(sorted(heavy), code, file=sys.stderr)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert "Usage" in r.stdout and r.stderr.strip().splitlines()[-1] == "[] 0", r.stdout + r.stderr


def test_ingest_runs_without_pandas(tmp_path):
    # pyarrow imports pandas (bokeh installs it) on its first conversion: 0.6 s and ~35 MB in the ingest
    # process and each parser worker. The CLI's ingest refuses it; here the 4 files of a sample run go
    # in (parsed in forked workers) and pandas never loads.
    run = Path(__file__).resolve().parents[2] / "sample_traces" / "normal"
    code = (
        "import sys\nfrom traceprof.cli import main\n"
        f"sys.argv = ['traceprof', 'ingest', {str(run)!r}, '--db', 'x.duckdb']\n"
        "main()\nprint('pandas' in sys.modules, file=sys.stderr)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0 and r.stderr.strip().splitlines()[-1] == "False", r.stdout + r.stderr
    assert "4 file(s) ingested" in r.stdout + r.stderr


def test_ingest_sees_pandas_as_not_installed(tmp_path):
    # The finder that keeps pandas out of ingest raised from find_spec, so importlib.util.find_spec("pandas"),
    # the usual "is it installed?" probe, raised in an ingest process. Now the import system answers as
    # for a missing module: find_spec is None (a finder after ours would have found it), import raises
    # ModuleNotFoundError, a submodule's probe raises it as for any missing package; other modules load.
    code = (
        "import importlib, importlib.machinery, importlib.util, sys\n"
        "assert importlib.util.find_spec('pandas') is not None, 'pandas is installed'\n"
        "from traceprof.cli import _parse_without_pandas\n"
        "_parse_without_pandas(); _parse_without_pandas()  # twice: wrapped once\n"
        "print(importlib.util.find_spec('pandas'))\n"
        "try:\n    import pandas\nexcept ModuleNotFoundError as e:\n    print(type(e).__name__, e.name)\n"
        "try:\n    importlib.util.find_spec('pandas.core.frame')\n"
        "except ModuleNotFoundError as e:\n    print(type(e).__name__, e.name)\n"
        "print(importlib.util.find_spec('json') is not None, importlib.machinery.PathFinder in sys.meta_path,\n"
        "      len([f for f in sys.meta_path if type(f).__name__ == '_NoPandas']) == len(sys.meta_path))\n"
        "importlib.invalidate_caches(); import pyarrow as pa; print(pa.array([1]).to_numpy().tolist())\n"
        "print('pandas' in sys.modules)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    if "pandas is installed" in r.stderr:
        pytest.skip("pandas is not installed here")
    assert r.stdout.splitlines() == [
        "None",
        "ModuleNotFoundError pandas",
        "ModuleNotFoundError pandas",
        "True True True",
        "[1]",
        "False",
    ], r.stdout + r.stderr


def test_default_db_is_the_stores():
    from traceprof import cli as cli_module
    from traceprof.storage.store import DEFAULT_DB

    assert cli_module.DEFAULT_DB == str(DEFAULT_DB)


def test_help_cites_only_files_in_the_repo():
    # `analyze NAME --help` once cited "DESIGN.md §4", a file the repository does not have.
    import re

    from traceprof.core.display import describe
    from traceprof.engine import analysis

    root = Path(__file__).resolve().parents[2]
    for name in analysis.names():
        for cited in re.findall(r"[\w/.-]+\.md\b", describe(analysis.get(name))):
            assert (root / cited).is_file(), f"analyze {name} --help cites {cited}"


def test_table_shows_the_first_rows_and_says_how_many_more(capsys):
    import polars as pl

    from traceprof.cli import TABLE_ROWS, Format, render

    df = pl.DataFrame(
        {"step": list(range(TABLE_ROWS + 57)), "name": [f"op_{i}" for i in range(TABLE_ROWS + 57)]}
    )
    render(df, Format.table, "steps")
    cap = capsys.readouterr()
    assert f"op_{TABLE_ROWS - 1}" in cap.out and f"op_{TABLE_ROWS} " not in cap.out
    assert "57 more row(s) of 257 not shown" in cap.err and "--format csv" in cap.err
    render(df, Format.csv)
    assert capsys.readouterr().out.count("\n") == TABLE_ROWS + 57 + 1  # CSV: every row and the header


def test_sql_profiling_output_to_a_file_is_one_error(db, tmp_path):
    target = tmp_path / "prof.json"
    r = cli(
        "sql",
        f"PRAGMA enable_profiling='json'; PRAGMA profiling_output='{target}'; SELECT 1",
        "--db",
        str(db),
        cwd=tmp_path,
    )
    # refused before it runs (it would print a profile into the output); DuckDB itself refuses the file
    assert (
        r.returncode == 1
        and "SQL error: " in r.stderr
        and "is refused" in r.stderr
        and "Traceback" not in r.stderr
    )
    assert not target.exists()
    r = cli("sql", f"SET profiling_output='{target}'", "--db", str(db), cwd=tmp_path)
    assert r.returncode == 1 and "is refused" in r.stderr and not target.exists()


def test_names_that_shorten_alike_are_numbered():
    # Two template instances of one kernel shorten to the same family: a table showed two rows that
    # looked alike (kernel_sum on the AMD corpus trace). Numbered in order of appearance; a repeated
    # name keeps its number; JSON/CSV keep the full names (not through display).
    import polars as pl

    from traceprof.core.display import table_rows

    a = (
        "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
        "at::detail::Array<char*, 1> >(int, at::native::FillFunctor<float>, at::detail::Array<char*, 1>)"
    )
    b = a.replace("float", "c10::Half")
    df = pl.DataFrame({"name": [a, b, "aten::mm", None, a], "n": [1, 2, 3, 4, 5]})
    assert [r[0] for r in table_rows(df)] == [
        "vectorized_elementwise_kernel #1",
        "vectorized_elementwise_kernel #2",
        "aten::mm",
        "",
        "vectorized_elementwise_kernel #1",
    ]


def test_sql_with_several_statements_says_whose_rows_it_shows(db, tmp_path):
    """DuckDB runs every statement and returns the last one's rows; one statement gets no note."""
    r = cli("sql", "SELECT 1 AS a; SELECT 2 AS b", "--db", str(db), "-f", "csv", cwd=tmp_path)
    assert (r.returncode, r.stdout, r.stderr) == (
        0,
        "b\n2\n",
        "note: 2 statements ran; the rows shown are the last one's\n",
    )
    r = cli("sql", "SELECT 2 AS b;", "--db", str(db), "-f", "csv", cwd=tmp_path)
    assert (r.returncode, r.stdout, r.stderr) == (0, "b\n2\n", "")
