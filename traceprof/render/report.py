"""The self-contained HTML report: the step waterfall and findings first, then a timeline of one step,
then every analysis.

Layout: the run's facts; the per-rank step waterfall (``critical_path``: a stacked bar per rank of
where its step time went); the ranked findings (``traceprof.engine.findings``) and one verdict per topic;
one line naming the analyses that do not apply to the run's sources and what they need; the
timeline of the median step (``traceprof.engine.timeline``); a section per analysis (notes, plots, the
tables behind them); the diff against a baseline when asked (or why the runs cannot be compared);
the ranks and trace files.

One file that works offline (``traceprof.render.plots.embed``: bokeh's JavaScript inlined, compressed;
budget: under 1 MB for the sample runs, checked by the tests; the full names behind shortened
table cells stored once, compressed: :func:`_names_once`). Every string that comes from a
trace (kernel, op and file names) is HTML-escaped. Analyses know nothing of HTML: the report
renders any :class:`traceprof.engine.analysis.FrameResult` through ``title``, ``notes``, ``frames()``
and ``charts()``.
"""

from __future__ import annotations

import base64
import gzip
import html
import json
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import polars as pl

from traceprof.core import term
from traceprof.core.display import UNITS, ColumnFormat, column_formats, format_cell, plain, shown_rows
from traceprof.core.errors import AnalysisError, TraceprofError, UsageError
from traceprof.core.fileio import write_output
from traceprof.core.names import distinct_short
from traceprof.engine import analysis as registry
from traceprof.engine import findings as fnd
from traceprof.engine import session
from traceprof.engine.analysis import FrameResult
from traceprof.engine.timing import analysis_mfu_options
from traceprof.storage.runs import ranks_text
from traceprof.storage.store import Store

__all__ = ["write_report", "render_html", "SIZE_BUDGET_BYTES"]

#: The report of a sample run stays below this (tests/test_report.py checks it).
SIZE_BUDGET_BYTES = 1_000_000

#: Rows a section's main table shows; its folded tables show :data:`_MAX_FOLDED_ROWS` (the CLI
#: and SQL give every row): the report stays within its size budget on runs of many kernels.
_MAX_ROWS = 200
_MAX_FOLDED_ROWS = 100

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:20px 24px;color:#1a1a1a;max-width:1400px}
h1{font-size:1.5em;margin:0 0 4px}h2{border-bottom:1px solid #ddd;padding-bottom:4px;margin-top:1.6em}
.facts{color:#555;margin:0 0 10px}
table{border-collapse:collapse;font-size:12px;margin:8px 0}
td,th{border:1px solid #ddd;padding:3px 6px;text-align:right;white-space:nowrap;max-width:520px;overflow:hidden;text-overflow:ellipsis}
th{background:#f4f4f4}td.s{text-align:left}
.note{background:#f7f9fc;border-left:3px solid #4a7bd0;padding:6px 10px;margin:6px 0}
.err{background:#fff4f4;border-left:3px solid #c33;padding:6px 10px}
.hta{background:#fff8e1;border-left:3px solid #e0a800;padding:6px 10px;margin:6px 0}
details{margin:6px 0}.scroll{overflow-x:auto;max-width:100%}.plot{width:100%}
ol.findings{padding-left:1.6em;margin:6px 0}ol.findings li{margin:4px 0;line-height:1.35;overflow-wrap:anywhere}
.cost{display:inline-block;min-width:4.2em;font-weight:600;color:#a50f15}.cost.none{color:#777}
li.ok .cost{color:#2b7a2b}
table.verdicts td{white-space:normal;text-align:left;max-width:1100px;overflow-wrap:anywhere}
.st-problem{color:#a50f15;font-weight:600}.st-ok{color:#2b7a2b;font-weight:600}.st-na{color:#777}
.st-inconclusive{color:#9a5b00;font-weight:600}
.missing{color:#444;background:#f6f6f6;padding:6px 10px;margin:8px 0}
"""


def _esc(s: str) -> str:
    r"""``s`` for HTML text or an attribute: control characters written out as the terminal shows
    them (ESC as ``\x1b``, newline as ``\n``: :func:`traceprof.core.term.escape`), then HTML-escaped."""
    return html.escape(term.escape(s))


def _cell(v: object, f: ColumnFormat, metric: object, names: dict[str, str] | None) -> str:
    """One HTML table cell: numbers right-aligned in their column's unit
    (:func:`traceprof.core.display.format_cell`), text left-aligned and escaped, a long name in its
    shortest form that tells it apart from the column's others, the full text on hover."""
    if isinstance(v, float | int) and not isinstance(v, bool):
        return f"<td>{_esc(format_cell(v, f, metric if isinstance(metric, str) else None))}</td>"
    text = plain(v)
    short = names.get(text, text) if names is not None and isinstance(v, str) else text
    if short != text:  # long kernel/op names: the short form, the full name on hover
        return f'<td class="s" title="{_esc(text)}">{_esc(short)}</td>'
    return f'<td class="s">{_esc(text)}</td>'


#: A table cell's full text on hover, as :func:`_cell` writes it (the text is escaped: no ``"``).
_FULL_TITLE = re.compile(r'<td class="s" title="([^"]*)">')

#: Sets each ``data-full`` cell's hover text from the page's ``tp-names`` list (:func:`_names_once`).
_NAMES_LOADER = """<script>
(async function () {
  try {
    const packed = document.getElementById("tp-names").textContent.trim();
    const bytes = Uint8Array.from(atob(packed), c => c.charCodeAt(0));
    const text = await new Response(new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"))).text();
    const names = JSON.parse(text);
    for (const cell of document.querySelectorAll("td[data-full]")) cell.title = names[Number(cell.dataset.full)];
  } catch (e) {}
})();
</script>"""


def _names_once(page: str) -> str:
    """``page`` with each table cell's full name (the hover text of a shortened kernel or op name,
    repeated in every table and row that shows it: 191 KB of hta ``trace_filter``'s 1.04 MB
    report) stored once: the cells carry its index (``data-full``), and the distinct names are
    one gzip-compressed, base64-encoded JSON list (``tp-names``, as ``traceprof.render.plots.embed``
    stores bokeh's JavaScript) that a small script turns back into each cell's ``title``. Nothing
    is lost (the names are in the page), and no trace text reaches the HTML from there."""
    ids: dict[str, int] = {}

    def ref(m: re.Match[str]) -> str:
        k = ids.setdefault(html.unescape(m.group(1)), len(ids))
        return f'<td class="s" data-full="{k}">'

    out = _FULL_TITLE.sub(ref, page)
    if not ids:
        return page
    data = json.dumps(list(ids), ensure_ascii=False, separators=(",", ":")).encode()
    packed = base64.b64encode(gzip.compress(data, 9, mtime=0)).decode("ascii")
    tail = f'<script id="tp-names" type="application/octet-stream">{packed}</script>\n{_NAMES_LOADER}\n'
    return out.replace("</body></html>", tail + "</body></html>")


def _table_html(
    df: pl.DataFrame, max_rows: int = _MAX_ROWS, units: str = "human", more: str = "", worst: str = ""
) -> str:
    """A table of ``max_rows`` of ``df``'s rows (the first; of per-step rows, the worst by
    ``worst``: :func:`traceprof.core.display.shown_rows`), in the one units rule of every table
    (:func:`traceprof.core.display.column_formats`: durations in the unit their header names)."""
    formats = column_formats(df, units)
    head = "".join(f"<th>{_esc(f.header)}</th>" for f in formats)
    shown, which = shown_rows(df, max_rows, worst)
    names = [distinct_short(shown[c], 80) if shown[c].dtype == pl.String else None for c in df.columns]
    mi = df.columns.index("metric") if "metric" in df.columns else None
    rows = [
        "<tr>"
        + "".join(
            _cell(v, f, row[mi] if mi is not None else None, n)
            for v, f, n in zip(row, formats, names, strict=True)
        )
        + "</tr>"
        for row in shown.iter_rows()
    ]
    more = f"<p>{_esc(which)} ({_esc(more or 'the CLI or SQL give every row')}).</p>" if which else ""
    table = f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"
    return f'<div class="scroll">{table}</div>{more}'


def _section(name: str, result: FrameResult, figs: list[Any], units: str = "human") -> str:
    from traceprof.render import plots

    parts = [f'<h2 id="{_esc(name)}">{_esc(result.title or name)}</h2>']
    parts += [f'<div class="note">{_esc(n)}</div>' for n in result.notes]
    for chart in result.charts():
        df = result.frames()[chart.frame]
        cols = [chart.value] if chart.kind == "heatmap" else list(chart.ys)
        present = [c for c in cols if c in df.columns]
        if df.is_empty() or all(df[c].null_count() == df.height for c in present):
            continue  # nothing to draw: the section's tables and notes say why
        if all(df[c].dtype.is_numeric() and not (df[c].fill_null(0) != 0).any() for c in present):
            what = chart.title.replace(" (ns)", "")
            parts.append(f'<p class="facts">{_esc(what)}: nothing to draw, every value is 0.</p>')
            continue
        fig, note = plots.chart(result, chart)
        figs.append(fig)
        parts.append(f"<!--PLOT{len(figs) - 1}-->")
        if note:
            parts.append(f'<p class="facts">{_esc(chart.title.replace(" (ns)", ""))}: {_esc(note)}.</p>')
    for fname, frame in result.frames().items():
        label = "table" if fname == "frame" else fname
        opened = " open" if fname == "frame" else ""
        rows = _MAX_ROWS if fname == "frame" else _MAX_FOLDED_ROWS
        how = f"traceprof analyze {name}{'' if fname == 'frame' else f' --table {fname}'} -f csv gives every row"
        known = name in registry.names()
        worst = registry.get(name).worst(fname) if known else ""
        table = _table_html(frame, rows, units, how if known else "", worst)
        parts.append(
            f"<details{opened}><summary>{_esc(label)} ({frame.height} rows)</summary>{table}</details>"
        )
    return "\n".join(parts)


def _findings_html(f: fnd.Findings, sources: list[str]) -> str:
    items = []
    for x in f.findings:
        shown = x.rank_by  # recoverable time by the step account, else the finding's own cost
        cost = (
            f'<span class="cost">{shown:.0f}%</span>'
            if shown is not None
            else '<span class="cost none">&ndash;</span>'
        )
        status = f'<span class="st-{"na" if x.status == "n/a" else _esc(x.status)}">{_esc(x.status)}</span>'
        text = _esc(
            x.full or x.text
        )  # whole names: a page has the room (the terminal's text cuts a long one)
        items.append(
            f'<li class="{"problem" if x.problem else "ok"}">{cost} {status} {text} '
            f'<a href="#{_esc(x.section)}">details</a></li>'
        )
    empty = f.empty_text[0].upper() + f.empty_text[1:] + "."
    listing = f'<ol class="findings">{"".join(items)}</ol>' if items else f'<p class="findings">{empty}</p>'
    rows = "".join(
        f'<tr><td class="s">{_esc(v.topic)}</td><td class="s st-{"na" if v.status == "n/a" else v.status}">'
        f'{_esc(v.status)}</td><td class="s">{_esc(v.text)}</td></tr>'
        for v in f.verdicts
    )
    verdicts = (
        (
            f'<table class="verdicts"><thead><tr><th>topic</th><th>verdict</th><th></th></tr></thead>'
            f"<tbody>{rows}</tbody></table>"
        )
        if rows
        else ""
    )
    return (
        '<h2 id="findings">Findings</h2>'
        + (f'<p class="facts"><b>Ranks:</b> {_esc(f.coverage)}</p>' if f.coverage else "")
        + f'<p class="facts">{_esc(f.ranking)} (&ndash;: no cost '
        f"measured), each with its topic's verdict.</p>{listing}{verdicts}{_missing_html(f, sources)}"
    )


def _missing_html(f: fnd.Findings, sources: list[str]) -> str:
    """One line: the analyses that do not apply, grouped by what they need, and how to get it."""
    if not f.unavailable:
        return ""
    groups: dict[str, list[str]] = {}
    for m in f.unavailable:
        groups.setdefault(m.needs or m.reason, []).append(m.analysis)
    parts = "; ".join(f"{', '.join(names)} need {needs}" for needs, names in groups.items())
    return (
        f'<p class="missing" id="missing"><b>Not available from this run\'s sources '
        f"({_esc(', '.join(sources) or 'none')}):</b> {_esc(parts)}. To get them, "
        f"{_esc(fnd.HOW)}.</p>"
    )


def _timeline_html(
    store: Store, run_id: int, figs: list[Any], paths: list[pl.DataFrame] | None = None
) -> str:
    """The timeline of the median step, with the paths an analysis draws on it (``critical_path``'s)."""
    from traceprof.engine.timeline import step_timeline, with_path
    from traceprof.render import plots

    head = '<h2 id="timeline">Timeline</h2>'
    try:
        tl = step_timeline(store, run_id)
    except TraceprofError as e:
        return f'{head}<p class="missing">No timeline: {_esc(str(e))}.</p>'
    if isinstance(tl, str):
        return f'{head}<p class="missing">No timeline: {_esc(tl)}.</p>'
    for path in paths or []:
        tl = with_path(tl, path)
    figs.append(plots.timeline(tl))
    return f"{head}<!--PLOT{len(figs) - 1}-->"


def _leads_html(results: dict[str, FrameResult | TraceprofError], figs: list[Any]) -> tuple[str, list[str]]:
    """The charts the report opens with, above the findings (their spec's ``Report.lead``:
    ``critical_path``'s per-rank step waterfall, compact so that the findings below stay on the
    first screen), or for each one why there is none; and their anchors."""
    from traceprof.render import plots

    html, anchors = [], []
    for spec in fnd.report_analyses():
        lead = spec.report.lead if spec.report is not None else None
        if lead is None:
            continue
        anchors.append(lead.anchor)
        res = results.get(spec.name)
        built = (
            lead.build(res)
            if isinstance(res, FrameResult)
            else (str(res) if res is not None else f"{spec.name} did not run")
        )
        if isinstance(built, str):
            html.append(
                f'<p class="missing" id="{_esc(lead.anchor)}">No {_esc(lead.what)}: {_esc(built)}.</p>'
            )
            continue
        frame, chart = built
        with plots.quiet():
            figs.append(
                plots.bars(frame, chart.x, list(chart.ys), chart.title, stacked=chart.stacked, height=230)
            )
        html.append(f'<div id="{_esc(lead.anchor)}"><!--PLOT{len(figs) - 1}--></div>')
    return "\n".join(html), anchors


def _timeline_paths(results: dict[str, FrameResult | TraceprofError]) -> list[pl.DataFrame]:
    """The frames the report draws as a path on the timeline (``Report.timeline_path``)."""
    out = []
    for spec in fnd.report_analyses():
        res = results.get(spec.name)
        if spec.report is not None and spec.report.timeline_path and isinstance(res, FrameResult):
            out.append(res.frames()[spec.report.timeline_path])
    return out


def render_html(
    store: Store,
    run: str | None,
    extra: list[tuple[str, FrameResult]] | None = None,
    params: dict[str, dict[str, str]] | None = None,
    baseline: str | None = None,
    force: bool = False,
    units: str = "human",
) -> str:
    """The report of one run as an HTML string.

    Args:
        store: An open store.
        run: Run name or id (default: latest).
        extra: More (name, result) sections appended at the end.
        params: Parameters per analysis as strings, e.g. ``{"mfu": {"peak_tflops": "989"}}``.
        baseline: A run to diff against (name or id); runs that are not comparable get a diff
            section saying why.
        force: Diff runs that are not comparable anyway, by per-rank medians (``diff --force``).
        units: The tables' durations: ``human`` (each column in s, ms or us, its header saying
            which) or ``ns`` (exact ints).

    Raises:
        StoreError: No such run (or baseline).
        UsageError: A parameter names no report analysis or has a bad value, or bad ``units``.
    """
    if units not in UNITS:
        raise UsageError(f"--units {units!r}: expected human or ns")
    with session.of(store):  # each analysis once: findings, verdict and sections share the results
        return _names_once(_render(store, run, extra, params, baseline, force, units))


def _render(
    store: Store,
    run: str | None,
    extra: list[tuple[str, FrameResult]] | None,
    params: dict[str, dict[str, str]] | None,
    baseline: str | None,
    force: bool,
    units: str,
) -> str:
    from traceprof.render import plots

    run_id = store.resolve_run(run)
    results = fnd.run_analyses(store, run_id, params)
    diff = (
        fnd.compare(store, baseline, run_id, analysis_mfu_options(params), force)
        if baseline is not None
        else None
    )
    hta = fnd.hta_mode(params)
    f = fnd.build(store, run_id, results, diff, hta, params)
    info = store.sql("SELECT * FROM runs WHERE run_id = ?", [run_id]).row(0, named=True)
    traces = store.sql(
        """SELECT rank, source, format, device_name, backend, host, events_kept, events_rejected, events_skipped,
                  regexp_extract(path, '[^/]+$') AS file
           FROM traces WHERE run_id = ? ORDER BY rank, source""",
        [run_id],
    )
    issues = store.run_issues(run_id)  # what ingest dropped or repaired, as `runs` shows it
    sources = list(info["sources"] or [])
    figs: list[Any] = []
    top, leads = _leads_html(results, figs)
    sections = [_timeline_html(store, run_id, figs, _timeline_paths(results))]
    toc = [*leads, "findings", "timeline"]
    with plots.quiet():
        for name, res in results.items():
            if isinstance(res, FrameResult):
                sections.append(_section(name, res, figs, units))
                toc.append(name)
        for name, res in list(extra or []):
            sections.append(_section(name, res, figs, units))
            toc.append(name)
        if isinstance(diff, FrameResult):
            sections.append(_section("diff", diff, figs, units))
            toc.append("diff")
        elif diff is not None:
            sections.append(
                f'<h2 id="diff">Regression diff against {_esc(str(baseline))}</h2>'
                f'<div class="err">not compared: {_esc(str(diff))}</div>'
            )
            toc.append("diff")
        tail, divs = plots.embed(figs)
    body = "\n".join(sections)
    for i, div in enumerate(divs):
        body = body.replace(f"<!--PLOT{i}-->", div)
        top = top.replace(f"<!--PLOT{i}-->", div)
    title = f"traceprof report: {info['name']}"
    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    nav = " · ".join(f'<a href="#{_esc(n)}">{_esc(n)}</a>' for n in [*toc, "traces"])
    ranks = ranks_text(store, run_id)
    devices = ", ".join(sorted({str(d) for d in traces["device_name"].drop_nulls().to_list()})) or "unknown"
    hta_note = (
        (
            '<p class="hta"><b>HTA-compatible mode</b> (hta=true): events selected as Holistic Trace '
            "Analysis 0.5.0 does (last ProfilerStep and GPU events without a launch dropped, times rounded "
            "inward to whole us, HTA's kernel classes). By default traceprof keeps all GPU activity, so "
            "windows, idle and overlap can differ.</p>"
        )
        if hta
        else ""
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{_esc(title)}</title>
<style>{_CSS}</style>
</head><body>
<h1>{_esc(title)}</h1>
<p class="facts">Run <b>{_esc(str(info["name"]))}</b> (id {run_id}) · {_esc(ranks)} ·
sources {_esc(", ".join(sources))} · devices {_esc(devices)} · clocks aligned: {info["clock_aligned"]} ·
generated {now} by traceprof</p>
{hta_note}
{top}
{_findings_html(f, sources)}
<p>{nav}</p>
{body}
<h2 id="traces">Ranks and trace files</h2>
<p class="facts">Each column's header names its unit (durations in s, ms or us); the CLI's JSON and CSV keep exact ns.</p>
{_table_html(traces, units=units)}
{f'<p class="facts">Ingest issues (records dropped or repaired, by reason, as `traceprof runs` shows them): {_esc(issues)}</p>' if issues else ""}
{tail}
</body></html>
"""


def write_report(
    store: Store,
    run: str | None,
    output: str | Path,
    baseline: str | None = None,
    params: dict[str, dict[str, str]] | None = None,
    force: bool = False,
    units: str = "human",
) -> Path:
    """Write the report of one run to ``output`` (HTML). Returns the path.

    With ``baseline`` (a run name or id) the report gets a regression diff of the run against it
    (``traceprof.engine.diff``), or, when the runs are not comparable, a diff section saying why.
    ``params``, ``force`` and ``units``: see :func:`render_html`.

    Raises:
        StoreError: No such run.
        AnalysisError: Nothing to report.
        UsageError: ``output`` cannot be written, or a bad parameter.
    """
    text = render_html(store, run, params=params, baseline=baseline, force=force, units=units)
    if not text:
        raise AnalysisError("empty report")
    return write_output(output, text.encode("utf-8"))
