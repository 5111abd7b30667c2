"""Markdown for pull-request comments: untrusted names stay inert and inside their cell."""

from __future__ import annotations

import polars as pl

from traceprof.core.term import md_text
from traceprof.engine.analysis import Finding, Verdict
from traceprof.engine.findings import Findings
from traceprof.render.markdown import findings_markdown, table

HOSTILE = "k|x`rm`<img src=x onerror=alert(1)><!--\n| forged | row |\n@all *b* [l](http://e) \\"


def test_md_text_escapes_pipes_backticks_html_newlines_mentions():
    s = md_text(HOSTILE)
    assert "\n" not in s and "<" not in s and ">" not in s and "@" not in s
    # every pipe, backtick, bracket and star is backslash-escaped (a \\ pair is an escaped backslash)
    body = s.replace("\\\\", "")
    for ch in "|`*[]":
        assert body.count(ch) == body.count("\\" + ch) == HOSTILE.count(ch), ch
    assert "&lt;img" in s and "&#64;all" in s and "\\n" in s


def test_table_keeps_hostile_names_in_their_cell_and_durations_human():
    df = pl.DataFrame({"name": [HOSTILE, "ok"], "total_ns": [1_500_000, 2_000]})
    lines = table(df)
    # one unit per column, named in the header (the units rule of every table): the median of
    # 1,500,000 and 2,000 ns is 751,000 ns, in us
    assert lines[0] == "| name | total (us) |" and lines[1] == "| --- | ---: |"
    assert len(lines) == 4  # header, rule, two rows: the newline in the name forged no row
    for ln in lines:
        assert ln.replace("\\|", "").count("|") == 3
    assert lines[2].endswith("| 1,500 |") and lines[3] == "| ok | 2 |"


def test_findings_markdown_headline_and_table():
    f = Findings(
        "run|1",
        (
            Finding("stragglers", "rank 3 `late`", 12.5, True, "stragglers", status="problem", rank=3),
            Finding("idle", "idle 4%", 4.0, False, "temporal", status="ok", ranks=(0,)),
        ),
        (Verdict("stragglers", "problem", "rank 3"), Verdict("idle", "ok", "fine")),
        (),
    )
    md = findings_markdown(f).splitlines()
    assert md[0] == "### traceprof summary: run run\\|1"
    assert "Verdict: **problem** (stragglers)" in md and "> rank 3 \\`late\\`" in md
    assert "| 1 | stragglers | problem |  | 12.5% | 3 | rank 3 \\`late\\` |" in md
    assert "| 2 | idle | ok |  | 4.0% | 0 | idle 4% |" in md
    ok = Findings("r", (), (Verdict("idle", "ok", "fine"),), ())
    assert "Verdict: **ok**" in findings_markdown(ok)
