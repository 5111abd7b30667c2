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


def open(db: str | Path, **options: Any) -> Session:  # noqa: A001 - the library's way in, as builtins.open is Python's
    """Open the store ``db`` as a :class:`Session`; ``options``: those of
    :func:`traceprof.engine.session.open_session` (``read_only``, ``cache``, ``executor``,
    ``scheduler``, ``threads``, ``memo``, ``many``)."""
    return _engine.open_session(db, cls=Session, **options)  # type: ignore[return-value]
