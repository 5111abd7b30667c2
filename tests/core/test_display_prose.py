"""Our own sentences in terminal tables: whole and wrapped, never cut in the middle."""

from __future__ import annotations

import polars as pl

from traceprof.core import display


def test_prose_columns_are_whole_where_other_text_is_shortened():
    reason = "+17.8% > threshold 1% (exact) (the baseline runs differ; compared with the nearest, normal: 6.04 GFLOP)"
    name = "void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl<at::native::AddFunctor>>"
    df = pl.DataFrame({"name": [name], "reason": [reason], "evidence": [reason], "why": [reason]})
    [cells] = list(display.table_rows(df))
    assert cells[1] == reason and cells[2] == reason  # prose: whole (it read "the baseline runs di…")
    assert len(cells[0]) < len(name) and len(cells[3]) <= 48  # others: shortened as before
    assert {"reason", "evidence", "text", "detail", "issues"} <= display.PROSE_COLUMNS


def test_a_diff_reason_prints_whole_wrapped_in_the_terminal(capsys, monkeypatch):
    from traceprof import cli

    reason = "unchanged (the baseline runs differ; compared with the nearest, normal: 6.04 GFLOP)"
    monkeypatch.setattr(cli.out, "width", 100)
    cli._print_table(["metric", "reason"], [False, False], [["flops", reason]], "metrics")
    lines = [ln.split("│")[2].strip() for ln in capsys.readouterr().out.splitlines() if ln.startswith("│")]
    assert " ".join(lines) == reason and max(map(len, lines)) <= display.PROSE_WIDTH


def test_a_p_value_keeps_two_significant_digits():
    # stragglers' p of 6e-08 and a diff's 0.0028 both read 0.00 (two decimals, as any float)
    df = pl.DataFrame({"p_value": [6e-08, 0.0028, 0.34, None], "ratio": [6e-08, 0.0028, 0.34, None]})
    df = df.with_columns(pl.col("p_value").alias("floor_p_value"))
    for units in display.UNITS:
        rows = list(display.table_rows(df, units))
        assert [r[0] for r in rows] == [r[2] for r in rows] == ["6e-08", "0.0028", "0.34", ""]
        # other floats: two decimals, a sub-unit value keeping 3 significant digits unless that
        # needs an exponent (6e-08 stays 0.00)
        assert [r[1] for r in rows] == ["0.00", "0.0028", "0.34", ""]


def test_a_value_below_the_columns_unit_keeps_three_significant_digits():
    """t14 D6: mfu's waterfall (straggler_rank2) puts idle 545,282 ns beside 531 ms of compute: the
    column is in ms with 0 decimals (median 122 ms >= 100), so idle read "1" (0.545 rounded up, 83 %
    off). By hand: 545,282 / 1e6 = 0.545282 -> "0.545"; 98 ms and 0 stay as they were; a sub-unit
    value that already shows two digits at the column's decimals (0.50 in a column of 2) keeps them."""
    df = pl.DataFrame({"ns": [545_282, 98_000_000, 122_000_000, 531_000_000, 0]})
    assert [r[0] for r in display.table_rows(df)] == ["0.545", "98", "122", "531", "0"]
    assert [c.header for c in display.column_formats(df)] == ["time (ms)"]
    two = display.ColumnFormat("x (ms)", "duration", 1e6, "ms", 2)
    assert [display.format_cell(v, two) for v in (500_000, 45_000, 4_000)] == ["0.50", "0.045", "0.004"]
    # the report renders the same cells
    from traceprof.render.report import _table_html

    assert ">0.545</td>" in _table_html(df)


def test_a_small_percent_keeps_three_significant_digits():
    """t15: the waterfall's ``pct`` column (2 decimals) read idle's 0.0617 % as "0.06" (one digit)
    beside its duration's "0.545". By hand: 0.0617 -> "0.0617"; 0.5 at 2 decimals "0.50" (two
    digits, kept); 12.345 -> "12.35"; 0.0 -> "0.00"."""
    df = pl.DataFrame({"pct": [0.0617, 0.5, 12.345, 0.0]})
    assert [r[0] for r in display.table_rows(df)] == ["0.0617", "0.50", "12.35", "0.00"]
