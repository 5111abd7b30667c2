"""The self-contained HTML report: run facts, every analysis as notes, tables and plots.

One file that works offline: bokeh's JavaScript is inlined, no CDN. Every string that comes from a
trace (kernel, op and file names) is HTML-escaped. Analyses know nothing of HTML: the report renders
any :class:`traceprof.analysis.FrameResult` through ``title``, ``notes``, ``frames()`` and
``charts()``.
"""

from __future__ import annotations

import html
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import polars as pl

from traceprof import analysis as registry
from traceprof.analysis import Chart, FrameResult
from traceprof.errors import AnalysisError, TraceprofError, UsageError
from traceprof.fileio import write_output
from traceprof.store import Store

__all__ = ["write_report", "render_html", "REPORT_ANALYSES"]

#: Analyses shown in the report, in this order (those not registered are skipped).
REPORT_ANALYSES = ("temporal", "overlap", "gaps", "idle", "kernels", "launch", "stragglers", "whatif", "mfu")

_MAX_ROWS = 200

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#1a1a1a;max-width:1400px}
h1{font-size:1.6em}h2{border-bottom:1px solid #ddd;padding-bottom:4px;margin-top:2em}
table{border-collapse:collapse;font-size:12px;margin:8px 0}
td,th{border:1px solid #ddd;padding:3px 6px;text-align:right;white-space:nowrap;max-width:520px;overflow:hidden;text-overflow:ellipsis}
th{background:#f4f4f4}td.s{text-align:left}
.note{background:#f7f9fc;border-left:3px solid #4a7bd0;padding:6px 10px;margin:6px 0}
.err{background:#fff4f4;border-left:3px solid #c33;padding:6px 10px}
details{margin:6px 0}.scroll{overflow-x:auto;max-width:100%}
"""


def _table_html(df: pl.DataFrame, max_rows: int = _MAX_ROWS) -> str:
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in df.columns)
    rows = []
    for row in df.head(max_rows).iter_rows():
        cells = []
        for v in row:
            if isinstance(v, float):
                cells.append(f"<td>{v:,.0f}</td>" if v.is_integer() and abs(v) >= 1000 else f"<td>{v:,.3f}</td>")
            elif isinstance(v, int) and not isinstance(v, bool):
                cells.append(f"<td>{v:,}</td>")
            else:
                cells.append(f'<td class="s">{html.escape("" if v is None else str(v))}</td>')
        rows.append("<tr>" + "".join(cells) + "</tr>")
    more = f"<p>{df.height - max_rows} more rows not shown (use the CLI or SQL).</p>" if df.height > max_rows else ""
    table = f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"
    return f'<div class="scroll">{table}</div>{more}'


def _chart(result: FrameResult, chart: Chart) -> Any:
    """A holoviews object for ``chart`` (imported lazily: holoviews is slow to import)."""
    import holoviews as hv

    df = result.frames()[chart.frame]
    if chart.kind == "heatmap":
        data = df.select([pl.col(chart.x).cast(pl.Utf8), pl.col(chart.ys[0]).cast(pl.Utf8), chart.value]).rows()
        return hv.HeatMap(data, kdims=[chart.x, chart.ys[0]], vdims=[chart.value]).opts(
            title=chart.title, colorbar=True, tools=["hover"], width=900, height=360, xrotation=45, cmap="Reds"
        )
    ylabel, title = chart.ylabel or "value", chart.title
    if all(y.endswith("_ns") for y in chart.ys):  # ns axes read badly (3.5e8): plot ms
        df = df.with_columns(pl.col(y) / 1e6 for y in chart.ys)
        ylabel, title = "ms", title.replace(" (ns)", "")
    long = df.select([pl.col(chart.x).cast(pl.Utf8), *chart.ys]).unpivot(
        index=chart.x, on=list(chart.ys), variable_name="series", value_name="value"
    )
    kdims = [chart.x, "series"] if len(chart.ys) > 1 else [chart.x]
    cols = [chart.x, "series", "value"] if len(chart.ys) > 1 else [chart.x, "value"]
    bars = hv.Bars(long.select(cols).rows(), kdims=kdims, vdims=["value"])
    return bars.opts(
        title=title, stacked=chart.stacked, tools=["hover"], width=900, height=320,
        ylabel=ylabel, legend_position="right",
        xrotation=45 if long.height > 12 or max(map(len, long[chart.x].to_list()), default=0) > 8 else 0,
    )


def _section(name: str, result: FrameResult, plots: list[Any]) -> str:
    parts = [f'<h2 id="{html.escape(name)}">{html.escape(result.title or name)}</h2>']
    parts += [f'<div class="note">{html.escape(n)}</div>' for n in result.notes]
    for chart in result.charts():
        df = result.frames()[chart.frame]
        if df.is_empty() or all(df[y].null_count() == df.height for y in chart.ys if y in df.columns):
            continue  # nothing to draw (holoviews fails on all-null series)
        plots.append(_chart(result, chart))
        parts.append(f"<!--PLOT{len(plots) - 1}-->")
    for fname, frame in result.frames().items():
        label = "table" if fname == "frame" else fname
        opened = " open" if fname == "frame" else ""
        parts.append(f"<details{opened}><summary>{html.escape(label)} ({frame.height} rows)</summary>{_table_html(frame)}</details>")
    return "\n".join(parts)


def _inline_resources(resources: str) -> str:
    """Bokeh's inline JS without external ``<script src=...>`` tags.

    holoviews imports panel, which registers an ES-module shim loaded from a relative ``static/``
    URL; the report's plots are plain bokeh models and do not need it, and offline it cannot load.
    """
    return re.sub(r"<script[^>]*\bsrc=[^>]*>\s*</script>", "", resources)


def render_html(
    store: Store,
    run: str | None,
    extra: list[tuple[str, FrameResult]] | None = None,
    params: dict[str, dict[str, str]] | None = None,
) -> str:
    """The report of one run as an HTML string.

    Args:
        store: An open store.
        run: Run name or id (default: latest).
        extra: More (name, result) sections appended at the end (e.g. a diff).
        params: Parameters per analysis as strings, e.g. ``{"mfu": {"peak_tflops": "989"}}``.

    Raises:
        StoreError: No such run.
        UsageError: A parameter names no report analysis or has a bad value.
    """
    params = params or {}
    unknown = set(params) - set(REPORT_ANALYSES)
    if unknown:
        raise UsageError(f"no report analysis {sorted(unknown)[0]!r}; choose from: {', '.join(REPORT_ANALYSES)}")
    import holoviews as hv
    from bokeh.embed import components
    from bokeh.resources import INLINE

    hv.extension("bokeh", logo=False)
    run_id = store.resolve_run(run)
    info = store.sql("SELECT * FROM runs WHERE run_id = ?", [run_id]).row(0, named=True)
    traces = store.sql(
        """SELECT rank, source, format, device_name, backend, host, events_kept, events_rejected, events_skipped,
                  regexp_extract(path, '[^/]+$') AS file
           FROM traces WHERE run_id = ? ORDER BY rank, source""",
        [run_id],
    )
    plots: list[Any] = []
    sections: list[str] = []
    toc: list[str] = []
    names = [n for n in REPORT_ANALYSES if n in registry.names()]
    results: list[tuple[str, FrameResult | TraceprofError]] = []
    for name in names:
        an = registry.get(name)
        try:
            results.append((name, an.run(store, registry.make_params(an, str(run_id), params.get(name, {})))))
        except UsageError:
            raise
        except TraceprofError as e:
            results.append((name, e))
    for name, res in results + list(extra or []):
        if isinstance(res, TraceprofError):
            msg = html.escape(str(res))
            sections.append(f'<h2 id="{name}">{html.escape(name)}</h2><div class="err">not available: {msg}</div>')
        else:
            sections.append(_section(name, res, plots))
        toc.append(name)
    script, divs = components([hv.render(p, backend="bokeh") for p in plots]) if plots else ("", [])
    body = "\n".join(sections)
    for i, div in enumerate(divs):
        body = body.replace(f"<!--PLOT{i}-->", div)
    title = f"traceprof report: {info['name']}"
    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    nav = " · ".join(f'<a href="#{html.escape(n)}">{html.escape(n)}</a>' for n in toc)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>{_CSS}</style>
{_inline_resources(INLINE.render())}
{script}
</head><body>
<h1>{html.escape(title)}</h1>
<p>Run <b>{html.escape(str(info['name']))}</b> (id {run_id}), world size {info['world_size']},
sources {html.escape(', '.join(info['sources'] or []))}, clocks aligned: {info['clock_aligned']}.
Generated {now} by traceprof. All times in the tables are ns unless a column says otherwise.</p>
<p>{nav}</p>
<h2 id="traces">Ranks and trace files</h2>
{_table_html(traces)}
{body}
</body></html>
"""


def write_report(
    store: Store,
    run: str | None,
    output: str | Path,
    baseline: str | None = None,
    params: dict[str, dict[str, str]] | None = None,
) -> Path:
    """Write the report of one run to ``output`` (HTML). Returns the path.

    With ``baseline`` (a run name or id) the report ends with a regression diff of the run
    against it (``traceprof.diff``). ``params``: see :func:`render_html`.

    Raises:
        StoreError: No such run.
        AnalysisError: Nothing to report.
        UsageError: ``output`` cannot be written.
    """
    extra: list[tuple[str, FrameResult]] = []
    if baseline is not None:
        from traceprof.diff import diff_runs

        extra.append(("diff", diff_runs(store, baseline, str(store.resolve_run(run)))))
    text = render_html(store, run, extra=extra, params=params)
    if not text:
        raise AnalysisError("empty report")
    return write_output(output, text.encode("utf-8"))
