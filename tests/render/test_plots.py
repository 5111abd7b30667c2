"""Plots read right: axis units match the legend, one palette, heatmaps over the data's range, long names shortened."""

from __future__ import annotations

import polars as pl

from traceprof.render import plots

LONG = (
    "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
    "at::detail::Array<char*, 1> >(int, at::native::FillFunctor<float>, at::detail::Array<char*, 1>)"
)


def _legend(fig) -> list[str]:
    return [item.label.value for item in fig.legend[0].items]


def test_ns_series_are_drawn_in_ms_with_plain_legends():
    df = pl.DataFrame(
        {"rank": [0, 1], "overlap_ns": [2_000_000, 4_000_000], "exposed_comm_ns": [1_000_000, 0]}
    )
    fig = plots.bars(
        df, "rank", ("overlap_ns", "exposed_comm_ns"), "Communication", ylabel="ns", stacked=True
    )
    assert fig.yaxis[0].axis_label == "ms" and _legend(fig) == ["overlap", "exposed comm"]
    src = fig.renderers[0].data_source.data
    assert list(src["overlap_ns"]) == [2.0, 4.0]  # 2,000,000 ns = 2 ms
    assert fig.y_range.start == 0 and fig.output_backend == "canvas"


def test_percent_series_keep_their_axis():
    df = pl.DataFrame({"rank": [0], "idle_pct": [12.5]})
    fig = plots.bars(df, "rank", ("idle_pct",), "Idle", ylabel="% of window")
    assert fig.yaxis[0].axis_label == "% of window" and _legend(fig) == ["idle"]


def test_long_names_are_shortened_with_the_full_name_on_hover():
    df = pl.DataFrame({"name": [LONG, "aten::mm"], "total_ns": [5_000, 3_000]})
    fig = plots.bars(df, "name", ("total_ns",), "Top kernels")
    data = fig.renderers[0].data_source.data
    assert list(data["x"]) == ["vectorized_elementwise_kernel", "aten::mm"] and list(data["full"]) == [
        LONG,
        "aten::mm",
    ]
    assert any("@full" in str(t.tooltips) for t in fig.tools if hasattr(t, "tooltips"))


def test_heatmap_colour_scale_runs_over_the_data():
    # An MFU of 41-44% on a scale from 0 was one flat block: the scale runs from the smallest value.
    df = pl.DataFrame({"step": [1, 1, 2], "rank": [0, 1, 0], "lateness_ms": [5.0, 7.5, 6.0]})
    fig = plots.heatmap(df, "step", "rank", "lateness_ms", "Lateness")
    mapper = fig.right[0].color_mapper
    assert (mapper.low, mapper.high) == (5.0, 7.5) and mapper.palette[0] == "#fff5f0"
    assert fig.right[0].title == "lateness (ms)"


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
    colour = {(fig.title.text, r.name): r.glyph.fill_color for fig in (a, b) for r in fig.renderers}
    assert colour == {
        ("A", "compute_pct"): meanings["compute"],
        ("A", "idle_pct"): meanings["idle"],
        ("B", "idle_ns"): meanings["idle"],
        ("B", "compute_ns"): meanings["compute"],
    }


def test_per_step_series_are_lines_at_page_width():
    df = pl.DataFrame(
        {"step": [3, 1, 2], "actual_ns": [3_000_000, 1_000_000, 2_000_000], "ideal_ns": [1_000_000] * 3}
    )
    fig = plots.series(df, "step", ("actual_ns", "ideal_ns"), "Step time")
    lines = [r for r in fig.renderers if type(r.glyph).__name__ == "Line"]
    assert len(lines) == 2 and list(lines[0].data_source.data["x"]) == [1, 2, 3]
    assert list(lines[0].data_source.data["v"]) == [1.0, 2.0, 3.0]  # ms, sorted by step
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
