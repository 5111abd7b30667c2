"""Plots read right: axis units match the legend, one palette, heatmaps over the data's range, long names shortened."""

from __future__ import annotations

import base64
import gzip
import json
import re

import polars as pl
import pytest

from traceprof.render import plots

LONG = (
    "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
    "at::detail::Array<char*, 1> >(int, at::native::FillFunctor<float>, at::detail::Array<char*, 1>)"
)


def _colours(fig) -> dict[str, str]:
    """Series label -> colour of a rendered bar chart (holoviews maps the series by a categorical
    colour mapper)."""
    mapper = fig.renderers[0].glyph.fill_color.transform
    return dict(zip(mapper.factors, mapper.palette, strict=True))


def test_ns_series_are_drawn_in_ms_with_plain_legends():
    df = pl.DataFrame(
        {"rank": [0, 1], "overlap_ns": [2_000_000, 4_000_000], "exposed_comm_ns": [1_000_000, 0]}
    )
    el = plots.bars(df, "rank", ("overlap_ns", "exposed_comm_ns"), "Communication", ylabel="ns", stacked=True)
    assert type(el).__name__ == "Bars"  # a holoviews element, for notebooks to compose
    assert el.dimension_values("value").tolist() == [2.0, 4.0, 1.0, 0.0]  # 2,000,000 ns = 2 ms
    assert list(dict.fromkeys(el.dimension_values("series"))) == ["overlap", "exposed comm"]
    fig = plots.render(el)
    assert fig.yaxis[0].axis_label == "ms" and set(_colours(fig)) == {"overlap", "exposed comm"}
    assert fig.y_range.start == 0 and fig.output_backend == "canvas"
    assert fig.sizing_mode == "stretch_width"  # the page's width


def test_percent_series_keep_their_axis():
    df = pl.DataFrame({"rank": [0], "idle_pct": [12.5]})
    fig = plots.render(plots.bars(df, "rank", ("idle_pct",), "Idle", ylabel="% of window"))
    assert fig.yaxis[0].axis_label == "% of window"
    assert fig.renderers[0].glyph.fill_color == plots.MEANING_COLORS["idle"]


def test_long_names_are_shortened_with_the_full_name_on_hover():
    df = pl.DataFrame({"name": [LONG, "aten::mm"], "total_ns": [5_000, 3_000]})
    el = plots.bars(df, "name", ("total_ns",), "Top kernels")
    assert el.dimension_values("x").tolist() == ["vectorized_elementwise_kernel", "aten::mm"]
    assert el.dimension_values("full").tolist() == [LONG, "aten::mm"]
    fig = plots.render(el)
    assert any("full" in str(t.tooltips) for t in fig.tools if hasattr(t, "tooltips"))


def test_heatmap_colour_scale_runs_over_the_data():
    # An MFU of 41-44% on a scale from 0 was one flat block: the scale runs from the smallest value.
    df = pl.DataFrame({"step": [1, 1, 2], "rank": [0, 1, 0], "lateness_ms": [5.0, 7.5, 6.0]})
    el = plots.heatmap(df, "step", "rank", "lateness_ms", "Lateness")
    assert type(el).__name__ == "HeatMap"
    bar = next(x for x in plots.render(el).right if hasattr(x, "color_mapper"))
    assert (bar.color_mapper.low, bar.color_mapper.high) == (5.0, 7.5)
    assert bar.color_mapper.palette[0] == "#fff5f0" and bar.title == "lateness (ms)"


def test_heatmap_cells_are_placed_without_a_dataset_per_column(monkeypatch):
    # holoviews orders a heatmap's categories from each x column's y values; it built a holoviews
    # Dataset per column for that (a 334-step heatmap: 334 of them, most of its render time).
    # The grid is the one holoviews' own path gives, with no Dataset per column:
    # x '1' holds y p, q; '2' holds q, r; '3' holds r, p: a cycle, so y is sorted (p, q, r); x keeps
    # its order of appearance; each cell in its place, NaN (None here) where a pair is missing.
    from holoviews.core.data import Dataset
    from holoviews.element.util import categorical_aggregate2d

    df = pl.DataFrame(
        {
            "step": ["1", "1", "2", "2", "3", "3"],
            "rank": ["p", "q", "q", "r", "r", "p"],
            "v": [1.0, 2, 3, 4, 5, 6],
        }
    )

    def cells(grid) -> list[list[float | None]]:
        return [
            [None if v != v else v for v in row] for row in grid.dimension_values("v", flat=False).tolist()
        ]

    own = categorical_aggregate2d._get_coords
    with plots._fast_heatmaps():
        grid = plots.heatmap(df, "step", "rank", "v", "cycle").gridded
    assert grid.dimension_values("step", expanded=False).tolist() == ["1", "2", "3"]
    assert grid.dimension_values("rank", expanded=False).tolist() == ["p", "q", "r"]
    assert cells(grid) == [[1.0, None, 6.0], [2.0, 3.0, None], [None, 4.0, 5.0]]  # [y][x]
    assert categorical_aggregate2d._get_coords == own  # restored after
    assert cells(plots.heatmap(df, "step", "rank", "v", "cycle").gridded) == cells(grid)  # holoviews' own
    made = []
    init = Dataset.__init__
    monkeypatch.setattr(Dataset, "__init__", lambda self, *a, **k: (made.append(1), init(self, *a, **k))[1])
    many = pl.DataFrame({"step": list(range(60)) * 2, "rank": [0] * 60 + [1] * 60, "v": [1.0] * 120})
    plots.render(plots.heatmap(many, "step", "rank", "v", "many"))
    assert len(made) < 60  # 60 columns, not a Dataset each


def test_one_palette_one_meaning_per_colour():
    # Green was idle in one chart, "other", "memory only" and p99 in others. Each meaning has one
    # colour, the same in every chart and on the timeline; series that measure no state (p99,
    # actual vs simulated) never take a meaning's colour.
    meanings = plots.MEANING_COLORS
    assert len(set(meanings.values())) == len(meanings)
    assert not set(meanings.values()) & set(plots.PALETTE)
    assert plots.STATE_COLORS[0] == meanings["idle"]
    expect = {
        "idle_pct": "idle",  # temporal
        "stream_idle_pct": "idle",  # idle
        "idle_ns": "idle",  # critical_path
        "host_wait_pct": "host-bound",  # idle by cause
        "host_bound_ns": "host-bound",  # critical_path
        "wait_ns": "waiting",  # nccl_sum, critical_path
        "exposed_comm_ns": "exposed communication",  # overlap
        "comm_only_ns": "exposed communication",  # kernels
        "overlap_ns": "communication",
        "transfer_ns": "communication",
        "compute_pct": "compute",
        "compute_only_ns": "compute",
        "memory_only_ns": "memory",
        "latency_p99_ns": None,
        "actual_ns": None,
    }
    assert {k: plots.meaning(k) for k in expect} == expect
    # the same column gets the same colour in two charts, whatever its place among the series
    a = plots.bars(
        pl.DataFrame({"rank": [0], "compute_pct": [60.0], "idle_pct": [40.0]}),
        "rank",
        ("compute_pct", "idle_pct"),
        "A",
        stacked=True,
    )
    b = plots.bars(
        pl.DataFrame({"rank": [0], "idle_ns": [4], "compute_ns": [6]}),
        "rank",
        ("idle_ns", "compute_ns"),
        "B",
        stacked=True,
    )
    assert (
        _colours(plots.render(a))
        == _colours(plots.render(b))
        == {
            "compute": meanings["compute"],
            "idle": meanings["idle"],
        }
    )


def test_per_step_series_are_lines_at_page_width():
    df = pl.DataFrame(
        {"step": [3, 1, 2], "actual_ns": [3_000_000, 1_000_000, 2_000_000], "ideal_ns": [1_000_000] * 3}
    )
    el = plots.series(df, "step", ("actual_ns", "ideal_ns"), "Step time")
    curves = [e for e in el if type(e).__name__ == "Curve"]
    assert [c.label for c in curves] == ["actual", "ideal"]
    assert curves[0].dimension_values("step").tolist() == [1, 2, 3]
    assert curves[0].dimension_values("v").tolist() == [1.0, 2.0, 3.0]  # ms, sorted by step
    fig = plots.render(el)
    assert sum(type(r.glyph).__name__ == "Line" for r in fig.renderers) == 2
    assert fig.sizing_mode == "stretch_width" and fig.yaxis[0].axis_label == "ms"


def test_embed_is_compressed_and_quiet(caplog):
    df = pl.DataFrame({"rank": [0], "a_ns": [1]})
    tail, divs = plots.embed([plots.bars(df, "rank", ("a_ns",), "t")])
    assert divs == ['<div class="plot" id="tp-plot-0"></div>']
    assert "DecompressionStream" in tail and "<script src" not in tail
    assert len(tail) < 600_000  # bokeh.min.js (1.3 MB) gzip + base64
    assert not [r for r in caplog.records if r.name.startswith("bokeh")]
    assert plots.embed([]) == ("", [])


def test_shorten_symbols_to_their_family_and_prose_at_both_ends():
    from traceprof.core.names import shorten

    assert shorten(LONG) == "vectorized_elementwise_kernel"
    assert (
        shorten("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 30)
        == "ncclDevKernel_AllReduce"
    )
    cause = "all_reduce (524.3 kB) after autograd::engine::evaluate_function: torch::autograd::AccumulateGrad"
    short = shorten(cause, 48)
    assert (
        len(short) == 48
        and short.startswith("all_reduce (524.3 kB) after")
        and short.endswith("AccumulateGrad")
    )
    assert shorten("aten::mm") == "aten::mm"


def test_shorten_keeps_the_start_of_text_that_starts_with_a_bracket():
    # Its family dropped every <...> and (...) part: "<script>alert(1)</script>[red]x..." became
    # "alert[red]x...". 48 = 31 kept from the start + "…" + 16 (a third) from the end.
    from traceprof.core.names import shorten

    name = "<script>alert(1)</script>[red]x" + "y" * 60
    assert shorten(name, 48) == "<script>alert(1)</script>[red]x…" + "y" * 16


def test_downsample_averages_runs_of_steps() -> None:
    """10 steps into at most 4 columns: ceil(10 / 4) = 3 steps a column, labelled by the first
    step: (0,1,2) -> mean 1, (3,4,5) -> 4, (6,7,8) -> 7, (9) -> 9; per rank for a heatmap; a short
    series is returned as it is, without a note."""
    import polars as pl

    from traceprof.render.plots import downsample

    df = pl.DataFrame({"step": list(range(10)), "v": [float(i) for i in range(10)]})
    out, note = downsample(df, "step", ["v"], max_columns=4)
    assert out["step"].to_list() == [0, 3, 6, 9] and out["v"].to_list() == [1.0, 4.0, 7.0, 9.0]
    assert "10 step values drawn as 4 columns, each the mean of 3" in note
    two = pl.concat([df.with_columns(pl.lit(r).alias("rank")) for r in (0, 1)])
    heat, _ = downsample(two, "step", ["v"], by=["rank"], max_columns=4)
    assert heat.height == 8 and heat.filter(pl.col("rank") == 1)["v"].to_list() == [1.0, 4.0, 7.0, 9.0]
    same, none = downsample(df, "step", ["v"], max_columns=10)
    assert same is df and none == ""


def _hand_buckets(values: list[float], per: int) -> list[tuple[float, float, float]]:
    """(min, median, max) of each run of ``per`` consecutive values, worked out without polars."""
    import statistics

    return [
        (min(b), statistics.median(b), max(b))
        for b in (values[i : i + per] for i in range(0, len(values), per))
    ]


def _step_chart(df: pl.DataFrame):
    """What-if's per-step chart of ``df`` (step, actual_ns, ideal_ns), drawn as the report draws it."""
    from traceprof.engine.analysis import Chart

    class Result:
        def frames(self) -> dict[str, pl.DataFrame]:
            return {"frame": df}

    spec = Chart("Step time: actual vs simulated without stragglers (ns)", "step", ("actual_ns", "ideal_ns"))
    el, note = plots.chart(Result(), spec)
    return plots.render(el), note


def test_a_per_step_series_of_5000_steps_is_bucketed_with_its_extremes() -> None:
    """5,000 steps into at most MAX_POINTS (500) points: ceil(5000 / 500) = 10 steps a point,
    labelled by the first (0, 10, ..., 4990). Step times 1 ms + (step mod 7) us, and one slow step,
    4,321, of 50 ms: its bucket (4,320-4,329) has max 50 ms, the mean of earlier versions (5.9 ms)
    hid it. Medians, mins and maxes worked out by :func:`_hand_buckets`; every other line is flat."""
    n, slow = 5000, 4321
    actual = [1_000_000 + (i % 7) * 1_000 for i in range(n)]
    actual[slow] = 50_000_000
    df = pl.DataFrame({"step": range(n), "actual_ns": actual, "ideal_ns": [900_000] * n})
    fig, note = _step_chart(df.reverse())  # the rows in any order
    assert note == (
        "5,000 steps drawn as 500 points of 10 consecutive steps: each their median, "
        "and a band from the smallest to the largest (the table has every step)"
    )
    lines = [r.data_source.data for r in fig.renderers if type(r.glyph).__name__ == "Line"]
    bands = [r.data_source.data for r in fig.renderers if type(r.glyph).__name__ == "Patch"]
    assert len(lines) == 2 and len(bands) == 2
    want = _hand_buckets([v / 1e6 for v in actual], 10)
    got = lines[0]
    assert len(got["step"]) == plots.MAX_POINTS == 500 and list(got["step"]) == list(range(0, n, 10))
    assert list(got["min"]) == [w[0] for w in want]
    assert list(got["median"]) == pytest.approx([w[1] for w in want], rel=1e-12)
    assert list(got["max"]) == [w[2] for w in want]
    assert got["max"][432] == 50.0 and max(got["max"]) == 50.0  # the slow step kept exactly
    # the band: the maxes left to right, then the mins right to left (one polygon)
    assert list(bands[0]["y"]) == [w[2] for w in want] + [w[0] for w in want][::-1]
    assert len(set(lines[1]["median"])) == 1 and lines[1]["median"][0] == pytest.approx(0.9)  # ideal: flat


def test_buckets_of_a_heatmap_show_each_buckets_most_outlying_step() -> None:
    """2 ranks x 1,000 steps into at most 400 columns: ceil(1000 / 400) = 3 steps a column, 334
    columns (the last holds step 999 alone). Rank 0's lateness 1.0 everywhere but 9.0 at step 500
    and 0.0 at step 700; rank 1's 1.0 everywhere. The median of all is 1.0: the column of steps
    498-500 shows rank 0's 9.0 and that of 699-701 its 0.0 (a mean showed 3.67 and 0.67); the
    bucket's median, min and max are kept beside."""
    n = 1000
    late0 = [9.0 if i == 500 else 0.0 if i == 700 else 1.0 for i in range(n)]
    df = pl.DataFrame(
        {"step": list(range(n)) * 2, "rank": [0] * n + [1] * n, "lateness_ms": late0 + [1.0] * n}
    )
    out, note = plots.buckets(df, "step", ["lateness_ms"], by=["rank"], max_points=400)
    assert note == "1,000 steps drawn as 334 points of 3 consecutive steps (the last fewer)"
    assert out.height == 668 and out["step"].unique().to_list() == list(range(0, n, 3))
    r0 = out.filter(pl.col("rank") == 0)
    far = dict(zip(r0["step"].to_list(), r0["lateness_ms_far"].to_list(), strict=True))
    assert far[498] == 9.0 and far[699] == 0.0
    assert {v for s, v in far.items() if s not in (498, 699)} == {1.0}
    assert set(out.filter(pl.col("rank") == 1)["lateness_ms_far"].to_list()) == {1.0}
    row = r0.filter(pl.col("step") == 498).select(pl.exclude("step", "rank", "lateness_ms_far")).row(0)
    assert row == (500, 3, 1.0, 1.0, 9.0)  # last step, steps, median, min, max
    assert r0.filter(pl.col("step") == 999).row(0, named=True)["steps"] == 1
    same, none = plots.buckets(df, "step", ["lateness_ms"], by=["rank"], max_points=n)
    assert same is df and none == ""


def test_every_plot_is_a_holoviews_element_that_renders_to_bokeh(tmp_path):
    # The report's charts are holoviews elements (a notebook composes them); the report renders each
    # to a bokeh figure. On the straggler sample (4 ranks): the timeline of the median step with its
    # critical path, the stragglers' heat map, overlap per rank, what-if's per-step lines, and a
    # memory-style lines chart and a stage Gantt chart from small frames.
    import holoviews as hv
    from bokeh.models import Model

    from tests.conftest import SAMPLES
    from traceprof.api import open as open_session
    from traceprof.ingest.ingest import ingest
    from traceprof.storage.store import Store

    db = tmp_path / "s.duckdb"
    with Store(db) as store:
        ingest(store, [SAMPLES / "straggler_rank2"])
    with open_session(db) as s:
        tl = s.timeline()
        assert isinstance(tl, hv.Overlay)
        kinds = {type(e).__name__ for e in tl}
        assert {"Rectangles", "Segments"} <= kinds  # states per rank, the critical path
        layout = s.plot("stragglers")
        assert [type(e).__name__ for e in layout] == ["Bars", "HeatMap"]
        whatif = s.plot("whatif")
        assert isinstance(next(iter(whatif)), hv.Overlay)  # actual vs simulated step time: lines
        elements = [tl, *layout, *whatif, *s.plot("overlap")]
    mem = pl.DataFrame(
        {
            "ts_ns": [0, 10**6, 2 * 10**6],
            "rank": [0, 0, 0],
            "allocated_bytes": [0, 2**30, 2**29],
            "peak": [False, True, False],
        }
    )
    elements.append(plots.lines(mem, "ts_ns", ("allocated_bytes",), "rank", "peak", "Memory"))
    gantt = pl.DataFrame(
        {
            "lane": ["stage 0", "stage 1"],
            "start_ms": [0.0, 1.0],
            "end_ms": [2.0, 3.0],
            "state": ["compute", "p2p"],
        }
    )
    elements.append(plots.spans(gantt, "lane", "start_ms", "end_ms", "state", "Stages"))
    for el in elements:
        assert isinstance(el, hv.core.Dimensioned)
        fig = plots.render(el)
        assert isinstance(fig, Model) and fig.renderers and fig.sizing_mode == "stretch_width"
    tail, divs = plots.embed(elements)
    assert len(divs) == len(elements) and tail.count('id="tp-bokeh"') == 1  # bokeh's JavaScript once


def test_holoviews_loads_only_when_plotting(tmp_path):
    # holoviews (and the pandas it brings) costs about a second: the CLI, the analyses and the plots
    # module itself do not import it; the first plot does.
    import subprocess
    import sys

    code = (
        "import sys, traceprof.cli, traceprof.api, traceprof.render.plots, traceprof.render.report\n"
        "print('holoviews' in sys.modules)\n"
        "import polars as pl\n"
        "traceprof.render.plots.bars(pl.DataFrame({'r': [0], 'x_ns': [1]}), 'r', ['x_ns'], 't')\n"
        "print('holoviews' in sys.modules)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert r.stdout.split() == ["False", "True"], r.stderr


def test_readme_notebook_example_runs(tmp_path, monkeypatch):
    # The README's notebook example, as written, on a store holding the straggler sample.
    import re

    import holoviews as hv

    from tests.conftest import REPO, SAMPLES
    from traceprof.ingest.ingest import ingest
    from traceprof.storage.store import Store

    text = (REPO / "README.md").read_text()
    block = re.search(r"<!-- notebook example:[^>]*-->\n```python\n(.*?)```", text, re.S).group(1)
    with Store(tmp_path / "traceprof.duckdb") as store:
        ingest(store, [SAMPLES / "straggler_rank2"])
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(block, "README.md", "exec"), scope)  # noqa: S102 - the README's own example
    scope["s"].close()
    assert scope["gaps"].frames()["ranks"].height == 4
    assert isinstance(scope["waits"], hv.Layout) and isinstance(scope["tl"], hv.Overlay)
    assert isinstance(scope["exposed"], hv.Bars)
    assert plots.render(scope["exposed"]).renderers  # draws


def test_timeline_of_many_ranks_is_one_image_of_states():
    # Above 64 ranks the timeline is a grid of binned states (engine.timeline): one hv.Image whose
    # colours are the states' (idle grey ... exposed red), rank 0 at the top as in the detailed lanes.
    import numpy as np

    from traceprof.engine.timeline import Timeline

    grid = np.zeros((100, 8), dtype=np.uint8)
    grid[0, :] = 3  # rank 0: exposed communication throughout
    grid[99, 4:] = 1  # rank 99: compute in the second half
    tl = Timeline(
        step=5, ranks=tuple(range(100)), span_ms=8.0, intervals=None, grid=grid, bin_ms=1.0, note="step 5"
    )
    el = plots.timeline(tl)
    image = next(e for e in el if type(e).__name__ == "Image")
    # rank 0 (code 3) at y = 0, rank 99 (code 1 from 4 ms on) at y = 99: the y axis is then inverted
    assert image[0.5, 0] == 3 and image[6.5, 99] == 1 and image[0.5, 99] == 0
    fig = plots.render(el)
    mapper = next(r.glyph.color_mapper for r in fig.renderers if type(r.glyph).__name__ == "Image")
    assert list(mapper.palette) == list(plots.STATE_COLORS) and (mapper.low, mapper.high) == (-0.5, 3.5)
    assert fig.y_range.start > fig.y_range.end and "100 ranks in 8 bins" in fig.title.text  # rank 0 on top


def _figures() -> list:
    df = pl.DataFrame({"rank": [0, 1, 2], "idle_ns": [3_000_000, 1_000_000, 2_000_000], "comm_ns": [1, 2, 3]})
    heat = pl.DataFrame({"step": [1, 2, 1, 2], "rank": [0, 0, 1, 1], "mfu_pct": [41.0, 42.5, 43.0, None]})
    return [
        plots.bars(df, "rank", ("idle_ns", "comm_ns"), "Idle", stacked=True),
        plots.heatmap(heat, "step", "rank", "mfu_pct", "MFU"),
    ]


def _unpacked(tail: str) -> str:
    """The figures' JSON of :func:`plots.embed`'s page tail, bokeh's model ids made one."""
    packed = re.search(r'id="tp-plots" type="application/octet-stream">([^<]*)<', tail).group(1)
    return re.sub(r'"p\d+"', '"id"', gzip.decompress(base64.b64decode(packed)).decode())


def test_embedding_skips_bokehs_document_checks_and_writes_the_same_figures(monkeypatch):
    """embed turns off bokeh's per-figure document validation (checks that only log), and the
    figures' JSON is the one written with it on; the caller's setting is restored after."""
    from bokeh.document import Document
    from bokeh.embed import json_item
    from bokeh.settings import settings

    calls = []
    real = Document.validate
    monkeypatch.setattr(Document, "validate", lambda self: calls.append(1) or real(self))
    settings.perform_document_validation.set_value(True)
    try:
        tail, _ = plots.embed(_figures())  # the caller's True turned off inside, then restored
        assert calls == [] and settings.perform_document_validation() is True
        with plots.quiet():  # the old way: each figure's document validated
            by_hand = [json_item(plots.render(f)) for f in _figures()]
        assert len(calls) == 2
    finally:
        settings.perform_document_validation.unset_value()
    assert settings.perform_document_validation() is True  # bokeh's default again
    items = [(f"tp-plot-{i}", item) for i, item in enumerate(by_hand)]
    expected = re.sub(r'"p\d+"', '"id"', json.dumps(items, separators=(",", ":")))
    assert _unpacked(tail) == expected


HOSTILE = "\x1b[2J\u202eevil<b>"  # ESC clear-screen, a right-to-left override, markup


def _chart_text(el) -> list[str]:
    """Every string a chart carries: its elements' data values and labels."""
    parts = list(el) if type(el).__name__ == "Overlay" else [el]
    out = []
    for p in parts:
        out.append(str(p.label))
        for d in (*p.kdims, *p.vdims):
            out += [v for v in p.dimension_values(d) if isinstance(v, str)]
    return out


def test_chart_data_escapes_trace_names_as_the_tables_do():
    """The t9 trial's hostile_gpu: the report's tables showed a kernel named ESC[2J + U+202E as
    `\\x1b[2J\\u202e`, while the bokeh tick labels and the hover field 'full' carried the raw ESC
    and U+202E (a name could reverse the chart's text). Now bars (x and full), heatmap cells,
    spans (lanes and states), and line legends hold the escaped text, term.escape's."""
    shown = "\\x1b[2J\\u202eevil<b>"
    els = [
        plots.bars(
            pl.DataFrame({"name": [HOSTILE, "aten::mm"], "total_ns": [5_000, 3_000]}),
            "name",
            ("total_ns",),
            "k",
        ),
        plots.heatmap(
            pl.DataFrame({"step": [1], "kernel": [HOSTILE], "v": [1.0]}), "step", "kernel", "v", "h"
        ),
        plots.spans(
            pl.DataFrame({"lane": [HOSTILE], "s": [0.0], "e": [1.0], "st": [HOSTILE]}),
            "lane",
            "s",
            "e",
            "st",
            "g",
        ),
        plots.lines(
            pl.DataFrame({"t": [0, 1], "g": [HOSTILE] * 2, "m_bytes": [1, 2]}),
            "t",
            ("m_bytes",),
            "g",
            "",
            "l",
        ),
    ]
    for el in els:
        text = _chart_text(el)
        assert not any(c in s for s in text for c in ("\x1b", "\u202e")), text
        assert any(shown in s for s in text), text
