"""The report's plots as holoviews elements, and their offline embedding; nothing here computes an analysis.

Each plot function returns a holoviews element (``hv.Bars``, ``hv.HeatMap``, an ``hv.Overlay`` of
``hv.Curve``/``hv.Rectangles``/``hv.Segments``): a notebook composes, restyles or shows it as it is
(``traceprof.plots``); the report renders it to bokeh (:func:`render`: ``hv.render(..., backend="bokeh")``)
and embeds the figures with bokeh's JavaScript inlined once (:func:`embed`). holoviews is imported
when a plot is made, never by the CLI's other commands.

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
from traceprof.core.term import escape

__all__ = [
    "bars",
    "chart",
    "heatmap",
    "lines",
    "series",
    "spans",
    "timeline",
    "embed",
    "render",
    "holoviews",
    "downsample",
    "PALETTE",
    "MEANING_COLORS",
    "STATE_COLORS",
    "color_of",
    "meaning",
    "MAX_COLUMNS",
    "MAX_LINES",
    "MAX_POINTS",
    "buckets",
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
#: A chart draws at most this many x categories (bars, heatmap columns): longer series are averaged
#: over runs of consecutive x values (:func:`downsample`), or, over steps (a step x rank heatmap of
#: 100,000 steps), cut into buckets each shown by its most outlying step (:func:`buckets`), so that
#: the figure stays responsive and the report's size bounded whatever the run's length.
MAX_COLUMNS = 400
#: A per-step series (:func:`series`) draws at most this many points per line: longer runs are cut
#: into buckets of consecutive steps, each drawn as its median with the band from its smallest to
#: its largest step (:func:`buckets`), so that a slow step of 100,000 stays in sight.
MAX_POINTS = 500
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


@contextlib.contextmanager
def _unvalidated() -> Iterator[None]:
    """Within the block, bokeh's ``json_item`` does not validate each figure's document: the
    checks only log warnings (:func:`quiet` keeps them off the terminal) and change nothing in the
    output, and they were about a tenth of the report's figure CPU. The setting is restored after."""
    from bokeh.settings import settings

    setting = settings.perform_document_validation
    had = setting._user_value  # what a caller set (bokeh's _Unset class when nothing)
    setting.set_value(False)
    try:
        yield
    finally:
        if isinstance(had, type):
            setting.unset_value()
        else:
            setting.set_value(had)


def label(col: str) -> str:
    """Legend text of a column: its name without the unit suffix, underscores as spaces."""
    for suffix in ("_ns", "_pct", "_ms"):
        if col.endswith(suffix):
            col = col[: -len(suffix)]
    return col.replace("_", " ")


def _shown(v: object) -> str:
    """A value from a trace as chart text (a tick label, a legend entry, a hover field): escaped
    as in the tables (:func:`traceprof.core.term.escape`: ESC as ``\x1b``, a bidi override as
    ``\u202e``), so that a kernel name cannot reverse or hide the chart's text."""
    return "" if v is None else escape(str(v))


def _categories(values: Sequence[object]) -> tuple[list[str], list[str]]:
    """Category labels (shortened, unique) and the full text of each, escaped (:func:`_shown`)."""
    full = [_shown(v) for v in values]
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
    if x not in df.columns or df[x].n_unique() <= max_columns:
        return df, ""
    binned, n, per = _bins(df, x, max_columns)
    cols = [c for c in values if c in df.columns]
    out = (
        binned.group_by("_bin", *by).agg(pl.col(x).min(), *(pl.col(c).mean() for c in cols)).sort("_bin", *by)
    )
    out = out.with_columns(pl.col(x).min().over("_bin")).drop("_bin").select(x, *by, *cols)
    return out, (
        f"{n:,} {x} values drawn as {out[x].n_unique():,} columns, each the mean of {per:,} consecutive "
        f"{x}s labelled by the first (the table has every {x})"
    )


def _bins(df: pl.DataFrame, x: str, most: int) -> tuple[pl.DataFrame, int, int]:
    """``df`` with ``_bin``: the index of the bucket of ``ceil(n / most)`` consecutive distinct
    ``x`` values that each row falls in; and n and the values per bucket."""
    n = df[x].n_unique()
    per = -(-n // most)
    return df.with_columns(((pl.col(x).rank("dense") - 1) // per).alias("_bin")), n, per


def buckets(
    df: pl.DataFrame, x: str, values: Sequence[str], by: Sequence[str] = (), max_points: int = MAX_POINTS
) -> tuple[pl.DataFrame, str]:
    """At most ``max_points`` distinct ``x`` values (steps), each bucket of consecutive ones drawn
    by its median and its extremes, so that no outlier is hidden.

    Args:
        df: The chart's frame; ``x`` numeric (a step), ``values`` numeric columns.
        x: The column cut into buckets of ``ceil(n / max_points)`` consecutive distinct values.
        values: Columns summarized within each bucket (nulls ignored).
        by: Other category columns kept apart (e.g. ``rank`` of a step x rank heatmap).
        max_points: Most buckets.

    Returns:
        (frame, note): ``df`` itself and "" when it has at most ``max_points`` distinct ``x``; else
        one row per bucket (and ``by`` values), sorted: ``x`` the bucket's first value, ``{x}_last``
        its last, ``{x}s`` how many it holds, and for each value column ``c``: ``c`` its median,
        ``c_min`` and ``c_max`` its smallest and largest (exact values of one step each), and
        ``c_far`` the value furthest from ``c``'s median over the whole frame (the most outlying
        step, either way; a heatmap's colour); and a note saying how many ``x`` values a point
        stands for.
        Work O(n log n) in the rows.
    """
    if x not in df.columns or df[x].n_unique() <= max_points:
        return df, ""
    binned, n, per = _bins(df.sort(x, maintain_order=True), x, max_points)
    cols = [c for c in values if c in df.columns]
    far = []
    for c in cols:
        med = df[c].median()
        off = (pl.col(c).cast(pl.Float64) - (med if med is not None else 0.0)).abs()
        far.append(pl.col(c).get(off.arg_max()).alias(f"{c}_far"))  # the first of equals
    out = (
        binned.group_by("_bin", *by)
        .agg(
            pl.col(x).min(),
            pl.col(x).max().alias(f"{x}_last"),
            pl.col(x).n_unique().alias(f"{x}s"),
            *(pl.col(c).median() for c in cols),
            *(pl.col(c).min().alias(f"{c}_min") for c in cols),
            *(pl.col(c).max().alias(f"{c}_max") for c in cols),
            *far,
        )
        .sort("_bin", *by)
    )
    out = out.with_columns(pl.col(x).min().over("_bin"), pl.col(f"{x}_last").max().over("_bin")).drop("_bin")
    return (
        out,
        f"{n:,} {x}s drawn as {out[x].n_unique():,} points of {per:,} consecutive {x}s"
        + (" (the last fewer)" if n % per else ""),
    )


def _y_axis(df: pl.DataFrame, ys: Sequence[str], ylabel: str) -> tuple[list[str], float, str]:
    """The ``ys`` columns ``df`` has, the factor their values are drawn by and the axis' unit:
    ``_ns`` columns in ms, ``_pct`` in %, others as they are, labelled ``ylabel``."""
    ys = [y for y in ys if y in df.columns]
    in_ms = all(y.endswith("_ns") for y in ys)
    unit = "ms" if in_ms else (ylabel or ("%" if all(y.endswith("_pct") for y in ys) else "value"))
    return ys, 1e-6 if in_ms else 1.0, unit


class _Columns:
    """What ``categorical_aggregate2d._get_coords`` reads of a pandas-backed holoviews Dataset
    (:func:`_fast_heatmaps`): its dimensions, its values, and its groupby by one column as plain
    pandas groups (first appearance first, as holoviews groups), without a holoviews Dataset per
    group."""

    def __init__(self, ds: Any) -> None:
        self.ds = ds

    def dimensions(self, *args: Any, **kwargs: Any) -> Any:
        return self.ds.dimensions(*args, **kwargs)

    def dimension_values(self, dim: Any, expanded: bool = True) -> Any:
        return self.ds.dimension_values(dim, expanded)

    def groupby(self, dim: Any, **_: Any) -> dict[Any, _Group]:
        name = self.ds.get_dimension(dim, strict=True).name
        return {k: _Group(g) for k, g in self.ds.data.groupby(name, sort=False, observed=False)}


class _Group:
    """One group of :meth:`_Columns.groupby`: a column's distinct values in order of appearance
    (``pd.unique``, as holoviews' pandas interface gives them)."""

    def __init__(self, df: Any) -> None:
        self.df = df

    def dimension_values(self, dim: Any, expanded: bool = True) -> Any:
        import pandas as pd

        col = self.df[getattr(dim, "name", dim)]
        return pd.unique(col) if not expanded else col.to_numpy()


@contextlib.contextmanager
def _fast_heatmaps() -> Iterator[None]:
    """Within the block, holoviews orders a heatmap's categories (``categorical_aggregate2d
    ._get_coords``: the y values' order, from each x column's) by its own code over plain pandas
    groups (:class:`_Columns`) instead of one holoviews Dataset per x value: the same coordinates,
    so the same figure in about a third of the CPU (a 334-step x 8-rank heatmap rendered and
    serialized: 0.90-1.06 -> 0.31-0.36 s under load; the 8 ranks x 1 M events report draws two or
    three). A Dataset not held as a pandas frame takes holoviews' own path. The method is restored
    after."""
    import pandas as pd
    from holoviews.element.util import categorical_aggregate2d as agg

    own = agg.__dict__["_get_coords"]

    def coords(cls: Any, obj: Any) -> Any:
        if isinstance(getattr(obj, "data", None), pd.DataFrame) and len(obj.kdims) == 2:
            return own.__func__(cls, _Columns(obj))
        return own.__func__(cls, obj)

    agg._get_coords = classmethod(coords)
    try:
        yield
    finally:
        agg._get_coords = own


def holoviews() -> Any:
    """holoviews with its bokeh backend loaded (imported here, when a plot is made: about a second
    that the CLI's other commands never pay)."""
    import holoviews as hv
    import holoviews.plotting.bokeh  # noqa: F401  (registers the bokeh backend for hv.render)

    return hv


def render(element: Any) -> Any:
    """The bokeh figure of a holoviews ``element`` (``hv.render(element, backend="bokeh")``),
    drawn on a canvas (no WebGL), bokeh's validation warnings kept off the terminal."""
    hv = holoviews()
    with quiet(), _fast_heatmaps():
        fig = hv.render(element, backend="bokeh")
    fig.output_backend = "canvas"
    return fig


def _opts(title: str, height: int, **more: Any) -> dict[str, Any]:
    """Options every chart shares: its title, the page's width (``responsive``: bokeh's
    ``sizing_mode="stretch_width"``) and ``height`` px."""
    return {"title": title, "responsive": True, "height": height, "toolbar": "right", **more}


def bars(
    df: pl.DataFrame,
    x: str,
    ys: Sequence[str],
    title: str,
    ylabel: str = "",
    stacked: bool = False,
    height: int = 320,
) -> Any:
    """A bar chart (``hv.Bars``): one bar per ``x`` value, one series per ``ys`` column (stacked or
    side by side), each in its colour (:func:`color_of`), ``height`` px tall.

    ``_ns`` columns are drawn in ms (axis ``ms``); other columns as they are, the axis labelled
    ``ylabel``. Long ``x`` labels are shortened (:func:`_categories`); hover gives the full one.
    """
    hv = holoviews()
    ys, scale, unit = _y_axis(df, ys, ylabel)
    xs, full = _categories(df[x].to_list())
    data: dict[str, list[Any]] = {"x": [], "series": [], "value": [], "full": []}
    for y in ys:
        for xv, fv, v in zip(xs, full, df[y].to_list(), strict=True):
            data["x"].append(xv)
            data["series"].append(label(y))
            data["value"].append(float("nan") if v is None else float(v) * scale)
            data["full"].append(fv)
    colors = {label(y): color_of(y, j) for j, y in enumerate(ys)}
    kx, value = hv.Dimension("x", label=x), hv.Dimension("value", label=unit)
    rotate = len(xs) > 12 or max(map(len, xs), default=0) > 8
    nonneg = all(not (v < 0) for v in data["value"])  # NaN is not negative
    opts = _opts(title, height, xrotation=45 if rotate else 0, tools=["hover"], show_grid=False)
    if nonneg:
        opts["ylim"] = (0, None)
    if len(ys) == 1:
        el = hv.Bars(data, kdims=[kx], vdims=[value, "full", "series"])
        return el.opts(color=colors[label(ys[0])], **opts)
    el = hv.Bars(data, kdims=[kx, hv.Dimension("series", label="series")], vdims=[value, "full"])
    return el.opts(stacked=stacked, color="series", cmap=colors, legend_position="right", **opts)


def series(
    df: pl.DataFrame, x: str, ys: Sequence[str], title: str, ylabel: str = "", height: int = 320
) -> Any:
    """A per-step series as lines with a marker per point (``hv.Curve`` and ``hv.Scatter``
    overlaid): ``x`` numeric (a step), one line per ``ys`` column in its colour (:func:`color_of`).
    ``_ns`` columns are drawn in ms (axis ``ms``), others as they are (axis ``ylabel``)."""
    hv = holoviews()
    ys, scale, unit = _y_axis(df, ys, ylabel)
    d = df.sort(x)
    if f"{x}_last" in d.columns:  # buckets of steps (:func:`buckets`)
        return _banded(hv, d, x, ys, scale, unit, title, height)
    parts = []
    for j, y in enumerate(ys):
        part = d.filter(pl.col(y).is_not_null())
        data = {x: part[x].to_list(), "v": [float(v) * scale for v in part[y].to_list()]}
        dims = {"kdims": [x], "vdims": [hv.Dimension("v", label=unit)], "label": label(y)}
        color = color_of(y, j)
        parts.append(hv.Curve(data, **dims).opts(color=color, line_width=2, tools=["hover"]))
        parts.append(hv.Scatter(data, **dims).opts(color=color, size=5))
    opts = _opts(title, height, legend_position="right", show_grid=False)
    if all(v >= 0 for y in ys for v in d[y].drop_nulls().to_list()):
        opts["ylim"] = (0, None)
    return hv.Overlay(parts).opts(**opts)


def _banded(
    hv: Any, d: pl.DataFrame, x: str, ys: Sequence[str], scale: float, unit: str, title: str, height: int
) -> Any:
    """:func:`series` of buckets of steps (:func:`buckets`): per ``ys`` column a line through the
    buckets' medians and a band from their smallest to their largest step, in its colour, at each
    bucket's first step; hover gives a point's median, smallest and largest."""
    parts = []
    v, lo, hi = (hv.Dimension(k, label=f"{k} ({unit})") for k in ("median", "min", "max"))
    for j, y in enumerate(ys):
        part = d.filter(pl.col(y).is_not_null())
        data = {
            x: part[x].to_list(),
            "median": [float(a) * scale for a in part[y].to_list()],
            "min": [float(a) * scale for a in part[f"{y}_min"].to_list()],
            "max": [float(a) * scale for a in part[f"{y}_max"].to_list()],
        }
        color, name = color_of(y, j), label(y)
        band = hv.Area(data, kdims=[x], vdims=[lo, hi], label=f"{name} (min-max)")
        parts.append(band.opts(color=color, alpha=0.25, line_alpha=0))
        curve = hv.Curve(data, kdims=[x], vdims=[v, lo, hi], label=f"{name} (median)")
        parts.append(curve.opts(color=color, line_width=2, tools=["hover"]))
    opts = _opts(title, height, legend_position="right", show_grid=False, ylabel=unit)
    if all(a >= 0 for y in ys for a in d[f"{y}_min"].drop_nulls().to_list()):
        opts["ylim"] = (0, None)
    return hv.Overlay(parts).opts(**opts)


def heatmap(df: pl.DataFrame, x: str, y: str, value: str, title: str) -> Any:
    """A heatmap (``hv.HeatMap``) of ``value`` over ``x`` × ``y`` (categories, in natural order);
    the colour scale runs over the data's range, from its smallest value (light) to its largest
    (dark), so that differences show even when every value is far from zero (an MFU of 41-44% was
    one flat block on a 0-based scale). A frame of buckets of ``x`` values (:func:`buckets`) is
    coloured by each bucket's most outlying value (``{value}_far``), so that one slow step of a
    hundred still shows."""
    hv = holoviews()
    banded = f"{value}_far" in df.columns
    vals = [None if v is None else float(v) for v in df[f"{value}_far" if banded else value].to_list()]
    present = [v for v in vals if v is not None]
    low, top = (min(present), max(present)) if present else (0.0, 1.0)
    if top <= low:  # one value: a scale around it
        low, top = low - 0.5, top + 0.5
    xs = [_shown(v) for v in df[x].to_list()]
    ys = [_shown(v) for v in df[y].to_list()]
    rows = len(set(ys))
    data = {x: xs, y: ys, value: [float("nan") if v is None else v for v in vals]}
    el = hv.HeatMap(data, kdims=[x, y], vdims=[hv.Dimension(value, label=label(value) + _unit(value))])
    el = el.redim.values(**{x: sorted(set(xs), key=_natural), y: sorted(set(ys), key=_natural)})
    return el.opts(
        **_opts(title, min(120 + 28 * rows, 520)),
        cmap=_REDS,
        clim=(low, top),
        colorbar=True,
        clabel=label(value) + _unit(value),
        clipping_colors={"NaN": "#f0f0f0"},
        tools=["hover"],
    )


def lines(df: pl.DataFrame, x: str, ys: Sequence[str], group: str, mark: str, title: str) -> Any:
    """Lines over time (``hv.Curve`` per line, overlaid): ``x`` epoch ns drawn as ms from the
    earliest, one line per ``group`` value and ``ys`` column (the first solid, the others dashed),
    in the group's colour; the rows where the boolean column ``mark`` is true drawn as markers
    (e.g. each series' peak). ``_bytes`` columns are drawn in GiB, ``_ns`` in ms."""
    hv = holoviews()
    ys = [y for y in ys if y in df.columns]
    scale, unit = (
        (1 / 2**30, "GiB")
        if all(y.endswith("_bytes") for y in ys)
        else (1e-6, "ms")
        if all(y.endswith("_ns") for y in ys)
        else (1.0, "value")
    )
    t0 = df[x].min() or 0
    groups = df[group].unique(maintain_order=True).to_list() if group else [None]
    if len(groups) > MAX_LINES:  # many ranks: the largest series, so that the figure stays readable and small
        top = (
            df.group_by(group)
            .agg(pl.col(ys[0]).max())
            .sort(ys[0], group, descending=[True, False], nulls_last=True)
        )
        keep = set(top[group].head(MAX_LINES).to_list())
        title += f" (the {MAX_LINES} largest of {len(groups)}; the table has all)"
        groups = [g for g in groups if g in keep]
    kt, kv = hv.Dimension("t", label="ms from the first record"), hv.Dimension("v", label=unit)
    parts, dashes = [], ("solid", "dashed", "dotted", "dotdash")
    for i, g in enumerate(groups):
        part = df.filter(pl.col(group) == g) if group else df
        color = PALETTE[i % len(PALETTE)]
        for j, y in enumerate(ys):
            d = part.filter(pl.col(y).is_not_null())
            if d.is_empty():
                continue
            t = [(v - t0) / 1e6 for v in d[x].to_list()]
            v = [float(v) * scale for v in d[y].to_list()]
            name = f"{_shown(g)} {label(y)}" if group else label(y)
            parts.append(
                hv.Curve((t, v), kdims=[kt], vdims=[kv], label=name).opts(
                    color=color, line_dash=dashes[j % len(dashes)], line_width=1.5, tools=["hover"]
                )
            )
            if mark and mark in d.columns:
                m = d.filter(pl.col(mark))
                pts = ([(v - t0) / 1e6 for v in m[x].to_list()], [float(v) * scale for v in m[y].to_list()])
                parts.append(hv.Scatter(pts, kdims=[kt], vdims=[kv]).opts(color=color, size=9))
    return hv.Overlay(parts).opts(**_opts(title, 360, legend_position="right", show_legend=True))


def spans(df: pl.DataFrame, lane: str, start: str, end: str, state: str, title: str) -> Any:
    """Intervals on lanes (a Gantt chart of ``hv.Rectangles``): one bar per row from ``start`` to
    ``end`` (ms) on lane ``lane`` (in first-seen order, top to bottom), coloured by ``state``
    (:func:`color_of`)."""
    hv = holoviews()
    lanes = list(dict.fromkeys(_shown(v) for v in df[lane].to_list()))
    index = {ln: i for i, ln in enumerate(lanes)}
    parts = []
    for k, raw in enumerate(dict.fromkeys(str(v) for v in df[state].to_list())):
        d = df.filter(pl.col(state).cast(pl.Utf8) == raw)
        st = _shown(raw)
        rows = [
            (s, index[_shown(ln)] - 0.35, e, index[_shown(ln)] + 0.35, _shown(ln), e - s)
            for ln, s, e in zip(d[lane].to_list(), d[start].to_list(), d[end].to_list(), strict=True)
        ]
        el = hv.Rectangles(rows, vdims=[lane, "ms"], label=st).opts(color=color_of(raw, k), line_alpha=0)
        parts.append(el.opts(tools=["hover"]))
    return hv.Overlay(parts).opts(
        **_opts(title, min(140 + 30 * len(lanes), 700)),
        xlabel="ms from the step's start",
        ylabel=lane,
        yticks=list(enumerate(lanes)),
        invert_yaxis=True,
        legend_position="bottom",
        show_grid=False,
    )


def chart(result: Any, spec: Any) -> tuple[Any, str]:
    """The holoviews element of one declared chart of an analysis result, as the report draws it,
    and a note when its x axis was thinned (:func:`downsample`: at most :data:`MAX_COLUMNS`
    columns, e.g. a per-step series of 100,000 steps), else "".

    Args:
        result: A :class:`traceprof.engine.analysis.FrameResult` (``frames()``).
        spec: One of its ``charts()`` (:class:`traceprof.engine.analysis.Chart`): ``lines`` over
            time, a ``heatmap``, ``spans`` on lanes, or bars; bars over ``step`` that are not
            stacked are drawn as lines (:func:`series`).
    """
    df = result.frames()[spec.frame]
    title = spec.title.replace(" (ns)", "")
    if spec.kind == "lines":  # a time series the analysis bounded already (e.g. memory's buckets)
        return lines(df, spec.x, spec.ys, spec.group, spec.mark, title), ""
    if spec.kind == "heatmap":
        if spec.x != "step":
            df, note = downsample(df, spec.x, [spec.value], by=[spec.ys[0]])
            return heatmap(df, spec.x, spec.ys[0], spec.value, title), note
        df, note = buckets(df, spec.x, [spec.value], by=[spec.ys[0]], max_points=MAX_COLUMNS)
        if note:  # each cell the most outlying step of its bucket, so that no outlier is hidden
            note += (
                f"; each cell shows the {label(spec.value)} of its step furthest from the median of all "
                "(the most outlying, either way; the table has every step)"
            )
        return heatmap(df, spec.x, spec.ys[0], spec.value, title), note
    if spec.kind == "spans":  # intervals per lane: x the lane, ys (start, end), value the state
        return spans(df, spec.x, spec.ys[0], spec.ys[1], spec.value, title), ""
    if spec.x == "step" and not spec.stacked and df[spec.x].dtype.is_numeric():  # a per-step series
        df, note = buckets(df, spec.x, spec.ys)
        if note:
            note += (
                ": each their median, and a band from the smallest to the largest (the table has every step)"
            )
        return series(df, spec.x, spec.ys, title, ylabel=spec.ylabel), note
    df, note = downsample(df, spec.x, spec.ys)
    return bars(df, spec.x, spec.ys, title, ylabel=spec.ylabel, stacked=spec.stacked), note


def _unit(col: str) -> str:
    return " (ms)" if col.endswith("_ms") else " (%)" if col.endswith("_pct") else ""


def _natural(s: str) -> tuple[int, float, str]:
    try:
        return (0, float(s), "")
    except ValueError:
        return (1, 0.0, s)


def timeline(tl: Any) -> Any:
    """The per-rank lanes of a :class:`traceprof.engine.timeline.Timeline` as holoviews elements
    overlaid: one rectangle per merged interval, coloured by state (few ranks), or one image of
    binned states (many ranks); the critical path over them in black (``hv.Segments``)."""
    hv = holoviews()
    from traceprof.engine.timeline import STATES

    n = len(tl.ranks)
    title = f"Timeline of {tl.note}: compute, communication (exposed in red), idle (grey)"
    parts: list[Any] = []
    if tl.intervals is not None:
        index = {r: i for i, r in enumerate(tl.ranks)}
        idle = [(0.0, i - 0.4, tl.span_ms, i + 0.4, r, tl.span_ms) for r, i in index.items()]
        parts.append(
            hv.Rectangles(idle, vdims=["rank", "ms"], label=STATES[0]).opts(
                color=STATE_COLORS[0], line_alpha=0
            )
        )
        for code, state in enumerate(STATES[1:], start=1):
            d = tl.intervals.filter(pl.col("state") == state)
            if d.is_empty():
                continue
            rows = [
                (s, index[r] - 0.4, e, index[r] + 0.4, r, e - s)
                for r, s, e in zip(
                    d["rank"].to_list(), d["start_ms"].to_list(), d["end_ms"].to_list(), strict=True
                )
            ]
            el = hv.Rectangles(rows, vdims=["rank", "ms"], label=state)
            parts.append(el.opts(color=STATE_COLORS[code], line_alpha=0, tools=["hover"]))
    else:
        bounds = (0, -0.5, tl.span_ms, n - 0.5)
        grid = tl.grid[::-1]  # hv.Image's first row is the top: rank 0 last, drawn at the bottom then flipped
        parts.append(hv.Image(grid, bounds=bounds).opts(cmap=list(STATE_COLORS), clim=(-0.5, 3.5)))
        title += f"; {n} ranks in {tl.grid.shape[1]} bins of {tl.bin_ms:,.2f} ms, each its main state"
    if tl.path is not None and not tl.path.is_empty():
        parts += _path(hv, tl)
        title += "; critical path in black"
    return hv.Overlay(parts).opts(
        **_opts(title, min(140 + 26 * n, 700)),
        xlabel=tl.axis,
        ylabel="rank",
        xlim=(0, tl.span_ms),
        yticks=[(i, str(r)) for i, r in enumerate(tl.ranks)],
        invert_yaxis=True,
        legend_position="bottom",
        show_grid=False,
    )


def _path(hv: Any, tl: Any) -> list[Any]:
    """The critical path (``tl.path``) over the lanes: a black line along each piece on its rank's
    lane and a dotted one where it crosses to another rank (a rank waited for that one)."""
    index = {r: i for i, r in enumerate(tl.ranks)}
    p = tl.path.with_columns(pl.col("rank").replace_strict(index, return_dtype=pl.Int64).alias("lane"))
    rows = [
        (s, y, e, y, r, f"{_shown(k)} {shorten(_shown(nm), 60)}", e - s)
        for s, e, y, r, k, nm in zip(
            p["start_ms"].to_list(),
            p["end_ms"].to_list(),
            p["lane"].to_list(),
            p["rank"].to_list(),
            p["kind"].to_list(),
            p["name"].to_list(),
            strict=True,
        )
    ]
    out = [
        hv.Segments(rows, vdims=["rank", "what", "ms"], label="critical path").opts(
            color="black", line_width=3, tools=["hover"]
        )
    ]
    turn = p.filter(pl.col("lane") != pl.col("lane").shift(1))
    prev = p["lane"].shift(1).filter(p["lane"] != p["lane"].shift(1))
    if turn.height:
        cross = [
            (x, y0, x, y1)
            for x, y0, y1 in zip(
                turn["start_ms"].to_list(), prev.to_list(), turn["lane"].to_list(), strict=True
            )
            if y0 is not None
        ]
        out.append(hv.Segments(cross).opts(color="black", line_width=2, line_dash="dotted"))
    return out


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
    """The page parts for ``figs`` (holoviews elements, rendered to bokeh by :func:`render`, or
    bokeh figures): (HTML to put at the end of the body, one ``<div>`` per figure).

    Without figures both are empty (no JavaScript at all).
    """
    if not figs:
        return "", []
    from bokeh.embed import json_item
    from bokeh.model import Model

    with quiet(), _unvalidated():
        items = [
            (f"tp-plot-{i}", json_item(f if isinstance(f, Model) else render(f))) for i, f in enumerate(figs)
        ]
    divs = [f'<div class="plot" id="{pid}"></div>' for pid, _ in items]
    data = json.dumps(items, separators=(",", ":")).encode()
    tail = (
        f'<script id="tp-bokeh" type="application/octet-stream">{_packed(_bokeh_js())}</script>\n'
        f'<script id="tp-plots" type="application/octet-stream">{_packed(data)}</script>\n{_LOADER}'
    )
    return tail, divs
