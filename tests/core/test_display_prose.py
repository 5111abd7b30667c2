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
        assert [r[1] for r in rows] == ["0.00", "0.00", "0.34", ""]  # other floats as before
