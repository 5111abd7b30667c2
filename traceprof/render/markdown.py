"""Markdown for a pull-request comment: ``summary -f markdown`` and ``diff -f markdown``.

A headline verdict first, then the tables a reviewer reads (GitHub-flavoured Markdown tables).
Every string that comes from a trace or a user (run names, kernel and op names, causes) goes
through :func:`traceprof.core.term.md_text`: no pipe ends a cell early, no backtick opens code, no
HTML tag or comment survives, no newline breaks a row, no ``@name`` mentions anyone. Durations are
in human units (``12.3 ms``, :mod:`traceprof.core.display`), the column name without ``_ns``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from traceprof.core import display
from traceprof.core.term import md_text

if TYPE_CHECKING:
    import polars as pl

    from traceprof.engine.diff import DiffResult
    from traceprof.engine.findings import Findings

__all__ = ["table", "findings_markdown", "diff_markdown", "ITEM_ROWS"]

#: Item changes and structural changes a diff comment shows (the largest first).
ITEM_ROWS = 10


def table(df: pl.DataFrame, width: int = 60) -> list[str]:
    """``df`` as the lines of a Markdown table: headers and cells as the terminal table writes them
    (:func:`traceprof.core.display.table_rows`: durations human, long names shortened to
    ``width``), every cell escaped; numeric columns right-aligned. Empty ``df``: no lines."""
    if df.is_empty():
        return []
    heads = display.table_columns(df)
    align = ["---:" if df[c].dtype.is_numeric() else "---" for c in df.columns]
    lines = ["| " + " | ".join(md_text(h) for h in heads) + " |", "| " + " | ".join(align) + " |"]
    for row in display.table_rows(df, width=width):
        lines.append("| " + " | ".join(md_text(v) for v in row) + " |")
    return lines


def _pct(v: float | None) -> str:
    return "" if v is None else f"{v:.1f}%"


def findings_markdown(f: Findings) -> str:
    """A run's findings as Markdown: a headline verdict (``problem`` when any topic's verdict is, with
    those topics; else ``ok``), the ranked findings (position, topic, status, recoverable and cost in
    % of step time, ranks, finding), the verdict per topic and what did not apply."""
    problems = [v.topic for v in f.verdicts if v.status == "problem"]
    verdict = f"**problem** ({', '.join(problems)})" if problems else "**ok**"
    lines = [f"### traceprof summary: run {md_text(f.run)}", "", f"Verdict: {verdict}", ""]
    if f.baseline:
        lines[0] += f" (baseline {md_text(f.baseline)})"
    if f.coverage:
        lines += [f"Ranks: {md_text(f.coverage)}", ""]
    top = next((x for x in f.findings if x.problem), None)
    if top is not None:
        lines += [f"> {md_text(top.text)}", ""]
    if f.findings:
        lines += [
            f"{f.ranking}.",
            "",
            "| # | topic | status | recoverable | cost | ranks | finding |",
            "| ---: | --- | --- | ---: | ---: | --- | --- |",
        ]
        for i, x in enumerate(f.findings, 1):
            ranks = x.ranks or ((x.rank,) if x.rank is not None else ())
            cells = (
                str(i),
                md_text(x.topic),
                md_text(x.status),
                _pct(x.recoverable_pct),
                _pct(x.cost_pct),
                ", ".join(str(r) for r in ranks),
                md_text(x.text),
            )
            lines.append("| " + " | ".join(cells) + " |")
    else:
        lines.append(md_text(f.empty_text))
    if f.verdicts:
        lines += ["", "| topic | verdict | why |", "| --- | --- | --- |"]
        lines += [f"| {md_text(v.topic)} | {md_text(v.status)} | {md_text(v.text)} |" for v in f.verdicts]
    if f.unavailable:
        lines += ["", "Not available from this run's sources: "]
        lines += [f"- {md_text(m.analysis)}: {md_text(m.needs or m.reason)}" for m in f.unavailable]
    return "\n".join(lines) + "\n"


def diff_markdown(res: DiffResult, cand: str) -> str:
    """A regression diff as Markdown: the gate's verdict and exit code, its summary line, the gated
    metrics (metric, layer, base, cand, change, threshold, noise floor, verdict, reason), the
    structural changes and the largest item changes (:data:`ITEM_ROWS` each), and the notes."""
    import polars as pl

    word = {"regression": "REGRESSION", "inconclusive": "INCONCLUSIVE"}.get(res.verdict, "OK")
    lines = [
        f"### traceprof diff: {md_text(res.baseline)} → {md_text(cand)}",
        "",
        f"Verdict: **{word}** (exit {res.exit_code})",
        "",
        f"> {md_text(res.summary)}",
        "",
        "Gated metrics (base: the baselines' mean; change in the bad direction, % of base):",
        "",
    ]
    lines += _metrics_table(res.frame)
    if res.structure.height:
        keep: list[str] = [
            c
            for c in ("kind", "name", "shape", "base_calls", "cand_calls", "delta_flops")
            if c in res.structure.columns
        ]
        lines += [
            "",
            f"Structural changes per step (largest FLOPs change first; {res.structure.height} in all):",
            "",
        ]
        lines += table(res.structure.select(keep).head(ITEM_ROWS))
    if res.items.height:
        shown = "kind name class base_ns cand_ns delta_ns share_of_step_pct".split()
        keep = [c for c in shown if c in res.items.columns]
        lines += ["", f"Largest item changes, typical time per step ({res.items.height} items in all):", ""]
        lines += table(res.items.select(keep).head(ITEM_ROWS).with_columns(pl.col(pl.Float64).round(2)))
    if res.notes[1:]:
        lines += ["", *(f"- {md_text(n)}" for n in res.notes[1:])]
    return "\n".join(lines) + "\n"


def _metrics_table(m: pl.DataFrame) -> list[str]:
    """The gated metrics: base and cand in each metric's unit (``_ns``: a human duration)."""
    heads = ["metric", "layer", "base", "cand", "change", "threshold", "noise", "verdict", "reason"]
    lines = ["| " + " | ".join(heads) + " |", "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- | --- |"]
    for r in m.iter_rows(named=True):
        metric = str(r["metric"])

        def val(v: object, metric: str = metric) -> str:  # in the metric's unit, as the terminal shows it
            return display.format_cell(v, display.ColumnFormat(metric, "metric"), metric)

        change = r.get("change_pct")
        cells = (
            md_text(r["metric"]),
            md_text(r.get("layer") or ""),
            val(r.get("base")),
            val(r.get("cand")),
            "" if change is None else f"{change:+.1f}%",
            _pct(r.get("threshold_pct")),
            _pct(r.get("noise_pct")),
            md_text(r.get("verdict") or ""),
            md_text(r.get("reason") or ""),
        )
        lines.append("| " + " | ".join(cells) + " |")
    return lines
