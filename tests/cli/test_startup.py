"""What the CLI's quick commands import: `--version`, `runs` and `analyze` printing a kept result load
neither polars, numpy nor pyarrow (0.6 s of CPU together) nor pydantic (typer's conversion of option
values, done in traceprof.cli: the same values as typer's, checked for every option), no command here
loads the report's or the capture's libraries (bokeh, holoviews, pandas, torch, dask), and what they
print is what the computing path prints (`runs` without polars; a kept view, every table and format).

Checked on the modules loaded, not on timings, which a busy CI machine makes flaky; the timings
are in benchmarks/bench.py (``startup``)."""

from __future__ import annotations

import os
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
#: Not loaded by `--version` and `runs`: the frame libraries, and pydantic (typer's conversion of
#: option values, done without it: traceprof.cli._plain_coercion).
FRAMES = ["polars", "numpy", "pyarrow", "pydantic"]


def _loaded(args: list[str], cwd, entry: str = "traceprof.entry") -> tuple[int, list[str], str]:
    """Run the CLI in a child with ``args``; its exit code, the modules of NEVER + FRAMES it loaded,
    and its stdout. ``entry``: the module whose ``main`` runs it (``traceprof.cli`` for a command
    that succeeds: ``traceprof.entry`` ends a successful ingest without returning)."""
    code = (
        f"import sys\nfrom {entry} import main\n"
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


def test_ingest_imports_no_pydantic(tmp_path):
    # ingest's PATH arguments have a parser of their own: converted an item at a time here, not by
    # typer's pydantic adapter of the list (importing pydantic and building it: 0.03-0.05 s of CPU)
    rc, mods, out = _loaded(
        ["ingest", str(SAMPLES / "normal"), "--db", "s.duckdb"], tmp_path, "traceprof.cli"
    )
    assert rc == 0 and "pydantic" not in mods and not set(mods) & set(NEVER), mods
    with Store(tmp_path / "s.duckdb", read_only=True) as s:
        assert s.run_rows()[1][0][1] == "normal"  # stored


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
    numeric, cells = row_cells(columns, rows)
    assert cells == [list(r) for r in table_rows(frame)]
    assert numeric == [frame[c].dtype.is_numeric() for c in frame.columns]
    # run_id, name, world_size 4, ranks 4, dump_only_ranks 0, traces 4, events (11,652), sources,
    # aligned, time, issues (the table prints the issues cell whole: test_runs' issues test)
    assert cells[0][:6] == ["1", "normal", "4", "4", "0", "4"] and cells[0][8] == "True"


def test_row_cells_shortens_and_tells_apart_like_table_rows():
    # Two 60-character names that shorten alike (kept: 48 characters) get the forms that tell them
    # apart (traceprof.core.names.distinct_short), as table_rows gives them; None is empty, ints get separators, floats 2 places,
    # bools and datetimes their text; a column of ints (None aside) is numeric, one of bools is not.
    a, b = "x" * 50 + "_kernel_a", "x" * 50 + "_kernel_b"
    t = datetime(2026, 12, 5, 17, 0, 0)
    rows = [(1, a, 1234567, 0.5, True, t), (None, b, None, 2.0, False, t), (3, a, 7, None, None, None)]
    numeric, cells = row_cells(["i", "s", "n", "f", "b", "t"], rows)
    frame = pl.DataFrame(rows, schema=["i", "s", "n", "f", "b", "t"], orient="row")
    assert cells == [list(r) for r in table_rows(frame)]
    forms = distinct_short([a, b], 48)
    assert (cells[0][1], cells[1][1], cells[2][1]) == (forms[a], forms[b], forms[a]) and forms[a] != forms[b]
    assert cells[0][2] == "1,234,567" and cells[1][0] == "" and cells[0][3] == "0.50"
    assert numeric == [True, False, True, True, False, False]


def test_row_cells_show_p_values_as_every_table_does():
    # A float in a p_value column keeps two significant digits (6e-08 read 0.00, 0.0028 too) as
    # table_rows shows it; the same floats in another column get plain()'s two decimals, a value below
    # 1 three significant digits where two decimals keep fewer than two, unless that needs an exponent.
    rows = [(6e-08, 6e-08, 1), (0.0028, 0.0028, 2), (0.34, 0.34, None)]
    columns = ["p_value", "f", "floor_p_value"]
    numeric, cells = row_cells(columns, rows)
    assert [r[:2] for r in cells] == [["6e-08", "0.00"], ["0.0028", "0.0028"], ["0.34", "0.34"]]
    assert [r[2] for r in cells] == ["1", "2", ""]  # ints in a p_value column: plain integers
    frame = pl.DataFrame(rows, schema=columns, orient="row")
    assert cells == [list(r) for r in table_rows(frame)]


def _all_params():
    """(command, parameter) of every command of the CLI (typer's click objects)."""
    import typer

    from traceprof.cli import app

    todo = [typer.main.get_command(app)]
    while todo:
        cmd = todo.pop()
        for p in cmd.params:
            yield cmd, p
        todo.extend(getattr(cmd, "commands", {}).values())


#: Raw values an option may get: numbers typer converts as Python does, and ones it converts its own
#: way or refuses (an underscore, an exponent, leading zeros, a word, an empty string).
_RAW = [
    "12",
    "-3",
    "0",
    "2.5",
    "-0.25",
    "007",
    "1_000",
    "1e3",
    "nan",
    "x",
    "",
    "table",
    "JSON",
    "csv",
    "a/b.duckdb",
]


def test_plain_coercion_converts_as_typer_does():
    # Every parameter of every command, every raw value (alone, and as a list for the repeatable
    # ones): the pydantic-free conversion gives typer's value, or typer's error message.
    import typer
    from typer.core import _TyperParameter

    from traceprof.cli import _plain_coercion, _PlainParam
    from traceprof.core.errors import UsageError

    _plain_coercion()
    assert getattr(_TyperParameter.get_runtime_param, "plain", False)
    seen = refused = 0
    for cmd, p in _all_params():
        ctx = typer.Context(cmd)
        theirs = p.get_runtime_param().typer_param()  # typer's own converter for p
        ours = _PlainParam(p, lambda theirs=theirs: theirs)
        multi = p.multiple or p.nargs == -1
        for raw in _RAW:
            value = (raw,) if multi else raw
            try:
                want: object = theirs.coerce(value, param=p, ctx=ctx)
            except Exception as e:  # noqa: BLE001 - the message is what is compared
                want = (type(e), getattr(e, "message", str(e)))
            try:
                got: object = ours.coerce(value, param=p, ctx=ctx)
            except Exception as e:  # noqa: BLE001
                got = (type(e), getattr(e, "message", str(e)))
            if got != want and isinstance(want, tuple) and want[0].__name__ == "BadParameter":
                # refused by both; ours in one line naming the option and the value as typed
                # (``--jobs x: expected a whole number``), typer's in pydantic's words without them
                named = f"{next(o for o in p.opts if o.startswith('--'))} {raw or repr(raw)}: expected "
                assert got[0] is UsageError and got[1].startswith(named), (got, want)
                refused += 1
            else:
                same = got == want or repr(got) == repr(want)  # nan: typer's own, converted by it
                assert same and type(got) is type(want), (cmd.name, p.name, raw, got, want)
            seen += 1
        assert ours.coerce(None, param=p, ctx=ctx) == theirs.coerce(None, param=p, ctx=ctx)
    assert seen > 500 and refused > 50  # every command's options were tried


def test_analyze_prints_a_kept_result_without_frame_libraries(db):
    # the first `analyze` computes the result (keeping it and how it prints beside the store); the
    # next prints it as kept: the same bytes, and neither polars, numpy, pyarrow nor pydantic loaded
    for args in (
        ["analyze", "temporal", "--db", str(db)],
        ["analyze", "gaps", "--db", str(db), "-f", "csv", "--table", "steps"],
        ["analyze", "stragglers", "--db", str(db), "-f", "json", "-p", "alpha=0.05"],
    ):
        rc1, mods1, first = _loaded(args, db.parent)
        rc2, mods2, again = _loaded(args, db.parent)
        assert rc1 == rc2 == 0 and "polars" in mods1 and mods2 == [], (args, mods1, mods2)
        assert again == first and len(first) > 100, args


FORMS = [[], ["--units", "ns"], ["-f", "json"], ["-f", "csv"], ["-f", "csv", "--raw"]]


@pytest.mark.parametrize("name", ["temporal", "gaps", "stragglers"])
def test_a_kept_view_prints_what_computing_prints(tmp_path, name, monkeypatch):
    # every table of the result in every format: as computed (--no-cache), as printed from the view
    # the first cached command keeps, and from the view again; notes and the rows-not-shown line too
    from tests import _cli_inproc as cli
    from traceprof import cli as traceprof_cli

    monkeypatch.setattr(traceprof_cli, "VIEW_ROWS", 5)  # larger frames keep no JSON/CSV: computed
    db = tmp_path / "v.duckdb"
    assert cli.run("ingest", str(SAMPLES / "normal"), "--db", str(db))[0] == 0
    help_text = cli.run("analyze", name, "--help")[1]
    tables = help_text.split("Tables (--table NAME): ")[1].split("\n")[0].split(", ")
    for t in tables:
        for form in FORMS:
            args = ["analyze", name, "--db", str(db), "--table", t, *form]
            computed = cli.run(*args, "--no-cache")
            kept = [cli.run(*args) for _ in range(2)]
            assert kept[0] == kept[1] == computed, (t, form)
    views = list((tmp_path / "v.duckdb.results").glob("*/view-*.json"))
    assert len(views) == 1  # one view: every table, every format


def test_a_damaged_view_is_ignored(tmp_path):
    from tests import _cli_inproc as cli

    db = tmp_path / "v.duckdb"
    cli.run("ingest", str(SAMPLES / "normal"), "--db", str(db))
    first = cli.run("analyze", "temporal", "--db", str(db))
    (view,) = (tmp_path / "v.duckdb.results").glob("*/view-*.json")
    view.write_bytes(view.read_bytes().replace(b"Temporal breakdown", b"Temporal breakdowN"))
    assert cli.run("analyze", "temporal", "--db", str(db)) == first  # computed (kept result) again


def test_a_view_holds_what_was_printed(tmp_path):
    # a view keeps the bytes an analyze printed, form by form: nothing is rendered that was not asked
    import orjson

    from tests import _cli_inproc as cli

    db = tmp_path / "v.duckdb"
    cli.run("ingest", str(SAMPLES / "normal"), "--db", str(db))
    table = cli.run("analyze", "temporal", "--db", str(db))
    (path,) = (tmp_path / "v.duckdb.results").glob("*/view-*.json")

    def forms() -> dict:
        return orjson.loads(path.read_bytes().partition(b"\n")[2])["frames"]

    assert forms() == {"frame": {"table:human": forms()["frame"]["table:human"]}}
    csv = cli.run("analyze", "temporal", "--db", str(db), "-f", "csv", "--table", "steps")
    assert csv == cli.run(
        "analyze", "temporal", "--db", str(db), "-f", "csv", "--table", "steps", "--no-cache"
    )
    assert set(forms()) == {"frame", "steps"} and forms()["steps"]["csv"] == csv[1]
    assert cli.run("analyze", "temporal", "--db", str(db)) == table


def test_an_add_on_analysis_keeps_no_view(tmp_path):
    """An analysis an installed package registers (entry point ``traceprof.analyses``) kept a view
    keyed by traceprof's code, not the add-on's: after the add-on changed, analyze printed its old
    output, and still printed it once the add-on was gone."""
    site = tmp_path / "site"
    (site / "addon-0.1.dist-info").mkdir(parents=True)
    (site / "addon-0.1.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: addon\nVersion: 0.1\n"
    )
    (site / "addon-0.1.dist-info" / "entry_points.txt").write_text(
        "[traceprof.analyses]\naddon_value = addon\n"
    )
    code = """from dataclasses import dataclass
import polars as pl
from traceprof.engine.analysis import Analysis, FrameResult, RunParams, register
VALUE = {value}
@dataclass(frozen=True)
class Params(RunParams):
    pass
@dataclass(frozen=True)
class Result(FrameResult):
    title = "Add-on value"
@register(Analysis(name="addon_value", params=Params, result=Result, frames=()))
def run(store, params):
    return Result(frame=pl.DataFrame({{"value": [VALUE]}}))
"""
    db = tmp_path / "a.duckdb"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), *sys.path])}

    def analyze(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "traceprof.cli", *args, "--db", str(db)],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path,
        )

    assert analyze("ingest", str(SAMPLES / "normal")).returncode == 0
    analyze("analyze", "temporal")  # the store's results folder exists: views would be kept
    printed = []
    for value in (2, 3):
        (site / "addon.py").write_text(code.format(value=value))
        r = analyze("analyze", "addon_value", "-f", "csv")
        assert r.returncode == 0, r.stderr
        printed.append(r.stdout)
    assert printed == ["value\n2\n", "value\n3\n"]
    (site / "addon.py").unlink()
    r = analyze("analyze", "addon_value")
    assert (r.returncode, r.stdout) == (1, "") and "'addon'" in r.stderr  # not the old output
    assert not list((tmp_path / "a.duckdb.results").glob("*/view-addon_value-*"))
