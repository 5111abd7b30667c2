"""Safe output: names from traces never drive the terminal, rich markup or a spreadsheet (issue 11)."""

from __future__ import annotations

import json

import pytest

from tests._cli_inproc import run
from tests.builders import kernel, launch, micro_trace
from traceprof.core import term

# Names a hostile trace may carry, as stored (JSON-decoded).
CLEAR = "\x1b[2J\x1b]0;pwned\x07clear"
CLOSE_TAG = "close[/x]tag"
LINK = "[link=http://evil.example]click[/link]"
MEMORY = "[memory]"
NEWLINE = "fake\n│ forged │ row"
FORMULA = '=HYPERLINK("http://evil.example","x")'
NAMES = [CLEAR, CLOSE_TAG, LINK, MEMORY, NEWLINE, FORMULA, "-2+3", "@SUM(A1)", "+1", "\u202eevil"]


def test_escape_exact():
    assert term.escape(CLEAR) == "\\x1b[2J\\x1b]0;pwned\\x07clear"
    assert term.escape(NEWLINE) == "fake\\n│ forged │ row"
    assert term.escape("a\tb\rc\x00d\x7fe\x9bf") == "a\\tb\\rc\\x00d\\x7fe\\x9bf"
    assert term.escape("\u202eevil\u2028") == "\\u202eevil\\u2028"
    assert term.escape(LINK) == LINK  # markup is not escaped here: term.text() keeps rich from reading it
    assert term.text(LINK).plain == LINK and term.text(LINK).spans == []


def test_csv_cell_exact():
    assert term.csv_cell("=1+2") == "'=1+2"
    assert term.csv_cell("+1") == "'+1"
    assert term.csv_cell("-x") == "'-x"
    assert term.csv_cell("@SUM(A1)") == "'@SUM(A1)"
    assert term.csv_cell("\tx") == "'\\tx"
    assert term.csv_cell("a=b") == "a=b"
    assert term.csv_cell("x\x1by") == "x\\x1by"


@pytest.fixture
def db(tmp_path):
    d = tmp_path / "evil"
    d.mkdir()
    (d / "rank0.json").write_text(json.dumps(micro_trace(NAMES)))
    path = tmp_path / "s.duckdb"
    code, _, err = run("ingest", str(d), "--db", str(path))
    assert code == 0, err
    return path


def test_table_prints_names_literally(db):
    code, out, err = run(
        "sql", "SELECT name FROM events WHERE kind = 'cpu_op' ORDER BY ts_ns", "--db", str(db)
    )
    assert code == 0, err
    assert "\x1b" not in out and "\x07" not in out and "\u202e" not in out
    rows = [ln.strip("│ ") for ln in out.splitlines() if ln.startswith("│")]
    # One table row per event: the newline in a name cannot forge a row.
    assert rows == [
        "\\x1b[2J\\x1b]0;pwned\\x07clear",
        "close[/x]tag",
        LINK,
        "[memory]",
        "fake\\n│ forged │ row",
        FORMULA,
        "-2+3",
        "@SUM(A1)",
        "+1",
        "\\u202eevil",
    ]


def test_analysis_table_and_runs_escape_names(db):
    code, out, err = run("analyze", "launch", "--db", str(db))  # any analysis: the render path is shared
    assert "\x1b" not in out + err and "Traceback" not in err
    code, out, err = run("runs", "--db", str(db))
    assert code == 0 and "evil" in out and "\x1b" not in out


def test_csv_neutralizes_formulas_unless_raw(db):
    q = "SELECT name, -1 AS n FROM events WHERE kind = 'cpu_op' ORDER BY ts_ns"
    code, out, _ = run("sql", q, "--db", str(db), "-f", "csv")
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "name,n"
    assert lines[1] == "\\x1b[2J\\x1b]0;pwned\\x07clear,-1"  # numbers are not strings: -1 stays -1
    assert lines[6] == '"\'=HYPERLINK(""http://evil.example"",""x"")",-1'
    assert lines[7:10] == ["'-2+3,-1", "'@SUM(A1),-1", "'+1,-1"]
    assert len(lines) == 11  # the newline is escaped, so one line per row
    code, out, _ = run("sql", q, "--db", str(db), "-f", "csv", "--raw")
    assert code == 0 and '\n"=HYPERLINK' in out and "\n@SUM(A1),-1\n" in out and "\x1b[2J" in out


def test_csv_guards_text_only_not_negative_decimals_intervals_or_dates(db):
    # Before: `'-1.5,'-1.2,'-01:00:00,-1.5`: DECIMAL and INTERVAL values, printed as DuckDB's text,
    # took the formula guard as if a user had written them. Text (VARCHAR, BLOB, lists) keeps it.
    q = (
        "SELECT -1.5 AS d, round(-1.234::DECIMAL(6,3), 1) AS r, -INTERVAL 1 HOUR AS iv, -1.5::DOUBLE AS f, "
        "'-infinity'::DATE AS dt, '-infinity'::TIMESTAMP AS ts, '-x' AS s, '=a'::BLOB AS b, ['=x'] AS l"
    )
    code, out, err = run("sql", q, "--db", str(db), "-f", "csv")
    assert code == 0, err
    assert out.splitlines() == [
        "d,r,iv,f,dt,ts,s,b,l",
        "-1.5,-1.2,-01:00:00,-1.5,-infinity,-infinity,'-x,'=a,['=x']",
    ]


def test_render_csv_neutralizes_too(db):
    code, out, _ = run("runs", "--db", str(db), "-f", "csv")
    assert code == 0 and out.splitlines()[1].split(",")[1] == "evil"


def test_sql_prints_every_duckdb_type(db):
    q = (
        "SELECT INTERVAL 1 MONTH AS i, union_value(k := 7) AS u, 'infinity'::TIMESTAMP AS t, "
        "'-infinity'::DATE AS d, '\\xAA\\x00'::BLOB AS b, 170141183460469231731687303715884105727::HUGEINT AS h, "
        "{'a': 1} AS s, [1, 2] AS l, 1.5::DECIMAL(4,2) AS dec, 2.5::DOUBLE AS x"
    )
    code, out, err = run("sql", q, "--db", str(db), "-f", "json")
    assert code == 0, err
    assert json.loads(out) == [
        {
            "i": "1 month",
            "u": {"k": 7},  # a union as {tag: value}, nested values as JSON (README's sql section)
            "t": "infinity",
            "d": "-infinity",
            "b": "\\xAA\\x00",
            "h": "170141183460469231731687303715884105727",
            "s": {"a": 1},
            "l": [1, 2],
            "dec": "1.50",
            "x": 2.5,
        }
    ]
    code, out, err = run("sql", q, "--db", str(db))
    assert code == 0 and "infinity" in out and "1 month" in out and "\\xAA\\x00" in out, err
    code, out, err = run("sql", q, "--db", str(db), "-f", "csv")
    # a date's text is DuckDB's, not a user's: no formula guard on -infinity (it had one)
    assert (
        out.splitlines()[1]
        == "1 month,7,infinity,-infinity,\\xAA\\x00,170141183460469231731687303715884105727,{'a': 1},\"[1, 2]\",1.50,2.5"
    )


def test_sql_caps_rows_and_says_so(db):
    code, out, err = run("sql", "SELECT range AS n FROM range(1500)", "--db", str(db), "-f", "csv")
    assert code == 0 and len(out.splitlines()) == 1 + 1000
    assert err.strip() == "note: first 1,000 rows shown; --max-rows 0 prints all"
    code, out, err = run(
        "sql", "SELECT range AS n FROM range(1500)", "--db", str(db), "-f", "csv", "--max-rows", "0"
    )
    assert code == 0 and len(out.splitlines()) == 1 + 1500 and err == ""
    code, out, err = run(
        "sql", "SELECT range AS n FROM range(3)", "--db", str(db), "-f", "json", "--max-rows", "2"
    )
    assert json.loads(out) == [{"n": 0}, {"n": 1}] and "first 2 rows shown" in err


def test_sql_error_is_one_line(db):
    code, out, err = run("sql", "SELECT 'a'::INTEGER", "--db", str(db))
    assert (
        code == 1
        and len(err.strip().splitlines()) == 1
        and err.startswith("error: SQL error: Conversion Error")
    )


def test_error_messages_are_escaped(tmp_path):
    d = tmp_path / "x"
    d.mkdir()
    bad = d / "rank0.json"
    bad.write_text(
        json.dumps({"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "[link=http://e]\x1b[2J", "ts": 1}]})
    )
    code, _, err = run("ingest", str(bad), "--db", str(tmp_path / "s.duckdb"))
    assert code == 1
    assert err.strip().endswith(
        "event #0 (ph='X', name='[link=http://e]\\x1b[2J'): missing 'dur'; pass "
        "--skip-bad-events to skip such events"
    )
    assert "\x1b" not in err


# A long hostile op name (50 characters): escape codes, an HTML tag, a newline. Its family (what a
# symbol is cut to) would drop `<script>` and `(1)</script>` unseen; shown, every character is
# there escaped, or the cut is marked with an ellipsis.
HOSTILE = "cmd|x\x1b[31mRED\x1b[0m<script>alert(1)</script>\nnewline"
LONG_RUN = "job<script>alert(1)</script>" + "_" * 30  # 58 characters, past every table's width


def _cell(out: str, start: str) -> str:
    """The one table cell of ``out`` that starts with ``start``."""
    cells = [c.strip() for ln in out.splitlines() for c in ln.split("│") if c.strip().startswith(start)]
    assert len(cells) == 1, out
    return cells[0]


def _shown_whole_or_cut(cell: str, full: str) -> None:
    """``cell`` is ``full`` escaped, or its escaped head and tail around one ellipsis."""
    whole = term.escape(full)
    if cell != whole:
        head, sep, tail = cell.partition("…")
        assert sep and whole.startswith(head) and whole.endswith(tail) and head and tail, (cell, whole)


def test_shorten_never_drops_characters_unseen():
    from traceprof.core.names import shorten

    # 50 characters cut to 40: the last 40 // 3 = 13 kept, 40 - 13 - 1 = 26 before the ellipsis
    assert shorten(HOSTILE, 40) == HOSTILE[:26] + "…" + HOSTILE[-13:]
    assert (
        shorten(HOSTILE, 40) == "cmd|x\x1b[31mRED\x1b[0m<script>a…ript>\nnewline"
    )  # "ript>" + newline + "newline": 13
    assert shorten("x<b>bold</b>" + "y" * 40, 40).startswith("x<b>bold</b>")
    # a real symbol is still cut to its family (template arguments and parameters are no news)
    sym = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>(int)"
    assert shorten(sym, 40) == "vectorized_elementwise_kernel"


@pytest.fixture
def hostile_db(tmp_path):
    """Two runs of one rank whose cpu_ops are HOSTILE (one call in ``base``, two in ``cand``) and
    ``aten::mm``, and one kernel HOSTILE; the second run is named LONG_RUN."""
    path = tmp_path / "h.duckdb"
    for run_name, names, base_ns in (
        ("base", [HOSTILE, "aten::mm"], 1_700_000_000_000_000_000),
        (LONG_RUN, [HOSTILE, HOSTILE, "aten::mm"], 1_700_000_001_000_000_000),
    ):
        d = tmp_path / f"r{base_ns}"
        d.mkdir()
        doc = micro_trace(names, base_ns=base_ns)
        doc["traceEvents"] += [launch(50, corr=1), kernel(HOSTILE, 7, 60, 5, corr=1)]  # a GPU kernel too
        (d / "rank0.json").write_text(json.dumps(doc))
        code, _, err = run("ingest", str(d), "--run", run_name, "--db", str(path))
        assert code == 0, err
    return path


def test_every_table_shows_long_hostile_names_whole_or_cut(hostile_db):
    db = str(hostile_db)
    code, out, err = run("runs", "--db", db)
    assert code == 0, err
    _shown_whole_or_cut(_cell(out, "job"), LONG_RUN)
    code, out, err = run("analyze", "kernel_sum", "--run", "base", "-f", "table", "--db", db)
    assert code == 0, err
    _shown_whole_or_cut(_cell(out, "cmd|x"), HOSTILE)
    code, out, err = run("diff", "base", LONG_RUN, "--table", "items", "--db", db)
    assert "Traceback" not in err, err
    _shown_whole_or_cut(_cell(out, "cmd|x"), HOSTILE)
    code, out, err = run("summary", "--run", "base", "--db", db)
    assert code in (0, 2, 3) and "Traceback" not in err, err
    assert "<script>" not in out or "alert" in out  # no tag shown without what it held
    for ln in out.splitlines():
        if "cmd|x" in ln:
            assert "<script>a" in ln, ln


def test_command_and_label_quote_for_the_shell():
    assert (
        term.command("traceprof", "runs", "rm", "my run; rm -rf x") == "traceprof runs rm 'my run; rm -rf x'"
    )
    assert term.command("traceprof", "runs", "rm", "it's") == "traceprof runs rm 'it'\"'\"'s'"
    assert term.command("traceprof", "diff", "a,b", "normal") == "traceprof diff a,b normal"
    assert term.label("normal") == "normal" and term.label("a,b") == "a,b"
    assert term.label("my run; rm -rf x") == "'my run; rm -rf x'"


#: Names that look like another name, or hold markup a display form could drop unseen.
ZERO_WIDTH = "aten::m\u200bm\ufeff"
IMG = "x<img src=x onerror=alert(1)>"


def test_zero_width_characters_are_written_out_everywhere(tmp_path):
    # a zero-width space, joiner or BOM hid in a name: "aten::m\u200bm" printed as "aten::mm" in the
    # terminal, CSV and the report (only bidi controls and line separators were escaped)
    assert term.escape("a\u200bb\u200cc\u200dd\u2060e\ufefff\u00adg") == (
        "a\\u200bb\\u200cc\\u200dd\\u2060e\\ufefff\\u00adg"
    )
    assert term.csv_cell("\u200b=1") == "\\u200b=1"  # written out, it starts no formula
    assert (
        term.json_text('"m\u200bm"') == '"m\\u200bm"'
        and json.loads(term.json_text('"m\u200bm"')) == "m\u200bm"
    )
    assert term.md_text("m\u200bm") == "m\\\\u200bm"
    d = tmp_path / "zw"
    d.mkdir()
    (d / "rank0.json").write_text(json.dumps(micro_trace([ZERO_WIDTH, IMG])))
    db = str(tmp_path / "s.duckdb")
    assert run("ingest", str(d), "--db", db)[0] == 0
    q = "SELECT name FROM events WHERE kind = 'cpu_op' ORDER BY ts_ns"
    code, out, _ = run("sql", q, "--db", db)
    assert code == 0 and "aten::m\\u200bm\\ufeff" in out and "\u200b" not in out
    code, out, _ = run("sql", q, "--db", db, "-f", "csv")
    assert code == 0 and out.splitlines() == ["name", "aten::m\\u200bm\\ufeff", IMG]
    code, out, _ = run("sql", q, "--db", db, "-f", "json")
    assert code == 0 and "\u200b" not in out and [r["name"] for r in json.loads(out)] == [ZERO_WIDTH, IMG]


def test_shorten_keeps_markup_a_family_would_drop():
    from traceprof.core.names import shorten

    # only "</", "/>" and "<!" marked markup: a tag with an attribute and no closing tag, a rich link
    # and a script URL were cut to their "family", dropping "<img ...>", "[link=...]" or "(1)" unseen
    assert shorten(IMG + "y" * 40, 40) == IMG[:26] + "…" + "y" * 13
    link = "x[link=file:///etc/passwd]x" + "z" * 40
    assert shorten(link, 40) == link[:26] + "…" + "z" * 13
    js = "javascript:alert(1)_aten::mm_" + "z" * 30
    assert shorten(js, 40) == js[:26] + "…" + "z" * 13
    # a template argument list is no markup: still its family
    assert shorten("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x128_32x3_nn>(Params)", 40) == (
        "cutlass_80_tensorop_s1688gemm_128x128_3…"
    )


@pytest.mark.parametrize(
    ("where", "unit"),
    [
        ("event #2 (ph='X', name='row')", "events"),  # the first of the words: an event named 'row'
        ("event (cat='cpu_op', name='op11', ts_ns=110000)", "events"),
        ("CUPTI_ACTIVITY_KIND_KERNEL row id 5", "rows"),
        ("entry #3 ('gloo:all_reduce')", "entries"),
        ("line 2", "records"),
    ],
)
def test_the_skip_hint_names_the_records_as_the_message_does(where, unit):
    """A Kineto event left out for long text or an out-of-range value said "skip such records" while
    one left out by the parser said "skip such events": the hint now follows the record's name."""
    from traceprof.core.limits import skip_hint

    assert skip_hint(where) == f"; pass --skip-bad-events to skip such {unit}"


def test_first_few_shows_three_then_what_is_left_out():
    """The one helper for "the first 3, ..." lists: 5 items -> 3 shown, "and 2 more" counted (5 - 3);
    3 items -> all, no suffix; only the shown items are formatted."""
    import numpy as np

    from traceprof.core.text import COUNTED, first_few

    assert first_few(["a", "b", "c", "d", "e"]) == "a, b, c, ..."
    assert first_few(["a", "b", "c", "d", "e"], more=COUNTED) == "a, b, c and 2 more"
    assert first_few(["a", "b", "c"], more=COUNTED) == "a, b, c" and first_few([]) == ""
    seen: list[int] = []
    shown = first_few(
        np.arange(1_000), 2, "; ", "; and {} more rank(s)", lambda i: seen.append(int(i)) or f"#{i}"
    )
    assert (shown, seen) == ("#0; #1; and 998 more rank(s)", [0, 1])
    # up to 8 whole, else the first 6 and the count of all (the ranks of a stage or a verdict)
    from traceprof.core.text import short_list

    assert short_list(list(range(8))) == "0, 1, 2, 3, 4, 5, 6, 7"
    assert short_list(list(range(0, 64, 2))) == "0, 2, 4, 6, 8, 10, ... (32)"
