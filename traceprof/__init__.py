"""traceprof: profile distributed LLM training traces in one DuckDB store.

The library mirrors the CLI (``traceprof.api``)::

    import traceprof

    with traceprof.open("traceprof.duckdb", read_only=False) as s:   # a Session
        s.ingest(["traces/run1"])                            # traceprof ingest traces/run1
    with traceprof.open("traceprof.duckdb") as s:
        s.analyze("overlap", run="run1").to_frame()          # traceprof analyze overlap --run run1
        s.summary(run="run1")                                # traceprof summary --run run1
        s.report("report.html", run="run1")                  # traceprof report --run run1
        s.diff("run0", "run1")                               # traceprof diff run0 run1

Layers, each a subpackage that imports only those below it (the contract in ``pyproject.toml``,
checked by ``lint-imports``): ``cli``/``api`` > ``render`` > ``analyses``/``collectors`` (the
``analyses/`` and ``collectors/`` folders, installed here) > ``engine`` > ``ingest`` >
``storage`` > ``core``.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["Store", "open", "__version__"]


def open(db: Any, **options: Any) -> Any:  # noqa: A001 - the library's way in, as builtins.open is Python's
    """Open the store ``db`` as a :class:`traceprof.api.Session` (``with traceprof.open(db) as s:
    s.analyze(...)``); ``options``: those of :func:`traceprof.engine.session.open_session`."""
    from traceprof.api import open as open_

    return open_(db, **options)


def __getattr__(name: str) -> Any:  # lazy, so `python -m traceprof.core.schema` imports nothing else
    if (
        name == "plots"
    ):  # holoviews elements for notebooks (traceprof.render.plots); holoviews loads on the first plot
        from traceprof.render import plots

        return plots
    if name == "Store":
        from traceprof.storage.store import Store

        return Store
    raise AttributeError(name)
