"""Odd option values, as a careless user types them: each is one line naming the option or path
as typed, ``--help`` shows flags as flags, and ``-p KEY=`` gives any analysis parameter back its
built-in default (over a config file's value)."""

from __future__ import annotations

import dataclasses
import re

import pytest

from tests._cli_inproc import run
from tests.cli.test_params_config import run as _cli  # the CLI in a child, no TRACEPROF_* variables
from tests.conftest import SAMPLES
from traceprof.core.errors import StoreError, UsageError


def _line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


# -- numbers echoed as typed ----------------------------------------------------------------------

NUMBERS = [
    (["ingest", "IN", "--max-inflate", "0"], "--max-inflate 0: expected a ratio above 0"),
    (["ingest", "IN", "--max-inflate", "0.000"], "--max-inflate 0.000: "),
    (["ingest", "IN", "--max-inflate", "1e400"], "--max-inflate 1e400: "),
    (["ingest", "IN", "-j", "00"], "--jobs 00: expected 1 or more"),
    (["ingest", "IN", "--jobs", "-0"], "--jobs -0: "),
    (["sql", "SELECT 1", "--timeout", "0.0"], "--timeout 0.0: expected seconds above 0"),
    (["sql", "SELECT 1", "--timeout", "nan"], "--timeout nan: "),
    (["sql", "SELECT 1", "--max-rows", "-01"], "--max-rows -01: expected 0 (all) or more"),
    (["history", "job", "--window", "-0"], "--window -0: must be at least 2"),
    (["collect", "-n", "00", "-o", "OUT", "--", "python", "-c", "pass"], "--nproc 00: expected 1 or more"),
]


@pytest.mark.parametrize(("args", "want"), NUMBERS, ids=[" ".join(a[1:]) for a, _ in NUMBERS])
def test_numeric_options_are_echoed_as_typed(tmp_path, args, want):
    args = [
        str(SAMPLES / "normal") if a == "IN" else str(tmp_path / "out") if a == "OUT" else a for a in args
    ]
    code, _, err = run(*args, "--db", str(tmp_path / "s.duckdb"))
    assert code == 1 and want in _line(err), err
    assert not (tmp_path / "s.duckdb").exists() and not (tmp_path / "out").exists()


def test_click_s_runner_and_app_say_options_as_typed_as_main_does(tmp_path):
    # the option and value as typed come from click's context, not sys.argv (pytest's here) nor a
    # module-level record: app() from Python and click's test runner say what main() says
    from typer.testing import CliRunner

    from traceprof.cli import app

    db = str(tmp_path / "s.duckdb")
    cases = [
        (["diff", "a", "b", "-t", "1e400"], "-t 1e400: thresholds are fractions in (0, 1]"),
        (["diff", "a", "b", "--threshold", "1e400"], "--threshold 1e400: thresholds are fractions"),
        (["diff", "a", "b", "-t1e400"], "-t 1e400: thresholds are fractions"),
        (["ingest", str(SAMPLES / "normal"), "-j", "abc"], "--jobs abc: expected a whole number"),
        (["sql", "SELECT 1", "--max-rows", "-01"], "--max-rows -01: expected 0 (all) or more"),
        (["sql", "SELECT 1", "--max-rows", "-1"], "--max-rows -1: expected 0 (all) or more"),  # not -01
    ]
    for args, want in cases:
        res = CliRunner().invoke(app, [*args, "--db", db])
        assert isinstance(res.exception, UsageError) and str(res.exception).startswith(want), (args, res)
        assert _line(run(*args, "--db", db)[2]) == f"error: {res.exception}"  # main() says the same
    assert not (tmp_path / "s.duckdb").exists()


def test_a_value_not_typed_is_written_plainly():
    from traceprof.cli import _typed

    # a value that did not come from the command line (a default, the library): no ".0" tail
    assert [_typed("no_such_option", v) for v in (0.0, 64.0, 2.5, 1e308, float("nan"), 7)] == [
        "0",
        "64",
        "2.5",
        "1e+308",
        "nan",
        "7",
    ]


# -- --help: flags without a value type -------------------------------------------------------------


#: typer 0.29's own value words: ``<str>``, ``<int>``, ``<float>``, ``<Path>``, ``<list[str]>``,
#: ``<bool>``, and a required argument as ``{paths}``.
TYPER_WORDS = re.compile(r"<(?:str|int|float|bool|Path|list\[[^>]*\]|[a-z]+\|[a-z|]+)>|\{[a-z_]+\}")


def _helps():
    import typer

    from traceprof.cli import app
    from traceprof.docs import _commands

    for path, _ in [("", None), *_commands(typer.main.get_command(app), "")]:
        code, out, _ = run(*path.split(), "--help")
        assert code == 0 and "--help" in out, path
        yield path, out


def test_help_shows_field_standard_value_words():
    seen = 0
    for path, out in _helps():
        assert not TYPER_WORDS.findall(out), (path, TYPER_WORDS.findall(out))
        seen += 1
    assert seen > 15
    code, out, _ = run("ingest", "--help")
    assert "ingest [OPTIONS] PATH..." in out
    line = {
        w: next(ln for ln in out.splitlines() if f" {w} " in ln)
        for w in ("--partial", "--jobs", "--db", "--run", "--max-inflate")
    }
    # a flag takes no value: no word; the others: the standard one (or the option's own)
    assert "<" not in line["--partial"] and "bool" not in line["--partial"]
    assert [
        line[w].split()[i] for w, i in (("--jobs", 3), ("--db", 2), ("--run", 2), ("--max-inflate", 2))
    ] == [
        "N",
        "PATH",
        "NAME",
        "RATIO",
    ]
    words = {
        ("diff",): ["diff [OPTIONS] BASE CAND", "[METRIC=]FRACTION", "KEY=VALUE"],
        ("summary",): ["[ANALYSIS.]KEY=VALUE", "table|json|csv|markdown", "RUNS"],
        ("analyze",): ["analyze [OPTIONS] [NAME]", "human|ns", "RUN"],
        ("baseline", "add"): ["baseline add [OPTIONS] NAME RUN..."],
        ("sql",): ["sql [OPTIONS] QUERY", "SECONDS"],
    }
    for cmd, want in words.items():
        out = run(*cmd, "--help")[1]
        assert all(w in out for w in want), (cmd, [w for w in want if w not in out])
    # the arguments panel names a repeatable argument as the usage line does, and so does click's message
    assert re.search(r"\*\s+RUN\.\.\.\s+Runs \(names or ids\) to add", run("baseline", "add", "--help")[1])
    assert _line(run("baseline", "add", "x")[2]).startswith("error: Missing argument 'RUN...'. (see ")


def test_h_is_help_on_every_command():
    # -h prints what --help prints, on the app, every command and every subcommand (it was
    # "No such option: -h" everywhere but analyze)
    seen = 0
    for path, out in _helps():
        code, short, err = run(*path.split(), "-h")
        assert (code, short) == (0, out), (path, err)
        seen += 1
    assert seen > 15


def test_every_help_of_a_command_taking_db_names_its_environment_variable(tmp_path):
    import typer

    from traceprof.cli import app
    from traceprof.docs import _commands
    from traceprof.engine import analysis

    # every command with a --db option (click's own list), and analyze NAME's help of its own
    takes = [
        p for p, cmd in _commands(typer.main.get_command(app), "") if any(o.name == "db" for o in cmd.params)
    ]
    assert {"ingest", "sql", "analyze", "baseline", "baseline add", "runs rm"} <= {p.strip() for p in takes}
    helps = [(p.split(), run(*p.split(), "--help")[1]) for p in takes]
    helps += [(["analyze", n], run("analyze", n, "--help")[1]) for n in analysis.names()]
    for path, out in helps:
        assert "[env var: TRACEPROF_DB]" in " ".join(out.replace("│", " ").split()), path
    # analyze NAME's help: the line names the option, its variable and the built-in default
    want = "--db PATH  Store file (DuckDB). [env var: TRACEPROF_DB] [default: traceprof.duckdb]; "
    assert run("analyze", "idle", "-h")[1].splitlines()[2].startswith(want)


def test_analyze_list_help_is_help_not_the_list():
    # it printed the list of analyses
    code, out, _ = run("analyze", "list", "--help")
    assert code == 0 and out.startswith(
        "traceprof analyze list [-f table|json|csv] [--raw]\n\nList the analyses"
    )
    assert "critical_path" not in out
    assert run("analyze", "list", "-h")[1] == out
    listed = run("analyze", "list")[1]  # the list itself: names in a column as wide as the longest,
    # each summary without the name (t14: "critical_path critical_path: ...", the column 12 wide)
    assert listed.splitlines()[0].startswith("critical_path  where every nanosecond")
    assert "desync         which ranks fell out of step" in listed and "critical_path:" not in listed


def test_an_unknown_analysis_suggests_the_nearest():
    code, _, err = run("analyze", "straggler")
    assert code == 1 and "no analysis 'straggler'; did you mean 'stragglers'? choose one of:" in err
    code, _, err = run("analyze", "STRAGGLERS")  # t15: any case
    assert code == 1 and "did you mean 'stragglers'?" in err


def test_the_typer_words_pattern_finds_what_typer_printed():
    # the check above cannot pass vacuously: each word typer 0.29 printed is found
    for shown in (
        "<str>",
        "<int>",
        "<float>",
        "<Path>",
        "<list[str]>",
        "<list[Path]>",
        "<bool>",
        "{paths}...",
        "<table|json|csv>",
    ):
        assert TYPER_WORDS.search(f"  --x  {shown}  help"), shown
    assert not TYPER_WORDS.search("rank%q{RANK} result_<name>_<table>")


# -- values that are not numbers, or too large: one line, the value as typed -------------------------

BAD_VALUES = [
    (["ingest", "IN", "-j", "abc"], "error: --jobs abc: expected a whole number"),
    (
        ["ingest", "IN", "-j", "99999999999999999999"],
        "error: --jobs 99999999999999999999: expected 1 to 1,024 parser processes",
    ),
    (["ingest", "IN", "-j", "1025"], "error: --jobs 1025: expected 1 to 1,024 parser processes"),
    (["ingest", "IN", "-j", "0x10"], "error: --jobs 0x10: expected a whole number"),
    (["ingest", "IN", "--max-inflate", "big"], "error: --max-inflate big: expected a number"),
    (["sql", "SELECT 1", "--max-rows", "ten"], "error: --max-rows ten: expected a whole number"),
    (["sql", "SELECT 1", "--timeout", "1 s"], "error: --timeout '1 s': expected a number"),
    (["history", "job", "--window", "1.5"], "error: --window 1.5: expected a whole number"),
    (["runs", "-f", "yaml"], "error: --format yaml: expected table, json or csv"),
    (["summary", "-f", "html"], "error: --format html: expected table, json, csv or markdown"),
    (
        ["collect", "-n", "two", "-o", "OUT", "--", "python", "-c", "pass"],
        "error: --nproc two: expected a whole number",
    ),
    (
        ["diff", "a", "b", "-t", "step_time_ns=abc"],
        "error: --threshold 'step_time_ns=abc': expected a fraction such as 0.1 (10%)",
    ),
    (
        ["analyze", "mfu", "-p", "peak_tflops=312", "-p", "peak_tflops=989"],
        "error: -p peak_tflops given twice, as 'peak_tflops=312' and 'peak_tflops=989': give it once",
    ),
    (
        ["summary", "-p", "gaps.hta=true", "-p", "gaps.hta=false"],
        "error: -p gaps.hta given twice, as 'gaps.hta=true' and 'gaps.hta=false': give it once",
    ),
    (["diff", "a", "b", "-t", "abc"], "error: --threshold 'abc': expected a fraction such as 0.1 (10%)"),
]


@pytest.mark.parametrize(("args", "want"), BAD_VALUES, ids=[" ".join(a[1:]) for a, _ in BAD_VALUES])
def test_bad_values_are_one_line_echoing_the_option_and_value(tmp_path, args, want):
    args = [
        str(SAMPLES / "normal") if a == "IN" else str(tmp_path / "out") if a == "OUT" else a for a in args
    ]
    code, _, err = run(*args, "--db", str(tmp_path / "s.duckdb"))
    assert code == 1 and _line(err) == want, err
    assert list(tmp_path.iterdir()) == []  # no store, no lock file, no output folder


def test_large_but_valid_numbers_still_pass(tmp_path):
    # 1,024 parser processes are within range (one more is refused); --max-rows has no bound: a
    # huge cap is every row (test_sandbox's test_huge_max_rows_is_all_rows)
    code, _, err = run("ingest", str(SAMPLES / "normal"), "--db", str(tmp_path / "s.duckdb"), "-j", "1_024")
    assert code == 0, err
    code, out, err = run(
        "sql", "SELECT 1 AS x", "--db", str(tmp_path / "s.duckdb"), "--max-rows", str(10**30), "-f", "csv"
    )
    assert (code, out) == (0, "x\n1\n"), err


# -- --db that is a folder ---------------------------------------------------------------------------


@pytest.mark.parametrize("db", ["x/", "x/.", "x/..", "folder", "folder/", "link"])
def test_db_folder_is_one_line(tmp_path, db):
    (tmp_path / "folder").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "folder")
    for how in ("option", "env"):
        args = ["runs", "--db", db] if how == "option" else ["runs"]
        r = _cli(*args, cwd=tmp_path, env={"TRACEPROF_DB": db} if how == "env" else None)
        assert r.returncode == 1 and _line(r.stderr) == (
            f"error: {db!r}: a folder, not a store file; --db takes a store file or a new path"
        ), (how, r.stderr)
    r = _cli("ingest", str(SAMPLES / "normal"), "--db", db, cwd=tmp_path)
    assert r.returncode == 1 and "a folder, not a store file" in _line(r.stderr)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder", "link"]  # no file x, no lock file


def test_store_refuses_a_folder_path(tmp_path):
    from traceprof.storage.store import Store

    for db in (f"{tmp_path}/x/", str(tmp_path)):
        with pytest.raises(StoreError, match="a folder, not a store file"):
            Store(db)
    assert list(tmp_path.iterdir()) == []


# -- -p KEY= : the built-in default ------------------------------------------------------------------


def _all_params():
    from traceprof.engine import analysis as registry

    for spec in registry.specs():
        for f in dataclasses.fields(spec.params):
            if f.name != "run":
                yield spec, f


def test_every_parameter_takes_its_default_back():
    from traceprof.engine import analysis as registry

    seen = 0
    for spec, f in _all_params():
        want = registry.make_params(spec, "r", {})
        for word in ("", "default", " DEFAULT "):
            assert registry.make_params(spec, "r", {f.name: word}) == want, (spec.name, f.name, word)
        if f.default is None:  # an optional one: none is its default too
            assert registry.make_params(spec, "r", {f.name: "None"}) == want
        seen += 1
    assert seen > 30


def test_a_bad_parameter_value_names_it_and_its_default():
    from traceprof.engine import analysis as registry

    checked = 0
    for spec, f in _all_params():
        kind = registry.param_types(spec.params)[f.name]
        bad = "zz" if kind in (int, float, bool) or f.default is None else None
        if bad is None:
            continue
        with pytest.raises(UsageError) as e:
            registry.make_params(spec, "r", {f.name: bad})
        msg = str(e.value)
        assert msg.startswith(f"{f.name}='zz': expected ") and msg.endswith(
            f"(or {f.name}= for its default)"
        ), msg
        checked += 1
    assert checked > 25


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    d = tmp_path_factory.mktemp("odd")
    r = _cli("ingest", str(SAMPLES / "normal"), "--db", str(d / "s.duckdb"), cwd=d)
    assert r.returncode == 0, r.stderr
    return d


def test_dash_p_empty_undoes_the_config_file(store):
    # traceprof.toml sets mfu.peak_tflops = 312: the sample (CPU) run's MFU is computed against it;
    # -p peak_tflops= (or none, default) gives the built-in default back: no peak, MFU empty
    cfg = store / "traceprof.toml"
    cfg.write_text('[params]\n"mfu.peak_tflops" = 312\n')
    env = {"TRACEPROF_CONFIG": str(cfg)}

    def peaks(*p: str) -> set[str]:
        r = _cli("analyze", "mfu", "--db", "s.duckdb", "-f", "csv", "--no-cache", *p, cwd=store, env=env)
        assert r.returncode == 0, r.stderr
        head, *rows = r.stdout.splitlines()
        i = head.split(",").index("peak_tflops")
        return {row.split(",")[i] for row in rows}

    assert peaks() == {"312.0"}
    for p in ("peak_tflops=", "mfu.peak_tflops=none", "peak_tflops=default"):
        assert peaks("-p", p) == {""}, p
    r = _cli("analyze", "mfu", "--db", "s.duckdb", "-p", "peak_tflops=fast", cwd=store, env=env)
    assert r.returncode == 1
    assert _line(r.stderr) == "error: peak_tflops='fast': expected a number (or peak_tflops= for its default)"


def test_a_line_break_in_a_value_stays_on_one_line(tmp_path):
    # a --db path holding a line break (and an escape): its message was two lines
    code, _, err = run("runs", "--db", str(tmp_path / "a\nb\x1b[31m"))
    assert (
        code == 1
        and _line(err)
        == f"error: {tmp_path}/a\\nb\\x1b[31m: no such store; create it with `traceprof ingest PATH`"
    )


def test_config_that_is_a_folder(tmp_path):
    code, _, err = run("--config", str(tmp_path), "runs")
    assert code == 1 and _line(err) == f"error: config file {tmp_path} (--config): a folder, not a file"


@pytest.mark.parametrize(
    "args, said",
    [
        (
            ["report", "--db", "s.duckdb", "-o", ""],
            "-o: the path is empty (''); -o takes the output file's name",
        ),
        (
            ["export", "perfetto", "--db", "s.duckdb", "-o", ""],
            "-o: the path is empty (''); -o takes the output file's name",
        ),
        (["runs", "--db", ""], "--db: the path is empty (''); --db takes a store file or a new path"),
        (
            ["--config", "", "runs", "--db", "s.duckdb"],
            "--config: the path is empty (''); --config takes a config file",
        ),
        (
            ["ingest", "", "--db", "s.duckdb"],
            "PATH: the path is empty (''); PATH takes a trace file or folder",
        ),
        (
            ["collect", "-o", "", "--", "python", "-c", "pass"],
            "--out: the path is empty (''); --out takes the folder for the rank traces",
        ),
    ],
)
def test_an_empty_path_is_said_to_be_empty(store, args, said):
    # Path("") is ".": export perfetto -o '' said "'': a folder, not a file", ingest '' read the current
    # folder, collect -o '' wrote the rank traces into it; each now says the path is empty, and runs nothing
    before = sorted(p.name for p in store.iterdir())
    r = _cli(*args, cwd=store)
    assert r.returncode == 1 and _line(r.stderr) == f"error: {said}"
    assert sorted(p.name for p in store.iterdir()) == before


@pytest.mark.parametrize("out", [".", "new/", "new/."])
def test_an_output_file_written_as_a_folder(store, out):
    # report -o new/ wrote the report to the file new (export perfetto -o new/ too)
    for cmd in (["report"], ["export", "perfetto"]):
        r = _cli(*cmd, "--db", "s.duckdb", "-o", out, cwd=store)
        assert r.returncode == 1, r.stderr
        assert _line(r.stderr) == f"error: {out!r}: a folder, not a file; -o takes the output file's name"
    assert not (store / "new").exists()
