"""``docs/analyses.md``, generated from the analyses' specs (``traceprof.engine.analysis.Analysis``).

``python -m traceprof.render.analysis_docs > docs/analyses.md`` (``make docs``) writes it; a test checks
that the file is current, as ``docs/schema.md`` is checked against ``traceprof.core.schema``.
"""

from __future__ import annotations

import inspect

from traceprof.core.display import param_rows
from traceprof.engine import analysis as registry

__all__ = ["markdown"]


def _cell(text: str) -> str:
    return text.replace("|", "&#124;").replace("\n", " ")


def markdown() -> str:
    """Every registered analysis as Markdown: summary, algorithm, parameters, where it runs (the
    report, per rank or cross-rank), what it requires, whether it reads the activity frame, and its tables with their columns."""
    specs = registry.specs()
    lines = [
        "# traceprof analyses",
        "",
        "Generated from each analysis' spec (`SPEC` in `analyses/<name>.py`) by "
        "`python -m traceprof.render.analysis_docs > docs/analyses.md`; do not edit by hand.",
        "",
        "`traceprof analyze NAME --help` prints the same. Times are integer nanoseconds (`_ns`), shares are "
        "0..100 (`_pct`). `analyze NAME --save` stores each table as `result_<name>_<table>` with these "
        "column docs as column comments.",
        "",
        "| analysis | what it computes | in the report | runs |",
        "|---|---|---|---|",
    ]
    for a in specs:
        where = "per rank (one Dask task each)" if a.per_rank is not None else "on the whole run"
        report = "yes" if a.report is not None else "no"
        lines.append(
            f"| [`{a.name}`](#{a.name}) | {_cell(a.summary.split(': ', 1)[-1])} | {report} | {where} |"
        )
    lines.append("")
    for a in specs:
        lines += [f"## `{a.name}`", "", inspect.cleandoc(a.doc), ""]
        facts = []
        if a.report is not None:
            facts.append(
                f"- In the report and `summary` (section {a.report.order // 10}); it needs "
                f"{a.report.needs}" + (" (run only on the runs that hold it)" if a.report.when else "") + "."
            )
        else:
            facts.append("- Not in the report: `traceprof analyze " + a.name + "`.")
        if a.findings is not None:
            facts.append(f"- Its findings hook gives the verdict of the topic `{a.findings.name}`.")
        facts.append(
            "- Runs per rank: with `--executor dask`, one task per rank, results merged."
            if a.per_rank is not None
            else "- Runs on the whole run (cross-rank)."
        )
        if a.requires:
            facts.append(
                f"- Runs {', '.join(f'`{r}`' for r in a.requires)} itself (started first on the report's "
                "threads)."
            )
        if not a.reads_activity:
            facts.append(
                "- Reads no activity frame (`reads_activity=False`): the report runs it last, once the "
                "frame the others share is let go of."
            )
        lines += [*facts, "", "### Parameters (`-p KEY=VALUE`)", ""]
        rows = param_rows(a.params)
        if rows:
            lines += ["| parameter | type | default |", "|---|---|---|"]
            lines += [f"| `{n}` | {_cell(t)} | `{d!r}` |" for n, t, d in rows]
        else:
            lines.append("None besides `--run`.")
        if a.params.__doc__ and not a.params.__doc__.startswith(a.params.__name__ + "("):
            lines += ["", inspect.cleandoc(a.params.__doc__)]
        lines += ["", "### Tables (`--table NAME`)", ""]
        for t in a.frames:
            lines += [f"`{t.name}`: {t.doc}", "", "| column | type | unit | doc |", "|---|---|---|---|"]
            lines += [f"| `{c.name}` | {c.type} | {c.unit} | {_cell(c.doc)} |" for c in t.columns]
            lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown(), end="")
