"""The library's way in, mirroring the CLI: ``traceprof.open(db)`` gives a :class:`Session`.

::

    import traceprof

    with traceprof.open("traceprof.duckdb") as s:
        s.analyze("gaps", run="normal")        # traceprof analyze gaps --run normal
        s.summary(run="normal")                # traceprof summary --run normal
        s.report("report.html", run="normal")  # traceprof report --run normal -o report.html
        s.diff("base1,base2", "normal")        # traceprof diff base1,base2 normal

A :class:`traceprof.engine.session.Session` (the store and how analyses run on it) that also
writes the report: the engine renders nothing, so the report's entry lives here, above it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from traceprof.engine import session as _engine

__all__ = ["Session", "open"]


class Session(_engine.Session):
    """:class:`traceprof.engine.session.Session` with :meth:`report`."""

    def report(
        self,
        output: str | Path,
        run: str | None = None,
        baseline: str | None = None,
        params: dict[str, dict[str, str]] | None = None,
        force: bool = False,
        units: str = "human",
    ) -> Path:
        """``traceprof report``: write the HTML report of ``run`` to ``output``; returns the path.
        ``units``: the tables' durations, ``human`` (s/ms/us, the header says which) or ``ns``.

        Raises:
            StoreError: No such run or baseline.
            UsageError: ``output`` cannot be written, or a bad parameter.
        """
        from traceprof.render.report import write_report

        return write_report(
            self.store, run, output, baseline=baseline, params=params, force=force, units=units
        )

    def plot(self, name: str, run: str | None = None, **params: Any) -> Any:
        """The charts the report draws for analysis ``name`` on ``run``, as one holoviews layout
        (a column of its elements: ``hv.Bars``, ``hv.HeatMap``, overlays of ``hv.Curve``...), for a
        notebook to show, restyle or compose (``traceprof.plots`` builds single ones).

        Raises:
            StoreError: No such run.
            AnalysisError: The analysis does not apply to the run, or it draws no chart.
            UsageError: No such analysis or a bad parameter.
        """
        from traceprof.core.errors import AnalysisError
        from traceprof.render import plots

        result = self.analyze(name, run, **params)
        elements = [plots.chart(result, c)[0] for c in result.charts()]
        if not elements:
            raise AnalysisError(f"{name} draws no chart")
        hv = plots.holoviews()
        return hv.Layout(elements).cols(1)

    def timeline(self, run: str | None = None, step: int | None = None) -> Any:
        """The per-rank timeline of ``step`` (default: the median step) of ``run`` as the report
        draws it: a holoviews overlay (rectangles per state, the critical path as segments where
        ``critical_path`` applies).

        Raises:
            StoreError: No such run.
            AnalysisError: The run has no step to draw (the reason in the message).
        """
        from traceprof.core.errors import AnalysisError, TraceprofError
        from traceprof.engine.findings import report_analyses
        from traceprof.engine.timeline import step_timeline, with_path
        from traceprof.render import plots

        tl = step_timeline(self.store, self.store.resolve_run(run), step)
        if isinstance(tl, str):
            raise AnalysisError(f"no timeline: {tl}")
        for spec in report_analyses():  # the paths drawn over it (critical_path's), where they apply
            if spec.report is not None and spec.report.timeline_path:
                try:
                    tl = with_path(tl, self.analyze(spec.name, run).frames()[spec.report.timeline_path])
                except TraceprofError:
                    continue
        return plots.timeline(tl)


def open(db: str | Path, **options: Any) -> Session:  # noqa: A001 - the library's way in, as builtins.open is Python's
    """Open the store ``db`` as a :class:`Session`; ``options``: those of
    :func:`traceprof.engine.session.open_session` (``read_only``, ``cache``, ``executor``,
    ``scheduler``, ``threads``, ``memo``, ``many``)."""
    return _engine.open_session(db, cls=Session, **options)  # type: ignore[return-value]
