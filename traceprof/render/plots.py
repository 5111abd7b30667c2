"""Bokeh figures for the report and their offline embedding; nothing here computes an analysis.

Conventions that keep plots honest:
  - ``_ns`` series are drawn in ms and the axis says ``ms``; legend entries are the column names
    without their unit suffix (``exposed_comm_ns`` -> ``exposed comm``), so axis and legend agree.
  - One palette (:data:`MEANING_COLORS`): a colour means one thing (idle grey, compute blue,
    communication light blue, exposed communication red, memory purple, host-bound orange,
    waiting gold) in every chart and on the timeline; series measuring no state take other colours.
  - Heatmap colour scales run over the data's range (smallest to largest value).
  - Per-step series are lines (:func:`series`), not bars.
  - Charts take the page's width (bokeh's ``sizing_mode="stretch_width"``).
  - Long category labels (kernel and op names) are shortened to their family
    (``traceprof.core.names.shorten``); the full name is on hover.
  - Canvas output only (no WebGL); bokeh's validation warnings are kept off the terminal.

Embedding (:func:`embed`): bokeh's core JavaScript (``bokeh.min.js``, 1.3 MB) and the figures'
JSON are stored gzip-compressed and base64-encoded in the page and unpacked by the browser
(``DecompressionStream``, in every current browser), which keeps a report well under 1 MB and
needs no network. The figures' JSON is data inside a base64 string, so no trace text can reach
the page's HTML from there.
"""

# bokeh's type hints lag its runtime API (ranges from lists, ColorBar/Legend exports, image's
# color_mapper): the checks below would flag documented bokeh usage, so they are off in this module.
# mypy: disable-error-code="attr-defined,arg-type,call-arg,union-attr,operator"
from __future__ import annotations

import base64
import contextlib
import gzip
import json
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import polars as pl

from traceprof.core.names import distinct_short, shorten

__all__ = [
    "bars",
    "heatmap",
    "lines",
    "series",
    "spans",
    "timeline",
    "embed",
    "downsample",
    "PALETTE",
    "MEANING_COLORS",
    "STATE_COLORS",
    "color_of",
    "meaning",
    "MAX_COLUMNS",
    "MAX_LINES",
]

#: The one palette of the report: each colour has one meaning in every chart and on the timeline.
#: Idle is grey everywhere; a series is coloured by what it measures (:func:`color_of`).
MEANING_COLORS = {
    "idle": "#c9c9c9",
    "compute": "#4c78a8",
    "communication": "#9ecae9",
    "exposed communication": "#e45756",
    "memory": "#b279a2",
    "host-bound": "#f58518",
    "waiting": "#eeca3b",
    "other": "#9d755d",
}
#: Colours of series that measure no state (percentiles, actual vs simulated, ranks): none of
#: :data:`MEANING_COLORS`, so that no colour means two things.
PALETTE = ("#54a24b", "#17becf", "#ff9da6", "#393b79", "#637939", "#7b4173", "#8c6d31", "#6b6ecf")
#: Colours of the timeline states (``traceprof.engine.timeline.STATES``): idle, compute, hidden and exposed communication.
STATE_COLORS = (
    MEANING_COLORS["idle"],
    MEANING_COLORS["compute"],
    MEANING_COLORS["communication"],
    MEANING_COLORS["exposed communication"],
)
#: What a series measures, by the words of its name, first match wins (``host_wait`` is host-bound
#: before ``wait`` is waiting; ``exposed_comm`` exposed before ``comm``).
_MEANINGS = (
    ("idle", "idle"),
    ("bubble", "idle"),
    ("host", "host-bound"),
    ("launch", "host-bound"),
    ("kernel_wait", "other"),
    ("wait", "waiting"),
    ("imbalance", "waiting"),
    ("exposed", "exposed communication"),
    ("comm_only", "exposed communication"),
    ("non_compute", "other"),
    ("hidden", "communication"),
    ("overlap", "communication"),
    ("comm", "communication"),
    ("transfer", "communication"),
    ("p2p", "communication"),
    ("compute", "compute"),
    ("memory", "memory"),
    ("memcpy", "memory"),
    ("other", "other"),
    ("unsplit", "other"),
)
#: Heat maps: a sequential scale from the data's smallest value (light) to its largest (dark).
_REDS = ["#fff5f0", "#fee0d2", "#fcbba1", "#fc9272", "#fb6a4a", "#ef3b2c", "#cb181d", "#a50f15", "#67000d"]


def meaning(name: str) -> str | None:
    """What a series or state named ``name`` measures (a key of :data:`MEANING_COLORS`), or None."""
    n = name.lower().replace(" ", "_").replace("-", "_")
    return next((m for word, m in _MEANINGS if word in n), None)


def color_of(name: str, i: int) -> str:
    """The colour of series ``name``, the ``i``-th of its chart: its meaning's, else the ``i``-th
    of :data:`PALETTE`."""
    m = meaning(name)
    return MEANING_COLORS[m] if m is not None else PALETTE[i % len(PALETTE)]


_WIDTH = 900
#: A chart draws at most this many x categories (bars, heatmap columns): longer series (a per-step
#: series of 100,000 steps) are averaged over runs of consecutive x values (:func:`downsample`), so
#: that the figure stays responsive and the report's size bounded whatever the run's length.
MAX_COLUMNS = 400
#: A lines chart draws at most this many groups (e.g. ranks): those with the largest values.
MAX_LINES = 16


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Keep bokeh's log messages (validation warnings) off the terminal."""
    log = logging.getLogger("bokeh")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def label(col: str) -> str:
    """Legend text of a column: its name without the unit suffix, underscores as spaces."""
    for suffix in ("_ns", "_pct", "_ms"):
        if col.endswith(suffix):
            col = col[: -len(suffix)]
    return col.replace("_", " ")


def _categories(values: Sequence[object]) -> tuple[list[str], list[str]]:
    """Category labels (shortened, unique) and the full text of each."""
    full = ["" if v is None else str(v) for v in values]
    forms = distinct_short(full, 32)  # names of one family keep the words that tell them apart
    short, seen = [], set()
    for f in full:
        s = forms.get(f, f)
        while s in seen:  # the same name twice: keep the bars apart
            s += "\u200b"
        seen.add(s)
        short.append(s)
    return short, full


def downsample(
    df: pl.DataFrame, x: str, values: Sequence[str], by: Sequence[str] = (), max_columns: int = MAX_COLUMNS
) -> tuple[pl.DataFrame, str]:
    """At most ``max_columns`` distinct ``x`` values: consecutive runs of them averaged.

    Args:
        df: The chart's frame; ``x`` numeric or sortable (e.g. step), ``values`` numeric columns.
        x: The category column to thin.
        values: Columns averaged within each run (nulls ignored).
        by: Other category columns kept apart (e.g. ``rank`` of a step x rank heatmap).
        max_columns: Most distinct ``x`` values kept.

    Returns:
        (frame, note): ``df`` itself and "" when it has at most ``max_columns`` distinct ``x``;
        else one row per run (and ``by`` values) labelled with the run's first ``x``, each value
        column the mean over the run, sorted by ``x``, and a note saying how many values each
        column averages. Work O(n log n) in the rows.
    """
    n = df[x].n_unique() if x in df.columns else 0
    if n <= max_columns:
        return df, ""
    per = -(-n // max_columns)  # x values per column, rounded up
    cols = [c for c in values if c in df.columns]
    binned = df.with_columns(((pl.col(x).rank("dense") - 1) // per).alias("_bin"))
    out = (
        binned.group_by("_bin", *by).agg(pl.col(x).min(), *(pl.col(c).mean() for c in cols)).sort("_bin", *by)
    )
    out = out.with_columns(pl.col(x).min().over("_bin")).drop("_bin").select(x, *by, *cols)
    return out, (
        f"{n:,} {x} values drawn as {out[x].n_unique():,} columns, each the mean of {per:,} consecutive "
        f"{x}s labelled by the first (the table has every {x})"
    )


def _y_axis(df: pl.DataFrame, ys: Sequence[str], ylabel: str) -> tuple[list[str], float, str]:
    """The ``ys`` columns ``df`` has, the factor their values are drawn by and the axis' unit:
    ``_ns`` columns in ms, ``_pct`` in %, others as they are, labelled ``ylabel``."""
    ys = [y for y in ys if y in df.columns]
    in_ms = all(y.endswith("_ns") for y in ys)
    unit = "ms" if in_ms else (ylabel or ("%" if all(y.endswith("_pct") for y in ys) else "value"))
    return ys, 1e-6 if in_ms else 1.0, unit


def bars(
    df: pl.DataFrame,
    x: str,
    ys: Sequence[str],
    title: str,
    ylabel: str = "",
    stacked: bool = False,
    height: int = 320,
) -> Any:
    """A bar chart: one bar per ``x`` value, one series per ``ys`` column (stacked or side by side),
    ``height`` px tall.

    ``_ns`` columns are drawn in ms (axis ``ms``); other columns as they are, the axis labelled
    ``ylabel``.
    """
    from bokeh.models import ColumnDataSource, FactorRange, HoverTool
    from bokeh.plotting import figure

    ys, scale, unit = _y_axis(df, ys, ylabel)
    xs, full = _categories(df[x].to_list())
    data: dict[str, list[Any]] = {"x": xs, "full": full}
    for y in ys:
        data[y] = [None if v is None else float(v) * scale for v in df[y].to_list()]
    rotate = len(xs) > 12 or max(map(len, xs), default=0) > 8
    nested = not stacked and len(ys) > 1
    factors = [(xv, label(y)) for xv in xs for y in ys] if nested else xs
    fig = figure(
        title=title,
        width=_WIDTH,
        sizing_mode="stretch_width",
        height=height,
        toolbar_location="right",
        tools="save,reset",
        output_backend="canvas",
        y_axis_label=unit,
        x_axis_label=x,
        x_range=FactorRange(*factors),
    )
    if not nested:
        src = ColumnDataSource(data)
        if stacked:
            rs = fig.vbar_stack(
                ys,
                x="x",
                width=0.8,
                source=src,
                color=[color_of(y, j) for j, y in enumerate(ys)],
                legend_label=[label(y) for y in ys],
            )
        else:
            rs = [
                fig.vbar(
                    x="x",
                    top=ys[0],
                    width=0.8,
                    source=src,
                    color=color_of(ys[0], 0),
                    legend_label=label(ys[0]),
                )
            ]
        for r, y in zip(rs, ys, strict=True):
            fig.add_tools(
                HoverTool(renderers=[r], tooltips=[(x, "@full"), (label(y), f"@{{{y}}}{{0,0.[000]}} {unit}")])
            )
    else:  # side by side: nested factors (x, series)
        src = ColumnDataSource(
            {
                "f": factors,
                "full": [fv for fv in full for _ in ys],
                "series": [label(y) for _ in xs for y in ys],
                "v": [data[y][i] for i in range(len(xs)) for y in ys],
                "c": [color_of(y, j) for _ in xs for j, y in enumerate(ys)],
            }
        )
        r = fig.vbar(x="f", top="v", width=0.8, source=src, color="c", legend_field="series")
        fig.add_tools(
            HoverTool(
                renderers=[r], tooltips=[(x, "@full"), ("", "@series"), ("value", f"@v{{0,0.[000]}} {unit}")]
            )
        )
    if all((v or 0) >= 0 for y in ys for v in data[y]):  # bars of non-negative values start at zero
        fig.y_range.start = 0
    fig.xaxis.major_label_orientation = 0.8 if rotate else 0
    fig.xgrid.grid_line_color = None
    fig.legend.location = "top_left"
    fig.add_layout(fig.legend[0], "right")
    return fig


def series(
    df: pl.DataFrame, x: str, ys: Sequence[str], title: str, ylabel: str = "", height: int = 320
) -> Any:
    """A per-step series as lines with a marker per point: ``x`` numeric (a step), one line per
    ``ys`` column in its colour (:func:`color_of`). ``_ns`` columns are drawn in ms (axis ``ms``),
    others as they are (axis ``ylabel``); hover gives the step and the value."""
    from bokeh.models import ColumnDataSource, HoverTool, Legend, LegendItem
    from bokeh.plotting import figure

    ys, scale, unit = _y_axis(df, ys, ylabel)
    d = df.sort(x)
    fig = figure(
        title=title,
        width=_WIDTH,
        sizing_mode="stretch_width",
        height=height,
        tools="xpan,xwheel_zoom,reset,save",
        output_backend="canvas",
        x_axis_label=x,
        y_axis_label=unit,
    )
    items = []
    for j, y in enumerate(ys):
        part = d.filter(pl.col(y).is_not_null())
        src = ColumnDataSource({"x": part[x].to_list(), "v": [float(v) * scale for v in part[y].to_list()]})
        color = color_of(y, j)
        r = fig.line("x", "v", source=src, color=color, line_width=2)
        fig.scatter("x", "v", source=src, color=color, size=5)
        fig.add_tools(HoverTool(renderers=[r], tooltips=[(x, "@x"), (label(y), f"@v{{0,0.[000]}} {unit}")]))
        items.append(LegendItem(label=label(y), renderers=[r]))
    if all(v >= 0 for y in ys for v in d[y].drop_nulls().to_list()):
        fig.y_range.start = 0
    fig.add_layout(Legend(items=items), "right")
    return fig


def heatmap(df: pl.DataFrame, x: str, y: str, value: str, title: str) -> Any:
    """A heatmap of ``value`` over ``x`` × ``y`` (categories); the colour scale runs over the data's
    range, from its smallest value (light) to its largest (dark), so that differences show even
    when every value is far from zero (an MFU of 41-44% was one flat block on a 0-based scale)."""
    from bokeh.models import ColorBar, ColumnDataSource, HoverTool, LinearColorMapper
    from bokeh.plotting import figure

    xs = [str(v) for v in df[x].to_list()]
    ys = [str(v) for v in df[y].to_list()]
    vals = [None if v is None else float(v) for v in df[value].to_list()]
    present = [v for v in vals if v is not None]
    low, top = (min(present), max(present)) if present else (0.0, 1.0)
    if top <= low:  # one value: a scale around it
        low, top = low - 0.5, top + 0.5
    mapper = LinearColorMapper(palette=_REDS, low=low, high=top, nan_color="#f0f0f0")
    xr = sorted(set(xs), key=_natural)
    yr = sorted(set(ys), key=_natural)
    fig = figure(
        title=title,
        x_range=xr,
        y_range=yr,
        width=_WIDTH,
        sizing_mode="stretch_width",
        height=min(120 + 28 * len(yr), 520),
        tools="save,reset",
        output_backend="canvas",
        x_axis_label=x,
        y_axis_label=y,
    )
    src = ColumnDataSource({"x": xs, "y": ys, "v": vals})
    r = fig.rect("x", "y", 1, 1, source=src, fill_color={"field": "v", "transform": mapper}, line_color=None)
    fig.add_tools(HoverTool(renderers=[r], tooltips=[(x, "@x"), (y, "@y"), (label(value), "@v{0,0.[00]}")]))
    fig.add_layout(ColorBar(color_mapper=mapper, title=label(value) + _unit(value)), "right")
    fig.grid.grid_line_color = None
    return fig


def lines(df: pl.DataFrame, x: str, ys: Sequence[str], group: str, mark: str, title: str) -> Any:
    """Lines over time: ``x`` epoch ns drawn as ms from the earliest, one line per ``group`` value and
    ``ys`` column (the first solid, the others dashed), in the group's colour; the rows where the
    boolean column ``mark`` is true drawn as markers (e.g. each series' peak). ``_bytes`` columns
    are drawn in GiB, ``_ns`` in ms; hover gives the group, the column and the value."""
    from bokeh.models import ColumnDataSource, HoverTool, Legend, LegendItem
    from bokeh.plotting import figure

    ys = [y for y in ys if y in df.columns]
    scale, unit = (
        (1 / 2**30, "GiB")
        if all(y.endswith("_bytes") for y in ys)
        else (1e-6, "ms")
        if all(y.endswith("_ns") for y in ys)
        else (1.0, "value")
    )
    t0 = df[x].min() or 0
    fig = figure(
        title=title,
        width=_WIDTH,
        sizing_mode="stretch_width",
        height=360,
        tools="xpan,xwheel_zoom,reset,save",
        output_backend="canvas",
        x_axis_label="ms from the first record",
        y_axis_label=unit,
    )
    items, dashes = [], ("solid", "dashed", "dotted", "dotdash")
    groups = df[group].unique(maintain_order=True).to_list() if group else [None]
    if len(groups) > MAX_LINES:  # many ranks: the largest series, so that the figure stays readable and small
        top = (
            df.group_by(group)
            .agg(pl.col(ys[0]).max())
            .sort(ys[0], group, descending=[True, False], nulls_last=True)
        )
        keep = set(top[group].head(MAX_LINES).to_list())
        fig.title.text += f" (the {MAX_LINES} largest of {len(groups)}; the table has all)"
        groups = [g for g in groups if g in keep]
    for i, g in enumerate(groups):
        part = df.filter(pl.col(group) == g) if group else df
        color = PALETTE[i % len(PALETTE)]
        for j, y in enumerate(ys):
            d = part.filter(pl.col(y).is_not_null())
            if d.is_empty():
                continue
            src = ColumnDataSource(
                {
                    "t": [(v - t0) / 1e6 for v in d[x].to_list()],
                    "v": [float(v) * scale for v in d[y].to_list()],
                    "g": [str(g)] * d.height,
                }
            )
            r = fig.line("t", "v", source=src, color=color, line_dash=dashes[j % len(dashes)], line_width=1.5)
            fig.add_tools(
                HoverTool(
                    renderers=[r],
                    tooltips=[("", "@g"), (label(y), f"@v{{0,0.000}} {unit}"), ("at", "@t{0,0.000} ms")],
                )
            )
            items.append(LegendItem(label=f"{g} {label(y)}" if group else label(y), renderers=[r]))
            if mark and mark in d.columns:
                m = d.filter(pl.col(mark))
                fig.scatter(
                    [(v - t0) / 1e6 for v in m[x].to_list()],
                    [float(v) * scale for v in m[y].to_list()],
                    color=color,
                    size=9,
                    marker="circle",
                )
    if items:
        fig.add_layout(Legend(items=items[:20]), "right")
    return fig


def spans(df: pl.DataFrame, lane: str, start: str, end: str, state: str, title: str) -> Any:
    """Intervals on lanes (a Gantt chart): one bar per row from ``start`` to ``end`` (ms) on lane
    ``lane`` (a category, in first-seen order, top to bottom), coloured by ``state``."""
    from bokeh.models import ColumnDataSource, FactorRange, HoverTool, Legend, LegendItem
    from bokeh.plotting import figure

    lanes = list(dict.fromkeys(str(v) for v in df[lane].to_list()))
    states = list(dict.fromkeys(str(v) for v in df[state].to_list()))
    fig = figure(
        title=title,
        width=_WIDTH,
        sizing_mode="stretch_width",
        height=min(140 + 30 * len(lanes), 700),
        tools="xpan,xwheel_zoom,reset,save",
        output_backend="canvas",
        x_axis_label="ms from the step's start",
        y_range=FactorRange(*reversed(lanes)),
    )
    items = []
    for k, st in enumerate(states):
        d = df.filter(pl.col(state).cast(pl.Utf8) == st)
        src = ColumnDataSource(
            {
                "y": [str(v) for v in d[lane].to_list()],
                "l": d[start].to_list(),
                "r": d[end].to_list(),
                "dur": (d[end] - d[start]).to_list(),
            }
        )
        r = fig.hbar(y="y", left="l", right="r", height=0.7, source=src, color=color_of(st, k))
        fig.add_tools(
            HoverTool(
                renderers=[r],
                tooltips=[(lane, "@y"), ("", st), ("from", "@l{0,0.000} ms"), ("for", "@dur{0,0.000} ms")],
            )
        )
        items.append(LegendItem(label=st, renderers=[r]))
    fig.ygrid.grid_line_color = None
    fig.add_layout(Legend(items=items, orientation="horizontal"), "below")
    return fig


def _unit(col: str) -> str:
    return " (ms)" if col.endswith("_ms") else " (%)" if col.endswith("_pct") else ""


def _natural(s: str) -> tuple[int, float, str]:
    try:
        return (0, float(s), "")
    except ValueError:
        return (1, 0.0, s)


def timeline(tl: Any) -> Any:
    """The per-rank lanes of a :class:`traceprof.engine.timeline.Timeline`: one quad per merged interval
    (few ranks), or one image of binned states (many ranks)."""
    from bokeh.models import ColumnDataSource, HoverTool, Legend, LegendItem
    from bokeh.plotting import figure

    from traceprof.engine.timeline import STATES

    n = len(tl.ranks)
    height = min(140 + 26 * n, 700)
    fig = figure(
        title=f"Timeline of {tl.note}: compute, communication (exposed in red), idle (grey)",
        width=_WIDTH,
        sizing_mode="stretch_width",
        height=height,
        tools="xpan,xwheel_zoom,reset,save",
        output_backend="canvas",
        x_axis_label=tl.axis,
        y_axis_label="rank",
        x_range=(0, tl.span_ms),
    )
    items = []
    if tl.intervals is not None:
        index = {r: i for i, r in enumerate(tl.ranks)}
        fig.quad(
            left=0,
            right=tl.span_ms,
            bottom=[i - 0.4 for i in range(n)],
            top=[i + 0.4 for i in range(n)],
            color=STATE_COLORS[0],
        )
        for code, state in enumerate(STATES[1:], start=1):
            d = tl.intervals.filter(pl.col("state") == state)
            lane = [index[r] for r in d["rank"].to_list()]
            src = ColumnDataSource(
                {
                    "l": d["start_ms"].to_list(),
                    "r": d["end_ms"].to_list(),
                    "b": [i - 0.4 for i in lane],
                    "t": [i + 0.4 for i in lane],
                    "rank": d["rank"].to_list(),
                    "dur": (d["end_ms"] - d["start_ms"]).to_list(),
                }
            )
            if d.is_empty():
                continue
            r = fig.quad(
                left="l",
                right="r",
                bottom="b",
                top="t",
                source=src,
                color=STATE_COLORS[code],
                line_color=None,
            )
            fig.add_tools(
                HoverTool(
                    renderers=[r],
                    tooltips=[
                        ("rank", "@rank"),
                        ("", state),
                        ("from", "@l{0,0.000} ms"),
                        ("for", "@dur{0,0.000} ms"),
                    ],
                )
            )
            items.append(LegendItem(label=state, renderers=[r]))
        fig.yaxis.ticker = list(range(n))
        fig.yaxis.major_label_overrides = {i: str(r) for i, r in enumerate(tl.ranks)}
    else:
        from bokeh.models import LinearColorMapper

        mapper = LinearColorMapper(palette=list(STATE_COLORS), low=-0.5, high=3.5)
        fig.image(image=[tl.grid], x=0, y=-0.5, dw=tl.span_ms, dh=n, color_mapper=mapper)
        for code, state in enumerate(STATES):
            items.append(
                LegendItem(
                    label=state,
                    renderers=[fig.scatter([], [], color=STATE_COLORS[code], size=8, marker="square")],
                )
            )
        fig.title.text += (
            f"; {n} ranks in {tl.grid.shape[1]} bins of {tl.bin_ms:,.2f} ms, each its main state"
        )
    if tl.path is not None and not tl.path.is_empty():
        items.append(LegendItem(label="critical path", renderers=[_path_glyphs(fig, tl)]))
        fig.title.text += "; critical path in black"
    fig.y_range.flipped = True
    fig.ygrid.grid_line_color = None
    fig.add_layout(Legend(items=items, orientation="horizontal"), "below")
    return fig


def _path_glyphs(fig: Any, tl: Any) -> Any:
    """The critical path (``tl.path``) over the lanes: a black line along each piece on its rank's
    lane and a vertical one where it crosses to another rank (a rank waited for that one)."""
    from bokeh.models import ColumnDataSource, HoverTool

    index = {r: i for i, r in enumerate(tl.ranks)}
    p = tl.path.with_columns(pl.col("rank").replace_strict(index, return_dtype=pl.Int64).alias("lane"))
    src = ColumnDataSource(
        {
            "l": p["start_ms"].to_list(),
            "r": p["end_ms"].to_list(),
            "y": p["lane"].to_list(),
            "rank": p["rank"].to_list(),
            "kind": p["kind"].to_list(),
            "name": [shorten(n, 60) for n in p["name"].to_list()],
            "dur": (p["end_ms"] - p["start_ms"]).to_list(),
        }
    )
    r = fig.segment(x0="l", x1="r", y0="y", y1="y", source=src, color="black", line_width=3)
    fig.add_tools(
        HoverTool(
            renderers=[r],
            tooltips=[
                ("critical path, rank", "@rank"),
                ("", "@kind @name"),
                ("from", "@l{0,0.000} ms"),
                ("for", "@dur{0,0.000} ms"),
            ],
        )
    )
    turn = p.filter(pl.col("lane") != pl.col("lane").shift(1))
    prev = p["lane"].shift(1).filter(p["lane"] != p["lane"].shift(1))
    if turn.height:
        fig.segment(
            x0=turn["start_ms"].to_list(),
            x1=turn["start_ms"].to_list(),
            y0=prev.to_list(),
            y1=turn["lane"].to_list(),
            color="black",
            line_width=2,
            line_dash="dotted",
        )
    return r


def _bokeh_js() -> bytes:
    import bokeh

    return (Path(bokeh.__file__).parent / "server" / "static" / "js" / "bokeh.min.js").read_bytes()


def _packed(data: bytes) -> str:
    return base64.b64encode(gzip.compress(data, 9, mtime=0)).decode("ascii")


_LOADER = """<script>
(async function () {
  const unpack = async (id) => {
    const bytes = Uint8Array.from(atob(document.getElementById(id).textContent.trim()), c => c.charCodeAt(0));
    const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
    return await new Response(stream).text();
  };
  try {
    const lib = document.createElement("script");
    lib.textContent = await unpack("tp-bokeh");
    document.head.appendChild(lib);
    for (const [id, item] of JSON.parse(await unpack("tp-plots"))) await Bokeh.embed.embed_item(item, id);
  } catch (e) {
    for (const d of document.querySelectorAll(".plot")) d.textContent = "plots need a current browser: " + e;
  }
})();
</script>"""


def embed(figs: Sequence[Any]) -> tuple[str, list[str]]:
    """The page parts for ``figs``: (HTML to put at the end of the body, one ``<div>`` per figure).

    Without figures both are empty (no JavaScript at all).
    """
    if not figs:
        return "", []
    from bokeh.embed import json_item

    with quiet():
        items = [(f"tp-plot-{i}", json_item(f)) for i, f in enumerate(figs)]
    divs = [f'<div class="plot" id="{pid}"></div>' for pid, _ in items]
    data = json.dumps(items, separators=(",", ":")).encode()
    tail = (
        f'<script id="tp-bokeh" type="application/octet-stream">{_packed(_bokeh_js())}</script>\n'
        f'<script id="tp-plots" type="application/octet-stream">{_packed(data)}</script>\n{_LOADER}'
    )
    return tail, divs
