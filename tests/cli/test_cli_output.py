"""What the CLI prints: tables that name the run, human units, unwrapped numbers, literal brackets,
findings, analysis help, one-line usage errors, a fast --help."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.builders import long_steps_run
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
    # one unit per column, named in the header: 72,200,000 ns = 72.2 ms
    assert table_columns(df) == ["rank", "step (ms)", "name"]
    assert list(next(table_rows(df))) == ["0", "72.2", "vectorized_elementwise_kernel"]
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
        "arrival_skew (ms)",
        "wait (us)",
        "start_utc",
        "ts_utc",
        "offset_start (ms)",
    ]
    assert list(next(table_rows(df))) == [
        "22:13:20.123456",
        "6.79",
        "1.50",
        "22:13:20.123457",
        "22:13:20.123456",
        "12.3",
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
    assert "Temporal breakdown: run 'straggler_rank2'" in r.stdout and "window (ms)" in r.stdout
    exact = cli("analyze", "temporal", "--db", str(db), "--units", "ns", cwd=tmp_path).stdout
    assert "window_ns" in exact and "(ms)" not in exact


def test_summary_leads_with_the_straggler(db, tmp_path):
    r = cli("summary", "--db", str(db), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("Findings for run 'straggler_rank2'")
    assert "rank 2 is a straggler" in lines[1]
    data = json.loads(cli("summary", "--db", str(db), "-f", "json", cwd=tmp_path).stdout)
    assert data["run"] == "straggler_rank2" and data["findings"][0]["topic"] == "stragglers"
    # the analyses that do not apply (a CPU run: no GPU kernels) under a key that cannot be read as
    # missing ranks (those are `coverage`, None here: every rank traced); it was `missing`
    assert list(data) == ["run", "baseline", "coverage", "findings", "verdicts", "unavailable_analyses"]
    assert data["coverage"] is None
    unavailable = {m["analysis"]: m for m in data["unavailable_analyses"]}
    assert set(unavailable) >= {"idle", "kernels", "launch"}
    assert set(unavailable["kernels"]) == {"analysis", "reason", "needs"}
    assert unavailable["kernels"]["needs"] == "GPU kernels (a Kineto trace with CUDA activity)"


def test_analyze_help_and_list(tmp_path):
    r = cli("analyze", "gaps", "--help", cwd=tmp_path)
    assert r.returncode == 0 and "Parameters (-p KEY=VALUE):" in r.stdout and "hta" in r.stdout
    assert "Tables (--table NAME): frame, gaps, steps, ranks" in r.stdout
    listed = json.loads(cli("analyze", "list", "-f", "json", cwd=tmp_path).stdout)
    names = [a["name"] for a in listed]
    assert {"temporal", "overlap", "gaps", "stragglers", "whatif", "mfu"} <= set(names)
    # each summary is its docstring's whole first sentence, in Markdown: nccl_sum's ended in a comma
    # (its sentence goes on on a second line) and kernel_sum's showed reST's ``nsys stats ...``
    for a in listed:
        # without the name, which its own column holds (t14: "critical_path critical_path: ...")
        assert not a["summary"].startswith(a["name"] + ":") and a["summary"].endswith("."), a
        assert "``" not in a["summary"] and "\n" not in a["summary"], a
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


def test_names_that_shorten_alike_are_told_apart():
    # Two template instances of one kernel shorten to the same family: a table showed two rows that
    # looked alike (kernel_sum on the AMD corpus trace), then numbered them (#1, #2), which says
    # nothing of which is which. Each gets the words of its name the other lacks (float; c10 Half:
    # the first one shown, "…" for the rest); a repeated name keeps its form; JSON/CSV keep the
    # full names (not through display).
    import polars as pl

    from traceprof.core.display import table_rows

    a = (
        "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
        "at::detail::Array<char*, 1> >(int, at::native::FillFunctor<float>, at::detail::Array<char*, 1>)"
    )
    b = a.replace("float", "c10::Half")
    df = pl.DataFrame({"name": [a, b, "aten::mm", None, a], "n": [1, 2, 3, 4, 5]})
    assert [r[0] for r in table_rows(df)] == [
        "vectorized_elementwise_kernel<float>",
        "vectorized_elementwise_kernel<c10 …>",
        "aten::mm",
        "",
        "vectorized_elementwise_kernel<float>",
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


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A store with the sample runs normal and extra_matmul (the README's CI-gate example)."""
    tmp = tmp_path_factory.mktemp("pair")
    path = tmp / "p.duckdb"
    for name in ("normal", "extra_matmul"):
        r = cli("ingest", str(SAMPLES / name), "--db", str(path), cwd=tmp)
        assert r.returncode == 0, r.stderr
    return path


def _rows(stdout: str) -> list[list[str]]:
    """The cells of a rich table's body and header lines (split on the box characters)."""
    return [
        [c.strip() for c in ln.strip("│┃").split("│" if "│" in ln else "┃")]
        for ln in stdout.splitlines()
        if ln.startswith(("│", "┃"))
    ]


def test_one_units_rule_in_mfu_and_diff(pair, tmp_path):
    # mfu headed a column step_ns over cells in ms; FLOPs printed as 1,511,071,744.
    mfu = cli("analyze", "mfu", "--db", str(pair), "--run", "normal", "-p", "peak_tflops=312", cwd=tmp_path)
    assert mfu.returncode == 0, mfu.stderr
    head = _rows(mfu.stdout)[0]
    assert "step (ms)" in head and "step_ns" not in head and "flops (GFLOP)" in head
    exact = json.loads(
        cli(
            "analyze",
            "mfu",
            "--db",
            str(pair),
            "--run",
            "normal",
            "-p",
            "peak_tflops=312",
            "-f",
            "json",
            cwd=tmp_path,
        ).stdout
    )
    first = _rows(mfu.stdout)[1]
    # the cell is the JSON's exact ns in ms to 3 significant digits (e.g. 51,512,345 ns -> 51.5)
    assert float(first[head.index("step (ms)")]) == pytest.approx(exact[0]["step_ns"] / 1e6, rel=5e-3)
    assert float(first[head.index("flops (GFLOP)")]) == pytest.approx(exact[0]["flops"] / 1e9, rel=5e-3)
    # diff's metrics: each row in its metric's unit (step time in ms, FLOPs in GFLOP, bytes in MiB);
    # --units ns: the exact integers JSON has.
    d = cli("diff", "normal", "extra_matmul", "--db", str(pair), "--table", "metrics", cwd=tmp_path)
    rows = {r[0]: r for r in _rows(d.stdout)[1:]}
    assert rows["step_time_ns"][2].endswith(" ms") and rows["flops"][2].endswith(" GFLOP")
    assert rows["comm_bytes"][2].endswith(" MiB")
    data = json.loads(
        cli("diff", "normal", "extra_matmul", "--db", str(pair), "-f", "json", cwd=tmp_path).stdout
    )
    base = {m["metric"]: m["base"] for m in data["metrics"]}
    assert float(rows["step_time_ns"][2].removesuffix(" ms")) == pytest.approx(
        base["step_time_ns"] / 1e6, rel=5e-3
    )
    ns = cli(
        "diff",
        "normal",
        "extra_matmul",
        "--db",
        str(pair),
        "--table",
        "metrics",
        "--units",
        "ns",
        cwd=tmp_path,
    )
    nsrows = {r[0]: r for r in _rows(ns.stdout)[1:]}
    assert nsrows["step_time_ns"][2] == f"{round(base['step_time_ns']):,}"
    assert nsrows["flops"][2] == f"{round(base['flops']):,}"


def test_kernel_names_that_collide_are_told_apart_on_nsys_corpus(tmp_path):
    # pipit's CloverLeaf export: eleven par_ranged2d_kernel<...lambda (instance k)> kernels printed as
    # par_ranged2d_kernel #1..#11. Every distinct name now reads distinct, and a name's form keeps
    # the words that set it apart (the function and the lambda's instance number).
    import sqlite3

    from tests.conftest import corpus
    from traceprof.core.names import distinct_short

    src = corpus("nsys/pipit_perlmutter-cloverleaf-cuda.sqlite")
    con = sqlite3.connect(f"file:{src}?mode=ro", uri=True)
    names = [
        r[0]
        for r in con.execute(
            "SELECT DISTINCT s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.demangledName"
        )
    ]
    con.close()
    forms = distinct_short(names, 48)
    assert len(set(forms.values())) == len(names) == 102
    assert not any(" #" in f for f in forms.values())
    halo10 = next(n for n in names if "update_halo_kernel" in n and "(instance 10)" in n)
    assert forms[halo10] == "par_ranged1d_kernel<update_halo_kernel … 10>"


def test_prose_that_shortens_alike_keeps_its_full_text():
    # Two gap causes that differ only in the middle shorten alike (both ends kept); prose has no
    # symbol family to tell them apart by, so each keeps its full text rather than a made-up form.
    from traceprof.core.names import distinct_short

    a = "all_reduce (524.3 kB) after autograd::engine::evaluate_function: torch::autograd::AccumulateGrad x"
    b = a.replace("evaluate_function", "evaluate_other")
    assert distinct_short([a, b], 48) == {a: a, b: b}


def test_compared_durations_share_a_unit_and_whole_counts_have_no_decimals():
    # A diff's items: alone, base (median 650 us) reads in us and cand (median 38.3 ms) in ms, each
    # column's median picking its unit ("900" beside "35.7"); compared side by side they take one
    # unit, that of the largest typical magnitude (38.3 ms -> ms, 1 decimal). Call counts held as floats (medians) are whole:
    # 20 and 28, not 20.00 and 28.00; a float that is not whole keeps its decimals.
    import polars as pl

    df = pl.DataFrame(
        {
            "base_ns": [900_000, 400_000],
            "cand_ns": [35_670_000, 41_000_000],
            "delta_ns": [34_770_000, 40_600_000],
            "base_calls": [20.0, 4.0],
            "p_value": [0.5, 0.25],
        }
    )
    assert table_columns(df) == ["base (ms)", "cand (ms)", "delta (ms)", "base_calls", "p_value"]
    assert list(table_rows(df))[0] == ["0.9", "35.7", "34.8", "20", "0.5"]  # p: two significant digits
    assert table_columns(df.select("base_ns")) == ["base (us)"]  # alone: its own unit


# -- sql -f json: nested values as JSON, wide integers as numbers where 64 bits hold them --------------

_NESTED_SQL = (
    "SELECT [1, 2] AS l, {'a': 1, 'b': 'x'} AS s, map([1], ['one']) AS m, [[1, 2], [3]] AS ll, "
    "[7, 8]::INTEGER[2] AS arr, NULL::INTEGER[] AS nl, "
    "5::HUGEINT AS h, -9223372036854775808::HUGEINT AS hmin, 18446744073709551615::UHUGEINT AS umax, "
    "18446744073709551616::HUGEINT AS over, [170141183460469231731687303715884105727::HUGEINT, 1] AS hl, "
    "['NaN'::DOUBLE] AS nan, 1.50::DECIMAL(4, 2) AS d, sum(x) AS total FROM range(4) t(x)"
)


def test_sql_json_writes_lists_objects_and_numbers(db):
    from tests._cli_inproc import run

    code, out, err = run("sql", _NESTED_SQL, "--db", str(db), "-f", "json")
    assert code == 0, err
    (row,) = json.loads(out)
    # worked by hand: lists, structs and arrays as JSON; a map's keys as text; HUGEINT and UHUGEINT as
    # numbers from -2**63 to 2**64 - 1 (what BIGINT / UBIGINT columns hold), as exact text beyond;
    # DECIMAL as its exact text; NaN as null; sum(x) over 0..3 (a HUGEINT in DuckDB) = 6
    assert row == {
        "l": [1, 2],
        "s": {"a": 1, "b": "x"},
        "m": {"1": "one"},
        "ll": [[1, 2], [3]],
        "arr": [7, 8],
        "nl": None,
        "h": 5,
        "hmin": -(2**63),
        "umax": 2**64 - 1,
        "over": str(2**64),
        "hl": ["170141183460469231731687303715884105727", 1],
        "nan": [None],
        "d": "1.50",
        "total": 6,
    }


def test_sql_table_shows_a_hugeint_as_a_number(db):
    from tests._cli_inproc import run

    # sum() of a BIGINT column is a HUGEINT in DuckDB: the table printed 357343000 (DuckDB's text)
    # beside count_star() as 2,020; now both with separators, right-aligned, exact beyond 64 bits
    q = "SELECT sum(x) * 1000000 AS total, count(*) AS n, 2::HUGEINT ** 100 AS big FROM range(2020) t(x)"
    q = q.replace("2::HUGEINT ** 100", "170141183460469231731687303715884105727::HUGEINT")
    code, out, err = run("sql", q, "--db", str(db))
    assert code == 0, err
    (row,) = [ln for ln in out.splitlines() if ln.startswith("│")]
    cells = [c.strip() for c in row.split("│")[1:-1]]
    assert cells == ["2,039,190,000,000", "2,020", "170,141,183,460,469,231,731,687,303,715,884,105,727"]
    code, out, _ = run("sql", q, "--db", str(db), "-f", "csv")  # CSV: the digits, no separators
    assert out.splitlines()[1] == "2039190000000,2020,170141183460469231731687303715884105727"


def test_sql_table_shows_p_values_as_analysis_tables_do(db):
    from tests._cli_inproc import run

    # A p-value read back by SQL (a saved diff's p_value) printed 0.00 for 6e-08 and 0.0028; now two
    # significant digits, as `analyze` and `diff` tables show it; other floats keep two decimals, a
    # value below 1 they would show with under two significant digits three (0.0028; 6e-08 would
    # need an exponent: 0.00).
    q = (
        "SELECT 6e-08::DOUBLE AS p_value, 0.0028::DOUBLE AS floor_p_value, 0.0028::DOUBLE AS f, "
        "6e-08::DOUBLE AS g"
    )
    code, out, err = run("sql", q, "--db", str(db))
    assert code == 0, err
    (row,) = [ln for ln in out.splitlines() if ln.startswith("│")]
    assert [c.strip() for c in row.split("│")[1:-1]] == ["6e-08", "0.0028", "0.0028", "0.00"]


def test_sql_json_text_inside_nested_values_stays_escaped(db):
    from tests._cli_inproc import run

    # a bidi override and ESC inside a struct: written as \u escapes, never raw
    q = "SELECT {'b': 'x' || chr(8238) || chr(27) || '[31m'} AS s, ['=1+1'] AS l"
    code, out, _ = run("sql", q, "--db", str(db), "-f", "json")
    assert code == 0 and "\u202e" not in out and "\x1b" not in out
    assert (
        "\\u202e" in out
        and "\\u001b" in out
        and json.loads(out) == [{"s": {"b": "x\u202e\x1b[31m"}, "l": ["=1+1"]}]
    )
    # csv and table are unchanged: DuckDB's text of the nested value, escaped (a leading = neutralized)
    code, out, _ = run("sql", "SELECT '=1+1' AS f, " + q[7:], "--db", str(db), "-f", "csv")
    assert (
        code == 0 and out.splitlines()[1].startswith("'=1+1,") and "\x1b" not in out and "\u202e" not in out
    )
    code, out, _ = run("sql", q, "--db", str(db))
    assert code == 0 and "\\x1b[31m" in out and "\x1b" not in out


def test_kernel_names_alike_but_for_one_template_argument_are_shortened(tmp_path):
    # hta trace_filter: two 928-character index_elementwise_kernel names that differ only in
    # OpaqueType<1> vs OpaqueType<4> (the same words, in another place) were printed in full by
    # kernel_sum (a 3,102-wide table); so were six split_embedding_backward_* kernels whose
    # families shorten alike (up to 1,956 characters). Each now shows where it differs, and every
    # name of the run's kernel_sum reads distinct in at most 3 x 48 characters.
    from tests.conftest import analyze, corpus
    from traceprof.core.display import table_rows
    from traceprof.ingest.ingest import ingest
    from traceprof.storage.store import Store

    with Store(tmp_path / "s.duckdb") as store:
        ingest(store, [corpus("hta/trace_filter")], run="tf")
        frame = analyze(store, "kernel_sum", "tf").frame
    names = frame["name"].to_list()
    shown = {n: row[frame.columns.index("name")] for n, row in zip(names, table_rows(frame), strict=True)}
    opaque = sorted(n for n in names if "index_elementwise_kernel" in n and "OpaqueType" in n)
    assert [len(n) for n in opaque] == [928, 928]
    assert [shown[n] for n in opaque] == [
        "index_elementwise_kernel<…OpaqueType<1>…>",
        "index_elementwise_kernel<…OpaqueType<4>…>",
    ]
    assert len(set(shown.values())) == len(names)
    assert max(len(s) for s in shown.values()) <= 3 * 48


def test_help_is_whole_on_a_narrow_terminal():
    # Below 60 columns typer's rich help cut option names and their notes in its table cells
    # ("--skip-b…", "[env var: TRACEPRO…"); there it is click's plain text, each line wrapped whole.
    import os

    env = {**os.environ, "COLUMNS": "50"}
    r = subprocess.run(
        [sys.executable, "-m", "traceprof.cli", "ingest", "--help"], capture_output=True, text=True, env=env
    )
    assert r.returncode == 0, r.stderr
    assert "…" not in r.stdout and max(map(len, r.stdout.splitlines())) <= 50
    for whole in ("--skip-bad-events / --no-skip-bad-events", "TRACEPROF_DB", "--max-inflate RATIO"):
        assert whole in r.stdout, whole
    # 60 columns and more: the rich help as before
    r = subprocess.run(
        [sys.executable, "-m", "traceprof.cli", "ingest", "--help"],
        capture_output=True,
        text=True,
        env={**env, "COLUMNS": "100"},
    )
    assert r.returncode == 0 and "╭─ Options" in r.stdout and "TRACEPROF_DB" in r.stdout


def test_the_command_list_gives_each_command_one_clean_line():
    # The command list showed summary's first paragraph with its docstring's line breaks ("... and
    # one verdict" / "per topic. JSON: run, ..."): now the paragraph's first sentence, one line per
    # command at 200 columns (rich help) and whole at 50 (click's plain help cut it at 45 characters).
    import os

    for cols in ("200", "50"):
        r = subprocess.run(
            [sys.executable, "-m", "traceprof.cli", "--help"],
            capture_output=True,
            text=True,
            env={**os.environ, "COLUMNS": cols},
        )
        assert r.returncode == 0, r.stderr
        text = " ".join(r.stdout.replace("│", " ").split())
        assert (
            "summary The findings of a run, ranked by the time they could recover (the step account), and "
            "one verdict per topic. report"
        ) in text
        assert "per topic. JSON" not in text and "JSON: run, baseline" not in text
        if cols == "200":
            lines = [ln for ln in r.stdout.splitlines() if ln.startswith("│ summary ")]
            assert len(lines) == 1 and lines[0].rstrip("│ ").endswith("one verdict per topic.")


def test_a_table_of_steps_shows_its_worst_rows_and_says_which(tmp_path):
    # 250 (rank, step) rows, 200 shown: by step_ns the worst are step 3 (5,000 us), then steps 249
    # down to 51 (1,249 .. 1,051 us); steps 0-2 and 4-50 are left out. Before: steps 0-199 in order,
    # the 49 slowest steps after them hidden, "50 more row(s) of 250 not shown".
    db = str(tmp_path / "s.duckdb")
    assert cli("ingest", str(long_steps_run(tmp_path / "run")), "--db", db, cwd=tmp_path).returncode == 0
    res = cli("analyze", "critical_path", "--db", db, "-f", "table", "--units", "ns", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    steps = [int(r[1]) for r in _rows(res.stdout)[1:]]
    assert steps == [3, *range(249, 50, -1)]
    assert "200 of 250 rows shown: those of largest step_ns, largest first" in res.stderr
    # a table that is not per-step rows keeps its first rows
    res = cli("analyze", "critical_path", "--db", db, "--table", "path", "-f", "table", cwd=tmp_path)
    assert "more row(s) of" in res.stderr and "those of largest" not in res.stderr


def _command_list(cols: str, *group: str) -> list[str]:
    """The lines of ``traceprof GROUP --help``'s command list at ``cols`` columns, borders left out."""
    import os

    r = subprocess.run(
        [sys.executable, "-m", "traceprof.cli", *group, "--help"],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": cols},
    )
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert max(map(len, lines)) <= int(cols)
    start = next(i for i, ln in enumerate(lines) if ln.startswith("╭─ Commands"))
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("╰"))
    return [ln.strip("│ ") for ln in lines[start + 1 : end]]


def test_the_command_list_has_one_line_per_command_at_80_columns():
    # At 80 columns the first sentences wrapped 9 of the 12 commands to 2-3 lines. Each now has one
    # line: its first clauses that fit (the description column is 80 - 4 border - 8 name - 2 = 66
    # characters), else cut at a word with "…"; at 200 the whole sentence, and `CMD --help` the whole help.
    from traceprof.cli import app

    names = [c.name or c.callback.__name__ for c in app.registered_commands] + [
        g.name for g in app.registered_groups
    ]
    narrow = _command_list("80")
    assert [ln.split()[0] for ln in narrow] == names and len(names) == 12
    shown = {ln.split()[0]: ln.split(None, 1)[1] for ln in narrow}
    assert shown["ingest"] == "Parse trace files into the store (one transaction per run; same…"
    assert shown["sql"] == "Run a read-only query on the store"
    assert shown["diff"] == "Compare a run with baseline runs: exit 3 on a regression"
    assert shown["report"] == "Write a self-contained HTML report (works offline) of one run."
    wide = {ln.split()[0]: ln.split(None, 1)[1] for ln in _command_list("200")}
    assert (
        wide["ingest"]
        == "Parse trace files into the store (one transaction per run; same file twice is a no-op)."
    )
    assert wide["diff"].endswith("0 when it is within the thresholds (CI gate).")
    assert [ln.split()[0] for ln in _command_list("80", "baseline")] == ["list", "add", "rm"]
    r = subprocess.run(
        [sys.executable, "-m", "traceprof.cli", "ingest", "--help"],
        capture_output=True,
        text=True,
        env={**__import__("os").environ, "COLUMNS": "80"},
    )
    assert "same file twice is" in r.stdout and "no-op" in r.stdout


def test_fit_line_cuts_at_a_clause_else_at_a_word():
    from traceprof.cli import fit_line

    text = "Compare a run with baseline runs: exit 3 on a regression (structural or timing), 4 when"
    assert fit_line(text, 200) == text
    assert fit_line(text, 60) == "Compare a run with baseline runs: exit 3 on a regression"  # 56
    assert fit_line(text, 40) == "Compare a run with baseline runs"  # 32, at least half of 40
    assert fit_line(text, 30) == "Compare a run with baseline…"  # no clause ends within 30
    # a clause end inside parentheses is no cut: "(queries only" would leave one open
    sql = "Run a read-only query on the store (queries only: no writes, no settings); prints"
    assert fit_line(sql, 60) == "Run a read-only query on the store"
    assert fit_line(sql, 75) == "Run a read-only query on the store (queries only: no writes, no settings)"
